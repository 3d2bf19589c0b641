"""Lowerings of torch's fused attention ops: the `nn.MultiheadAttention` and
`nn.TransformerEncoderLayer` fast paths; and the CPU flash-attention kernel with its backward.

In eval mode (or with no parameter requiring grad) these modules call one fused
aten op instead of their Python code: `_native_multi_head_attention` and
`_transformer_encoder_layer_fwd`. Masks follow torch's `_masked_softmax`: a
nonzero (True) entry hides the key; `mask_type` 0 is an (L, S) attention mask,
1 a (B, S) key-padding mask, 2 a mask broadcastable to (B, H, L, S). A row whose
keys are all hidden gets zero weights, as in torch.

`F.scaled_dot_product_attention` on CPU tensors traced by aot_autograd (`torch.compile`)
becomes `_scaled_dot_product_flash_attention_for_cpu` (when there is no dropout), whose
second output is the log-sum-exp of each query's scores; its backward recomputes the
probabilities from it. torch's decomposition of the forward returns the attention weights
in that place instead, so both are lowered here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from bridge_ops._lowering import aten, lowering, opmath

_HIGHEST = lax.Precision.HIGHEST


def _linear(x, w, b):
  y = jnp.matmul(x, w.T, precision=_HIGHEST)
  return y if b is None else y + b


def _heads(x, num_head):
  b, n, e = x.shape
  return x.reshape(b, n, num_head, e // num_head).transpose(0, 2, 1, 3)


def _mask_4d(mask, mask_type, shape):
  """The mask as booleans broadcastable to the scores' (B, H, L, S)."""
  hidden = mask if mask.dtype == jnp.bool_ else mask != 0
  if mask_type == 1:  # key padding: (B, S)
    hidden = hidden[:, None, None, :]
  elif hidden.ndim == 2:  # (L, S)
    hidden = hidden[None, None]
  return jnp.broadcast_to(hidden, shape)


def _attention(q, k, v, num_head, mask, mask_type):
  """Scaled dot-product attention over heads; returns (output (B, L, E), weights (B, H, L, S))."""
  qh, kh, vh = _heads(q, num_head), _heads(k, num_head), _heads(v, num_head)
  scale = 1.0 / jnp.sqrt(jnp.asarray(qh.shape[-1], q.dtype))
  scores = jnp.matmul(qh * scale, kh.swapaxes(-1, -2), precision=_HIGHEST)
  if mask is not None:
    hidden = _mask_4d(mask, mask_type, scores.shape)
    scores = jnp.where(hidden, -jnp.inf, scores)
    weights = jax.nn.softmax(scores, axis=-1)
    weights = jnp.where(hidden.all(axis=-1, keepdims=True), 0.0, weights)
  else:
    weights = jax.nn.softmax(scores, axis=-1)
  out = jnp.matmul(weights, vh, precision=_HIGHEST)
  b, h, n, d = out.shape
  return out.transpose(0, 2, 1, 3).reshape(b, n, h * d), weights


def _in_projection(query, key, value, qkv_weight, qkv_bias):
  wq, wk, wv = jnp.split(qkv_weight, 3, axis=0)
  bq, bk, bv = jnp.split(qkv_bias, 3) if qkv_bias is not None else (None,) * 3
  return _linear(query, wq, bq), _linear(key, wk, bk), _linear(value, wv, bv)


@lowering(
  aten._native_multi_head_attention.default,
  static_argnames=("embed_dim", "num_head", "need_weights", "average_attn_weights", "mask_type"),
)
def _native_multi_head_attention(
  query,
  key,
  value,
  embed_dim,
  num_head,
  qkv_weight,
  qkv_bias,
  proj_weight,
  proj_bias,
  mask=None,
  need_weights=True,
  average_attn_weights=True,
  mask_type=None,
):
  del embed_dim
  q, k, v = _in_projection(query, key, value, qkv_weight, qkv_bias)
  out, weights = _attention(q, k, v, num_head, mask, mask_type)
  out = _linear(out, proj_weight, proj_bias)
  if not need_weights:
    return out, None
  return out, weights.mean(axis=1) if average_attn_weights else weights


def _layer_norm(x, weight, bias, eps):
  mean = x.mean(axis=-1, keepdims=True)
  var = jnp.square(x - mean).mean(axis=-1, keepdims=True)
  return (x - mean) * lax.rsqrt(var + eps) * weight + bias


@lowering(
  aten._transformer_encoder_layer_fwd.default,
  static_argnames=("embed_dim", "num_heads", "use_gelu", "norm_first", "mask_type"),
)
def _transformer_encoder_layer_fwd(
  src,
  embed_dim,
  num_heads,
  qkv_weight,
  qkv_bias,
  proj_weight,
  proj_bias,
  use_gelu,
  norm_first,
  eps,
  norm_weight_1,
  norm_bias_1,
  norm_weight_2,
  norm_bias_2,
  ffn_weight_1,
  ffn_bias_1,
  ffn_weight_2,
  ffn_bias_2,
  mask=None,
  mask_type=None,
):
  del embed_dim
  x = src
  h = _layer_norm(x, norm_weight_1, norm_bias_1, eps) if norm_first else x
  q, k, v = _in_projection(h, h, h, qkv_weight, qkv_bias)
  attn, _ = _attention(q, k, v, num_heads, mask, mask_type)
  x = x + _linear(attn, proj_weight, proj_bias)
  if not norm_first:
    x = _layer_norm(x, norm_weight_1, norm_bias_1, eps)
  h = _layer_norm(x, norm_weight_2, norm_bias_2, eps) if norm_first else x
  h = _linear(h, ffn_weight_1, ffn_bias_1)
  h = jax.nn.gelu(h, approximate=False) if use_gelu else jax.nn.relu(h)
  x = x + _linear(h, ffn_weight_2, ffn_bias_2)
  if not norm_first:
    x = _layer_norm(x, norm_weight_2, norm_bias_2, eps)
  return x


def _flash_scores(query, key, is_causal, attn_mask, scale):
  """The scaled scores (B, H, L, S) in the compute dtype, causal and `attn_mask` applied."""
  ct = opmath(query.dtype)
  scale = 1.0 / float(query.shape[-1]) ** 0.5 if scale is None else scale
  s = jnp.matmul(query.astype(ct), jnp.swapaxes(key, -1, -2).astype(ct), precision=_HIGHEST)
  s = s * jnp.asarray(scale, ct)
  if is_causal:  # (top left aligned, as torch's kernel)
    length, keys = s.shape[-2:]
    s = jnp.where(jnp.tril(jnp.ones((length, keys), bool)), s, -jnp.inf)
  if attn_mask is not None:
    if attn_mask.dtype == jnp.bool_:
      s = jnp.where(attn_mask, s, -jnp.inf)
    else:
      s = s + attn_mask.astype(ct)
  return s


def _flash_probabilities(s, logsumexp):
  """softmax(s) from its log-sum-exp; a row with every key hidden gets zeros."""
  lse = logsumexp[..., None]
  return jnp.where(jnp.isneginf(lse), 0.0, jnp.exp(s - jnp.where(jnp.isneginf(lse), 0.0, lse)))


def _no_dropout(dropout_p):
  if dropout_p:
    raise NotImplementedError(
      "_scaled_dot_product_flash_attention_for_cpu with dropout: torch's CPU kernel takes "
      "no dropout either (scaled_dot_product_attention takes its math path then)."
    )


@lowering(
  aten._scaled_dot_product_flash_attention_for_cpu.default,
  static_argnames=("dropout_p", "is_causal", "scale"),
)
def _flash_attention_for_cpu(
  query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None
):
  _no_dropout(dropout_p)
  s = _flash_scores(query, key, is_causal, attn_mask, scale)
  logsumexp = jax.nn.logsumexp(s, axis=-1)
  p = _flash_probabilities(s, logsumexp)
  out = jnp.matmul(p, value.astype(p.dtype), precision=_HIGHEST)
  return out.astype(query.dtype), logsumexp  # (in the compute dtype, as torch's)


@lowering(
  aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
  static_argnames=("dropout_p", "is_causal", "scale"),
)
def _flash_attention_for_cpu_backward(
  grad_out,
  query,
  key,
  value,
  out,
  logsumexp,
  dropout_p,
  is_causal,
  *,
  attn_mask=None,
  scale=None,
):
  _no_dropout(dropout_p)
  ct = opmath(query.dtype)
  scale = 1.0 / float(query.shape[-1]) ** 0.5 if scale is None else scale
  p = _flash_probabilities(_flash_scores(query, key, is_causal, attn_mask, scale), logsumexp)
  g = grad_out.astype(ct)
  grad_value = jnp.matmul(jnp.swapaxes(p, -1, -2), g, precision=_HIGHEST)
  dp = jnp.matmul(g, jnp.swapaxes(value, -1, -2).astype(ct), precision=_HIGHEST)
  ds = p * (dp - jnp.sum(g * out.astype(ct), axis=-1, keepdims=True)) * jnp.asarray(scale, ct)
  grad_query = jnp.matmul(ds, key.astype(ct), precision=_HIGHEST)
  grad_key = jnp.matmul(jnp.swapaxes(ds, -1, -2), query.astype(ct), precision=_HIGHEST)
  return grad_query.astype(query.dtype), grad_key.astype(key.dtype), grad_value.astype(value.dtype)
