"""Turn worker reports into RESULTS.md tables and (if matplotlib is importable) PNG plots."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from pathlib import Path

from .common import (
  CALL_TORCH_WORKLOADS,
  CALLBACK_WORKLOADS,
  CONV_WORKLOADS,
  GPU_WORKLOADS,
  HF_WORKLOADS,
  MODULE_WORKLOADS,
  SHARDED_DEVICES,
  SHARDED_WORKLOADS,
  SHARDED_XLA_FLAGS,
  SIZES,
)
from .systems import ALL, BASELINE

CALL_WORKLOADS = ("call_small", "fwd_bwd_small", "eager_add")
CALLBACK_TITLE = "torch called from JAX (callback mode)"
CALL_TORCH_TITLE = "torch called from JAX (trace mode): call_torch under jax.jit, jit(grad), vmap"
SHARDED_TITLE = (
  f"Data parallel on {SHARDED_DEVICES} simulated CPU devices: MLP 512-1024-1024-10 "
  "training step, batch 256, cross-entropy, optax.sgd"
)
GPU_TITLE = "CUDA GPU: transfers, a Pallas (Triton) kernel called from torch, models on the GPU"
GROUPS = {
  "Per-call overhead, f(x) = x*2+1 on a (16, 16) float32 tensor": CALL_WORKLOADS[:2],
  "One eager op on the system's device: x + y, (16, 16) float32": ("eager_add",),
  "to_jax: float32 torch CPU tensor -> JAX array": tuple(f"to_jax_{s}" for s in SIZES),
  "to_torch: float32 JAX CPU array -> torch tensor": tuple(f"to_torch_{s}" for s in SIZES),
  "Compiled module call: nn.Linear(16, 16) on (8, 16) float32, torch.no_grad()": (
    "compiled_linear",
  ),
  "MLP training step: 784-256-256-10, batch 64, cross-entropy, SGD": ("mlp_train_step",),
  "Transformer block: TransformerEncoderLayer(128, 4 heads, ff 256), (4, 32, 128), eval, "
  "torch.no_grad()": tuple(
    w for w in MODULE_WORKLOADS if w.startswith("transformer") and "train" not in w
  ),
  "Transformer block training step: the same layer in train mode (dropout 0), cross-entropy on "
  "its (128, 128) outputs, SGD": ("transformer_train_step",),
  "Hugging Face GPT2LMHeadModel (768 wide, 12 heads, 2 layers, vocab 8192), batch 1, eval, "
  "torch.no_grad(), logits": ("gpt2_forward_s64", "gpt2_forward_s256", "gpt2_first_call_s64"),
  "Hugging Face BertModel (hidden 512, 8 heads, 4 layers, intermediate 2048), batch 1, eval, "
  "torch.no_grad(), last_hidden_state": ("bert_forward_s64", "bert_forward_s256"),
  "Hugging Face GPT-2 training step: the same model, sequence 64, next-token cross-entropy, SGD": (
    "gpt2_train_step_s64",
  ),
  "Conv nets (torchvision's resnet18 and mobilenet_v3_small, 1000 classes), eval, "
  "torch.no_grad(): 1x3x224x224 and 8x3x64x64": tuple(w for w in CONV_WORKLOADS if "forward" in w),
  "Conv net fine-tuning step: the same nets on 8x3x64x64, BatchNorm frozen (eval), "
  "cross-entropy, SGD": tuple(w for w in CONV_WORKLOADS if "train" in w),
  CALLBACK_TITLE: CALLBACK_WORKLOADS,
  CALL_TORCH_TITLE: CALL_TORCH_WORKLOADS,
  SHARDED_TITLE: SHARDED_WORKLOADS,
  GPU_TITLE: GPU_WORKLOADS,
}
# Groups whose tables give ratios against these systems (system / reference) instead of
# against the baseline, with a paragraph saying what is timed.
REFERENCES = {
  CALLBACK_TITLE: ("wrap_torch2jax", "torch_eager"),
  CALL_TORCH_TITLE: ("plain_jax", "torch_eager"),
  SHARDED_TITLE: ("plain_jax",),
}
INTROS = {
  GPU_TITLE: [
    "Run by the same command on a machine with torch and JAX for CUDA (`--workloads gpu` for "
    "these rows alone); their worker is the only one that sees the GPU, and the notes name the "
    "GPU and the CUDA builds. `cuda_to_jax_<size>` / `cuda_to_torch_<size>`: one conversion of "
    "a float32 buffer between a torch CUDA tensor and a JAX GPU array (bridge.to_jax / "
    "bridge.to_torch; dlpack_manual: jax.dlpack.from_dlpack / torch.from_dlpack); a copy is "
    "flagged in the notes. `cuda_pallas_softmax`: a row softmax written in Pallas (Triton "
    "backend), (4096, 1024) float32, called on a CUDA tensor (bridge: `bridge.call_jax`; "
    "dlpack_manual: DLPack around the jitted kernel; plain_jax: the kernel on a JAX GPU "
    "array; torch_eager: `torch.softmax`, the reference). `cuda_mlp_train_step`, "
    "`cuda_transformer_block`, `cuda_gpt2_forward_s256`: the CPU rows' models with module and "
    "input moved to the GPU (`.cuda()`; plain_jax's arrays on JAX's default device, the GPU). "
    "Outputs are checked against torch on the CPU within 2e-3 (GPU summation orders, and "
    "TF32 where JAX's default matmul precision uses it); every timed call ends with "
    "`torch.cuda.synchronize()` for CUDA tensor outputs and `block_until_ready` for JAX ones.",
  ],
  CALLBACK_TITLE: [
    "A torch function, f(x) = x*2+1 on a (16, 16) float32 JAX array, called from JAX under "
    "`jax.jit` (`torch_from_jax_call`), and one `jax.jit(jax.grad(lambda x: f(x).sum()))` step "
    'through it (`torch_from_jax_grad`). bridge: `bridge.call_torch(f, x, mode="callback")`; '
    "wrap_torch2jax: `torch2jax(f, torch.ones(16, 16), output_shapes=...)`; pure_callback: "
    "`jax.pure_callback` around `torch.from_numpy` -> f -> `.numpy()` (not differentiable); "
    "torch_eager: f on a torch tensor, no JAX (the reference; its grad row is "
    "`f(x).sum().backward()`); plain_jax: the same math as jitted JAX ops (context).",
    "",
    "Ratios are this system's median / the reference's median (below 1: faster than the "
    "reference).",
  ],
  CALL_TORCH_TITLE: [
    "Torch code traced into the JAX program (`bridge.call_torch`'s default mode): "
    "`jax.jit(lambda x: call_torch(f, x))` (`call_torch_jit_*`), "
    "`jax.jit(jax.grad(lambda x: call_torch(f, x).sum()))` (`call_torch_jit_grad_*`) and "
    "`jax.jit(jax.vmap(lambda x: call_torch(f, x)))` over 64 examples (`call_torch_vmap_mlp`). "
    "`small`: f(x) = x*2+1 on (16, 16) float32 (per-call overhead; the same function as the "
    "callback rows); `mlp`: f(x) = tanh(x @ w1 + b1) @ w2 + b2 with 256x256 weights closed over "
    "as CPU torch tensors, on a (64, 256) batch (the vmap row maps f over its 64 rows, one "
    "(256,) example at a time). bridge: `bridge.call_torch(f, x)`; torchax: "
    "`torchax.interop.call_torch(f, x)` with the weights on its jax device; plain_jax: the same "
    "math written in JAX (the reference); torch_eager: f on torch tensors, no JAX "
    "(`f(x).sum().backward()` for the grad rows, `torch.func.vmap(f)` for the vmap row).",
    "",
    "Ratios are this system's median / the reference's median (below 1: faster than the "
    "reference). On the MLP rows bridge, torchax and plain_jax run the same XLA program, whose "
    "call times under JAX's asynchronous CPU dispatch are bimodal (~190 us, or ~245 us when the "
    "call waits for XLA's worker thread to wake up): their medians move by up to ~20% from run "
    "to run, so read their ratios to each other within that as equal (see the minimums; with "
    "`--sync-cpu-dispatch` all three took 178 +- 1 us; benchmarks/README.md).",
  ],
  SHARDED_TITLE: [
    f"One training step of a 512-1024-1024-10 ReLU MLP (float32, 1.59M parameters) on a (256, 512) "
    f"batch: `jax.jit` of `jax.value_and_grad` of the cross-entropy plus an `optax.sgd` update. "
    f"`dp8_train_step`: the batch split over a mesh of {SHARDED_DEVICES} CPU devices (axis "
    f'"data", `NamedSharding(mesh, P("data"))`, 32 rows per device), the parameters '
    f"replicated (`P()`), gradients all-reduced by the SPMD program; `dp1_train_step`: the same "
    f"step with everything on one device. bridge: `params, fn = bridge.extract_jax(model)`, "
    f"`bridge.shard(params, sharding)`; plain_jax (the reference): the same MLP written in JAX "
    f"from the same initial values, placed with `jax.device_put` on the same shardings. Their "
    f"worker runs with `XLA_FLAGS={SHARDED_XLA_FLAGS}` (both rows; no other worker has it).",
    "",
    f"The {SHARDED_DEVICES} devices are simulated: they share this machine's cores (XLA runs one "
    f"program per device, each on its 32 rows, then the all-reduce), so dp8 is not expected to be "
    f"faster than dp1 here; the rows measure what the data-parallel program costs against the "
    f"single-device one, and bridge against plain JAX on each. Ratios are this system's median "
    f"/ plain_jax's (below 1: faster).",
  ],
}
# Issue 4's and issue 7's targets: (workload, bridge system, other system, goal for bridge/other median).
GOALS = (
  ("compiled_linear", "bridge", "plain_jax", 1.5),
  ("compiled_linear", "bridge_jax", "plain_jax", 1.5),
  ("mlp_train_step", "bridge", "plain_jax", 1.05),
  ("transformer_block", "bridge", "torchax", 1.0),
  ("transformer_block", "bridge_jax", "torchax", 1.0),
  ("transformer_block_composite", "bridge", "torchax", 1.0),
  ("transformer_block_composite", "bridge_jax", "torchax", 1.0),
  ("transformer_first_call", "bridge", "torchax", 0.5),
  ("transformer_first_call", "bridge_jax", "torchax", 0.5),
  ("transformer_first_call_composite", "bridge", "torchax", 0.5),
  ("transformer_first_call_composite", "bridge_jax", "torchax", 0.5),
  # Issue 7: bridge faster than torch eager and torchax on every Hugging Face row.
  *(
    (w, "bridge", other, 1.0)
    for w in HF_WORKLOADS
    if "first_call" not in w
    for other in ("torch_eager", "torchax")
  ),
  ("gpt2_first_call_s64", "bridge", "torchax", 0.5),
  # Issue 28: call_jax at most 2x a direct jitted call, its forward+backward at most 2x torch
  # eager's own of the same function.
  ("call_small", "bridge", "plain_jax", 2.0),
  ("fwd_bwd_small", "bridge", "torch_eager", 2.0),
  # Issue 28: conv net forwards under bridge.compile at least as fast as torch eager on the CPU.
  *((w, "bridge", "torch_eager", 1.0) for w in CONV_WORKLOADS if "forward" in w),
  # Callback mode: torch called from JAX at most as costly as wrap-torch2jax's FFI call.
  *((w, "bridge", "wrap_torch2jax", 1.0) for w in CALLBACK_WORKLOADS),
  # Data parallel: the sharded step at most 1.05x the same program run by plain JAX.
  ("dp8_train_step", "bridge", "plain_jax", 1.05),
  # torch.compile(backend="jax") (issue 26): steady state at least as fast as inductor on the
  # transformer rows and within 1.1x of bridge.compile (forwards: `bridge`; training steps:
  # `bridge_autograd`, bridge.compile in the same torch loop, as `bridge` trains one fused
  # JAX step); first calls at most half of inductor's.
  *(
    (w, "torch_compile_jax", other, goal)
    for w in (
      "transformer_block",
      "transformer_block_composite",
      "transformer_train_step",
      "gpt2_forward_s64",
      "gpt2_train_step_s64",
    )
    for other, goal in (
      ("torch_compile", 1.0),
      ("bridge_autograd" if "train" in w else "bridge", 1.1),
    )
  ),
  *(
    (w, "torch_compile_jax", "torch_compile", 0.5)
    for w in ("transformer_first_call", "gpt2_first_call_s64")
  ),
)


def _color(system: str) -> str:
  """One fixed colour per system (the baseline in red) across all plots."""
  palette = [
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:gray",
    "tab:olive",
    "tab:cyan",
    "gold",
    "navy",
    "darkgreen",
  ]
  others = [s for s in ALL if s != BASELINE]
  return "tab:red" if system == BASELINE else palette[others.index(system) % len(palette)]


def _read(path: str) -> str:
  try:
    return Path(path).read_text()
  except OSError:
    return ""


def machine_info(quick: bool, seconds: float) -> dict:
  cpu = next(
    (
      line.split(":", 1)[1].strip()
      for line in _read("/proc/cpuinfo").splitlines()
      if line.startswith("model name")
    ),
    platform.processor() or "unknown",
  )
  mem = next(
    (
      line.split()[1] for line in _read("/proc/meminfo").splitlines() if line.startswith("MemTotal")
    ),
    None,
  )
  return {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "mode": "quick" if quick else "full",
    "nproc": os.cpu_count(),
    "cpu": cpu,
    "memory_gib": round(int(mem) / 2**20, 1) if mem else None,
    "platform": platform.platform(),
    "seconds": round(seconds, 1),
  }


def _us(v: float | None) -> str:
  if v is None:
    return "-"
  return f"{v:,.1f}" if v < 1000 else f"{v:,.0f}"


def _median(reports: list[dict], system: str, workload: str) -> float | None:
  for r in reports:
    if r["system"] == system and workload in r["results"]:
      return r["results"][workload]["median_us"]
  return None


def _rounds(reports: list[dict], system: str, workload: str) -> list[float] | None:
  """Each interleaved round's median of `system` on `workload` (None if not interleaved)."""
  for r in reports:
    if r["system"] == system and workload in r["results"]:
      return r["results"][workload].get("rounds_us")
  return None


def round_ratios(reports: list[dict], mine: str, other: str, workload: str) -> list[float]:
  """`mine / other` round by round (their blocks of one round ran side by side)."""
  a, b = _rounds(reports, mine, workload), _rounds(reports, other, workload)
  if not a or not b:
    return []
  return [x / y for x, y in zip(a, b) if y]


def _ratio(reports: list[dict], system: str, workload: str) -> str:
  mine, base = _median(reports, system, workload), _median(reports, BASELINE, workload)
  return f"{mine / base:.2f}x" if mine is not None and base else "n/a"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _ratio_to(reports: list[dict], system: str, reference: str, workload: str) -> str:
  mine, ref = _median(reports, system, workload), _median(reports, reference, workload)
  return f"{mine / ref:.2f}x" if mine is not None and ref else "n/a"


def _workload_table(
  reports: list[dict], workload: str, references: tuple[str, ...] = ()
) -> list[str]:
  """One row per system; the ratio columns are other / baseline, or system / each reference."""
  rows = []
  for r in reports:
    res = r["results"].get(workload)
    if res is None:
      continue
    ratios = (
      [_ratio_to(reports, r["system"], ref, workload) for ref in references]
      if references
      else [_ratio(reports, r["system"], workload)]
    )
    rows.append(
      [r["system"], _us(res["median_us"]), _us(res["min_us"]), _us(res["max_us"]), str(res["n"])]
      + ratios
    )
  ratio_header = (
    [f"vs {ref} (system / {ref})" for ref in references] if references else [f"ratio vs {BASELINE}"]
  )
  header = ["system", "median (us)", "min (us)", "max (us)", "n"] + ratio_header
  return _table(header, rows) if rows else ["(no system ran this workload)"]


def _present(reports: list[dict], workloads: tuple[str, ...]) -> list[str]:
  return [w for w in workloads if any(w in r["results"] or w in r["skipped"] for r in reports)]


def _header(reports: list[dict], meta: dict) -> list[str]:
  base = next(
    (r for r in reports if r.get("versions", {}).get("torch")), {"versions": {}, "env": {}}
  )
  v = base["versions"]
  omp = sorted({r.get("env", {}).get("OMP_WAIT_POLICY", "?") for r in reports if r.get("env")})
  return [
    "# Benchmark results",
    "",
    f"- date: {meta['date']} ({_mode(meta)} run, {meta['seconds']:.0f} s)",
    f"- machine: {meta['nproc']} CPUs ({meta['cpu']}), {meta['memory_gib']} GiB RAM, "
    f"{meta['platform']}",
    f"- python {v.get('python', '?')}, torch {v.get('torch', '?')}, jax {v.get('jax', '?')}, "
    f"jaxlib {v.get('jaxlib', '?')}, numpy {v.get('numpy', '?')}",
    f"- OMP_WAIT_POLICY={', '.join(omp) or '?'} (set before torch is imported in every worker)",
    "- JAX CPU dispatch: "
    + (
      "synchronous (`--sync-cpu-dispatch`: jax_cpu_enable_async_dispatch=False in every worker)"
      if any(r.get("env", {}).get("sync_cpu_dispatch") for r in reports)
      else "asynchronous (JAX's default)"
    ),
    "- interleaved (the default): the systems' workers time each workload in turns, in "
    "blocks of 1/40 of its time budget, and the first-call processes alternate between "
    "systems, so machine noise falls on all systems alike"
    if meta.get("interleaved")
    else "- the systems are timed one after another (`--sequential`; by default they take turns)",
    "- times are per call, in microseconds; each worker process runs one system; warm-up "
    "calls are excluded; JAX outputs are waited for (block_until_ready) inside the timed "
    "region, in the module and Hugging Face workloads also the JAX array inside a jax-device "
    "tensor output "
    "(bridge_jax, torchax; eager_add does not wait for those); CPU torch tensor outputs "
    "are complete when returned",
    "- transformer_first_call*, gpt2_first_call_s64: one first call (trace + compile + run) "
    "per fresh process; "
    "median/min/max over the processes (n)",
    f"- ratio = other / {BASELINE} (median): above 1 means {BASELINE} is faster",
    "- every output is checked against a reference before timing; a transfer whose output "
    "does not alias its input is flagged as a copy in the notes",
    "- regenerate: `python -m benchmarks` (full) or `python -m benchmarks --quick`",
    *(_merged_line(run) for run in meta.get("merged", [])),
    "",
  ]


def _mode(meta: dict) -> str:
  return meta["mode"] + (", interleaved" if meta.get("interleaved") else "")


def _merged_line(run: dict) -> str:
  """One header line for rows merged in by a later `--merge` run (see run.merge)."""
  workloads = run["workloads"] if isinstance(run["workloads"], str) else ", ".join(run["workloads"])
  return (
    f"- merged in (`--merge`): {workloads} for {', '.join(run['systems'])}, measured "
    f"{run['date']} ({_mode(run)} run, {run['seconds']:.0f} s, {run['nproc']} CPUs, "
    f"{run['cpu']}), side by side in that run; rows not named in such a line are from "
    f"the run dated above"
  )


def _summary(reports: list[dict], workloads: list[str]) -> list[str]:
  rows = [
    [r["system"]] + [_us(_median(reports, r["system"], w)) for w in workloads] for r in reports
  ]
  return ["## Summary: median us per call", ""] + _table(["system"] + workloads, rows) + [""]


def _skip_reason(reports: list[dict], system: str, workload: str) -> str | None:
  for r in reports:
    if r["system"] == system:
      return r["skipped"].get(workload) or r["skipped"].get("all")
  return None


def _goals(reports: list[dict]) -> list[str]:
  """Issue 4's and 7's ratio targets, for the (workload, pair)s this run covered."""
  rows = []
  for workload, mine, other, goal in GOALS:
    if not _present(reports, (workload,)):
      continue
    a, b = _median(reports, mine, workload), _median(reports, other, workload)
    if a is not None and b:
      spread = round_ratios(reports, mine, workload=workload, other=other)
      if spread:  # met only if every round is: the whole spread on the right side
        lo, hi = min(spread), max(spread)
        ratio = f"{a / b:.2f} ({lo:.2f}-{hi:.2f})"
        verdict = "met" if hi <= goal else ("not met" if lo > goal else "within spread")
      else:
        ratio, verdict = f"{a / b:.2f}", "met" if a / b <= goal else "not met"
    else:
      missing = mine if a is None else other
      why = _skip_reason(reports, missing, workload) or "not run"
      ratio, verdict = "n/a", f"{missing} skipped: {why[:160]}"
    rows.append([workload, f"{mine} / {other}", ratio, f"<= {goal}", verdict])
  if not rows:
    return []
  header = ["workload", "ratio (median)", "value", "goal", "status"]
  return (
    [
      "## Goals (issues 4 and 7, callback mode, data parallel)",
      "",
      "Ratios here are bridge / other (below 1: bridge is faster). In an interleaved run "
      "each value is the ratio of the medians, then (in parentheses) the lowest and highest "
      "ratio of one round's medians: a goal is met only when every round meets it, not met "
      "when none does, and 'within spread' otherwise.",
      "",
    ]
    + _table(header, rows)
    + [""]
  )


def _mib(n: int | None) -> str:
  return "-" if n is None else f"{n / 2**20:,.2f}"


def _sharded_tables(reports: list[dict]) -> list[str]:
  """The sharded rows per device: dp8 against dp1 in time, and the compiled steps' memory."""
  dp8, dp1 = SHARDED_WORKLOADS
  rows = []
  for r in reports:
    a, b = _median(reports, r["system"], dp8), _median(reports, r["system"], dp1)
    if a is not None or b is not None:
      rows.append([r["system"], _us(b), _us(a), f"{a / b:.2f}x" if a is not None and b else "n/a"])
  lines = []
  if rows:
    lines += [f"### {dp8} against {dp1}", ""]
    lines += _table(["system", f"{dp1} median (us)", f"{dp8} median (us)", f"{dp8} / {dp1}"], rows)
    lines.append("")
  fields = (
    ("argument", "arguments"),
    ("output", "outputs"),
    ("alias", "aliased"),
    ("temp", "temporaries"),
    ("generated_code", "generated code"),
  )
  rows = []
  for r in reports:
    for w in SHARDED_WORKLOADS:
      res = r["results"].get(w)
      if res is None:
        continue
      memory = res.get("memory") or {}
      stats = res.get("device_memory")
      device = (
        ", ".join(f"{k} {_mib(v)}" for k, v in stats.items())
        if stats
        else "none (backend has no memory_stats)"
      )
      rows.append(
        [r["system"], w, str(res.get("devices", "?"))]
        + [_mib(memory.get(f"{f}_bytes")) for f, _ in fields]
        + [device]
      )
  if rows:
    lines += [
      "### Memory per device (MiB)",
      "",
      "From `jax.jit(step).lower(...).compile().memory_analysis()` of the timed step. "
      "For the program partitioned over the mesh these are the sizes of the SPMD "
      "program each device runs, so per device: the arguments are the replicated "
      "parameters (6.05 MiB) plus the device's rows of the batch; temporaries include "
      "the gradient buffers of the all-reduce. On CPU they come from XLA's buffer "
      "assignment, not from measured allocations; XLA reports no generated-code size "
      "there. The last column is device 0's `memory_stats()`, which the CPU backend "
      "does not provide.",
      "",
    ]
    lines += _table(
      ["system", "workload", "devices"]
      + [f"{label}" for _, label in fields]
      + ["memory_stats (device 0)"],
      rows,
    )
    lines.append("")
  return lines


def _systems_section(reports: list[dict]) -> list[str]:
  lines = ["## Systems, notes and skipped workloads", ""]
  for r in reports:
    extra = {
      k: v
      for k, v in r.get("versions", {}).items()
      if k not in ("python", "torch", "jax", "jaxlib", "numpy")
    }
    versions = ", ".join(f"{k} {v}" for k, v in extra.items())
    lines.append(f"### {r['system']}" + (f" ({versions})" if versions else ""))
    lines += [f"- note: {n}" for n in r["notes"]]
    gpu_skips = {w: why for w, why in r["skipped"].items() if w in GPU_WORKLOADS}
    reasons = set(gpu_skips.values())
    if len(gpu_skips) > 1 and len(reasons) == 1:  # e.g. no GPU here: one line for them all
      lines.append(f"- skipped the {len(gpu_skips)} cuda_* workloads: {reasons.pop()}")
      gpu_skips = {}
    lines += [
      f"- skipped `{w}`: {why}"
      for w, why in r["skipped"].items()
      if w not in GPU_WORKLOADS or w in gpu_skips
    ]
    lines.append("")
  return lines


def _ran(reports: list[dict], workloads: tuple[str, ...]) -> bool:
  return any(w in r["results"] for r in reports for w in workloads)


_COLD_KINDS = {
  "difference": "seconds beyond the baseline",
  "median": "seconds",
  "ratio": "ratio to the baseline",
}


def _cold_start(figures: dict | None) -> list[str]:
  """`python -m benchmarks.cold_start --write`'s figures: each case's median over fresh
  processes taking turns, and issue 28's goals."""
  if not figures:
    return []
  lines = [
    "## Cold start (fresh processes)",
    "",
    f"Measured {figures['date']} ({figures['mode']}) by `python -m benchmarks.cold_start "
    "--write`: every sample is a new interpreter, the cases of a row taking turns, the "
    "bridge's own files byte-compiled first (as `pip install` leaves them); see "
    "benchmarks/cold_start.py for what each case runs.",
    "",
  ]
  lines += _table(
    ["row", "case", "median (s)", "samples (s)"],
    [
      [c["row"], c["case"], f"{c['median_s']:.3f}", ", ".join(f"{v:.2f}" for v in c["samples"])]
      for c in figures["cases"]
    ],
  )
  lines += [""]
  lines += _table(
    ["row", "measured", "value", "goal", "status"],
    [
      [
        g["row"],
        _COLD_KINDS[g["kind"]],
        f"{g['value']:.3f}",
        f"<= {g['goal']}",
        "met" if g["value"] <= g["goal"] else "not met",
      ]
      for g in figures["goals"]
    ],
  )
  return lines + [""]


def markdown(reports: list[dict], meta: dict, plots: list[Path]) -> str:
  lines = _header(reports, meta)
  # the CUDA rows only where some system ran them (elsewhere one line says why not)
  groups = {t: g for t, g in GROUPS.items() if t != GPU_TITLE or _ran(reports, g)}
  workloads = [w for ws in groups.values() for w in _present(reports, ws)]
  lines += _summary(reports, workloads)
  lines += _goals(reports)
  for title, group in groups.items():
    present = _present(reports, group)
    if not present:
      continue
    lines += [f"## {title}", ""]
    lines += INTROS[title] + [""] if title in INTROS else []
    for w in present:
      lines += [f"### {w}", ""] + _workload_table(reports, w, REFERENCES.get(title, ())) + [""]
    if title == SHARDED_TITLE:
      lines += _sharded_tables(reports)
    if title == GPU_TITLE and meta.get("gpu_figures"):
      lines += meta["gpu_figures"] + [""]  # tests/gpu/measure.py's table (merge_gpu.py)
  if GPU_TITLE not in groups and _present(reports, GPU_WORKLOADS):
    why = next((r["skipped"][w] for r in reports for w in GPU_WORKLOADS if w in r["skipped"]), "")
    lines += [f"## {GPU_TITLE}", "", f"Not measured in this run: {why}.", ""]
  lines += _cold_start(meta.get("cold_start"))
  if plots:
    lines += ["## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots] + [""]
  lines += _systems_section(reports)
  return "\n".join(lines)


MISSING_MATPLOTLIB = (
  "benchmarks: matplotlib is not installed, so no plots are drawn; "
  'install the bench extra: pip install -e ".[bench]"'
)


def plots(reports: list[dict], out_dir: Path, required: bool = True) -> list[Path]:
  """Write the PNG plots; returns their paths. Without matplotlib: SystemExit saying what to
  install, or (`required=False`, a --quick run) that message printed and no plots."""
  try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    if required:
      raise SystemExit(MISSING_MATPLOTLIB) from None
    print(MISSING_MATPLOTLIB, file=sys.stderr)
    return []
  out_dir.mkdir(parents=True, exist_ok=True)
  written = []
  has = lambda w: any(w in r["results"] for r in reports)

  if any(has(w) for w in CALL_WORKLOADS):
    fig, axes = plt.subplots(1, len(CALL_WORKLOADS), figsize=(12, 4.5))
    for ax, w in zip(axes, CALL_WORKLOADS):
      _bars(ax, reports, w)
    fig.tight_layout()
    written.append(_save(fig, out_dir / "call_overhead.png"))

  # (workloads, file, log axis); the sharded rows' medians are close: a linear axis from 0
  for group, name, log in (
    (MODULE_WORKLOADS, "modules.png", True),
    (HF_WORKLOADS, "huggingface.png", True),
    (CALLBACK_WORKLOADS, "callback.png", True),
    (CALL_TORCH_WORKLOADS, "call_torch.png", True),
    (SHARDED_WORKLOADS, "sharded.png", False),
    (GPU_WORKLOADS, "cuda.png", True),
  ):
    present = [w for w in group if has(w)]
    if present:
      fig, axes = plt.subplots(1, len(present), figsize=(4 * len(present), 4.5), squeeze=False)
      for ax, w in zip(axes[0], present):
        _bars(ax, reports, w, log)
      fig.tight_layout()
      written.append(_save(fig, out_dir / name))

  directions = ("to_jax", "to_torch")
  if any(has(f"{d}_{s}") for d in directions for s in SIZES):
    fig, axes = plt.subplots(1, len(directions), figsize=(12, 4.5))
    for ax, direction in zip(axes, directions):
      _lines(ax, reports, direction)
    fig.tight_layout()
    written.append(_save(fig, out_dir / "transfers.png"))
  return written


def _bars(ax, reports: list[dict], workload: str, log: bool = True) -> None:
  """Median per system as bars on a log axis (or a linear one from 0)."""
  pairs = [
    (r["system"], r["results"][workload]["median_us"]) for r in reports if workload in r["results"]
  ]
  if pairs:
    names, values = zip(*pairs)
    ax.bar(names, values, color=[_color(n) for n in names])
    for i, val in enumerate(values):
      ax.text(i, val, _us(val), ha="center", va="bottom", fontsize=8)
    if log:
      ax.set_yscale("log")
  ax.set_title(f"{workload} (median per call)")
  ax.set_ylabel("microseconds (log)" if log else "microseconds")
  ax.tick_params(axis="x", rotation=30)


def _lines(ax, reports: list[dict], direction: str) -> None:
  """Median time vs buffer size, one line per system, log-log."""
  for r in reports:
    points = [
      (nbytes, r["results"][f"{direction}_{s}"]["median_us"])
      for s, nbytes in SIZES.items()
      if f"{direction}_{s}" in r["results"]
    ]
    if points:
      xs, ys = zip(*points)
      ax.plot(
        xs,
        ys,
        marker="o",
        label=r["system"],
        color=_color(r["system"]),
        linewidth=2.5 if r["system"] == BASELINE else 1.2,
      )
  shown = {
    s: n for s, n in SIZES.items() if any(f"{direction}_{s}" in r["results"] for r in reports)
  }
  if shown:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(list(shown.values()), list(shown))
    ax.legend(fontsize=8)
  ax.set_title(f"{direction}: median time vs size")
  ax.set_xlabel("float32 buffer size")
  ax.set_ylabel("microseconds (log)")


def _save(fig, path: Path) -> Path:
  fig.savefig(path, dpi=110)
  import matplotlib.pyplot as plt

  plt.close(fig)
  return path
