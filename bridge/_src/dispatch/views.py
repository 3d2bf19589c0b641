"""The plan of a view op: the result shares its input's storage, with torch's metadata."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import torch

from bridge._src import scope
from bridge._src import tensor as tensor_lib
from bridge._src.dispatch.schema import aten
from bridge._src.tensor import Tensor, make_view


class ViewPlan:
  """A view op: the result shares its input's storage, with torch's metadata."""

  def __init__(self, func: Any):
    self.func = func
    self.cache: dict[tuple, Any] = {}
    self.detaches = func in (aten.detach.default, aten.detach_.default)

  def __call__(self, args: tuple, kwargs: dict) -> Any:
    self_t = args[0]
    rest = args[1:]
    key = (
      tuple(self_t.shape),
      tuple(self_t.stride()),
      self_t.storage_offset(),
      self_t.dtype,
      _freeze(rest),
      _freeze(kwargs),
    )
    meta = self.cache.get(key)
    if meta is None:
      meta = self.cache[key] = self._meta(self_t, rest, kwargs)
    if meta is _COPIES:
      # A "maybe view" op (`reshape`, `contiguous`, `flatten` of a non-viewable
      # layout) copies here: its composite kernel does the copy with ordinary ops.
      return self.func.decompose(*args, **kwargs)
    storage, device, dtype = self_t._storage, self_t._dev, self_t.dtype
    out: Any
    if isinstance(meta, list):
      out = [
        make_view(storage, size, stride, offset, dtype, device) for size, stride, offset in meta
      ]
    else:
      size, stride, offset = meta
      out = make_view(storage, size, stride, offset, dtype, device)
    # `detach()`, views of a detached tensor, and views made in a `torch.no_grad()` block of
    # traced code are constants for JAX's derivatives (torch gives them no gradient)
    if (self.detaches or self_t._detached or scope.no_grad_inside()) and isinstance(
      storage.array, jax.core.Tracer
    ):
      tensor_lib.detach_traced(out)
    return out

  def _meta(self, t: Tensor, rest: tuple, kwargs: dict) -> Any:
    numel = int(np.prod(t._storage.array.shape))
    base = torch.empty(numel, dtype=t.dtype, device="meta")
    m = base.as_strided(tuple(t.shape), tuple(t.stride()), t.storage_offset())
    composite = torch._C._dispatch_has_kernel_for_dispatch_key(
      self.func.name(), "CompositeImplicitAutograd"
    )
    try:
      out = self.func(m, *rest, **kwargs)
    except (NotImplementedError, RuntimeError):
      if composite:  # `to(device="cpu")`: no meta answer, a copy
        return _COPIES
      raise
    if composite and any(
      not o._is_view() for o in (out if isinstance(out, (list, tuple)) else [out])
    ):
      return _COPIES
    if isinstance(out, (list, tuple)):
      return [(tuple(o.shape), tuple(o.stride()), o.storage_offset()) for o in out]
    return (tuple(out.shape), tuple(out.stride()), out.storage_offset())


_COPIES = object()  # a `ViewPlan` cache entry: the op copies for this layout


def _freeze(x: Any) -> Any:
  if isinstance(x, (list, tuple)):
    return tuple(_freeze(v) for v in x)
  if isinstance(x, dict):
    return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
  if isinstance(x, torch.Tensor):
    return ("tensor", id(x))
  return x
