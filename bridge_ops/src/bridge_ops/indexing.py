"""Indexing family: advanced indexing, gather/scatter, index_*, masks and nonzero.

Index values follow torch for valid inputs: negative indices count from the end
where torch allows them (advanced indexing, `take`/`put`, `index_fill`). An index out
of range raises torch's error, with torch's message: each lowering declares its rule
(`check_index`, `check`) and the core enforces it in eager mode. Inside a JAX program
the values are unknown and, unless `bridge.config(check_indices=True)`, unchecked:
JAX clamps reads and drops writes.

Ops whose output shape depends on values (`index.Tensor` with boolean masks,
`nonzero`, `masked_select`) are registered with `dynamic_shape=True` and so run
on concrete arrays. `index_put` keeps static shapes even with boolean masks: the
mask becomes `nonzero(mask, size=N)` with N read from the static shapes of the
values (or, when the values broadcast, the mask's size padded with indices that
are out of range and so dropped). `index.Tensor` is one overload for integer and
boolean indices alike, so integer indexing runs eagerly too.

Over 700 lines on purpose: every lowering here shares one index normalisation and one set of
range and dtype checks (`_dim`, `_check_along`, `_check_advanced`, `_check_flat`,
`_index_dtypes`), which a split would have to import back.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import torch

from bridge_ops._lowering import (
  aten,
  check,
  check_index,
  highest,
  lowering,
  lowest,
  torch_dtype,
  weak,
  with_derivative,
)


def _dim(d: int, ndim: int) -> int:
  n = max(ndim, 1)
  return d + n if d < 0 else d


def _is_mask(i) -> bool:
  return i is not None and np.dtype(i.dtype) in (np.dtype(np.bool_), np.dtype(np.uint8))


def _masks_to_bool(indices):
  """uint8 index tensors are (deprecated) masks in torch, not integer indices."""
  return [i.astype(jnp.bool_) if _is_mask(i) else i for i in indices]


def _getitem_tuple(indices):
  return tuple(slice(None) if i is None else i for i in indices)


def _add_at(x, idx, values, mode=None):
  """`x.at[idx].add(values)`; on bool, torch's addition is logical or."""
  if x.dtype == jnp.bool_:
    return x.at[idx].max(values.astype(jnp.bool_), mode=mode)
  return x.at[idx].add(values, mode=mode)


def _mul_at(x, idx, values, mode=None):
  """`x.at[idx].multiply(values)`; on bool, torch's multiplication is logical and."""
  if x.dtype == jnp.bool_:
    return x.at[idx].min(values.astype(jnp.bool_), mode=mode)
  return x.at[idx].multiply(values, mode=mode)


def _dim_message(prefix=""):
  """torch's "index 9 is out of bounds for dimension 1 with size 4" (scatter, index_add...)."""
  return prefix + "index {value} is out of bounds for dimension {dim} with size {size}"


def _check_along(self, dim, index, error, message, negative=False):
  """`index` within `self`'s dim `dim` (a 0-d `self` has one element), with torch's message."""
  d = _dim(dim, self.ndim)
  size = self.shape[d] if self.ndim else 1
  check_index(
    index,
    size,
    error,
    message.replace("{dim}", str(d)).replace("{size}", str(size)),
    negative=negative,
  )


def broadcast_shapes(a, b) -> tuple[int, ...]:
  """The shape `a` and `b` broadcast to, or torch's error (`infer_size`'s: the last dim, from
  the right, where they differ) where they do not broadcast."""
  ndim = max(len(a), len(b))
  out = []
  for i in range(ndim - 1, -1, -1):
    offset = ndim - 1 - i
    size_a = a[len(a) - 1 - offset] if offset < len(a) else 1
    size_b = b[len(b) - 1 - offset] if offset < len(b) else 1
    if size_a != size_b and size_a != 1 and size_b != 1:
      raise RuntimeError(
        f"The size of tensor a ({size_a}) must match the size of tensor b ({size_b}) at "
        f"non-singleton dimension {i}"
      )
    out.append(size_b if size_a == 1 else size_a)
  return tuple(out[::-1])


def _torch_name(dtype) -> str:
  """torch's name of a dtype in its messages: "Char" for int8, "Float" for float32."""
  return torch.empty(0, dtype=torch_dtype(dtype)).type().removeprefix("torch.")[: -len("Tensor")]


def _index_dtypes(position, allowed, error, message):
  """torch's rule for the dtype of the index (or mask) argument at `position`, a tensor or
  a list of them (`None`s in it are slices): one of `allowed` (NumPy dtype names), else
  `error(message)`, with `{dtype}` torch's name of the dtype refused. In a program without
  64-bit types, int32 also stands for int64 (the dtype torch saw)."""
  allowed = frozenset(np.dtype(a) for a in allowed)

  def decorate(fn):
    name = list(inspect.signature(fn).parameters)[position]

    def wrapped(*args, **kwargs):
      index = args[position] if len(args) > position else kwargs[name]
      ok = allowed
      if np.dtype("int64") in ok and jax.dtypes.canonicalize_dtype(jnp.int64) != jnp.int64:
        ok = ok | {np.dtype("int32")}
      for i in index if isinstance(index, (list, tuple)) else [index]:
        if i is not None and np.dtype(i.dtype) not in ok:
          raise error(message.format(dtype=_torch_name(i.dtype)))
      return fn(*args, **kwargs)

    wrapped.__name__, wrapped.__qualname__ = fn.__name__, fn.__qualname__
    wrapped.__module__, wrapped.__doc__ = fn.__module__, fn.__doc__
    return wrapped

  return decorate


# torch's rule for advanced indices (uint8 ones are masks)
_advanced_dtypes = _index_dtypes(
  1,
  ("int64", "int32", "uint8", "bool"),
  IndexError,
  "tensors used as indices must be long, int, byte or bool tensors",
)


# --- advanced indexing ------------------------------------------------------------------------


def _check_masks(self, indices):
  """torch's check that each boolean mask has the shape of the dims of `self` it indexes
  (JAX's error says it in other words; `index_put` would drop or misplace the values)."""
  d = 0
  for i in indices:
    if i is not None and i.dtype == jnp.bool_ and d + i.ndim <= self.ndim:
      for j in range(i.ndim):
        if i.shape[j] != self.shape[d + j]:
          raise IndexError(
            f"The shape of the mask {list(i.shape)} at index {j} does not match the shape "
            f"of the indexed tensor {list(self.shape)} at index {d + j}"
          )
    d += i.ndim if i is not None and i.dtype == jnp.bool_ else 1


def _check_advanced(self, indices):
  """torch's check of advanced indices: masks of the shape they index (`_check_masks`), and
  every integer index in [-size, size) of its dim. torch names the first bad element (in
  broadcast order; the index tensors' order within it) and numbers the dim among the index
  tensors (a k-dim mask counts k), not among `self`'s dims."""
  _check_masks(self, indices)
  arrays, dims, j, d = [], [], 0, 0
  for i in indices:
    if i is not None and i.dtype == jnp.bool_:
      j, d = j + i.ndim, d + i.ndim
      continue
    if i is not None:
      if self.shape[d] == 0 and i.size:  # known now (and JAX could not build the gather)
        check(
          np.ones((), bool),
          None,
          IndexError,
          "index is out of bounds for dimension with size 0",
          kind="index",
        )
      arrays.append(i)
      dims.append((j, self.shape[d]))
      j += 1
    d += 1
  if not arrays:
    return
  shape = jnp.broadcast_shapes(*(a.shape for a in arrays))
  values = jnp.stack([jnp.broadcast_to(a, shape) for a in arrays], axis=-1)
  sizes = [n for _, n in dims]
  # (jnp for a symbolic size: a dimension of `bridge.export`)
  sizes = np.array(sizes) if all(isinstance(n, int) for n in sizes) else jnp.array(sizes)
  bad = (values >= sizes) | (values < -sizes)

  def message(value, position):
    j, n = dims[position % len(dims)]
    return f"index {value} is out of bounds for dimension {j} with size {n}"

  check(bad, values, IndexError, message, kind="index")


@lowering(aten.index.Tensor, aten.index.Tensor_hacked_twin, dynamic_shape="bool_inputs")
@_advanced_dtypes
def index(self, indices):
  indices = _masks_to_bool(indices)
  _check_advanced(self, indices)
  return self[_getitem_tuple(indices)]


def _selected_count(ndim, indices, values_shape):
  """How many elements the boolean masks select, where static shapes tell it, else None.

  Other advanced (integer) indices broadcast with the masks' selection, so their
  last dim tells it; otherwise the values' dim that lines up with the selection does.
  """
  is_mask = [i is not None and i.dtype == jnp.bool_ for i in indices]
  int_shapes = [i.shape for i, m in zip(indices, is_mask) if i is not None and not m]
  adv_shape = np.broadcast_shapes(*int_shapes) if int_shapes else ()
  if adv_shape and adv_shape[-1] != 1:
    return adv_shape[-1]
  adv_ndim = max(len(adv_shape), 1)
  consumed = [(i.ndim if m else 1) if i is not None else 1 for i, m in zip(indices, is_mask)]
  positions = [k for k, i in enumerate(indices) if i is not None]
  adjacent = positions == list(range(positions[0], positions[-1] + 1))
  before = positions[0] if adjacent else 0  # sliced dims ahead of the advanced block
  sliced = ndim - sum(c for c, i in zip(consumed, indices) if i is not None)
  from_end = adv_ndim + sliced - 1 - (before + adv_ndim - 1)  # the selection's dim, from the end
  if len(values_shape) > from_end and values_shape[-1 - from_end] != 1:
    return values_shape[-1 - from_end]
  return None


def _put_tuple(self, indices, values):
  """The `.at[...]` index for `index_put`, with boolean masks turned into static-size indices."""
  indices = _masks_to_bool(indices)
  if not any(i is not None and i.dtype == jnp.bool_ for i in indices):
    return _getitem_tuple(indices), False
  count = _selected_count(self.ndim, indices, np.shape(values))
  padded = count is None
  if padded:  # values broadcast over the selection: pad with out-of-range indices, dropped
    count = min(int(np.prod(i.shape)) for i in indices if i is not None and i.dtype == jnp.bool_)
  else:
    _check_selected(self, indices, values, count)
  out, dim = [], 0
  for i in indices:
    if i is not None and i.dtype == jnp.bool_:
      fill = tuple(self.shape[dim : dim + i.ndim])
      parts = jnp.nonzero(i, size=count, fill_value=fill) if i.ndim else None
      if parts is None:  # a 0-d mask: True adds a unit dim, False selects nothing
        raise NotImplementedError("bridge: index_put with a 0-d boolean index")
      out.extend(parts)
      dim += i.ndim
    else:
      out.append(slice(None) if i is None else i)
      dim += 1
  return tuple(out), padded


def _check_selected(self, indices, values, count):
  """torch's error where the one boolean mask of an `index_put` selects another number of
  elements than the values give (`x[mask] = v`, 3 values for 2 places): the selection is
  read from static-size indices, which would drop the extra values or repeat the last."""
  masks = [i for i in indices if i is not None and i.dtype == jnp.bool_]
  if len(masks) != 1 or any(i is not None and i.dtype != jnp.bool_ for i in indices):
    return
  selected = jnp.sum(masks[0], dtype=jnp.int32)
  values_shape = list(np.shape(values))
  shape, mask_ndim = tuple(self.shape), masks[0].ndim
  before = next(k for k, i in enumerate(indices) if i is not None)

  def message(value, position):
    del position
    rest = shape[before + mask_ndim :]
    result = [*shape[:before], int(value), *rest]
    return (
      f"shape mismatch: value tensor of shape {values_shape} cannot be broadcast to indexing "
      f"result of shape {result}"
    )

  check(selected != count, selected, RuntimeError, message)


def _index_put(self, indices, values, accumulate):
  idx, padded = _put_tuple(self, indices, values)
  values = jnp.asarray(values).astype(self.dtype)
  mode = "drop" if padded else None
  return _add_at(self, idx, values, mode) if accumulate else self.at[idx].set(values, mode=mode)


def _check_put_dtypes(self, values):
  """torch's rule: `index_put` writes values of `self`'s dtype only (`x[i] = 5.0` is converted
  first; a tensor of another dtype is refused, not cast: `int8[i] = tensor(1000)` wrapped)."""
  got = np.dtype(getattr(values, "dtype", self.dtype))
  if got != np.dtype(self.dtype):
    raise RuntimeError(
      "Index put requires the source and destination dtypes match, got "
      f"{_torch_name(self.dtype)} for the destination and {_torch_name(got)} for the source."
    )


@lowering(aten.index_put.default, aten.index_put.hacked_twin)
@_advanced_dtypes
def index_put(self, indices, values, accumulate=False):
  _check_advanced(self, _masks_to_bool(indices))
  _check_put_dtypes(self, values)
  return _index_put(self, indices, values, accumulate)


@lowering(
  aten._index_put_impl.default, aten._index_put_impl_.default, aten._index_put_impl_.hacked_twin
)
@_advanced_dtypes
def _index_put_impl(self, indices, values, accumulate=False, unsafe=False):
  _check_advanced(self, _masks_to_bool(indices))
  _check_put_dtypes(self, values)
  return _index_put(self, indices, values, accumulate)


@lowering(aten._unsafe_index.Tensor, aten._unsafe_index.Tensor_hacked_twin)
@_index_dtypes(
  1, ("int64", "int32"), RuntimeError, "_unsafe_index found unexpected index type {dtype}"
)
def _unsafe_index(self, indices):
  """`index` with integer indices only (what decompositions emit): static shapes."""
  _check_advanced(self, indices)
  return self[_getitem_tuple(indices)]


@lowering(aten._unsafe_index_put.default, aten._unsafe_index_put.hacked_twin)
@_advanced_dtypes
def _unsafe_index_put(self, indices, values, accumulate=False):
  _check_advanced(self, _masks_to_bool(indices))
  return _index_put(self, indices, values, accumulate)


def _readable(self, dims, fill=0):
  """`self`, or where one of its `dims` has size 0, a stand-in with that dim grown to one
  element of `fill`: JAX cannot build a gather from a size-0 dim. Any index there is out of
  range: the lowering's check raises torch's error for it in eager mode; a program reads
  `fill`, as it reads a clamped element for an index out of range elsewhere."""
  if all(self.shape[d] != 0 for d in dims):
    return self
  shape = tuple(1 if d in dims and n == 0 else n for d, n in enumerate(self.shape))
  return jnp.full(shape, fill, self.dtype)


def _clamped(self, indices):
  """Indices clamped into [-size, size) per dim, as torch's decompositions of the masked ops."""
  return [
    None if ix is None else jnp.clip(ix, -self.shape[d], self.shape[d] - 1)
    for d, ix in enumerate(indices)
  ]


@lowering(aten._unsafe_masked_index.default)
def _unsafe_masked_index(self, mask, indices, fill):
  """`self[indices]` where `mask`, else `fill` (what torch's `slice_scatter` decomposes to: an
  empty slice's `src` has a size-0 dim, read nowhere)."""
  fill = jnp.asarray(fill).astype(self.dtype)
  src = _readable(self, [d for d, ix in enumerate(indices) if ix is not None], fill)
  return jnp.where(mask, src[_getitem_tuple(_clamped(src, indices))], fill)


@lowering(aten._unsafe_masked_index_put_accumulate.default)
def _unsafe_masked_index_put_accumulate(self, mask, indices, values):
  values = jnp.where(mask, values, jnp.zeros((), values.dtype))
  return _index_put(self, _clamped(self, indices), values, True)


# --- index_* along one dim --------------------------------------------------------------------


def _along(self, dim, index):
  """`.at[]`/getitem index selecting `index` (1-d) along `dim`."""
  d = _dim(dim, self.ndim)
  return (slice(None),) * d + (jnp.reshape(index, (-1,)),)


@lowering(aten.index_select.default)
@_index_dtypes(
  2, ("int64", "int32"), RuntimeError, "index_select(): Expected dtype int32 or int64 for index"
)
def index_select(self, dim, index):
  if index.ndim > 1:
    raise IndexError("index_select(): Index is supposed to be a vector")
  # [0, size); torch's CPU kernel words it by its path: its own loop along dim 1
  if self.ndim > 1 and _dim(dim, self.ndim) == 1:
    _check_along(
      self,
      dim,
      index,
      RuntimeError,
      "INDICES element is out of DATA bounds, id={value} axis_dim={size}",
    )
  else:
    _check_along(self, dim, index, IndexError, "index out of range in self")
  if self.ndim == 0:
    if index.size != 1:  # (known from the shapes)
      raise RuntimeError(
        f"index_select(): Index to scalar can have only 1 value, got {index.size} value(s)"
      )
    return jnp.reshape(self, (1,))[jnp.reshape(index, (-1,))].reshape(())
  if self.ndim > 1 and self.shape[_dim(dim, self.ndim)] == 0 and index.size:
    _select_from_empty()  # (1-d: the check above raises)
  return _readable(self, [_dim(dim, self.ndim)])[_along(self, dim, index)]


def _select_from_empty():
  """torch's error, known from the shapes, for rows selected from a size-0 dim
  (`index_select`, `embedding`)."""
  check(
    np.ones((), bool),
    None,
    RuntimeError,
    "index_select(): self indexing axis dim should be positive",
    kind="index",
  )


@lowering(aten.index_add.default)
@_index_dtypes(
  2,
  ("int64", "int32"),
  RuntimeError,
  "index_add_(): Expected dtype int32/int64 for index but got: {dtype}",
)
def index_add(self, dim, index, source, *, alpha=1):
  if self.ndim == 0:
    return index_add(self.reshape(1), 0, index, source.reshape(1), alpha=alpha).reshape(())
  # torch's CPU kernel words it by its path: a loop over one dim for 1-d (and 0-d) tensors,
  # `index_put`'s for the others
  if self.ndim == 1:
    _check_along(self, dim, index, IndexError, "index out of range in self")
  else:
    _check_along(self, dim, index, RuntimeError, _dim_message())
  # bool: torch's `source * alpha` is a logical and, its addition a logical or
  src = jnp.logical_and(source, alpha) if self.dtype == jnp.bool_ else source * alpha
  src = src.astype(self.dtype)
  return _add_at(self, _along(self, dim, index), src.reshape(_indexed_shape(self, dim, index)))


def _indexed_shape(self, dim, index):
  d = _dim(dim, self.ndim)
  return self.shape[:d] + (int(np.prod(index.shape)),) + self.shape[d + 1 :]


@lowering(aten.index_copy.default)
@_index_dtypes(
  2, ("int64",), RuntimeError, "index_copy_(): Expected a long tensor for index, but got {dtype}"
)
def index_copy(self, dim, index, source):
  _check_along(self, dim, index, IndexError, _dim_message("index_copy_(): "))
  if self.ndim == 0:
    return jnp.reshape(source, ()).astype(self.dtype)
  src = source.astype(self.dtype).reshape(_indexed_shape(self, dim, index))
  return self.at[_along(self, dim, index)].set(src)


@lowering(aten.index_fill.int_Scalar)
@_index_dtypes(2, ("int64",), IndexError, "index_fill_(): Expected dtype int64 for index.")
def index_fill_int_Scalar(self, dim, index, value):
  if self.ndim == 0:
    return index_fill_int_Scalar(self.reshape(1), 0, index, value).reshape(())
  _check_along(self, dim, index, IndexError, _dim_message(), negative=True)
  return self.at[_along(self, dim, index)].set(jnp.asarray(value).astype(self.dtype))


@lowering(aten.index_fill.int_Tensor)
def index_fill_int_Tensor(self, dim, index, value):
  return index_fill_int_Scalar(self, dim, index, value)


@lowering(aten.index_reduce.default)
@_index_dtypes(
  2,
  ("int64", "int32"),
  RuntimeError,
  "index_reduce_(): Expected dtype int32/int64 for index but got: {dtype}",
)
def index_reduce(self, dim, index, source, reduce, *, include_self=True):
  """scatter_reduce with `index` spread over `source`'s other dims."""
  if self.ndim == 0:
    return index_reduce(
      self.reshape(1), 0, index, source.reshape(1), reduce, include_self=include_self
    ).reshape(())
  _check_along(self, dim, index, IndexError, "index out of range in self")
  d = _dim(dim, self.ndim)
  src = jnp.reshape(source, _indexed_shape(self, d, index))
  shape = [1] * self.ndim
  shape[d] = -1
  full = jnp.broadcast_to(jnp.reshape(index, shape), src.shape)
  return _scatter_reduce_two(self, d, full, src, reduce, include_self)


def _check_flat(self, index, empty):
  """`take`/`put`'s check: flat positions in [-numel, numel)."""
  if not self.size:  # known now (and JAX could not build `take`'s gather)
    check(
      np.ones((), bool) if np.size(index) else np.zeros((), bool),
      None,
      IndexError,
      empty,
      kind="index",
    )
    return
  check_index(
    index,
    self.size,
    IndexError,
    f"out of range: tried to access index {{value}} on a tensor of {self.size} elements.",
    negative=True,
  )


@lowering(aten.take.default)
def take(self, index):
  _check_flat(self, index, "take(): tried to take from an empty tensor")
  return jnp.reshape(self, (-1,))[index]


@lowering(aten.put.default)
@_index_dtypes(
  1, ("int64",), RuntimeError, "put_(): Expected a long tensor for index, but got {dtype}"
)
def put(self, index, source, accumulate=False):
  """Writes `source` at flat positions `index` of `self` (negative ones count from the end)."""
  _check_flat(self, index, "put_(): Tried to put elements into an empty tensor")
  flat = jnp.reshape(self, (-1,))
  idx = jnp.reshape(index, (-1,))
  idx = jnp.where(idx < 0, idx + flat.shape[0], idx)
  src = jnp.reshape(source, (-1,)).astype(self.dtype)
  out = _add_at(flat, idx, src) if accumulate else flat.at[idx].set(src)
  return jnp.reshape(out, self.shape)


@lowering(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
  """Rows of `weight`. torch's derivative differs from a plain gather's: the row at
  `padding_idx` (>= 0; -1 is none) gets no gradient, and with `scale_grad_by_freq` each
  row's gradient is divided by how often it is looked up in `indices`. JAX's transforms of
  the gather (`jax.grad`, `jax.jvp`, the VJP behind a compiled module's backward) follow
  torch through `_embedding`'s JVP rule."""
  if weight.ndim != 2:
    raise RuntimeError("'weight' must be 2-D")
  if weight.shape[0] == 0 and indices.size:
    _select_from_empty()
  check_index(indices, weight.shape[0], IndexError, "index out of range in self")
  if ((padding_idx is None or padding_idx < 0) and not scale_grad_by_freq) or not jnp.issubdtype(
    weight.dtype, jnp.inexact
  ):  # (no derivative to shape)
    return _rows(weight, indices)
  return _embedding(
    padding_idx if padding_idx is not None else -1, bool(scale_grad_by_freq), weight, indices
  )


def _rows(weight, indices):
  """`weight[indices]`: an index out of range is clamped into range, as every JAX read (its
  check raised in eager mode; `jnp.take`'s default NaN fill costs a mask and a select).
  The indices are clipped in their own dtype and then narrowed where the rows fit int32:
  `jnp.take`'s own clamp mixes int32 bounds with int64 indices under `jax.grad` when
  64-bit types are switched on for the op only."""
  weight = _readable(weight, [0])
  n = weight.shape[0]
  if isinstance(n, int) and n < 2**31 and np.dtype(indices.dtype).itemsize > 4:
    indices = jnp.clip(indices, 0, n - 1).astype(jnp.int32)
  return jnp.take(weight, indices, axis=0, mode="clip")


# rows of `weight`; derivative: the weight tangent's rows times the per-position factor
# (linear in that tangent, so JAX transposes it for reverse mode: a scatter-add)
_embedding_rows = with_derivative(
  lambda weight, indices, factor: _rows(weight, indices),
  lambda out, p, t: _rows(t[0], p[1]) * p[2][..., None],
)


def _embedding(padding_idx: int, scale_grad_by_freq: bool, weight, indices):
  """`jnp.take(weight, indices, axis=0)` whose derivative scales each looked-up row by a
  per-position factor (0 at `padding_idx`, 1 / the row's count with `scale_grad_by_freq`)."""
  factor = jnp.ones(indices.shape, weight.dtype)
  if scale_grad_by_freq:
    flat = jnp.reshape(indices, (-1,))
    counts = jnp.zeros((weight.shape[0],), weight.dtype).at[flat].add(1)
    factor = factor / counts[indices]
  if padding_idx >= 0:
    factor = jnp.where(indices == padding_idx, jnp.zeros((), weight.dtype), factor)
  return _embedding_rows(weight, indices, jax.lax.stop_gradient(factor))


@lowering(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
  idx = jnp.reshape(indices, (-1,))
  width = grad_output.shape[-1]
  grad = jnp.reshape(grad_output, (idx.shape[0], width))
  if scale_grad_by_freq:
    counts = jnp.zeros((num_weights,), grad.dtype).at[idx].add(1)
    grad = grad / counts[idx][:, None]
  grad = jnp.where((idx != padding_idx)[:, None], grad, jnp.zeros((), grad.dtype))
  return jnp.zeros((num_weights, width), grad.dtype).at[idx].add(grad)


# --- gather / scatter -------------------------------------------------------------------------


def _scatter_index(self, dim, index):
  """The full index tuple of torch gather/scatter: `index` along `dim`, positions elsewhere."""
  d = _dim(dim, self.ndim)
  grids = _sparse_indices(index.shape)
  grids[d] = index
  return tuple(grids)


def _sparse_indices(shape):
  """`jnp.indices(shape, sparse=True)` that also takes symbolic sizes (`bridge.export`)."""
  dtype = jax.dtypes.canonicalize_dtype(jnp.int64)
  return [
    jax.lax.broadcasted_iota(dtype, tuple(n if j == i else 1 for j, n in enumerate(shape)), i)
    for i in range(len(shape))
  ]


def _src_part(src, index):
  """The part of `src` that scatter reads (src may be larger than index in every dim)."""
  return src[tuple(slice(0, n) for n in index.shape)]


def _as_1d(out):
  """torch allows 0-d self/index/src in gather/scatter: run them as 1-element 1-d tensors.

  `out` names whose shape the result has: "self" (scatter) or "index" (gather).
  """

  def decorate(fn):
    def wrapped(self, dim, index, *args, **kwargs):
      if self.ndim:
        return fn(self, dim, index, *args, **kwargs)
      args = [jnp.reshape(a, (-1,)) if hasattr(a, "ndim") and not weak(a) else a for a in args]
      result = fn(jnp.reshape(self, (1,)), 0, jnp.reshape(index, (-1,)), *args, **kwargs)
      return jnp.reshape(result, self.shape if out == "self" else index.shape)

    wrapped.__name__, wrapped.__qualname__ = fn.__name__, fn.__qualname__
    wrapped.__module__ = fn.__module__
    return wrapped

  return decorate


def _check_scatter(self, dim, index):
  """gather/scatter's check: `index` in [0, size) of `self`'s dim `dim`."""
  _check_along(self, dim, index, RuntimeError, _dim_message())


@lowering(aten.gather.default)
@_as_1d("index")
def gather(self, dim, index, *, sparse_grad=False):
  _check_scatter(self, dim, index)
  return _readable(self, [_dim(dim, self.ndim)])[_scatter_index(self, dim, index)]


def _reduce_at(x, idx, values, reduce):
  if reduce == "add":
    return _add_at(x, idx, values)
  if reduce == "multiply":
    return _mul_at(x, idx, values)
  raise ValueError(f"bridge: scatter reduce must be 'add' or 'multiply', got {reduce!r}")


@lowering(aten.scatter.src)
@_as_1d("self")
def scatter_src(self, dim, index, src):
  _check_scatter(self, dim, index)
  return self.at[_scatter_index(self, dim, index)].set(_src_part(src, index).astype(self.dtype))


@lowering(aten.scatter.value)
@_as_1d("self")
def scatter_value(self, dim, index, value):
  _check_scatter(self, dim, index)
  return self.at[_scatter_index(self, dim, index)].set(jnp.asarray(value).astype(self.dtype))


@lowering(aten.scatter.reduce)
@_as_1d("self")
def scatter_reduce(self, dim, index, src, *, reduce):
  _check_scatter(self, dim, index)
  idx = _scatter_index(self, dim, index)
  return _reduce_at(self, idx, _src_part(src, index).astype(self.dtype), reduce)


@lowering(aten.scatter.value_reduce)
@_as_1d("self")
def scatter_value_reduce(self, dim, index, value, *, reduce):
  _check_scatter(self, dim, index)
  vals = jnp.broadcast_to(jnp.asarray(value).astype(self.dtype), index.shape)
  return _reduce_at(self, _scatter_index(self, dim, index), vals, reduce)


@lowering(aten.scatter_add.default)
@_as_1d("self")
def scatter_add(self, dim, index, src):
  _check_scatter(self, dim, index)
  return _add_at(self, _scatter_index(self, dim, index), _src_part(src, index).astype(self.dtype))


@jax.custom_vjp
def _scatter_prod(base, idx, src):
  """`base.at[idx].multiply(src)`, differentiable with repeated indices (JAX's scatter-multiply
  gradient needs unique ones) by torch's `scatter_reduce_backward` formula for "prod"."""
  return base.at[idx].multiply(src)


def _scatter_prod_fwd(base, idx, src):
  result = base.at[idx].multiply(src)
  return result, (base, idx, src, result)


def _scatter_prod_bwd(res, g):
  base, idx, src, result = res
  one = jnp.ones((), base.dtype)
  # torch: an element's gradient is the product of the others, computed without dividing by 0.
  masked_base = jnp.where(base == 0, one, base)
  grad_base = g * masked_base.at[idx].multiply(src) / masked_base
  src_zero = src == 0
  zeros_in_slot = jnp.zeros(base.shape, jnp.int32).at[idx].add(src_zero.astype(jnp.int32))[idx]
  single_zero = src_zero & (zeros_in_slot == 1)
  others = base.at[idx].multiply(jnp.where(single_zero, one, src))
  grad_src = jnp.where(
    single_zero, (g * others)[idx], (g * result)[idx] / jnp.where(src_zero, one, src)
  )
  return grad_base, tuple(None for _ in idx), grad_src


_scatter_prod.defvjp(_scatter_prod_fwd, _scatter_prod_bwd)


@lowering(aten.scatter_reduce.two)
@_as_1d("self")
def scatter_reduce_two(self, dim, index, src, reduce, *, include_self=True):
  _check_scatter(self, dim, index)
  return _scatter_reduce_two(self, dim, index, src, reduce, include_self)


def _scatter_reduce_two(self, dim, index, src, reduce, include_self):
  idx = _scatter_index(self, dim, index)
  src = _src_part(src, index).astype(self.dtype)
  dt = self.dtype

  def base(init):
    return self if include_self else self.at[idx].set(jnp.asarray(init, dt))

  if reduce == "sum":
    return _add_at(base(0), idx, src)
  if reduce == "prod":
    if dt == jnp.bool_:
      return _mul_at(base(1), idx, src)
    return _scatter_prod(base(1), idx, src)
  if reduce == "amax":
    return base(lowest(dt)).at[idx].max(src)
  if reduce == "amin":
    return base(highest(dt)).at[idx].min(src)
  if reduce == "mean":
    total = base(0).at[idx].add(src)
    count = (
      (jnp.ones if include_self else jnp.zeros)(self.shape, dt)
      .at[idx]
      .add(jnp.ones(index.shape, dt))
    )
    count = jnp.where(count == 0, jnp.ones((), dt), count)
    kind = np.dtype(dt).kind
    if kind in "fc" or dt == jnp.bfloat16:
      return total / count
    return jnp.floor_divide(total, count)
  raise ValueError(f"bridge: unknown scatter_reduce reduction {reduce!r}")


# --- masks ------------------------------------------------------------------------------------


@lowering(aten.masked_scatter.default)
@_index_dtypes(
  1,
  ("bool",),
  RuntimeError,
  "masked_scatter_ only supports boolean masks, but got mask with dtype {dtype}",
)
def masked_scatter(self, mask, source):
  shape = jnp.broadcast_shapes(self.shape, mask.shape)
  flat = jnp.broadcast_to(self, shape).reshape(-1)
  m = jnp.broadcast_to(mask, shape).reshape(-1)
  src = jnp.reshape(source, (-1,)).astype(self.dtype)
  count = jnp.sum(m, dtype=jnp.int64)
  check(
    count > src.size, None, RuntimeError, "Number of elements of source < number of ones in mask"
  )
  if src.size == 0:
    return flat.reshape(shape)
  pos = jnp.cumsum(m, dtype=jnp.int64) - 1  # the i-th selected element takes source[i]
  vals = src[jnp.clip(pos, 0, src.size - 1)]
  return jnp.where(m, vals, flat).reshape(shape)


@lowering(aten.masked_select.default, dynamic_shape=True)
@_index_dtypes(1, ("bool",), RuntimeError, "masked_select: expected BoolTensor for mask")
def masked_select(self, mask):
  broadcast_shapes(mask.shape, self.shape)  # (torch's error where they do not broadcast)
  s, m = jnp.broadcast_arrays(self, mask.astype(jnp.bool_))
  return s[m]


@lowering(aten.nonzero.default, dynamic_shape=True)
def nonzero(self):
  if self.ndim == 0:
    return jnp.zeros((int(self != 0), 0), jnp.int64)
  return jnp.stack(jnp.nonzero(self), axis=1).astype(jnp.int64)


@lowering(aten.nonzero_static.default)
def nonzero_static(self, *, size, fill_value=-1):
  if self.ndim == 0:
    return jnp.zeros((size, 0), jnp.int64)
  parts = jnp.nonzero(self, size=size, fill_value=fill_value)
  return jnp.stack(parts, axis=1).astype(jnp.int64)
