"""FFT (`torch.fft`): the `_fft_r2c`, `_fft_c2c` and `_fft_c2r` primitives torch lowers every transform to."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from bridge_ops._lowering import lowering

aten = torch.ops.aten
