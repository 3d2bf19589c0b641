"""Elementwise math functions: roots, exp/log, trigonometric and hyperbolic functions,
sigmoid/logit, erf, rounding, copysign, hypot, xlogy, heaviside, sinc, logaddexp, complex
numbers, frexp, nextafter, gcd/lcm.

torch's values where they differ from JAX's: `heaviside(nan, v)` is 0, `xlogy(0, nan)` is
nan; derivatives are torch's at its edge points (`rsqrt` at -0, `logit` outside [0, 1],
`sinc` near 0).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bridge_ops._lowering import (
  aten,
  lowering,
  promote,
  result_dtypes,
  scalar_type_name,
  while_loop,
  with_derivative,
  x_times_log,
)
from bridge_ops._elementwise import _as, _inexact, _integer, _promote, _sigmoid
from bridge_ops.comparison import _integral

__all__: list[str] = []


@lowering(aten.sqrt.default)
@promote("self", kind="int_to_float")
def sqrt(self):
  return jnp.sqrt(self)


@lowering(aten.rsqrt.default)
@promote("self", kind="int_to_float")
def rsqrt(self):
  return _rsqrt(self)


# torch's derivative, from the output: -out**3 / 2 (+inf at -0, where rsqrt is -inf; JAX's
# -out / (2 x) gave -inf)
_rsqrt = with_derivative(lax.rsqrt, lambda out, p, t: -0.5 * (out * out * out) * t[0])


@lowering(aten.exp.default)
@promote("self", kind="int_to_float")
def exp(self):
  return jnp.exp(self)


@lowering(aten.exp2.default)
@promote("self", kind="int_to_float")
def exp2(self):
  if not jnp.issubdtype(self.dtype, jnp.floating):
    return jnp.exp2(self)  # complex
  return _exp2(self)


def _exp2_value(x):
  # XLA's exp2 is exp(x * ln 2): ~20 ulp off for |x| ~ 100 in float32 (2**100 inexact).
  # Split x = n + f and scale exp2(f) by 2**n exactly.
  n = jnp.round(x)
  n_int = jnp.clip(jnp.where(jnp.isfinite(n), n, 0), -2000, 2000).astype(jnp.int32)
  out = jnp.ldexp(jnp.exp2(x - n), n_int)
  return jnp.where(jnp.isfinite(x), out, jnp.exp2(x))


# torch's derivative, from the output: exp2(x) ln 2 (inf where exp2 overflows, 0 at -inf;
# differentiating the split above gave nan there)
_exp2 = with_derivative(_exp2_value, lambda out, p, t: out * np.log(2.0).item() * t[0])


@lowering(aten.expm1.default)
@promote("self", kind="int_to_float")
def expm1(self):
  return jnp.expm1(self)


@lowering(aten.log.default)
@promote("self", kind="int_to_float")
def log(self):
  return jnp.log(self)


@lowering(aten.log2.default)
@promote("self", kind="int_to_float")
def log2(self):
  return jnp.log2(self)


@lowering(aten.log10.default)
@promote("self", kind="int_to_float")
def log10(self):
  return jnp.log10(self)


@lowering(aten.log1p.default)
@promote("self", kind="int_to_float")
def log1p(self):
  return jnp.log1p(self)


@lowering(aten.sin.default)
@promote("self", kind="int_to_float")
def sin(self):
  return jnp.sin(self)


@lowering(aten.cos.default)
@promote("self", kind="int_to_float")
def cos(self):
  return jnp.cos(self)


@lowering(aten.tan.default)
@promote("self", kind="int_to_float")
def tan(self):
  return jnp.tan(self)


@lowering(aten.asin.default)
@promote("self", kind="int_to_float")
def asin(self):
  return jnp.arcsin(self)


@lowering(aten.acos.default)
@promote("self", kind="int_to_float")
def acos(self):
  return jnp.arccos(self)


@lowering(aten.atan.default)
@promote("self", kind="int_to_float")
def atan(self):
  return jnp.arctan(self)


def _atan2_tangent(out, primals, tangents):
  y, x = primals
  r2 = y * y + x * x
  recip = jnp.where(r2 == 0, jnp.zeros((), r2.dtype), 1 / jnp.where(r2 == 0, 1, r2))
  return (x * tangents[0] - y * tangents[1]) * recip  # torch: no gradient at (0, 0)


_atan2 = with_derivative(jnp.arctan2, _atan2_tangent)


@lowering(aten.atan2.default, aten.arctan2.default)
@_promote("self", "other", kind="int_to_float")
def atan2(self, other):
  return _atan2(self, other)


@lowering(aten.sinh.default)
@promote("self", kind="int_to_float")
def sinh(self):
  return jnp.sinh(self)


@lowering(aten.cosh.default)
@promote("self", kind="int_to_float")
def cosh(self):
  return jnp.cosh(self)


@lowering(aten.tanh.default)
@promote("self", kind="int_to_float")
def tanh(self):
  return jnp.tanh(self)


@lowering(aten.asinh.default)
@promote("self", kind="int_to_float")
def asinh(self):
  return jnp.arcsinh(self)


@lowering(aten.acosh.default)
@promote("self", kind="int_to_float")
def acosh(self):
  return jnp.arccosh(self)


@lowering(aten.atanh.default)
@promote("self", kind="int_to_float")
def atanh(self):
  return jnp.arctanh(self)


@lowering(aten.sigmoid.default)
@promote("self", kind="int_to_float")
def sigmoid(self):
  return _sigmoid(self)


@lowering(aten.logit.default)
def logit(self, eps=None):
  # torch's vectorized CPU kernel rounds each step (1 - x, the quotient, log) to the tensor's
  # own dtype, float16/bfloat16 included: no float32 opmath here.
  self = self.astype(result_dtypes(self, kind="int_to_float")[1])
  if eps is None:
    return _logit(self)
  return _logit_eps(self, _as(eps, self.dtype))  # (eps traced like a Scalar)


def _logit_value(x, lo=None):
  if lo is not None:  # a negative eps means no clamping, like None
    clamped = jnp.where(x < lo, lo, jnp.where(x > 1 - lo, 1 - lo, x))
    x = jnp.where(lo < 0, x, clamped)
  return jnp.log(x / (1 - x))


# torch's logit_backward: 1 / (x (1 - x)); nan outside [0, 1] (where the value is nan: JAX's
# rule gave a finite slope there), 0 outside [eps, 1 - eps] with an eps. eps gets no gradient.
# (The slope is computed from the primals alone, so the tangent stays linear in `t`.)
def _logit_slope(x, *eps):
  return logit_backward(jnp.ones_like(x), x, *eps).astype(x.dtype)


_logit = with_derivative(_logit_value, lambda out, p, t: t[0] * _logit_slope(p[0]))
_logit_eps = with_derivative(_logit_value, lambda out, p, t: t[0] * _logit_slope(*p))


@lowering(aten.logit_backward.default)
@promote("grad_output", "self")
def logit_backward(grad_output, self, eps=None):
  grad = grad_output / (self * (1 - self))
  # Without eps (or a negative one): nan outside [0, 1]; with eps: 0 outside [eps, 1 - eps]
  # and for a nan input (torch's vectorized path; its scalar path gives nan there).
  no_eps = jnp.where((self < 0) | (self > 1), jnp.full((), jnp.nan, grad.dtype), grad)
  if eps is None:
    return no_eps
  lo = _as(eps, self.dtype)  # `float? eps` is traced like a Scalar
  with_eps = jnp.where((self >= lo) & (self <= 1 - lo), grad, jnp.zeros((), grad.dtype))
  return jnp.where(lo < 0, no_eps, with_eps)


@lowering(aten.erf.default)
@promote("self", kind="int_to_float")
def erf(self):
  return lax.erf(self)


@lowering(aten.erfc.default)
@promote("self", kind="int_to_float")
def erfc(self):
  return lax.erfc(self)


@lowering(aten.erfinv.default)
@promote("self", kind="int_to_float")
def erfinv(self):
  return lax.erf_inv(self)


@lowering(aten.floor.default)
@promote("self")
def floor(self):
  return jnp.floor(self) if _inexact(self) else self


@lowering(aten.ceil.default)
@promote("self")
def ceil(self):
  return jnp.ceil(self) if _inexact(self) else self


@lowering(aten.trunc.default)
@promote("self")
def trunc(self):
  return jnp.trunc(self) if _inexact(self) else self


@lowering(aten.round.default)
@promote("self")
def round(self):  # (named after the op)
  # Half to even, like std::nearbyint.
  return jnp.round(self) if _inexact(self) else self


@lowering(aten.round.decimals)
@promote("self")
def round_decimals(self, *, decimals):
  if not _inexact(self):
    return self
  scale = jnp.asarray(10.0 ** (-decimals if decimals < 0 else decimals), self.dtype)
  if decimals < 0:
    return jnp.round(self / scale) * scale
  return jnp.round(self * scale) / scale


@lowering(aten.frac.default)
@promote("self")
def frac(self):
  return self - jnp.trunc(self)


@lowering(aten.copysign.Tensor, aten.copysign.Scalar)
@_promote("self", "other", kind="int_to_float")
def copysign(self, other):
  return _copysign(self, other)


def _copysign_tangent(out, primals, tangents):
  x = primals[0]  # torch: d/dx = out / x, 0 at x = 0 (JAX's rule gives the sign there)
  return tangents[0] * jnp.where(
    x == 0, jnp.zeros((), out.dtype), out / jnp.where(x == 0, jnp.ones((), x.dtype), x)
  )


_copysign = with_derivative(jnp.copysign, _copysign_tangent)


@lowering(aten.hypot.default)
@_promote("self", "other")
def hypot(self, other):
  return _hypot(self, other)


# torch's derivative (x dx + y dy) / hypot: right for tiny inputs, whose squares underflow in
# JAX's rule, and nan at (0, 0) as in torch.
_hypot = with_derivative(jnp.hypot, lambda out, p, t: (p[0] * t[0] + p[1] * t[1]) / out)


@lowering(aten.xlogy.Tensor, aten.xlogy.Scalar_Other, aten.xlogy.Scalar_Self)
@_promote("self", "other", kind="int_to_float")
def xlogy(self, other):
  return _xlogy(self, other)


# (jax's own xlogy gives 0 at (0, nan), and its derivative 0 at every x == 0)
_xlogy = x_times_log(jnp.log, 0.0)


@lowering(aten.heaviside.default)
@_promote("self", "values")
def heaviside(self, values):
  # torch: x == 0 ? values : x > 0, so heaviside(nan) is 0 (jnp.heaviside gives `values`).
  return jnp.where(self == 0, values, (self > 0).astype(self.dtype))


# ----------------------------------------------------------------------------- more math


def _sinc_value(x):
  # torch: 1 at 0, else sin(pi x) / (pi x), in opmath (float32 for float16/bfloat16).
  zero = x == 0
  product = jnp.pi * jnp.where(zero, jnp.ones((), x.dtype), x)
  return jnp.where(zero, jnp.ones((), x.dtype), jnp.sin(product) / product)


def _sinc_tangent(out, primals, tangents):
  # torch's sinc_backward: (pi x cos(pi x) - sin(pi x)) / (pi x^2), and 0 where pi x^2 is 0.
  # JAX's derivative of sin(p) / p cancels catastrophically near 0 (float32 at 1e-5: -6e-3,
  # at 1e-30: -inf); this formula's numerator rounds to exactly 0 there, as in torch.
  x, t = primals[0], tangents[0]
  x_pi, x2_pi = x * jnp.pi, x * x * jnp.pi
  safe = jnp.where(x2_pi == 0, jnp.ones((), x.dtype), x2_pi)
  slope = (x_pi * jnp.cos(x_pi) - jnp.sin(x_pi)) / safe
  return jnp.where(x2_pi == 0, jnp.zeros((), x.dtype), slope) * t


_sinc = with_derivative(_sinc_value, _sinc_tangent)


@lowering(aten.sinc.default)
@promote("self", kind="int_to_float")
def sinc(self):
  return _sinc(self) if jnp.issubdtype(self.dtype, jnp.floating) else _sinc_value(self)


@lowering(aten.logaddexp.default)
@_promote("self", "other")
def logaddexp(self, other):
  # torch's _log_add_exp_helper (aten/src/ATen/native/cpu/LogAddExp.h).
  x, y = jnp.broadcast_arrays(self, other)
  if jnp.issubdtype(x.dtype, jnp.complexfloating):
    x_nan, y_nan = jnp.isnan(x), jnp.isnan(y)
    lo = jnp.where(y_nan, y, jnp.where(x_nan, x, jnp.where(x.real < y.real, x, y)))
    hi = jnp.where(y_nan, y, jnp.where(x_nan, x, jnp.where(x.real < y.real, y, x)))
    nan = lax.complex(*(jnp.full((), jnp.nan, x.real.dtype),) * 2)
    both_inf = ~jnp.isfinite(lo.real) & (lo.real == hi.real)
    finite_hi = jnp.where(both_inf, jnp.zeros((), x.dtype), hi)
    general = (
      jnp.log1p(jnp.exp(jnp.where(both_inf, jnp.zeros((), x.dtype), lo) - finite_hi)) + finite_hi
    )
    inf_case = jnp.where(lo.real < 0, lo, jnp.log(jnp.exp(lo) + jnp.exp(hi)))
    return jnp.where(jnp.isnan(lo), nan, jnp.where(both_inf, inf_case, general))
  lo = jnp.where(jnp.isnan(y), y, jnp.minimum(x, y))
  hi = jnp.where(jnp.isnan(y), y, jnp.maximum(x, y))
  general = (lo != hi) | jnp.isfinite(lo)
  safe_lo = jnp.where(general, lo, jnp.zeros((), lo.dtype))
  safe_hi = jnp.where(general, hi, jnp.zeros((), hi.dtype))
  return jnp.where(general, jnp.log1p(jnp.exp(safe_lo - safe_hi)) + safe_hi, x)


@lowering(aten.angle.default)
@promote("self", kind="int_to_float")
def angle(self):
  if jnp.issubdtype(self.dtype, jnp.complexfloating):
    re, im = jnp.real(self), jnp.imag(self)
    # torch's derivative at 0 is 0 (arctan2's is nan there); the value keeps atan2's signs
    zero = (re == 0) & (im == 0)
    safe = jnp.arctan2(jnp.where(zero, 0, im), jnp.where(zero, 1, re))
    return jnp.where(zero, lax.stop_gradient(jnp.arctan2(im, re)), safe)
  # torch: nan stays nan, pi for negatives, 0 otherwise (gradient 0 everywhere).
  out = jnp.where(self < 0, jnp.full((), jnp.pi, self.dtype), jnp.zeros((), self.dtype))
  return jnp.where(jnp.isnan(self), self, out)


def _no_complex32(name: str, x: jax.Array) -> None:
  if x.dtype == jnp.float16:
    raise TypeError(
      f"`torch.{name}`: float16 inputs give a torch.complex32 (chalf) result, and JAX has no "
      f"complex32 type. Cast the inputs to float32 (complex64 result) first; got a float16 "
      f"tensor of shape {tuple(x.shape)}."
    )


def _check_parts(a: jax.Array, b: jax.Array) -> None:
  """torch's `complex_check_dtype`: both parts float16, float32 or float64, and of one dtype."""
  names = scalar_type_name(a.dtype), scalar_type_name(b.dtype)
  if not all(n in ("Half", "Float", "Double") for n in names):
    raise RuntimeError(
      f"Expected both inputs to be Half, Float or Double tensors but got {names[0]} and {names[1]}"
    )
  if names[0] != names[1]:
    raise RuntimeError(
      f"Expected object of scalar type {names[0]} but got scalar type {names[1]} for second "
      "argument"
    )


@lowering(aten.complex.default)
def complex(real, imag):  # (named after the op)
  _check_parts(real, imag)
  _no_complex32("complex", real)
  real, imag = jnp.broadcast_arrays(real, imag)
  return lax.complex(real, imag)


@lowering(aten.polar.default)
def polar(abs, angle):  # (schema names)
  _check_parts(abs, angle)
  _no_complex32("polar", abs)
  return lax.complex(*jnp.broadcast_arrays(abs * jnp.cos(angle), abs * jnp.sin(angle)))


# `_conj_copy`: `Tensor.conj()`'s view op as a functional graph holds it (`bridge.export`; the
# `jax` device keeps torch's lazy conj bit instead). A real tensor's conjugate is itself.
@lowering(aten._conj_physical.default, aten.conj_physical.default, aten._conj_copy.default)
def conj_physical(self):
  return jnp.conj(self) if jnp.issubdtype(self.dtype, jnp.complexfloating) else self


@lowering(aten.signbit.default)
def signbit(self):
  if self.dtype == jnp.bool_ or jnp.issubdtype(self.dtype, jnp.unsignedinteger):
    return jnp.zeros(self.shape, jnp.bool_)
  if _integer(self):
    return self < 0
  return jnp.signbit(self)


@lowering(aten.frexp.Tensor)
def frexp(self):
  # std::frexp: (mantissa in [0.5, 1), int32 exponent); 0, inf and nan keep exponent 0.
  # The mantissa's gradient is 2**-exponent, as torch's.
  mantissa, exponent = jnp.frexp(self)
  finite = jnp.isfinite(self)
  exponent = jnp.where(finite, exponent, 0).astype(jnp.int32)
  scale = jnp.ldexp(jnp.ones((), self.dtype), -exponent)
  scale = jnp.where(jnp.isfinite(scale), scale, jnp.zeros((), self.dtype))
  safe = jnp.where(finite, self, jnp.zeros((), self.dtype))
  linear = lax.stop_gradient(mantissa) + (safe - lax.stop_gradient(safe)) * scale
  # 0, inf and nan are their own mantissa: -0.0 keeps its sign (-0.0 + 0.0 above is 0.0), and
  # its gradient is 2**-0 = 1, as torch's
  return jnp.where(finite & (self != 0), linear, self), exponent


# torch's derivative: 1 for self (where finite), 0 for other. (As a derivative rule, not by
# adding `self - stop_gradient(self)`: -0.0 + 0.0 is 0.0, and nextafter(0, -0) is -0.0.)
_nextafter = with_derivative(
  jnp.nextafter,
  lambda out, p, t: jnp.where(jnp.isfinite(p[0]), t[0], jnp.zeros((), out.dtype)),
)


@lowering(aten.nextafter.default)
def nextafter(self, other):
  # In the result dtype itself (no float32 opmath: the next bfloat16 is not the next float32).
  _, result = result_dtypes(self, other)
  return _nextafter(*jnp.broadcast_arrays(_as(self, result), _as(other, result)))


def _gcd(a: jax.Array, b: jax.Array) -> jax.Array:
  # Euclid on absolute values, like torch's calc_gcd.
  a, b = jnp.broadcast_arrays(jnp.abs(a), jnp.abs(b))

  def cond(state):
    return jnp.any(state[0] != 0)

  def body(state):
    x, y = state
    nonzero = x != 0
    safe = jnp.where(nonzero, x, jnp.ones((), x.dtype))
    return jnp.where(nonzero, lax.rem(y, safe), x), jnp.where(nonzero, x, y)

  return while_loop(cond, body, (a, b))[1]


@lowering(aten.gcd.default)
@_integral("gcd_cpu")
@_promote("self", "other")
def gcd(self, other):
  return _gcd(self, other)


@lowering(aten.lcm.default)
@_integral("lcm_cpu")
@_promote("self", "other")
def lcm(self, other):
  # torch: g == 0 ? 0 : abs(a / g * b).
  a, b = jnp.broadcast_arrays(self, other)
  g = _gcd(a, b)
  safe = jnp.where(g == 0, jnp.ones((), g.dtype), g)
  return jnp.where(g == 0, jnp.zeros((), g.dtype), jnp.abs(lax.div(a, safe) * b))
