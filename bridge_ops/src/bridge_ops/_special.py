"""Helpers shared by the special-function families (`special`, `bessel`, `polynomials`):
torch's `prims` namespace, float promotion, Horner and Chebyshev series, safe branches."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from bridge_ops._lowering import Ops, result_dtypes

prims = Ops(torch.ops.prims, "prims")

__all__: list[str] = []


def _float(*values):
  """`values` (arrays or Scalars) cast to torch's `int_to_float` computation dtype."""
  compute, _ = result_dtypes(*values, kind="int_to_float")
  out = []
  for v in values:
    v = jnp.asarray(v)
    if v.dtype == jnp.bool_:
      v = v.astype(jnp.uint8)
    out.append(v.astype(compute))
  return jnp.broadcast_arrays(*out) if len(out) > 1 else out


def _horner(z, coeffs):
  r = jnp.zeros_like(z)
  for c in coeffs:
    r = r * z + c
  return r


def _chebyshev_series(t, coeffs):
  # Cephes' chbevl as torch unrolls it in the k0/k1 kernels: 0.5 * (b0 - b2).
  p = q = jnp.zeros_like(t)
  a = jnp.full_like(t, coeffs[0])
  for c in coeffs[1:]:
    p, q = q, a
    a = t * q - p + c
  return 0.5 * (a - p)


def _nan(x):
  return jnp.full((), jnp.nan, x.dtype)


def _inf(x):
  return jnp.full((), jnp.inf, x.dtype)


def _where_safe(cond, x, fill):
  """`x` where `cond`, else the harmless `fill` (so an untaken branch cannot give nan grads)."""
  return jnp.where(cond, x, jnp.asarray(fill, x.dtype))
