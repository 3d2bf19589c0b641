"""The JAX devices behind the `jax` torch device: `jax:i` is the default backend's i-th local
device, and each thread has a current one (`set_device`, the `device` context manager).

The foundation that the rest of the core places arrays with; `bridge._src.device` serves these
functions to torch as the device module (`torch.jax`).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import jax
import torch

import _bridge_autoload
from bridge._src import tensor as tensor_lib
from bridge._src.errors import TransferError


@functools.cache
def jax_devices() -> tuple[Any, ...]:
  """The JAX devices behind `jax:0`, `jax:1`, ...: the default backend's local devices.

  Found, torch's autograd engine learns whether it must run backward passes on the calling
  thread (`_bridge_autoload._Engine`): where there are more of them than the engine has device
  threads (the most devices a torch device guard reports: 1 for the `jax` device, which torch
  lets no Python backend change, or CUDA's count)."""
  found = tuple(jax.local_devices())
  _bridge_autoload.ENGINE[1] = len(found) > max(1, torch.cuda.device_count())
  return found


def place(a: jax.Array, index: int) -> jax.Array:
  """`a` (a concrete array) on the JAX device behind `jax:index`: moved only if it is not there."""
  target = jax_devices()[index]
  return a if next(iter(a.sharding.device_set)) == target else jax.device_put(a, target)


def device_index(device: Any) -> int:
  """The index of a torch `device` of type jax, checked against the JAX devices."""
  index = (
    0
    if device is None
    else (device.index if isinstance(device, torch.device) else torch.device(device).index)
  )
  index = current_device() if index is None else index
  n = len(jax_devices())
  if not 0 <= index < n:
    raise TransferError(
      f"bridge: device jax:{index} does not exist; this process has {n} JAX device(s) "
      f"(jax:0 to jax:{n - 1}: {list(jax_devices())}). Pick one of those indices."
    )
  return index


_state = threading.local()


def is_available() -> bool:
  """Whether the `jax` device can be used (JAX sees at least one device)."""
  try:
    return len(jax_devices()) > 0
  except RuntimeError:
    return False


def device_count() -> int:
  """The number of `jax` devices (`jax:0` ... `jax:{n-1}`): JAX's local devices."""
  return len(jax_devices())


def current_device() -> int:
  """The index of the current `jax` device (0 unless `set_device` changed it in this thread)."""
  return getattr(_state, "index", 0)


def set_device(device: Any) -> None:
  """Make `device` (an index or `jax:i`) the current `jax` device of this thread."""
  _state.index = device_index(
    device if not isinstance(device, int) else torch.device(tensor_lib.device_type(), device)
  )


class device:  # (lowercase, as torch's device modules spell it: `torch.cuda.device`)
  """Context manager that makes `jax:i` the current `jax` device of this thread."""

  def __init__(self, device: Any):
    self.index = device_index(
      torch.device(tensor_lib.device_type(), device) if isinstance(device, int) else device
    )

  def __enter__(self) -> None:
    self.prev = current_device()
    _state.index = self.index

  def __exit__(self, *exc: Any) -> None:
    _state.index = self.prev
