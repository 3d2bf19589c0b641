"""Helpers shared by the linear-algebra families (`products`, `linalg`, `ldl`, `spectral`):
the products' precision, conjugate transposes, batch broadcasting, Hermitian inputs, and
torch's errors for LAPACK's `info` (`check_info`)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from bridge_ops._lowering import check

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


# ----------------------------------------------------------------------------- info checks
# torch's kernels hand LAPACK's `info` (0, the 1-based index of a failing pivot/minor, or
# -i for an illegal argument i) to `_linalg_check_errors(info, api_name, is_matrix)`, which
# raises for the first nonzero one: `LinAlgError` for most, a `RuntimeError` for
# `lu_factor`, an internal assert for a negative code or a name it does not know (`ldl`),
# each message depending on the name (its wording varies with torch's version). So the
# message and the exception's type come from torch's own check, run on the CPU on an `info`
# holding the failing code at its position (only when it fails, or once per name for the
# type).


def _torch_info_error(api_name: str, is_matrix: bool, code: int, position: int) -> Exception:
  """torch's exception for LAPACK code `code` at batch element `position` (flat, C order)."""
  infos = torch.zeros(() if is_matrix else (position + 1,), dtype=torch.int32)
  infos.view(-1)[-1] = code
  try:
    torch.ops.aten._linalg_check_errors(infos, api_name, is_matrix=is_matrix)
  except Exception as e:  # noqa: BLE001 - whatever torch raises is the error
    return e
  raise AssertionError(f"torch's _linalg_check_errors accepted info {code} for {api_name}")


@functools.cache
def _info_error_type(api_name: str, sign: int) -> type[Exception]:
  # (the type depends on the name and the code's sign only, but for the SVDs' -4, a NaN in the
  # input: torch's LinAlgError where other negative codes are internal asserts)
  code = -4 if sign < 0 and "svd" in api_name else sign
  return type(_torch_info_error(api_name, True, code, 0))


def _info_message(api_name: str, is_matrix: bool):
  # (a closure of hashable values: a staged check is named by them, see `ffi.check_name`)
  return lambda code, position: str(_torch_info_error(api_name, is_matrix, code, position))


def check_info(info, api_name: str, is_matrix: bool) -> None:
  """torch's `_linalg_check_errors(info, api_name, is_matrix)` as a value check: raises
  torch's exception, with its message, for the first nonzero `info` (a batch of LAPACK codes;
  `is_matrix`: torch's `A.dim() == 2`, one code without a batch element in the message).
  Eager on the `jax` device it raises; inside a traced program only with
  `bridge.config(check_indices=True)` (`_lowering.check`)."""
  xp = jnp if isinstance(info, jax.core.Tracer) else np  # (concrete: `_linalg_check_errors`)
  flat = xp.asarray(info).reshape(-1)
  failed = flat != 0
  if not flat.size or (xp is np and not failed.any()):
    return
  first = flat[xp.argmax(failed)]  # torch reports the first failing element only
  message = _info_message(api_name, is_matrix)
  for sign, bad in ((1, failed & (first > 0)), (-1, failed & (first < 0))):
    check(bad, flat, _info_error_type(api_name, sign), message)
