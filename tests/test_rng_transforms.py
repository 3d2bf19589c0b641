"""`bridge.rng_key` under JAX's transformations: a key serves the trace its block was opened
in. Bodies JAX traces once and reuses (`lax.scan`, `fori_loop`, `jax.checkpoint`, an inner
`jax.jit`) and `jax.vmap` over an unbatched key refuse to draw from an outer key (it would
repeat one mask), and say to open the block inside with a key of the body's; that pattern
draws a fresh mask per iteration, call and example, reproducibly. No tracer leaks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bridge
from bridge._src import rng

N = 64


def _drop(t):
  return F.dropout(t, 0.5)


def _dropped(a):
  return bridge.call_torch(_drop, a)


def _masks(out):
  """Dropout of ones: the kept positions."""
  out = np.asarray(out)
  assert set(np.unique(out).tolist()) <= {0.0, 2.0}
  return out != 0


def _rows_differ(rows):
  rows = [tuple(r.ravel().tolist()) for r in _masks(rows)]
  return len(set(rows)) == len(rows)


def _h(a):
  return (_dropped(a) * a).sum()


def _key(k):
  return jax.random.key(k)


# --- the refusals: each says what to do -------------------------------------------------------

_NESTED = r"nested JAX trace.*fold_in\(key, i\).*jax\.checkpoint\(lambda x, key"
_VMAP = r"jax\.vmap.*jax\.random\.split\(key, n\)"


def _checkpoint_eagerly():
  with bridge.rng_key(_key(0)):
    jax.grad(jax.checkpoint(_h))(jnp.ones(N))


def _checkpoint_under_jit():
  @jax.jit
  def step(a, key):
    with bridge.rng_key(key):
      return jax.grad(jax.checkpoint(_h))(a)

  step(jnp.ones(N), _key(5))


def _scan_under_jit():
  @jax.jit
  def f(key):
    with bridge.rng_key(key):
      return jax.lax.scan(lambda c, _: (c, _dropped(jnp.ones(N))), 0.0, None, length=3)[1]

  f(_key(0))


def _scan_eagerly():
  with bridge.rng_key(_key(0)):
    jax.lax.scan(lambda c, _: (c, _dropped(jnp.ones(N))), 0.0, None, length=2)


def _fori_loop_under_jit():
  @jax.jit
  def f(a, key):
    with bridge.rng_key(key):
      return jax.lax.fori_loop(0, 3, lambda i, c: c + _dropped(a), a)

  f(jnp.ones(N), _key(0))


def _inner_jit():
  inner = jax.jit(_dropped)

  @jax.jit
  def f(a, key):
    with bridge.rng_key(key):
      return inner(a)

  f(jnp.ones(N), _key(0))


def _vmap_under_jit():
  @jax.jit
  def g(a, key):
    with bridge.rng_key(key):
      return jax.vmap(bridge.jax_view(_drop))(a)

  g(jnp.ones((4, N)), _key(0))


def _vmap_eagerly():
  with bridge.rng_key(_key(0)):
    jax.vmap(_dropped)(jnp.ones((4, N)))


def _vmap_eagerly_without_a_key():
  jax.vmap(_dropped)(jnp.ones((4, N)))


def _vmap_of_one_key_opened_inside():
  def f(a):
    with bridge.rng_key(_key(0)):  # one concrete key for every example
      return _dropped(a)

  jax.vmap(f)(jnp.ones((4, N)))


@pytest.mark.parametrize(
  "case",
  [
    _checkpoint_eagerly,
    _checkpoint_under_jit,
    _scan_under_jit,
    _scan_eagerly,
    _fori_loop_under_jit,
    _inner_jit,
    _vmap_under_jit,
    _vmap_eagerly,
    _vmap_eagerly_without_a_key,
    _vmap_of_one_key_opened_inside,
  ],
  ids=lambda case: case.__name__[1:],
)
def test_a_key_from_outside_a_reused_body_or_vmap_is_refused(case):
  match = _VMAP if "vmap" in case.__name__ else _NESTED
  with pytest.raises(bridge.BridgeError, match=match) as info:
    case()
  assert type(info.value) is bridge.BridgeError
  assert "native_dropout" in str(info.value)  # names the random op


def test_a_refused_checkpoint_stays_refused_in_a_fresh_jit():
  """A second jitted function reusing the checkpointed function got the first trace's key
  tracer from JAX's cache (`UnexpectedTracerError`)."""
  for _ in range(2):
    with pytest.raises(bridge.BridgeError, match=_NESTED):
      _checkpoint_under_jit()


def test_a_refusal_leaves_the_blocks_key_as_it_was():
  """The box never takes a tracer of a body: a random op after the refused loop draws."""
  key = _key(0)
  with bridge.rng_key(key) as box:
    with pytest.raises(bridge.BridgeError):
      jax.lax.scan(lambda c, _: (c, _dropped(jnp.ones(N))), 0.0, None, length=2)
    assert box.key is key
    _masks(_dropped(jnp.ones(N)))
    assert not isinstance(box.key, jax.core.Tracer)


def test_a_random_op_after_a_loop_in_the_same_block_draws():
  @jax.jit
  def g(key):
    with bridge.rng_key(key):
      body = lambda c, i: (c, _in_block(jax.random.fold_in(key, i), jnp.ones(N)))
      ys = jax.lax.scan(body, 0.0, jnp.arange(3))[1]
      return ys, _dropped(jnp.ones(N))

  ys, after = g(_key(0))
  assert _rows_differ(jnp.concatenate([ys, after[None]]))


def test_a_key_of_a_trace_that_has_ended_is_a_leaked_tracer():
  kept = []

  @jax.jit
  def f(key):
    block = bridge.rng_key(key)
    kept.append((block, block.__enter__()))
    return key

  f(_key(0))
  block = kept[0][0]
  try:
    with pytest.raises(bridge.LeakedTracerError, match="bridge.rng_key"):
      rng.next_key()
  finally:
    block.__exit__(None, None, None)


# --- the right patterns: a key of the body's own ------------------------------------------------


def _in_block(key, a):
  with bridge.rng_key(key):
    return _dropped(a)


def test_scan_with_a_key_per_iteration_draws_a_fresh_mask_each_time():
  @jax.jit
  def f(key):
    body = lambda c, i: (c, _in_block(jax.random.fold_in(key, i), jnp.ones(N)))
    return jax.lax.scan(body, 0.0, jnp.arange(4))[1]

  a, b, c = f(_key(0)), f(_key(1)), f(_key(0))
  assert _rows_differ(a) and _rows_differ(b)
  np.testing.assert_array_equal(a, c)
  assert not np.array_equal(a, b)


def test_scan_eagerly_with_a_key_per_iteration():
  body = lambda key, i: (key, _in_block(jax.random.fold_in(key, i), jnp.ones(N)))
  a = jax.lax.scan(body, _key(0), jnp.arange(3))[1]
  b = jax.lax.scan(body, _key(1), jnp.arange(3))[1]  # the body is cached: the key is its input
  assert _rows_differ(a) and not np.array_equal(a, b)
  np.testing.assert_array_equal(jax.lax.scan(body, _key(0), jnp.arange(3))[1], a)


def test_fori_loop_with_a_carried_key():
  @jax.jit
  def f(a, key):
    def body(i, carry):
      total, key = carry
      key, sub = jax.random.split(key)
      return total.at[i].set(_in_block(sub, a)), key

    return jax.lax.fori_loop(0, 3, body, (jnp.zeros((3, N)), key))[0]

  a, b = f(jnp.ones(N), _key(0)), f(jnp.ones(N), _key(0))
  assert _rows_differ(a)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, f(jnp.ones(N), _key(1)))


def _g(a, key):
  with bridge.rng_key(key):
    return (_dropped(a) * a).sum()


def test_a_checkpointed_function_given_the_key_draws_per_key_and_replays_its_mask():
  @jax.jit
  def step(a, key):
    return jax.grad(jax.checkpoint(_g))(a, key), jax.grad(_g)(a, key)

  x = jnp.ones(N)
  (a, plain_a), (b, _), (c, _) = (step(x, _key(k)) for k in (5, 6, 5))
  assert not np.array_equal(a, b)
  np.testing.assert_array_equal(a, c)
  np.testing.assert_array_equal(a, plain_a)  # the backward's recomputation: the same mask
  # eagerly too, a fresh mask per key (the checkpoint's trace is cached, the key its input)
  d, e = (jax.grad(jax.checkpoint(_g))(x, _key(k)) for k in (0, 1))
  assert not np.array_equal(d, e)


def test_vmap_over_keys_draws_each_examples_own_mask():
  a = jnp.arange(1.0, 4 * N + 1).reshape(4, N)
  keys = jax.random.split(_key(0), 4)
  eager = jax.vmap(_in_block)(keys, a)
  jitted = jax.jit(jax.vmap(_in_block))(keys, a)
  assert _rows_differ(eager / a) and _rows_differ(jitted / a)
  np.testing.assert_array_equal(eager, jnp.stack([_in_block(keys[i], a[i]) for i in range(4)]))
  one = jax.jit(_in_block)
  np.testing.assert_array_equal(jitted, jnp.stack([one(keys[i], a[i]) for i in range(4)]))
  # an example's mask is its key's alone (JAX's batching of RngBitGenerator used the first)
  same = jax.vmap(_in_block)(jnp.stack([keys[1], keys[1]]), jnp.ones((2, N)))
  np.testing.assert_array_equal(same[0], same[1])


def test_vmap_over_keys_inside_jit_with_a_key_argument():
  @jax.jit
  def g(a, key):
    return jax.vmap(_in_block)(jax.random.split(key, a.shape[0]), a)

  a, b = g(jnp.ones((3, N)), _key(0)), g(jnp.ones((3, N)), _key(0))
  assert _rows_differ(a)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, g(jnp.ones((3, N)), _key(1)))


# --- what worked keeps working ----------------------------------------------------------------


def test_grad_and_value_and_grad_inside_a_block():
  @jax.jit
  def step(a, key):
    with bridge.rng_key(key):
      value, grad = jax.value_and_grad(_h)(a)
      return value, grad, jax.grad(_h)(a)

  x = jnp.ones(N)
  (va, ga, ha), (vb, gb, _), (vc, gc, _) = (step(x, _key(k)) for k in (0, 1, 0))
  assert not np.array_equal(ga, gb) and not np.array_equal(ga, ha)  # each op a fresh subkey
  np.testing.assert_array_equal(ga, gc)
  np.testing.assert_allclose(va, (ga / 2).sum())  # the value's mask is the gradient's
  with bridge.rng_key(_key(0)):
    d = jax.grad(_h)(x)
  with bridge.rng_key(_key(1)):
    e = jax.grad(_h)(x)
  assert not np.array_equal(d, e)


def _checkpointed_dropout_and_its_torch_gradient(t):
  t = t.detach().requires_grad_()
  y = torch.utils.checkpoint.checkpoint(lambda u: F.dropout(u, 0.5) * 3, t, use_reentrant=False)
  (g,) = torch.autograd.grad(y.sum(), t)
  return y, g


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_torch_checkpoint_inside_a_block_recomputes_the_same_mask(jit):
  # torch saves the device's generator state (`torch.jax.get_rng_state`) and restores it
  # for the recomputation: inside a block that is the block's key (it was the device's
  # global generator, which the block's ops do not draw from: a new mask, a wrong gradient)
  def step(a, key):
    with bridge.rng_key(key):
      return bridge.call_torch(_checkpointed_dropout_and_its_torch_gradient, a)

  run = jax.jit(step) if jit else step
  masks = []
  for k in (0, 1):
    y, g = run(jnp.ones(N), _key(k))
    np.testing.assert_array_equal(np.asarray(g), np.where(np.asarray(y) != 0, 6.0, 0.0))
    masks.append(np.asarray(y) != 0)
  assert (masks[0] != masks[1]).any()
