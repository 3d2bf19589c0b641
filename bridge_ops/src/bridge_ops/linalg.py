"""Linear algebra: the `torch.linalg` factorizations and solves (LU, Cholesky, QR,
triangular solves, Householder products), inverses, determinants, renorm.

Decompositions return exactly the outputs of their aten schema (LU and 1-based int32
pivots, LAPACK's `info`, empty tensors for outputs not asked for). Where torch checks `info`
(the composite ops `linalg.inv`, `linalg.solve`, `linalg.cholesky`... through
`_linalg_check_errors`; the `*_ex` ops with `check_errors=True`; `cholesky`,
`cholesky_inverse`), `_linalg.check_info` raises torch's error (`LinAlgError` mostly) as a
value check: eagerly on the `jax` device, and inside a staged program (`jax.jit`) only with
`bridge.config(check_indices=True)`; without it the result holds JAX's NaN/inf instead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from bridge_ops._lowering import (
  aten,
  fori_loop,
  lowering,
  opmath,
  p_norm,
  torch_abs,
  with_derivative,
)
from bridge_ops._linalg import (
  _HIGHEST,
  _batch_broadcast,
  _empty,
  _hermitian_input,
  _is_vector_rhs,
  _mH,
  _mT,
  check_info,
)


# ----------------------------------------------------------------------------- decompositions
# torch's CPU kernels call LAPACK (getrf, potrf, geqrf, gesdd, syevd, geev), and so do JAX's
# CPU lowerings, so factors, pivots and signs match. torch's pivots are LAPACK's: 1-based int32.
# `info` outputs are LAPACK's too (0, or the 1-based index of the failing pivot/minor).


def _lu(a):
  """LAPACK getrf: (LU, 1-based int32 pivots, permutation, info) of a (batch of) matrices."""
  lu, pivots, perm = lax.linalg.lu(a)
  diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
  return lu, (pivots + 1).astype(jnp.int32), perm, _first_zero(diag == 0)


def _first_zero(bad):
  """LAPACK's info: the 1-based index of the first True along the last axis, else 0."""
  if not bad.shape[-1]:
    return jnp.zeros(bad.shape[:-1], jnp.int32)
  return jnp.where(jnp.any(bad, axis=-1), jnp.argmax(bad, axis=-1) + 1, 0).astype(jnp.int32)


def _perm_from_pivots(pivots, m):
  """The row permutation (`A[perm] = L @ U`) of torch's 1-based LAPACK pivots."""
  return lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


def _rows(b, perm):
  return jnp.take_along_axis(b, perm[..., :, None], axis=-2)


def _unrows(b, perm):
  """The inverse of `_rows`: out[perm] = b."""
  inv = jnp.argsort(perm, axis=-1)
  return jnp.take_along_axis(b, inv[..., :, None], axis=-2)


def _lu_solve(lu, perm, b, adjoint=False):
  """Solve A X = B (or A^H X = B) from A's LU factors (A[perm] = L U); batch dims broadcast."""
  lu, b = _batch_broadcast(lu, b)
  perm = jnp.broadcast_to(perm, lu.shape[:-1])
  tri = lax.linalg.triangular_solve
  if not adjoint:
    y = tri(lu, _rows(b, perm), left_side=True, lower=True, unit_diagonal=True)
    return tri(lu, y, left_side=True, lower=False)
  # A^H = U^H L^H P^T
  y = tri(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
  y = tri(lu, y, left_side=True, lower=True, unit_diagonal=True, transpose_a=True, conjugate_a=True)
  return _unrows(y, perm)


def _lu_factors(lu, pivots):
  """(P, L, U) with A = P L U from a (batch of) m x n LU and its 1-based pivots."""
  m, n = lu.shape[-2:]
  k = min(m, n)
  l = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
  u = jnp.triu(lu[..., :k, :])
  perm = _perm_from_pivots(pivots, m)
  p = _mT(jax.nn.one_hot(perm, m, dtype=lu.dtype))  # P[perm[i], i] = 1
  return p, l, u


@lowering(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(A, *, pivot=True, check_errors=False):
  if not pivot:
    raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the CPU")
  lu, pivots, _, info = _lu(A)
  if check_errors:
    check_info(info, "torch.linalg.lu_factor_ex", A.ndim == 2)
  return lu, pivots, info


@lowering(aten.linalg_lu.default)
def linalg_lu(A, *, pivot=True):
  if not pivot:
    raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the CPU")
  lu, pivots, _, _ = _lu(A)
  return _lu_factors(lu, pivots)


@lowering(aten.lu_unpack.default)
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
  p, l, u = _lu_factors(LU_data, LU_pivots)
  if not unpack_data:
    l = u = _empty(LU_data.dtype)
  if not unpack_pivots:
    p = _empty(LU_data.dtype)
  return p, l, u


@lowering(aten.linalg_lu_solve.default)
def linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False):
  perm = _perm_from_pivots(pivots, LU.shape[-1])
  if left:
    return _lu_solve(LU, perm, B, adjoint)
  # X A = B  <=>  A^H X^H = B^H
  return _mH(_lu_solve(LU, perm, _mH(B), not adjoint))


@lowering(aten._linalg_solve_ex.default)
def _linalg_solve_ex(A, B, *, left=True, check_errors=False):
  # (result, LU, pivots, info), LU and pivots those of A; a B that is a (batch of) vector(s)
  # is solved as a column, as torch's linalg_solve_is_vector_rhs says.
  lu, pivots, perm, info = _lu(A)
  vector = _is_vector_rhs(A, B)
  b = B[..., None] if vector else B
  x = _lu_solve(lu, perm, b) if left else _mH(_lu_solve(lu, perm, _mH(b), True))
  if check_errors:
    check_info(info, "torch.linalg.solve_ex", A.ndim == 2)
  return (x[..., 0] if vector else x), lu, pivots, info


@lowering(aten.linalg_inv_ex.default)
def linalg_inv_ex(A, *, check_errors=False):
  lu, _, perm, info = _lu(A)
  eye = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=A.dtype), A.shape)
  if check_errors:
    check_info(info, "linalg.inv_ex", A.ndim == 2)
  return _lu_solve(lu, perm, eye), info


def _lu_det_parts(lu, pivots):
  """(sign of the permutation, diagonal of U)."""
  n = lu.shape[-1]
  swaps = jnp.sum(pivots != jnp.arange(1, n + 1, dtype=pivots.dtype), axis=-1)
  parity = jnp.where(swaps % 2 == 0, 1, -1).astype(lu.dtype)
  return parity, jnp.diagonal(lu, axis1=-2, axis2=-1)


@lowering(aten._linalg_det.default)
def _linalg_det(A):
  # torch: LU of A^T for a contiguous real A (det A^T = det A), of A otherwise
  use_t = not jnp.iscomplexobj(A)
  lu, pivots, _, _ = _lu(_mT(A) if use_t else A)
  return _det(A, lu, pivots), lu, pivots


def _det_value(A, lu, pivots):
  del A  # the value comes from A's LU; the derivative is A's (below)
  parity, diag = _lu_det_parts(lu, pivots)
  return parity * jnp.prod(diag, axis=-1)


def _det_tangent(out, primals, tangents):
  # torch's derivative: det * trace(A^-1 dA), and 0 at an exactly singular A (JAX's rule,
  # through the LU, gives nan there); the singular matrices are swapped for I in the solve so
  # that its transpose (reverse mode) does not divide by their zero pivots.
  A, dA = primals[0], tangents[0]
  singular = out == 0
  eye = jnp.eye(A.shape[-1], dtype=A.dtype)
  x = jnp.linalg.solve(jnp.where(singular[..., None, None], eye, A), dA)
  return jnp.where(singular, jnp.zeros((), out.dtype), out * jnp.trace(x, axis1=-2, axis2=-1))


_det = with_derivative(_det_value, _det_tangent)


@lowering(aten._linalg_slogdet.default)
def _linalg_slogdet(A):
  use_t = not jnp.iscomplexobj(A)
  lu, pivots, _, _ = _lu(_mT(A) if use_t else A)
  parity, diag = _lu_det_parts(lu, pivots)
  absdiag = jnp.abs(diag)
  logabsdet = jnp.sum(jnp.log(absdiag), axis=-1)
  if jnp.iscomplexobj(A):
    phase = jnp.where(absdiag == 0, 0, diag / jnp.where(absdiag == 0, 1, absdiag).astype(A.dtype))
    sign = parity * jnp.prod(phase, axis=-1)
  else:
    sign = parity * jnp.prod(jnp.sign(diag), axis=-1)
  return sign, logabsdet, lu, pivots


def _cholesky_info(a):
  """potrf's info for a Hermitian `a`: the order of the first leading minor that is not
  positive definite, else 0 (unblocked Cholesky, run only when the factorization failed)."""
  n = a.shape[-1]

  def failing(a):
    def step(j, state):
      l, info = state
      d = jnp.real(a[..., j, j]) - jnp.sum(jnp.abs(l[..., j, :]) ** 2, axis=-1)
      bad = ~(d > 0) & (info == 0)
      info = jnp.where(bad, j + 1, info)
      dj = jnp.sqrt(jnp.where(d > 0, d, 1)).astype(a.dtype)
      col = a[..., :, j] - jnp.einsum("...ik,...k->...i", l, jnp.conj(l[..., j, :]))
      col = col / dj[..., None]
      col = jnp.where(jnp.arange(n) > j, col, 0).at[..., j].set(dj)
      return l.at[..., :, j].set(col), info

    return fori_loop(0, n, step, (jnp.zeros_like(a), jnp.zeros(a.shape[:-2], jnp.int32)))[1]

  return failing(lax.stop_gradient(a))


def _cholesky(a, upper):
  h = _hermitian_input(a, upper)
  l = lax.linalg.cholesky(h, symmetrize_input=False)
  info = jnp.zeros(a.shape[:-2], jnp.int32)
  if a.shape[-1]:
    info = lax.cond(jnp.all(jnp.isfinite(l)), lambda h: info, _cholesky_info, lax.stop_gradient(h))
  return (_mH(l) if upper else l), info


@lowering(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(self, *, upper=False, check_errors=False):
  # Where A is not positive definite torch leaves a partial factor; this gives NaN (info says).
  l, info = _cholesky(self, upper)
  if check_errors:
    check_info(info, "linalg.cholesky_ex", self.ndim == 2)
  return l, info


@lowering(aten.cholesky.default)
def cholesky(self, upper=False):
  # torch raises on a matrix that is not positive definite (a value check: inside a staged
  # program only with `check_indices`, else the factor is NaN there).
  l, info = _cholesky(self, upper)
  check_info(info, "cholesky", self.ndim == 2)
  return l


def _cholesky_solve(b, l, upper):
  l, b = _batch_broadcast(l, b)
  tri = lax.linalg.triangular_solve
  if upper:  # A = U^H U
    y = tri(l, b, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
    return tri(l, y, left_side=True, lower=False)
  y = tri(l, b, left_side=True, lower=True)
  return tri(l, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True)


@lowering(aten.cholesky_solve.default)
def cholesky_solve(self, input2, upper=False):
  return _cholesky_solve(self, input2, upper)


@lowering(aten.cholesky_inverse.default)
def cholesky_inverse(self, upper=False):
  # LAPACK potri: info is the first zero on the factor's diagonal (a NaN is not zero)
  diag = jnp.diagonal(self, axis1=-2, axis2=-1)
  check_info(_first_zero(diag == 0), "cholesky_inverse", self.ndim == 2)
  eye = jnp.broadcast_to(jnp.eye(self.shape[-1], dtype=self.dtype), self.shape)
  return _cholesky_solve(eye, self, upper)


@lowering(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(self, B, *, upper, left=True, unitriangular=False):
  a, b = _batch_broadcast(self, B)
  return lax.linalg.triangular_solve(
    a, b, left_side=left, lower=not upper, unit_diagonal=unitriangular
  )


@lowering(aten.triangular_solve.default)
def triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
  a, b = _batch_broadcast(A, self)
  x = lax.linalg.triangular_solve(
    a, b, left_side=True, lower=not upper, transpose_a=transpose, unit_diagonal=unitriangular
  )
  return x, a  # (solution, cloned_coefficient: A broadcast to the batch shape)


@lowering(aten.linalg_qr.default)
def linalg_qr(A, mode="reduced"):
  if mode == "r":
    return _empty(A.dtype), jnp.linalg.qr(A, mode="r")
  return jnp.linalg.qr(A, mode=mode)


@lowering(aten.geqrf.default)
def geqrf(self):
  # LAPACK geqrf (JAX has it as a primitive, not yet in its public `lax.linalg`)
  from jax._src.lax.linalg import geqrf as lapack_geqrf

  return lapack_geqrf(self)


def _householder_q(a, tau, cols):
  """Q = H_1 ... H_k (H_i = I - tau_i v_i v_i^H, v_i below the diagonal of column i of `a`), its
  first `cols` columns. Written as a loop of rank-1 updates so that it is differentiable."""
  m, k = a.shape[-2], tau.shape[-1]
  batch = jnp.broadcast_shapes(a.shape[:-2], tau.shape[:-1])
  q = jnp.broadcast_to(jnp.eye(m, cols, dtype=a.dtype), batch + (m, cols))
  rows = jnp.arange(m)

  def step(i, q):
    j = k - 1 - i
    col = lax.dynamic_index_in_dim(a, j, axis=a.ndim - 1, keepdims=False)
    v = jnp.where(rows > j, col, jnp.where(rows == j, 1, 0).astype(a.dtype))
    t = lax.dynamic_index_in_dim(tau, j, axis=tau.ndim - 1, keepdims=False)
    w = jnp.einsum("...i,...ij->...j", jnp.conj(v), q)
    return q - (t[..., None] * v)[..., :, None] * w[..., None, :]

  return fori_loop(0, k, step, q)


@lowering(aten.linalg_householder_product.default)
def linalg_householder_product(input, tau):
  return _householder_q(input, tau, input.shape[-1])


@lowering(aten.ormqr.default)
def ormqr(self, input2, input3, left=True, transpose=False):
  # Q (m x m, m = the rows of `self`) applied to C = input3 from the left or the right
  q = _householder_q(self, input2, self.shape[-2])
  if transpose:
    q = _mH(q)
  return (
    jnp.matmul(q, input3, precision=_HIGHEST) if left else jnp.matmul(input3, q, precision=_HIGHEST)
  )


@lowering(aten._linalg_check_errors.default, dynamic_shape=True)
def _linalg_check_errors(info, api_name, *, is_matrix):
  """torch's check of the `info` of a factorization (`linalg.inv`, `linalg.solve`,
  `linalg.cholesky`, ... call it): torch's error for the first failing `info`, a value check
  (`check_info`)."""
  check_info(info, api_name, is_matrix)


@lowering(aten.renorm.default, static_argnames=("p", "maxnorm"))
def renorm(self, p, dim, maxnorm):
  """torch: each slice along `dim` whose p-norm exceeds `maxnorm` is scaled by
  maxnorm / (norm + 1e-7); norms of 16-bit floats are taken in float32 and the factor rounded
  to the dtype before the multiplication. (`maxnorm` is static, so that torch's check of it
  raises here, in compiled programs too; its meta kernel checks only `p`.)"""
  if not maxnorm >= 0:  # (NaN too; torch prints the double as C++ streams do)
    raise RuntimeError(f"renorm: expected maxnorm to be >= 0 but got {float(maxnorm):g}")
  dim = dim % self.ndim
  axes = tuple(d for d in range(self.ndim) if d != dim)
  # torch's derivative of |x| and of the root is 0 at 0, so a zero slice (left as it is) has
  # the identity's gradient, not nan
  x = torch_abs(self.astype(opmath(self.dtype)))
  if p == float("inf"):
    norm = jnp.max(x, axis=axes, keepdims=True, initial=0)
  elif p == float("-inf"):
    norm = jnp.min(x, axis=axes, keepdims=True)
  elif p == 0:
    norm = jnp.sum(x != 0, axis=axes, keepdims=True).astype(x.dtype)
  elif p == 1:
    norm = jnp.sum(x, axis=axes, keepdims=True)
  else:
    norm = p_norm(x, p, axes, keepdims=True)
  factor = jnp.where(norm > maxnorm, maxnorm / (norm + 1e-7), 1).astype(self.dtype)
  return self * factor
