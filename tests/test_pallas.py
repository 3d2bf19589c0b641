"""A Pallas kernel (interpret mode on CPU) called from torch, forward and backward."""

from __future__ import annotations

import jax
import pytest
import torch
from jax.experimental import pallas as pl

import bridge

BLOCK = 8


def _silu_kernel(x_ref, o_ref):
  x = x_ref[...]
  o_ref[...] = x * jax.nn.sigmoid(x)


def _silu_grad_kernel(x_ref, g_ref, o_ref):
  x = x_ref[...]
  s = jax.nn.sigmoid(x)
  o_ref[...] = g_ref[...] * s * (1 + x * (1 - s))


def _rows(n_inputs: int, x: jax.Array, kernel) -> jax.Array:
  spec = pl.BlockSpec((BLOCK, x.shape[1]), lambda i: (i, 0))
  return pl.pallas_call(
    kernel,
    out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    grid=(x.shape[0] // BLOCK,),
    in_specs=[spec] * n_inputs,
    out_specs=spec,
    interpret=True,
  )


def silu_raw(x):
  """The forward kernel alone: JAX has no derivative for it."""
  return _rows(1, x, _silu_kernel)(x)


@jax.custom_vjp
def silu(x):
  return silu_raw(x)


def _silu_fwd(x):
  return silu_raw(x), x


def _silu_bwd(x, g):
  return (_rows(2, x, _silu_grad_kernel)(x, g),)


silu.defvjp(_silu_fwd, _silu_bwd)


def test_pallas_kernel_forward_and_backward_match_torch():
  x = torch.randn(32, 16, requires_grad=True)
  y = bridge.call_jax(silu, x)
  torch.testing.assert_close(y, torch.nn.functional.silu(x.detach()))
  (y * torch.arange(16.0)).sum().backward()
  x_ref = x.detach().requires_grad_()
  (torch.nn.functional.silu(x_ref) * torch.arange(16.0)).sum().backward()
  torch.testing.assert_close(x.grad, x_ref.grad)


def test_pallas_kernel_in_a_torch_training_step():
  torch.manual_seed(0)
  lin1, lin2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 1)
  act = bridge.torch_view(silu)
  opt = torch.optim.SGD([*lin1.parameters(), *lin2.parameters()], lr=0.05)
  x, target = torch.randn(64, 16), torch.randn(64, 1)
  losses = []
  for _ in range(30):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(lin2(act(lin1(x))), target)
    loss.backward()
    opt.step()
    losses.append(loss.item())
  assert losses[-1] < 0.8 * losses[0]


def test_raw_kernel_runs_forward_with_grad_inputs_and_fails_only_on_backward():
  x = torch.randn(16, 8, requires_grad=True)
  y = bridge.call_jax(silu_raw, x)
  torch.testing.assert_close(y, torch.nn.functional.silu(x.detach()))
  with torch.no_grad():
    torch.testing.assert_close(bridge.call_jax(silu_raw, x), y.detach())
  with pytest.raises(bridge.BridgeError, match="cannot differentiate"):
    y.sum().backward()
