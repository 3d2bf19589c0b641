"""Helpers shared by the reduction families (`reduction`, `sorting`, `histogram`): the
`dim` argument as axes, torch's reduction dtypes, torch's errors for reducing nothing, and a
stable sort."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from bridge_ops._lowering import jax_dtype


def _wrap_dim(dim: int, ndim: int) -> int:
  """torch's `maybe_wrap_dim`: `dim` as a non-negative axis of an `ndim`-dimensional tensor, or
  its IndexError when out of range (a 0-d tensor takes -1 and 0). Some of torch's meta kernels
  (`_softmax`, `sort`) do not check it; every lowering that takes a `dim` goes through here."""
  low, high = (-1, 0) if ndim == 0 else (-ndim, ndim - 1)
  if not low <= dim <= high:
    raise IndexError(
      f"Dimension out of range (expected to be in range of [{low}, {high}], but got {dim})"
    )
  return dim % max(ndim, 1)


def _axes(x, dim, empty_means_all: bool = True) -> tuple[int, ...]:
  """`dim` (None, int or list) as sorted non-negative axes of `x`."""
  if dim is None:
    return tuple(range(x.ndim))
  dims = [dim] if isinstance(dim, int) else list(dim)
  if not dims:
    return tuple(range(x.ndim)) if empty_means_all else ()
  axes = tuple(sorted(_wrap_dim(d, x.ndim) for d in dims))
  return () if x.ndim == 0 else axes  # a 0-d tensor has nothing to reduce


def _one_axis(x, dim: int):
  """(x with at least one dim, its axis for `dim`): 0-d tensors are treated as shape (1,)."""
  axis = _wrap_dim(dim, x.ndim)
  return (x.reshape(1), 0) if x.ndim == 0 else (x, axis)


def _nonempty(x, dims, name: str, wrap: bool = True) -> None:
  """torch's `zero_numel_check_dims` for the reductions with no identity (max, min, kthvalue,
  median, mode...): reducing `x` over an empty one of `dims` (an int or ints) raises IndexError
  naming it, wrapped into [0, ndim) as most kernels print it (`amax`/`amin`: `wrap=False`, as
  given). The shapes are static, so this is decided while a program is traced."""
  for d in [dims] if isinstance(dims, int) else dims:
    axis = _wrap_dim(d, x.ndim)
    if x.ndim and x.shape[axis] == 0:  # (a 0-d tensor has one element: nothing is empty)
      d = axis if wrap else d
      raise IndexError(f"{name}: Expected reduction dim {d} to have non-zero size.")


def _nonempty_all(x, name: str, error: type[Exception] = RuntimeError, hint: bool = True) -> None:
  """torch's error for reducing all of an empty `x` with no identity (`x.max()`): `error`
  (RuntimeError, IndexError for argmax/argmin), its hint to give a dim with `hint`."""
  if x.size == 0:
    message = f"{name}: Expected reduction dim to be specified for input.numel() == 0."
    raise error(message + (" Specify the reduction dim with the 'dim' argument." if hint else ""))


def _is_int(dtype) -> bool:
  return jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_)


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
