"""Linear algebra: matrix products (mm, bmm, mv, dot, vdot, the fused add* forms) and the
`torch.linalg` primitives (LU, Cholesky, LDL, QR, SVD, eigendecompositions, solves, inverses,
determinants, pinv, lstsq, matrix_exp, Householder products).

* Products run at `Precision.HIGHEST` (no TF32 / bf16 passes on accelerators) so float32
  matches torch on CPU; float16/bfloat16 accumulate in float32 and round once, as torch's CPU
  kernels do.
* add*: `beta * self + alpha * product`, where `beta == 0` ignores `self` (NaN/inf in it do
  not propagate) and, where torch's CPU kernels call BLAS, `alpha == 0` ignores the product.
  torch's `addr` (elementwise) and its small-`baddbmm` loop (k*m*n < 400) do multiply by
  `alpha`, so NaN propagates there. `beta` and `alpha` may be traced, so these are `where`s,
  not Python branches; for integer tensors they truncate to integers first, as torch's do.
* `matmul`, `linear`, `outer`, `ger` are composite in torch (they decompose into the ops
  here before reaching the device), and the `.dtype` (`out_dtype`) overloads are CUDA-only in
  torch, so none of them is registered.
* Decompositions return exactly the outputs of their aten schema (LU and 1-based int32
  pivots, LAPACK's `info`, empty tensors for outputs not asked for). The composite ops
  (`linalg.inv`, `linalg.solve`, `linalg.cholesky`...) check `info` through
  `_linalg_check_errors`, which raises torch's `LinAlgError` on concrete values; inside a
  staged program (`jax.jit`) it cannot, and the result holds JAX's NaN/inf instead.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from bridge_ops._lowering import (aten, fori_loop, jax_dtype, literal, lowering, opmath,
                                  p_norm, scan, torch_abs, torch_dtype, while_loop, with_derivative)

_HIGHEST = lax.Precision.HIGHEST


def _same_dtype(a, b):
  # torch's matrix products refuse mixed dtypes (its meta kernels do not check this)
  if a.dtype != b.dtype:
    raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: "
                       f"{_torch_name(a.dtype)} != {_torch_name(b.dtype)}")


def _torch_name(dtype):
  return {"float32": "float", "float64": "double", "float16": "c10::Half",
          "bfloat16": "c10::BFloat16", "int64": "long int", "int32": "int"}.get(
              np.dtype(dtype).name, np.dtype(dtype).name)


# The products' contractions as `lax.dot_general` dimension numbers: ((contracting), (batch)).
# (jnp.einsum plans its contraction in Python each time it meets new shapes: ~0.8 ms more per
# op when torch code is traced.)
_CONTRACTIONS = {
    "ij,jk->ik": (((1,), (0,)), ((), ())),
    "bij,bjk->bik": (((2,), (1,)), ((0,), (0,))),
    "ij,j->i": (((1,), (0,)), ((), ())),
    "i,i->": (((0,), (0,)), ((), ())),
}


def _product(subscripts, a, b):
  """A matrix product at full precision, in the accumulation dtype (float32 for 16-bit
  floats)."""
  _same_dtype(a, b)
  return lax.dot_general(a, b, _CONTRACTIONS[subscripts], precision=_HIGHEST,
                         preferred_element_type=opmath(a.dtype))


def _scalar(x, dtype):
  """torch's `Scalar.to<scalar_t>()` for integer tensors: a float beta/alpha truncates."""
  if jnp.issubdtype(dtype, jnp.integer):
    return jnp.asarray(x).astype(dtype)
  return x


def _add_scaled(self, product, beta, alpha, out_dtype, zero_alpha_ignores_product=True):
  """beta * self + alpha * product, with torch's semantics for beta == 0 and alpha == 0."""
  if out_dtype == jnp.bool_:  # torch: for bool tensors beta/alpha act as logical and
    return (jnp.logical_and(beta, self) | jnp.logical_and(alpha, product)).astype(jnp.bool_)
  bias = self.astype(product.dtype)
  if literal(beta) and beta in (0, 1):  # (the defaults: nothing to scale or select)
    bias = jnp.zeros_like(bias) if beta == 0 else bias
  else:
    beta = _scalar(beta, out_dtype)
    bias = jnp.where(beta == 0, jnp.zeros_like(bias), beta * bias)
  if literal(alpha) and alpha == 1:
    scaled = product
  else:
    alpha = _scalar(alpha, out_dtype)
    scaled = alpha * product
    if zero_alpha_ignores_product:
      scaled = jnp.where(alpha == 0, jnp.zeros_like(product), scaled)
  return (bias + scaled).astype(out_dtype)


@lowering(aten.mm.default)
def mm(self, mat2):
  return _product("ij,jk->ik", self, mat2).astype(self.dtype)


@lowering(aten.bmm.default)
def bmm(self, mat2):
  return _product("bij,bjk->bik", self, mat2).astype(self.dtype)


@lowering(aten.linear.default)
def linear(input, weight, bias=None):
  # torch decomposes `linear` (`t` + `addmm`, or an expanded `bmm` for a non-contiguous 3-D
  # input); the core runs this instead when autograd is not recording.
  _same_dtype(input, weight)
  out = lax.dot_general(input, weight, (((input.ndim - 1,), (weight.ndim - 1,)), ((), ())),
                        precision=_HIGHEST, preferred_element_type=opmath(input.dtype))
  return (out if bias is None else out + bias).astype(input.dtype)


@lowering(aten.matmul.default)
def matmul(self, other):
  # torch's `matmul` broadcasts by expanding to `bmm`; XLA contracts the batch dims directly.
  _same_dtype(self, other)
  return jnp.matmul(self, other, precision=_HIGHEST,
                    preferred_element_type=opmath(self.dtype)).astype(self.dtype)


@lowering(aten.mv.default)
def mv(self, vec):
  return _product("ij,j->i", self, vec).astype(self.dtype)


@lowering(aten.dot.default)
def dot(self, tensor):
  return _product("i,i->", self, tensor).astype(self.dtype)


@lowering(aten.vdot.default)
def vdot(self, other):
  return _product("i,i->", jnp.conj(self), other).astype(self.dtype)


@lowering(aten.addmm.default)
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
  return _add_scaled(self, _product("ij,jk->ik", mat1, mat2), beta, alpha, mat1.dtype)


@lowering(aten.addmv.default)
def addmv(self, mat, vec, *, beta=1, alpha=1):
  return _add_scaled(self, _product("ij,j->i", mat, vec), beta, alpha, mat.dtype)


@lowering(aten._grouped_mm.default)
def _grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
  """torch's grouped GEMM (`F.grouped_mm`, what Hugging Face's mixture-of-experts layers call
  on a non-CPU device). `offs` holds the int32 end offsets of the groups along the ragged
  dimension:

  * 2-D x 3-D: (M, K) rows in groups, group g times `mat2[g]` -> (M, N); rows past the last
    offset are 0 (torch's CPU kernel leaves them unset);
  * 3-D x 2-D: (N) columns in groups, `self[g]` times group g's columns -> (M, N);
  * 2-D x 2-D: K in groups, one product per group -> (G, M, N);
  * 3-D x 3-D (no `offs`): a batched product.

  The offsets may be traced values (a router's counts): every shape is static.
  """
  allowed = (np.dtype(jnp.float32), np.dtype(jnp.bfloat16), np.dtype(jnp.float16))
  for name, m in (("mat_a", self), ("mat_b", mat2)):
    if np.dtype(m.dtype) not in allowed:
      kind = torch.empty(0, dtype=torch_dtype(m.dtype)).type().rpartition(".")[2]
      raise RuntimeError(f"Expected {name} to be Float32, BFloat16 or Float16 matrix, got "
                         f"{kind.removesuffix('Tensor')}")
  _same_dtype(self, mat2)
  if bias is not None:
    raise RuntimeError("Bias not supported yet")
  if out_dtype is not None and np.dtype(jax_dtype(out_dtype)) != np.dtype(self.dtype):
    raise RuntimeError("Grouped gemm output dtype must match `mat_a` dtype")
  if (offs is None) != (self.ndim == 3 and mat2.ndim == 3):
    raise RuntimeError("Offsets must be passed (only) when mat_a or mat_b is 2-D: "
                       f"got {self.ndim}-D and {mat2.ndim}-D with offs "
                       f"{'missing' if offs is None else 'given'}")
  if offs is not None and np.dtype(offs.dtype) != np.dtype(jnp.int32):
    raise RuntimeError("Offsets have to be int32")
  acc = opmath(self.dtype)
  if offs is None:
    out = lax.dot_general(self, mat2, (((2,), (1,)), ((0,), (0,))), precision=_HIGHEST,
                          preferred_element_type=acc)
    return out.astype(self.dtype)
  groups = offs.shape[0]
  if self.ndim == 2 and mat2.ndim == 3:
    sizes = jnp.diff(offs, prepend=jnp.zeros((1,), offs.dtype))
    out = lax.ragged_dot(self, mat2, sizes, precision=_HIGHEST, preferred_element_type=acc)
    return out.astype(self.dtype)
  ragged = mat2.shape[1] if self.ndim == 3 else self.shape[1]  # N (3-D x 2-D) or K (2-D x 2-D)
  # the group of each column of mat2 / each k; past the last offset: `groups`, in none
  group = jnp.searchsorted(offs, jnp.arange(ragged, dtype=offs.dtype), side="right")
  member = (group[None, :] == jnp.arange(groups)[:, None]).astype(acc)  # (G, ragged)
  if self.ndim == 3:  # (G, M, K) x (K, N): column n uses self[group of n]
    full = lax.dot_general(self, mat2, (((2,), (0,)), ((), ())), precision=_HIGHEST,
                           preferred_element_type=acc)  # (G, M, N)
    return (full * member[:, None, :]).sum(0).astype(self.dtype)
  # (M, K) x (K, N) with K in groups -> (G, M, N)
  masked = self.astype(acc)[None, :, :] * member[:, None, :]  # (G, M, K)
  out = lax.dot_general(masked, mat2.astype(acc), (((2,), (0,)), ((), ())), precision=_HIGHEST,
                        preferred_element_type=acc)
  return out.astype(self.dtype)


@lowering(aten.baddbmm.default)
def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
  if batch1.shape[1] * batch1.shape[2] * batch2.shape[2] >= 400:  # BLAS
    return _add_scaled(self, _product("bij,bjk->bik", batch1, batch2), beta, alpha,
                       batch1.dtype)
  # torch's own loop for small products: each dot product summed in order over k (in the
  # accumulation dtype), then `self * beta + alpha * acc`; alpha multiplies, so NaN propagates.
  _same_dtype(batch1, batch2)
  acc_dtype = opmath(batch1.dtype)
  a, b = batch1.astype(acc_dtype), batch2.astype(acc_dtype)

  def step(k, acc):
    return acc + (lax.dynamic_index_in_dim(a, k, axis=2, keepdims=False)[:, :, None]
                  * lax.dynamic_index_in_dim(b, k, axis=1, keepdims=False)[:, None, :])
  acc = fori_loop(0, a.shape[2], step, jnp.zeros(a.shape[:2] + b.shape[2:], acc_dtype))
  return _add_scaled(self, acc, beta, alpha, batch1.dtype, zero_alpha_ignores_product=False)


@lowering(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
  # torch: `addmm_` once per batch entry, in order (beta for the first, 1 after), so the sum
  # over the batch is rounded to the dtype at each step.
  _same_dtype(batch1, batch2)
  out = jnp.broadcast_to(self, (batch1.shape[1], batch2.shape[2])).astype(batch1.dtype)
  if not batch1.shape[0]:
    return _add_scaled(out, jnp.zeros(out.shape, opmath(out.dtype)), beta, 0, out.dtype)
  out = _add_scaled(out, _product("ij,jk->ik", batch1[0], batch2[0]), beta, alpha, out.dtype)

  def step(out, mats):
    return _add_scaled(out, _product("ij,jk->ik", *mats), 1, alpha, out.dtype), None
  return scan(step, out, (batch1[1:], batch2[1:]))[0]


@lowering(aten.addr.default)
def addr(self, vec1, vec2, *, beta=1, alpha=1):
  if vec1.dtype == jnp.bool_:
    return _add_scaled(self, vec1[:, None] & vec2[None, :], beta, alpha, jnp.bool_)
  # torch's elementwise kernel: `self * beta + alpha * vec1 * vec2` in the dtype itself, each
  # operation rounded (beta == 0: `alpha * vec1 * vec2`)
  dtype = vec1.dtype
  beta, alpha = _scalar(beta, dtype), _scalar(alpha, dtype)

  def rnd(x):
    return x.astype(dtype)
  outer = rnd(rnd(alpha * vec1[:, None]) * vec2[None, :])
  return rnd(jnp.where(beta == 0, outer, rnd(rnd(self * beta) + outer)))


# ----------------------------------------------------------------------------- decompositions
# torch's CPU kernels call LAPACK (getrf, potrf, geqrf, gesdd, syevd, geev), and so do JAX's
# CPU lowerings, so factors, pivots and signs match. torch's pivots are LAPACK's: 1-based int32.
# `info` outputs are LAPACK's too (0, or the 1-based index of the failing pivot/minor).


def _mT(x):
  return jnp.swapaxes(x, -1, -2)


def _mH(x):
  return jnp.conj(_mT(x))


def _empty(dtype):
  # torch returns a 0-element tensor for an output it was asked not to compute
  return jnp.zeros((0,), dtype)


def _batch_broadcast(a, b, a_core=2, b_core=2):
  """`a`, `b` with their batch dims (all but the last `*_core`) broadcast to each other."""
  batch = jnp.broadcast_shapes(a.shape[:a.ndim - a_core], b.shape[:b.ndim - b_core])
  return (jnp.broadcast_to(a, batch + a.shape[a.ndim - a_core:]),
          jnp.broadcast_to(b, batch + b.shape[b.ndim - b_core:]))


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
  y = tri(lu, y, left_side=True, lower=True, unit_diagonal=True, transpose_a=True,
          conjugate_a=True)
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


def _is_vector_rhs(A, B):
  # torch's linalg_solve_is_vector_rhs
  return B.ndim == 1 or (A.ndim - 1 == B.ndim and B.shape == A.shape[:-1])


@lowering(aten._linalg_solve_ex.default)
def _linalg_solve_ex(A, B, *, left=True, check_errors=False):
  # (result, LU, pivots, info), LU and pivots those of A; a B that is a (batch of) vector(s)
  # is solved as a column, as torch's linalg_solve_is_vector_rhs says.
  lu, pivots, perm, info = _lu(A)
  vector = _is_vector_rhs(A, B)
  b = B[..., None] if vector else B
  x = _lu_solve(lu, perm, b) if left else _mH(_lu_solve(lu, perm, _mH(b), True))
  return (x[..., 0] if vector else x), lu, pivots, info


@lowering(aten.linalg_inv_ex.default)
def linalg_inv_ex(A, *, check_errors=False):
  lu, _, perm, info = _lu(A)
  eye = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=A.dtype), A.shape)
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
  return jnp.where(singular, jnp.zeros((), out.dtype),
                   out * jnp.trace(x, axis1=-2, axis2=-1))


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


def _hermitian_from(a, upper):
  """The Hermitian matrix whose `upper`/lower triangle is `a`'s (LAPACK reads only that one)."""
  if upper:
    tri = jnp.triu(a)
    return tri + _mH(jnp.triu(a, 1))
  tri = jnp.tril(a)
  return tri + _mH(jnp.tril(a, -1))


def _hermitian_input(a, upper):
  """`a`'s `upper`/lower triangle as a Hermitian matrix, with torch's gradient: torch's
  backward of cholesky/eigh returns a Hermitian gradient, which is the gradient through
  `(a + a^H) / 2`."""
  sym = (a + _mH(a)) / 2
  return sym + lax.stop_gradient(_hermitian_from(a, upper) - sym)


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
    info = lax.cond(jnp.all(jnp.isfinite(l)), lambda h: info, _cholesky_info,
                    lax.stop_gradient(h))
  return (_mH(l) if upper else l), info


@lowering(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(self, *, upper=False, check_errors=False):
  # Where A is not positive definite torch leaves a partial factor; this gives NaN (info says).
  return _cholesky(self, upper)


@lowering(aten.cholesky.default)
def cholesky(self, upper=False):
  # torch raises on a matrix that is not positive definite; under `jit` that cannot be
  # checked, so the factor is NaN there.
  return _cholesky(self, upper)[0]


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
  eye = jnp.broadcast_to(jnp.eye(self.shape[-1], dtype=self.dtype), self.shape)
  return _cholesky_solve(eye, self, upper)


# ----------------------------------------------------------------------------- LDL (Bunch-Kaufman)
# torch's CPU kernels call LAPACK's ?sytrf / ?hetrf (uplo='L') and ?sytrs / ?hetrs, which JAX
# does not expose. For n below sytrf's block size (64) that is the unblocked ?sytf2 / ?hetf2,
# ported here step by step (a `while_loop` over k stepping by 1 or 2), with LAPACK's pivot tests
# (`>=` against alpha = (1 + sqrt(17)) / 8 times the column/row maxima, |re| + |im| for complex)
# and BLAS's i?amax (the first maximum), so the same 1x1/2x2 blocks and interchanges come out
# (checked against torch's MKL for n up to 130, where MKL's blocked path chooses the same). With
# NaN in the input this follows MKL as measured: i?amax returns the first NaN, Fortran MAX keeps
# its second argument, and only the complex kernels stop (info) at a NaN diagonal. Complex inputs
# holding inf may still differ (complex division/multiplication by inf is library-defined).
# The factor is LAPACK's compact one: L's columns and D's blocks in the lower triangle, 1-based
# pivots, negative (and repeated) for a 2x2 block, `info` the first zero pivot column.

_BK_ALPHA = (1 + 17 ** 0.5) / 8


def _cabs1(z):
  # BLAS's |re| + |im| (izamax, and LAPACK's pivot tests for complex)
  return jnp.abs(z.real) + jnp.abs(z.imag) if jnp.iscomplexobj(z) else jnp.abs(z)


def _iamax(v, mask):
  """MKL's i?amax over `v[mask]` (v >= 0): the first largest value, and the first NaN if any."""
  return jnp.argmax(jnp.where(mask, v, -1))


def _fmax(a, b):
  # Fortran MAX as compiled (x86 maxsd): `b` when either is NaN
  return jnp.where(a > b, a, b)


def _matrices(fn, *args, cores):
  """`fn` on each matrix of `args` (batch dims broadcast; `cores` core dims per argument)."""
  batch = jnp.broadcast_shapes(*(a.shape[:a.ndim - c] for a, c in zip(args, cores)))
  size = int(np.prod(batch))
  flat = [jnp.broadcast_to(a, batch + a.shape[a.ndim - c:]).reshape((size,) + a.shape[a.ndim - c:])
          for a, c in zip(args, cores)]
  outs = jax.vmap(fn)(*flat)
  return tuple(o.reshape(batch + o.shape[1:]) for o in outs)


def _sytf2(a, herm):
  """LAPACK ?sytf2 (`herm`: ?hetf2), uplo='L', on one n x n matrix: (LD, pivots, info)."""
  n = a.shape[-1]
  if n == 0:
    return a, jnp.zeros((0,), jnp.int32), jnp.int32(0)
  idx = jnp.arange(n)
  row, col = idx[:, None], idx[None, :]
  cplx = jnp.iscomplexobj(a)
  conj = jnp.conj if herm else (lambda z: z)
  dabs = (lambda z: jnp.abs(z.real)) if herm else _cabs1  # |A(k,k)| in the pivot tests
  if herm:  # ?hetf2 reads only the real part of the diagonal
    a = jnp.where(row == col, a.real.astype(a.dtype), a)

  def step(state):
    k, a, ipiv, info = state
    # Pivot choice (Bunch-Kaufman partial pivoting), from the lower triangle.
    absakk = dabs(a[k, k])
    colv = _cabs1(a[:, k])
    imax = _iamax(colv, idx > k)
    colmax = jnp.where(k < n - 1, colv[imax], 0)
    zero = _fmax(absakk, colmax) == 0
    if cplx:  # MKL's complex kernels also stop at a NaN diagonal (LAPACK's DISNAN test)
      zero = zero | jnp.isnan(absakk)
    rowv = jnp.where(idx < imax, _cabs1(a[imax, :]), _cabs1(a[:, imax]))
    rowmax = rowv[_iamax(rowv, (idx >= k) & (idx < imax))]
    rowmax = jnp.where(imax < n - 1, _fmax(rowmax, rowv[_iamax(rowv, idx > imax)]), rowmax)
    keep = (absakk >= _BK_ALPHA * colmax) | (absakk >= _BK_ALPHA * colmax * (colmax / rowmax))
    one = keep | (dabs(a[imax, imax]) >= _BK_ALPHA * rowmax) | zero
    kp = jnp.where(keep | zero, k, imax).astype(jnp.int32)
    kstep = jnp.where(one, 1, 2).astype(jnp.int32)
    # Interchange rows and columns kk and kp of the trailing (symmetric/Hermitian) block.
    kk = k + kstep - 1
    full = jnp.where(row >= col, a, conj(a.T))
    perm = idx.at[kk].set(kp).at[kp].set(kk)
    a = jnp.where((row >= k) & (col >= k), full[perm][:, perm], a)
    ck = a[:, k]
    ck1 = a[:, k + 1]
    # 1x1 block: A22 -= x x^T / d (x x^H / re(d)), then L's column is x / d.
    d = a[k, k].real if herm else a[k, k]
    r1 = 1 / d
    x = jnp.where(idx > k, ck, 0)
    a1 = jnp.where((row > k) & (col > k), a + x[:, None] * (-r1 * conj(x))[None, :], a)
    a1 = jnp.where((col == k) & (row > k), (r1 * x)[:, None], a1)
    # 2x2 block: A22 -= W inv(D) W^T with W = columns k, k+1; L's columns are W inv(D).
    if herm:
      dd = jnp.hypot(a[k + 1, k].real, a[k + 1, k].imag)
      d11, d22 = a[k + 1, k + 1].real / dd, a[k, k].real / dd
      tt = 1 / (d11 * d22 - 1)
      d21 = a[k + 1, k] / dd
      dd = tt / dd
      wk = dd * (d11 * ck - d21 * ck1)
      wkp1 = dd * (d22 * ck1 - jnp.conj(d21) * ck)
    else:
      d21 = a[k + 1, k]
      d11, d22 = a[k + 1, k + 1] / d21, a[k, k] / d21
      t = 1 / (d11 * d22 - 1)
      d21 = t / d21
      wk = d21 * (d11 * ck - ck1)
      wkp1 = d21 * (d22 * ck1 - ck)
    trail2 = (row >= k + 2) & (col >= k + 2)
    a2 = jnp.where(trail2, a - ck[:, None] * conj(wk)[None, :] - ck1[:, None] * conj(wkp1)[None, :],
                   a)
    below2 = row >= k + 2
    a2 = jnp.where(below2 & (col == k), wk[:, None], a2)
    a2 = jnp.where(below2 & (col == k + 1), wkp1[:, None], a2)
    new = jnp.where(zero, a, jnp.where(kstep == 1, a1, a2))
    if herm:  # ?her / the rank-2 loop leave the updated diagonal real
      new = jnp.where(row == col, new.real.astype(new.dtype), new)
    piv = jnp.where(kstep == 1, kp + 1, -(kp + 1)).astype(jnp.int32)
    ipiv = jnp.where((idx == k) | ((idx == k + 1) & (kstep == 2)), piv, ipiv)
    info = jnp.where((info == 0) & zero, k + 1, info).astype(jnp.int32)
    return k + kstep, new, ipiv, info

  state = (jnp.int32(0), a, jnp.zeros((n,), jnp.int32), jnp.int32(0))
  _, a, ipiv, info = while_loop(lambda s: s[0] < n, step, state)
  return jnp.tril(a), ipiv, info


def _sytrs(ld, ipiv, b, herm):
  """LAPACK ?sytrs (`herm`: ?hetrs), uplo='L': solve A X = B from ?sytf2's (LD, pivots)."""
  n = ld.shape[-1]
  if n == 0:
    return b
  idx = jnp.arange(n)
  conj = jnp.conj if herm else (lambda z: z)

  def swap(b, i, j):
    perm = idx.at[i].set(j).at[j].set(i)
    return b[perm]

  def forward(state):  # L D X = B, k = 0, 1, ... (1 or 2 at a time)
    k, b = state
    p = ipiv[k]
    # 1x1 block
    b1 = swap(b, k, p - 1)
    b1 = jnp.where((idx > k)[:, None], b1 - ld[:, k, None] * b1[k][None, :], b1)
    s = 1 / (ld[k, k].real if herm else ld[k, k])
    b1 = b1.at[k].set(b1[k] * s)
    # 2x2 block (rows k, k+1)
    b2 = swap(b, k + 1, -p - 1)
    update = b2 - ld[:, k, None] * b2[k][None, :] - ld[:, k + 1, None] * b2[k + 1][None, :]
    b2 = jnp.where((idx > k + 1)[:, None], update, b2)
    akm1k = ld[k + 1, k]
    akm1 = ld[k, k] / conj(akm1k)
    ak = ld[k + 1, k + 1] / akm1k
    denom = akm1 * ak - 1
    bkm1 = b2[k] / conj(akm1k)
    bk = b2[k + 1] / akm1k
    b2 = b2.at[k].set((ak * bkm1 - bk) / denom).at[k + 1].set((akm1 * bk - bkm1) / denom)
    one = p > 0
    return k + jnp.where(one, 1, 2).astype(jnp.int32), jnp.where(one, b1, b2)

  def backward(state):  # L^T X = B (L^H), k = n-1, n-2, ...
    k, b = state
    p = ipiv[k]
    one = p > 0
    below = (idx > k)[:, None]
    dot = lambda l: jnp.sum(jnp.where(below, conj(l)[:, None] * b, 0), axis=0)
    b = b.at[k].set(b[k] - dot(ld[:, k]))
    b = jnp.where(one, b, b.at[k - 1].set(b[k - 1] - dot(ld[:, k - 1])))
    b = swap(b, k, jnp.where(one, p, -p) - 1)
    return k - jnp.where(one, 1, 2).astype(jnp.int32), b

  _, b = while_loop(lambda s: s[0] < n, forward, (jnp.int32(0), b))
  _, b = while_loop(lambda s: s[0] >= 0, backward, (jnp.int32(n - 1), b))
  return b


@lowering(aten.linalg_ldl_factor_ex.default)
def linalg_ldl_factor_ex(self, *, hermitian=False, check_errors=False):
  """torch's LAPACK ?sytrf (?hetrf for complex `hermitian`) with uplo='L': (LD, pivots, info)."""
  herm = hermitian and jnp.iscomplexobj(self)
  return _matrices(functools.partial(_sytf2, herm=herm), self, cores=(2,))


@lowering(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(LD, pivots, B, *, hermitian=False):
  """torch's LAPACK ?sytrs (?hetrs for complex `hermitian`) with uplo='L'; batch dims
  broadcast."""
  if B.dtype != LD.dtype:  # torch's kernel checks this (its meta function does not)
    names = {"float32": "Float", "float64": "Double", "complex64": "ComplexFloat",
             "complex128": "ComplexDouble"}
    name = lambda x: names.get(np.dtype(x.dtype).name, np.dtype(x.dtype).name)
    raise RuntimeError(f"Expected b and A to have the same dtype, but found b of type {name(B)} "
                       f"and A of type {name(LD)} instead.")
  herm = hermitian and jnp.iscomplexobj(LD)
  solve = lambda ld, piv, b: (_sytrs(ld, piv, b, herm),)
  return _matrices(solve, LD, pivots, B, cores=(2, 1, 2))[0]


@lowering(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(self, B, *, upper, left=True, unitriangular=False):
  a, b = _batch_broadcast(self, B)
  return lax.linalg.triangular_solve(a, b, left_side=left, lower=not upper,
                                     unit_diagonal=unitriangular)


@lowering(aten.triangular_solve.default)
def triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
  a, b = _batch_broadcast(A, self)
  x = lax.linalg.triangular_solve(a, b, left_side=True, lower=not upper, transpose_a=transpose,
                                  unit_diagonal=unitriangular)
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
  return jnp.matmul(q, input3, precision=_HIGHEST) if left else \
      jnp.matmul(input3, q, precision=_HIGHEST)


def _wider_complex(a):
  """complex64 -> complex128 when the program has 64-bit types, else None. LAPACK's
  complex64 SVD (JAX's CPU svd) can be a few ulps further off than torch's on some CPUs,
  which a condition number (`linalg.cond`) magnifies past torch's tolerance; the SVD of a
  complex64 matrix is therefore computed in complex128 and rounded (complex SVDs are rare
  in models; float32 ones stay single precision)."""
  if a.dtype != jnp.complex64 or jax.dtypes.canonicalize_dtype(jnp.complex128) != jnp.complex128:
    return None
  return a.astype(jnp.complex128)


def _svd(a, **kwargs):
  wide = _wider_complex(a)
  if wide is None:
    return jnp.linalg.svd(a, **kwargs)
  if not kwargs.get("compute_uv", True):
    return jnp.linalg.svd(wide, **kwargs).astype(jnp.float32)
  u, s, vh = jnp.linalg.svd(wide, **kwargs)
  return u.astype(a.dtype), s.astype(jnp.float32), vh.astype(a.dtype)


@lowering(aten._linalg_svd.default)
def _linalg_svd(A, full_matrices=False, compute_uv=True, *, driver=None):
  if not compute_uv:
    return _empty(A.dtype), _svd(A, compute_uv=False), _empty(A.dtype)
  u, s, vh = _svd(A, full_matrices=False)
  m, n = A.shape[-2:]
  if full_matrices and m != n:
    # torch's backward uses the first min(m, n) singular vectors only; JAX has no derivative
    # for the full ones, so the completion is a constant.
    uf, _, vhf = _svd(lax.stop_gradient(A), full_matrices=True)
    k = min(m, n)
    u = jnp.concatenate([u + (uf[..., :k] - lax.stop_gradient(u)), uf[..., k:]], axis=-1)
    vh = jnp.concatenate([vh + (vhf[..., :k, :] - lax.stop_gradient(vh)), vhf[..., k:, :]],
                         axis=-2)
  return u, s, vh


def _eigh(a, uplo, compute_v):
  v, w = lax.linalg.eigh(_hermitian_input(a, uplo == "U"), lower=uplo != "U",
                         symmetrize_input=False)
  return w, v


@lowering(aten._linalg_eigh.default)
def _linalg_eigh(A, UPLO="L", compute_v=True):
  w, v = _eigh(A, UPLO, compute_v)
  return w, (v if compute_v else _empty(A.dtype))


@jax.custom_vjp
def _eig(a):
  # LAPACK geev (JAX's CPU eig): eigenvectors of unit norm, largest component real.
  w, v = jnp.linalg.eig(a)
  return w, v


def _eig_fwd(a):
  w, v = _eig(a)
  return (w, v), (w, v, jnp.zeros((0,), a.dtype))  # (the last: the input's dtype)


def _eig_bwd(res, cts):
  """torch's linalg_eig_backward (JAX has no derivative for eigenvectors): with torch's
  cotangents (JAX's conjugated), gA = V^-H (diag(gw) + P(V^H gV) / conj(w_j - w_i)) V^H, where
  P projects onto the tangent space of unit-norm columns."""
  w, v, like = res
  gw, gv = jnp.conj(cts[0]), jnp.conj(cts[1])
  vh = _mH(v)
  mm = functools.partial(jnp.matmul, precision=_HIGHEST)
  vhgv = mm(vh, gv)
  vhgv = vhgv - mm(vh, v * jnp.real(jnp.diagonal(vhgv, axis1=-2, axis2=-1))[..., None, :])
  n = w.shape[-1]
  eye = jnp.eye(n, dtype=bool)
  econj = jnp.conj(jnp.where(eye, 1, w[..., None, :] - w[..., :, None]))
  ga = jnp.where(eye, gw[..., None, :] * jnp.eye(n, dtype=w.dtype), vhgv / econj)
  ga = jnp.linalg.solve(vh, mm(ga, vh))
  ga = jnp.conj(ga)
  return (ga if jnp.iscomplexobj(like) else jnp.real(ga)),


_eig.defvjp(_eig_fwd, _eig_bwd)


@lowering(aten.linalg_eig.default)
def linalg_eig(self):
  return _eig(self)


@lowering(aten.linalg_eigvals.default)
def linalg_eigvals(self):
  return jnp.linalg.eigvals(self)


def _pinv_tolerance(s_max, atol, rtol, m, n, dtype):
  """torch's `max(atol, rtol * s_max)` (in float64, as torch's default tolerances are): rtol
  defaults to eps * max(m, n), or to 0 where an `atol` > 0 is given."""
  f64 = jnp.float64
  default = jnp.asarray(jnp.finfo(jnp.finfo(dtype).dtype).eps * max(m, n), f64)
  if rtol is None:
    rtol = default if atol is None else jnp.where(jnp.asarray(atol) > 0, 0, default)
  atol = jnp.zeros((), f64) if atol is None else jnp.asarray(atol)
  rtol = jnp.asarray(rtol)
  return jnp.maximum(atol[..., None], rtol[..., None] * s_max)


@lowering(aten.linalg_pinv.atol_rtol_tensor, aten.linalg_pinv.atol_rtol_float)
def linalg_pinv(self, *, atol=None, rtol=None, hermitian=False):
  # torch: singular values (|eigenvalues| where hermitian) at or below max(atol, rtol * s_max)
  # are dropped. Its derivative is pinv's own (torch's pinv_backward), not the one through
  # the SVD/eigh, so it is the same for `hermitian` and for any A.
  m, n = self.shape[-2:]
  atol = None if atol is None else jnp.asarray(atol)
  rtol = None if rtol is None else jnp.asarray(rtol)

  @jax.custom_jvp
  def pinv(a):
    if hermitian:
      w, v = _eigh(a, "L", True)
      s = jnp.abs(w)
      tol = _pinv_tolerance(jnp.max(s, axis=-1, keepdims=True, initial=0), atol, rtol, m, n,
                            a.dtype)
      inv = jnp.where(s > tol, 1 / jnp.where(s > tol, w, 1), 0).astype(a.dtype)
      return jnp.matmul(v * inv[..., None, :], _mH(v), precision=_HIGHEST)
    u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    tol = _pinv_tolerance(s[..., :1], atol, rtol, m, n, a.dtype)  # s sorted descending
    inv = jnp.where(s > tol, 1 / jnp.where(s > tol, s, 1), 0).astype(a.dtype)
    return jnp.matmul(_mH(vh) * inv[..., None, :], _mH(u), precision=_HIGHEST)

  @pinv.defjvp
  def pinv_jvp(primals, tangents):
    (a,), (da,) = primals, tangents
    p = pinv(a)
    mm = functools.partial(jnp.matmul, precision=_HIGHEST)
    dp = (-mm(mm(p, da), p)
          + mm(mm(mm(jnp.eye(n, dtype=a.dtype) - mm(p, a), _mH(da)), _mH(p)), p)
          + mm(mm(mm(p, _mH(p)), _mH(da)), jnp.eye(m, dtype=a.dtype) - mm(a, p)))
    return p, dp
  return pinv(self)


# torch's matrix_exp (Bader, Blanes, Casas 2019): Taylor polynomials of degree 1, 2, 4, 8, 12
# or 18 (with scaling and squaring), picked per matrix by its 1-norm; the same evaluation
# schemes here, so that float32 rounds as torch's does.
_MEXP_THETAS = {
    np.dtype(np.float32): (1.192092800768788e-07, 5.978858893805233e-04, 5.116619363445086e-02,
                           5.800524627688768e-01, 1.461661507209034e+00, 3.010066362817634e+00),
    np.dtype(np.float64): (2.220446049250313e-16, 2.580956802971767e-08, 3.397168839976962e-04,
                           4.991228871115323e-02, 2.996158913811580e-01, 1.090863719290036e+00),
}
_MEXP_T12 = (
    (9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740),
    (5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031,
     0.01108844528519167989),
    (0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968,
     0.00610700528898058230),
    (-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079,
     -0.00675951846863086359))
_MEXP_T18 = (
    (0., -1.00365581030144618291e-01, -8.02924648241156932449e-03, -8.92138498045729985177e-04,
     0.),
    (0., 3.97849749499645077844e-01, 1.36783778460411720168e+00, 4.98289622525382669416e-01,
     -6.37898194594723280150e-04),
    (-1.09676396052962061844e+01, 1.68015813878906206114e+00, 5.71779846478865511061e-02,
     -6.98210122488052056106e-03, 3.34975017086070470649e-05),
    (-9.04316832390810593223e-02, -6.76404519071381882256e-02, 6.75961301770459654925e-02,
     2.95552570429315521194e-02, -1.39180257516060693404e-05),
    (0., 0., -9.23364619367118555360e-02, -1.69364939002081722752e-02,
     -1.40086798182036094347e-05))


def _mexp_taylor(a, degree):
  """torch's compute_T{degree}."""
  mm = functools.partial(jnp.matmul, precision=_HIGHEST)
  eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)

  def lin(mats, coeffs):
    out = jnp.zeros_like(a)
    for m, c in zip(mats, coeffs):
      out = out + c * m
    return out
  if degree == 1:
    return eye + a
  a2 = mm(a, a)
  if degree == 2:
    return eye + a + a2 / 2
  if degree == 4:
    return lin([eye, a, a2, mm(a2, lin([eye, a, a2], [1 / 2.0, 1 / 6.0, 1 / 24.0]))],
               [1.0, 1.0, 0.0, 1.0])
  if degree == 8:
    sqrt_177 = 0.1330413469565007072504e+2
    x3 = 2. / 3.
    x1, x2 = x3 * ((1. + sqrt_177) / 88.), x3 * ((1. + sqrt_177) / 352.)
    x4, x5 = (-271. + 29. * sqrt_177) / (315. * x3), (-11. + 11. * sqrt_177) / (1260. * x3)
    x6, x7 = (-99. + 11. * sqrt_177) / (5040. * x3), (89. - sqrt_177) / (5040. * x3)
    y2 = (857. - 58. * sqrt_177) / 630.
    a4 = mm(a2, lin([a, a2], [x1, x2]))
    a8 = mm(lin([a2, a4], [x3, 1.0]), lin([eye, a, a2, a4], [x4, x5, x6, x7]))
    return lin([eye, a, a2, a4, a8], [1.0, 1.0, y2, 0.0, 1.0])
  a3 = mm(a, a2)
  if degree == 12:
    b = [lin([eye, a, a2, a3], row) for row in _MEXP_T12]
    a6 = b[2] + mm(b[3], b[3])
    return b[0] + mm(b[1] + a6, a6)
  b = [lin([eye, a, a2, a3, mm(a3, a3)], row) for row in _MEXP_T18]
  a9 = b[3] + mm(b[0], b[4])
  return b[1] + mm(b[2] + a9, a9)


def _mexp(a):
  """torch's mexp on a batch of matrices in float32/float64 (complex too)."""
  thetas = _MEXP_THETAS[np.dtype(jnp.finfo(a.dtype).dtype)]
  norm = jnp.max(jnp.sum(jnp.abs(a), axis=-2), axis=-1)[..., None, None]
  # degree 18: scale by 2^-s, square s times (s <= 64 for any finite norm)
  s = jnp.maximum(0, jnp.ceil(jnp.log2(norm / thetas[5])))
  s = jnp.where(jnp.isfinite(s), s, 0)
  out = _mexp_taylor(a / (2.0 ** s).astype(a.dtype), 18)
  max_s = jnp.max(s).astype(jnp.int32) if s.size else 0
  out = fori_loop(0, max_s, lambda i, m: jnp.where(
      i < s, jnp.matmul(m, m, precision=_HIGHEST), m), out)
  out = jnp.where(norm >= thetas[4], out, jnp.nan)
  lower = -1
  for degree, upper in zip((1, 2, 4, 8, 12), thetas):
    pick = (lower < norm) & (norm <= upper) & (norm < thetas[4])
    out = jnp.where(pick, _mexp_taylor(a, degree), out)
    lower = upper
  return out


@jax.custom_vjp
def _matrix_exp(a):
  return _mexp(a)


def _matrix_exp_fwd(a):
  return _mexp(a), a


def _matrix_exp_bwd(a, g):
  # torch's backward: the upper right block of exp([[A^H, G], [0, A^H]]) (in JAX's
  # conjugated convention for complex cotangents: A^T and g).
  n = a.shape[-1]
  at = _mT(a)
  top = jnp.concatenate([at, g], axis=-1)
  bottom = jnp.concatenate([jnp.zeros_like(at), at], axis=-1)
  return _mexp(jnp.concatenate([top, bottom], axis=-2))[..., :n, n:],


_matrix_exp.defvjp(_matrix_exp_fwd, _matrix_exp_bwd)


@lowering(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(self):
  # float16/bfloat16: in float32, rounded once (torch's own 16-bit evaluation is not usable:
  # it overflows to NaN on inputs whose exponential is representable).
  n = self.shape[-1]
  if n == 0:
    return self
  if n == 1:
    return jnp.exp(self)
  return _matrix_exp(self.astype(opmath(self.dtype))).astype(self.dtype)


@lowering(aten.linalg_lstsq.default, static_argnames=("rcond",))
def linalg_lstsq(self, b, rcond=None, *, driver=None):
  """The minimum-norm least-squares solution, by SVD with singular values below
  `rcond * s_max` dropped (torch's default rcond: eps * max(m, n)). torch's drivers differ in
  what else they return: `gelsy` (the CPU default) the rank only, `gels` the residuals only,
  `gelsd`/`gelss` all of rank, singular values and residuals; residuals are computed for
  m > n only, and only where every matrix has full rank (under `jit` the shape cannot depend
  on that, so they are NaN there instead of empty)."""
  driver = driver or "gelsy"
  m, n = self.shape[-2:]
  vector = _is_vector_rhs(self, b)
  rhs = b[..., None] if vector else b
  a, rhs = _batch_broadcast(self, rhs)
  u, s, vh = jnp.linalg.svd(a, full_matrices=False)
  real = s.dtype
  cutoff = (jnp.finfo(real).eps * max(m, n) if rcond is None or rcond < 0 else rcond)
  keep = s > cutoff * s[..., :1] if min(m, n) else s > 0
  inv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(a.dtype)
  x = jnp.matmul(_mH(vh) * inv[..., None, :], jnp.matmul(_mH(u), rhs, precision=_HIGHEST),
                 precision=_HIGHEST)
  rank = jnp.sum(keep, axis=-1).astype(jnp.int64)
  residuals = _empty(real)
  if m > n and driver != "gelsy":
    residuals = jnp.sum(jnp.abs(jnp.matmul(a, x, precision=_HIGHEST) - rhs) ** 2, axis=-2)
    if driver != "gels":
      residuals = jnp.where(jnp.all(rank == n), residuals, jnp.nan)
    if vector:
      residuals = residuals[..., 0]
  return ((x[..., 0] if vector else x), residuals,
          rank if driver != "gels" else _empty(jnp.int64),
          s if driver in ("gelsd", "gelss") else _empty(real))


@lowering(aten._trilinear.default)
def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
  """sum over `sumdim` of i1 * i2 * i3, each first unsqueezed at its `expand` dims (the
  kernel of `bilinear`). As torch: i1 and i2 are contracted first over the summed dims that i3
  lacks, the result rounded to the dtype, then contracted with i3 (16-bit floats accumulate
  in float32 in each step)."""
  ndim = i1.ndim + len(expand1)
  letters = "abcdefghijklmnopqrstuvwxyz"[:ndim]
  summed = {d % ndim for d in sumdim}
  dims = [[d for d in range(ndim) if d not in {e % ndim for e in expand}]
          for expand in (expand1, expand2, expand3)]
  first = [d for d in range(ndim) if (d in dims[0] or d in dims[1])
           and not (d in summed and d not in dims[2])]
  keep = [d for d in range(ndim) if d not in summed]
  second = [d for d in keep if d in first or d in dims[2]]

  def sub(ds):
    return "".join(letters[d] for d in ds)

  def contract(spec, *xs):
    return jnp.einsum(spec, *xs, precision=_HIGHEST,
                      preferred_element_type=opmath(i1.dtype)).astype(i1.dtype)
  buf = contract(f"{sub(dims[0])},{sub(dims[1])}->{sub(first)}", i1, i2)
  out = contract(f"{sub(first)},{sub(dims[2])}->{sub(second)}", buf, i3)
  return jnp.expand_dims(out, [k for k, d in enumerate(keep) if d not in second])


@lowering(aten._linalg_check_errors.default, dynamic_shape=True)
def _linalg_check_errors(info, api_name, *, is_matrix):
  """torch's check of the `info` of a factorization (`linalg.inv`, `linalg.solve`,
  `linalg.cholesky`, ... call it): raises torch's `LinAlgError` on a concrete failing `info`.
  Inside a staged JAX program the value is unknown, so nothing is checked there and the result
  holds NaN/inf as JAX's own linear algebra gives."""
  if isinstance(info, jax.core.Tracer):
    return None
  flat = np.asarray(info).reshape(-1)
  bad = np.flatnonzero(flat)
  if not bad.size:
    return None
  code = int(flat[bad[0]])
  where = "" if is_matrix else f": (Batch element {bad[0]})"
  if code < 0:
    raise RuntimeError(f"{api_name}{where}: Argument {-code} has illegal value.")
  if "inv" in api_name:
    msg = (f"The diagonal element {code} is zero, the inversion could not be completed because "
           "the input matrix is singular.")
  elif "solve" in api_name:
    msg = "The solver failed because the input matrix is singular."
  elif "cholesky" in api_name:
    msg = ("The factorization could not be completed because the input is not "
           f"positive-definite (the leading minor of order {code} is not positive-definite).")
  elif "lu_factor" in api_name:
    raise RuntimeError(
        f"{api_name}{where}: U[{code},{code}] is zero and using it on lu_solve would result in a "
        "division by zero. If you still want to perform the factorization, consider calling "
        "linalg.lu(A, pivot) or linalg.lu_factor_ex(A, pivot)")
  else:
    msg = f"The algorithm failed (error code: {code})."
  raise torch.linalg.LinAlgError(f"{api_name}{where}: {msg}")


@lowering(aten.renorm.default, static_argnames=("p",))
def renorm(self, p, dim, maxnorm):
  """torch: each slice along `dim` whose p-norm exceeds `maxnorm` is scaled by
  maxnorm / (norm + 1e-7); norms of 16-bit floats are taken in float32 and the factor rounded
  to the dtype before the multiplication."""
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


# ----------------------------------------------------------------------------- cross product

_MANTISSA = {np.dtype(jnp.float16): (5, 10), np.dtype(jnp.bfloat16): (8, 7)}


def _rounded(x):
  """`x` rounded to its 16-bit dtype now: XLA would otherwise keep a fused chain of 16-bit
  ops in float32, where torch rounds after every op."""
  bits = _MANTISSA.get(np.dtype(x.dtype))
  return lax.reduce_precision(x, *bits) if bits else x


@lowering(aten.linalg_cross.default)
def linalg_cross(self, other, dim=-1):
  """torch's `a[i+1] b[i+2] - a[i+2] b[i+1]`, each product rounded in 16-bit dtypes."""
  a, b = jnp.broadcast_arrays(self, other)
  a1, a2 = jnp.roll(a, -1, axis=dim), jnp.roll(a, -2, axis=dim)
  b1, b2 = jnp.roll(b, -1, axis=dim), jnp.roll(b, -2, axis=dim)
  return _rounded(_rounded(a1 * b2) - _rounded(a2 * b1))
