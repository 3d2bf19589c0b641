"""FFT lowerings (bridge_ops.fft) against torch on CPU: the three primitives torch.fft uses."""

from __future__ import annotations

import pytest
import torch

from tests.ops.harness import check

aten = torch.ops.aten


def make(shape, dtype, seed=0):
  return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("dim", [[0], [3], [0, 2], [0, 1, 2, 3]])
@pytest.mark.parametrize("normalization", [0, 1, 2])
@pytest.mark.parametrize("forward", [True, False])
# torch's primitives take non-negative dims (the torch.fft frontend wraps them).
def test_fft_c2c(dtype, dim, normalization, forward):
  check(aten._fft_c2c.default, make((3, 4, 5, 2), dtype), dim, normalization, forward)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dim", [[1], [0, 1], [0, 1, 2, 3]])
@pytest.mark.parametrize("normalization", [0, 1, 2])
@pytest.mark.parametrize("onesided", [True, False])
def test_fft_r2c(dtype, dim, normalization, onesided):
  check(aten._fft_r2c.default, make((3, 6, 5, 2), dtype), dim, normalization, onesided)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize(
  "dim,shape", [([1], (3, 10)), ([1], (3, 11)), ([0, 1], (3, 8, 2)), ([0, 1, 2, 3], (3, 4, 5, 3))]
)
@pytest.mark.parametrize("normalization", [0, 1, 2])
def test_fft_c2r(dtype, dim, shape, normalization):
  # A Hermitian one-sided input, as torch.fft.irfftn passes it; the last dim's size is given.
  x = torch.fft.rfftn(make(shape, torch.float64), dim=dim).to(dtype)
  # float32: an unnormalized 4-d transform sums 180 terms; the FFT algorithms round differently.
  tol = dict(atol=1e-4, rtol=1e-5) if dtype is torch.complex64 else {}
  check(aten._fft_c2r.default, x, dim, normalization, shape[dim[-1]], **tol)
