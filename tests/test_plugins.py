"""Lowering plugins are found through the `bridge.lowerings` entry points, with an API check."""

from __future__ import annotations

import types
from importlib import metadata

import pytest
import torch

import bridge
import bridge_ops
from bridge._src import plugins


def test_bridge_ops_is_installed_and_discovered():
  found = {p.name: p for p in plugins.discover()}
  assert "aten" in found
  info = found["aten"]
  assert info.distribution == "bridge-ops"
  assert info.version == bridge_ops.__version__ == metadata.version("bridge-ops")
  assert info.api_version in plugins.SUPPORTED_API_VERSIONS
  assert info.module.register is not None


def test_plugin_has_its_own_version():
  assert metadata.version("bridge") == bridge.__version__
  assert metadata.version("bridge-ops") != metadata.version("bridge")


def _fake_entry_point(name: str, obj: object) -> metadata.EntryPoint:
  ep = metadata.EntryPoint(name=name, value="fake_plugin:obj", group=plugins.GROUP)
  return types.SimpleNamespace(name=ep.name, value=ep.value, dist=None, load=lambda: obj)


@pytest.mark.parametrize("api", [0, 2, None])
def test_incompatible_plugin_is_refused_with_the_fix(monkeypatch, api):
  obj = types.SimpleNamespace(REGISTRY_API_VERSION=api, register=lambda registry: None)
  monkeypatch.setattr(metadata, "entry_points", lambda group: [_fake_entry_point("old_ops", obj)])
  with pytest.raises(bridge.PluginError) as info:
    plugins.discover()
  msg = str(info.value)
  assert "'old_ops'" in msg and f"registry API version {api!r}" in msg
  assert "supports [1]" in msg and "pip install -U" in msg


def test_plugin_that_fails_to_import_is_reported(monkeypatch):
  def boom():
    raise ImportError("no module named fake_plugin")

  ep = types.SimpleNamespace(name="broken", value="fake_plugin:obj", dist=None, load=boom)
  monkeypatch.setattr(metadata, "entry_points", lambda group: [ep])
  with pytest.raises(bridge.PluginError, match=r"'broken'.*failed to import.*no module named"):
    plugins.discover()


def _nested_programs(jaxpr) -> dict:
  """Name -> count of the nested `jit` equations in `jaxpr` (and the jaxprs inside it)."""
  import jax

  found: dict = {}
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ("jit", "pjit"):
      found[eqn.params["name"]] = found.get(eqn.params["name"], 0) + 1
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      for k, v in _nested_programs(sub).items():
        found[k] = found.get(k, 0) + v
  return found


def _primitives(jaxpr) -> set:
  import jax

  names = set()
  for eqn in jaxpr.eqns:
    names.add(eqn.primitive.name)
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      names |= _primitives(sub)
  return names


def test_bridge_ops_lowerings_trace_with_jit_off_and_keep_their_loops():
  """bridge-ops declares TRACE_JIT_FREE: its lowerings trace with `jax.disable_jit()` on, so
  jnp's helpers (`jnp.where`, every `x * y`) leave no nested programs in the traced model;
  its loops stay loops (a `baddbmm` of small matrices sums over k in a `fori_loop`)."""
  import jax
  import jax.numpy as jnp
  import torch

  from bridge._src.registry import REGISTRY

  assert REGISTRY.lookup(torch.ops.aten.where.self).jit_free

  def masked(x):
    return torch.where(x > 0, x * 2, x - 1)

  x = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)
  closed = jax.make_jaxpr(lambda a: bridge.call_torch(masked, a))(x)
  assert _nested_programs(closed.jaxpr) == {}
  assert "select_n" in _primitives(closed.jaxpr)
  expected = torch.where(
    torch.from_numpy(jax.device_get(x)) > 0,
    torch.from_numpy(jax.device_get(x)) * 2,
    torch.from_numpy(jax.device_get(x)) - 1,
  )
  torch.testing.assert_close(
    torch.from_numpy(jax.device_get(bridge.call_torch(masked, x))), expected
  )

  b1, b2, c = jnp.ones((2, 3, 5)), jnp.ones((2, 5, 4)), jnp.zeros((2, 3, 4))
  closed = jax.make_jaxpr(lambda *a: bridge.call_torch(torch.baddbmm, *a))(c, b1, b2)
  prims = _primitives(closed.jaxpr)
  assert "while" in prims or "scan" in prims, prims  # staged, not unrolled over k
  out = bridge.call_torch(torch.baddbmm, c, b1, b2)
  assert float(jnp.max(jnp.abs(out - 5.0))) == 0.0


def test_user_lowerings_trace_with_jit_on():
  """A lowering registered by user code (not by a plugin that declares TRACE_JIT_FREE) traces
  as before, jit on: its loops are its own business."""
  import torch

  from bridge._src.registry import Registry

  registry = Registry()
  registry._loaded = True  # no plugins: only this registration
  registry.register(torch.ops.aten.relu.default, lambda x: x)
  assert registry.lookup(torch.ops.aten.relu.default).jit_free is False


def test_an_op_this_torch_lacks_skips_its_lowering_not_the_plugin():
  # bridge-ops supports torch 2.5 and later: a lowering of an op from a later torch (or of a
  # torch module that an older torch lacks) must not keep the rest of its family from loading
  # (on torch 2.11 the whole plugin failed to load over one such op)
  from bridge_ops import _lowering

  ops = _lowering.Ops(torch.ops.aten, "aten")
  assert ops.add is torch.ops.aten.add and ops.__lshift__ is torch.ops.aten.__lshift__
  missing = ops.an_op_of_a_later_torch
  assert isinstance(missing, _lowering.Missing) and missing.default is missing
  with pytest.raises(NotImplementedError, match="aten::an_op_of_a_later_torch does not exist"):
    missing.default(1)
  with pytest.raises(AttributeError):
    ops.__wrapped__  # (Python's own questions about the object are not ops)
  before = len(_lowering.RECORDS)
  try:

    @_lowering.lowering(missing.default, ops.add.Tensor)
    def lowered(a, b):
      return a + b

    assert [r.op for r in _lowering.RECORDS[before:]] == [torch.ops.aten.add.Tensor]
  finally:
    del _lowering.RECORDS[before:]


def test_the_plugin_imports_nothing_from_the_core():
  """bridge-ops' runtime modules (`plugin`, `_lowering` and every op family) import no `bridge`
  module: the core hands them what they need at registration (the OpInfo tool in
  `bridge_ops.testing` is the one part that imports the core, and nothing imports it).
  torch's device-backend autoload is off there (it imports `bridge` only when the device is
  first used)."""
  import os
  import subprocess
  import sys
  import pkgutil
  from bridge_ops import plugin

  modules = ["bridge_ops.plugin", "bridge_ops._lowering"] + [
    f"bridge_ops.{family}" for family in plugin.FAMILIES
  ]
  runtime = {
    f"bridge_ops.{m.name}" for m in pkgutil.iter_modules(bridge_ops.__path__) if m.name != "testing"
  }
  assert set(modules) <= runtime and runtime - set(modules) <= {
    f"bridge_ops.{m}" for m in ("_elementwise", "_reduction", "_linalg", "_special")
  }
  code = (
    "import importlib, sys\n"
    f"for name in {modules!r}:\n"
    "  importlib.import_module(name)\n"
    "print(sorted(m for m in sys.modules if m == 'bridge' or m.startswith('bridge.')))\n"
  )
  env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
  run = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env
  )
  assert run.returncode == 0, run.stderr
  assert run.stdout.strip() == "[]", run.stdout


def test_the_plugin_uses_the_cores_dtype_map():
  """bridge-ops keeps no dtype map of its own: `register` takes the registry's (the core's
  `dtypes.TORCH_TO_JAX`, read-only), and without one a dtype helper says how to install it."""
  from bridge._src import dtypes
  from bridge._src import registry as registry_lib
  from bridge_ops import _lowering

  registry_lib.REGISTRY.load_plugins()
  handed = registry_lib.REGISTRY.dtypes
  assert dict(handed) == dtypes.TORCH_TO_JAX
  with pytest.raises(TypeError):
    handed[torch.float32] = None  # read-only
  assert _lowering._DTYPES["to_jax"] is handed
  assert _lowering.jax_dtype(torch.bfloat16) == dtypes.TORCH_TO_JAX[torch.bfloat16]
  assert _lowering.torch_dtype(dtypes.TORCH_TO_JAX[torch.int16]) is torch.int16
  saved = dict(_lowering._DTYPES)
  _lowering._DTYPES.clear()
  try:
    with pytest.raises(RuntimeError, match=r"no dtype map is installed.*install_dtypes"):
      _lowering.default_float()
  finally:
    _lowering._DTYPES.update(saved)


def test_a_core_without_a_dtype_map_is_refused_with_the_fix():
  from bridge_ops import plugin

  with pytest.raises(RuntimeError, match=r"registry has no `dtypes`.*Upgrade bridge"):
    plugin.register(types.SimpleNamespace(register=lambda *a, **k: None))


@pytest.mark.parametrize(
  "dtype, compute",
  [
    ("float16", "float32"),
    ("bfloat16", "float32"),
    ("float32", "float32"),
    ("float64", "float64"),
    ("int8", "int8"),
    ("int16", "int16"),
    ("bool", "bool"),
    ("complex64", "complex64"),
  ],
)
def test_opmath_is_torchs_compute_dtype(dtype, compute):
  """One `opmath` for every lowering: the 16-bit floats compute in float32, the rest as is."""
  import jax.numpy as jnp
  import numpy as np
  from bridge_ops._lowering import opmath

  assert opmath(getattr(jnp, dtype)) == np.dtype(getattr(jnp, compute))
