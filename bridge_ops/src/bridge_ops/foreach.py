"""Foreach family: the `_foreach_*` ops (torch.optim's `foreach=True` path, grad clipping).

Each lowering takes lists and returns a list, one element per tensor, computed as
the single-tensor op would be: torch's type promotion per tensor (Python and
traced scalars are weak), half types computed in float32. The in-place forms
(`_foreach_add_`, `_foreach_zero_`, ...) are derived by the core from these.

A `Tensor scalars` argument (the `.Tensor` overloads of addcmul/addcdiv) holds
one value per tensor; torch reads them as Python scalars, so here they are cast
to each tensor's computation dtype rather than promoting it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bridge_ops._lowering import aten, jax_dtype, lowering, opmath, result_dtypes


def _weak(x) -> bool:
  return bool(getattr(getattr(x, "aval", x), "weak_type", False))


def _is_tensor(x) -> bool:
  return hasattr(x, "dtype") and hasattr(x, "shape") and not (_weak(x) and np.ndim(x) == 0)


def _cast(x, dtype):
  """Tensors to `dtype`; Python and weak scalars stay weak (they follow the tensors)."""
  return x.astype(dtype) if _is_tensor(x) else x


def _as_scalar(x, dtype):
  """An element of a `Tensor scalars` argument, used as a scalar of `dtype`."""
  return jnp.reshape(x, ()).astype(dtype)


def _elementwise(fn, *args, kind="default"):
  compute, result = result_dtypes(*args, kind=kind)
  return fn(*[_cast(a, compute) for a in args]).astype(result)


def _unary(fn, self, kind="int_to_float"):
  return [_elementwise(fn, t, kind=kind) for t in self]


def _integral(x) -> bool:
  return np.dtype(x.dtype).kind in "iub"


def _keep_ints(fn):
  """Rounding ops leave integer tensors unchanged."""
  return lambda x: x if _integral(x) else fn(x)


# --- binary arithmetic ------------------------------------------------------------------------


def _unit(alpha) -> bool:
  return isinstance(alpha, (int, float)) and alpha == 1


def _add(a, b, alpha=1):
  return _elementwise(lambda x, y: x + y if _unit(alpha) else x + y * alpha, a, b)


def _sub(a, b, alpha=1):
  return _elementwise(lambda x, y: x - y if _unit(alpha) else x - y * alpha, a, b)


def _mul(a, b):
  return _elementwise(lambda x, y: x * y, a, b)


def _div(a, b):
  return _elementwise(lambda x, y: x / y, a, b, kind="int_to_float")


@lowering(aten._foreach_add.List)
def _foreach_add_List(self, other, *, alpha=1):
  return [_add(a, b, alpha) for a, b in zip(self, other)]


@lowering(aten._foreach_add.Scalar)
def _foreach_add_Scalar(self, scalar):
  return [_add(a, scalar) for a in self]


@lowering(aten._foreach_add.ScalarList)
def _foreach_add_ScalarList(self, scalars):
  return [_add(a, s) for a, s in zip(self, scalars)]


@lowering(aten._foreach_add.Tensor)
def _foreach_add_Tensor(self, other, *, alpha=1):
  return [_add(a, other, alpha) for a in self]


@lowering(aten._foreach_sub.List)
def _foreach_sub_List(self, other, *, alpha=1):
  return [_sub(a, b, alpha) for a, b in zip(self, other)]


@lowering(aten._foreach_sub.Scalar)
def _foreach_sub_Scalar(self, scalar):
  return [_sub(a, scalar) for a in self]


@lowering(aten._foreach_sub.ScalarList)
def _foreach_sub_ScalarList(self, scalars):
  return [_sub(a, s) for a, s in zip(self, scalars)]


@lowering(aten._foreach_mul.List)
def _foreach_mul_List(self, other):
  return [_mul(a, b) for a, b in zip(self, other)]


@lowering(aten._foreach_mul.Scalar)
def _foreach_mul_Scalar(self, scalar):
  return [_mul(a, scalar) for a in self]


@lowering(aten._foreach_mul.ScalarList)
def _foreach_mul_ScalarList(self, scalars):
  return [_mul(a, s) for a, s in zip(self, scalars)]


@lowering(aten._foreach_mul.Tensor)
def _foreach_mul_Tensor(self, other):
  return [_mul(a, other) for a in self]


@lowering(aten._foreach_div.List)
def _foreach_div_List(self, other):
  return [_div(a, b) for a, b in zip(self, other)]


@lowering(aten._foreach_div.Scalar)
def _foreach_div_Scalar(self, scalar):
  return [_div(a, scalar) for a in self]


@lowering(aten._foreach_div.ScalarList)
def _foreach_div_ScalarList(self, scalars):
  return [_div(a, s) for a, s in zip(self, scalars)]


@lowering(aten._foreach_div.Tensor)
def _foreach_div_Tensor(self, other):
  return [_div(a, other) for a in self]


# --- addcmul / addcdiv (torch's order: self + value * t1 * t2, self + value * t1 / t2) --------


def _addcmul(s, t1, t2, value):
  return _elementwise(lambda a, b, c: a + value * b * c, s, t1, t2)


def _addcdiv(s, t1, t2, value):
  return _elementwise(lambda a, b, c: a + value * b / c, s, t1, t2)


def _compute_dtype(*args):
  return result_dtypes(*args)[0]


@lowering(aten._foreach_addcmul.Scalar)
def _foreach_addcmul_Scalar(self, tensor1, tensor2, value=1):
  return [_addcmul(s, a, b, value) for s, a, b in zip(self, tensor1, tensor2)]


@lowering(aten._foreach_addcmul.ScalarList)
def _foreach_addcmul_ScalarList(self, tensor1, tensor2, scalars):
  return [_addcmul(s, a, b, v) for s, a, b, v in zip(self, tensor1, tensor2, scalars)]


@lowering(aten._foreach_addcmul.Tensor)
def _foreach_addcmul_Tensor(self, tensor1, tensor2, scalars):
  return [_addcmul(s, a, b, _as_scalar(scalars[i], _compute_dtype(s, a, b)))
          for i, (s, a, b) in enumerate(zip(self, tensor1, tensor2))]


@lowering(aten._foreach_addcdiv.Scalar)
def _foreach_addcdiv_Scalar(self, tensor1, tensor2, value=1):
  return [_addcdiv(s, a, b, value) for s, a, b in zip(self, tensor1, tensor2)]


@lowering(aten._foreach_addcdiv.ScalarList)
def _foreach_addcdiv_ScalarList(self, tensor1, tensor2, scalars):
  return [_addcdiv(s, a, b, v) for s, a, b, v in zip(self, tensor1, tensor2, scalars)]


@lowering(aten._foreach_addcdiv.Tensor)
def _foreach_addcdiv_Tensor(self, tensor1, tensor2, scalars):
  return [_addcdiv(s, a, b, _as_scalar(scalars[i], _compute_dtype(s, a, b)))
          for i, (s, a, b) in enumerate(zip(self, tensor1, tensor2))]


# --- lerp (torch's two-sided formula, exact at both ends) -------------------------------------


def _lerp(start, end, weight):
  def fn(a, b, w):
    small = jnp.abs(w) < 0.5
    return jnp.where(small, a + w * (b - a), b - (b - a) * (1 - w))
  compute, result = result_dtypes(start, end)
  return fn(start.astype(compute), end.astype(compute), _cast(weight, compute)).astype(result)


@lowering(aten._foreach_lerp.List)
def _foreach_lerp_List(self, tensors1, weights):
  return [_lerp(a, b, w) for a, b, w in zip(self, tensors1, weights)]


@lowering(aten._foreach_lerp.Scalar)
def _foreach_lerp_Scalar(self, tensors1, weight):
  return [_lerp(a, b, weight) for a, b in zip(self, tensors1)]


@lowering(aten._foreach_lerp.ScalarList)
def _foreach_lerp_ScalarList(self, tensors1, weight):
  return [_lerp(a, b, w) for a, b, w in zip(self, tensors1, weight)]


# --- maximum / minimum / clamp ----------------------------------------------------------------


def _max(a, b):
  return _elementwise(jnp.maximum, a, b)


def _min(a, b):
  return _elementwise(jnp.minimum, a, b)


@lowering(aten._foreach_maximum.List, aten._foreach_clamp_min.List)
def _foreach_maximum_List(self, other):
  return [_max(a, b) for a, b in zip(self, other)]


@lowering(aten._foreach_maximum.Scalar, aten._foreach_clamp_min.Scalar)
def _foreach_maximum_Scalar(self, scalar):
  return [_max(a, scalar) for a in self]


@lowering(aten._foreach_maximum.ScalarList, aten._foreach_clamp_min.ScalarList)
def _foreach_maximum_ScalarList(self, scalars):
  return [_max(a, s) for a, s in zip(self, scalars)]


@lowering(aten._foreach_minimum.List, aten._foreach_clamp_max.List)
def _foreach_minimum_List(self, other):
  return [_min(a, b) for a, b in zip(self, other)]


@lowering(aten._foreach_minimum.Scalar, aten._foreach_clamp_max.Scalar)
def _foreach_minimum_Scalar(self, scalar):
  return [_min(a, scalar) for a in self]


@lowering(aten._foreach_minimum.ScalarList, aten._foreach_clamp_max.ScalarList)
def _foreach_minimum_ScalarList(self, scalars):
  return [_min(a, s) for a, s in zip(self, scalars)]


# --- pow --------------------------------------------------------------------------------------


def _power(a, b):
  """jnp.power, with torch's integer rule for negative exponents (1, +-1 or 0)."""
  if not jnp.issubdtype(jnp.result_type(a, b), jnp.integer):
    return jnp.power(a, b)
  b_arr = jnp.asarray(b)
  neg = b_arr < 0
  pos = jnp.power(a, jnp.where(neg, jnp.zeros((), b_arr.dtype), b_arr))
  odd = (b_arr % 2) != 0
  at_neg = jnp.where(a == 1, 1, jnp.where(a == -1, jnp.where(odd, -1, 1), 0))
  return jnp.where(neg, at_neg.astype(pos.dtype), pos)


def _pow(a, b):
  return _elementwise(_power, a, b, kind="bool_to_long")


@lowering(aten._foreach_pow.List)
def _foreach_pow_List(self, exponent):
  return [_pow(a, b) for a, b in zip(self, exponent)]


@lowering(aten._foreach_pow.Scalar)
def _foreach_pow_Scalar(self, exponent):
  return [_pow(a, exponent) for a in self]


@lowering(aten._foreach_pow.ScalarList)
def _foreach_pow_ScalarList(self, exponent):
  return [_pow(a, e) for a, e in zip(self, exponent)]


@lowering(aten._foreach_pow.ScalarAndTensor)
def _foreach_pow_ScalarAndTensor(self, exponent):
  return [_pow(self, e) for e in exponent]


# --- reductions -------------------------------------------------------------------------------


def _norm_dtypes(x, dtype):
  out = jax_dtype(dtype, None)
  if out is None:
    out = {np.dtype(jnp.complex64): jnp.float32,
           np.dtype(jnp.complex128): jnp.float64}.get(np.dtype(x.dtype), x.dtype)
  compute = opmath(out)
  return compute, out


def _norm(x, ord, dtype):
  compute, out = _norm_dtypes(x, dtype)
  a = jnp.abs(x).astype(compute)
  if ord == float("inf"):
    r = jnp.max(a, initial=0.0)
  elif ord == float("-inf"):
    r = jnp.min(a)
  elif ord == 0:
    r = jnp.sum(a != 0).astype(compute)
  elif ord == 1:
    r = jnp.sum(a)
  elif ord == 2:
    r = jnp.sqrt(jnp.sum(a * a))
  else:
    r = jnp.sum(a ** ord) ** (1.0 / ord)
  return r.astype(out)


@lowering(aten._foreach_norm.Scalar, static_argnames=("ord",))
def _foreach_norm_Scalar(self, ord=2, dtype=None):
  return [_norm(t, ord, dtype) for t in self]


@lowering(aten._foreach_powsum.Scalar)
def _foreach_powsum_Scalar(self, ord=2, dtype=None):
  """sum(|x| ** ord): the norm without its root (pow's own rules at 0 and +-inf)."""
  results = []
  for t in self:
    compute, out = _norm_dtypes(t, dtype)
    results.append(jnp.sum(jnp.abs(t).astype(compute) ** ord).astype(out))
  return results


@lowering(aten._foreach_max.default)
def _foreach_max(self):
  return [jnp.max(t) for t in self]


# --- copies -----------------------------------------------------------------------------------


@lowering(aten._foreach_zero.default)
def _foreach_zero(self):
  return [jnp.zeros(t.shape, t.dtype) for t in self]


@lowering(aten._foreach_copy.default)
def _foreach_copy(self, src, non_blocking=False):
  return [jnp.copy(jnp.broadcast_to(s.astype(t.dtype), t.shape)) for t, s in zip(self, src)]


@lowering(aten._foreach_clone.default)
def _foreach_clone(self, *, memory_format=None):
  return [jnp.copy(t) for t in self]


# --- unary ------------------------------------------------------------------------------------


def _sign(x):
  if np.dtype(x.dtype) == np.bool_:
    return x
  return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)  # NaN -> 0, -0.0 -> 0.0


@lowering(aten._foreach_abs.default)
def _foreach_abs(self):
  return _unary(jnp.abs, self, kind="complex_to_float")


@lowering(aten._foreach_neg.default)
def _foreach_neg(self):
  return _unary(jnp.negative, self, kind="default")


@lowering(aten._foreach_sign.default)
def _foreach_sign(self):
  return _unary(_sign, self, kind="default")


@lowering(aten._foreach_ceil.default)
def _foreach_ceil(self):
  return _unary(_keep_ints(jnp.ceil), self, kind="default")


@lowering(aten._foreach_floor.default)
def _foreach_floor(self):
  return _unary(_keep_ints(jnp.floor), self, kind="default")


@lowering(aten._foreach_round.default)
def _foreach_round(self):
  return _unary(_keep_ints(jnp.round), self, kind="default")


@lowering(aten._foreach_trunc.default)
def _foreach_trunc(self):
  return _unary(_keep_ints(jnp.trunc), self, kind="default")


@lowering(aten._foreach_frac.default)
def _foreach_frac(self):
  return _unary(lambda x: x - jnp.trunc(x), self, kind="default")


@lowering(aten._foreach_sqrt.default)
def _foreach_sqrt(self):
  return _unary(jnp.sqrt, self)


@lowering(aten._foreach_rsqrt.default)
def _foreach_rsqrt(self):
  return _unary(jax.lax.rsqrt, self)


@lowering(aten._foreach_reciprocal.default)
def _foreach_reciprocal(self):
  return _unary(lambda x: 1 / x, self)


@lowering(aten._foreach_exp.default)
def _foreach_exp(self):
  return _unary(jnp.exp, self)


@lowering(aten._foreach_expm1.default)
def _foreach_expm1(self):
  return _unary(jnp.expm1, self)


@lowering(aten._foreach_log.default)
def _foreach_log(self):
  return _unary(jnp.log, self)


@lowering(aten._foreach_log1p.default)
def _foreach_log1p(self):
  return _unary(jnp.log1p, self)


@lowering(aten._foreach_log2.default)
def _foreach_log2(self):
  return _unary(jnp.log2, self)


@lowering(aten._foreach_log10.default)
def _foreach_log10(self):
  return _unary(jnp.log10, self)


@lowering(aten._foreach_sigmoid.default)
def _foreach_sigmoid(self):
  return _unary(jax.nn.sigmoid, self)


@lowering(aten._foreach_tanh.default)
def _foreach_tanh(self):
  return _unary(jnp.tanh, self)


@lowering(aten._foreach_sin.default)
def _foreach_sin(self):
  return _unary(jnp.sin, self)


@lowering(aten._foreach_cos.default)
def _foreach_cos(self):
  return _unary(jnp.cos, self)


@lowering(aten._foreach_tan.default)
def _foreach_tan(self):
  return _unary(jnp.tan, self)


@lowering(aten._foreach_asin.default)
def _foreach_asin(self):
  return _unary(jnp.arcsin, self)


@lowering(aten._foreach_acos.default)
def _foreach_acos(self):
  return _unary(jnp.arccos, self)


@lowering(aten._foreach_atan.default)
def _foreach_atan(self):
  return _unary(jnp.arctan, self)


@lowering(aten._foreach_sinh.default)
def _foreach_sinh(self):
  return _unary(jnp.sinh, self)


@lowering(aten._foreach_cosh.default)
def _foreach_cosh(self):
  return _unary(jnp.cosh, self)


@lowering(aten._foreach_erf.default)
def _foreach_erf(self):
  return _unary(jax.lax.erf, self)


@lowering(aten._foreach_erfc.default)
def _foreach_erfc(self):
  return _unary(jax.lax.erfc, self)


@lowering(aten._foreach_lgamma.default)
def _foreach_lgamma(self):
  return _unary(jax.lax.lgamma, self)
