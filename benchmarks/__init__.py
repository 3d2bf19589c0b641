"""Benchmark harness comparing `bridge` with hand-written DLPack code and peer libraries.

Run ``python -m benchmarks [--quick]``; see ``benchmarks/README.md``.
"""

import os

# torch's OpenMP threads busy-spin between ops unless told otherwise; this must be
# set before torch is imported, so it lives in the package __init__ that every
# benchmark process (runner and workers) imports first.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
