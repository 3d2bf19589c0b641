"""Orthogonal polynomials (`torch.special.*_polynomial_*`): Chebyshev T/U/V/W (and shifted),
Hermite H/He, Laguerre, Legendre.

As torch's CPU kernels (aten/src/ATen/native/Math.h): an integer degree `n` (a float `n` is
truncated toward 0, like torch's `static_cast<int64_t>`), 0 for `n < 0`, and torch's
recurrences (a loop up to the largest `n`, stopped per element where torch stops: at `n` or
at a nan).
"""

from __future__ import annotations

import jax.numpy as jnp

from bridge_ops._lowering import aten, lowering, while_loop
from bridge_ops._special import _float, _nan, _where_safe

__all__: list[str] = []


# ----------------------------------------------------------------------------- polynomials


def _degree(n):
  """torch's `static_cast<int64_t>(n)` of the promoted degree: truncation toward 0; nan, inf and
  out-of-range values become INT64_MIN (what x86's conversion gives), hence degree < 0."""
  if not jnp.issubdtype(n.dtype, jnp.floating):
    return n.astype(jnp.int64)
  ok = jnp.isfinite(n) & (jnp.abs(n) < 2.0**63)
  return jnp.where(
    ok, jnp.trunc(_where_safe(ok, n, 0.0)).astype(jnp.int64), jnp.iinfo(jnp.int64).min
  )


def _recurrence(x, n, first, step, needed, *, stop_at_nan=True):
  """The polynomial of degree n >= 0 from P_0 = 1, P_1 = `first` and torch's loop
  `for (k = 2; k <= n && !isnan(q); k++) {r = step(k, p, q); p = q; q = r;}`, run for all
  elements up to the largest n, freezing each where its own loop stops.

  `needed` marks the elements whose result is the loop's: torch answers the others (a closed
  form, a boundary value) without looping, so they must not keep the loop going: a degree of
  1e10 at x = 0.5 would run it 1e10 times."""
  one = jnp.ones_like(x)

  def active(k, q):
    act = (k <= n) & needed
    return act & ~jnp.isnan(q) if stop_at_nan else act

  def cond(state):
    k, p, q = state
    return jnp.any(active(k, q))

  def body(state):
    k, p, q = state
    act = active(k, q)
    r = step(k.astype(x.dtype), p, q)
    return k + 1, jnp.where(act, q, p), jnp.where(act, r, q)

  k0 = jnp.asarray(2, jnp.int64)
  rec = while_loop(cond, body, (k0, one, first))[2]  # (torch's r; q once the loop has run)
  return jnp.where(n == 0, one, jnp.where(n == 1, first, rec))


def _polynomial(kernel, x, n, *, shifted=False, **kwargs):
  """`kernel(x, n, **kwargs)` at torch's promoted x and integer degree n, 0 for n < 0."""
  x, n = _float(x, n)
  n = _degree(n)
  if shifted:
    # torch's shifted kernels run the plain recurrences at 2x - 1 (with other trig thresholds).
    x = x + x - 1.0
  return jnp.where(n < 0, jnp.zeros_like(x), kernel(x, n, **kwargs))


def _overloads(packet):
  """A polynomial's functional overloads: tensor x and n, a Scalar x, a Scalar n."""
  return packet.default, packet.x_scalar, packet.n_scalar


def _parity_sign(n):
  return jnp.where(n % 2 == 0, 1.0, -1.0)


def _at_ends(x, n, value):
  """`value` at x == 1, (-1)^n `value` at x == -1 (the plain Chebyshev T/U and Legendre)."""
  return jnp.where((x > 0) | (n % 2 == 0), value, -value)


def _chebyshev(x, n, first, threshold, trig, at_one):
  """torch's Chebyshev kernels: at |x| == 1 `at_one`; for |x| < 1 above the degree
  `threshold` the trigonometric form `trig(n, acos(x))`; elsewhere the recurrence
  r = 2x q - p from P_1 = `first`."""
  rec = _recurrence(x, n, first, lambda k, p, q: (x + x) * q - p, _by_recurrence(x, n, threshold))
  inside = jnp.abs(x) < 1.0
  acos = jnp.arccos(_where_safe(inside, x, 0.0))
  out = jnp.where((n > threshold) & inside, trig(n.astype(x.dtype), acos), rec)
  return jnp.where(jnp.abs(x) == 1.0, at_one, out)


def _by_recurrence(x, n, threshold):
  """The Chebyshev elements torch computes by its recurrence: not |x| == 1, nor |x| < 1 with
  n above the threshold of the trigonometric form."""
  return (jnp.abs(x) != 1.0) & ~((n > threshold) & (jnp.abs(x) < 1.0))


def _chebyshev_t(x, n, threshold):
  return _chebyshev(x, n, x, threshold, lambda nf, acos: jnp.cos(nf * acos), _at_ends(x, n, 1.0))


def _chebyshev_u(x, n, threshold):
  nf = n.astype(x.dtype)

  def trig(nf, acos):
    sin_acos = jnp.sin(acos)
    return jnp.where(
      sin_acos != 0,
      jnp.sin((nf + 1) * acos) / sin_acos,
      (nf + 1) * jnp.cos((nf + 1) * acos) / _where_safe(jnp.abs(x) < 1.0, x, 1.0),
    )

  return _chebyshev(x, n, x + x, threshold, trig, _at_ends(x, n, nf + 1))


def _chebyshev_vw(x, n, kind, threshold, shifted_kernel=False):
  nf = n.astype(x.dtype)
  odd_sign = _parity_sign(n).astype(x.dtype)
  if kind == "v":
    first = x + x - 1.0
    at_one = jnp.where(x > 0, jnp.ones_like(x), odd_sign * (nf + nf + 1))

    def trig(nf, acos):
      return jnp.where(
        jnp.sin(acos / 2.0) != 1.0,
        jnp.cos((nf + 0.5) * acos) / jnp.cos(acos / 2.0),
        odd_sign * (nf + nf + 1),
      )

  else:
    first = x + x + 1.0
    at_one = jnp.where(x > 0, nf + nf + 1, odd_sign)

    def trig(nf, acos):
      # (where cos(acos(x) / 2) rounds to 1 the plain kernel gives 2n + 1, the shifted one +-1)
      return jnp.where(
        jnp.cos(acos / 2.0) != 1.0,
        jnp.sin((nf + 0.5) * acos) / jnp.sin(acos / 2.0),
        odd_sign if shifted_kernel else at_one,
      )

  return _chebyshev(x, n, first, threshold, trig, at_one)


@lowering(*_overloads(aten.special_chebyshev_polynomial_t))
def special_chebyshev_polynomial_t(x, n):
  return _polynomial(_chebyshev_t, x, n, threshold=6)


@lowering(*_overloads(aten.special_chebyshev_polynomial_u))
def special_chebyshev_polynomial_u(x, n):
  return _polynomial(_chebyshev_u, x, n, threshold=8)


@lowering(*_overloads(aten.special_chebyshev_polynomial_v))
def special_chebyshev_polynomial_v(x, n):
  return _polynomial(_chebyshev_vw, x, n, kind="v", threshold=8)


@lowering(*_overloads(aten.special_chebyshev_polynomial_w))
def special_chebyshev_polynomial_w(x, n):
  return _polynomial(_chebyshev_vw, x, n, kind="w", threshold=8)


@lowering(*_overloads(aten.special_shifted_chebyshev_polynomial_t))
def special_shifted_chebyshev_polynomial_t(x, n):
  return _polynomial(_chebyshev_t, x, n, shifted=True, threshold=6)


@lowering(*_overloads(aten.special_shifted_chebyshev_polynomial_u))
def special_shifted_chebyshev_polynomial_u(x, n):
  return _polynomial(_chebyshev_u, x, n, shifted=True, threshold=6)


@lowering(*_overloads(aten.special_shifted_chebyshev_polynomial_v))
def special_shifted_chebyshev_polynomial_v(x, n):
  return _polynomial(_chebyshev_vw, x, n, shifted=True, kind="v", threshold=6, shifted_kernel=True)


@lowering(*_overloads(aten.special_shifted_chebyshev_polynomial_w))
def special_shifted_chebyshev_polynomial_w(x, n):
  return _polynomial(_chebyshev_vw, x, n, shifted=True, kind="w", threshold=4, shifted_kernel=True)


def _hermite(x, n, first, step):
  """torch's Hermite kernels: nan above the degree limit (and no loop there), else the
  recurrence from P_1 = `first`."""
  limit = 128 if x.dtype == jnp.float32 else 512
  rec = _recurrence(x, n, first, step, n <= limit, stop_at_nan=False)
  return jnp.where(n > limit, _nan(x), rec)


def _hermite_h(x, n):
  # torch: k runs 2, 4, ..., 2n - 2 with r = 2x q - k p.
  return _hermite(x, n, x + x, lambda k, p, q: (x + x) * q - (k + k - 2.0) * p)


def _hermite_he(x, n):
  # torch: k runs 1 .. n - 1 with r = x q - k p.
  return _hermite(x, n, x, lambda k, p, q: x * q - (k - 1.0) * p)


@lowering(*_overloads(aten.special_hermite_polynomial_h))
def special_hermite_polynomial_h(x, n):
  return _polynomial(_hermite_h, x, n)


@lowering(*_overloads(aten.special_hermite_polynomial_he))
def special_hermite_polynomial_he(x, n):
  return _polynomial(_hermite_he, x, n)


def _laguerre(x, n):
  # torch: k runs 1 .. n - 1 with r = ((2k + 1 - x) q - k p) / (k + 1); 1 at x == 0.
  def step(k, p, q):
    k = k - 1.0
    return (((k + k) + (1.0 - x)) * q - k * p) / (k + 1.0)

  rec = _recurrence(x, n, 1.0 - x, step, x != 0.0)
  return jnp.where(jnp.abs(x) == 0.0, jnp.ones_like(x), rec)


@lowering(*_overloads(aten.special_laguerre_polynomial_l))
def special_laguerre_polynomial_l(x, n):
  return _polynomial(_laguerre, x, n)


def _legendre(x, n):
  # torch: k runs 1 .. n - 1 with r = ((2k + 1) x q - k p) / (k + 1).
  def step(k, p, q):
    k = k - 1.0
    return ((k + k + 1.0) * x * q - k * p) / (k + 1.0)

  rec = _recurrence(x, n, x, step, jnp.abs(x) != 1.0)
  return jnp.where(jnp.abs(x) == 1.0, _at_ends(x, n, 1.0), rec)


@lowering(*_overloads(aten.special_legendre_polynomial_p))
def special_legendre_polynomial_p(x, n):
  return _polynomial(_legendre, x, n)
