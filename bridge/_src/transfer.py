"""Transfers: torch tensors to JAX arrays and back, zero-copy through DLPack.

A transfer is zero-copy whenever both sides can address the same buffer: same
device, a dense layout (row-major or a permutation of it) and, for JAX on CPU, a
64-byte aligned data pointer. Otherwise the caller's `copy` decides:

* `copy=None` (default): zero-copy when possible, else one copy;
* `copy=False`: zero-copy or a `TransferError` that says why it is impossible;
* `copy=True`: always a fresh copy.

A zero-copy result aliases its source: writing into the torch tensor in place
changes the JAX array (which JAX assumes never happens), and a torch tensor made
from a JAX array writes into JAX's buffer. Copy (`copy=True`) when either side
will be mutated. A tensor made from an array keeps the buffer alive: `a.delete()`
afterwards drops the array's claim only, and the tensor stays valid.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import jax
import numpy as np
import torch
from jax._src import config as _jax_config

from bridge._src import dtypes
from bridge._src import tree as tree_lib
from bridge._src.errors import BridgeTypeError, TransferError

try:  # The C++ entry points behind `jax.dlpack`; the public wrappers cost ~30 us a call.
  from jax._src.lib import _jax as _jaxlib
  from jax._src.lib import jaxlib_extension_version as _jaxlib_version

  _dlpack_to_buffer = _jaxlib.dlpack_managed_tensor_to_buffer
  _buffer_to_dlpack = _jaxlib.buffer_to_dlpack_managed_tensor
except (ImportError, AttributeError):  # pragma: no cover - other jaxlib versions
  _dlpack_to_buffer = _buffer_to_dlpack = None

# for hot paths that know their array is a fresh single-CPU-device one of a dtype torch has
buffer_to_dlpack = _buffer_to_dlpack

try:  # concrete arrays (not tracers): hot paths compare `type(x) is ArrayImpl`
  from jax._src.array import ArrayImpl
except ImportError:  # pragma: no cover - a JAX that moved it: the hot paths give way
  ArrayImpl = jax.Array  # type: ignore[misc,assignment]
_KDL_CPU = 1  # DLDeviceType.kDLCPU
_KDL_CUDA = 2  # DLDeviceType.kDLCUDA
_ALIGNMENT = 64  # bytes; XLA:CPU refuses to alias a less aligned buffer
# bytes; XLA on a GPU takes a less aligned buffer and then fails each program that reads it
# ("Address of buffer 1 must be a multiple of 10", seen on an H100 with JAX 0.11)
_GPU_ALIGNMENT = 16
_STRICT = "Pass `copy=None` (or `copy=True`) to allow the copy"

Where = Callable[[], str]


@functools.cache
def _cpu_device() -> jax.Device:
  # (this process's own: with several processes, `jax.devices()` lists theirs too)
  return jax.local_devices(backend="cpu")[0]


def _describe(t: torch.Tensor) -> str:
  return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


# --- torch -> JAX ------------------------------------------------------------


def check_tensor(t: torch.Tensor, *, api: str, where: Where) -> None:
  """Refuse tensors that have no JAX counterpart: sparse, quantized, nested, meta, bad dtype."""
  dtype = t.dtype
  if (
    t.layout is torch.strided
    and dtype in dtypes.TORCH_TO_JAX
    and not t.is_quantized
    and not t.is_nested
    and not t.is_meta
    and (dtype not in dtypes.TORCH_X64 or dtypes.x64_enabled())
  ):
    return  # the common case, without building any message
  kind = None
  if t.is_nested:
    kind = "a nested tensor"
  elif t.layout is not torch.strided:
    kind = f"a sparse tensor (layout {t.layout})"
  elif t.is_quantized:
    kind = "a quantized tensor"
  elif t.is_meta:
    kind = "a meta tensor (it has no data)"
  if kind is not None:
    fix = (
      "Convert it first (e.g. `t.to_dense()`, `t.dequantize()`, "
      "`t.to_padded_tensor(0.0)`) or materialize it on a real device."
    )
    raise BridgeTypeError(f"`{api}`: {where()} is {kind}; JAX has only dense arrays. {fix}")
  dtypes.jax_dtype(t.dtype, api=api, where=where())
  dtypes.check_x64(t.dtype, api=api, where=f"{where()} ({_describe(t)})")


# NumPy's 64-bit dtypes, and the 32-bit ones JAX silently narrows them to while its 64-bit
# types are disabled (as `dtypes.TORCH_X64` and `dtypes.NARROWED` for torch).
_NUMPY_NARROWED = {
  dtypes.TORCH_TO_JAX[wide]: dtypes.TORCH_TO_JAX[narrow] for wide, narrow in dtypes.NARROWED.items()
}


def check_numpy_x64(x: np.ndarray | np.generic, *, api: str, where: Where) -> None:
  """Refuse a 64-bit NumPy array or scalar while JAX would silently narrow it to 32 bits.

  The rule `check_tensor` applies to a 64-bit tensor, for NumPy inputs: exact, or an error.
  """
  dtype = x.dtype
  if dtype in _NUMPY_NARROWED and not dtypes.x64_enabled():
    narrow = _NUMPY_NARROWED[dtype].name
    if isinstance(x, np.ndarray):
      what, fix = f"a NumPy array of shape {x.shape}", f"`x.astype(np.{narrow})`"
    else:
      what, fix = f"a NumPy scalar, {x!r:.40}", f"`np.{narrow}(x)`"
    raise BridgeTypeError(
      f"`{api}`: {where()} ({what}) is {dtype.name}, but JAX's 64-bit types are disabled, "
      f"so JAX would silently turn it into {narrow}. Either enable them, globally with "
      "`jax.config.update('jax_enable_x64', True)` or for this call with "
      f"`with jax.enable_x64(True): ...`, or narrow it yourself, e.g. {fix}."
    )


def is_dense(t: torch.Tensor) -> bool:
  """Whether `t`'s elements fill its memory exactly, in row-major order or a permutation of it."""
  if t.is_contiguous() or t.numel() == 0:
    return True
  expected = 1
  for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
    if stride != expected:
      return False
    expected *= size
  return True


def _copy_advice(t: torch.Tensor) -> str:
  """What to pass instead of `t` for a zero-copy move: a strided view becomes dense with
  `contiguous()`, which returns a dense view at an unaligned offset as it is."""
  return "`t.contiguous()`" if not is_dense(t) else "`t.clone()`"


def _not_zero_copy_reason(
  t: torch.Tensor, alignment: int = _ALIGNMENT, where: str = "JAX on CPU aliases"
) -> str | None:
  if not is_dense(t):
    return (
      f"it is a strided view with strides {t.stride()} (a stride-0 `expand`, a "
      "step slice or a gap), which JAX arrays cannot describe"
    )
  if t.data_ptr() % alignment:
    return (
      f"its data pointer {t.data_ptr():#x} is not {alignment}-byte aligned (e.g. a "
      f"view at an offset such as `t[1:]`), and {where} only "
      f"{alignment}-byte aligned buffers"
    )
  return None


def keep_size(t: torch.Tensor) -> None:
  """Makes the storage of `t`, whose memory a JAX array now shares, one that cannot be resized,
  as `Tensor.numpy()` does for an array sharing it: torch's `resize_` would otherwise free
  the memory the array reads (a crash, or garbage), where now it raises torch's "Trying to
  resize storage that is not resizable"."""
  storage = t.untyped_storage()
  if storage.resizable():
    torch.empty(0, dtype=torch.uint8).set_(storage).numpy()  # (marks the storage: torch's way)


def _cpu_tensor_to_jax(t: torch.Tensor, copy: bool | None, api: str, where: Where) -> jax.Array:
  if copy:
    t = t.clone(memory_format=torch.contiguous_format)  # the allocator aligns to 64 bytes
  else:
    reason = _not_zero_copy_reason(t)
    if reason is not None:
      if copy is False:
        raise TransferError(
          f"`{api}`: {where()} ({_describe(t)}) cannot be moved without a copy: "
          f"{reason}. {_STRICT}, or pass {_copy_advice(t)}."
        )
      t = t.clone(memory_format=torch.contiguous_format)
    else:
      keep_size(t)
  if _dlpack_to_buffer is None:  # pragma: no cover
    return jax.dlpack.from_dlpack(t, copy=False)
  capsule = torch._C._to_dlpack(t)
  if _jaxlib_version >= 467:
    return _dlpack_to_buffer(capsule, _cpu_device(), None, False, _KDL_CPU)
  return _dlpack_to_buffer(capsule, _cpu_device(), None, False)  # pragma: no cover


def _jax_has(platform: str) -> bool:
  try:
    return bool(jax.devices(platform))
  except RuntimeError:
    return False


@functools.cache
def _cuda_target(index: int) -> tuple[Any, int, Any] | None:
  """For torch's `cuda:index`: JAX's device, the stream JAX orders imported buffers on and a
  torch handle on that stream; None where the direct import does not apply (no JAX GPU, a
  ROCm torch, a plugin without that stream): `jax.dlpack.from_dlpack` then does it all."""
  if _dlpack_to_buffer is None or _jaxlib_version < 467 or torch.version.cuda is None:
    return None
  try:
    device = jax.local_devices(backend="cuda")[0].client.device_from_local_hardware_id(index)
    stream = device.get_stream_for_external_ready_events()
  except (RuntimeError, AttributeError):  # (JaxRuntimeError is a RuntimeError)
    return None
  return device, stream, torch.cuda.ExternalStream(stream, device=torch.device("cuda", index))


def current_cuda_stream(index: int) -> Any:
  """torch's current stream on GPU `index`: `torch.cuda.current_stream(index)` without its
  argument checks (a third of a small call's cost)."""
  stream_id, device_index, device_type = torch._C._cuda_getCurrentStream(index)
  return torch.cuda.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)


# torch's stream objects by (GPU, stream pointer): a stream lives as long as the process (torch's
# pool streams, and external streams their owner keeps), and building one costs 2 us a call
_cuda_streams: dict[tuple[int, int], Any] = {}
# one event per thread and GPU, recorded anew by each import: a wait is bound to the record
# made before it, and no other thread records in between (an event belongs to one GPU)
_events = threading.local()


def _cuda_ready_event(index: int, raw: int) -> Any:
  """An event recorded on torch's current stream `raw` of GPU `index`, for one wait."""
  stream = _cuda_streams.get((index, raw))
  if stream is None:
    stream = _cuda_streams[(index, raw)] = current_cuda_stream(index)
  events = getattr(_events, "by_gpu", None)
  if events is None:
    events = _events.by_gpu = {}
  event = events.get(index)
  if event is None:
    event = events[index] = torch.cuda.Event()
  event.record(stream)
  return event


def _cuda_tensor_to_jax(t: torch.Tensor, target: tuple[Any, int, Any]) -> jax.Array:
  """A dense CUDA tensor as a JAX array on the same GPU, sharing its memory.

  What `jax.dlpack.from_dlpack(t)` does without its Python layers (~60 us a call): JAX's
  stream for external buffers waits for torch's current stream (the work that wrote `t`,
  with no host synchronization), then JAX takes the buffer as ready on that stream."""
  device, stream, jax_stream = target
  index = t.device.index or 0
  raw = torch._C._cuda_getCurrentRawStream(index)
  if raw != stream:
    jax_stream.wait_event(_cuda_ready_event(index, raw))
  capsule = torch._C._to_dlpack(t)
  return _dlpack_to_buffer(capsule, device, stream, False, _KDL_CUDA)


def cuda_tensor_arg(t: torch.Tensor) -> jax.Array | None:
  """A CUDA tensor as a zero-copy argument of a compiled call on its GPU, or None where
  `tensor_to_jax` must decide (a copy, an error, no direct import): the shortcut of a call
  the general path already took once with a tensor of this shape and dtype."""
  if t.is_conj() or t.is_neg() or _not_zero_copy_reason(t, _GPU_ALIGNMENT, "") is not None:
    return None
  target = _cuda_target(t.device.index or 0)
  if target is None:
    return None
  return _cuda_tensor_to_jax(t.detach() if t.requires_grad else t, target)


def _accelerator_tensor_to_jax(
  t: torch.Tensor, copy: bool | None, api: str, where: Where
) -> jax.Array:
  target = _cuda_target(t.device.index or 0) if t.device.type == "cuda" else None
  if target is not None or (t.device.type == "cuda" and _jax_has("gpu")):
    reason = None if copy else _not_zero_copy_reason(t, _GPU_ALIGNMENT, "XLA on a GPU reads")
    if reason is not None and copy is False:
      raise TransferError(
        f"`{api}`: {where()} ({_describe(t)}) cannot be moved without a copy: {reason}. "
        f"{_STRICT}, or pass {_copy_advice(t)}."
      )
    if copy or reason is not None:
      # a copy made by torch, on its current stream, then shared: JAX's own copying import
      # is not supported by every GPU plugin (PJRT's C API rejects its host buffer semantics)
      t, copy = t.clone(memory_format=torch.contiguous_format), False
    if target is not None:
      return _cuda_tensor_to_jax(t, target)
    return jax.dlpack.from_dlpack(t, copy=copy)
  if copy is False:
    raise TransferError(
      f"`{api}`: {where()} ({_describe(t)}) is on torch device {t.device}, which has no "
      f"JAX counterpart in this process (JAX devices: {jax.devices()}), so it cannot "
      f"be shared without a copy. {_STRICT} through host memory, or install the JAX "
      "build for that accelerator (e.g. `pip install jax[cuda12]`)."
    )
  return _cpu_tensor_to_jax(t.cpu(), None, api, where)


# The bridge's own torch device (its type, and what hands over one of its tensors' JAX arrays
# for `tensor_to_jax`): set by `tensor`, a module this one cannot import.
own_device: tuple[str, Callable[[torch.Tensor, bool | None, str, Where], jax.Array]] | None = None


def tensor_to_jax(
  t: torch.Tensor,
  *,
  copy: bool | None = None,
  api: str = "bridge.to_jax",
  where: Where = lambda: "the tensor",
) -> jax.Array:
  """Move one tensor to a `jax.Array` (see the module docstring for `copy`)."""
  check_tensor(t, api=api, where=where)
  own = own_device
  if own is not None and t.device.type == own[0]:  # its data is a JAX array already
    return own[1](t, copy, api, where)
  t = t.detach()
  if t.is_conj() or t.is_neg():
    if copy is False:
      raise TransferError(
        f"`{api}`: {where()} ({_describe(t)}) is a lazy conjugate/negative view, which "
        f"must be materialized before JAX can read it. {_STRICT}, or call "
        "`t.resolve_conj().resolve_neg()` first."
      )
    t, copy = t.resolve_conj().resolve_neg(), None  # already a fresh copy
  if t.device.type == "cpu":
    return _cpu_tensor_to_jax(t, copy, api, where)
  return _accelerator_tensor_to_jax(t, copy, api, where)


def default_device_is_cpu() -> bool:
  """Whether an uncommitted argument of a jitted call lands on a CPU device."""
  device = _jax_config.default_device.value
  if device is None:
    return _default_backend_is_cpu()
  return getattr(device, "platform", device) == "cpu"


@functools.cache
def _default_backend_is_cpu() -> bool:
  return jax.default_backend() == "cpu"


def fast_tensor_arg(t: torch.Tensor, index: tuple | None = None) -> Any:
  """A CPU tensor as a zero-copy NumPy view for a jitted call, or None if that does not apply.

  Only for calls whose uncommitted arguments land on the CPU (`default_device_is_cpu()`).
  `index`: a basic index (slices) taken of the view, which must then be contiguous (an
  expanded tensor's one distinct row, cheaper through NumPy than torch's indexing).

  `Tensor.numpy()` itself refuses every tensor the fast path must not take: other
  devices, sparse, nested, quantized, conjugate/negative views, and dtypes NumPy
  lacks (bfloat16, float8). The caller then takes `tensor_to_jax`'s general path.
  """
  if t.requires_grad:
    t = t.detach()
  if t.dtype in dtypes.TORCH_X64 and not dtypes.x64_enabled():
    return None
  if index is None and not t.is_contiguous():
    return None  # a transposed tensor: DLPack shares it, a NumPy argument would be copied
  try:
    a = t.numpy()
  except (RuntimeError, TypeError):
    return None
  if index is not None:
    a = a[index]
    if not a.flags.c_contiguous:
      return None
  return a


def tensor_to_jax_arg(t: torch.Tensor, *, api: str, where: Where) -> Any:
  """A tensor as an argument of a jitted call on the tensor's device (copy=None semantics).

  CPU tensors become zero-copy NumPy views when JAX's default device is the CPU
  (JAX's C++ dispatch aliases an aligned dense buffer and copies any other);
  everything else goes through `tensor_to_jax`.
  """
  arg = fast_tensor_arg(t) if default_device_is_cpu() else None
  return arg if arg is not None else tensor_to_jax(t, copy=None, api=api, where=where)


def to_jax(tree: Any, copy: bool | None = None) -> Any:
  """Moves every `torch.Tensor` in a pytree to a `jax.Array`, zero-copy when possible.

  Args:
    tree: any pytree (tensor, list, tuple, dict, namedtuple, dataclass, ...).
      Leaves that are not torch tensors pass through unchanged.
    copy: `None` copies only when zero-copy is impossible; `False` never
      copies and raises `TransferError` instead; `True` always copies.

  Returns:
    The same structure with JAX arrays in place of tensors. Dtypes are exact;
    a zero-copy array shares memory with its tensor (see the module docs).

  Raises:
    BridgeTypeError: a sparse, quantized, nested or meta tensor, a dtype JAX
      lacks, or a 64-bit tensor while JAX's 64-bit types are disabled.
    TransferError: `copy=False` and a tensor cannot be shared.

  Example:
    >>> import torch, bridge
    >>> t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    >>> a = bridge.to_jax(t)
    >>> a.shape, a.dtype
    ((2, 3), dtype('float32'))
    >>> a.unsafe_buffer_pointer() == t.data_ptr()  # zero-copy
    True
  """
  _check_copy(copy, "bridge.to_jax")
  if type(tree) is torch.Tensor:  # a lone tensor: skip the pytree machinery
    return tensor_to_jax(tree, copy=copy, api="bridge.to_jax", where=lambda: "the tensor")
  return _convert_leaves(tree, torch.Tensor, tensor_to_jax, copy, "bridge.to_jax")


# --- JAX -> torch ------------------------------------------------------------


# CPU devices, by id (a device lives as long as its client, so an id is not reused). Keyed
# by device, not by sharding: each compiled program's outputs have sharding objects of
# their own, and holding those kept the program's compilation alive.
_CPU_DEVICES: dict[int, Any] = {}
_SingleDeviceSharding = jax.sharding.SingleDeviceSharding


def is_one_cpu_device(sharding: Any) -> bool:
  if type(sharding) is not _SingleDeviceSharding:
    if not isinstance(sharding, _SingleDeviceSharding):
      return False
  try:
    device = sharding._device
  except AttributeError:  # pragma: no cover - other jaxlib versions
    device = next(iter(sharding.device_set))
  if _CPU_DEVICES.get(id(device)) is device:
    return True
  if device.platform == "cpu":  # type: ignore[attr-defined]
    _CPU_DEVICES[id(device)] = device
    return True
  return False


def fast_array_out(a: Any) -> torch.Tensor | None:
  """A concrete single-CPU-device array as a zero-copy tensor, or None if that does not apply.

  Only for arrays that nothing else holds (the fresh outputs of a jitted call): the tensor
  takes its DLPack reference on `a` itself, and `a.delete()` while that reference is held
  aborts the process (XLA's "Non-zero type 1 hold on destruction" check). An array the
  caller may still hold goes through `_cpu_array_to_torch`.
  """
  if (
    type(a) is ArrayImpl
    and _buffer_to_dlpack is not None
    and id(a.dtype) in dtypes.JAX_TO_TORCH_BY_ID
    and is_one_cpu_device(a.sharding)
    and not a.is_deleted()
  ):
    return torch._C._from_dlpack(_buffer_to_dlpack(a))
  return None


def array_to_torch_arg(a: jax.Array, *, api: str, where: Where) -> torch.Tensor:
  """`array_to_torch(a, copy=None)` with a fast path for single-CPU-device outputs."""
  out = fast_array_out(a)
  return out if out is not None else array_to_torch(a, copy=None, api=api, where=where)


def _cpu_array_to_torch(a: jax.Array) -> torch.Tensor:
  """A single-CPU-device array the caller may hold as a zero-copy tensor.

  The DLPack reference is taken on `a.addressable_data(0)`, an array object of its own that
  shares `a`'s buffer (as `a.__dlpack__` does): `a.delete()` then drops only `a`'s claim, and
  the buffer lives on until the tensor dies. A reference taken on `a` itself would make
  `a.delete()` abort the process.
  """
  if _buffer_to_dlpack is None:  # pragma: no cover
    return torch.from_dlpack(a)
  return torch._C._from_dlpack(_buffer_to_dlpack(a.addressable_data(0)))


def gpu_array_to_torch(a: jax.Array) -> torch.Tensor:
  """A single-GPU array as a zero-copy CUDA tensor: torch's current stream on that GPU waits
  for the array (no host synchronization). As `torch.from_dlpack(a)`, without its Python
  layers; the reference is taken on `a.addressable_data(0)` (see `_cpu_array_to_torch`)."""
  if _buffer_to_dlpack is None or torch.version.cuda is None:  # pragma: no cover - ROCm
    return torch.from_dlpack(a)
  index = getattr(next(iter(a.sharding.device_set)), "local_hardware_id", None)
  if index is None:  # pragma: no cover - other jaxlib versions
    index = a.__dlpack_device__()[1]  # type: ignore[attr-defined]
  stream = torch._C._cuda_getCurrentRawStream(index)
  # (DLPack names the legacy default stream 1: 0 means "no stream", a host wait)
  capsule = _buffer_to_dlpack(a.addressable_data(0), stream=stream or 1)
  return torch._C._from_dlpack(capsule)


def array_to_torch(
  a: jax.Array,
  *,
  copy: bool | None = None,
  api: str = "bridge.to_torch",
  where: Where = lambda: "the array",
) -> torch.Tensor:
  """Move one concrete `jax.Array` to a `torch.Tensor` (see the module docstring for `copy`)."""
  if isinstance(a, jax.core.Tracer):
    raise BridgeTypeError(
      f"`{api}`: {where()} is a JAX tracer ({a.aval}), an abstract value inside "
      "`jax.jit`/`jax.grad`/`jax.vmap`, with no data to hand to torch. Transfer concrete "
      "arrays outside the transformation instead."
    )
  if a.is_deleted():
    raise TransferError(
      f"`{api}`: {where()} was deleted (donated to a jitted call or "
      "`.delete()`d); there is no data left to transfer."
    )
  dtypes.torch_dtype(a.dtype, api=api, where=where())
  sharding = a.sharding
  if len(sharding.device_set) > 1:
    if sharding.is_fully_replicated:  # every device holds the whole value: share one copy
      return array_to_torch(a.addressable_data(0), copy=copy, api=api, where=where)
    if copy is False:
      raise TransferError(
        f"`{api}`: {where()} (shape {a.shape}, dtype {a.dtype}) is sharded over "
        f"{len(sharding.device_set)} devices; a torch tensor needs it gathered into one "
        f"buffer. {_STRICT}."
      )
    gathered = jax.device_put(a, jax.sharding.SingleDeviceSharding(_cpu_device()))
    return _cpu_array_to_torch(gathered)
  platform = next(iter(sharding.device_set)).platform  # type: ignore[attr-defined]
  if platform == "cpu":
    out = _cpu_array_to_torch(a)
    return out.clone() if copy else out
  if platform in ("gpu", "cuda", "rocm") and torch.cuda.is_available():
    out = gpu_array_to_torch(a)
    return out.clone() if copy else out
  if copy is False:
    raise TransferError(
      f"`{api}`: {where()} (shape {a.shape}, dtype {a.dtype}) lives on JAX platform "
      f"{platform!r}, which torch in this process cannot address, so it cannot be shared "
      f"without a copy. {_STRICT} through host memory."
    )
  return _cpu_array_to_torch(jax.device_put(a, _cpu_device()))


def to_torch(tree: Any, copy: bool | None = None) -> Any:
  """Moves every `jax.Array` in a pytree to a `torch.Tensor`, zero-copy when possible.

  Args:
    tree: any pytree; leaves that are not JAX arrays pass through unchanged.
    copy: `None` copies only when zero-copy is impossible (another platform, a
      sharded array); `False` never copies and raises `TransferError` instead;
      `True` always copies.

  Returns:
    The same structure with torch tensors in place of arrays, on the matching
    torch device (JAX CPU -> torch CPU, JAX GPU -> the same CUDA device). A
    zero-copy tensor shares JAX's buffer: writing into it changes the array.

  Raises:
    BridgeTypeError: a tracer, or a dtype torch lacks (e.g. int4, float0).
    TransferError: `copy=False` and an array cannot be shared, or a deleted array.

  Example:
    >>> import jax.numpy as jnp, bridge
    >>> bridge.to_torch({"w": jnp.ones((2,), jnp.bfloat16)})
    {'w': tensor([1., 1.], dtype=torch.bfloat16)}
  """
  _check_copy(copy, "bridge.to_torch")
  if type(tree) is ArrayImpl:  # a lone array: skip the pytree machinery
    if (
      copy is None
      and _buffer_to_dlpack is not None
      and id(tree.dtype) in dtypes.JAX_TO_TORCH_BY_ID
      and is_one_cpu_device(tree.sharding)
      and not tree.is_deleted()
    ):
      return _cpu_array_to_torch(tree)  # (the caller holds `tree`: not `fast_array_out`)
    return array_to_torch(tree, copy=copy, api="bridge.to_torch", where=lambda: "the array")
  return _convert_leaves(tree, jax.Array, array_to_torch, copy, "bridge.to_torch")


def _check_copy(copy: Any, api: str) -> None:
  if copy is not None and not isinstance(copy, bool):
    raise BridgeTypeError(f"`{api}`: `copy` must be None, True or False, got {copy!r}.")


def _convert_leaves(
  tree: Any, kind: type, convert: Callable[..., Any], copy: bool | None, api: str
) -> Any:
  """`tree` with each leaf of type `kind` converted (`to_jax` and `to_torch` of a pytree)."""

  def leaf(x: Any, where: Where) -> Any:
    if isinstance(x, kind):
      return convert(x, copy=copy, api=api, where=lambda: f"leaf {where()}")
    return x

  return tree_lib.tree_map(leaf, tree)
