"""The hand-written way to call torch from JAX: `jax.pure_callback` around the torch function.

Only the callback rows (torch called from JAX). The host function wraps the
callback's NumPy argument with `torch.from_numpy`, calls f and hands back
`.numpy()` of the result.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..common import System

NOT_HERE = "pure_callback runs only the torch-called-from-JAX workloads (torch_from_jax_*)"


def _torch_from_jax(f, x):
  def host(a):
    return f(torch.from_numpy(np.asarray(a))).numpy()

  spec = jax.ShapeDtypeStruct(tuple(x.shape), jnp.float32)
  g = jax.jit(lambda a: jax.pure_callback(host, spec, a))
  xj = jnp.asarray(x.detach().numpy())
  return (lambda: g(xj)), (lambda out: out)


def make() -> System:
  # The callback's argument is a read-only view of the XLA buffer; f does not write to it.
  warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
  return System(
    name="pure_callback",
    torch_from_jax=_torch_from_jax,
    notes=[
      "pure_callback: torch_from_jax_call: jax.jit(lambda x: jax.pure_callback(host, "
      "ShapeDtypeStruct((16, 16), float32), x)), host(a) = f(torch.from_numpy("
      "np.asarray(a))).numpy()."
    ],
    unsupported={
      **{
        attr: NOT_HERE
        for attr in ("call", "fwd_bwd", "to_jax", "to_torch", "eager", "forward", "train_step")
      },
      **dict.fromkeys(
        ("call_torch_jit", "call_torch_grad", "call_torch_vmap"),
        "not applicable: a host call of eager torch, not torch traced into "
        "the JAX program (its call row is torch_from_jax_call)",
      ),
      "torch_from_jax_grad": "not differentiable: jax.pure_callback has no JVP or VJP rule "
      "(a custom_vjp with a second callback would have to be written)",
    },
  )
