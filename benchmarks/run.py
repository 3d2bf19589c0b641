"""Run every system's worker in its own subprocess and write benchmarks/RESULTS.md.

python -m benchmarks [--quick] [--only SYSTEM,...]
                     [--workloads WORKLOAD,...|modules|hf|callback|call_torch|sharded|gpu]
                     [--sequential] [--sync-cpu-dispatch] [--merge] [--out DIR]

The systems are timed in turns (interleaved, benchmarks/interleave.py) unless --sequential
says one after another. A run on a machine without a CUDA GPU keeps the CUDA rows of the
existing results.json, with the header line of the run that measured them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import first_call, interleave, report, systems
from .common import (
  CALL_TORCH_WORKLOADS,
  CALLBACK_WORKLOADS,
  FIRST_CALL_WORKLOADS,
  GPU_WORKLOADS,
  CONV_WORKLOADS,
  HF_WORKLOADS,
  MODULE_WORKLOADS,
  SHARDED_WORKLOADS,
  SHARDED_XLA_FLAGS,
  WORKLOADS,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEERS_PYTHON = ROOT / ".venvs" / "peers" / "bin" / "python"
WORKER_TIMEOUT_S = 900
NO_GPU = "needs a CUDA GPU: this machine has no NVIDIA driver (/dev/nvidiactl)"
# Names that --workloads expands to several workloads.
WORKLOAD_GROUPS = {
  "modules": MODULE_WORKLOADS,
  "hf": HF_WORKLOADS,
  "conv": CONV_WORKLOADS,
  "callback": CALLBACK_WORKLOADS,
  "call_torch": CALL_TORCH_WORKLOADS,
  "sharded": SHARDED_WORKLOADS,
  "gpu": GPU_WORKLOADS,
}


def _interpreter(name: str) -> Path | None:
  """The python that runs `name`: the peers venv for peers (None if missing)."""
  if name not in systems.PEERS:
    return Path(sys.executable)
  return PEERS_PYTHON if PEERS_PYTHON.exists() else None


def _unavailable(name: str, reason: str, workloads: list[str] | None) -> dict:
  return {
    "system": name,
    "versions": {},
    "env": {},
    "results": {},
    "skipped": {w: reason for w in workloads} if workloads else {"all": reason},
    "notes": [f"{name}: {reason}"],
  }


SYNC_CPU_DISPATCH = False  # set by --sync-cpu-dispatch


def run_system(name: str, quick: bool, workloads: list[str] | None) -> dict:
  """One system's report. The sharded and the CUDA workloads run in workers of their own.

  Only the sharded worker gets ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (8
  simulated CPU devices); only the CUDA worker sees the GPU (every other worker runs
  with ``JAX_PLATFORMS=cpu`` and no visible CUDA device, so the CPU rows are CPU rows on
  a GPU machine too). The workers' reports are combined into one.
  """
  selected = list(workloads or WORKLOADS)
  sharded = [w for w in selected if w in SHARDED_WORKLOADS]
  cuda = [w for w in selected if w in GPU_WORKLOADS]
  if _interpreter(name) is None:
    return run_worker(name, quick, workloads)
  rest = [w for w in selected if w not in SHARDED_WORKLOADS and w not in GPU_WORKLOADS]
  parts = [run_worker(name, quick, rest)] if rest else []
  if sharded:
    parts.append(run_worker(name, quick, sharded, xla_flags=SHARDED_XLA_FLAGS))
  if cuda and not Path("/dev/nvidiactl").exists():  # no NVIDIA driver: no worker to start
    parts.append(dict(_unavailable(name, NO_GPU, cuda), notes=[]))
  elif cuda:
    parts.append(run_worker(name, quick, cuda, gpu=True))
  return _combine(parts)


def _combine(parts: list[dict]) -> dict:
  """One report from the reports of one system's workers (the first gives the metadata)."""
  report = dict(parts[0], results={}, skipped={}, notes=[], versions={})
  for part in parts:
    report["results"].update(part["results"])
    report["skipped"].update(part["skipped"])
    report["notes"] += [n for n in part["notes"] if n not in report["notes"]]
    report["versions"].update(part["versions"])
  return report


def run_worker(
  name: str, quick: bool, workloads: list[str] | None, xla_flags: str = "", gpu: bool = False
) -> dict:
  """Run one worker subprocess and return its parsed JSON report.

  `xla_flags` are appended to the worker's XLA_FLAGS (the sharded workloads' device count);
  only a `gpu` worker sees CUDA devices.
  """
  python = _interpreter(name)
  if python is None:
    return _unavailable(name, PEERS_MISSING, workloads)
  try:
    proc = subprocess.run(
      _worker_cmd(python, name, quick, workloads),
      cwd=ROOT,
      env=_worker_env(name, xla_flags, gpu),
      capture_output=True,
      text=True,
      timeout=WORKER_TIMEOUT_S,
    )
  except subprocess.TimeoutExpired:
    return _unavailable(name, f"worker timed out after {WORKER_TIMEOUT_S}s", workloads)
  return _worker_report(name, proc.returncode, proc.stdout, proc.stderr, workloads)


PEERS_MISSING = "peers venv missing: run benchmarks/setup_peers.sh"


def _worker_cmd(python: Path, name: str, quick: bool, workloads: list[str] | None) -> list[str]:
  cmd = [str(python), "-m", "benchmarks.worker", name]
  if quick:
    cmd.append("--quick")
  if workloads:
    cmd += ["--only", ",".join(workloads)]
  return cmd


def _worker_env(name: str, xla_flags: str = "", gpu: bool = False) -> dict[str, str]:
  """The environment of a process that runs system `name` (a worker, a first-call sample)."""
  env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
  if SYNC_CPU_DISPATCH:
    env["BENCH_SYNC_CPU_DISPATCH"] = "1"
  if xla_flags:
    env["XLA_FLAGS"] = " ".join(f for f in (env.get("XLA_FLAGS", ""), xla_flags) if f)
  if not gpu:
    env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
  if name not in systems.BRIDGE:
    # Only the bridge workers load the bridge (torch autoloads it otherwise), and
    # torchax needs the PrivateUse1 backend for itself.
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
  return env


def _worker_report(
  name: str, returncode: int, stdout: str, stderr: str, workloads: list[str] | None
) -> dict:
  lines = [line for line in stdout.splitlines() if line.startswith("{")]
  if returncode != 0 or not lines:
    tail = (stderr.strip().splitlines() or ["no output"])[-1][:300]
    return _unavailable(name, f"worker failed (rc={returncode}): {tail}", workloads)
  return json.loads(lines[-1])


def run_interleaved(names: list[str], quick: bool, workloads: list[str] | None) -> list[dict]:
  """Every system's report, with the systems timed in turns (benchmarks/interleave.py)."""
  selected = list(workloads or WORKLOADS)
  firsts = [w for w in selected if w in FIRST_CALL_WORKLOADS]
  apart = [w for w in selected if w in SHARDED_WORKLOADS or w in GPU_WORKLOADS]
  steady = [w for w in selected if w not in firsts and w not in apart]
  parts: dict[str, list[dict]] = {name: [] for name in names}
  if steady:
    for report_ in _interleaved_workers(names, quick, steady):
      parts[report_["system"]].append(report_)
  if firsts:
    for report_ in _interleaved_first_calls(names, quick, firsts):
      parts[report_["system"]].append(report_)
  if apart:
    for name in names:
      print(f"[benchmarks] {name}: {', '.join(apart)} ...", flush=True)
      parts[name].append(run_system(name, quick, apart))
  return [_combine(parts[name]) for name in names]


def _interleaved_workers(names: list[str], quick: bool, workloads: list[str]) -> list[dict]:
  procs, channels, reports = {}, {}, []
  for name in names:
    python = _interpreter(name)
    if python is None:
      reports.append(_unavailable(name, PEERS_MISSING, workloads))
      continue
    to_worker, from_worker = os.pipe(), os.pipe()
    env = _worker_env(name)
    env[interleave.ENV] = f"{to_worker[0]},{from_worker[1]}"
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    procs[name] = (
      subprocess.Popen(
        _worker_cmd(python, name, quick, workloads),
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=err,
        text=True,
        pass_fds=(to_worker[0], from_worker[1]),
      ),
      out,
      err,
    )
    os.close(to_worker[0])
    os.close(from_worker[1])
    channels[name] = interleave.Channel(
      os.fdopen(from_worker[0], "r"), os.fdopen(to_worker[1], "w")
    )
  # A hung worker would block the coordinator: past the time limit, every worker is killed
  # (their pipes close, and the coordinator moves on).
  watchdog = threading.Timer(
    WORKER_TIMEOUT_S * max(len(procs), 1), lambda: [p.kill() for p, _, _ in procs.values()]
  )
  watchdog.start()
  try:
    interleave.coordinate(
      channels, names, lambda line: print(f"[benchmarks] interleaved: {line}", flush=True)
    )
    for name, (proc, out, err) in procs.items():
      returncode = proc.wait()
      out.seek(0)
      err.seek(0)
      reports.append(_worker_report(name, returncode, out.read(), err.read(), workloads))
  finally:
    watchdog.cancel()
  return reports


def _interleaved_first_calls(names: list[str], quick: bool, workloads: list[str]) -> list[dict]:
  """The first-call samples, one fresh process at a time, the systems in turn."""
  reports = {
    name: {"system": name, "versions": {}, "env": {}, "results": {}, "skipped": {}, "notes": []}
    for name in names
  }
  for workload in workloads:
    samples: dict[str, list[dict]] = {name: [] for name in names}
    print(f"[benchmarks] interleaved: {workload}: {', '.join(names)}", flush=True)
    for _ in range(first_call.PROCESSES[quick]):
      for name in names:
        python = _interpreter(name)
        report_ = reports[name]
        if workload in report_["skipped"]:
          continue
        if python is None:
          report_["skipped"][workload] = PEERS_MISSING
          continue
        result = first_call.sample(str(python), name, workload, _worker_env(name))
        if "skip" in result:
          report_["skipped"][workload] = result["skip"]
        else:
          samples[name].append(result)
    for name in names:
      if samples[name] and workload not in reports[name]["skipped"]:
        row, note = first_call.summary(name, workload, samples[name])
        reports[name]["results"][workload] = row
        reports[name]["notes"].append(note)
  return list(reports.values())


def merge(old: dict, reports: list[dict], run: dict) -> dict:
  """`old` results.json with this run's `reports` merged in, system by system.

  A (system, workload) that this run timed or skipped replaces the old entry; every
  other old row stays. Notes are the union; systems new to the file are added in
  report order. `run` (this run's date, mode, seconds, systems and workloads) is
  appended to meta["merged"], which RESULTS.md lists under its header.
  """
  by_name = {r["system"]: r for r in old["reports"]}
  for new in reports:
    mine = by_name.get(new["system"])
    if mine is None:
      by_name[new["system"]] = new
      continue
    ran = set(new["results"]) | set(new["skipped"])
    if "all" in new["skipped"]:  # the worker did not run: keep the old rows
      ran = set()
    mine["results"] = {w: r for w, r in mine["results"].items() if w not in ran}
    mine["skipped"] = {w: r for w, r in mine["skipped"].items() if w not in ran}
    mine["results"].update({w: r for w, r in new["results"].items() if w in ran})
    mine["skipped"].update({w: r for w, r in new["skipped"].items() if w in ran})
    mine["notes"] += [n for n in new["notes"] if n not in mine["notes"]]
    mine["versions"].update(new["versions"])
  order = {name: i for i, name in enumerate(systems.ALL)}
  # an earlier merge whose rows this run all replaced is no longer worth a header line
  earlier = [
    m
    for m in old["meta"].get("merged", [])
    if not (
      set(m.get("systems", ())) <= set(run.get("systems", ()))
      and set(m.get("workloads", ())) <= set(run.get("workloads", ()))
    )
  ]
  meta = dict(old["meta"], merged=earlier + [run])
  return {
    "meta": meta,
    "reports": sorted(by_name.values(), key=lambda r: order.get(r["system"], len(order))),
  }


def keep_gpu_rows(old: dict, results: dict) -> dict:
  """`results` with the CUDA rows of `old` kept where this run measured none (no GPU here).

  A run on a CPU machine cannot measure the CUDA rows; they stay as the GPU run measured
  (and skipped) them (`merge_gpu`), with that run's header line, its notes and
  `tests/gpu/measure.py`'s figures. A run that timed any CUDA row replaces them all.
  """
  if any(w in GPU_WORKLOADS for r in results["reports"] for w in r["results"]):
    return results
  gpu_runs = [
    m for m in old["meta"].get("merged", []) if set(m.get("workloads", ())) <= set(GPU_WORKLOADS)
  ]
  if not gpu_runs:
    return results
  reports = [dict(r) for r in results["reports"]]
  by_name = {r["system"]: r for r in reports}
  for before in old["reports"]:
    kept = {w: row for w, row in before["results"].items() if w in GPU_WORKLOADS}
    if not kept:
      continue
    mine = by_name.get(before["system"])
    if mine is None:  # a system this run did not start: only its CUDA rows
      mine = dict(before, results={}, skipped={}, notes=[])
      reports.append(mine)
    mine["results"] = dict(mine["results"], **kept)
    mine["skipped"] = {
      **{w: why for w, why in mine["skipped"].items() if w not in GPU_WORKLOADS},
      **{w: why for w, why in before["skipped"].items() if w in GPU_WORKLOADS},
    }
    ours = f"{before['system']}: CUDA rows"
    gpu_notes = [n for n in before["notes"] if n.startswith(ours) and n not in mine["notes"]]
    mine["notes"] = mine["notes"] + gpu_notes
  meta = dict(results["meta"], merged=gpu_runs)
  if "gpu_figures" in old["meta"]:
    meta["gpu_figures"] = old["meta"]["gpu_figures"]
  return {"meta": meta, "reports": reports}


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="few repetitions, sizes <= 64MiB")
  parser.add_argument(
    "--only", help=f"comma-separated systems (default: all of {','.join(systems.ALL)})"
  )
  parser.add_argument(
    "--workloads",
    help="comma-separated workload names, 'modules' for "
    "the module workloads, 'hf' for the Hugging Face ones, 'conv' for the conv "
    "nets, 'callback' for torch called from JAX in callback mode, 'call_torch' for it in trace "
    "mode, 'sharded' for data parallel on 8 simulated CPU devices, 'gpu' for "
    "the CUDA rows (skipped without a CUDA GPU) (default: all)",
  )
  parser.add_argument("--out", type=Path, default=HERE, help="where RESULTS.md and plots/ go")
  parser.add_argument(
    "--sync-cpu-dispatch",
    action="store_true",
    help="run JAX CPU computations on the calling thread in every worker "
    "(jax_cpu_enable_async_dispatch=False)",
  )
  parser.add_argument(
    "--sequential",
    action="store_true",
    help="time the systems one after another, each in its own worker, instead of in turns "
    "(the default: every system's worker starts at once and they take turns, block by "
    "block, and the first-call processes alternate too, so that machine noise falls on "
    "all systems alike: benchmarks/interleave.py)",
  )
  parser.add_argument(  # the default since the full page comes from one interleaved run
    "--interleave", action="store_true", help=argparse.SUPPRESS
  )
  parser.add_argument(
    "--merge",
    action="store_true",
    help="merge this run's rows into the existing results.json (other rows "
    "kept) and rewrite RESULTS.md from the merged results",
  )
  args = parser.parse_args(argv)
  global SYNC_CPU_DISPATCH
  SYNC_CPU_DISPATCH = args.sync_cpu_dispatch

  names = args.only.split(",") if args.only else list(systems.ALL)
  unknown = sorted(set(names) - set(systems.ALL))
  if unknown:
    parser.error(f"unknown systems: {', '.join(unknown)}")
  workloads = (
    [w for name in args.workloads.split(",") for w in WORKLOAD_GROUPS.get(name, (name,))]
    if args.workloads
    else None
  )
  unknown = sorted(set(workloads or ()) - set(WORKLOADS))
  if unknown:
    parser.error(f"unknown workloads: {', '.join(unknown)} (known: {', '.join(WORKLOADS)})")

  old = None
  if args.merge and (args.out / "results.json").exists():
    old = json.loads((args.out / "results.json").read_text())
    old_sync = any(r.get("env", {}).get("sync_cpu_dispatch") for r in old["reports"])
    if old_sync != SYNC_CPU_DISPATCH:
      parser.error(
        f"--merge: {args.out / 'results.json'} was measured with "
        f"{'synchronous' if old_sync else 'asynchronous'} JAX CPU dispatch; "
        f"run {'with' if old_sync else 'without'} --sync-cpu-dispatch to merge"
      )

  started = time.time()
  print(
    f"[benchmarks] OMP_WAIT_POLICY=PASSIVE for every worker; {'quick' if args.quick else 'full'} run"
  )
  interleaved = not args.sequential
  if interleaved:
    reports = run_interleaved(names, args.quick, workloads)
  else:
    reports = []
    for name in names:
      t0 = time.time()
      print(f"[benchmarks] {name} ...", end=" ", flush=True)
      reports.append(run_system(name, args.quick, workloads))
      print(
        f"{len(reports[-1]['results'])} timed, {len(reports[-1]['skipped'])} skipped "
        f"({time.time() - t0:.1f}s)",
        flush=True,
      )

  args.out.mkdir(parents=True, exist_ok=True)
  meta = dict(report.machine_info(args.quick, time.time() - started), interleaved=interleaved)
  results = {"meta": meta, "reports": reports}
  if old is not None:
    results = merge(old, reports, dict(meta, systems=names, workloads=workloads or "all"))
  elif (args.out / "results.json").exists():
    previous = json.loads((args.out / "results.json").read_text())
    results = keep_gpu_rows(previous, results)
    if "cold_start" in previous["meta"]:  # (benchmarks.cold_start's figures: kept)
      results["meta"]["cold_start"] = previous["meta"]["cold_start"]
  (args.out / "results.json").write_text(json.dumps(results, indent=1))
  reports, meta = results["reports"], results["meta"]
  drawn = report.plots(reports, args.out / "plots", required=not args.quick)
  markdown = report.markdown(reports, meta, plots=drawn)
  (args.out / "RESULTS.md").write_text(markdown)
  print(f"[benchmarks] wrote {args.out / 'RESULTS.md'} in {time.time() - started:.0f}s")


if __name__ == "__main__":
  main()
