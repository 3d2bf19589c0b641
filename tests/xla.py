"""XLA flags of the test suite (set by `tests/conftest.py`, kept by the subprocesses tests start).

The suite compiles tens of thousands of small XLA programs (every op in every dtype,
eagerly and under `jax.jit` / `jax.grad`), and compiling, not running, is most of its
time. With LLVM's optimizations and XLA:CPU's newer fusion emitters off, each compiles
about twice as fast (8 OpInfo tests: 30 s -> 15 s on 2 cores). XLA's HLO passes still
run, and floating-point semantics are the same (no fast math either way), so what the
tests assert does not change; the benchmarks, which time programs, do not use these
flags. `BRIDGE_TEST_XLA_DEFAULTS=1` runs the suite with XLA's default flags.
"""

from __future__ import annotations

import os

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


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
