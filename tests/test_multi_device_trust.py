"""The `jax` device past `jax:0`, against torch on CPU: autograd on `jax:i`, CPU scalars and
indices beside a `jax:3` tensor, copies across devices and into views of sharded tensors, the
gradient of `.cpu()` of a sharded tensor, `bridge.shard` of a tensor with a graph or onto one
device, and the error for meshes of the same devices in another order.

JAX fixes its device count when it starts and this process has one device, so the cases run in
a subprocess with 8 simulated devices (`_report`), one test here per case. To run them by hand:

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest -q \
      tests/test_multi_device_trust.py
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import bridge
from bridge._src.sharding import sharding_of
from tests import xla

ROOT = pathlib.Path(__file__).resolve().parent.parent
MULTI = len(jax.devices()) >= 8
CASES: list[str] = []


def case(fn: Callable[..., None]) -> Any:
  """A case of the 8-device subprocess (skipped in a process with fewer devices)."""
  CASES.append(fn.__name__)
  return pytest.mark.skipif(not MULTI, reason="needs 8 JAX devices (run by `_report`)")(fn)


def _devices(t: torch.Tensor) -> set[int]:
  return {d.id for d in sharding_of(t).device_set}


def _mesh(*shape: int, names: tuple[str, ...] = ("d",)) -> Mesh:
  return Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), names)


# --- autograd on jax:i -------------------------------------------------------------------


@case
@pytest.mark.parametrize("index", [1, 3, 7])
def test_backward_of_a_leaf_on_jax_i(index):
  x = torch.ones(3, device=f"jax:{index}", requires_grad=True)
  (x * 2).sum().backward()
  assert x.grad.device == torch.device("jax", index)
  assert _devices(x.grad) == {index}
  torch.testing.assert_close(x.grad.cpu(), torch.full((3,), 2.0))


@case
def test_backward_of_a_moved_leaf_and_a_cpu_loss():
  w = torch.randn(4, 3)
  x = w.to("jax:2").requires_grad_()
  loss = (x.sin() * 3).cpu().sum()  # the loss on the CPU, its graph on jax:2
  (g,) = torch.autograd.grad(loss, x)
  assert g.device == torch.device("jax", 2)
  torch.testing.assert_close(g.cpu(), 3 * w.cos())


@case
def test_backward_of_a_module_on_jax_i():
  torch.manual_seed(0)
  ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
  m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
  m.load_state_dict(ref.state_dict())
  m.to("jax:5")
  x = torch.randn(6, 4)
  ref(x).pow(2).mean().backward()
  m(x.to("jax:5")).pow(2).mean().backward()
  for (name, p), q in zip(m.named_parameters(), ref.parameters()):
    assert p.grad.device == torch.device("jax", 5), name
    torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6)


@case
def test_backward_of_call_jax_and_compile_on_jax_i():
  w = torch.randn(5)
  x = w.to("jax:4").requires_grad_()
  bridge.call_jax(jnp.sin, x).sum().backward()
  torch.testing.assert_close(x.grad.cpu(), w.cos())
  assert x.grad.device == torch.device("jax", 4)

  lin = torch.nn.Linear(3, 2)
  ref = torch.nn.Linear(3, 2)
  ref.load_state_dict(lin.state_dict())
  lin.to("jax:6")
  inp = torch.randn(4, 3)
  bridge.compile(lin)(inp.to("jax:6")).sum().backward()
  ref(inp).sum().backward()
  torch.testing.assert_close(lin.weight.grad.cpu(), ref.weight.grad)
  assert lin.weight.grad.device == torch.device("jax", 6)


@case
def test_backward_of_a_reentrant_checkpoint_on_jax_i():
  w = torch.randn(3)
  x = w.to("jax:1").requires_grad_()
  y = torch.utils.checkpoint.checkpoint(lambda t: t.exp() * 2, x, use_reentrant=True)
  y.sum().backward()
  torch.testing.assert_close(x.grad.cpu(), 2 * w.exp())


# --- CPU scalars and indices beside jax:3 --------------------------------------------------

_BESIDE = {
  "add_cpu_scalar": lambda a: a + torch.tensor(2.0),
  "index_cpu_tensor": lambda a: a[torch.tensor([0, 2])],
  "clamp_cpu_scalar": lambda a: a.clamp(min=torch.tensor(0.5)),
  "masked_fill_cpu_mask": lambda a: a.clone().masked_fill_(torch.tensor(True), 1.0),
  "where_cpu_scalar": lambda a: torch.where(a > 0, a, torch.tensor(0.0)),
  "setitem_cpu_index": lambda a: a.clone().index_put_((torch.tensor([1]),), torch.tensor(9.0)),
}


@case
@pytest.mark.parametrize("name", sorted(_BESIDE))
def test_cpu_scalars_and_indices_beside_jax_3(name):
  x = torch.tensor([-1.0, 0.25, 3.0])
  out = _BESIDE[name](x.to("jax:3"))
  assert out.device == torch.device("jax", 3)
  assert _devices(out) == {3}
  torch.testing.assert_close(out.cpu(), _BESIDE[name](x))


# --- copies across devices ---------------------------------------------------------------


@case
def test_load_state_dict_from_another_device_keeps_the_destination():
  src = torch.nn.Linear(4, 4)
  m = torch.nn.Linear(4, 4).to("jax:3")
  m.load_state_dict(src.to("jax:0").state_dict())
  assert m.weight.device == torch.device("jax", 3)
  assert _devices(m.weight) == {3} and _devices(m.bias) == {3}
  x = torch.randn(2, 4)
  torch.testing.assert_close(m(x.to("jax:3")).cpu(), src.cpu()(x))


@case
def test_copy_from_a_sharded_source_lands_on_the_destination_device():
  s = bridge.shard(torch.arange(16.0).reshape(8, 2), NamedSharding(_mesh(8), P("d")))
  d = torch.zeros(8, 2, device="jax:3")
  d.copy_(s)
  assert d.device == torch.device("jax", 3) and _devices(d) == {3}
  torch.testing.assert_close(d.cpu(), torch.arange(16.0).reshape(8, 2))


@case
def test_copy_into_a_view_from_another_device():
  t0 = torch.arange(4.0).to("jax:0")
  d = torch.zeros(4, device="jax:3")
  d[:2] = t0[:2]
  assert _devices(d) == {3}
  torch.testing.assert_close(d.cpu(), torch.tensor([0.0, 1.0, 0.0, 0.0]))


# --- writes into views of sharded tensors ----------------------------------------------------


def _set(t: torch.Tensor, index: Any, v: Any) -> None:
  t[index] = v


_VIEW_WRITES = {
  "rows_from_cpu": lambda a: _set(a, slice(0, 2), torch.ones(2, 4)),
  "element_from_cpu_scalar": lambda a: _set(a, (1, 2), torch.tensor(7.0)),
  "column_copy_from_cpu": lambda a: a[:, 1].copy_(torch.arange(8.0)),
  "rows_from_jax_0": lambda a: _set(a, slice(0, 2), torch.full((2, 4), 3.0).to("jax:0")),
  "rows_from_jax_5": lambda a: _set(a, slice(2, 4), torch.full((2, 4), 5.0).to("jax:5")),
}


@case
@pytest.mark.parametrize("name", sorted(_VIEW_WRITES))
@pytest.mark.parametrize("spec", [P("d"), P(None, "d")], ids=["rows", "columns"])
def test_writes_into_a_view_of_a_sharded_tensor_keep_its_sharding(name, spec):
  sharding = NamedSharding(_mesh(4), spec)
  expected = torch.arange(32.0).reshape(8, 4)
  a = bridge.shard(expected.clone(), sharding)
  _VIEW_WRITES[name](a)
  _VIEW_WRITES[name](expected)
  torch.testing.assert_close(a.cpu(), expected)
  assert sharding_of(a).is_equivalent_to(sharding, 2), sharding_of(a)


@case
def test_writing_a_row_of_a_sharded_embedding_weight():
  emb = torch.nn.Embedding(8, 4)
  ref = torch.nn.Embedding(8, 4)
  ref.load_state_dict(emb.state_dict())
  sharding = NamedSharding(_mesh(4), P("d"))
  bridge.shard(emb, sharding)
  with torch.no_grad():
    emb.weight[0] = torch.zeros(4)
    ref.weight[0] = torch.zeros(4)
  torch.testing.assert_close(emb.weight.cpu(), ref.weight)
  assert sharding_of(emb.weight).is_equivalent_to(sharding, 2)


# --- the gradient of .cpu() of a sharded tensor ---------------------------------------------


@case
@pytest.mark.parametrize("move", ["cpu", "jax:3"])
def test_backward_through_a_move_of_sharded_tensors(move):
  torch.manual_seed(0)
  mesh = _mesh(4)
  ref = torch.nn.Linear(8, 8)
  m = torch.nn.Linear(8, 8)
  m.load_state_dict(ref.state_dict())
  bridge.shard(m, NamedSharding(mesh, P()))
  x = torch.randn(8, 8)
  xs = bridge.shard(x, NamedSharding(mesh, P("d")))
  m(xs).to(move).pow(2).mean().backward()
  ref(x).pow(2).mean().backward()
  torch.testing.assert_close(m.weight.grad.cpu(), ref.weight.grad, rtol=1e-5, atol=1e-6)
  torch.testing.assert_close(m.bias.grad.cpu(), ref.bias.grad, rtol=1e-5, atol=1e-6)
  assert _devices(m.weight.grad) == {0, 1, 2, 3}


@case
def test_backward_through_cpu_of_a_sharded_leaf():
  w = torch.randn(8, 2)
  ws = bridge.shard(w, NamedSharding(_mesh(4), P("d"))).requires_grad_()
  (ws * 3).cpu().sum().backward()
  torch.testing.assert_close(ws.grad.cpu(), torch.full((8, 2), 3.0))
  assert _devices(ws.grad) == {0, 1, 2, 3}


# --- bridge.shard: gradients and single devices ----------------------------------------------


@case
@pytest.mark.parametrize("source", ["cpu", "jax:3", "sharded"])
def test_shard_of_a_tensor_with_a_graph_passes_the_gradient_back(source):
  sharding = NamedSharding(_mesh(8), P("d"))
  w0 = torch.randn(8, 4)
  w = w0.clone().requires_grad_()
  if source == "jax:3":
    w = w0.to("jax:3").requires_grad_()
  elif source == "sharded":
    w = bridge.shard(w0, NamedSharding(_mesh(2), P("d"))).requires_grad_()
  h = bridge.shard(w * 2, sharding)
  assert h.grad_fn is not None and not h.is_leaf
  (h * h).sum().backward()
  assert w.grad.device == w.device
  torch.testing.assert_close(w.grad.cpu(), 8 * w0)
  if source == "sharded":
    assert sharding_of(w.grad).is_equivalent_to(sharding_of(w), 2)
  elif source == "jax:3":
    assert _devices(w.grad) == {3}


@case
def test_shard_of_a_leaf_stays_a_leaf():
  w = torch.randn(8, 4, requires_grad=True)
  h = bridge.shard(w, NamedSharding(_mesh(8), P("d")))
  assert h.is_leaf and h.requires_grad and h.grad_fn is None
  h.sum().backward()
  torch.testing.assert_close(h.grad.cpu(), torch.ones(8, 4))
  assert w.grad is None  # (a copy: the original is untouched)


@case
@pytest.mark.parametrize(
  "sharding",
  [
    lambda: SingleDeviceSharding(jax.devices()[3]),
    lambda: NamedSharding(Mesh(np.array(jax.devices()[5:6]), ("d",)), P()),
  ],
  ids=["single_device_3", "mesh_of_device_5"],
)
def test_shard_onto_one_device_names_that_device(sharding):
  s = sharding()
  (device,) = s.device_set
  t = bridge.shard(torch.arange(4.0), s)
  assert t.device == torch.device("jax", device.id)
  out = t + torch.ones(4, device=f"jax:{device.id}")
  torch.testing.assert_close(out.cpu(), torch.arange(4.0) + 1)


# --- the current device ---------------------------------------------------------------------


@case
def test_jax_methods_follow_the_current_device():
  with torch.jax.device(2):
    assert torch.ones(2).jax().device == torch.device("jax", 2)
    assert torch.nn.Linear(2, 2).jax().weight.device == torch.device("jax", 2)
    assert torch.ones(2, device="jax").device == torch.device("jax", 2)


# --- meshes of the same devices in another order ------------------------------------------


@case
def test_meshes_of_the_same_devices_in_another_order_say_so():
  devices = jax.devices()[:4]
  a = bridge.shard(torch.ones(4, 4), NamedSharding(Mesh(np.array(devices), ("x",)), P("x")))
  b = bridge.shard(torch.ones(4, 4), NamedSharding(Mesh(np.array(devices[::-1]), ("x",)), P("x")))
  with pytest.raises(bridge.DeviceMismatchError) as e:
    a + b
  assert str(e.value) == (
    "bridge: aten.add.Tensor got `jax` tensors placed on the same devices in different orders "
    "(meshes that list the devices otherwise):\n"
    "  argument 0: shape (4, 4), NamedSharding(mesh {x=4}, spec P('x',)), devices [0, 1, 2, 3]\n"
    "  argument 1: shape (4, 4), NamedSharding(mesh {x=4}, spec P('x',)), devices [0, 1, 2, 3]\n"
    "  argument 0: devices in the order [0, 1, 2, 3]\n"
    "  argument 1: devices in the order [3, 2, 1, 0]\n"
    "One op runs on one mesh: place them together first (`bridge.shard(t, sharding)` with a "
    "sharding over the same mesh, its devices in the same order)."
  )


# --- the runner, in the main (one-device) process -------------------------------------------


@pytest.fixture(scope="module")
def _report() -> dict[str, str]:
  """Each case's outcome in a subprocess with 8 simulated devices: name -> PASSED/FAILED/..."""
  env = dict(
    os.environ,
    XLA_FLAGS=xla.with_flags("--xla_force_host_platform_device_count=8"),
    OMP_WAIT_POLICY="PASSIVE",
  )
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "pytest",
      "-q",
      "-rA",
      "-p",
      "no:randomly",
      "-p",
      "no:cacheprovider",
      "-p",
      "no:xdist",
      str(pathlib.Path(__file__).relative_to(ROOT)),
    ],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=500,
  )
  found: dict[str, str] = {}
  for line in out.stdout.splitlines():
    m = re.match(r"(PASSED|FAILED|ERROR|SKIPPED) \S*::(test_\w+)", line)
    if m:
      name = m.group(2)
      found[name] = "FAILED" if found.get(name, "PASSED") != "PASSED" else m.group(1)
  assert found, (out.stdout + out.stderr)[-4000:]
  found["_log"] = out.stdout[-20000:]
  return found


@pytest.mark.skipif(MULTI, reason="the cases run themselves in this process")
@pytest.mark.parametrize("name", CASES)
def test_on_8_simulated_devices(_report, name):
  outcome = _report.get(name)
  if outcome != "PASSED":
    failure = re.search(rf"_+ {name}\S* _+\n(.*?)(?=\n_{{5,}} |\n=+ )", _report["_log"], re.S)
    pytest.fail(f"{name}: {outcome}\n{failure.group(1)[-3000:] if failure else ''}")
