"""Helpers shared by the reduction families (`reduction`, `sorting`, `histogram`): the
`dim` argument as axes, torch's reduction dtypes, torch's errors for reducing nothing, and a
stable sort."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from bridge_ops._lowering import jax_dtype


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


def _nonempty(x, dims, name: str, wrap: bool = True) -> None:
  """torch's `zero_numel_check_dims` for the reductions with no identity (max, min, kthvalue,
  median, mode...): reducing `x` over an empty one of `dims` (an int or ints) raises IndexError
  naming it, wrapped into [0, ndim) as most kernels print it (`amax`/`amin`: `wrap=False`, as
  given). The shapes are static, so this is decided while a program is traced."""
  if x.ndim == 0:  # one element: nothing is empty
    return
  for d in [dims] if isinstance(dims, int) else dims:
    if x.shape[d] == 0:
      d = d % x.ndim if wrap else d
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
