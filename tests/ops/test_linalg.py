"""Matrix-product lowerings (bridge_ops.products) against torch on CPU."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from tests.ops.harness import check, lowering_of, run_direct

aten = torch.ops.aten
nan = math.nan

F32, F64, BF16, F16, I64, C64 = (
  torch.float32,
  torch.float64,
  torch.bfloat16,
  torch.float16,
  torch.int64,
  torch.complex64,
)


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
BROADCAST_SELF = {
  aten.addmm.default: (3,),
  aten.addmv.default: (1,),
  aten.baddbmm.default: (5, 1),
  aten.addbmm.default: (1, 3),
  aten.addr.default: (3,),
}
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
@pytest.mark.parametrize(
  "beta,alpha", [(1, 1), (0.5, 2), (-1, 0.25), (0, 3), (2, 0), (0, 0)], ids=str
)
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
  shapes = (
    SHAPES[op] if size == "small" else [tuple(8 * d if d > 2 else d for d in s) for s in SHAPES[op]]
  )
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
      s.numpy(), a.numpy(), b.numpy(), 0, 1.5
    )
  assert got.dtype == jnp.float32
  torch.testing.assert_close(
    torch.from_numpy(jax.device_get(got).copy()), op(s, a, b, beta=0, alpha=1.5), **tol(F32)
  )


# ----------------------------------------------------------------------------- decompositions

C128 = torch.complex128


def spd(n, dtype, batch=(), seed=0):
  a = make(batch + (n, n), dtype, seed)
  return a @ a.mH + n * torch.eye(n, dtype=dtype)


def lu_args(n, dtype, batch=(2,)):
  lu, piv = torch.linalg.lu_factor(make(batch + (n, n), dtype))
  return lu, piv


def tri(n, dtype, upper, batch=(2,)):
  a = make(batch + (n, n), dtype) + 3 * torch.eye(n, dtype=dtype)
  return a.triu() if upper else a.tril()


def qr_args(m, n, dtype):
  return torch.geqrf(make((m, n), dtype))


def indefinite(n, dtype, batch=(3,)):
  # symmetric, indefinite: Bunch-Kaufman picks 1x1 and 2x2 blocks and interchanges
  a = make(batch + (n, n), dtype)
  return a + a.mT


def ldl_args(n, dtype, hermitian=False, batch=(3,)):
  ld, piv, _ = torch.linalg.ldl_factor_ex(indefinite(n, dtype, batch), hermitian=hermitian)
  return ld, piv


# op: (arguments, keyword arguments) builders by dtype; outputs compared with torch on CPU.
# (Eigenvectors and singular vectors are left out: their signs are LAPACK-implementation
# defined, and torch's MKL and JAX's LAPACK may pick others.)
DECOMPOSITIONS = {
  "lu_factor_ex": (aten.linalg_lu_factor_ex.default, lambda d: [make((2, 5, 5), d)], {}),
  "lu_factor_ex_wide": (aten.linalg_lu_factor_ex.default, lambda d: [make((3, 5), d)], {}),
  "lu": (aten.linalg_lu.default, lambda d: [make((2, 5, 3), d)], {}),
  "lu_unpack": (aten.lu_unpack.default, lambda d: list(lu_args(4, d)), {}),
  "lu_unpack_nodata": (
    aten.lu_unpack.default,
    lambda d: list(lu_args(4, d)),
    dict(unpack_data=False),
  ),
  "lu_solve": (aten.linalg_lu_solve.default, lambda d: [*lu_args(4, d), make((4, 2), d)], {}),
  "lu_solve_adjoint": (
    aten.linalg_lu_solve.default,
    lambda d: [*lu_args(4, d), make((2, 4, 3), d)],
    dict(adjoint=True),
  ),
  "lu_solve_right": (
    aten.linalg_lu_solve.default,
    lambda d: [*lu_args(4, d), make((2, 3, 4), d)],
    dict(left=False),
  ),
  "solve_ex": (
    aten._linalg_solve_ex.default,
    lambda d: [make((2, 4, 4), d), make((2, 4, 3), d)],
    {},
  ),
  "solve_ex_vector": (
    aten._linalg_solve_ex.default,
    lambda d: [make((2, 4, 4), d), make((2, 4), d)],
    {},
  ),
  "solve_ex_right": (
    aten._linalg_solve_ex.default,
    lambda d: [make((4, 4), d), make((2, 3, 4), d)],
    dict(left=False),
  ),
  "inv_ex": (aten.linalg_inv_ex.default, lambda d: [make((3, 4, 4), d)], {}),
  "det": (aten._linalg_det.default, lambda d: [make((3, 4, 4), d)], {}),
  "slogdet": (aten._linalg_slogdet.default, lambda d: [make((3, 4, 4), d)], {}),
  "cholesky_ex": (aten.linalg_cholesky_ex.default, lambda d: [spd(4, d, (2,))], {}),
  "cholesky_ex_upper": (aten.linalg_cholesky_ex.default, lambda d: [spd(4, d)], dict(upper=True)),
  "cholesky": (aten.cholesky.default, lambda d: [spd(4, d, (2,))], {}),
  "cholesky_solve": (
    aten.cholesky_solve.default,
    lambda d: [make((2, 4, 3), d), torch.linalg.cholesky(spd(4, d))],
    {},
  ),
  "cholesky_solve_upper": (
    aten.cholesky_solve.default,
    lambda d: [make((4, 3), d), torch.linalg.cholesky(spd(4, d)).mH.resolve_conj()],
    dict(upper=True),
  ),
  "cholesky_inverse": (
    aten.cholesky_inverse.default,
    lambda d: [torch.linalg.cholesky(spd(4, d, (2,)))],
    {},
  ),
  "solve_triangular": (
    aten.linalg_solve_triangular.default,
    lambda d: [tri(4, d, True), make((4, 3), d)],
    dict(upper=True),
  ),
  "solve_triangular_right_unit": (
    aten.linalg_solve_triangular.default,
    lambda d: [tri(4, d, False), make((2, 3, 4), d)],
    dict(upper=False, left=False, unitriangular=True),
  ),
  "triangular_solve": (
    aten.triangular_solve.default,
    lambda d: [make((2, 4, 3), d), tri(4, d, False, ())],
    dict(upper=False, transpose=True),
  ),
  "qr": (aten.linalg_qr.default, lambda d: [make((2, 5, 3), d)], {}),
  "qr_complete": (aten.linalg_qr.default, lambda d: [make((5, 3), d)], dict(mode="complete")),
  "qr_r": (aten.linalg_qr.default, lambda d: [make((3, 5), d)], dict(mode="r")),
  "geqrf": (aten.geqrf.default, lambda d: [make((2, 5, 3), d)], {}),
  "householder_product": (
    aten.linalg_householder_product.default,
    lambda d: list(qr_args(5, 3, d)),
    {},
  ),
  "ormqr": (aten.ormqr.default, lambda d: [*qr_args(5, 3, d), make((5, 2), d)], {}),
  "ormqr_right_transpose": (
    aten.ormqr.default,
    lambda d: [*qr_args(5, 3, d), make((2, 5), d)],
    dict(left=False, transpose=True),
  ),
  "svdvals": (aten._linalg_svd.default, lambda d: [make((2, 5, 3), d)], dict(compute_uv=False)),
  "eigvalsh": (aten._linalg_eigh.default, lambda d: [make((2, 4, 4), d)], dict(compute_v=False)),
  "eigvalsh_upper": (
    aten._linalg_eigh.default,
    lambda d: [make((4, 4), d)],
    dict(UPLO="U", compute_v=False),
  ),
  "pinv": (aten.linalg_pinv.atol_rtol_tensor, lambda d: [make((2, 5, 3), d)], {}),
  "pinv_hermitian": (
    aten.linalg_pinv.atol_rtol_tensor,
    lambda d: [spd(4, d)],
    dict(hermitian=True),
  ),
  "matrix_exp": (aten.linalg_matrix_exp.default, lambda d: [make((2, 4, 4), d) / 4], {}),
  "ldl_factor_ex": (aten.linalg_ldl_factor_ex.default, lambda d: [indefinite(6, d)], {}),
  "ldl_factor_ex_hermitian": (
    aten.linalg_ldl_factor_ex.default,
    lambda d: [indefinite(6, d)],
    dict(hermitian=True),
  ),
  "ldl_factor_ex_spd": (aten.linalg_ldl_factor_ex.default, lambda d: [spd(5, d, (2,))], {}),
  "ldl_solve": (aten.linalg_ldl_solve.default, lambda d: [*ldl_args(6, d), make((6, 2), d)], {}),
  "ldl_solve_hermitian": (
    aten.linalg_ldl_solve.default,
    lambda d: [*ldl_args(6, d, True, ()), make((2, 6, 3), d)],
    dict(hermitian=True),
  ),
}


@pytest.mark.parametrize("name", list(DECOMPOSITIONS))
@pytest.mark.parametrize("dtype", [F64, F32, C64], ids=str)
def test_decompositions(name, dtype):
  op, args, kwargs = DECOMPOSITIONS[name]
  check(op, *args(dtype), **kwargs, **({} if dtype == F64 else dict(atol=1e-4, rtol=1e-4)))


@pytest.mark.parametrize("driver", [None, "gelsy", "gels", "gelsd", "gelss"])
def test_lstsq(driver):
  # tall, full rank: every driver's outputs (residuals only for gels, gelsd and gelss)
  check(
    aten.linalg_lstsq.default, make((2, 6, 3), F64), make((2, 6, 2), F64, seed=1), driver=driver
  )


def test_trilinear_is_bilinear():
  x1, x2, w = make((3, 4), F32), make((3, 5), F32, 1), make((2, 4, 5), F32, 2)
  check(aten._trilinear.default, x1, w, x2, [1, 3], [0], [1, 2], [2, 3], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("p", [1, 2, 3, math.inf])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_renorm(p, dtype):
  check(aten.renorm.default, make((4, 5, 3), dtype), p, 1, 2.0)


def test_singular_info():
  """getrf's and potrf's info: the first zero pivot, the first minor that is not positive
  definite; the composite ops raise torch's LinAlgError on it."""
  singular = torch.tensor([[1.0, 2, 3], [2, 4, 6], [1, 1, 1]], dtype=F64)
  not_pd = torch.tensor([[1.0, 2, 0], [2, 1, 0], [0, 0, 1]], dtype=F64)
  out, expected = run_direct(aten.linalg_lu_factor_ex.default, singular)
  assert out[2].item() == expected[2].item() == 3
  out, expected = run_direct(aten.linalg_cholesky_ex.default, not_pd)
  assert out[1].item() == expected[1].item() == 2
  with pytest.raises(torch.linalg.LinAlgError, match="singular"):
    torch.linalg.inv(singular.to("jax"))
  with pytest.raises(torch.linalg.LinAlgError, match="positive-definite"):
    torch.linalg.cholesky(not_pd.to("jax"))


@pytest.mark.parametrize("hermitian", [False, True])
@pytest.mark.parametrize("dtype", [F64, C64], ids=str)
def test_ldl_pivots(dtype, hermitian):
  """?sytrf's / ?hetrf's Bunch-Kaufman choices: 1-based pivots, negative for 2x2 blocks, the
  first zero column in info."""
  a = indefinite(7, dtype, (4,))
  a[1, :, 2] = 0
  a[1, 2, :] = 0  # row and column 2 of matrix 1 are zero: a zero pivot column
  out, expected = run_direct(aten.linalg_ldl_factor_ex.default, a, hermitian=hermitian)
  assert (expected[1] < 0).any() and (expected[1] != torch.arange(1, 8)).any()
  assert expected[2][0] == 0 and expected[2][1] > 0
  torch.testing.assert_close(out[1:], expected[1:])
  tol = {} if dtype == F64 else dict(atol=1e-4, rtol=1e-4)
  torch.testing.assert_close(out[0], expected[0], **tol)


@pytest.mark.parametrize("fn", ["eig", "eigh", "svd", "svd_full", "qr", "pinv_hermitian"])
def test_gauge_invariant_gradients(fn):
  """jax.grad through call_torch matches torch autograd for losses that do not depend on the
  signs/phases of eigen- or singular vectors."""
  import bridge

  k = torch.arange(4, dtype=F64)
  losses = {
    "eig": lambda a: (
      (torch.linalg.eig(a)[1].abs() ** 2 * k).sum() + torch.linalg.eig(a)[0].abs().sum()
    ),
    "eigh": lambda a: (torch.linalg.eigh(a)[1] ** 2 * k).sum() + torch.linalg.eigh(a)[0].sum(),
    "svd": lambda a: (torch.linalg.svd(a, full_matrices=False)[0] ** 2 * k[:3]).sum(),
    "svd_full": lambda a: (
      (torch.linalg.svd(a)[2] ** 2 * k[:3, None]).sum() + torch.linalg.svd(a)[1].sum()
    ),
    "qr": lambda a: (torch.linalg.qr(a)[0] * k[:3]).sum() + torch.linalg.qr(a)[1].sum(),
    "pinv_hermitian": lambda a: (torch.linalg.pinv(a, hermitian=True) * k).sum(),
  }
  loss = losses[fn]
  a = make((4, 4) if fn in ("eig", "eigh", "pinv_hermitian") else (4, 3), F64)
  if fn in ("eigh", "pinv_hermitian"):
    a = a + a.mT
  t = a.clone().requires_grad_(True)
  loss(t).backward()
  with jax.enable_x64(True):
    got = jax.grad(lambda x: bridge.call_torch(loss, x))(jnp.asarray(a.numpy()))
  torch.testing.assert_close(torch.from_numpy(np.asarray(got).copy()), t.grad)


_GROUPED = {  # (mat_a, mat_b, offs): torch's four layouts (its CPU kernel wants 16-byte strides)
  "2d_3d": ((7, 4), (3, 4, 8), [2, 2, 5]),  # rows in groups (an empty one); rows 5, 6 in none
  "3d_2d": ((3, 8, 4), (4, 12), [4, 8, 12]),  # columns of mat_b in groups
  "2d_2d": ((8, 12), (12, 8), [4, 7, 12]),  # k in groups: one product per group
  "3d_3d": ((3, 8, 4), (3, 4, 8), None),  # batched
}


@pytest.mark.parametrize("layout", sorted(_GROUPED))
def test_grouped_mm_matches_torch_with_gradients(layout):
  """`F.grouped_mm` (Hugging Face's mixture-of-experts GEMMs) on the jax device and under
  `jax.jit(jax.grad)` with traced offsets, against torch's CPU kernel and autograd."""
  a_shape, b_shape, offs = _GROUPED[layout]
  gen = torch.Generator().manual_seed(3)
  a, b = torch.randn(a_shape, generator=gen), torch.randn(b_shape, generator=gen)
  offs = None if offs is None else torch.tensor(offs, dtype=torch.int32)
  expected = torch._grouped_mm(a, b, offs=offs)
  keep = slice(0, 5) if layout == "2d_3d" else slice(None)  # torch leaves rows 5, 6 unset
  got = torch._grouped_mm(a.to("jax"), b.to("jax"), offs=None if offs is None else offs.to("jax"))
  assert got.dtype == torch.float32 and got.shape == expected.shape
  torch.testing.assert_close(got.cpu()[keep], expected[keep])
  if layout == "2d_3d":
    assert not got.cpu()[5:].any()

  weights = torch.randn(expected.shape, generator=gen)
  if layout == "2d_3d":
    weights[5:] = 0  # the unset rows count for nothing
  ar, br = a.clone().requires_grad_(), b.clone().requires_grad_()
  (torch._grouped_mm(ar, br, offs=offs) * weights).sum().backward()

  def loss(x, y, o):
    out = bridge.call_torch(lambda t, u, v: torch._grouped_mm(t, u, offs=v), x, y, o)
    return (out * jnp.asarray(weights.numpy())).sum()

  arrays = [jnp.asarray(t.numpy()) for t in (a, b)]
  o = None if offs is None else jnp.asarray(offs.numpy())
  ga, gb = jax.jit(jax.grad(loss, argnums=(0, 1)))(*arrays, o)
  # (torch's backward leaves the gradient of the rows in no group unset too; here it is 0)
  torch.testing.assert_close(torch.tensor(np.asarray(ga))[keep], ar.grad[keep])
  if layout == "2d_3d":
    assert not np.asarray(ga)[5:].any()
  torch.testing.assert_close(torch.tensor(np.asarray(gb)), br.grad)


@pytest.mark.parametrize(
  "bad,message",
  [
    (
      dict(dtype=torch.float64),
      "Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double",
    ),
    (dict(offs_dtype=torch.int64), "Offsets have to be int32"),
    (dict(out_dtype=torch.float16), "Grouped gemm output dtype must match `mat_a` dtype"),
  ],
)
def test_grouped_mm_refuses_what_torch_refuses(bad, message):
  a = torch.randn(7, 4, dtype=bad.get("dtype", torch.float32), device="jax")
  b = torch.randn(3, 4, 8, dtype=bad.get("dtype", torch.float32), device="jax")
  offs = torch.tensor([2, 2, 5], dtype=bad.get("offs_dtype", torch.int32), device="jax")
  with pytest.raises(RuntimeError, match=message):
    torch._grouped_mm(a, b, offs=offs, out_dtype=bad.get("out_dtype"))
