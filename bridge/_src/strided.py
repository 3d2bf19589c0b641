"""Reading and writing a torch view of a storage's JAX array, with structured ops.

A `bridge.Tensor` view is torch's (size, stride, storage offset) over its storage's
array (the base, contiguous in its own shape). `gather` reads it and `scatter`
writes into it; both are jitted with the view's shape static and, where its plan
allows, its position (offset) traced, so that a row or column at each index shares one
program; they work on tracers (under `jax.jit`, `jax.grad`, `jax.vmap`) as on arrays.
A view of another dtype reads the storage's bytes as its own dtype first (`reinterpret`)
and writes them back (`restore`).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import config as _jax_config


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
  """torch's strides of a contiguous tensor of `shape`."""
  strides, acc = [], 1
  for n in reversed(shape):
    strides.append(acc)
    acc *= max(n, 1)
  return tuple(reversed(strides))


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


def _strided_plan(
  shape: tuple, size: tuple, stride: tuple, offset: int, window: tuple | None
) -> _Strided | None:
  """The view as a strided slice of a contiguous array of `shape`, or None where it is not."""
  strides = contiguous_strides(shape)
  start = tuple(
    (offset // b) % n if d else offset // b for d, (n, b) in enumerate(zip(shape, strides))
  )
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
  tries: list[tuple[tuple, int, tuple[int, int] | None]] = [(tuple(shape), offset, None)]
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
  if all(n == 1 or s == c for n, s, c in zip(size, stride, contiguous_strides(size))):
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


def read(base: Any, size: tuple, stride: tuple, offset: int) -> Any:
  """The view (size, stride, offset) of the contiguous storage array `base`."""
  if math.prod(size) == 0:  # (sliced from `base`: `jnp.zeros` would narrow float64 outside x64)
    return lax.slice(base.reshape(-1), (0,), (0,)).reshape(size)
  plan = _plan(tuple(base.shape), size, stride, offset)
  flat = base.reshape(-1)
  if plan is None:
    return flat[_flat_index(size, stride, offset)]
  if isinstance(plan, _Contiguous):
    return _window(flat, (plan.offset, plan.numel)).reshape(size)
  x = _window(flat, plan.window).reshape(plan.shape)
  x = lax.slice(x, plan.start, plan.limit, plan.step).reshape(plan.kept)
  if plan.perm != tuple(range(len(plan.perm))):
    x = lax.transpose(x, plan.perm)
  return jnp.broadcast_to(x.reshape(plan.expanded), size)


def write(base: Any, new: Any, size: tuple, stride: tuple, offset: int) -> Any:
  """`base` with the view (size, stride, offset) set to `new` (broadcast, cast to base's dtype)."""
  if math.prod(size) == 0:
    return base
  new = jnp.broadcast_to(new, size).astype(base.dtype)
  plan = _plan(tuple(base.shape), size, stride, offset)
  flat = base.reshape(-1)
  if plan is None or (isinstance(plan, _Strided) and plan.expanded != size):
    # The fallback, also for a broadcast dim (several elements at one address).
    flat = flat.at[_flat_index(size, stride, offset).reshape(-1)].set(new.reshape(-1))
  elif isinstance(plan, _Contiguous):
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
  config = tuple(
    (a, n - b, k - 1) for a, b, k, n in zip(plan.start, plan.limit, plan.step, plan.shape)
  )
  spread = lax.pad(x, jnp.zeros((), base.dtype), config)
  mask = lax.pad(jnp.ones(counts, bool), False, config)
  return jnp.where(mask, spread, base)


def _read_at(base: Any, offset: Any, size: tuple) -> Any:
  """A contiguous view's elements, from a traced `offset` into the flat `base`."""
  flat = lax.dynamic_slice(base.reshape(-1), (offset,), (math.prod(size),))
  return flat.reshape(size)


def _write_at(base: Any, new: Any, offset: Any, size: tuple) -> Any:
  """`base` with the contiguous view at traced `offset` set to `new` (as `write`)."""
  new = jnp.broadcast_to(new, size).astype(base.dtype).reshape(-1)
  return lax.dynamic_update_slice(base.reshape(-1), new, (offset,)).reshape(base.shape)


class _Shape(NamedTuple):
  """A `_Strided` plan without its position: what its program depends on (static), while the
  window's first element and the slice's start are traced (see `_split`)."""

  size: tuple
  window: int | None  # the window's length; None: the whole flat base
  shape: tuple
  extent: tuple  # limit - start
  step: tuple
  kept: tuple
  perm: tuple
  expanded: tuple


def _split(plan: _Strided, size: tuple, numel: int) -> tuple[_Shape, int, tuple]:
  """`plan` as its static shape and its traced position (window's first element, start)."""
  window = plan.window
  if window is not None and window[1] == numel:
    window = None
  extent = tuple(b - a for a, b in zip(plan.start, plan.limit))
  shape = _Shape(
    size,
    None if window is None else window[1],
    plan.shape,
    extent,
    plan.step,
    plan.kept,
    plan.perm,
    plan.expanded,
  )
  return shape, 0 if window is None else window[0], plan.start


def _region(base: Any, first: Any, how: _Shape) -> Any:
  """The window of the flat base, reshaped to the plan's shape."""
  flat = base.reshape(-1)
  if how.window is not None:
    flat = lax.dynamic_slice(flat, (first,), (how.window,))
  return flat.reshape(how.shape)


def _read_strided_at(base: Any, first: Any, start: tuple, how: _Shape) -> Any:
  """`read` of a strided view whose position (`first`, `start`) is traced."""
  x = lax.dynamic_slice(_region(base, first, how), start, how.extent)
  x = lax.slice(x, (0,) * len(how.extent), how.extent, how.step).reshape(how.kept)
  if how.perm != tuple(range(len(how.perm))):
    x = lax.transpose(x, how.perm)
  return jnp.broadcast_to(x.reshape(how.expanded), how.size)


def _write_strided_at(base: Any, new: Any, first: Any, start: tuple, how: _Shape) -> Any:
  """`write` of a strided view (no broadcast dims) whose position is traced: the view's
  bounding box is cut out, written as `_set_strided` writes a box starting at 0, put back."""
  new = jnp.broadcast_to(new, how.size).astype(base.dtype)
  region = _region(base, first, how)
  box = lax.dynamic_slice(region, start, how.extent)
  zero = (0,) * len(how.extent)
  box = _set_strided(
    box,
    new,
    _Strided(None, how.extent, zero, how.extent, how.step, how.kept, how.perm, how.expanded),
  )
  region = lax.dynamic_update_slice(region, box, start)
  flat = region.reshape(-1)
  if how.window is not None:
    flat = lax.dynamic_update_slice(base.reshape(-1), flat, (first,))
  return flat.reshape(base.shape)


@functools.lru_cache(maxsize=4096)
def _placed(shape: tuple, size: tuple, stride: tuple, offset: int) -> tuple | None:
  """The view's plan as (strided, static key, traced position, writable) for the jitted
  forms below, once per view layout and position; None for an empty view or the flat-index
  fallback (static throughout). Contiguous: the key is the view's size, the position its
  offset. Strided: `_split`; writable where it has no broadcast dim (else `write`'s fallback)."""
  if not math.prod(size):
    return None
  plan = _plan(shape, size, stride, offset)
  if isinstance(plan, _Contiguous):
    return False, size, (plan.offset,), True
  if plan is None:
    return None
  how, first, start = _split(plan, size, math.prod(shape))
  return True, how, (first, start), plan.expanded == size


# --- a storage's bytes as another dtype ------------------------------------------
#
# torch's `view(dtype)`, `view_as_real` and `view_as_complex` read a storage's bytes as
# elements of another dtype, whose size, stride and offset count elements of that dtype.
# `reinterpret` gives the flat storage as that dtype (a complex value as its real and
# imaginary parts, which JAX differentiates; other dtypes by `bitcast_convert_type`), and
# `restore` turns it back into the storage's own array.


def _component(dtype: np.dtype) -> np.dtype:
  """The real dtype of a complex dtype's parts, or the dtype itself."""
  return (
    np.dtype(np.float32 if dtype == np.complex64 else np.float64) if dtype.kind == "c" else dtype
  )


def _leading(flat: Any, n: int) -> Any:
  """The first `n` elements of the 1-D `flat`."""
  return flat if flat.shape[0] == n else lax.slice(flat, (0,), (n,))


def _bitcast(flat: Any, dtype: np.dtype) -> Any:
  """The 1-D real `flat` as `dtype`'s elements (a trailing part too small for one dropped)."""
  src = np.dtype(flat.dtype)
  if src == dtype:
    return flat
  if src == np.bool_:
    flat, src = lax.convert_element_type(flat, np.uint8), np.dtype(np.uint8)
  if dtype == np.bool_:
    return lax.ne(_bitcast(flat, np.dtype(np.uint8)), jnp.zeros((), np.uint8))
  if src.itemsize < dtype.itemsize:
    k = dtype.itemsize // src.itemsize
    n = flat.shape[0] // k
    return lax.bitcast_convert_type(_leading(flat, n * k).reshape(n, k), dtype)
  return lax.bitcast_convert_type(flat, dtype).reshape(-1)


def reinterpret(base: Any, dtype: Any) -> Any:
  """The bytes of `base` (flattened) as a 1-D array of `dtype`, as torch views a storage."""
  dtype = np.dtype(dtype)
  flat = base.reshape(-1)
  if np.dtype(flat.dtype) == dtype:
    return flat
  if np.dtype(flat.dtype).kind == "c":  # (interleaved real and imaginary parts)
    parts = (lax.real(flat), lax.imag(flat))
    flat = lax.concatenate([lax.expand_dims(p, (1,)) for p in parts], 1).reshape(-1)
  flat = _bitcast(flat, _component(dtype))
  if dtype.kind == "c":
    n = flat.shape[0] // 2
    pairs = _leading(flat, 2 * n).reshape(n, 2)
    flat = lax.complex(
      lax.slice(pairs, (0, 0), (n, 1)).reshape(n), lax.slice(pairs, (0, 1), (n, 2)).reshape(n)
    )
  return flat


def restore(flat: Any, like: Any) -> Any:
  """`flat` (`reinterpret(like, ...)`, written) as `like`'s dtype and shape: its bytes, then
  `like`'s trailing bytes that were too few for an element of `flat`'s dtype.

  Bits reinterpreted (not a complex value's parts) carry no derivative: as torch, which
  records no write through such a view, the result keeps `like`'s."""
  back = reinterpret(flat, like.dtype)
  n = math.prod(like.shape)
  if back.shape[0] < n:
    rest = lax.slice(like.reshape(-1), (back.shape[0],), (n,))
    back = lax.concatenate([back, rest], 0)
  back = back.reshape(like.shape)
  src, dst = np.dtype(flat.dtype), np.dtype(like.dtype)
  if _component(src) != _component(dst) and dst.kind in "fc":
    back = keep_tangent(like, back)
  return back


@jax.custom_jvp
def keep_tangent(old: Any, new: Any) -> Any:
  """`new`, whose derivative is `old`'s (a write torch does not record)."""
  return new


@keep_tangent.defjvp
def _keep_tangent_jvp(primals: tuple, tangents: tuple) -> tuple:
  return primals[1], tangents[0]


# Jitted forms for concrete arrays; a tracer (JAX is already building a program) calls
# `read`/`write` directly, so the ops land in that program instead of nested programs. A
# view's position is traced where its plan allows (a row `x[i]`, a column `x[:, j]`,
# `narrow`, a chunk): one program serves every position, where a static offset compiled one
# per row or column (25-35 ms each on this CPU). The flat-index fallback keeps it static.
_gather = jax.jit(read, static_argnums=(1, 2, 3))
_scatter = jax.jit(write, static_argnums=(2, 3, 4))
_gather_at = jax.jit(_read_at, static_argnums=(2,))
_scatter_at = jax.jit(_write_at, static_argnums=(3,))
_gather_strided_at = jax.jit(_read_strided_at, static_argnums=(3,))
_scatter_strided_at = jax.jit(_write_strided_at, static_argnums=(4,))
_reinterpret = jax.jit(reinterpret, static_argnums=(1,))
_restore = jax.jit(restore)
_x64_state = _jax_config.enable_x64


def gather(base: Any, size: tuple, stride: tuple, offset: int) -> Any:
  """`read`, jitted, with 64-bit types on (a float64 storage stays float64)."""
  prev = _x64_state.swap_local(True)
  try:
    placed = _placed(tuple(base.shape), size, stride, offset)
    if placed is None:
      return _gather(base, size, stride, offset)
    strided, key, position, _ = placed
    return (_gather_strided_at if strided else _gather_at)(base, *position, key)
  finally:
    _x64_state.set_local(prev)


def scatter(base: Any, new: Any, size: tuple, stride: tuple, offset: int) -> Any:
  """`write`, jitted, with 64-bit types on (a float64 storage stays float64)."""
  prev = _x64_state.swap_local(True)
  try:
    placed = _placed(tuple(base.shape), size, stride, offset)
    if placed is None or not placed[3]:
      return _scatter(base, new, size, stride, offset)
    strided, key, position, _ = placed
    return (_scatter_strided_at if strided else _scatter_at)(base, new, *position, key)
  finally:
    _x64_state.set_local(prev)


def reinterpreted(base: Any, dtype: Any) -> Any:
  """`reinterpret`, jitted, with 64-bit types on."""
  prev = _x64_state.swap_local(True)
  try:
    return _reinterpret(base, np.dtype(dtype))
  finally:
    _x64_state.set_local(prev)


def restored(flat: Any, like: Any) -> Any:
  """`restore`, jitted, with 64-bit types on."""
  prev = _x64_state.swap_local(True)
  try:
    return _restore(flat, like)
  finally:
    _x64_state.set_local(prev)
