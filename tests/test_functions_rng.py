"""A custom `torch.autograd.Function` with random ops in its forward, in traced torch code.

Such a Function is a `jax.custom_vjp`, whose forward JAX traces apart; the current
`bridge.rng_key` key is threaded through it (one more input and output), so its dropout draws
from the block's key: a fresh mask per call and per key, the same mask for the same key, and
its own `backward` sees the mask the forward saved. Without a block, inside `jax.jit`, the
random op still asks for a key; a key from outside a body JAX reuses is still refused.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bridge

N = 64
_X = np.linspace(0.5, 2.0, N, dtype=np.float32)  # nonzero: a zero of the output is a drop
_W = np.linspace(-1.0, 1.0, N, dtype=np.float32) + 3.0  # the loss's weights (nonzero)


def _function(drop: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Any:
  """A Function whose forward is `dropout(x) * 2` (or `drop(x) * 2`), saving its mask; its
  backward, `g * mask * 2`, is not its forward's derivative (`g * mask * 4`)."""
  drop = drop or (lambda x: F.dropout(x, 0.5))

  class Drop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
      y = drop(x) * 2
      mask = (y != 0).to(x.dtype)
      ctx.save_for_backward(mask)
      return y

    @staticmethod
    def backward(ctx, grad):
      (mask,) = ctx.saved_tensors
      return grad * mask * 2

  return Drop


Drop = _function()


class Scale(torch.autograd.Function):
  """No random op: forward 3x, backward 5g."""

  @staticmethod
  def forward(ctx, x):
    return x * 3

  @staticmethod
  def backward(ctx, grad):
    return grad * 5


def _drop(a: Any) -> Any:
  return bridge.call_torch(lambda t: Drop.apply(t), a)


def _plain_dropout(a: Any) -> Any:
  return bridge.call_torch(lambda t: F.dropout(t, 0.5), a)


def _mask(y: Any) -> np.ndarray:
  """The kept positions of `Drop` of `_X`: where it is `4 * x`, the rest 0."""
  y = np.asarray(y)
  kept = y != 0
  np.testing.assert_allclose(y[kept], 4 * _X[kept], rtol=1e-6)
  assert 0 < kept.sum() < N  # (a mask of p=0.5 over 64 values)
  return kept


def _loss(a: Any) -> Any:
  return (_drop(a) * _W).sum()


def _key(k: int) -> Any:
  return jax.random.key(k)


# --- forward: a mask per key and per call -------------------------------------------------------


@jax.jit
def _jitted(a, key):
  return _eager(a, key)


def _eager(a, key):
  with bridge.rng_key(key):
    return _drop(a), _drop(a), _plain_dropout(jnp.ones(N))


@pytest.mark.parametrize("run", [_jitted, _eager], ids=["jit", "eager"])
def test_a_mask_per_key_and_per_call(run):
  a = jnp.asarray(_X)
  first, second, after = run(a, _key(0))
  again = run(a, _key(0))
  other = run(a, _key(1))
  m = _mask(first)
  assert not np.array_equal(m, _mask(second))  # two calls in one block
  assert not np.array_equal(m, _mask(other[0]))  # another key
  np.testing.assert_array_equal(first, again[0])  # the same key
  np.testing.assert_array_equal(second, again[1])
  kept = np.asarray(after) != 0  # a random op after it in the block draws, and differs
  assert set(np.unique(np.asarray(after)).tolist()) <= {0.0, 2.0}
  assert not np.array_equal(kept, m) and not np.array_equal(kept, _mask(second))


def test_the_key_after_it_is_current_and_concrete_eagerly():
  key = _key(0)
  with bridge.rng_key(key) as box:
    _drop(jnp.asarray(_X))
    assert box.key is not key and box.used  # advanced by the forward's dropout
    assert not isinstance(box.key, jax.core.Tracer)


# --- backward: the Function's own, with the forward's mask --------------------------------------


def _torch_gradient(mask: np.ndarray) -> np.ndarray:
  """torch autograd of the same Function on the CPU, its dropout replaced by `mask`."""
  fixed = torch.from_numpy(mask.astype(np.float32) * 2)  # dropout's scaling, 1 / (1 - p)
  cpu = _function(lambda x: x * fixed)
  x = torch.from_numpy(_X.copy()).requires_grad_()
  y = cpu.apply(x)
  np.testing.assert_array_equal(y.detach().numpy() != 0, mask)
  (y * torch.from_numpy(_W)).sum().backward()
  return x.grad.numpy()


def _check_gradient(value: Any, grad: Any) -> None:
  mask = _mask(value)
  grad = np.asarray(grad)
  np.testing.assert_array_equal(grad != 0, mask)  # the forward's mask
  np.testing.assert_allclose(grad, np.where(mask, 2 * _W, 0), rtol=1e-6)  # its own backward
  np.testing.assert_allclose(grad, _torch_gradient(mask), rtol=1e-6)


@jax.jit
def _grad_block_outside(a, key):
  with bridge.rng_key(key):
    return _drop(a), jax.grad(_loss)(a)  # (two calls: two masks)


def _loss_in_block(a, key):
  with bridge.rng_key(key):
    y = _drop(a)
    return (y * _W).sum(), y


def test_jit_of_grad_uses_the_forwards_mask():
  a = jnp.asarray(_X)
  (_, y), grad = jax.jit(jax.value_and_grad(_loss_in_block, has_aux=True))(a, _key(0))
  _check_gradient(y, grad)
  np.testing.assert_array_equal(y, _jitted(a, _key(0))[0])  # the mask the key gives


def test_jit_of_grad_with_the_block_outside_grad():
  a = jnp.asarray(_X)
  first, grad = _grad_block_outside(a, _key(0))
  np.testing.assert_array_equal(first, _jitted(a, _key(0))[0])
  y = _jitted(a, _key(0))[1]  # the second draw of the block
  _check_gradient(y, grad)


def test_grad_eagerly():
  a = jnp.asarray(_X)
  (_, y), grad = jax.value_and_grad(_loss_in_block, has_aux=True)(a, _key(0))
  _check_gradient(y, grad)
  np.testing.assert_array_equal(y, _eager(a, _key(0))[0])


def test_grad_of_a_jitted_function_traced_before():
  """JAX traces the custom_vjp's forward again when it differentiates a jitted function it
  traced without derivatives; that trace draws from the same key, with the block closed."""
  loss = jax.jit(_loss_in_block)
  a = jnp.asarray(_X)
  _, y = loss(a, _key(0))
  grad = jax.grad(lambda a, key: loss(a, key)[0])(a, _key(0))
  _check_gradient(y, grad)


class ScaleByArgmax(torch.autograd.Function):
  """No random op, an int64 value in its forward; backward 5g."""

  @staticmethod
  def forward(ctx, x):
    return x * (x.argmax() + 1)

  @staticmethod
  def backward(ctx, grad):
    return grad * 5


def test_grad_of_a_jitted_function_traced_before_without_random_ops():
  """That later trace of the forward runs in a trace scope too (its int64 argmax failed to
  lower: 'type of return operand 0 (tensor<i32>) doesn't match ... (tensor<i64>)')."""
  loss = jax.jit(lambda a: bridge.call_torch(lambda t: ScaleByArgmax.apply(t), a).sum())
  a = jnp.asarray(_X)
  np.testing.assert_allclose(loss(a), _X.sum() * N, rtol=1e-5)
  np.testing.assert_allclose(jax.grad(loss)(a), 5.0)


def test_bridge_compile_draws_from_the_generator():
  compiled = bridge.compile(lambda x: Drop.apply(x))
  x = torch.from_numpy(_X.copy())
  torch.manual_seed(0)
  first, second = compiled(x).numpy(), compiled(x).numpy()
  torch.manual_seed(0)
  np.testing.assert_array_equal(compiled(x).numpy(), first)
  assert not np.array_equal(_mask(first), _mask(second))
  x.requires_grad_()
  y = compiled(x)
  (y * torch.from_numpy(_W)).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), _torch_gradient(_mask(y.detach().numpy())))


def test_vjp_pullback_later_outside_the_block():
  a = jnp.asarray(_X)
  with bridge.rng_key(_key(0)):
    y, pullback = jax.vjp(_drop, a)
  (grad,) = pullback(jnp.asarray(_W))
  _check_gradient(y, grad)


def test_vmap_over_keys_draws_each_examples_mask():
  def one(a, key):
    with bridge.rng_key(key):
      return _drop(a)

  a = jnp.asarray(_X)
  keys = jax.random.split(_key(0), 4)
  ys = jax.jit(jax.vmap(one, in_axes=(None, 0)))(a, keys)
  masks = [tuple(_mask(y).tolist()) for y in ys]
  assert len(set(masks)) == 4
  for y, key in zip(ys, keys):
    np.testing.assert_array_equal(y, jax.jit(one)(a, key))


# --- refusals, as before --------------------------------------------------------------------


def test_without_a_key_under_jit_the_random_op_asks_for_one():
  with pytest.raises(bridge.BridgeError, match=r"staged JAX program.*bridge\.rng_key"):
    jax.jit(_drop)(jnp.asarray(_X))


def test_a_key_from_outside_a_scan_body_is_still_refused():
  @jax.jit
  def f(key):
    with bridge.rng_key(key) as box:
      body = lambda c, _: (c, _drop(jnp.asarray(_X)))
      with pytest.raises(bridge.BridgeError, match="nested JAX trace"):
        jax.lax.scan(body, 0.0, None, length=2)
      assert box.key is key  # left as it was
      return _drop(jnp.asarray(_X))  # and draws after the refusal

  _mask(f(_key(0)))


def test_an_unbatched_key_under_vmap_is_still_refused():
  with bridge.rng_key(_key(0)):
    with pytest.raises(bridge.BridgeError, match=r"jax\.vmap"):
      jax.vmap(_drop)(jnp.ones((2, N)))


# --- a Function without random ops: unchanged ---------------------------------------------------


def _scale(a: Any) -> Any:
  return bridge.call_torch(lambda t: Scale.apply(t), a)


def _custom_vjp_operands(jaxpr: Any) -> list:
  eqns = [e for e in jaxpr.eqns if e.primitive.name == "custom_vjp_call"]
  for e in jaxpr.eqns:
    for sub in jax.extend.core.jaxprs_in_params(e.params):
      eqns += [f for f in sub.eqns if f.primitive.name == "custom_vjp_call"]
  assert len(eqns) == 1
  return list(eqns[0].invars)


def test_without_a_block_no_key_operand():
  a = jnp.asarray(_X)
  operands = _custom_vjp_operands(jax.make_jaxpr(_scale)(a).jaxpr)
  assert [v.aval.shape for v in operands] == [(N,)]
  np.testing.assert_allclose(jax.jit(_scale)(a), 3 * _X, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(jax.grad(lambda a: _scale(a).sum()))(a), 5.0)


def test_in_a_block_no_draw_leaves_the_key():
  a = jnp.asarray(_X)

  @jax.jit
  def f(a, key):
    with bridge.rng_key(key) as box:
      y = _scale(a)
      assert box.key is key  # not advanced
      return y, jax.grad(lambda a: _scale(a).sum())(a), _plain_dropout(jnp.ones(N))

  y, grad, after = f(a, _key(0))
  np.testing.assert_allclose(y, 3 * _X, rtol=1e-6)
  np.testing.assert_allclose(grad, 5.0)
  np.testing.assert_array_equal(after, jax.jit(_first_dropout)(_key(0)))  # the block's first draw


def _first_dropout(key: Any) -> Any:
  with bridge.rng_key(key):
    return _plain_dropout(jnp.ones(N))


# --- random ops in a backward: drawn where it runs, never the forward's key ------------------


class NoisyGrad(torch.autograd.Function):
  """Identity forward; backward `g * u`, `u` uniform: drawn as the backward runs."""

  @staticmethod
  def forward(ctx, x):
    return x.clone()

  @staticmethod
  def backward(ctx, grad):
    return grad * torch.rand_like(grad)


def _noisy_loss(a: Any) -> Any:
  return bridge.call_torch(lambda t: NoisyGrad.apply(t), a).sum()


@jax.jit
def _noisy_grad(a, key):
  with bridge.rng_key(key):
    return jax.grad(_noisy_loss)(a), _plain_dropout(jnp.ones(N))


def test_a_backward_draws_from_the_block_where_it_runs():
  a = jnp.ones(N)
  grad, after = _noisy_grad(a, _key(0))
  grad = np.asarray(grad)
  assert ((grad >= 0) & (grad < 1)).all() and len(np.unique(grad)) > N // 2
  np.testing.assert_array_equal(grad, _noisy_grad(a, _key(0))[0])
  assert not np.array_equal(grad, _noisy_grad(a, _key(1))[0])
  assert not np.array_equal(after, jax.jit(_first_dropout)(_key(0)))  # the backward drew first


def test_a_backward_drawing_eagerly():
  with bridge.rng_key(_key(0)):
    grad = np.asarray(jax.grad(_noisy_loss)(jnp.ones(N)))
  assert ((grad >= 0) & (grad < 1)).all() and len(np.unique(grad)) > N // 2


def test_a_backward_drawing_after_the_block_closed_asks_for_a_key():
  """Inside `jax.jit`, a backward running after the differentiated function's block has
  closed has no key to draw from (open the block around `jax.grad` instead): said, never
  the forward's key reused."""

  def loss(a, key):
    with bridge.rng_key(key):
      return _noisy_loss(a)

  with pytest.raises(bridge.BridgeError, match=r"rand_like.*staged JAX program"):
    jax.jit(jax.grad(loss))(jnp.ones(N), _key(0))
