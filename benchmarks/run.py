"""Run every system's worker in its own subprocess and write benchmarks/RESULTS.md.

    python -m benchmarks [--quick] [--only SYSTEM,...] [--workloads WORKLOAD,...|modules|hf]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from . import report, systems
from .common import HF_WORKLOADS, MODULE_WORKLOADS, WORKLOADS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEERS_PYTHON = ROOT / ".venvs" / "peers" / "bin" / "python"
WORKER_TIMEOUT_S = 900
# Names that --workloads expands to several workloads.
WORKLOAD_GROUPS = {"modules": MODULE_WORKLOADS, "hf": HF_WORKLOADS}


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


def run_worker(name: str, quick: bool, workloads: list[str] | None) -> dict:
    """Run one worker subprocess and return its parsed JSON report."""
    python = _interpreter(name)
    if python is None:
        return _unavailable(name, "peers venv missing: run benchmarks/setup_peers.sh", workloads)
    cmd = [str(python), "-m", "benchmarks.worker", name]
    if quick:
        cmd.append("--quick")
    if workloads:
        cmd += ["--only", ",".join(workloads)]
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    if SYNC_CPU_DISPATCH:
        env["BENCH_SYNC_CPU_DISPATCH"] = "1"
    if name not in systems.BRIDGE:
        # Only the bridge workers load the bridge (torch autoloads it otherwise), and
        # torchax needs the PrivateUse1 backend for itself.
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return _unavailable(name, f"worker timed out after {WORKER_TIMEOUT_S}s", workloads)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return _unavailable(name, f"worker failed (rc={proc.returncode}): {tail}", workloads)
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions, sizes <= 64MiB")
    parser.add_argument("--only", help=f"comma-separated systems (default: all of {','.join(systems.ALL)})")
    parser.add_argument("--workloads", help="comma-separated workload names, 'modules' for "
                        "the module workloads, 'hf' for the Hugging Face ones (default: all)")
    parser.add_argument("--out", type=Path, default=HERE, help="where RESULTS.md and plots/ go")
    parser.add_argument("--sync-cpu-dispatch", action="store_true",
                        help="run JAX CPU computations on the calling thread in every worker "
                        "(jax_cpu_enable_async_dispatch=False)")
    args = parser.parse_args(argv)
    global SYNC_CPU_DISPATCH
    SYNC_CPU_DISPATCH = args.sync_cpu_dispatch

    names = args.only.split(",") if args.only else list(systems.ALL)
    unknown = sorted(set(names) - set(systems.ALL))
    if unknown:
        parser.error(f"unknown systems: {', '.join(unknown)}")
    workloads = [w for name in args.workloads.split(",") for w in WORKLOAD_GROUPS.get(name, (name,))
                 ] if args.workloads else None
    unknown = sorted(set(workloads or ()) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workloads: {', '.join(unknown)} (known: {', '.join(WORKLOADS)})")

    started = time.time()
    print(f"[benchmarks] OMP_WAIT_POLICY=PASSIVE for every worker; {'quick' if args.quick else 'full'} run")
    reports = []
    for name in names:
        t0 = time.time()
        print(f"[benchmarks] {name} ...", end=" ", flush=True)
        reports.append(run_worker(name, args.quick, workloads))
        print(f"{len(reports[-1]['results'])} timed, {len(reports[-1]['skipped'])} skipped "
              f"({time.time() - t0:.1f}s)", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    meta = report.machine_info(args.quick, time.time() - started)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "reports": reports}, indent=1))
    markdown = report.markdown(reports, meta, plots=report.plots(reports, args.out / "plots"))
    (args.out / "RESULTS.md").write_text(markdown)
    print(f"[benchmarks] wrote {args.out / 'RESULTS.md'} in {time.time() - started:.0f}s")


if __name__ == "__main__":
    main()
