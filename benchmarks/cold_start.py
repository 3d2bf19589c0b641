"""Cold-start figures (issue 28): what a new user meets first, each sample a fresh process.

    python -m benchmarks.cold_start [--quick]

Rows, each against its baseline in the same alternating run (fresh interpreters, taking turns,
so the machine's drift falls on both alike):

- ``import_torch_autoload``: `import torch` with bridge's backend autoload on, against off;
- ``import_bridge``: `import torch; import jax; import bridge`, against `import torch; import
  jax` (the time after `import jax`, in the same interpreter);
- ``first_compile_mlp`` / ``first_call_torch_mlp``: the first `bridge.compile` call of a
  4-16-1 MLP, and the first `call_torch` of it under `jax.jit`, beyond the imports (JAX's own
  first program included: its backend starts there);
- ``demo``: `python -m bridge`, whole;
- ``transformer_first_call_dropout``: the first call of a compiled 2-layer
  `TransformerEncoder(128, 4)` in training mode with `dropout=0.1`, against `dropout=0`.

Before the first sample the bridge's own Python files (`bridge`, `bridge_ops`, the autoload
module) are byte-compiled, as `pip install` does for an installed package: a machine that sets
PYTHONDONTWRITEBYTECODE (this one does) would otherwise compile them from source in every
fresh process, about 0.1 s that no user of an installed wheel pays (torch's and JAX's files are
byte-compiled by their own installs).

Prints one table (medians, with the samples) and the goals; `--write` also puts them into
RESULTS.md's "Cold start" section (stored in results.json, kept by later benchmark runs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

_TIMED = "import time\n_t0 = time.perf_counter()\n{setup}\n_t1 = time.perf_counter()\n{body}\nprint(time.perf_counter() - _t1)\n"

_MLP = """
import torch, jax, jax.numpy as jnp, bridge
torch.manual_seed(0)
mlp = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
"""

_TRANSFORMER = """
import torch, bridge
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(128, 4, 512, dropout={p}, batch_first=True)
model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).train()
x = torch.randn(8, 32, 128)
compiled = bridge.compile(model)
"""

# row -> (baseline label, its (setup, body), measured label, its (setup, body), autoload of each)
ROWS: dict[str, tuple] = {
  "import_torch_autoload": (
    ("autoload off", ("", "import torch"), "0"),
    ("autoload on", ("", "import torch"), "1"),
  ),
  "import_bridge": (
    ("import torch, jax", ("import torch, jax", "pass"), "0"),
    ("+ import bridge", ("import torch, jax", "import bridge"), "0"),
  ),
  "first_compile_mlp": (
    None,
    ("first call", (_MLP, "bridge.compile(mlp)(torch.randn(8, 4)).sum().item()"), "0"),
  ),
  "first_call_torch_mlp": (
    None,
    (
      "first call",
      (_MLP, "jax.jit(lambda x: bridge.call_torch(mlp, x))(jnp.ones((8, 4))).block_until_ready()"),
      "0",
    ),
  ),
  "demo": (None, ("python -m bridge", None, "0")),
  "transformer_first_call_dropout": (
    ("dropout=0", (_TRANSFORMER.format(p=0.0), "compiled(x).sum().item()"), "0"),
    ("dropout=0.1", (_TRANSFORMER.format(p=0.1), "compiled(x).sum().item()"), "0"),
  ),
}


def _sample(code: tuple | None, autoload: str) -> float:
  env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD=autoload, OMP_WAIT_POLICY="PASSIVE")
  if code is None:  # the demo, timed from outside
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bridge"], check=True, capture_output=True, env=env)
    return time.perf_counter() - start
  setup, body = code
  script = _TIMED.format(setup=setup, body=body)
  done = subprocess.run(
    [sys.executable, "-c", script], check=True, capture_output=True, text=True, env=env
  )
  return float(done.stdout.strip().splitlines()[-1])


# Issue 28's targets, row -> (what is compared, goal): "difference", the measured case's median
# minus the baseline's, in seconds; "median", the measured case's, in seconds; "ratio", its
# median over the baseline's.
GOALS = {
  "import_torch_autoload": ("difference", 0.1),
  "import_bridge": ("difference", 0.3),
  "first_compile_mlp": ("median", 0.5),
  "first_call_torch_mlp": ("median", 0.5),
  "demo": ("median", 5.0),
  "transformer_first_call_dropout": ("ratio", 1.3),
}


def byte_compile() -> None:
  """Byte-compiles the bridge's own files as `pip install` would (into their `__pycache__`)."""
  import compileall
  from pathlib import Path

  import bridge
  import bridge_ops

  autoload = Path(bridge.__file__).resolve().parent.parent / "_bridge_autoload.py"
  for package in (bridge, bridge_ops):
    compileall.compile_dir(Path(package.__file__).parent, quiet=1)
  if autoload.exists():
    compileall.compile_file(autoload, quiet=1)


def measure(rounds: int) -> dict:
  """Every row's cases, taking turns `rounds` times: {"cases": [...], "goals": [...]}."""
  byte_compile()
  cases_out, goals_out = [], []
  for row, (baseline, measured) in ROWS.items():
    cases = [c for c in (baseline, measured) if c is not None]
    samples: dict[str, list[float]] = {label: [] for label, _, _ in cases}
    for _ in range(rounds):  # the cases take turns
      for label, code, autoload in cases:
        samples[label].append(_sample(code, autoload))
    medians = {label: statistics.median(v) for label, v in samples.items()}
    for label, values in samples.items():
      cases_out.append({"row": row, "case": label, "median_s": medians[label], "samples": values})
    meas = medians[measured[0]]
    base = medians[baseline[0]] if baseline is not None else None
    kind, goal = GOALS[row]
    if kind == "median":
      value = meas
    elif base is None:  # (a row without a baseline has a "median" goal)
      raise ValueError(f"{row}: a {kind} goal needs a baseline")
    else:
      value = meas - base if kind == "difference" else meas / base
    goals_out.append({"row": row, "kind": kind, "value": value, "goal": goal})
  return {"cases": cases_out, "goals": goals_out}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="fewer rounds")
  parser.add_argument(
    "--write",
    action="store_true",
    help="also store the figures in benchmarks/results.json and rewrite RESULTS.md's cold-start "
    "section (later runs of `python -m benchmarks` keep it)",
  )
  args = parser.parse_args()
  started = time.time()
  figures = measure(3 if args.quick else 7)
  print(f"{'row':34s} {'case':22s} {'median s':>9s}  samples")
  for c in figures["cases"]:
    shown = ", ".join(f"{v:.2f}" for v in c["samples"])
    print(f"{c['row']:34s} {c['case']:22s} {c['median_s']:9.3f}  [{shown}]")
  for g in figures["goals"]:
    print(f"{g['row']:34s} {g['kind']:22s} {g['value']:9.3f}  goal <= {g['goal']}")
  if args.write:
    _write(figures, args.quick, time.time() - started)


def _write(figures: dict, quick: bool, seconds: float) -> None:
  import json

  from . import report
  from .run import HERE

  path = HERE / "results.json"
  results = json.loads(path.read_text())
  info = report.machine_info(quick, seconds)
  results["meta"]["cold_start"] = dict(figures, date=info["date"], mode=info["mode"])
  path.write_text(json.dumps(results, indent=1))
  markdown = report.markdown(
    results["reports"], results["meta"], plots=report.plots(results["reports"], HERE / "plots")
  )
  (HERE / "RESULTS.md").write_text(markdown)
  print(f"[benchmarks] wrote the cold-start section of {HERE / 'RESULTS.md'}")


if __name__ == "__main__":
  main()
