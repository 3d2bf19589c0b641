"""torch's errors for bad values of loss, embedding_bag and activation arguments (binary
cross-entropy outside [0, 1], CTC lengths, huber/smooth_l1/celu scalars, embedding_bag
offsets, margin-loss targets), on the `jax` device and in compiled programs, against torch on
CPU; valid arguments keep torch's values."""

from __future__ import annotations

import re

import jax
import pytest
import torch
import torch.nn.functional as F

import bridge
from tests.ops.harness import assert_raises_like_cpu, error_message

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

nan = float("nan")


def _t(v, d, **kw):
  return torch.tensor(v, device=d, **kw)


def _lp(d):
  return torch.zeros(5, 2, 4).log_softmax(2).to(d)


def _tg(d):
  return _t([[1, 2], [1, 1]], d)


def _ctc(d, inputs, targets, tensors=True, tg=_tg, **kw):
  if tensors:
    inputs, targets = _t(inputs, d), _t(targets, d)
  return F.ctc_loss(_lp(d), tg(d), inputs, targets, **kw)


def _bag(d, offsets, dtype=torch.float32, **kw):
  weight = torch.arange(6.0, dtype=dtype).reshape(3, 2).to(d)
  return F.embedding_bag(_t([0, 1], d), weight, _t(offsets, d), **kw)


# name -> op on device `d`; torch on CPU raises for each (its type and message here too).
RAISES = {
  "bce_target_above_1": lambda d: F.binary_cross_entropy(_t([0.5], d), _t([1.5], d)),
  "bce_target_negative": lambda d: F.binary_cross_entropy(_t([0.5], d), _t([-0.5], d)),
  "bce_target_nan": lambda d: F.binary_cross_entropy(_t([0.5], d), _t([nan], d)),
  "bce_input_above_1": lambda d: F.binary_cross_entropy(_t([1.5], d), _t([1.0], d)),
  "bce_input_negative": lambda d: F.binary_cross_entropy(_t([-0.5], d), _t([1.0], d)),
  "bce_input_nan": lambda d: F.binary_cross_entropy(_t([nan], d), _t([1.0], d)),
  "bce_first_bad_element_wins": lambda d: F.binary_cross_entropy(
    _t([0.5, 1.5], d), _t([1.5, 0.5], d)
  ),
  "bce_module_float64": lambda d: torch.nn.BCELoss()(
    _t([0.5, 0.2], d, dtype=torch.float64), _t([1.0, 2.0], d, dtype=torch.float64)
  ),
  "ctc_input_length_too_long": lambda d: _ctc(d, [6, 5], [2, 2]),
  "ctc_input_length_negative": lambda d: _ctc(d, [-1, 5], [2, 2]),
  "ctc_target_length_too_long": lambda d: _ctc(d, [5, 5], [3, 2]),
  "ctc_target_length_negative": lambda d: _ctc(d, [5, 5], [-1, 2]),
  "ctc_blank_out_of_range": lambda d: _ctc(d, [5, 5], [2, 2], blank=4),
  "ctc_input_lengths_size": lambda d: _ctc(d, [5], [2, 2]),
  "ctc_target_lengths_size": lambda d: _ctc(d, [5, 5], [2]),
  "ctc_concatenated_targets_short": lambda d: _ctc(
    d, [5, 5], [2, 2], tg=lambda d: _t([1, 2, 1], d)
  ),
  "huber_delta_0": lambda d: F.huber_loss(_t([1.0], d), _t([2.0], d), delta=0.0),
  "huber_delta_negative": lambda d: F.huber_loss(_t([1.0], d), _t([2.0], d), delta=-1.0),
  "smooth_l1_beta_negative": lambda d: F.smooth_l1_loss(_t([1.0], d), _t([3.0], d), beta=-1.0),
  "bag_first_offset_not_0": lambda d: _bag(d, [1]),
  "bag_first_offset_not_0_max": lambda d: _bag(d, [1], mode="max"),
  "bag_last_offset_past_end": lambda d: _bag(d, [0, 5]),
  "bag_last_offset_past_end_float64": lambda d: _bag(d, [0, 3], torch.float64),
  "bag_include_last_offset_past_end": lambda d: _bag(d, [0, 1, 5], include_last_offset=True),
  "bag_decreasing_offsets": lambda d: _bag(d, [0, 2, 1]),
  "bag_decreasing_offsets_mean": lambda d: _bag(d, [0, 2, 1], mode="mean"),
  "bag_decreasing_last_offset": lambda d: _bag(d, [0, 2, 1], include_last_offset=True),
  "bag_negative_offset": lambda d: _bag(d, [0, -1], mode="mean"),
  "bag_negative_offset_max": lambda d: _bag(d, [0, -1], mode="max"),
  "bag_negative_offset_float64": lambda d: _bag(d, [0, -1], torch.float64),
  "celu_alpha_0": lambda d: F.celu(_t([1.0, -1.0], d), alpha=0.0),
  "multi_margin_target_too_large": lambda d: F.multi_margin_loss(
    torch.zeros(2, 3, device=d), _t([0, 3], d)
  ),
  "multi_margin_target_negative": lambda d: F.multi_margin_loss(
    torch.zeros(2, 3, device=d), _t([0, -1], d)
  ),
  "multilabel_margin_target_too_large": lambda d: F.multilabel_margin_loss(
    torch.zeros(1, 3, device=d), _t([[5, -1, 0]], d)
  ),
  "multilabel_margin_target_below_minus_1": lambda d: F.multilabel_margin_loss(
    torch.zeros(1, 3, device=d), _t([[-2, -1, 0]], d)
  ),
  "multilabel_margin_bad_label_after_end": lambda d: F.multilabel_margin_loss(
    torch.zeros(1, 3, device=d), _t([[0, -1, 5]], d)
  ),
}


@pytest.mark.parametrize("name", list(RAISES))
def test_raises_torchs_error(name):
  assert_raises_like_cpu(RAISES[name])


# name -> (fn of CPU tensors, its arguments): values checked inside a compiled program only with
# `bridge.config(check_indices=True)`, with torch's message.
COMPILED = {
  "bce_target": (F.binary_cross_entropy, (torch.tensor([0.5, 0.2]), torch.tensor([1.0, 1.5]))),
  "bce_input": (F.binary_cross_entropy, (torch.tensor([0.5, nan]), torch.tensor([1.0, 0.5]))),
  "ctc_input_lengths": (
    lambda lp, i, t: F.ctc_loss(lp, torch.tensor([[1, 2], [1, 1]]), i, t),
    (torch.zeros(5, 2, 4).log_softmax(2), torch.tensor([6, 5]), torch.tensor([2, 2])),
  ),
  "ctc_target_lengths": (
    lambda lp, i, t: F.ctc_loss(lp, torch.tensor([[1, 2], [1, 1]]), i, t),
    (torch.zeros(5, 2, 4).log_softmax(2), torch.tensor([5, 5]), torch.tensor([3, 2])),
  ),
  "bag_offsets": (
    lambda w, o: F.embedding_bag(torch.tensor([0, 1]), w, o),
    (torch.ones(3, 2), torch.tensor([1])),
  ),
  "multi_margin": (F.multi_margin_loss, (torch.zeros(2, 3), torch.tensor([0, 3]))),
}


@pytest.mark.parametrize("name", list(COMPILED))
def test_bridge_compile_with_check_indices_raises_torchserror_message(name):
  fn, args = COMPILED[name]
  with pytest.raises(RuntimeError) as expected:
    fn(*args)
  with bridge.config(check_indices=True):
    with pytest.raises((jax.errors.JaxRuntimeError, RuntimeError, IndexError)) as info:
      jax.block_until_ready(bridge.compile(fn)(*args))
  assert error_message(expected.value) in str(info.value)


# Python scalars torch refuses: raised while the program is traced, with or without the setting.
COMPILED_SCALARS = {
  "huber": lambda x, y: F.huber_loss(x, y, delta=0.0),
  "smooth_l1": lambda x, y: F.smooth_l1_loss(x, y, beta=-0.5),
  "celu": lambda x, y: F.celu(x, alpha=0.0) + y,
}


@pytest.mark.parametrize("name", list(COMPILED_SCALARS))
def test_bridge_compile_raises_torchs_error_for_a_scalar(name):
  fn, args = COMPILED_SCALARS[name], (torch.tensor([1.0, -2.0]), torch.tensor([2.0, 0.5]))
  with pytest.raises(RuntimeError) as expected:
    fn(*args)
  with pytest.raises(RuntimeError, match=re.escape(error_message(expected.value))):
    bridge.compile(fn)(*args)


# Valid arguments: torch's values (and the checks pass them eagerly and in compiled programs).
def _x(d):
  return torch.tensor([[0.3, -1.2, 2.0], [0.5, 0.1, -0.7]], device=d)


VALID = {
  "bce_edges": lambda d: F.binary_cross_entropy(
    _t([0.0, 1.0, 0.25, 0.75], d), _t([0.0, 1.0, 1.0, 0.0], d), reduction="none"
  ),
  "ctc_tensor_lengths": lambda d: _ctc(d, [5, 3], [2, 0], reduction="none"),
  "ctc_concatenated": lambda d: _ctc(d, [5, 4], [2, 1], tg=lambda d: _t([1, 2, 3], d)),
  "huber": lambda d: F.huber_loss(_x(d), _x(d) * 0.2, delta=0.5, reduction="none"),
  "smooth_l1_beta_0": lambda d: F.smooth_l1_loss(_x(d), _x(d) * 0.2, beta=0.0),
  "smooth_l1": lambda d: F.smooth_l1_loss(_x(d), _x(d) * 0.2, beta=0.7, reduction="sum"),
  "bag_sum": lambda d: _bag(d, [0, 1, 2]),
  "bag_include_last": lambda d: _bag(d, [0, 1, 1], include_last_offset=True, mode="mean"),
  "bag_max_empty_bags": lambda d: _bag(d, [0, 0, 2], mode="max"),
  "celu": lambda d: F.celu(_x(d), alpha=0.5),
  "celu_negative_alpha": lambda d: F.celu(_x(d), alpha=-1.5),
  "multi_margin": lambda d: F.multi_margin_loss(_x(d), _t([2, 0], d), p=2, margin=0.5),
  "multi_margin_weight": lambda d: F.multi_margin_loss(
    _x(d), _t([1, 2], d), weight=_t([0.5, 1.0, 2.0], d), reduction="none"
  ),
  "multilabel_margin": lambda d: F.multilabel_margin_loss(
    _x(d), _t([[2, -1, 1], [0, 1, -1]], d), reduction="sum"
  ),
}


@pytest.mark.parametrize("name", list(VALID))
def test_valid_arguments_keep_torchs_values(name):
  expected = VALID[name]("cpu")
  got = VALID[name]("jax")
  torch.testing.assert_close(got.cpu(), expected, rtol=1e-6, atol=1e-6)
