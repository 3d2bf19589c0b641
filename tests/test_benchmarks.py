"""The benchmark worker for the bridge still runs and checks its outputs (peers are not run in CI)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent


def test_bridge_benchmark_worker_quick():
  workloads = "call_small,fwd_bwd_small,to_jax_1KiB,to_torch_1MiB"
  out = subprocess.run(
      [sys.executable, "-m", "benchmarks.worker", "bridge", "--quick", "--only", workloads],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout)
  assert report["system"] == "bridge"
  assert not report["skipped"], report["skipped"]
  assert set(report["results"]) == set(workloads.split(","))
  for name, r in report["results"].items():
    assert 0 < r["min_us"] <= r["median_us"] <= r["max_us"], (name, r)
  assert not any("copies" in note for note in report["notes"]), report["notes"]
