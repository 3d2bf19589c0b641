"""LOSS family: loss lowerings against torch on CPU."""

from __future__ import annotations

import pytest
import torch

from tests.ops.harness import check

aten = torch.ops.aten

DTYPES = [torch.float32, torch.float64]
REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}
SHAPES = [(4, 5), (2, 3, 4), (7,)]


def _gen(seed: int = 0) -> torch.Generator:
  return torch.Generator().manual_seed(seed)


def _randn(shape, dtype, g):
  return torch.randn(shape, dtype=dtype, generator=g)


def _probs(shape, dtype, g):
  """Probabilities, with exact 0s and 1s (torch clamps the logs at -100)."""
  p = torch.rand(shape, dtype=dtype, generator=g)
  flat = p.view(-1)
  flat[:2] = torch.tensor([0.0, 1.0], dtype=dtype)[: flat.numel()]
  return p


def _regression(op, *extra):
  return lambda shape, dtype, g: (op, (_randn(shape, dtype, g), _randn(shape, dtype, g)), extra)


def _bce(weighted):
  def make(shape, dtype, g):
    x, t = _probs(shape, dtype, g), torch.rand(shape, dtype=dtype, generator=g)
    w = torch.rand(shape[-1:], dtype=dtype, generator=g) if weighted else None  # broadcast
    return aten.binary_cross_entropy.default, (x, t, w), ()
  return make


def _bce_logits(weighted, pos_weighted):
  def make(shape, dtype, g):
    x = _randn(shape, dtype, g) * 10
    x.view(-1)[:2] = torch.tensor([100.0, -100.0], dtype=dtype)[: x.numel()]  # saturated logits
    t = torch.rand(shape, dtype=dtype, generator=g)
    w = torch.rand(shape[-1:], dtype=dtype, generator=g) if weighted else None
    pw = torch.rand(shape[-1:], dtype=dtype, generator=g) * 3 if pos_weighted else None
    return aten.binary_cross_entropy_with_logits.default, (x, t, w, pw), ()
  return make


# id -> maker(shape, dtype, generator) -> (op, tensors, args after `reduction`)
POINTWISE = {
    "mse": _regression(aten.mse_loss.default),
    "huber": _regression(aten.huber_loss.default, 1.0),
    "huber_delta": _regression(aten.huber_loss.default, 0.3),
    "smooth_l1": _regression(aten.smooth_l1_loss.default, 1.0),
    "smooth_l1_beta": _regression(aten.smooth_l1_loss.default, 0.5),
    "smooth_l1_beta0": _regression(aten.smooth_l1_loss.default, 0.0),  # the L1 loss
    "bce": _bce(False),
    "bce_weight": _bce(True),
    "bce_logits": _bce_logits(False, False),
    "bce_logits_weight": _bce_logits(True, False),
    "bce_logits_pos_weight": _bce_logits(False, True),
    "bce_logits_both": _bce_logits(True, True),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS.values(), ids=REDUCTIONS.keys())
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", POINTWISE)
def test_pointwise_loss(name, shape, reduction, dtype):
  op, tensors, extra = POINTWISE[name](shape, dtype, _gen())
  check(op, *tensors, reduction, *extra)


# Mixed float32/float64 arguments compute in float64. (Not huber_loss: its CPU kernel returns
# `self`'s dtype while its meta kernel, which the core follows, promotes.)
@pytest.mark.parametrize("op,extra", [(aten.mse_loss.default, ()),
                                      (aten.smooth_l1_loss.default, (0.5,))],
                         ids=["mse", "smooth_l1"])
def test_regression_loss_promotes(op, extra):
  g = _gen()
  check(op, _randn((3, 4), torch.float32, g), _randn((3, 4), torch.float64, g), 1, *extra)


def _nll_args(shape, weighted, ignore_index, all_ignored, dtype, g):
  """(log-probabilities, target, weight); the classes are dim 1 (dim 0 for a 1-D input)."""
  class_dim = 1 if len(shape) > 1 else 0
  c = shape[class_dim]
  logp = torch.log_softmax(_randn(shape, dtype, g), dim=class_dim)
  target = torch.randint(0, c, shape[:1] + shape[2:] if class_dim else (), generator=g)
  if all_ignored:
    target.fill_(ignore_index)
  # A -inf log-probability at an ignored target must still give exactly 0, not NaN.
  hit = torch.zeros(shape, dtype=torch.bool).scatter_(
      class_dim, target.unsqueeze(class_dim), True)
  logp = logp.masked_fill(hit & (target == ignore_index).unsqueeze(class_dim), float("-inf"))
  w = torch.rand(c, dtype=dtype, generator=g) + 0.1 if weighted else None
  return logp, target, w


# id: (op, input shape, weighted, ignore_index, every target ignored)
NLL = {
    "plain": (aten.nll_loss_forward.default, (6, 5), False, -100, False),
    "weight": (aten.nll_loss_forward.default, (6, 5), True, -100, False),
    "ignore": (aten.nll_loss_forward.default, (8, 3), False, 1, False),
    "weight_ignore": (aten.nll_loss_forward.default, (8, 3), True, 2, False),
    "all_ignored": (aten.nll_loss_forward.default, (4, 3), True, 0, True),  # mean: 0 / 0 = NaN
    "1d": (aten.nll_loss_forward.default, (5,), True, -100, False),
    "1d_ignored": (aten.nll_loss_forward.default, (5,), False, 2, True),
    "2d": (aten.nll_loss2d_forward.default, (2, 5, 3, 4), False, -100, False),
    "2d_weight_ignore": (aten.nll_loss2d_forward.default, (3, 4, 5, 2), True, 1, False),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS.values(), ids=REDUCTIONS.keys())
@pytest.mark.parametrize("name", NLL)
def test_nll_loss(name, reduction, dtype):
  op, shape, weighted, ignore_index, all_ignored = NLL[name]
  logp, target, weight = _nll_args(shape, weighted, ignore_index, all_ignored, dtype, _gen())
  check(op, logp, target, weight, reduction, ignore_index)
