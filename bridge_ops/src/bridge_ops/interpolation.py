"""Interpolation: `interpolate`/`upsample` in every mode, and their backwards.

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
    w = np.where(
      x < 1,
      ((a + 2) * x - (a + 3)) * x * x + 1,
      np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, t(0)),
    )
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
  _check_sizes(x, output_size)
  floating = jnp.issubdtype(x.dtype, jnp.floating)
  ct = opmath(x.dtype) if floating else np.dtype(np.float32)
  wt = np.dtype(x.dtype) if floating and stored_weights else ct
  y = x.astype(opmath(x.dtype))
  for d in reversed(range(nd)):
    axis = x.ndim - nd + d
    y = _resample_axis(y, axis, *table(d, x.shape[axis], int(output_size[d]), ct, wt))
  return y.astype(x.dtype)


def _check_sizes(x, output_size) -> None:
  """torch's `upsample_{1,2,3}d_common_check` and its kernels' check of the channels: every
  spatial size, in and out, > 0, and no empty dim but the batch. Known from the shapes."""
  nd = len(output_size)
  n_in = [int(n) for n in x.shape[x.ndim - nd :]]
  n_out = [int(n) for n in output_size]
  if min(n_in + n_out) <= 0:
    names = ("D", "H", "W")[3 - nd :]

    def sizes(values):
      return ", ".join(f"{a}: {n}" for a, n in zip(names, values))

    joint = ") and output (" if nd == 1 else ") output ("
    raise RuntimeError(
      "Input and output sizes should be greater than 0, but got input ("
      + sizes(n_in)
      + joint
      + sizes(n_out)
      + ")"
    )
  if 0 in x.shape[1:]:
    raise RuntimeError(
      f"Non-empty {x.ndim}D data tensor expected but got a tensor with sizes {list(x.shape)}"
    )


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
  return _resample(
    x,
    output_size,
    lambda d, n_in, n_out, ct, wt: _linear_table(n_in, n_out, align_corners, scales[d], ct, wt),
    not _vectorized_2d(output_size),
  )


def _cubic(x, output_size, align_corners, scales):
  return _resample(
    x,
    output_size,
    lambda d, n_in, n_out, ct, wt: _cubic_table(n_in, n_out, align_corners, scales[d], ct, wt),
  )


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


def _backward(resample, grad_output, input_size, *args, **kwargs):
  """The gradient for `grad_output` of `resample(x, *args, **kwargs)` (linear in x)."""
  zeros = jnp.zeros(tuple(input_size), opmath(grad_output.dtype))
  _, vjp = jax.vjp(lambda x: resample(x, *args, **kwargs), zeros)
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


@_static(
  aten._upsample_nearest_exact1d.vec,
  aten._upsample_nearest_exact2d.vec,
  aten._upsample_nearest_exact3d.vec,
)
def _upsample_nearest_exact_vec(input, output_size, scale_factors):
  size, scales = _vec_size(input, output_size, scale_factors)
  return _nearest(input, size, scales, exact=True)


@_static(aten.upsample_nearest1d_backward.default)
def upsample_nearest1d_backward(grad_output, output_size, input_size, scales=None):
  return _backward(_nearest, grad_output, input_size, output_size, [scales], False)


@_static(aten.upsample_nearest2d_backward.default)
def upsample_nearest2d_backward(grad_output, output_size, input_size, scales_h=None, scales_w=None):
  return _backward(_nearest, grad_output, input_size, output_size, [scales_h, scales_w], False)


@_static(aten.upsample_nearest3d_backward.default)
def upsample_nearest3d_backward(
  grad_output, output_size, input_size, scales_d=None, scales_h=None, scales_w=None
):
  return _backward(
    _nearest, grad_output, input_size, output_size, [scales_d, scales_h, scales_w], False
  )


@_static(aten._upsample_nearest_exact1d_backward.default)
def _upsample_nearest_exact1d_backward(grad_output, output_size, input_size, scales=None):
  return _backward(_nearest, grad_output, input_size, output_size, [scales], True)


@_static(aten._upsample_nearest_exact2d_backward.default)
def _upsample_nearest_exact2d_backward(
  grad_output, output_size, input_size, scales_h=None, scales_w=None
):
  return _backward(_nearest, grad_output, input_size, output_size, [scales_h, scales_w], True)


@_static(aten._upsample_nearest_exact3d_backward.default)
def _upsample_nearest_exact3d_backward(
  grad_output, output_size, input_size, scales_d=None, scales_h=None, scales_w=None
):
  return _backward(
    _nearest, grad_output, input_size, output_size, [scales_d, scales_h, scales_w], True
  )


# --- linear, bilinear, trilinear


@_static(aten.upsample_linear1d.default)
def upsample_linear1d(self, output_size, align_corners, scales=None):
  """`mode="linear"` (and bilinear/trilinear below): separable linear interpolation."""
  return _linear(self, output_size, align_corners, [scales])


@_static(aten.upsample_bilinear2d.default)
def upsample_bilinear2d(self, output_size, align_corners, scales_h=None, scales_w=None):
  return _linear(self, output_size, align_corners, [scales_h, scales_w])


@_static(aten.upsample_trilinear3d.default)
def upsample_trilinear3d(
  self, output_size, align_corners, scales_d=None, scales_h=None, scales_w=None
):
  return _linear(self, output_size, align_corners, [scales_d, scales_h, scales_w])


@_static(aten.upsample_linear1d.vec, aten.upsample_bilinear2d.vec, aten.upsample_trilinear3d.vec)
def upsample_linear_vec(input, output_size, align_corners, scale_factors):
  size, scales = _vec_size(input, output_size, scale_factors)
  return _linear(input, size, align_corners, scales)


@_static(aten.upsample_linear1d_backward.default)
def upsample_linear1d_backward(grad_output, output_size, input_size, align_corners, scales=None):
  return _backward(_linear, grad_output, input_size, output_size, align_corners, [scales])


@_static(aten.upsample_bilinear2d_backward.default)
def upsample_bilinear2d_backward(
  grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None
):
  return _backward(
    _linear, grad_output, input_size, output_size, align_corners, [scales_h, scales_w]
  )


@_static(aten.upsample_trilinear3d_backward.default)
def upsample_trilinear3d_backward(
  grad_output, output_size, input_size, align_corners, scales_d=None, scales_h=None, scales_w=None
):
  scales = [scales_d, scales_h, scales_w]
  return _backward(_linear, grad_output, input_size, output_size, align_corners, scales)


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
def upsample_bicubic2d_backward(
  grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None
):
  return _backward(
    _cubic, grad_output, input_size, output_size, align_corners, [scales_h, scales_w]
  )


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
def _upsample_bilinear2d_aa_backward(
  grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None
):
  scales = [scales_h, scales_w]
  return _backward(
    _aa, grad_output, input_size, output_size, align_corners, scales, False, skip_kept=False
  )


@_static(aten._upsample_bicubic2d_aa_backward.default)
def _upsample_bicubic2d_aa_backward(
  grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None
):
  scales = [scales_h, scales_w]
  return _backward(
    _aa, grad_output, input_size, output_size, align_corners, scales, True, skip_kept=False
  )
