"""Custom `torch.autograd.Function`s in traced torch code keep their own backward.

JAX's derivatives of `call_torch`, `extract_jax` functions and `bridge.compile` use a
Function's `backward`, as torch autograd does, not the derivative of its traced forward.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch.autograd.function import once_differentiable

import bridge


class Reverse(torch.autograd.Function):
  """Gradient reversal: identity forward, backward -scale * g (a non-tensor on ctx)."""

  @staticmethod
  def forward(ctx, x, scale):
    ctx.scale = scale
    return x.clone()

  @staticmethod
  def backward(ctx, g):
    return -ctx.scale * g, None


class RoundSTE(torch.autograd.Function):
  """Straight-through rounding: its forward's own derivative is 0 almost everywhere."""

  @staticmethod
  def forward(ctx, x):
    return torch.round(x)

  @staticmethod
  def backward(ctx, g):
    return g


class SquareAndArgmax(torch.autograd.Function):
  """New-style (setup_context), a saved input, a non-differentiable integer output, and a
  backward that is not the forward's derivative (3x instead of 2x)."""

  @staticmethod
  def forward(x):
    return x * x, x.argmax()

  @staticmethod
  def setup_context(ctx, inputs, output):
    (x,) = inputs
    ctx.save_for_backward(x)
    ctx.mark_non_differentiable(output[1])

  @staticmethod
  def backward(ctx, g, g_index):
    (x,) = ctx.saved_tensors
    assert g_index is not None and g_index.shape == ()  # materialized zeros
    return 3 * x * g


class ScaleBroadcast(torch.autograd.Function):
  """Two tensor inputs; the gradient of `w` comes back in the output's shape (torch sums it
  to `w`'s shape) and is doubled; an output saved for backward."""

  @staticmethod
  def forward(ctx, x, w):
    y = x * w
    ctx.save_for_backward(y, w)
    return y

  @staticmethod
  def backward(ctx, g):
    y, w = ctx.saved_tensors
    return g * w, 2 * g * y / w


class OnceDifferentiable(torch.autograd.Function):
  @staticmethod
  def forward(ctx, x):
    ctx.save_for_backward(x)
    return x.exp()

  @staticmethod
  @once_differentiable
  def backward(ctx, g):
    (x,) = ctx.saved_tensors
    return g * 10 * x


def model(x):
  y = Reverse.apply(x, 0.5) * 2 + RoundSTE.apply(x * 3)
  y = y + SquareAndArgmax.apply(x)[0]
  y = y + ScaleBroadcast.apply(x.reshape(2, 3), torch.linspace(0.5, 1.5, 3)).reshape(-1)
  return (y + OnceDifferentiable.apply(x)).sum()


def torch_grad(fn, x):
  t = torch.tensor(np.asarray(x), requires_grad=True)
  fn(t).backward()
  return t.grad


X = jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32)


@pytest.mark.parametrize("transform", ["grad", "jit_grad", "vjp", "value_and_grad"])
def test_jax_derivatives_use_the_functions_backward(transform):
  want = torch_grad(model, X)
  f = lambda a: bridge.call_torch(model, a)
  if transform == "grad":
    got = jax.grad(f)(X)
  elif transform == "jit_grad":
    got = jax.jit(jax.grad(f))(X)
  elif transform == "vjp":
    value, pullback = jax.vjp(f, X)
    (got,) = pullback(jnp.ones_like(value))
  else:
    value, got = jax.value_and_grad(f)(X)
    np.testing.assert_allclose(
      np.asarray(value), model(torch.tensor(np.asarray(X))).item(), rtol=1e-6
    )
  torch.testing.assert_close(torch.tensor(np.asarray(got)), want)


def test_per_example_gradients_under_vmap():
  xs = jnp.stack([X, X[::-1] * 0.5])
  got = jax.vmap(jax.grad(lambda a: bridge.call_torch(model, a)))(xs)
  for row, x in zip(np.asarray(got), np.asarray(xs)):
    torch.testing.assert_close(torch.tensor(row), torch_grad(model, x))


def test_second_derivatives_go_through_the_backward():
  """The backward is traced torch code, so JAX differentiates it again (reverse over
  reverse); forward mode fails as in torch, where a Function needs a `jvp` method."""

  def f(a):
    return bridge.call_torch(lambda x: SquareAndArgmax.apply(x)[0].sum(), a)

  hess = jax.jacrev(jax.grad(f))(X)
  np.testing.assert_allclose(np.asarray(hess), 3 * np.eye(6), rtol=1e-6)  # d(3x)/dx
  with pytest.raises(TypeError, match="forward-mode"):
    jax.jvp(f, (X,), (jnp.ones_like(X),))


def test_compiled_backward_uses_the_functions_backward():
  class Net(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.fc = torch.nn.Linear(3, 4)

    def forward(self, x):
      h = self.fc(x)
      return (RoundSTE.apply(h * 4) ** 2).sum() + Reverse.apply(h, 2.0).sum()

  torch.manual_seed(0)
  net = Net()
  x = torch.randn(5, 3)
  net(x).backward()
  want = [p.grad.clone() for p in net.parameters()]
  net.zero_grad()
  bridge.compile(net)(x).backward()
  for p, w in zip(net.parameters(), want):
    torch.testing.assert_close(p.grad, w)


def test_extract_jax_gradients_use_the_backward():
  class Net(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.fc = torch.nn.Linear(3, 3)

    def forward(self, x):
      return Reverse.apply(self.fc(x), 1.0).pow(2).sum()

  torch.manual_seed(0)
  net = Net()
  x = torch.randn(2, 3)
  params, fn = bridge.extract_jax(net)
  got = jax.grad(fn)(params, jnp.asarray(x.numpy()))
  net(x).backward()
  torch.testing.assert_close(torch.tensor(np.asarray(got["fc.weight"])), net.fc.weight.grad)


def test_torch_autograd_inside_the_traced_code_runs_the_backward_itself():
  def f(x):
    x = x.detach().requires_grad_()
    (g,) = torch.autograd.grad(Reverse.apply(x, 3.0).sum(), x)
    return g

  got = jax.jit(lambda a: bridge.call_torch(f, a))(X)
  np.testing.assert_allclose(np.asarray(got), -3 * np.ones(6))


def test_a_forward_reading_a_traced_value_it_was_not_given_is_differentiated_as_traced():
  """JAX cannot give a custom rule a derivative for closed-over values: the forward's own
  derivative is used, so the closed-over parameter still gets its gradient."""

  class UsesModule(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, module):
      return x * module.weight

    @staticmethod
    def backward(ctx, g):
      raise AssertionError("not used")

  class Net(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.weight = torch.nn.Parameter(torch.full((3,), 2.0))

    def forward(self, x):
      return UsesModule.apply(x, self).sum()

  params, fn = bridge.extract_jax(Net())
  got = jax.grad(fn)(params, jnp.arange(3.0))
  np.testing.assert_allclose(np.asarray(got["weight"]), [0.0, 1.0, 2.0])


def test_an_in_place_forward_warns_and_is_differentiated_as_traced():
  class MulInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
      ctx.mark_dirty(x)
      return x.mul_(2)

    @staticmethod
    def backward(ctx, g):
      return 2 * g

  def f(a):
    y = a * 1
    return MulInPlace.apply(y).sum() + y.sum()

  with pytest.warns(UserWarning, match="MulInPlace modifies an input in place"):
    got = jax.grad(lambda a: bridge.call_torch(f, a))(X)
  np.testing.assert_allclose(np.asarray(got), 4 * np.ones(6))


def test_a_backward_with_too_few_gradients_is_a_clear_error():
  class Short(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
      return x * y

    @staticmethod
    def backward(ctx, g):
      return g

  with pytest.raises(
    bridge.BridgeError,
    match=r"Short.backward returned 1 gradients for a "
    r"forward of 2 inputs",
  ):
    jax.grad(lambda a: bridge.call_torch(lambda x: Short.apply(x, x).sum(), a))(X)


def test_functions_outside_traces_are_torchs_own():
  """The routing is there only while torch code is traced."""
  before = torch.autograd.Function.__dict__["apply"]
  jax.grad(lambda a: bridge.call_torch(model, a))(X)
  assert torch.autograd.Function.__dict__["apply"] is before
  x = torch.tensor(np.asarray(X), requires_grad=True)
  Reverse.apply(x, 1.0).sum().backward()
  torch.testing.assert_close(x.grad, -torch.ones(6))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    out = bridge.call_torch(model, X)  # concrete arrays: torch's apply, no JAX derivative
  np.testing.assert_allclose(np.asarray(out), model(torch.tensor(np.asarray(X))).item(), rtol=1e-6)
