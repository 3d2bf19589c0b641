"""Reductions: sum/mean/prod, max/min/arg*, var/std, norms, all/any, scans, sort/topk, softmax.

torch semantics kept here (each checked against torch on CPU in tests/ops/test_reduction.py):
* `dim` is None, an int or a list; None and `[]` mean every dim (except `all.dims`/`any.dims`,
  where `[]` reduces nothing). A 0-d tensor accepts dim 0 or -1 and stays 0-d.
* sum/prod/cumsum/cumprod of integers and bools give int64; `dtype=` casts before reducing.
  float16/bfloat16 accumulate in float32 and round once, as torch's CPU kernels do.
* max/min/argmax/argmin propagate NaN and pick the first NaN or the first tie; cummax/cummin
  pick the *last* tie (and the last NaN), as torch does.
* sort is stable in both directions (NaN sorts as the largest value); median, nanmedian,
  kthvalue and mode take their values and indices from that stable order.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from bridge_ops._lowering import aten, jax_dtype, lowering, result_dtypes

_LOW_FLOATS = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))


# ----------------------------------------------------------------------------- helpers

def _axes(x, dim, empty_means_all: bool = True) -> tuple[int, ...]:
  """`dim` (None, int or list) as sorted non-negative axes of `x`."""
  if dim is None:
    return tuple(range(x.ndim))
  dims = [dim] if isinstance(dim, int) else list(dim)
  if not dims:
    return tuple(range(x.ndim)) if empty_means_all else ()
  if x.ndim == 0:  # torch accepts dim 0 / -1 on a 0-d tensor; nothing to reduce
    return ()
  return tuple(sorted(d % x.ndim for d in dims))


def _one_axis(x, dim: int):
  """(x with at least one dim, its axis for `dim`): 0-d tensors are treated as shape (1,)."""
  if x.ndim == 0:
    return x.reshape(1), 0
  return x, dim % x.ndim


def _is_int(dtype) -> bool:
  return jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_)


def _acc(dtype):
  """The dtype torch's CPU kernels accumulate `dtype` in (float32 for 16-bit floats)."""
  return jnp.dtype(jnp.float32) if np.dtype(dtype) in _LOW_FLOATS else jnp.dtype(dtype)


def _real(dtype):
  return jnp.finfo(dtype).dtype if jnp.issubdtype(dtype, jnp.complexfloating) else dtype


def _sum_dtype(x, dtype):
  """torch's result dtype of sum/prod/cumsum: `dtype`, else int64 for integers and bools."""
  if dtype is not None:
    return jax_dtype(dtype)
  return jnp.dtype(jnp.int64) if _is_int(x.dtype) else x.dtype


def _count(x, axes) -> int:
  return math.prod(x.shape[a] for a in axes)


def _squeeze(x, axis: int, keepdim: bool, was_0d: bool):
  if was_0d:
    return x.reshape(())
  return x if keepdim else jnp.squeeze(x, axis)


def _sort(x, axis: int, descending: bool):
  """torch's stable sort along `axis`: NaN largest, ties keep their order; int64 indices."""
  idx = lax.broadcasted_iota(jnp.int64, x.shape, axis)
  if not descending:
    return lax.sort((x, idx), dimension=axis, num_keys=1, is_stable=True)
  # Descending and stable = ascending by (value, -index), reversed.
  v, neg = lax.sort((x, -idx), dimension=axis, num_keys=2)
  return jnp.flip(v, axis), -jnp.flip(neg, axis)


# ----------------------------------------------------------------------------- sum, mean, prod

@lowering(aten.sum.default, aten.sum.dim_IntList)
def sum_dim_IntList(self, dim=None, keepdim=False, *, dtype=None):
  out = _sum_dtype(self, dtype)
  r = jnp.sum(self.astype(out), axis=_axes(self, dim), keepdims=keepdim, dtype=_acc(out))
  return r.astype(out)


@lowering(aten.trace.default)
def trace(self):
  out = _sum_dtype(self, None)
  return jnp.trace(self.astype(out), dtype=_acc(out)).astype(out)


@lowering(aten.nansum.default)
def nansum(self, dim=None, keepdim=False, *, dtype=None):
  x = self if _is_int(self.dtype) else jnp.where(jnp.isnan(self), jnp.zeros_like(self), self)
  return sum_dim_IntList(x, dim, keepdim, dtype=dtype)


@lowering(aten.mean.default, aten.mean.dim)
def mean_dim(self, dim=None, keepdim=False, *, dtype=None):
  out = jax_dtype(dtype, self.dtype)
  axes = _axes(self, dim)
  s = jnp.sum(self.astype(out), axis=axes, keepdims=keepdim, dtype=_acc(out))
  return (s / _count(self, axes)).astype(out)


@lowering(aten.prod.default, aten.prod.dim_int)
def prod_dim_int(self, dim=None, keepdim=False, *, dtype=None):
  out = _sum_dtype(self, dtype)
  r = jnp.prod(self.astype(out), axis=_axes(self, dim), keepdims=keepdim, dtype=_acc(out))
  return r.astype(out)


# ----------------------------------------------------------------------------- max, min, arg*

@lowering(aten.max.default)
def max_default(self):
  return jnp.max(self)


@lowering(aten.min.default)
def min_default(self):
  return jnp.min(self)


@lowering(aten.amax.default)
def amax(self, dim=(), keepdim=False):
  return jnp.max(self, axis=_axes(self, dim), keepdims=keepdim)


@lowering(aten.amin.default)
def amin(self, dim=(), keepdim=False):
  return jnp.min(self, axis=_axes(self, dim), keepdims=keepdim)


@lowering(aten.aminmax.default)
def aminmax(self, *, dim=None, keepdim=False):
  return amin(self, dim, keepdim), amax(self, dim, keepdim)


def _arg_reduce(arg_fn, x, dim, keepdim):
  if dim is None:
    i = arg_fn(x.reshape(-1)).astype(jnp.int64)
    return i.reshape((1,) * x.ndim) if keepdim else i
  x1, axis = _one_axis(x, dim)
  i = arg_fn(x1, axis=axis, keepdims=True).astype(jnp.int64)
  return _squeeze(i, axis, keepdim, x.ndim == 0)


@lowering(aten.argmax.default)
def argmax(self, dim=None, keepdim=False):
  return _arg_reduce(jnp.argmax, self, dim, keepdim)  # first max; first NaN wins, as torch


@lowering(aten.argmin.default)
def argmin(self, dim=None, keepdim=False):
  return _arg_reduce(jnp.argmin, self, dim, keepdim)


def _value_index(arg_fn, x, dim, keepdim):
  x1, axis = _one_axis(x, dim)
  i = arg_fn(x1, axis=axis, keepdims=True).astype(jnp.int64)
  v = jnp.take_along_axis(x1, i, axis)
  return _squeeze(v, axis, keepdim, x.ndim == 0), _squeeze(i, axis, keepdim, x.ndim == 0)


@lowering(aten.max.dim)
def max_dim(self, dim, keepdim=False):
  return _value_index(jnp.argmax, self, dim, keepdim)


@lowering(aten.min.dim)
def min_dim(self, dim, keepdim=False):
  return _value_index(jnp.argmin, self, dim, keepdim)


# ----------------------------------------------------------------------------- var, std

def _var_mean(x, dim, correction, keepdim, sqrt=False):
  """(variance or std, mean), computed in float32 for 16-bit floats and rounded once; the
  variance is real for complex inputs."""
  axes = _axes(x, dim)
  n = _count(x, axes)
  xa = x.astype(_acc(x.dtype))
  mean = jnp.sum(xa, axis=axes, keepdims=True) / n
  d = xa - mean
  sq = (d * jnp.conj(d)).real if jnp.iscomplexobj(d) else d * d
  # torch divides by max(0, N - correction) (so N <= correction gives inf or nan).
  dof = jnp.maximum(n - (1 if correction is None else correction), 0)
  var = jnp.sum(sq, axis=axes, keepdims=keepdim) / dof
  if sqrt:
    var = jnp.sqrt(var)
  if not keepdim:
    mean = jnp.squeeze(mean, axes)
  return var.astype(_real(x.dtype)), mean.astype(x.dtype)


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
  out = _real(x.dtype)
  a = jnp.abs(x).astype(_acc(out))
  axes = _axes(x, dim)
  if ord == math.inf:
    r = jnp.max(a, axis=axes, keepdims=keepdim)
  elif ord == -math.inf:
    r = jnp.min(a, axis=axes, keepdims=keepdim)
  elif ord == 0:
    r = jnp.sum(a != 0, axis=axes, keepdims=keepdim, dtype=a.dtype)
  elif ord == 1:
    r = jnp.sum(a, axis=axes, keepdims=keepdim)
  elif ord == 2:
    r = jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
  else:
    r = jnp.sum(a ** ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)
  return r.astype(out)


@lowering(aten.linalg_vector_norm.default, static_argnames=("ord",))
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None):
  return _vector_norm(self, ord, dim, keepdim, dtype)


@lowering(aten.norm.Scalar, aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dim_dtype,
          aten.norm.ScalarOpt_dtype, static_argnames=("p",))
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
  return fn(x1.astype(_acc(out)), axis=axis).astype(out).reshape(x.shape)


@lowering(aten.cumsum.default)
def cumsum(self, dim, *, dtype=None):
  return _scan(lax.cumsum, self, dim, _sum_dtype(self, dtype))


@lowering(aten.cumprod.default)
def cumprod(self, dim, *, dtype=None):
  return _scan(lax.cumprod, self, dim, _sum_dtype(self, dtype))


@lowering(aten.logcumsumexp.default, aten._logcumsumexp.default)
def logcumsumexp(self, dim):
  return _scan(lax.cumlogsumexp, self, dim, self.dtype)


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

  v, i = lax.associative_scan(combine, (x1, idx), axis=axis)
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
  _, out = result_dtypes(self, kind="int_to_float")
  x = self.astype(_acc(out))
  axes = _axes(x, dim)
  m = jnp.max(x, axis=axes, keepdims=True, initial=-jnp.inf)  # -inf: empty reductions give -inf
  m = jnp.where(jnp.isinf(m), jnp.zeros_like(m), m)  # torch: an infinite max is not subtracted
  r = jnp.log(jnp.sum(jnp.exp(x - m), axis=axes, keepdims=True)) + m
  return (r if keepdim else jnp.squeeze(r, axes)).astype(out)


@lowering(aten._softmax.default)
def _softmax(self, dim, half_to_float):
  x = self.astype(_acc(self.dtype))
  axes = _axes(x, dim)
  e = jnp.exp(x - jnp.max(x, axis=axes, keepdims=True))
  out = jnp.float32 if half_to_float else self.dtype
  return (e / jnp.sum(e, axis=axes, keepdims=True)).astype(out)


@lowering(aten._safe_softmax.default)
def _safe_softmax(self, dim, dtype=None):
  """softmax, except that a slice of only -inf gives zeros instead of NaN (SDPA's masked rows)."""
  x = self.astype(jax_dtype(dtype, self.dtype))
  axes = _axes(x, dim)
  out = _softmax(x, dim, False)
  masked = jnp.all(x == -jnp.inf, axis=axes, keepdims=True)
  return jnp.where(masked, jnp.zeros_like(out), out)


@lowering(aten._log_softmax.default)
def _log_softmax(self, dim, half_to_float):
  x = self.astype(_acc(self.dtype))
  axes = _axes(x, dim)
  shifted = x - jnp.max(x, axis=axes, keepdims=True)
  r = shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=axes, keepdims=True))
  return r.astype(jnp.float32 if half_to_float else self.dtype)


@lowering(aten._softmax_backward_data.default)
def _softmax_backward_data(grad_output, output, dim, input_dtype):
  g, y = grad_output.astype(_acc(grad_output.dtype)), output.astype(_acc(output.dtype))
  axes = _axes(g, dim)
  r = y * (g - jnp.sum(g * y, axis=axes, keepdims=True))
  return r.astype(jax_dtype(input_dtype))


@lowering(aten._log_softmax_backward_data.default)
def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
  g, y = grad_output.astype(_acc(grad_output.dtype)), output.astype(_acc(output.dtype))
  axes = _axes(g, dim)
  r = g - jnp.exp(y) * jnp.sum(g, axis=axes, keepdims=True)
  return r.astype(jax_dtype(input_dtype))


# ---------------------------------------------------------------- sort, topk, order statistics

@lowering(aten.sort.default, aten.sort.stable)
def sort(self, dim=-1, descending=False, *, stable=None):
  # torch leaves the order of ties to the kernel when stable=False; stable is a valid choice.
  x1, axis = _one_axis(self, dim)
  v, i = _sort(x1, axis, descending)
  return v.reshape(self.shape), i.reshape(self.shape)


@lowering(aten.topk.default)
def topk(self, k, dim=-1, largest=True, sorted=True):
  # Returned sorted whatever `sorted` says (torch leaves the order unspecified then).
  x1, axis = _one_axis(self, dim)
  if largest:
    # lax.top_k: NaN is the largest value, ties keep index order; it works on the last axis.
    xm = jnp.moveaxis(x1, axis, -1)
    v, i = lax.top_k(xm.astype(jnp.uint8) if xm.dtype == jnp.bool_ else xm, k)
    v, i = jnp.moveaxis(v.astype(xm.dtype), -1, axis), jnp.moveaxis(i.astype(jnp.int64), -1, axis)
  else:
    v, i = _sort(x1, axis, descending=False)
    v, i = lax.slice_in_dim(v, 0, k, axis=axis), lax.slice_in_dim(i, 0, k, axis=axis)
  if self.ndim == 0:
    v, i = v.reshape(()), i.reshape(())
  return v, i


def _pick(v, i, pos, axis, keepdim, was_0d):
  """Values and indices at per-slice position `pos` (shape of v with `axis` of size 1)."""
  pv = jnp.take_along_axis(v, pos, axis)
  pi = jnp.take_along_axis(i, pos, axis)
  return _squeeze(pv, axis, keepdim, was_0d), _squeeze(pi, axis, keepdim, was_0d)


@lowering(aten.kthvalue.default)
def kthvalue(self, k, dim=-1, keepdim=False):
  x1, axis = _one_axis(self, dim)
  v, i = _sort(x1, axis, descending=False)
  v, i = lax.slice_in_dim(v, k - 1, k, axis=axis), lax.slice_in_dim(i, k - 1, k, axis=axis)
  return _squeeze(v, axis, keepdim, self.ndim == 0), _squeeze(i, axis, keepdim, self.ndim == 0)


def _median(x, axis, keepdim, was_0d, ignore_nan):
  """Lower median along `axis`. median: any NaN -> the first NaN (value and index);
  nanmedian: the lower median of the non-NaN values (all NaN -> the first NaN)."""
  v, i = _sort(x, axis, descending=False)  # NaN last, ties in index order
  n = x.shape[axis]
  shape1 = x.shape[:axis] + (1,) + x.shape[axis + 1:]
  if not jnp.issubdtype(x.dtype, jnp.inexact):
    return _pick(v, i, jnp.full(shape1, (n - 1) // 2, jnp.int64), axis, keepdim, was_0d)
  nan = jnp.isnan(x)
  if ignore_nan:
    valid = n - jnp.sum(nan, axis=axis, keepdims=True, dtype=jnp.int64)
    pos = jnp.maximum(valid - 1, 0) // 2
    return _pick(v, i, pos, axis, keepdim, was_0d)
  pos = jnp.full(shape1, (n - 1) // 2, jnp.int64)
  pv, pi = _pick(v, i, pos, axis, True, False)
  has_nan = jnp.any(nan, axis=axis, keepdims=True)
  first_nan = jnp.argmax(nan, axis=axis, keepdims=True).astype(jnp.int64)
  pv = jnp.where(has_nan, jnp.full_like(pv, jnp.nan), pv)
  pi = jnp.where(has_nan, first_nan, pi)
  return _squeeze(pv, axis, keepdim, was_0d), _squeeze(pi, axis, keepdim, was_0d)


def _median_all(x, ignore_nan):
  if x.size == 0:  # torch returns NaN for an empty input
    return jnp.full((), jnp.nan, x.dtype)
  return _median(x.reshape(-1), 0, False, True, ignore_nan)[0]


@lowering(aten.median.default)
def median(self):
  return _median_all(self, ignore_nan=False)


@lowering(aten.nanmedian.default)
def nanmedian(self):
  return _median_all(self, ignore_nan=True)


@lowering(aten.median.dim)
def median_dim(self, dim, keepdim=False):
  x1, axis = _one_axis(self, dim)
  return _median(x1, axis, keepdim, self.ndim == 0, ignore_nan=False)


@lowering(aten.nanmedian.dim)
def nanmedian_dim(self, dim, keepdim=False):
  x1, axis = _one_axis(self, dim)
  return _median(x1, axis, keepdim, self.ndim == 0, ignore_nan=True)


@lowering(aten.mode.default)
def mode(self, dim=-1, keepdim=False):
  """Most frequent value (the smallest on a tie) and the index of its last occurrence, as
  torch's CPU kernel gives while its sort keeps equal values in order."""
  x1, axis = _one_axis(self, dim)
  v, i = _sort(x1, axis, descending=False)
  n = x1.shape[axis]
  pos = lax.broadcasted_iota(jnp.int64, v.shape, axis)
  head = lax.slice_in_dim(v, 0, n - 1, axis=axis)
  tail = lax.slice_in_dim(v, 1, n, axis=axis)
  edge = jnp.ones_like(lax.slice_in_dim(v, 0, 1, axis=axis), dtype=jnp.bool_)
  starts = jnp.concatenate([edge, tail != head], axis=axis)  # a run of equal values starts
  ends = jnp.concatenate([tail != head, edge], axis=axis)    # a run ends
  run_start = lax.cummax(jnp.where(starts, pos, 0), axis=axis)
  length = jnp.where(ends, pos - run_start + 1, 0)            # run length, at each run's end
  best = jnp.argmax(length, axis=axis, keepdims=True)         # first longest = smallest value
  return _pick(v, i, best, axis, keepdim, self.ndim == 0)
