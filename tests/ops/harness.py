"""Checks a lowering against torch on CPU: `check(aten.op.overload, *args, **kwargs)`.

Two ways, both used when available:
* direct: the registered lowering is called on JAX copies of the CPU arguments
  (inside the 64-bit scope the core uses) and its result cast to torch's dtype;
* device: the op runs on the `jax` torch device (`bridge.Tensor`), through the
  core's dispatch, caching and dtype checks.
Each is compared with the op on CPU with `torch.testing.assert_close`.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch


_BY_OP: dict = {}


def lowering_of(op: torch._ops.OpOverload):
  if not _BY_OP:
    from bridge._src.registry import REGISTRY
    from bridge_ops import plugin

    plugin.install_dtypes(REGISTRY.dtypes)  # what the core hands over when it registers them
    for r in plugin.import_families():
      ops = (
        [r.op]
        if isinstance(r.op, torch._ops.OpOverload)
        else [getattr(r.op, n) for n in r.op.overloads() if not getattr(r.op, n)._schema.is_mutable]
      )
      for o in ops:
        _BY_OP[o] = r
  return _BY_OP.get(op)


def random_tensors(gen: torch.Generator):
  """`r(*shape, dtype=...)`: random test tensors from `gen` (normal floats, ints scaled by 10,
  bools by sign)."""

  def r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    x = torch.randn(*shape, generator=gen)
    if dtype.is_floating_point or dtype.is_complex:
      return x.to(dtype)
    if dtype == torch.bool:
      return x > 0
    return (x * 10).to(dtype)

  return r


def _to_jax(x: Any) -> Any:
  if isinstance(x, torch.Tensor):
    return (
      jnp.asarray(x.detach().numpy())
      if x.dtype is not torch.bfloat16
      else jnp.asarray(x.detach().float().numpy()).astype(jnp.bfloat16)
    )
  if isinstance(x, (list, tuple)):
    return type(x)(_to_jax(v) for v in x)
  return x


def _to_torch(x: Any, like: Any) -> Any:
  if isinstance(like, torch.Tensor):
    arr = np.asarray(jnp.asarray(x).astype(jnp.float32) if x.dtype == jnp.bfloat16 else x)
    t = torch.from_numpy(arr.copy())
    return t.to(like.dtype)
  if isinstance(like, (list, tuple)):
    return type(like)(_to_torch(a, b) for a, b in zip(x, like))
  return x


def run_direct(op, *args, **kwargs):
  record = lowering_of(op)
  assert record is not None, f"no lowering registered for {op}"
  if record.options.get("random"):
    kwargs = dict(kwargs, key=jax.random.PRNGKey(0))
  with jax.enable_x64(True):
    out = record.fn(*_to_jax(list(args)), **{k: _to_jax(v) for k, v in kwargs.items()})
    expected = op(*args, **{k: v for k, v in kwargs.items() if k != "key"})
    return _to_torch(out, expected), expected


def _to_device(x: Any) -> Any:
  if isinstance(x, torch.Tensor):
    return x.to("jax")
  if isinstance(x, (list, tuple)):
    return type(x)(_to_device(v) for v in x)
  return x


def device_available() -> bool:
  try:
    import bridge

    return hasattr(bridge, "Tensor")
  except ImportError:
    return False


def check(
  op,
  *args,
  atol: float | None = None,
  rtol: float | None = None,
  exact_dtype: bool = True,
  **kwargs,
) -> None:
  """Compare the lowering of `op` (direct, and on the device when it exists) with torch on CPU."""
  out, expected = run_direct(op, *args, **kwargs)
  torch.testing.assert_close(
    out, expected, atol=atol, rtol=rtol, check_dtype=exact_dtype, equal_nan=True
  )
  if device_available():
    dev_out = op(*_to_device(list(args)), **{k: _to_device(v) for k, v in kwargs.items()})
    dev_cpu = jax.tree_util.tree_map(
      lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, dev_out
    )
    torch.testing.assert_close(
      dev_cpu, expected, atol=atol, rtol=rtol, check_dtype=exact_dtype, equal_nan=True
    )


def error_message(error: BaseException) -> str:
  """`str(error)` without torch's C++ backtrace (where TORCH_SHOW_CPP_STACKTRACES prints one)."""
  return str(error).split("\nException raised from")[0]


def assert_raises_like_cpu(make: Callable[[str], Any]) -> None:
  """`make("jax")` raises what `make("cpu")` raises: torch's exception type (or the bridge's
  class for it: `TorchRuntimeError`, `TorchIndexError`...) with torch's message."""
  import pytest

  from bridge._src.errors import BridgeError

  with pytest.raises(Exception) as expected:
    make("cpu")
  with pytest.raises(Exception) as got:
    make("jax")
  want, have = expected.value, got.value
  assert type(have) is type(want) or (
    isinstance(have, type(want)) and isinstance(have, BridgeError)
  ), (type(have), type(want), str(have))
  assert error_message(have) == error_message(want)


def assert_checked_program_raises(
  fn: Callable[..., Any], args: tuple, op: str, expected: BaseException
) -> None:
  """`bridge.compile(fn)(*args)` under `bridge.config(check_indices=True)` raises the error CPU
  torch raised (`expected`), named with `op` and the setting: a `JaxRuntimeError`, or the
  check's torch error itself where the compiled program's call re-raises it."""
  import pytest

  import bridge

  with bridge.config(check_indices=True):
    with pytest.raises((jax.errors.JaxRuntimeError, type(expected))) as got:
      jax.block_until_ready(bridge.compile(fn)(*args))
  assert f"{op}: {error_message(expected)}" in str(got.value)
  assert "check_indices" in str(got.value)
