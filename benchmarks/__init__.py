"""Benchmark harness comparing `bridge` with hand-written DLPack code and peer libraries.

Run ``python -m benchmarks [--quick]``; see ``benchmarks/README.md``.
"""

import os

# torch's OpenMP threads busy-spin between ops unless told otherwise; this must be
# set before torch is imported, so it lives in the package __init__ that every
# benchmark process (runner and workers) imports first.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# `--sync-cpu-dispatch`: JAX runs CPU computations on the calling thread instead of handing
# them to a worker thread (`jax_cpu_enable_async_dispatch=False`). With async dispatch a
# blocked call that comes more than ~10 us after the previous one pays the worker's wake-up
# (~40 us here), which a tight loop of bare JAX calls never does; set before any JAX backend
# is created.
if os.environ.get("BENCH_SYNC_CPU_DISPATCH") == "1":
  import jax

  jax.config.update("jax_cpu_enable_async_dispatch", False)
