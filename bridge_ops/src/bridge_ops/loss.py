"""Losses and distances: mse, smooth_l1, huber, binary cross-entropy (with logits too), nll, soft
margin, CTC, and the pairwise distances cdist and pdist.

What torch's loss functions reach (checked with a logging `TorchDispatchMode`):

* `F.mse_loss`, `F.smooth_l1_loss`, `F.huber_loss`, `F.binary_cross_entropy` reach their
  own aten ops; their `*_backward` ops are decomposed by torch, so only the forward ops
  are lowered here.
* `F.nll_loss` / `F.cross_entropy` with class indices reach `nll_loss_forward` (2-D or 1-D
  input) or `nll_loss2d_forward` (N, C, d1, ...; more than one spatial dim is viewed as
  4-D first), after `_log_softmax`; `nll_loss*_backward` are decomposed by torch.
* `F.binary_cross_entropy_with_logits` reaches `binary_cross_entropy_with_logits`, whose
  gradient torch writes with elementwise ops.
* `F.l1_loss`, `F.kl_div`, `F.cross_entropy` with probabilities and the label smoothing
  and weight terms of `F.cross_entropy` are composite: they decompose into elementwise
  and reduction ops before reaching the device.
* `F.linear_cross_entropy` with `options` (the chunked path) reaches the custom ops
  `torch_nn::_linear_cross_entropy_batch_chunked` (mean/sum: the loss and its gradients in
  one op) and `torch_nn::_linear_cross_entropy_batch_chunked_no_reduction` (none); their
  backward is torch autograd Python (scaling the precomputed gradients, or recomputing them
  with torch ops), not a separate op. Without `options` it is composite.

`reduction` is torch's enum: 0 none, 1 mean, 2 sum.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from bridge_ops import arithmetic, indexing
from bridge_ops import reduction as reduction_ops
from bridge_ops._lowering import (
  Ops,
  aten,
  check,
  lowering,
  p_norm,
  promote,
  result_dtypes,
  scan,
  with_derivative,
)

try:
  # Defines the `torch_nn` library ops of the chunked `F.linear_cross_entropy` (torch imports
  # it lazily, on the first chunked call); a torch without it has no chunked path to lower.
  import torch.nn.modules.linear_cross_entropy
except ImportError:
  pass

torch_nn = Ops(torch.ops.torch_nn, "torch_nn")

_NONE, _MEAN, _SUM = 0, 1, 2


def _reduce(loss, reduction: int):
  if reduction == _MEAN:
    return jnp.mean(loss)
  if reduction == _SUM:
    return jnp.sum(loss)
  return loss


@lowering(aten.mse_loss.default)
@promote("self", "target")
def mse_loss(self, target, reduction=_MEAN):
  return _reduce(jnp.square(self - target), reduction)


# `delta`/`beta` are static: torch refuses a bad one before it computes (its message here, at
# once, also while torch code is traced into a program); a value recompiles (one per model).
@lowering(aten.huber_loss.default, static_argnames=("delta",))
@promote("self", "target")
def huber_loss(self, target, reduction=_MEAN, delta=1.0):
  if not delta > 0:
    raise RuntimeError("huber_loss does not support non-positive values for delta.")
  z = jnp.abs(self - target)
  q = _quadratic_part(z, delta)
  return _reduce(jnp.where(z < delta, 0.5 * q * q, delta * (z - 0.5 * delta)), reduction)


def _quadratic_part(z, bound):
  """`z` where the quadratic branch is taken (and at nan), else 0: an infinite difference then
  has the linear branch's gradient (torch's +-delta), not inf * 0 = nan from the untaken
  square; a nan difference keeps torch's nan gradient."""
  return jnp.where(z >= bound, jnp.zeros((), z.dtype), z)


@lowering(aten.smooth_l1_loss.default, static_argnames=("beta",))
@promote("self", "target")
def smooth_l1_loss(self, target, reduction=_MEAN, beta=1.0):
  if not beta >= 0:
    raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
  z = jnp.abs(self - target)
  # beta == 0 is the L1 loss: `z < 0` never holds, and the quadratic branch divides by 1
  # instead of 0.
  safe_beta = beta + (beta == 0)
  q = _quadratic_part(z, beta)
  return _reduce(jnp.where(z < beta, 0.5 * q * q / safe_beta, z - 0.5 * beta), reduction)


def _bce_elements(x, y):
  # torch clamps both logs at -100, so an input of exactly 0 or 1 gives a finite loss.
  return (y - 1) * jnp.maximum(jnp.log1p(-x), -100.0) - y * jnp.maximum(jnp.log(x), -100.0)


def _bce_tangent(out, primals, tangents):
  """torch's `binary_cross_entropy_backward` ((x - y) / max(x (1 - x), 1e-12): finite at
  x = 0 or 1, where a sigmoid in float32 often lands) and its target derivative."""
  (x, y), (tx, ty) = primals, tangents
  dx = (x - y) / jnp.maximum((1 - x) * x, jnp.asarray(1e-12, x.dtype))
  dy = jnp.maximum(jnp.log1p(-x), -100.0) - jnp.maximum(jnp.log(x), -100.0)
  return dx * tx + dy * ty


_bce = with_derivative(_bce_elements, _bce_tangent)

_BCE_ERRORS = {
  1: "all elements of input should be between 0 and 1",
  2: "all elements of target should be between 0 and 1",
}


def _check_bce_values(input, target):
  """torch's CPU kernel checks each element in turn, input before target (NaN fails both)."""
  codes = jnp.where(
    ~((input >= 0) & (input <= 1)), 1, jnp.where(~((target >= 0) & (target <= 1)), 2, 0)
  )
  check(codes != 0, codes, RuntimeError, lambda code, position: _BCE_ERRORS[int(code)])


@lowering(aten.binary_cross_entropy.default)
@promote("self", "target", "weight")
def binary_cross_entropy(self, target, weight=None, reduction=_MEAN):
  _check_bce_values(self, target)
  loss = _bce(self, target)
  if weight is not None:
    loss = loss * weight
  return _reduce(loss, reduction)


@lowering(aten.binary_cross_entropy_with_logits.default)
@promote("self", "target", "weight", "pos_weight")
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None, reduction=_MEAN):
  log_sigmoid = jax.nn.log_sigmoid(self)  # min(x, 0) - log1p(exp(-|x|)), as torch's
  if pos_weight is not None:
    log_sigmoid = ((pos_weight - 1) * target + 1) * log_sigmoid
  loss = (1 - target) * self - log_sigmoid
  if weight is not None:
    loss = loss * weight
  return _reduce(loss, reduction)


@lowering(aten.soft_margin_loss.default)
def soft_margin_loss(self, target, reduction=_MEAN):
  """torch's kernel: `neg(self).mul_(target).exp_().log1p_()` in `self`'s dtype, step by step,
  so that a half `exp` overflows to inf as in torch (a fused float computation would not)."""
  z = (-self).astype(result_dtypes(self, target)[0]) * target
  loss = jnp.log1p(jnp.exp(z.astype(self.dtype)))
  return _reduce(loss, reduction)


def _nll(logp, target, weight, reduction, ignore_index):
  """`logp` (..., C) with the classes last, `target` (...): (output, total_weight) as torch."""
  target = target.astype(jnp.int64)
  ignored = target == ignore_index
  n_classes = logp.shape[-1]
  check(
    ~ignored & ((target < 0) | (target >= n_classes)),
    target,
    IndexError,
    "Target {value} is out of bounds.",
    kind="index",
  )
  safe = jnp.where(ignored, 0, target)
  picked = jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
  w = jnp.ones_like(picked) if weight is None else weight.astype(logp.dtype)[safe]
  w = jnp.where(ignored, jnp.zeros((), logp.dtype), w)
  # Ignored entries are exactly 0 (torch skips them; -logp * 0 would be NaN for logp = -inf).
  loss = jnp.where(ignored, jnp.zeros((), logp.dtype), -picked * w)
  total = jnp.sum(w)
  if reduction == _NONE:
    # torch leaves total_weight at 0 for a batch, but sets it for a single (0-d) target.
    return loss, (total if target.ndim == 0 else jnp.zeros((), logp.dtype))
  out = jnp.sum(loss)
  # mean divides by the summed weights of the kept targets: 0 / 0 = NaN when all are ignored.
  return (out / total if reduction == _MEAN else out), total


@lowering(aten.nll_loss_forward.default)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
  # self (N, C) with target (N,), or (C,) with a 0-d target: the classes are the last dim.
  return _nll(self, target, weight, reduction, ignore_index)


@lowering(aten.nll_loss2d_forward.default)
def nll_loss2d_forward(self, target, weight, reduction, ignore_index):
  # self (N, C, H, W), target (N, H, W).
  return _nll(jnp.moveaxis(self, 1, -1), target, weight, reduction, ignore_index)


# --- margin losses: torch's decompositions, with its CPU kernels' checks of the targets -------
# (the decompositions' `gather` would name its own index error): the same lowerings, in the
# same order, so the values and derivatives are those of the decompositions.


@lowering(aten.multi_margin_loss.default, static_argnames=("p",))
def multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=_MEAN):
  if p not in (1, 2):
    raise RuntimeError("only p == 1 and p == 2 supported")
  x = jnp.atleast_2d(self)
  t = jnp.atleast_1d(target)
  dim = x.shape[1]
  check((t < 0) | (t >= dim), t, RuntimeError, "target out of range")
  t = t[:, None]
  z = arithmetic.add(arithmetic.rsub(indexing.gather(x, 1, t), margin), x)
  z = arithmetic.clamp_min(z, 0)
  z = z if p == 1 else arithmetic.mul(z, z)
  if weight is not None:
    z = arithmetic.mul(z, jnp.atleast_1d(weight)[t])
  z = arithmetic.where(jnp.arange(dim) != t, z, 0)
  if reduction == _MEAN:
    return reduction_ops.mean_dim(z)
  if reduction == _SUM:
    return arithmetic.div(reduction_ops.sum_dim_IntList(z), dim)
  return reduction_ops.mean_dim(z, [1])


@lowering(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(self, target, reduction):
  x = jnp.atleast_2d(self)
  t = jnp.atleast_2d(target)
  dim = x.shape[1]
  # torch's CPU kernel checks every label, those after a -1 too
  check((t < -1) | (t >= dim), t, RuntimeError, "argument #2 'target' is out of range")
  idx = jnp.arange(dim)
  end = jnp.min(jnp.where(t == -1, idx, dim), axis=-1, keepdims=True)
  kept = idx < end
  u = indexing.gather(x, -1, jnp.where(kept, t, 0))
  is_target = jnp.any(idx == jnp.where(kept, t, -1)[..., None], axis=1)
  z = arithmetic.add(arithmetic.rsub(u.T[..., None], 1.0), x)
  z = arithmetic.div(arithmetic.clamp_min(z, 0), dim)
  z = arithmetic.where(is_target, 0, z)
  # (torch's decomposition stops here, and counts the labels at and after a -1 as class 0:
  # its CPU kernel, which this follows, leaves them out)
  z = arithmetic.where(kept.T[..., None], z, 0)
  if reduction == _MEAN:
    z = reduction_ops.mean_dim(reduction_ops.sum_dim_IntList(z, [0, -1]))
  elif reduction == _SUM:
    z = reduction_ops.sum_dim_IntList(z)
  else:
    z = reduction_ops.sum_dim_IntList(z, [0, -1])
  return z, is_target.astype(self.dtype).reshape(target.shape)


# --- chunked linear cross entropy (`F.linear_cross_entropy(..., options=...)`) ----------------


def _linear_ce_rows(input, linear_weight, linear_bias, target, weight, ignore_index):
  """(per-row loss `weight[t] * -log_softmax(input @ linear_weight.T + bias)[t]` (N,), the
  row weights (N,)). Ignored rows have weight 0 (an out-of-range `ignore_index` target reads
  class 0 instead).

  16-bit floats accumulate in float32, as torch does on CPU (`acc_policy="accurate"`,
  `acc_dtype=float32`); the ops' `acc_policy`, `acc_dtype` and `batch_chunk_size` only choose
  torch's buffers and rounding (on the `jax` device torch resolves them to the input dtype),
  so they are not followed: the rows are computed at once.
  """
  acc, _ = result_dtypes(input)
  logits = jnp.matmul(
    input.astype(acc), linear_weight.astype(acc).T, precision=jax.lax.Precision.HIGHEST
  )
  if linear_bias is not None:
    logits = logits + linear_bias.astype(acc)
  ignored = target == ignore_index
  safe = jnp.where(ignored, 0, target)
  # As torch: logits shifted by their row max, loss = log(sum(exp(shifted))) - shifted[t].
  shifted = logits - jax.lax.stop_gradient(jnp.max(logits, axis=1, keepdims=True))
  picked = jnp.take_along_axis(shifted, safe[:, None], axis=1)[:, 0]
  nll = jnp.log(jnp.sum(jnp.exp(shifted), axis=1)) - picked
  w = jnp.ones(target.shape, acc) if weight is None else weight.astype(acc)[safe]
  w = jnp.where(ignored, jnp.zeros((), acc), w)
  return w * nll, w


@lowering(
  torch_nn._linear_cross_entropy_batch_chunked.default, static_argnames=("label_smoothing",)
)
def _linear_cross_entropy_batch_chunked(
  input,
  linear_weight,
  target,
  linear_bias,
  weight,
  reduction,
  ignore_index,
  label_smoothing,
  batch_chunk_size,
  acc_policy,
  acc_dtype,
  allow_retain_graph,
  compute_input_grad,
  compute_linear_weight_grad,
  compute_linear_bias_grad,
):
  """The mean/sum chunked op: (loss, d loss/d input, d loss/d linear_weight, d loss/d bias),
  each gradient an empty (0, 0) / (0,) array unless its `compute_*` flag is set (torch's
  autograd scales them by the upstream gradient). `mean` divides by the summed row weights
  and is NaN when they sum to 0 (every target ignored, or an empty batch), as torch."""
  if label_smoothing != 0.0:
    raise NotImplementedError("linear_cross_entropy does not support label smoothing")
  if reduction not in ("mean", "sum"):
    raise NotImplementedError(f"linear_cross_entropy does not support {reduction=}")
  dtype = input.dtype

  def loss_of(x, lw, b):
    rows, w = _linear_ce_rows(x, lw, b, target, weight, ignore_index)
    if reduction == "sum":
      return jnp.sum(rows)
    d = jnp.sum(w)
    return jnp.sum(rows) / jnp.where(d == 0, jnp.nan, d)

  loss, vjp = jax.vjp(loss_of, input, linear_weight, linear_bias)
  grads = vjp(jnp.ones((), loss.dtype))
  gi = grads[0].astype(dtype) if compute_input_grad else jnp.zeros((0, 0), dtype)
  gw = grads[1].astype(dtype) if compute_linear_weight_grad else jnp.zeros((0, 0), dtype)
  gb = grads[2].astype(dtype) if compute_linear_bias_grad else jnp.zeros((0,), dtype)
  return loss.astype(dtype), gi, gw, gb


@lowering(torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default)
def _linear_cross_entropy_batch_chunked_no_reduction(
  input,
  linear_weight,
  target,
  linear_bias,
  weight,
  ignore_index,
  batch_chunk_size,
  acc_policy,
  acc_dtype,
):
  """The reduction='none' chunked op: the per-row loss (N,), 0 on ignored rows."""
  rows, _ = _linear_ce_rows(input, linear_weight, linear_bias, target, weight, ignore_index)
  return rows.astype(input.dtype)


# --- distances (`torch.cdist`, `F.pdist`: what metric losses and k-NN code build on) -----------


def _p_norm(diff, p, axis=-1):
  """torch's `cdist`/`pdist` p-norm of `diff` along `axis`, with its special cases of p.

  Gradients follow torch's backward: |x| has slope sign(x) (0 at 0, where JAX's `abs` has 1),
  and p = inf gives every tied maximum the whole gradient (JAX's `max` would share it).
  """
  a = diff * jnp.sign(diff)
  if p == 0:
    return jnp.sum((a != 0).astype(diff.dtype), axis=axis)
  if p == 1:
    return jnp.sum(a, axis=axis)
  if p == float("inf"):
    top = jax.lax.stop_gradient(jnp.max(a, axis=axis, keepdims=True, initial=0))
    ties = jnp.where(a == top, a - jax.lax.stop_gradient(a), jnp.zeros((), a.dtype))
    return jnp.squeeze(top, axis) + jnp.sum(ties, axis=axis)
  return p_norm(a, p, axis)


def _euclidean_dist(x1, x2):
  """torch's `_euclidean_dist` (the matrix-product form of the p=2 distance)."""
  x1_norm = jnp.sum(x1 * x1, axis=-1, keepdims=True)
  x2_norm = jnp.sum(x2 * x2, axis=-1, keepdims=True)
  x1_ = jnp.concatenate([-2 * x1, x1_norm, jnp.ones_like(x1_norm)], axis=-1)
  x2_ = jnp.concatenate([x2, jnp.ones_like(x2_norm), x2_norm], axis=-1)
  r = jnp.matmul(x1_, jnp.swapaxes(x2_, -1, -2), precision=jax.lax.Precision.HIGHEST)
  return jnp.sqrt(jnp.maximum(r, 1e-30))


@lowering(aten._cdist_forward.default, static_argnames=("p",))
def _cdist_forward(x1, x2, p, compute_mode=None):
  """Distances between the rows of `x1` (..., P, M) and `x2` (..., R, M). As torch, p = 2 uses
  the matrix-product form when `compute_mode` is 1, or 0/None and P or R exceeds 25."""
  mode = 0 if compute_mode is None else compute_mode
  batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
  x1 = jnp.broadcast_to(x1, batch + x1.shape[-2:])
  x2 = jnp.broadcast_to(x2, batch + x2.shape[-2:])
  if p == 2 and (mode == 1 or (mode == 0 and (x1.shape[-2] > 25 or x2.shape[-2] > 25))):
    return _euclidean_dist(x1, x2)
  return _p_norm(x1[..., :, None, :] - x2[..., None, :, :], p)


@lowering(aten._pdist_forward.default, static_argnames=("p",))
def _pdist_forward(self, p=2.0):
  """The distances between rows i < j of `self` (N, M), in row-major order of (i, j)."""
  i, j = np.triu_indices(self.shape[0], 1)
  return _p_norm(self[i] - self[j], p)


# --- CTC --------------------------------------------------------------------------------------


def _logsumexp(*xs):
  """log(sum(exp(x))) of same-shaped arrays; all -inf gives -inf with zero (not NaN) gradients."""
  x = jnp.stack(xs)
  m = jnp.max(x, axis=0)
  m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, jnp.zeros((), m.dtype)))
  s = jnp.sum(jnp.exp(x - m), axis=0)
  empty = s == 0
  return jnp.where(empty, -jnp.inf, jnp.log(jnp.where(empty, 1, s)) + m)


def _ctc_alpha(log_probs, labels, input_lengths, target_lengths, blank):
  """torch's CTC forward pass: (nll (N,), log_alpha (N, T, 2S+1)) for `labels` (N, S)."""
  t_max, n, _ = log_probs.shape
  ninf = jnp.full((), -jnp.inf, log_probs.dtype)
  ext = jnp.full((n, 2 * labels.shape[1] + 1), blank, labels.dtype).at[:, 1::2].set(labels)
  width = ext.shape[1]
  lp_ext = jnp.take_along_axis(log_probs, jnp.broadcast_to(ext[None], (t_max, n, width)), axis=2)
  pos = jnp.arange(width)
  prev2 = jnp.concatenate([jnp.full((n, 2), -1, ext.dtype), ext[:, :-2]], axis=1)
  skip = (ext != blank) & (pos >= 2) & (ext != prev2)
  in_len = input_lengths[:, None]
  first = jnp.where((pos == 0) | ((pos == 1) & (target_lengths[:, None] > 0)), lp_ext[0], ninf)

  def step(alpha, t):
    a1 = jnp.concatenate([jnp.full((n, 1), ninf), alpha[:, :-1]], axis=1)
    a2 = jnp.where(skip, jnp.concatenate([jnp.full((n, 2), ninf), alpha[:, :-2]], axis=1), ninf)
    new = _logsumexp(alpha, a1, a2) + lp_ext[t]
    new = jnp.where(t < in_len, new, alpha)  # past its input length a sample keeps its alpha
    return new, jnp.where(t < in_len, new, ninf)

  last, rest = scan(step, first, jnp.arange(1, t_max))
  history = jnp.concatenate([jnp.where(in_len > 0, first, ninf)[None], rest], axis=0)
  history = jnp.where(pos <= 2 * target_lengths[:, None], history, ninf)
  end = jnp.take_along_axis(last, (2 * target_lengths)[:, None], axis=1)[:, 0]
  before = jnp.take_along_axis(last, jnp.maximum(2 * target_lengths - 1, 0)[:, None], axis=1)[:, 0]
  before = jnp.where(target_lengths > 0, before, ninf)
  return -_logsumexp(end, before), jnp.moveaxis(history, 0, 1)


def _ctc_loss_impl(log_probs, targets, input_lengths, target_lengths, width, blank, zero_infinity):
  """`width`: the targets' padded length (log_alpha has 2 * width + 1 columns)."""
  in_len = jnp.reshape(jnp.asarray(input_lengths), (-1,)).astype(jnp.int32)
  tgt_len = jnp.reshape(jnp.asarray(target_lengths), (-1,)).astype(jnp.int32)
  cols = jnp.arange(width)
  if targets.ndim == 1 and targets.shape[0] == 0:
    labels = jnp.full((tgt_len.shape[0], width), blank, jnp.int32)
  elif targets.ndim == 1:  # concatenated targets: pad them to (N, width)
    starts = jnp.cumsum(tgt_len) - tgt_len
    idx = jnp.clip(starts[:, None] + cols, 0, targets.shape[0] - 1)
    labels = jnp.where(cols < tgt_len[:, None], targets[idx], blank)
  else:
    labels = targets[:, :width]
  labels = labels.astype(jnp.int32)
  batched = log_probs.ndim == 3
  lp = log_probs if batched else log_probs[:, None]
  labels = labels if labels.ndim == 2 else labels[None]

  # The integer arrays are arguments (not closed over): a custom_vjp's rules cannot capture
  # values traced outside them.
  @jax.custom_vjp
  def ctc(lp, labels, in_len, tgt_len):
    return _ctc_alpha(lp, labels, in_len, tgt_len, blank)

  def fwd(lp, labels, in_len, tgt_len):
    out = _ctc_alpha(lp, labels, in_len, tgt_len, blank)
    return out, (lp, labels, in_len, tgt_len, out[0])

  def bwd(res, cts):
    # torch's gradient is exp(log_probs) - posterior (the gradient with respect to the logits
    # of a log_softmax), where the exact derivative is -posterior; 0 past an input's length.
    lp, labels, in_len, tgt_len, nll = res
    g = cts[0]
    _, vjp = jax.vjp(lambda x: _ctc_alpha(x, labels, in_len, tgt_len, blank)[0], lp)
    grad = vjp(g)[0] + jnp.exp(lp) * g[None, :, None]
    live = jnp.arange(lp.shape[0])[:, None] < in_len[None, :]
    infinite = jnp.isinf(nll)[None, :]
    if zero_infinity:
      live = live & ~infinite
    else:  # torch: exp(-inf + inf) is NaN for an impossible alignment
      grad = jnp.where(infinite[..., None], jnp.nan, grad)
    return jnp.where(live[..., None], grad, jnp.zeros((), lp.dtype)), None, None, None

  ctc.defvjp(fwd, bwd)
  nll, log_alpha = ctc(lp, labels, in_len, tgt_len)
  if zero_infinity:
    nll = jnp.where(jnp.isinf(nll), jnp.zeros((), nll.dtype), nll)
  return (nll, log_alpha) if batched else (nll[0], log_alpha[0])


_CTC_WHERE = " (while checking arguments for ctc_loss_allocate_outputs)"


def _ctc_length_error(name, low, high=None):
  """torch's message for a length out of [low, high] (`value` the first such length)."""

  def message(value, position):
    if value < low:
      return f"Expected {name} to have value at least {low}, but got value {value}{_CTC_WHERE}"
    return f"Expected {name} to have value at most {high}, but got value {value}{_CTC_WHERE}"

  return message


def _check_ctc_arguments(log_probs, targets, input_lengths, target_lengths, blank):
  """torch's checks of `_ctc_loss`'s arguments, in its CPU kernel's order: the blank and the
  lengths' sizes (static), then the target lengths (>= 0, and the targets long enough for
  them), then each input length in [0, T]. Lengths given as lists (`_ctc_loss.default`) are
  known here and raise at once; as tensors they are values (`check`)."""
  if not 0 <= blank < log_probs.shape[-1]:
    raise RuntimeError("blank must be in label range")
  batched = log_probs.ndim == 3
  in_len = jnp.reshape(jnp.asarray(input_lengths), (-1,))
  tgt_len = jnp.reshape(jnp.asarray(target_lengths), (-1,))
  if batched:
    if in_len.shape[0] != log_probs.shape[1]:
      raise RuntimeError("input_lengths must be of size batch_size")
    if tgt_len.shape[0] != log_probs.shape[1]:
      raise RuntimeError("target_lengths must be of size batch_size")
  if tgt_len.size:
    check(tgt_len < 0, tgt_len, RuntimeError, _ctc_length_error("target_lengths", 0))
    if targets.ndim == 1:  # concatenated: exactly sum(target_lengths) labels
      total = jnp.sum(tgt_len)
      check(
        total != targets.shape[0],
        total,
        RuntimeError,
        f"Expected tensor to have size {{value}} at dimension 0, but got size "
        f"{targets.shape[0]} for argument #2 'targets'{_CTC_WHERE}",
      )
    elif targets.ndim == 2:
      longest = jnp.max(tgt_len)
      check(
        longest > targets.shape[1],
        longest,
        RuntimeError,
        f"Expected tensor to have size at least {{value}} at dimension 1, but got size "
        f"{targets.shape[1]} for argument #2 'targets'{_CTC_WHERE}",
      )
  if in_len.size:
    t_max = log_probs.shape[0]
    check(
      (in_len < 0) | (in_len > t_max),
      in_len,
      RuntimeError,
      _ctc_length_error("input_lengths", 0, t_max),
    )


@lowering(aten._ctc_loss.default)
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
  """torch's CTC loss (`F.ctc_loss` before its reduction), with torch's gradient."""
  _check_ctc_arguments(log_probs, targets, input_lengths, target_lengths, blank)
  width = max((int(v) for v in target_lengths), default=0)
  return _ctc_loss_impl(
    log_probs,
    targets,
    np.asarray(input_lengths, np.int64),
    np.asarray(target_lengths, np.int64),
    width,
    blank,
    zero_infinity,
  )


@lowering(aten._ctc_loss.Tensor, dynamic_shape=True)
def _ctc_loss_Tensor(
  log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False
):
  """`_ctc_loss` with the lengths as tensors. Eagerly log_alpha (the buffer torch's backward
  reads) is (N, T, 2 * max(target_lengths) + 1) as in torch; under `jax.jit` the lengths are
  not known, so it is padded to the targets' own width (the extra columns -inf, where torch
  leaves uninitialized memory). The loss is the same either way."""
  _check_ctc_arguments(log_probs, targets, input_lengths, target_lengths, blank)
  if isinstance(target_lengths, jax.core.Tracer):
    width = targets.shape[-1] if targets.ndim == 2 else targets.shape[0]
  else:
    width = int(np.max(np.asarray(target_lengths), initial=0))
  return _ctc_loss_impl(
    log_probs, targets, input_lengths, target_lengths, width, blank, zero_infinity
  )
