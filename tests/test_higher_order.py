"""torch's higher-order operators in `torch.compile(..., backend="jax")` graphs: `torch.cond`,
`while_loop`, `scan` and `map` as JAX's own control flow (one program holds both branches, a loop
runs as a loop), and `flex_attention`; checked against eager torch: values, gradients, dtypes,
random ops inside."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch._higher_order_ops import scan, while_loop
from torch._higher_order_ops.map import map as torch_map

import bridge
from bridge._src.dispatch import higher_order


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class Gate(torch.nn.Module):
  """A layer whose second half runs only when the first half's output sums positive."""

  def __init__(self):
    super().__init__()
    self.a, self.b = torch.nn.Linear(8, 4), torch.nn.Linear(4, 4)

  def forward(self, x):
    h = self.a(x)
    return torch.cond(h.sum() > 0, lambda t: self.b(t).tanh() * 2, lambda t: t - 1, (h,))


def test_cond_picks_the_branch_by_value_in_one_program_with_torchs_gradients():
  torch.manual_seed(0)
  eager = Gate()
  model = copy.deepcopy(eager)
  compiled = torch.compile(model, backend="jax")
  picked = set()
  programs = []
  for sign in (1.0, -1.0, 1.0, -1.0):
    programs.append(bridge.compile_stats().programs)
    x = torch.randn(5, 8) * sign
    picked.add(bool(eager.a(x).sum() > 0))
    with torch.no_grad():
      torch.testing.assert_close(compiled(x), eager(x))
    eager.zero_grad()
    model.zero_grad()
    eager(x).pow(2).sum().backward()
    compiled(x).pow(2).sum().backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
      torch.testing.assert_close(p.grad, q.grad, msg=name)
  assert picked == {True, False}  # both branches taken, each matching torch
  # the first step compiled the inference, forward and backward programs; the other branch
  # is in them: a value picks it inside the program
  assert programs[1] == programs[-1] == bridge.compile_stats().programs == 3


def test_cond_keeps_integer_dtypes_and_a_cpu_scalar_operand():
  def f(x, k):
    return torch.cond(x.sum() > 0, lambda t, s: (t * s).long(), lambda t, s: t.long() - 1, (x, k))

  compiled = torch.compile(f, backend="jax", fullgraph=True)
  for sign in (1.0, -1.0):
    x = torch.randn(6) * 4 * sign
    out = compiled(x, torch.tensor(3.0))
    assert out.dtype == torch.int64
    torch.testing.assert_close(out, f(x, torch.tensor(3.0)))


def test_while_loop_runs_its_data_dependent_trip_count_in_one_program():
  def f(x, n):
    return while_loop(lambda i, y: i < n, lambda i, y: (i + 1, y * 2 + 1), (torch.tensor(0), x))

  compiled = torch.compile(f, backend="jax", fullgraph=True)
  x = torch.randn(3)
  for n in (5, 0, 2):
    got = compiled(x, torch.tensor(n))
    want = f(x, torch.tensor(n))
    torch.testing.assert_close(got, want)
    assert got[0].dtype == torch.int64
  assert bridge.compile_stats().programs == 1


def test_scan_forward_and_gradients_match_torch():
  def combine(c, x):
    nc = c * 0.5 + x
    return nc.clone(), nc.sin()

  def f(init, xs):
    return scan(combine, init, xs)

  compiled = torch.compile(f, backend="jax", fullgraph=True)
  init, xs = torch.randn(4), torch.randn(6, 4)
  leaves = [(init.clone().requires_grad_(), xs.clone().requires_grad_()) for _ in range(2)]
  outs = [fn(*args) for fn, args in zip((f, compiled), leaves)]
  torch.testing.assert_close(outs[1], outs[0])
  for carry, ys in outs:
    (carry.sum() + ys.pow(2).sum()).backward()
  for got, want in zip(leaves[1], leaves[0]):
    torch.testing.assert_close(got.grad, want.grad)


def test_map_forward_and_gradients_match_torch():
  w = torch.randn(4, requires_grad=True)

  def f(xs, y):
    return torch_map(lambda x, y: (x * y + w).relu(), xs, y)

  compiled = torch.compile(f, backend="jax", fullgraph=True)
  xs, y = torch.randn(5, 4), torch.randn(4)
  torch.testing.assert_close(compiled(xs, y), f(xs, y))
  compiled(xs, y).sum().backward()
  got = w.grad.clone()
  w.grad = None
  f(xs, y).sum().backward()
  torch.testing.assert_close(got, w.grad)


def test_random_ops_inside_a_branch_draw_from_torchs_generator():
  def f(x):
    return torch.cond(
      x.sum() > 0, lambda t: torch.nn.functional.dropout(t, 0.5), lambda t: t - 1, (x,)
    )

  compiled = torch.compile(f, backend="jax", fullgraph=True)
  x = torch.ones(4000)
  torch.manual_seed(3)
  first, second = compiled(x), compiled(x)
  torch.manual_seed(3)
  torch.testing.assert_close(compiled(x), first)  # reproducible under the seed
  assert not torch.equal(first, second)  # a new mask each call
  for out in (first, second):
    assert set(out.unique().tolist()) <= {0.0, 2.0}
    assert 0.45 < (out == 0).float().mean().item() < 0.55
  torch.testing.assert_close(compiled(-x), -x - 1)


def test_random_ops_in_a_loop_body_draw_anew_each_iteration():
  def f(x, n):
    return while_loop(
      lambda i, y: i < n,
      lambda i, y: (i + 1, y + torch.rand(y.shape)),
      (torch.tensor(0), x),
    )

  compiled = torch.compile(f, backend="jax", fullgraph=True)
  _, one = compiled(torch.zeros(2000), torch.tensor(1))
  _, three = compiled(torch.zeros(2000), torch.tensor(3))
  assert 0.45 < one.mean().item() < 0.55
  assert 1.4 < three.mean().item() < 1.6  # three draws summed, not one draw three times
  assert 0.2 < three.var().item() < 0.3  # three independent uniforms: 3/12


def test_flex_attention_with_a_score_mod_a_block_mask_and_grouped_heads():
  from torch.nn.attention.flex_attention import create_block_mask, flex_attention

  bias = torch.randn(4)
  mask = create_block_mask(lambda b, h, q, k: q >= k, None, None, 32, 32, device="cpu")

  def attend(q, k, v):
    return flex_attention(
      q, k, v, score_mod=lambda s, b, h, q, k: s + bias[h], block_mask=mask, enable_gqa=True
    )

  def with_lse(q, k, v):
    return flex_attention(q, k, v, return_lse=True)

  q, k = torch.randn(2, 4, 32, 8), torch.randn(2, 2, 32, 8)
  with torch.no_grad(), warnings.catch_warnings():
    warnings.simplefilter("ignore")  # (torch: flex_attention run eagerly is unfused)
    torch.testing.assert_close(torch.compile(attend, backend="jax")(q, k, k), attend(q, k, k))
    torch.testing.assert_close(torch.compile(with_lse, backend="jax")(q, q, q), with_lse(q, q, q))


def test_a_nested_compile_region_runs_in_the_program_with_torchs_gradients():
  @torch.compiler.nested_compile_region
  def block(x, w):
    return (x @ w).relu()

  def f(x, w):
    return block(block(x, w), w).sum(0)

  x, w = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
  got = torch.compile(f, backend="jax")(x, w)
  torch.testing.assert_close(got, f(x, w))
  grads = torch.autograd.grad(got.sum(), (x, w))
  torch.testing.assert_close(grads, torch.autograd.grad(f(x, w).sum(), (x, w)))


def test_the_operators_are_registered_for_bridge_tensors():
  for op in higher_order.IMPLEMENTATIONS:
    assert bridge.Tensor in op.python_key_table, op


def _two_dropouts(x):
  h = torch.nn.functional.dropout(x, 0.5, training=True)
  return h, torch.nn.functional.dropout(h * 2 + 1, 0.5, training=True)


def test_checkpointing_replays_the_forwards_random_numbers_in_the_backward():
  # aot_autograd writes a checkpointed dropout as `run_and_save_rng_state` (forward) and
  # `run_with_rng_state` (backward); the first call failed with "'NotImplementedType' object
  # is not subscriptable". The backward recomputes both masks: the gradient is the one the
  # forward's masks give (each output > 0 where kept: x > 0).
  f = torch.compile(
    lambda x: torch.utils.checkpoint.checkpoint(_two_dropouts, x, use_reentrant=False),
    backend="jax",
  )
  masks = []
  for _ in range(2):
    x = (torch.rand(2000) + 1).requires_grad_()
    h, y = f(x)
    (h.sum() + y.sum()).backward()
    m1, m2 = (h != 0).float(), (y != 0).float()
    torch.testing.assert_close(x.grad, 2 * m1 * (1 + 4 * m2))
    assert 0.4 < m1.mean() < 0.6 and 0.4 < m2.mean() < 0.6
    masks.append(m1)
  assert not torch.equal(*masks)  # new masks each call


def test_a_checkpointed_dropouts_gradient_matches_its_forward_mask():
  def f(x):
    return torch.utils.checkpoint.checkpoint(
      lambda t: torch.nn.functional.dropout(t, 0.5, training=True) * 3, x, use_reentrant=False
    )

  g = torch.compile(f, backend="jax")
  for _ in range(3):
    x = (torch.rand(1000) + 1).requires_grad_()
    y = g(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, (y != 0).float() * 6)  # (1/(1-p) = 2, times 3)
    assert 0.4 < (y != 0).float().mean() < 0.6
