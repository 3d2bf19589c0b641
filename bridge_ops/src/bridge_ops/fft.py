"""FFT (`torch.fft`): the `_fft_r2c`, `_fft_c2c` and `_fft_c2r` primitives torch lowers every transform to.

torch's frontend (`torch.fft.*`, `stft`, `istft`) does the padding, trimming, dtype promotion and
choice of direction; the three primitives only transform over `dim` and scale by `normalization`
(0: none, 1: 1/sqrt(n), 2: 1/n, with n the product of the signal sizes over `dim`: the output sizes
for `_fft_c2r`). Complex results are complex64 for float32 input and complex128 for float64, as
torch's meta kernels say (the core casts to them).
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from bridge_ops._lowering import aten, lowering


def _axes(x, dim) -> list[int]:
  return [d % x.ndim for d in dim]


def _scale(x, normalization: int, n: int):
  if normalization == 1:
    return x * (1.0 / math.sqrt(n))
  if normalization == 2:
    return x * (1.0 / n)
  return x


def _c2c(x, axes, forward: bool):
  """Unnormalized complex transform over `axes` (XLA transforms at most 3 axes at a time)."""
  for i in range(0, len(axes), 3):
    chunk = axes[i : i + 3]
    x = (
      jnp.fft.fftn(x, axes=chunk, norm="backward")
      if forward
      else jnp.fft.ifftn(x, axes=chunk, norm="forward")
    )
  return x


def _complex(x):
  return (
    x.astype(jnp.complex128 if x.dtype == jnp.float64 else jnp.complex64)
    if not jnp.iscomplexobj(x)
    else x
  )


@lowering(aten._fft_c2c.default)
def _fft_c2c(self, dim, normalization, forward):
  """Complex-to-complex transform (forward: e^{-2 pi i ...}, else the unnormalized inverse)."""
  axes = _axes(self, dim)
  n = math.prod(self.shape[a] for a in axes)
  return _scale(_c2c(_complex(self), axes, forward), normalization, n)


@lowering(aten._fft_r2c.default)
def _fft_r2c(self, dim, normalization, onesided):
  """Real-to-complex forward transform; `onesided` keeps the last dim's n // 2 + 1 terms."""
  axes = _axes(self, dim)
  n = math.prod(self.shape[a] for a in axes)
  x = _complex(self)
  if onesided:
    x = jnp.fft.rfft(self, axis=axes[-1], norm="backward").astype(x.dtype)
    x = _c2c(x, axes[:-1], True)
  else:
    x = _c2c(x, axes, True)
  return _scale(x, normalization, n)


@lowering(aten._fft_c2r.default)
def _fft_c2r(self, dim, normalization, last_dim_size):
  """Complex-to-real inverse transform of a one-sided (Hermitian) input; the last dim of the
  output has `last_dim_size` points (the input's last dim must hold last_dim_size // 2 + 1)."""
  axes = _axes(self, dim)
  x = _c2c(_complex(self), axes[:-1], False)
  last = axes[-1]
  keep = last_dim_size // 2 + 1
  if x.shape[last] > keep:  # torch ignores the terms past the Hermitian half
    x = jnp.take(x, jnp.arange(keep), axis=last)
  x = jnp.fft.irfft(x, n=last_dim_size, axis=last, norm="forward")
  n = math.prod(self.shape[a] for a in axes[:-1]) * last_dim_size
  return _scale(x, normalization, n)
