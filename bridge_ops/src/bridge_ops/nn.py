"""Lowerings of the NN family: convolution and normalization (pooling is `pooling.py`).

What torch's `nn` modules reach on a non-CPU device (checked with a logging
`TorchDispatchMode`, forward and backward):

* `Conv{1,2,3}d`, `ConvTranspose*d` -> `convolution` / `convolution_backward`;
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

from bridge_ops._lowering import (
  aten,
  check,
  check_index,
  expand_param,
  lowering,
  opmath,
  scalar_type_name,
)
from bridge_ops.indexing import _embedding

_HIGHEST = lax.Precision.HIGHEST


def _conv_dn(lhs_shape, rhs_shape):
  spatial = "DHW"[5 - len(lhs_shape) :]  # torch convolves 1, 2 or 3 spatial dims
  return lax.conv_dimension_numbers(
    lhs_shape, rhs_shape, ("NC" + spatial, "OI" + spatial, "NC" + spatial)
  )


def _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups):
  nd = input.ndim - 2
  stride, padding = expand_param(stride, nd), expand_param(padding, nd)
  dilation, output_padding = expand_param(dilation, nd), expand_param(output_padding, nd)
  weight = weight.astype(input.dtype)
  if not transposed:
    pads = [(p, p) for p in padding]
    extents = [d * (k - 1) + 1 for d, k in zip(dilation, weight.shape[2:])]
    if any(n < e for n, e in zip(input.shape[2:], extents)) and any(padding):
      # XLA:CPU leaves its fast (Eigen) convolution for a naive loop when the kernel is
      # larger than the unpadded input (ResNet's 3x3 convolutions on 2x2 maps: 60x slower
      # than torch); padded beforehand, the kernel fits and the fast path is taken
      input = jnp.pad(input, [(0, 0), (0, 0)] + pads)
      pads = [(0, 0)] * nd
    return lax.conv_general_dilated(
      input,
      weight,
      window_strides=stride,
      padding=pads,
      rhs_dilation=dilation,
      dimension_numbers=_conv_dn(input.shape, weight.shape),
      feature_group_count=groups,
      precision=_HIGHEST,
    )
  # Transposed: weight is (C_in, C_out / groups, *k). Dilate the input by the stride,
  # pad by dilation * (k - 1) - padding (plus output_padding on the high side) and
  # convolve with the spatially flipped kernel, regrouped to (C_out, C_in / groups, *k).
  c_in, c_out_g, *k = weight.shape
  w = weight.reshape(groups, c_in // groups, c_out_g, *k)
  w = jnp.swapaxes(w, 1, 2).reshape(groups * c_out_g, c_in // groups, *k)
  w = jnp.flip(w, axis=tuple(range(2, 2 + nd)))
  pads = [
    (d * (kk - 1) - p, d * (kk - 1) - p + op)
    for kk, p, d, op in zip(k, padding, dilation, output_padding)
  ]
  return lax.conv_general_dilated(
    input,
    w,
    window_strides=[1] * nd,
    padding=pads,
    lhs_dilation=stride,
    rhs_dilation=dilation,
    dimension_numbers=_conv_dn(input.shape, w.shape),
    feature_group_count=groups,
    precision=_HIGHEST,
  )


def _real_convolution(input, weight, bias, *params):
  """A real convolution; 16-bit floats accumulate in float32 (bias included) and round once,
  as torch's CPU kernels do."""
  ct = opmath(input.dtype)
  out = _conv(input.astype(ct), weight.astype(ct), *params)
  if bias is not None:
    out = out + bias.astype(ct).reshape((1, -1) + (1,) * (out.ndim - 2))
  return out.astype(input.dtype)


@lowering(aten.convolution.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
  params = (stride, padding, dilation, transposed, output_padding, groups)
  if not jnp.iscomplexobj(input):
    return _real_convolution(input, weight, bias, *params)
  # torch's `complex_convolution`: three real convolutions (Gauss's trick),
  # a = conv(x_r, w_r) + b_r, b = conv(x_i, w_i), c = conv(x_r + x_i, w_r + w_i) + b_r + b_i,
  # result a - b + i (c - a - b).
  x_r, x_i = jnp.real(input), jnp.imag(input)
  w_r, w_i = jnp.real(weight), jnp.imag(weight)
  b_r = None if bias is None else jnp.real(bias)
  b_ri = None if bias is None else jnp.real(bias) + jnp.imag(bias)
  a = _real_convolution(x_r, w_r, b_r, *params)
  b = _real_convolution(x_i, w_i, None, *params)
  c = _real_convolution(x_r + x_i, w_r + w_i, b_ri, *params)
  return lax.complex(a - b, c - a - b)


@lowering(aten.convolution_backward.default)
def convolution_backward(
  grad_output,
  input,
  weight,
  bias_sizes,
  stride,
  padding,
  dilation,
  transposed,
  output_padding,
  groups,
  output_mask,
):
  def f(x, w):
    return convolution(x, w, None, stride, padding, dilation, transposed, output_padding, groups)

  _, vjp = jax.vjp(f, input, weight)
  grad_input, grad_weight = vjp(grad_output.astype(input.dtype))
  grad_bias = None
  if output_mask[2]:
    grad_bias = jnp.sum(grad_output, axis=(0,) + tuple(range(2, grad_output.ndim)))
  return (
    grad_input if output_mask[0] else None,
    grad_weight if output_mask[1] else None,
    grad_bias,
  )


# ----------------------------------------------------------------------- normalization


def _channel_shape(ndim: int) -> tuple[int, ...]:
  return (1, -1) + (1,) * (ndim - 2)


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
  """(out, save_mean, save_invstd, new_running_mean, new_running_var), as torch's kernels."""
  ct = opmath(input.dtype)
  x = input.astype(ct)
  shape = _channel_shape(input.ndim)
  if training:
    axes = (0,) + tuple(range(2, input.ndim))
    # torch's CPU kernel keeps the batch mean and invstd in the input's dtype (16-bit floats
    # round them; the variance is taken around the rounded mean).
    mean = jnp.mean(x, axis=axes).astype(input.dtype).astype(ct)
    var = jnp.mean(jnp.square(x - mean.reshape(shape)), axis=axes)  # biased, for normalizing
    invstd = (1 / jnp.sqrt(var + eps)).astype(input.dtype).astype(ct)
    n = input.size // input.shape[1] if input.shape[1] else 0
    new_mean = new_var = None
    if running_mean is not None:
      new_mean = (momentum * mean + (1 - momentum) * running_mean.astype(ct)).astype(
        running_mean.dtype
      )
    if running_var is not None:
      unbiased = var * n / jnp.asarray(n - 1, ct)  # n == 1 gives nan, as torch's var_sum / 0
      new_var = (momentum * unbiased + (1 - momentum) * running_var.astype(ct)).astype(
        running_var.dtype
      )
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
def _native_batch_norm_legit_functional(
  input, weight, bias, running_mean, running_var, training, momentum, eps
):
  return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


@lowering(aten._native_batch_norm_legit.no_stats)
def _native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
  return _batch_norm(input, weight, bias, None, None, True, momentum, eps)[:3]


@lowering(aten._native_batch_norm_legit_no_training.default)
def _native_batch_norm_legit_no_training(
  input, weight, bias, running_mean, running_var, momentum, eps
):
  return _batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@lowering(aten._batch_norm_with_update_functional.default)
def _batch_norm_with_update_functional(
  input, weight, bias, running_mean, running_var, momentum, eps
):
  """`BatchNorm` training with running stats (the functional twin of `_batch_norm_with_update`):
  (out, save_mean, save_invstd, reserve (empty), new running mean, new running var)."""
  out, mean, invstd, new_mean, new_var = _batch_norm(
    input, weight, bias, running_mean, running_var, True, momentum, eps
  )
  return out, mean, invstd, jnp.zeros((0,), jnp.uint8), new_mean, new_var


@lowering(aten._batch_norm_no_update.default)
def _batch_norm_no_update(input, weight, bias, running_mean, running_var, momentum, eps):
  """`BatchNorm` in eval mode: normalized with the running stats."""
  out, mean, invstd, _, _ = _batch_norm(
    input, weight, bias, running_mean, running_var, False, momentum, eps
  )
  return out, mean, invstd, jnp.zeros((0,), jnp.uint8)


@lowering(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
  ct = opmath(input.dtype)
  x = input.astype(ct)
  axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
  mean = jnp.mean(x, axis=axes, keepdims=True)
  centered = x - mean
  var = jnp.mean(jnp.square(centered), axis=axes, keepdims=True)
  rstd = 1 / jnp.sqrt(var + eps)
  out = centered * rstd
  if weight is not None:
    out = out * weight.astype(ct)
  if bias is not None:
    out = out + bias.astype(ct)
  return out.astype(input.dtype), mean, rstd


@lowering(aten.native_group_norm.default)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
  ct = opmath(input.dtype)
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


# ------------------------------------------------------------------------------ embedding bag

_BAG_SUM, _BAG_MEAN, _BAG_MAX = 0, 1, 2


def _bags(indices, offsets, n_bags, include_last_offset, padding_idx):
  """(positions, the bag of each index, whether it counts, its segment: the bag or `n_bags`
  for one left out) for `indices` split into bags at `offsets`."""
  n = indices.shape[0]
  starts = offsets[:n_bags].astype(jnp.int64)
  end = offsets[n_bags].astype(jnp.int64) if include_last_offset else n
  pos = jnp.arange(n)
  bag = jnp.searchsorted(starts, pos, side="right") - 1
  valid = (bag >= 0) & (pos < end)
  if padding_idx is not None and padding_idx >= 0:
    valid = valid & (indices != padding_idx)
  return pos, bag, valid, jnp.where(valid, bag, n_bags)


_NOT_IMPROVED = (
  "  (Could this error message be improved?  If so, please report an enhancement request to "
  "PyTorch.)"
)


def _fbgemm_path(weight, mode, padding_idx):
  """Whether torch's CPU kernel takes its FBGEMM path ("sum"/"mean" of 16/32-bit floats
  without padding_idx), whose checks and messages differ from the other paths'."""
  return (
    mode != _BAG_MAX
    and (padding_idx is None or padding_idx < 0)
    and np.dtype(weight.dtype)
    in (np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(jnp.float32))
  )


def _check_bag_offsets(weight, indices, offsets, mode, include_last_offset, padding_idx):
  """torch's checks of `offsets` (values), in its CPU kernel's order: offsets[0] is 0,
  offsets[-1] at most the number of indices, every offset in [0, n] (its `index_add_` into
  offset2bag), and on the FBGEMM path non-decreasing offsets (its error report's words)."""
  if offsets.shape[0] == 0:
    return
  n = indices.shape[0]
  first, last = offsets[0], offsets[-1]
  kind = scalar_type_name(offsets.dtype)
  check(
    jnp.stack([first != 0, last > n]),
    jnp.stack([first, last]),
    RuntimeError,
    lambda value, position: (
      "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
      f"position 0. However, got {value}\n[ torch.{kind}Tensor{{}} ]"  # (torch prints a tensor)
      if position == 0
      else f"offsets[-1] can not be greater than input's length {n} but got offsets[-1] of {value}"
    ),
  )
  check((offsets < 0) | (offsets > n), offsets, IndexError, "index out of range in self")
  if _fbgemm_path(weight, mode, padding_idx) and offsets.shape[0] > 1:
    decreasing = jnp.any(offsets[1:] < offsets[:-1])
    ragged_end = include_last_offset & (last != n)
    check(
      jnp.stack([decreasing & ~ragged_end, decreasing & ragged_end]),
      None,
      RuntimeError,
      lambda value, position: (
        "Expected i < index_size to be true, but got false." + _NOT_IMPROVED
        if position == 0
        else "Your input appears to be incorrect: the last offset value should be the size "
        "of the indices tensor, but it seems not to be the case."
      ),
    )


def _check_bag_indices(weight, indices, mode, padding_idx):
  """Rows in [0, num_embeddings), with the message of torch's CPU kernel: its FBGEMM path
  (16/32-bit floats, "sum"/"mean", no padding_idx) names the position (FBGEMM words a bad
  index past the first bag otherwise; this message is kept for it too)."""
  n = weight.shape[0]
  if _fbgemm_path(weight, mode, padding_idx):
    message = (
      f"Index {{position}} of input takes value {{value}} which is not in the valid range [0, {n})"
    )
  else:
    message = "embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be {value}"
  check_index(indices, n, RuntimeError, message)


@lowering(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag(
  weight,
  indices,
  offsets,
  scale_grad_by_freq=False,
  mode=0,
  sparse=False,
  per_sample_weights=None,
  include_last_offset=False,
  padding_idx=-1,
):
  """`F.embedding_bag`: rows of `weight` gathered by `indices` and reduced per bag (bag `b` is
  `indices[offsets[b]:offsets[b + 1]]`, the last one to the end, or to `offsets[-1]` with
  `include_last_offset`); entries equal to `padding_idx` (>= 0) are left out (and not
  counted by "mean"); an empty bag gives zeros. `per_sample_weights` scale rows ("sum").

  Returns (output, offset2bag, bag_size, max_indices) shaped as torch's meta kernel (its
  CUDA layout): the bag of every index, the entries per bag, the row index of each maximum
  ("max"; 0 for an empty bag, as torch's CPU kernel). Sums run in float32 for the 16-bit floats.
  """
  _check_bag_offsets(weight, indices, offsets, mode, include_last_offset, padding_idx)
  _check_bag_indices(weight, indices, mode, padding_idx)
  n = indices.shape[0]
  n_offsets = offsets.shape[0]
  n_bags = n_offsets - 1 if include_last_offset else n_offsets
  pos, bag, valid, segment = _bags(indices, offsets, n_bags, include_last_offset, padding_idx)
  ct = opmath(weight.dtype)
  if scale_grad_by_freq and mode != _BAG_MAX and jnp.issubdtype(weight.dtype, jnp.inexact):
    # torch divides each row's gradient by its count in `indices` ("sum", "mean")
    rows = _embedding(-1, True, weight, indices).astype(ct)
  else:
    rows = weight[indices].astype(ct)
  if per_sample_weights is not None:
    rows = rows * per_sample_weights.astype(ct)[:, None]
  count = jax.ops.segment_sum(valid.astype(jnp.int64), segment, n_bags + 1)[:n_bags]
  max_indices = jnp.zeros((0,), indices.dtype)
  if mode == _BAG_MAX and n == 0:  # every bag empty: zeros, as torch (nothing to gather)
    out = jnp.zeros((n_bags, weight.shape[1]), ct)
    max_indices = jnp.zeros((n_bags, weight.shape[1]), indices.dtype)
  elif mode == _BAG_MAX:
    out = jax.ops.segment_max(rows, segment, n_bags + 1)[:n_bags]
    empty = (count == 0)[:, None]
    out = jnp.where(empty, jnp.zeros((), ct), out)
    # torch keeps the first maximum of each bag (`val > max` replaces it).
    is_max = valid[:, None] & (rows == out[jnp.clip(bag, 0, n_bags - 1)])
    first = jax.ops.segment_min(jnp.where(is_max, pos[:, None], n), segment, n_bags + 1)[:n_bags]
    max_indices = jnp.where(empty, 0, indices[jnp.clip(first, 0, n - 1)]).astype(indices.dtype)
    # The value read from that first maximum, so the gradient goes to it alone, as torch's
    # (segment_max's derivative splits it among tied rows).
    picked = jnp.take_along_axis(rows, jnp.clip(first, 0, n - 1), axis=0)
    out = jnp.where(first < n, picked, lax.stop_gradient(out))
  else:
    out = jax.ops.segment_sum(
      jnp.where(valid[:, None], rows, jnp.zeros((), ct)), segment, n_bags + 1
    )[:n_bags]
    if mode == _BAG_MEAN:
      out = jnp.where(
        count[:, None] > 0, out / jnp.maximum(count, 1)[:, None].astype(ct), jnp.zeros((), ct)
      )
  bag_size = jnp.zeros((n_offsets,), indices.dtype).at[:n_bags].set(count.astype(indices.dtype))
  return out.astype(weight.dtype), bag.astype(indices.dtype), bag_size, max_indices


@lowering(aten._embedding_bag_backward.default)
def _embedding_bag_backward(
  grad,
  indices,
  offsets,
  offset2bag,
  bag_size,
  maximum_indices,
  num_weights,
  scale_grad_by_freq,
  mode,
  sparse,
  per_sample_weights,
  padding_idx=-1,
):
  """The weight's gradient of `_embedding_bag` ("sum", "mean": each counted index gets its
  bag's gradient, divided by the bag's size for "mean", times its `per_sample_weights`;
  "max": each bag's gradient goes to the rows that held its maxima). With
  `scale_grad_by_freq` a row's gradient is divided by how often it occurs in `indices`, as
  documented; torch 2.13's CPU kernel divides some rows by another index's count
  (pytorch/pytorch#190063), its CUDA kernel does not."""
  if sparse:
    raise ValueError(
      "embedding_bag(sparse=True): sparse gradients are not supported on the "
      "`jax` device; use sparse=False (dense gradients)."
    )
  n_bags, width = grad.shape[0], grad.shape[1]
  include_last_offset = offsets.shape[0] == n_bags + 1
  ct = opmath(grad.dtype)
  g = grad.astype(ct)
  out = jnp.zeros((num_weights, width), ct)
  if mode == _BAG_MAX:
    filled = (bag_size[:n_bags] > 0)[:, None]
    cols = jnp.broadcast_to(jnp.arange(width), (n_bags, width))
    out = out.at[maximum_indices, cols].add(jnp.where(filled, g, jnp.zeros((), ct)))
    return out.astype(grad.dtype)
  _, bag, valid, _ = _bags(indices, offsets, n_bags, include_last_offset, padding_idx)
  rows = g[jnp.clip(bag, 0, n_bags - 1)]
  if mode == _BAG_MEAN:
    size = bag_size[jnp.clip(bag, 0, n_bags - 1)].astype(ct)
    rows = rows / jnp.maximum(size, 1)[:, None]
  if per_sample_weights is not None:
    rows = rows * per_sample_weights.astype(ct)[:, None]
  if scale_grad_by_freq:
    counts = jnp.zeros((num_weights,), ct).at[indices].add(1)
    rows = rows / counts[indices][:, None]
  rows = jnp.where(valid[:, None], rows, jnp.zeros((), ct))
  return out.at[indices].add(rows).astype(grad.dtype)
