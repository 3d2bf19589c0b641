"""Helpers shared by the linear-algebra families (`products`, `linalg`, `ldl`, `spectral`):
the products' precision, conjugate transposes, batch broadcasting, Hermitian inputs."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

# The products run at `Precision.HIGHEST` (no TF32 / bf16 passes on accelerators).
_HIGHEST = lax.Precision.HIGHEST


def _mT(x):
  return jnp.swapaxes(x, -1, -2)


def _mH(x):
  return jnp.conj(_mT(x))


def _empty(dtype):
  # torch returns a 0-element tensor for an output it was asked not to compute
  return jnp.zeros((0,), dtype)


def _batch_broadcast(a, b, a_core=2, b_core=2):
  """`a`, `b` with their batch dims (all but the last `*_core`) broadcast to each other."""
  batch = jnp.broadcast_shapes(a.shape[: a.ndim - a_core], b.shape[: b.ndim - b_core])
  return (
    jnp.broadcast_to(a, batch + a.shape[a.ndim - a_core :]),
    jnp.broadcast_to(b, batch + b.shape[b.ndim - b_core :]),
  )


def _is_vector_rhs(A, B):
  # torch's linalg_solve_is_vector_rhs
  return B.ndim == 1 or (A.ndim - 1 == B.ndim and B.shape == A.shape[:-1])


def _hermitian_from(a, upper):
  """The Hermitian matrix whose `upper`/lower triangle is `a`'s (LAPACK reads only that one)."""
  if upper:
    tri = jnp.triu(a)
    return tri + _mH(jnp.triu(a, 1))
  tri = jnp.tril(a)
  return tri + _mH(jnp.tril(a, -1))


def _hermitian_input(a, upper):
  """`a`'s `upper`/lower triangle as a Hermitian matrix, with torch's gradient: torch's
  backward of cholesky/eigh returns a Hermitian gradient, which is the gradient through
  `(a + a^H) / 2`."""
  sym = (a + _mH(a)) / 2
  return sym + lax.stop_gradient(_hermitian_from(a, upper) - sym)
