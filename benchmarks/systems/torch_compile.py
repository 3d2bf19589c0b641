"""torch.compile (inductor, CPU): torch's own compiler, on the module workloads."""

import torch

from ..common import NON_MODULE_CAPABILITIES, System
from .torch_compile_jax import _Calls
from .torch_eager import _train_step as _eager_train_step

NOT_HERE = (
  "torch_compile runs only the module workloads (compiled_linear, transformer_*, the mlp and "
  "gpt2 train steps, gpt2_forward_*, bert_forward_*, the first calls, cuda_transformer_block, "
  "cuda_gpt2_forward_s256)"
)


def _forward(module, x):
  compiled = torch.compile(module)
  return (lambda: compiled(x)), (lambda out: out)


def _train_step(module, x, y):
  compiled = torch.compile(module)
  return _eager_train_step(_Calls(module, compiled), x, y)


def make() -> System:
  return System(
    name="torch_compile",
    forward=_forward,
    train_step=_train_step,
    notes=[
      "torch_compile: torch.compile(module) with the default (inductor) backend, "
      "CPU tensors (CUDA tensors in the cuda_* rows); compiled on the first (untimed) "
      "call under torch.no_grad(); train steps as torch_eager's with the compiled module."
    ],
    unsupported={
      **dict.fromkeys(NON_MODULE_CAPABILITIES, NOT_HERE),
      "cuda_mlp_train_step": NOT_HERE,
    },
  )
