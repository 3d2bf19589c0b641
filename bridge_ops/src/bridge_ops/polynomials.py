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


def _recurrence(x, n, p, q, step, first_k, needed, *, stop_at_nan=True):
  """torch's loop `for (k = first_k; k <= n && !isnan(q); k++) {r = step(k, p, q); p = q; q = r;}`
  run for all elements up to the largest n, freezing each where its own loop stops.
  Returns q (torch's r after the loop; equal to q once the loop ran at least once).

  `needed` marks the elements whose result is the loop's: torch answers the others (a closed
  form, a boundary value) without looping, so they must not keep the loop going: a degree of
  1e10 at x = 0.5 would run it 1e10 times."""

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

  k0 = jnp.asarray(first_k, jnp.int64)
  return while_loop(cond, body, (k0, p, q))[2]


def _poly_args(x, n):
  x, n = _float(x, n)
  return x, n, _degree(n)


def _parity_sign(n):
  return jnp.where(n % 2 == 0, 1.0, -1.0)


def _by_recurrence(x, n, threshold):
  """The Chebyshev elements torch computes by its recurrence: not |x| == 1, nor |x| < 1 with
  n above the threshold of the trigonometric form."""
  return (jnp.abs(x) != 1.0) & ~((n > threshold) & (jnp.abs(x) < 1.0))


def _chebyshev_t(x, n, threshold):
  one = jnp.ones_like(x)
  rec = _recurrence(
    x, n, one, x, lambda k, p, q: (x + x) * q - p, 2, _by_recurrence(x, n, threshold)
  )
  out = jnp.where(n == 0, one, jnp.where(n == 1, x, rec))
  inside = jnp.abs(x) < 1.0
  out = jnp.where(
    (n > threshold) & inside,
    jnp.cos(n.astype(x.dtype) * jnp.arccos(_where_safe(inside, x, 0.0))),
    out,
  )
  out = jnp.where(jnp.abs(x) == 1.0, jnp.where((x > 0) | (n % 2 == 0), 1.0, -1.0), out)
  return jnp.where(n < 0, jnp.zeros_like(x), out)


def _chebyshev_u(x, n, threshold):
  one = jnp.ones_like(x)
  rec = _recurrence(
    x, n, one, x + x, lambda k, p, q: (x + x) * q - p, 2, _by_recurrence(x, n, threshold)
  )
  out = jnp.where(n == 0, one, jnp.where(n == 1, x + x, rec))
  inside = jnp.abs(x) < 1.0
  nf = n.astype(x.dtype)
  acos = jnp.arccos(_where_safe(inside, x, 0.0))
  sin_acos = jnp.sin(acos)
  trig = jnp.where(
    sin_acos != 0,
    jnp.sin((nf + 1) * acos) / sin_acos,
    (nf + 1) * jnp.cos((nf + 1) * acos) / _where_safe(inside, x, 1.0),
  )
  out = jnp.where((n > threshold) & inside, trig, out)
  out = jnp.where(jnp.abs(x) == 1.0, jnp.where((x > 0) | (n % 2 == 0), nf + 1, -(nf + 1)), out)
  return jnp.where(n < 0, jnp.zeros_like(x), out)


def _chebyshev_vw(x, n, kind, threshold, shifted):
  one = jnp.ones_like(x)
  first = x + x - 1.0 if kind == "v" else x + x + 1.0
  rec = _recurrence(
    x, n, one, first, lambda k, p, q: (x + x) * q - p, 2, _by_recurrence(x, n, threshold)
  )
  out = jnp.where(n == 0, one, jnp.where(n == 1, first, rec))
  nf = n.astype(x.dtype)
  odd_sign = _parity_sign(n).astype(x.dtype)
  if kind == "v":
    at_one = jnp.where(x > 0, one, odd_sign * (nf + nf + 1))
  else:
    at_one = jnp.where(x > 0, nf + nf + 1, odd_sign)
  inside = jnp.abs(x) < 1.0
  acos = jnp.arccos(_where_safe(inside, x, 0.0))
  if kind == "v":
    trig = jnp.where(
      jnp.sin(acos / 2.0) != 1.0,
      jnp.cos((nf + 0.5) * acos) / jnp.cos(acos / 2.0),
      odd_sign * (nf + nf + 1),
    )
  else:
    # (where cos(acos(x) / 2) rounds to 1 the plain kernel gives 2n + 1, the shifted one +-1)
    trig = jnp.where(
      jnp.cos(acos / 2.0) != 1.0,
      jnp.sin((nf + 0.5) * acos) / jnp.sin(acos / 2.0),
      odd_sign if shifted else at_one,
    )
  out = jnp.where((n > threshold) & inside, trig, out)
  out = jnp.where(jnp.abs(x) == 1.0, at_one, out)
  return jnp.where(n < 0, jnp.zeros_like(x), out)


def _plain(x, n):
  x, _, n = _poly_args(x, n)
  return x, n


def _shifted(x, n):
  # torch's shifted kernels run the plain recurrences at 2x - 1 (with other trig thresholds).
  x, _, n = _poly_args(x, n)
  return x + x - 1.0, n


@lowering(
  aten.special_chebyshev_polynomial_t.default,
  aten.special_chebyshev_polynomial_t.x_scalar,
  aten.special_chebyshev_polynomial_t.n_scalar,
)
def special_chebyshev_polynomial_t(x, n):
  return _chebyshev_t(*_plain(x, n), threshold=6)


@lowering(
  aten.special_chebyshev_polynomial_u.default,
  aten.special_chebyshev_polynomial_u.x_scalar,
  aten.special_chebyshev_polynomial_u.n_scalar,
)
def special_chebyshev_polynomial_u(x, n):
  return _chebyshev_u(*_plain(x, n), threshold=8)


@lowering(
  aten.special_chebyshev_polynomial_v.default,
  aten.special_chebyshev_polynomial_v.x_scalar,
  aten.special_chebyshev_polynomial_v.n_scalar,
)
def special_chebyshev_polynomial_v(x, n):
  return _chebyshev_vw(*_plain(x, n), "v", threshold=8, shifted=False)


@lowering(
  aten.special_chebyshev_polynomial_w.default,
  aten.special_chebyshev_polynomial_w.x_scalar,
  aten.special_chebyshev_polynomial_w.n_scalar,
)
def special_chebyshev_polynomial_w(x, n):
  return _chebyshev_vw(*_plain(x, n), "w", threshold=8, shifted=False)


@lowering(
  aten.special_shifted_chebyshev_polynomial_t.default,
  aten.special_shifted_chebyshev_polynomial_t.x_scalar,
  aten.special_shifted_chebyshev_polynomial_t.n_scalar,
)
def special_shifted_chebyshev_polynomial_t(x, n):
  return _chebyshev_t(*_shifted(x, n), threshold=6)


@lowering(
  aten.special_shifted_chebyshev_polynomial_u.default,
  aten.special_shifted_chebyshev_polynomial_u.x_scalar,
  aten.special_shifted_chebyshev_polynomial_u.n_scalar,
)
def special_shifted_chebyshev_polynomial_u(x, n):
  return _chebyshev_u(*_shifted(x, n), threshold=6)


@lowering(
  aten.special_shifted_chebyshev_polynomial_v.default,
  aten.special_shifted_chebyshev_polynomial_v.x_scalar,
  aten.special_shifted_chebyshev_polynomial_v.n_scalar,
)
def special_shifted_chebyshev_polynomial_v(x, n):
  return _chebyshev_vw(*_shifted(x, n), "v", threshold=6, shifted=True)


@lowering(
  aten.special_shifted_chebyshev_polynomial_w.default,
  aten.special_shifted_chebyshev_polynomial_w.x_scalar,
  aten.special_shifted_chebyshev_polynomial_w.n_scalar,
)
def special_shifted_chebyshev_polynomial_w(x, n):
  return _chebyshev_vw(*_shifted(x, n), "w", threshold=4, shifted=True)


def _hermite_limit(dtype):
  return 128 if dtype == jnp.float32 else 512


@lowering(
  aten.special_hermite_polynomial_h.default,
  aten.special_hermite_polynomial_h.x_scalar,
  aten.special_hermite_polynomial_h.n_scalar,
)
def special_hermite_polynomial_h(x, n):
  # torch: k runs 2, 4, ..., 2n - 2 with r = 2x q - k p; nan above the degree limit.
  x, _, n = _poly_args(x, n)
  one = jnp.ones_like(x)
  rec = _recurrence(
    x,
    n,
    one,
    x + x,
    lambda k, p, q: (x + x) * q - (k + k - 2.0) * p,
    2,
    n <= _hermite_limit(x.dtype),
    stop_at_nan=False,
  )
  out = jnp.where(n == 0, one, jnp.where(n == 1, x + x, rec))
  out = jnp.where(n > _hermite_limit(x.dtype), _nan(x), out)
  return jnp.where(n < 0, jnp.zeros_like(x), out)


@lowering(
  aten.special_hermite_polynomial_he.default,
  aten.special_hermite_polynomial_he.x_scalar,
  aten.special_hermite_polynomial_he.n_scalar,
)
def special_hermite_polynomial_he(x, n):
  # torch: k runs 1 .. n - 1 with r = x q - k p.
  x, _, n = _poly_args(x, n)
  one = jnp.ones_like(x)
  rec = _recurrence(
    x,
    n,
    one,
    x,
    lambda k, p, q: x * q - (k - 1.0) * p,
    2,
    n <= _hermite_limit(x.dtype),
    stop_at_nan=False,
  )
  out = jnp.where(n == 0, one, jnp.where(n == 1, x, rec))
  out = jnp.where(n > _hermite_limit(x.dtype), _nan(x), out)
  return jnp.where(n < 0, jnp.zeros_like(x), out)


@lowering(
  aten.special_laguerre_polynomial_l.default,
  aten.special_laguerre_polynomial_l.x_scalar,
  aten.special_laguerre_polynomial_l.n_scalar,
)
def special_laguerre_polynomial_l(x, n):
  # torch: k runs 1 .. n - 1 with r = ((2k + 1 - x) q - k p) / (k + 1); 1 at x == 0.
  x, _, n = _poly_args(x, n)
  one = jnp.ones_like(x)

  def step(k, p, q):
    k = k - 1.0
    return (((k + k) + (1.0 - x)) * q - k * p) / (k + 1.0)

  rec = _recurrence(x, n, one, 1.0 - x, step, 2, x != 0.0)
  out = jnp.where(n == 0, one, jnp.where(n == 1, 1.0 - x, rec))
  out = jnp.where(jnp.abs(x) == 0.0, one, out)
  return jnp.where(n < 0, jnp.zeros_like(x), out)


@lowering(
  aten.special_legendre_polynomial_p.default,
  aten.special_legendre_polynomial_p.x_scalar,
  aten.special_legendre_polynomial_p.n_scalar,
)
def special_legendre_polynomial_p(x, n):
  # torch: k runs 1 .. n - 1 with r = ((2k + 1) x q - k p) / (k + 1).
  x, _, n = _poly_args(x, n)
  one = jnp.ones_like(x)

  def step(k, p, q):
    k = k - 1.0
    return ((k + k + 1.0) * x * q - k * p) / (k + 1.0)

  rec = _recurrence(x, n, one, x, step, 2, jnp.abs(x) != 1.0)
  out = jnp.where(n == 0, one, jnp.where(n == 1, x, rec))
  out = jnp.where(jnp.abs(x) == 1.0, jnp.where((x > 0) | (n % 2 == 0), 1.0, -1.0), out)
  return jnp.where(n < 0, jnp.zeros_like(x), out)
