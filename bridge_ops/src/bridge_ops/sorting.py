"""Sorting and order statistics: sort, topk, kthvalue, median, nanmedian, mode, unique, and
the searches in sorted sequences (searchsorted, bucketize).

sort is stable in both directions (NaN sorts as the largest value); median and nanmedian
take their values and indices from that stable order (a nanmedian of only NaN: the index
torch's nth_element leaves), kthvalue and mode from ports of torch's CPU algorithms (mode's
`std::sort` compares NaN false with everything, as in C++).

`searchsorted`/`bucketize` run torch's own binary search (not `jnp.searchsorted`):
NaN compares false there, where JAX's sort order would put it last.

About 600 lines on purpose: the order statistics share the ordering keys and the ports of
torch's sort and selection algorithms defined here (`_order_keys`, `_introsort_order`,
`_introselect_order`, `_partial_sort_order`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bridge_ops._lowering import (
  aten,
  check_index,
  fori_loop,
  lowering,
  result_dtypes,
  scalar_type_name,
  while_loop,
  with_derivative,
)
from bridge_ops._reduction import _nonempty, _one_axis, _sort, _squeeze, _wrap_dim


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
  stable=False) leaves a 1-d int `key` in, `<` as comparator: `_introsort_partition`, then the
  final insertion sort, which is a stable sort of the partitioned order."""
  key, order = _introsort_partition(key)
  _, final = lax.sort((key, jnp.arange(key.shape[0], dtype=jnp.int32)), num_keys=1, is_stable=True)
  return order[final]


def _introsort_partition(key):
  """(`key` as libstdc++'s introsort loop leaves it before its final insertion sort, the
  permutation it applied): median-of-3 Hoare partitions of every segment longer than 16, one
  tree level at a time (the k-th left stopper swaps with the k-th right stopper while they
  have not crossed), `<` as comparator (only comparisons with the pivot decide, so a float key
  with NaN, which compares false, partitions as in C++). Segments still longer than 16 when the
  depth limit is reached (heapsort in libstdc++, for median-of-3-killer inputs only) are left
  to the final sort."""
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
      chosen = jnp.where(
        va < vb,
        jnp.where(vb < vc, ib, jnp.where(va < vc, ic, ia)),
        jnp.where(va < vc, ia, jnp.where(vb < vc, ic, ib)),
      )
      src = jnp.where(active & (pos == first), chosen, pos)
      src = jnp.where(active & (pos == chosen[first]), first, src)
      a, perm = a[src], perm[src]
      # __unguarded_partition(first + 1, last, pivot = *first)
      pivot = a[first]
      left = active & (pos > first) & ~(a < pivot)
      right = active & ~(pivot < a)
      lrank = _segment_cumsum(left, first)
      rc = jnp.cumsum(right.astype(jnp.int32))
      rrank = rc[jnp.maximum(last - 1, 0)] - rc  # right stoppers above, in the segment
      drop = jnp.full_like(pos, n)
      lpos = (
        jnp.full((n,), n, jnp.int32).at[jnp.where(left, first + lrank, drop)].set(pos, mode="drop")
      )
      rpos = (
        jnp.full((n,), -1, jnp.int32)
        .at[jnp.where(right, first + rrank, drop)]
        .set(pos, mode="drop")
      )
      k = pos - first  # position t holds pair k of its segment
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
  return key, order


def _final_insertion_sort(a, order):
  """The permutation (of `order`) libstdc++'s final insertion sort leaves the float key `a`
  (with NaN) in, `<` as comparator. NaN compares false with everything, so it stops every
  element moving left past it: an insertion sort of the first 16 (where an element less than
  the first jumps to the front, past NaNs), then, from the 17th on, each NaN-free run between
  NaNs ends sorted in its order (insertion is stable), the NaNs where they stand."""
  m = min(a.shape[0], 16)
  head, head_order = a[:m], order[:m]
  idx = jnp.arange(m)
  for i in range(1, m):  # __insertion_sort(first, first + 16)
    val = head[i]
    stop = jnp.max(jnp.where((idx < i) & ~(val < head), idx, -1))  # the scan's stop
    j = jnp.where(val < head[0], 0, stop + 1)
    src = jnp.where((idx > j) & (idx <= i), idx - 1, idx)
    head = jnp.where(idx == j, val, head[src])
    head_order = jnp.where(idx == j, head_order[i], head_order[src])
  a = jnp.concatenate([head, a[m:]])
  order = jnp.concatenate([head_order, order[m:]])
  nan = jnp.isnan(a)
  run = jnp.cumsum(nan.astype(jnp.int32))  # a NaN opens a run; it sorts first in it
  value = jnp.where(nan | (a == 0), jnp.zeros_like(a), a)  # (-0.0 == 0.0 for `<`)
  pos = jnp.arange(a.shape[0], dtype=jnp.int32)
  final = lax.sort((run, (~nan).astype(jnp.int32), value, pos), num_keys=3, is_stable=True)[-1]
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
    chosen = jnp.where(
      va < vb,
      jnp.where(vb < vc, ib, jnp.where(va < vc, ic, ia)),
      jnp.where(va < vc, ia, jnp.where(vb < vc, ic, ib)),
    )
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
    return (a, perm, jnp.where(cut <= nth, cut, first), jnp.where(cut <= nth, last, cut), depth + 1)

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
    head = _introsort_order(keys[order[: k - 1]])
    order = jnp.concatenate([order[: k - 1][head], order[k - 1 :]])
  return order


@lowering(aten.topk.default)
def topk(self, k, dim=-1, largest=True, sorted=True):
  """The k largest (smallest) values, NaN largest, with the order of ties (and, for
  sorted=False, of the values) that torch's CPU kernel (libstdc++ partial_sort, or nth_element
  then sort) gives."""
  x1, axis = _one_axis(self, dim)
  n = x1.shape[axis]
  if not 0 <= k <= n:  # (torch's meta kernel says so too, but an empty row fails here first)
    raise RuntimeError("selected index k out of range")
  if self.ndim == 0:  # torch's kernel copies a 0-d tensor's value and index 0, for k = 0 too
    return self, jnp.zeros((), jnp.int64)
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
    swaps = jnp.sum((lpos < rpos).astype(jnp.int32))  # pairs swapped before the pointers meet
    meet = (lpos[jnp.minimum(swaps, n - 1)] == rpos[jnp.minimum(swaps, n - 1)]) & (swaps < n)
    t = swaps + meet.astype(jnp.int32)  # the round in which they cross

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
  _nonempty(self, dim, "kthvalue()")
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
  shape1 = x.shape[:axis] + (1,) + x.shape[axis + 1 :]
  if not jnp.issubdtype(x.dtype, jnp.inexact):
    return _pick(v, i, jnp.full(shape1, (n - 1) // 2, jnp.int64), axis, keepdim, was_0d)
  nan = jnp.isnan(x)
  if ignore_nan:
    valid = n - jnp.sum(nan, axis=axis, keepdims=True, dtype=jnp.int64)
    pos = jnp.maximum(valid - 1, 0) // 2
    pv, pi = _pick(v, i, pos, axis, keepdim, was_0d)
    # a slice of only NaN: the index torch's std::nth_element leaves first (see below)
    none = _squeeze(valid == 0, axis, keepdim, was_0d)
    return pv, jnp.where(none, jnp.int64(_all_equal_first(n)), pi)
  pos = jnp.full(shape1, (n - 1) // 2, jnp.int64)
  pv, pi = _pick(v, i, pos, axis, True, False)
  has_nan = jnp.any(nan, axis=axis, keepdims=True)
  first_nan = jnp.argmax(nan, axis=axis, keepdims=True).astype(jnp.int64)
  pv = jnp.where(has_nan, jnp.full_like(pv, jnp.nan), pv)
  pi = jnp.where(has_nan, first_nan, pi)
  return _squeeze(pv, axis, keepdim, was_0d), _squeeze(pi, axis, keepdim, was_0d)


@functools.lru_cache
def _all_equal_first(n: int) -> int:
  """The index libstdc++'s `std::nth_element(first, first, last)` leaves first in
  iota(n) when every element is equivalent to every other (nanmedian's comparator on a slice
  of only NaN, where torch takes nth = (0 - 1) / 2 = 0): each Hoare partition (the median of
  3 is the middle element, swapped to the front) swaps pairs from both ends to the middle and
  keeps the left half, down to 3 elements, which the final insertion sort leaves alone."""
  a = list(range(n))
  last = n
  while last > 3:
    mid = last // 2
    a[0], a[mid] = a[mid], a[0]
    lo, hi = 1, last - 1
    while lo < hi:
      a[lo], a[hi] = a[hi], a[lo]
      lo, hi = lo + 1, hi - 1
    last = lo
  return a[0] if n else 0


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
  flag: with_derivative(
    functools.partial(lambda x, flag: _median(x.reshape(-1), 0, False, True, flag)[0], flag=flag),
    _evenly_distributed,
  )
  for flag in (False, True)
}


@lowering(aten.median.default)
def median(self):
  return _median_all(self, ignore_nan=False)


@lowering(aten.nanmedian.default)
def nanmedian(self):
  return _median_all(self, ignore_nan=True)


@lowering(aten.median.dim)
def median_dim(self, dim, keepdim=False):
  _nonempty(self, dim, "median()")
  x1, axis = _one_axis(self, dim)
  return _median(x1, axis, keepdim, self.ndim == 0, ignore_nan=False)


@lowering(aten.nanmedian.dim)
def nanmedian_dim(self, dim, keepdim=False):
  _nonempty(self, dim, "median()")  # (torch's nanmedian says median() too)
  x1, axis = _one_axis(self, dim)
  return _median(x1, axis, keepdim, self.ndim == 0, ignore_nan=True)


@lowering(aten.mode.default)
def mode(self, dim=-1, keepdim=False):
  """Most frequent value and an index of it, as torch's CPU kernel finds them: it sorts the
  row with `std::sort` (`<` on the values: NaN compares false, so it stays among the others
  and each NaN is a run of its own), then takes the first longest run of equal values, and
  the index of the run's last element."""
  _nonempty(self, dim, "mode()")
  x1, axis = _one_axis(self, dim)
  xm = jnp.moveaxis(x1, axis, -1)
  rows = xm.reshape(-1, xm.shape[-1])
  v, i = jax.vmap(_mode_row)(rows)
  shape = xm.shape[:-1] + (1,)
  v, i = jnp.moveaxis(v.reshape(shape), -1, axis), jnp.moveaxis(i.reshape(shape), -1, axis)
  return _squeeze(v, axis, keepdim, self.ndim == 0), _squeeze(i, axis, keepdim, self.ndim == 0)


def _mode_row(x):
  if jnp.issubdtype(x.dtype, jnp.floating):
    order = _final_insertion_sort(*_introsort_partition(x))
  else:
    order = _introsort_order(_order_keys(x, descending=False))
  v = x[order]
  n = x.shape[0]
  pos = jnp.arange(n)
  ends = jnp.concatenate([v[1:] != v[:-1], jnp.ones((1,), jnp.bool_)])  # a run ends
  starts = jnp.concatenate([jnp.ones((1,), jnp.bool_), ends[:-1]])
  run_start = lax.cummax(jnp.where(starts, pos, 0), axis=0)
  length = jnp.where(ends, pos - run_start + 1, 0)  # run length, at each run's end
  best = jnp.argmax(length)  # the first longest
  return v[best], order[best].astype(jnp.int64)


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
  new = v[1:] != v[:-1]  # NaN != NaN: each NaN its own run
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
  axis = _wrap_dim(dim, self.ndim)
  if any(size == 0 for d, size in enumerate(self.shape) if d != axis):
    raise RuntimeError(
      "There are 0 sized dimensions, and they aren't selected, so unique cannot be applied"
    )
  x = jnp.moveaxis(self, axis, 0)
  n = x.shape[0]
  flat = x.reshape(n, int(np.prod(x.shape[1:])))
  new = jnp.any(flat[1:] != flat[:-1], axis=1)
  starts = jnp.concatenate([jnp.ones((min(n, 1),), jnp.bool_), new])
  group = jnp.cumsum(starts) - 1
  k = int(jnp.sum(starts))
  values = jnp.moveaxis(x[jnp.nonzero(starts, size=k)[0]], 0, axis)
  # with `dim`, torch's CPU kernel returns the inverse and the counts whether asked or not
  return values, group.astype(jnp.int64), jnp.zeros((k,), jnp.int64).at[group].add(1)


# --- sorted search ----------------------------------------------------------------------------


def _binary_search(seq, values, right):
  """torch's lower/upper bound loop, vectorized: the first i with seq[i] >= v (> v if right).

  Written out rather than `jnp.searchsorted` so comparisons with NaN behave as in torch
  (a NaN compares false, so NaNs at the end of a sorted row are never "above" a value).
  `seq` is (n,) or (rows, n); `values` then has any shape, or (rows, m).
  """
  n = seq.shape[-1]
  start = jnp.zeros(values.shape, jnp.int64)
  end = jnp.full(values.shape, n, jnp.int64)
  for _ in range(n.bit_length()):  # each step at least halves end - start
    active = start < end
    mid = start + ((end - start) >> 1)
    safe = jnp.clip(mid, 0, n - 1)
    mid_val = seq[safe] if seq.ndim == 1 else jnp.take_along_axis(seq, safe, axis=-1)
    go_right = ~(mid_val > values) if right else ~(mid_val >= values)
    start = jnp.where(active & go_right, mid + 1, start)
    end = jnp.where(active & ~go_right, mid, end)
  return start


def _searchsorted(seq, values, out_int32, side, sorter=None):
  """torch's searchsorted; first the checks of its `searchsorted_pre_check` that the core's
  meta kernel leaves to the CPU kernel (a sorter's dtype and values, `side`, a 0-d `seq`)."""
  if side not in ("left", "right"):
    raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
  if sorter is not None:
    if sorter.shape != seq.shape:
      raise RuntimeError(
        "torch.searchsorted(): boundary and sorter must have the same size, but got boundary "
        f"tensor [{', '.join(map(str, seq.shape))}]and got sorter tensor "
        f"[{', '.join(map(str, sorter.shape))}]"
      )
    if sorter.dtype != jnp.int64:
      raise RuntimeError(
        "torch.searchsorted(): sorter must be a tensor of long dtype but got dtype "
        f"{scalar_type_name(sorter.dtype)}"
      )
    if sorter.ndim and sorter.size:
      message = "torch.searchsorted(): sorter index out of range"
      check_index(sorter, sorter.shape[-1], RuntimeError, message)
  if seq.ndim == 0:
    raise RuntimeError(
      "torch.searchsorted(): boundaries tensor should have positive dimension, but got 0 dimension"
    )
  if sorter is not None:
    seq = jnp.take_along_axis(seq, sorter, axis=-1)
  compute, _ = result_dtypes(seq, values)
  seq = seq.astype(compute)
  values = jnp.asarray(values).astype(compute)
  out_dtype = jnp.int32 if out_int32 else jnp.int64
  right = side == "right"
  if seq.ndim == 1:
    return _binary_search(seq, values, right).astype(out_dtype)
  # (sizes given: a batch of none leaves `-1` nothing to infer from)
  rows = jnp.reshape(seq, (int(np.prod(seq.shape[:-1])), seq.shape[-1]))
  vals = jnp.reshape(values, (rows.shape[0], values.shape[-1]))
  return jnp.reshape(_binary_search(rows, vals, right), values.shape).astype(out_dtype)


def _side(right, side):
  return side if side is not None else ("right" if right else "left")


@lowering(aten.searchsorted.Tensor)
def searchsorted_Tensor(
  sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None
):
  return _searchsorted(sorted_sequence, self, out_int32, _side(right, side), sorter)


@lowering(aten.searchsorted.Scalar)
def searchsorted_Scalar(
  sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None
):
  return _searchsorted(sorted_sequence, self, out_int32, _side(right, side), sorter)


def _bucketize(self, boundaries, out_int32, right):
  if boundaries.ndim != 1:
    raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})")
  return _searchsorted(boundaries, self, out_int32, "right" if right else "left")


@lowering(aten.bucketize.Tensor)
def bucketize_Tensor(self, boundaries, *, out_int32=False, right=False):
  return _bucketize(self, boundaries, out_int32, right)


@lowering(aten.bucketize.Scalar)
def bucketize_Scalar(self, boundaries, *, out_int32=False, right=False):
  return _bucketize(self, boundaries, out_int32, right)
