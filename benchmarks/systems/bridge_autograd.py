"""bridge.compile(module) trained by torch: torch's own step around the compiled module.

The like-for-like baseline of `torch_compile_jax`'s training rows: the same torch loop
(zero_grad, cross_entropy, backward, SGD), the module's forward one `bridge.compile` program
and its backward the program's JAX VJP, run by torch autograd. (The `bridge` system's
training rows are one fused JAX step through `bridge.extract_jax`, loss and update included.)
"""

from .. import models
from ..common import (
  CONV_WORKLOADS,
  HF_WORKLOADS,
  MODULE_WORKLOADS,
  NON_MODULE_CAPABILITIES,
  System,
)
from .torch_compile_jax import _Calls
from .torch_eager import _train_step as _eager_train_step

TRAIN = ("mlp_train_step", "transformer_train_step", "gpt2_train_step_s64") + tuple(
  w for w in CONV_WORKLOADS if "train" in w
)
NOT_HERE = "bridge_autograd runs the training steps only (bridge runs the forwards)"


def _train_step(module, x, y):
  import bridge

  compiled = bridge.compile(module)
  run, read = _eager_train_step(_Calls(module, compiled), x, y)
  run.settle = compiled.wait_optimized  # steady state: after the background compile
  return run, read


def make() -> System:
  import bridge  # noqa: F401  (registers the jax device)

  forwards = [w for w in MODULE_WORKLOADS + HF_WORKLOADS + CONV_WORKLOADS if w not in TRAIN]
  return System(
    name="bridge_autograd",
    packages=("bridge",),
    train_step=_train_step,
    notes=[
      "bridge_autograd: torch's own training step (zero_grad, cross_entropy, backward, "
      "SGD lr=%g) around bridge.compile(module): the compiled forward and its JAX VJP run "
      "by torch autograd, CPU tensors; the like-for-like baseline of torch_compile_jax's "
      "training rows." % models.LR
    ],
    unsupported={
      **dict.fromkeys(NON_MODULE_CAPABILITIES, NOT_HERE),
      **dict.fromkeys(forwards, NOT_HERE),
    },
  )
