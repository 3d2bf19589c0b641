"""Special functions (`torch.special.*`): Bessel, orthogonal polynomials, polygamma, Airy, ..."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from bridge_ops._lowering import lowering

aten = torch.ops.aten
