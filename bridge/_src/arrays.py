"""JAX arrays and tracers seen as `bridge.Tensor`s, without a copy: what torch code traced into
a JAX program gets for its inputs (`call_torch`, custom autograd Functions, module state).
"""

from __future__ import annotations

from typing import Any, Callable

import jax

from bridge._src import devices as device_lib
from bridge._src import dtypes
from bridge._src import narrowing
from bridge._src import scope
from bridge._src import tensor as tensor_lib


def array_to_tensor(
  a: Any, where: Callable[[], str], api: str = "bridge.torch_view"
) -> tensor_lib.Tensor:
  """A `bridge.Tensor` holding the JAX array or tracer `a` (no copy)."""
  dtype = dtypes.torch_dtype(a.dtype, api=api, where=where())
  if dtype in dtypes.NARROWED and scope.is_staged() and not dtypes.x64_enabled():
    a = narrowing.enter(a, where())  # (a 32-bit program: it must fit, or is refused)
  index = 0
  if not isinstance(a, jax.core.Tracer):
    devices = a.sharding.device_set
    if len(devices) == 1:
      (dev,) = devices
      jax_devices = device_lib.jax_devices()
      index = jax_devices.index(dev) if dev in jax_devices else 0
  return tensor_lib.make(a, tensor_lib.jax_device(index), dtype)
