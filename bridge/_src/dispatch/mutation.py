"""In-place and `out=` ops on the `jax` device: compute with the functional twin, then store.

`x.add_(y)` runs `add.Tensor`'s plan and writes the result into `x`'s storage
(so every view of `x` sees it); `torch.add(x, y, out=o)` does the same into `o`,
resizing it as torch does; ops that mutate positional arguments (`_native_batch_norm_legit`)
run their `_functional` variant, which returns the new values.
"""

from __future__ import annotations

import gc
import math
import sys
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from bridge._src import dtypes
from bridge._src import narrowing
from bridge._src import scope
from bridge._src import strided
from bridge._src.dispatch import fallback
from bridge._src.dispatch.functional import FunctionalPlan
from bridge._src.dispatch.resolve import decomposing, decomposing_scope, decomposition
from bridge._src.dispatch.schema import aten, is_view, mutated_args, x64
from bridge._src.errors import BridgeTypeError
from bridge._src.registry import REGISTRY
from bridge._src.tensor import Tensor, make, make_view, storage_numel, value, write

_FILLED = ("dtype", "layout", "device", "pin_memory")


def _arguments(func: Any) -> list[tuple[str, str, bool]]:
  return [(a.name, str(a.type), a.has_default_value()) for a in func._schema.arguments]


def _functional_twin(func: Any) -> Any:
  """The non-mutating overload computing what `func` writes, or None."""
  name = func._schema.name.split("::")[-1]
  dunder = name.startswith("__i") and name.endswith("__")  # `x <<= 1`: `__ilshift__`
  in_place = dunder or name.endswith("_")
  packet_name = "__" + name[3:] if dunder else name[:-1] if in_place else name
  overload = func._overloadname
  mutated = set(mutated_args(func))
  packet = getattr(aten, packet_name, None)
  if packet is None:
    return None
  if in_place:
    # the overload of the same name, if it takes the same arguments (`pow_.Scalar` takes a
    # Scalar exponent, `pow.Scalar` a Scalar base: its twin is `pow.Tensor_Scalar`), else
    # one that does (`floor_divide_.Tensor`'s is `floor_divide.default`)
    twin = getattr(packet, overload, None)
    if twin is not None and mutated_args(twin):
      return None
    same = _arguments(func)
    if twin is not None and _arguments(twin) == same:
      return twin
    for ov in packet.overloads():  # same argument types, and defaults where it has them
      cand = getattr(packet, ov)
      if not mutated_args(cand) and _arguments(cand) == same:
        return cand
    return twin
  kwarg_only = {a.name for a in func._schema.arguments if a.kwarg_only}
  if not mutated <= kwarg_only:  # mutates positional arguments: not an out= variant
    functional = getattr(aten, f"{name}_functional", None) or getattr(
      aten, f"_{name}_functional", None
    )
    if functional is None:
      return None
    return getattr(functional, overload, None) or getattr(functional, "default", None)
  wanted = [a.name for a in func._schema.arguments if a.name not in mutated]
  loose = None
  for ov in packet.overloads():
    cand = getattr(packet, ov)
    if mutated_args(cand):
      continue
    names = [a.name for a in cand._schema.arguments]
    if names == wanted:
      return cand
    # A factory's functional form has extra keyword-only arguments (dtype, device...).
    extra = [a for a in cand._schema.arguments if a.name not in wanted]
    if [n for n in names if n in wanted] == wanted and all(
      a.kwarg_only and (a.has_default_value() or a.name in _FILLED) for a in extra
    ):
      loose = cand
  return loose


class MutatingPlan:
  """In-place and `out=` ops: compute with the functional twin, then store the results."""

  def __init__(self, func: Any, plan_of: Callable[[Any], Callable]):
    self.func = func
    self.mutated = mutated_args(func)
    self.names = [a.name for a in func._schema.arguments]
    self.twin = _functional_twin(func)
    self.inplace = func._schema.name.endswith("_")
    # an out= overload: every mutated argument is keyword-only (torch resizes those)
    self.is_out = not self.inplace and all(
      a.kwarg_only for a in func._schema.arguments if a.name in self.mutated
    )
    self.direct = None
    if self.twin is None:
      lowering = REGISTRY.lookup(func)
      if lowering is not None:
        self.direct = FunctionalPlan(func)
    self.twin_plan = plan_of(self.twin) if self.twin is not None else None

  def _fallback(self, targets: list, args: tuple, kwargs: dict) -> Any:
    """torch runs the op on copies in a host call (`fallback.writing`); the new values are
    stored into the tensors it writes, and its own results come back as new tensors."""
    run = fallback.writing(self.func)
    if run is None:
      fallback.raise_not_found(
        self.func,
        "The callback fallback cannot take it either: it writes a list of tensors."
        if fallback.available()
        else None,
      )
    outs, written = run(args, kwargs)
    for target, new in written:
      store(target, new)
    returns = self.func._schema.returns
    if all(r.alias_info is not None for r in returns):  # (aten's in-place form: the targets)
      return None if not returns else targets[0] if len(returns) == 1 else tuple(targets)
    device = next(t.device for t in targets if isinstance(t, Tensor))
    made = [make(o, device) for o in (outs if isinstance(outs, (tuple, list)) else [outs])]
    return made[0] if len(returns) == 1 else tuple(made)

  def _targets(self, args: tuple, kwargs: dict) -> list:
    targets = []
    for name in self.mutated:
      i = self.names.index(name)
      targets.append(args[i] if i < len(args) else kwargs[name])
    return targets

  def __call__(self, args: tuple, kwargs: dict) -> Any:
    targets = self._targets(args, kwargs)
    check_overlap(self.func, self.names, self.mutated, targets, args, kwargs)
    if self.twin_plan is not None:
      if self.inplace or self.twin._schema.name.endswith("_functional"):
        out = self.twin_plan(args, kwargs)
      else:
        twin_kwargs = {k: v for k, v in kwargs.items() if k not in self.mutated}
        target = targets[0]
        if isinstance(target, torch.Tensor):
          for arg in self.twin._schema.arguments:
            if arg.name == "dtype" and "dtype" not in twin_kwargs:
              twin_kwargs["dtype"] = target.dtype
            elif arg.name == "device" and "device" not in twin_kwargs:
              twin_kwargs["device"] = target.device
        out = self.twin_plan(args, twin_kwargs)
    elif self.direct is not None:
      out = self.direct(args, kwargs)
    else:
      decomp = decomposition(self.func)
      if decomp is None or self.func in decomposing():
        return self._fallback(targets, args, kwargs)
      with decomposing_scope(self.func):
        return decomp(*args, **kwargs)
    if len(targets) == 1 and isinstance(targets[0], (list, tuple)):
      outs = [out]  # one mutated Tensor[] argument (`_foreach_add_`): out is its new list
    else:
      outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if self.twin is not None and self.twin._schema.name.endswith("_functional"):
      new_values = outs[len(outs) - len(targets) :]
      results = outs[: len(outs) - len(targets)]
    else:
      new_values, results = outs[: len(targets)], None
    # torch resizes out= tensors (and `resize_` its input); other results broadcast into place
    resize = self.is_out or self.func._schema.name in _RESIZING
    if self.inplace or self.is_out:
      for target, new in zip(targets, new_values):
        _check_result(new, target, grows=not resize)
    for target, new in zip(targets, new_values):
      if isinstance(target, (list, tuple)):
        for t, n in zip(target, new):
          store(t, n, resize=resize)
      elif target is not None:
        store(target, new, resize=resize)
    if results is not None:
      return tuple(results) if len(results) > 1 else results[0]
    returns = self.func._schema.returns
    if not returns:
      return None
    return targets[0] if len(returns) == 1 else tuple(targets)


class RestridePlan:
  """In-place ops that change only a tensor's metadata (`transpose_`, `t_`, `squeeze_`,
  `unsqueeze_`, `as_strided_`...): the tensor becomes its own view, with the same storage."""

  def __init__(self, func: Any, view: Any, plan_of: Callable[[Any], Callable]):
    self.func, self.view, self.plan_of = func, view, plan_of

  def __call__(self, args: tuple, kwargs: dict) -> Any:
    target = args[0]
    view = self.plan_of(self.view)(args, kwargs)
    with torch.no_grad():
      target.data = view  # the view's sizes, strides, offset and storage (`Tensor.data`)
    return target


_RESIZING = frozenset({"aten::resize_", "aten::resize_as_"})  # (their plans: `special`)


def restride_twin(func: Any) -> Any:
  """The view op whose metadata an in-place metadata op gives its input, or None."""
  name = func._schema.name.split("::")[-1]
  if not name.endswith("_") or mutated_args(func) != [func._schema.arguments[0].name]:
    return None
  packet = getattr(aten, name[:-1], None)
  if packet is None:
    return None
  # the view overload taking the same arguments, by name and type (`transpose_.default` is
  # `transpose.int` in place; `squeeze_.dims`, of `int[] dim`, is `squeeze.dims`, not
  # `squeeze.dim` of `int dim`)
  same = _arguments(func)
  for overload in packet.overloads():
    twin = getattr(packet, overload)
    if is_view(twin) and _arguments(twin) == same:
      return twin
  return None


OVERLAP_ERROR = (
  "unsupported operation: some elements of the input tensor and the written-to tensor refer "
  "to a single memory location. Please clone() the tensor before performing the operation."
)
_PARTIAL, _FULL = "partial", "full"
# (op, written dtypes, the overlaps of one call) -> whether CPU torch refuses them
_REFUSED: dict[tuple, bool] = {}


def check_overlap(
  func: Any, names: list[str], written: list[str], targets: list, args: tuple, kwargs: dict
) -> None:
  """torch's error for an in-place or `out=` op (`func`, its arguments' `names`) that reads a
  tensor overlapping one it writes (`targets`, the arguments named in `written`), where torch
  refuses that op so.

  torch's kernels check it themselves (`assert_no_partial_overlap`: every TensorIterator op,
  `copy_`; `assert_no_overlap`, which refuses the same elements too: `index_put_`, `cat`...),
  and some do not (reductions, `mm`); `x.add_(x)` is fine. The overlap is torch's
  (`get_overlap_status`); whether `func` refuses it, CPU torch is asked once per op, dtype
  and kind of overlap (`_torch_refuses`).
  """
  storages = [t._storage for t in targets if type(t) is Tensor]
  if not storages:
    return
  found: list[tuple] = []
  for i, a in enumerate(args):
    if (type(a) is Tensor and a._storage in storages) or type(a) in (list, tuple):
      _overlaps(names[i], a, written, targets, found)
  for name, a in kwargs.items():
    _overlaps(name, a, written, targets, found)
  if not found:
    return
  key = (func, tuple(t.dtype for t in targets if type(t) is Tensor), tuple(found))
  refused = _REFUSED.get(key)
  if refused is None:
    refused = _REFUSED[key] = _torch_refuses(func, args, kwargs)
  if refused:
    raise RuntimeError(OVERLAP_ERROR)


def _overlaps(name: str, a: Any, written: list[str], targets: list, found: list) -> None:
  """Add to `found` how argument `name` (a tensor, or a list of them), if it is read,
  overlaps the tensors written (`targets`)."""
  if name in written:
    return
  for i, r in enumerate(a if type(a) in (list, tuple) else (a,)):
    if type(r) is Tensor:
      found += [(name, i, lap) for w in targets if (lap := _overlap(w, r)) is not None]


def _overlap(a: Tensor, b: Tensor) -> str | None:
  """How `a` and `b` overlap in memory, as torch's `get_overlap_status` tells: `_FULL` (the
  same tensor, or the same elements laid out alike), `_PARTIAL`, or None (apart, or too hard
  to tell: either is not dense)."""
  if a is b:
    return _FULL
  if a._storage is not b._storage or a.numel() == 0 or b.numel() == 0:
    return None
  if not (_dense(a) and _dense(b)):
    return None
  a_begin, b_begin = a.storage_offset() * a.element_size(), b.storage_offset() * b.element_size()
  a_end, b_end = a_begin + a.numel() * a.element_size(), b_begin + b.numel() * b.element_size()
  if a_begin == b_begin and a_end == b_end:
    return _FULL if a.stride() == b.stride() else _PARTIAL
  return _PARTIAL if a_begin < b_end and b_begin < a_end else None


def _dense(t: torch.Tensor) -> bool:
  """torch's "non-overlapping and dense": some order of the dimensions is contiguous."""
  expected = 1
  for stride, size in sorted((st, n) for n, st in zip(t.shape, t.stride()) if n > 1):
    if stride != expected:
      return False
    expected *= size
  return True


def _torch_refuses(func: Any, args: tuple, kwargs: dict) -> bool:
  """Whether CPU torch refuses `func` for overlapping arguments: it runs on zeros laid out as
  the arguments are (one CPU buffer per storage, so what overlaps overlaps), and the overlap
  is checked before any value is read."""
  buffers: dict[int, torch.Tensor] = {}
  made: dict[int, Any] = {}

  def stand_in(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
      return type(x)(stand_in(v) for v in x)
    if not isinstance(x, torch.Tensor):
      return x
    if id(x) not in made:
      if type(x) is Tensor:
        buffer = buffers.get(id(x._storage))
        if buffer is None:
          nbytes = storage_numel(x) * x.element_size()
          buffer = buffers[id(x._storage)] = torch.zeros(nbytes, dtype=torch.uint8)
        made[id(x)] = buffer.view(x.dtype).as_strided(x.shape, x.stride(), x.storage_offset())
      else:
        made[id(x)] = x.detach().clone()  # (the op writes: never into the caller's tensor)
    return made[id(x)]

  try:
    cargs = tuple(stand_in(a) for a in args)
    ckwargs = {k: "cpu" if k == "device" else stand_in(v) for k, v in kwargs.items()}
    with torch.no_grad():
      func(*cargs, **ckwargs)
  except RuntimeError as e:
    return str(e) == OVERLAP_ERROR
  except Exception:  # noqa: BLE001 - another refusal (raised as the op runs) or no CPU kernel
    return False
  return False


def _check_result(new: Any, target: Any, grows: bool) -> None:
  """torch's rules for the result an in-place or out= op writes (TensorIterator's): it must
  cast to the written tensor's dtype (`x.mul_(complex)` on a float `x`, `add(..., out=long)`
  of floats raise; they would drop the imaginary part, or truncate), and an in-place op
  cannot grow its tensor by broadcasting (`grows`; out= tensors are resized instead)."""
  if not isinstance(new, torch.Tensor) or not isinstance(target, torch.Tensor):
    return
  if not torch.can_cast(new.dtype, target.dtype):
    raise RuntimeError(
      f"result type {dtypes.scalar_type_name(new.dtype)} can't be cast to the desired "
      f"output type {dtypes.scalar_type_name(target.dtype)}"
    )
  if grows and tuple(new.shape) != tuple(target.shape):
    try:
      broadcast = torch.broadcast_shapes(tuple(new.shape), tuple(target.shape))
    except RuntimeError:
      broadcast = tuple(new.shape)
    if tuple(broadcast) != tuple(target.shape):
      raise RuntimeError(
        f"output with shape {list(target.shape)} doesn't match the broadcast shape "
        f"{list(broadcast)}"
      )


def store(target: Any, new: Any, resize: bool = False) -> None:
  """Write the value of tensor `new` into tensor `target` (torch's copy_ semantics: `new`
  broadcasts to `target`'s shape). `resize=True` is for `out=` tensors, which torch gives the
  result's shape instead."""
  if not isinstance(target, Tensor):
    if isinstance(target, torch.Tensor):  # a CPU tensor receiving a jax result
      with torch.no_grad():
        target.copy_(new.cpu() if isinstance(new, Tensor) else new)
      return
    raise BridgeTypeError(f"bridge: cannot write a result into {type(target).__name__}")
  v = value(new) if isinstance(new, Tensor) else new
  if tuple(v.shape) != tuple(target.shape):
    if resize:
      _resize_output(target, tuple(v.shape))  # (then written as any tensor of its shape)
    else:
      with x64():
        v = jnp.broadcast_to(v, tuple(target.shape))
  want = dtypes.TORCH_TO_JAX[target.dtype]
  if scope.narrow():  # a 32-bit program: its 64-bit tensors hold 32-bit arrays
    want = jax.dtypes.canonicalize_dtype(want)
  if np.dtype(v.dtype) != want:
    with x64():
      v = cast(v, want)
  if target._detached or scope.no_grad_inside():
    # An in-place op that torch does not record (in a `torch.no_grad()` block of traced code,
    # or through a `detach()`ed alias, as `F.embedding(max_norm=...)` renormalizes its
    # weight): later uses of the tensor get the gradient the tensor itself had (a
    # parameter's own), so the storage takes the new value with the old value's derivative.
    old = value(target, recorded=True)
    if isinstance(old, jax.core.Tracer) or isinstance(v, jax.core.Tracer):
      v = strided.keep_tangent(old, v)
  if scope.narrow():  # a 32-bit program: the tensor's bound takes the written values'
    narrowing.stored(target, new)
  write(target, v)


cast = jax.jit(lambda v, dtype: v.astype(dtype), static_argnums=1)


RESIZED_OUTPUT = (
  "An output with one or more elements was resized since it had shape {old}, which does not "
  "match the required output shape {new}. This behavior is deprecated, and in a future PyTorch "
  "release outputs will not be resized unless they have zero elements. You can explicitly "
  "reuse an out tensor t by resizing it, inplace, to zero elements with t.resize_(0)."
)


def _resize_output(target: Tensor, shape: tuple) -> None:
  """torch's `resize_output` for an `out=` tensor: its warning unless it is empty, then
  `resize_`."""
  if target.numel() != 0:
    warnings.warn(
      RESIZED_OUTPUT.format(old=list(target.shape), new=list(shape)), UserWarning, stacklevel=2
    )
  resize(target, shape)


def meta_like(t: torch.Tensor) -> torch.Tensor:
  """A meta tensor with `t`'s dtype and geometry over a storage of `t`'s storage's size: what
  torch's own `resize_` / `set_` make of it (their checks, errors and strides) is `t`'s. `t`
  may be on another device than `jax` (the other tensor of an op mixing devices)."""
  if type(t) is Tensor:
    numel = storage_numel(t)
  else:
    numel = t.untyped_storage().nbytes() // t.element_size()
  storage = torch.empty(numel, dtype=t.dtype, device="meta")
  return storage.as_strided(tuple(t.shape), tuple(t.stride()), int(t.storage_offset()))


def resize(target: Tensor, size: Any, memory_format: Any = None) -> None:
  """`target.resize_(size, memory_format=...)` as torch's: the new geometry (contiguous, or
  `memory_format`'s) at the same storage offset over the same storage, which grows when it
  holds too few elements (see `conform`)."""
  meta = meta_like(target)
  meta.resize_(size, memory_format=memory_format)
  conform(target, meta, target)


def conform(target: Tensor, meta: torch.Tensor, source: Tensor) -> None:
  """Give `target` the geometry of `meta` (what torch's `resize_`/`set_` made of a meta
  stand-in) over the storage of `source` (`target` itself, or `set_`'s source), read as
  `source` reads it (`Tensor._as`).

  As torch's `maybe_resize_storage`: a storage holding too few bytes for the new geometry
  grows (`grow`), and every tensor sharing it sees that (a storage is one object in torch:
  views of it see its new memory, with the old contents); one holding enough stays as it is,
  so a shrunk tensor and the other views of its storage still alias.
  """
  size, stride, offset = tuple(meta.shape), tuple(meta.stride()), int(meta.storage_offset())
  storage, as_ = source._storage, source._as
  if (
    storage is target._storage
    and as_ is target._as
    and size == tuple(target.shape)
    and stride == tuple(target.stride())
    and offset == int(target.storage_offset())
  ):
    return
  if math.prod(size) != 0:  # (torch leaves the storage of an empty tensor alone)
    extent = offset + 1 + sum((n - 1) * s for n, s in zip(size, stride))
    grow(source, extent * target.element_size())
  view = make_view(
    storage,
    size,
    stride,
    offset,
    target.dtype,
    storage.device,
    as_,
    target.is_conj(),
    target.is_neg(),
  )
  with torch.no_grad():
    target.data = view  # the view's metadata and storage (`Tensor.data`)


# `sys.getrefcount(storage)` in `grow` when one tensor alone holds it: its `__dict__`, the
# locals `storage` of `grow` and `conform`, and `getrefcount`'s argument (a test checks it)
_ONE_HOLDER = 4


def grow(holder: Tensor, nbytes: int) -> None:
  """Grow the array of `holder`'s storage to hold `nbytes` bytes, as torch reallocates a
  storage: the old elements first, then new ones (uninitialized in torch, zeros here); the
  array becomes one-dimensional.

  Every tensor sharing the storage sees the new array. Those that read it whole (`_whole`:
  their shape was the array's) become views of it first: `holder`, when it alone holds the
  storage, else each tensor found by a walk of the garbage collector's referrers (tens of
  milliseconds: only for a storage that other tensors share).
  """
  storage = holder._storage
  array = storage.array
  itemsize = np.dtype(array.dtype).itemsize
  missing = -(-(nbytes - int(np.size(array)) * itemsize) // itemsize)
  if missing <= 0:
    return
  if sys.getrefcount(storage) > _ONE_HOLDER:
    for d in gc.get_referrers(storage):
      if type(d) is dict and d.get("_storage") is storage:  # a tensor's `__dict__`
        d["_whole"], d["_cache"] = False, None
  else:
    holder._whole, holder._cache = False, None
  with x64():
    storage.array = jnp.pad(array.reshape(-1), (0, missing))
  storage.version += 1
  storage.address = 0  # (new memory, in torch: `data_ptr()` changes; `tensor.storage_address`)
