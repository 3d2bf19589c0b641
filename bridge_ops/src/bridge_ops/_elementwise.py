"""Helpers shared by the elementwise families (`arithmetic`, `math_ops`, `comparison`,
`activation`): torch's Scalar casting and promotion, integer division, powers and shifts.

A `Scalar` is cast to the computation dtype before use (so an out-of-range int wraps like
torch's `uint8 == 300`); float16/bfloat16 compute in float32 (`_lowering.opmath`) and the
core casts results back to torch's result dtype. Before that, every input is rounded to the
inputs' common dtype, as torch's CPU kernels cast their inputs (a float16 tensor is compared
with 0.1 rounded to float16), except the ones a kernel reads unrounded (`_promote`'s `exact`).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bridge_ops._lowering import check, literal, opmath, result_dtypes, with_derivative

__all__: list[str] = []


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


def _common(*values: Any) -> Any:
  """The dtype torch's CPU kernels cast `values` to before computing (TensorIterator's common
  dtype) where the computation dtype is wider (float16, bfloat16: computed in float32); else
  None (nothing to round)."""
  _, common = result_dtypes(*values)
  return common if opmath(common) != np.dtype(common) else None


def _rounded(value: Any, common: Any, compute: Any) -> jax.Array:
  """`value` in `compute`, rounded to `common` first (a Python float reaches float16 through
  float32, as `c10::Half(float)`), or straight in `compute` where `common` is None."""
  if common is None or np.dtype(getattr(value, "dtype", type(value))) == np.dtype(common):
    return _as(value, compute)
  return _as(_as(_as(value, compute), common), compute)


def _promoted(
  *values: Any, kind: str = "default", exact: tuple[bool, ...] = ()
) -> tuple[jax.Array, ...]:
  """`values` (arrays or Scalars) cast to torch's computation dtype for them, each rounded to
  the common dtype first (`_rounded`) unless `exact` (by position) says torch reads it as
  it is."""
  compute, _ = result_dtypes(*values, kind=kind)
  common = _common(*values)
  exact = exact + (False,) * (len(values) - len(exact))
  return tuple(
    _as(v, compute) if keep else _rounded(v, common, compute) for v, keep in zip(values, exact)
  )


def _single(value: Any) -> bool:
  """A single value (a Scalar, a 0-d or one-element tensor): what torch's `is_scalar` operand
  is, which broadcasts over the whole result."""
  return np.size(value) == 1


def _promote(
  *names: str, kind: str = "default", exact: str | None = None, scalars: tuple[str, ...] = ()
) -> Callable[[Callable], Callable]:
  """Like `promote`, for ops with several inputs: every named argument, Scalars included,
  is cast to torch's computation dtype (with `_as`) before the lowering runs.

  torch casts a Python scalar to the operation's dtype, so an out-of-range int wraps
  (`uint8_tensor == 300` compares with 44) where JAX would refuse the literal; and it casts
  every input to the inputs' common dtype first, so a float16 tensor compares with 0.1 (or
  a float32 0-d tensor of 0.1, or adds an int64 tensor of 2049) rounded to float16, though
  float16 computes in float32. `exact` names the argument that torch's CPU kernel reads
  unrounded when it is a single value (`_single`): the divisor of `mul` and `div` (their
  `original_scalar_value`). `scalars` names Scalar arguments that take no part in promotion
  but which the kernel reads in the common dtype (`add`'s `alpha.to<scalar_t>()`); the
  default of 1 stays a literal.
  """

  def decorate(fn: Callable) -> Callable:
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
      bound = sig.bind(*args, **kwargs)
      present = [n for n in names if bound.arguments.get(n) is not None]
      values = [bound.arguments[n] for n in present]
      keep = tuple(n == exact and _single(v) for n, v in zip(present, values))
      for n, v in zip(present, _promoted(*values, kind=kind, exact=keep)):
        bound.arguments[n] = v
      if scalars:
        compute, _ = result_dtypes(*values)
        common = _common(*values)
        for n in scalars:
          v = bound.arguments.get(n, sig.parameters[n].default)
          if not _is_one(v):
            bound.arguments[n] = _rounded(v, common, compute)
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
_remainder_real = with_derivative(_remainder_value, lambda out, p, t: t[0] - t[1] * _div_floor(*p))


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
    neg = jnp.where(
      a == 1, one, jnp.where(a == -1, jnp.where((b & 1) != 0, -one, one), jnp.zeros((), a.dtype))
    )
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


def _nan_to_num_real(
  x: jax.Array, nan: float | None, posinf: float | None, neginf: float | None
) -> jax.Array:
  info = jnp.finfo(x.dtype)
  nan_v = jnp.asarray(0.0 if nan is None else nan, np.float64).astype(x.dtype)
  pos_v = jnp.asarray(info.max if posinf is None else posinf, np.float64).astype(x.dtype)
  neg_v = jnp.asarray(info.min if neginf is None else neginf, np.float64).astype(x.dtype)
  x = jnp.where(jnp.isnan(x), nan_v, x)
  x = jnp.where(x == jnp.inf, pos_v, x)
  return jnp.where(x == -jnp.inf, neg_v, x)


# torch's derivative, from the output: y (1 - y). Differentiating 1 / (1 + exp(-x)) gives
# inf / inf = nan once exp(-x) overflows (x < -89 in float32), where torch's is 0.
_sigmoid = with_derivative(
  lambda x: 1 / (1 + jnp.exp(-x)), lambda out, x, t: t[0] * (1 - out) * out
)


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
