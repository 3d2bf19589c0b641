"""`bridge.shard` and `bridge.constrain`: sharded torch tensors and modules over a JAX mesh.

JAX fixes its device count when it starts, and this process has one CPU device, so the
multi-device cases (data and tensor parallel training, `call_torch` under `jax.jit` with
shardings, checkpoints restored onto another mesh, errors across meshes) live in
`tests/sharded_cases.py` and run here in a subprocess with 8 simulated devices. The tests
below them need one device only.
"""

from __future__ import annotations

import copy
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.sharding import AbstractMesh, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import bridge
from tests import xla
from bridge._src.sharding import sharding_of

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARDED_CASES = "tests/sharded_cases.py"


@pytest.mark.slow
def test_sharded_cases_pass_on_8_simulated_devices():
  env = dict(
    os.environ,
    XLA_FLAGS=xla.with_flags("--xla_force_host_platform_device_count=8"),
    OMP_WAIT_POLICY="PASSIVE",
  )
  try:
    out = subprocess.run(
      [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        SHARDED_CASES,
      ],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=400,
    )
  except subprocess.TimeoutExpired as e:
    partial = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
    pytest.fail(f"{SHARDED_CASES} did not finish in {e.timeout} s:\n{partial[-6000:]}")
  tail = (out.stdout + out.stderr)[-6000:]
  assert out.returncode == 0, f"{SHARDED_CASES} failed (exit {out.returncode}):\n{tail}"
  assert " passed" in out.stdout and " failed" not in out.stdout, tail


# --- one device -------------------------------------------------------------------------------


@pytest.fixture
def mesh() -> Mesh:
  return Mesh(np.array(jax.devices()[:1]), ("data",))


def test_shard_a_module_on_a_one_device_mesh(mesh):
  torch.manual_seed(0)
  model = torch.nn.Sequential(
    torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
  )
  ref = copy.deepcopy(model)
  sharding = NamedSharding(mesh, P())
  assert bridge.shard(model, sharding) is model  # in place
  for name, t in model.state_dict().items():
    assert t.device.type == "jax", name
    assert sharding_of(t).is_equivalent_to(sharding, t.dim()), name
    torch.testing.assert_close(t.cpu(), ref.state_dict()[name])
  assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad for p in model.parameters())
  assert model[1].num_batches_tracked.dtype == torch.int64  # exact dtypes, 64-bit off

  x = torch.randn(6, 4)
  xs = bridge.shard(x, NamedSharding(mesh, P("data")))
  out = model(xs)
  expected = ref(x)
  torch.testing.assert_close(out.cpu(), expected)
  out.sum().backward()
  expected.sum().backward()
  for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
    torch.testing.assert_close(p.grad.cpu(), q.grad, msg=lambda m: f"{name}: {m}")
  torch.testing.assert_close(model[1].running_mean.cpu(), ref[1].running_mean)


def test_shard_tensors_arrays_and_pytrees(mesh):
  sharding = NamedSharding(mesh, P("data"))
  t = torch.arange(6.0, requires_grad=True)
  s = bridge.shard(t, sharding)
  assert s.device.type == "jax" and s.requires_grad and s.is_leaf
  assert sharding_of(s).is_equivalent_to(sharding, 1)
  assert t.device.type == "cpu"  # a copy: the original is untouched
  (s * s).sum().backward()
  torch.testing.assert_close(s.grad.cpu(), 2 * t.detach())

  tree = {"w": jnp.ones((2, 3)), "b": [torch.zeros(3, dtype=torch.float64), "static"]}
  names = []

  def rule(name, leaf):
    names.append(name)
    return None if isinstance(leaf, jax.Array) else sharding

  placed = bridge.shard(tree, rule)
  assert len(names) == 2 and any("w" in n for n in names) and any("b" in n for n in names)
  assert placed["w"] is tree["w"]  # None: left where it is
  b = placed["b"][0]
  assert b.device.type == "jax" and b.dtype == torch.float64 and placed["b"][1] == "static"
  a = bridge.shard(jnp.arange(4.0), sharding)
  assert isinstance(a, jax.Array) and a.sharding.is_equivalent_to(sharding, 1)


def test_a_rule_returning_none_leaves_the_tensor_on_its_device(mesh):
  model = bridge.shard(
    torch.nn.Linear(4, 2), lambda name, t: NamedSharding(mesh, P()) if name == "weight" else None
  )
  assert model.weight.device.type == "jax" and model.bias.device.type == "cpu"


def test_a_mesh_axis_that_does_not_divide_the_dimension_raises_sharding_error():
  # the check needs only the mesh's shape: an abstract 4x2 mesh stands in for 8 devices
  mesh = AbstractMesh((4, 2), ("data", "model"))
  model = torch.nn.Linear(5, 3)
  with pytest.raises(bridge.ShardingError) as info:
    bridge.shard(
      model, lambda name, t: NamedSharding(mesh, P(None, "model") if t.dim() == 2 else P())
    )
  message = str(info.value)
  for part in (
    "`bridge.shard`",
    "Linear.weight",
    "(3, 5)",
    "dimension 1",
    "2 ways",
    "model",
    "data=4, model=2",
    "Pad it to a multiple of 2",
  ):
    assert part in message, message
  assert model.weight.device.type == "cpu" and model.bias.device.type == "cpu"  # nothing moved
  assert isinstance(info.value, ValueError) and isinstance(info.value, bridge.BridgeError)

  with pytest.raises(bridge.ShardingError, match=r"\['x'\].*\(5,\).*4 ways over mesh axis data"):
    bridge.shard({"x": torch.ones(5)}, NamedSharding(mesh, P("data")))


def test_a_spec_longer_than_the_shape_raises_sharding_error(mesh):
  with pytest.raises(bridge.ShardingError, match=r"Linear\.bias has shape \(2,\).*partitions 2"):
    bridge.shard(torch.nn.Linear(4, 2), NamedSharding(mesh, P("data", None)))


def test_an_unknown_mesh_axis_is_refused():
  # JAX itself refuses the sharding when it is built, before the bridge sees it
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
  with pytest.raises(ValueError, match="model"):
    bridge.shard(torch.nn.Linear(4, 2), lambda name, t: NamedSharding(mesh, P("model")))


def test_an_unknown_mesh_axis_in_a_rule_names_the_tensor():
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
  with pytest.raises(ValueError) as info:
    bridge.shard(torch.nn.Linear(4, 2), lambda name, t: NamedSharding(mesh, P("model")))
  assert isinstance(info.value, bridge.ShardingError), repr(info.value)
  assert "Linear.weight" in str(info.value) and "('data',)" in str(info.value)


@pytest.mark.parametrize("bad", [P(), "data", 3], ids=["PartitionSpec", "str", "int"])
def test_a_rule_returning_no_sharding_raises_bridge_type_error(bad):
  with pytest.raises(bridge.BridgeTypeError, match=r"the sharding for weight is a .*jax\.sharding"):
    bridge.shard(torch.nn.Linear(4, 2), lambda name, t: bad)
  with pytest.raises(bridge.BridgeTypeError, match=r"the sharding for .*'a'.*jax\.sharding"):
    bridge.shard({"a": torch.ones(2)}, lambda name, t: bad)
  with pytest.raises(bridge.BridgeTypeError, match="expected a `jax.sharding.Sharding`"):
    bridge.shard(torch.ones(2), bad)


def test_constrain_on_a_cpu_tensor_raises_bridge_type_error(mesh):
  with pytest.raises(bridge.BridgeTypeError, match=r"bridge\.constrain.*cpu.*bridge\.shard"):
    bridge.constrain(torch.ones(2), NamedSharding(mesh, P()))


def test_constrain_on_one_device(mesh):
  sharding = NamedSharding(mesh, P("data"))
  t = torch.arange(4.0, device="jax", requires_grad=True)
  c = bridge.constrain(t, sharding)
  assert sharding_of(c).is_equivalent_to(sharding, 1)
  (c * 3).sum().backward()
  torch.testing.assert_close(t.grad.cpu(), torch.full((4,), 3.0))
  f = jax.jit(bridge.jax_view(lambda u: bridge.constrain(u * 2, sharding)))
  np.testing.assert_allclose(np.asarray(f(jnp.arange(4.0))), np.arange(4.0) * 2)


class _Tied(torch.nn.Module):
  def __init__(self) -> None:
    super().__init__()
    self.emb = torch.nn.Embedding(8, 4)
    self.head = torch.nn.Linear(4, 8, bias=False)
    self.head.weight = self.emb.weight

  def forward(self, tokens):
    return self.head(self.emb(tokens))


def test_shard_keeps_tied_weights_tied(mesh):
  model = bridge.shard(_Tied(), NamedSharding(mesh, P()))
  assert model.head.weight is model.emb.weight


def test_shard_a_module_whose_parameters_have_gradients(mesh):
  model = torch.nn.Linear(4, 2)
  model(torch.randn(3, 4)).sum().backward()
  grads = [p.grad.clone() for p in model.parameters()]
  bridge.shard(model, NamedSharding(mesh, P()))
  for p, g in zip(model.parameters(), grads):
    assert p.device.type == "jax" and p.grad is not None and p.grad.device.type == "jax"
    torch.testing.assert_close(p.grad.cpu(), g)


def test_a_sharding_over_an_abstract_mesh_names_the_tensor_and_says_to_use_devices():
  abstract = jax.sharding.AbstractMesh((4, 2), ("data", "model"))
  with pytest.raises(bridge.ShardingError) as info:
    bridge.shard(torch.nn.Linear(4, 8), NamedSharding(abstract, P()))
  message = str(info.value)
  assert "Linear.weight" in message and "AbstractMesh" in message and "jax.devices()" in message
  with pytest.raises(bridge.ShardingError, match="the sharding for the tensor is over an"):
    bridge.shard(torch.ones(8, 4), NamedSharding(abstract, P("data")))
