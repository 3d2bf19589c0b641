"""Torch's 64-bit values in a JAX program built with 64-bit types off: exact or refused.

Such a program (`jax.jit` with `jax_enable_x64` off, see `scope.narrow`) cannot hold int64
values, so torch's int64 tensors are held as int32 arrays. That is exact exactly when every
value fits in int32, which the bridge shows while tracing, op by op, instead of hoping:
each int32 array that stands for an int64 tensor carries a bound on its absolute values
(`track`), and each op producing one computes its bound from its inputs' bounds (a position
is below its tensor's size, `a + b` below the sum of the bounds, a conversion from float is
unbounded; `after_call`). A bound past int32 refuses the op with a `NarrowingError` that
names it, except for a sum, difference or negation of values that each fit: each run of the
program checks those (`ffi.stage_check`), as it checks an int64 input of the program (`enter`).
Float64 (complex128) values are never exact in 32 bits: creating one is refused.

So nothing inside such a program warns: its int64 values are torch's. What the user can see
is an int64 output of their torch function arriving as an int32 array; that is said once per
function or module class (`returned`).

Bounds live in the trace scope (one table per traced call; `track` before the scope begins
keeps them for it), keyed by the identity of a tensor's storage (so its views share them) or
of an array just made.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax._src import core as _jax_core

from bridge._src import dtypes
from bridge._src import ffi
from bridge._src import scope
from bridge._src import tensor as tensor_lib
from bridge._src import tree as tree_lib
from bridge._src.errors import NarrowingError

LIMIT = 2**31 - 1
INF = math.inf
_TRUE_32 = (torch.int32, torch.uint32)
_NATIVE = {
  np.dtype(np.bool_): 1,
  np.dtype(np.int8): 128,
  np.dtype(np.uint8): 255,
  np.dtype(np.int16): 2**15,
  np.dtype(np.uint16): 2**16 - 1,
  np.dtype(np.int32): 2**31,
  np.dtype(np.uint32): 2**32 - 1,
}

# Ops whose results are values of their inputs, moved or selected (or a scalar argument).
_MOVE = frozenset(
  """
  _to_copy to clone copy copy_ detach alias lift_fresh view _unsafe_view reshape expand expand_as
  permute transpose t squeeze unsqueeze flatten unflatten slice select narrow as_strided
  diagonal movedim split split_with_sizes chunk unbind tensor_split cat stack hstack vstack
  flip roll repeat tile tril triu constant_pad_nd pad where masked_fill fill zero full full_like
  zeros zeros_like ones ones_like empty empty_like new_zeros new_ones new_full new_empty
  empty_strided scalar_tensor arange range linspace amax amin maximum minimum clamp clamp_min
  clamp_max max min sort topk kthvalue median nanmedian mode cummax cummin msort unfold
  max_pool1d_with_indices max_pool2d_with_indices max_pool3d_with_indices adaptive_max_pool1d
  adaptive_max_pool2d adaptive_max_pool3d fractional_max_pool2d fractional_max_pool3d
  sign sgn relu _reshape_alias contiguous index_put scatter masked_scatter diag diag_embed
  block_diag randint randperm index_select gather take take_along_dim index embedding one_hot
""".split()
)
# ... of which only the first argument's values (and a `value`/`src`) reach the result.
_SELECT = {
  "index_select": (0,),
  "gather": (0,),
  "take": (0,),
  "take_along_dim": (0,),
  "index": (0,),
  "embedding": (0,),
  "index_put": (0, 2),
  "scatter": (0, 3),
  "scatter_reduce": (0, 3),
  "masked_scatter": (0, 2),
  "masked_fill": (0, 2),
  "where": (1, 2),
  "one_hot": (),
}
# Ops whose integer results are positions or counts: below the largest input's size.
_INDEX = frozenset(
  """
  argmax argmin argsort nonzero nonzero_static searchsorted bucketize bincount count_nonzero
  unique _unique _unique2 unique_consecutive unique_dim histc _embedding_bag multinomial
  sym_numel numel size
""".split()
)
# Multi-output ops whose output 0 is values of the input, and output 1 positions.
_INDEX_OUT1 = frozenset(
  """
  sort topk kthvalue median nanmedian mode cummax cummin max min max_pool1d_with_indices
  max_pool2d_with_indices max_pool3d_with_indices adaptive_max_pool1d adaptive_max_pool2d
  adaptive_max_pool3d fractional_max_pool2d fractional_max_pool3d
""".split()
)
# ... and those whose output 0 is the input's values, the others positions or counts.
_VALUES_OUT0 = frozenset("unique _unique _unique2 unique_consecutive unique_dim".split())
_SUM = frozenset("sum nansum cumsum trace".split())
_PROD = frozenset("prod cumprod".split())
_MATMUL = frozenset(
  "mm bmm matmul dot vdot mv addmm addmv addbmm baddbmm linear einsum "
  "tensordot inner outer ger".split()
)
_DIV = frozenset("floor_divide div remainder fmod rshift bitwise_right_shift __rshift__".split())
# Ops that add the values of `src` (argument 2 or 3) into `self`, possibly several times.
_ACCUMULATE = {"scatter_add": 3, "index_add": 3, "index_put": 2, "scatter": 3, "scatter_reduce": 3}


def _table() -> dict | None:
  return scope._ACTIVE.get().bounds


def track(array: Any, bound: float | None) -> Any:
  """Record that int32 `array` holds an int64 tensor's values, all within +-`bound` (None:
  the op that made it is to be proven by `after_call`)."""
  table = _table()
  if table is None:  # an input of a call whose trace scope is about to begin
    if not (scope.is_staged() and not dtypes.x64_enabled()):
      return array
    table = scope._pending.bounds = getattr(scope._pending, "bounds", None) or {}
  table[id(array)] = (array, bound)
  return array


def narrow_dtype(dtype: torch.dtype, what: str) -> torch.dtype:
  """`dtype`, or inside a 32-bit program its int32 counterpart; a float64 or complex128 value
  there is refused."""
  narrowed = dtypes.NARROWED.get(dtype)
  if narrowed is None or not scope.narrow():
    return dtype
  if dtype.is_floating_point or dtype.is_complex:
    raise refuse_float(what, dtype)
  return narrowed


def known(
  t: torch.Tensor, what: str, narrow: bool | None = None
) -> tuple[torch.Tensor, float | None]:
  """CPU tensor `t`, of known values, about to join a program: inside a 32-bit one (`narrow`;
  default: whether the current trace scope is one), a 64-bit integer tensor is checked to fit
  and narrowed, and its bound returned for `track`; a float64 one is refused. Elsewhere, or
  for other dtypes, `(t, None)`."""
  if t.dtype not in dtypes.NARROWED or not (scope.narrow() if narrow is None else narrow):
    return t, None
  if t.dtype.is_floating_point or t.dtype.is_complex:
    raise refuse_float(what, t.dtype)
  bound = known_bound(t)
  check(what, bound, moved=True)
  return t.to(dtypes.NARROWED[t.dtype]), bound


def enter(array: Any, where: str) -> Any:
  """An input of torch code about to be staged into a 32-bit program, as it may enter: a
  64-bit integer array is checked to fit in int32 (now if known, else when the program
  runs), since JAX's own ops narrow it to int32 there; a float64 one is refused."""
  dtype = np.dtype(array.dtype)
  if dtype.kind in "fc":
    raise refuse_float(where, dtype)
  value = _concrete(array)
  if value is not None:
    bound = known_bound(torch.tensor(np.asarray(value, np.int64)))  # (a copy: it may be read-only)
    check(where, bound, moved=True)
    return track(array, bound)
  limits = np.iinfo(np.int32)
  with jax.enable_x64(True):  # (comparisons only: JAX lowers the program with x64 off)
    bad = (array < limits.min) | (array > limits.max)
  _stage_or_refuse(
    bad,
    None,
    where,
    lambda value, position: NarrowingError(
      f"bridge: {where} is {dtype.name} and holds a value at flat position {position} that "
      "int32 cannot hold; the JAX program it was passed to is built with JAX's 64-bit types "
      "disabled, so it computes with int32. Enable 64-bit types "
      "(`jax.config.update('jax_enable_x64', True)`) to keep it exactly."
    ),
    f"enter {dtype.name}",
  )
  return track(array, 2**31)


def _concrete(x: Any) -> Any:
  if not isinstance(x, jax.core.Tracer):
    return np.asarray(x)
  return _jax_core.to_concrete_value(x)


def _stage_or_refuse(
  bad: Any, values: Any, what: str, error: Callable[[Any, int], BaseException], kind: str
) -> None:
  """A run-time check of `bad` (`ffi.stage_check`, named by `kind` and `what`, which make its
  error), or a refusal where programs cannot make host calls."""
  if not ffi.supported():
    raise refuse_int(what, INF)
  ffi.stage_check(bad, values, error, ("narrowing", kind, what))


def _entry(table: dict, obj: Any) -> Any:
  entry = table.get(id(obj))
  return entry if entry is not None and entry[0] is obj else None


def bound_of(x: Any, table: dict) -> float:
  """A bound on the absolute values of `x` (an argument of an op in the 32-bit program)."""
  if isinstance(x, bool):
    return 1
  if isinstance(x, int):
    return abs(x)
  if isinstance(x, float):
    return abs(x) if math.isfinite(x) else INF
  if isinstance(x, (tuple, list)):
    return max((bound_of(v, table) for v in x), default=0)
  storage = getattr(x, "_storage", None)
  if storage is not None:  # a `jax` tensor
    entry = _entry(table, storage) or _entry(table, storage.array)
    if entry is not None and entry[1] is not None:
      return entry[1]
    return _NATIVE.get(np.dtype(storage.array.dtype), INF)
  if isinstance(x, torch.Tensor):  # a CPU tensor: a known value
    return known_bound(x)
  dtype = getattr(x, "dtype", None)
  if dtype is None:
    return 0
  entry = _entry(table, x)
  if entry is not None and entry[1] is not None:
    return entry[1]
  return _NATIVE.get(np.dtype(dtype), INF)


def known_bound(values: Any) -> float:
  """The bound of known values (a constant of the program: a CPU tensor, a folded result)."""
  t = torch.as_tensor(values)
  if t.numel() == 0:
    return 0
  if t.dtype.is_floating_point or t.dtype.is_complex:
    return INF
  return max(abs(int(t.min())), abs(int(t.max())))


def _size(x: Any) -> int:
  if isinstance(x, (tuple, list)):
    return max((_size(v) for v in x), default=0)
  return math.prod(x.shape) if hasattr(x, "shape") else 0


def _rule(name: str, i: int, args: tuple, kwargs: dict, table: dict) -> tuple[float, bool]:
  """(the bound of output `i` of op `name` on these jax-level arguments, whether the op only
  moves values: an int32 value moved is exact, only arithmetic can overflow)."""
  bound = _arith(name, i, args, kwargs, table)
  if bound is not None:
    return bound, False
  if name == "view" and any(isinstance(v, torch.dtype) for v in args[1:]):
    return INF, False  # a reinterpretation of the bits: not the values
  if name in _VALUES_OUT0 and i == 0:
    return bound_of(args[0], table), True
  if name == "repeat_interleave":  # (`repeat_interleave(repeats)` gives positions)
    return max(bound_of(args[0], table), _size(args[0])), True
  if name in _INDEX or (i == 1 and name in _INDEX_OUT1):
    leaves = list(args) + list(kwargs.values())
    bound = max((_size(v) for v in leaves), default=0) + 1
    if name == "nonzero_static":  # (the rows past the nonzero ones hold `fill_value`)
      bound = max(bound, abs(kwargs.get("fill_value", args[2] if len(args) > 2 else -1)))
    return bound, False
  if name in _SELECT:
    picked = [args[k] for k in _SELECT[name] if k < len(args)]
    picked += [kwargs[k] for k in ("value", "src", "values") if k in kwargs]
    return max((bound_of(v, table) for v in picked), default=1), True
  if name in _MOVE:
    leaves = list(args) + list(kwargs.values())
    return max((bound_of(v, table) for v in leaves), default=0), True
  return INF, False  # an op the rules do not know: not proven


def _arith(name: str, i: int, args: tuple, kwargs: dict, table: dict) -> float | None:
  """The bound of an arithmetic op's result, or None for other ops."""
  leaves = list(args) + list(kwargs.values())
  b = [bound_of(v, table) for v in args]
  first = b[0] if b else 0
  if name in ("abs", "neg", "negative"):
    return first
  if name in _ACCUMULATE and _accumulates(name, args, kwargs):
    k = _ACCUMULATE[name]
    src = (
      args[k]
      if len(args) > k
      else kwargs.get("src", kwargs.get("source", kwargs.get("values", kwargs.get("value", 0))))
    )
    reduce = kwargs.get("reduce", args[4] if name == "scatter_reduce" and len(args) > 4 else "")
    if reduce in ("prod", "multiply"):
      return INF
    return first + bound_of(src, table) * max(_size(src), 1)
  if name in ("add", "sub", "rsub"):
    alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
    return first + (b[1] if len(b) > 1 else 0) * bound_of(alpha, table)
  if name == "mul":
    return first * (b[1] if len(b) > 1 else 1)
  if name in _SUM:
    return first * max(_size(args[0]), 1)
  if name in _PROD:
    n = max(_size(args[0]), 1)
    return first**n if first <= 1 or n * math.log2(first) < 64 else INF
  if name in _MATMUL:
    arrays = [v for v in leaves if hasattr(v, "shape")]
    return math.prod(bound_of(v, table) for v in arrays) * max(map(_size, arrays), default=1)
  if name in _DIV:
    return max(b[:2], default=0)
  if name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    # (values within +-B lie in [-2**k, 2**k) for the 2**k above B, and so do these)
    return 2 * max(b[:2], default=0) + 1
  if name == "bitwise_not":
    return first + 1
  if name in ("pow", "square"):
    e = b[1] if len(b) > 1 else 2
    return first**e if first <= 1 or e * math.log2(first) < 64 else INF
  if name in ("lshift", "bitwise_left_shift", "__lshift__"):
    shift = b[1] if len(b) > 1 else 0
    return first * 2**shift if shift < 64 else INF
  return None


def _accumulates(name: str, args: tuple, kwargs: dict) -> bool:
  """Whether this call adds into `self` (rather than only writing values)."""
  if name in ("scatter_add", "index_add"):
    return True
  if name == "index_put":
    return bool(kwargs.get("accumulate", args[3] if len(args) > 3 else False))
  if name == "scatter_reduce":
    reduce = kwargs.get("reduce", args[4] if len(args) > 4 else "sum")
    return reduce not in ("amax", "amin")
  return kwargs.get("reduce") is not None  # scatter(..., reduce="add"/"multiply")


def _name(func: Any) -> str:
  name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
  return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def refuse_float(what: str, dtype: Any) -> NarrowingError:
  name = _short(dtype)
  return NarrowingError(
    f"bridge: {what} ({name}) cannot be computed exactly here: the torch code is being "
    f"traced into a JAX program built with JAX's 64-bit types disabled, which cannot hold "
    f"{name} values, and computing it in 32 bits would give other numbers than torch. "
    "Enable 64-bit types (`jax.config.update('jax_enable_x64', True)`, or `with jax.enable_x64(True):` around "
    "the jitted call), or keep the torch code in 32 bits (`.float()`). First at\n  "
    f"{scope.user_line()}"
  )


def refuse_int(what: str, bound: float, reason: str = "") -> NarrowingError:
  reach = reason or (
    "unbounded values from its inputs"
    if bound == INF
    else f"values up to {int(bound)} from its inputs"
  )
  return NarrowingError(
    f"bridge: {what} (int64) cannot be computed exactly here: the torch code is being traced "
    "into a JAX program built with JAX's 64-bit types disabled, which holds int64 tensors as "
    "int32. That is exact "
    "only while every value fits in int32, and here the bridge cannot show it does "
    f"({reach}). Enable 64-bit types "
    "(`jax.config.update('jax_enable_x64', True)`, or `with jax.enable_x64(True):` around "
    "the jitted call). First at\n  "
    f"{scope.user_line()}"
  )


def check(what: str, bound: float, moved: bool = False) -> None:
  """Refuse `what` unless its values fit in int32 (moved int32 values do, -2**31 included)."""
  if bound > (2**31 if moved else LIMIT):
    raise refuse_int(what, bound)


# Torch functions (their code) and module classes whose int64 outputs `returned` warned about.
_told: set = set()


def returned_held(fn: Any, out: Any, api: str) -> None:
  """`returned` for the tensors in `out`, the output of the user's torch function or module
  `fn`, that the current 32-bit program holds as int32 for torch's int64."""
  table = _table()
  if table is None or _owner(fn)[0] in _told:
    return
  leaves = tree_lib.flatten(out)[0]
  if any(map(_named_tuple, leaves)):  # torch's (values, indices) named tuples
    out = tree_lib.tree_map(lambda x, _: tuple(x) if _named_tuple(x) else x, out)
    leaves = tree_lib.flatten(out)[0]
  held = [
    (i, tuple(x.shape), _WIDE[x.dtype])
    for i, x in enumerate(leaves)
    if isinstance(x, torch.Tensor) and x.dtype in _WIDE and _is_tracked(table, x)
  ]
  if held:
    returned(fn, out, held, api)


_WIDE = {narrow: wide for wide, narrow in dtypes.NARROWED.items() if not wide.is_floating_point}


def _named_tuple(x: Any) -> bool:
  return type(x).__module__ == "torch.return_types"


def returned(fn: Any, out: Any, held: list[tuple[int, tuple, torch.dtype]], api: str) -> None:
  """Warn that the user's torch function or module `fn` returns int64 tensors that come back
  as int32 arrays (`held`: their leaf indices in the output tree `out`, shapes and torch
  dtypes); once per function or module class.

  The one place the user sees a 32-bit program's narrowing: every other int64 value in it is
  proven exact or checked, and stays inside; these reach the caller with other dtypes than
  torch's (the values are torch's).
  """
  key, label = _owner(fn)
  if key in _told:
    return
  _told.add(key)
  paths = tree_lib.leaf_paths(out)
  listing = "; ".join(
    f"output {paths[i] or '<root>'} (shape {tuple(shape)}, {_short(dt)} -> "
    f"{_short(dtypes.NARROWED[dt])})"
    for i, shape, dt in held
  )
  one = len(held) == 1
  scope.warn(
    f"`{api}`: {label} returns {'an int64 tensor' if one else 'int64 tensors'}, which "
    f"{'comes back as an int32 array' if one else 'come back as int32 arrays'}: {listing}. "
    "The JAX program it returns to is built with JAX's 64-bit types disabled, which cannot "
    "hold int64 values; the values are torch's (each is shown to fit in int32, or checked "
    "when the program runs), only the dtype differs. To get int64, enable 64-bit types "
    "(`jax.config.update('jax_enable_x64', True)`, or `with jax.enable_x64(True):` around "
    "the jitted call); to say int32 is meant, return `.int()` from the torch code. Said once "
    f"per function, here at\n  {scope.user_line()}"
  )


def _owner(fn: Any) -> tuple[Any, str]:
  """(what `returned` warns once for, how it names it): a module's class, a function's code."""
  while isinstance(fn, functools.partial):
    fn = fn.func
  if isinstance(fn, torch.nn.Module):
    return type(fn), f"`{type(fn).__name__}.forward`"
  fn = getattr(fn, "__func__", fn)  # a bound method: its function
  label = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
  code = getattr(fn, "__code__", None)
  if code is not None:
    return code, f"`{label}`"
  if label is not None and isinstance(fn, Hashable):  # a builtin (`torch.argmax`): itself
    return fn, f"`{label}`"
  return type(fn), f"`{label or type(fn).__name__}`"  # a callable object: its class


def _short(dtype: torch.dtype) -> str:
  return str(dtype).removeprefix("torch.")


def after_call(func: Any, args: tuple, kwargs: dict, result: Any) -> None:
  """Prove (or refuse) the int64 results of one op staged into a 32-bit program: `result`
  is its output (tensors), `args`/`kwargs` its torch-level arguments."""
  table = _table()
  if table is None:
    return
  outs = result if isinstance(result, (tuple, list)) else (result,)
  tracked = None
  for i, o in enumerate(outs):
    storage = getattr(o, "_storage", None)
    if storage is None or o.dtype not in (torch.int32, torch.uint32):
      continue
    if kwargs.get("dtype") in _TRUE_32 and _name(func) == "_to_copy":
      continue  # `.int()`: a true int32 from here on, with torch's int32 semantics
    born = _entry(table, storage.array)  # narrowed from int64 where it was made
    if born is not None and born[1] is not None:
      bound = born[1]  # a known value's
    else:
      if born is None:
        if tracked is None:
          tensors = _tensors((args, kwargs))
          # (a factory's result is tracked whatever its dtype: an int64 `out=` target made
          # as int32 hands its dtype down to the factory that fills it)
          tracked = (
            not tensors
            or any(_is_tracked(table, v) for v in tensors)
            or _wide_in_torch(func, args, kwargs)
          )
        if not tracked:
          continue  # int32 from int32: torch computes it in 32 bits too
      name = _name(func)
      bound, moved = _rule(name, i, args, kwargs, table)
      if bound > LIMIT and not moved and name in _CHECKED and _checkable(args, kwargs, table):
        _check_overflow(func, name, args, storage.array)
        bound = LIMIT
      check(f"the result of {func}", bound, moved)
    table[id(storage)] = (storage, bound)


# Ops whose int32 overflow a program can detect itself, cheaply: where their bound is not
# proven, each run checks it (a host call that fails the run) instead of refusing the op.
_CHECKED = frozenset({"add", "sub", "rsub", "neg", "negative", "abs"})


def _checkable(args: tuple, kwargs: dict, table: dict) -> bool:
  alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
  return alpha == 1 and all(bound_of(v, table) <= 2**31 for v in args[:2])


def _check_overflow(func: Any, name: str, args: tuple, result: Any) -> None:
  """Stage a check that `result` (int32) is the exact result of this int64 op."""

  def int32(x: Any) -> Any:
    v = tensor_lib.value(x) if isinstance(x, tensor_lib.Tensor) else x
    return jnp.asarray(v).astype(np.int32)  # (exact: every input fits, `_checkable`)

  a = int32(args[0])
  r = result.astype(np.int32)
  if name in ("neg", "negative", "abs"):
    bad = a == np.iinfo(np.int32).min
  else:
    b = int32(args[1])
    if name == "rsub":
      a, b = b, a
    # two's complement: a sum overflows when both operands' signs differ from the result's
    bad = (((a ^ r) & (b ^ r)) < 0) if name == "add" else (((a ^ b) & (a ^ r)) < 0)
  bad = jnp.broadcast_to(bad, r.shape)
  known = _concrete(bad)
  what = f"the result of {func}"
  if known is not None:
    if np.any(known):
      raise refuse_int(what, INF)
    return
  _stage_or_refuse(
    bad,
    None,
    what,
    lambda value, position: NarrowingError(
      f"bridge: {what} (int64) overflows int32 at flat position {position}: the JAX program "
      "it runs in is built with JAX's 64-bit types disabled, so it computes torch's int64 "
      "values as int32, checked each run where they may not fit. Enable 64-bit types "
      "(`jax.config.update('jax_enable_x64', True)`) to keep them exactly."
    ),
    "overflow",
  )


def _wide_in_torch(func: Any, args: tuple, kwargs: dict) -> bool:
  """Whether torch gives an int64 result for these arguments (asked of its meta kernels)."""

  def meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
      return torch.empty(x.shape, dtype=x.dtype, device="meta")
    if isinstance(x, torch.device):
      return torch.device("meta")
    return x

  try:
    out = (
      func(
        *[_map(meta, a) for a in args],
        **{k: _map(meta, v) for k, v in kwargs.items() if k != "device"},
        device="meta",
      )
      if "device" in kwargs
      else func(*[_map(meta, a) for a in args], **{k: _map(meta, v) for k, v in kwargs.items()})
    )
  except Exception:  # noqa: BLE001 - no meta kernel: not known to be wide
    return False
  return any(
    isinstance(o, torch.Tensor) and o.dtype in (torch.int64, torch.uint64) for o in _tensors(out)
  )


def _map(fn: Any, x: Any) -> Any:
  if isinstance(x, (tuple, list)):
    return type(x)(_map(fn, v) for v in x)
  return fn(x)


def _is_tracked(table: dict, t: Any) -> bool:
  storage = getattr(t, "_storage", None)
  return storage is not None and (
    _entry(table, storage) is not None or _entry(table, storage.array) is not None
  )


def stored(target: Any, new: Any) -> None:
  """`new` was written into (part of) the tracked `target` in place: widen its bound."""
  table = _table()
  if table is None:
    return
  if not (_is_tracked(table, target) or _is_tracked(table, new)):
    return  # a true int32 tensor keeps torch's int32 semantics
  bound = bound_of(new, table)
  if not target._whole:
    bound = max(bound, bound_of(target, table))
  table[id(target._storage)] = (target._storage, bound)


def _tensors(tree: Any) -> list:
  out: list = []
  stack = [tree]
  while stack:
    x = stack.pop()
    if isinstance(x, (tuple, list)):
      stack.extend(x)
    elif isinstance(x, dict):
      stack.extend(x.values())
    elif isinstance(x, torch.Tensor):
      out.append(x)
  return out
