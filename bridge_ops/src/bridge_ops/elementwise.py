"""Elementwise lowerings: arithmetic, math functions, comparisons, logic, activations.

Semantics follow torch's CPU kernels, not NumPy/JAX, wherever the two differ:

* integer `div(rounding_mode="floor")`, `remainder` and `floor_divide` round
  towards -inf (Python), `fmod` and `div(rounding_mode="trunc")` towards zero;
  float floor division is torch's `div_floor_floating` (x / 0 stays x / 0, not nan);
* integer `pow` wraps like repeated squaring and gives torch's values for negative
  tensor exponents (1 -> 1, -1 -> +-1, anything else -> 0); a negative Scalar exponent
  raises torch's error, as does an integer division or remainder by zero (`check`: in eager
  mode; inside a JAX program XLA's quotient stands);
* `sign`/`sgn` of nan is 0; `heaviside(nan, v)` is 0; `xlogy(0, nan)` is nan;
* `clamp` propagates a nan bound, and with min > max gives max;
* `minimum`/`maximum` propagate nan, `fmin`/`fmax` ignore it; on a tie all four return
  their first argument, as torch's CPU kernels (so `maximum(-0.0, 0.0)` is -0.0, where XLA
  orders -0 < +0), and `relu`/`clamp` keep an input equal to a bound (`relu(-0.0)` is -0.0);
* shifts by a negative amount or >= the bit width give torch's values (0, or the
  sign fill for a right shift);
* a `Scalar` is cast to the computation dtype before use (so an out-of-range int
  wraps like torch's `uint8 == 300`), and the bounds of `threshold`/`hardtanh`
  are cast to the (opmath) dtype of `self`: truncated for integer tensors.

Reduced-precision floats (float16, bfloat16) are computed in float32, like
torch's opmath; the core casts results back to torch's result dtype.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bridge_ops._lowering import (aten, check, literal, lowering, promote, result_dtypes,
                                  torch_abs, torch_sign, while_loop, with_derivative,
                                  x_times_log)

__all__: list[str] = []

_SQRT1_2 = 0.70710678118654752440
_SQRT2 = 1.41421356237309504880
_2_SQRTPI = 1.12837916709551257390


# ----------------------------------------------------------------------------- helpers

def _as(value: Any, dtype: Any) -> jax.Array:
  """A Scalar (Python number or weakly typed 0-d value) or array, cast to `dtype`."""
  value = jnp.asarray(value)
  if value.dtype == jnp.bool_ and np.dtype(dtype) != np.dtype(jnp.bool_):
    # Through uint8: XLA rewrites `convert(bool) * x` as `select(bool, x, 0)`, which gives 0
    # where torch (IEEE) gives nan for `False * inf` or `False / 0`.
    value = value.astype(jnp.uint8)
  return value.astype(dtype)


def _is_one(alpha: Any) -> bool:
  """`alpha` is the literal 1 (the default; a traced scalar is never known to be)."""
  return literal(alpha) and alpha == 1


def _promoted(*values: Any, kind: str = "default") -> tuple[jax.Array, ...]:
  """`values` (arrays or Scalars) cast to torch's computation dtype for them."""
  compute, _ = result_dtypes(*values, kind=kind)
  return tuple(_as(v, compute) for v in values)


def _promote(*names: str, kind: str = "default") -> Callable[[Callable], Callable]:
  """Like `promote`, for ops with several inputs: every named argument, Scalars included,
  is cast to torch's computation dtype (with `_as`) before the lowering runs.

  torch casts a Python scalar to the operation's dtype, so an out-of-range int wraps
  (`uint8_tensor == 300` compares with 44) where JAX would refuse the literal.
  """
  def decorate(fn: Callable) -> Callable:
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
      bound = sig.bind(*args, **kwargs)
      present = [n for n in names if bound.arguments.get(n) is not None]
      for n, v in zip(present, _promoted(*(bound.arguments[n] for n in present), kind=kind)):
        bound.arguments[n] = v
      return fn(*bound.args, **bound.kwargs)
    return wrapper
  return decorate


def _inexact(x: jax.Array) -> bool:
  return jnp.issubdtype(x.dtype, jnp.inexact)


def _integer(x: jax.Array) -> bool:
  return jnp.issubdtype(x.dtype, jnp.integer)


def _truth(x: jax.Array) -> jax.Array:
  return x if x.dtype == jnp.bool_ else x != 0


def _isnan(x: jax.Array) -> jax.Array:
  return jnp.isnan(x) if _inexact(x) else jnp.zeros(jnp.shape(x), jnp.bool_)


def _div_floor(a: jax.Array, b: jax.Array) -> jax.Array:
  a, b = jnp.broadcast_arrays(a, b)  # lax.div/rem need equal shapes
  if _inexact(a):
    # A step function: torch's derivative of a rounded division is 0 (the steps' formula
    # below differentiates to inf/nan at b == 0).
    a, b = lax.stop_gradient(a), lax.stop_gradient(b)
    # c10::div_floor_floating (Python's float floordiv); x / 0 stays inf/nan.
    mod = lax.rem(a, b)
    div = (a - mod) / b
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floordiv = jnp.floor(div)
    floordiv = jnp.where(div - floordiv > 0.5, floordiv + 1, floordiv)
    floordiv = jnp.where(div == 0, jnp.copysign(jnp.zeros_like(div), a / b), floordiv)
    return jnp.where(b == 0, a / b, floordiv)
  quot, rem = lax.div(a, b), lax.rem(a, b)
  return jnp.where((rem != 0) & ((rem < 0) != (b < 0)), quot - 1, quot)


def _check_divisor(a: jax.Array, b: jax.Array) -> None:
  """torch's integer division (floor, trunc, remainder, fmod) by zero: RuntimeError."""
  if _integer(a):
    zero = jnp.broadcast_to(b == 0, jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b)))
    check(zero, None, RuntimeError, "ZeroDivisionError")


def _remainder_value(a: jax.Array, b: jax.Array) -> jax.Array:
  # fmod, then moved into the divisor's sign (torch's remainder, ints and floats alike).
  a, b = jnp.broadcast_arrays(a, b)
  mod = lax.rem(a, b)
  return jnp.where((mod != 0) & ((mod < 0) != (b < 0)), mod + b, mod)


# torch's derivative: da - db * floor(a / b), with torch's floor division (nan at a = inf)
_remainder_real = with_derivative(
    _remainder_value, lambda out, p, t: t[0] - t[1] * _div_floor(*p))


def _remainder(a: jax.Array, b: jax.Array) -> jax.Array:
  inexact = jnp.issubdtype(jnp.result_type(a, b), jnp.inexact)
  return _remainder_real(a, b) if inexact else _remainder_value(a, b)


def _int_pow(a: jax.Array, b: jax.Array) -> jax.Array:
  """torch's integer pow: wrapping repeated squaring; negative exponents as `c10::powi`."""
  a, b = jnp.broadcast_arrays(a, b)
  one = jnp.ones((), a.dtype)
  e = jnp.where(b < 0, jnp.zeros((), b.dtype), b)
  acc, base = jnp.ones_like(a), a
  for _ in range(jnp.iinfo(b.dtype).bits):
    acc = jnp.where((e & 1) != 0, acc * base, acc)
    base = base * base
    e = lax.shift_right_logical(e, jnp.ones((), e.dtype))
  if jnp.issubdtype(b.dtype, jnp.signedinteger):
    neg = jnp.where(a == 1, one, jnp.where(a == -1, jnp.where((b & 1) != 0, -one, one),
                                           jnp.zeros((), a.dtype)))
    acc = jnp.where(b < 0, neg, acc)
  return acc


def _pow(a: jax.Array, b: jax.Array) -> jax.Array:
  if _integer(a):
    return _int_pow(a, b)
  return jnp.power(a, b)


def _clamp(x: jax.Array, lo: jax.Array | None, hi: jax.Array | None) -> jax.Array:
  # torch._refs.clamp: a nan input stays nan, a nan bound gives nan, min > max gives max.
  # Gradients as torch's clamp_backward: 1 inside the bounds, at them included, 0 outside
  # and at a nan input (which passes through as a constant).
  nan_input, kept = _isnan(x), jax.lax.stop_gradient(x)
  if lo is not None:
    x = jnp.where((x >= lo) | _isnan(x), x, lo)
  if hi is not None:
    x = jnp.where((x <= hi) | _isnan(x), x, hi)
  return jnp.where(nan_input, kept, x)


def _nan_to_num_real(x: jax.Array, nan: float | None, posinf: float | None,
                     neginf: float | None) -> jax.Array:
  info = jnp.finfo(x.dtype)
  nan_v = jnp.asarray(0.0 if nan is None else nan, np.float64).astype(x.dtype)
  pos_v = jnp.asarray(info.max if posinf is None else posinf, np.float64).astype(x.dtype)
  neg_v = jnp.asarray(info.min if neginf is None else neginf, np.float64).astype(x.dtype)
  x = jnp.where(jnp.isnan(x), nan_v, x)
  x = jnp.where(x == jnp.inf, pos_v, x)
  return jnp.where(x == -jnp.inf, neg_v, x)


# torch's derivative, from the output: y (1 - y). Differentiating 1 / (1 + exp(-x)) gives
# inf / inf = nan once exp(-x) overflows (x < -89 in float32), where torch's is 0.
_sigmoid = with_derivative(lambda x: 1 / (1 + jnp.exp(-x)),
                           lambda out, x, t: t[0] * (1 - out) * out)


def _lshift(a: jax.Array, b: jax.Array) -> jax.Array:
  a, b = jnp.broadcast_arrays(a, b)
  bits = jnp.iinfo(a.dtype).bits
  out = lax.shift_left(a, b)
  return jnp.where((b < 0) | (b >= bits), jnp.zeros((), a.dtype), out)


def _rshift(a: jax.Array, b: jax.Array) -> jax.Array:
  a, b = jnp.broadcast_arrays(a, b)
  signed = jnp.issubdtype(a.dtype, jnp.signedinteger)
  max_shift = jnp.iinfo(a.dtype).bits - int(signed)
  b = jnp.where((b < 0) | (b >= max_shift), jnp.asarray(max_shift, b.dtype), b)
  # An unsigned shift by the full width gives 0, a signed one by width-1 the sign fill.
  return lax.shift_right_arithmetic(a, b) if signed else lax.shift_right_logical(a, b)


# ----------------------------------------------------------------------------- arithmetic

@lowering(aten.add.Tensor, aten.add.Scalar)
@_promote("self", "other")
def add(self, other, alpha=1):
  if _is_one(alpha):  # `x + y`: no multiply by a constant 1 in the program
    return self + other
  return self + other * _as(alpha, other.dtype)


@lowering(aten.sub.Tensor, aten.sub.Scalar)
@_promote("self", "other")
def sub(self, other, alpha=1):
  if _is_one(alpha):
    return self - other
  return self - other * _as(alpha, other.dtype)


@lowering(aten.rsub.Tensor, aten.rsub.Scalar)
@_promote("self", "other")
def rsub(self, other, alpha=1):
  if _is_one(alpha):
    return other - self
  return other - self * _as(alpha, self.dtype)


@lowering(aten.mul.Tensor, aten.mul.Scalar)
@_promote("self", "other")
def mul(self, other):
  return self * other


@lowering(aten.div.Tensor, aten.div.Scalar)
@_promote("self", "other", kind="int_to_float")
def div(self, other):
  return self / other


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(self, other, *, rounding_mode=None):
  if rounding_mode is None:
    return div(self, other)
  if rounding_mode == "trunc":
    _, result = result_dtypes(self, other)
    a, b = _promoted(self, other)
    if _inexact(a):
      # torch rounds the quotient to the result dtype before truncating: in bfloat16,
      # -100 / -0.8789 = 113.78 rounds to 114 first. A step function: derivative 0.
      return lax.stop_gradient(jnp.trunc((a / b).astype(result)))
    _check_divisor(a, b)
    return lax.div(*jnp.broadcast_arrays(a, b))  # C division: rounds towards zero
  if rounding_mode == "floor":
    return floor_divide(self, other)
  raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' "
                   f"but found {rounding_mode!r}")


@lowering(aten.floor_divide.default, aten.floor_divide.Scalar)
@_promote("self", "other")
def floor_divide(self, other):
  _check_divisor(self, other)
  return _div_floor(self, other)


@lowering(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
@_promote("self", "other")
def remainder(self, other):
  _check_divisor(self, other)
  return _remainder(self, other)


@lowering(aten.fmod.Tensor, aten.fmod.Scalar)
@_promote("self", "other")
def fmod(self, other):
  _check_divisor(self, other)
  return lax.rem(*jnp.broadcast_arrays(self, other))


@lowering(aten.neg.default)
def neg(self):
  return -self


@lowering(aten.abs.default)
def abs(self):  # noqa: A001 - named after the op
  return self if self.dtype == jnp.bool_ else torch_abs(self)  # (derivative 0 at 0)


@lowering(aten.sign.default)
@promote("self")
def sign(self):
  if self.dtype == jnp.bool_:
    return self
  return torch_sign(self)  # nan -> 0 (jnp.sign gives nan)


@lowering(aten.sgn.default)
@promote("self")
def sgn(self):
  if jnp.issubdtype(self.dtype, jnp.complexfloating):
    mag = jnp.abs(self)
    safe = jnp.where(mag == 0, jnp.ones_like(mag), mag)
    return jnp.where(mag == 0, jnp.zeros_like(self), self / safe.astype(self.dtype))
  return sign(self)


def _pow_tangent(out, primals, tangents):
  # torch's pow_backward_self / pow_backward_exponent: no gradient through a 0 exponent, and
  # none to the exponent where the base is 0 and the exponent >= 0 (x ** x at 0 has
  # derivative 0 in torch, nan by JAX's rule).
  (x, y), (tx, ty) = primals, tangents
  zero = jnp.zeros((), out.dtype)
  d_x = jnp.where(y == 0, zero, y * jnp.power(x, y - 1))
  d_y = jnp.where((x == 0) & (y >= 0), zero, out * jnp.log(x))
  return d_x * tx + d_y * ty


_real_pow = with_derivative(jnp.power, _pow_tangent)


@lowering(aten.pow.Tensor_Tensor)
@_promote("self", "exponent")
def pow(self, exponent):  # noqa: A001 - named after the op
  if jnp.issubdtype(self.dtype, jnp.floating):
    self, exponent = jnp.broadcast_arrays(self, exponent)
    return _real_pow(self, exponent)
  return _pow(self, exponent)


def _scalar(x: Any) -> bool:
  """A Scalar argument: a Python number or a weakly typed 0-d value (a traced number)."""
  return not hasattr(x, "dtype") or (np.ndim(x) == 0 and getattr(
      getattr(x, "aval", x), "weak_type", False))


def _check_int_power(fn: Callable) -> Callable:
  """torch: an integral tensor to a negative integral Scalar power raises (before promotion,
  which wraps -1 into 255 for uint8). `pow_` with a Scalar runs `pow.Scalar` with the tensor
  as `self`, so both overloads check."""
  @functools.wraps(fn)
  def wrapper(self: Any, exponent: Any) -> Any:
    if (not _scalar(self) and _scalar(exponent) and _integral_kind(self)
        and _integral_kind(exponent)):
      check(jnp.asarray(exponent) < 0, None, RuntimeError,
            "Integers to negative integer powers are not allowed.")
    return fn(self, exponent)
  return wrapper


def _integral_kind(x: Any) -> bool:
  return np.dtype(getattr(x, "dtype", type(x))).kind in "biu"


@lowering(aten.pow.Tensor_Scalar)
@_check_int_power
@_promote("self", "exponent")
def pow_tensor_scalar(self, exponent):
  if not _inexact(self):
    return _pow(self, exponent)
  # torch computes exponent 0.5 / -0.5 with sqrt / rsqrt: differs from pow at -inf.
  # (the branches not taken get a harmless input, so their gradients cannot be nan: sqrt's
  # derivative at 0 is inf, as torch's, not 0 * inf)
  half, neg_half = exponent == 0.5, exponent == -0.5
  out = _pow(jnp.where(half | neg_half, 1, self), exponent)
  out = jnp.where(half, jnp.sqrt(jnp.where(half, self, 1)), out)
  return jnp.where(neg_half, lax.rsqrt(jnp.where(neg_half, self, 1)), out)


@lowering(aten.pow.Scalar)
@_check_int_power
@_promote("self", "exponent")
def pow_scalar(self, exponent):
  # torch: a base equal to 1 gives ones (pow(1, nan) = 1 too, so no special case).
  return _pow(self, exponent)


@lowering(aten.reciprocal.default)
@promote("self", kind="int_to_float")
def reciprocal(self):
  return 1 / self


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
def round(self):  # noqa: A001 - named after the op
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


# ----------------------------------------------------------------------------- clamp, min/max

@lowering(aten.clamp.default, aten.clamp.Tensor)
@_promote("self", "min", "max")
def clamp(self, min=None, max=None):  # noqa: A002 - schema names
  return _clamp(self, min, max)


@lowering(aten.clamp_min.default, aten.clamp_min.Tensor)
@_promote("self", "min")
def clamp_min(self, min):  # noqa: A002
  return _clamp(self, min, None)


@lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
@_promote("self", "max")
def clamp_max(self, max):  # noqa: A002
  return _clamp(self, None, max)


def _first_on_tie(extreme: Callable) -> Callable:
  """`extreme` (jnp.maximum/minimum: NaN-propagating) returning its first argument on a tie,
  as torch's CPU loop (-0.0 and 0.0 are a tie), with `extreme`'s derivative (half to each
  argument on a tie, as torch's)."""
  return with_derivative(lambda a, b: jnp.where(a == b, a, extreme(a, b)),
                         lambda out, p, t: jax.jvp(extreme, p, t)[1])


_float_minimum = _first_on_tie(jnp.minimum)
_float_maximum = _first_on_tie(jnp.maximum)


@lowering(aten.minimum.default)
@_promote("self", "other")
def minimum(self, other):
  if not _inexact(self) or jnp.iscomplexobj(self):
    return jnp.minimum(self, other)
  return _float_minimum(*jnp.broadcast_arrays(self, other))  # nan-propagating, like torch


@lowering(aten.maximum.default)
@_promote("self", "other")
def maximum(self, other):
  if not _inexact(self) or jnp.iscomplexobj(self):
    return jnp.maximum(self, other)
  return _float_maximum(*jnp.broadcast_arrays(self, other))


@lowering(aten.fmin.default)
@_promote("self", "other")
def fmin(self, other):
  if not _inexact(self):
    return jnp.minimum(self, other)
  # std::fmin: the non-nan operand wins.
  return jnp.where(jnp.isnan(other) | (self <= other), self, other)


@lowering(aten.fmax.default)
@_promote("self", "other")
def fmax(self, other):
  if not _inexact(self):
    return jnp.maximum(self, other)
  return jnp.where(jnp.isnan(other) | (self >= other), self, other)  # std::fmax


# ----------------------------------------------------------------------------- ternary

@lowering(aten.lerp.Scalar, aten.lerp.Tensor)
@_promote("self", "end", "weight")
def lerp(self, end, weight):
  diff = end - self
  return jnp.where(jnp.abs(weight) < 0.5, self + weight * diff, end - diff * (1 - weight))


@lowering(aten.addcmul.default)
@_promote("self", "tensor1", "tensor2")
def addcmul(self, tensor1, tensor2, *, value=1):
  return self + _as(value, self.dtype) * tensor1 * tensor2


@lowering(aten.addcdiv.default)
@_promote("self", "tensor1", "tensor2")
def addcdiv(self, tensor1, tensor2, *, value=1):
  return self + _as(value, self.dtype) * tensor1 / tensor2


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
@_promote("self", "other")
def where(condition, self, other):
  return jnp.where(_truth(condition), self, other)


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(self, mask, value):
  # The value is cast to self's dtype (a float into an int tensor truncates, like torch).
  return jnp.where(_truth(mask), _as(value, self.dtype), self)


# ----------------------------------------------------------------------------- comparisons

@lowering(aten.eq.Tensor, aten.eq.Scalar)
@_promote("self", "other", kind="always_bool")
def eq(self, other):
  return self == other


@lowering(aten.ne.Tensor, aten.ne.Scalar)
@_promote("self", "other", kind="always_bool")
def ne(self, other):
  return self != other


@lowering(aten.lt.Tensor, aten.lt.Scalar)
@_promote("self", "other", kind="always_bool")
def lt(self, other):
  return self < other


@lowering(aten.le.Tensor, aten.le.Scalar)
@_promote("self", "other", kind="always_bool")
def le(self, other):
  return self <= other


@lowering(aten.gt.Tensor, aten.gt.Scalar)
@_promote("self", "other", kind="always_bool")
def gt(self, other):
  return self > other


@lowering(aten.ge.Tensor, aten.ge.Scalar)
@_promote("self", "other", kind="always_bool")
def ge(self, other):
  return self >= other


@lowering(aten.logical_and.default)
def logical_and(self, other):
  return _truth(self) & _truth(other)


@lowering(aten.logical_or.default)
def logical_or(self, other):
  return _truth(self) | _truth(other)


@lowering(aten.logical_xor.default)
def logical_xor(self, other):
  return _truth(self) ^ _truth(other)


@lowering(aten.logical_not.default)
def logical_not(self):
  return ~_truth(self)


@lowering(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.bitwise_and.Scalar_Tensor)
@_promote("self", "other")
def bitwise_and(self, other):
  return self & other


@lowering(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.bitwise_or.Scalar_Tensor)
@_promote("self", "other")
def bitwise_or(self, other):
  return self | other


@lowering(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.bitwise_xor.Scalar_Tensor)
@_promote("self", "other")
def bitwise_xor(self, other):
  return self ^ other


@lowering(aten.bitwise_not.default)
def bitwise_not(self):
  return ~self


@lowering(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
          aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar)
@_promote("self", "other")
def bitwise_left_shift(self, other):
  return _lshift(self, other)


@lowering(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
          aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar)
@_promote("self", "other")
def bitwise_right_shift(self, other):
  return _rshift(self, other)


@lowering(aten.isnan.default)
def isnan(self):
  return _isnan(self)


@lowering(aten.isinf.default)
def isinf(self):
  return jnp.isinf(self) if _inexact(self) else jnp.zeros(self.shape, jnp.bool_)


@lowering(aten.isfinite.default)
def isfinite(self):
  return jnp.isfinite(self) if _inexact(self) else jnp.ones(self.shape, jnp.bool_)


@lowering(aten.isposinf.default)
def isposinf(self):
  return self == jnp.inf if _inexact(self) else jnp.zeros(self.shape, jnp.bool_)


@lowering(aten.isneginf.default)
def isneginf(self):
  return self == -jnp.inf if _inexact(self) else jnp.zeros(self.shape, jnp.bool_)


@lowering(aten.nan_to_num.default)
def nan_to_num(self, nan=None, posinf=None, neginf=None):
  if jnp.issubdtype(self.dtype, jnp.complexfloating):
    return lax.complex(_nan_to_num_real(jnp.real(self), nan, posinf, neginf),
                       _nan_to_num_real(jnp.imag(self), nan, posinf, neginf))
  if not _inexact(self):
    return self
  return _nan_to_num_real(self, nan, posinf, neginf)


@lowering(aten.copysign.Tensor, aten.copysign.Scalar)
@_promote("self", "other", kind="int_to_float")
def copysign(self, other):
  return _copysign(self, other)


def _copysign_tangent(out, primals, tangents):
  x = primals[0]  # torch: d/dx = out / x, 0 at x = 0 (JAX's rule gives the sign there)
  return tangents[0] * jnp.where(x == 0, jnp.zeros((), out.dtype),
                                 out / jnp.where(x == 0, jnp.ones((), x.dtype), x))


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


# ----------------------------------------------------------------------------- activations

@lowering(aten.relu.default)
def relu(self):
  # As torch: relu(nan) = nan; the derivative is 0 where x <= 0 (at exactly 0 too: that of a
  # bare `maximum(x, 0)` there is 0.5) and 1 elsewhere, NaN included (torch's
  # threshold_backward passes the gradient where the result is not <= 0). An input of 0
  # stays itself (relu(-0.0) is -0.0, torch's clamp_min).
  zeroed = jnp.where(self < 0, jnp.zeros((), self.dtype), self)
  return jnp.where(self <= 0, jax.lax.stop_gradient(zeroed), self)


@lowering(aten.gelu.default)
@promote("self")
def gelu(self, *, approximate="none"):
  if approximate == "tanh":
    inner = (_SQRT2 * _2_SQRTPI * 0.5) * (self + 0.044715 * (self * self * self))
    return 0.5 * self * (1 + jnp.tanh(inner))
  return self * 0.5 * (1 + lax.erf(self * _SQRT1_2))


@lowering(aten.silu.default)
@promote("self")
def silu(self):
  return _silu(self)


def _silu_grad(grad_output, self):
  s = _sigmoid(self)
  return grad_output * s * (1 + self * (1 - s))


# (torch's backward formula: finite where exp(-x) overflows)
_silu = with_derivative(lambda x: x / (1 + jnp.exp(-x)), lambda out, x, t: _silu_grad(t[0], x[0]))


@lowering(aten.hardtanh.default)
@promote("self")
def hardtanh(self, min_val=-1, max_val=1):
  # Bounds in self's (opmath) dtype: truncated for an integer tensor, like torch. Unlike
  # clamp's, torch's hardtanh_backward passes no gradient at the bounds themselves (and
  # passes it at a nan input): the clamped value, with the gradient only strictly inside.
  lo, hi = _as(min_val, self.dtype), _as(max_val, self.dtype)
  inside = ((self > lo) & (self < hi)) | _isnan(self)
  return jnp.where(inside, self, jax.lax.stop_gradient(_clamp(self, lo, hi)))


@lowering(aten.leaky_relu.default)
@promote("self")
def leaky_relu(self, negative_slope=0.01):
  return jnp.where(self > 0, self, self * _as(negative_slope, self.dtype))


@lowering(aten.elu.default)
@promote("self")
def elu(self, alpha=1, scale=1, input_scale=1):
  negcoef = _as(alpha, self.dtype) * _as(scale, self.dtype)
  # The branch not taken sees 0: expm1 of a large positive input is inf, and its derivative
  # times the zero cotangent of the unused branch would be nan.
  neg_in = jnp.where(self <= 0, self, jnp.zeros((), self.dtype))
  neg = jnp.expm1(neg_in * _as(input_scale, self.dtype)) * negcoef
  return jnp.where(self <= 0, neg, self * _as(scale, self.dtype))


@lowering(aten.celu.default)
@promote("self")
def celu(self, alpha=1.0):
  """torch computes celu as elu(x, alpha, 1, 1 / alpha); torch's decomposition (a `where`
  over expm1) would give a nan gradient for a large input."""
  return elu(self, alpha, 1, 1 / alpha)  # (1 / alpha in double, as torch's Scalar)


@lowering(aten.softplus.default)
@promote("self")
def softplus(self, beta=1, threshold=20):
  beta = _as(beta, self.dtype)
  scaled = self * beta
  linear = scaled > _as(threshold, self.dtype)
  # (the branch not taken sees 0: see `elu`)
  safe = jnp.where(linear, jnp.zeros((), scaled.dtype), scaled)
  return jnp.where(linear, self, jnp.log1p(jnp.exp(safe)) / beta)


# Their derivatives are torch's backward formulas (`hardsigmoid_backward`,
# `hardswish_backward` below): 0 at x = -3 and 3 for hardsigmoid, where clip's rule gives 1/12.
_hardsigmoid = with_derivative(
    lambda x: jnp.minimum(jnp.maximum(x + 3, 0), 6) / 6,
    lambda out, x, t: _hardsigmoid_grad(t[0], x[0]))
_hardswish = with_derivative(
    lambda x: x * jnp.minimum(jnp.maximum(x + 3, 0), 6) / 6,
    lambda out, x, t: _hardswish_grad(t[0], x[0]))


@lowering(aten.hardsigmoid.default)
@promote("self")
def hardsigmoid(self):
  return _hardsigmoid(self)


@lowering(aten.hardswish.default)
@promote("self")
def hardswish(self):
  return _hardswish(self)


@lowering(aten.mish.default)
@promote("self")
def mish(self):
  return _mish(self)


# (torch's backward formula: finite where exp(x) overflows)
_mish = with_derivative(lambda x: x * jnp.tanh(jnp.log1p(jnp.exp(x))),
                        lambda out, x, t: _mish_grad(t[0], x[0]))


@lowering(aten.threshold.default)
@promote("self")
def threshold(self, threshold, value):
  # threshold/value in self's (opmath) dtype: truncated for an integer tensor, like torch.
  return jnp.where(self <= _as(threshold, self.dtype), _as(value, self.dtype), self)


# ----------------------------------------------------------------------------- backward ops

@lowering(aten.threshold_backward.default)
@promote("grad_output", "self")
def threshold_backward(grad_output, self, threshold):
  return jnp.where(self <= _as(threshold, self.dtype), jnp.zeros((), grad_output.dtype),
                   grad_output)


@lowering(aten.gelu_backward.default)
@promote("grad_output", "self")
def gelu_backward(grad_output, self, *, approximate="none"):
  if approximate == "tanh":
    beta = _SQRT2 * _2_SQRTPI * 0.5
    kappa = 0.044715
    x_sq = self * self
    tanh_inner = jnp.tanh(beta * (self + kappa * (x_sq * self)))
    left = 0.5 * self
    right = 1 + tanh_inner
    right_derivative = left * (1 - tanh_inner * tanh_inner) * (beta * (1 + 3 * kappa * x_sq))
    return grad_output * (0.5 * right + right_derivative)
  cdf = 0.5 * (1 + lax.erf(self * _SQRT1_2))
  pdf = (_2_SQRTPI * _SQRT1_2 * 0.5) * jnp.exp(self * self * -0.5)
  return grad_output * (cdf + self * pdf)


@lowering(aten.silu_backward.default)
@promote("grad_output", "self")
def silu_backward(grad_output, self):
  return _silu_grad(grad_output, self)


@lowering(aten.sigmoid_backward.default)
@promote("grad_output", "output")
def sigmoid_backward(grad_output, output):
  return grad_output * (1 - output) * output


@lowering(aten.tanh_backward.default)
@promote("grad_output", "output")
def tanh_backward(grad_output, output):
  return grad_output * (1 - output * output)


@lowering(aten.hardtanh_backward.default)
@promote("grad_output", "self")
def hardtanh_backward(grad_output, self, min_val, max_val):
  # Where torch's own scalar and vectorized CPU paths differ (a nan input), follow the
  # vectorized one, which runs on all but a tensor's tail: here nan -> 0.
  inside = (self > _as(min_val, self.dtype)) & (self < _as(max_val, self.dtype))
  return jnp.where(inside, grad_output, jnp.zeros((), grad_output.dtype))


@lowering(aten.leaky_relu_backward.default)
@promote("grad_output", "self")
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
  return jnp.where(self > 0, grad_output, grad_output * _as(negative_slope, grad_output.dtype))


@lowering(aten.elu_backward.default)
@promote("grad_output", "self_or_result")
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
  dt = grad_output.dtype
  negcoef = _as(alpha, dt) * _as(scale, dt)
  negiptcoef = _as(input_scale, dt)
  if is_result:
    neg = grad_output * negiptcoef * (self_or_result + negcoef)
  else:
    neg = grad_output * negiptcoef * negcoef * jnp.exp(self_or_result * negiptcoef)
  # nan input -> nan, like torch's vectorized path (its scalar path gives the positive side).
  return jnp.where(self_or_result > 0, grad_output * _as(scale, dt), neg)


@lowering(aten.softplus_backward.default)
@promote("grad_output", "self")
def softplus_backward(grad_output, self, beta, threshold):
  scaled = self * _as(beta, self.dtype)
  z = jnp.exp(scaled)
  return jnp.where(scaled > _as(threshold, self.dtype), grad_output, grad_output * z / (z + 1))


def _hardsigmoid_grad(grad_output, self):
  return jnp.where((self > -3) & (self < 3), grad_output / 6, jnp.zeros((), grad_output.dtype))


def _hardswish_grad(grad_output, self):
  # nan input -> nan, like torch's vectorized path (its scalar path and the decomposition
  # give grad_output).
  return jnp.where(self <= -3, jnp.zeros((), grad_output.dtype),
                   jnp.where(self >= 3, grad_output, grad_output * (self / 3 + 0.5)))


@lowering(aten.hardsigmoid_backward.default)
@promote("grad_output", "self")
def hardsigmoid_backward(grad_output, self):
  return _hardsigmoid_grad(grad_output, self)


@lowering(aten.hardswish_backward.default)
@promote("grad_output", "self")
def hardswish_backward(grad_output, self):
  return _hardswish_grad(grad_output, self)


@lowering(aten.mish_backward.default)
@promote("grad_output", "self")
def mish_backward(grad_output, self):
  return _mish_grad(grad_output, self)


def _mish_grad(grad_output, self):
  tanh_sp = jnp.tanh(jnp.log1p(jnp.exp(self)))
  out = self * _sigmoid(self) * (1 - tanh_sp * tanh_sp)
  return grad_output * (tanh_sp + out)


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
    general = jnp.log1p(jnp.exp(jnp.where(both_inf, jnp.zeros((), x.dtype), lo) - finite_hi)) \
        + finite_hi
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
        f"tensor of shape {tuple(x.shape)}.")


@lowering(aten.complex.default)
def complex(real, imag):  # noqa: A001 - named after the op
  _no_complex32("complex", real)
  real, imag = jnp.broadcast_arrays(real, imag)
  return lax.complex(real, imag)


@lowering(aten.polar.default)
def polar(abs, angle):  # noqa: A002 - schema names
  _no_complex32("polar", abs)
  return lax.complex(*jnp.broadcast_arrays(abs * jnp.cos(angle), abs * jnp.sin(angle)))


@lowering(aten._conj_physical.default, aten.conj_physical.default)
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
  return jnp.where(finite, linear, self), exponent


@lowering(aten.nextafter.default)
def nextafter(self, other):
  # In the result dtype itself (no float32 opmath: the next bfloat16 is not the next float32).
  # torch's derivative: 1 for self, 0 for other.
  _, result = result_dtypes(self, other)
  self, other = _as(self, result), _as(other, result)
  out = jnp.nextafter(lax.stop_gradient(self), lax.stop_gradient(other))
  safe = jnp.where(jnp.isfinite(self), self, jnp.zeros((), self.dtype))
  return out + (safe - lax.stop_gradient(safe))


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
@_promote("self", "other")
def gcd(self, other):
  return _gcd(self, other)


@lowering(aten.lcm.default)
@_promote("self", "other")
def lcm(self, other):
  # torch: g == 0 ? 0 : abs(a / g * b).
  a, b = jnp.broadcast_arrays(self, other)
  g = _gcd(a, b)
  safe = jnp.where(g == 0, jnp.ones((), g.dtype), g)
  return jnp.where(g == 0, jnp.zeros((), g.dtype), jnp.abs(lax.div(a, safe) * b))


# ----------------------------------------------------------------------------- whole-tensor tests

@lowering(aten.equal.default, dynamic_shape=True)
def equal(self, other):
  # torch.equal: same shape and the same elements (nan is not equal to itself). The result is
  # a Python `bool`, which depends on the values: eager only (under jit, TracedValueError).
  if self.shape != other.shape:
    return jnp.zeros((), jnp.bool_)
  a, b = _promoted(self, other)
  return jnp.all(a == b)


@lowering(aten.allclose.default, dynamic_shape=True)
def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
  # torch.isclose's rule, reduced with all(): equal values (infinities included) are close,
  # finite ones when |a - b| <= atol + rtol * |b|, nans only with equal_nan.
  a, b = _promoted(self, other)
  close = a == b
  if equal_nan and _inexact(a):
    close = close | (jnp.isnan(a) & jnp.isnan(b))
  if _inexact(a):
    diff = jnp.abs(a - b)
    tol = _as(atol, diff.dtype) + _as(rtol, diff.dtype) * jnp.abs(b)
    close = close | (jnp.isfinite(diff) & (diff <= tol))
  else:
    diff = jnp.abs(a.astype(jnp.float64) - b.astype(jnp.float64))
    close = close | (diff <= _as(atol, jnp.float64) + _as(rtol, jnp.float64) * jnp.abs(
        b.astype(jnp.float64)))
  return jnp.all(close)


@lowering(aten.hash_tensor.default)
def hash_tensor(self, dim=(), *, keepdim=False, mode=0):
  # torch: elements widened to their 64-bit float/integer type, bit-cast to uint64, reduced
  # with xor (mode 0, the only one).
  if mode != 0:
    raise ValueError(f"`torch.hash_tensor`: only mode=0 (xor reduction) exists, got {mode}")
  if _inexact(self):
    bits = lax.bitcast_convert_type(self.astype(jnp.float64), jnp.uint64)
  elif jnp.issubdtype(self.dtype, jnp.unsignedinteger):
    bits = self.astype(jnp.uint64)
  else:
    bits = lax.bitcast_convert_type(self.astype(jnp.int64), jnp.uint64)
  if self.ndim == 0:
    return bits  # a 0-d tensor's dim 0 / -1 reduces nothing
  dims = tuple(d % self.ndim for d in dim) if dim else tuple(range(self.ndim))
  out = lax.reduce(bits, jnp.zeros((), jnp.uint64), lax.bitwise_xor, dims)
  if keepdim:
    out = jnp.expand_dims(out, dims)
  return out
