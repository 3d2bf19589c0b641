"""The GPU tests: every test in this folder is marked `gpu` and skipped unless torch and JAX
both see a CUDA GPU (run them with `pytest -m gpu`, or `tests/gpu/run_on_gpu.sh` on a GPU
machine)."""

from __future__ import annotations

import pytest


def _why_no_gpu() -> str | None:
  import torch

  if not torch.cuda.is_available():
    return "needs a CUDA GPU: torch.cuda.is_available() is False"
  import jax

  try:
    if jax.devices()[0].platform != "gpu":
      return f"needs JAX on a CUDA GPU: JAX's default device is {jax.devices()[0]}"
  except RuntimeError as e:
    return f"needs JAX on a CUDA GPU: {e}"
  return None


def pytest_collection_modifyitems(config, items):
  here = __file__.rsplit("/", 1)[0] + "/"
  mine = [item for item in items if str(item.fspath).startswith(here)]
  if not mine:
    return
  reason = _why_no_gpu()
  for item in mine:
    item.add_marker(pytest.mark.gpu)
    if reason:
      item.add_marker(pytest.mark.skip(reason=reason))
