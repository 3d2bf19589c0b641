"""Suite-wide fixtures."""

from __future__ import annotations

import gc
import os

import pytest

from tests import xla

xla.use_fast_compile()  # before any test starts JAX's backend (see tests/xla.py)
_CACHE_MADE = xla.use_compile_cache()  # (the first process makes it, and removes it at the end)


def pytest_unconfigure(config: pytest.Config) -> None:
  xla.remove_compile_cache(_CACHE_MADE)


_MAPS = "/proc/self/maps"
_MAX_MAPPINGS = 20_000  # of the kernel's default vm.max_map_count, 65530
_CHECK_EVERY = 10
_tests_run = [0]


@pytest.fixture(autouse=True)
def _bounded_memory_mappings():
  """Drop JAX's compiled programs when this process holds too many memory mappings.

  Every XLA:CPU executable maps memory of its own, and JAX keeps every program it
  compiled. One xdist worker of this suite compiles tens of thousands (the op tests),
  and was measured at 47,000 mappings near the end of a run; past the kernel's
  `vm.max_map_count` XLA fails to load code ("Failed to materialize symbols") or
  crashes. Checked every few tests (reading the map list takes milliseconds).
  """
  yield
  _tests_run[0] += 1
  if _tests_run[0] % _CHECK_EVERY or not os.path.exists(_MAPS):
    return
  with open(_MAPS, "rb") as f:
    mappings = f.read().count(b"\n")
  if mappings > _MAX_MAPPINGS:
    import jax

    jax.clear_caches()
    gc.collect()


@pytest.fixture
def fresh_dynamo():
  """A test of `torch.compile` that compiles from scratch (dynamo's caches and recompile
  limits are per code object) and counts the backend's work from zero; used by a module's
  `pytestmark = pytest.mark.usefixtures("fresh_dynamo")`."""
  import torch

  import bridge

  torch._dynamo.reset()
  bridge.compile_stats(reset=True)
  yield
  torch._dynamo.reset()
