"""Elementwise arithmetic: add/sub/mul/div and their rounding modes, remainder, abs, sign,
pow, clamp, minimum/maximum, and the ternary ops (lerp, addcmul, addcdiv, where).

Semantics follow torch's CPU kernels, not NumPy/JAX, wherever the two differ:

* integer `div(rounding_mode="floor")`, `remainder` and `floor_divide` round
  towards -inf (Python), `fmod` and `div(rounding_mode="trunc")` towards zero;
  float floor division is torch's `div_floor_floating` (x / 0 stays x / 0, not nan);
* integer `pow` wraps like repeated squaring and gives torch's values for negative
  tensor exponents (1 -> 1, -1 -> +-1, anything else -> 0); a negative Scalar exponent
  raises torch's error, as does an integer division or remainder by zero (`check`: in eager
  mode; inside a JAX program XLA's quotient stands);
* `sign`/`sgn` of nan is 0;
* `clamp` propagates a nan bound, and with min > max gives max;
* `minimum`/`maximum` propagate nan, `fmin`/`fmax` ignore it; on a tie all four return
  their first argument, as torch's CPU kernels (so `maximum(-0.0, 0.0)` is -0.0, where XLA
  orders -0 < +0), and `clamp` keeps an input equal to a bound.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bridge_ops._lowering import (
  aten,
  check,
  lowering,
  promote,
  result_dtypes,
  torch_abs,
  torch_sign,
  with_derivative,
)
from bridge_ops._special import prims
from bridge_ops._elementwise import (
  _as,
  _check_divisor,
  _clamp,
  _div_floor,
  _inexact,
  _is_one,
  _pow,
  _promote,
  _promoted,
  _remainder,
  _single,
  _truth,
)

__all__: list[str] = []


# ----------------------------------------------------------------------------- arithmetic


def _times_alpha(x, alpha):
  """`x * alpha`, in `x`'s dtype; `x` itself for the default alpha of 1 (no multiply by a
  constant 1 in the program)."""
  return x if _is_one(alpha) else x * _as(alpha, x.dtype)


@lowering(aten.add.Tensor, aten.add.Scalar)
@_promote("self", "other", scalars=("alpha",))
def add(self, other, alpha=1):
  return self + _times_alpha(other, alpha)


@lowering(aten.sub.Tensor, aten.sub.Scalar)
@_promote("self", "other", scalars=("alpha",))
def sub(self, other, alpha=1):
  return self - _times_alpha(other, alpha)


@lowering(aten.rsub.Tensor, aten.rsub.Scalar)
@_promote("self", "other", scalars=("alpha",))
def rsub(self, other, alpha=1):
  return other - _times_alpha(self, alpha)


@lowering(aten.mul.Tensor, aten.mul.Scalar)
@_promote("self", "other", exact="other")
def mul(self, other):
  return self * other


@lowering(aten.div.Tensor, aten.div.Scalar)
@_promote("self", "other", kind="int_to_float", exact="other")
def div(self, other):
  return self / other


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(self, other, *, rounding_mode=None):
  if rounding_mode is None:
    return div(self, other)
  if rounding_mode == "trunc":
    _, result = result_dtypes(self, other)
    single = _single(other)
    a, b = _promoted(self, other, exact=(False, single))
    if _inexact(a):
      # torch rounds the quotient to the result dtype before truncating: in bfloat16,
      # -100 / -0.8789 = 113.78 rounds to 114 first; but a single divisor it reads
      # unrounded, and truncates the float32 quotient. A step function: derivative 0.
      quotient = a / b if single else (a / b).astype(result)
      return lax.stop_gradient(jnp.trunc(quotient))
    _check_divisor(a, b)
    return lax.div(*jnp.broadcast_arrays(a, b))  # C division: rounds towards zero
  if rounding_mode == "floor":
    return floor_divide(self, other)
  raise ValueError(
    f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found {rounding_mode!r}"
  )


@lowering(aten.floor_divide.default, aten.floor_divide.Scalar)
@_promote("self", "other", exact="other")
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
def abs(self):  # (named after the op)
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
def pow(self, exponent):  # (named after the op)
  if jnp.issubdtype(self.dtype, jnp.floating):
    self, exponent = jnp.broadcast_arrays(self, exponent)
    return _real_pow(self, exponent)
  return _pow(self, exponent)


def _scalar(x: Any) -> bool:
  """A Scalar argument: a Python number or a weakly typed 0-d value (a traced number)."""
  return not hasattr(x, "dtype") or (
    np.ndim(x) == 0 and getattr(getattr(x, "aval", x), "weak_type", False)
  )


def _check_int_power(fn: Callable) -> Callable:
  """torch: an integral tensor to a negative integral Scalar power raises (before promotion,
  which wraps -1 into 255 for uint8). `pow_` with a Scalar runs `pow.Scalar` with the tensor
  as `self`, so both overloads check. A uint16/32/64 tensor has no CPU kernel for `pow`: only
  an exponent of 0 or 1 (a Scalar base of 1), which torch answers without one, is computed."""

  @functools.wraps(fn)
  def wrapper(self: Any, exponent: Any) -> Any:
    if (
      not _scalar(self) and _scalar(exponent) and _integral_kind(self) and _integral_kind(exponent)
    ):
      check(
        jnp.asarray(exponent) < 0,
        None,
        RuntimeError,
        "Integers to negative integer powers are not allowed.",
      )
      _check_unsigned_power(self, jnp.asarray(exponent) > 1)
    elif _scalar(self) and not _scalar(exponent) and _integral_kind(self):
      _check_unsigned_power(exponent, jnp.asarray(self) != 1)
    return fn(self, exponent)

  return wrapper


# torch's names of the unsigned dtypes it has no `pow` kernel for
_NO_UNSIGNED_KERNEL = {
  np.dtype("uint16"): "UInt16",
  np.dtype("uint32"): "UInt32",
  np.dtype("uint64"): "UInt64",
}


def _check_unsigned_power(tensor: Any, computed: Any) -> None:
  """torch's error for `pow` of a uint16/32/64 tensor where its kernel would compute."""
  name = _NO_UNSIGNED_KERNEL.get(np.dtype(tensor.dtype))
  if name is not None:
    check(computed, None, NotImplementedError, f"\"pow\" not implemented for '{name}'")


def _integral_kind(x: Any) -> bool:
  return np.dtype(getattr(x, "dtype", type(x))).kind in "biu"


@lowering(aten.pow.Tensor_Scalar)
@_check_int_power
def pow_tensor_scalar(self, exponent):
  # torch computes exponent 0.5 / -0.5 with sqrt / rsqrt (differs from pow at -inf and -0),
  # but not for float16, whose kernel calls std::pow.
  return _pow_tensor_scalar(self, exponent, roots=self.dtype != jnp.float16)


def _pow_base_tangent(out, primals, tangents):
  # (a Scalar exponent is a constant: the base's term of `_pow_tangent` alone; the exponent's
  # term, its zero tangent times log of a negative base, would be nan)
  (x, y), (tx, _) = primals, tangents
  return jnp.where(y == 0, jnp.zeros((), out.dtype), y * jnp.power(x, y - 1)) * tx


_scalar_pow = with_derivative(jnp.power, _pow_base_tangent)


def _float_pow(base, exponent):
  """`base ** exponent` for a Scalar exponent, with torch's derivative where the base is real
  floating (none through an exponent of 0, at a base of 0 too, where JAX's is nan)."""
  if jnp.issubdtype(base.dtype, jnp.floating):
    return _scalar_pow(*jnp.broadcast_arrays(base, jnp.asarray(exponent, base.dtype)))
  return _pow(base, exponent)


@_promote("self", "exponent")
def _pow_tensor_scalar(self, exponent, roots):
  if not _inexact(self) or not roots:
    return _float_pow(self, exponent)
  # (the branches not taken get a harmless input, so their gradients cannot be nan: sqrt's
  # derivative at 0 is inf, as torch's, not 0 * inf)
  half, neg_half = exponent == 0.5, exponent == -0.5
  out = _float_pow(jnp.where(half | neg_half, 1, self), exponent)
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


# ----------------------------------------------------------------------------- clamp, min/max


@lowering(aten.clamp.default, aten.clamp.Tensor)
@_promote("self", "min", "max")
def clamp(self, min=None, max=None):  # (schema names)
  return _clamp(self, min, max)


@lowering(aten.clamp_min.default, aten.clamp_min.Tensor)
@_promote("self", "min")
def clamp_min(self, min):
  return _clamp(self, min, None)


@lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
@_promote("self", "max")
def clamp_max(self, max):
  return _clamp(self, None, max)


def _first_on_tie(extreme: Callable) -> Callable:
  """`extreme` (jnp.maximum/minimum: NaN-propagating) returning its first argument on a tie,
  as torch's CPU loop (-0.0 and 0.0 are a tie), with `extreme`'s derivative (half to each
  argument on a tie, as torch's)."""
  return with_derivative(
    lambda a, b: jnp.where(a == b, a, extreme(a, b)), lambda out, p, t: jax.jvp(extreme, p, t)[1]
  )


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


@lowering(aten.lerp.Tensor)
@_promote("self", "end", "weight")
def lerp(self, end, weight):
  diff = end - self
  return jnp.where(jnp.abs(weight) < 0.5, self + weight * diff, end - diff * (1 - weight))


@lowering(aten.lerp.Scalar)
@_promote("self", "end", "weight", exact="weight")
def lerp_scalar(self, end, weight):
  """`lerp` with a Scalar weight, which torch's kernel reads unrounded (in float32 for
  float16/bfloat16 tensors; a 0-d tensor weight is rounded to their dtype)."""
  return lerp(self, end, weight)


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


@lowering(prims.fma.default)
def fma(a, b, c):
  """`a * b + c` (torch's `lerp` decomposition, in a compiled optimizer step); XLA contracts it
  to one fused multiply-add where the CPU has one, as torch's kernel."""
  return a * b + c
