"""What an aten overload's schema says (a view, the arguments it writes, which argument types
may be traced), and JAX's 64-bit types switched on for the bridge's own computations.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import jax
import torch

from bridge._src import dtypes, scope

aten = torch.ops.aten


def x64() -> Any:
  """JAX's 64-bit types on for a block (the bridge's own computations), if they are off
  (and unless torch code is staged into a 32-bit JAX program: see `scope.narrow`)."""
  if dtypes.x64_enabled() or scope.narrow():
    return contextlib.nullcontext()
  return jax.enable_x64(True)


def quiet_narrowing() -> Any:
  """JAX's warnings about unavailable 64-bit dtypes, silenced (the bridge proves or refuses
  each narrowing itself: `narrowing`)."""
  ctx = warnings.catch_warnings()
  ctx.__enter__()
  warnings.filterwarnings("ignore", message="Explicitly requested dtype")
  return ctx


def is_dynamic_type(t: Any) -> bool:
  """Whether values of schema type `t` may be traced (tensors and Scalar/float/complex)."""
  if isinstance(t, torch.OptionalType):
    return is_dynamic_type(t.getElementType())
  if isinstance(t, torch.ListType):
    return is_dynamic_type(t.getElementType())
  return isinstance(t, (torch.TensorType, torch.NumberType, torch.FloatType, torch.ComplexType))


def mutated_args(func: Any) -> list[str]:
  return [
    a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write
  ]


def is_view(func: Any) -> bool:
  rets = func._schema.returns
  return (
    bool(rets)
    and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)
    and not mutated_args(func)
  )
