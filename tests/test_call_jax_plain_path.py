"""`call_jax(f, x, w, ...)` on positional plain CPU tensors, once `f` has an entry: the short
path (no general sorting of the arguments), with and without autograd, keeps every promise of
the general one: values, gradients of any order, non-differentiable integer outputs, torch's
errors for a changed input and a second backward, and the general path for what it cannot take.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch

import bridge
from bridge._src import call_jax as call_jax_lib
from bridge._src.errors import BridgeTypeError


@pytest.fixture(autouse=True)
def _fresh_cache():
  call_jax_lib.clear_cache()
  yield
  call_jax_lib.clear_cache()


@pytest.fixture
def no_general_path(monkeypatch):
  """After it is entered, a call that sorts its arguments the general way fails the test."""

  def refuse(args, kwargs):
    raise AssertionError("call_jax took the general path")

  def enter():
    monkeypatch.setattr(call_jax_lib, "_leaves", refuse)

  return enter


def _jf(x, w):
  return jnp.tanh(x @ w) * x.sum()


def _tf(x, w):
  return torch.tanh(x @ w) * x.sum()


def _inputs(grads=(True, True)):
  g = torch.Generator().manual_seed(0)
  x = torch.randn(3, 4, generator=g).requires_grad_(grads[0])
  w = torch.randn(4, 4, generator=g).requires_grad_(grads[1])
  return x, w


@pytest.mark.parametrize("grads", [(True, True), (True, False), (False, True)])
def test_gradients_on_the_short_path_equal_torch(grads, no_general_path):
  x, w = _inputs(grads)
  bridge.call_jax(_jf, x, w)  # the first call makes the entry
  no_general_path()
  y = bridge.call_jax(_jf, x, w)
  expected = _tf(x, w)
  torch.testing.assert_close(y, expected)
  assert y.requires_grad
  wanted = [t for t in (x, w) if t.requires_grad]
  got = torch.autograd.grad(y.square().sum(), wanted)
  want = torch.autograd.grad(expected.square().sum(), wanted)
  for a, b in zip(got, want):
    torch.testing.assert_close(a, b)


def test_second_order_on_the_short_path(no_general_path):
  x, w = _inputs()
  bridge.call_jax(_jf, x, w)
  no_general_path()
  (gx,) = torch.autograd.grad(bridge.call_jax(_jf, x, w).sum(), x, create_graph=True)
  (want_gx,) = torch.autograd.grad(_tf(x, w).sum(), x, create_graph=True)
  torch.testing.assert_close(gx, want_gx)
  # (a second derivative of float32 math: XLA's and torch's roundings differ by a few ulps)
  torch.testing.assert_close(
    torch.autograd.grad(gx.square().sum(), w)[0],
    torch.autograd.grad(want_gx.square().sum(), w)[0],
    rtol=1e-4,
    atol=1e-4,
  )


def test_no_grad_on_the_short_path(no_general_path):
  x, w = _inputs()
  bridge.call_jax(_jf, x, w)
  no_general_path()
  with torch.no_grad():
    y = bridge.call_jax(_jf, x, w)
  assert not y.requires_grad and y.grad_fn is None
  torch.testing.assert_close(y, _tf(x, w).detach())


def test_integer_and_tuple_outputs_on_the_short_path(no_general_path):
  def f(x, w):
    return jnp.argmax(x @ w, axis=1), (jnp.sin(x), w * 2)

  x, w = _inputs()
  bridge.call_jax(f, x, w)
  no_general_path()
  idx, (s, w2) = bridge.call_jax(f, x, w)
  assert idx.dtype == torch.int32 and not idx.requires_grad
  torch.testing.assert_close(idx, torch.argmax(x @ w, dim=1).to(torch.int32))
  (s.sum() + w2.sum()).backward()
  torch.testing.assert_close(x.grad, torch.cos(x.detach()))
  torch.testing.assert_close(w.grad, torch.full_like(w, 2.0))


def test_an_input_changed_in_place_before_the_backward_is_refused(no_general_path):
  x, w = _inputs((False, True))
  bridge.call_jax(_jf, x, w)
  no_general_path()
  y = bridge.call_jax(_jf, x, w)
  with torch.no_grad():
    w.add_(1)
  with pytest.raises(RuntimeError, match="modified by an inplace operation"):
    y.sum().backward()


def test_a_second_backward_is_refused(no_general_path):
  x, w = _inputs()
  bridge.call_jax(_jf, x, w)
  no_general_path()
  y = bridge.call_jax(_jf, x, w).sum()
  y.backward()
  with pytest.raises(RuntimeError, match="backward through the graph a second time"):
    y.backward()


def test_what_the_short_path_cannot_take_goes_the_general_way():
  x, w = _inputs()
  bridge.call_jax(_jf, x, w)
  # a transposed (non-contiguous) tensor, and a bfloat16 one, are converted the general way
  wt = w.detach().t().contiguous().t().requires_grad_()
  torch.testing.assert_close(bridge.call_jax(_jf, x, wt), _tf(x, wt))
  xb, wb = x.detach().bfloat16(), w.detach().bfloat16()
  bridge.call_jax(_jf, xb, wb)
  torch.testing.assert_close(bridge.call_jax(_jf, xb, wb), _tf(xb, wb), atol=0.05, rtol=0.05)


def test_64_bit_tensors_are_refused_on_the_second_call_too():
  f = lambda a, b: a + b
  x = torch.ones(2)
  bridge.call_jax(f, x, x)
  with pytest.raises(BridgeTypeError, match="64-bit"):
    bridge.call_jax(f, torch.ones(2, dtype=torch.float64), x)


def test_forward_mode_tangents_still_flow_after_the_entry_exists():
  import torch.autograd.forward_ad as fwAD

  x, w = _inputs((False, False))
  bridge.call_jax(_jf, x, w)
  with fwAD.dual_level():
    dual = fwAD.make_dual(x, torch.ones_like(x))
    tangent = fwAD.unpack_dual(bridge.call_jax(_jf, dual, w)).tangent
    want = fwAD.unpack_dual(_tf(dual, w)).tangent
  torch.testing.assert_close(tangent, want)


def test_torch_func_transforms_are_still_refused():
  f = lambda a, b: jnp.sum(a * b)
  x = torch.ones(3)
  bridge.call_jax(f, x, x)
  with pytest.raises(BridgeTypeError, match="torch.func"):
    torch.func.grad(lambda a: bridge.call_jax(f, a, x))(x)


def test_a_jitted_function_takes_the_short_path_too(no_general_path):
  jf = jax.jit(_jf)
  x, w = _inputs()
  bridge.call_jax(jf, x, w)
  no_general_path()
  y = bridge.call_jax(jf, x, w)
  y.sum().backward()
  x2, w2 = _inputs()
  _tf(x2, w2).sum().backward()
  torch.testing.assert_close(x.grad, x2.grad)
  torch.testing.assert_close(w.grad, w2.grad)
