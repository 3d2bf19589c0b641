"""torch.compile(module, backend="eager"): dynamo alone, the floor of every torch.compile backend.

Dynamo captures the graph (its bytecode tracing at the first call, its guards and frame at
every call) and torch eager runs the captured graph: what any backend, inductor or
`backend="jax"`, pays before its own work. Shown beside torch_compile_jax so that its first call
splits into dynamo's share and the backend's. Its per-call rows run dynamo's graph in eager torch,
which is not the module's own call (the torch_eager row): they do not isolate dynamo's per-call
cost (docs/speed.md measures that).
"""

import torch

from ..common import CONV_WORKLOADS, GPU_WORKLOADS, NON_MODULE_CAPABILITIES, System
from .torch_compile_jax import _Calls
from .torch_eager import _train_step as _eager_train_step

NOT_HERE = (
  "torch_compile_eager runs only the module workloads (compiled_linear, transformer_*, the mlp "
  "and gpt2 train steps, gpt2_forward_*, bert_forward_*, the first calls; no conv nets, no CUDA rows)"
)


def _forward(module, x):
  compiled = torch.compile(module, backend="eager")
  return (lambda: compiled(x)), (lambda out: out)


def _train_step(module, x, y):
  compiled = torch.compile(module, backend="eager")
  return _eager_train_step(_Calls(module, compiled), x, y)


def make() -> System:
  import bridge  # noqa: F401  (as torch_compile_jax's worker: see the module docstring)

  return System(
    name="torch_compile_eager",
    forward=_forward,
    train_step=_train_step,
    notes=[
      'torch_compile_eager: torch.compile(module, backend="eager"): dynamo captures the graph '
      "and torch eager runs it, CPU tensors; dynamo's own share of every torch.compile backend "
      "(first call: its tracing), the floor under torch_compile_jax's first call (the bridge "
      "loaded, as there); its per-call rows run dynamo's graph in eager torch."
    ],
    unsupported={
      **dict.fromkeys(NON_MODULE_CAPABILITIES, NOT_HERE),
      **dict.fromkeys(CONV_WORKLOADS + GPU_WORKLOADS, NOT_HERE),
    },
  )
