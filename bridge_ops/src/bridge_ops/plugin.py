"""The `bridge.lowerings` entry point of bridge-ops."""

from __future__ import annotations

import importlib
from typing import Any, Callable

REGISTRY_API_VERSION = 1
# The core may trace these lowerings with `jax.disable_jit()` on (jnp's jitted helpers then
# trace inline, not as nested programs): they stage their loops through `_lowering.fori_loop`,
# `while_loop` and `scan`, and call no `jax.jit` of their own. An optional attribute: a core
# that does not know it ignores it.
TRACE_JIT_FREE = True

# One module per op family; each registers its lowerings with `@lowering` on import (in this
# order; no two register the same op: the registry refuses a duplicate without `override=`).
# The modules whose names start with "_" hold helpers shared within a group of families.
FAMILIES = (
  "arithmetic",
  "math_ops",
  "comparison",
  "activation",  # elementwise
  "reduction",
  "sorting",
  "histogram",
  "products",
  "linalg",
  "ldl",
  "spectral",
  "shape",
  "indexing",
  "creation",
  "random",
  "nn",
  "loss",
  "foreach",
  "attention",
  "recurrent",
  "special",
  "bessel",
  "polynomials",
  "fft",
  "pooling",
  "interpolation",
  "grid_sample",
)


def import_families() -> list:
  """Imports every op-family module (their `@lowering`s record themselves); returns the records."""
  from bridge_ops import _lowering  # (imports jax: not when the entry point is only read)

  for family in FAMILIES:
    importlib.import_module(f"bridge_ops.{family}")
  return _lowering.RECORDS


def install_checks(report: Callable[..., None]) -> None:
  """Optional (a core that does not know it never calls it, and the checks are then skipped):
  the core's `report(bad, values, error, message, kind)`, which enforces the value checks the
  lowerings declare with `_lowering.check` (torch's errors for out-of-range indices...)."""
  from bridge_ops import _lowering  # (imports jax: not when the entry point is only read)

  _lowering._REPORT[0] = report


def install_dtypes(torch_to_jax: Any) -> None:
  """The core's torch -> JAX dtype map, which the lowerings use (`register` installs the
  registry's; a lowering called outside the core needs one installed first)."""
  from bridge_ops import _lowering  # (imports jax: not when the entry point is only read)

  _lowering.install_dtypes(torch_to_jax)


def register(registry: Any) -> None:
  """Adds bridge-ops' lowerings to the core's registry, after taking its dtype map."""
  torch_to_jax = getattr(registry, "dtypes", None)
  if torch_to_jax is None:
    raise RuntimeError(
      "bridge_ops: this bridge core's registry has no `dtypes` (the torch -> JAX dtype map "
      "bridge-ops takes from the core instead of keeping a copy). Upgrade bridge to the "
      "version that ships with this bridge-ops."
    )
  install_dtypes(torch_to_jax)
  for record in import_families():
    registry.register(record.op, record.fn, **record.options)
