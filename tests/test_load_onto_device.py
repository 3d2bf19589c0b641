"""`torch.load(f, map_location="jax")` of a checkpoint saved from the CPU: the tensors load onto
the `jax` device (they stayed on the CPU, silently), with their values, dtypes, sizes, strides,
`requires_grad` and `Parameter`-ness, and tensors saved sharing memory load sharing it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import bridge

JAX0 = torch.device("jax", 0)


def _roundtrip(obj, save_kwargs=None, **load_kwargs):
  buf = io.BytesIO()
  torch.save(obj, buf, **(save_kwargs or {}))
  buf.seek(0)
  return torch.load(buf, **load_kwargs)


def _checkpoint():
  base = torch.arange(12.0).reshape(3, 4)
  return {
    "base": base,
    "view": base[1:, 2:],  # shares base's storage
    "t": torch.arange(6.0).reshape(2, 3).t(),  # strides (1, 3)
    "int64": torch.tensor([1, 2**40, -(2**35)]),
    "bool": torch.tensor([True, False, True]),
    "half": torch.tensor([1.5, -2.25], dtype=torch.float16),
    "bf16": torch.tensor([3.0, 0.5], dtype=torch.bfloat16),
    "f64": torch.tensor([1 + 1e-12], dtype=torch.float64),
    "scalar": torch.tensor(3.5),
    "empty": torch.empty(0, 3),
    "param": torch.nn.Parameter(torch.randn(2, 2, generator=torch.Generator().manual_seed(0))),
    "frozen": torch.nn.Parameter(torch.ones(2), requires_grad=False),
    "grad": torch.ones(2).requires_grad_(),
  }


@pytest.mark.parametrize(
  "map_location",
  ["jax", "jax:0", torch.device("jax"), {"cpu": "jax"}],
  ids=["str", "str_index", "device", "dict"],
)
@pytest.mark.parametrize("weights_only", [True, False])
def test_a_cpu_checkpoint_loads_onto_the_jax_device(map_location, weights_only):
  saved = _checkpoint()
  loaded = _roundtrip(saved, map_location=map_location, weights_only=weights_only)
  assert loaded.keys() == saved.keys()
  for name, want in saved.items():
    got = loaded[name]
    assert got.device == JAX0, name
    assert got.dtype == want.dtype, name
    assert got.shape == want.shape, name
    assert got.stride() == want.stride(), name
    assert got.requires_grad == want.requires_grad, name
    assert isinstance(got, torch.nn.Parameter) == isinstance(want, torch.nn.Parameter), name
    torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=0, atol=0)


def test_tensors_saved_sharing_memory_load_sharing_it():
  loaded = _roundtrip(_checkpoint(), map_location="jax")
  assert loaded["base"].device == loaded["view"].device == JAX0
  loaded["base"][2, 3] = 100.0  # a write through one shows in the other, as on the CPU
  assert loaded["view"].cpu().tolist() == [[6.0, 7.0], [10.0, 100.0]]
  ints = torch.arange(4, dtype=torch.int32)
  whole, part = _roundtrip([ints, ints[1:3]], map_location="jax")
  whole.add_(1)
  assert part.cpu().tolist() == [2, 3] and part.dtype == torch.int32


def test_a_state_dict_loads_into_a_module_on_the_device(tmp_path):
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
  path = tmp_path / "model.pt"
  torch.save(model.state_dict(), path)
  for kwargs in ({}, {"mmap": True}):
    state = torch.load(path, map_location="jax", **kwargs)
    assert {v.device for v in state.values()} == {JAX0}
    assert state["1.num_batches_tracked"].dtype == torch.int64
    on_jax = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).to("jax")
    on_jax.load_state_dict(state)
    x = torch.randn(5, 3)
    torch.testing.assert_close(on_jax.eval()(x.to("jax")).cpu(), model.eval()(x))


def test_tensors_saved_from_the_jax_device_still_load_either_way():
  # (a control: this worked before)
  saved = {
    "w": torch.arange(3.0, device="jax"),
    "p": torch.nn.Parameter(torch.ones(2, device="jax")),
  }
  on_cpu = _roundtrip(saved)
  assert {v.device.type for v in on_cpu.values()} == {"cpu"}
  on_jax = _roundtrip(saved, map_location="jax")
  assert {v.device for v in on_jax.values()} == {JAX0}
  assert isinstance(on_jax["p"], torch.nn.Parameter) and on_jax["p"].requires_grad
  torch.testing.assert_close(on_jax["w"].cpu(), torch.arange(3.0))


def test_the_legacy_format_loads_on_the_cpu_as_documented():
  # (a control: torch rebuilds its tensors before reading their bytes, so they stay on the CPU)
  base = torch.arange(6.0)
  loaded = _roundtrip(
    {"a": base, "v": base[2:]},
    save_kwargs={"_use_new_zipfile_serialization": False},
    map_location="jax",
    weights_only=False,
  )
  assert loaded["a"].device.type == "cpu" and loaded["v"].tolist() == [2.0, 3.0, 4.0, 5.0]


def test_a_device_that_does_not_exist_is_named():
  with pytest.raises(bridge.TransferError, match="device jax:5 does not exist"):
    _roundtrip({"a": torch.ones(2)}, map_location="jax:5")


def test_an_index_loads_onto_that_device():
  code = textwrap.dedent(
    """
    import io, torch, bridge
    buf = io.BytesIO(); torch.save({"a": torch.arange(3.0)}, buf); buf.seek(0)
    a = torch.load(buf, map_location="jax:1")["a"]
    assert a.device == torch.device("jax", 1), a.device
    assert (a + 1).device == torch.device("jax", 1)
    assert a.cpu().tolist() == [0.0, 1.0, 2.0]
    print("ok")
    """
  )
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
  assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
