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
@pytest.mark.parametrize(
  "op,extra",
  [(aten.mse_loss.default, ()), (aten.smooth_l1_loss.default, (0.5,))],
  ids=["mse", "smooth_l1"],
)
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
  hit = torch.zeros(shape, dtype=torch.bool).scatter_(class_dim, target.unsqueeze(class_dim), True)
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


@pytest.mark.parametrize("reduction", list(REDUCTIONS.values()))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_soft_margin_loss(reduction, dtype):
  g = _gen(3)
  x = (torch.randn(6, 5, generator=g) * 6).to(dtype)  # large enough that half `exp` overflows
  target = torch.where(torch.rand(6, 5, generator=g) > 0.5, 1.0, -1.0).to(dtype)
  check(aten.soft_margin_loss.default, x, target, reduction)


P_NORMS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")]


@pytest.mark.parametrize("p", P_NORMS)
@pytest.mark.parametrize(
  "shapes,mode",
  [
    (((2, 5, 4), (1, 6, 4)), None),
    (((30, 3), (7, 3)), None),  # > 25 rows: matmul form
    (((5, 3), (7, 3)), 1),
    (((30, 3), (7, 3)), 2),
    (((3, 0), (4, 0)), None),
  ],
)
def test_cdist_forward(p, shapes, mode):
  g = _gen(4)
  x1, x2 = (torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes)
  if x1.shape[-1]:
    x2[..., 0, :] = x1.reshape(-1, x1.shape[-1])[0]  # a zero distance
  check(aten._cdist_forward.default, x1, x2, p, mode)


@pytest.mark.parametrize("p", P_NORMS)
def test_pdist_forward(p):
  x = torch.randn(6, 4, generator=_gen(5), dtype=torch.float64)
  x[5] = x[1]
  check(aten._pdist_forward.default, x, p)


_CTC_TARGETS = torch.tensor([[1, 2, 2, 4], [3, 1, 4, 2], [4, 4, 1, 3]])
CTC_CASES = {  # (targets, input_lengths, target_lengths, kwargs)
  "padded": (_CTC_TARGETS, [12, 10, 7], [4, 3, 0], {}),
  "mean": (_CTC_TARGETS, [12, 10, 7], [4, 3, 1], {"reduction": "mean"}),
  "concatenated": (torch.tensor([1, 3, 3, 2, 4, 1, 2]), [12, 10, 7], [4, 3, 0], {}),
  "blank": (torch.tensor([[0, 1, 3], [3, 3, 3], [1, 0, 4]]), [12, 5, 7], [3, 3, 2], {"blank": 2}),
  "impossible": (
    torch.tensor([[1, 1, 1, 1], [1, 2, 3, 4], [1, 2, 3, 4]]),
    [12, 5, 3],
    [4, 4, 4],
    {},
  ),
  "impossible_zero_infinity": (
    torch.tensor([[1, 1, 1, 1], [1, 2, 3, 4], [1, 2, 3, 4]]),
    [12, 5, 3],
    [4, 4, 4],
    {"zero_infinity": True},
  ),
}


@pytest.mark.parametrize("case", list(CTC_CASES))
def test_ctc_loss_and_torch_gradient(case):
  """The loss, and torch's gradient (exp(log_probs) - posterior, not the exact derivative)."""
  import bridge
  import jax

  targets, input_lengths, target_lengths, kwargs = CTC_CASES[case]
  kwargs = {"reduction": "none", **kwargs}
  g = _gen(6)
  log_probs = torch.randn(12, 3, 5, generator=g, dtype=torch.float64).log_softmax(-1)

  def fn(lp):
    return torch.nn.functional.ctc_loss(lp, targets, input_lengths, target_lengths, **kwargs)

  x = log_probs.clone().requires_grad_()
  expected = fn(x)
  cot = torch.randn(expected.shape, generator=g, dtype=torch.float64)
  (expected_grad,) = torch.autograd.grad(expected, x, cot)
  with jax.enable_x64(True):
    out = bridge.to_torch(bridge.call_torch(fn, bridge.to_jax(log_probs)))
    grad = jax.grad(lambda a: (bridge.call_torch(fn, a) * bridge.to_jax(cot)).sum())(
      bridge.to_jax(log_probs)
    )
  torch.testing.assert_close(out, expected.detach(), equal_nan=True)
  torch.testing.assert_close(bridge.to_torch(grad), expected_grad, equal_nan=True)


@pytest.mark.parametrize(
  "targets", [_CTC_TARGETS, torch.tensor([1, 3, 3, 2, 4, 1, 2])], ids=["padded", "concatenated"]
)
def test_ctc_loss_tensor_lengths_under_jit(targets):
  """Tensor lengths (`_ctc_loss.Tensor`) are traced under `jax.jit`: the loss still matches."""
  import bridge
  import jax

  log_probs = torch.randn(12, 3, 5, generator=_gen(7), dtype=torch.float64).log_softmax(-1)
  lengths = (torch.tensor([12, 10, 7]), torch.tensor([4, 3, 0]))
  expected = torch.nn.functional.ctc_loss(log_probs, targets, *lengths, reduction="none")

  def fn(lp, il, tl):
    return torch.nn.functional.ctc_loss(lp, targets, il, tl, reduction="none")

  with jax.enable_x64(True):
    out = jax.jit(lambda *a: bridge.call_torch(fn, *a))(
      bridge.to_jax(log_probs), *(bridge.to_jax(t) for t in lengths)
    )
  torch.testing.assert_close(bridge.to_torch(out), expected)


# --- chunked linear cross entropy (`F.linear_cross_entropy(..., options=...)`) ----------------

_LCE = (
  torch.ops.torch_nn
)  # defined by torch.nn.modules.linear_cross_entropy (bridge_ops imports it)


def _lce_args(n, ignore_index, weighted, biased, all_ignored, dtype, g):
  """(input (n, 5), linear_weight (4, 5), target (n,), linear_bias, weight) with some targets
  equal to `ignore_index` (all of them for `all_ignored`)."""
  import torch.nn.modules.linear_cross_entropy

  x, lw = _randn((n, 5), dtype, g), _randn((4, 5), dtype, g)
  target = torch.randint(0, 4, (n,), generator=g)
  target[::3] = ignore_index
  if all_ignored:
    target.fill_(ignore_index)
  b = _randn((4,), dtype, g) if biased else None
  w = torch.rand(4, dtype=dtype, generator=g) + 0.5 if weighted else None
  return x, lw, target, b, w


# id: (batch, ignore_index, weighted, biased, every target ignored)
LCE = {
  "plain": (6, -100, False, False, False),
  "ignore_in_range": (7, 1, False, True, False),
  "weight_bias": (6, -100, True, True, False),
  "weight_ignore": (8, 2, True, False, False),
  "all_ignored": (4, 0, True, True, True),  # mean: 0 / 0 = NaN, gradients too
  "empty": (0, -100, False, True, False),
}


@pytest.mark.parametrize("grads", [True, False], ids=["grads", "loss_only"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("name", LCE)
def test_linear_cross_entropy_batch_chunked(name, reduction, grads):
  n, ignore_index, weighted, biased, all_ignored = LCE[name]
  x, lw, target, b, w = _lce_args(
    n, ignore_index, weighted, biased, all_ignored, torch.float64, _gen(8)
  )
  check(
    _LCE._linear_cross_entropy_batch_chunked.default,
    x,
    lw,
    target,
    b,
    w,
    reduction,
    ignore_index,
    0.0,
    2,
    "compact",
    torch.float64,
    True,
    grads,
    grads,
    grads and biased,
  )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", LCE)
def test_linear_cross_entropy_batch_chunked_no_reduction(name, dtype):
  n, ignore_index, weighted, biased, all_ignored = LCE[name]
  x, lw, target, b, w = _lce_args(n, ignore_index, weighted, biased, all_ignored, dtype, _gen(9))
  check(
    _LCE._linear_cross_entropy_batch_chunked_no_reduction.default,
    x,
    lw,
    target,
    b,
    w,
    ignore_index,
    3,
    "compact",
    dtype,
  )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_linear_cross_entropy_chunked_half_accumulates_in_float32(reduction):
  """float16 inputs with torch CPU's float32 accumulation (`acc_policy="accurate"`)."""
  x, lw, target, b, w = _lce_args(9, 1, True, True, False, torch.float16, _gen(10))
  if reduction == "none":
    check(
      _LCE._linear_cross_entropy_batch_chunked_no_reduction.default,
      x,
      lw,
      target,
      b,
      w,
      1,
      2,
      "accurate",
      torch.float32,
    )
  else:  # the loss only: torch rounds its float16 gradients chunk by chunk
    check(
      _LCE._linear_cross_entropy_batch_chunked.default,
      x,
      lw,
      target,
      b,
      w,
      reduction,
      1,
      0.0,
      2,
      "accurate",
      torch.float32,
      False,
      False,
      False,
      False,
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_linear_cross_entropy_chunked_gradient(reduction):
  """`jax.grad` through `F.linear_cross_entropy(..., options=...)` against torch autograd."""
  import bridge
  import jax

  x, lw, target, b, w = _lce_args(7, 2, True, True, False, torch.float64, _gen(11))
  options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=3)

  def fn(x, lw, b):
    return torch.nn.functional.linear_cross_entropy(
      x, lw, target, linear_bias=b, weight=w, ignore_index=2, reduction=reduction, options=options
    )

  ins = [t.clone().requires_grad_() for t in (x, lw, b)]
  expected = fn(*ins)
  cot = torch.randn(expected.shape, generator=_gen(12), dtype=torch.float64)
  expected_grads = torch.autograd.grad(expected, ins, cot)
  with jax.enable_x64(True):
    out = bridge.to_torch(bridge.call_torch(fn, *(bridge.to_jax(t) for t in (x, lw, b))))
    grads = jax.grad(
      lambda *a: (bridge.call_torch(fn, *a) * bridge.to_jax(cot)).sum(), argnums=(0, 1, 2)
    )(*(bridge.to_jax(t) for t in (x, lw, b)))
  torch.testing.assert_close(out, expected.detach())
  for got, want in zip(grads, expected_grads):
    torch.testing.assert_close(bridge.to_torch(got), want)
