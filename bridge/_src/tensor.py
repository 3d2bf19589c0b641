"""`bridge.Tensor`: a torch tensor on the `jax` device whose data is a JAX array.

Storage model. Torch tensors alias: a view shares its base's memory and an
in-place op through either is seen by both. JAX arrays are immutable, so each
`bridge.Tensor` points at a shared `Storage` box holding one JAX array (the
base's contents, in the base's shape) and a version counter. A tensor that is
the whole storage reads the array directly; any other view is torch's own
(size, stride, storage offset) over the storage's elements, read by a gather
and written by a scatter, and cached per storage version. A view of another dtype
(`view(dtype)`, `view_as_real`, `view_as_complex`) reads the storage's bytes as its
own dtype (`Tensor._as`), its metadata counting elements of that dtype as torch's does;
a lazy conjugate or negative view (torch's conj and neg bits) reads and writes its
storage's elements conjugated or negated. In-place ops compute the new value
functionally and store it into the box, so every view sees it. Under `jax.jit` the
arrays are tracers and the same code traces.
"""

from __future__ import annotations

import copy
import functools
import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, SupportsIndex

import jax
import jax.numpy as jnp
import numpy as np
import torch

import _bridge_autoload
from bridge._src import dtypes
from bridge._src import strided
from bridge._src.errors import BridgeTypeError, TracedValueError
from bridge._src.transfer import ArrayImpl


class Storage:
  """A mutable box around the JAX array that a base tensor and its views share."""

  # (`address` and `torch_storage` are set only when asked for: `storage_address`,
  # `Tensor.untyped_storage`; nothing is added to the storage every op result makes)
  __slots__ = ("array", "version", "device", "address", "torch_storage")
  address: int  # (`storage_address`: what `data_ptr()` counts from)
  torch_storage: Any  # (a weak reference to its `_StorageStandIn`)

  def __init__(self, array: Any, device: torch.device):
    self.array = array
    self.version = 0
    self.device = device  # a cached `jax_device(i)`, so devices compare by identity


def storage_nbytes(storage: Storage) -> int:
  """How many bytes the storage's array holds."""
  array = storage.array
  return int(np.size(array)) * np.dtype(array.dtype).itemsize


# The numbers `data_ptr()` gives `jax` tensors. torch code tells storages apart by their data
# pointers (tied weights in safetensors and transformers, deduplication), so each storage gets
# one of its own, the first time it is asked for, spaced so that no two storages' byte ranges
# meet, and the same while the storage lives (a storage that grows gets a new one, as torch's
# reallocated memory). They are not addresses and must never be read as such: they lie in
# [2**55, 2**56), which no process maps (not canonical on x86-64, outside every AArch64 user
# address space, top byte ignored or not), so a dereference faults instead of reading memory.
_ADDRESSES = (1 << 55, 1 << 56)
_next_address = _ADDRESSES[0]
_address_lock = threading.Lock()


def storage_address(storage: Storage) -> int:
  """The number `data_ptr()` of `storage`'s tensors counts from: 0 for an empty storage (as
  torch's), else the storage's own (see `_ADDRESSES`)."""
  global _next_address
  address = getattr(storage, "address", 0)
  if address:
    return address
  nbytes = storage_nbytes(storage)
  if nbytes == 0:
    return 0
  with _address_lock:
    address = getattr(storage, "address", 0)
    if not address:
      span = -(-nbytes // 4096) * 4096 + 4096  # page-aligned, with a page's gap to the next
      if _next_address + span > _ADDRESSES[1]:  # (after 32 PiB handed out: again from the start)
        _next_address = _ADDRESSES[0]
      address = storage.address = _next_address
      _next_address += span
  return address


class _StorageStandIn:
  """What `untyped_storage()` and `storage()` of a `jax` tensor give: the data is a JAX array,
  not a torch storage, so this read-only stand-in answers only what libraries ask of a storage
  to tell tensors' memory apart (safetensors' `storage_ptr`/`storage_size`, transformers'
  tied weights): `data_ptr()` (what the tensors' `data_ptr()` count from: a number, not an
  address), `nbytes()`, `size()`, `len()`, `element_size()`, `device`; anything else raises
  `BridgeTypeError`."""

  __slots__ = ("_box", "__weakref__")

  def __init__(self, box: Storage):
    self._box = box

  @property
  def device(self) -> torch.device:
    return self._box.device

  is_cuda = False
  is_sparse = False

  def data_ptr(self) -> int:
    return storage_address(self._box)

  def nbytes(self) -> int:
    return storage_nbytes(self._box)

  def element_size(self) -> int:
    return 1

  def size(self) -> int:
    return self.nbytes() // self.element_size()

  def __len__(self) -> int:
    return self.size()

  def __getattr__(self, name: str) -> Any:
    if name.startswith("__"):  # (protocol probes: `getattr(s, "__array__", None)`)
      raise AttributeError(name)
    raise _no_torch_storage(f"`{name}`")

  def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
    raise _no_torch_storage("pickling (save the tensor instead)")

  def __repr__(self) -> str:
    return f"<storage of {self.nbytes()} bytes of a JAX array on {self.device}>"


class _TypedStorageStandIn(_StorageStandIn):
  """`storage()` of a `jax` tensor: `_StorageStandIn` counted in elements of the tensor's dtype,
  as torch's `TypedStorage`."""

  __slots__ = ("dtype",)

  def __init__(self, box: Storage, dtype: torch.dtype):
    super().__init__(box)
    self.dtype = dtype

  def element_size(self) -> int:
    return self.dtype.itemsize

  def untyped(self) -> _StorageStandIn:
    return _untyped_stand_in(self._box)


def _untyped_stand_in(box: Storage) -> _StorageStandIn:
  """The storage's stand-in: the same object while one is held (torch's storage objects are:
  `t.untyped_storage() is t[1:].untyped_storage()`); the box holds it weakly, so no cycle keeps
  the array alive."""
  ref = getattr(box, "torch_storage", None)
  stand_in = ref() if ref is not None else None
  if stand_in is None:
    stand_in = _StorageStandIn(box)
    box.torch_storage = weakref.ref(stand_in)
  return stand_in


def _no_torch_storage(what: str) -> BridgeTypeError:
  return BridgeTypeError(
    "bridge: a `jax` tensor keeps its data in a JAX array, not in a torch storage: its "
    "`untyped_storage()` and `storage()` are stand-ins that tell storages apart (`data_ptr()`, "
    f"`nbytes()`, `size()`, `element_size()`, `device`), without {what}. Use "
    "`bridge.jax_view(t)` for the array, or `t.cpu()` for a CPU copy."
  )


def device_type() -> str:
  """The `jax` device's type string: `"jax"`, or `"privateuseone"` where bridge leaves torch's
  PrivateUse1 backend unnamed (`bridge._src.device`)."""
  return torch._C._get_privateuse1_backend_name()


@functools.cache
def jax_device(index: int) -> torch.device:
  # (a PrivateUse1 device: equal to itself, and so cached, whether or not it is named `jax`)
  return torch.device(device_type(), index)


class Tensor(torch.Tensor):
  """A torch tensor on the `jax` device; its data is a JAX array (or a tracer).

  Create one as any torch tensor (`torch.ones(2, device="jax")`, `t.to("jax")`)
  or wrap an array without copying: `bridge.torch_view(jax_array)`. Every aten op
  on it runs as JAX code (see `bridge._src.dispatch`).
  """

  _storage: Storage
  _whole: bool = True  # this tensor is its storage's whole array, in the array's shape
  _cache: tuple[int, Any] | None = None  # (storage version, value) for views
  # a view of another dtype than its storage's array: the JAX dtype it reads the storage's
  # bytes as (its size, stride and offset count elements of that dtype); None otherwise
  _as: Any = None
  # a `detach()` (or a view made under `torch.no_grad()`) of a traced tensor: it reads its
  # storage through `lax.stop_gradient`, so JAX's derivatives see a constant, as torch's do
  _detached: bool = False

  @property
  def _dev(self) -> torch.device:
    return self._storage.device

  __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

  @staticmethod
  def __new__(cls, *args: Any, **kwargs: Any) -> Tensor:
    raise BridgeTypeError(
      "`bridge.Tensor` is not constructed directly: use a torch factory with "
      "`device='jax'` (e.g. `torch.zeros(3, device='jax')`), `tensor.to('jax')`, or wrap a "
      "JAX array with `bridge.torch_view(array)`."
    )

  @classmethod
  def __torch_dispatch__(  # type: ignore[override]
    cls, func: Any, types: Any, args: tuple = (), kwargs: Any = None
  ) -> Any:
    # (the override's signature is torch's documented one; its stub omits `func`)
    plan = _PLANS.get(func)  # the dispatcher's per-op plans (bridge._src.dispatch)
    if plan is None:
      plan = _get_plan(func)
    try:
      return plan(args, kwargs or {})
    except Exception as e:
      if torch._C._current_graph_task_id() == -1:
        raise
      return _defer_backward_error(e, func, args, kwargs or {})

  # --- data access -------------------------------------------------------------

  @property
  def data(self) -> torch.Tensor:
    """A detached alias of this tensor, as torch's `Tensor.data`."""
    return _DATA.__get__(self)

  @data.setter
  def data(self, new: torch.Tensor) -> None:
    """`t.data = new`: `t` takes `new`'s metadata (torch's `set_data`) and shares its storage.

    torch swaps only the C++ metadata; the JAX array lives on the Python object, so it is
    moved here too (`module.to(torch.bfloat16)` on a `jax` module assigns `param.data`).
    """
    if type(new) is not Tensor:
      raise BridgeTypeError(
        f"bridge: `t.data = new` with `t` on the {self.device} device needs `new` there "
        f"too, got a {type(new).__name__} on {getattr(new, 'device', 'no device')}. "
        f"Move it first: `t.data = new.to('{self.device}')`."
      )
    _DATA.__set__(self, new)
    self._storage, self._whole, self._as, self._cache = new._storage, new._whole, new._as, None

  def numpy(self, *, force: bool = False) -> np.ndarray:
    """As `torch.Tensor.numpy`, but a copy: a read-only one, since writes could not reach the
    JAX array (`force=True`: a writable one, as torch's `force` copy of a CUDA tensor).

    Refuses what torch's refuses unless `force=True` (a tensor that requires grad, a lazy
    conjugate or negative view), with torch's errors; `np.array(t)` is a writable copy.
    """
    if not force:
      if self.requires_grad:
        raise RuntimeError(
          "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."
        )
      if self.is_conj():
        raise RuntimeError(
          "Can't call numpy() on Tensor that has conjugate bit set. "
          "Use tensor.resolve_conj().numpy() instead."
        )
      if self.is_neg():
        raise RuntimeError(
          "Can't call numpy() on Tensor that has negative bit set. "
          "Use tensor.resolve_neg().numpy() instead."
        )
    # (a CPU copy, its conjugate/negative bits resolved; torch's errors for what NumPy lacks)
    array = self.detach().cpu().numpy(force=True)
    if not force:
      array.flags.writeable = False
    return array

  def detach_(self) -> torch.Tensor:
    """As `torch.Tensor.detach_`; a traced tensor also reads its storage as a constant from
    now on (`_detached`): torch's autograd kernel does all of `detach_`, so the bridge's
    dispatch never sees it, and JAX's derivatives would still flow through the tensor."""
    out = super().detach_()
    if isinstance(self._storage.array, jax.core.Tracer):
      detach_traced(self)
    return out

  def set_(self, *args: Any, **kwargs: Any) -> torch.Tensor:
    """As `torch.Tensor.set_`. For `t.set_(source, storage_offset, size, stride)` torch's
    Python binding passes aten `set_` the torch storage of `source` (its
    `source_Storage_storage_offset` overload), which for a `jax` tensor holds no data: the
    dispatcher finds `source` itself here (`set_source`)."""
    source = args[0] if args else kwargs.get("source")
    if isinstance(source, _StorageStandIn):  # `t.set_(u.untyped_storage(), ...)`: u's storage,
      source = _over_storage(source._box, self.dtype)  # as a 1-d tensor of t's dtype
      args, kwargs = ((source, *args[1:]), kwargs) if args else (args, {**kwargs, "source": source})
    elif isinstance(source, torch.UntypedStorage) and hasattr(source, "_bridge_cpu"):
      source = _over_storage(_loaded(source, self), self.dtype)  # (`torch.load` onto the device)
      args, kwargs = ((source, *args[1:]), kwargs) if args else (args, {**kwargs, "source": source})
    if not isinstance(source, Tensor):
      return super().set_(*args, **kwargs)
    _set_source.tensor = source
    try:
      return super().set_(*args, **kwargs)
    finally:
      _set_source.tensor = None

  def share_memory_(self) -> Tensor:
    """As `torch.Tensor.share_memory_` for a CUDA tensor: nothing to do (the data is a JAX
    array in the JAX runtime's memory, which is never moved to shared memory; another
    process receives the tensor pickled as a CPU tensor: see `__reduce_ex__`)."""
    return self

  def is_shared(self) -> bool:
    """As `torch.Tensor.is_shared` for a CUDA tensor: always True."""
    return True

  def untyped_storage(self) -> Any:
    """A read-only stand-in for torch's storage (the data is a JAX array): it tells storages
    apart as torch's does (`data_ptr()`, `nbytes()`, `size()`, `device`) and refuses anything
    else (`bridge.jax_view(t)` gives the array)."""
    return _untyped_stand_in(self._storage)

  def _typed_storage(self) -> Any:
    """`untyped_storage()` counted in elements of this tensor's dtype (torch's `storage()`)."""
    return _TypedStorageStandIn(self._storage, self.dtype)

  def storage(self) -> Any:
    """As `torch.Tensor.storage`, with its deprecation warning: `untyped_storage()`'s
    stand-in, counted in elements of this tensor's dtype."""
    torch.storage._warn_typed_storage_removal(stacklevel=2)
    return self._typed_storage()

  def data_ptr(self) -> int:
    """A number that tells this tensor's storage apart, as torch's data pointers do: the
    storage's own (`untyped_storage().data_ptr()`) plus the storage offset in bytes, so views
    of one storage agree and no two storages meet; 0 for an empty tensor, as torch's. Not an
    address (`bridge.jax_view(t)` gives the array)."""
    if self.numel() == 0:
      return 0
    base = storage_address(self._storage)
    return base + int(self.storage_offset()) * self.element_size() if base else 0

  def __dlpack__(
    self,
    *,
    stream: Any = None,
    max_version: tuple[int, int] | None = None,
    dl_device: Any = None,
    copy: bool | None = None,
  ) -> Any:
    """As `torch.Tensor.__dlpack__`: JAX's own DLPack export of the tensor's array, zero-copy
    (so `torch.from_dlpack(t)`, `np.from_dlpack(t)` and `jax.dlpack.from_dlpack(t)` share its
    buffer, as `bridge.jax_view(t)` does), with the protocol's arguments as JAX takes them.
    torch's refusals: a tensor that requires grad, a lazy conjugate. A view that is not its
    storage's whole array exports a copy of its values (DLPack cannot describe it over the
    array), and `copy=False` refuses it."""
    if self.requires_grad:
      raise BufferError("Can't export tensors that require gradient, use tensor.detach()")
    if self.is_conj():
      raise BufferError("Can't export tensors with the conjugate bit set")
    array = self._dlpack_array("__dlpack__")
    if not self._whole:
      if copy is False:
        raise BufferError(
          f"`Tensor.__dlpack__`: this `jax` tensor (shape {tuple(self.shape)}, strides "
          f"{self.stride()}, storage offset {self.storage_offset()}) is a view of a JAX array "
          "that DLPack cannot describe, so it cannot be exported without a copy. Pass "
          "`copy=None` or `copy=True`, or export `t.clone()`."
        )
      array = value(self)
    return array.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

  def __dlpack_device__(self) -> tuple[Any, int]:
    """As `torch.Tensor.__dlpack_device__`: the DLPack device of the tensor's JAX array (the
    CPU, or the GPU it is on), where `__dlpack__` exports it."""
    return self._dlpack_array("__dlpack_device__").__dlpack_device__()

  def _dlpack_array(self, api: str) -> Any:
    array = self._storage.array
    if isinstance(array, jax.core.Tracer):
      raise TracedValueError(
        f"`Tensor.{api}`: the tensor is a value of the JAX program being traced (an argument "
        "of `bridge.compile`, `call_torch` or `jax.jit`, or computed from one), which has no "
        "buffer to export while the program is built. Export it outside the traced function."
      )
    return array

  def __format__(self, format_spec: str) -> str:
    """As `torch.Tensor.__format__`: a 0-d tensor formats its value (`f"{loss:.4f}"`), but
    for `f"{t}"` a traced one, whose value is unknown, shows as `repr(t)` (as `print(t)`)."""
    traced = isinstance(self._storage.array, jax.core.Tracer)
    if self.dim() == 0 and not (traced and not format_spec):
      return self.detach().item().__format__(format_spec)
    return object.__format__(self, format_spec)

  def tolist(self) -> Any:
    """The values as nested Python numbers, as `torch.Tensor.tolist` (through a CPU copy)."""
    return self.detach().cpu().tolist()

  def __repr__(self, *, tensor_contents: Any = None) -> Any:  # type: ignore[override]
    del tensor_contents
    if isinstance(self._storage.array, jax.core.Tracer):
      return f"bridge.Tensor(<traced {tuple(self.shape)} {self.dtype}>, device='{self.device}')"
    with torch.no_grad():
      text = repr(torch.Tensor._make_subclass(torch.Tensor, self.detach().cpu()))
    extra = [f"device='{self.device}'"]
    if self.grad_fn is not None:
      extra.append(f"grad_fn=<{type(self.grad_fn).__name__}>")
    elif self.requires_grad:
      extra.append("requires_grad=True")
    return f"{text[:-1]}, {', '.join(extra)})"

  def __copy__(self) -> Tensor:
    """As `copy.copy` of a CPU tensor (torch's rebuild from the same storage): a new tensor
    over this one's storage (a write through either shows in both) with its geometry, a leaf
    that requires grad where this one does, without its `.grad`, with its Python attributes
    (the same objects: a `Parameter` stays one); backward hooks are not copied (torch's
    warning)."""
    if not isinstance(self, torch.nn.Parameter):  # (torch's `Parameter` does not warn)
      torch.utils.hooks.warn_if_has_hooks(self)
    new = self._same_view(self._storage)
    if self._detached:
      detach_traced(new)
    new.requires_grad_(self.requires_grad)
    for name, v in self.__dict__.items():
      if name not in _INTERNAL:
        setattr(new, name, v)
    return new

  def _same_view(self, storage: Storage) -> Tensor:
    """A new tensor over `storage` with this one's geometry, dtype view and conj/neg bits."""
    with torch.no_grad():
      return make_view(
        storage,
        tuple(self.shape),
        tuple(self.stride()),
        int(self.storage_offset()),
        self.dtype,
        self._storage.device,
        self._as,
        self.is_conj(),
        self.is_neg(),
      )

  def __deepcopy__(self, memo: dict) -> Tensor:
    """A copy in which what aliased still aliases (one new storage per storage, as torch's
    deepcopy of CPU views: `deepcopy((t, t[1:]))` keeps the view a view), with the
    gradient, `requires_grad` and Python attributes copied as torch copies them."""
    if not self.is_leaf:
      return torch.Tensor.__deepcopy__(self, memo)  # (torch's error for non-leaves)
    if id(self) in memo:
      return memo[id(self)]
    key = (_DEEPCOPY, id(self._storage))
    storage = memo.get(key)
    if storage is None:  # (the array is immutable: the new box may hold the same one)
      storage = memo[key] = Storage(self._storage.array, self._storage.device)
      memo.setdefault(id(memo), []).append(self._storage)  # (keeps the id valid)
    new = self._same_view(storage)
    new.requires_grad_(self.requires_grad)
    if self.grad is not None:
      new.grad = copy.deepcopy(self.grad, memo)
    for name, v in self.__dict__.items():
      if name not in _INTERNAL:
        setattr(new, name, copy.deepcopy(v, memo))
    memo[id(self)] = new
    return new

  def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
    """Saved as a CPU tensor: it loads anywhere (bridge or not) as a CPU tensor, and onto the
    jax device with `torch.load(..., map_location="jax")`. What else torch saves of a tensor
    is kept as torch keeps it: a `Parameter` is rebuilt by torch's `_rebuild_parameter`, the
    Python attributes by `_rebuild_parameter_with_state` or `_rebuild_from_type_v2`, and
    backward hooks are not saved (with torch's warning); all load with `weights_only=True`.
    """
    torch.utils.hooks.warn_if_has_hooks(self)
    state = {k: v for k, v in self.__dict__.items() if k not in _INTERNAL and k != "_is_param"}
    if isinstance(self, torch.nn.Parameter):  # (a `Parameter` of this class: `_is_param`)
      hooks: OrderedDict = OrderedDict()  # (torch saves an empty one: hooks are not saved)
      if state:
        return (
          torch._utils._rebuild_parameter_with_state,
          (self.detach(), self.requires_grad, hooks, state),
        )
      return (torch._utils._rebuild_parameter, (self.detach(), self.requires_grad, hooks))
    with torch.no_grad():
      data = torch.Tensor._make_subclass(torch.Tensor, self.detach().cpu())
    rebuild = torch._utils._rebuild_device_tensor_from_cpu_tensor
    if not state:
      return (rebuild, (data, self.dtype, "cpu", self.requires_grad))
    # Loaded onto the jax device, `_rebuild_from_type_v2` makes the rebuilt tensor a
    # `torch.Tensor` with `as_subclass`, which for a jax tensor is an alias: one that requires
    # grad would be a non-leaf (`AliasBackward0`). So the tensor is rebuilt without, and
    # `requires_grad` set on the alias with the other attributes (it is a settable one).
    if self.requires_grad:
      state["requires_grad"] = True
    return (
      torch._tensor._rebuild_from_type_v2,
      (rebuild, torch.Tensor, (data, self.dtype, "cpu", False), state),
    )


_set_source = threading.local()  # the `jax` tensor `Tensor.set_` passes as a torch storage


def set_source(storage: Any) -> Tensor | None:
  """The `jax` tensor whose torch storage `storage` is, when `Tensor.set_` passed it (torch's
  Python binding of `t.set_(source, storage_offset, size)` hands aten the source's storage
  instead of the source), else None."""
  source = getattr(_set_source, "tensor", None)
  if source is None or _UNTYPED_STORAGE(source)._cdata != storage._cdata:
    return None
  return source


_UNTYPED_STORAGE: Any = torch._C.TensorBase.untyped_storage
_DATA: Any = torch._C.TensorBase.data  # torch's own `data` descriptor, which `Tensor.data` wraps
_DEEPCOPY = object()  # the memo key prefix of storages `Tensor.__deepcopy__` copied
_INTERNAL = frozenset(["_storage", "_whole", "_cache", "_as", "_detached"])
_PLANS: dict[Any, Any] = {}  # shared with bridge._src.dispatch, which fills it


def _defer_backward_error(error: Exception, func: Any, args: tuple, kwargs: dict) -> Any:
  """An op failed inside torch's autograd engine: raise when the backward pass ends.

  Raised right here, the error would unwind through the engine's stream guard, which
  calls back into Python with the error still pending and aborts the process
  (torch's Python device guard cannot exchange streams). So the op returns zeros of
  the right shapes, and the error is raised, traceback intact, by a callback the
  engine runs when the backward pass finishes.
  """
  task = torch._C._current_graph_task_id()
  with _deferred_lock:
    entry = _deferred.get(task)
    if entry is None:
      _bridge_autoload.ENGINE[0] += 1  # (the engine's mark: `take_deferred`)
      entry = _deferred[task] = (_bridge_autoload.ENGINE[0], [])

      def raise_pending() -> None:
        with _deferred_lock:
          errors = _deferred.pop(task, (0, [error]))[1]
        raise errors[0]

      torch.autograd.Variable._execution_engine.queue_callback(raise_pending)
    entry[1].append(error)

  def placeholder(m: Any) -> Any:
    if isinstance(m, torch.Tensor):
      with jax.enable_x64(True):  # (the dtype as it is: an int64 guess raised a warning)
        zeros = jnp.zeros(tuple(m.shape), dtypes.TORCH_TO_JAX[m.dtype])
      return make(zeros, jax_device(0), m.dtype)
    return m

  meta = jax.tree_util.tree_map(
    lambda x: (
      torch.empty(tuple(x.shape), dtype=x.dtype, device="meta")
      if isinstance(x, torch.Tensor)
      else x
    ),
    (args, kwargs),
  )
  try:
    shapes = func(*meta[0], **meta[1])
  except Exception:  # noqa: BLE001 - no meta kernel: a guess, the pass is failing anyway
    shapes = next((x for x in meta[0] if isinstance(x, torch.Tensor)), None)
  return jax.tree_util.tree_map(placeholder, shapes)


# graph task id -> (its number among the backward passes that deferred an error, their errors)
_deferred: dict[int, tuple[int, list[Exception]]] = {}
_deferred_lock = threading.Lock()


def take_deferred(since: int) -> Exception | None:
  """The first error deferred by a backward pass counted after `since` (the count of such passes,
  `_bridge_autoload.ENGINE[0]`, when the engine began the pass) whose callback never
  ran (torch's engine stopped the pass first, at the zeros that stood in for the op's
  results, whose shapes were a guess): those passes' errors dropped, the first one returned,
  so that the user sees the op's own error, and nothing stays behind."""
  with _deferred_lock:
    late = sorted((n, task) for task, (n, _) in _deferred.items() if n > since)
    errors = [_deferred.pop(task)[1][0] for _, task in late]
  return errors[0] if errors else None


def _no_planner(func: Any) -> Any:
  raise RuntimeError(
    f"bridge: {func} reached a `jax` tensor before the dispatcher was loaded (`import bridge`)."
  )


# The plan of an op not yet in `_PLANS`: the dispatch layer's, once it `set_planner`s.
_get_plan: Callable[[Any], Any] = _no_planner


def set_planner(planner: Callable[[Any], Any]) -> None:
  """Install the dispatch layer's plan builder (`dispatch.plans.get_plan`), which
  `Tensor.__torch_dispatch__` calls for an op it has no plan for yet. The one call from this
  layer into a higher one, made by registration (the plans create `Tensor`s, so the class sits
  below them); installed once, by `dispatch.plans` as it is imported."""
  global _get_plan
  if _get_plan is not _no_planner and _get_plan is not planner:
    raise RuntimeError(f"bridge: a planner is installed already ({_get_plan!r})")
  _get_plan = planner


_BY_ID = dtypes.JAX_TO_TORCH_BY_ID


def torch_dtype_of(array: Any) -> torch.dtype:
  """The torch dtype of a JAX array or tracer (fast path for the dtypes JAX returns)."""
  dtype = dtypes.JAX_TO_TORCH_BY_ID.get(id(array.dtype))
  return dtype if dtype is not None else dtypes.JAX_TO_TORCH[np.dtype(array.dtype)]


def make_result(array: Any, device: torch.device, dtype: torch.dtype | None = None) -> Tensor:
  """A new tensor that is the whole of a new storage holding `array`.

  `device` must be a cached `jax_device(i)` (devices of storages compare by identity); the
  hot path of every op's result.
  """
  if dtype is None:  # torch_dtype_of, inlined: this runs for every op's result
    dtype = _BY_ID.get(id(array.dtype)) or dtypes.JAX_TO_TORCH[np.dtype(array.dtype)]
  t = torch.Tensor._make_wrapper_subclass(Tensor, array.shape, dtype=dtype, device=device)
  t._storage = Storage(array, device)  # `_whole` and `_cache` keep their class defaults
  return t


def make(array: Any, device: Any, dtype: torch.dtype | None = None) -> Tensor:
  """`make_result` for any spelling of a jax device (`"jax:1"`, `torch.device("jax", 1)`)."""
  if type(device) is not torch.device or device.type != device_type() or device.index is None:
    device = jax_device(torch.device(device).index or 0)
  else:
    device = jax_device(device.index)
  if dtype is not None and dtypes.TORCH_TO_JAX.get(dtype) != np.dtype(array.dtype):
    dtype = None  # JAX narrowed it (a 32-bit program): the tensor says what it holds
  return make_result(array, device, dtype)


def make_view(
  storage: Storage,
  size: tuple,
  stride: tuple,
  offset: int,
  dtype: torch.dtype,
  device: torch.device,
  as_: Any = None,
  conj: bool = False,
  neg: bool = False,
) -> Tensor:
  """A tensor sharing `storage`, with torch's view metadata: read as JAX dtype `as_` where
  that is not the storage array's (see `Tensor._as`), with torch's conj and neg bits."""
  t = torch.Tensor._make_wrapper_subclass(
    Tensor, size, strides=stride, storage_offset=offset, dtype=dtype, device=device
  )
  t._storage = storage
  base_shape = tuple(storage.array.shape)
  if as_ is not None or conj or neg:
    t._whole, t._as = False, as_
    if conj:
      torch._C._set_conj(t, True)
    if neg:
      torch._C._set_neg(t, True)
  elif not (
    tuple(size) == base_shape
    and offset == 0
    and tuple(stride) == strided.contiguous_strides(base_shape)
  ):
    t._whole = False
  return t


def _loaded(storage: Any, like: Tensor) -> Storage:
  """The JAX storage of a CPU storage `torch.load(..., map_location="jax")` loads onto the
  device (`_bridge_autoload._load_onto_device`): its bytes copied to `like`'s device once,
  as an array of `like`'s dtype (of bytes when they do not divide into it), kept on the
  storage for the other tensors saved sharing it."""
  box = getattr(storage, "_bridge_box", None)
  if box is None:
    cpu = storage._bridge_cpu
    dtype = like.dtype if cpu.nbytes() % like.element_size() == 0 else torch.uint8
    n = cpu.nbytes() // dtype.itemsize
    flat = torch.empty(0, dtype=dtype).set_(cpu, 0, (n,), (1,))
    moved: Any = flat.to(like.device, copy=True)
    box = storage._bridge_box = moved._storage
    storage._bridge_cpu = None  # (the CPU bytes are no longer needed)
  return box


def _over_storage(storage: Storage, dtype: torch.dtype) -> Tensor:
  """All of `storage` as a 1-d tensor of `dtype` (its bytes read as that dtype where the
  array's is another), as torch's `set_(storage)` sees a storage."""
  as_: Any = dtypes.TORCH_TO_JAX[dtype]
  if as_ == np.dtype(storage.array.dtype):
    as_ = None
  n = storage_nbytes(storage) // dtype.itemsize
  return make_view(storage, (n,), (1,), 0, dtype, storage.device, as_)


def storage_numel(t: Tensor) -> int:
  """How many elements of `t`'s own dtype its storage holds (more or fewer than the array's
  for a view of another dtype: torch's storage size in `t`'s units)."""
  array = t._storage.array
  if t._as is None:
    return int(np.size(array))
  return int(np.size(array)) * np.dtype(array.dtype).itemsize // np.dtype(t._as).itemsize


def value(t: Tensor, recorded: bool = False) -> Any:
  """The JAX value of `t`: its storage's array, or the gathered view (cached per version).
  `recorded=True` reads a detached tensor without its `stop_gradient` (for writes through it,
  which keep the storage's own derivative)."""
  storage = t._storage
  if t._whole:
    return storage.array
  cache = t._cache
  if cache is not None and cache[0] == storage.version:
    v = cache[1]
  else:
    array = storage.array
    traced = isinstance(array, jax.core.Tracer)
    if t._as is not None:
      array = (strided.reinterpret if traced else strided.reinterpreted)(array, t._as)
    v = (strided.read if traced else strided.gather)(
      array, tuple(t.shape), tuple(t.stride()), int(t.storage_offset())
    )
    v = _lazy(t, v)
    t._cache = (storage.version, v)
  if t._detached and not recorded and isinstance(v, jax.core.Tracer):
    v = jax.lax.stop_gradient(v)
  return v


def _lazy(t: Tensor, v: Any) -> Any:
  """`v` (a view's elements as stored, or its value) conjugated where `t` has torch's conj
  bit and negated where it has the neg bit: each is its own inverse, so this both reads a
  lazy view's value and turns a value into what its storage holds."""
  if t.is_conj() and jnp.iscomplexobj(v):
    v = jax.lax.conj(v)
  if t.is_neg():
    v = jax.lax.neg(v)
  return v


def detach_traced(views: Any) -> None:
  """Mark tensors (views of a traced storage) as detached: see `Tensor._detached`."""
  for t in views if isinstance(views, list) else [views]:
    t._detached, t._whole = True, False  # (a whole tensor's reads skip `value`)


def _placed_as(old: Any, new: Any) -> Any:
  """`new` (of `old`'s shape) placed as `old` was: a tensor's array stays on the device its
  `jax:i` names, or with its sharding, whatever devices the value written comes from (a
  `jax:0` tensor copied into a `jax:3` one, a sharded parameter receiving a CPU value)."""
  placement = old.sharding
  if new.sharding is placement:
    return new
  devices = placement.device_set
  if new.sharding.device_set == devices and (
    len(devices) == 1 or new.sharding.is_equivalent_to(placement, new.ndim)
  ):
    return new
  return jax.device_put(new, placement)


def _beside(base: Any, new: Any) -> Any:
  """`new` (a value written into part of `base`) where it can meet `base`: on `base`'s device,
  or replicated over `base`'s mesh."""
  placement = base.sharding
  devices = placement.device_set
  if new.sharding.device_set == devices:
    return new
  if len(devices) > 1:
    if not isinstance(placement, jax.sharding.NamedSharding):
      return new  # (JAX says what it refuses)
    placement = jax.sharding.NamedSharding(placement.mesh, jax.sharding.PartitionSpec())
  return jax.device_put(new, placement)


def write(t: Tensor, new: Any) -> None:
  """Store `new` (t's shape and dtype) as t's value; every view of the storage sees it."""
  storage = t._storage
  if t._whole:
    old = storage.array
    if type(new) is ArrayImpl and type(old) is ArrayImpl and new.sharding is not old.sharding:
      new = _placed_as(old, new)
    storage.array = new
  else:
    size, stride = tuple(t.shape), tuple(t.stride())
    if 0 not in size and any(s == 0 and n > 1 for s, n in zip(stride, size)):
      raise RuntimeError(
        "unsupported operation: more than one element of the written-to tensor refers to a "
        "single memory location. Please clone() the tensor before performing the operation."
      )
    array = storage.array
    traced = isinstance(array, jax.core.Tracer)
    concrete = type(array) is ArrayImpl and type(new) is ArrayImpl
    if concrete:
      new = _beside(array, new)
    base = array
    if t._as is not None:
      base = (strided.reinterpret if traced else strided.reinterpreted)(array, t._as)
    base = (strided.write if traced else strided.scatter)(
      base, _lazy(t, new), size, stride, int(t.storage_offset())
    )
    if t._as is not None:
      base = (strided.restore if traced else strided.restored)(base, array)
    storage.array = _placed_as(array, base) if concrete and type(base) is ArrayImpl else base
  storage.version += 1
  t._cache = None if t._whole else (storage.version, new)
