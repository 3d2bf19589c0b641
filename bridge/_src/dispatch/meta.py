"""torch's own shapes and dtypes for an op (its meta kernel), and a lowering's results cast
to them.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import torch

from bridge._src import dtypes, narrowing, scope
from bridge._src.errors import BridgeError


def _meta_arg(x: Any) -> Any:
  if isinstance(x, jax.core.Tracer) or isinstance(x, (jax.Array, np.ndarray)):
    shape, dtype = np.shape(x), np.dtype(x.dtype)
    weak = getattr(getattr(x, "aval", None), "weak_type", False) or getattr(x, "weak_type", False)
    if weak and not shape:
      return {"b": True, "i": 1, "u": 1, "f": 1.0, "c": 1j}[dtype.kind]
    return torch.empty(shape, dtype=dtypes.JAX_TO_TORCH[dtype], device="meta")
  return x


def meta_outputs(func: Any, args: tuple, kwargs: dict) -> Any:
  """torch's output metadata for these (traced) arguments, or None if torch has no meta kernel."""
  margs, mkwargs = jax.tree_util.tree_map(_meta_arg, (args, kwargs))
  mkwargs.pop("key", None)
  if "device" in mkwargs:  # a factory: ask for meta tensors, never re-enter the jax device
    mkwargs["device"] = "meta"
  try:
    return func(*margs, **mkwargs)
  except Exception:  # noqa: BLE001 - no meta kernel: the lowering's own dtypes stand
    return None


def conform(func: Any, out: Any, expected: Any) -> Any:
  """Cast a lowering's results to torch's dtypes; refuse a wrong shape."""
  if expected is None:
    return out
  if isinstance(out, (tuple, list)):
    kind = list if isinstance(out, list) else tuple  # torch's named return types -> tuple
    if not isinstance(expected, (tuple, list)) or len(expected) != len(out):
      return kind(out)
    return kind(conform(func, o, e) for o, e in zip(out, expected))
  if not isinstance(expected, torch.Tensor) or not hasattr(out, "dtype"):
    return out
  if tuple(out.shape) != tuple(expected.shape):
    raise BridgeError(
      f"bridge: the lowering of {func} returned shape {tuple(out.shape)}, but torch's "
      f"{func} gives {tuple(expected.shape)} for these inputs. This is a bug in the "
      "lowering; please report it."
    )
  want = dtypes.TORCH_TO_JAX.get(expected.dtype)
  if want is not None and np.dtype(out.dtype) != want:
    if want.itemsize == 8 or want == np.complex128:
      narrowed = jax.dtypes.canonicalize_dtype(want)
      if narrowed != want:  # a 32-bit program (see `scope.narrow`; proven by `narrowing`)
        if want.kind not in "iu":
          raise narrowing.refuse_float(f"the result of {func}", expected.dtype)
        scope.warn_narrowed(f"the {expected.dtype} result of {func}")
        out = narrowing.track(out.astype(narrowed), None)  # proven in `narrowing.after_call`
        want = narrowed
    if np.dtype(out.dtype) != want:
      out = out.astype(want)
  return out
