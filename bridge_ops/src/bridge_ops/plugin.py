"""The `bridge.lowerings` entry point of bridge-ops."""

from __future__ import annotations

from typing import Any

REGISTRY_API_VERSION = 1


def register(registry: Any) -> None:
  """Adds bridge-ops' lowerings to the core's registry.

  No family is lowered yet: the registry and the first lowerings arrive with
  the `jax` device. Until then there is nothing to add.
  """
  del registry
