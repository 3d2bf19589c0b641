"""The `jax` torch device, registered at `import torch` without importing JAX or bridge.

Torch's `torch.backends` entry point calls `autoload()` at the end of `import torch` (unless
`TORCH_DEVICE_BACKEND_AUTOLOAD=0`). Importing bridge there would cost every torch user about a
second (JAX, the core), used or not, so this module, which imports torch alone and lives
outside the `bridge` package (importing any `bridge.*` module runs `bridge/__init__`), installs
torch's side of the device and nothing else: the PrivateUse1 backend's name (`jax`, unless
torch can use a CUDA GPU: see `bridge._src.device`), its `torch.jax` module, device guard and
hooks, its factory and composite kernels and its serialization rule (and the torch log name
`bridge`: `register_log`). Each of the device's parts is a trampoline: the first one called
imports bridge, whose `bridge._src.device.register` hands the real implementations over
(`bind`); from then on they run directly. Nothing a user can reach
works on a `jax` tensor without passing through one of them first, since no `jax` tensor
exists before a factory kernel made it.

`import bridge` (with or without the autoload) runs the same `install`, so there is one
registration path.
"""

from __future__ import annotations

import importlib.util
import threading
from typing import Any, Callable

import torch
from torch.autograd.variable import Variable as _Variable

NAME = "jax"  # PrivateUse1's name once named

# name -> the real implementation, filled by `bridge._src.device.register` (`bind`)
_REAL: dict[str, Any] = {}
_lock = threading.RLock()
_installed = False
_libraries: list[Any] = []  # keeps the torch.library registrations alive
_pending_seed: int | None = None  # a seed given before bridge was loaded (`bind` applies it)

# The kernels the backend registers, as (library key, aten op, name of the implementation).
# implemented by torch per backend only (`_efficientzerotensor`: forward AD's zero tangents)
_FACTORIES = ("tril_indices", "triu_indices", "_efficientzerotensor")
_COMPOSITES = (
  "linear",
  "matmul",
  "linalg_eigvals",
  "cov",
  "one_hot",
  "quantile",
  "nanquantile",
)  # see `bridge._src.device._composite`
KERNELS: tuple[tuple[str, str, str], ...] = (
  ("PrivateUse1", "empty.memory_format", "empty"),
  # `.item()` below torch's Python key: `torch.tensor([loss, loss])` reads its 0-d elements so
  ("PrivateUse1", "_local_scalar_dense", "local_scalar_dense"),
  ("PrivateUse1", "empty_strided", "empty_strided"),
  ("PrivateUse1", "_copy_from", "copy_from"),
  ("PrivateUse1", "_copy_from_and_resize", "copy_from"),
  *(("PrivateUse1", op, f"factory.{op}") for op in _FACTORIES),
  ("QuantizedPrivateUse1", "empty_quantized", "no_quantized"),
  *(("AutogradPrivateUse1", op, f"composite.{op}") for op in _COMPOSITES),
  # ops with no meaning on the jax device, answered before the per-op fallback would run them
  # on CPU copies (`t.pin_memory()`: torch's error for a non-CPU tensor; `record_stream`: a
  # no-op, JAX manages the buffers' lifetimes)
  ("AutogradPrivateUse1", "_pin_memory", "pin_memory"),
  ("AutogradPrivateUse1", "record_stream", "record_stream"),
)


def autoload() -> None:
  """Called by torch at `import torch` (unless TORCH_DEVICE_BACKEND_AUTOLOAD=0)."""
  install(named=None)


def register_log() -> None:
  """Makes the bridge's loggers (`bridge.*`: the `torch.compile` backend's graphs, programs and
  recompiles) a torch log named `bridge`, so `TORCH_LOGS=bridge` (INFO) or `TORCH_LOGS=+bridge`
  (DEBUG) turns them on, as `TORCH_LOGS=dynamo` does dynamo's. Torch reads `TORCH_LOGS` right
  after the autoload (`install`); with the autoload off, `import bridge` registers the name too
  late for it, and `torch._logging.set_logs(modules={"bridge": logging.INFO})` or the `logging`
  module turn the loggers on."""
  try:
    from torch._logging import _internal  # (a private module: skipped if torch moves it)

    if "bridge" not in _internal.log_registry.log_alias_to_log_qnames:
      _internal.register_log("bridge", "bridge")
  except (ImportError, AttributeError):
    pass


def _real(name: str) -> Any:
  found = _REAL.get(name)
  if found is None:
    import bridge  # noqa: F401 - importing bridge binds the real implementations

    found = _REAL[name]
  return found


def _trampoline(name: str) -> Callable[..., Any]:
  def kernel(*args: Any, **kwargs: Any) -> Any:
    return _real(name)(*args, **kwargs)

  kernel.__name__ = kernel.__qualname__ = name
  return kernel


class DeviceModule:
  """What `torch.jax` is: torch looks devices' helpers up here; each is bridge's
  (`bridge._src.device._DeviceModule`), loaded on first use, except those torch's CPU-only
  code asks of the accelerator's module (`DataLoader`, `torch.manual_seed`,
  `torch.utils.checkpoint`): they answer here, without loading bridge or starting JAX
  until the device is used."""

  # CUDA's lazy-init flag, which torch reads before saving a device's RNG state
  # (`torch.utils.checkpoint` replays dropout in its recomputation only then). The jax
  # device needs no initialization (`is_initialized()` is always True); read without
  # importing bridge, since CPU-only code reaches it too (the accelerator's module).
  _initialized = True

  @staticmethod
  def is_available() -> bool:
    """Whether the `jax` device can be used: bridge's answer (JAX sees a device) once bridge is
    loaded. torch's CPU code asks it too, as the accelerator's (`DataLoader(...,
    pin_memory=True)`, `torch.utils.checkpoint`), so before that it answers without starting
    JAX, whose runtime would cost a second and make forked `DataLoader` workers unsafe:
    whether JAX is installed (it always has a CPU device)."""
    found = _REAL.get("is_available")
    if found is not None:
      return bool(found())
    return importlib.util.find_spec("jax") is not None

  @staticmethod
  def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes of `torch.autocast(device_type="jax")` (asked by CPU-only code too: the
    recomputation of `torch.utils.checkpoint` opens the accelerator's autocast, disabled)."""
    return [torch.bfloat16, torch.float16]

  @staticmethod
  def _lazy_init() -> None:
    """What torch runs before a device's first use (`torch.accelerator.current_device_index`):
    nothing for the jax device, whose factories load bridge themselves."""

  @staticmethod
  def current_device() -> int:
    """bridge's current `jax` device once loaded; before, `jax:0` (only bridge changes it)."""
    found = _REAL.get("module")
    return 0 if found is None else int(found.current_device())

  @staticmethod
  def set_device(device: Any) -> None:
    """bridge's `set_device`; before bridge is loaded, `jax:0` (there always, and the current
    one: `DataLoader(..., pin_memory=True)`'s thread sets it) needs no loading."""
    if not (device == 0 and isinstance(device, int) and "module" not in _REAL):
      _real("module").set_device(device)

  @staticmethod
  def _is_in_bad_fork() -> bool:
    """bridge's answer once loaded (`bridge._src.device._is_in_bad_fork`); before, bridge has
    started no JAX runtime that a fork could break."""
    found = _REAL.get("module")
    return found is not None and bool(found._is_in_bad_fork())

  @staticmethod
  def manual_seed_all(seed: int) -> None:
    """Seed the device's generator. `torch.manual_seed` calls this in every process, CPU-only
    ones too (each `DataLoader` worker), so before bridge is loaded the seed waits for it
    (`bind`) instead of loading bridge and starting JAX."""
    global _pending_seed
    with _lock:
      if "module" not in _REAL:
        _pending_seed = int(seed)
        return
    _REAL["module"].manual_seed_all(seed)

  def __getattr__(self, name: str) -> Any:
    if name.startswith("__"):
      raise AttributeError(name)
    value = getattr(_real("module"), name)
    setattr(self, name, value)  # (found once)
    return value

  def __repr__(self) -> str:
    return "<module 'torch.jax' (bridge's jax device)>"


class _DeviceGuard(torch._C._acc.DeviceGuard):
  """Lets torch's C++ code (views, autograd) handle `jax` tensors like any device's."""

  def type_(self) -> Any:
    return torch._C._autograd.DeviceType.PrivateUse1


# What `_Engine` reads on every backward pass, kept up by bridge: [how many backward passes have
# deferred a failed `jax` op's error (`bridge._src.tensor`), whether a pass runs on the calling
# thread (`bridge._src.devices.jax_devices`: more `jax` devices than the engine has threads)]
ENGINE: list[Any] = [0, False]
_run_backward = torch._C._ImperativeEngine.run_backward


class _Engine(torch._C._ImperativeEngine):
  """torch's autograd engine (`Variable._execution_engine`), with two changes for `jax`
  tensors; a pass that meets neither costs a list read and a try block.

  - A backward on `jax:1` and above runs on the calling thread. The engine gives each device
    index a worker thread and queue, as many as the largest device count a device guard
    reports; torch's guard for a Python backend (`_DeviceGuard`'s base) reports 1, which Python
    cannot override (torch 2.13), so a gradient on `jax:1` found no queue ("device_ready_queues_
    ... INTERNAL ASSERT FAILED"). With multithreading off (torch's own switch,
    `torch.autograd.set_multithreading_enabled(False)`) the engine runs every node on the
    calling thread, as it does CPU nodes: switched off for the pass only, and only where the
    process has more `jax` devices than the engine has threads.
  - A `jax` op that fails inside the pass stands zeros in for its results and raises its error
    when the pass ends (`bridge._src.tensor`); where the engine stops the pass first (the
    zeros' shapes were a guess), that op's error is the one raised, and nothing stays behind.
  """

  def run_backward(self, *args: Any, **kwargs: Any) -> Any:
    state = ENGINE
    since = state[0]
    try:
      if not state[1] or not torch._C._is_multithreading_enabled():
        return _run_backward(self, *args, **kwargs)
      torch._C._set_multithreading_enabled(False)
      try:
        return _run_backward(self, *args, **kwargs)
      finally:
        torch._C._set_multithreading_enabled(True)
    except Exception as e:
      if state[0] == since:  # no `jax` op deferred an error in the meantime
        raise
      first = _REAL["take_deferred"](since)
      if first is None or first is e:
        raise
      first.add_note(f"(bridge: torch's autograd engine then stopped the backward pass: {e})")
      raise first from None


class _Hooks(torch._C._acc.PrivateUse1Hooks):
  """The backend hooks torch's autograd engine asks for."""

  def is_available(self) -> bool:
    return bool(_real("is_available")())

  def has_primary_context(self, device_index: int) -> bool:
    return True

  def is_built(self) -> bool:
    return True


MODULE = DeviceModule()


def backend_name() -> str:
  """PrivateUse1's current name: `privateuseone`, `jax`, or another backend's."""
  return torch._C._get_privateuse1_backend_name()


def cuda_usable() -> bool:
  """Whether torch in this process can use a CUDA GPU (then the device stays unnamed)."""
  try:
    return torch.cuda.is_available()
  except Exception:  # noqa: BLE001 - a broken driver: torch cannot use CUDA either
    return False


def install(named: bool | None) -> bool:
  """Install the backend (idempotent; safe from several threads): False, doing nothing, when
  another backend holds PrivateUse1. `named`: also name it `jax` (None: unless torch can use
  a CUDA GPU; False: leave the name as it is)."""
  global _installed
  register_log()
  with _lock:
    if backend_name() not in ("privateuseone", NAME):
      return False
    if not _installed:
      if not hasattr(torch, backend_name()):
        torch._register_device_module(backend_name(), MODULE)
      torch._C._acc.register_python_privateuseone_device_guard(_DeviceGuard())
      torch._C._acc.register_python_privateuseone_hook(_Hooks())
      libraries = {}
      for key, op, target in KERNELS:
        if key not in libraries:
          libraries[key] = torch.library.Library("aten", "IMPL", key)
        libraries[key].impl(op, _trampoline(target))
      _libraries.extend(libraries.values())
      # torch.load(..., map_location="jax"): the saved (CPU) storages load onto the device
      torch.serialization.register_package(5, _never_tag, _load_onto_device)
      _guard_storages()
      _installed = True
    if named or (named is None and not cuda_usable()):
      name_backend()
    return True


def name_backend() -> None:
  """Rename PrivateUse1 to `jax`, with its `torch.jax` module and the usual methods
  (`t.jax()`, `t.is_jax`, `model.jax()`); idempotent."""
  with _lock:
    if backend_name() == NAME:
      return
    torch.utils.rename_privateuse1_backend(NAME)
    if not hasattr(torch, NAME):
      torch._register_device_module(NAME, MODULE)
    if not cuda_usable():  # (else CUDA keeps its pinned memory: see `_unpinned_copy`)
      library = torch.library.Library("aten", "IMPL", "CPU")
      library.impl("_pin_memory", _unpinned_copy)
      _libraries.append(library)
    torch.utils.generate_methods_for_privateuse1_backend(
      for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=False
    )


def _unpinned_copy(self: torch.Tensor, device: Any = None) -> torch.Tensor:
  """torch's `_pin_memory` for CPU tensors once `jax` is torch's accelerator (named).

  torch pins memory with the accelerator's pinned allocator, which a Python backend has no
  way to provide (torch's hooks then raise `NotImplementedError ... getPinnedMemoryAllocator`,
  and `DataLoader(..., pin_memory=True)` fails on plain CPU tensors). The jax device has no
  pinned memory and its copies from the CPU need none, so `t.pin_memory()` gives what
  torch's gives but unpinned: a copy (`is_pinned()` stays False). Registered only where
  torch cannot use CUDA, whose pinning it would replace (`t.pin_memory("cuda")`).
  """
  if device is not None and torch.device(device).type != backend_name():
    raise RuntimeError(
      f"Tensor.pin_memory(device={str(device)!r}): torch's pinned memory is unavailable in "
      f"this process, where bridge's {backend_name()!r} device is torch's accelerator (it "
      "has no pinned memory); pass no device to get an unpinned copy."
    )
  return self.clone()


def bind(implementations: dict[str, Any]) -> None:
  """Hand the real implementations to the trampolines (`bridge._src.device.register`), install
  the autograd engine that serves every `jax:i` (`_Engine`), and seed the device's generator
  with a seed given before (`DeviceModule.manual_seed_all`)."""
  global _pending_seed
  with _lock:
    _REAL.update(implementations)
    seed, _pending_seed = _pending_seed, None
    if type(_Variable._execution_engine) is torch._C._ImperativeEngine:
      _Variable._execution_engine = _Engine()
  # bridge's generator starts from `torch.initial_seed()`: seeded only if that differs (not
  # after `torch.manual_seed(seed)`, which seeds the CPU generator too), so as to start no
  # JAX runtime while bridge is being imported
  if seed is not None and seed % 2**64 != torch.initial_seed():
    implementations["module"].manual_seed_all(seed)


def _guard_storages() -> None:
  """Make a torch storage on the jax device an error instead of a crash.

  torch builds a storage on a device with that device's allocator (`c10::make_storage_impl`),
  which a Python backend cannot register: `torch.UntypedStorage(n, device="jax")` crashed the
  process (SIGSEGV), and with it every Python path that makes one (`TypedStorage(n,
  device=...)`, `storage.to(device=...)`, `_new_shared`, a `torch.load` whose `map_location`
  moves storages with `storage.to`). They all construct `torch.UntypedStorage(...,
  device=...)` (`device` is a keyword-only argument of its constructor), so this wraps that
  constructor, once, at install (a patch of a torch class: the one narrow guard the backend
  needs): only a storage asked for on this backend's device changes (bridge's error, through
  a trampoline); every other call goes on to torch's constructor as it was."""
  torchs = torch.UntypedStorage.__new__  # (torch's C constructor, `StorageBase.__new__`)

  def __new__(cls: Any, *args: Any, **kwargs: Any) -> Any:
    device = kwargs.get("device")
    if device is not None and device != "cpu" and _is_ours(device):
      _real("no_storage")()
    return torchs(cls, *args, **kwargs)

  torch.UntypedStorage.__new__ = __new__  # type: ignore[method-assign]


def _is_ours(device: Any) -> bool:
  """Whether `device` (anything torch takes for one) names this backend's device."""
  try:
    return torch.device(device).type == backend_name()
  except (RuntimeError, TypeError, ValueError):
    return False  # (torch's constructor gives its own error for it)


def _never_tag(obj: Any) -> None:
  del obj  # no storage ever lives on the jax device: jax tensors are saved as CPU tensors
  return None


def _load_onto_device(storage: Any, location: str) -> Any:
  """`torch.load(..., map_location="jax")`'s deserializer of a storage saved from the CPU.

  torch rebuilds a tensor on its storage's device (`torch._utils._rebuild_tensor`: an empty
  tensor there, `set_` to the storage). No storage can hold memory on the jax device, so the
  one handed back only says it is there: it points at the CPU storage's bytes without owning
  them, and keeps that storage (`_bridge_cpu`); `bridge.Tensor.set_` copies the bytes into one
  JAX array per storage (tensors saved sharing memory load sharing it). A tensor saved from
  the jax device was saved as a CPU tensor, so it takes this way too.

  A file in torch's legacy format (`_use_new_zipfile_serialization=False`) rebuilds its
  tensors before it reads their bytes (`_torch_load_uninitialized`), so its tensors stay on
  the CPU, as `torch.load` gives them (move them after loading)."""
  current = backend_name()
  if location != current and not location.startswith(current + ":"):
    return None
  if getattr(storage, "_torch_load_uninitialized", False):
    return storage
  device = torch.device(location)
  if device.index is None:
    device = torch.device(current, MODULE.current_device())
  on: Any = torch._C._construct_storage_from_data_pointer(
    storage.data_ptr(), device, storage.nbytes()
  )
  on._bridge_cpu = storage
  return on
