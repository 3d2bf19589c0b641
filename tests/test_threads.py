"""Tracing a module leaves it as it is for every other thread; compiled calls are thread-safe.

`bridge.compile` (on a new input signature) and `extract_jax`'s function (under `jax.jit`)
trace a module's forward with its parameters swapped for traced tensors: only for the
tracing thread. Each test runs its threads for a bounded time, with Python switching threads
often, so a swap other threads could see would be seen.
"""

from __future__ import annotations

import copy
import sys
import threading

import jax
import jax.numpy as jnp
import pytest
import torch
from torch import nn

import bridge

_TIMEOUT = 50  # seconds for a test's threads, under pytest's own limit


@pytest.fixture(autouse=True)
def _switch_often():
  """Python switches threads every 10 us instead of every 5 ms."""
  interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-5)
  yield
  sys.setswitchinterval(interval)


def _run(*targets):
  """Runs each target in its own thread; returns the errors they raised."""
  errors: list[BaseException] = []

  def guarded(target):
    try:
      target()
    except BaseException as e:  # noqa: BLE001 - reported by the test
      errors.append(e)

  threads = [threading.Thread(target=guarded, args=(t,), daemon=True) for t in targets]
  for t in threads:
    t.start()
  for t in threads:
    t.join(_TIMEOUT)
  assert not any(t.is_alive() for t in threads), "threads did not finish in time"
  return errors


def _mlp():
  torch.manual_seed(0)
  return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))


def _eager_until(model, done):
  """An eager forward, again and again until `done` is set: always the module's own numbers."""
  x = torch.randn(5, 8)
  with torch.no_grad():
    want = copy.deepcopy(model)(x)

  def run():
    n = 0
    while not done.is_set() or n == 0:
      with torch.no_grad():
        torch.testing.assert_close(model(x), want)
      n += 1

  return run


def test_eager_forward_while_another_thread_compiles():
  model = _mlp()
  done = threading.Event()

  def compile_new_signatures():
    try:
      compiled = bridge.compile(model)
      for batch in range(1, 13):
        x = torch.randn(batch, 8)
        with torch.no_grad():
          torch.testing.assert_close(compiled(x), model(x))
    finally:
      done.set()

  assert _run(_eager_until(model, done), compile_new_signatures) == []


@pytest.mark.parametrize("device", ["cpu", "jax"])
def test_concurrent_compiled_calls_with_new_batch_sizes(device):
  model = _mlp()
  ref = copy.deepcopy(model)
  compiled = bridge.compile(model.to(device))

  def calls(k):
    def run():
      for batch in range(1, 6):
        x = torch.randn(batch + 10 * k, 8)
        with torch.no_grad():
          torch.testing.assert_close(compiled(x.to(device)).cpu(), ref(x))

    return run

  assert _run(*[calls(k) for k in range(4)]) == []


@pytest.mark.parametrize("device", ["cpu", "jax"])
def test_shared_batchnorm_counts_every_call(device):
  """6 threads x 20 training calls of one compiled BatchNorm: 120 updates, none lost. With the
  same batch each time, the running statistics do not depend on the order of the calls."""
  torch.manual_seed(0)
  bn = nn.BatchNorm1d(4)
  ref = copy.deepcopy(bn)
  x = torch.randn(6, 4)
  for _ in range(120):
    ref(x)
  compiled = bridge.compile(bn.to(device))
  xd = x.to(device)

  def calls():
    for _ in range(20):
      compiled(xd)

  assert _run(*[calls] * 6) == []
  assert int(bn.num_batches_tracked.cpu()) == 120
  torch.testing.assert_close(bn.running_mean.cpu(), ref.running_mean)
  torch.testing.assert_close(bn.running_var.cpu(), ref.running_var)


def test_extract_jax_under_jit_while_the_module_runs_eagerly():
  model = _mlp()
  params, fn = bridge.extract_jax(model)
  done = threading.Event()

  def trace_new_shapes():
    try:
      for batch in range(1, 11):
        x = jnp.ones((batch, 8))
        out = jax.jit(fn)(params, x)
        with torch.no_grad():
          want = model(torch.ones(batch, 8))
        torch.testing.assert_close(torch.from_numpy(jax.device_get(out).copy()), want)
    finally:
      done.set()

  assert _run(_eager_until(model, done), trace_new_shapes) == []


def test_callback_mode_shape_run_while_the_module_runs_eagerly():
  """Callback mode finds a module's output shapes by running it on fake tensors, with fake
  copies of its state: swapped in for that thread only (an eager forward elsewhere saw fake
  parameters: "Please convert all Tensors to FakeTensors first")."""
  model = _mlp()
  done = threading.Event()

  def shape_runs():
    try:
      for batch in range(1, 13):  # a new input shape: a new fake run each time
        x = jnp.ones((batch, 8))
        with torch.no_grad():
          want = model(torch.ones(batch, 8))
        got = bridge.call_torch(model, x, mode="callback")
        torch.testing.assert_close(bridge.to_torch(got), want)
    finally:
      done.set()

  assert _run(_eager_until(model, done), shape_runs) == []


def test_callback_mode_under_vmap_without_jit_from_several_threads():
  """`jax.vmap` without jit runs callback mode's host calls at once, on the calling thread:
  each thread gets its own function's numbers, element by element or on the whole batch."""

  def worker(k):
    def run():
      for i in range(10):
        xs = jnp.full((3, 4), float(10 * k + i))
        for method in ("sequential", "expand_dims"):
          out = jax.vmap(
            lambda a: bridge.call_torch(lambda t: t * 2 + k, a, mode="callback", vmap_method=method)
          )(xs)
          torch.testing.assert_close(
            bridge.to_torch(out), torch.full((3, 4), 2.0 * (10 * k + i) + k)
          )

    return run

  assert _run(*(worker(k) for k in range(3))) == []


@pytest.mark.parametrize("device", ["cpu", "jax"])
def test_concurrent_dropout_calls_draw_distinct_masks(device):
  """Each compiled call that draws reads the generator's key and writes its successor as one
  step: 4 threads x 10 calls draw exactly the 40 masks of 40 calls in a row (before, two
  threads could read the same key and draw the same mask)."""
  model = nn.Dropout(0.5).to(device)
  compiled = bridge.compile(model)
  x = torch.ones(64, device=device)

  def masks(n):
    return [bytes((compiled(x) != 0).cpu().numpy()) for _ in range(n)]

  torch.manual_seed(0)
  compiled(x)  # traced (and its first key consumed) before the threads start
  serial = masks(40)
  torch.manual_seed(0)
  compiled(x)
  got: list[bytes] = []

  def calls():
    got.extend(masks(10))

  assert _run(*[calls for _ in range(4)]) == []
  assert len(set(got)) == 40 and sorted(got) == sorted(serial)
