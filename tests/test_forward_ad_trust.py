"""Forward-mode AD (`torch.autograd.forward_ad`) keeps torch's values: tangents through the
composite ops the `jax` device runs whole (`matmul`, `linear`), through `bridge.compile` when
nothing requires grad, and tangents that torch's backward differentiates again
(forward-over-reverse) through `call_jax` and `bridge.compile`. Batched output gradients
(`is_grads_batched=True`) get a clear error there.
"""

from __future__ import annotations

import jax.numpy as jnp
import pytest
import torch
import torch.autograd.forward_ad as fwAD

import bridge


def _gen():
  return torch.Generator().manual_seed(0)


def test_matmul_and_linear_carry_tangents_on_the_jax_device():
  g = _gen()
  m, v, xs = torch.randn(3, 4, generator=g), torch.randn(4), torch.randn(2, 4, generator=g)
  lin = torch.nn.Linear(4, 4).requires_grad_(False)  # a frozen layer: no reverse-mode recording
  out = {}
  for dev in ("cpu", "jax"):
    layer = lin.to(dev)
    with fwAD.dual_level():
      a = fwAD.make_dual(m.to(dev), torch.ones(3, 4, device=dev))
      x = fwAD.make_dual(xs.to(dev), torch.ones(2, 4, device=dev))
      out[dev] = [
        fwAD.unpack_dual(a @ v.to(dev)).tangent,
        fwAD.unpack_dual(torch.matmul(a, m.t().to(dev))).tangent,
        fwAD.unpack_dual(layer(x) + x.sum()).tangent,
        fwAD.unpack_dual(torch.nn.functional.linear(x, m.to(dev))).tangent,
      ]
  for got, want in zip(out["jax"], out["cpu"]):
    assert got is not None
    torch.testing.assert_close(got.cpu(), want)


def _jax_fn(a, b):
  return jnp.sin(a) * b


def _torch_fn(a, b):
  return torch.sin(a) * b


_WAYS = {
  "call_jax": lambda: lambda a, b: bridge.call_jax(_jax_fn, a, b),
  "compile": lambda: bridge.compile(_torch_fn),
}


@pytest.mark.parametrize("way", list(_WAYS))
@pytest.mark.parametrize("what", ["tangent", "tangent+primal"])
def test_forward_over_reverse_gradients_equal_torch(way, what):
  g = _gen()
  xs, ys = torch.randn(4, generator=g), torch.randn(4, generator=g)
  grads = {}
  for name, fn in (("torch", _torch_fn), (way, _WAYS[way]())):
    p = xs.clone().requires_grad_()
    with fwAD.dual_level():
      primal, tangent = fwAD.unpack_dual(fn(fwAD.make_dual(p, torch.ones(4)), ys))
      assert tangent.requires_grad
      loss = tangent.sum() if what == "tangent" else (tangent + primal).sum()
      grads[name] = torch.autograd.grad(loss, p)[0]
  torch.testing.assert_close(grads[way], grads["torch"])


@pytest.mark.parametrize("way", list(_WAYS))
def test_a_tangent_that_requires_grad_is_differentiated(way):
  g = _gen()
  xs, ys = torch.randn(4, generator=g), torch.randn(4, generator=g)
  grads = {}
  for name, fn in (("torch", _torch_fn), (way, _WAYS[way]())):
    t = torch.linspace(0.5, 2.0, 4).requires_grad_()
    with fwAD.dual_level():
      _, tangent = fwAD.unpack_dual(fn(fwAD.make_dual(xs, t), ys))
      grads[name] = torch.autograd.grad(tangent.square().sum(), t)[0]
  torch.testing.assert_close(grads[way], grads["torch"])


def test_tangents_without_a_recorded_graph_are_unchanged():
  """Plain forward mode (nothing requires grad): the tangent as before, no graph."""
  xs, ys = torch.randn(4, generator=_gen()), torch.ones(4)
  with fwAD.dual_level():
    _, got = fwAD.unpack_dual(bridge.call_jax(_jax_fn, fwAD.make_dual(xs, torch.ones(4)), ys))
  assert not got.requires_grad
  torch.testing.assert_close(got, torch.cos(xs))


@pytest.mark.parametrize("warm", [False, True], ids=["first call", "after the shortcut"])
def test_bridge_compile_carries_tangents_when_nothing_requires_grad(warm):
  """A dual input whose primal needs no gradient: the tangent was dropped (None)."""
  g = _gen()
  xs, ys = torch.randn(4, generator=g), torch.randn(4, generator=g)
  lin = torch.nn.Linear(4, 2).requires_grad_(False)
  fn, module = bridge.compile(_torch_fn), bridge.compile(lin)
  if warm:  # plain calls first: they record the shortcuts
    for _ in range(2):
      fn(xs, ys), module(xs)
  with fwAD.dual_level():
    got = fwAD.unpack_dual(fn(fwAD.make_dual(xs, torch.ones(4)), ys)).tangent
    want = fwAD.unpack_dual(_torch_fn(fwAD.make_dual(xs, torch.ones(4)), ys)).tangent
    torch.testing.assert_close(got, want)
    got = fwAD.unpack_dual(module(fwAD.make_dual(xs, torch.ones(4)))).tangent
    want = fwAD.unpack_dual(lin(fwAD.make_dual(xs, torch.ones(4)))).tangent
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("way", list(_WAYS))
def test_batched_output_gradients_get_a_clear_error(way):
  """`is_grads_batched=True` runs the backward under torch's vmap: it failed inside a
  `detach` with "Batching rule not implemented for aten::detach"."""
  from bridge._src.errors import BridgeError

  x = torch.randn(4, generator=_gen()).requires_grad_()
  y = _WAYS[way]()(x, torch.ones(4))
  with pytest.raises(BridgeError, match="is_grads_batched=True"):
    torch.autograd.grad(y, x, grad_outputs=torch.eye(4), is_grads_batched=True)
