"""torch's own shapes and dtypes for an op (its meta kernel), and a lowering's results cast
to them.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import torch

from bridge._src import dtypes, narrowing
from bridge._src.errors import BridgeError


# A traced Python scalar's stand-in values (its kind's): right for shapes and dtypes, not
# for torch's checks of values (`geometric_(p)` wants p in (0, 1)), hence two sets
STAND_INS = (
  {"b": True, "i": 1, "u": 1, "f": 1.0, "c": 1j},
  {"b": False, "i": 2, "u": 2, "f": 0.5, "c": 0.5 + 0.5j},  # (another set: see `_verdict`)
)


def weak(x: Any) -> bool:
  """Whether an array or tracer is weakly typed (a 0-d one stands for a Python number)."""
  return getattr(getattr(x, "aval", None), "weak_type", False) or getattr(x, "weak_type", False)


def _meta_arg(x: Any, stand_ins: list | None = None, other: bool = False) -> Any:
  if isinstance(x, jax.core.Tracer) or isinstance(x, (jax.Array, np.ndarray)):
    shape, dtype = np.shape(x), np.dtype(x.dtype)
    if weak(x) and not shape:
      if not isinstance(x, jax.core.Tracer):
        return np.asarray(x).item()  # a known value: itself
      if stand_ins is not None:
        stand_ins.append(x)
      return STAND_INS[other][dtype.kind]
    return torch.empty(shape, dtype=dtypes.JAX_TO_TORCH[dtype], device="meta")
  return x


def meta_outputs(func: Any, args: tuple, kwargs: dict) -> Any:
  """torch's output metadata for these (traced) arguments, or None if torch has no meta kernel.

  Where torch refuses the arguments (a dimension out of range, a weight of the wrong rank:
  mistakes a lowering may not check), this raises torch's own exception, as CPU torch
  raises it (`torch_error`)."""
  rule = _PLAIN_RULES.get(func)
  if rule is not None:
    try:
      found = rule(*args, **kwargs)
    except TypeError:  # arguments of another form: torch's meta kernel takes them
      found = None
    if found is not None:
      shape, dtype = found
      return torch.empty(shape, dtype=dtypes.JAX_TO_TORCH[dtype], device="meta")
  stand_ins: list = []
  margs, mkwargs = _meta_args(args, kwargs, stand_ins)
  try:
    return func(*margs, **mkwargs)
  except Exception as e:  # noqa: BLE001 - no meta kernel: the lowering's own dtypes stand
    # (only torch's check errors: a TypeError here more likely says how the arguments were
    # stood in for than that torch refuses them)
    if isinstance(e, (RuntimeError, IndexError)):
      error = _verdict(func, e, margs, mkwargs, args, kwargs, bool(stand_ins))
      if error is not None:
        raise error from None
    return None


# Plain rules: the output shape and dtype of hot ops (the matrix products, activations) where
# torch certainly accepts the arguments (floating tensors of one dtype whose shapes fit),
# without torch's meta kernels. Those are Python (`addmm`'s decomposition, the elementwise
# references) whose first call imports torch._dynamo, sympy and torch's symbolic shapes: about
# 1 s of a process's first trace of a `nn.Linear` and a `tanh`, and tens of microseconds of
# every trace of such an op. Anything else (another dtype, a mismatch torch refuses, a traced
# scalar) goes to torch's kernel as before, which raises torch's error.
_Type = tuple[tuple[int, ...], np.dtype]  # (shape, dtype)
_FLOATING = frozenset(np.dtype(d) for d in ("float16", "float32", "float64", jax.numpy.bfloat16))


def _array_type(x: Any) -> _Type | None:
  """(shape, dtype) of an array or tracer of a floating dtype torch has a tensor for (a weak
  scalar, which stands for a Python number, is not one)."""
  if not isinstance(x, (jax.core.Tracer, jax.Array, np.ndarray)):
    return None
  dtype = np.dtype(x.dtype)
  if dtype not in _FLOATING or (weak(x) and not np.shape(x)):
    return None
  return tuple(np.shape(x)), dtype


def _batched_product(a: Any, b: Any, batch: int) -> _Type | None:
  """The product of two (batch + 2)-dimensional arrays of one dtype whose inner sizes agree
  and (for bmm) whose batch sizes are equal."""
  x, y = _array_type(a), _array_type(b)
  if x is None or y is None or x[1] != y[1]:
    return None
  (sa, dtype), (sb, _) = x, y
  if len(sa) != 2 + batch or len(sb) != 2 + batch or sa[-1] != sb[-2] or sa[:-2] != sb[:-2]:
    return None
  return (*sa[:-1], sb[-1]), dtype


def _mm(self: Any, mat2: Any) -> _Type | None:
  return _batched_product(self, mat2, 0)


def _bmm(self: Any, mat2: Any) -> _Type | None:
  return _batched_product(self, mat2, 1)


def _addmm(self: Any, mat1: Any, mat2: Any, *, beta: Any = 1, alpha: Any = 1) -> _Type | None:
  out, bias = _batched_product(mat1, mat2, 0), _array_type(self)
  if out is None or bias is None or bias[1] != out[1]:
    return None
  if type(beta) not in (int, float) or type(alpha) not in (int, float):
    return None
  shape = bias[0]  # broadcast to the product's shape
  if len(shape) > 2 or any(d not in (1, n) for d, n in zip(shape[::-1], out[0][::-1])):
    return None
  return out


def _linear(input: Any, weight: Any, bias: Any = None) -> _Type | None:
  x, w = _array_type(input), _array_type(weight)
  if x is None or w is None or x[1] != w[1] or not x[0] or len(w[0]) != 2 or x[0][-1] != w[0][1]:
    return None
  if bias is not None:
    b = _array_type(bias)
    if b is None or b[1] != x[1] or b[0] != w[0][:1]:
      return None
  return (*x[0][:-1], w[0][0]), x[1]


def _same(self: Any) -> _Type | None:
  """A floating op of one tensor that keeps its shape and dtype (`tanh`)."""
  return _array_type(self)


# Ops of one floating tensor and nothing else whose result has its shape and dtype.
_SAME_AS_INPUT = (
  "abs",
  "neg",
  "exp",
  "exp2",
  "expm1",
  "log",
  "log1p",
  "log2",
  "sin",
  "cos",
  "tan",
  "tanh",
  "sigmoid",
  "relu",
  "silu",
  "sqrt",
  "rsqrt",
  "erf",
  "reciprocal",
  "hardswish",
  "mish",
)


_PLAIN_RULES: dict[Any, Any] = {
  **{getattr(torch.ops.aten, name).default: _same for name in _SAME_AS_INPUT},
  torch.ops.aten.linear.default: _linear,
  torch.ops.aten.mm.default: _mm,
  torch.ops.aten.bmm.default: _bmm,
  torch.ops.aten.addmm.default: _addmm,
}


def _verdict(
  func: Any, error: Exception, margs: Any, mkwargs: dict, args: Any, kwargs: dict, stood_in: bool
) -> Exception | None:
  """`_refusal`, where traced scalars stood in by values of their kind: only if the meta
  kernel refuses another set of stand-ins too (a shape mistake, not a value check of a
  stand-in such as `geometric_`'s p in (0, 1))."""
  if stood_in:
    other_args, other_kwargs = _meta_args(args, kwargs, None, other=True)
    try:
      func(*other_args, **other_kwargs)
      return None  # the verdict depends on the scalars' values, which are unknown here
    except Exception as e:  # noqa: BLE001
      if type(e) is not type(error):
        return None
  return _refusal(func, error, margs, mkwargs)


def _meta_args(
  args: Any, kwargs: dict, stand_ins: list | None = None, other: bool = False
) -> tuple[Any, dict]:
  margs, mkwargs = jax.tree_util.tree_map(lambda x: _meta_arg(x, stand_ins, other), (args, kwargs))
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
  stand_ins: list = []
  margs, mkwargs = _meta_args(args, kwargs, stand_ins)
  try:
    func(*margs, **mkwargs)
  except Exception as e:  # noqa: BLE001 - sorted by `_verdict`
    return _verdict(func, e, margs, mkwargs, args, kwargs, bool(stand_ins))
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
        out = narrowing.track(out.astype(narrowed), None)  # proven in `narrowing.after_call`
        want = narrowed
    if np.dtype(out.dtype) != want:
      out = out.astype(want)
  return out
