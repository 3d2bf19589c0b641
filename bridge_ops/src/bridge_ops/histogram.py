"""Histograms and bucketed sums: histc, histogram, histogramdd, bincount, segment_reduce."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from bridge_ops._lowering import aten, check, lowering, opmath


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
def segment_reduce(
  data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None
):
  """Reduces consecutive segments of `data` along `axis` (segment sizes from `lengths`, or
  `offsets` with lengths = diff(offsets)). `initial` joins every segment as one more element
  (mean: (initial + sum) / count); empty segments give `initial`, else sum 0, prod 1,
  max -inf, min inf, mean NaN."""
  if indices is not None:
    raise NotImplementedError(
      "bridge: `segment_reduce` with `indices` is not supported (torch "
      "does not implement it either); pass `lengths` or `offsets`."
    )
  if lengths is None:
    lengths = offsets[..., 1:] - offsets[..., :-1]
  axis = axis % data.ndim
  if lengths.ndim != axis + 1:
    raise NotImplementedError(
      "bridge: `segment_reduce`: `lengths`/`offsets` must have the "
      "leading dims of `data` up to `axis`."
    )
  s = lengths.shape[-1]
  x = jnp.moveaxis(data, axis, -1)  # (..., n, *rest) -> (..., rest, n)
  x = x.reshape(lengths.shape[:-1] + (-1, data.shape[axis]))  # (lead, rest, n)
  rows = x.reshape(-1, x.shape[-2], x.shape[-1])
  lens = lengths.reshape(-1, s).astype(jnp.int64)
  ids = jnp.sum(
    jnp.arange(data.shape[axis])[None, :, None] >= jnp.cumsum(lens, -1)[:, None, :], axis=-1
  )  # (batch, n) segment of each element
  acc = opmath(data.dtype)

  def one(r, seg, ln):  # r: (rest, n); seg: (n,); ln: (s,)
    r = r.T.astype(acc)  # (n, rest)
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
      out = {
        "sum": lambda: out + init,
        "mean": lambda: out + init,
        "prod": lambda: out * init,
        "max": lambda: jnp.maximum(out, init),
        "min": lambda: jnp.minimum(out, init),
      }[reduce]()
      if reduce == "mean":
        out = jnp.where(empty, init, out / jnp.maximum(ln, 1).astype(acc))
      out = jnp.where(empty, jnp.broadcast_to(init, out.shape), out)
    elif reduce == "mean":
      out = out / ln.astype(acc)  # empty: 0 / 0 = NaN, as torch
    elif reduce in ("max", "min"):
      fill = -jnp.inf if reduce == "max" else jnp.inf
      out = jnp.where(empty, jnp.full_like(out, fill), out)
    return out.T  # (rest, s)

  out = jax.vmap(one)(rows, ids, lens).astype(data.dtype)  # (batch, rest, s)
  out = out.reshape(x.shape[:-1] + (s,))
  out = out.reshape(lengths.shape[:-1] + data.shape[axis + 1 :] + (s,))
  return jnp.moveaxis(out, -1, axis)
