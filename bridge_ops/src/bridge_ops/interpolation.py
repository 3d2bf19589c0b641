"""Interpolation: `interpolate`/`upsample` in every mode, `grid_sample`, `affine_grid`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from bridge_ops._lowering import lowering

aten = torch.ops.aten
