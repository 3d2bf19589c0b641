"""LDL (Bunch-Kaufman) factorization and solve: `linalg_ldl_factor_ex`, `linalg_ldl_solve`,
LAPACK's unblocked ?sytf2 / ?hetf2 and ?sytrs / ?hetrs ported step by step."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from bridge_ops._lowering import aten, lowering, scalar_type_name, while_loop
from bridge_ops._linalg import check_info


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

_BK_ALPHA = (1 + 17**0.5) / 8


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
  batch = jnp.broadcast_shapes(*(a.shape[: a.ndim - c] for a, c in zip(args, cores)))
  size = int(np.prod(batch))
  flat = [
    jnp.broadcast_to(a, batch + a.shape[a.ndim - c :]).reshape((size,) + a.shape[a.ndim - c :])
    for a, c in zip(args, cores)
  ]
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
    a2 = jnp.where(
      trail2, a - ck[:, None] * conj(wk)[None, :] - ck1[:, None] * conj(wkp1)[None, :], a
    )
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
  ld, pivots, info = _matrices(functools.partial(_sytf2, herm=herm), self, cores=(2,))
  if check_errors:
    check_info(info, "torch.linalg.ldl_factor_ex", self.ndim == 2)
  return ld, pivots, info


@lowering(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(LD, pivots, B, *, hermitian=False):
  """torch's LAPACK ?sytrs (?hetrs for complex `hermitian`) with uplo='L'; batch dims
  broadcast."""
  if B.dtype != LD.dtype:  # torch's kernel checks this (its meta function does not)
    raise RuntimeError(
      f"Expected b and A to have the same dtype, but found b of type "
      f"{scalar_type_name(B.dtype)} and A of type {scalar_type_name(LD.dtype)} instead."
    )
  herm = hermitian and jnp.iscomplexobj(LD)
  solve = lambda ld, piv, b: (_sytrs(ld, piv, b, herm),)
  return _matrices(solve, LD, pivots, B, cores=(2, 1, 2))[0]
