"""Value checks: torch's errors where JAX would clamp, drop or compute something."""

from __future__ import annotations

import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core as _jax_core

from bridge._src import config as config_lib
from bridge._src import ffi
from bridge._src.errors import BridgeError, TorchIndexError, TorchRuntimeError
from bridge._src.registry import REGISTRY

_config_var = config_lib._CURRENT


_TORCH_ERRORS = {IndexError: TorchIndexError, RuntimeError: TorchRuntimeError}


check_state = threading.local()  # .found: flags of the eager op being traced, or None; .op: its op


def concrete(x: Any) -> np.ndarray | None:
  """`x`'s value, if known here (a JVP tracer of a known value too), else None."""
  if not isinstance(x, jax.core.Tracer):
    return np.asarray(x)
  known = _jax_core.to_concrete_value(x)
  return None if known is None else np.asarray(known)


def _check_message(message: Any, value: Any, position: int) -> str:
  if isinstance(message, str):
    return message.format(value=value, position=position)
  return message(value, position)


def _check_error(
  error: type[Exception], message: Any, bad: np.ndarray, values: np.ndarray | None
) -> Exception:
  """torch's exception for the first True element of `bad` (in C order)."""
  position = int(np.argmax(np.ravel(bad)))
  value = None
  if values is not None:
    value = np.ravel(np.broadcast_to(values, np.shape(bad)))[position].item()
  return _TORCH_ERRORS.get(error, error)(_check_message(message, value, position))


def report_value_check(op: str, bad: Any, error: type[Exception], message: str) -> None:
  """A value check the core makes itself, outside a lowering (a composite op run whole):
  `_report_check` with `op` as the op a staged check's error names."""
  outer, check_state.op = getattr(check_state, "op", None), op
  try:
    _report_check(bad, None, error, message, "value")
  finally:
    check_state.op = outer


def _report_check(bad: Any, values: Any, error: type[Exception], message: Any, kind: str) -> None:
  """Enforce one rule a lowering declares (`bridge_ops._lowering.check`; see above)."""
  known = concrete(bad)
  if known is not None:
    if known.any():
      raise _check_error(error, message, known, None if values is None else concrete(values))
    return
  found = getattr(check_state, "found", None)
  if found is not None:
    found.append(jnp.any(bad))
  elif _config_var.get().check_indices:  # every rule, not only indices (see `Config`)
    _stage_check(bad, values, error, message, kind)


def _stage_check(bad: Any, values: Any, error: type[Exception], message: Any, kind: str) -> None:
  """A host call in the program being staged that raises torch's error if `bad` holds."""
  op = getattr(check_state, "op", None)
  if not ffi.supported():
    what = "indices" if kind == "index" else "values"
    raise BridgeError(
      f"`bridge.config(check_indices=True)`: checking the {what} of {op} inside a JAX "
      f"program needs a host call, which programs on {ffi.platform()} cannot make. Leave "
      "check_indices off there (out-of-range reads are clamped, writes dropped, an integer "
      f"division by zero gives an unspecified number), or check the {what} before the program."
    )
  torch_type = _TORCH_ERRORS.get(error, error)
  ffi.stage_check(
    bad,
    values,
    lambda value, position: torch_type(
      f"`bridge.config(check_indices=True)`: {op}: " + _check_message(message, value, position)
    ),
    ffi.check_name("index", op, torch_type, message),
  )


_installed_checks: list[bool] = []


def install_checks() -> None:
  """Hand `_report_check` to the plugins that declare value checks (once, when loaded)."""
  if _installed_checks:
    return
  for info in REGISTRY.plugins:
    install = getattr(info.module, "install_checks", None)
    if callable(install):
      install(_report_check)
  _installed_checks.append(True)
