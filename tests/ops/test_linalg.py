"""Matrix-product lowerings (bridge_ops.linalg) against torch on CPU."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest
import torch

from tests.ops.harness import check, lowering_of

aten = torch.ops.aten
nan = math.nan

F32, F64, BF16, F16, I64, C64 = (torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                 torch.int64, torch.complex64)


def make(shape, dtype, seed=0):
  g = torch.Generator().manual_seed(seed)
  if dtype.is_floating_point or dtype.is_complex:
    sample_dtype = dtype if dtype not in (BF16, F16) else F32
    return torch.randn(shape, generator=g, dtype=sample_dtype).to(dtype)
  return torch.randint(-4, 5, shape, generator=g, dtype=dtype)


# op: argument shapes (self first). Shapes broadcast where torch allows (the add* self).
SHAPES = {
    aten.mm.default: [(5, 7), (7, 3)],
    aten.bmm.default: [(2, 5, 7), (2, 7, 3)],
    aten.mv.default: [(5, 7), (7,)],
    aten.dot.default: [(9,), (9,)],
    aten.vdot.default: [(9,), (9,)],
    aten.addmm.default: [(5, 3), (5, 7), (7, 3)],
    aten.addmv.default: [(5,), (5, 7), (7,)],
    aten.baddbmm.default: [(2, 5, 3), (2, 5, 7), (2, 7, 3)],
    aten.addbmm.default: [(5, 3), (2, 5, 7), (2, 7, 3)],
    aten.addr.default: [(5, 3), (5,), (3,)],
}
BROADCAST_SELF = {aten.addmm.default: (3,), aten.addmv.default: (1,), aten.baddbmm.default: (5, 1),
                  aten.addbmm.default: (1, 3), aten.addr.default: (3,)}
ADD_OPS = [op for op in SHAPES if len(SHAPES[op]) == 3]


def args_for(op, dtype, shapes=None):
  return [make(s, dtype, seed=i) for i, s in enumerate(shapes or SHAPES[op])]


def tol(dtype, k=7):
  # float32: MKL/OpenBLAS and XLA sum the k products in different orders (a few ulps).
  # 16-bit floats: both accumulate in float32 and round once; a one-ulp difference remains where
  # the float32 results straddle a rounding boundary.
  if dtype in (F32, C64):
    return dict(atol=1e-5 * k, rtol=1e-5)
  if dtype in (BF16, F16):
    return dict(atol=1e-2, rtol=1.6e-2)
  return {}


@pytest.mark.parametrize("op", list(SHAPES))
@pytest.mark.parametrize("dtype", [F32, F64, BF16, F16, I64, C64], ids=str)
def test_products(op, dtype):
  check(op, *args_for(op, dtype), **tol(dtype))


@pytest.mark.parametrize("op", ADD_OPS)
@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, 2), (-1, 0.25), (0, 3), (2, 0), (0, 0)],
                         ids=str)
@pytest.mark.parametrize("dtype", [F32, F64, BF16])
def test_beta_alpha(op, beta, alpha, dtype):
  check(op, *args_for(op, dtype), beta=beta, alpha=alpha, **tol(dtype))


@pytest.mark.parametrize("op", ADD_OPS)
@pytest.mark.parametrize("beta,alpha", [(2, 3), (0, 1)], ids=str)
def test_integer_scalars(op, beta, alpha):
  check(op, *args_for(op, I64), beta=beta, alpha=alpha)


@pytest.mark.parametrize("op", ADD_OPS)
def test_broadcast_self(op):
  shapes = [BROADCAST_SELF[op]] + SHAPES[op][1:]
  check(op, *args_for(op, F32, shapes), beta=0.5, **tol(F32))


@pytest.mark.parametrize("op", ADD_OPS)
@pytest.mark.parametrize("beta,alpha", [(0, 1), (1, 0), (0.5, 2)], ids=str)
@pytest.mark.parametrize("size", ["small", "large"])
def test_zero_scale_and_nan(op, beta, alpha, size):
  """beta == 0 ignores self; alpha == 0 ignores the product where torch calls BLAS (addr and
  torch's loop for small baddbmm multiply by alpha, so NaN propagates there)."""
  shapes = SHAPES[op] if size == "small" else [tuple(8 * d if d > 2 else d for d in s)
                                               for s in SHAPES[op]]
  s, a, b = args_for(op, F32, shapes)
  if beta == 0:
    s = torch.full_like(s, nan)
  if alpha == 0:
    a = a.clone()
    a.view(-1)[0] = nan
  check(op, s, a, b, beta=beta, alpha=alpha, **tol(F32))


@pytest.mark.parametrize("beta,alpha", [(True, True), (False, True), (True, False)], ids=str)
def test_addr_bool(beta, alpha):
  g = torch.Generator().manual_seed(0)
  s, v1, v2 = (torch.randint(0, 2, shape, generator=g).bool() for shape in [(4, 3), (4,), (3,)])
  check(aten.addr.default, s, v1, v2, beta=beta, alpha=alpha)


@pytest.mark.parametrize("op", [aten.mm.default, aten.bmm.default])
def test_empty_inner_dim(op):
  shapes = [(5, 0), (0, 3)] if op is aten.mm.default else [(2, 5, 0), (2, 0, 3)]
  check(op, *args_for(op, F32, shapes))


def test_float32_large_k_is_full_precision():
  """float32 products at HIGHEST precision: no reduced-precision passes, even for long sums."""
  a, b = make((16, 1024), F32), make((1024, 8), F32, seed=1)
  check(aten.mm.default, a, b, **tol(F32, k=32))


@pytest.mark.parametrize("op", ADD_OPS)
def test_traced_beta_alpha(op):
  """The core passes Scalars as weakly typed 0-d tracers: beta == 0 must work traced."""
  s, a, b = args_for(op, F32)
  s = torch.full_like(s, nan)
  fn = lowering_of(op).fn
  with jax.enable_x64(True):
    got = jax.jit(lambda s, a, b, beta, alpha: fn(s, a, b, beta=beta, alpha=alpha))(
        s.numpy(), a.numpy(), b.numpy(), 0, 1.5)
  assert got.dtype == jnp.float32
  torch.testing.assert_close(torch.from_numpy(jax.device_get(got).copy()),
                             op(s, a, b, beta=0, alpha=1.5), **tol(F32))
