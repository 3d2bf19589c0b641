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

Many tests compile the very same program (an op's eager program for a common shape, the
OpInfo programs that 64-bit types on and off both build): `use_compile_cache` shares them
between the tests of one run and its xdist workers (not the fresh interpreters some tests
start, which compile their own), through JAX's persistent compilation cache in a temporary
directory that the run removes at its end. A hit returns the executable XLA built for the
identical program (the key is the program, its compile options and the XLA flags), so no test
runs anything else than it would compile; `counting_compiles` counts hits as compiles. On
2 cores it saves about a tenth of the time of the op tests (`test_elementwise`, `test_shape`,
`test_device`: 169 and 184 s without, 155 and 153 s with, interleaved).
`BRIDGE_TEST_COMPILE_CACHE=0` turns it off.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
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
  """A list that gathers the duration of every XLA compile while the block runs (a program
  the run's compile cache held counts too: JAX times its retrieval as the compile)."""
  compiles: list[float] = []

  def listen(event: str, duration: float, **kwargs: object) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(duration)

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    yield compiles
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)


CACHE_DIR_ENV = "BRIDGE_TEST_COMPILE_CACHE_DIR"


def use_compile_cache() -> str | None:
  """Points JAX's persistent compilation cache at this run's directory (made by the first
  process, named to xdist's workers through the environment); returns the directory if this
  process made it (it removes it: `remove_compile_cache`), else None."""
  if os.environ.get("BRIDGE_TEST_COMPILE_CACHE") == "0":
    return None
  made = None
  path = os.environ.get(CACHE_DIR_ENV)
  if not path:
    path = made = tempfile.mkdtemp(prefix="bridge-test-xla-cache-")
    os.environ[CACHE_DIR_ENV] = path
  settings = {  # every program, however quick to compile or small
    "jax_compilation_cache_dir": path,
    "jax_persistent_cache_min_compile_time_secs": 0,
    "jax_persistent_cache_min_entry_size_bytes": -1,
  }
  for name, value in settings.items():
    jax.config.update(name, value)
  _atomic_cache_writes()
  return made


def remove_compile_cache(path: str | None) -> None:
  if path:
    shutil.rmtree(path, ignore_errors=True)


def _atomic_cache_writes() -> None:
  """Write cache entries whole (a temporary file renamed), so that a worker reading the entry
  another worker is writing never sees part of it. (JAX's cache without a size limit writes
  in place; with one it locks and rescans the directory on every write.)"""
  try:
    from jax._src import lru_cache
  except ImportError:  # another JAX: its own writes
    return
  cls = getattr(lru_cache, "LRUCache", None)
  suffix = getattr(lru_cache, "_CACHE_SUFFIX", None)
  if cls is None or suffix is None or getattr(cls, "_bridge_atomic", False):
    return
  put = cls.put

  def atomic_put(self: object, key: str, value: bytes) -> None:
    if getattr(self, "eviction_enabled", True):
      return put(self, key, value)
    final = os.path.join(str(self.path), f"{key}{suffix}")  # type: ignore[attr-defined]
    if os.path.exists(final):
      return None
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(final), prefix=".partial-")
    try:
      with os.fdopen(fd, "wb") as f:
        f.write(value)
      os.replace(tmp, final)
    except BaseException:
      with contextlib.suppress(OSError):
        os.unlink(tmp)
      raise
    return None

  cls.put = atomic_put  # type: ignore[method-assign]
  cls._bridge_atomic = True  # type: ignore[attr-defined]
