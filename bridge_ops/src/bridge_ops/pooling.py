"""Pooling: max/avg/adaptive/fractional pooling in 1d, 2d and 3d, with indices, and their backwards."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from bridge_ops._lowering import lowering

aten = torch.ops.aten
