"""Bring a GPU machine's results home: merge the CUDA rows of `tests/gpu/run_on_gpu.sh`'s run
into benchmarks/results.json and rewrite benchmarks/RESULTS.md (with the figures of
tests/gpu/measure.py under the CUDA section).

    python -m benchmarks.merge_gpu GPU_OUT     # the folder the script wrote ($OUT)

GPU_OUT/bench/results.json holds the rows of `python -m benchmarks --workloads gpu` (every row
with its baselines from that same run); GPU_OUT/gpu_figures.md, if present, the table of
measure.py (each figure beside its baseline from the same process).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from . import report
from .common import GPU_WORKLOADS
from .run import HERE, merge


def main(argv: list[str] | None = None) -> None:
  args = sys.argv[1:] if argv is None else argv
  if len(args) != 1:
    raise SystemExit("usage: python -m benchmarks.merge_gpu GPU_OUT")
  out = Path(args[0])
  new = json.loads((out / "bench" / "results.json").read_text())
  old = json.loads((HERE / "results.json").read_text())
  names = [r["system"] for r in new["reports"]]
  for r in new["reports"]:  # (the header's versions stay the CPU run's: the GPU machine's
    r["versions"] = {}  # CUDA builds are named in each system's notes)
  run = dict(new["meta"], systems=names, workloads=list(GPU_WORKLOADS))
  results = merge(old, new["reports"], run)
  figures = out / "gpu_figures.md"
  if figures.exists():
    results["meta"]["gpu_figures"] = figures.read_text().rstrip("\n").split("\n")
  (HERE / "results.json").write_text(json.dumps(results, indent=1))
  markdown = report.markdown(
    results["reports"], results["meta"], plots=report.plots(results["reports"], HERE / "plots")
  )
  (HERE / "RESULTS.md").write_text(markdown)
  print(
    f"[benchmarks] merged {len(names)} systems' CUDA rows from {out}; wrote {HERE / 'RESULTS.md'}"
  )


if __name__ == "__main__":
  main()
