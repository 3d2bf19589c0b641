"""XLA flags of the test suite (set by `tests/conftest.py`, kept by the subprocesses tests start).

The suite compiles tens of thousands of small XLA programs (every op in every dtype,
eagerly and under `jax.jit` / `jax.grad`), and compiling, not running, is most of its
time. XLA:CPU's older loop emitters compile them faster than its newer fusion emitters
(8 OpInfo tests: 38 s -> 22 s; the whole suite, `-n auto` on 2 cores: 33.3 min -> 27.5 min),
and every test passes with either. Turning LLVM's optimizations off as well
(`--xla_backend_optimization_level=0`) would save more (whole suite: 19.9 min) but changes
results in the last bits: `gelu_backward` in float32 then differs from torch by 1.07e-5
where torch gives 0, past the test's 1e-5. `python -m benchmarks`, which times programs,
uses XLA's defaults. `BRIDGE_TEST_XLA_DEFAULTS=1` runs the suite with XLA's default flags.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import jax

FAST_COMPILE = "--xla_cpu_use_fusion_emitters=false"


def with_flags(*flags: str) -> str:
  """`XLA_FLAGS` for a subprocess: this process's flags plus `flags`."""
  return " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()


def use_fast_compile() -> None:
  """Adds `FAST_COMPILE` to `XLA_FLAGS` (before JAX starts its backend), unless opted out."""
  if os.environ.get("BRIDGE_TEST_XLA_DEFAULTS") == "1":
    return
  current = os.environ.get("XLA_FLAGS", "")
  if FAST_COMPILE not in current:
    os.environ["XLA_FLAGS"] = with_flags(FAST_COMPILE)


@contextlib.contextmanager
def counting_compiles() -> Iterator[list[float]]:
  """A list that gathers the duration of every XLA compile while the block runs."""
  compiles: list[float] = []

  def listen(event: str, duration: float, **kwargs: object) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(duration)

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    yield compiles
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)
