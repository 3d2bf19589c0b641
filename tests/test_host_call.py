"""Callback mode's host-call paths other than the CPU's FFI handler, run here on the CPU by making
the bridge believe the platform is a GPU: JAX's buffer callback (a CUDA GPU: torch on XLA's
device buffers and stream) and JAX's Python callbacks (through host memory: where neither the FFI
handler nor buffer callbacks serve)."""

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from bridge._src import ffi
from bridge._src import narrowing
from tests.xla import counting_compiles


@pytest.fixture(autouse=True, params=["buffers", "host"])
def path(request, monkeypatch):
  monkeypatch.setattr(ffi, "platform", lambda: "gpu")
  monkeypatch.setattr(ffi, "route", lambda platform_name=None: request.param)
  return request.param


X = np.linspace(-1.5, 2.0, 12, dtype=np.float32).reshape(3, 4)


def f(t):
  return torch.sin(t) * t


def test_forward_and_jit_match_torch():
  want = f(torch.tensor(X)).numpy()
  np.testing.assert_allclose(
    np.asarray(bridge.call_torch(f, jnp.asarray(X), mode="callback")), want, rtol=1e-6
  )
  got = jax.jit(lambda a: bridge.call_torch(f, a, mode="callback"))(jnp.asarray(X))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


def test_grad_and_per_example_grad_match_torch_autograd():
  t = torch.tensor(X, requires_grad=True)
  f(t).sum().backward()
  grad = jax.jit(jax.grad(lambda a: bridge.call_torch(f, a, mode="callback").sum()))
  np.testing.assert_allclose(np.asarray(grad(jnp.asarray(X))), t.grad.numpy(), rtol=1e-5)
  per_row = jax.vmap(jax.grad(lambda a: bridge.call_torch(f, a, mode="callback").sum()))
  np.testing.assert_allclose(np.asarray(per_row(jnp.asarray(X))), t.grad.numpy(), rtol=1e-5)


def test_bfloat16_and_narrowed_outputs(monkeypatch):
  monkeypatch.setattr(narrowing, "_told", set())  # (said once per function)
  out = bridge.call_torch(lambda t: t.to(torch.bfloat16) * 3, jnp.asarray(X), mode="callback")
  assert out.dtype == jnp.bfloat16
  want = (torch.tensor(X).to(torch.bfloat16) * 3).float().numpy()
  np.testing.assert_array_equal(np.asarray(out, np.float32), want)
  # inside a program built with 64-bit types off, an int64 result is computed as int32: the
  # caller gets an int32 array, which is said
  with pytest.warns(UserWarning, match="64-bit types disabled"):
    counts = jax.jit(lambda a: bridge.call_torch(lambda t: (t > 0).sum(-1), a, mode="callback"))(
      jnp.asarray(X)
    )
  assert counts.dtype == jnp.int32
  np.testing.assert_array_equal(np.asarray(counts), (X > 0).sum(-1))


def test_module_buffers_update_once_per_call_and_step():
  bn = torch.nn.BatchNorm1d(4)
  jax.jit(lambda a: bridge.call_torch(bn, a, mode="callback"))(jnp.asarray(X)).block_until_ready()
  assert bn.num_batches_tracked.item() == 1
  jax.jit(jax.grad(lambda a: bridge.call_torch(bn, a, mode="callback").sum()))(jnp.asarray(X))
  assert bn.num_batches_tracked.item() == 2


def test_torch_exception_is_raised_as_itself_in_an_eager_call():
  def bad(t):
    raise KeyError("no such feature")

  spec = jax.ShapeDtypeStruct((3, 4), jnp.float32)
  with pytest.raises(KeyError, match="no such feature"):
    bridge.call_torch(bad, jnp.asarray(X), mode="callback", result_shape_dtypes=spec)
  with pytest.raises(jax.errors.JaxRuntimeError, match="KeyError: 'no such feature'"):
    jax.jit(lambda a: bridge.call_torch(bad, a, mode="callback", result_shape_dtypes=spec))(
      jnp.asarray(X)
    ).block_until_ready()


def test_a_check_without_outputs_fails_the_run():
  # (a host call with no results and a side effect: `bridge.config(check_indices=True)`)
  with bridge.config(check_indices=True):
    pick = jax.jit(lambda a, i: bridge.call_torch(lambda t, j: t[j], a, i))
    np.testing.assert_array_equal(np.asarray(pick(jnp.asarray(X), jnp.asarray([2, 0]))), X[[2, 0]])
    with pytest.raises(jax.errors.JaxRuntimeError, match="out of bounds"):
      pick(jnp.asarray(X), jnp.asarray([0, 7])).block_until_ready()


def test_random_function_draws_a_seed_and_replays_it_in_the_backward():
  def noisy(t):
    return torch.nn.functional.dropout(t, 0.5, training=True) * t

  x = jnp.asarray(np.abs(X) + 1)
  out, grad = jax.jit(
    jax.value_and_grad(lambda a: bridge.call_torch(noisy, a, mode="callback").sum())
  )(x)
  # the kept elements (where the gradient is not zero) are exactly those summed forward
  g, xs = np.asarray(grad), np.asarray(x)
  kept = g != 0
  np.testing.assert_allclose(g[kept], 4 * xs[kept], rtol=1e-6)
  np.testing.assert_allclose(float(out), float((2 * xs[kept] ** 2).sum()), rtol=1e-5)


@pytest.mark.parametrize("vmap_method", ["sequential", "sequential_unrolled", "expand_dims"])
def test_vmap_without_jit_runs_now_and_compiles_nothing(vmap_method):
  """As on the CPU's FFI route: `jax.vmap` without jit runs the host function on the batch now.
  JAX's callbacks compiled a program for each function (and, "sequential", a scan each call)."""
  seen = []

  def make(k):
    def fn(t):
      seen.append(tuple(t.shape))
      return t * 2 + k

    return fn

  xs = jnp.asarray(X)
  jax.vmap(lambda a: bridge.call_torch(make(0.0), a, mode="callback"))(xs)  # (first use)
  with counting_compiles() as compiles:
    for k in range(1, 4):
      call = lambda a: bridge.call_torch(
        make(float(k)), a, mode="callback", vmap_method=vmap_method
      )
      out = jax.vmap(call)(xs)
      np.testing.assert_allclose(np.asarray(out), X * 2 + k, rtol=1e-6)
      assert out.dtype == jnp.float32 and out.shape == (3, 4)
  assert compiles == []
  per_call = [(4,)] * 3 if vmap_method.startswith("sequential") else [(3, 4)]
  assert seen[-len(per_call) :] == per_call


def test_vmap_of_vmap_without_jit_and_unbatched_arguments():
  xs = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
  w = np.linspace(1, 2, 4, dtype=np.float32)

  def run(k):
    inner = lambda a, b: bridge.call_torch(lambda t, u: t.cumsum(-1) * u + k, a, b, mode="callback")
    return jax.vmap(jax.vmap(inner, in_axes=(0, None)), in_axes=(0, None))(
      jnp.asarray(xs), jnp.asarray(w)
    )

  run(0)  # (JAX's own programs that slice and stack the elements, once per shape)
  with counting_compiles() as compiles:
    for k in (1, 2):
      np.testing.assert_allclose(np.asarray(run(k)), np.cumsum(xs, -1) * w + k, rtol=1e-6)
  assert compiles == []


def test_torch_exception_is_raised_as_itself_under_vmap_without_jit():
  def bad(t):
    raise KeyError("no such feature")

  spec = jax.ShapeDtypeStruct((4,), jnp.float32)
  with pytest.raises(KeyError, match="no such feature"):
    jax.vmap(lambda a: bridge.call_torch(bad, a, mode="callback", result_shape_dtypes=spec))(
      jnp.asarray(X)
    )


def test_fresh_functions_under_vmap_without_jit_are_freed():
  gc.collect()
  host_before = len(ffi._HOST)
  refs = []
  for method in ("sequential", "expand_dims"):
    for _ in range(3):
      weight = torch.arange(4.0)
      f = lambda t, w=weight: t * 2 + w[: t.shape[-1]]
      refs.append((weakref.ref(f), weakref.ref(weight)))
      call = lambda a, f=f, m=method: bridge.call_torch(f, a, mode="callback", vmap_method=m)
      jax.vmap(call)(jnp.asarray(X))
      del call
      del f, weight
  gc.collect()
  alive = [i for i, (f, w) in enumerate(refs) if f() is not None or w() is not None]
  assert alive == [], f"{len(alive)} of {len(refs)} functions kept alive: {alive}"
  assert len(ffi._HOST) <= host_before
