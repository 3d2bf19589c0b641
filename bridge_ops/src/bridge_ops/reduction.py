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

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bridge_ops._lowering import (aten, check, fori_loop, jax_dtype, lowering, opmath,
                                  p_norm, result_dtypes, torch_abs, while_loop, with_derivative)



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
  r = jnp.sum(self.astype(out), axis=_axes(self, dim), keepdims=keepdim, dtype=opmath(out))
  return r.astype(out)


@lowering(aten.trace.default)
def trace(self):
  out = _sum_dtype(self, None)
  return jnp.trace(self.astype(out), dtype=opmath(out)).astype(out)


@lowering(aten.nansum.default)
def nansum(self, dim=None, keepdim=False, *, dtype=None):
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
  r = jnp.prod(self.astype(out), axis=_axes(self, dim), keepdims=keepdim, dtype=opmath(out))
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

# torch's std backward divides by 2 * std and gives 0 where std is 0 (a constant input);
# sqrt's own rule gives inf there, so NaN once multiplied by the zero derivative of var.
_std_sqrt = with_derivative(
    jnp.sqrt, lambda out, v, t: jnp.where(out == 0, jnp.zeros((), out.dtype),
                                          t[0] / (2 * jnp.where(out == 0, 1, out))))


def _var_mean(x, dim, correction, keepdim, sqrt=False):
  """(variance or std, mean), computed in float32 for 16-bit floats and rounded once; the
  variance is real for complex inputs."""
  axes = _axes(x, dim)
  n = _count(x, axes)
  xa = x.astype(opmath(x.dtype))
  mean = jnp.sum(xa, axis=axes, keepdims=True) / n
  d = xa - mean
  sq = (d * jnp.conj(d)).real if jnp.iscomplexobj(d) else d * d
  # torch divides by max(0, N - correction) (so N <= correction gives inf or nan).
  dof = jnp.maximum(n - (1 if correction is None else correction), 0)
  var = jnp.sum(sq, axis=axes, keepdims=keepdim) / dof
  if sqrt:
    var = _std_sqrt(var)
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
  _, out = result_dtypes(self, kind="int_to_float")
  x = self.astype(opmath(out))
  axes = _axes(x, dim)
  # torch shifts by the max real part (-inf for an empty reduction, so it gives -inf)
  m = jnp.max(x.real, axis=axes, keepdims=True, initial=-jnp.inf)
  m = jnp.where(jnp.isinf(m), jnp.zeros_like(m), m)  # torch: an infinite max is not subtracted
  r = jnp.log(jnp.sum(jnp.exp(x - m), axis=axes, keepdims=True)) + m
  return (r if keepdim else jnp.squeeze(r, axes)).astype(out)


@lowering(aten._softmax.default)
def _softmax(self, dim, half_to_float):
  x = self.astype(opmath(self.dtype))
  axes = _axes(x, dim)
  e = jnp.exp(x - jnp.max(x, axis=axes, keepdims=True))
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
  m = lax.stop_gradient(jnp.max(jnp.maximum(x, lowest), axis=axes, keepdims=True))
  e = jnp.exp(x - m)
  total = jnp.sum(e, axis=axes, keepdims=True)
  return (e / jnp.where(total == 0, jnp.ones_like(total), total)).astype(out_dtype)


@lowering(aten._log_softmax.default)
def _log_softmax(self, dim, half_to_float):
  x = self.astype(opmath(self.dtype))
  axes = _axes(x, dim)
  shifted = x - jnp.max(x, axis=axes, keepdims=True)
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


# ---------------------------------------------------------------- sort, topk, order statistics

def _order_keys(x, descending: bool):
  """int32 keys whose `<` is torch's sort comparator on `x`: dense ranks with every NaN equal and
  largest, -0.0 == 0.0; negated for a descending sort (NaN first)."""
  v, idx = _sort(x, 0, descending=False)
  same = v[1:] == v[:-1]
  if jnp.issubdtype(x.dtype, jnp.inexact):
    same = same | (jnp.isnan(v[1:]) & jnp.isnan(v[:-1]))
  rank = jnp.cumsum(jnp.concatenate([jnp.zeros((1,), jnp.int32), (~same).astype(jnp.int32)]))
  keys = jnp.zeros(x.shape, jnp.int32).at[idx].set(rank)
  return -keys if descending else keys


def _segment_cumsum(flags, first):
  """Exclusive count of `flags` before each position, counted from its segment's `first`."""
  c = jnp.cumsum(flags.astype(jnp.int32)) - flags.astype(jnp.int32)
  return c - c[first]


def _introsort_order(key):
  """The permutation libstdc++'s `std::sort` (introsort, as torch's CPU sort kernel runs it for
  stable=False) leaves a 1-d int `key` in, `<` as comparator: median-of-3 Hoare partitions of
  every segment longer than 16, one tree level at a time (the k-th left stopper swaps with the
  k-th right stopper while they have not crossed), then the final insertion sort, which is a
  stable sort of the partitioned order. Segments still longer than 16 when the depth limit is
  reached (heapsort in libstdc++, for median-of-3-killer inputs only) are sorted stably here."""
  n = key.shape[0]
  pos = jnp.arange(n, dtype=jnp.int32)
  if n > 16:
    def level(state):
      a, perm, head, depth = state
      seg = jnp.cumsum(head.astype(jnp.int32)) - 1
      starts = jax.ops.segment_min(pos, seg, n)
      ends = jax.ops.segment_max(pos, seg, n) + 1
      first, last = starts[seg], ends[seg]
      active = last - first > 16
      mid = first + (last - first) // 2
      # __move_median_to_first(first, first + 1, mid, last - 1)
      ia, ib, ic = first + 1, mid, jnp.maximum(last - 1, 0)
      va, vb, vc = a[jnp.minimum(ia, n - 1)], a[ib], a[ic]
      chosen = jnp.where(va < vb, jnp.where(vb < vc, ib, jnp.where(va < vc, ic, ia)),
                         jnp.where(va < vc, ia, jnp.where(vb < vc, ic, ib)))
      src = jnp.where(active & (pos == first), chosen, pos)
      src = jnp.where(active & (pos == chosen[first]), first, src)
      a, perm = a[src], perm[src]
      # __unguarded_partition(first + 1, last, pivot = *first)
      pivot = a[first]
      left = active & (pos > first) & ~(a < pivot)
      right = active & ~(pivot < a)
      lrank = _segment_cumsum(left, first)
      rc = jnp.cumsum(right.astype(jnp.int32))
      rrank = rc[jnp.maximum(last - 1, 0)] - rc            # right stoppers above, in the segment
      drop = jnp.full_like(pos, n)
      lpos = jnp.full((n,), n, jnp.int32).at[jnp.where(left, first + lrank, drop)].set(
          pos, mode="drop")
      rpos = jnp.full((n,), -1, jnp.int32).at[jnp.where(right, first + rrank, drop)].set(
          pos, mode="drop")
      k = pos - first                                        # position t holds pair k of its segment
      pair = active & (lpos < n) & (rpos >= 0) & (lpos < rpos)
      npairs = jax.ops.segment_sum(pair.astype(jnp.int32), seg, n)[seg]
      pair = pair & (k < npairs)
      src = pos.at[jnp.where(pair, lpos, drop)].set(rpos, mode="drop")
      src = src.at[jnp.where(pair, rpos, drop)].set(lpos, mode="drop")
      a, perm = a[src], perm[src]
      # the cut: the left pointer's stop, min(L_K, R_{K-1}) (R_{-1} = last)
      l_k = lpos[jnp.minimum(first + npairs, n - 1)]
      l_k = jnp.where(first + npairs < last, l_k, n)
      r_prev = jnp.where(npairs > 0, rpos[jnp.maximum(first + npairs - 1, 0)], last)
      cut = jnp.minimum(l_k, r_prev)
      head = head | (active & (pos == cut))
      return a, perm, head, depth + 1

    def more(state):
      a, perm, head, depth = state
      seg = jnp.cumsum(head.astype(jnp.int32)) - 1
      sizes = jax.ops.segment_sum(jnp.ones_like(pos), seg, n)
      return (depth < 2 * (n.bit_length() - 1)) & jnp.any(sizes > 16)

    state = (key, pos, pos == 0, 0)
    key, order, _, _ = while_loop(more, level, state)
  else:
    order = pos
  _, final = lax.sort((key, pos), num_keys=1, is_stable=True)
  return order[final]


# torch's CPU sort runs x86-simd-sort for these when stable=False: an order of ties this lowering
# cannot reproduce (it gives the stable order); the other dtypes go through std::sort.
_XSS_DTYPES = tuple(np.dtype(t) for t in (jnp.int32, jnp.int64, jnp.float32, jnp.float64))


@lowering(aten.sort.default, aten.sort.stable)
def sort(self, dim=-1, descending=False, *, stable=None):
  """torch.sort: NaN sorts as the largest value. stable=True keeps ties in order; stable=False
  reproduces the order of ties torch's CPU kernel (std::sort) leaves (stable up to 16 elements)."""
  x1, axis = _one_axis(self, dim)
  if stable or np.dtype(self.dtype) in _XSS_DTYPES or x1.shape[axis] <= 16:
    v, i = _sort(x1, axis, descending)
    return v.reshape(self.shape), i.reshape(self.shape)
  xm = jnp.moveaxis(x1, axis, -1)
  rows = xm.reshape(-1, xm.shape[-1])
  order = jax.vmap(lambda r: _introsort_order(_order_keys(r, descending)))(rows)
  i = order.astype(jnp.int64).reshape(xm.shape)
  v = jnp.take_along_axis(xm, i, -1)
  v, i = jnp.moveaxis(v, -1, axis), jnp.moveaxis(i, -1, axis)
  return v.reshape(self.shape), i.reshape(self.shape)


def _pointer_stops(left, right, pos, n, big):
  """Hoare partition's pointer stops, vectorised: the positions where the left pointer stops
  (ascending, `big` past the last) and where the right one stops (descending, `-big` past)."""
  lrank = jnp.cumsum(left.astype(jnp.int32)) - left
  rrank = jnp.sum(right.astype(jnp.int32)) - jnp.cumsum(right.astype(jnp.int32))
  nl, nr = jnp.sum(left.astype(jnp.int32)), jnp.sum(right.astype(jnp.int32))
  lpos = jnp.full((n,), big).at[jnp.where(left, lrank, n)].set(pos, mode="drop")
  rpos = jnp.full((n,), -big).at[jnp.where(right, rrank, n)].set(pos, mode="drop")
  return jnp.where(pos >= nl, big, lpos), jnp.where(pos >= nr, -big, rpos)


def _introselect_order(key, nth: int):
  """The permutation libstdc++'s `std::nth_element(first, first + nth, last)` (introselect)
  leaves the 1-d int `key` in, `<` as comparator: median-of-3 Hoare partitions (as in
  `_introsort_order`) of the part holding `nth` while it is longer than 3, then an insertion sort
  of that part. (Past the depth limit libstdc++ heap-selects; that order is not reproduced.)"""
  n = key.shape[0]
  pos = jnp.arange(n, dtype=jnp.int32)
  big = jnp.int32(n + 1)

  def body(state):
    a, perm, first, last, depth = state
    mid = first + (last - first) // 2
    ia, ib, ic = first + 1, mid, last - 1
    va, vb, vc = a[ia], a[ib], a[ic]
    chosen = jnp.where(va < vb, jnp.where(vb < vc, ib, jnp.where(va < vc, ic, ia)),
                       jnp.where(va < vc, ia, jnp.where(vb < vc, ic, ib)))
    a, perm = _swap((a, perm), first, chosen)
    piv = a[first]
    left = (pos > first) & (pos < last) & ~(a < piv)
    right = (pos >= first) & (pos < last) & ~(piv < a)
    lpos, rpos = _pointer_stops(left, right, pos, n, big)
    swaps = jnp.sum((lpos < rpos).astype(jnp.int32))
    l_k = jnp.where(swaps < n, lpos[jnp.minimum(swaps, n - 1)], big)
    r_prev = jnp.where(swaps > 0, rpos[jnp.maximum(swaps - 1, 0)], last)
    cut = jnp.minimum(l_k, r_prev)
    pair = pos < swaps
    src = pos.at[jnp.where(pair, lpos, n)].set(rpos, mode="drop")
    src = src.at[jnp.where(pair, rpos, n)].set(lpos, mode="drop")
    a, perm = a[src], perm[src]
    return (a, perm, jnp.where(cut <= nth, cut, first), jnp.where(cut <= nth, last, cut),
            depth + 1)

  def more(state):
    _, _, first, last, depth = state
    return (last - first > 3) & (depth < 2 * (n.bit_length() - 1))

  state = (key, pos, jnp.int32(0), jnp.int32(n), 0)
  a, perm, first, last, _ = while_loop(more, body, state)
  inside = (pos >= first) & (pos < last)
  block = jnp.where(pos < first, 0, jnp.where(inside, 1, 2))
  _, _, final = lax.sort((block, jnp.where(inside, a, pos), pos), num_keys=2, is_stable=True)
  return perm[final]


def _adjust_heap(a, p, hole, length, value, vp, steps: int):
  """libstdc++'s __adjust_heap on the heap a[:length] (and its payload p): sift the hole at
  `hole` down to a leaf, then push `value` up from there (`<` on keys as comparator). `length`
  may be traced; `steps` bounds the depth of the heap."""
  top = hole
  child = hole
  last = jnp.maximum(length - 1, 0)
  for _ in range(steps):
    go = child < (length - 1) // 2
    c2 = 2 * (child + 1)
    c2 = jnp.where(a[jnp.minimum(c2, last)] < a[jnp.clip(c2 - 1, 0, last)], c2 - 1, c2)
    c2 = jnp.minimum(c2, last)
    a = jnp.where(go, a.at[hole].set(a[c2]), a)
    p = jnp.where(go, p.at[hole].set(p[c2]), p)
    hole = jnp.where(go, c2, hole)
    child = jnp.where(go, c2, child)
  odd_child = ((length & 1) == 0) & (child == (length - 2) // 2)
  c2 = jnp.clip(2 * (child + 1) - 1, 0, last)
  a = jnp.where(odd_child, a.at[hole].set(a[c2]), a)
  p = jnp.where(odd_child, p.at[hole].set(p[c2]), p)
  hole = jnp.where(odd_child, c2, hole)
  for _ in range(steps):  # __push_heap
    parent = jnp.maximum((hole - 1) // 2, 0)
    go = (hole > top) & (a[parent] < value)
    a = jnp.where(go, a.at[hole].set(a[parent]), a)
    p = jnp.where(go, p.at[hole].set(p[parent]), p)
    hole = jnp.where(go, parent, hole)
  return a.at[hole].set(value), p.at[hole].set(vp)


def _partial_sort_order(key, k: int):
  """The first k of the permutation libstdc++'s `std::partial_sort(first, first + k, last)`
  leaves the 1-d int `key` in (`<` as comparator): make_heap of the first k, each later element
  smaller than the heap's top replaces it (pop_heap), then sort_heap."""
  n = key.shape[0]
  steps = k.bit_length() + 1
  a, p = key[:k], jnp.arange(k, dtype=jnp.int32)

  def make(t, state):  # __make_heap: parents (k - 2) // 2 down to 0
    a, p = state
    parent = (k - 2) // 2 - t
    return _adjust_heap(a, p, parent, k, a[parent], p[parent], steps)
  if k >= 2:
    a, p = fori_loop(0, (k - 2) // 2 + 1, make, (a, p))

  def select(i, state):  # __heap_select
    a, p = state
    na, np_ = _adjust_heap(a, p, jnp.int32(0), k, key[i], i.astype(jnp.int32), steps)
    take = key[i] < a[0]
    return jnp.where(take, na, a), jnp.where(take, np_, p)
  a, p = fori_loop(k, n, select, (a, p))

  def pop(t, state):  # __sort_heap
    a, p = state
    last = k - 1 - t
    va, vp = a[last], p[last]
    a, p = a.at[last].set(a[0]), p.at[last].set(p[0])
    return _adjust_heap(a, p, jnp.int32(0), last, va, vp, steps)
  a, p = fori_loop(0, k - 1, pop, (a, p))
  return p


def _topk_row(x, k: int, largest: bool, sorted: bool):
  """torch's CPU topk of one row: std::partial_sort when k * 64 <= n, else std::nth_element to
  put the k-th in place, then std::sort of the k - 1 before it when `sorted`."""
  n = x.shape[0]
  keys = _order_keys(x, descending=largest)
  if k * 64 <= n:
    return _partial_sort_order(keys, k)
  order = _introselect_order(keys, k - 1)[:k]
  if sorted and k > 1:
    head = _introsort_order(keys[order[:k - 1]])
    order = jnp.concatenate([order[:k - 1][head], order[k - 1:]])
  return order


@lowering(aten.topk.default)
def topk(self, k, dim=-1, largest=True, sorted=True):
  """The k largest (smallest) values, NaN largest, with the order of ties (and, for
  sorted=False, of the values) that torch's CPU kernel (libstdc++ partial_sort, or nth_element
  then sort) gives."""
  x1, axis = _one_axis(self, dim)
  n = x1.shape[axis]
  if k == 0:
    if largest:
      xm = jnp.moveaxis(x1, axis, -1)
      v, i = lax.top_k(xm.astype(jnp.uint8) if xm.dtype == jnp.bool_ else xm, k)
      v, i = jnp.moveaxis(v.astype(xm.dtype), -1, axis), jnp.moveaxis(i.astype(jnp.int64), -1, axis)
    else:
      v, i = _sort(x1, axis, descending=False)
      v, i = lax.slice_in_dim(v, 0, k, axis=axis), lax.slice_in_dim(i, 0, k, axis=axis)
  else:
    xm = jnp.moveaxis(x1, axis, -1)
    rows = xm.reshape(-1, n)
    order = jax.vmap(lambda r: _topk_row(r, k, largest, sorted))(rows)
    i = order.astype(jnp.int64).reshape(xm.shape[:-1] + (k,))
    v = jnp.take_along_axis(xm, i, -1)
    v, i = jnp.moveaxis(v, -1, axis), jnp.moveaxis(i, -1, axis)
  if self.ndim == 0:
    v, i = v.reshape(()), i.reshape(())
  return v, i


def _pick(v, i, pos, axis, keepdim, was_0d):
  """Values and indices at per-slice position `pos` (shape of v with `axis` of size 1)."""
  pv = jnp.take_along_axis(v, pos, axis)
  pi = jnp.take_along_axis(i, pos, axis)
  return _squeeze(pv, axis, keepdim, was_0d), _squeeze(pi, axis, keepdim, was_0d)


def _swap(arrays, i, j):
  """Swaps positions i and j (0-d int arrays) of every 1-d array in `arrays`."""
  out = []
  for a in arrays:
    ai, aj = a[i], a[j]
    out.append(a.at[i].set(aj).at[j].set(ai))
  return out


def _quickselect_order(key, kth: int):
  """The permutation torch's CPU `quick_select_template` (Sedgewick's quickselect, used by
  kthvalue) leaves the 1-d int `key` in when it selects position `kth`. Each round is one
  vectorized Hoare partition: the k-th left stopper (key >= pivot, from L + 2 up) swaps with the
  k-th right stopper (key <= pivot, from R - 1 down) until they cross; a stopper met by both
  pointers at once is swapped with itself and the scan goes on, as in the C++ loop."""
  n = key.shape[0]
  pos = jnp.arange(n, dtype=jnp.int32)
  big = jnp.int32(n + 1)

  def body(state):
    a, perm, lo, hi, _ = state
    two = hi == lo + 1
    # two elements: order them and stop
    a2, perm2 = _swap((a, perm), jnp.where(two & (a[lo] > a[hi]), lo, hi), hi)
    # median of three into L, L + 1, R
    p = (lo + hi) >> 1
    a, perm = _swap((a, perm), p, lo + 1)
    for x, y in ((lo + 1, hi), (lo, hi), (lo + 1, lo)):
      a, perm = _swap((a, perm), jnp.where(a[x] > a[y], x, y), y)
    piv = a[lo]
    left = (pos >= lo + 2) & (pos <= hi) & (a >= piv)
    right = (pos >= lo + 1) & (pos <= hi - 1) & (a <= piv)
    lpos, rpos = _pointer_stops(left, right, pos, n, big)
    swaps = jnp.sum((lpos < rpos).astype(jnp.int32))      # pairs swapped before the pointers meet
    meet = (lpos[jnp.minimum(swaps, n - 1)] == rpos[jnp.minimum(swaps, n - 1)]) & (swaps < n)
    t = swaps + meet.astype(jnp.int32)                     # the round in which they cross

    def at(arr, idx, missing):
      return jnp.where((idx >= 0) & (idx < n), arr[jnp.clip(idx, 0, n - 1)], missing)
    i = jnp.minimum(at(lpos, t, big), at(rpos, swaps - 1, big))
    j = jnp.maximum(at(rpos, t, -big), at(lpos, swaps - 1, -big))
    pair = pos < swaps
    src = pos.at[jnp.where(pair, lpos, n)].set(rpos, mode="drop")
    src = src.at[jnp.where(pair, rpos, n)].set(lpos, mode="drop")
    a, perm = a[src], perm[src]
    a, perm = _swap((a, perm), lo, j)
    new_lo = jnp.where(j <= kth, i, lo)
    new_hi = jnp.where(j >= kth, j - 1, hi)
    a = jnp.where(two, a2, a)
    perm = jnp.where(two, perm2, perm)
    return a, perm, jnp.where(two, lo, new_lo), jnp.where(two, hi, new_hi), two

  def more(state):
    _, _, lo, hi, done = state
    return ~done & (hi > lo)

  state = (key, pos, jnp.int32(0), jnp.int32(n - 1), jnp.bool_(False))
  return while_loop(more, body, state)[1]


@lowering(aten.kthvalue.default)
def kthvalue(self, k, dim=-1, keepdim=False):
  """The k-th smallest value (NaN largest) and the index torch's CPU quickselect gives it
  among equal values."""
  x1, axis = _one_axis(self, dim)
  xm = jnp.moveaxis(x1, axis, -1)
  rows = xm.reshape(-1, xm.shape[-1])
  order = jax.vmap(lambda r: _quickselect_order(_order_keys(r, False), k - 1)[k - 1])(rows)
  i = order.astype(jnp.int64).reshape(xm.shape[:-1] + (1,))
  v = jnp.take_along_axis(xm, i, -1)
  v, i = jnp.moveaxis(v, -1, axis), jnp.moveaxis(i, -1, axis)
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
  if not jnp.issubdtype(x.dtype, jnp.inexact):
    return _median(x.reshape(-1), 0, False, True, ignore_nan)[0]
  return _MEDIAN_SPREAD[ignore_nan](x)


def _evenly_distributed(out, primals, tangents):
  """torch's derivative of a full `median`/`nanmedian` (`evenly_distribute_backward`): the
  mean tangent of the elements equal to the result (NaN ones if it is NaN), not one of them."""
  x, t = primals[0], tangents[0]
  hits = jnp.where(jnp.isnan(out), jnp.isnan(x), x == out)
  return jnp.sum(jnp.where(hits, t, jnp.zeros((), t.dtype))) / jnp.sum(hits).astype(t.dtype)


_MEDIAN_SPREAD = {  # by `ignore_nan`
    flag: with_derivative(functools.partial(
        lambda x, flag: _median(x.reshape(-1), 0, False, True, flag)[0], flag=flag),
        _evenly_distributed)
    for flag in (False, True)}


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


# ----------------------------------------------------------------------------- histograms

def _upper_bound(edges, x, first, length):
  """std::upper_bound(edges + first, edges + first + length, x) - edges, elementwise over `x`,
  step for step (so an unsorted `edges` gives what torch's CPU kernel gives)."""
  for _ in range(int(edges.shape[0]).bit_length() + 1):
    half = length // 2
    middle = first + half
    right = ~(x < edges[jnp.clip(middle, 0, edges.shape[0] - 1)])
    live = length > 0
    first = jnp.where(live & right, middle + 1, first)
    length = jnp.where(live, jnp.where(right, length - half - 1, half), 0)
  return first


def _linspace(left, right, steps: int, dtype):
  """torch's CPU linspace in `dtype`: start + step * i for the first half, end - step * (steps -
  1 - i) for the rest (so both ends are exact)."""
  start, end = left.astype(dtype), right.astype(dtype)
  step = (end - start) / jnp.asarray(max(steps - 1, 1), dtype)
  i = jnp.arange(steps)
  lo = start + step * i.astype(dtype)
  hi = end - step * (steps - 1 - i).astype(dtype)
  return jnp.where(i < steps // 2, lo, hi)


def _histdd(x, edges, weight, density, algorithm):
  """torch's CPU histogramdd kernel on `x` (M, D) with per-dim bin `edges`: elements outside
  [edges[0], edges[-1]] (and NaN) are skipped, the last bin includes its right edge; `algorithm`
  "linear" (histc), "local" (linear then a search of the neighbouring edges: histogram with a bin
  count) or "search" (upper_bound over the edges: bin tensors). The counts are in x's dtype."""
  m, d = x.shape
  keep = jnp.ones((m,), jnp.bool_)
  flat = jnp.zeros((m,), jnp.int64)
  for k in range(d):
    e, elt = edges[k], x[:, k]
    n_edges = e.shape[0]
    left, right = e[0], e[n_edges - 1]
    keep = keep & (elt >= left) & (elt <= right)
    if algorithm == "search":
      pos = _upper_bound(e, elt, jnp.zeros_like(flat), jnp.full_like(flat, n_edges)) - 1
    else:
      q = (elt - left) * jnp.asarray(n_edges - 1, x.dtype) / (right - left)
      pos = jnp.where(keep, q, 0).astype(jnp.int64)
      if algorithm == "local":
        lo = jnp.maximum(pos - 1, 0)
        hi = jnp.minimum(pos + 2, n_edges)
        pos = _upper_bound(e, elt, lo, hi - lo) - 1
    pos = jnp.where(pos == n_edges - 1, pos - 1, pos)
    flat = flat * (n_edges - 1) + jnp.clip(pos, 0, n_edges - 2)
  shape = tuple(int(e.shape[0]) - 1 for e in edges)
  w = jnp.ones((m,), x.dtype) if weight is None else weight.reshape(m).astype(x.dtype)
  w = jnp.where(keep, w, jnp.zeros_like(w)).astype(opmath(x.dtype))
  hist = jnp.zeros((math.prod(shape),), w.dtype).at[flat].add(w).reshape(shape).astype(x.dtype)
  if density:
    hist = hist / jnp.sum(hist.astype(opmath(x.dtype))).astype(x.dtype)
    for k, e in enumerate(edges):
      lengths = (e[1:] - e[:-1]).reshape(tuple(-1 if j == k else 1 for j in range(d)))
      hist = hist / lengths
  return hist


def _outer_edges(x, bins, limits):
  """histogramdd's bin edges per dim: the outer edges are `limits` (the `range` argument), else the data's
  min/max (0 and 1 for an empty input); an empty interval is widened by 0.5 each side."""
  d = x.shape[1]
  if limits is not None:
    left = jnp.stack([jnp.asarray(limits[2 * k], jnp.float64) for k in range(d)])
    right = jnp.stack([jnp.asarray(limits[2 * k + 1], jnp.float64) for k in range(d)])
  elif x.shape[0] > 0:
    left, right = jnp.min(x, axis=0).astype(jnp.float64), jnp.max(x, axis=0).astype(jnp.float64)
  else:
    left, right = jnp.zeros((d,), jnp.float64), jnp.ones((d,), jnp.float64)
  same = left == right
  left, right = jnp.where(same, left - 0.5, left), jnp.where(same, right + 0.5, right)
  return [_linspace(left[k], right[k], bins[k] + 1, x.dtype) for k in range(d)]


@lowering(aten.histc.default)
def histc(self, bins=100, min=0, max=0):
  """torch.histc: `bins` equal bins over [min, max] (the data's range when min == max, widened by
  1 each side when still empty); out-of-range elements are ignored. A non-finite or empty range,
  which torch refuses, gives NaN counts here."""
  x = self.reshape(-1, 1)
  lo, hi = jnp.asarray(min, jnp.float64), jnp.asarray(max, jnp.float64)
  if x.shape[0] > 0:
    data_lo, data_hi = jnp.min(x).astype(jnp.float64), jnp.max(x).astype(jnp.float64)
    lo, hi = jnp.where(lo == hi, data_lo, lo), jnp.where(lo == hi, data_hi, hi)
  same = lo == hi
  lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
  edges = _linspace(lo, hi, bins + 1, self.dtype)
  hist = _histdd(x, [edges], None, False, "linear")
  if not jnp.issubdtype(hist.dtype, jnp.inexact):  # integer data (CUDA's histc takes it):
    return hist  # its range is finite and widened to lo < hi, and NaN has no integer value
  bad = ~(jnp.isfinite(lo) & jnp.isfinite(hi) & (lo < hi))
  return jnp.where(bad, jnp.full_like(hist, jnp.nan), hist)


@lowering(aten.histogram.bin_ct)
def histogram_bin_ct(self, bins=100, *, range=None, weight=None, density=False):
  x = self.reshape(-1, 1)
  edges = _outer_edges(x, [bins], range)
  return _histdd(x, edges, weight, density, "local"), edges[0]


@lowering(aten.histogram.bins_tensor)
def histogram_bins_tensor(self, bins, *, weight=None, density=False):
  return _histdd(self.reshape(-1, 1), [bins], weight, density, "search"), bins


@lowering(aten._histogramdd_bin_edges.default)
def _histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):
  return _outer_edges(self.reshape(-1, self.shape[-1]), list(bins), range)


@lowering(aten._histogramdd_from_bin_cts.default)
def _histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):
  x = self.reshape(-1, self.shape[-1])
  return _histdd(x, _outer_edges(x, list(bins), range), weight, density, "local")


@lowering(aten._histogramdd_from_bin_tensors.default)
def _histogramdd_from_bin_tensors(self, bins, *, weight=None, density=False):
  return _histdd(self.reshape(-1, self.shape[-1]), list(bins), weight, density, "search")


@lowering(aten.bincount.default, dynamic_shape=True)
def bincount(self, weights=None, minlength=0):
  """Counts (int64), or sums of `weights`, of each value 0..max(self); at least `minlength` bins.
  The length depends on the values, so this runs on concrete arrays (not under `jax.jit`)."""
  check(self < 0, self, RuntimeError, "bincount only supports 1-d non-negative integral inputs.")
  n = max(int(jnp.max(self)) + 1 if self.size else 0, minlength)
  if weights is None:
    return jnp.zeros((n,), jnp.int64).at[self].add(1)
  w = weights.astype(jnp.float32 if weights.dtype == jnp.float32 else jnp.float64)
  return jnp.zeros((n,), w.dtype).at[self].add(w)


# ----------------------------------------------------------------------------- segment_reduce

@lowering(aten.segment_reduce.default)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0,
                   unsafe=False, initial=None):
  """Reduces consecutive segments of `data` along `axis` (segment sizes from `lengths`, or
  `offsets` with lengths = diff(offsets)). `initial` joins every segment as one more element
  (mean: (initial + sum) / count); empty segments give `initial`, else sum 0, prod 1,
  max -inf, min inf, mean NaN."""
  if indices is not None:
    raise NotImplementedError("bridge: `segment_reduce` with `indices` is not supported (torch "
                              "does not implement it either); pass `lengths` or `offsets`.")
  if lengths is None:
    lengths = offsets[..., 1:] - offsets[..., :-1]
  axis = axis % data.ndim
  if lengths.ndim != axis + 1:
    raise NotImplementedError("bridge: `segment_reduce`: `lengths`/`offsets` must have the "
                              "leading dims of `data` up to `axis`.")
  s = lengths.shape[-1]
  x = jnp.moveaxis(data, axis, -1)                             # (..., n, *rest) -> (..., rest, n)
  x = x.reshape(lengths.shape[:-1] + (-1, data.shape[axis]))   # (lead, rest, n)
  rows = x.reshape(-1, x.shape[-2], x.shape[-1])
  lens = lengths.reshape(-1, s).astype(jnp.int64)
  ids = jnp.sum(jnp.arange(data.shape[axis])[None, :, None] >= jnp.cumsum(lens, -1)[:, None, :],
                axis=-1)                                       # (batch, n) segment of each element
  acc = opmath(data.dtype)

  def one(r, seg, ln):  # r: (rest, n); seg: (n,); ln: (s,)
    r = r.T.astype(acc)                                        # (n, rest)
    if reduce in ("sum", "mean"):
      out = jax.ops.segment_sum(r, seg, s)
    elif reduce == "prod":
      out = jax.ops.segment_prod(r, seg, s)
    elif reduce == "max":
      out = jax.ops.segment_max(r, seg, s)
    elif reduce == "min":
      out = jax.ops.segment_min(r, seg, s)
    else:
      raise ValueError(f"bridge: `segment_reduce`: unknown reduction {reduce!r}.")
    ln = ln[:, None]
    empty = ln == 0
    if initial is not None:
      init = jnp.asarray(initial, acc)
      out = {"sum": lambda: out + init, "mean": lambda: out + init,
             "prod": lambda: out * init, "max": lambda: jnp.maximum(out, init),
             "min": lambda: jnp.minimum(out, init)}[reduce]()
      if reduce == "mean":
        out = jnp.where(empty, init, out / jnp.maximum(ln, 1).astype(acc))
      out = jnp.where(empty, jnp.broadcast_to(init, out.shape), out)
    elif reduce == "mean":
      out = out / ln.astype(acc)                               # empty: 0 / 0 = NaN, as torch
    elif reduce in ("max", "min"):
      fill = -jnp.inf if reduce == "max" else jnp.inf
      out = jnp.where(empty, jnp.full_like(out, fill), out)
    return out.T                                               # (rest, s)

  out = jax.vmap(one)(rows, ids, lens).astype(data.dtype)      # (batch, rest, s)
  out = out.reshape(x.shape[:-1] + (s,))
  out = out.reshape(lengths.shape[:-1] + data.shape[axis + 1:] + (s,))
  return jnp.moveaxis(out, -1, axis)


# ----------------------------------------------------------------------------- unique

def _unique_flat(x, sorted_values, consecutive, return_inverse, return_counts):
  """Unique values of the flat concrete `x`: sorted (NaNs all distinct, last) or consecutive runs;
  empty int64 tensors for the inverse/counts that are not asked for, as torch's CPU kernel."""
  x = x.reshape(-1)
  n = x.shape[0]
  if consecutive:
    v, perm = x, jnp.arange(n)
  else:
    v, perm = _sort(x, 0, descending=False)
  new = v[1:] != v[:-1]                                        # NaN != NaN: each NaN its own run
  starts = jnp.concatenate([jnp.ones((min(n, 1),), jnp.bool_), new])
  group = jnp.cumsum(starts) - 1
  k = int(jnp.sum(starts))
  values = v[jnp.nonzero(starts, size=k)[0]]
  empty = jnp.zeros((0,), jnp.int64)
  inverse = jnp.zeros((n,), jnp.int64).at[perm].set(group) if return_inverse else empty
  counts = jnp.zeros((k,), jnp.int64).at[group].add(1) if return_counts else empty
  return values, inverse, counts


@lowering(aten._unique2.default, dynamic_shape=True)
def _unique2(self, sorted=True, return_inverse=False, return_counts=False):
  """torch.unique without dim: torch's CPU kernel always sorts (NaNs stay distinct)."""
  v, inv, cnt = _unique_flat(self, True, False, return_inverse, return_counts)
  return v, inv.reshape(self.shape) if return_inverse else inv, cnt


@lowering(aten._unique.default, dynamic_shape=True)
def _unique(self, sorted=True, return_inverse=False):
  v, inv, _ = _unique_flat(self, True, False, return_inverse, False)
  return v, inv.reshape(self.shape) if return_inverse else inv


@lowering(aten.unique_consecutive.default, dynamic_shape=True)
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
  """Collapses runs of equal values (of equal slices along `dim`)."""
  if dim is None:
    v, inv, cnt = _unique_flat(self, False, True, return_inverse, return_counts)
    return v, inv.reshape(self.shape) if return_inverse else inv, cnt
  axis = dim % self.ndim
  x = jnp.moveaxis(self, axis, 0)
  n = x.shape[0]
  flat = x.reshape(n, -1)
  new = jnp.any(flat[1:] != flat[:-1], axis=1)
  starts = jnp.concatenate([jnp.ones((min(n, 1),), jnp.bool_), new])
  group = jnp.cumsum(starts) - 1
  k = int(jnp.sum(starts))
  values = jnp.moveaxis(x[jnp.nonzero(starts, size=k)[0]], 0, axis)
  # with `dim`, torch's CPU kernel returns the inverse and the counts whether asked or not
  return values, group.astype(jnp.int64), jnp.zeros((k,), jnp.int64).at[group].add(1)


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
    raise RuntimeError(f"cov(): expected {name} to have one or fewer dimensions but got {name} "
                       f"with {w.ndim} dimensions")
  if _is_int(w.dtype) != integral or w.dtype == jnp.bool_:
    kind = "integral" if integral else "floating point"
    raise RuntimeError(f"cov(): expected {name} to have {kind} dtype but got {name} with "
                       f"{w.dtype} dtype")
  if w.size != n:
    raise RuntimeError(f"cov(): expected {name} to have the same numel as there are "
                       f"observations in the input but got {w.size} != {n}")
  return w.reshape(-1)


@lowering(aten.cov.default)
def cov(self, correction=1, fweights=None, aweights=None):
  """torch's `cov` (`aten/src/ATen/native/Correlation.cpp`), step by step in its dtypes.

  torch's code reads values to check the weights; it runs on concrete tensors. This
  lowering runs where those values are traced (see `bridge._src.device._WHOLE_WHEN_TRACED`):
  negative weights or weights summing to zero, which torch refuses, give NaN; degrees of
  freedom <= 0 give torch's inf/NaN (it zeroes the normalization factor and warns)."""
  if self.ndim > 2:
    raise RuntimeError("cov(): expected input to have two or fewer dimensions but got an "
                       f"input with {self.ndim} dimensions")
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
  c = jnp.matmul(centred, jnp.conj(other).T, precision=lax.Precision.HIGHEST,
                 preferred_element_type=acc).astype(centred.dtype)
  if jnp.iscomplexobj(c) and 1 in centred.shape:  # torch zeroes a vector's imaginary part
    c = lax.complex(c.real, jnp.zeros_like(c.real))
  out = jnp.squeeze(div(c, norm))
  return jnp.where(invalid, jnp.asarray(jnp.nan, out.dtype), out)
