"""Reductions: sum/mean/prod, max/min/arg*, var/std, norms, all/any, scans, logsumexp and
softmax, covariance.

torch semantics kept here (each checked against torch on CPU in tests/ops/test_reduction.py):
* `dim` is None, an int or a list; None and `[]` mean every dim (except `all.dims`/`any.dims`,
  where `[]` reduces nothing). A 0-d tensor accepts dim 0 or -1 and stays 0-d.
* sum/prod/cumsum/cumprod of integers and bools give int64; `dtype=` casts before reducing.
  float16/bfloat16 sum, mean and the scans accumulate in float32 and round once, as torch's CPU
  kernels do; prod rounds every product to the 16-bit type, in the order of torch's kernel.
* max/min/argmax/argmin propagate NaN and pick the first NaN or the first tie; cummax/cummin
  pick the *last* tie (and the last NaN), as torch does.
* The reductions with no identity (max, min, amax, amin, aminmax, argmax, argmin) of nothing
  raise torch's error (its type and message) while traced; softmax over an empty dim is empty.
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from bridge_ops._lowering import (
  aten,
  fori_loop,
  jax_dtype,
  lowering,
  opmath,
  p_norm,
  real_dtype,
  result_dtypes,
  torch_abs,
  with_derivative,
)
from bridge_ops._reduction import (
  _axes,
  _count,
  _is_int,
  _nonempty,
  _nonempty_all,
  _one_axis,
  _squeeze,
  _sum_dtype,
)


# ----------------------------------------------------------------------------- sum, mean, prod


def _sum_or_prod(reduce, self, dim, keepdim, dtype):
  """`reduce` (`jnp.sum` or `jnp.prod`) over `dim` in torch's result dtype, accumulated in its
  opmath dtype (float32 for the half types)."""
  out = _sum_dtype(self, dtype)
  r = reduce(self.astype(out), axis=_axes(self, dim), keepdims=keepdim, dtype=opmath(out))
  return r.astype(out)


@lowering(aten.sum.default, aten.sum.dim_IntList)
def sum_dim_IntList(self, dim=None, keepdim=False, *, dtype=None):
  return _sum_or_prod(jnp.sum, self, dim, keepdim, dtype)


@lowering(aten.trace.default)
def trace(self):
  out = _sum_dtype(self, None)
  return jnp.trace(self.astype(out), dtype=opmath(out)).astype(out)


@lowering(aten.nansum.default)
def nansum(self, dim=None, keepdim=False, *, dtype=None):
  if dim is not None and not len(dim) and self.shape != ((1,) * self.ndim if keepdim else ()):
    # torch's CPU kernel sums every element, its meta kernel keeps the input's shape: the
    # `jax` device follows the meta kernel's shapes, so the result torch gives cannot be made
    raise NotImplementedError(
      f"`torch.nansum` with `dim=()` (no dims) on shape {tuple(self.shape)}: torch's CPU "
      "kernel sums every element, but its meta kernel, whose shapes the `jax` device "
      "follows, keeps the input's shape. Pass `dim=None` to sum every element."
    )
  x = self if _is_int(self.dtype) else jnp.where(jnp.isnan(self), jnp.zeros_like(self), self)
  return sum_dim_IntList(x, dim, keepdim, dtype=dtype)


@lowering(aten.mean.default, aten.mean.dim)
def mean_dim(self, dim=None, keepdim=False, *, dtype=None):
  out = jax_dtype(dtype, self.dtype)
  axes = _axes(self, dim)
  s = jnp.sum(self.astype(out), axis=axes, keepdims=keepdim, dtype=opmath(out))
  return (s / _count(self, axes)).astype(out)


@lowering(aten.prod.default, aten.prod.dim_int)
def prod_dim_int(self, dim=None, keepdim=False, *, dtype=None):
  out = _sum_dtype(self, dtype)
  if out in _HALF_TYPES:
    return _half_prod(self.astype(out), dim, keepdim)
  return _sum_or_prod(jnp.prod, self, dim, keepdim, dtype)


# torch's CPU prod of float16/bfloat16 (`binary_kernel_reduce_vec`) rounds every product to the
# 16-bit type, so its order decides the result. Along a row that is contiguous in memory it
# keeps 4 vectors of 16 lanes per 64-element block, multiplies them together, then the lanes
# in order, then the elements past the last block one by one; along any other dim it multiplies
# in index order. One result of at least `_GRAIN` elements is split among torch's threads
# (`two_pass_reduction`), each chunk reduced as a row, then the per-thread results as a row.
_HALF_TYPES = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))
_LANES, _BLOCK, _GRAIN = 16, 64, 32768


def _in_order(acc, rows):
  """`acc` times each column of the 2-d `rows` in turn, rounded after each product."""
  if rows.shape[1] == 0:
    return acc
  return fori_loop(
    0, rows.shape[1], lambda i, a: a * lax.dynamic_index_in_dim(rows, i, 1, False), acc
  )


def _row_prod(rows):
  """torch's product of each contiguous row of the 2-d `rows` (see above)."""
  m, n = rows.shape
  acc = jnp.ones((m,), rows.dtype)
  count = n // _BLOCK
  if count:
    blocks = rows[:, : count * _BLOCK].reshape(m, count, 4, _LANES)
    vec = fori_loop(
      1, count, lambda i, v: v * lax.dynamic_index_in_dim(blocks, i, 1, False), blocks[:, 0]
    )
    lanes = (vec[:, 0] * vec[:, 1]) * (vec[:, 2] * vec[:, 3])
    acc = _in_order(lanes[:, 0], lanes[:, 1:])
  return _in_order(acc, rows[:, count * _BLOCK :])


def _half_prod(x, dim, keepdim):
  axes = _axes(x, dim)
  kept = [s for a, s in enumerate(x.shape) if a not in axes]
  if math.prod(kept) == 1:  # one result: every element, in memory order
    flat = x.reshape(-1)
    threads = min(torch.get_num_threads(), -(-flat.size // _GRAIN))
    if threads > 1:
      size = -(-flat.size // threads)
      parts = [_row_prod(flat[t * size : (t + 1) * size][None]) for t in range(threads)]
      pad = jnp.ones((torch.get_num_threads() - threads,), x.dtype)
      flat = jnp.concatenate(parts + [pad])
    r = _row_prod(flat[None])[0]
  else:
    (axis,) = axes
    rows = jnp.moveaxis(x, axis, -1).reshape(math.prod(kept), x.shape[axis])
    contiguous = all(s == 1 for s in x.shape[axis + 1 :])
    r = _row_prod(rows) if contiguous else _in_order(jnp.ones(rows.shape[:1], x.dtype), rows)
  shape = [1 if a in axes else s for a, s in enumerate(x.shape)] if keepdim else kept
  return r.reshape(shape)


# ----------------------------------------------------------------------------- max, min, arg*


@lowering(aten.max.default)
def max_default(self):
  _nonempty_all(self, "max()")
  return jnp.max(self)


@lowering(aten.min.default)
def min_default(self):
  _nonempty_all(self, "min()")
  return jnp.min(self)


@lowering(aten.amax.default)
def amax(self, dim=(), keepdim=False):
  _no_identity(self, dim, "amax()")
  return jnp.max(self, axis=_axes(self, dim), keepdims=keepdim)


@lowering(aten.amin.default)
def amin(self, dim=(), keepdim=False):
  _no_identity(self, dim, "amin()")
  return jnp.min(self, axis=_axes(self, dim), keepdims=keepdim)


def _no_identity(x, dim, name):
  """torch's errors for amax/amin of nothing: no dim given (every dim), or an empty one."""
  if dim is None or (not isinstance(dim, int) and not len(dim)):
    _nonempty_all(x, name)
  else:
    _nonempty(x, dim, name, wrap=False)


@lowering(aten.aminmax.default)
def aminmax(self, *, dim=None, keepdim=False):
  if dim is None and self.size == 0:
    raise RuntimeError(
      "aminmax(): cannot compute aminmax over an empty dimension as the operation has no identity."
    )
  if dim is not None:
    _nonempty(self, dim, "aminmax")
  return amin(self, dim, keepdim), amax(self, dim, keepdim)


def _arg_reduce(arg_fn, x, dim, keepdim, name):
  if dim is None:
    _nonempty_all(x, name, IndexError, hint=False)
    i = arg_fn(x.reshape(-1)).astype(jnp.int64)
    return i.reshape((1,) * x.ndim) if keepdim else i
  _nonempty(x, dim, name)
  x1, axis = _one_axis(x, dim)
  i = arg_fn(x1, axis=axis, keepdims=True).astype(jnp.int64)
  return _squeeze(i, axis, keepdim, x.ndim == 0)


@lowering(aten.argmax.default)
def argmax(self, dim=None, keepdim=False):
  return _arg_reduce(
    jnp.argmax, self, dim, keepdim, "argmax()"
  )  # first max; first NaN wins, as torch


@lowering(aten.argmin.default)
def argmin(self, dim=None, keepdim=False):
  return _arg_reduce(jnp.argmin, self, dim, keepdim, "argmin()")


def _value_index(arg_fn, x, dim, keepdim, name):
  _nonempty(x, dim, name)
  x1, axis = _one_axis(x, dim)
  i = arg_fn(x1, axis=axis, keepdims=True).astype(jnp.int64)
  v = jnp.take_along_axis(x1, i, axis)
  return _squeeze(v, axis, keepdim, x.ndim == 0), _squeeze(i, axis, keepdim, x.ndim == 0)


@lowering(aten.max.dim)
def max_dim(self, dim, keepdim=False):
  return _value_index(jnp.argmax, self, dim, keepdim, "max()")


@lowering(aten.min.dim)
def min_dim(self, dim, keepdim=False):
  return _value_index(jnp.argmin, self, dim, keepdim, "min()")


# ----------------------------------------------------------------------------- var, std

# torch's std backward divides by 2 * std and gives 0 where std is 0 (a constant input);
# sqrt's own rule gives inf there, so NaN once multiplied by the zero derivative of var.
_std_sqrt = with_derivative(
  jnp.sqrt,
  lambda out, v, t: jnp.where(
    out == 0, jnp.zeros((), out.dtype), t[0] / (2 * jnp.where(out == 0, 1, out))
  ),
)


def _var_mean(x, dim, correction, keepdim, sqrt=False):
  """(variance or std, mean), computed in float32 for 16-bit floats and rounded once; the
  variance is real for complex inputs.

  torch's kernels square float32 deviations in double: a float32 std of [1e20, -1e20] is
  finite there. Here they are scaled by a power of two near their largest magnitude before
  squaring, and the result is scaled back: exact (the same numbers as without it), except
  that the squares cannot overflow. (float64 is squared as is, as torch does; a complex std is
  the square root of its float32 variance, as torch's.)"""
  axes = _axes(x, dim)
  n = _count(x, axes)
  xa = x.astype(opmath(x.dtype))
  mean = jnp.sum(xa, axis=axes, keepdims=True) / n
  d = xa - mean
  real = real_dtype(xa.dtype)
  k = jnp.zeros((), jnp.int32)
  if real != np.float64:
    mag = jnp.maximum(jnp.abs(d.real), jnp.abs(d.imag)) if jnp.iscomplexobj(d) else jnp.abs(d)
    _, e = jnp.frexp(jnp.max(mag, axis=axes, keepdims=True, initial=0))
    bias = jnp.finfo(real).maxexp - 1
    k = lax.stop_gradient(jnp.clip(e, 2 - bias, bias - 1))
    d = d * _power_of_two(-k, real)
    if not keepdim:
      k = jnp.squeeze(k, axes)
  sq = (d * jnp.conj(d)).real if jnp.iscomplexobj(d) else d * d
  # torch divides by max(0, N - correction) (so N <= correction gives inf or nan).
  dof = jnp.maximum(n - (1 if correction is None else correction), 0)
  var = jnp.sum(sq, axis=axes, keepdims=keepdim) / dof
  scale = _power_of_two(k, real)
  if sqrt and not jnp.iscomplexobj(d):
    var = _std_sqrt(var) * scale
  else:
    var = var * scale * scale
    var = _std_sqrt(var) if sqrt else var
  if not keepdim:
    mean = jnp.squeeze(mean, axes)
  return var.astype(real_dtype(x.dtype)), mean.astype(x.dtype)


def _power_of_two(k, dtype):
  """2 ** k in the float `dtype`, exactly, for integers k in its normal range."""
  info = jnp.finfo(dtype)
  bits = jnp.dtype(f"int{info.bits}")
  exponent = (k.astype(bits) + (info.maxexp - 1)) << info.nmant
  return lax.bitcast_convert_type(exponent, dtype)


@lowering(aten.var.correction)
def var_correction(self, dim=None, *, correction=None, keepdim=False):
  return _var_mean(self, dim, correction, keepdim)[0]


@lowering(aten.std.correction)
def std_correction(self, dim=None, *, correction=None, keepdim=False):
  return _var_mean(self, dim, correction, keepdim, sqrt=True)[0]


@lowering(aten.var_mean.correction)
def var_mean_correction(self, dim=None, *, correction=None, keepdim=False):
  return _var_mean(self, dim, correction, keepdim)


@lowering(aten.std_mean.correction)
def std_mean_correction(self, dim=None, *, correction=None, keepdim=False):
  return _var_mean(self, dim, correction, keepdim, sqrt=True)


# ----------------------------------------------------------------------------- norms


def _vector_norm(x, ord, dim, keepdim, dtype):
  """torch.linalg.vector_norm; `ord` is static (a Python number), it picks the algorithm."""
  if dtype is not None:
    x = x.astype(jax_dtype(dtype))
  out = real_dtype(x.dtype)
  a = torch_abs(x).astype(opmath(out))
  axes = _axes(x, dim)
  if ord == math.inf:
    r = jnp.max(a, axis=axes, keepdims=keepdim)
  elif ord == -math.inf:
    r = jnp.min(a, axis=axes, keepdims=keepdim)
  elif ord == 0:
    r = jnp.sum(a != 0, axis=axes, keepdims=keepdim, dtype=a.dtype)
  elif ord == 1:
    r = jnp.sum(a, axis=axes, keepdims=keepdim)
  elif ord < 0:
    r = _negative_order_norm(a, ord, axes, keepdim)
  else:
    r = p_norm(a, ord, axes, keepdim)  # (torch's zero gradients at zeros)
  return r.astype(out)


def _negative_order_norm(a, ord, axes, keepdim):
  """(sum a ** ord) ** (1 / ord) for ord < 0: a zero element's a ** ord is inf, which makes
  the norm 0 and torch's gradient 0 for every element: the zeros are left out of the powers,
  so the untaken branch has no inf * 0. A nan makes the norm and all its gradients nan."""
  zero = (a == 0) & ~jnp.any(jnp.isnan(a), axis=axes, keepdims=True)
  r = jnp.sum(jnp.where(zero, 1, a) ** ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)
  return jnp.where(jnp.any(zero, axis=axes, keepdims=keepdim), jnp.zeros((), r.dtype), r)


@lowering(aten.linalg_vector_norm.default, static_argnames=("ord",))
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None):
  return _vector_norm(self, ord, dim, keepdim, dtype)


@lowering(
  aten.norm.Scalar,
  aten.norm.ScalarOpt_dim,
  aten.norm.ScalarOpt_dim_dtype,
  aten.norm.ScalarOpt_dtype,
  static_argnames=("p",),
)
def norm(self, p=2, dim=None, keepdim=False, *, dtype=None):
  return _vector_norm(self, 2 if p is None else p, dim, keepdim, dtype)


# ----------------------------------------------------------------------------- all, any, count


def _logical(fn, x, dim, keepdim):
  # all.dims / any.dims: an empty dim list reduces nothing (unlike sum).
  r = fn(x != 0, axis=_axes(x, dim, empty_means_all=False), keepdims=keepdim)
  return r.astype(jnp.uint8) if x.dtype == jnp.uint8 else r  # torch keeps uint8


@lowering(aten.all.default, aten.all.dim, aten.all.dims)
def all_dims(self, dim=None, keepdim=False):
  return _logical(jnp.all, self, dim, keepdim)


@lowering(aten.any.default, aten.any.dim, aten.any.dims)
def any_dims(self, dim=None, keepdim=False):
  return _logical(jnp.any, self, dim, keepdim)


@lowering(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def count_nonzero(self, dim=None):
  return jnp.sum(self != 0, axis=_axes(self, dim), dtype=jnp.int64)


# ----------------------------------------------------------------------------- scans


def _scan(fn, x, dim, out):
  x1, axis = _one_axis(x.astype(out), dim)
  return fn(x1.astype(opmath(out)), axis=axis).astype(out).reshape(x.shape)


@lowering(aten.cumsum.default)
def cumsum(self, dim, *, dtype=None):
  return _scan(lax.cumsum, self, dim, _sum_dtype(self, dtype))


@lowering(aten.cumprod.default)
def cumprod(self, dim, *, dtype=None):
  return _scan(lax.cumprod, self, dim, _sum_dtype(self, dtype))


def _log_add_exp_complex(a, b):
  """torch's complex log-add-exp step (a: the running value, b: the next element): NaN is
  infectious; two equal infinite real parts give the running value (-inf) or log(e^a + e^b)
  (+inf); otherwise log1p(exp(min - max)) + max, min/max by real part."""
  b_lt = b.real < a.real  # a tie keeps the running value as the min, as torch
  lo, hi = jnp.where(b_lt, b, a), jnp.where(b_lt, a, b)
  nan = jnp.isnan(a) | jnp.isnan(b)
  both_inf = ~jnp.isfinite(lo.real) & (lo.real == hi.real)
  r = jnp.log1p(jnp.exp(lo - hi)) + hi
  r = jnp.where(both_inf, jnp.where(lo.real < 0, lo, jnp.log(jnp.exp(lo) + jnp.exp(hi))), r)
  return jnp.where(nan, jnp.full_like(r, complex(jnp.nan, jnp.nan)), r)


@lowering(aten.logcumsumexp.default, aten._logcumsumexp.default)
def logcumsumexp(self, dim):
  if not jnp.iscomplexobj(self):
    return _scan(lax.cumlogsumexp, self, dim, self.dtype)
  # Complex: torch's sequential scan from -inf + 0j, one `_log_add_exp_complex` step per element.
  x1, axis = _one_axis(self, dim)
  r = lax.associative_scan(_log_add_exp_complex, x1, axis=axis)
  r = _log_add_exp_complex(jnp.full_like(r, complex(-jnp.inf, 0)), r)
  return r.reshape(self.shape)


def _cum_extreme(x, dim, better):
  """cummax/cummin: the running pick moves to a later element when it is NaN, or when neither
  is NaN and `better(later, pick)` (>= / <=, so the *last* tie wins), as torch's kernel does."""
  x1, axis = _one_axis(x, dim)
  idx = lax.broadcasted_iota(jnp.int64, x1.shape, axis)

  def combine(a, b):  # a: earlier segment, b: later segment
    (va, ia), (vb, ib) = a, b
    take_b = better(vb, va)
    if jnp.issubdtype(va.dtype, jnp.inexact):
      take_b = jnp.isnan(vb) | (~jnp.isnan(va) & take_b)
    return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

  _, i = lax.associative_scan(combine, (x1, idx), axis=axis)
  # the values read at the indices: the scan's own lose the sign of a zero (it interleaves by
  # adding), and torch's tie goes to the later element, -0.0 or 0.0
  v = jnp.take_along_axis(x1, i, axis=axis)
  return v.reshape(x.shape), i.reshape(x.shape)


@lowering(aten.cummax.default)
def cummax(self, dim):
  return _cum_extreme(self, dim, jnp.greater_equal)


@lowering(aten.cummin.default)
def cummin(self, dim):
  return _cum_extreme(self, dim, jnp.less_equal)


# ----------------------------------------------------------------------------- logsumexp, softmax


@lowering(aten.logsumexp.default)
def logsumexp(self, dim, keepdim=False):
  if not len(dim) and not keepdim and self.ndim and self.size:
    # torch's CPU kernel: the sum over no dims is every element (0-d), its max kept (1, ..., 1)
    ones = ", ".join(["1"] * self.ndim)
    raise RuntimeError(f"output with shape [] doesn't match the broadcast shape [{ones}]")
  _, out = result_dtypes(self, kind="int_to_float")
  x = self.astype(opmath(out))
  axes = _axes(x, dim)
  # torch shifts by the max real part (-inf for an empty reduction, so it gives -inf)
  m = jnp.max(x.real, axis=axes, keepdims=True, initial=-jnp.inf)
  m = jnp.where(jnp.isinf(m), jnp.zeros_like(m), m)  # torch: an infinite max is not subtracted
  r = jnp.log(jnp.sum(jnp.exp(x - m), axis=axes, keepdims=True)) + m
  return (r if keepdim else jnp.squeeze(r, axes)).astype(out)


def _shift(x, axes):
  """The max over `axes` (kept) that softmax subtracts before `exp`: -inf over an empty dim
  (torch's softmax of nothing is empty; JAX's max of nothing is an error)."""
  return jnp.max(x, axis=axes, keepdims=True, initial=-jnp.inf)


@lowering(aten._softmax.default)
def _softmax(self, dim, half_to_float):
  x = self.astype(opmath(self.dtype))
  axes = _axes(x, dim)
  e = jnp.exp(x - _shift(x, axes))
  out = jnp.float32 if half_to_float else self.dtype
  return (e / jnp.sum(e, axis=axes, keepdims=True)).astype(out)


@lowering(aten._safe_softmax.default)
def _safe_softmax(self, dim, dtype=None):
  """softmax, except that a slice of only -inf gives zeros instead of NaN (SDPA's masked rows)."""
  out_dtype = jax_dtype(dtype, self.dtype)
  x = self.astype(out_dtype).astype(opmath(out_dtype))
  axes = _axes(x, dim)
  # No pass of its own finds the masked rows: the shift is the max of the row with -inf raised
  # to the lowest finite value, so a row of only -inf is shifted by that finite value and
  # exp(x - shift) is exactly 0 there (not exp(nan)). Any other row's sum of exps is at least 1
  # (its max gives exp(0)), so only a masked row sums to 0, and its 0 / 0 becomes 0 / 1. No NaN
  # reaches the gradient either (torch's backward gives 0 there). NaN and +inf still give NaN.
  # The raise happens before the max (not on the max): XLA:CPU then fuses the scores' matmul,
  # the mask, the max and the exp into one kernel, as it does for a plain softmax.
  # (Not `maximum(total, 1)`: its gradient is halved where a sum is exactly 1.)
  lowest = jnp.finfo(x.dtype).min
  m = lax.stop_gradient(jnp.max(jnp.maximum(x, lowest), axis=axes, keepdims=True, initial=lowest))
  e = jnp.exp(x - m)
  total = jnp.sum(e, axis=axes, keepdims=True)
  return (e / jnp.where(total == 0, jnp.ones_like(total), total)).astype(out_dtype)


@lowering(aten._log_softmax.default)
def _log_softmax(self, dim, half_to_float):
  x = self.astype(opmath(self.dtype))
  axes = _axes(x, dim)
  shifted = x - _shift(x, axes)
  total = jnp.sum(jnp.exp(shifted), axis=axes, keepdims=True)
  if x.dtype != self.dtype and not half_to_float and axes == (self.ndim - 1,):
    # torch's CPU kernel over the last dim keeps the sum of exps in the 16-bit type before its
    # log (its kernel over other dims does not): an output near 0 then differs by up to 5%.
    total = total.astype(self.dtype).astype(x.dtype)
  r = shifted - jnp.log(total)
  return r.astype(jnp.float32 if half_to_float else self.dtype)


@lowering(aten._softmax_backward_data.default)
def _softmax_backward_data(grad_output, output, dim, input_dtype):
  g, y = grad_output.astype(opmath(grad_output.dtype)), output.astype(opmath(output.dtype))
  axes = _axes(g, dim)
  r = y * (g - jnp.sum(g * y, axis=axes, keepdims=True))
  return r.astype(jax_dtype(input_dtype))


@lowering(aten._log_softmax_backward_data.default)
def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
  g, y = grad_output.astype(opmath(grad_output.dtype)), output.astype(opmath(output.dtype))
  axes = _axes(g, dim)
  r = g - jnp.exp(y) * jnp.sum(g, axis=axes, keepdims=True)
  return r.astype(jax_dtype(input_dtype))


# ----------------------------------------------------------------------------- covariance

_BITS = {np.dtype(jnp.float16): (5, 10), np.dtype(jnp.bfloat16): (8, 7)}


def _binary(fn, a, b, kind="default"):
  """torch's elementwise `fn(a, b)`: its dtype promotion (0-d tensors and Python numbers by
  category) and, in 16-bit dtypes, its rounding after the op (XLA would fuse in float32)."""
  compute, result = result_dtypes(a, b, kind=kind)
  v = fn(jnp.asarray(a).astype(compute), jnp.asarray(b).astype(compute))
  bits = _BITS.get(np.dtype(compute))
  return (lax.reduce_precision(v, *bits) if bits else v).astype(result)


def _check_weights(w, name, n, integral):
  if w.ndim > 1:
    raise RuntimeError(
      f"cov(): expected {name} to have one or fewer dimensions but got {name} "
      f"with {w.ndim} dimensions"
    )
  if _is_int(w.dtype) != integral or w.dtype == jnp.bool_:
    kind = "integral" if integral else "floating point"
    raise RuntimeError(
      f"cov(): expected {name} to have {kind} dtype but got {name} with {w.dtype} dtype"
    )
  if w.size != n:
    raise RuntimeError(
      f"cov(): expected {name} to have the same numel as there are "
      f"observations in the input but got {w.size} != {n}"
    )
  return w.reshape(-1)


@lowering(aten.cov.default)
def cov(self, correction=1, fweights=None, aweights=None):
  """torch's `cov` (`aten/src/ATen/native/Correlation.cpp`), step by step in its dtypes.

  torch's code reads values to check the weights; it runs on concrete tensors. This
  lowering runs where those values are traced (see `bridge._src.device._WHOLE_WHEN_TRACED`):
  negative weights or weights summing to zero, which torch refuses, give NaN; degrees of
  freedom <= 0 give torch's inf/NaN (it zeroes the normalization factor and warns)."""
  if self.ndim > 2:
    raise RuntimeError(
      "cov(): expected input to have two or fewer dimensions but got an "
      f"input with {self.ndim} dimensions"
    )
  if self.dtype == jnp.bool_:
    raise RuntimeError("cov(): bool dtype is not supported for input")
  x = self.reshape(1, -1) if self.ndim < 2 else self
  n = x.shape[1]
  fw = None if fweights is None else _check_weights(fweights, "fweights", n, True)
  aw = None if aweights is None else _check_weights(aweights, "aweights", n, False)
  w = fw if aw is None else aw if fw is None else _binary(jnp.multiply, fw, aw)
  invalid = jnp.asarray(False)
  for v in (fw, aw):
    if v is not None and n:
      invalid = invalid | (jnp.min(v) < 0)
  mul, sub = functools.partial(_binary, jnp.multiply), functools.partial(_binary, jnp.subtract)
  div = functools.partial(_binary, jnp.true_divide, kind="int_to_float")
  if w is None:
    w_sum = jnp.asarray(n, jnp.int64)
  else:
    w_sum = sum_dim_IntList(w)
    invalid = invalid | (w_sum == 0)
  avg = div(sum_dim_IntList(x if w is None else mul(x, w), [1]), w_sum)
  if w is None:
    norm = jnp.asarray(n - correction, jnp.int64)
  elif correction == 0:
    norm = w_sum
  elif aw is None:
    norm = sub(w_sum, correction)
  elif fw is None and n == 1 and correction == 1:
    norm = jnp.asarray(0, jnp.int64)
  else:
    norm = sub(w_sum, div(mul(correction, sum_dim_IntList(mul(w, aw))), w_sum))
  norm = jnp.where(norm <= 0, jnp.zeros_like(norm), norm)
  if n == 1 and (fw is None) != (aw is None):
    centred = jnp.zeros(x.shape, jnp.float32 if _is_int(x.dtype) else x.dtype)
  else:
    centred = sub(x, avg[:, None])
  other = centred if w is None else mul(centred, w)
  acc = opmath(centred.dtype)
  c = jnp.matmul(
    centred, jnp.conj(other).T, precision=lax.Precision.HIGHEST, preferred_element_type=acc
  ).astype(centred.dtype)
  if jnp.iscomplexobj(c) and 1 in centred.shape:  # torch zeroes a vector's imaginary part
    c = lax.complex(c.real, jnp.zeros_like(c.real))
  out = jnp.squeeze(div(c, norm))
  return jnp.where(invalid, jnp.asarray(jnp.nan, out.dtype), out)
