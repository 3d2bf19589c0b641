"""Histograms and bucketed sums: histc, histogram, histogramdd, bincount, segment_reduce."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from bridge_ops._lowering import aten, check, lowering, opmath, scalar_type_name


# ----------------------------------------------------------------------------- torch's checks


def _num(v) -> str:
  """A double as torch's messages print it (C++ `ostream <<`: 6 significant digits, "-nan")."""
  if math.isnan(v):
    return "-nan" if math.copysign(1.0, v) < 0 else "nan"
  return "%g" % v


def _sizes(shape) -> str:
  return "[" + ", ".join(str(int(n)) for n in shape) + "]"


def _check_bin_cts(bins) -> None:
  """histogramdd_prepare_out: a positive number of bins per dim."""
  for k, b in enumerate(bins):
    if b <= 0:
      raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {b} for dimension {k}")


def _check_inputs(x, edges, weight) -> None:
  """histogramdd_check_inputs (shapes; the dtypes are the core's): `x` (..., N), one 1-d,
  non-empty edges tensor per dim, a weight of x's shape less its innermost dim."""
  for k, e in enumerate(edges):
    if e.ndim != 1:
      raise RuntimeError(
        "torch.histogramdd: bins tensor should have one dimension, but got "
        f"{e.ndim} dimensions in the bins tensor for dimension {k}"
      )
    if e.size == 0:
      raise RuntimeError(
        "torch.histogramdd: bins tensor should have at least 1 element, but got "
        f"{e.size} elements in the bins tensor for dimension {k}"
      )
  if weight is not None and tuple(x.shape[:-1]) != (tuple(weight.shape) or (1,)):
    raise RuntimeError(
      "torch.histogramdd: if weight tensor is provided it should have the same shape as the "
      "input tensor excluding its innermost dimension, but got input with shape "
      f"{_sizes(x.shape)} and weight with shape {_sizes(weight.shape)}"
    )


def _widen(lo, hi, dtype, xp):
  """torch's `bins_edges_correction` of an empty range [lo, lo]: one step of `dtype` or 1 out,
  whichever is wider, for float32/float64; 1 out for the other dtypes. `xp`: np or jnp."""
  if dtype not in (np.float32, np.float64):
    return lo - 1, hi + 1
  t, inf = np.dtype(dtype).type, np.inf
  down = xp.nextafter(xp.asarray(lo).astype(t), t(-inf)).astype(np.float64)
  up = xp.nextafter(xp.asarray(hi).astype(t), t(inf)).astype(np.float64)
  return xp.minimum(down, lo - 1), xp.maximum(up, hi + 1)


def _range_error(text, nan):
  """`check`'s message for data ranges packed as lo + hi*1j, one per dim (the position): `text`
  with {lo}, {hi} and {dim}. A NaN end prints as `nan` ("nan", "-nan"), or as its own sign
  (None), or as the first NaN of the data ("first": lo's, which both ends are in torch)."""

  def message(value, position):
    lo, hi = value.real, value.imag
    if nan == "first" and math.isnan(lo):
      hi = lo
    show = _num if nan in (None, "first") else lambda v: nan if math.isnan(v) else _num(v)
    return text.format(lo=show(lo), hi=show(hi), dim=position)

  return message


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
  if steps < 0:
    raise RuntimeError("number of steps must be non-negative")
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
  min/max (0 and 1 for an empty input); an empty interval is widened by 0.5 each side. torch
  refuses a range that is not finite, or whose min exceeds its max."""
  d = x.shape[1]
  left, right = _outer_range(x, limits)
  if len(bins) != d:
    raise RuntimeError(
      "histogramdd: The size of bins must be equal to the innermost dimension of the input."
    )
  return [_linspace(left[k], right[k], bins[k] + 1, x.dtype) for k in range(d)]


def _outer_range(x, limits):
  """select_outer_bin_edges: per dim the (left, right) ends, checked as torch does (`limits`,
  the `range` argument, is static: checked here; the data's range is a value check)."""
  d = x.shape[1]
  if limits is not None:
    if len(limits) != 2 * d:
      raise RuntimeError(
        f"torch.histogramdd: for a {d}-dimensional histogram range should have {2 * d} "
        f"elements, but got {len(limits)}"
      )
    for k in range(d):
      lo, hi = float(limits[2 * k]), float(limits[2 * k + 1])
      if not (math.isfinite(lo) and math.isfinite(hi)):
        raise RuntimeError(
          f"torch.histogramdd: dimension {k}'s range [{_num(lo)}, {_num(hi)}] is not finite"
        )
      if not lo <= hi:
        raise RuntimeError(
          "torch.histogramdd: min should not exceed max, but got min "
          f"{_num(lo)} max {_num(hi)} for dimension {k}"
        )
    left = jnp.stack([jnp.asarray(limits[2 * k], jnp.float64) for k in range(d)])
    right = jnp.stack([jnp.asarray(limits[2 * k + 1], jnp.float64) for k in range(d)])
  elif x.shape[0] > 0:
    left, right = jnp.min(x, axis=0).astype(jnp.float64), jnp.max(x, axis=0).astype(jnp.float64)
    check(  # (a NaN is both ends: the first NaN of the data, as torch's kernel finds it)
      ~(jnp.isfinite(left) & jnp.isfinite(right)),
      jax.lax.complex(left, right),
      RuntimeError,
      _range_error(
        "torch.histogramdd: dimension {dim}'s range [{lo}, {hi}] is not finite", "first"
      ),
    )
  else:
    left, right = jnp.zeros((d,), jnp.float64), jnp.ones((d,), jnp.float64)
  same = left == right
  return jnp.where(same, left - 0.5, left), jnp.where(same, right + 0.5, right)


@lowering(aten.histc.default, static_argnames=("min", "max"))
def histc(self, bins=100, min=0, max=0):
  """torch.histc: `bins` equal bins over [min, max] (the data's range when min == max, widened
  when still empty as torch's `bins_edges_correction`); out-of-range elements are ignored. torch
  refuses a range that is not finite or empty: `min`/`max` are static and checked here, the
  data's range is a value check (unchecked inside a JAX program, where the counts are NaN)."""
  _check_bin_cts([bins])
  x = self.reshape(-1, 1)
  dtype = np.dtype(self.dtype)
  if not (min == max and x.shape[0] > 0):  # the range is min/max's
    lo, hi = float(min), float(max)
    if lo == hi:
      lo, hi = (float(v) for v in _widen(lo, hi, dtype, np))
    if not (math.isfinite(lo) and math.isfinite(hi)):
      raise RuntimeError(f"torch.histc: range of [{_num(lo)}, {_num(hi)}] is not finite")
    if not lo < hi:
      raise RuntimeError("torch.histc: max must be larger than min")
    lo, hi = jnp.asarray(lo, jnp.float64), jnp.asarray(hi, jnp.float64)
    return _histdd(x, [_linspace(lo, hi, bins + 1, dtype)], None, False, "linear")
  lo, hi = jnp.min(x).astype(jnp.float64), jnp.max(x).astype(jnp.float64)
  same = lo == hi
  wide_lo, wide_hi = _widen(lo, hi, dtype, jnp)
  lo, hi = jnp.where(same, wide_lo, lo), jnp.where(same, wide_hi, hi)
  hist = _histdd(x, [_linspace(lo, hi, bins + 1, dtype)], None, False, "linear")
  if not jnp.issubdtype(hist.dtype, jnp.inexact):  # integer data (CUDA's histc takes it):
    return hist  # its range is finite and widened to lo < hi, and NaN has no integer value
  bad = ~(jnp.isfinite(lo) & jnp.isfinite(hi))  # (a finite range is widened to lo < hi)
  # the data's NaN: torch's aminmax gives the NaN itself for one element, else its
  # vectorized "-nan" (bfloat16's goes through float: "nan")
  nan = "nan" if dtype == jnp.bfloat16 else None if x.shape[0] == 1 else "-nan"
  message = _range_error("torch.histc: range of [{lo}, {hi}] is not finite", nan)
  check(bad, jax.lax.complex(lo, hi), RuntimeError, message)
  return jnp.where(bad, jnp.full_like(hist, jnp.nan), hist)


@lowering(aten.histogram.bin_ct, static_argnames=("range",))
def histogram_bin_ct(self, bins=100, *, range=None, weight=None, density=False):
  x = self.reshape(-1, 1)
  _check_bin_cts([bins])
  edges = _outer_edges(x, [bins], range)
  _check_inputs(x, edges, None if weight is None else weight.reshape(-1))
  return _histdd(x, edges, weight, density, "local"), edges[0]


@lowering(aten.histogram.bins_tensor)
def histogram_bins_tensor(self, bins, *, weight=None, density=False):
  _check_inputs(self.reshape(-1, 1), [bins], None if weight is None else weight.reshape(-1))
  _check_bin_cts([bins.size - 1])
  return _histdd(self.reshape(-1, 1), [bins], weight, density, "search"), bins


@lowering(aten._histogramdd_bin_edges.default, static_argnames=("range",))
def _histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):
  return _outer_edges(self.reshape(-1, self.shape[-1]), list(bins), range)


@lowering(aten._histogramdd_from_bin_cts.default, static_argnames=("range",))
def _histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):
  x = self.reshape(-1, self.shape[-1])
  edges = _outer_edges(x, list(bins), range)
  _check_inputs(self, edges, weight)
  _check_bin_cts(bins)
  return _histdd(x, edges, weight, density, "local")


@lowering(aten._histogramdd_from_bin_tensors.default)
def _histogramdd_from_bin_tensors(self, bins, *, weight=None, density=False):
  _check_inputs(self, bins, weight)
  _check_bin_cts([e.size - 1 for e in bins])
  return _histdd(self.reshape(-1, self.shape[-1]), list(bins), weight, density, "search")


@lowering(aten.bincount.default, dynamic_shape=True)
def bincount(self, weights=None, minlength=0):
  """Counts (int64), or sums of `weights`, of each value 0..max(self); at least `minlength` bins.
  The length depends on the values, so this runs on concrete arrays (not under `jax.jit`)."""
  if not jnp.issubdtype(self.dtype, jnp.integer):  # (the core refuses bool; floats come here)
    raise NotImplementedError(
      f"\"bincount_cpu\" not implemented for '{scalar_type_name(self.dtype)}'"
    )
  if minlength < 0:
    raise RuntimeError("minlength should be >= 0")
  if self.ndim != 1:
    raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
  if self.size == 0:  # (torch returns before it looks at the weights)
    return jnp.zeros((minlength,), jnp.int64)
  check(self < 0, self, RuntimeError, "bincount only supports 1-d non-negative integral inputs.")
  if weights is not None and (weights.ndim != 1 or weights.shape != self.shape):
    raise RuntimeError("weights should be 1-d and have the same length as input")
  n = max(int(jnp.max(self)) + 1, minlength)
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
