"""Time one first call of a wrapped model in this (fresh) process; print one JSON object.

    python -m benchmarks.first_call SYSTEM WORKLOAD

Run by the `transformer_first_call` / `transformer_first_call_composite` /
`gpt2_first_call_s64` workloads, once per sample. Untimed: loading the system (imports, torchax's environment),
one tiny jitted JAX call so that the backend is up, and a warm-up: the system's
`forward` on a tiny `nn.Linear(2, 3)` followed by a `nn.LayerNorm(3)`, placed,
compiled and called once, so that each library's one-time start-up (its device's
first tensor, op tables, first dispatch: about a second for bridge and for
torchax) is paid before, and reported as ``warmup_us``. (The LayerNorm: a linear
layer alone no longer reaches bridge's tensor subclass dispatch, whose first use
makes torch import `torch.distributed.tensor` and sympy, ~0.35 s that torchax
pays in its warm-up; those imports are in `cold_start`'s rows.) Then the model is built (`models.transformer()`, or
`models.gpt2(64)`: a 2-layer GPT-2-shaped `GPT2LMHeadModel` from its config) and
the system's `forward(module, x)` places module and input and builds the
wrapper (``setup_us``). Timed (``first_call_us``): the first call of the
wrapper, i.e. tracing the module, lowering, XLA compilation and one run, until
the output is ready; nothing of the layer has been traced or compiled before.
Everything runs under ``torch.no_grad()``, with torch's MHA fast path allowed
(`transformer_first_call`, as `transformer_block`) or off
(`transformer_first_call_composite`, as `transformer_block_composite`; the
GPT-2 model has no such fast path). The output is checked against torch eager afterwards.

Output: {"first_call_us", "setup_us", "warmup_us"}, or {"skip": reason}.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback


# Workload -> (model builder name in benchmarks.models and its arguments, MHA fast path allowed).
MODELS = {
  "transformer_first_call": (("transformer",), True),
  "transformer_first_call_composite": (("transformer",), False),
  "gpt2_first_call_s64": (("gpt2", 64), True),
}


def measure(name: str, workload: str) -> dict:
  import jax
  import jax.numpy as jnp
  import torch

  from . import models, workloads
  from .common import _contains_jax_array

  system = importlib.import_module(f"benchmarks.systems.{name}").make()
  jax.block_until_ready(jax.jit(lambda a: a + 1)(jnp.zeros(())))
  forward = workloads._need(system, "forward", workload)
  clock = time.perf_counter

  def first_call(module: torch.nn.Module, x: torch.Tensor) -> tuple:
    t0 = clock()
    run, to_cpu = forward(module, x)
    t1 = clock()
    out = run()
    if _contains_jax_array(out):
      jax.block_until_ready(out)
    t2 = clock()
    return to_cpu(out), t1 - t0, t2 - t1

  (builder, *args), fastpath = MODELS[workload]
  build = lambda: getattr(models, builder)(*args)
  with torch.no_grad(), models.mha_fastpath(fastpath):
    with models.seeded(0):
      tiny = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.LayerNorm(3))
    _, warm_setup, warm_call = first_call(tiny, torch.ones(1, 2))
    module, x = build()
    out, setup, first = first_call(module, x)
    reference, x_ref = build()
    workloads._check(out, reference(x_ref), "output", workloads.MODEL_RTOL, workloads.MODEL_ATOL)
  return {
    "first_call_us": first * 1e6,
    "setup_us": setup * 1e6,
    "warmup_us": (warm_setup + warm_call) * 1e6,
  }


PROCESSES = {True: 2, False: 5}  # fresh processes per sample set, by quick
TIMEOUT_S = 300


def sample(python: str, system: str, workload: str, env: dict[str, str]) -> dict:
  """Run one first-call process; its result: {"first_call_us", ...} or {"skip": reason}.

  JAX's persistent compilation cache is off in it, and so are inductor's on-disk caches (its
  FX graph and AOT autograd caches, on by default, would otherwise serve torch.compile's
  first call from an earlier process's compile), so no cache of any library is warm.
  """
  import subprocess
  from pathlib import Path

  env = dict(
    env,
    JAX_ENABLE_COMPILATION_CACHE="false",
    TORCHINDUCTOR_FX_GRAPH_CACHE="0",
    TORCHINDUCTOR_AUTOGRAD_CACHE="0",
  )
  try:
    proc = subprocess.run(
      [python, "-m", "benchmarks.first_call", system, workload],
      cwd=Path(__file__).resolve().parent.parent,
      env=env,
      capture_output=True,
      text=True,
      timeout=TIMEOUT_S,
    )
  except subprocess.TimeoutExpired:
    return {"skip": f"error: first-call process timed out after {TIMEOUT_S}s"}
  lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
  if proc.returncode != 0 or not lines:
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return {"skip": f"error: first-call process failed (rc={proc.returncode}): {tail}"}
  return json.loads(lines[-1])


def summary(system: str, workload: str, samples: list[dict]) -> tuple[dict, str]:
  """The result row ({"median_us", "min_us", "max_us", "n"}) of `samples` and its note."""
  import statistics

  firsts = [s["first_call_us"] for s in samples]
  ms = lambda key: f"{statistics.median(s[key] for s in samples) / 1e3:,.1f} ms"
  note = (
    f"{system}: {workload}: {len(firsts)} fresh processes; not included (medians): "
    f"warm-up on a tiny nn.Linear + nn.LayerNorm (library start-up) {ms('warmup_us')}, placing the "
    f"model and input and building the wrapper {ms('setup_us')}."
  )
  return (
    {
      "median_us": statistics.median(firsts),
      "min_us": min(firsts),
      "max_us": max(firsts),
      "n": len(firsts),
    },
    note,
  )


def main() -> None:
  from . import workloads
  from .worker import _short

  real_stdout, sys.stdout = sys.stdout, sys.stderr  # keep stdout for the one JSON line
  try:
    result = measure(sys.argv[1], sys.argv[2])
  except workloads.Skip as skip:
    result = {"skip": str(skip)}
  except Exception as err:
    result = {"skip": f"error: {_short(err)}"}
    if os.environ.get("BENCH_DEBUG"):
      traceback.print_exc(file=sys.stderr)
  finally:
    sys.stdout = real_stdout
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
