"""`bridge.Tensor`: a torch tensor on the `jax` device whose data is a JAX array.

Storage model. Torch tensors alias: a view shares its base's memory and an
in-place op through either is seen by both. JAX arrays are immutable, so each
`bridge.Tensor` points at a shared `Storage` box holding one JAX array (the
base's contents, in the base's shape) and a version counter. A tensor that is
the whole storage reads the array directly; any other view is torch's own
(size, stride, storage offset) over the storage's elements, read by a gather
and written by a scatter, and cached per storage version. In-place ops compute
the new value functionally and store it into the box, so every view sees it.
Under `jax.jit` the arrays are tracers and the same code traces.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
import torch

from bridge._src import dtypes
from bridge._src.errors import BridgeTypeError


class Storage:
  """A mutable box around the JAX array that a base tensor and its views share."""

  __slots__ = ("array", "version", "device")

  def __init__(self, array: Any, device: torch.device):
    self.array = array
    self.version = 0
    self.device = device  # a cached `jax_device(i)`, so devices compare by identity


@functools.cache
def jax_device(index: int) -> torch.device:
  return torch.device("jax", index)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
  strides, acc = [], 1
  for n in reversed(shape):
    strides.append(acc)
    acc *= max(n, 1)
  return tuple(reversed(strides))


class Tensor(torch.Tensor):
  """A torch tensor on the `jax` device; its data is a JAX array (or a tracer).

  Create one as any torch tensor (`torch.ones(2, device="jax")`, `t.to("jax")`)
  or wrap an array without copying: `bridge.torch_view(jax_array)`. Every aten op
  on it runs as JAX code (see `bridge._src.dispatch`).
  """

  _storage: Storage
  _whole: bool = True  # this tensor is its storage's whole array, in the array's shape
  _cache: tuple[int, Any] | None = None  # (storage version, value) for views

  @property
  def _dev(self) -> torch.device:
    return self._storage.device

  __torch_function__ = torch._C._disabled_torch_function_impl

  @staticmethod
  def __new__(cls, *args: Any, **kwargs: Any) -> Tensor:
    raise BridgeTypeError(
        "`bridge.Tensor` is not constructed directly: use a torch factory with "
        "`device='jax'` (e.g. `torch.zeros(3, device='jax')`), `tensor.to('jax')`, or wrap a "
        "JAX array with `bridge.torch_view(array)`.")

  @classmethod
  def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
    plan = _PLANS.get(func)  # the dispatcher's per-op plans (bridge._src.dispatch)
    if plan is None:
      plan = _get_plan(func)
    try:
      return plan(args, kwargs or {})
    except Exception as e:
      if torch._C._current_graph_task_id() == -1:
        raise
      return _defer_backward_error(e, func, args, kwargs or {})

  # --- data access -------------------------------------------------------------

  def numpy(self, *, force: bool = False) -> np.ndarray:  # type: ignore[override]
    """A NumPy copy of the data (as `t.cpu().numpy()`)."""
    del force
    return self.detach().cpu().numpy()

  def untyped_storage(self) -> Any:  # type: ignore[override]
    raise BridgeTypeError(
        "bridge: a `jax` tensor keeps its data in a JAX array, not in a torch storage. Use "
        "`bridge.jax_view(t)` for the array, or `t.cpu()` for a CPU copy.")

  def tolist(self) -> Any:  # type: ignore[override]
    return self.detach().cpu().tolist()

  def __repr__(self, *, tensor_contents: Any = None) -> str:
    del tensor_contents
    if isinstance(self._storage.array, jax.core.Tracer):
      return (f"bridge.Tensor(<traced {tuple(self.shape)} {self.dtype}>, "
              f"device='{self.device}')")
    with torch.no_grad():
      text = repr(torch.Tensor._make_subclass(torch.Tensor, self.detach().cpu()))
    extra = [f"device='{self.device}'"]
    if self.grad_fn is not None:
      extra.append(f"grad_fn=<{type(self.grad_fn).__name__}>")
    elif self.requires_grad:
      extra.append("requires_grad=True")
    return f"{text[:-1]}, {', '.join(extra)})"

  def __reduce_ex__(self, protocol: int) -> Any:
    # Saved as a CPU tensor: loads on any machine (bridge or not) as a CPU tensor,
    # and onto the jax device with `torch.load(..., map_location="jax")`.
    with torch.no_grad():
      data = torch.Tensor._make_subclass(torch.Tensor, self.detach().cpu())
    return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
            (data, self.dtype, "cpu", self.requires_grad))


_PLANS: dict[Any, Any] = {}  # shared with bridge._src.dispatch, which fills it


def _defer_backward_error(error: Exception, func: Any, args: tuple, kwargs: dict) -> Any:
  """An op failed inside torch's autograd engine: raise when the backward pass ends.

  Raised right here, the error would unwind through the engine's stream guard, which
  calls back into Python with the error still pending and aborts the process
  (torch's Python device guard cannot exchange streams). So the op returns zeros of
  the right shapes, and the error is raised, traceback intact, by a callback the
  engine runs when the backward pass finishes.
  """
  task = torch._C._current_graph_task_id()
  with _deferred_lock:
    pending = _deferred.get(task)
    if pending is None:
      pending = _deferred[task] = []
      def raise_pending() -> None:
        with _deferred_lock:
          errors = _deferred.pop(task, [error])
        raise errors[0]
      torch.autograd.Variable._execution_engine.queue_callback(raise_pending)
    pending.append(error)
  def placeholder(m: Any) -> Any:
    if isinstance(m, torch.Tensor):
      return make(jnp.zeros(tuple(m.shape), dtypes.TORCH_TO_JAX[m.dtype]), jax_device(0), m.dtype)
    return m
  meta = jax.tree_util.tree_map(
      lambda x: torch.empty(tuple(x.shape), dtype=x.dtype, device="meta")
      if isinstance(x, torch.Tensor) else x, (args, kwargs))
  try:
    shapes = func(*meta[0], **meta[1])
  except Exception:  # noqa: BLE001 - no meta kernel: a guess, the pass is failing anyway
    shapes = next((x for x in meta[0] if isinstance(x, torch.Tensor)), None)
  return jax.tree_util.tree_map(placeholder, shapes)


_deferred: dict[int, list[Exception]] = {}  # graph task id -> errors of its backward pass
_deferred_lock = threading.Lock()


def _get_plan(func: Any) -> Any:  # replaced by bridge._src.dispatch.get_plan on import
  raise RuntimeError("bridge: the dispatcher is not loaded")


_BY_ID = dtypes.JAX_TO_TORCH_BY_ID


def torch_dtype_of(array: Any) -> torch.dtype:
  """The torch dtype of a JAX array or tracer (fast path for the dtypes JAX returns)."""
  dtype = dtypes.JAX_TO_TORCH_BY_ID.get(id(array.dtype))
  return dtype if dtype is not None else dtypes.JAX_TO_TORCH[np.dtype(array.dtype)]


def make_result(array: Any, device: torch.device, dtype: torch.dtype | None = None) -> Tensor:
  """A new tensor that is the whole of a new storage holding `array`.

  `device` must be a cached `jax_device(i)` (devices of storages compare by identity); the
  hot path of every op's result.
  """
  if dtype is None:  # torch_dtype_of, inlined: this runs for every op's result
    dtype = _BY_ID.get(id(array.dtype)) or dtypes.JAX_TO_TORCH[np.dtype(array.dtype)]
  t = torch.Tensor._make_wrapper_subclass(Tensor, array.shape, dtype=dtype, device=device)
  t._storage = Storage(array, device)  # `_whole` and `_cache` keep their class defaults
  return t


def make(array: Any, device: Any, dtype: torch.dtype | None = None) -> Tensor:
  """`make_result` for any spelling of a jax device (`"jax:1"`, `torch.device("jax", 1)`)."""
  if type(device) is not torch.device or device.type != "jax" or device.index is None:
    device = jax_device(torch.device(device).index or 0)
  else:
    device = jax_device(device.index)
  if dtype is not None and dtypes.TORCH_TO_JAX.get(dtype) != np.dtype(array.dtype):
    dtype = None  # JAX narrowed it (a 32-bit program): the tensor says what it holds
  return make_result(array, device, dtype)


def make_view(storage: Storage, size: tuple, stride: tuple, offset: int, dtype: torch.dtype,
              device: torch.device) -> Tensor:
  """A tensor sharing `storage`, with torch's view metadata."""
  t = torch.Tensor._make_wrapper_subclass(Tensor, size, strides=stride, storage_offset=offset,
                                          dtype=dtype, device=device)
  t._storage = storage
  base_shape = tuple(storage.array.shape)
  if not (tuple(size) == base_shape and offset == 0
          and tuple(stride) == _contiguous_strides(base_shape)):
    t._whole = False
  return t


def value(t: Tensor) -> Any:
  """The JAX value of `t`: its storage's array, or the gathered view (cached per version)."""
  storage = t._storage
  if t._whole:
    return storage.array
  cache = t._cache
  if cache is not None and cache[0] == storage.version:
    return cache[1]
  v = _gather(storage.array, tuple(t.shape), tuple(t.stride()), t.storage_offset())
  t._cache = (storage.version, v)
  return v


def write(t: Tensor, new: Any) -> None:
  """Store `new` (t's shape and dtype) as t's value; every view of the storage sees it."""
  storage = t._storage
  if t._whole:
    storage.array = new
  else:
    size, stride = tuple(t.shape), tuple(t.stride())
    if any(s == 0 and n > 1 for s, n in zip(stride, size)):
      raise RuntimeError(
          "unsupported operation: more than one element of the written-to tensor refers to a "
          "single memory location. Please clone() the tensor before performing the operation.")
    storage.array = _scatter(storage.array, new, size, stride, t.storage_offset())
  storage.version += 1
  t._cache = None if t._whole else (storage.version, new)


# --- reading and writing a view --------------------------------------------------
#
# A view is (size, stride, offset) over the storage's elements, which the storage array
# holds contiguously in its own shape. Most views are a strided slice of that array (or
# of a reshape of it), permuted and broadcast: `t()`, `permute`, `select`, `x[1:, ::2]`,
# `expand`, `unsqueeze`, `view`. Those lower to slice/transpose/broadcast (and to
# dynamic_update_slice or pad+select for a write), which XLA fuses and differentiates
# cheaply; only the rest (overlapping `as_strided`, a stride that fits no factorization)
# takes a gather/scatter over flat indices.


class _Contiguous(NamedTuple):
  """The view is the flat elements [offset, offset + numel) reshaped to its size."""
  offset: int
  numel: int


class _Strided(NamedTuple):
  """The view is a strided slice of (part of) the base reshaped to `shape`, permuted, broadcast.

  Reading: take the flat elements [window[0], window[0] + window[1]) of the base (all of
  them where `window` is None), reshape to `shape`, `lax.slice(start, limit, step)`, reshape
  to `kept` (drops the dims selected at one index), transpose by `perm` (into the view's
  order of its dims of size > 1 and stride > 0), reshape to `expanded` (1 at the view's new
  axes and broadcast dims) and broadcast to the view's size.
  """
  window: tuple | None
  shape: tuple
  start: tuple
  limit: tuple
  step: tuple
  kept: tuple
  perm: tuple
  expanded: tuple


def _match(shape: tuple, strides: tuple, start: tuple, dims: list, used: list) -> list | None:
  """Assigns each (size, stride) in `dims` a distinct base dim it is a strided slice of."""
  if not dims:
    return []
  n, s = dims[0]
  for d in sorted(range(len(shape)), key=lambda d: -strides[d]):
    if d in used or shape[d] <= 1 or s % strides[d]:
      continue
    if start[d] + (n - 1) * (s // strides[d]) >= shape[d]:
      continue
    rest = _match(shape, strides, start, dims[1:], used + [d])
    if rest is not None:
      return [d] + rest
  return None


def _strided_plan(shape: tuple, size: tuple, stride: tuple, offset: int,
                  window: tuple | None) -> _Strided | None:
  """The view as a strided slice of a contiguous array of `shape`, or None where it is not."""
  strides = _contiguous_strides(shape)
  start = tuple((offset // b) % n if d else offset // b
                for d, (n, b) in enumerate(zip(shape, strides)))
  if not shape or start[0] >= shape[0]:
    return None
  view_dims = [i for i, (n, s) in enumerate(zip(size, stride)) if n > 1 and s > 0]
  base_dims = _match(shape, strides, start, [(size[i], stride[i]) for i in view_dims], [])
  if base_dims is None:
    return None
  step, count = [1] * len(shape), [1] * len(shape)
  for i, d in zip(view_dims, base_dims):
    step[d], count[d] = stride[i] // strides[d], size[i]
  limit = tuple(b + (c - 1) * k + 1 for b, c, k in zip(start, count, step))
  order = sorted(range(len(view_dims)), key=lambda j: base_dims[j])  # view dims in base order
  perm = tuple(order.index(j) for j in range(len(view_dims)))
  expanded = tuple(n if (n > 1 and s > 0) else 1 for n, s in zip(size, stride))
  kept = tuple(size[view_dims[j]] for j in order)
  return _Strided(window, shape, start, limit, tuple(step), kept, perm, expanded)


def _factorizations(shape: tuple, size: tuple, stride: tuple, offset: int) -> list[tuple]:
  """(shape, offset, window) to try the base as: its own shape, split by the view's strides, 1-D.

  Split by the view's strides (when each divides the next larger), each dim of the view is
  one dim of the split base; where the base's size is no multiple of the largest stride, the
  split is of a window of the flat base that holds the view.
  """
  numel = math.prod(shape)
  tries = [(tuple(shape), offset, None)]
  cuts = sorted({1} | {s for n, s in zip(size, stride) if n > 1 and s > 0}, reverse=True)
  if all(a % b == 0 for a, b in zip(cuts, cuts[1:])):
    inner = tuple(a // b for a, b in zip(cuts, cuts[1:]))
    if numel % cuts[0] == 0:
      tries.append(((numel // cuts[0],) + inner, offset, None))
    else:
      span = sum((n - 1) * s for n, s in zip(size, stride))
      length = -(-(span + 1) // cuts[0]) * cuts[0]
      first = min(offset, numel - length)
      if first >= 0:
        tries.append(((length // cuts[0],) + inner, offset - first, (first, length)))
  tries.append(((numel,), offset, None))
  return list(dict.fromkeys(tries))


@functools.lru_cache(maxsize=4096)
def _plan(shape: tuple, size: tuple, stride: tuple, offset: int) -> _Contiguous | _Strided | None:
  """How to read/write the view (size, stride, offset) of a contiguous array of `shape`.

  Pure Python on static metadata, so it runs once per view layout; None means the flat-index
  fallback.
  """
  if all(n == 1 or s == c for n, s, c in zip(size, stride, _contiguous_strides(size))):
    return _Contiguous(offset, math.prod(size))
  for factored, start, window in _factorizations(shape, size, stride, offset):
    plan = _strided_plan(factored, size, stride, start, window)
    if plan is not None:
      return plan
  return None


def _flat_index(size: tuple, stride: tuple, offset: int) -> np.ndarray:
  index = np.full(size, offset, dtype=np.int64)
  for dim, (n, s) in enumerate(zip(size, stride)):
    shape = [1] * len(size)
    shape[dim] = n
    index = index + (np.arange(n, dtype=np.int64) * s).reshape(shape)
  return index


def _window(flat: Any, window: tuple | None) -> Any:
  """The flat elements [window[0], window[0] + window[1]) (all of them where None)."""
  if window is None or window[1] == flat.shape[0]:
    return flat
  return lax.slice(flat, (window[0],), (window[0] + window[1],))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _gather(base: Any, size: tuple, stride: tuple, offset: int) -> Any:
  """The view (size, stride, offset) of the contiguous storage array `base`."""
  if math.prod(size) == 0:
    return jnp.zeros(size, base.dtype)
  plan = _plan(tuple(base.shape), size, stride, offset)
  flat = base.reshape(-1)
  if plan is None:
    return flat[_flat_index(size, stride, offset)]
  if type(plan) is _Contiguous:
    return _window(flat, (plan.offset, plan.numel)).reshape(size)
  x = _window(flat, plan.window).reshape(plan.shape)
  x = lax.slice(x, plan.start, plan.limit, plan.step).reshape(plan.kept)
  if plan.perm != tuple(range(len(plan.perm))):
    x = lax.transpose(x, plan.perm)
  return jnp.broadcast_to(x.reshape(plan.expanded), size)


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _scatter(base: Any, new: Any, size: tuple, stride: tuple, offset: int) -> Any:
  """`base` with the view (size, stride, offset) set to `new` (broadcast, cast to base's dtype)."""
  if math.prod(size) == 0:
    return base
  new = jnp.broadcast_to(new, size).astype(base.dtype)
  plan = _plan(tuple(base.shape), size, stride, offset)
  flat = base.reshape(-1)
  if plan is None or (type(plan) is _Strided and plan.expanded != size):
    # The fallback, also for a broadcast dim (several elements at one address).
    flat = flat.at[_flat_index(size, stride, offset).reshape(-1)].set(new.reshape(-1))
  elif type(plan) is _Contiguous:
    flat = _set_window(flat, (plan.offset, plan.numel), new.reshape(-1))
  else:
    part = _set_strided(_window(flat, plan.window).reshape(plan.shape), new, plan)
    flat = _set_window(flat, plan.window, part.reshape(-1))
  return flat.reshape(base.shape)


def _set_window(flat: Any, window: tuple | None, part: Any) -> Any:
  """`flat` with its elements [window[0], window[0] + window[1]) set to `part`."""
  if window is None or window[1] == flat.shape[0]:
    return part
  return lax.dynamic_update_slice(flat, part, (window[0],))


def _set_strided(base: Any, new: Any, plan: _Strided) -> Any:
  """`base` (shaped `plan.shape`) with its strided slice `plan` set to `new` (the view's value)."""
  x = new.reshape(tuple(plan.kept[p] for p in plan.perm))
  if plan.perm != tuple(range(len(plan.perm))):
    x = lax.transpose(x, tuple(np.argsort(plan.perm).tolist()))
  counts = tuple((b - a - 1) // k + 1 for a, b, k in zip(plan.start, plan.limit, plan.step))
  x = x.reshape(counts)
  if all(k == 1 for k in plan.step):
    return lax.dynamic_update_slice(base, x, plan.start)
  # A strided write without a scatter: spread `x` over the base's shape with interior
  # padding, and select it where the view's elements are.
  config = tuple((a, n - b, k - 1)
                 for a, b, k, n in zip(plan.start, plan.limit, plan.step, plan.shape))
  spread = lax.pad(x, jnp.zeros((), base.dtype), config)
  mask = lax.pad(jnp.ones(counts, bool), False, config)
  return jnp.where(mask, spread, base)
