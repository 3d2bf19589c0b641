"""An aten overload resolved to a function of JAX arrays: the registry's lowering, torch's
decomposition, or the callback fallback (else `OperatorNotFound`).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import jax
import numpy as np
import torch
from torch._decomp import decomposition_table

from bridge._src import config as config_lib
from bridge._src import tensor as tensor_lib
from bridge._src.dispatch import fallback
from bridge._src.errors import OperatorNotFound
from bridge._src.registry import REGISTRY
from bridge._src.tensor import Tensor, make, value


def lowering_fn(func: Any) -> tuple[Callable, Any]:
  """(function of jax arrays, Lowering or None) for `func`: a lowering, or a decomposition."""
  lowering = REGISTRY.lookup(func)
  if lowering is not None:
    if func in fallback.TORCH_ON_CPU:
      lowering = fallback.torch_on_cpu(func, lowering)
    return lowering.fn, lowering
  REGISTRY.require_plugins()
  decomp = decomposition(func) if config_lib.get_config().decompose_missing_ops else None
  if decomp is None:
    lowering = fallback.lowering(func)
    if lowering is None:
      fallback.raise_not_found(func)
    return lowering.fn, lowering
  return _decomposition_as_lowering(func, decomp), None


def decomposition(func: Any) -> Callable | None:
  """torch's decomposition of `func`, or its CompositeImplicitAutograd kernel (which, below
  autograd, torch does not run by itself)."""
  decomp = decomposition_table.get(func)
  if decomp is not None:
    return decomp
  if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
    return func.decompose
  return None


def composite_kernel(func: Any) -> Callable | None:
  """torch's CompositeImplicitAutograd kernel of `func` where it has one and no lowering;
  else None.

  Above autograd torch runs such a kernel on the tensors it was given, so the op never reaches
  the dispatcher; below autograd (`torch.inference_mode()` turns autograd's keys off) it
  does, and torch's backends still run the kernel on the tensors. The kernel may write them
  without the op's schema saying so (`batch_norm`'s running statistics, through
  `native_batch_norm`; `instance_norm`'s): its decomposition run as one lowering, on new
  tensors, would lose the write, and raises `ArgumentWritten` instead; the op then runs the
  kernel on the tensors themselves (`special`).
  """
  if not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
    return None
  if REGISTRY.lookup(func) is not None:
    return None
  return func.decompose


_decomp_state = threading.local()


def decomposing() -> set:
  active = getattr(_decomp_state, "active", None)
  if active is None:
    active = _decomp_state.active = set()
  return active


class decomposing_scope:
  """Marks `func` as being decomposed, so a decomposition that calls its own op fails cleanly."""

  def __init__(self, func: Any):
    self.func = func

  def __enter__(self) -> None:
    decomposing().add(self.func)

  def __exit__(self, *exc: Any) -> None:
    decomposing().discard(self.func)


def _decomposition_as_lowering(func: Any, decomp: Callable) -> Callable:
  """Run torch's decomposition on tensors that wrap the traced JAX values."""

  def run(*args: Any, **kwargs: Any) -> Any:
    if func in decomposing():
      fallback.raise_not_found(func)
    with decomposing_scope(func):
      return run_inner(*args, **kwargs)

  def run_inner(*args: Any, **kwargs: Any) -> Any:
    device = tensor_lib.jax_device(0)
    # Traced arrays become tensors again; a weakly typed 0-d tracer is a traced Python scalar.
    targs, tkwargs = jax.tree_util.tree_map(
      lambda x: (
        make(x, device)
        if isinstance(x, (jax.core.Tracer, jax.Array)) and (np.ndim(x) > 0 or not x.aval.weak_type)
        else x
      ),
      (args, kwargs),
    )
    out = decomp(*targs, **tkwargs)
    if out is NotImplemented:  # torch's decomposition does not cover these arguments
      lowering = fallback.lowering(func)
      if lowering is None:
        fallback.raise_not_found(func)
      return lowering.fn(*args, **kwargs)
    _check_unwritten(func, targs, tkwargs)
    return jax.tree_util.tree_map(
      lambda t: value(t) if isinstance(t, Tensor) else t,
      out,
      is_leaf=lambda t: isinstance(t, torch.Tensor),
    )

  return run


class ArgumentWritten(OperatorNotFound):
  """A decomposition run as one lowering wrote an argument that its op's schema does not mark
  as written: the write cannot reach the caller's tensor (`composite_kernel`)."""


def _check_unwritten(func: Any, args: tuple, kwargs: dict) -> None:
  """Raise `ArgumentWritten` where the decomposition wrote one of its arguments (given to it
  as new tensors) that its op's schema does not mark as written."""
  names = [a.name for a in func._schema.arguments]
  declared = {a.name for a in func._schema.arguments if a.alias_info and a.alias_info.is_write}
  for name, t in [*zip(names, args), *kwargs.items()]:
    if isinstance(t, Tensor) and t._storage.version and name not in declared:
      raise ArgumentWritten(
        f"bridge: torch's decomposition of {func} writes its argument `{name}`, which the "
        "op's schema does not say: run as one lowering, on the argument's value, it would "
        "lose the write. Register a lowering of the op that returns the new value and "
        f"store it, as the in-place ops do. Its schema: {func._schema}"
      )
