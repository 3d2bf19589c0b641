"""torchax (peer): torch tensors <-> torchax Tensors wrapping JAX arrays; interop.call_jax and
interop.call_torch.

torchax 0.0.13 names aten named-tensor (Dimname) overloads, e.g.
``aten.prod.dim_Dimname``, that torch 2.13 removed, so it does not import as
shipped. `_import_torchax` lets such missing names resolve to inert placeholders
while torchax imports and builds its op tables; torchax never dispatches to them
for the ops benchmarked here. The shim is reported in the notes.
"""

import contextlib
import functools

import jax
import jax.numpy as jnp
import torch
import torch._ops

from .. import models
from ..common import System


class _RemovedOverload:
  """Stands in for an aten overload that this torch no longer has."""

  def __init__(self, name: str):
    self.name = name

  def __repr__(self):
    return f"<removed overload {self.name}>"


def _is_named_tensor_overload(key: str) -> bool:
  return "dimname" in key.lower() or "names" in key


@contextlib.contextmanager
def _placeholders_for_removed_overloads(missing: list[str]):
  packet = torch._ops.OpOverloadPacket
  original = packet.__getattr__

  def getattr_or_placeholder(self, key):
    try:
      return original(self, key)
    except AttributeError:
      if not _is_named_tensor_overload(key):
        raise
      missing.append(f"{self}.{key}")
      return _RemovedOverload(f"{self}.{key}")

  packet.__getattr__ = getattr_or_placeholder
  try:
    yield
  finally:
    packet.__getattr__ = original


def _import_torchax():
  """Import torchax and build its environment (which loads the op tables)."""
  missing: list[str] = []
  with _placeholders_for_removed_overloads(missing):
    import torchax
    from torchax import interop

    env = torchax.default_env()
  return env, interop, sorted(set(missing))


def make() -> System:
  env, interop, missing = _import_torchax()
  # Documented config switch: use DLPack instead of numpy for CPU<->JAX conversion.
  env.config.use_dlpack_for_data_conversion = True

  def call(f):
    jf = jax.jit(f)
    return lambda x: interop.call_jax(jf, env.to_xla(x)).torch()

  def fwd_bwd(f):
    jf = jax.jit(f)
    # torchax 0.0.13 calls `fn` of j2t_autograd with torchax Tensors (via
    # call_torch), so the JAX function goes inside call_jax, as its users do.
    g = interop.j2t_autograd(lambda x: interop.call_jax(jf, x))

    def step(x):
      with env:
        xj = env.to_xla(x.detach()).requires_grad_(True)
        y = g(xj)
        y.sum().backward()
      return y.torch(), xj.grad.torch()

    return step

  def eager(x, y):
    xj, yj = env.to_xla(x), env.to_xla(y)  # tensors of torchax's jax device

    def run():
      with env:
        return xj + yj

    return run, (lambda out: out.torch())

  def forward(module, x):
    import torchax

    with env:
      module.to("jax")
    xj = env.to_xla(x)
    compiled = torchax.compile(module)  # interop.JittableModule, forward jitted

    def run():
      out = compiled(xj)
      jax.block_until_ready(out.jax())
      return out

    return run, (lambda out: out.torch())

  def train_step(module, x, y):
    import torchax

    states, fn = torchax.extract_jax(module)
    return models.jax_train_step(lambda p, xs: fn(p, (xs,)), states, x, y, module)

  def placed(fn):
    """fn's torch code bound to its weights on torchax's jax device: torchax refuses math
    between its tensors and CPU tensors, so closed-over CPU weights fail under call_torch."""
    return functools.partial(fn.apply, {k: env.to_xla(v) for k, v in fn.weights.items()})

  def call_torch_jit(fn, x):
    f = placed(fn)
    g, xj = jax.jit(lambda a: interop.call_torch(f, a)), jnp.asarray(x.numpy())
    return (lambda: g(xj)), (lambda out: out)

  def call_torch_grad(fn, x):
    f = placed(fn)
    step = jax.jit(jax.grad(lambda a: interop.call_torch(f, a).sum()))
    xj = jnp.asarray(x.numpy())
    return (lambda: step(xj)), (lambda out: out)

  def call_torch_vmap(fn, xs):
    f = placed(fn)
    g, xj = jax.jit(jax.vmap(lambda a: interop.call_torch(f, a))), jnp.asarray(xs.numpy())
    return (lambda: g(xj)), (lambda out: out)

  not_callback = (
    "not measured: torchax's interop.call_torch runs torch code as JAX ops "
    "through torchax tensors (traced, not a host call of eager torch; see the "
    "call_torch rows)"
  )
  return System(
    name="torchax",
    forward=forward,
    train_step=train_step,
    eager=eager,
    packages=("torchax",),
    call=call,
    fwd_bwd=fwd_bwd,
    to_jax=env.t2j_copy,
    to_torch=env.j2t_copy,
    call_torch_jit=call_torch_jit,
    call_torch_grad=call_torch_grad,
    call_torch_vmap=call_torch_vmap,
    unsupported=dict.fromkeys(("torch_from_jax", "torch_from_jax_grad"), not_callback),
    notes=[
      f"torchax: import shim: {len(missing)} aten named-tensor (Dimname) overloads "
      f"removed in torch {torch.__version__} resolve to inert placeholders while "
      f"torchax imports ({', '.join(missing[:3])}, ...).",
      "torchax: env.config.use_dlpack_for_data_conversion=True. to_jax is "
      "env.t2j_copy (DLPack); to_torch is env.j2t_copy, whose DLPack path calls the "
      "removed jax.dlpack.to_dlpack and so falls back to numpy (no shim applied).",
      "torchax: call_small = env.to_xla(x) -> interop.call_jax(jit(f)) -> .torch().",
      "torchax: fwd_bwd_small uses interop.j2t_autograd (jax.vjp traced on every "
      "call). torchax's CPU->jax move is not differentiable, so the step "
      "converts x to a torchax leaf that requires grad and returns "
      "y and the grad converted back to CPU torch tensors.",
      "torchax: forward workloads: torchax.compile(module) (a JittableModule) on the "
      "module moved to torchax's jax device (`with env: module.to('jax')`) and "
      "env.to_xla(x); the output's JAX array (out.jax()) is waited for in the timed "
      "call. It traces under its torch-function mode, which fails torch's MHA "
      "fast-path check (has_torch_function): transformer_block runs the op-by-op "
      "layer, as transformer_block_composite does.",
      "torchax: mlp_train_step: states, fn = torchax.extract_jax(mlp), then the same "
      "jitted value_and_grad + SGD step as bridge and plain_jax (gpt2_train_step_s64 "
      "likewise).",
      "torchax: call_torch_*: jax.jit(lambda x: interop.call_torch(f, x)), "
      "jax.jit(jax.grad(lambda x: interop.call_torch(f, x).sum())) and "
      "jax.jit(jax.vmap(lambda x: interop.call_torch(f, x))) on JAX arrays, the same torch "
      "code traced as JAX ops; f closes over the weights moved to torchax's jax device "
      "(env.to_xla): with the CPU weights the other systems close over, torchax raises "
      "'Expect a Tensor or a View but got torch.Tensor ... mixed math between XLATensor "
      "and torch.Tensor'.",
    ],
  )
