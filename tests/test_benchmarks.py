"""The benchmark workers for the bridge still run and check their outputs (peers are not run in CI)."""

from __future__ import annotations

import json
import re
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
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
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
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout)
  assert set(result) == {"first_call_us", "setup_us", "warmup_us"}, result
  assert result["first_call_us"] > 0


def _fake_report(system: str, medians: dict[str, float], skipped: dict[str, str]) -> dict:
  results = {w: {"median_us": m, "min_us": m, "max_us": m, "n": 1} for w, m in medians.items()}
  return {
    "system": system,
    "versions": {},
    "env": {},
    "results": results,
    "skipped": skipped,
    "notes": [],
  }


def test_report_goals_table():
  reports = [
    _fake_report("bridge", {"compiled_linear": 30.0, "mlp_train_step": 100.0}, {}),
    _fake_report("plain_jax", {"compiled_linear": 20.0}, {"mlp_train_step": "why not"}),
  ]
  meta = {
    "date": "now",
    "mode": "quick",
    "seconds": 1.0,
    "nproc": 2,
    "cpu": "cpu",
    "memory_gib": 1.0,
    "platform": "linux",
  }
  text = report.markdown(reports, meta, plots=[])
  assert "| compiled_linear | bridge / plain_jax | 1.50 | <= 1.5 | met |" in text
  assert (
    "| mlp_train_step | bridge / plain_jax | n/a | <= 1.05 | plain_jax skipped: why not |" in text
  )
  assert "### compiled_linear" in text


def test_gpu_workloads_with_the_cpu_standing_in(monkeypatch):
  """The CUDA rows' code (placement, output checks, timing, notes) runs here with the CPU
  standing in for the GPU: `require_cuda` passes, `.cuda()` keeps tensors where they are and
  the "GPU" arrays are CPU arrays. On a machine without a GPU the rows are skipped with the
  reason; this keeps their code from rotting until one runs them."""
  import importlib

  import jax.numpy as jnp
  import torch

  from benchmarks import gpu, workloads

  monkeypatch.setattr(gpu, "require_cuda", lambda: None)
  monkeypatch.setattr(gpu, "describe", lambda: "CUDA rows on a stand-in CPU")
  monkeypatch.setattr(gpu, "_jax_gpu_array", jnp.asarray)
  monkeypatch.setattr(gpu, "SOFTMAX_SHAPE", (64, 128))  # the Pallas interpreter is slow
  monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
  monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, *a, **k: self)
  table = gpu.workloads(quick=True)
  names = (
    "cuda_to_jax_1MiB",
    "cuda_to_torch_1MiB",
    "cuda_pallas_softmax",
    "cuda_mlp_train_step",
    "cuda_transformer_block",
  )
  ran: dict[str, set] = {}
  for name in ("bridge", "dlpack_manual", "plain_jax", "torch_eager"):
    system = importlib.import_module(f"benchmarks.systems.{name}").make()
    ran[name] = set()
    for workload in names:
      try:
        result = table[workload](system, True)
      except workloads.Skip as skip:
        # only "this system has no such capability": never a wrong output or an error
        assert not str(skip).startswith(("wrong output", "error")), (name, workload, skip)
        continue
      assert 0 < result["min_us"] <= result["median_us"] <= result["max_us"], (name, workload)
      ran[name].add(workload)
    assert not any("copies" in note for note in system.notes), system.notes
    if ran[name]:
      assert f"{name}: CUDA rows on a stand-in CPU" in system.notes
  assert ran["bridge"] == set(names)
  assert ran["dlpack_manual"] == {"cuda_to_jax_1MiB", "cuda_to_torch_1MiB", "cuda_pallas_softmax"}
  assert ran["plain_jax"] == {"cuda_pallas_softmax", "cuda_mlp_train_step"}
  assert ran["torch_eager"] == {
    "cuda_pallas_softmax",
    "cuda_mlp_train_step",
    "cuda_transformer_block",
  }


def test_gpu_workloads_skip_without_a_gpu():
  import torch

  from benchmarks import gpu, workloads
  from benchmarks.systems import torch_eager

  if torch.cuda.is_available():
    pytest.skip("this machine has a CUDA GPU")
  with pytest.raises(workloads.Skip, match="needs a CUDA GPU"):
    gpu.workloads(quick=True)["cuda_pallas_softmax"](torch_eager.make(), True)


def _pipe_pair():
  import os

  from benchmarks import interleave

  a_r, b_w = os.pipe()
  b_r, a_w = os.pipe()
  return (
    interleave.Channel(os.fdopen(a_r, "r"), os.fdopen(a_w, "w")),
    interleave.Channel(os.fdopen(b_r, "r"), os.fdopen(b_w, "w")),
  )


def test_interleaved_timing_alternates_blocks_and_waits_for_each_workload():
  """The coordinator lets only the workers on one workload set up and time, and their
  blocks alternate; a worker on another workload waits until that one is done."""
  import threading

  from benchmarks import interleave

  events = []  # (system, what), in the order it happened
  lock = threading.Lock()

  def worker(name, ch, workloads):
    for w in workloads:
      ch.send(f"begin {w}")
      assert ch.recv() == "setup"
      with lock:
        events.append((name, f"setup {w}"))

      def fn():
        with lock:
          if not events or events[-1] != (name, w):
            events.append((name, w))  # a new block of this worker's calls

      samples = interleave.timed_blocks(ch, fn, min_reps=5, max_reps=10**9, budget_s=0.2)
      assert len(samples) >= 5
      ch.send(f"end {w}")
    ch.write.close()

  plan = {"a": ["w1", "w2"], "b": ["w1", "w2"], "c": ["w2"]}
  coordinator_ends, threads = {}, []
  for name, workloads in plan.items():
    mine, theirs = _pipe_pair()
    coordinator_ends[name] = mine
    threads.append(threading.Thread(target=worker, args=(name, theirs, workloads)))
  for t in threads:
    t.start()
  interleave.coordinate(coordinator_ends, ["a", "b", "c"], lambda line: None)
  for t in threads:
    t.join(timeout=30)
    assert not t.is_alive()
  # c announced w2 at once, but set it up only after a and b had timed w1
  first_w1_end = max(i for i, e in enumerate(events) if e[1] == "w1")
  assert events.index(("c", "setup w2")) > first_w1_end
  for w, group in (("w1", "ab"), ("w2", "abc")):
    blocks = [name for name, what in events if what == w]
    assert set(blocks) == set(group)
    # each worker's blocks come in turns: while all are timing, no worker runs twice in a row
    n = min(blocks.count(name) for name in group)
    head = blocks[: n * len(group)]
    assert all(head[i] != head[i + 1] for i in range(len(head) - 1)), head
    assert n >= interleave.ROUNDS // 2


def test_interleaved_run_end_to_end(tmp_path):
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "benchmarks",
      "--quick",  # interleaved: the default
      "--only",
      "bridge,plain_jax",
      "--workloads",
      "call_small,compiled_linear",
      "--out",
      str(tmp_path),
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert "[benchmarks] interleaved: call_small: bridge, plain_jax" in out.stdout
  results = json.loads((tmp_path / "results.json").read_text())
  assert results["meta"]["interleaved"] is True
  for r in results["reports"]:
    assert r["env"]["interleaved"] is True
    assert set(r["results"]) == {"call_small", "compiled_linear"}, (r["system"], r["skipped"])
  page = (tmp_path / "RESULTS.md").read_text()
  assert "quick, interleaved run" in page
  # each goal's ratio with its spread over the rounds (the blocks timed side by side)
  bridge_rounds = next(r for r in results["reports"] if r["system"] == "bridge")["results"]
  assert len(bridge_rounds["compiled_linear"]["rounds_us"]) >= 2
  row = next(
    line for line in page.splitlines() if "| compiled_linear | bridge / plain_jax |" in line
  )
  assert re.search(
    r"\| \d+\.\d\d \(\d+\.\d\d-\d+\.\d\d\) \| <= 1.5 \| (met|not met|within spread) \|", row
  ), row
  # the plots (matplotlib comes with the test extras, as with the bench extra)
  drawn = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
  assert len(drawn) >= 2, drawn
  for name in drawn:
    assert f"(plots/{name})" in page


def test_a_run_without_a_gpu_keeps_the_cuda_rows_of_their_gpu_run():
  from benchmarks import run
  from benchmarks.common import GPU_WORKLOADS

  cuda = GPU_WORKLOADS[0]
  gpu_run = {
    "date": "2026-11-26 15:06 UTC",
    "workloads": list(GPU_WORKLOADS),
    "systems": ["bridge"],
  }
  cpu_run = {"date": "2026-11-21", "workloads": ["call_small"], "systems": ["bridge"]}
  old = {
    "meta": {"merged": [cpu_run, gpu_run], "gpu_figures": ["| figure |"]},
    "reports": [
      _fake_report("bridge", {"call_small": 20.0, cuda: 100.0}, {}),
      _fake_report("torch_eager", {cuda: 50.0}, {GPU_WORKLOADS[1]: "not applicable"}),
    ],
  }
  old["reports"][0]["notes"] = ["bridge: CUDA rows on an H100", "bridge: an old CPU note"]
  new = {
    "meta": {"date": "2026-11-27"},
    "reports": [_fake_report("bridge", {"call_small": 15.0}, {cuda: run.NO_GPU})],
  }
  kept = run.keep_gpu_rows(old, new)
  bridge, torch_eager = kept["reports"]
  assert bridge["results"]["call_small"] == new["reports"][0]["results"]["call_small"]
  assert bridge["results"][cuda] == old["reports"][0]["results"][cuda]
  assert cuda not in bridge["skipped"]
  assert bridge["notes"] == ["bridge: CUDA rows on an H100"]
  assert torch_eager["system"] == "torch_eager"
  assert set(torch_eager["results"]) == {cuda}
  assert torch_eager["skipped"] == {GPU_WORKLOADS[1]: "not applicable"}
  # the header names the GPU run (and only it) as merged in; the figures stay
  assert kept["meta"]["merged"] == [gpu_run]
  assert kept["meta"]["gpu_figures"] == ["| figure |"]
  assert kept["meta"]["date"] == "2026-11-27"
  # a run that measured a CUDA row replaces them all
  measured = {"meta": {}, "reports": [_fake_report("bridge", {cuda: 90.0}, {})]}
  assert run.keep_gpu_rows(old, measured) is measured


def test_cold_start_section_renders_cases_and_goals():
  figures = {
    "date": "2026-11-27 23:40 UTC",
    "mode": "full",
    "cases": [
      {"row": "import_bridge", "case": "import torch, jax", "median_s": 0.0, "samples": [0.0]},
      {"row": "import_bridge", "case": "+ import bridge", "median_s": 0.14, "samples": [0.14]},
      {"row": "demo", "case": "python -m bridge", "median_s": 5.5, "samples": [5.5, 5.6]},
    ],
    "goals": [
      {"row": "import_bridge", "kind": "difference", "value": 0.14, "goal": 0.3},
      {"row": "demo", "kind": "median", "value": 5.5, "goal": 5.0},
    ],
  }
  text = "\n".join(report._cold_start(figures))
  assert "## Cold start (fresh processes)" in text
  assert "| import_bridge | + import bridge | 0.140 | 0.14 |" in text
  assert "| import_bridge | seconds beyond the baseline | 0.140 | <= 0.3 | met |" in text
  assert "| demo | seconds | 5.500 | <= 5.0 | not met |" in text
  assert report._cold_start(None) == []
