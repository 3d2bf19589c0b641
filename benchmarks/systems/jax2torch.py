"""jax2torch (peer): the `jax2torch(fn)` decorator (an autograd.Function over jax.vjp).

jax2torch 0.0.7 moves arrays with DLPack *capsules*: ``jax.dlpack.to_dlpack``
(removed from JAX) and ``jax.dlpack.from_dlpack(capsule)`` (JAX now only accepts
objects with ``__dlpack__``). The shim swaps the module's two dlpack namespaces
for ones where ``to_dlpack`` returns the array itself (torch's and jax's
from_dlpack both accept ``__dlpack__`` objects); the torch side detaches first,
as the old capsule export ignored requires_grad. Reported in the notes.
"""

import sys
import types

import jax
import torch

from ..common import System, torch_fwd_bwd

MODULES = "not applicable: it wraps JAX functions for torch, not torch modules for JAX"


def _shim_dlpack():
  import jax2torch  # noqa: F401  (the package re-exports the function under the module's name)

  module = sys.modules["jax2torch.jax2torch"]
  module.jax_dlpack = types.SimpleNamespace(
    to_dlpack=lambda a: a, from_dlpack=jax.dlpack.from_dlpack
  )
  module.torch_dlpack = types.SimpleNamespace(
    to_dlpack=lambda t: t.detach(), from_dlpack=torch.utils.dlpack.from_dlpack
  )
  return module


def make() -> System:
  module = _shim_dlpack()
  wrap = module.jax2torch
  return System(
    name="jax2torch",
    packages=("jax2torch",),
    call=lambda f: wrap(jax.jit(f)),
    fwd_bwd=lambda f: torch_fwd_bwd(wrap(jax.jit(f))),
    to_jax=module.t2j,
    to_torch=module.j2t,
    notes=[
      "jax2torch: shim: its DLPack-capsule calls (jax.dlpack.to_dlpack, removed "
      "from JAX; from_dlpack(capsule), no longer accepted) go through the "
      "__dlpack__ protocol instead (to_dlpack returns the array itself).",
      "jax2torch: call_small and fwd_bwd_small use jax2torch(jax.jit(f)), which "
      "runs jax.vjp (re-traced every call) even without grad; converters are its "
      "module-level t2j / j2t (t2j calls .contiguous()).",
    ],
    unsupported=dict.fromkeys(
      (
        "forward",
        "train_step",
        "torch_from_jax",
        "torch_from_jax_grad",
        "call_torch_jit",
        "call_torch_grad",
        "call_torch_vmap",
      ),
      MODULES,
    ),
  )
