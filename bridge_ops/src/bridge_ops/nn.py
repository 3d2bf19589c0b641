"""Lowerings of the NN family: convolution, pooling and normalization.

What torch's `nn` modules reach on a non-CPU device (checked with a logging
`TorchDispatchMode`, forward and backward):

* `Conv{1,2,3}d`, `ConvTranspose*d` -> `convolution` / `convolution_backward`;
* `MaxPool*d` -> `max_pool2d_with_indices` (+ `_backward`, left to torch's
  decomposition), `AvgPool2d` -> `avg_pool2d` / `avg_pool2d_backward`,
  `AdaptiveAvgPool2d` -> `_adaptive_avg_pool2d` / `_adaptive_avg_pool2d_backward`
  (an output size of 1 becomes `mean` instead);
* `LayerNorm` -> `native_layer_norm`, `GroupNorm` -> `native_group_norm`, their
  backward ops are decomposed by torch;
* `BatchNorm*d` -> `native_batch_norm`, whose schema claims to be functional but
  which updates `running_mean`/`running_var` in place when training. A lowering
  cannot write those back, so it is NOT registered here (torch's decomposition
  does the `copy_`); the functional spellings `_native_batch_norm_legit_functional`
  (returns the new running stats), `_native_batch_norm_legit.no_stats` and
  `_native_batch_norm_legit_no_training` are.
* `F.scaled_dot_product_attention` takes the math path (`bmm`, `_safe_softmax`)
  on a PrivateUse1 device, so it needs nothing here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bridge_ops._lowering import aten, lowering

_HIGHEST = lax.Precision.HIGHEST


def _expand(param, n: int) -> list[int]:
  """torch's `expand_param_if_needed`: a one-element list stands for all `n` spatial dims."""
  param = [int(param)] if isinstance(param, int) else [int(p) for p in param]
  return param * n if len(param) == 1 else param


def _opmath(dtype):
  """torch's computation dtype: float32 for the half types, else the dtype itself."""
  return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


def _conv_dn(lhs_shape, rhs_shape):
  spatial = "DHW"[5 - len(lhs_shape):]  # torch convolves 1, 2 or 3 spatial dims
  return lax.conv_dimension_numbers(lhs_shape, rhs_shape,
                                    ("NC" + spatial, "OI" + spatial, "NC" + spatial))


def _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups):
  nd = input.ndim - 2
  stride, padding = _expand(stride, nd), _expand(padding, nd)
  dilation, output_padding = _expand(dilation, nd), _expand(output_padding, nd)
  weight = weight.astype(input.dtype)
  if not transposed:
    return lax.conv_general_dilated(
        input, weight, window_strides=stride, padding=[(p, p) for p in padding],
        rhs_dilation=dilation, dimension_numbers=_conv_dn(input.shape, weight.shape),
        feature_group_count=groups, precision=_HIGHEST)
  # Transposed: weight is (C_in, C_out / groups, *k). Dilate the input by the stride,
  # pad by dilation * (k - 1) - padding (plus output_padding on the high side) and
  # convolve with the spatially flipped kernel, regrouped to (C_out, C_in / groups, *k).
  c_in, c_out_g, *k = weight.shape
  w = weight.reshape(groups, c_in // groups, c_out_g, *k)
  w = jnp.swapaxes(w, 1, 2).reshape(groups * c_out_g, c_in // groups, *k)
  w = jnp.flip(w, axis=tuple(range(2, 2 + nd)))
  pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op)
          for kk, p, d, op in zip(k, padding, dilation, output_padding)]
  return lax.conv_general_dilated(
      input, w, window_strides=[1] * nd, padding=pads, lhs_dilation=stride,
      rhs_dilation=dilation, dimension_numbers=_conv_dn(input.shape, w.shape),
      feature_group_count=groups, precision=_HIGHEST)


@lowering(aten.convolution.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                groups):
  out = _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups)
  if bias is not None:
    out = out + bias.astype(out.dtype).reshape((1, -1) + (1,) * (out.ndim - 2))
  return out


@lowering(aten.convolution_backward.default)
def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                         transposed, output_padding, groups, output_mask):
  def f(x, w):
    return _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)
  _, vjp = jax.vjp(f, input, weight)
  grad_input, grad_weight = vjp(grad_output.astype(input.dtype))
  grad_bias = None
  if output_mask[2]:
    grad_bias = jnp.sum(grad_output, axis=(0,) + tuple(range(2, grad_output.ndim)))
  return (grad_input if output_mask[0] else None,
          grad_weight if output_mask[1] else None,
          grad_bias)


# ----------------------------------------------------------------------------- pooling

def _pool_out(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
  """torch's `pooling_output_shape`."""
  out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
  if ceil_mode and (out - 1) * s >= size + p:
    out -= 1
  return out


def _pool_params(x, kernel_size, stride, padding, dilation, ceil_mode):
  k = _expand(kernel_size, 2)
  s = _expand(stride, 2) if stride else k  # an empty stride means stride = kernel_size
  p = _expand(padding, 2)
  d = _expand(dilation, 2)
  (h, w) = x.shape[-2:]
  out = [_pool_out(n, kk, ss, pp, dd, ceil_mode) for n, kk, ss, pp, dd in zip((h, w), k, s, p, d)]
  # Padding on the high side: enough for the last (ceil_mode) window, never negative.
  hi = [max(0, (o - 1) * ss + dd * (kk - 1) + 1 - pp - n)
        for o, ss, dd, kk, pp, n in zip(out, s, d, k, p, (h, w))]
  return k, s, p, d, out, hi


def _windows(x, k, s, p, d, out, hi, fill):
  """Stacks the k[0]*k[1] strided views of the padded `x`: (..., K, OH, OW)."""
  lead = x.ndim - 2
  xp = jnp.pad(x, [(0, 0)] * lead + [(p[0], hi[0]), (p[1], hi[1])], constant_values=fill)
  views = []
  for i in range(k[0]):
    for j in range(k[1]):
      start = (0,) * lead + (i * d[0], j * d[1])
      limit = xp.shape[:lead] + (i * d[0] + (out[0] - 1) * s[0] + 1,
                                 j * d[1] + (out[1] - 1) * s[1] + 1)
      views.append(lax.slice(xp, start, limit, (1,) * lead + tuple(s)))
  return jnp.stack(views, axis=-3)


@lowering(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1,
                            ceil_mode=False):
  x = self
  k, s, p, d, out, hi = _pool_params(x, kernel_size, stride, padding, dilation, ceil_mode)
  h, w = x.shape[-2:]
  floating = jnp.issubdtype(x.dtype, jnp.floating)
  fill = -jnp.inf if floating else jnp.iinfo(x.dtype).min
  v = _windows(x, k, s, p, d, out, hi, fill)
  # Static geometry: row/column of every window element, and whether it is inside the input.
  ki, kj = np.divmod(np.arange(k[0] * k[1]), k[1])
  rows = np.arange(out[0])[None, :, None] * s[0] - p[0] + ki[:, None, None] * d[0]
  cols = np.arange(out[1])[None, None, :] * s[1] - p[1] + kj[:, None, None] * d[1]
  valid = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)
  flat = (rows * w + cols).astype(np.int64)
  values = jnp.max(v, axis=-3)  # NaN propagates, as in torch
  # torch scans the window in order and takes `val > max || isnan(val)`: the first
  # maximum, or the last NaN; a window of only -inf gives its first valid element.
  first_max = jnp.argmax(valid & (v == values[..., None, :, :]), axis=-3)
  if floating:
    nan = valid & jnp.isnan(v)
    kk = v.shape[-3]
    last_nan = kk - 1 - jnp.argmax(jnp.flip(nan, axis=-3), axis=-3)
    first_max = jnp.where(jnp.any(nan, axis=-3), last_nan, first_max)
  flat = jnp.broadcast_to(jnp.asarray(flat, dtype=jnp.int64), v.shape)
  indices = jnp.take_along_axis(flat, first_max[..., None, :, :].astype(jnp.int64), axis=-3)
  return values, indices[..., 0, :, :]


def _avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                divisor_override):
  k, s, p, _, out, hi = _pool_params(x, kernel_size, stride, padding, 1, ceil_mode)
  h, w = x.shape[-2:]
  lead = x.ndim - 2
  summed = lax.reduce_window(  # a concrete 0 init keeps it a differentiable window sum
      x, np.zeros((), x.dtype), lax.add, (1,) * lead + tuple(k), (1,) * lead + tuple(s),
      [(0, 0)] * lead + [(p[0], hi[0]), (p[1], hi[1])])
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
    div = np.outer(sizes(out[0], k[0], s[0], p[0], h), sizes(out[1], k[1], s[1], p[1], w))
    div = np.maximum(div, 1)
  if jnp.issubdtype(x.dtype, jnp.integer):
    # torch divides integers in C++: truncating, as lax.div.
    return lax.div(summed, jnp.broadcast_to(jnp.asarray(div, x.dtype), summed.shape))
  return summed / jnp.asarray(div, x.dtype)


@lowering(aten.avg_pool2d.default)
def avg_pool2d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
  return _avg_pool2d(self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


@lowering(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override):
  _, vjp = jax.vjp(lambda x: _avg_pool2d(x, kernel_size, stride, padding, ceil_mode,
                                         count_include_pad, divisor_override), self)
  return vjp(grad_output.astype(self.dtype))[0]


def _adaptive_matrix(n: int, o: int):
  """(o, n) 0/1 matrix of torch's adaptive windows [floor(i n/o), ceil((i+1) n/o)), and sizes."""
  i = np.arange(o)
  start = (i * n) // o
  end = ((i + 1) * n + o - 1) // o
  j = np.arange(n)
  m = (j[None, :] >= start[:, None]) & (j[None, :] < end[:, None])
  return m, end - start


def _adaptive_avg(x, output_size):
  oh, ow = _expand(output_size, 2)
  mh, ch = _adaptive_matrix(x.shape[-2], oh)
  mw, cw = _adaptive_matrix(x.shape[-1], ow)
  summed = jnp.einsum("...hw,ah,bw->...ab", x, jnp.asarray(mh, x.dtype), jnp.asarray(mw, x.dtype),
                      precision=_HIGHEST)
  return summed / jnp.asarray(np.outer(ch, cw), x.dtype)


@lowering(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(self, output_size):
  return _adaptive_avg(self, output_size)


@lowering(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(grad_output, self):
  size = grad_output.shape[-2:]
  _, vjp = jax.vjp(lambda x: _adaptive_avg(x, size), self)
  return vjp(grad_output.astype(self.dtype))[0]


# ----------------------------------------------------------------------- normalization

def _channel_shape(ndim: int) -> tuple[int, ...]:
  return (1, -1) + (1,) * (ndim - 2)


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
  """(out, save_mean, save_invstd, new_running_mean, new_running_var), as torch's kernels."""
  ct = _opmath(input.dtype)
  x = input.astype(ct)
  shape = _channel_shape(input.ndim)
  if training:
    axes = (0,) + tuple(range(2, input.ndim))
    mean = jnp.mean(x, axis=axes)
    var = jnp.mean(jnp.square(x - mean.reshape(shape)), axis=axes)  # biased, for normalizing
    invstd = 1 / jnp.sqrt(var + eps)
    n = input.size // input.shape[1] if input.shape[1] else 0
    new_mean = new_var = None
    if running_mean is not None:
      new_mean = (momentum * mean + (1 - momentum) * running_mean.astype(ct)
                  ).astype(running_mean.dtype)
    if running_var is not None:
      unbiased = var * n / jnp.asarray(n - 1, ct)  # n == 1 gives nan, as torch's var_sum / 0
      new_var = (momentum * unbiased + (1 - momentum) * running_var.astype(ct)
                 ).astype(running_var.dtype)
  else:
    mean = running_mean.astype(ct)
    invstd = 1 / jnp.sqrt(running_var.astype(ct) + eps)
    new_mean, new_var = running_mean, running_var
  out = (x - mean.reshape(shape)) * invstd.reshape(shape)
  if weight is not None:
    out = out * weight.astype(ct).reshape(shape)
  if bias is not None:
    out = out + bias.astype(ct).reshape(shape)
  # Not training, torch's CPU kernel returns empty (0,) saved stats; its meta kernel (which the
  # core checks against) and CUDA return the running mean and invstd: those are returned.
  return out.astype(input.dtype), mean, invstd, new_mean, new_var


@lowering(aten._native_batch_norm_legit_functional.default)
def _native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var,
                                        training, momentum, eps):
  return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


@lowering(aten._native_batch_norm_legit.no_stats)
def _native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
  return _batch_norm(input, weight, bias, None, None, True, momentum, eps)[:3]


@lowering(aten._native_batch_norm_legit_no_training.default)
def _native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var,
                                         momentum, eps):
  return _batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@lowering(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
  ct = _opmath(input.dtype)
  x = input.astype(ct)
  axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
  mean = jnp.mean(x, axis=axes, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
  rstd = 1 / jnp.sqrt(var + eps)
  out = (x - mean) * rstd
  if weight is not None:
    out = out * weight.astype(ct)
  if bias is not None:
    out = out + bias.astype(ct)
  return out.astype(input.dtype), mean, rstd


@lowering(aten.native_group_norm.default)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
  ct = _opmath(input.dtype)
  x = input.astype(ct).reshape(N, group, (C // group) * HxW)
  mean = jnp.mean(x, axis=-1)
  var = jnp.mean(jnp.square(x - mean[..., None]), axis=-1)
  rstd = 1 / jnp.sqrt(var + eps)
  out = ((x - mean[..., None]) * rstd[..., None]).reshape(N, C, HxW)
  if weight is not None:
    out = out * weight.astype(ct)[:, None]
  if bias is not None:
    out = out + bias.astype(ct)[:, None]
  return out.reshape(input.shape).astype(input.dtype), mean, rstd
