"""The benchmark workers for the bridge still run and check their outputs (peers are not run in CI)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from benchmarks import report

ROOT = pathlib.Path(__file__).parent.parent

WORKER_CASES = [
    ("bridge", "call_small,fwd_bwd_small,to_jax_1KiB,to_torch_1MiB"),
    ("bridge", "compiled_linear,mlp_train_step,transformer_block"),
    ("bridge_jax", "compiled_linear"),
    ("bridge", "gpt2_forward_s64"),  # issue 7: a Hugging Face model (transformers, offline)
]


@pytest.mark.parametrize("system,workloads", WORKER_CASES)
def test_bridge_benchmark_worker_quick(system, workloads):
  if "gpt2" in workloads or "bert" in workloads:
    pytest.importorskip("transformers")
  out = subprocess.run(
      [sys.executable, "-m", "benchmarks.worker", system, "--quick", "--only", workloads],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout)
  assert result["system"] == system
  assert not result["skipped"], result["skipped"]
  assert set(result["results"]) == set(workloads.split(","))
  for name, r in result["results"].items():
    assert 0 < r["min_us"] <= r["median_us"] <= r["max_us"], (name, r)
  assert not any("copies" in note for note in result["notes"]), result["notes"]


def test_first_call_process():
  out = subprocess.run(
      [sys.executable, "-m", "benchmarks.first_call", "bridge", "transformer_first_call"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout)
  assert set(result) == {"first_call_us", "setup_us", "warmup_us"}, result
  assert result["first_call_us"] > 0


def _fake_report(system: str, medians: dict[str, float], skipped: dict[str, str]) -> dict:
  results = {w: {"median_us": m, "min_us": m, "max_us": m, "n": 1} for w, m in medians.items()}
  return {"system": system, "versions": {}, "env": {}, "results": results, "skipped": skipped,
          "notes": []}


def test_report_goals_table():
  reports = [
      _fake_report("bridge", {"compiled_linear": 30.0, "mlp_train_step": 100.0}, {}),
      _fake_report("plain_jax", {"compiled_linear": 20.0}, {"mlp_train_step": "why not"}),
  ]
  meta = {"date": "now", "mode": "quick", "seconds": 1.0, "nproc": 2, "cpu": "cpu",
          "memory_gib": 1.0, "platform": "linux"}
  text = report.markdown(reports, meta, plots=[])
  assert "| compiled_linear | bridge / plain_jax | 1.50 | <= 1.5 | met |" in text
  assert "| mlp_train_step | bridge / plain_jax | n/a | <= 1.05 | plain_jax skipped: why not |" in text
  assert "### compiled_linear" in text
