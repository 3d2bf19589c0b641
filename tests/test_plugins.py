"""Lowering plugins are found through the `bridge.lowerings` entry points, with an API check."""

from __future__ import annotations

import types
from importlib import metadata

import pytest

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
  monkeypatch.setattr(metadata, "entry_points",
                      lambda group: [_fake_entry_point("old_ops", obj)])
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
