"""wrap-torch2jax (peer; `torch2jax` on GitHub): a torch function called from JAX via XLA FFI.

Only the callback rows (torch called from JAX). `torch2jax(f, example,
output_shapes=...)` registers f with its C++ extension, which is compiled into
~/.cache/torch2jax on first use (~40 s); `make()` builds it, outside the timed
calls. The default `depth=2` defines the custom VJP (a second FFI call running
torch's VJP), so one wrapper serves both rows.
"""

import jax
import jax.numpy as jnp
import torch

from ..common import System

NOT_HERE = "wrap_torch2jax runs only the torch-called-from-JAX workloads (torch_from_jax_*)"


def make() -> System:
  import wrap_torch2jax as t2j

  t2j.compile_and_import_module()  # the C++ extension (cached after the first build)

  def wrap(f, x):
    return t2j.torch2jax(f, torch.ones(x.shape), output_shapes=torch.Size(x.shape))

  def torch_from_jax(f, x):
    g = jax.jit(wrap(f, x))
    xj = jnp.asarray(x.detach().numpy())
    return (lambda: g(xj)), (lambda out: out)

  def torch_from_jax_grad(f, x):
    fj = wrap(f, x)
    step = jax.jit(jax.grad(lambda a: fj(a).sum()))
    xj = jnp.asarray(x.detach().numpy())
    return (lambda: step(xj)), (lambda out: out)

  return System(
    name="wrap_torch2jax",
    packages=("wrap-torch2jax",),
    torch_from_jax=torch_from_jax,
    torch_from_jax_grad=torch_from_jax_grad,
    notes=[
      "wrap_torch2jax: fj = wrap_torch2jax.torch2jax(f, torch.ones(16, 16), "
      "output_shapes=torch.Size((16, 16))) (depth=2, its default: custom VJP through "
      "torch.func.vjp); torch_from_jax_call: jax.jit(fj); torch_from_jax_grad: "
      "jax.jit(jax.grad(lambda x: fj(x).sum())). Its C++ extension is built (or loaded "
      "from ~/.cache/torch2jax) before timing."
    ],
    unsupported={
      **{
        attr: NOT_HERE
        for attr in ("call", "fwd_bwd", "to_jax", "to_torch", "eager", "forward", "train_step")
      },
      **dict.fromkeys(
        ("call_torch_jit", "call_torch_grad", "call_torch_vmap"),
        "not applicable: it has no trace mode; it always runs the torch "
        "function in eager torch through an XLA FFI host call (measured in "
        "the callback rows, torch_from_jax_*)",
      ),
    },
  )
