"""Foreach family: the `_foreach_*` ops (torch.optim's `foreach=True` path, grad clipping).

Each lowering takes lists and returns a list, one element per tensor, computed by the
single-tensor op's lowering (`arithmetic`, `math_ops`, `special`): its torch type
promotion per tensor, its opmath, its derivative rules (`abs` at 0 has gradient 0), then
torch's result dtype for that tensor. The in-place forms (`_foreach_add_`,
`_foreach_zero_`, ...) are derived by the core from these.

A `Tensor scalars` argument (the `.Tensor` overloads of addcmul/addcdiv) holds
one value per tensor; torch reads them as Python scalars, so here they are cast
to each tensor's computation dtype rather than promoting it.
"""

from __future__ import annotations

import jax.numpy as jnp

from bridge_ops import arithmetic, math_ops, reduction, special
from bridge_ops._lowering import (
  aten,
  jax_dtype,
  lowering,
  opmath,
  real_dtype,
  result_dtypes,
  torch_abs,
)


def _each(op, *args, kind="default", **kwargs):
  """The single-tensor lowering `op` on one tensor's arguments (its dtype rules and derivative
  rules come with it), in torch's result dtype for them (`kind`: their promotion kind)."""
  _, result = result_dtypes(*args, kind=kind)
  return op(*args, **kwargs).astype(result)


def _unary(op, self, kind="int_to_float"):
  return [_each(op, t, kind=kind) for t in self]


# --- binary arithmetic ------------------------------------------------------------------------


def _add(a, b, alpha=1):
  return _each(arithmetic.add, a, b, alpha=alpha)


def _sub(a, b, alpha=1):
  return _each(arithmetic.sub, a, b, alpha=alpha)


def _mul(a, b):
  return _each(arithmetic.mul, a, b)


def _div(a, b):
  return _each(arithmetic.div, a, b, kind="int_to_float")


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
  return _each(arithmetic.addcmul, s, t1, t2, value=value)


def _addcdiv(s, t1, t2, value):
  return _each(arithmetic.addcdiv, s, t1, t2, value=value)


def _scalar(scalars, i):
  """Element `i` of a `Tensor scalars` argument, a 0-d value (cast like a Scalar)."""
  return jnp.reshape(scalars[i], ())


@lowering(aten._foreach_addcmul.Scalar)
def _foreach_addcmul_Scalar(self, tensor1, tensor2, value=1):
  return [_addcmul(s, a, b, value) for s, a, b in zip(self, tensor1, tensor2)]


@lowering(aten._foreach_addcmul.ScalarList)
def _foreach_addcmul_ScalarList(self, tensor1, tensor2, scalars):
  return [_addcmul(s, a, b, v) for s, a, b, v in zip(self, tensor1, tensor2, scalars)]


@lowering(aten._foreach_addcmul.Tensor)
def _foreach_addcmul_Tensor(self, tensor1, tensor2, scalars):
  return [
    _addcmul(s, a, b, _scalar(scalars, i))
    for i, (s, a, b) in enumerate(zip(self, tensor1, tensor2))
  ]


@lowering(aten._foreach_addcdiv.Scalar)
def _foreach_addcdiv_Scalar(self, tensor1, tensor2, value=1):
  return [_addcdiv(s, a, b, value) for s, a, b in zip(self, tensor1, tensor2)]


@lowering(aten._foreach_addcdiv.ScalarList)
def _foreach_addcdiv_ScalarList(self, tensor1, tensor2, scalars):
  return [_addcdiv(s, a, b, v) for s, a, b, v in zip(self, tensor1, tensor2, scalars)]


@lowering(aten._foreach_addcdiv.Tensor)
def _foreach_addcdiv_Tensor(self, tensor1, tensor2, scalars):
  return [
    _addcdiv(s, a, b, _scalar(scalars, i))
    for i, (s, a, b) in enumerate(zip(self, tensor1, tensor2))
  ]


# --- lerp (torch's two-sided formula, exact at both ends) -------------------------------------


def _lerp(start, end, weight):
  _, result = result_dtypes(start, end)  # (the weight does not promote)
  return arithmetic.lerp(start, end, weight).astype(result)


@lowering(aten._foreach_lerp.List)
def _foreach_lerp_List(self, tensors1, weights):
  return [_lerp(a, b, w) for a, b, w in zip(self, tensors1, weights)]


def _lerp_scalar(start, end, weight):
  # (a Scalar weight is read unrounded, in the computation's float32 for float16/bfloat16
  # tensors, as `lerp.Scalar` and torch's foreach kernels on CPU and CUDA read it)
  _, result = result_dtypes(start, end)
  return arithmetic.lerp_scalar(start, end, weight).astype(result)


@lowering(aten._foreach_lerp.Scalar)
def _foreach_lerp_Scalar(self, tensors1, weight):
  return [_lerp_scalar(a, b, weight) for a, b in zip(self, tensors1)]


@lowering(aten._foreach_lerp.ScalarList)
def _foreach_lerp_ScalarList(self, tensors1, weight):
  return [_lerp_scalar(a, b, w) for a, b, w in zip(self, tensors1, weight)]


# --- maximum / minimum / clamp ----------------------------------------------------------------


def _max(a, b):
  return _each(arithmetic.maximum, a, b)


def _min(a, b):
  return _each(arithmetic.minimum, a, b)


def _clamp_min(a, b):
  return _each(arithmetic.clamp_min, a, b)


def _clamp_max(a, b):
  return _each(arithmetic.clamp_max, a, b)


@lowering(aten._foreach_maximum.List)
def _foreach_maximum_List(self, other):
  return [_max(a, b) for a, b in zip(self, other)]


@lowering(aten._foreach_maximum.Scalar)
def _foreach_maximum_Scalar(self, scalar):
  return [_max(a, scalar) for a in self]


@lowering(aten._foreach_maximum.ScalarList)
def _foreach_maximum_ScalarList(self, scalars):
  return [_max(a, s) for a, s in zip(self, scalars)]


@lowering(aten._foreach_minimum.List)
def _foreach_minimum_List(self, other):
  return [_min(a, b) for a, b in zip(self, other)]


@lowering(aten._foreach_minimum.Scalar)
def _foreach_minimum_Scalar(self, scalar):
  return [_min(a, scalar) for a in self]


@lowering(aten._foreach_minimum.ScalarList)
def _foreach_minimum_ScalarList(self, scalars):
  return [_min(a, s) for a, s in zip(self, scalars)]


@lowering(aten._foreach_clamp_min.List)
def _foreach_clamp_min_List(self, other):
  return [_clamp_min(a, b) for a, b in zip(self, other)]


@lowering(aten._foreach_clamp_min.Scalar)
def _foreach_clamp_min_Scalar(self, scalar):
  return [_clamp_min(a, scalar) for a in self]


@lowering(aten._foreach_clamp_min.ScalarList)
def _foreach_clamp_min_ScalarList(self, scalars):
  return [_clamp_min(a, s) for a, s in zip(self, scalars)]


@lowering(aten._foreach_clamp_max.List)
def _foreach_clamp_max_List(self, other):
  return [_clamp_max(a, b) for a, b in zip(self, other)]


@lowering(aten._foreach_clamp_max.Scalar)
def _foreach_clamp_max_Scalar(self, scalar):
  return [_clamp_max(a, scalar) for a in self]


@lowering(aten._foreach_clamp_max.ScalarList)
def _foreach_clamp_max_ScalarList(self, scalars):
  return [_clamp_max(a, s) for a, s in zip(self, scalars)]


# --- pow --------------------------------------------------------------------------------------


def _pow(op, a, b):
  return _each(op, a, b, kind="bool_to_long")


@lowering(aten._foreach_pow.List)
def _foreach_pow_List(self, exponent):
  return [_pow(arithmetic.pow, a, b) for a, b in zip(self, exponent)]


@lowering(aten._foreach_pow.Scalar)
def _foreach_pow_Scalar(self, exponent):
  return [_pow(arithmetic.pow_tensor_scalar, a, exponent) for a in self]


@lowering(aten._foreach_pow.ScalarList)
def _foreach_pow_ScalarList(self, exponent):
  return [_pow(arithmetic.pow_tensor_scalar, a, e) for a, e in zip(self, exponent)]


@lowering(aten._foreach_pow.ScalarAndTensor)
def _foreach_pow_ScalarAndTensor(self, exponent):
  return [_pow(arithmetic.pow_scalar, self, e) for e in exponent]


# --- reductions -------------------------------------------------------------------------------


@lowering(aten._foreach_norm.Scalar, static_argnames=("ord",))
def _foreach_norm_Scalar(self, ord=2, dtype=None):
  """torch.linalg.vector_norm of each tensor (torch's own fallback), so that the norm of a
  zero tensor has vector_norm's zero gradient, not the nan of sqrt at 0."""
  return [reduction._vector_norm(t, ord, None, False, dtype) for t in self]


@lowering(aten._foreach_powsum.Scalar)
def _foreach_powsum_Scalar(self, ord=2, dtype=None):
  """sum(|x| ** ord): the norm without its root (pow's own rules at 0 and +-inf)."""
  results = []
  for t in self:
    if dtype is not None:
      t = t.astype(jax_dtype(dtype))
    out = real_dtype(t.dtype)
    results.append(jnp.sum(torch_abs(t).astype(opmath(out)) ** ord).astype(out))
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


@lowering(aten._foreach_abs.default)
def _foreach_abs(self):
  return _unary(arithmetic.abs, self, kind="complex_to_float")


@lowering(aten._foreach_neg.default)
def _foreach_neg(self):
  return _unary(arithmetic.neg, self, kind="default")


@lowering(aten._foreach_sign.default)
def _foreach_sign(self):
  return _unary(arithmetic.sign, self, kind="default")


@lowering(aten._foreach_ceil.default)
def _foreach_ceil(self):
  return _unary(math_ops.ceil, self, kind="default")


@lowering(aten._foreach_floor.default)
def _foreach_floor(self):
  return _unary(math_ops.floor, self, kind="default")


@lowering(aten._foreach_round.default)
def _foreach_round(self):
  return _unary(math_ops.round, self, kind="default")


@lowering(aten._foreach_trunc.default)
def _foreach_trunc(self):
  return _unary(math_ops.trunc, self, kind="default")


@lowering(aten._foreach_frac.default)
def _foreach_frac(self):
  return _unary(math_ops.frac, self, kind="default")


@lowering(aten._foreach_sqrt.default)
def _foreach_sqrt(self):
  return _unary(math_ops.sqrt, self)


@lowering(aten._foreach_rsqrt.default)
def _foreach_rsqrt(self):
  return _unary(math_ops.rsqrt, self)


@lowering(aten._foreach_reciprocal.default)
def _foreach_reciprocal(self):
  return _unary(arithmetic.reciprocal, self)


@lowering(aten._foreach_exp.default)
def _foreach_exp(self):
  return _unary(math_ops.exp, self)


@lowering(aten._foreach_expm1.default)
def _foreach_expm1(self):
  return _unary(math_ops.expm1, self)


@lowering(aten._foreach_log.default)
def _foreach_log(self):
  return _unary(math_ops.log, self)


@lowering(aten._foreach_log1p.default)
def _foreach_log1p(self):
  return _unary(math_ops.log1p, self)


@lowering(aten._foreach_log2.default)
def _foreach_log2(self):
  return _unary(math_ops.log2, self)


@lowering(aten._foreach_log10.default)
def _foreach_log10(self):
  return _unary(math_ops.log10, self)


@lowering(aten._foreach_sigmoid.default)
def _foreach_sigmoid(self):
  return _unary(math_ops.sigmoid, self)


@lowering(aten._foreach_tanh.default)
def _foreach_tanh(self):
  return _unary(math_ops.tanh, self)


@lowering(aten._foreach_sin.default)
def _foreach_sin(self):
  return _unary(math_ops.sin, self)


@lowering(aten._foreach_cos.default)
def _foreach_cos(self):
  return _unary(math_ops.cos, self)


@lowering(aten._foreach_tan.default)
def _foreach_tan(self):
  return _unary(math_ops.tan, self)


@lowering(aten._foreach_asin.default)
def _foreach_asin(self):
  return _unary(math_ops.asin, self)


@lowering(aten._foreach_acos.default)
def _foreach_acos(self):
  return _unary(math_ops.acos, self)


@lowering(aten._foreach_atan.default)
def _foreach_atan(self):
  return _unary(math_ops.atan, self)


@lowering(aten._foreach_sinh.default)
def _foreach_sinh(self):
  return _unary(math_ops.sinh, self)


@lowering(aten._foreach_cosh.default)
def _foreach_cosh(self):
  return _unary(math_ops.cosh, self)


@lowering(aten._foreach_erf.default)
def _foreach_erf(self):
  return _unary(math_ops.erf, self)


@lowering(aten._foreach_erfc.default)
def _foreach_erfc(self):
  return _unary(math_ops.erfc, self)


@lowering(aten._foreach_lgamma.default)
def _foreach_lgamma(self):
  return _unary(special.lgamma, self)
