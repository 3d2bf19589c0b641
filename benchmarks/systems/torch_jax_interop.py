"""torch-jax-interop (peer): jax_to_torch(fn) wrapper; WrappedJaxFunction for autograd."""

import jax

from ..common import System, torch_fwd_bwd

MODULES = (
  "not measured: its torch_module_to_jax runs the module through jax.pure_callback "
  "(torch on the host, outside the XLA program); issue 4 compares compilers of torch code"
)

TRACE = (
  "not applicable: no trace mode for torch code in JAX. Under jax.jit its torch_to_jax(fn) "
  "hands fn the JAX tracer unconverted (x*2+1 then runs as JAX ops, torch.tanh(x @ w) fails "
  "with a TypeError), and torch_module_to_jax runs the module through jax.pure_callback "
  "(a host call; see the callback rows)"
)


def make() -> System:
  import torch_jax_interop as tji

  def call(f):
    return tji.jax_to_torch(jax.jit(f))  # no autograd support in this wrapper

  def fwd_bwd(f):
    # The documented autograd path: an nn.Module over fn(params, *inputs); no params here.
    jf = jax.jit(lambda params, x: f(x))
    return torch_fwd_bwd(tji.WrappedJaxFunction(jf, jax_params=()))

  return System(
    name="torch_jax_interop",
    packages=("torch-jax-interop", "chex"),
    call=call,
    fwd_bwd=fwd_bwd,
    to_jax=tji.torch_to_jax,
    to_torch=tji.jax_to_torch,
    notes=[
      "torch_jax_interop: call_small = jax_to_torch(jax.jit(f)); fwd_bwd_small = "
      "WrappedJaxFunction(jit(lambda params, x: f(x)), jax_params=()) "
      "(jax.vjp traced on every call); converters torch_to_jax / jax_to_torch. "
      "chex, absl-py and toolz installed --no-deps (chex is imported but undeclared).",
      "torch_jax_interop: WrappedJaxFunction's backward hands the incoming gradient "
      "to torch_to_jax as is; the gradient of y.sum() is an expanded (stride-0) "
      "tensor, which jax.dlpack.from_dlpack rejects, so fwd_bwd_small fails.",
    ],
    unsupported={
      **dict.fromkeys(("forward", "train_step"), MODULES),
      **dict.fromkeys(
        ("torch_from_jax", "torch_from_jax_grad"),
        "not measured: its torch_module_to_jax calls the module through "
        "jax.pure_callback, which the pure_callback system measures by hand",
      ),
      **dict.fromkeys(("call_torch_jit", "call_torch_grad", "call_torch_vmap"), TRACE),
    },
  )
