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
  """torch's output metadata for these (traced) arguments, or None if torch has no meta kernel.

  Where torch refuses the arguments (a dimension out of range, a weight of the wrong rank:
  mistakes a lowering may not check), this raises torch's own exception, as CPU torch
  raises it (`torch_error`)."""
  margs, mkwargs = _meta_args(args, kwargs)
  try:
    return func(*margs, **mkwargs)
  except Exception as e:  # noqa: BLE001 - no meta kernel: the lowering's own dtypes stand
    # (only torch's check errors: a TypeError here more likely says how the arguments were
    # stood in for, e.g. a traced scalar as a Python number, than that torch refuses them)
    if isinstance(e, (RuntimeError, IndexError)):
      error = _refusal(func, e, margs, mkwargs)
      if error is not None:
        raise error from None
    return None


def _meta_args(args: Any, kwargs: dict) -> tuple[Any, dict]:
  margs, mkwargs = jax.tree_util.tree_map(_meta_arg, (args, kwargs))
  mkwargs.pop("key", None)
  if "device" in mkwargs:  # a factory: ask for meta tensors, never re-enter the jax device
    mkwargs["device"] = "meta"
  return margs, mkwargs


_SMALL = 1 << 16  # elements: a CPU stand-in this small is real memory (no stride-0 quirks)


def _cpu_arg(x: Any) -> Any:
  """A meta tensor as a CPU tensor of its shape and dtype (zeros; stride 0 if large)."""
  if isinstance(x, torch.Tensor) and x.device.type == "meta":
    if x.numel() <= _SMALL:
      return torch.zeros(x.shape, dtype=x.dtype)
    return torch.zeros((), dtype=x.dtype).expand(x.shape)
  return x


def torch_error(func: Any, args: Any, kwargs: dict) -> Exception | None:
  """The exception CPU torch raises for these arguments (its own type and message for a
  shape, dtype or size mistake), or None if torch raises none or cannot tell (no meta
  kernel, an output shape that depends on values)."""
  margs, mkwargs = _meta_args(args, kwargs)
  try:
    func(*margs, **mkwargs)
  except Exception as e:  # noqa: BLE001 - sorted by `_refusal`
    return _refusal(func, e, margs, mkwargs)
  return None


def _refusal(func: Any, error: Exception, margs: Any, mkwargs: dict) -> Exception | None:
  """`error` (the meta kernel's) as CPU torch raises it, if it is torch refusing the
  arguments; None for what is not (no meta kernel, a value-dependent shape).

  The meta kernel decides (it allocates nothing); its message can differ from the CPU
  kernel's (`a and b must have same reduction dim` against `mat1 and mat2 shapes cannot be
  multiplied`), so the CPU kernel is asked for its own on inputs of the same shapes (it
  fails its checks before computing). A CPU kernel that does not refuse them leaves the
  verdict open (None): only a mistake both kernels see is raised."""
  if not isinstance(error, (RuntimeError, IndexError, ValueError, TypeError)):
    return None
  if isinstance(error, NotImplementedError) or type(error).__module__.startswith(
    "torch._subclasses"
  ):  # no meta kernel; a data-dependent output shape
    return None
  cargs, ckwargs = jax.tree_util.tree_map(
    _cpu_arg, (margs, mkwargs), is_leaf=lambda x: isinstance(x, torch.Tensor)
  )
  if "device" in ckwargs:
    ckwargs["device"] = "cpu"
  try:
    func(*cargs, **ckwargs)
  except type(error) as cpu_error:
    return cpu_error
  except Exception:  # noqa: BLE001 - another kind of failure: not a verdict
    return None
  return None


def _meta_tensor(x: Any) -> Any:
  if isinstance(x, torch.Tensor):
    return torch.empty(tuple(x.shape), dtype=x.dtype, device="meta")
  if isinstance(x, (list, tuple)):
    return type(x)(_meta_tensor(v) for v in x)
  return x


def _signature(x: Any) -> Any:
  """What torch's checks of an in-place/out= op read of an argument: shape and dtype of a
  tensor, the type of a float (not its value), anything else as it is."""
  if isinstance(x, torch.Tensor):
    return (tuple(x.shape), x.dtype)
  if isinstance(x, (float, complex)):
    return type(x)
  if isinstance(x, (list, tuple)):
    return tuple(_signature(v) for v in x)
  if isinstance(x, (int, bool, str, type(None), torch.dtype)):
    return x
  return type(x)


def mutation_error(func: Any, args: tuple, kwargs: dict, verdicts: dict) -> Exception | None:
  """torch's exception for an in-place or out= op that torch refuses on these arguments (a
  result it cannot cast to the written tensor's dtype, a broadcast that would grow it), or
  None. The verdict is kept per argument signature in `verdicts`."""
  try:
    key = (_signature(args), tuple(sorted((k, _signature(v)) for k, v in kwargs.items())))
    hash(key)
  except TypeError:
    return None
  if key in verdicts:
    return verdicts[key]
  margs = tuple(_meta_tensor(a) for a in args)
  mkwargs = {k: _meta_tensor(v) for k, v in kwargs.items()}
  try:
    func(*margs, **mkwargs)
    error = None
  except Exception as e:  # noqa: BLE001 - sorted by `_refusal`
    error = _refusal(func, e, margs, mkwargs)
  verdicts[key] = error
  return error


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
