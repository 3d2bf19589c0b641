"""Callback mode keeps the user's torch function alive exactly as long as something can still
call it: a compiled program that calls it (its keepalive), a backward still to run (the
residuals), the caller. Its caches and the host-call table refer to it weakly, so a new
function object per call does not grow memory (each used to stay alive for good, with
everything it closed over)."""

from __future__ import annotations

import ctypes
import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from bridge._src import ffi


def _rss_bytes() -> int:
  """The resident memory, after glibc hands back what is free (the 1 MiB tensors freed
  between XLA's compiles otherwise stay in its arenas: RSS would grow with nothing kept)."""
  gc.collect()
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):  # another C library: RSS as it is
    pass
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * 4096


def _fresh(weight: torch.Tensor):
  return lambda t: t * 2 + weight.reshape(-1)[: t.shape[-1]]


def _uses(x):
  """Each way callback mode is called: eagerly, under jit, under grad, under vmap (without jit,
  which runs the host calls now: it used to compile each function's batched call once, kept
  in JAX's cache of single-op programs, 1.4 MiB each up to its 4096 entries)."""
  return [
    lambda f: bridge.call_torch(f, x, mode="callback"),
    lambda f: jax.jit(lambda a: bridge.call_torch(f, a, mode="callback"))(x),
    lambda f: jax.grad(lambda a: bridge.call_torch(f, a, mode="callback").sum())(x),
    lambda f: jax.jit(jax.grad(lambda a: bridge.call_torch(f, a, mode="callback").sum()))(x),
    lambda f: jax.vmap(
      lambda a: bridge.call_torch(f, a, mode="callback", vmap_method="expand_dims")
    )(jnp.stack([x, x])),
    lambda f: jax.vmap(lambda a: bridge.call_torch(f, a, mode="callback"))(jnp.stack([x, x])),
  ]


def test_fresh_functions_are_freed_with_what_they_hold():
  x = jnp.arange(4.0)
  gc.collect()
  host_before = len(ffi._HOST)
  refs = []
  for use in _uses(x):
    for _ in range(3):
      weight = torch.arange(4.0)
      f = _fresh(weight)
      refs.append((weakref.ref(f), weakref.ref(weight)))
      use(f)
      del f, weight
  gc.collect()
  alive = [i for i, (f, w) in enumerate(refs) if f() is not None or w() is not None]
  assert alive == [], f"{len(alive)} of {len(refs)} functions kept alive: {alive}"
  assert len(ffi._HOST) <= host_before  # (their host functions are unregistered)


@pytest.mark.slow
def test_memory_stays_flat_over_fresh_functions():
  x = jnp.arange(4.0)
  uses = _uses(x)

  def run(n: int) -> None:
    for i in range(n):
      f = _fresh(torch.zeros(256, 1024))  # each holds 1 MiB
      uses[i % len(uses)](f)

  run(20)
  gc.collect()
  before = _rss_bytes()
  run(150)
  gc.collect()
  growth = _rss_bytes() - before
  assert growth < 40 * 2**20, f"RSS grew by {growth / 2**20:.0f} MiB over 150 fresh functions"


def test_a_program_keeps_the_function_it_calls():
  """Inline functions die with the Python call that made them; the programs built from them
  must still run (cached by jit, compiled ahead of time, differentiated later)."""
  x = jnp.arange(3.0)
  double = jax.jit(lambda a: bridge.call_torch(lambda t: t * 2, a, mode="callback"))
  batched = jax.jit(
    jax.vmap(
      lambda a: bridge.call_torch(lambda t: t.sin(), a, mode="callback", vmap_method="expand_dims")
    )
  )
  grad = jax.jit(jax.grad(lambda a: bridge.call_torch(lambda t: (t**3).sum(), a, mode="callback")))
  compiled = (
    jax.jit(lambda a: bridge.call_torch(lambda t: t + 1, a, mode="callback")).lower(x).compile()
  )
  for _ in range(2):
    np.testing.assert_allclose(double(x), 2 * np.arange(3.0))
    np.testing.assert_allclose(batched(jnp.ones((2, 3))), np.sin(np.ones((2, 3))), rtol=1e-6)
    np.testing.assert_allclose(grad(x), 3 * np.arange(3.0) ** 2, rtol=1e-6)
    np.testing.assert_allclose(compiled(x), np.arange(3.0) + 1)
    gc.collect()
  # the backward of an eager grad runs after the function that made the lambda returned
  cube = lambda a: bridge.call_torch(lambda t: t**3, a, mode="callback")
  np.testing.assert_allclose(jax.grad(jax.grad(cube))(2.0), 12.0, rtol=1e-6)


def test_a_module_in_callback_mode_is_freed_with_its_function():
  refs = []
  for _ in range(3):
    module = torch.nn.Linear(3, 2)
    params, fn = bridge.extract_jax(module, mode="callback")
    out = jax.jit(fn)(params, jnp.ones((4, 3)))
    assert out.shape == (4, 2)
    refs.append(weakref.ref(module))
    del module, params, fn
  gc.collect()
  assert [r() for r in refs] == [None, None, None]
