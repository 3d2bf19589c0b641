"""Ops the dispatcher handles itself: copies between devices, `.item()`, resolving lazy
conj/neg views, `native_batch_norm` (whose schema hides that it updates running stats), and
composite ops without a lowering that reach it below autograd (`torch.inference_mode()`).
Lazy conj/neg views and dtype views themselves are views (`dispatch.views`).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
import torch
from jax._src import core as _jax_core

from bridge._src import config as config_lib
from bridge._src import devices as device_lib
from bridge._src import dtypes
from bridge._src import narrowing
from bridge._src import scope
from bridge._src import tensor as tensor_lib
from bridge._src import transfer
from bridge._src.dispatch.functional import FunctionalPlan
from bridge._src.dispatch import mutation
from bridge._src.dispatch.mutation import cast, check_overlap, store
from bridge._src.dispatch.resolve import (
  ArgumentWritten,
  composite_kernel,
  decomposing,
  decomposing_scope,
)
from bridge._src.dispatch.schema import aten, x64
from bridge._src.dispatch.tensors import moved_placement, remember_placement
from bridge._src.errors import BridgeTypeError
from bridge._src.tensor import Tensor, make, value


def concrete(v: Any, what: str) -> Any:
  """`v` itself, or a traced `v`'s concrete value (known under an eager `jax.grad`); raises
  `TracedValueError` (naming the torch line) when JAX is staging a program."""
  if isinstance(v, jax.core.Tracer):
    c = _jax_core.to_concrete_value(v)
    if c is None:
      raise scope.traced_value_error(what)
    return c
  return v


def _to_copy(args: tuple, kwargs: dict) -> Any:
  src = args[0]
  dtype = kwargs.get("dtype") or src.dtype
  device = kwargs.get("device")
  v = value(src)
  if device is not None and torch.device(device).type != tensor_lib.device_type():
    v = concrete(v, f"a copy to {device}: `.cpu()`, `.tolist()`, `.numpy()`, `.to('{device}')`")
    remember_placement(src, v)
    out = transfer.array_to_torch(v, copy=True, api="Tensor.to", where=lambda: "the tensor")
    return out.to(dtype=dtype, device=device)
  target_device = (
    tensor_lib.jax_device(device_lib.device_index(device)) if device is not None else src.device
  )
  dtype = narrowing.narrow_dtype(dtype, f"a conversion to {dtype}")
  with x64():
    want = dtypes.jax_dtype(dtype, api="Tensor.to", where="the requested dtype")
    # Same dtype: the copy shares the immutable array in a storage box of its own, so an
    # in-place op on either tensor (which replaces its box's array) leaves the other alone.
    out = cast(v, want) if np.dtype(v.dtype) != want else v
    if target_device != src.device:
      remember_placement(src, v)
      # (a move's gradient goes back placed as the tensor moved: `moved_placement`)
      out = jax.device_put(out, moved_placement() or device_lib.jax_devices()[target_device.index])
  return make(out, target_device, dtype)


def copy_into(dst: Any, src: Any) -> Any:
  """`dst.copy_(src)` where either may be a `jax` tensor."""
  return _copy_((dst, src), {})


_COPY_NAMES = [a.name for a in aten.copy_.default._schema.arguments]


def _check_broadcast_into(dst: tuple, src: tuple) -> None:
  """torch's errors for a source of `copy_` that does not broadcast to the destination's shape
  (JAX's would name neither tensor)."""
  shape = list(dst) if len(dst) >= len(src) else list(src)
  for i in range(1, len(shape) + 1):
    a = dst[-i] if i <= len(dst) else 1
    b = src[-i] if i <= len(src) else 1
    if a != b and a != 1 and b != 1:
      raise RuntimeError(
        f"The size of tensor a ({a}) must match the size of tensor b ({b}) at non-singleton "
        f"dimension {len(shape) - i}"
      )
    shape[-i] = a if b == 1 else b
  if tuple(shape) != tuple(dst):
    raise RuntimeError(f"output with shape {list(dst)} doesn't match the broadcast shape {shape}")


def _copy_(args: tuple, kwargs: dict) -> Any:
  dst, src = args[0], args[1]
  if src.shape != dst.shape:
    _check_broadcast_into(tuple(dst.shape), tuple(src.shape))
  if isinstance(src, Tensor):
    if isinstance(dst, Tensor):
      check_overlap(aten.copy_.default, _COPY_NAMES, ["self"], [dst], args, kwargs)
      store(dst, src)
    else:
      with torch.no_grad():
        dst.copy_(_to_copy((src,), {"device": dst.device, "dtype": src.dtype}))
    return dst
  if src.is_meta:  # (torch's error, for any device: `copy_impl`)
    raise NotImplementedError("Cannot copy out of meta tensor; no data!")
  # (inside a 32-bit program a 64-bit source must fit, as CPU tensors beside jax tensors)
  src_t, bound = narrowing.known(
    src.detach(), f"a {src.dtype} CPU tensor (shape {tuple(src.shape)}) copied to the jax device"
  )
  with x64():
    v = transfer.tensor_to_jax(src_t, copy=True, api="Tensor.copy_", where=lambda: "the source")
    # (a CPU tensor arrives on JAX's CPU device: on to the tensor's own, a GPU or jax:1)
    v = device_lib.place(v, dst.device.index or 0)
    if bound is not None:
      narrowing.track(v, bound)
  store(dst, v)
  return dst


def _local_scalar_dense(args: tuple, kwargs: dict) -> Any:
  v = concrete(value(args[0]), "`.item()`, `bool(t)`, `if t:`, `int(t)` or `float(t)`")
  return np.asarray(v).item()


def _identity_copy(args: tuple, kwargs: dict) -> Any:
  return _to_copy(args[:1], {})


def _resolved(args: tuple, kwargs: dict) -> Any:
  """`resolve_conj` / `resolve_neg` (composite in torch, so reached only when called as an
  aten op): the input, or a copy holding its value where it is a lazy conjugate/negative."""
  t = args[0]
  if not (t.is_conj() or t.is_neg()):
    return t
  return make(value(t), t._dev, t.dtype)


def _as_strided_scatter(args: tuple, kwargs: dict) -> Any:
  """torch's `output = clone_preserve_strides(self); output.as_strided(size, stride,
  offset).copy_(src)`.

  torch clones `self`'s whole storage (elements outside the view included) and views the
  copy with `self`'s size, strides and offset, so the scatter's storage offset and strides
  address that storage. A jax tensor's storage array is exactly that storage. An expanded
  `self` (internal overlap) is cloned contiguous first, as torch does.
  """
  names = ["self", "src", "size", "stride", "storage_offset"]
  bound = dict(zip(names, args), **kwargs)
  self, src = bound["self"], bound["src"]
  if any(self.stride(d) == 0 and self.size(d) > 1 for d in range(self.dim())):
    self = self.clone(memory_format=torch.contiguous_format)
  n = tensor_lib.storage_numel(self)
  storage = self.as_strided((n,), (1,), 0).clone()
  out = storage.as_strided(self.size(), self.stride(), self.storage_offset())
  storage.as_strided(bound["size"], bound["stride"], bound.get("storage_offset") or 0).copy_(src)
  return out


def _pack_padded_sequence(args: tuple, kwargs: dict) -> tuple:
  """torch's `_pack_padded_sequence` (`nn.utils.rnn.pack_padded_sequence`), on jax tensors.

  As torch's kernel (CompositeExplicitAutograd, so it reaches the dispatcher), with the same
  checks and messages: `lengths` is a CPU int64 tensor, so the packed layout is known in
  Python; the data are slices of `input` (traced like any op: shapes are static) and
  `batch_sizes` is a CPU tensor, which torch's recurrent kernels (`lstm.data`, ...) and
  `pad_packed_sequence` read on the host.
  """
  bound = dict(zip(["input", "lengths", "batch_first"], args), **kwargs)
  x, lengths, batch_first = bound["input"], bound["lengths"], bound["batch_first"]
  if x.numel() == 0:
    raise RuntimeError("Cannot pack empty tensors.")
  if lengths.device.type != "cpu" or lengths.dtype != torch.int64 or lengths.dim() != 1:
    kind = torch.empty(0, dtype=lengths.dtype).type().rpartition(".")[2].removesuffix("Tensor")
    hint = ""
    if isinstance(lengths, Tensor) and isinstance(lengths._storage.array, jax.core.Tracer):
      hint = (
        ". Here `lengths` is a value of the JAX program being traced (a tensor argument "
        "of `bridge.compile` or `call_torch`), but the packed layout must be known "
        "while tracing: pass the lengths as a Python list (a static argument) or as a "
        "CPU tensor the function closes over"
      )
    raise RuntimeError(
      f"'lengths' argument should be a 1D CPU int64 tensor, but got "
      f"{lengths.dim()}D {lengths.device} {kind} tensor{hint}"
    )
  if batch_first:
    x = x.transpose(0, 1)
  batch, lens = x.shape[1], lengths.tolist()
  if len(lens) != batch:
    raise RuntimeError(
      f"Expected `len(lengths)` to be equal to batch_size, but got {len(lens)} (batch_size={batch})"
    )
  if lens[-1] <= 0:
    raise RuntimeError(
      "Length of all samples has to be greater than 0, but found an element "
      "in 'lengths' that is <= 0"
    )
  steps, sizes, prev = [], [], 0
  for i, n in enumerate(reversed(lens)):  # shortest first: each run of steps has one batch
    if n < prev:
      raise RuntimeError(
        "`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. "
        "You can pass `enforce_sorted=False` to pack_padded_sequence and/or pack_sequence "
        "to sidestep this requirement if you do not need ONNX exportability."
      )
    if n > prev:
      steps.append(x[prev:n, : batch - i].reshape(-1, *x.shape[2:]))
      sizes += [batch - i] * (n - prev)
      prev = n
  return torch.cat(steps), torch.tensor(sizes, dtype=torch.int64, device="cpu")


def _false(args: tuple, kwargs: dict) -> bool:
  return False


def _is_set_to(args: tuple, kwargs: dict) -> bool:
  """`t.is_set_to(other)`, as torch's: the same storage, storage offset, sizes and strides
  (whatever the dtypes); a tensor of another device never is."""
  bound = dict(zip(["self", "tensor"], args), **kwargs)
  a, b = bound["self"], bound["tensor"]
  return (
    type(a) is Tensor
    and type(b) is Tensor
    and a._storage is b._storage
    and a.storage_offset() == b.storage_offset()
    and a.shape == b.shape
    and a.stride() == b.stride()
  )


def _native_batch_norm(plan_of: Callable[[Any], Callable]) -> Callable:
  """`native_batch_norm` updates its running stats in place though its schema does not say so:
  it runs the plan (`plan_of`) of the `_native_batch_norm_legit` overload that fits, then
  stores the new statistics."""

  def run(args: tuple, kwargs: dict) -> Any:
    bound = dict(
      zip(
        ["input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps"],
        args,
      ),
      **kwargs,
    )
    if not (bound["training"] and bound["running_mean"] is not None):
      if bound["running_mean"] is not None:
        return plan_of(aten._native_batch_norm_legit_no_training.default)(
          (
            bound["input"],
            bound["weight"],
            bound["bias"],
            bound["running_mean"],
            bound["running_var"],
            bound["momentum"],
            bound["eps"],
          ),
          {},
        )
      return plan_of(aten._native_batch_norm_legit.no_stats)(
        (
          bound["input"],
          bound["weight"],
          bound["bias"],
          bound["training"],
          bound["momentum"],
          bound["eps"],
        ),
        {},
      )
    out, mean, rstd, new_mean, new_var = plan_of(aten._native_batch_norm_legit_functional.default)(
      (
        bound["input"],
        bound["weight"],
        bound["bias"],
        bound["running_mean"],
        bound["running_var"],
        True,
        bound["momentum"],
        bound["eps"],
      ),
      {},
    )
    store(bound["running_mean"], new_mean)
    store(bound["running_var"], new_var)
    return out, mean, rstd

  return run


# The special ops above that make tensors with new values or dtypes (their int64 results in a
# 32-bit program are proven exact by `narrowing`); the others return their input or write
# through `store`, which does it.
NEW_VALUES = frozenset(
  {
    aten._to_copy.default,
    torch.ops.prims.convert_element_type.default,
    aten.lift_fresh_copy.default,
    aten.as_strided_scatter.default,
    aten._pack_padded_sequence.default,
  }
)


def _new_zeros_with_same_feature_meta(args: tuple, kwargs: dict) -> Tensor:
  """Forward AD's zero tangent laid out as `other` (its strides, storage offset and storage
  size), after `self`'s first `self_num_batch_dims` dimensions, which stack copies of it."""
  self, other = args[0], args[1]
  batch = args[2] if len(args) > 2 else kwargs.get("self_num_batch_dims", 0)
  numel = tensor_lib.storage_numel(other)
  strides: list[int] = []
  for n in reversed(self.shape[:batch]):
    strides.insert(0, numel)
    numel *= int(n)
  storage = tensor_lib.Storage(
    jax.numpy.zeros((numel,), dtypes.TORCH_TO_JAX[other.dtype]), other._storage.device
  )
  return tensor_lib.make_view(
    storage,
    (*self.shape[:batch], *other.shape),
    (*strides, *other.stride()),
    other.storage_offset(),
    other.dtype,
    other._storage.device,
  )


def _resize_(args: tuple, kwargs: dict) -> Any:
  """`t.resize_(size)` as torch's: over the same storage, which grows if it must
  (`mutation.resize`), so the views of `t` still alias it."""
  bound = dict(zip(["self", "size"], args), **kwargs)
  mutation.resize(bound["self"], bound["size"], bound.get("memory_format"))
  return bound["self"]


def _resize_as_(args: tuple, kwargs: dict) -> Any:
  """`t.resize_as_(template)`: `resize_` to the template's shape (and memory format)."""
  bound = dict(zip(["self", "the_template"], args), **kwargs)
  self, template = bound["self"], bound["the_template"]
  meta_template = torch.empty_strided(
    tuple(template.shape), tuple(template.stride()), dtype=template.dtype, device="meta"
  )
  if type(self) is not Tensor:  # (a CPU tensor resized as a `jax` one: torch's own kernel)
    return self.resize_as_(meta_template, memory_format=bound.get("memory_format"))
  meta = mutation.meta_like(self)
  meta.resize_as_(meta_template, memory_format=bound.get("memory_format"))
  mutation.conform(self, meta, self)
  return self


def _other_device(self: Any, device: Any) -> RuntimeError:
  return RuntimeError(
    f'Attempted to set the storage of a tensor on device "{self.device}" to a storage on '
    f'different device "{device}".  This is no longer allowed; the devices must match.'
  )


def _set_(args: tuple, kwargs: dict) -> Any:
  """`t.set_()`: `t` becomes an empty tensor (size (0,)) with a new storage of its own."""
  self = args[0] if args else kwargs["self"]
  with x64():
    empty = make(jax.numpy.zeros((0,), dtypes.TORCH_TO_JAX[self.dtype]), self._dev, self.dtype)
  meta = torch.empty(0, dtype=self.dtype, device="meta")
  mutation.conform(self, meta, empty)
  return self


def _set_tensor(args: tuple, kwargs: dict) -> Any:
  """`t.set_(source)` and `t.set_(source, storage_offset, size, stride)`: `t` shares the
  storage of `source` (no copy: a write through either is seen by both), with `source`'s
  geometry or the one given, which may grow that storage as torch's `set_` does (`set_`'s
  overloads taking a storage reach here too, with the tensor `Tensor.set_` was given). torch's
  checks and errors (dtypes, offsets, sizes and strides) are those of its meta kernel."""
  names = ["self", "source", "storage_offset", "size", "stride"]
  bound = dict(zip(names, args), **kwargs)
  self, source = bound["self"], bound["source"]
  stand_in: Any = mutation.meta_like(source) if isinstance(source, Tensor) else source.to("meta")
  meta = mutation.meta_like(self)  # (`self` may be a CPU tensor given a `jax` source)
  if "size" in bound:
    meta.set_(stand_in, bound["storage_offset"], bound["size"], bound.get("stride") or [])
  else:
    meta.set_(stand_in)
  if type(self) is not Tensor or type(source) is not Tensor or source._dev is not self._dev:
    raise _other_device(self, source.device)
  mutation.conform(self, meta, source)
  return self


def _set_storage(args: tuple, kwargs: dict) -> Any:
  """`t.set_(storage, ...)`. A `jax` tensor's data is a JAX array, not a torch storage
  (`untyped_storage()` refuses), so the storage is another device's (torch's error), or that
  of the `jax` tensor `Tensor.set_` was given (`tensor.set_source`): as `set_(source, ...)`."""
  names = ["self", "source", "storage_offset", "size", "stride"]
  bound = dict(zip(names, args), **kwargs)
  self, storage = bound["self"], bound["source"]
  source = tensor_lib.set_source(storage)
  if source is not None:
    if "size" not in bound:  # (`set_(storage)`: all of it, as a 1-d tensor)
      bound["storage_offset"], bound["size"] = 0, [storage.nbytes() // self.element_size()]
    return _set_tensor((), {**bound, "source": source})
  if storage.device.type == tensor_lib.device_type():
    raise BridgeTypeError(
      "`Tensor.set_`: a torch storage of the `jax` device holds no data (a `jax` tensor's data "
      "is a JAX array). Pass the tensor itself: `t.set_(source, storage_offset, size, stride)`."
    )
  raise _other_device(self, storage.device)


def _no_nested(args: tuple, kwargs: dict) -> Any:
  """`torch._nested_tensor_from_mask`: a nested tensor, which the `jax` device cannot hold
  (torch reaches it in `nn.TransformerEncoder`'s fast path: eval mode, no gradient recorded,
  a `src_key_padding_mask`; its output then raised torch's "Internal error")."""
  del args, kwargs
  raise BridgeTypeError(
    "`torch._nested_tensor_from_mask`: the `jax` device cannot hold nested tensors. "
    "`nn.TransformerEncoder` makes one in its fast path (eval mode, no gradient recorded, "
    "a `src_key_padding_mask`): build it with `enable_nested_tensor=False` (the same values "
    "at the unpadded positions), or run it under `torch.backends.mha.set_fastpath_enabled(False)`."
  )


_SPECIAL: dict[Any, Callable] = {
  aten._nested_tensor_from_mask.default: _no_nested,
  aten._to_copy.default: _to_copy,
  # (torch.compile's graphs convert a Python number passed as a 0-dim tensor with it)
  torch.ops.prims.convert_element_type.default: lambda a, k: _to_copy(
    (a[0],), {"dtype": a[1] if len(a) > 1 else k["dtype"]}
  ),
  aten.copy_.default: _copy_,
  aten.resize_.default: _resize_,
  aten.resize_as_.default: _resize_as_,
  aten.set_.default: _set_,
  aten.set_.source_Tensor: _set_tensor,
  aten.set_.source_Tensor_storage_offset: _set_tensor,
  aten.set_.source_Storage: _set_storage,
  aten.set_.source_Storage_storage_offset: _set_storage,
  aten._local_scalar_dense.default: _local_scalar_dense,
  aten.lift_fresh.default: lambda a, k: a[0],
  aten.lift_fresh_copy.default: _identity_copy,
  aten.resolve_conj.default: _resolved,
  aten.resolve_neg.default: _resolved,
  aten.as_strided_scatter.default: _as_strided_scatter,
  aten.is_pinned.default: _false,
  aten.is_set_to.default: _is_set_to,
  aten._pack_padded_sequence.default: _pack_padded_sequence,
  aten._has_compatible_shallow_copy_type.default: lambda a, k: (
    isinstance(a[0], Tensor) and isinstance(a[1], Tensor)
  ),
  aten._new_zeros_with_same_feature_meta.default: _new_zeros_with_same_feature_meta,
  # (forward AD's `make_dual` asks it of a tangent: the storages' sizes, in elements)
  aten._has_same_storage_numel.default: lambda a, k: (
    type(a[0]) is Tensor
    and type(a[1]) is Tensor
    and tensor_lib.storage_numel(a[0]) == tensor_lib.storage_numel(a[1])
  ),
}


class _Composite:
  """A composite op without a lowering, reached below autograd (`resolve.composite_kernel`).

  Its functional plan runs torch's decomposition as one lowering, until that is seen writing an
  argument (`resolve.ArgumentWritten`, raised while it is traced, before anything is stored:
  `batch_norm`'s running statistics); from then on, and for an op whose result is a Python
  value (`item`: a lowering has no value to read), torch's composite kernel runs on the tensors
  themselves, each of its ops dispatched in turn, as above autograd, so what it writes lands
  in them.
  """

  def __init__(self, func: Any, kernel: Callable):
    self.func, self.kernel = func, kernel
    self.functional = FunctionalPlan(func)
    self.on_tensors = any(isinstance(r.type, _NUMBERS) for r in func._schema.returns)

  def __call__(self, args: tuple, kwargs: dict) -> Any:
    if self.func in decomposing() or not config_lib.get_config().decompose_missing_ops:
      return self.functional(args, kwargs)
    if not self.on_tensors:
      try:
        return self.functional(args, kwargs)
      except ArgumentWritten:
        self.on_tensors = True
    with decomposing_scope(self.func):
      return self.kernel(*args, **kwargs)


_NUMBERS = (torch.NumberType, torch.IntType, torch.FloatType, torch.BoolType, torch.ComplexType)


def composite(func: Any) -> "_Composite | None":
  """The plan of a composite op without a lowering that writes nothing its schema names (views
  and in-place ops have plans of their own), or None for any other op."""
  kernel = composite_kernel(func)
  return None if kernel is None else _Composite(func, kernel)


def table(plan_of: Callable[[Any], Callable]) -> dict[Any, Callable]:
  """The special ops' plans by overload; `plan_of(op)` gives another op's plan."""
  return {**_SPECIAL, aten.native_batch_norm.default: _native_batch_norm(plan_of)}
