"""The `jax` torch device: torch's PrivateUse1 backend, renamed, with its `torch.jax` module.

Torch's side of the backend (its factory kernels, device guard and hooks, device module,
name) is installed by the top-level module `_bridge_autoload`, which imports torch alone, so
that torch's backend autoload can run it at `import torch` without importing JAX or bridge;
each of those kernels is a trampoline to the implementation here. `register()` (run by
`import bridge`) installs it too if the autoload did not, and hands the trampolines their
implementations: the factory kernels that create `bridge.Tensor`s (every other op reaches
`bridge.Tensor.__torch_dispatch__`), the device module (`torch.jax`), the composite ops that
run whole. Then, unless torch in this process can use a CUDA GPU, `_name()` renames
PrivateUse1 to `jax` and generates the usual methods (`t.jax()`, `t.is_jax`, `model.jax()`).

Why not on a CUDA machine: torch (2.8 and later) takes a *named* PrivateUse1 backend
for the process's accelerator (`torch.accelerator` then reports `jax`), and its
autograd engine then finds no stream for CUDA tensors: every backward over CUDA
tensors fails with "opt_ready_stream && opt_parent_stream INTERNAL ASSERT FAILED"
(pytorch/pytorch#161129), and a rename cannot be undone. So there the backend stays
unnamed (`privateuseone:0`): everything bridge builds on it (`call_torch`,
`bridge.compile`, `extract_jax`, `torch_view`) works and CUDA training is untouched;
the device strings `"jax"`/`"jax:0"` need `bridge.register_jax_device()`, which
names it, at that cost (and says so in a warning). It changes no JAX setting and no
other torch backend.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.autograd.forward_ad as _fwd_ad
from jax._src import xla_bridge

import _bridge_autoload

from bridge._src import autocast
from bridge._src import rng
from bridge._src import tensor
from bridge._src.devices import (
  current_device,
  device,
  device_count,
  device_index,
  is_available,
  set_device,
)
from bridge._src.dispatch import checks
from bridge._src.dispatch.plans import get_plan
from bridge._src.dispatch.special import copy_into
from bridge._src.dispatch.tensors import new_zeros, wait_for_last_result
from bridge._src.errors import BridgeError, BridgeTypeError, CudaAutogradWarning
from bridge._src.registry import REGISTRY

NAME = _bridge_autoload.NAME  # the device's name once named (`tensor.device_type()` says which)
_lock = threading.Lock()
_registered = False


# --- the torch.jax module ---------------------------------------------------------


def synchronize(device: Any = None) -> None:
  """Wait until every op issued so far on the `jax` device has finished."""
  del device
  wait_for_last_result()
  jax.effects_barrier()


def is_initialized() -> bool:
  return True


def _is_in_bad_fork() -> bool:
  """Whether this process is a fork of one whose JAX runtime had started: JAX's threads do not
  survive a fork, so JAX cannot run here. torch then leaves the device's generator alone
  (`torch.manual_seed` in a `DataLoader` worker), as it does CUDA's in such a child."""
  return _forked_after_start


def _after_fork_in_child() -> None:
  global _forked_after_start
  started = getattr(xla_bridge, "backends_are_initialized", None)  # (JAX's own, private)
  _forked_after_start = _forked_after_start or started is None or bool(started())


_forked_after_start = False
os.register_at_fork(after_in_child=_after_fork_in_child)  # (as torch.cuda registers its own)


def manual_seed(seed: int) -> None:
  """Seed the random number generator of the `jax` device (all of them)."""
  rng.manual_seed(int(seed))


manual_seed_all = manual_seed


def seed() -> None:
  """Seed the `jax` generator with a non-deterministic random number."""
  manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)


seed_all = seed


def initial_seed() -> int:
  return rng.initial_seed()


def get_rng_state(device: Any = None) -> torch.Tensor:
  """The generator state as a CPU `torch.uint8` tensor (for `torch.random.fork_rng`); inside a
  `bridge.rng_key` block, the block's key, which its random ops draw from: a `jax` tensor of
  its uint32 data (traced in traced code), so that `torch.utils.checkpoint` and `fork_rng`
  save and restore what the block's ops draw (a recomputation replays dropout's mask)."""
  _check_device(device)
  box = rng.current_box()
  if box is not None:
    return tensor.make(rng.raw(box.key), torch.device(tensor.device_type()), torch.uint32)
  return torch.from_numpy(np.frombuffer(rng.get_state(), dtype=np.uint8).copy())


def set_rng_state(new_state: torch.Tensor, device: Any = None) -> None:
  """Restore a state `get_rng_state` gave (a block's key inside a `bridge.rng_key` block).

  Else the state is a CPU `torch.uint8` tensor of the generator's 8 bytes, with torch's errors
  (CUDA's `set_rng_state`, whose generator checks what the CPU's does) for another tensor."""
  _check_device(device)
  box = rng.current_box()
  if box is not None and type(new_state) is tensor.Tensor and new_state.dtype == torch.uint32:
    data = tensor.value(new_state)
    box.key = rng.typed(data) if jax.dtypes.issubdtype(box.key.dtype, jax.dtypes.prng_key) else data
    return
  if not isinstance(new_state, torch.Tensor):
    raise TypeError(f"expected a torch.ByteTensor, but got {type(new_state).__name__}")
  if not (
    new_state.layout == torch.strided
    and new_state.device.type == "cpu"
    and new_state.dtype == torch.uint8
  ):
    raise TypeError("RNG state must be a torch.ByteTensor")
  if new_state.numel() != rng.STATE_BYTES:
    raise RuntimeError("RNG state is wrong size")
  rng.set_state(new_state.contiguous().numpy().tobytes())


def _check_device(device: Any) -> None:
  """torch.jax's RNG functions' `device` (None: the current one): one that exists (`set_device`'s
  error else)."""
  if device is not None:
    device_index(
      device if not isinstance(device, int) else torch.device(tensor.device_type(), device)
    )


def _no_storage() -> Any:
  """`torch.UntypedStorage(..., device="jax")` and what builds on it (`_bridge_autoload`'s
  guard): torch would build the storage with the device's allocator, which a Python backend
  cannot have (the process crashed)."""
  raise BridgeTypeError(
    "bridge: a torch storage cannot live on the `jax` device (a `jax` tensor keeps its data in "
    "a JAX array, not in a torch storage), so a storage cannot be made on it or moved to it. "
    "Move tensors instead: `t.to('jax')`, `model.to('jax')`; to load a checkpoint onto the "
    "device, load it on the CPU and move the tensors: `model.to('jax')` then "
    "`model.load_state_dict(torch.load(f))`, or "
    "`torch.utils._pytree.tree_map(lambda t: t.to('jax'), torch.load(f))`."
  )


def _pin_memory(self: torch.Tensor, device: Any = None) -> Any:
  """`t.pin_memory()` of a `jax` tensor: torch's error for a tensor not on the CPU (CUDA's)."""
  del device
  raise RuntimeError(f"cannot pin '{self.type()}' only dense CPU tensors can be pinned")


def _record_stream(self: torch.Tensor, stream: Any) -> None:
  """`t.record_stream(s)`: nothing to do, as for a device without a stream-ordered allocator
  (JAX keeps an array's buffer alive while a computation uses it)."""
  del self, stream


def _no_quantized(*args: Any, **kwargs: Any) -> Any:
  raise BridgeTypeError(
    "bridge: quantized tensors cannot live on the `jax` device (JAX has no quantized "
    "arrays). Dequantize first: `t.dequantize().to('jax')`, and quantize with JAX code."
  )


class _DeviceModule:
  """What `torch.jax` is: torch looks devices' helpers up here."""

  is_available = staticmethod(is_available)
  device_count = staticmethod(device_count)
  current_device = staticmethod(current_device)
  set_device = staticmethod(set_device)
  synchronize = staticmethod(synchronize)
  is_initialized = staticmethod(is_initialized)
  _is_in_bad_fork = staticmethod(_is_in_bad_fork)
  manual_seed = staticmethod(manual_seed)
  manual_seed_all = staticmethod(manual_seed_all)
  seed = staticmethod(seed)
  seed_all = staticmethod(seed_all)
  initial_seed = staticmethod(initial_seed)
  get_rng_state = staticmethod(get_rng_state)
  set_rng_state = staticmethod(set_rng_state)
  device = device

  def __repr__(self) -> str:
    return "<module 'torch.jax' (bridge's jax device)>"


# --- factory kernels ------------------------------------------------------------


def _empty(
  size: Any,
  dtype: Any = None,
  layout: Any = None,
  device: Any = None,
  pin_memory: Any = None,
  memory_format: Any = None,
) -> torch.Tensor:
  del layout, memory_format
  if pin_memory:  # (CUDA's `empty_cuda` check: only CPU memory is pinned)
    raise RuntimeError("Only dense CPU tensors can be pinned")
  return new_zeros(_sizes(size), dtype, device)


def _empty_strided(
  size: Any,
  stride: Any,
  dtype: Any = None,
  layout: Any = None,
  device: Any = None,
  pin_memory: Any = None,
) -> torch.Tensor:
  del stride, layout  # jax tensors are created contiguous
  if pin_memory:  # (as `_empty`)
    raise RuntimeError("Only dense CPU tensors can be pinned")
  return new_zeros(_sizes(size), dtype, device)


def _sizes(size: Any) -> tuple[int, ...]:
  """A new tensor's size, with torch's error for a negative dimension (JAX makes an empty array
  of it)."""
  sizes = tuple(int(s) for s in size)
  for s in sizes:
    if s < 0:
      raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {list(sizes)}")
  return sizes


# Factories torch implements only per backend (CPU, CUDA): on the jax device they run their
# lowering through the dispatcher.
_BACKEND_ONLY_FACTORIES = ("tril_indices", "triu_indices", "_efficientzerotensor")


def _factory(name: str, *args: Any, **kwargs: Any) -> torch.Tensor:
  op = getattr(torch.ops.aten, name).default
  return get_plan(op)(args, kwargs)


def _local_scalar_dense(self: torch.Tensor) -> Any:
  """`t.item()` where torch's Python key is off: torch's tensor constructor reads the 0-d
  tensors of a list so (`torch.tensor([loss, loss])`), bypassing `__torch_dispatch__`; this
  runs the same plan."""
  return get_plan(torch.ops.aten._local_scalar_dense.default)((self,), {})


def _copy_from(self: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
  """Copy between a `jax` tensor and another device's (torch routes some copies here)."""
  del non_blocking
  return copy_into(dst, self)


# Composite ops that torch would decompose before they reach the jax device, but that run
# better whole (`linear` is one matmul, not `t` + `addmm`; `matmul` of a non-contiguous 3-D
# tensor would expand a weight to every batch element for `bmm`): when autograd is not
# recording them (in reverse or forward mode) and a lowering exists, they run as one op
# (`linalg_eigvals` then keeps CPU torch's values where `linalg_eig` refuses infs and NaNs: torch
# decomposes it into `linalg_eig` only for a tensor that may need a derivative).
_WHOLE_WHEN_NOT_RECORDING = ("linear", "matmul", "linalg_eigvals")
# Composite ops whose torch code reads tensor values to decide (`cov` checks its weights and
# its degrees of freedom with `.item()`-like calls): inside a JAX trace, where those values
# are unknown, they run whole through their lowering; on concrete values torch's own code
# runs, with its checks and warnings.
_WHOLE_WHEN_TRACED = ("cov",)


def _composite(packet: Any, *args: Any, **kwargs: Any) -> Any:
  op = packet.default
  tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
  ours = all(type(t) is tensor.Tensor for t in tensors)
  if packet.__name__ in _WHOLE_WHEN_TRACED:
    whole = ours and any(
      isinstance(t._storage.array, jax.core.Tracer)  # type: ignore[attr-defined]
      for t in tensors
    )  # (`ours`: all are bridge.Tensors)
  else:
    whole = ours and len({t.dtype for t in tensors}) == 1
  whole = (
    whole
    and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
    # (nor forward-mode AD: a dual tensor's tangent lives above the dispatch run below)
    and _fwd_ad._current_level < 0
    and REGISTRY.lookup(op) is not None
  )
  if whole:
    with torch._C._AutoDispatchBelowAutograd():
      return get_plan(op)(args, kwargs)
  return op.decompose(*args, **kwargs)


def _one_hot(self: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
  """`F.one_hot` with the CPU's errors. torch's composite code skips its checks for a tensor
  with torch's Python key (as a `jax` tensor has), computing `eq(self[..., None], arange(n))`:
  a class out of range gave a row of zeros, a float tensor a result. Here torch's errors come
  first: on concrete values eagerly, and in a traced program through the value checks
  (`bridge.config(check_indices=True)`; unchecked otherwise, as other value checks there);
  then that computation, without torch's `_assert_async` (which would run on the host)."""
  if self.dtype != torch.int64:
    raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
  if type(self) is not tensor.Tensor:  # (a functorch wrapper: torch's own code)
    return torch.ops.aten.one_hot.default.decompose(self, num_classes)
  if self.numel() == 0:
    if num_classes <= 0:
      raise RuntimeError("Can not infer total number of classes from empty tensor.")
  else:
    v = tensor.value(self)
    with jax.enable_x64(True):  # (int64 values and class counts, whatever JAX's setting)
      negative = jnp.min(v) < 0
      too_large = None if num_classes == -1 else jnp.max(v) >= num_classes
    report = functools.partial(checks.report_value_check, "aten::one_hot")
    report(negative, RuntimeError, "Class values must be non-negative.")
    if too_large is not None:
      report(too_large, RuntimeError, "Class values must be smaller than num_classes.")
    if num_classes == -1:
      num_classes = int(self.max().item()) + 1
  classes = torch.arange(num_classes, dtype=self.dtype, device=self.device)
  return (self.unsqueeze(-1) == classes).to(torch.int64)


def _quantile(packet: Any, self: torch.Tensor, q: Any, *args: Any, **kwargs: Any) -> Any:
  """`torch.quantile`/`nanquantile` with a tensor `q`, with the CPU's check of q's values
  (torch makes it on the CPU only, to spare an accelerator the wait; the `jax` device makes it
  as its other value checks: on concrete values eagerly, in a traced program with
  `bridge.config(check_indices=True)`), then torch's own composite code."""
  if type(q) is tensor.Tensor and q.numel():
    v = tensor.value(q)
    outside = jnp.any(~((v >= 0) & (v <= 1)))  # (NaN too)
    checks.report_value_check(
      f"aten::{packet.__name__}",
      outside,
      RuntimeError,
      "quantile() q values must be in the range [0, 1]",
    )
  return packet.default.decompose(self, q, *args, **kwargs)


cuda_usable = _bridge_autoload.cuda_usable


def register(named: bool | None = None) -> None:
  """Install the device (idempotent; safe from several threads) and hand the trampolines of
  `_bridge_autoload` (which torch's autoload may have installed at `import torch`) their
  implementations; `named` also names it `jax` (default: unless torch can use a CUDA GPU)."""
  global _registered
  with _lock:
    if not _registered:
      _backend_name()  # (refuses a PrivateUse1 held by another backend)
      _bridge_autoload.install(named=False)
      _bridge_autoload.bind(_implementations())
      autocast.register()
      _registered = True
  if named if named is not None else not cuda_usable():
    _name()


def _implementations() -> dict[str, Any]:
  """What `_bridge_autoload`'s trampolines run, by the names its `KERNELS` give them."""
  found: dict[str, Any] = {
    "module": _MODULE,
    "is_available": is_available,
    "take_deferred": tensor.take_deferred,
    "empty": _empty,
    "empty_strided": _empty_strided,
    "copy_from": _copy_from,
    "local_scalar_dense": _local_scalar_dense,
    "no_quantized": _no_quantized,
    "no_storage": _no_storage,
    "pin_memory": _pin_memory,
    "record_stream": _record_stream,
    "composite.one_hot": _one_hot,
    "composite.quantile": functools.partial(_quantile, torch.ops.aten.quantile),
    "composite.nanquantile": functools.partial(_quantile, torch.ops.aten.nanquantile),
  }
  for op_name in _BACKEND_ONLY_FACTORIES:  # no composite kernel: torch never reaches Python
    found[f"factory.{op_name}"] = functools.partial(_factory, op_name)
  for op_name in _WHOLE_WHEN_NOT_RECORDING + _WHOLE_WHEN_TRACED:
    found[f"composite.{op_name}"] = functools.partial(_composite, getattr(torch.ops.aten, op_name))
  return found


def register_jax_device() -> None:
  """Makes `"jax"` a torch device string on a machine where torch can use a CUDA GPU.

  `import bridge` names the device `jax` unless torch in this process can use a CUDA
  GPU: there torch (2.8 and later) would then take it for the process's accelerator,
  and every backward over CUDA tensors would fail inside torch's autograd engine
  (pytorch/pytorch#161129). Without the name everything else works (`call_jax`,
  `call_torch`, `bridge.compile`, `extract_jax`, `torch_view`, transfers); its tensors
  show as `privateuseone:0`. Call this to use `torch.ones(2, device="jax")`,
  `t.to("jax")`, `model.jax()` there anyway: it warns (`CudaAutogradWarning`) that
  from now on this process cannot run torch's backward over CUDA tensors. Idempotent;
  on other machines the device is already named and this does nothing.
  """
  register(named=True)


def _name() -> None:
  with _lock:
    if _backend_name() == NAME:
      return
    if cuda_usable():
      warnings.warn(
        "bridge: the `jax` torch device is now registered by name in a process where torch "
        "can use a CUDA GPU. torch now takes `jax` for its accelerator, and its autograd "
        'engine cannot run a backward over CUDA tensors any more in this process ("INTERNAL '
        'ASSERT FAILED ... opt_ready_stream && opt_parent_stream", pytorch/pytorch#161129). '
        "Train CUDA models in another process, or use bridge without the device name "
        '(everything but the `"jax"` device strings works without it).',
        CudaAutogradWarning,
        stacklevel=3,
      )
    _bridge_autoload.name_backend()


_MODULE = _DeviceModule()


def _backend_name() -> str:
  """PrivateUse1's current name (`privateuseone` or `jax`), refusing a backend of another."""
  current = tensor.device_type()
  if current not in ("privateuseone", NAME):
    raise BridgeError(
      f"bridge: torch's PrivateUse1 backend is already taken by {current!r}, so the `jax` "
      "device cannot be registered. Only one out-of-tree backend can be loaded per process."
    )
  return current
