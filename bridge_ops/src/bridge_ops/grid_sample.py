"""`grid_sample` (`grid_sampler_2d/3d`) and its backward.

They follow `aten/src/ATen/native/GridSampler.h`: bilinear (trilinear), nearest (round half
to even) and bicubic (2-D only) sampling, zeros/border/reflection padding, with or without
`align_corners`. float16/bfloat16 have no opmath there: torch's kernels round every
operation to 16 bits, which is reproduced step by step (the 2-D vectorized kernel and the
3-D scalar one differ in formulas); their backward raises. `affine_grid_generator` is
composite in torch (`linspace` and a batched matmul), so it needs nothing here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bridge_ops._lowering import aten, lowering, opmath


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
    src = [
      _pad_coordinates(_unnormalize(c, s, align_corners), s, padding_mode, align_corners)
      for c, s in zip(coords, sizes)
    ]
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
  for corner in range(2**nd):
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
    tiny = jnp.round(v * np.float32(2.0**24)) * np.float32(2.0**-24)
    return jnp.where(
      jnp.abs(v) < np.float32(2.0**-14),
      tiny,
      jax.lax.reduce_precision(v, exponent_bits=5, mantissa_bits=10),
    )

  return r


def _scalar16(dtype, value) -> np.float32:
  """A C++ `static_cast<scalar_t>(value)` for the 16-bit `dtype`, as a float32 constant."""
  with np.errstate(over="ignore"):  # a float16 past 65504 is inf, as in C++
    return np.float32(np.asarray(np.float32(value)).astype(dtype))


def _to_int16(v):
  """`convert_to_int_of_same_size` for 16-bit lanes: truncate to int32 (NaN and values out
  of range give INT_MIN, as x86's `cvtt` does) and keep the low 16 bits."""
  bad = jnp.isnan(v) | (jnp.abs(v) >= np.float32(2.0**31))
  return jnp.where(bad, np.float32(-(2.0**31)), v).astype(jnp.int32).astype(jnp.int16)


def _grid_sample_2d_16(input, grid, interpolation_mode, padding_mode, align_corners):
  """torch's vectorized 2-D CPU kernel (`ApplyGridSample<scalar_t, 2, ...>`) in 16 bits."""
  dtype = input.dtype
  r = _round16(dtype)
  n, _, h, w = input.shape
  if h * w >= 2**15:
    # The kernel's sizes and gather offsets `y * inp_sH + x * inp_sW` are int16 lanes: from
    # 2**15 elements per channel they wrap and torch reads outside the channel.
    raise NotImplementedError(
      f"bridge: `grid_sampler_2d` on the `jax` device does not support "
      f"{np.dtype(dtype).name} inputs with 32768 or more pixels per channel (got "
      f"{h}x{w}): torch's 16-bit CPU kernel overflows its int16 offsets there and reads "
      "outside the input. Cast the input and grid to float32 first."
    )
  if padding_mode != _ZEROS and any(_scalar16(dtype, s - 1) > s - 1 for s in (h, w)):
    # Border and reflection clip to `static_cast<scalar_t>(size - 1)`, which rounds up past
    # the last pixel here, and the kernel then reads the pixel after the row (or channel).
    raise NotImplementedError(
      f"bridge: `grid_sampler_2d` on the `jax` device does not support "
      f"{np.dtype(dtype).name} inputs of size {h}x{w} with border or reflection padding: "
      f"torch's 16-bit CPU kernel rounds the last pixel's index up and reads past the "
      "input. Cast the input and grid to float32 first."
    )
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
  corners = [
    (jy_n, jx_w, n_mask & w_mask, r(ds * de)),
    (jy_n, jx_e, n_mask & e_mask, r(ds * dw)),
    (jy_s, jx_w, s_mask & w_mask, r(dn * de)),
    (jy_s, jx_e, s_mask & e_mask, r(dn * dw)),
  ]
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
def grid_sampler_backward(
  grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask
):
  """(grad_input, grad_grid) through JAX's derivative of the forward above."""
  if input.dtype in (jnp.float16, jnp.bfloat16):
    # torch's 16-bit backward kernels round each step in their own order (and scatter-add
    # in 16 bits); the derivative of the emulated forward would not match them.
    raise NotImplementedError(
      f"bridge: the backward of `grid_sampler` on the `jax` device supports float32 and "
      f"float64, not {np.dtype(input.dtype).name}. Cast the input and grid to float32."
    )

  def f(x, g):
    return _grid_sample(x, g, interpolation_mode, padding_mode, align_corners)

  _, vjp = jax.vjp(f, input, grid)
  grad_input, grad_grid = vjp(grad_output.astype(input.dtype))
  return (grad_input if output_mask[0] else None, grad_grid if output_mask[1] else None)
