"""Pooling: max/avg/adaptive/fractional pooling in 1d, 2d and 3d, with indices, and unpooling.

What reaches the device: `max_pool{1,2}d` -> `max_pool2d_with_indices` (its backward is
torch's decomposition), `max_pool3d` -> `max_pool3d_with_indices` (decomposed by torch),
`avg_pool{1,2,3}d` -> `avg_pool2d`/`avg_pool3d`, `adaptive_avg_pool{1,2,3}d` ->
`_adaptive_avg_pool2d/3d` (an output of 1 becomes `mean`), `adaptive_max_pool{1,2,3}d` ->
`adaptive_max_pool2d/3d`, `fractional_max_pool2d/3d` (their random samples arrive as a
tensor, drawn by torch on the device), `max_unpool{1,2,3}d` -> `max_unpool2d/3d`.

torch's semantics reproduced here:

* windows: `pooling_output_shape` (with `ceil_mode`, the last window must start inside the
  input or the left padding); adaptive windows `[floor(i * in / out), ceil((i + 1) * in / out))`;
* max: NaN wins (the last NaN of the window), else the first maximum; indices are flat
  offsets into each (batch, channel) plane;
* avg: the divisor is `divisor_override`, else the window clipped to the padded input
  (`count_include_pad`) or to the input; integers divide truncating; 16-bit floats sum and
  divide in float32 and round once, as torch's CPU kernels do.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bridge_ops._lowering import aten, check, expand_param, lowering, lowest, opmath


# ---------------------------------------------------------------------------- windows


def _pool_out(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
  """torch's `pooling_output_shape`."""
  out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
  if ceil_mode and (out - 1) * s >= size + p:
    out -= 1
  return out


def _pool_params(x, nd, kernel_size, stride, padding, dilation, ceil_mode):
  k = expand_param(kernel_size, nd)
  s = expand_param(stride, nd) if stride else k  # an empty stride means stride = kernel_size
  p = expand_param(padding, nd)
  d = expand_param(dilation, nd)
  sizes = x.shape[-nd:]
  out = [_pool_out(n, kk, ss, pp, dd, ceil_mode) for n, kk, ss, pp, dd in zip(sizes, k, s, p, d)]
  # Padding on the high side: enough for the last (ceil_mode) window, never negative.
  hi = [
    max(0, (o - 1) * ss + dd * (kk - 1) + 1 - pp - n)
    for o, ss, dd, kk, pp, n in zip(out, s, d, k, p, sizes)
  ]
  return k, s, p, d, out, hi


def _windows(x, k, s, p, d, out, hi, fill):
  """Stacks the prod(k) strided views of the padded `x`: (..., K, *out)."""
  nd = len(k)
  lead = x.ndim - nd
  xp = jnp.pad(x, [(0, 0)] * lead + list(zip(p, hi)), constant_values=fill)
  views = []
  for offs in np.ndindex(*k):
    start = (0,) * lead + tuple(o * dd for o, dd in zip(offs, d))
    limit = xp.shape[:lead] + tuple(
      o * dd + (oo - 1) * ss + 1 for o, dd, oo, ss in zip(offs, d, out, s)
    )
    views.append(lax.slice(xp, start, limit, (1,) * lead + tuple(s)))
  return jnp.stack(views, axis=-nd - 1)


def _select_max(v, valid, flat, axis):
  """torch's scan of a window (`val > max || isnan(val)`): the value, and the flat index of
  the last NaN or else the first maximum. `v` holds the window along `axis` (-inf padded),
  `valid` marks real elements, `flat` their flat input offsets."""
  peak = jnp.max(v, axis=axis)  # NaN propagates
  first_max = jnp.argmax(valid & (v == jnp.expand_dims(peak, axis)), axis=axis)
  if jnp.issubdtype(v.dtype, jnp.floating):
    nan = valid & jnp.isnan(v)
    kk = v.shape[axis]
    last_nan = kk - 1 - jnp.argmax(jnp.flip(nan, axis=axis), axis=axis)
    first_max = jnp.where(jnp.any(nan, axis=axis), last_nan, first_max)
  flat = jnp.broadcast_to(jnp.asarray(flat, dtype=jnp.int64), v.shape)
  chosen = jnp.expand_dims(first_max, axis).astype(jnp.int64)
  index = jnp.take_along_axis(flat, chosen, axis=axis)
  # The value read at the chosen element: its derivative goes to that element alone, as
  # torch's backward sends each window's gradient to its index (the max's rule would split
  # it between tied elements).
  values = jnp.squeeze(jnp.take_along_axis(v, chosen, axis=axis), axis)
  return values, jnp.squeeze(index, axis)


# ------------------------------------------------------------------------------ max pool


@lowering(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
  x = self
  k, s, p, d, out, hi = _pool_params(x, 2, kernel_size, stride, padding, dilation, ceil_mode)
  h, w = x.shape[-2:]
  v = _windows(x, k, s, p, d, out, hi, lowest(x.dtype))
  # Static geometry: row/column of every window element, and whether it is inside the input.
  ki, kj = np.divmod(np.arange(k[0] * k[1]), k[1])
  rows = np.arange(out[0])[None, :, None] * s[0] - p[0] + ki[:, None, None] * d[0]
  cols = np.arange(out[1])[None, None, :] * s[1] - p[1] + kj[:, None, None] * d[1]
  valid = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)
  return _select_max(v, valid, rows * w + cols, axis=-3)


# ------------------------------------------------------------------------------ avg pool


def _avg_pool(x, nd, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
  k, s, p, _, out, hi = _pool_params(x, nd, kernel_size, stride, padding, 1, ceil_mode)
  lead = x.ndim - nd
  y = x.astype(opmath(x.dtype))
  summed = lax.reduce_window(  # a concrete 0 init keeps it a differentiable window sum
    y,
    np.zeros((), y.dtype),
    lax.add,
    (1,) * lead + tuple(k),
    (1,) * lead + tuple(s),
    [(0, 0)] * lead + list(zip(p, hi)),
  )
  if divisor_override is not None:
    div = np.full(out, divisor_override, np.int64)
  else:
    # torch: the window clipped to the padded input (pool_size) or to the input itself.
    def sizes(o, kk, ss, pp, n):
      start = np.arange(o) * ss - pp
      end = np.minimum(start + kk, n + pp)
      full = end - start
      valid = np.minimum(end, n) - np.maximum(start, 0)
      return full if count_include_pad else valid

    div = np.ones((), np.int64)
    for o, kk, ss, pp, n in zip(out, k, s, p, x.shape[lead:]):
      div = np.multiply.outer(div, sizes(o, kk, ss, pp, n))
    div = np.maximum(div, 1)
  if jnp.issubdtype(x.dtype, jnp.integer):
    # torch divides integers in C++: truncating, as lax.div.
    return lax.div(summed, jnp.broadcast_to(jnp.asarray(div, x.dtype), summed.shape))
  return (summed / jnp.asarray(div, y.dtype)).astype(x.dtype)


@lowering(aten.avg_pool2d.default)
def avg_pool2d(
  self,
  kernel_size,
  stride=(),
  padding=0,
  ceil_mode=False,
  count_include_pad=True,
  divisor_override=None,
):
  return _avg_pool(
    self, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
  )


@lowering(aten.avg_pool3d.default)
def avg_pool3d(
  self,
  kernel_size,
  stride=(),
  padding=0,
  ceil_mode=False,
  count_include_pad=True,
  divisor_override=None,
):
  return _avg_pool(
    self, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
  )


def _vjp(f, x, grad, *args):
  """The gradient for `grad` of `f(x, *args)` at `x`."""
  _, vjp = jax.vjp(lambda x: f(x, *args), x)
  return vjp(grad.astype(x.dtype))[0]


@lowering(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(
  grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
  options = (kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
  return _vjp(_avg_pool, self, grad_output, 2, *options)


@lowering(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(
  grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
  options = (kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
  return _vjp(_avg_pool, self, grad_output, 3, *options)


# ------------------------------------------------------------------------------ adaptive


def _adaptive_table(n: int, o: int):
  """torch's adaptive windows [floor(i n/o), ceil((i+1) n/o)): (indices (o, K), mask, sizes)."""
  i = np.arange(o)
  start = (i * n) // o
  end = ((i + 1) * n + o - 1) // o
  k = int((end - start).max()) if o else 1
  idx = start[:, None] + np.arange(k)[None, :]
  mask = idx < end[:, None]
  return np.where(mask, idx, 0), mask, end - start


def _adaptive_avg(x, output_size):
  """Window sums one axis at a time (only the window's own elements: an inf elsewhere does
  not leak in), divided by the window sizes; in float32 for the 16-bit floats."""
  nd = len(output_size)
  y = x.astype(opmath(x.dtype))
  count = np.ones((), np.int64)
  for a, o in enumerate(output_size):
    axis = x.ndim - nd + a
    idx, mask, sizes = _adaptive_table(x.shape[axis], int(o))
    total = None
    for j in range(idx.shape[1]):
      shape = [1] * y.ndim
      shape[axis] = idx.shape[0]
      term = jnp.take(y, jnp.asarray(idx[:, j]), axis=axis)
      term = jnp.where(jnp.asarray(mask[:, j]).reshape(shape), term, jnp.zeros((), y.dtype))
      total = term if total is None else total + term
    y = total
    count = np.multiply.outer(count, sizes)
  return (y / jnp.asarray(count, y.dtype)).astype(x.dtype)


def _check_nonempty(x, name: str, first: int) -> None:
  """torch's refusal of an adaptive pooling's input with an empty dim from `first` on (the
  spatial dims for `adaptive_avg_pool2d`, every non-batch dim for `adaptive_avg_pool3d`):
  its windows would be empty. Known from the shapes."""
  for i in range(first, x.ndim):
    if x.shape[i] == 0:
      raise RuntimeError(
        f"{name}(): Expected input to have non-zero size for non-batch dimensions, but input "
        f"has sizes {list(x.shape)} with dimension {i} being empty"
      )


@lowering(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(self, output_size):
  _check_nonempty(self, "adaptive_avg_pool2d", self.ndim - 2)
  return _adaptive_avg(self, expand_param(output_size, 2))


@lowering(aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool3d(self, output_size):
  _check_nonempty(self, "adaptive_avg_pool3d", 1)
  if self.dtype in (jnp.float16, jnp.bfloat16) and self.size and all(expand_param(output_size, 3)):
    return _adaptive_avg3d_half(self, expand_param(output_size, 3))
  return _adaptive_avg(self, expand_param(output_size, 3))


@lowering(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(grad_output, self):
  size = grad_output.shape[-2:]
  return _vjp(_adaptive_avg, self, grad_output, size)


@lowering(aten._adaptive_avg_pool3d_backward.default)
def _adaptive_avg_pool3d_backward(grad_output, self):
  size = grad_output.shape[-3:]
  return _vjp(_adaptive_avg, self, grad_output, size)


def _adaptive_windows(spatial, output_size):
  """Every adaptive window as flat offsets into the plane: (flat (*out, K), valid (*out, K)),
  K running over the window in row-major (torch's scan) order, padded where it is smaller."""
  nd = len(output_size)
  flat = np.zeros((), np.int64)
  valid = np.ones((), bool)
  stride = int(np.prod(spatial))
  for a, (n, o) in enumerate(zip(spatial, output_size)):
    idx, mask, _ = _adaptive_table(n, int(o))
    stride //= n
    shape = [1] * (2 * nd)
    shape[a], shape[nd + a] = idx.shape
    flat = flat + (idx * stride).reshape(shape)
    valid = valid & mask.reshape(shape)
  out_shape = tuple(int(o) for o in output_size)
  window = (_numel(flat.shape[nd:]),)  # (not -1: an output size of 0 leaves it unknown)
  flat = np.broadcast_to(flat, out_shape + flat.shape[nd:]).reshape(out_shape + window)
  valid = np.broadcast_to(valid, out_shape + valid.shape[nd:]).reshape(out_shape + window)
  return flat, valid


def _numel(shape) -> int:
  """The elements of a shape: `reshape(lead + (-1,))` cannot infer them when `lead` holds a 0
  (a batch of none)."""
  return int(np.prod(shape))


def _gather_windows(x, flat, nd):
  lead = x.shape[:-nd]
  v = jnp.take(x.reshape(lead + (_numel(x.shape[-nd:]),)), jnp.asarray(flat.reshape(-1)), axis=-1)
  return v.reshape(lead + flat.shape)


def _adaptive_avg3d_half(x, output_size):
  """torch's CPU 3-D kernel on 16-bit floats sums each window in that dtype, in scan order,
  then divides by its depth, height and width in turn, rounding every step."""

  def r(v):
    return v.astype(x.dtype).astype(jnp.float32)

  flat, valid = _adaptive_windows(x.shape[-3:], output_size)
  v = _gather_windows(x, flat, 3).astype(jnp.float32)
  total = jnp.zeros(v.shape[:-1], jnp.float32)
  for j in range(flat.shape[-1]):
    total = r(total + jnp.where(jnp.asarray(valid[..., j]), v[..., j], 0))
  for a, o in enumerate(output_size):
    size = _adaptive_table(x.shape[x.ndim - 3 + a], int(o))[2]
    shape = [1] * 3
    shape[a] = -1
    total = r(total / jnp.asarray(size.reshape(shape), jnp.float32))
  return total.astype(x.dtype)


def _adaptive_max(x, output_size):
  """(values, flat indices) over torch's adaptive windows, scanned in row-major order."""
  nd = len(output_size)
  flat, valid = _adaptive_windows(x.shape[-nd:], output_size)
  v = _gather_windows(x, flat, nd)
  v = jnp.where(jnp.asarray(valid), v, jnp.asarray(lowest(x.dtype), x.dtype))
  return _select_max(v, valid, flat, axis=-1)


@lowering(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(self, output_size):
  return _adaptive_max(self, expand_param(output_size, 2))


@lowering(aten.adaptive_max_pool3d.default)
def adaptive_max_pool3d(self, output_size):
  return _adaptive_max(self, expand_param(output_size, 3))


def _scatter_back(grad_output, self, indices, nd):
  """The gradient of a pooling that picked `indices` (flat offsets per plane): each output's
  gradient added at its index, in float32 for the 16-bit floats."""
  lead = self.shape[:-nd]
  g = grad_output.astype(opmath(grad_output.dtype)).reshape(
    lead + (_numel(grad_output.shape[-nd:]),)
  )
  idx = indices.reshape(lead + (_numel(indices.shape[-nd:]),))
  plane = int(np.prod(self.shape[-nd:]))
  zeros = jnp.zeros(lead + (plane,), g.dtype)
  batch = [jnp.arange(n).reshape((-1,) + (1,) * (len(lead) - i)) for i, n in enumerate(lead)]
  out = zeros.at[(*batch, idx)].add(g)
  return out.reshape(self.shape).astype(self.dtype)


@lowering(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad_output, self, indices):
  return _scatter_back(grad_output, self, indices, 2)


@lowering(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad_output, self, indices):
  return _scatter_back(grad_output, self, indices, 3)


# ---------------------------------------------------------------------------- fractional


def _intervals(sample, n_in: int, n_out: int, pool: int):
  """torch's `generate_intervals`: window starts `int((i + u) * alpha) - int(u * alpha)` with
  `alpha = (in - pool) / (out - 1)`, the last window at `in - pool`. torch computes in the
  input's dtype; for the 16-bit floats each step is rounded to it here as well."""
  dt = sample.dtype
  u = sample.astype(opmath(dt))

  def r(v):  # round to the sample's dtype, as torch's scalar arithmetic does
    return v.astype(dt).astype(u.dtype)

  if n_out > 1:
    alpha = r(jnp.asarray(n_in - pool, u.dtype) / jnp.asarray(n_out - 1, u.dtype))
    i = jnp.arange(n_out - 1, dtype=u.dtype)
    starts = (
      r(r(i + u[..., None]) * alpha).astype(jnp.int64) - r(u * alpha).astype(jnp.int64)[..., None]
    )
    last = jnp.full(u.shape + (1,), n_in - pool, jnp.int64)
    return jnp.concatenate([starts, last], axis=-1)
  return jnp.full(u.shape + (1,), n_in - pool, jnp.int64)


def _fractional_max(x, kernel_size, output_size, samples, nd):
  batched = x.ndim == nd + 2
  if not batched:
    x = x[None]
  k = expand_param(kernel_size, nd)
  out = expand_param(output_size, nd)
  spatial = x.shape[2:]
  # samples (N, C, nd): 2-D uses [w, h], 3-D [t, h, w].
  order = [1, 0] if nd == 2 else [0, 1, 2]
  n, c = x.shape[:2]
  starts = [_intervals(samples[..., order[a]], spatial[a], out[a], k[a]) for a in range(nd)]
  # window element positions per axis: (N, C, out_a, k_a)
  pos = [s[..., None] + jnp.arange(kk) for s, kk in zip(starts, k)]
  flat = jnp.zeros((n, c) + (1,) * (2 * nd), jnp.int64)
  stride = int(np.prod(spatial))
  for a in range(nd):
    stride //= spatial[a]
    shape = [n, c] + [1] * (2 * nd)
    shape[2 + a] = out[a]
    shape[2 + nd + a] = k[a]
    flat = flat + pos[a].reshape(shape) * stride
  window = int(np.prod(k))
  flat = flat.reshape((n, c) + tuple(out) + (window,))
  v = jnp.take_along_axis(
    x.reshape(n, c, _numel(spatial)), flat.reshape(n, c, _numel(out) * window), axis=-1
  )
  v = v.reshape(flat.shape)
  values, index = _select_max(v, jnp.ones(flat.shape, bool), flat, axis=-1)
  if not batched:
    values, index = values[0], index[0]
  return values, index


@lowering(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(self, kernel_size, output_size, random_samples):
  """torch's pseudo-random windows from `random_samples` (N, C, 2), then a max pool."""
  return _fractional_max(self, kernel_size, output_size, random_samples, 2)


@lowering(aten.fractional_max_pool3d.default)
def fractional_max_pool3d(self, kernel_size, output_size, random_samples):
  return _fractional_max(self, kernel_size, output_size, random_samples, 3)


@lowering(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
  return _scatter_back(grad_output, self, indices, 2)


@lowering(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
  return _scatter_back(grad_output, self, indices, 3)


# ------------------------------------------------------------------------------- unpool


def _check_unpool_indices(idx, output_size):
  """torch's error for an index outside the output plane. Its CPU kernel scans every index
  and keeps the last bad one (when it runs on one thread; several threads race for it):
  flipped, that one comes first in C order, which `check` reports."""
  sizes = "x".join(str(int(o)) for o in output_size)
  plane = int(np.prod(output_size))
  flat = jnp.flip(idx.reshape(-1))
  check(
    (flat < 0) | (flat >= plane),
    flat,
    RuntimeError,
    "Found an invalid max index: {value} (output volumes are of size " + sizes + ")",
  )


def _max_unpool(x, indices, output_size, nd):
  """Each value written at its flat index of an (N, C, *output_size) zero tensor; the gradient
  of every input is the output gradient at its index (torch's, also for repeated indices).
  An index outside the output raises torch's error (`_check_unpool_indices`); unchecked in a
  traced program, where it is dropped."""
  lead = x.shape[:-nd]
  plane = int(np.prod(output_size))
  batch = tuple(jnp.arange(n).reshape((-1,) + (1,) * (len(lead) - i)) for i, n in enumerate(lead))
  idx = indices.reshape(lead + (_numel(indices.shape[-nd:]),)).astype(jnp.int64)
  if idx.size:
    _check_unpool_indices(idx, output_size)

  @jax.custom_vjp
  def unpool(values):
    return jnp.zeros(lead + (plane,), x.dtype).at[(*batch, idx)].set(values, mode="drop")

  def forward(values):
    return unpool(values), None

  def backward(_, g):
    return (g[(*batch, jnp.clip(idx, 0, plane - 1))] * (idx < plane).astype(g.dtype),)

  unpool.defvjp(forward, backward)
  return unpool(x.reshape(lead + (_numel(x.shape[-nd:]),))).reshape(
    lead + tuple(int(o) for o in output_size)
  )


@lowering(aten.max_unpool2d.default)
def max_unpool2d(self, indices, output_size):
  """`F.max_unpool1d/2d` (1-D as an (L, 1) output, as torch words its error)."""
  return _max_unpool(self, indices, output_size, 2)


@lowering(aten.max_unpool3d.default)
def max_unpool3d(self, indices, output_size, stride, padding):
  return _max_unpool(self, indices, output_size, 3)
