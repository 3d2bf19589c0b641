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
import numpy as np
import torch
import torch.autograd.forward_ad as _fwd_ad
from jax._src import xla_bridge

import _bridge_autoload

from bridge._src import autocast
from bridge._src import rng
from bridge._src import tensor
from bridge._src.devices import current_device, device, device_count, is_available, set_device
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
  del device
  box = rng.current_box()
  if box is not None:
    return tensor.make(rng.raw(box.key), torch.device(tensor.device_type()), torch.uint32)
  return torch.from_numpy(np.frombuffer(rng.get_state(), dtype=np.uint8).copy())


def set_rng_state(new_state: torch.Tensor, device: Any = None) -> None:
  """Restore a state `get_rng_state` gave (a block's key inside a `bridge.rng_key` block)."""
  del device
  box = rng.current_box()
  if box is not None and type(new_state) is tensor.Tensor and new_state.dtype == torch.uint32:
    data = tensor.value(new_state)
    box.key = rng.typed(data) if jax.dtypes.issubdtype(box.key.dtype, jax.dtypes.prng_key) else data
    return
  rng.set_state(new_state.cpu().numpy().tobytes())


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
  del layout, pin_memory, memory_format
  return new_zeros(_sizes(size), dtype, device)


def _empty_strided(
  size: Any,
  stride: Any,
  dtype: Any = None,
  layout: Any = None,
  device: Any = None,
  pin_memory: Any = None,
) -> torch.Tensor:
  del stride, layout, pin_memory  # jax tensors are created contiguous
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
# recording them (in reverse or forward mode) and a lowering exists, they run as one op.
_WHOLE_WHEN_NOT_RECORDING = ("linear", "matmul")
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
    "empty": _empty,
    "empty_strided": _empty_strided,
    "copy_from": _copy_from,
    "local_scalar_dense": _local_scalar_dense,
    "no_quantized": _no_quantized,
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
