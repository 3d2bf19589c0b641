"""torch.compile (inductor, CPU): torch's own compiler, on the forward workloads only."""

import torch

from ..common import System

NOT_HERE = (
  "torch_compile runs only the forward workloads (compiled_linear, transformer_block*, "
  "gpt2_forward_*, bert_forward_*, cuda_transformer_block, cuda_gpt2_forward_s256)"
)


def _forward(module, x):
  compiled = torch.compile(module)
  return (lambda: compiled(x)), (lambda out: out)


def make() -> System:
  return System(
    name="torch_compile",
    forward=_forward,
    notes=[
      "torch_compile: torch.compile(module) with the default (inductor) backend, "
      "CPU tensors (CUDA tensors in the cuda_* rows); compiled on the first (untimed) "
      "call under torch.no_grad()."
    ],
    unsupported={
      **{
        attr: NOT_HERE
        for attr in (
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
      },
      **dict.fromkeys(("mlp_train_step", "gpt2_train_step_s64", "cuda_mlp_train_step"), NOT_HERE),
      **dict.fromkeys(
        ("transformer_first_call", "transformer_first_call_composite", "gpt2_first_call_s64"),
        "not measured: issues 4 and 7 compare the first calls of bridge.compile "
        "and torchax.compile",
      ),
    },
  )
