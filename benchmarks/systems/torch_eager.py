"""Reference point: the same math done by torch itself, eagerly, with torch autograd."""

import torch

from .. import models
from ..common import System, torch_fwd_bwd


def _train_step(module, x, y):
  opt = torch.optim.SGD(module.parameters(), lr=models.LR)

  def run():
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(module(x), y)
    loss.backward()
    opt.step()
    return loss.detach()

  def read(loss):
    return loss.item(), {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}

  return run, read


def _torch_from_jax_grad(f, x):
  """The torch-only counterpart of the jitted grad step: f(x).sum().backward() on a leaf x."""
  x = x.detach().requires_grad_(True)

  def run():
    x.grad = None
    f(x).sum().backward()
    return x.grad

  return run, (lambda out: out)


def _call_torch_vmap(fn, xs):
  """torch's own vmap of the per-example function, eagerly."""
  g = torch.func.vmap(fn)
  return (lambda: g(xs)), (lambda out: out)


def make() -> System:
  return System(
    name="torch_eager",
    call=lambda f: f,  # f uses plain operators, so it runs as torch ops on torch tensors
    fwd_bwd=lambda f: torch_fwd_bwd(f),
    eager=lambda x, y: ((lambda: x + y), (lambda out: out)),
    forward=lambda module, x: ((lambda: module(x)), (lambda out: out)),
    train_step=_train_step,
    # The reference for the callback rows: f on the torch tensor, no JAX around it.
    torch_from_jax=lambda f, x: ((lambda: f(x)), (lambda out: out)),
    torch_from_jax_grad=_torch_from_jax_grad,
    # The torch reference of the call_torch (trace mode) rows: the same calls, no JAX.
    call_torch_jit=lambda fn, x: ((lambda: fn(x)), (lambda out: out)),
    call_torch_grad=_torch_from_jax_grad,
    call_torch_vmap=_call_torch_vmap,
    notes=[
      "torch_eager: the math runs as torch ops; no JAX involved.",
      "torch_eager: mlp_train_step: zero_grad, cross_entropy, backward, "
      "torch.optim.SGD(lr=0.01).step(); gpt2_train_step_s64 likewise.",
      "torch_eager: torch_from_jax_call / torch_from_jax_grad (the reference, no JAX): "
      "f(x) on the CPU tensor, and x.grad = None; f(x).sum().backward() on a leaf x.",
      "torch_eager: call_torch_* (the torch reference, no JAX): fn(x), x.grad = None; "
      "fn(x).sum().backward() on a leaf x, and torch.func.vmap(fn)(x) for the vmap row.",
    ],
    unsupported={
      "to_jax": "not applicable (no JAX side)",
      "to_torch": "not applicable (no JAX side)",
      **dict.fromkeys(
        ("transformer_first_call", "transformer_first_call_composite", "gpt2_first_call_s64"),
        "not applicable (eager: nothing to trace or compile)",
      ),
    },
  )
