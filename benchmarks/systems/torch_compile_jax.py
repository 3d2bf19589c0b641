"""torch.compile(module, backend="jax"): the bridge's torch.compile backend, CPU tensors."""

import torch

from .. import models
from ..common import NON_MODULE_CAPABILITIES, System
from .torch_eager import _train_step as _eager_train_step

NOT_HERE = (
  "torch_compile_jax runs the module workloads only (compiled_linear, transformer_*, mlp and "
  "gpt2 train steps, gpt2_forward_*, bert_forward_*, the first calls)"
)


def _settle():
  """Steady state: after the background compiles of the optimized programs."""
  from bridge._src import dynamo

  dynamo.wait_optimized()


def _forward(module, x):
  compiled = torch.compile(module, backend="jax")

  def run():
    return compiled(x)

  run.settle = _settle
  return run, (lambda out: out)


def _train_step(module, x, y):
  # torch's own step (zero_grad, cross_entropy, backward, SGD) around the compiled module:
  # the compiled forward and backward graphs are the only difference from torch_eager's
  compiled = torch.compile(module, backend="jax")
  run, read = _eager_train_step(_Calls(module, compiled), x, y)
  run.settle = _settle
  return run, read


class _Calls(torch.nn.Module):
  """`module`'s parameters for the optimizer and state dict, `compiled` for the call."""

  def __init__(self, module, compiled):
    super().__init__()
    self.module = module
    self.__dict__["compiled"] = compiled  # (not a submodule: the parameters once)

  def forward(self, x):
    return self.compiled(x)

  def state_dict(self, *args, **kwargs):
    return self.module.state_dict(*args, **kwargs)


def make() -> System:
  return System(
    name="torch_compile_jax",
    forward=_forward,
    train_step=_train_step,
    notes=[
      'torch_compile_jax: torch.compile(module, backend="jax") (the bridge\'s backend: '
      "dynamo -> aot_autograd -> one jax.jit program per forward/backward graph), CPU "
      "tensors in and out; forward rows under torch.no_grad() (the inference graph), "
      "train steps as torch_eager's with the compiled module (SGD lr=%g)." % models.LR
    ],
    unsupported=dict.fromkeys(NON_MODULE_CAPABILITIES, NOT_HERE),
  )
