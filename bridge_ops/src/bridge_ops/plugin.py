"""The `bridge.lowerings` entry point of bridge-ops."""

from __future__ import annotations

import importlib
from typing import Any

REGISTRY_API_VERSION = 1

# One module per op family; each registers its lowerings with `@lowering` on import.
FAMILIES = ("elementwise", "reduction", "linalg", "shape", "indexing", "creation", "random",
            "nn", "loss", "foreach")


def register(registry: Any) -> None:
  """Adds bridge-ops' lowerings to the core's registry."""
  from bridge_ops import _lowering
  for family in FAMILIES:
    try:
      importlib.import_module(f"bridge_ops.{family}")
    except ModuleNotFoundError as e:
      if e.name != f"bridge_ops.{family}":
        raise
  for record in _lowering.RECORDS:
    registry.register(record.op, record.fn, **record.options)
