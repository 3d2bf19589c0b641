"""Interpolation: `interpolate`/`upsample` in every mode, `grid_sample`, and their backwards.

`F.interpolate` reaches the device as the aten `upsample_*` ops (their `.vec` overloads
are composite: torch turns them into the sized ones; both are registered, as torch's
Python dispatcher may hand over either). Each spatial axis is resampled separably, as
torch's CPU kernels do, with source indices and weights computed here in NumPy from
the static sizes, with torch's formulas (`aten/src/ATen/native/UpSample.h`) in torch's
computation type (float32 for the 16-bit floats and float32, float64 for float64):

* scale: `(in - 1) / (out - 1)` with `align_corners`, else `1 / scale_factor` when one
  is given (and > 0), else `in / out`;
* nearest: `min(floor(i * scale), in - 1)`; nearest-exact: `min(floor(max(scale * (i +
  0.5) - 0.5, 0) + 0.5), in - 1)`;
* linear: source `scale * (i + 0.5) - 0.5` (clamped at 0; `scale * i` with
  `align_corners`), the two neighbours weighted by the fraction; an axis whose size
  does not change is copied;
* cubic: Keys' kernel with A = -0.75 on four neighbours clamped to the edge;
* antialiased (`_upsample_*_aa`): Pillow's filters (triangle, Keys A = -0.5) stretched
  by the scale when shrinking, normalized to sum 1.

Scales are static arguments (the index tables depend on them). Values are computed
in float32 for float16/bfloat16 and rounded once.

`grid_sampler_2d/3d` follow `aten/src/ATen/native/GridSampler.h`: bilinear (trilinear),
nearest (round half to even) and bicubic (2-D only) sampling, zeros/border/reflection
padding, with or without `align_corners`. float16/bfloat16 have no opmath there: torch's
kernels round every operation to 16 bits, which is reproduced step by step (the 2-D
vectorized kernel and the 3-D scalar one differ in formulas); their backward raises.
`affine_grid_generator` is composite in torch (`linspace` and a batched matmul), so it
needs nothing here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from bridge_ops._lowering import aten, lowering, opmath

_SCALES = ("scales", "scales_d", "scales_h", "scales_w", "scale_factors")


# --------------------------------------------------------------------- index tables (NumPy)

def _area_scale(n_in: int, n_out: int, align_corners: bool, scale, ct) -> np.generic:
  """torch's `area_pixel_compute_scale`."""
  if align_corners:
    return ct.type(n_in - 1) / ct.type(n_out - 1) if n_out > 1 else ct.type(0)
  if scale is not None and scale > 0:
    return ct.type(1.0 / scale)
  return ct.type(n_in) / ct.type(n_out)


def _source_index(scale, n_out: int, align_corners: bool, cubic: bool, ct) -> np.ndarray:
  """torch's `area_pixel_compute_source_index` for every output index."""
  i = np.arange(n_out).astype(ct)
  if align_corners:
    return scale * i
  src = scale * (i + ct.type(0.5)) - ct.type(0.5)
  return src if cubic else np.maximum(src, ct.type(0))


def _floorf(v: np.ndarray) -> np.ndarray:
  """C's `floorf` (through float32, as torch's kernels call it), as int64."""
  return np.floor(v.astype(np.float32)).astype(np.int64)


def _nearest_table(n_in, n_out, scale, exact, ct):
  """torch's `HelperInterpNearest(Exact)::compute_indices_weights` (the generic kernel)."""
  s = _area_scale(n_in, n_out, False, scale, ct)
  if exact:
    src = _floorf(_source_index(s, n_out, False, False, ct) + ct.type(0.5))
  else:
    src = _floorf(_source_index(s, n_out, True, False, ct))
  return np.minimum(src, n_in - 1)[None], None


def _nearest_idx_table(n_in, n_out, scale, exact):
  """torch's `nearest_idx` / `nearest_exact_idx` (the vectorized kernel): a float32 scale,
  and, for "nearest", a copy when the size is kept and `i >> 1` when it doubles."""
  i = np.arange(n_out)
  if not exact and n_out == n_in:
    return i[None], None
  if not exact and n_out == 2 * n_in:
    return (i >> 1)[None], None
  s = _area_scale(n_in, n_out, False, scale, np.dtype(np.float32))
  src = (i.astype(np.float32) + np.float32(0.5)) * s if exact else i.astype(np.float32) * s
  return np.minimum(_floorf(src), n_in - 1)[None], None


def _linear_table(n_in, n_out, align_corners, scale, ct, wt):
  """(indices (2, out), weights (2, out)): torch's `compute_source_index_and_lambda`, the
  weights stored in `wt` (`lambda0 = 1 - lambda1` computed from the stored `lambda1`)."""
  if n_in == n_out:
    i = np.arange(n_out)
    return np.stack([i, i]), np.stack([np.ones(n_out, wt), np.zeros(n_out, wt)])
  s = _area_scale(n_in, n_out, align_corners, scale, ct)
  real = _source_index(s, n_out, align_corners, False, ct)
  i0 = np.minimum(_floorf(real), n_in - 1)
  lam1 = np.clip(real - i0.astype(ct), 0, 1).astype(ct).astype(wt)
  lam0 = (ct.type(1) - lam1.astype(ct)).astype(wt)
  i1 = i0 + (i0 < n_in - 1)
  return np.stack([i0, i1]), np.stack([lam0, lam1])


def _cubic_coefficients(t, a):
  """Keys' cubic convolution weights of the 4 neighbours at fraction `t` (torch's order)."""
  def near(x):  # |x| <= 1
    return ((a + 2) * x - (a + 3)) * x * x + 1

  def far(x):  # 1 < |x| < 2
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
  one = t.dtype.type(1)
  return np.stack([far(t + one), near(t), near(one - t), far(one - t + one)])


def _cubic_table(n_in, n_out, align_corners, scale, ct, wt):
  s = _area_scale(n_in, n_out, align_corners, scale, ct)
  real = _source_index(s, n_out, align_corners, True, ct)
  i0 = np.minimum(_floorf(real), n_in - 1)
  t = np.clip(real - i0.astype(ct), 0, 1).astype(ct)
  idx = np.clip(i0[None] + np.arange(-1, 3)[:, None], 0, n_in - 1)
  return idx, _cubic_coefficients(t, ct.type(-0.75)).astype(wt)


def _aa_table(n_in, n_out, align_corners, scale, ct, cubic):
  """Antialiased weights: torch's `_compute_indices_min_size_weights_aa` (Pillow's resampler),
  with its mix of `ct` and double arithmetic.

  Returns (indices (K, out), weights (K, out), mask (K, out)): output `i` reads
  `xsize[i]` inputs from `xmin[i]`; the masked-out slots are padding.
  """
  t = ct.type
  s = _area_scale(n_in, n_out, align_corners, scale, ct)
  interp = 4 if cubic else 2
  support = t(interp * 0.5 * float(s)) if s >= 1.0 else t(interp * 0.5)
  k = int(np.ceil(support)) * 2 + 1
  invscale = t(1.0 / float(s)) if s >= 1.0 else t(1.0)
  center = (float(s) * (np.arange(n_out) + 0.5)).astype(ct)
  xmin = np.maximum((center - support).astype(np.float64) + 0.5, 0).astype(np.int64)
  xmax = ((center + support).astype(np.float64) + 0.5).astype(np.int64)
  xsize = np.clip(np.minimum(xmax, n_in) - xmin, 0, k)
  j = np.arange(k)[:, None]
  x = (((j + xmin[None]).astype(ct) - center[None]).astype(np.float64) + 0.5) * float(invscale)
  x = np.abs(x.astype(ct))
  if cubic:  # Keys, A = -0.5 (Pillow's bicubic)
    a = t(-0.5)
    w = np.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                 np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, t(0)))
  else:  # triangle
    w = np.where(x < 1, (1.0 - x.astype(np.float64)).astype(ct), t(0))
  mask = j < xsize[None]
  w = np.where(mask, w, t(0)).astype(ct)
  total = np.zeros(n_out, ct)
  for row in w:  # torch sums in order, in `ct`
    total = (total + row).astype(ct)
  w = np.where(total != 0, w / np.where(total != 0, total, t(1)), w).astype(ct)
  idx = np.where(mask, np.minimum(xmin[None] + j, n_in - 1), 0)
  return idx, w, mask


# ------------------------------------------------------------------------- resampling (JAX)

def _resample_axis(x, axis: int, idx: np.ndarray, w: np.ndarray | None, mask=None):
  """out[..., i, ...] = sum_k w[k, i] * x[..., idx[k, i], ...] along `axis`."""
  if w is None:
    return jnp.take(x, jnp.asarray(idx[0]), axis=axis)
  shape = [1] * x.ndim
  shape[axis] = idx.shape[1]
  out = None
  for k in range(idx.shape[0]):
    wk = jnp.asarray(w[k]).astype(x.dtype).reshape(shape)
    term = jnp.take(x, jnp.asarray(idx[k]), axis=axis) * wk
    if mask is not None:  # a padding slot of the antialiased tables reads nothing
      term = jnp.where(jnp.asarray(mask[k]).reshape(shape), term, jnp.zeros((), x.dtype))
    out = term if out is None else out + term
  return out


def _resample(x, output_size, table, stored_weights=True):
  """Resamples the trailing `len(output_size)` axes, the last one first (as torch's loops
  nest); `table(d, n_in, n_out, ct, wt)` gives axis `d`'s (indices, weights[, mask]) with
  weights computed in `ct` and stored in `wt`. torch's generic CPU kernel stores its
  weights in the input's dtype (`stored_weights`), its vectorized one keeps them in float;
  both then compute in float and round once, as here."""
  nd = len(output_size)
  floating = jnp.issubdtype(x.dtype, jnp.floating)
  ct = opmath(x.dtype) if floating else np.dtype(np.float32)
  wt = np.dtype(x.dtype) if floating and stored_weights else ct
  y = x.astype(opmath(x.dtype))
  for d in reversed(range(nd)):
    axis = x.ndim - nd + d
    y = _resample_axis(y, axis, *table(d, x.shape[axis], int(output_size[d]), ct, wt))
  return y.astype(x.dtype)


def _vectorized_2d(output_size) -> bool:
  """Whether torch's CPU kernel for a 2-D resize takes its vectorized (channels-last) path:
  for small outputs (H + W <= 128), or channels-last inputs with C > 3 (layouts are taken
  as contiguous here)."""
  return len(output_size) == 2 and sum(output_size) <= 128


def _nearest(x, output_size, scales, exact):
  vectorized = _vectorized_2d(output_size)  # each path has its own index rule
  def table(d, n_in, n_out, ct, wt):
    if vectorized:
      return _nearest_idx_table(n_in, n_out, scales[d], exact)
    return _nearest_table(n_in, n_out, scales[d], exact, ct)
  return _resample(x, output_size, table)


def _linear(x, output_size, align_corners, scales):
  return _resample(x, output_size, lambda d, n_in, n_out, ct, wt: _linear_table(
      n_in, n_out, align_corners, scales[d], ct, wt), not _vectorized_2d(output_size))


def _cubic(x, output_size, align_corners, scales):
  return _resample(x, output_size, lambda d, n_in, n_out, ct, wt: _cubic_table(
      n_in, n_out, align_corners, scales[d], ct, wt))


def _aa(x, output_size, align_corners, scales, cubic, skip_kept=True):
  """Antialiased resampling. torch's forward copies an axis whose size is kept (whatever the
  scale), its backward does not: `skip_kept=False` for the backward."""
  def table(d, n_in, n_out, ct, wt):
    if skip_kept and n_in == n_out:
      return np.arange(n_out)[None], None
    return _aa_table(n_in, n_out, align_corners, scales[d], ct, cubic)
  return _resample(x, output_size, table)


def _vec_size(input, output_size, scale_factors):
  """torch's `upsample_compute_output_size` and the scales the `.vec` overloads pass on."""
  nd = input.ndim - 2
  if output_size is not None:
    return [int(s) for s in output_size], [None] * nd
  factors = [float(f) for f in scale_factors]
  factors = factors * nd if len(factors) == 1 else factors
  return [int(n * f) for n, f in zip(input.shape[2:], factors)], factors


def _backward(forward, grad_output, input_size):
  """The gradient of a resampling (linear in its input) for `grad_output`."""
  zeros = jnp.zeros(tuple(input_size), opmath(grad_output.dtype))
  _, vjp = jax.vjp(forward, zeros)
  return vjp(grad_output.astype(opmath(grad_output.dtype)))[0].astype(grad_output.dtype)


_static = functools.partial(lowering, static_argnames=_SCALES)


# --- nearest

@_static(aten.upsample_nearest1d.default)
def upsample_nearest1d(self, output_size, scales=None):
  """`mode="nearest"`: source index `min(floor(i * scale), in - 1)` (torch's legacy rule)."""
  return _nearest(self, output_size, [scales], exact=False)


@_static(aten.upsample_nearest2d.default)
def upsample_nearest2d(self, output_size, scales_h=None, scales_w=None):
  return _nearest(self, output_size, [scales_h, scales_w], exact=False)


@_static(aten.upsample_nearest3d.default)
def upsample_nearest3d(self, output_size, scales_d=None, scales_h=None, scales_w=None):
  return _nearest(self, output_size, [scales_d, scales_h, scales_w], exact=False)


@_static(aten._upsample_nearest_exact1d.default)
def _upsample_nearest_exact1d(self, output_size, scales=None):
  """`mode="nearest-exact"`: the nearest pixel centre (Pillow's and scikit-image's rule)."""
  return _nearest(self, output_size, [scales], exact=True)


@_static(aten._upsample_nearest_exact2d.default)
def _upsample_nearest_exact2d(self, output_size, scales_h=None, scales_w=None):
  return _nearest(self, output_size, [scales_h, scales_w], exact=True)


@_static(aten._upsample_nearest_exact3d.default)
def _upsample_nearest_exact3d(self, output_size, scales_d=None, scales_h=None, scales_w=None):
  return _nearest(self, output_size, [scales_d, scales_h, scales_w], exact=True)


@_static(aten.upsample_nearest1d.vec, aten.upsample_nearest2d.vec, aten.upsample_nearest3d.vec)
def upsample_nearest_vec(input, output_size, scale_factors):
  size, scales = _vec_size(input, output_size, scale_factors)
  return _nearest(input, size, scales, exact=False)


@_static(aten._upsample_nearest_exact1d.vec, aten._upsample_nearest_exact2d.vec,
         aten._upsample_nearest_exact3d.vec)
def _upsample_nearest_exact_vec(input, output_size, scale_factors):
  size, scales = _vec_size(input, output_size, scale_factors)
  return _nearest(input, size, scales, exact=True)


@_static(aten.upsample_nearest1d_backward.default)
def upsample_nearest1d_backward(grad_output, output_size, input_size, scales=None):
  return _backward(lambda x: _nearest(x, output_size, [scales], False), grad_output, input_size)


@_static(aten.upsample_nearest2d_backward.default)
def upsample_nearest2d_backward(grad_output, output_size, input_size, scales_h=None,
                                scales_w=None):
  return _backward(lambda x: _nearest(x, output_size, [scales_h, scales_w], False),
                   grad_output, input_size)


@_static(aten.upsample_nearest3d_backward.default)
def upsample_nearest3d_backward(grad_output, output_size, input_size, scales_d=None,
                                scales_h=None, scales_w=None):
  return _backward(lambda x: _nearest(x, output_size, [scales_d, scales_h, scales_w], False),
                   grad_output, input_size)


@_static(aten._upsample_nearest_exact1d_backward.default)
def _upsample_nearest_exact1d_backward(grad_output, output_size, input_size, scales=None):
  return _backward(lambda x: _nearest(x, output_size, [scales], True), grad_output, input_size)


@_static(aten._upsample_nearest_exact2d_backward.default)
def _upsample_nearest_exact2d_backward(grad_output, output_size, input_size, scales_h=None,
                                       scales_w=None):
  return _backward(lambda x: _nearest(x, output_size, [scales_h, scales_w], True),
                   grad_output, input_size)


@_static(aten._upsample_nearest_exact3d_backward.default)
def _upsample_nearest_exact3d_backward(grad_output, output_size, input_size, scales_d=None,
                                       scales_h=None, scales_w=None):
  return _backward(lambda x: _nearest(x, output_size, [scales_d, scales_h, scales_w], True),
                   grad_output, input_size)


# --- linear, bilinear, trilinear

@_static(aten.upsample_linear1d.default)
def upsample_linear1d(self, output_size, align_corners, scales=None):
  """`mode="linear"` (and bilinear/trilinear below): separable linear interpolation."""
  return _linear(self, output_size, align_corners, [scales])


@_static(aten.upsample_bilinear2d.default)
def upsample_bilinear2d(self, output_size, align_corners, scales_h=None, scales_w=None):
  return _linear(self, output_size, align_corners, [scales_h, scales_w])


@_static(aten.upsample_trilinear3d.default)
def upsample_trilinear3d(self, output_size, align_corners, scales_d=None, scales_h=None,
                         scales_w=None):
  return _linear(self, output_size, align_corners, [scales_d, scales_h, scales_w])


@_static(aten.upsample_linear1d.vec, aten.upsample_bilinear2d.vec,
         aten.upsample_trilinear3d.vec)
def upsample_linear_vec(input, output_size, align_corners, scale_factors):
  size, scales = _vec_size(input, output_size, scale_factors)
  return _linear(input, size, align_corners, scales)


@_static(aten.upsample_linear1d_backward.default)
def upsample_linear1d_backward(grad_output, output_size, input_size, align_corners,
                               scales=None):
  return _backward(lambda x: _linear(x, output_size, align_corners, [scales]), grad_output,
                   input_size)


@_static(aten.upsample_bilinear2d_backward.default)
def upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners,
                                 scales_h=None, scales_w=None):
  return _backward(lambda x: _linear(x, output_size, align_corners, [scales_h, scales_w]),
                   grad_output, input_size)


@_static(aten.upsample_trilinear3d_backward.default)
def upsample_trilinear3d_backward(grad_output, output_size, input_size, align_corners,
                                  scales_d=None, scales_h=None, scales_w=None):
  scales = [scales_d, scales_h, scales_w]
  return _backward(lambda x: _linear(x, output_size, align_corners, scales), grad_output,
                   input_size)


# --- bicubic

@_static(aten.upsample_bicubic2d.default)
def upsample_bicubic2d(self, output_size, align_corners, scales_h=None, scales_w=None):
  """`mode="bicubic"`: Keys' cubic convolution (A = -0.75), neighbours clamped to the edge."""
  return _cubic(self, output_size, align_corners, [scales_h, scales_w])


@_static(aten.upsample_bicubic2d.vec)
def upsample_bicubic2d_vec(input, output_size, align_corners, scale_factors):
  size, scales = _vec_size(input, output_size, scale_factors)
  return _cubic(input, size, align_corners, scales)


@_static(aten.upsample_bicubic2d_backward.default)
def upsample_bicubic2d_backward(grad_output, output_size, input_size, align_corners,
                                scales_h=None, scales_w=None):
  return _backward(lambda x: _cubic(x, output_size, align_corners, [scales_h, scales_w]),
                   grad_output, input_size)


# --- antialiased (interpolate(..., antialias=True))

@_static(aten._upsample_bilinear2d_aa.default)
def _upsample_bilinear2d_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
  """Antialiased bilinear: Pillow's triangle filter, widened by the scale when shrinking."""
  return _aa(self, output_size, align_corners, [scales_h, scales_w], cubic=False)


@_static(aten._upsample_bicubic2d_aa.default)
def _upsample_bicubic2d_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
  """Antialiased bicubic: Pillow's Keys filter (A = -0.5), widened by the scale when shrinking."""
  return _aa(self, output_size, align_corners, [scales_h, scales_w], cubic=True)


@_static(aten._upsample_bilinear2d_aa.vec)
def _upsample_bilinear2d_aa_vec(input, output_size, align_corners, scale_factors):
  size, scales = _vec_size(input, output_size, scale_factors)
  return _aa(input, size, align_corners, scales, cubic=False)


@_static(aten._upsample_bicubic2d_aa.vec)
def _upsample_bicubic2d_aa_vec(input, output_size, align_corners, scale_factors):
  size, scales = _vec_size(input, output_size, scale_factors)
  return _aa(input, size, align_corners, scales, cubic=True)


@_static(aten._upsample_bilinear2d_aa_backward.default)
def _upsample_bilinear2d_aa_backward(grad_output, output_size, input_size, align_corners,
                                     scales_h=None, scales_w=None):
  scales = [scales_h, scales_w]
  return _backward(lambda x: _aa(x, output_size, align_corners, scales, False, skip_kept=False),
                   grad_output, input_size)


@_static(aten._upsample_bicubic2d_aa_backward.default)
def _upsample_bicubic2d_aa_backward(grad_output, output_size, input_size, align_corners,
                                    scales_h=None, scales_w=None):
  scales = [scales_h, scales_w]
  return _backward(lambda x: _aa(x, output_size, align_corners, scales, True, skip_kept=False),
                   grad_output, input_size)


# ----------------------------------------------------------------------------- grid_sample

_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2  # torch's GridSamplerInterpolation
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2  # torch's GridSamplerPadding


def _unnormalize(coord, size: int, align_corners: bool):
  """torch's `grid_sampler_unnormalize`: [-1, 1] to pixel coordinates."""
  if align_corners:
    return (coord + 1) / 2 * (size - 1)
  return ((coord + 1) * size - 1) / 2


def _clip(coord, size: int):
  """torch's `clip_coordinates` into [0, size - 1]; its gradient is 0 where it clips."""
  zero = jnp.zeros((), coord.dtype)
  return jnp.where(coord <= 0, zero, jnp.where(coord >= size - 1, zero + (size - 1), coord))


def _reflect(coord, twice_low: int, twice_high: int):
  """torch's `reflect_coordinates`: reflect into [twice_low / 2, twice_high / 2]."""
  if twice_low == twice_high:
    return jnp.zeros_like(coord)
  low = twice_low / 2
  span = (twice_high - twice_low) / 2
  c = coord - low
  c = jnp.where(c < 0, -c, c)
  extra = jnp.fmod(c, span)
  flips = jnp.floor(c / span)
  return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _pad_coordinates(coord, size: int, padding_mode: int, align_corners: bool):
  """torch's `compute_coordinates`: apply the border or reflection padding rule."""
  if padding_mode == _BORDER:
    return _clip(coord, size)
  if padding_mode == _REFLECTION:
    if align_corners:
      coord = _reflect(coord, 0, 2 * (size - 1))
    else:
      coord = _reflect(coord, -1, 2 * size - 1)
    return _clip(coord, size)
  return coord


def _gather(x_last, n_index, points):
  """`x_last[n, *point]` for integer points inside the input; 0 elsewhere (and for NaN).

  `x_last` is (N, *spatial, C), `points` a list of (N, *out) integer-valued float arrays,
  one per spatial axis in the input's order; returns (N, *out, C) and the in-bounds mask.
  """
  inside = None
  index = []
  for p, size in zip(points, x_last.shape[1:-1]):
    ok = (p >= 0) & (p <= size - 1)  # false for NaN
    inside = ok if inside is None else inside & ok
    index.append(jnp.where(ok, p, 0).astype(jnp.int32))
  values = x_last[(n_index, *index)]
  return jnp.where(inside[..., None], values, jnp.zeros((), values.dtype)), inside


def _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners):
  """torch's CPU `grid_sampler_{2,3}d` (see `aten/src/ATen/native/GridSampler.h`)."""
  if interpolation_mode == _BICUBIC and input.ndim != 4:
    raise RuntimeError("grid_sampler(): bicubic interpolation only supports 4D input")
  if input.dtype in (jnp.float16, jnp.bfloat16):
    if input.ndim == 4:
      return _grid_sample_2d_16(input, grid, interpolation_mode, padding_mode, align_corners)
    return _grid_sample_3d_16(input, grid, interpolation_mode, padding_mode, align_corners)
  nd = input.ndim - 2
  x = input.astype(opmath(input.dtype))
  g = grid.astype(x.dtype)
  x_last = jnp.moveaxis(x, 1, -1)  # (N, *spatial, C)
  n_index = jnp.arange(x.shape[0]).reshape((-1,) + (1,) * nd)
  sizes = x.shape[2:]
  # grid[..., 0] is x (the last axis), grid[..., 1] y, grid[..., 2] z.
  coords = [g[..., nd - 1 - a] for a in range(nd)]  # in the input's axis order
  if interpolation_mode == _BICUBIC:
    out = _grid_bicubic(x_last, n_index, coords, sizes, padding_mode, align_corners)
  else:
    src = [_pad_coordinates(_unnormalize(c, s, align_corners), s, padding_mode, align_corners)
           for c, s in zip(coords, sizes)]
    if interpolation_mode == _NEAREST:
      out, _ = _gather(x_last, n_index, [jnp.round(c) for c in src])  # half to even
    else:
      out = _grid_linear(x_last, n_index, src)
  return jnp.moveaxis(out, -1, 1).astype(input.dtype)


def _grid_linear(x_last, n_index, src):
  """Bilinear/trilinear: the 2**nd corners, in torch's order (z, then y, then x outer to
  inner), each weighted by the product of its per-axis distances (x first)."""
  low = [jnp.floor(c) for c in src]
  out = None
  nd = len(src)
  for corner in range(2 ** nd):
    bits = [(corner >> (nd - 1 - a)) & 1 for a in range(nd)]  # axis 0 is the slowest
    point = [lo + b for lo, b in zip(low, bits)]
    weight = None
    for a in reversed(range(nd)):  # x, then y, then z
      w = (src[a] - low[a]) if bits[a] else (low[a] + 1 - src[a])
      weight = w if weight is None else weight * w
    values, _ = _gather(x_last, n_index, point)
    term = values * weight[..., None]
    out = term if out is None else out + term
  return out


def _grid_bicubic(x_last, n_index, coords, sizes, padding_mode, align_corners):
  """Bicubic: 4x4 neighbours of the unnormalized point, each read through the padding rule,
  combined with Keys' weights (A = -0.75) along x, then along y."""
  iy, ix = (_unnormalize(c, s, align_corners) for c, s in zip(coords, sizes))
  iy0, ix0 = jnp.floor(iy), jnp.floor(ix)
  ty, tx = iy - iy0, ix - ix0
  cx = _cubic_weights(tx)
  cy = _cubic_weights(ty)
  h, w = sizes
  out = None
  for i in range(4):
    py = _pad_coordinates(iy0 - 1 + i, h, padding_mode, align_corners)
    row = None
    for j in range(4):
      px = _pad_coordinates(ix0 - 1 + j, w, padding_mode, align_corners)
      values, _ = _gather(x_last, n_index, [jnp.trunc(py), jnp.trunc(px)])
      term = values * cx[j][..., None]
      row = term if row is None else row + term
    term = row * cy[i][..., None]
    out = term if out is None else out + term
  return out


def _cubic_weights(t):
  """torch's `get_cubic_upsample_coefficients` (A = -0.75) for traced fractions `t`."""
  a = -0.75

  def near(x):
    return ((a + 2) * x - (a + 3)) * x * x + 1

  def far(x):
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
  return [far(t + 1), near(t), near(1 - t), far(2 - t)]


# --- grid_sample in float16/bfloat16
#
# torch has no opmath here: the 2-D kernel (`native/cpu/GridSamplerKernel.cpp`) runs in
# `Vectorized<Half/BFloat16>`, whose every +, -, *, / computes in float32 and rounds back
# to 16 bits; the 3-D kernel (`grid_sampler_3d_cpu_impl` in `native/GridSampler.cpp`) is
# scalar `c10::Half/BFloat16` arithmetic, which rounds the same way. So the arithmetic
# below is float32 with an explicit rounding (`_round16`) after each elementary operation,
# in torch's order (XLA would otherwise keep a chain of 16-bit operations in float32).


def _round16(dtype):
  """Rounds float32 values to the nearest `dtype` (float16/bfloat16) value, kept in float32.

  `lax.reduce_precision` rather than an `astype` round trip, which XLA may drop as excess
  precision; it flushes float16's subnormals to zero, so those are rounded by hand (to a
  multiple of 2**-24, exact in float32). bfloat16's subnormals are float32's.
  """
  if np.dtype(dtype) == np.dtype(jnp.bfloat16):
    return lambda v: jax.lax.reduce_precision(v, exponent_bits=8, mantissa_bits=7)

  def r(v):
    tiny = jnp.round(v * np.float32(2.0 ** 24)) * np.float32(2.0 ** -24)
    return jnp.where(jnp.abs(v) < np.float32(2.0 ** -14), tiny,
                     jax.lax.reduce_precision(v, exponent_bits=5, mantissa_bits=10))
  return r


def _scalar16(dtype, value) -> np.float32:
  """A C++ `static_cast<scalar_t>(value)` for the 16-bit `dtype`, as a float32 constant."""
  with np.errstate(over="ignore"):  # a float16 past 65504 is inf, as in C++
    return np.float32(np.asarray(np.float32(value)).astype(dtype))


def _to_int16(v):
  """`convert_to_int_of_same_size` for 16-bit lanes: truncate to int32 (NaN and values out
  of range give INT_MIN, as x86's `cvtt` does) and keep the low 16 bits."""
  bad = jnp.isnan(v) | (jnp.abs(v) >= np.float32(2.0 ** 31))
  return jnp.where(bad, np.float32(-2.0 ** 31), v).astype(jnp.int32).astype(jnp.int16)


def _grid_sample_2d_16(input, grid, interpolation_mode, padding_mode, align_corners):
  """torch's vectorized 2-D CPU kernel (`ApplyGridSample<scalar_t, 2, ...>`) in 16 bits."""
  dtype = input.dtype
  r = _round16(dtype)
  n, _, h, w = input.shape
  if h * w >= 2 ** 15:
    # The kernel's sizes and gather offsets `y * inp_sH + x * inp_sW` are int16 lanes: from
    # 2**15 elements per channel they wrap and torch reads outside the channel.
    raise NotImplementedError(
        f"bridge: `grid_sampler_2d` on the `jax` device does not support "
        f"{np.dtype(dtype).name} inputs with 32768 or more pixels per channel (got "
        f"{h}x{w}): torch's 16-bit CPU kernel overflows its int16 offsets there and reads "
        "outside the input. Cast the input and grid to float32 first.")
  if padding_mode != _ZEROS and any(_scalar16(dtype, s - 1) > s - 1 for s in (h, w)):
    # Border and reflection clip to `static_cast<scalar_t>(size - 1)`, which rounds up past
    # the last pixel here, and the kernel then reads the pixel after the row (or channel).
    raise NotImplementedError(
        f"bridge: `grid_sampler_2d` on the `jax` device does not support "
        f"{np.dtype(dtype).name} inputs of size {h}x{w} with border or reflection padding: "
        f"torch's 16-bit CPU kernel rounds the last pixel's index up and reads past the "
        "input. Cast the input and grid to float32 first.")
  x_last = jnp.moveaxis(input.astype(jnp.float32), 1, -1)  # (N, H, W, C)
  g = grid.astype(jnp.float32)
  n_index = jnp.arange(n).reshape(-1, 1, 1)
  zeros_pad = padding_mode == _ZEROS

  def location(size):
    """`ComputeLocation<scalar_t, padding, align_corners>`: (unnormalize, compute_coordinates)."""
    max_val = _scalar16(dtype, size - 1)
    base = max_val if align_corners else _scalar16(dtype, size)  # size - 1, or size
    scale = _scalar16(dtype, base / 2)
    twice_span = _scalar16(dtype, base * 2)
    low = np.float32(0 if align_corners else -0.5)
    empty = align_corners and size <= 1

    def unnormalize(v):
      v = r(r(v + 1) * scale)
      return v if align_corners else r(v - np.float32(0.5))

    def clip(v):
      # clamp_max(max_val, clamp_min(0, v)): x86 max/min return the second operand on NaN.
      v = jnp.where(v > 0, v, np.float32(0))
      return jnp.where(v < max_val, v, max_val)

    def reflect(v):
      if empty:
        return jnp.zeros_like(v)
      a = jnp.abs(v if align_corners else r(v - low))
      flips = jnp.trunc(r(a / twice_span))
      extra = r(a - r(flips * twice_span))
      out = jnp.minimum(extra, r(twice_span - extra))
      return out if align_corners else r(out + low)

    def coordinates(v):
      if padding_mode == _BORDER:
        return clip(v)
      if padding_mode == _REFLECTION:
        return clip(reflect(v))
      return v
    return unnormalize, coordinates

  unnorm_w, coords_w = location(w)
  unnorm_h, coords_h = location(h)
  gx, gy = g[..., 0], g[..., 1]

  def gather(iy, ix, mask):
    """`mask_gather` of int16 pixel indices: 0 where the mask is off."""
    values = x_last[n_index, jnp.where(mask, iy, 0), jnp.where(mask, ix, 0)]
    return jnp.where(mask[..., None], values, np.float32(0))

  def inside(i, size):
    return (i > -1) & (i < size)

  if interpolation_mode == _BICUBIC:
    x, y = unnorm_w(gx), unnorm_h(gy)
    ix, iy = jnp.floor(x), jnp.floor(y)
    cx, cy = _cubic_weights16(r, r(x - ix)), _cubic_weights16(r, r(y - iy))

    def value(px, py):
      jx, jy = _to_int16(coords_w(px)), _to_int16(coords_h(py))
      mask = inside(jx, w) & inside(jy, h) if zeros_pad else jnp.ones(jx.shape, bool)
      return gather(jy, jx, mask)

    rows = []
    for i in range(4):
      py = r(iy + np.float32(i - 1))
      acc = None
      for j in range(4):
        term = r(cx[j][..., None] * value(r(ix + np.float32(j - 1)), py))
        acc = term if acc is None else r(acc + term)
      rows.append(acc)
    out = None
    for i in range(4):
      term = r(cy[i][..., None] * rows[i])
      out = term if out is None else r(out + term)
    return jnp.moveaxis(out, -1, 1).astype(dtype)

  x, y = coords_w(unnorm_w(gx)), coords_h(unnorm_h(gy))
  if interpolation_mode == _NEAREST:
    jx, jy = _to_int16(jnp.round(x)), _to_int16(jnp.round(y))  # half to even
    mask = inside(jx, w) & inside(jy, h) if zeros_pad else jnp.ones(jx.shape, bool)
    return jnp.moveaxis(gather(jy, jx, mask), -1, 1).astype(dtype)

  x_w, y_n = jnp.floor(x), jnp.floor(y)
  dw = r(x - x_w)
  de = r(1 - dw)
  dn = r(y - y_n)
  ds = r(1 - dn)
  jx_w, jy_n = _to_int16(x_w), _to_int16(y_n)
  jx_e, jy_s = jx_w + jnp.int16(1), jy_n + jnp.int16(1)  # int16, wrapping as torch's
  if zeros_pad:
    w_mask, n_mask = inside(jx_w, w), inside(jy_n, h)
    e_mask, s_mask = inside(jx_e, w), inside(jy_s, h)
  else:
    w_mask = n_mask = jnp.ones(jx_w.shape, bool)
    e_mask, s_mask = jx_e < w, jy_s < h
  corners = [(jy_n, jx_w, n_mask & w_mask, r(ds * de)),
             (jy_n, jx_e, n_mask & e_mask, r(ds * dw)),
             (jy_s, jx_w, s_mask & w_mask, r(dn * de)),
             (jy_s, jx_e, s_mask & e_mask, r(dn * dw))]
  out = None
  for iy, ix, mask, weight in corners:
    term = r(gather(iy, ix, mask) * weight[..., None])
    out = term if out is None else r(out + term)
  return jnp.moveaxis(out, -1, 1).astype(dtype)


def _cubic_weights16(r, t):
  """`get_cubic_coefficients` of the vectorized kernel (A = -0.75), rounded per operation."""
  a = np.float32(-0.75)

  def near(x):  # ((A + 2) * x - (A + 3)) * x * x + 1
    return r(r(r(r(r((a + 2) * x) - (a + 3)) * x) * x) + 1)

  def far(x):  # ((A * x - 5 * A) * x + 8 * A) * x - 4 * A
    return r(r(r(r(r(r(a * x) - 5 * a) * x) + 8 * a) * x) - 4 * a)
  return [far(r(t + 1)), near(t), near(r(1 - t)), far(r(2 - t))]


def _grid_sample_3d_16(input, grid, interpolation_mode, padding_mode, align_corners):
  """torch's scalar 3-D CPU kernel (`grid_sampler_3d_cpu_impl`) in 16-bit arithmetic."""
  dtype = input.dtype
  r = _round16(dtype)
  x = input.astype(jnp.float32)
  x_last = jnp.moveaxis(x, 1, -1)  # (N, D, H, W, C)
  g = grid.astype(jnp.float32)
  n_index = jnp.arange(x.shape[0]).reshape((-1, 1, 1, 1))
  sizes = x.shape[2:]

  def source_index(v, size):
    """`grid_sampler_compute_source_index` with `scalar_t` = the 16-bit type."""
    if align_corners:
      v = r(r(r(v + 1) / 2) * _scalar16(dtype, size - 1))
    else:
      v = r(r(r(r(v + 1) * _scalar16(dtype, size)) - 1) / 2)
    if padding_mode == _REFLECTION:
      low, high = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
      if low == high:
        v = jnp.zeros_like(v)
      else:
        lo = _scalar16(dtype, _scalar16(dtype, low) / 2)
        span = _scalar16(dtype, _scalar16(dtype, high - low) / 2)
        v = jnp.abs(r(v - lo))
        extra = jnp.fmod(v, span)  # exact
        flips = jnp.floor(r(v / span))
        v = jnp.where(jnp.fmod(flips, 2) == 0, r(extra + lo), r(r(span - extra) + lo))
    if padding_mode in (_BORDER, _REFLECTION):
      # std::min(size - 1, std::max(v, 0)): a NaN passes std::max and std::min gives size - 1.
      last = _scalar16(dtype, size - 1)
      v = jnp.where(v < 0, np.float32(0), v)
      v = jnp.where(v < last, v, last)
    return v

  def index(v):
    """`static_cast<int64_t>` of an integral coordinate: in torch 2.13's x86 build a NaN
    gives 0 for bfloat16 and an out-of-bounds index for float16 (undefined behaviour)."""
    if np.dtype(dtype) == np.dtype(jnp.bfloat16):
      return jnp.where(jnp.isnan(v), np.float32(0), v)
    return v

  # grid[..., 0] is x (the last axis), grid[..., 1] y, grid[..., 2] z.
  src = [source_index(g[..., 2 - a], s) for a, s in enumerate(sizes)]  # z, y, x
  if interpolation_mode == _NEAREST:
    out, _ = _gather(x_last, n_index, [index(jnp.round(c)) for c in src])  # half to even
    return jnp.moveaxis(out, -1, 1).astype(dtype)
  low = [index(jnp.floor(c)) for c in src]
  out = jnp.zeros(src[0].shape + (x.shape[1],), jnp.float32)
  for corner in range(8):
    bits = [(corner >> (2 - a)) & 1 for a in range(3)]  # z slowest, x fastest
    weight = None
    for a in (2, 1, 0):  # (x - ...) * (y - ...) * (z - ...), rounded after each step
      # The int64 corner index meets the 16-bit coordinate as `static_cast<scalar_t>`.
      d = r(src[a] - low[a]) if bits[a] else r(r(low[a] + 1) - src[a])
      weight = d if weight is None else r(weight * d)
    values, ok = _gather(x_last, n_index, [lo + b for lo, b in zip(low, bits)])
    out = jnp.where(ok[..., None], r(out + r(values * weight[..., None])), out)
  return jnp.moveaxis(out, -1, 1).astype(dtype)


@lowering(aten.grid_sampler_2d.default)
def grid_sampler_2d(input, grid, interpolation_mode, padding_mode, align_corners):
  """`F.grid_sample` on 4-D input: bilinear/nearest/bicubic, zeros/border/reflection."""
  return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners)


@lowering(aten.grid_sampler_3d.default)
def grid_sampler_3d(input, grid, interpolation_mode, padding_mode, align_corners):
  """`F.grid_sample` on 5-D input: trilinear ("bilinear") or nearest."""
  return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners)


@lowering(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def grid_sampler_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                          align_corners, output_mask):
  """(grad_input, grad_grid) through JAX's derivative of the forward above."""
  if input.dtype in (jnp.float16, jnp.bfloat16):
    # torch's 16-bit backward kernels round each step in their own order (and scatter-add
    # in 16 bits); the derivative of the emulated forward would not match them.
    raise NotImplementedError(
        f"bridge: the backward of `grid_sampler` on the `jax` device supports float32 and "
        f"float64, not {np.dtype(input.dtype).name}. Cast the input and grid to float32.")

  def f(x, g):
    return _grid_sample(x, g, interpolation_mode, padding_mode, align_corners)
  _, vjp = jax.vjp(f, input, grid)
  grad_input, grad_grid = vjp(grad_output.astype(input.dtype))
  return (grad_input if output_mask[0] else None, grad_grid if output_mask[1] else None)
