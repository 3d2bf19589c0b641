"""The lowering registry: user lowerings, duplicates, missing ops, missing plugin."""

from __future__ import annotations

import pytest
import torch

import bridge
from bridge._src import plugins
from bridge._src import registry as registry_lib


@torch.library.custom_op("bridgetest::scaled_square", mutates_args=())
def scaled_square(x: torch.Tensor, scale: float) -> torch.Tensor:
  return x * x * scale


@scaled_square.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
  return torch.empty_like(x)


@torch.library.custom_op("bridgetest::unlowered", mutates_args=())
def unlowered(x: torch.Tensor) -> torch.Tensor:
  return x.clone()


@unlowered.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
  return torch.empty_like(x)


def test_user_lowering_for_a_custom_op_runs_on_the_device():
  @bridge.register_lowering(torch.ops.bridgetest.scaled_square.default)
  def scaled_square_jax(x, scale):
    return x * x * scale

  x = torch.arange(4.0)
  out = torch.ops.bridgetest.scaled_square(x.to("jax"), 0.5)
  assert isinstance(out, bridge.Tensor)
  torch.testing.assert_close(out.cpu(), scaled_square(x, 0.5))


def test_duplicate_registration_raises_unless_override():
  op = torch.ops.bridgetest.scaled_square.default
  registry_lib.REGISTRY.lookup(op)  # make sure plugins are loaded first
  if op not in registry_lib.REGISTRY._table:
    bridge.register_lowering(op)(lambda x, scale: x * x * scale)
  with pytest.raises(bridge.RegistrationError) as info:
    bridge.register_lowering(op)(lambda x, scale: x)
  msg = str(info.value)
  assert "bridgetest.scaled_square.default already has a lowering" in msg
  assert "override=True" in msg
  bridge.register_lowering(op, override=True)(lambda x, scale: x * x * scale * 1.0)


def test_registering_something_that_is_not_an_op():
  with pytest.raises(bridge.RegistrationError, match="aten overloads.*got 'add'"):
    bridge.register_lowering("add")(lambda x: x)


def test_op_without_lowering_or_decomposition_says_how_to_add_one():
  # (by default such an op runs through the callback fallback: tests/test_fallback.py)
  with bridge.config(fallback="error"), pytest.raises(bridge.OperatorNotFound) as info:
    torch.ops.bridgetest.unlowered(torch.ones(2, device="jax"))
  msg = str(info.value)
  assert "fallback='error'" in msg
  assert "no lowering for bridgetest.unlowered.default" in msg
  assert "@bridge.register_lowering(torch.ops.bridgetest.unlowered.default)" in msg
  assert "import bridge, torch, jax.numpy as jnp" in msg
  assert isinstance(info.value, NotImplementedError)


def test_decompositions_can_be_turned_off():
  x = torch.randn(3, 4, device="jax")
  with bridge.config(decompose_missing_ops=False):
    ok = registry_lib.REGISTRY.lookup(torch.ops.aten.add.Tensor) is not None
    assert ok  # lowered ops are unaffected
    (x + 1).cpu()


def test_missing_plugin_is_reported_with_the_fix(monkeypatch):
  monkeypatch.setattr(plugins, "discover", lambda: [])
  fresh = registry_lib.Registry()
  with pytest.raises(bridge.PluginError) as info:
    fresh.require_plugins()
  msg = str(info.value)
  assert "no lowering plugin is installed" in msg and "pip install bridge-ops" in msg
  assert "call_jax" in msg


def test_bridge_ops_registers_many_lowerings():
  registry_lib.REGISTRY.load_plugins()
  assert [p.distribution for p in registry_lib.REGISTRY.plugins] == ["bridge-ops"]
  assert len(registry_lib.REGISTRY) > 300
  for op in (
    torch.ops.aten.add.Tensor,
    torch.ops.aten.mm.default,
    torch.ops.aten.convolution.default,
    torch.ops.aten.native_layer_norm.default,
  ):
    assert op in registry_lib.REGISTRY, op
