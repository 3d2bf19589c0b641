"""Gradients at kinks, ties, zeros and clamps follow torch autograd.

A lowering's derivative under `jax.grad` (through `call_torch`) and in a compiled module's
backward is JAX's derivative of the lowering, not torch's autograd formula. Away from
special points the two agree (the OpInfo run checks that on random inputs); at the points
below they can differ, and torch's choice is the one users' training depends on: no
gradient for |x| at 0 or for a std of 0 (a constant input), a max pool's gradient to one
tied element, a finite BCE gradient at an input of exactly 0 or 1 (a saturated sigmoid).
Each case compares `jax.grad` of the torch function on the given float64 point with torch
autograd there.
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge

F = torch.nn.functional


def _t(*values):
  return torch.tensor(values, dtype=torch.float64)


CASES = {
  # name: (torch function of a 1-d float64 tensor returning a scalar, point)
  "abs at 0": (lambda x: x.abs().sum(), [0.0, -1.0, 2.0]),
  "abs at nan": (lambda x: x.abs().sum(), [float("nan"), -1.0]),
  # the foreach forms build on the single-tensor lowerings and so inherit their rules
  "_foreach_abs at 0": (lambda x: torch._foreach_abs([x, 2 * x])[1].sum(), [0.0, -1.0, 2.0]),
  "relu at 0": (lambda x: F.relu(x).sum(), [0.0, 1.0, -1.0]),
  "leaky_relu at 0": (lambda x: F.leaky_relu(x, 0.1).sum(), [0.0, 1.0, -1.0]),
  "hardtanh at its bounds": (lambda x: F.hardtanh(x).sum(), [-1.0, 1.0, 0.0, 2.0]),
  "clamp at its bounds": (lambda x: x.clamp(-1, 1).sum(), [-1.0, 1.0, 0.0, 2.0]),
  "relu6 at its bounds": (lambda x: F.relu6(x).sum(), [0.0, 6.0, 3.0]),
  "hardsigmoid at +-3": (lambda x: F.hardsigmoid(x).sum(), [-3.0, 3.0, 0.0]),
  "hardswish at +-3": (lambda x: F.hardswish(x).sum(), [-3.0, 3.0, 0.0]),
  "vector_norm at 0": (lambda x: torch.linalg.vector_norm(x), [0.0, 0.0, 0.0]),
  "_foreach_norm at 0": (
    lambda x: sum(n for p in (2, 3, float("inf")) for n in torch._foreach_norm([x[:3], x], p)),
    [0.0, 0.0, 0.0, 3.0, -4.0],
  ),
  "normalize a zero row": (lambda x: F.normalize(x.reshape(1, -1)).sum(), [0.0, 0.0, 0.0]),
  "pdist of equal rows": (lambda x: F.pdist(x.reshape(2, 2)).sum(), [1.0, 2.0, 1.0, 2.0]),
  "pow with a zero base": (lambda x: torch.pow(torch.zeros(2, dtype=x.dtype), x).sum(), [2.0, 0.0]),
  "x ** 2 and x ** 0.5 at 0": (lambda x: (x**2.0).sum() + (x**0.5).sum(), [0.0, 1.0]),
  "xlogy at 0": (lambda x: torch.xlogy(x, x).sum(), [0.0, 1.0]),
  "xlogy with x = 0": (lambda x: torch.xlogy(x[:3], x[3:]).sum(), [0.0, 0.0, 0.0, 2.0, 0.0, -1.0]),
  "xlog1py with x = 0": (
    lambda x: torch.special.xlog1py(x[:3], x[3:]).sum(),
    [0.0, 0.0, 0.0, 2.0, -1.0, -0.5],
  ),
  "div with rounding by 0": (
    lambda x: (
      torch.div(x[:2], x[2:], rounding_mode="floor")
      + torch.div(x[:2], x[2:], rounding_mode="trunc")
    ).sum(),
    [1.0, 0.0, 0.0, 0.0],
  ),
  "remainder of inf": (
    lambda x: torch.remainder(x[:2], x[2:]).sum(),
    [float("inf"), 3.0, 1.0, 2.0],
  ),
  "huber and smooth_l1 at an infinite target": (
    lambda x: (
      F.huber_loss(x, _t(float("inf"), float("-inf"), 0.0), delta=2.0)
      + F.smooth_l1_loss(x, _t(float("inf"), float("-inf"), 0.0), beta=2.0)
    ),
    [0.0, 1.0, 0.5],
  ),
  "huber at a nan difference": (
    lambda x: F.huber_loss(x, _t(float("inf"), 0.0)),
    [float("inf"), 1.0],
  ),
  "renorm of a zero row": (
    lambda x: (torch.renorm(x.reshape(2, 2), 2, 0, 1.0) * _t(1, 2, 3, 4).reshape(2, 2)).sum(),
    [0.0, 0.0, 3.0, 4.0],
  ),
  "renorm p=3 of a zero row": (
    lambda x: torch.renorm(x.reshape(2, 2), 3, 0, 1.0).sum(),
    [0.0, 0.0, 3.0, 4.0],
  ),
  "embedding_bag max with ties": (
    lambda x: F.embedding_bag(
      torch.tensor([0, 1, 2]), x.reshape(3, 2), torch.tensor([0, 2]), mode="max"
    ).sum(),
    [1.0, 1.0, 1.0, 1.0, 0.0, 0.0],
  ),
  "det of singular matrices": (
    lambda x: torch.linalg.det(x.reshape(3, 2, 2)).sum(),
    [1.0, 2.0, 2.0, 4.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0],
  ),
  "angle of complex 0": (lambda x: torch.complex(x[:2], x[2:]).angle().sum(), [0.0, 1.0, 0.0, 1.0]),
  "atan2 at (0, 0)": (lambda x: torch.atan2(x, x).sum(), [0.0, 1.0]),
  "max with ties": (lambda x: x.max(), [1.0, 1.0, 0.0]),
  "max(dim) with ties": (lambda x: x.reshape(1, 3).max(dim=1).values.sum(), [1.0, 1.0, 0.0]),
  "amax with ties": (lambda x: x.amax(), [1.0, 1.0, 0.0]),
  "maximum with ties": (lambda x: torch.maximum(x, torch.ones_like(x)).sum(), [1.0, 2.0]),
  "sort with ties": (lambda x: (x.sort().values * _t(0, 1, 2)).sum(), [1.0, 1.0, 0.0]),
  "topk with ties": (lambda x: (x.topk(2).values * _t(1, 2)).sum(), [1.0, 1.0, 0.0]),
  "median with ties": (lambda x: x.median(), [1.0, 1.0, 0.0, 2.0]),
  "nanmedian with ties": (lambda x: x.nanmedian(), [1.0, float("nan"), 1.0, 0.0]),
  "median(dim) with ties": (
    lambda x: x.reshape(1, 4).median(dim=1).values.sum(),
    [1.0, 1.0, 0.0, 2.0],
  ),
  "std of a constant": (lambda x: x[:1].std(correction=0) + x.std(), [1.0, 1.0]),
  "std_mean of a constant": (lambda x: sum(torch.std_mean(x, correction=0)), [2.0, 2.0]),
  "sqrt at 0": (lambda x: torch.sqrt(x).sum(), [0.0, 4.0]),
  "sign": (lambda x: (x.sign() * x).sum(), [0.0, -2.0]),
  "smooth_l1 at beta": (
    lambda x: F.smooth_l1_loss(x, torch.zeros_like(x), beta=1.0),
    [1.0, -1.0, 0.5],
  ),
  "huber at delta": (lambda x: F.huber_loss(x, torch.zeros_like(x), delta=1.0), [1.0, -1.0]),
  "l1_loss at 0": (lambda x: F.l1_loss(x, x.detach()), [1.0, 2.0]),
  "logsumexp with -inf": (lambda x: torch.logsumexp(x, 0), [float("-inf"), 0.0]),
  "softplus at its threshold": (lambda x: F.softplus(x, beta=1, threshold=20).sum(), [20.0, 0.0]),
  "max_pool1d with ties": (
    lambda x: F.max_pool1d(x.reshape(1, 1, 4), 2).sum(),
    [1.0, 1.0, 2.0, 2.0],
  ),
  "max_pool2d with ties": (
    lambda x: (F.max_pool2d(x.reshape(1, 1, 2, 3), 2, 1) * _t(1, 2)).sum(),
    [1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
  ),
  "adaptive_max_pool1d with ties": (
    lambda x: F.adaptive_max_pool1d(x.reshape(1, 1, 4), 2).sum(),
    [3.0, 3.0, 0.0, 0.0],
  ),
  "prelu at 0": (lambda x: F.prelu(x, _t(0.25)).sum(), [0.0, -1.0]),
  "elu, celu, selu at 0": (lambda x: (F.elu(x) + F.celu(x) + F.selu(x)).sum(), [0.0]),
  "cumprod through 0": (lambda x: x.cumprod(0).sum(), [0.0, 2.0, 3.0]),
  "prod with one 0": (lambda x: x.prod(), [0.0, 2.0, 3.0]),
  "prod with two 0s": (lambda x: x.prod(), [0.0, 0.0, 3.0]),
  "sinc near 0": (lambda x: torch.sinc(x).sum(), [1e-200, 1e-20, -1e-9, 0.0, 0.5]),
  "logit at and outside [0, 1]": (lambda x: torch.logit(x).sum(), [0.0, 1.0, 2.0, -1.0, 0.3]),
  "logit with eps": (lambda x: torch.logit(x, 1e-3).sum(), [0.0, 1.0, 2.0, -1.0, 0.3, 1e-4]),
  "pow(x, x) at 0": (lambda x: torch.pow(x, x).sum(), [0.0, 0.5, 2.0]),
  "pow of a 0 base": (lambda x: torch.pow(torch.zeros_like(x), x).sum(), [-1.0, 0.0, 2.0]),
  "norm p=0.5 with a 0": (lambda x: x.norm(p=0.5), [0.0, 1.0, 4.0]),
  "norm of negative order with a 0": (
    lambda x: x.reshape(2, 3).norm(p=-1, dim=1).sum(),
    [0.0, 1.0, 4.0, 1.0, 2.0, 4.0],
  ),
  "norm of negative order, nan and 0": (lambda x: x.norm(p=-2), [0.0, float("nan"), 4.0]),
  "lgamma at +-0": (lambda x: torch.lgamma(x).sum(), [0.0, -0.0, 2.5, -1.5]),
  "mvlgamma at 0": (lambda x: torch.mvlgamma(x, 1).sum(), [0.0, 2.5]),
  "rsqrt at -0": (lambda x: torch.rsqrt(x).sum(), [-0.0, 0.0, 4.0]),
  "ndtri at 0 and 1": (lambda x: torch.special.ndtri(x).sum(), [0.0, 1.0, 0.3]),
  "mvlgamma at x <= (p-1)/2": (lambda x: torch.mvlgamma(x, 2).sum(), [-0.5, 0.3, 1.0, 3.0]),
  "matrix_norm at 0": (lambda x: torch.linalg.matrix_norm(x.reshape(2, 2)), [0.0, 0.0, 0.0, 0.0]),
  "kl_div with a 0 target": (lambda x: F.kl_div(x, _t(0.0, 1.0), reduction="sum"), [-1.0, -2.0]),
  "binary_cross_entropy at 0 and 1": (
    lambda x: F.binary_cross_entropy(x, _t(0.0, 1.0)),
    [0.0, 1.0],
  ),
  "binary_cross_entropy, target": (lambda x: F.binary_cross_entropy(_t(0.25, 0.5), x), [0.0, 1.0]),
  "cosine_similarity with a 0 vector": (
    lambda x: F.cosine_similarity(x.reshape(1, 2), _t(1.0, 0.0).reshape(1, 2)).sum(),
    [0.0, 0.0],
  ),
  "pairwise_distance of equal points": (
    lambda x: F.pairwise_distance(x[:2].reshape(1, 2), x[2:].reshape(1, 2)).sum(),
    [1.0, 1.0, 1.0, 1.0],
  ),
}


# float32 points where an exp in a lowering overflows (torch's formulas stay finite), or a
# square underflows, or JAX's rule goes through |x| at 0.
LARGE = {
  "sigmoid": (lambda x: torch.sigmoid(x).sum(), [100.0, -100.0, 0.5]),
  "silu": (lambda x: F.silu(x).sum(), [100.0, -100.0, 0.5]),
  "glu": (lambda x: F.glu(x, 0).sum(), [100.0, -100.0]),
  "elu": (lambda x: F.elu(x).sum(), [100.0, -100.0, 0.5]),
  "celu": (lambda x: F.celu(x, 2.0).sum(), [100.0, -100.0, -0.5]),
  "selu": (lambda x: F.selu(x).sum(), [100.0, -100.0]),
  "softplus": (lambda x: F.softplus(x).sum(), [100.0, -100.0, 0.5]),
  "softplus with beta": (
    lambda x: F.softplus(x, beta=2.0, threshold=5).sum(),
    [100.0, -100.0, 2.0],
  ),
  "mish": (lambda x: F.mish(x).sum(), [100.0, -100.0, 0.5]),
  "logsigmoid": (lambda x: F.logsigmoid(x).sum(), [100.0, -100.0]),
  "binary_cross_entropy_with_logits": (
    lambda x: F.binary_cross_entropy_with_logits(x, torch.tensor([1.0, 0.0])),
    [100.0, -100.0],
  ),
  "cross_entropy": (lambda x: F.cross_entropy(x.reshape(1, 2), torch.tensor([1])), [100.0, -100.0]),
  "log_softmax with -inf": (lambda x: F.log_softmax(x, 0)[1], [float("-inf"), 0.0, 1.0]),
  "norm p=1 at 0": (lambda x: x.norm(p=1), [0.0, 1.0]),
  "entr at 0": (lambda x: torch.special.entr(x).sum(), [0.0, 1.0, 0.5]),
  "i0, i0e, i1, i1e at 0": (
    lambda x: (
      torch.i0(x) + torch.special.i0e(x) + torch.special.i1(x) + torch.special.i1e(x)
    ).sum(),
    [0.0, 1.0, -3.0],
  ),
  "i0 where it overflows": (lambda x: torch.i0(x).sum(), [100.0, -100.0]),
  "hypot of tiny values": (
    lambda x: torch.hypot(x, torch.zeros_like(x)).sum(),
    [1e-30, -1e-30, 2.0],
  ),
  "hypot at (0, 0)": (lambda x: torch.hypot(x, torch.zeros_like(x)).sum(), [0.0, 1.0]),
  "copysign at 0": (lambda x: torch.copysign(x, -torch.ones_like(x)).sum(), [0.0, 2.0, -1.0]),
  "sinc near 0": (lambda x: torch.sinc(x).sum(), [1e-30, -1e-30, 1e-5, 0.0, 0.5, 3.0]),
  "logit at and outside [0, 1]": (lambda x: torch.logit(x).sum(), [0.0, 1.0, 2.0, -1.0, 0.3]),
  "exp2 where it overflows": (
    lambda x: torch.exp2(x).sum(),
    [1e10, float("inf"), float("-inf"), 3.5],
  ),
}


@pytest.mark.parametrize("name", list(LARGE))
def test_jax_grad_matches_torch_autograd_where_exp_overflows(name):
  fn, point = LARGE[name]
  x = torch.tensor(point, dtype=torch.float32, requires_grad=True)
  fn(x).backward()
  grad = jax.grad(bridge.jax_view(fn))(jnp.asarray(point, jnp.float32))
  assert np.isnan(np.asarray(grad)).sum() == x.grad.isnan().sum()  # NaN only where torch's is
  torch.testing.assert_close(torch.from_numpy(np.array(grad)), x.grad, equal_nan=True)


def test_second_derivatives_and_vmap_follow_torch():
  """The derivative rules are themselves differentiable (torch's double backward) and batch."""
  points = [-100.0, 0.0, 0.5, 3.0]
  for f in (torch.sigmoid, F.silu, torch.abs, F.hardswish):
    second = jax.vmap(jax.grad(jax.grad(bridge.jax_view(f))))(jnp.asarray(points, jnp.float32))
    x = torch.tensor(points, requires_grad=True)
    (g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    expected = torch.stack(
      [torch.autograd.grad(g[i], x, retain_graph=True)[0][i] for i in range(len(points))]
    )
    torch.testing.assert_close(torch.from_numpy(np.array(second)), expected, msg=str(f))


@pytest.mark.parametrize("name", list(CASES))
def test_jax_grad_matches_torch_autograd(name):
  fn, point = CASES[name]
  x = torch.tensor(point, dtype=torch.float64, requires_grad=True)
  fn(x).backward()
  with jax.enable_x64(True):
    grad = jax.grad(bridge.jax_view(fn))(jnp.asarray(point, jnp.float64))
  torch.testing.assert_close(torch.from_numpy(np.array(grad)), x.grad, equal_nan=True)


@pytest.mark.parametrize(
  "name",
  [
    "abs at 0",
    "hardswish at +-3",
    "std of a constant",
    "median with ties",
    "max_pool1d with ties",
    "binary_cross_entropy at 0 and 1",
  ],
)
def test_forward_mode_agrees(name):
  """`jax.jvp` uses the same derivatives: the JVP along a tangent is grad . tangent."""
  fn, point = CASES[name]
  x = torch.tensor(point, dtype=torch.float64, requires_grad=True)
  fn(x).backward()
  tangent = np.linspace(0.5, 1.5, len(point))
  with jax.enable_x64(True):
    _, jvp = jax.jvp(
      bridge.jax_view(fn), (jnp.asarray(point, jnp.float64),), (jnp.asarray(tangent),)
    )
  torch.testing.assert_close(
    torch.tensor(float(jvp), dtype=torch.float64), (x.grad * torch.from_numpy(tangent)).sum()
  )


def test_compiled_backward_sends_a_max_pools_gradient_to_one_tied_element():
  """A CNN whose max pool sees a flat (saturated) region: the compiled backward gives the
  first tied element the gradient, as torch does, instead of splitting it."""
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 1), torch.nn.MaxPool2d(2), torch.nn.Flatten())
  ref = copy.deepcopy(model)
  x = torch.zeros(1, 1, 4, 4)
  x[0, 0, 2:, 2:] = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
  x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
  weights = torch.arange(8.0).reshape(1, 8)
  (bridge.compile(model)(x1) * weights).sum().backward()
  (ref(x2) * weights).sum().backward()
  torch.testing.assert_close(x1.grad, x2.grad)
  torch.testing.assert_close(model[0].weight.grad, ref[0].weight.grad)


class _SigmoidBCE(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.lin = torch.nn.Linear(1, 1)

  def forward(self, x, y):
    p = torch.sigmoid(self.lin(x))
    return F.binary_cross_entropy(p, y), p


def test_compiled_backward_of_bce_on_a_saturated_sigmoid_is_finite():
  """sigmoid(20) is exactly 1.0 in float32: torch's BCE gradient stays finite there (a
  plain derivative of the clamped logs multiplies 0 by inf)."""
  model = _SigmoidBCE()
  with torch.no_grad():
    model.lin.weight.fill_(20.0)
    model.lin.bias.zero_()
  ref = copy.deepcopy(model)
  x, y = torch.tensor([[1.0], [-1.0], [0.1]]), torch.tensor([[1.0], [0.0], [1.0]])
  loss, p = bridge.compile(model)(x, y)
  assert p[0, 0].item() == 1.0  # the saturated case is reached
  loss.backward()
  ref(x, y)[0].backward()
  assert torch.isfinite(model.lin.weight.grad).all()
  torch.testing.assert_close(model.lin.weight.grad, ref.lin.weight.grad)
