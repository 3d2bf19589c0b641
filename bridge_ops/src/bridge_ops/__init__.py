"""bridge-ops: aten -> JAX lowerings for the bridge's `jax` torch device.

The core finds this package through the `bridge.lowerings` entry point
(`bridge_ops.plugin`). Lowerings arrive family by family (arithmetic,
reduction, indexing, linalg, ...), one module per family.
"""

__version__ = "0.0.3"
