"""Elementwise comparisons, logic and bitwise ops (shifts included), the isnan family,
nan_to_num, and the whole-tensor tests (equal, allclose, hash_tensor).

Shifts by a negative amount or >= the bit width give torch's values (0, or the sign fill
for a right shift).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax.numpy as jnp
from jax import lax

from bridge_ops._lowering import aten, lowering, result_dtypes, scalar_type_name
from bridge_ops._elementwise import (
  _as,
  _inexact,
  _isnan,
  _lshift,
  _nan_to_num_real,
  _promote,
  _promoted,
  _rshift,
  _truth,
)

__all__: list[str] = []


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


def _integral(kernel: str) -> Callable[[Callable], Callable]:
  """torch's error for a bitwise op whose inputs promote to a floating or complex dtype, which
  its CPU kernel `kernel` lacks (`"bitwise_and_cpu" not implemented for 'Float'`)."""

  def decorate(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(self: Any, other: Any) -> Any:
      _, common = result_dtypes(self, other)
      if jnp.issubdtype(common, jnp.inexact):
        name = scalar_type_name(common)
        raise NotImplementedError(f"\"{kernel}\" not implemented for '{name}'")
      return fn(self, other)

    return wrapper

  return decorate


@lowering(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.bitwise_and.Scalar_Tensor)
@_integral("bitwise_and_cpu")
@_promote("self", "other")
def bitwise_and(self, other):
  return self & other


@lowering(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.bitwise_or.Scalar_Tensor)
@_integral("bitwise_or_cpu")
@_promote("self", "other")
def bitwise_or(self, other):
  return self | other


@lowering(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.bitwise_xor.Scalar_Tensor)
@_integral("bitwise_xor_cpu")
@_promote("self", "other")
def bitwise_xor(self, other):
  return self ^ other


@lowering(aten.bitwise_not.default)
def bitwise_not(self):
  if _inexact(self):
    raise NotImplementedError(
      f"\"bitwise_not_cpu\" not implemented for '{scalar_type_name(self.dtype)}'"
    )
  return ~self


@lowering(
  aten.bitwise_left_shift.Tensor,
  aten.bitwise_left_shift.Tensor_Scalar,
  aten.bitwise_left_shift.Scalar_Tensor,
  aten.__lshift__.Tensor,
  aten.__lshift__.Scalar,
)
@_integral("lshift_cpu")
@_promote("self", "other")
def bitwise_left_shift(self, other):
  return _lshift(self, other)


@lowering(
  aten.bitwise_right_shift.Tensor,
  aten.bitwise_right_shift.Tensor_Scalar,
  aten.bitwise_right_shift.Scalar_Tensor,
  aten.__rshift__.Tensor,
  aten.__rshift__.Scalar,
)
@_integral("rshift_cpu")
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
    return lax.complex(
      _nan_to_num_real(jnp.real(self), nan, posinf, neginf),
      _nan_to_num_real(jnp.imag(self), nan, posinf, neginf),
    )
  if not _inexact(self):
    return self
  return _nan_to_num_real(self, nan, posinf, neginf)


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
    close = close | (
      diff <= _as(atol, jnp.float64) + _as(rtol, jnp.float64) * jnp.abs(b.astype(jnp.float64))
    )
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
