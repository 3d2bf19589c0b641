"""With bridge imported (autoloaded), CPU torch code behaves as before.

The suite's process has `bridge` loaded (torch's backend autoload). These tests
run torch's own machinery here and compare with a process that has bridge off.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import bridge  # noqa: F401

# A slice of torch's OpInfo database: run each op's sample inputs on CPU.
OPS = [
  "add",
  "sub",
  "mul",
  "div",
  "pow",
  "exp",
  "log",
  "sin",
  "tanh",
  "sigmoid",
  "sqrt",
  "abs",
  "clamp",
  "where",
  "sum",
  "mean",
  "prod",
  "amax",
  "argmax",
  "cumsum",
  "softmax",
  "log_softmax",
  "matmul",
  "mm",
  "bmm",
  "addmm",
  "cat",
  "stack",
  "reshape",
  "permute",
  "transpose",
  "gather",
  "index_select",
  "masked_fill",
  "nn.functional.relu",
  "nn.functional.gelu",
  "nn.functional.conv2d",
  "nn.functional.layer_norm",
  "nn.functional.cross_entropy",
  "sort",
  "topk",
]

_SCRIPT = r"""
import sys, torch
if sys.argv[3] == "1":
    import bridge  # (the autoload alone registers the device without importing bridge)
from torch.testing._internal.common_methods_invocations import op_db
names = set(sys.argv[2].split(","))
results = {}
for op in op_db:
    if op.name not in names or op.variant_test_name:
        continue
    torch.manual_seed(0)
    for i, sample in enumerate(op.sample_inputs("cpu", torch.float32)):
        if i == 4:
            break
        out = op(sample.input, *sample.args, **sample.kwargs)
        results[f"{op.name}/{i}"] = out
torch.save(results, sys.argv[1])
print(len(results), "bridge" in sys.modules)
"""


def _run(path: str, autoload: bool) -> str:
  env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1" if autoload else "0")
  out = subprocess.run(
    [sys.executable, "-c", _SCRIPT, path, ",".join(OPS), "1" if autoload else "0"],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout.strip()


@pytest.mark.slow
def test_opinfo_samples_on_cpu_give_the_same_results_with_bridge(tmp_path):
  without, with_ = tmp_path / "without.pt", tmp_path / "with.pt"
  count_a, loaded_a = _run(str(without), autoload=False).split()
  count_b, loaded_b = _run(str(with_), autoload=True).split()
  assert (loaded_a, loaded_b) == ("False", "True")
  assert count_a == count_b and int(count_a) >= 100
  a, b = torch.load(without, weights_only=False), torch.load(with_, weights_only=False)
  assert a.keys() == b.keys()
  for key in a:
    torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, equal_nan=True, msg=key)


def test_default_device_is_still_cpu():
  assert torch.get_default_device() == torch.device("cpu")
  assert torch.empty(1).device.type == "cpu" and type(torch.empty(1)) is torch.Tensor


def test_fork_rng_restores_cpu_rng():
  torch.manual_seed(3)
  with torch.random.fork_rng():
    torch.rand(5)
  after = torch.rand(5)
  torch.manual_seed(3)
  assert torch.equal(after, torch.rand(5))


def test_freeze_rng_state():
  from torch.testing._internal.common_utils import freeze_rng_state

  torch.manual_seed(4)
  with freeze_rng_state():
    torch.rand(3)
  after = torch.rand(3)
  torch.manual_seed(4)
  assert torch.equal(after, torch.rand(3))


def test_accelerator_api_works():
  # torch reports a renamed PrivateUse1 backend as its accelerator (a torch rule); its API
  # must keep working.
  acc = torch.accelerator.current_accelerator()
  assert acc is not None and acc.type == "jax"
  assert torch.accelerator.is_available()
  assert torch.accelerator.device_count() == torch.jax.device_count()
  assert torch.accelerator.current_device_index() == 0
  # Without bridge, torch.accelerator.* raised "no accelerator" on a CPU machine; with it,
  # stream synchronization still cannot be provided by a Python backend (use torch.jax.synchronize).
  with pytest.raises(RuntimeError, match="synchroniz"):
    torch.accelerator.synchronize()
  torch.jax.synchronize()


@pytest.mark.slow
def test_torch_compile_default_backend_on_cpu():
  @torch.compile
  def f(x):
    return torch.sin(x) * 2 + x.sum()

  x = torch.randn(8)
  torch.testing.assert_close(f(x), torch.sin(x) * 2 + x.sum())


def test_cuda_surface_unchanged():
  assert torch.cuda.is_available() == (torch.cuda.device_count() > 0)
