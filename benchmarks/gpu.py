"""The CUDA workloads: the same command on a machine with torch and JAX for CUDA adds them.

They run in a worker of their own (run.py), the only one that sees the GPU; every other
worker runs with ``JAX_PLATFORMS=cpu`` and ``CUDA_VISIBLE_DEVICES=`` so that the CPU rows
stay CPU rows on any machine. Without a CUDA GPU in torch and in JAX, each workload is
skipped with the reason.

- ``cuda_to_jax_<size>`` / ``cuda_to_torch_<size>``: one conversion of a float32 buffer
  between a torch CUDA tensor and a JAX GPU array (zero-copy when the output aliases the
  input, which the notes report).
- ``cuda_pallas_softmax``: a row softmax written in Pallas (Triton on the GPU) on a
  (4096, 1024) float32 tensor, called from torch (bridge: ``bridge.call_jax``); torch_eager
  runs ``torch.softmax`` (the reference); plain_jax calls the kernel on a JAX array.
- ``cuda_mlp_train_step``, ``cuda_transformer_block``, ``cuda_gpt2_forward_s256``: the CPU
  rows' models on the GPU (module and input moved with ``.cuda()``; systems that take JAX
  arrays get them on JAX's default device, the GPU).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from . import models
from .common import FULL, GPU_SIZES, QUICK, QUICK_MAX_BYTES, SIZES, System, time_calls

# GPUs sum float32 products in other orders than torch's CPU kernels, and JAX's default matmul
# precision there may use TF32 (plain_jax's hand-written MLP): outputs agree to ~1e-3.
GPU_RTOL, GPU_ATOL = 2e-3, 2e-3
SOFTMAX_SHAPE, SOFTMAX_BLOCK_ROWS = (4096, 1024), 16


def require_cuda() -> None:
  """Skip unless torch and JAX both see a CUDA GPU."""
  from .workloads import Skip

  if not torch.cuda.is_available():
    raise Skip("needs a CUDA GPU: torch.cuda.is_available() is False (CPU torch build or no GPU)")
  import jax

  try:
    gpus = jax.devices("gpu")
  except RuntimeError:
    gpus = []
  if not gpus:
    raise Skip("needs a CUDA GPU in JAX too: no 'gpu' backend (install jax[cuda12])")


def describe() -> str:
  """The GPU and the CUDA builds, for the notes."""
  import jax

  gpu = jax.devices("gpu")[0]
  return (
    f"CUDA rows on {torch.cuda.get_device_name(0)} (torch {torch.__version__}, CUDA "
    f"{torch.version.cuda}; JAX {jax.__version__} on {gpu.device_kind})"
  )


def _note(system: System) -> None:
  text = f"{system.name}: {describe()}"
  if text not in system.notes:
    system.notes.append(text)


def _jax_gpu_array(a: np.ndarray):
  import jax

  return jax.device_put(a, jax.devices("gpu")[0])


def transfer(system: System, quick: bool, size: str, direction: str) -> dict:
  """One conversion of a float32 buffer between torch CUDA and JAX GPU memory."""
  from .workloads import _big_tensor, _need, time_transfer

  workload = f"cuda_{direction}_{size}"
  convert = _need(system, direction, workload)
  require_cuda()
  _note(system)
  host = _big_tensor(SIZES[size])
  src = host.cuda() if direction == "to_jax" else _jax_gpu_array(host.numpy())
  return time_transfer(system, quick, workload, convert, src)


def _softmax_kernel(x_ref, o_ref):
  import jax.numpy as jnp

  x = x_ref[...]
  e = jnp.exp(x - x.max(axis=-1, keepdims=True))
  o_ref[...] = e / e.sum(axis=-1, keepdims=True)


def pallas_softmax(x):
  """Row softmax of a 2-D float32 JAX array as one Pallas kernel, `SOFTMAX_BLOCK_ROWS` rows per
  program (Triton on a GPU; the interpreter on a CPU)."""
  import jax
  from jax.experimental import pallas as pl

  rows, cols = x.shape
  block = (SOFTMAX_BLOCK_ROWS, cols)
  return pl.pallas_call(
    _softmax_kernel,
    out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    grid=(rows // SOFTMAX_BLOCK_ROWS,),
    in_specs=[pl.BlockSpec(block, lambda i: (i, 0))],
    out_specs=pl.BlockSpec(block, lambda i: (i, 0)),
    interpret=jax.default_backend() == "cpu",
  )(x)


class Softmax:
  """The benchmarked function of ``cuda_pallas_softmax``: the Pallas kernel on JAX arrays,
  ``torch.softmax`` on torch tensors (torch_eager's reference)."""

  def __call__(self, x):
    if isinstance(x, torch.Tensor):
      return torch.softmax(x, dim=-1)
    return pallas_softmax(x)


SOFTMAX = Softmax()  # one object: systems cache their jitted wrappers by the function


def pallas_softmax_call(system: System, quick: bool) -> dict:
  from .workloads import _check, _input, _need, blocking

  g = _need(system, "call", "cuda_pallas_softmax")(SOFTMAX)
  require_cuda()
  _note(system)
  x_t = torch.randn(SOFTMAX_SHAPE, generator=torch.Generator().manual_seed(5))
  x = _input(system, x_t) if system.array_in == "jax" else x_t.cuda()
  out = g(x)
  _check(out, torch.softmax(x_t, dim=-1), "softmax", 1e-5, 1e-6)
  return time_calls(blocking(lambda: g(x), out), QUICK if quick else FULL)


def _place(system: System, *objs):
  """On the GPU for systems that take torch objects; unchanged (CPU) for those that take JAX
  arrays, which place them on JAX's default device (the GPU)."""
  return objs if system.array_in == "jax" else tuple(o.cuda() for o in objs)


def forward(system: System, quick: bool, workload: str, build: Callable) -> dict:
  """Steady-state forward of a model on the GPU (`workloads._forward`, placed by `_place`)."""
  from .workloads import _forward

  require_cuda()
  _note(system)
  return _forward(
    system,
    quick,
    workload,
    build,
    place=lambda *objs: _place(system, *objs),
    tolerance=(GPU_RTOL, GPU_ATOL),
  )


def train_step(system: System, quick: bool, workload: str, build: Callable) -> dict:
  """One SGD step on the GPU; loss and updated parameters checked against torch's CPU step."""
  from .workloads import _train_step

  require_cuda()
  _note(system)
  return _train_step(
    system,
    quick,
    workload,
    build,
    place=lambda *objs: _place(system, *objs),
    tolerance=(GPU_RTOL, GPU_ATOL),
  )


def workloads(quick: bool) -> dict[str, Callable[[System, bool], dict]]:
  """The CUDA workloads in report order (quick mode drops the biggest transfers)."""
  table: dict[str, Callable[[System, bool], dict]] = {}
  for direction in ("to_jax", "to_torch"):
    for size in GPU_SIZES:
      if quick and SIZES[size] > QUICK_MAX_BYTES:
        continue
      table[f"cuda_{direction}_{size}"] = lambda system, q, s=size, d=direction: transfer(
        system, q, s, d
      )
  table["cuda_pallas_softmax"] = pallas_softmax_call
  table["cuda_mlp_train_step"] = lambda system, q: train_step(
    system, q, "cuda_mlp_train_step", models.mlp
  )
  table["cuda_transformer_block"] = lambda system, q: forward(
    system, q, "cuda_transformer_block", models.transformer
  )
  table["cuda_gpt2_forward_s256"] = lambda system, q: forward(
    system, q, "cuda_gpt2_forward_s256", lambda: models.gpt2(256)
  )
  return table
