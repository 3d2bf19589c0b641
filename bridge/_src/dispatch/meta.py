"""torch's own shapes and dtypes for an op (its meta kernel), and a lowering's results cast
to them.
"""

from __future__ import annotations

import re
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


_META_REFUSALS = (RuntimeError, IndexError, ValueError, AssertionError)


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
    # (only torch's check errors, and the ValueError or AssertionError of a meta kernel written
    # in Python (`add`'s alpha, `clamp` without bounds, `nll_loss`'s weight); a TypeError here
    # more likely says how the arguments were stood in for than that torch refuses them)
    if isinstance(e, _META_REFUSALS):
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


def _cpu_arg(x: Any, fill: int = 0) -> Any:
  """A meta tensor as a CPU tensor of its shape and dtype, of `fill`s (stride 0 if large)."""
  if isinstance(x, torch.Tensor) and x.device.type == "meta":
    if x.numel() <= _SMALL:
      return torch.full(x.shape, fill, dtype=x.dtype)
    return torch.full((), fill, dtype=x.dtype).expand(x.shape)
  return x


def _cpu_run(func: Any, margs: Any, mkwargs: dict, fill: int) -> Exception | None:
  """The exception torch's CPU kernel raises for stand-ins of the meta arguments (tensors of
  `fill`s), or None. Its random draws (a kernel with a `Generator?` argument gets one of its
  own; any other's are undone) leave torch's generator as it was."""
  try:
    cargs, ckwargs = jax.tree_util.tree_map(
      lambda x: _cpu_arg(x, fill),
      (margs, mkwargs),
      is_leaf=lambda x: isinstance(x, torch.Tensor),
    )
  except Exception:  # noqa: BLE001 - no stand-in of this dtype: no verdict
    return _NO_STAND_IN
  if "device" in ckwargs:
    ckwargs["device"] = "cpu"
  generator = _generator_arg(func)
  if generator is not None:
    at, name = generator
    if at < len(cargs):
      cargs = (*cargs[:at], torch.Generator(), *cargs[at + 1 :])
    else:
      ckwargs[name] = torch.Generator()
  try:
    with torch.no_grad():
      if generator is None and torch.Tag.nondeterministic_seeded in func.tags:
        with torch.random.fork_rng(devices=[]):
          func(*cargs, **ckwargs)
      else:
        func(*cargs, **ckwargs)
  except Exception as e:  # noqa: BLE001 - the caller picks the errors it trusts
    return e
  return None


class _NoStandIn(Exception):
  """No stand-in could be made (a dtype torch cannot fill): never a verdict."""


_NO_STAND_IN = _NoStandIn()


def _generator_arg(func: Any) -> tuple[int, str] | None:
  """(position, name) of `func`'s `Generator?` argument, if it has one."""
  for i, a in enumerate(func._schema.arguments):
    if isinstance(a.type, torch.OptionalType) and a.type.getElementType().kind() == "GeneratorType":
      return i, a.name
  return None


def _alike(error: Exception, again: Exception | None) -> bool:
  """Whether `again` is `error`: its type and its words."""
  return type(again) is type(error) and str(again) == str(error)


# --- the dtypes torch's CPU kernels refuse --------------------------------------------------------
#
# torch's meta kernels accept dtypes its CPU kernels lack (`softmax` of integers, `sort` of
# complex numbers, `bool_mask @ bool_mask`, `cdist` in float16): the CPU kernel is asked, on
# stand-ins, once per argument signature. float32 and float64 tensors are what every CPU kernel
# of a floating op takes; any other dtype (integers, bool, complex, float16, bfloat16), of a
# tensor or of a `dtype` argument, is asked about.

_ANY_KERNEL = frozenset((np.dtype("float32"), np.dtype("float64")))
_ANY_KERNEL_TORCH = frozenset((torch.float32, torch.float64))
_REFUSALS = (RuntimeError, IndexError, ValueError, TypeError)  # NotImplementedError is one
# What a refusal of dtypes names (`"softmax_lastdim_kernel_impl" not implemented for 'Long'`,
# "Sort does not support complex dtypes on CPU", "Boolean inputs not supported for relu"); an
# error that names none (an index out of range, a singular matrix) is about values, not dtypes
_NAMES_A_DTYPE = re.compile(
  r"\b(dtypes?|types?|complex\w*|bool(ean)?|integ\w*|float\w*|double|half|bfloat16|long|"
  r"u?int\d*|byte|short|char)\b",
  re.IGNORECASE,
)
_STAND_IN_MAX = 4096  # elements of a stand-in or a result: its CPU kernel is cheap
# Ops whose CUDA kernels take dtypes their CPU kernels refuse (`histc` of integers, which
# Hugging Face's Mixtral calls off the CPU): the `jax` device is an accelerator to torch code,
# which may pick such dtypes for it, so the CPU kernel's refusal is not asked for these.
_ACCELERATOR_DTYPES = frozenset({"aten::histc"})


def rare_dtypes(dyn: Any) -> bool:
  """Whether some array among an op's traced arguments `dyn` (not a traced Python scalar) has
  a dtype other than float32/float64."""
  for d in dyn:
    dtype = getattr(d, "dtype", None)
    if dtype is not None and dtype not in _ANY_KERNEL and (np.ndim(d) or not weak(d)):
      return True
  return False


def rare_dtype_arguments(statics: Any) -> bool:
  """Whether an op's static arguments name a dtype other than float32/float64."""
  return any(isinstance(s, torch.dtype) and s not in _ANY_KERNEL_TORCH for s in statics)


def kernel_refusal(func: Any, args: Any, kwargs: dict, expected: Any) -> Exception | None:
  """The exception torch's CPU kernel raises for arguments of these dtypes, where it lacks a
  kernel for them (`NotImplementedError: "softmax_lastdim_kernel_impl" not implemented for
  'Long'`), or None: the caller asks only where a dtype is rare (`rare_dtypes`), once per
  argument signature; `expected` is the meta kernel's result for them.

  The kernel runs on stand-ins: tensors of the arguments' shapes where they and the results
  are small (else of their shapes with each dimension cut to a few elements, where the meta
  kernel takes those), once of zeros and once of ones, with traced Python scalars as two sets
  of values (`STAND_INS`). A refusal is the same exception, in the same words, for both, and
  names a dtype: an error that depends on values (an integer division by zero, an index out
  of range, a singular matrix) is not taken for one. Where unsure, None."""
  if func.name().startswith("aten::_unsafe"):  # (unchecked indexing: ones may read past the end)
    return None
  if func.name() in _ACCELERATOR_DTYPES:  # (what torch's CUDA kernel takes, the device takes)
    return None
  try:
    zeros = _meta_args(args, kwargs)
    ones = _meta_args(args, kwargs, None, other=True)
  except Exception:  # noqa: BLE001 - a symbolic shape, a dtype torch lacks: unsure
    return None
  if not _small(zeros, expected):
    cut = _cut(zeros, ones)
    if cut is None:
      return None
    zeros, ones = cut
    try:
      expected = func(*zeros[0], **zeros[1])
    except Exception:  # noqa: BLE001 - the meta kernel refuses the cut shapes: unsure
      return None
    if not _small(zeros, expected):  # (a factory of a large size)
      return None
  error = _cpu_run(func, *zeros, 0)
  if error is None or not isinstance(error, _REFUSALS) or not _NAMES_A_DTYPE.search(str(error)):
    return None
  if not _alike(error, _cpu_run(func, *ones, 1)):
    return None
  return error


def _meta_tensors(tree: Any) -> list[torch.Tensor]:
  return [
    t
    for t in jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, torch.Tensor))
    if isinstance(t, torch.Tensor)
  ]


def _small(margs: tuple, expected: Any) -> bool:
  """Whether every tensor argument and result has at most `_STAND_IN_MAX` elements (a result
  the meta kernel cannot tell counts as large only if no argument is a tensor)."""
  tensors = _meta_tensors(margs)
  if expected is None and not tensors:
    return False
  return all(t.numel() <= _STAND_IN_MAX for t in [*tensors, *_meta_tensors(expected)])


def _cut(zeros: tuple, ones: tuple) -> tuple[tuple, tuple] | None:
  """The meta arguments with each dimension of each tensor cut to one length, so that each
  tensor has at most about `_STAND_IN_MAX` elements (equal sizes stay equal, sizes 0 and 1
  stay); None if no argument is a tensor."""
  tensors = _meta_tensors(zeros)
  rank = max((t.dim() for t in tensors), default=0)
  if not rank:
    return None
  limit = max(2, int(_STAND_IN_MAX ** (1 / rank)))

  def cut(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
      return torch.empty([min(n, limit) for n in x.shape], dtype=x.dtype, device="meta")
    return x

  def each(tree: tuple) -> tuple:
    return jax.tree_util.tree_map(cut, tree, is_leaf=lambda x: isinstance(x, torch.Tensor))

  return each(zeros), each(ones)


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
  if not isinstance(error, (*_META_REFUSALS, TypeError)):
    return None
  if isinstance(error, NotImplementedError) or type(error).__module__.startswith(
    "torch._subclasses"
  ):  # no meta kernel; a data-dependent output shape
    return None
  cpu_error = _cpu_run(func, margs, mkwargs, 0)
  if cpu_error is None or isinstance(cpu_error, type(error)):
    return cpu_error
  # A meta kernel written in Python words a refusal as a ValueError or AssertionError where
  # the CPU kernel raises a RuntimeError (`add`'s alpha): the CPU kernel's own error, if it is
  # no verdict on the zeros (it refuses ones too, in the same words)
  again = _cpu_run(func, margs, mkwargs, 1)
  if not isinstance(cpu_error, _REFUSALS) or not _alike(cpu_error, again):
    return None
  return cpu_error


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
