"""Gradients of gradients through `call_jax` and `bridge.compile`, and the life of the residuals.

A backward recorded by torch (`create_graph=True`: gradient penalties, double backprop,
MAML's inner step, Hessian-vector products) is itself a differentiable JAX call, to any
order; a backward that does not retain the graph releases JAX's residuals, and a second
one raises torch's own error.
"""

from __future__ import annotations

import copy
import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from bridge._src import call_jax as call_jax_lib


@pytest.fixture(autouse=True)
def _x64_and_fresh_cache():
  call_jax_lib.clear_cache()
  with jax.enable_x64(True):
    yield
  call_jax_lib.clear_cache()


def _gen() -> torch.Generator:
  return torch.Generator().manual_seed(0)


def _t(*shape, g, dtype=torch.float64, low=None):
  t = torch.randn(*shape, generator=g, dtype=dtype)
  if low is not None:
    t = t.abs() + low
  return t.requires_grad_()


# (name, JAX function, torch inputs): each checked by gradcheck and gradgradcheck in float64
FUNCTIONS = [
  (
    "tanh_matmul",
    lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2),
    lambda g: (_t(3, 2, g=g), _t(4, 3, g=g)),
  ),
  ("sin_times", lambda x, y: jnp.sin(x) * y, lambda g: (_t(5, g=g), _t(5, g=g))),
  ("softmax", lambda x: jax.nn.softmax(x, axis=-1), lambda g: (_t(3, 4, g=g),)),
  ("logsumexp", lambda x: jax.nn.logsumexp(x, axis=0), lambda g: (_t(4, 3, g=g),)),
  (
    "rms_norm",
    lambda x, s: x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * s,
    lambda g: (_t(2, 6, g=g), _t(6, g=g)),
  ),
  (
    "gelu_mlp",
    lambda x, w1, w2: jax.nn.gelu(x @ w1) @ w2,
    lambda g: (_t(3, 4, g=g), _t(4, 5, g=g), _t(5, 2, g=g)),
  ),
  ("log_pow", lambda x: jnp.log(x) ** 3 + x**2.5, lambda g: (_t(4, g=g, low=0.5),)),
  (
    "solve",
    lambda a, b: jnp.linalg.solve(a + 4 * jnp.eye(3), b),
    lambda g: (_t(3, 3, g=g), _t(3, 2, g=g)),
  ),
  (
    "pytree_outputs",
    lambda p, x: {"y": jnp.cos(x @ p["w"]), "n": jnp.argmax(x), "z": [x * p["b"]]},
    lambda g: ({"w": _t(3, 3, g=g), "b": _t(3, g=g)}, _t(2, 3, g=g)),
  ),
  ("complex", lambda z: jnp.sin(z) * jnp.conj(z), lambda g: (_t(4, g=g, dtype=torch.complex128),)),
  ("cumsum_sort", lambda x: jnp.cumsum(jnp.sort(x) ** 2), lambda g: (_t(6, g=g),)),
  (
    "scan",
    lambda x: jax.lax.scan(lambda c, a: (jnp.tanh(c * a), c), 1.0, x)[0],
    lambda g: (_t(5, g=g),),
  ),
]


def _tensor_leaves(tree):
  return [t for t in jax.tree_util.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _as_tensor_fn(fn, example):
  """`fn` on the example's structure as a function of its tensor leaves, float outputs only."""
  leaves, treedef = jax.tree_util.tree_flatten(example)

  def run(*tensors):
    out = bridge.call_jax(fn, *treedef.unflatten(list(tensors)))
    return tuple(
      o for o in jax.tree_util.tree_leaves(out) if o.is_floating_point() or o.is_complex()
    )

  return run, leaves


@pytest.mark.parametrize("name,fn,make", FUNCTIONS, ids=[f[0] for f in FUNCTIONS])
def test_gradgradcheck(name, fn, make):
  del name
  run, inputs = _as_tensor_fn(fn, make(_gen()))
  assert torch.autograd.gradcheck(run, inputs)
  assert torch.autograd.gradgradcheck(run, inputs)


def test_gradient_of_gradient_has_a_graph():
  """The bug this fixes: the gradient came back with no `grad_fn`, so a penalty on it
  trained on a wrong (missing) gradient without any error."""
  w, x = _t(3, 2, g=_gen()), _t(4, 3, g=_gen())
  (gx,) = torch.autograd.grad(bridge.call_jax(FUNCTIONS[0][1], w, x), x, create_graph=True)
  assert gx.grad_fn is not None and gx.requires_grad
  penalty = gx.pow(2).sum()
  gw_bridge = torch.autograd.grad(penalty, w)[0]
  w2, x2 = w.detach().requires_grad_(), x.detach().requires_grad_()
  (gx2,) = torch.autograd.grad(torch.tanh(x2 @ w2).pow(2).sum(), x2, create_graph=True)
  torch.testing.assert_close(gw_bridge, torch.autograd.grad(gx2.pow(2).sum(), w2)[0])


def test_third_and_fourth_order():
  x = torch.tensor([0.7, -1.3], dtype=torch.float64, requires_grad=True)
  xt = x.detach().requires_grad_()
  ours, theirs = bridge.call_jax(lambda x: jnp.sin(x) ** 3, x), torch.sin(xt) ** 3
  for _ in range(4):
    (ours,) = torch.autograd.grad(ours.sum(), x, create_graph=True)
    (theirs,) = torch.autograd.grad(theirs.sum(), xt, create_graph=True)
    torch.testing.assert_close(ours, theirs)
    assert ours.grad_fn is not None


def test_hessian_vector_product_and_functional_hessian():
  f = lambda x: jnp.sum(jnp.exp(x[:-1] * x[1:]))
  x = _t(4, g=_gen())
  ours = torch.autograd.functional.hessian(lambda x: bridge.call_jax(f, x), x)
  theirs = torch.autograd.functional.hessian(lambda x: torch.exp(x[:-1] * x[1:]).sum(), x)
  torch.testing.assert_close(ours, theirs)
  v = torch.randn(4, dtype=torch.float64, generator=_gen())
  _, hvp = torch.autograd.functional.hvp(lambda x: bridge.call_jax(f, x), x, v)
  torch.testing.assert_close(hvp, theirs @ v)


def test_double_backward_on_the_jax_device():
  x = _t(4, 3, g=_gen()).detach().to("jax").requires_grad_()
  y = bridge.call_jax(lambda x: jnp.sum(jnp.sin(x) ** 2), x)
  (g,) = torch.autograd.grad(y, x, create_graph=True)
  assert g.device.type == "jax" and g.grad_fn is not None
  g.sum().backward()
  assert x.grad.device.type == "jax"
  torch.testing.assert_close(x.grad.cpu(), 2 * torch.cos(2 * x.detach().cpu()))


def _penalty(model, x):
  """WGAN-GP's gradient penalty plus the output: a loss whose backward differentiates a
  backward."""
  y = model(x)
  (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
  return (g.norm(dim=1) - 1).pow(2).mean() + y.mean()


MODULES = [
  (
    "mlp",
    lambda: torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)),
  ),
  (
    "layernorm_gelu",
    lambda: torch.nn.Sequential(
      torch.nn.Linear(3, 6), torch.nn.LayerNorm(6), torch.nn.GELU(), torch.nn.Linear(6, 2)
    ),
  ),
  (
    "conv",
    lambda: torch.nn.Sequential(
      torch.nn.Unflatten(1, (1, 3)),
      torch.nn.Conv1d(1, 2, 2),
      torch.nn.Softplus(),
      torch.nn.Flatten(),
      torch.nn.Linear(4, 1),
    ),
  ),
]


@pytest.mark.parametrize("device", ["cpu", "jax"])
@pytest.mark.parametrize("name,make", MODULES, ids=[m[0] for m in MODULES])
def test_compiled_module_gradient_penalty(name, make, device):
  del name
  torch.manual_seed(0)
  eager = make().double()
  net = copy.deepcopy(eager).to(device)
  compiled = bridge.compile(net)
  x = torch.randn(5, 3, dtype=torch.float64)
  _penalty(compiled, x.to(device).requires_grad_()).backward()
  _penalty(eager, x.clone().requires_grad_()).backward()
  for (pname, p), q in zip(net.named_parameters(), eager.parameters()):
    assert p.grad is not None, pname
    torch.testing.assert_close(p.grad.cpu(), q.grad, msg=pname)
  xc = x.clone().requires_grad_()
  if device == "cpu":
    assert torch.autograd.gradgradcheck(compiled, (xc,))


def test_once_differentiable_function_raises_at_the_second_order():
  """A custom VJP whose backward JAX cannot differentiate (a host callback): the first
  order works, the second is an error, never zeros."""

  @jax.custom_vjp
  def f(x):
    return jnp.sin(x)

  def bwd(x, g):
    cos = jax.pure_callback(np.cos, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return (g * cos,)

  f.defvjp(lambda x: (jnp.sin(x), x), bwd)
  x = torch.tensor([0.3, 0.5], dtype=torch.float64, requires_grad=True)
  (g,) = torch.autograd.grad(bridge.call_jax(f, x).sum(), x, create_graph=True)
  torch.testing.assert_close(g, torch.cos(x.detach()))
  with pytest.raises(
    bridge.BridgeError, match=r"through the backward of `.*f`.*cannot differentiate"
  ):
    g.sum().backward()


# --- the residuals' lifetime --------------------------------------------------------------


def test_second_backward_without_retain_graph_raises_as_torch():
  x = _t(3, g=_gen())
  y = bridge.call_jax(lambda x: jnp.sum(x**2), x)
  y.backward()
  with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
    y.backward()
  torch.testing.assert_close(x.grad, 2 * x.detach())  # accumulated once


def test_retain_graph_then_release():
  x = _t(3, g=_gen())
  y = bridge.call_jax(lambda x: jnp.sum(x**2), x)
  y.backward(retain_graph=True)
  y.backward()
  torch.testing.assert_close(x.grad, 4 * x.detach())
  with pytest.raises(RuntimeError, match="backward through the graph a second time"):
    y.backward()


def test_residuals_are_released_by_the_backward():
  x = torch.randn(256, 256, requires_grad=True)
  gc.collect()
  before = {id(a) for a in jax.live_arrays()}
  y = bridge.call_jax(lambda x: jnp.sum(jnp.sin(x) * jnp.exp(x)), x)  # residuals: cos, exp, ..
  kept = [a for a in jax.live_arrays() if id(a) not in before and a.size >= 256 * 256]
  assert kept, "the forward should keep residuals of the input's size"
  del kept
  (gx,) = torch.autograd.grad(y, x)
  del gx  # (its tensor holds the gradient's array)
  gc.collect()
  left = [a for a in jax.live_arrays() if id(a) not in before and a.size >= 256 * 256]
  assert not left, f"{len(left)} residual arrays outlive the backward while `y` lives"
  assert y.requires_grad  # the output itself is untouched


def test_backward_after_an_input_changed_in_place_raises_as_torch():
  """The residuals may alias the input's memory (zero-copy): torch's version check refuses
  the backward instead of differentiating at the new values."""
  x = torch.randn(4, requires_grad=True)
  w = torch.randn(4)
  y = bridge.call_jax(lambda x, w: jnp.sum(x * w), x, w)
  w.add_(1.0)
  with pytest.raises(RuntimeError, match="modified by an inplace operation"):
    y.backward()
