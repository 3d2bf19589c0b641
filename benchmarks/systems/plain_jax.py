"""Lower bound: the jitted JAX function called directly on JAX arrays (no torch at all)."""

import jax
import jax.numpy as jnp
import torch

from .. import models
from ..common import CONV_WORKLOADS, System

NO_BLOCK = "no hand-written JAX transformer block (issue 4 compares it across torch front ends)"
NO_HF = (
  "no hand-written JAX GPT-2 / BERT (issue 7 compares Hugging Face models across torch front ends)"
)


def _call(f):
  return jax.jit(f)


def _fwd_bwd(f):
  """Jitted equivalent of ``y = f(x); y.sum().backward()``: returns (y, grad)."""

  def step(x):
    y, vjp = jax.vjp(f, x)
    (grad,) = vjp(jnp.ones_like(y))
    return y, grad

  return jax.jit(step)


def _eager(x, y):
  xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
  return (lambda: jnp.add(xj, yj)), (lambda out: out)


def _array(t: torch.Tensor) -> jax.Array:
  return jnp.asarray(t.detach().numpy())


@jax.jit
def _linear(w, b, x):
  return x @ w.T + b


def _forward(module, x):
  """`nn.Linear` only: the same ``x @ W.T + b``, jitted, with the parameters as arguments."""
  if type(module) is not torch.nn.Linear:
    raise TypeError(f"plain_jax has a hand-written nn.Linear only, not {type(module).__name__}")
  w, b, xj = _array(module.weight), _array(module.bias), _array(x)
  return (lambda: _linear(w, b, xj)), (lambda out: out)


def _mlp(params, x):
  """The MLPs of `models.mlp()` and `models.dp_mlp()` by hand: Linear, ReLU, Linear, ReLU, Linear."""
  n = len(params) // 2  # a weight and a bias per layer
  for i in range(n):
    x = x @ params[f"{2 * i}.weight"].T + params[f"{2 * i}.bias"]
    if i < n - 1:
      x = jax.nn.relu(x)
  return x


def _train_step(module, x, y):
  params = {k: _array(v) for k, v in module.state_dict().items()}  # the same initial values
  return models.jax_train_step(_mlp, params, x, y)


def _sharded_train_step(module, x, y, params_sharding, batch_sharding):
  """The MLP written in JAX, the same initial values placed with jax.device_put."""
  params = jax.device_put(
    {k: v.detach().numpy() for k, v in module.state_dict().items()}, params_sharding
  )
  return models.jax_sharded_train_step(_mlp, params, x, y, batch_sharding)


def _torch_from_jax(f, x):
  """Context for the callback rows: the same math as JAX ops, jitted (no torch)."""
  g, xj = jax.jit(f), _array(x)
  return (lambda: g(xj)), (lambda out: out)


def _torch_from_jax_grad(f, x):
  step, xj = jax.jit(jax.grad(lambda a: f(a).sum())), _array(x)
  return (lambda: step(xj)), (lambda out: out)


def _call_torch_math(fn):
  """The math of a `models.TorchFn`, hand-written in JAX; its weights closed over as JAX arrays."""
  w = {k: _array(v) for k, v in fn.weights.items()}
  if fn.name == "small":
    return lambda x: x * 2 + 1
  if fn.name == "mlp":
    return lambda x: jnp.tanh(x @ w["w1"] + w["b1"]) @ w["w2"] + w["b2"]
  raise ValueError(f"plain_jax has no JAX version of the call_torch function {fn.name!r}")


def _call_torch_jit(fn, x):
  """The reference of the call_torch rows: the same math, jitted JAX (no torch)."""
  g, xj = jax.jit(_call_torch_math(fn)), _array(x)
  return (lambda: g(xj)), (lambda out: out)


def _call_torch_grad(fn, x):
  math = _call_torch_math(fn)
  step, xj = jax.jit(jax.grad(lambda a: math(a).sum())), _array(x)
  return (lambda: step(xj)), (lambda out: out)


def _call_torch_vmap(fn, xs):
  g, xj = jax.jit(jax.vmap(_call_torch_math(fn))), _array(xs)
  return (lambda: g(xj)), (lambda out: out)


def make() -> System:
  return System(
    name="plain_jax",
    array_in="jax",
    call=_call,
    fwd_bwd=_fwd_bwd,
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
      "plain_jax: JAX arrays in and out, no framework boundary (lower bound); "
      "eager_add: jnp.add, eager (not jitted).",
      "plain_jax: compiled_linear: jax.jit(lambda w, b, x: x @ w.T + b)(w, b, x) on JAX "
      "arrays; mlp_train_step: the same MLP written in JAX (same initial values, same "
      "loss and SGD update in one jax.jit).",
      "plain_jax: torch_from_jax_call / torch_from_jax_grad: jax.jit(f) and "
      "jax.jit(jax.grad(lambda x: f(x).sum())) with f = x*2+1 as JAX ops (no torch).",
      "plain_jax: call_torch_* (the reference): the same functions written in JAX "
      "(x*2+1; jnp.tanh(x @ w1 + b1) @ w2 + b2 with the weights closed over as JAX arrays) "
      "under jax.jit, jax.jit(jax.grad(lambda x: f(x).sum())) and jax.jit(jax.vmap(f)).",
      "plain_jax: dp8_train_step / dp1_train_step (the reference): the same MLP written "
      "in JAX, the same initial values placed with jax.device_put on the same shardings, "
      "the same jitted loss, gradient and optax.sgd update (models.jax_sharded_train_step).",
    ],
    unsupported={
      "to_jax": "not applicable (no torch side)",
      "to_torch": "not applicable (no torch side)",
      **dict.fromkeys(
        (
          "transformer_block",
          "transformer_block_composite",
          "transformer_train_step",
          "transformer_first_call",
          "transformer_first_call_composite",
          "cuda_transformer_block",
        ),
        NO_BLOCK,
      ),
      **dict.fromkeys(
        (
          "gpt2_forward_s64",
          "gpt2_forward_s256",
          "bert_forward_s64",
          "bert_forward_s256",
          "gpt2_train_step_s64",
          "gpt2_first_call_s64",
          "cuda_gpt2_forward_s256",
        ),
        NO_HF,
      ),
      **dict.fromkeys(CONV_WORKLOADS, "not measured: no JAX-written ResNet or MobileNet here"),
    },
  )
