"""Shape family: joining, copying, repeating, flipping and padding tensors.

View ops (`view`, `expand`, `permute`, `select`, `slice`, ...) are not here: the
core handles them generically on aliased storage. Their functional `*_copy`
twins (what functionalization emits) are lowered here as plain value ops.
`as_strided_copy` and `_reshape_alias_copy` are left out: their result depends
on the input's storage layout (strides, offset), which a value-level lowering
does not see.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bridge_ops._lowering import aten, jax_dtype, lowering, result_dtypes


def _dim(d: int, ndim: int) -> int:
  """A wrapped dimension (torch allows dim in [-ndim, ndim); 0-d tensors take 0 and -1)."""
  n = max(ndim, 1)
  return d + n if d < 0 else d


def _fresh(x):
  """A copy that jit cannot forward as its input (outputs must not alias arguments)."""
  return jnp.copy(x)


def _common_dtype(tensors):
  return result_dtypes(*tensors)[1]


# --- joining ----------------------------------------------------------------------------------


@lowering(aten.cat.default)
def cat(tensors, dim=0):
  dtype = _common_dtype(tensors)
  # torch's legacy rule: 1-d empty tensors are skipped whatever the others' shapes.
  kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
  if not kept:
    return jnp.zeros((0,), dtype)
  d = _dim(dim, kept[0].ndim)
  return _fresh(jnp.concatenate([t.astype(dtype) for t in kept], axis=d))


@lowering(aten.stack.default)
def stack(tensors, dim=0):
  dtype = _common_dtype(tensors)
  d = dim + tensors[0].ndim + 1 if dim < 0 else dim
  return jnp.stack([t.astype(dtype) for t in tensors], axis=d)


# --- copies -----------------------------------------------------------------------------------


@lowering(aten.clone.default)
def clone(self, *, memory_format=None):
  return _fresh(self)


@lowering(aten.alias_copy.default)
def alias_copy(self):
  return _fresh(self)


@lowering(aten.detach_copy.default)
def detach_copy(self):
  return _fresh(self)


def _resolve_size(size, numel):
  size = list(size)
  if -1 in size:
    known = math.prod(s for s in size if s != -1)
    size[size.index(-1)] = numel // known if known else 0
  return tuple(size)


@lowering(aten._unsafe_view.default)
def _unsafe_view(self, size):
  return _fresh(jnp.reshape(self, _resolve_size(size, self.size)))


@lowering(aten.view_copy.default)
def view_copy(self, size):
  return _fresh(jnp.reshape(self, _resolve_size(size, self.size)))


@lowering(aten.view_copy.dtype)
def view_copy_dtype(self, dtype):
  """Reinterprets the bytes (torch `view(dtype)`): the last dim scales with the item sizes."""
  new = np.dtype(jax_dtype(dtype))
  old = np.dtype(self.dtype)
  src = self.astype(jnp.uint8) if old == np.bool_ else self
  tgt = jnp.uint8 if new == np.bool_ else new
  if old.itemsize == new.itemsize:
    out = lax.bitcast_convert_type(src, tgt)
  elif old.itemsize > new.itemsize:  # each element becomes several: merge the new last axis
    out = lax.bitcast_convert_type(src, tgt)
    out = out.reshape(self.shape[:-1] + (self.shape[-1] * (old.itemsize // new.itemsize),))
  else:  # several elements become one: group the last axis first
    ratio = new.itemsize // old.itemsize
    grouped = src.reshape(self.shape[:-1] + (self.shape[-1] // ratio, ratio))
    out = lax.bitcast_convert_type(grouped, tgt)
  return out.astype(jnp.bool_) if new == np.bool_ else out


@lowering(aten.resize.default)
def resize(self, size, *, memory_format=None):
  """torch `resize_`: the elements keep their flat (contiguous) order; the ones torch leaves
  uninitialized when the tensor grows are zeros here."""
  n = math.prod(size)
  flat = jnp.reshape(self, (-1,))
  if n > flat.shape[0]:
    flat = jnp.concatenate([flat, jnp.zeros((n - flat.shape[0],), self.dtype)])
  return _fresh(jnp.reshape(flat[:n], tuple(size)))


@lowering(aten.expand_copy.default)
def expand_copy(self, size, *, implicit=False):
  lead = len(size) - self.ndim
  shape = tuple(self.shape[i - lead] if (s == -1 and i >= lead) else s for i, s in enumerate(size))
  return _fresh(jnp.broadcast_to(self, shape))


@lowering(aten.permute_copy.default)
def permute_copy(self, dims):
  return _fresh(jnp.transpose(self, [_dim(d, self.ndim) for d in dims]))


@lowering(aten.transpose_copy.int)
def transpose_copy(self, dim0, dim1):
  if self.ndim < 2:
    return _fresh(self)
  return _fresh(jnp.swapaxes(self, _dim(dim0, self.ndim), _dim(dim1, self.ndim)))


@lowering(aten.t_copy.default)
def t_copy(self):
  return jnp.swapaxes(self, 0, 1) if self.ndim == 2 else _fresh(self)


@lowering(aten.unsqueeze_copy.default)
def unsqueeze_copy(self, dim):
  d = dim + self.ndim + 1 if dim < 0 else dim
  return jnp.expand_dims(self, d)


@lowering(aten.squeeze_copy.default)
def squeeze_copy(self):
  return _fresh(jnp.squeeze(self)) if self.ndim else _fresh(self)


@lowering(aten.squeeze_copy.dim)
def squeeze_copy_dim(self, dim):
  return squeeze_copy_dims(self, [dim])


@lowering(aten.squeeze_copy.dims)
def squeeze_copy_dims(self, dim):
  if self.ndim == 0:
    return _fresh(self)
  axes = tuple(sorted({_dim(d, self.ndim) for d in dim if self.shape[_dim(d, self.ndim)] == 1}))
  return _fresh(jnp.squeeze(self, axes)) if axes else _fresh(self)


@lowering(aten.select_copy.int)
def select_copy(self, dim, index):
  d = _dim(dim, self.ndim)
  i = index + self.shape[d] if index < 0 else index
  return lax.index_in_dim(self, i, d, keepdims=False)


def _slice_bounds(n, start, end, step):
  """torch's clamping of a slice's bounds to a dimension of size `n`; where `n` or a bound is
  symbolic (a dimension of `bridge.export`), as dimension expressions (`min(2, batch)`)."""
  start = 0 if start is None else start
  end = n if end is None else end
  if isinstance(n, int) and isinstance(start, int) and isinstance(end, int):
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    start = min(max(start, 0), n)
    end = min(max(end, start), n)
    return start, end, step
  if isinstance(end, int) and end >= _INT64_MAX:  # `x[a:]` as torch writes it
    end = n
  start = jax.core.max_dim(start + n, 0) if _negative(start) else jax.core.min_dim(start, n)
  end = jax.core.max_dim(end + n, 0) if _negative(end) else jax.core.min_dim(end, n)
  return start, jax.core.max_dim(end, start), step


_INT64_MAX = 2**63 - 1


def _negative(v) -> bool:
  """Whether a bound counts from the end: a negative int (a symbolic one is a size: >= 0)."""
  return isinstance(v, int) and v < 0


@lowering(aten.slice_copy.Tensor)
def slice_copy(self, dim=0, start=None, end=None, step=1):
  d = _dim(dim, self.ndim)
  s, e, st = _slice_bounds(self.shape[d], start, end, step)
  return _fresh(lax.slice_in_dim(self, s, e, st, axis=d))


@lowering(aten.narrow_copy.default)
def narrow_copy(self, dim, start, length):
  d = _dim(dim, self.ndim)
  s = start + self.shape[d] if start < 0 else start
  return _fresh(lax.slice_in_dim(self, s, s + length, axis=d))


@lowering(aten.diagonal_copy.default)
def diagonal_copy(self, offset=0, dim1=0, dim2=1):
  return jnp.diagonal(self, offset, _dim(dim1, self.ndim), _dim(dim2, self.ndim))


@lowering(aten.diagonal_scatter.default)
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
  """`self` with its `diagonal(offset, dim1, dim2)` replaced by `src` (the diagonal last)."""
  d1, d2 = _dim(dim1, self.ndim), _dim(dim2, self.ndim)
  x = jnp.moveaxis(self, (d1, d2), (-2, -1))
  n = max(0, min(x.shape[-2] - max(-offset, 0), x.shape[-1] - max(offset, 0)))
  rows = np.arange(n) + max(-offset, 0)
  cols = np.arange(n) + max(offset, 0)
  x = x.at[..., rows, cols].set(src.astype(self.dtype))
  return jnp.moveaxis(x, (-2, -1), (d1, d2))


@lowering(aten.unfold_copy.default)
def unfold_copy(self, dimension, size, step):
  if self.ndim == 0:
    return jnp.reshape(self, (1,))
  d = _dim(dimension, self.ndim)
  n = (self.shape[d] - size) // step + 1
  starts = np.arange(n) * step
  idx = starts[:, None] + np.arange(size)[None, :]  # (n, size)
  out = jnp.take(self, jnp.asarray(idx.reshape(-1), jnp.int64), axis=d)
  out = out.reshape(self.shape[:d] + (n, size) + self.shape[d + 1 :])
  return jnp.moveaxis(out, d + 1, -1)


@lowering(aten.split_with_sizes_copy.default)
def split_with_sizes_copy(self, split_sizes, dim=0):
  d = _dim(dim, self.ndim)
  bounds = np.cumsum([0] + list(split_sizes))
  return [
    _fresh(lax.slice_in_dim(self, int(a), int(b), axis=d)) for a, b in zip(bounds[:-1], bounds[1:])
  ]


@lowering(aten.split_copy.Tensor)
def split_copy(self, split_size, dim=0):
  d = _dim(dim, self.ndim)
  n = self.shape[d]
  if split_size == 0:
    return [_fresh(self)]
  starts = range(0, max(n, 1), split_size)
  return [_fresh(lax.slice_in_dim(self, s, min(s + split_size, n), axis=d)) for s in starts]


@lowering(aten.unbind_copy.int)
def unbind_copy(self, dim=0):
  d = _dim(dim, self.ndim)
  return [lax.index_in_dim(self, i, d, keepdims=False) for i in range(self.shape[d])]


@lowering(aten.view_as_real_copy.default)
def view_as_real_copy(self):
  return jnp.stack([jnp.real(self), jnp.imag(self)], axis=-1)


@lowering(aten.view_as_complex_copy.default)
def view_as_complex_copy(self):
  return lax.complex(self[..., 0], self[..., 1])


# --- repeating, flipping, rolling, triangles --------------------------------------------------


@lowering(aten.repeat.default)
def repeat(self, repeats):
  return _fresh(jnp.tile(self, tuple(repeats)))


@lowering(aten.flip.default)
def flip(self, dims):
  if not dims or self.ndim == 0:
    return _fresh(self)
  return jnp.flip(self, tuple(_dim(d, self.ndim) for d in dims))


@lowering(aten.roll.default)
def roll(self, shifts, dims=()):
  if not dims:  # roll the flattened tensor
    return _fresh(jnp.roll(self.reshape(-1), shifts[0]).reshape(self.shape))
  return _fresh(jnp.roll(self, tuple(shifts), tuple(_dim(d, self.ndim) for d in dims)))


@lowering(aten.tril.default)
def tril(self, diagonal=0):
  return jnp.tril(self, diagonal)


@lowering(aten.triu.default)
def triu(self, diagonal=0):
  return jnp.triu(self, diagonal)


# --- padding ----------------------------------------------------------------------------------


@lowering(aten.constant_pad_nd.default)
def constant_pad_nd(self, pad, value=0):
  """`pad` lists (before, after) pairs from the last dim backwards; negative pads crop."""
  config = [(0, 0, 0)] * self.ndim
  for i in range(len(pad) // 2):
    config[self.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
  return _fresh(lax.pad(self, jnp.asarray(value).astype(self.dtype), config))


def _pad_index(n, left, right, mode):
  """torch's source index for each output position of one padded dim (reflect/replicate)."""
  i_start, o_start = max(0, -left), max(0, left)
  j = np.arange(n + left + right)
  if mode == "reflect":
    ip = np.where(j < left, 2 * left - j, np.where(j < n + left, j, 2 * (n + left - 1) - j))
  else:
    ip = np.where(j < left, left, np.where(j < n + left, j, n + left - 1))
  return ip - o_start + i_start


def _pad(self, padding, mode):
  out = _fresh(self)
  for i in range(len(padding) // 2):
    axis = self.ndim - 1 - i
    idx = _pad_index(self.shape[axis], padding[2 * i], padding[2 * i + 1], mode)
    out = jnp.take(out, jnp.asarray(idx, jnp.int64), axis=axis)
  return out


def _pad_backward(grad_output, self, padding, mode):
  _, vjp = jax.vjp(lambda s: _pad(s, padding, mode), jnp.zeros(self.shape, grad_output.dtype))
  return vjp(grad_output)[0]


# One lowering for the 1-D, 2-D and 3-D ops: `padding`'s length gives the dims.


@lowering(
  aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default
)
def reflection_pad(self, padding):
  return _pad(self, padding, "reflect")


@lowering(
  aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default
)
def replication_pad(self, padding):
  return _pad(self, padding, "replicate")


@lowering(
  aten.reflection_pad1d_backward.default,
  aten.reflection_pad2d_backward.default,
  aten.reflection_pad3d_backward.default,
)
def reflection_pad_backward(grad_output, self, padding):
  return _pad_backward(grad_output, self, padding, "reflect")


@lowering(
  aten.replication_pad1d_backward.default,
  aten.replication_pad2d_backward.default,
  aten.replication_pad3d_backward.default,
)
def replication_pad_backward(grad_output, self, padding):
  return _pad_backward(grad_output, self, padding, "replicate")
