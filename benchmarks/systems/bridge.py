"""bridge (this project): call_jax, to_jax, to_torch; compile and extract_jax on CPU modules;
call_torch for torch called from JAX (mode="callback", and the default trace mode)."""

import jax
import jax.numpy as jnp

from .. import models
from ..common import System, torch_fwd_bwd


def _eager(x, y):
  xj, yj = x.to("jax"), y.to("jax")  # bridge.Tensors on the jax torch device
  return (lambda: xj + yj), (lambda out: out.cpu())


def _forward(module, x):
  import bridge

  compiled = bridge.compile(module)  # CPU tensors in, CPU tensors out

  def run():
    return compiled(x)

  run.settle = compiled.wait_optimized  # steady state: after the background compile
  return run, (lambda out: out)


def _train_step(module, x, y):
  import bridge

  params, fn = bridge.extract_jax(module)
  return models.jax_train_step(fn, params, x, y, module)


def _sharded_train_step(module, x, y, params_sharding, batch_sharding):
  """extract_jax, then the parameters placed with bridge.shard (replicated over the mesh)."""
  import bridge

  params, fn = bridge.extract_jax(module)
  params = bridge.shard(params, params_sharding)
  return models.jax_sharded_train_step(fn, params, x, y, batch_sharding)


def _jax_array(x):
  return jnp.asarray(x.detach().numpy())


def _torch_from_jax(f, x):
  import bridge

  g = jax.jit(lambda a: bridge.call_torch(f, a, mode="callback"))
  xj = _jax_array(x)
  return (lambda: g(xj)), (lambda out: out)


def _torch_from_jax_grad(f, x):
  import bridge

  step = jax.jit(jax.grad(lambda a: bridge.call_torch(f, a, mode="callback").sum()))
  xj = _jax_array(x)
  return (lambda: step(xj)), (lambda out: out)


def _call_torch_jit(fn, x):
  """Trace mode (the default): fn's torch ops become JAX ops of the jitted program."""
  import bridge

  g, xj = jax.jit(lambda a: bridge.call_torch(fn, a)), _jax_array(x)
  return (lambda: g(xj)), (lambda out: out)


def _call_torch_grad(fn, x):
  import bridge

  step, xj = jax.jit(jax.grad(lambda a: bridge.call_torch(fn, a).sum())), _jax_array(x)
  return (lambda: step(xj)), (lambda out: out)


def _call_torch_vmap(fn, xs):
  import bridge

  g, xj = jax.jit(jax.vmap(lambda a: bridge.call_torch(fn, a))), _jax_array(xs)
  return (lambda: g(xj)), (lambda out: out)


def make() -> System:
  import bridge

  def call(f):
    # bridge jits and caches internally; the same function object is passed every call.
    return lambda x: bridge.call_jax(f, x)

  return System(
    name="bridge",
    packages=("bridge",),
    call=call,
    fwd_bwd=lambda f: torch_fwd_bwd(call(f)),
    to_jax=bridge.to_jax,
    to_torch=bridge.to_torch,
    eager=_eager,
    forward=_forward,
    train_step=_train_step,
    torch_from_jax=_torch_from_jax,
    torch_from_jax_grad=_torch_from_jax_grad,
    call_torch_jit=_call_torch_jit,
    call_torch_grad=_call_torch_grad,
    call_torch_vmap=_call_torch_vmap,
    sharded_train_step=_sharded_train_step,
    notes=[
      "bridge: bridge.call_jax(f, x) with the unjitted f; bridge.to_jax / bridge.to_torch; "
      "eager_add: x + y on tensors of the jax torch device.",
      "bridge: module workloads: bridge.compile(module)(x) on CPU module and tensors "
      "(CPU tensors out; see bridge_jax for the jax device); mlp_train_step: "
      "params, fn = bridge.extract_jax(mlp), then jax.jit of jax.value_and_grad of "
      "the cross-entropy of fn(params, x) plus the SGD update (benchmarks/models.py); "
      "gpt2_train_step_s64 likewise (the tied lm_head/wte weight is one parameter).",
      "bridge: torch_from_jax_call: jax.jit(lambda x: bridge.call_torch(f, x, "
      "mode='callback')) on a JAX array (f runs in eager torch through an XLA FFI host "
      "call); torch_from_jax_grad: jax.jit(jax.grad(lambda x: bridge.call_torch(f, x, "
      "mode='callback').sum())) (the backward runs torch autograd in a second host call).",
      "bridge: call_torch_* (trace mode, the default): jax.jit(lambda x: bridge.call_torch(fn, "
      "x)), jax.jit(jax.grad(lambda x: bridge.call_torch(fn, x).sum())) and "
      "jax.jit(jax.vmap(lambda x: bridge.call_torch(fn, x))) on JAX arrays; fn's torch ops "
      "are traced into the program, its closed-over CPU weights become constants.",
      "bridge: dp8_train_step / dp1_train_step: params, fn = bridge.extract_jax(mlp); "
      "params = bridge.shard(params, NamedSharding(mesh, P())) (dp1: "
      "SingleDeviceSharding(device 0)); the batch placed with NamedSharding(mesh, "
      "P('data')); one jax.jit of jax.value_and_grad of the cross-entropy of fn(params, x) "
      "plus an optax.sgd update (models.jax_sharded_train_step).",
    ],
  )
