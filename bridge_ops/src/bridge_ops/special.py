"""Special functions (`torch.special.*`) of the gamma and error-function families: lgamma,
digamma, polygamma, zeta, mvlgamma, igamma, erfcx, ndtr, log_ndtr, ndtri, xlog1py, entr.

Each lowering reproduces torch's CPU kernel (aten/src/ATen/native/Math.h), not SciPy's:
`digamma(+-0)` is -+inf; `zeta` is torch's Euler-Maclaurin sum in float64 (inf at x == 1
and for q a non-positive integer, nan for x < 1), which `polygamma` (n >= 2) uses too;
`igamma`/`igammac` follow torch's boundary values (a or x zero or infinite).

Arguments are promoted like torch (`int_to_float`); float16/bfloat16 are computed in
float32, as torch's opmath does, and the core casts the result back.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
from jax import lax

from bridge_ops._lowering import aten, lowering, promote, while_loop, with_derivative, x_times_log
from bridge_ops._special import _float, _inf, _nan, _where_safe, prims

__all__: list[str] = []


# ----------------------------------------------------------------------------- gamma family


@lowering(aten.lgamma.default, prims.lgamma.default)
@promote("self", kind="int_to_float")
def lgamma(self):
  return _lgamma(self)


def _trigamma(x):
  # torch's trigamma: reflection below 0.5, six recurrence steps, then the asymptotic series.
  reflect = x < 0.5
  sin_pi_x = jnp.sin(jnp.pi * x)
  result = jnp.where(reflect, -(jnp.pi * jnp.pi) / (sin_pi_x * sin_pi_x), jnp.zeros_like(x))
  x = jnp.where(reflect, 1 - x, x)
  for _ in range(6):
    result = result + 1 / (x * x)
    x = x + 1
  ixx = 1 / (x * x)
  result = result + (1 + 1 / (2 * x) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / x
  return jnp.where(reflect, -result, result)


_ZETA_A = (
  12.0,
  -720.0,
  30240.0,
  -1209600.0,
  47900160.0,
  -1.8924375803183791606e9,
  7.47242496e10,
  -2.950130727918164224e12,
  1.1646782814350067249e14,
  -4.5979787224074726105e15,
  1.8152105401943546773e17,
  -7.1661652561756670113e18,
)
_ZETA_MAX_TERMS = 1 << 20  # torch's direct sum runs until q + i > 9: ~|q| terms for q << 0


def _zeta(x, q):
  """torch's Hurwitz zeta (Cephes' Euler-Maclaurin sum), in float64 like torch's acc_type.

  The direct sum runs, per element, until its own exit; an element with q < -2**20 (which
  torch would sum for ~|q| steps) gives nan instead of a partly summed value."""
  dtype = x.dtype
  x, q = jnp.broadcast_arrays(x.astype(jnp.float64), q.astype(jnp.float64))
  machep = 1.11022302462515654042e-16
  s = jnp.power(q, -x)

  def cond(state):
    i, a, b, s, done = state
    return jnp.any(~done) & (i < _ZETA_MAX_TERMS)

  def body(state):
    i, a, b, s, done = state
    go = ~done
    a2 = a + 1.0
    b2 = jnp.power(a2, -x)
    s2 = s + b2
    converged = (-machep * s2 < b2) & (b2 < machep * s2)
    a, b, s = (jnp.where(go, new, old) for new, old in ((a2, a), (b2, b), (s2, s)))
    # leaves the loop: converged (return s), or past `(i < 9) || (a <= 9)`.
    finished = converged | ((i + 1 >= 9) & ~(a2 <= 9.0))
    return i + 1, a, b, s, done | (go & finished)

  nonpos = q <= 0
  returned = (x <= 1) | (nonpos & ((q == jnp.floor(q)) | (x != jnp.floor(x))))
  zeros = jnp.zeros_like(x)
  start = (jnp.asarray(0, jnp.int64), q, zeros, s, returned)
  i, a, b, s_sum, summed = while_loop(cond, body, start)
  # Recompute which elements returned early (converged) inside the loop: they keep s_sum.
  early = (-machep * s_sum < b) & (b < machep * s_sum)
  w = a
  s = s_sum + b * w / (x - 1.0)
  s = s - 0.5 * b
  a_ = jnp.ones_like(x)
  k = zeros
  done = early
  for coef in _ZETA_A:
    a_ = a_ * (x + k)
    b = b / w
    t = a_ * b / coef
    s_new = s + t
    s = jnp.where(done, s, s_new)
    done = done | (jnp.abs(t / s_new) < machep)
    k = k + 1.0
    a_ = a_ * (x + k)
    b = b / w
    k = k + 1.0
  out = jnp.where(early, s_sum, s)
  out = jnp.where(summed, out, jnp.nan)
  out = jnp.where(nonpos & (x != jnp.floor(x)), jnp.nan, out)
  out = jnp.where(nonpos & (q == jnp.floor(q)), jnp.inf, out)
  out = jnp.where(x < 1, jnp.nan, out)
  out = jnp.where(x == 1, jnp.inf, out)
  return out.astype(dtype)


@lowering(
  aten.special_zeta.default,
  aten.special_zeta.self_scalar,
  aten.special_zeta.other_scalar,
  prims.zeta.default,
)
def zeta(self, other):
  return _zeta(*_float(self, other))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _polygamma(n, x):
  # torch: n = 0 digamma (+-0 -> -+inf, where jax gives nan), n = 1 its own trigamma, else
  # (-1)**(n+1) n! zeta(n + 1, x). The derivative is polygamma(n + 1, x), as torch's.
  if n == 0:
    return jnp.where(x == 0, jnp.copysign(_inf(x), -x), jsp.digamma(x))
  if n == 1:
    return _trigamma(x)
  sign = 1.0 if n % 2 else -1.0
  return sign * math.exp(math.lgamma(n + 1.0)) * _zeta(jnp.full_like(x, n + 1), x)


@_polygamma.defjvp
def _polygamma_jvp(n, primals, tangents):
  (x,), (dx,) = primals, tangents
  return _polygamma(n, x), _polygamma(n + 1, x) * dx


# torch's derivative: digamma, so -+inf at +-0 (JAX's rule gives nan there)
_lgamma = with_derivative(lax.lgamma, lambda out, p, t: _polygamma(0, p[0]) * t[0])


@lowering(aten.digamma.default, prims.digamma.default)
@promote("self", kind="int_to_float")
def digamma(self):
  return _polygamma(0, self)


@lowering(aten.polygamma.default)
def polygamma(n, self):
  if n < 0:
    raise ValueError(f"`torch.polygamma`: the order n must be non-negative, got n={n}")
  (x,) = _float(self)
  return _polygamma(n, x)


@lowering(aten.mvlgamma.default)
@promote("self", kind="int_to_float")
def mvlgamma(self, p):
  # torch: sum_{i<p} lgamma(x - i/2) + p(p-1)/4 log(pi), for every x: torch no longer
  # checks x > (p-1)/2 (mvlgamma(-0.5, 1) is lgamma(-0.5), mvlgamma(0, 1) is inf).
  if p < 1:
    raise RuntimeError("p has to be greater than or equal to 1")
  args = self[..., None] + jnp.arange(-p * 0.5 + 0.5, 0.5, 0.5, dtype=self.dtype)
  return jnp.sum(_lgamma(args), axis=-1) + p * (p - 1) / 4 * np.log(np.pi)


def _igamma_edges(a, x, out, *, upper):
  lo, hi = (1.0, 0.0) if upper else (0.0, 1.0)  # the value at x == 0 and at x == inf
  nan = _nan(out)
  out = jnp.where(jnp.isinf(x), hi, out)
  out = jnp.where(jnp.isinf(a), jnp.where(jnp.isinf(x), nan, lo), out)
  out = jnp.where(x == 0, lo, out)
  out = jnp.where(a == 0, jnp.where(x > 0, hi, nan), out)
  return jnp.where((x < 0) | (a < 0), nan, out)


@lowering(aten.igamma.default, prims.igamma.default)
def igamma(self, other):
  a, x = _float(self, other)
  return _igamma_edges(a, x, jsp.gammainc(a, x), upper=False)


@lowering(aten.igammac.default, prims.igammac.default)
def igammac(self, other):
  a, x = _float(self, other)
  return _igamma_edges(a, x, jsp.gammaincc(a, x), upper=True)


# ------------------------------------------------------------------------- error function family


@lowering(aten.special_erfcx.default, prims.erfcx.default)
@promote("self", kind="int_to_float")
def special_erfcx(self):
  return jsp.erfcx(self)


@lowering(aten.special_log_ndtr.default)
@promote("self", kind="int_to_float")
def special_log_ndtr(self):
  return jsp.log_ndtr(self)


@lowering(aten.special_ndtr.default)
@promote("self", kind="int_to_float")
def special_ndtr(self):
  return jsp.ndtr(self)


@lowering(
  aten.special_xlog1py.default, aten.special_xlog1py.self_scalar, aten.special_xlog1py.other_scalar
)
def special_xlog1py(self, other):
  return _xlog1py(*_float(self, other))


_xlog1py = x_times_log(jnp.log1p, -1.0)  # (torch's decomposition's derivative: 0 at x == 0)


@lowering(aten.special_ndtri.default, prims.ndtri.default)
@promote("self", kind="int_to_float")
def special_ndtri(self):
  return _ndtri(self)


# torch's derivative, from the output: sqrt(2 pi) exp(ndtri(x)**2 / 2), inf at 0 and 1
# (JAX's rule gives 0 there)
_ndtri = with_derivative(
  jsp.ndtri, lambda out, p, t: math.sqrt(2 * math.pi) * jnp.exp(out * out / 2) * t[0]
)


@lowering(aten.special_entr.default)
@promote("self", kind="int_to_float")
def special_entr(self):
  return _entr(self)


def _entr_values(x):
  # torch: nan -> nan, x > 0 -> -x log x, 0 -> 0, x < 0 -> -inf.
  pos = x > 0
  safe = _where_safe(pos, x, 1)
  out = jnp.where(pos, -safe * jnp.log(safe), jnp.where(x == 0, 0.0, -jnp.inf))
  return jnp.where(jnp.isnan(x), x, out.astype(x.dtype))


# torch's derivative -(1 + log x) everywhere: inf at 0, nan below (the branches give 0 there)
_entr = with_derivative(_entr_values, lambda out, x, t: t[0] * -(1 + jnp.log(x[0])))
