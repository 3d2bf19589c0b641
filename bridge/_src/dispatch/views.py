"""The plan of a view op: the result shares its input's storage, with torch's metadata (its
dtype, for a view of another dtype, and torch's conj and neg bits among it)."""

from __future__ import annotations

import contextlib
from typing import Any

import jax
import numpy as np
import torch

from bridge._src import dtypes
from bridge._src import scope
from bridge._src import tensor as tensor_lib
from bridge._src.dispatch.schema import aten
from bridge._src.errors import NarrowingError
from bridge._src.tensor import Tensor, make_view


def _check_in_storage(size: tuple, stride: tuple, offset: int, dtype: Any, nbytes: int) -> None:
  """torch's refusal of a view reaching past its storage's end (`as_strided` with a larger
  size or offset), which a meta tensor, whose storage has no bytes to check, lets through: JAX
  would clamp the positions past the end, reading and writing other elements."""
  if 0 in size:
    return
  itemsize = dtype.itemsize
  need = itemsize * (offset + 1 + sum((n - 1) * st for n, st in zip(size, stride)))
  if need > nbytes:
    raise RuntimeError(
      f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, "
      f"and itemsize {itemsize} requiring a storage size of {need} are out of bounds for "
      f"storage of size {nbytes}"
    )


class ViewPlan:
  """A view op: the result shares its input's storage, with torch's metadata."""

  def __init__(self, func: Any):
    self.func = func
    self.cache: dict[tuple, Any] = {}
    self.detaches = func is aten.detach.default
    # `view(dtype)` to another dtype: torch records no derivative through it
    self.reinterprets = func is aten.view.dtype

  def __call__(self, args: tuple, kwargs: dict) -> Any:
    self_t = args[0]
    rest = args[1:]
    key = (
      tuple(self_t.shape),
      tuple(self_t.stride()),
      self_t.storage_offset(),
      self_t.dtype,
      self_t.is_conj(),
      self_t.is_neg(),
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
    storage, device = self_t._storage, self_t._dev
    out: Any
    # A view of a normal tensor is a normal tensor, also when made in `torch.inference_mode()`
    # (torch's autograd layer then gives it its base's version counter, which an inference
    # tensor has none of)
    normal = torch.is_inference_mode_enabled() and not self_t.is_inference()
    with torch.inference_mode(False) if normal else contextlib.nullcontext():
      if isinstance(meta, tuple):
        size, stride, offset, dtype, conj, neg = meta
        as_ = self_t._as if dtype is self_t.dtype else self._as(self_t, dtype)
        out = make_view(storage, size, stride, offset, dtype, device, as_, conj, neg)
      else:
        out = [
          make_view(storage, size, stride, offset, dtype, device, self._as(self_t, dtype), c, n)
          for size, stride, offset, dtype, c, n in meta
        ]
    # `detach()`, views of a detached tensor, and views made in a `torch.no_grad()` block of
    # traced code are constants for JAX's derivatives (torch gives them no gradient)
    detaches = self.detaches or (self.reinterprets and out.dtype != self_t.dtype)
    if (detaches or self_t._detached or scope.no_grad_inside()) and isinstance(
      storage.array, jax.core.Tracer
    ):
      tensor_lib.detach_traced(out)
    return out

  def _meta(self, t: Tensor, rest: tuple, kwargs: dict) -> Any:
    base = torch.empty(tensor_lib.storage_numel(t), dtype=t.dtype, device="meta")
    m = base.as_strided(tuple(t.shape), tuple(t.stride()), t.storage_offset())
    if t.is_conj():
      m = m._conj()
    if t.is_neg():
      m = m._neg_view()
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
    described = [
      (tuple(o.shape), tuple(o.stride()), o.storage_offset(), o.dtype, o.is_conj(), o.is_neg())
      for o in (out if isinstance(out, (list, tuple)) else [out])
    ]
    nbytes = tensor_lib.storage_numel(t) * t.element_size()
    for size, stride, offset, dtype, _, _ in described:
      _check_in_storage(size, stride, offset, dtype, nbytes)
    return described if isinstance(out, (list, tuple)) else described[0]

  def _as(self, t: Tensor, dtype: torch.dtype) -> Any:
    """The JAX dtype a view of `t` with `dtype` reads the storage as (`Tensor._as`)."""
    if dtype == t.dtype:
      return t._as
    name = self.func.overloadpacket.__name__
    if scope.narrow() and (dtype in dtypes.NARROWED or t.dtype in dtypes.NARROWED):
      raise NarrowingError(
        f"bridge: `{name}` from {t.dtype} to {dtype} reads 64-bit values' bytes, but the torch "
        "code is being traced into a JAX program built with JAX's 64-bit types disabled, "
        "whose 64-bit tensors hold 32-bit arrays. Enable 64-bit types "
        "(`jax.config.update('jax_enable_x64', True)`, or `with jax.enable_x64(True):` around "
        f"the jitted call). First at\n  {scope.user_line()}"
      )
    want = dtypes.jax_dtype(dtype, api=f"torch.{name}", where="the view")
    return None if want == np.dtype(t._storage.array.dtype) else want


_COPIES = object()  # a `ViewPlan` cache entry: the op copies for this layout


def _freeze(x: Any) -> Any:
  if isinstance(x, (list, tuple)):
    return tuple(_freeze(v) for v in x)
  if isinstance(x, dict):
    return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
  if isinstance(x, torch.Tensor):
    return ("tensor", id(x))
  return x
