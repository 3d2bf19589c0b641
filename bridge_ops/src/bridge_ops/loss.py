"""Lowerings of the LOSS family.

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

`reduction` is torch's enum: 0 none, 1 mean, 2 sum.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bridge_ops._lowering import aten, lowering, promote

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


@lowering(aten.huber_loss.default)
@promote("self", "target")
def huber_loss(self, target, reduction=_MEAN, delta=1.0):
  z = jnp.abs(self - target)
  return _reduce(jnp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta)), reduction)


@lowering(aten.smooth_l1_loss.default)
@promote("self", "target")
def smooth_l1_loss(self, target, reduction=_MEAN, beta=1.0):
  z = jnp.abs(self - target)
  # beta == 0 is the L1 loss: `z < 0` never holds, and the quadratic branch divides by 1
  # instead of 0 (`beta` may be traced: no Python branch on it).
  safe_beta = beta + (beta == 0)
  return _reduce(jnp.where(z < beta, 0.5 * z * z / safe_beta, z - 0.5 * beta), reduction)


@lowering(aten.binary_cross_entropy.default)
@promote("self", "target", "weight")
def binary_cross_entropy(self, target, weight=None, reduction=_MEAN):
  # torch clamps both logs at -100, so an input of exactly 0 or 1 gives a finite loss.
  loss = ((target - 1) * jnp.maximum(jnp.log1p(-self), -100.0)
          - target * jnp.maximum(jnp.log(self), -100.0))
  if weight is not None:
    loss = loss * weight
  return _reduce(loss, reduction)


@lowering(aten.binary_cross_entropy_with_logits.default)
@promote("self", "target", "weight", "pos_weight")
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None,
                                     reduction=_MEAN):
  log_sigmoid = jax.nn.log_sigmoid(self)  # min(x, 0) - log1p(exp(-|x|)), as torch's
  if pos_weight is not None:
    log_sigmoid = ((pos_weight - 1) * target + 1) * log_sigmoid
  loss = (1 - target) * self - log_sigmoid
  if weight is not None:
    loss = loss * weight
  return _reduce(loss, reduction)


def _nll(logp, target, weight, reduction, ignore_index):
  """`logp` (..., C) with the classes last, `target` (...): (output, total_weight) as torch."""
  target = target.astype(jnp.int64)
  ignored = target == ignore_index
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
