"""Run one system's workloads in this process and print one JSON object.

    python -m benchmarks.worker SYSTEM [--quick] [--only WORKLOAD,...]

Output: {"system", "versions", "env", "results": {workload: {median_us, min_us,
max_us, n}}, "skipped": {workload: reason}, "notes": [...]}.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import platform
import sys
import traceback
from importlib import metadata

from . import interleave, systems

BASE_PACKAGES = ("torch", "jax", "jaxlib", "numpy")


def _version(dist: str) -> str:
  try:
    return metadata.version(dist)
  except metadata.PackageNotFoundError:
    return "not installed"


def _short(err: BaseException) -> str:
  text = f"{type(err).__name__}: {err}".strip().splitlines()
  return (text[0] if text else type(err).__name__)[:300]


def run(name: str, quick: bool, only: list[str] | None) -> dict:
  """Load system `name`, run its workloads, return the result object."""
  # Imported here so that OMP_WAIT_POLICY (set in benchmarks/__init__) precedes torch.
  from . import workloads

  report = {
    "system": name,
    "versions": {"python": platform.python_version()},
    "env": {
      "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", ""),
      "sync_cpu_dispatch": os.environ.get("BENCH_SYNC_CPU_DISPATCH") == "1",
      "interleaved": bool(os.environ.get(interleave.ENV)),
    },
    "executable": sys.executable,
    "results": {},
    "skipped": {},
    "notes": [],
  }
  table = workloads.all_workloads(quick)
  selected = [w for w in table if only is None or w in only]
  try:
    system = importlib.import_module(f"benchmarks.systems.{name}").make()
  except Exception as err:  # the system cannot even load: skip everything
    report["notes"].append(f"failed to load: {_short(err)}")
    report["skipped"] = {w: f"system failed to load: {_short(err)}" for w in selected}
    system = None
  packages = BASE_PACKAGES + (system.packages if system else systems.PACKAGES.get(name, ()))
  report["versions"].update({p: _version(p) for p in packages})
  if system is None:
    return report
  for workload in selected:
    interleave.begin(workload)  # under --interleave: wait for this workload's turn
    try:
      report["results"][workload] = table[workload](system, quick)
    except workloads.Skip as skip:
      report["skipped"][workload] = str(skip)
    except Exception as err:
      report["skipped"][workload] = f"error: {_short(err)}"
      if os.environ.get("BENCH_DEBUG"):
        traceback.print_exc(file=sys.stderr)
    finally:
      gc.collect()  # before `end`: the next workload's timing may start right after
      interleave.end(workload)
  report["notes"].extend(system.notes)
  return report


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.worker", description=__doc__.split("\n")[0]
  )
  parser.add_argument("system", choices=list(systems.ALL))
  parser.add_argument("--quick", action="store_true", help="fewer repetitions, sizes <= 64MiB")
  parser.add_argument("--only", help="comma-separated workload names")
  args = parser.parse_args(argv)
  only = args.only.split(",") if args.only else None
  # Libraries may print; keep stdout for the one JSON line.
  real_stdout, sys.stdout = sys.stdout, sys.stderr
  try:
    report = run(args.system, args.quick, only)
  finally:
    sys.stdout = real_stdout
  print(json.dumps(report), flush=True)


if __name__ == "__main__":
  main()
