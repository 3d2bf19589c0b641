"""The best hand-written interop: DLPack round trips and an autograd.Function over jax.vjp."""

import jax
import torch

from ..common import System, torch_fwd_bwd

to_jax = jax.dlpack.from_dlpack
to_torch = torch.from_dlpack

MODULES = (
  "not applicable: hand-written DLPack calls of jitted JAX functions; nothing runs a torch "
  "module as a JAX program"
)


def _call(f):
  jf = jax.jit(f)
  return lambda x: to_torch(jf(to_jax(x)))


def _fwd_bwd(f):
  """Forward and backward are each one jitted call; the vjp residuals pass between them."""
  fwd = jax.jit(lambda x: jax.vjp(f, x))  # returns (y, vjp_fn); vjp_fn is a pytree
  bwd = jax.jit(lambda vjp_fn, g: vjp_fn(g)[0])

  class JaxFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
      y, ctx.vjp_fn = fwd(to_jax(x.detach()))
      return to_torch(y)

    @staticmethod
    def backward(ctx, g):
      # g is often an expanded (stride-0) tensor, which DLPack import rejects.
      return to_torch(bwd(ctx.vjp_fn, to_jax(g.contiguous())))

  return torch_fwd_bwd(JaxFn.apply)


def make() -> System:
  return System(
    name="dlpack_manual",
    call=_call,
    fwd_bwd=_fwd_bwd,
    to_jax=to_jax,
    to_torch=to_torch,
    notes=[
      "dlpack_manual: jax.dlpack.from_dlpack / torch.from_dlpack around jax.jit(f); "
      "fwd_bwd uses a torch.autograd.Function whose forward is jit(vjp) and whose "
      "backward is a jitted call of the returned vjp function."
    ],
    unsupported={
      **dict.fromkeys(("forward", "train_step"), MODULES),
      **dict.fromkeys(
        ("torch_from_jax", "torch_from_jax_grad"),
        "not applicable: hand-written calls of JAX from torch; the "
        "pure_callback system is the hand-written call of torch from JAX",
      ),
      **dict.fromkeys(
        ("call_torch_jit", "call_torch_grad", "call_torch_vmap"),
        "not applicable: hand-written calls of JAX from torch; tracing torch "
        "code into JAX is not something DLPack can do by hand",
      ),
    },
  )
