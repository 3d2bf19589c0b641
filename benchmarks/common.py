"""Shared helpers: the timing loop, run settings and the `System` description."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any


KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
# Transfer sizes (bytes of float32 data); workloads are named e.g. "to_jax_1GiB".
SIZES = {"1KiB": KiB, "1MiB": MiB, "64MiB": 64 * MiB, "1GiB": GiB}
QUICK_MAX_BYTES = 64 * MiB  # --quick skips bigger transfers
# The module workloads of issue 4 (models in benchmarks/models.py).
MODULE_WORKLOADS = (
  "compiled_linear",
  "mlp_train_step",
  "transformer_block",
  "transformer_block_composite",
  "transformer_train_step",
  "transformer_first_call",
  "transformer_first_call_composite",
)
# The Hugging Face workloads of issue 7 (configs with random weights, built offline).
HF_WORKLOADS = (
  "gpt2_forward_s64",
  "gpt2_forward_s256",
  "bert_forward_s64",
  "bert_forward_s256",
  "gpt2_train_step_s64",
  "gpt2_first_call_s64",
)
# The conv nets of issue 28 (torchvision's resnet18 and mobilenet_v3_small, models.py): eval
# forwards on 1x3x224x224 and 8x3x64x64, fine-tuning steps (BatchNorm frozen) on 8x3x64x64.
CONV_WORKLOADS = (
  "resnet18_forward_224",
  "resnet18_forward_64x8",
  "mobilenet_v3_small_forward_224",
  "resnet18_train_step_64x8",
  "mobilenet_v3_small_train_step_64x8",
)
# torch called from JAX (bridge.call_torch(..., mode="callback")): f(x) = x*2+1 on a (16, 16)
# float32 JAX array under jax.jit, and a jitted jax.grad step through it.
CALLBACK_WORKLOADS = ("torch_from_jax_call", "torch_from_jax_grad")
# torch called from JAX in trace mode (bridge.call_torch's default: the torch code becomes part
# of the JAX program): f(x) = x*2+1 on (16, 16) and a 2-layer tanh MLP on (64, 256) under jax.jit
# and jax.jit(jax.grad), and the MLP under jax.jit(jax.vmap) over 64 examples (models.py).
CALL_TORCH_WORKLOADS = (
  "call_torch_jit_small",
  "call_torch_jit_mlp",
  "call_torch_jit_grad_small",
  "call_torch_jit_grad_mlp",
  "call_torch_vmap_mlp",
)
# Data parallel on simulated CPU devices: one SGD step of a 512-1024-1024-10 MLP on a batch of
# 256, split over a mesh of 8 devices (axis "data", parameters replicated) and on one device.
# Their worker runs with SHARDED_XLA_FLAGS (run.py; no other worker does).
SHARDED_WORKLOADS = ("dp8_train_step", "dp1_train_step")
SHARDED_DEVICES = 8
SHARDED_XLA_FLAGS = f"--xla_force_host_platform_device_count={SHARDED_DEVICES}"
# The CUDA workloads (benchmarks/gpu.py): a machine with torch and JAX for CUDA adds them; their
# worker is the only one that sees the GPU (run.py). Elsewhere they are skipped with the reason.
GPU_SIZES = ("1MiB", "64MiB", "1GiB")
GPU_WORKLOADS = tuple(
  f"cuda_{direction}_{size}" for direction in ("to_jax", "to_torch") for size in GPU_SIZES
) + (
  "cuda_pallas_softmax",
  "cuda_mlp_train_step",
  "cuda_transformer_block",
  "cuda_gpt2_forward_s256",
)
# The capabilities of a system that are not about a torch module (the call, transfer, eager
# and torch-from-JAX rows): the module-only systems mark them all unsupported.
NON_MODULE_CAPABILITIES = (
  "call",
  "fwd_bwd",
  "to_jax",
  "to_torch",
  "eager",
  "torch_from_jax",
  "torch_from_jax_grad",
  "call_torch_jit",
  "call_torch_grad",
  "call_torch_vmap",
)
# One first call per fresh process (benchmarks/first_call.py), not a timing loop.
FIRST_CALL_WORKLOADS = (
  "transformer_first_call",
  "transformer_first_call_composite",
  "gpt2_first_call_s64",
)
WORKLOADS = (
  ("call_small", "fwd_bwd_small", "eager_add")
  + tuple(f"{direction}_{size}" for direction in ("to_jax", "to_torch") for size in SIZES)
  + MODULE_WORKLOADS
  + HF_WORKLOADS
  + CONV_WORKLOADS
  + CALLBACK_WORKLOADS
  + CALL_TORCH_WORKLOADS
  + SHARDED_WORKLOADS
  + GPU_WORKLOADS
)


@dataclasses.dataclass(frozen=True)
class Settings:
  """How hard to time one workload."""

  warmup: int  # untimed calls before timing
  min_reps: int  # always time at least this many calls
  max_reps: int  # never time more than this many calls
  budget_s: float  # stop after this much timed wall time (once min_reps is reached)


QUICK = Settings(warmup=3, min_reps=5, max_reps=300, budget_s=0.15)
FULL = Settings(warmup=20, min_reps=10, max_reps=50000, budget_s=2.0)
# Transfers of big buffers may copy hundreds of MiB per call: the time budget, not
# the repetition cap, then bounds the run (at least min_reps calls are timed).
FULL_BIG = Settings(warmup=3, min_reps=5, max_reps=5000, budget_s=3.0)
# The call_torch rows (5 workloads x 4 systems, each call <= ~1 ms): half the budget keeps
# them to ~20 s of a full run, still >= 1,000 timed calls per row.
FULL_SHORT = Settings(warmup=20, min_reps=10, max_reps=50000, budget_s=1.0)
# The sharded rows (a step takes ~15-35 ms on 2 cores): twice the budget, >= ~100 timed steps.
FULL_SHARDED = Settings(warmup=10, min_reps=10, max_reps=5000, budget_s=4.0)


@dataclasses.dataclass
class System:
  """What one benchmarked system offers. A `None` entry means "not supported".

  call(f) -> g:    g(x) computes f(x); x and the result are torch tensors
                   (JAX arrays when ``array_in == "jax"``).
  fwd_bwd(f) -> s: s(x) runs ``y = f(x); y.sum().backward()`` on a leaf x that
                   requires grad and returns ``(y, dy/dx)``.
  to_jax(t), to_torch(a): convert one array across the boundary.
  eager(x, y) -> (run, to_cpu): places CPU tensors x, y on the system's device;
                   run() computes x + y there as one eager op, to_cpu(out)
                   brings a result back for checking.
  forward(module, x) -> (run, to_cpu): places a CPU module and CPU input where the
                   system runs them and wraps the module (compiling lazily: the
                   first run() traces and compiles); run() calls it once,
                   to_cpu(out) gives a CPU tensor for checking. run() returns only
                   once its output is computed: systems whose outputs are tensors
                   of a jax torch device wait for the JAX array inside run(); JAX
                   array outputs are waited for by the workload (`blocking`).
  train_step(module, x, y) -> (run, read): one SGD step (`models.LR`) of
                   cross-entropy on logits module(x) and int labels y; the
                   system's copy of the parameters is updated in place or carried
                   between calls; read(run()) -> (loss, {state-dict name: ndarray}).
  torch_from_jax(f, x) -> (run, to_cpu): the other direction: f is a torch
                   function, x a CPU tensor that the system places as its input
                   (a JAX array; torch_eager keeps the tensor); run() calls f on it
                   from JAX under `jax.jit` (a jitted JAX array -> JAX array
                   function), to_cpu(out) gives an array for checking.
  torch_from_jax_grad(f, x) -> (run, to_cpu): likewise, run() is one jitted
                   ``jax.grad(lambda x: f(x).sum())`` step and returns the gradient.
  call_torch_jit(fn, x) -> (run, to_cpu): torch code traced into a JAX program: fn
                   is a `models.TorchFn` (torch code ``fn.apply(fn.weights, x)``;
                   calling fn closes over its CPU weights), x a CPU tensor that the
                   system places as its input; run() is one call of
                   ``jax.jit(lambda x: fn(x))`` on it (torch_eager: fn on the tensor;
                   plain_jax: the same math written in JAX).
  call_torch_grad(fn, x) -> (run, to_cpu): likewise, one jitted
                   ``jax.grad(lambda x: fn(x).sum())`` step; returns the gradient.
  call_torch_vmap(fn, xs) -> (run, to_cpu): one call of ``jax.jit(jax.vmap(fn))`` over
                   the leading dimension of xs (fn sees one example at a time).
  sharded_train_step(module, x, y, params_sharding, batch_sharding) -> (run, read, compiled):
                   `train_step` with the parameters placed by `params_sharding` and the
                   batch (x, y) by `batch_sharding` (JAX shardings: replicated / split over a
                   mesh's "data" axis, or both one device); run() is one call of the jitted
                   step, read(run()) -> (loss, {state-dict name: ndarray}, {name: sharding
                   of the updated parameter}), compiled the step's `jax.stages.Compiled`
                   for these arguments (its `memory_analysis()` is reported).
  """

  name: str
  packages: tuple[str, ...] = ()
  array_in: str = "torch"
  call: Callable[[Callable], Callable] | None = None
  fwd_bwd: Callable[[Callable], Callable] | None = None
  to_jax: Callable[[Any], Any] | None = None
  to_torch: Callable[[Any], Any] | None = None
  eager: Callable[[Any, Any], tuple[Callable[[], Any], Callable[[Any], Any]]] | None = None
  forward: Callable[[Any, Any], tuple[Callable[[], Any], Callable[[Any], Any]]] | None = None
  train_step: Callable[[Any, Any, Any], tuple[Callable[[], Any], Callable[[Any], tuple]]] | None = (
    None
  )
  torch_from_jax: (
    Callable[[Callable, Any], tuple[Callable[[], Any], Callable[[Any], Any]]] | None
  ) = None
  torch_from_jax_grad: (
    Callable[[Callable, Any], tuple[Callable[[], Any], Callable[[Any], Any]]] | None
  ) = None
  call_torch_jit: Callable[[Any, Any], tuple[Callable[[], Any], Callable[[Any], Any]]] | None = None
  call_torch_grad: Callable[[Any, Any], tuple[Callable[[], Any], Callable[[Any], Any]]] | None = (
    None
  )
  call_torch_vmap: Callable[[Any, Any], tuple[Callable[[], Any], Callable[[Any], Any]]] | None = (
    None
  )
  sharded_train_step: (
    Callable[..., tuple[Callable[[], Any], Callable[[Any], tuple], Any]] | None
  ) = None
  notes: list[str] = dataclasses.field(default_factory=list)
  # Reasons, by workload or capability name; a workload listed here is skipped
  # even when the capability it uses exists.
  unsupported: dict[str, str] = dataclasses.field(default_factory=dict)


def torch_fwd_bwd(call: Callable) -> Callable:
  """The standard torch training step around a torch-in/torch-out `call`."""

  def step(x):
    x.grad = None
    y = call(x)
    y.sum().backward()
    return y, x.grad

  return step


def _contains_jax_array(out: Any) -> bool:
  import jax

  return any(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves(out))


def _contains_cuda_tensor(out: Any) -> bool:
  import jax
  import torch

  return any(
    isinstance(leaf, torch.Tensor) and leaf.is_cuda for leaf in jax.tree_util.tree_leaves(out)
  )


def blocking(fn: Callable[[], Any], sample_out: Any) -> Callable[[], Any]:
  """Wrap `fn` so that JAX outputs are waited for, if `sample_out` holds any, and CUDA torch
  tensors too (`torch.cuda.synchronize()`: the whole device, so also XLA's streams, which
  share torch's primary CUDA context)."""
  jax_out, cuda_out = _contains_jax_array(sample_out), _contains_cuda_tensor(sample_out)
  if not jax_out and not cuda_out:
    return fn
  import jax
  import torch

  def run():
    out = fn()
    if jax_out:
      jax.block_until_ready(out)
    if cuda_out:
      torch.cuda.synchronize()
    return out

  return run


def time_calls(fn: Callable[[], Any], settings: Settings) -> dict[str, Any]:
  """Time `fn()` call by call (after warm-up); return median/min/max in us and n.

  Interleaved (the default run) the calls are timed in blocks, in turn with the other systems'
  workers (benchmarks/interleave.py).
  """
  from . import interleave

  for _ in range(settings.warmup):
    fn()
  ch = interleave.channel()
  rounds: list[float] = []
  if ch is not None:
    samples = interleave.timed_blocks(
      ch, fn, settings.min_reps, settings.max_reps, settings.budget_s, rounds
    )
    if not samples:
      raise RuntimeError("interleaved timing: the coordinator stopped before any call")
  else:
    samples = []
    clock = time.perf_counter
    deadline = clock() + settings.budget_s
    while len(samples) < settings.max_reps:
      t0 = clock()
      fn()
      samples.append(clock() - t0)
      if len(samples) >= settings.min_reps and clock() > deadline:
        break
  us = [s * 1e6 for s in samples]
  out: dict[str, Any] = {
    "median_us": statistics.median(us),
    "min_us": min(us),
    "max_us": max(us),
    "n": len(us),
  }
  if rounds:  # interleaved: each round's median, side by side with the other systems'
    out["rounds_us"] = [r * 1e6 for r in rounds]
  return out
