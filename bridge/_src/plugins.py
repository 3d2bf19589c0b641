"""Discovery of lowering plugins through the `bridge.lowerings` entry point group.

A plugin's entry point names an object (usually a module) with:

* `REGISTRY_API_VERSION: int`, the registry API it was written against, and
* `register(registry) -> None`, which adds its lowerings (the registry arrives
  with the `jax` device).

The registry it gets offers `register(op, fn, ...)` (the lowering contract is in
`bridge._src.registry`) and, read-only, `dtypes`: the core's torch dtype -> JAX dtype map,
so that a plugin keeps no copy of its own (added within API version 1: a plugin that does
not read it is unaffected).

The core accepts the API versions in `SUPPORTED_API_VERSIONS` and refuses any
other with a `PluginError` naming the plugin and the fix.

Optional: `TRACE_JIT_FREE = True` declares that the plugin's lowerings may be traced
with `jax.disable_jit()` on (they stage their loops with jit turned back on, and call
no `jax.jit` that must stay one); jnp's own jitted helpers then trace inline rather
than as nested programs, a quarter of a model's trace time. Cores that do not know the
attribute ignore it.
"""

from __future__ import annotations

import dataclasses
from importlib import metadata
from typing import Any

from bridge._src.errors import PluginError

GROUP = "bridge.lowerings"
SUPPORTED_API_VERSIONS = frozenset({1})


@dataclasses.dataclass(frozen=True)
class PluginInfo:
  """One installed lowering plugin: entry point name, distribution, version, API version."""

  name: str
  distribution: str
  version: str
  api_version: int
  module: Any = dataclasses.field(compare=False, repr=False)


def discover() -> list[PluginInfo]:
  """Loads every `bridge.lowerings` entry point and checks its registry API version."""
  found = []
  for ep in sorted(metadata.entry_points(group=GROUP), key=lambda e: e.name):
    dist = ep.dist.name if ep.dist is not None else "<unknown>"
    version = ep.dist.version if ep.dist is not None else "<unknown>"
    try:
      obj = ep.load()
    except ImportError as e:
      raise PluginError(
        f"bridge: the lowering plugin {ep.name!r} ({dist} {version}, entry point "
        f"{ep.value!r}) failed to import: {e}. Reinstall it or uninstall it."
      ) from e
    api = getattr(obj, "REGISTRY_API_VERSION", None)
    if api not in SUPPORTED_API_VERSIONS or not callable(getattr(obj, "register", None)):
      raise PluginError(
        f"bridge: the lowering plugin {ep.name!r} ({dist} {version}) declares registry "
        f"API version {api!r}, but this bridge supports {sorted(SUPPORTED_API_VERSIONS)} "
        "and needs a `register(registry)` function. Install a matching version "
        f"(`pip install -U {dist}` or upgrade bridge), or uninstall {dist}."
      )
    found.append(PluginInfo(ep.name, dist, version, api, obj))
  return found
