"""Singular values and eigenvalues, and what builds on them: SVD, eigh, eig, pinv, lstsq,
and matrix_exp (scaling and squaring with torch's Taylor degrees)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bridge_ops._lowering import aten, check, fori_loop, lowering, opmath, scalar_type_name
from bridge_ops.indexing import broadcast_shapes
from bridge_ops._linalg import (
  _HIGHEST,
  _empty,
  _hermitian_input,
  _is_vector_rhs,
  _mH,
  _mT,
  check_info,
)


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


def _check_svd_input(A) -> None:
  """LAPACK's gesdd refuses a NaN (code -4: torch's "...contained non-finite values."; an
  infinity passes): for svd, svdvals, pinv, matrix_rank, the 2/nuclear norms and cond alike."""
  if A.size:
    nan = jnp.isnan(A).any(axis=(-2, -1))
    check_info(jnp.where(nan, -4, 0).astype(jnp.int32), "linalg.svd", A.ndim == 2)


@lowering(aten._linalg_svd.default)
def _linalg_svd(A, full_matrices=False, compute_uv=True, *, driver=None):
  _check_svd_input(A)
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
    vh = jnp.concatenate([vh + (vhf[..., :k, :] - lax.stop_gradient(vh)), vhf[..., k:, :]], axis=-2)
  return u, s, vh


def _eigh(a, uplo, compute_v):
  v, w = lax.linalg.eigh(
    _hermitian_input(a, uplo == "U"), lower=uplo != "U", symmetrize_input=False
  )
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
  return ((ga if jnp.iscomplexobj(like) else jnp.real(ga)),)


_eig.defvjp(_eig_fwd, _eig_bwd)


@lowering(aten.linalg_eig.default)
def linalg_eig(self):
  if self.size:  # (torch's check; `linalg_eigvals` makes none)
    check(
      ~jnp.isfinite(self),
      None,
      RuntimeError,
      "torch.linalg.eig: input tensor should not contain infs or NaNs.",
    )
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
  if not hermitian:
    _check_svd_input(self)  # (torch's pinv runs its SVD)
  m, n = self.shape[-2:]
  atol = None if atol is None else jnp.asarray(atol)
  rtol = None if rtol is None else jnp.asarray(rtol)

  @jax.custom_jvp
  def pinv(a):
    if hermitian:
      w, v = _eigh(a, "L", True)
      s = jnp.abs(w)
      tol = _pinv_tolerance(
        jnp.max(s, axis=-1, keepdims=True, initial=0), atol, rtol, m, n, a.dtype
      )
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
    dp = (
      -mm(mm(p, da), p)
      + mm(mm(mm(jnp.eye(n, dtype=a.dtype) - mm(p, a), _mH(da)), _mH(p)), p)
      + mm(mm(mm(p, _mH(p)), _mH(da)), jnp.eye(m, dtype=a.dtype) - mm(a, p))
    )
    return p, dp

  return pinv(self)


# torch's matrix_exp (Bader, Blanes, Casas 2019): Taylor polynomials of degree 1, 2, 4, 8, 12
# or 18 (with scaling and squaring), picked per matrix by its 1-norm; the same evaluation
# schemes here, so that float32 rounds as torch's does.
_MEXP_THETAS = {
  np.dtype(np.float32): (
    1.192092800768788e-07,
    5.978858893805233e-04,
    5.116619363445086e-02,
    5.800524627688768e-01,
    1.461661507209034e00,
    3.010066362817634e00,
  ),
  np.dtype(np.float64): (
    2.220446049250313e-16,
    2.580956802971767e-08,
    3.397168839976962e-04,
    4.991228871115323e-02,
    2.996158913811580e-01,
    1.090863719290036e00,
  ),
}
_MEXP_T12 = (
  (9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740),
  (5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031, 0.01108844528519167989),
  (0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968, 0.00610700528898058230),
  (-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079, -0.00675951846863086359),
)
_MEXP_T18 = (
  (0.0, -1.00365581030144618291e-01, -8.02924648241156932449e-03, -8.92138498045729985177e-04, 0.0),
  (
    0.0,
    3.97849749499645077844e-01,
    1.36783778460411720168e00,
    4.98289622525382669416e-01,
    -6.37898194594723280150e-04,
  ),
  (
    -1.09676396052962061844e01,
    1.68015813878906206114e00,
    5.71779846478865511061e-02,
    -6.98210122488052056106e-03,
    3.34975017086070470649e-05,
  ),
  (
    -9.04316832390810593223e-02,
    -6.76404519071381882256e-02,
    6.75961301770459654925e-02,
    2.95552570429315521194e-02,
    -1.39180257516060693404e-05,
  ),
  (0.0, 0.0, -9.23364619367118555360e-02, -1.69364939002081722752e-02, -1.40086798182036094347e-05),
)


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
    return lin(
      [eye, a, a2, mm(a2, lin([eye, a, a2], [1 / 2.0, 1 / 6.0, 1 / 24.0]))], [1.0, 1.0, 0.0, 1.0]
    )
  if degree == 8:
    sqrt_177 = 0.1330413469565007072504e2
    x3 = 2.0 / 3.0
    x1, x2 = x3 * ((1.0 + sqrt_177) / 88.0), x3 * ((1.0 + sqrt_177) / 352.0)
    x4, x5 = (-271.0 + 29.0 * sqrt_177) / (315.0 * x3), (-11.0 + 11.0 * sqrt_177) / (1260.0 * x3)
    x6, x7 = (-99.0 + 11.0 * sqrt_177) / (5040.0 * x3), (89.0 - sqrt_177) / (5040.0 * x3)
    y2 = (857.0 - 58.0 * sqrt_177) / 630.0
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
  out = _mexp_taylor(a / (2.0**s).astype(a.dtype), 18)
  max_s = jnp.max(s).astype(jnp.int32) if s.size else 0
  out = fori_loop(
    0, max_s, lambda i, m: jnp.where(i < s, jnp.matmul(m, m, precision=_HIGHEST), m), out
  )
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
  return (_mexp(jnp.concatenate([top, bottom], axis=-2))[..., :n, n:],)


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


_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def _lstsq_shapes(A, B, driver):
  """torch's checks of `linalg.lstsq`'s arguments, in its order, and its shapes: (whether `B`
  is a batch of vectors, the solution's batch). torch broadcasts `A`'s batch with `B`'s first
  `A.ndim - 2` sizes (which, for a `B` of one dim fewer that is not a batch of vectors,
  include its rows), then copies `B` into the solution, broadcasting it there."""
  name = "torch.linalg.lstsq"
  if A.ndim < 2:
    raise RuntimeError(f"{name}: input must have at least 2 dimensions.")
  if B.ndim < 1:
    raise RuntimeError(f"{name}: other must have at least 1 dimension.")
  if A.dtype != B.dtype:
    raise RuntimeError(
      f"{name}: Expected input and other to have the same dtype, but got input's dtype "
      f"{scalar_type_name(A.dtype)} and other's dtype {scalar_type_name(B.dtype)}"
    )
  if not 0 <= A.ndim - B.ndim <= 1:
    raise RuntimeError(
      f"{name}: input.dim() must be greater or equal to other.dim() and "
      "(input.dim() - other.dim()) <= 1"
    )
  vector = _is_vector_rhs(A, B)
  if A.shape[-2] != B.shape[-1 if vector else -2]:
    raise RuntimeError(f"{name}: input.size(-2) should match other.size({-1 if vector else -2})")
  if driver not in _LSTSQ_DRIVERS:
    raise RuntimeError(f"{name}: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)")
  batch = broadcast_shapes(A.shape[:-2], B.shape[: A.ndim - 2])
  rhs = B.shape + (1,) if vector else B.shape
  target = batch + (A.shape[-2], rhs[-1])
  if broadcast_shapes(target, rhs) != target:
    raise RuntimeError(
      f"output with shape {list(target)} doesn't match the broadcast shape "
      f"{list(broadcast_shapes(target, rhs))}"
    )
  return vector, batch


@lowering(aten.linalg_lstsq.default, static_argnames=("rcond",))
def linalg_lstsq(self, b, rcond=None, *, driver=None):
  """The minimum-norm least-squares solution, by SVD with singular values below
  `rcond * s_max` dropped (torch's default rcond: eps * max(m, n)). torch's drivers differ in
  what else they return: `gelsy` (the CPU default) the rank only, `gels` the residuals only,
  `gelsd`/`gelss` all of rank, singular values and residuals; residuals are computed for
  m > n only, and only where every matrix has full rank (under `jit` the shape cannot depend
  on that, so they are NaN there instead of empty). The rank and singular values have
  `self`'s batch shape, the solution and residuals the broadcast one (`_lstsq_shapes`)."""
  driver = "gelsy" if driver is None else driver
  vector, batch = _lstsq_shapes(self, b, driver)
  m, n = self.shape[-2:]
  rhs = b[..., None] if vector else b
  rhs = jnp.broadcast_to(rhs, batch + (m, rhs.shape[-1]))
  a = jnp.broadcast_to(self, batch + (m, n))
  u, s, vh = jnp.linalg.svd(a, full_matrices=False)
  real = s.dtype
  cutoff = jnp.finfo(real).eps * max(m, n) if rcond is None or rcond < 0 else rcond
  keep = s > cutoff * s[..., :1] if min(m, n) else s > 0
  inv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(a.dtype)
  x = jnp.matmul(
    _mH(vh) * inv[..., None, :], jnp.matmul(_mH(u), rhs, precision=_HIGHEST), precision=_HIGHEST
  )
  rank = jnp.sum(keep, axis=-1).astype(jnp.int64)
  residuals = _empty(real)
  if m > n and driver != "gelsy":
    residuals = jnp.sum(jnp.abs(jnp.matmul(a, x, precision=_HIGHEST) - rhs) ** 2, axis=-2)
    if driver != "gels":
      residuals = jnp.where(jnp.all(rank == n), residuals, jnp.nan)
    if vector:
      residuals = residuals[..., 0]
  # the rank and singular values of `self`'s own batch (its copies along broadcast dims agree)
  own = tuple(slice(0, 1) if size == 1 else slice(None) for size in self.shape[:-2])
  return (
    (x[..., 0] if vector else x),
    residuals,
    rank[own] if driver != "gels" else _empty(jnp.int64),
    s[own] if driver in ("gelsd", "gelss") else _empty(real),
  )
