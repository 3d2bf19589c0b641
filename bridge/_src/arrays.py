"""JAX arrays and tracers seen as `bridge.Tensor`s, without a copy: what torch code traced into
a JAX program gets for its inputs (`call_torch`, custom autograd Functions, module state).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from bridge._src import devices as device_lib
from bridge._src import dtypes
from bridge._src import narrowing
from bridge._src import scope
from bridge._src import tensor as tensor_lib
from bridge._src import transfer
from bridge._src.errors import BridgeTypeError, TransferError


def array_to_tensor(
  a: Any, where: Callable[[], str], api: str = "bridge.torch_view"
) -> tensor_lib.Tensor:
  """A `bridge.Tensor` holding the JAX array or tracer `a` (no copy). A NumPy array is
  taken as `jax.jit` takes one (made a JAX array; a 64-bit one refused where JAX would narrow
  it); anything else that is not an array raises, naming it."""
  if isinstance(a, (np.ndarray, np.generic)):
    transfer.check_numpy_x64(a, api=api, where=where)
    a = jnp.asarray(a)
  elif not isinstance(a, (jax.Array, jax.core.Tracer)):
    fix = (
      " (a torch tensor: convert it with `bridge.to_jax`)" if isinstance(a, torch.Tensor) else ""
    )
    raise BridgeTypeError(
      f"`{api}`: {where()} is a {type(a).__module__}.{type(a).__qualname__}, not a JAX "
      f"array{fix}. Pass JAX arrays, as `extract_jax` returns them."
    )
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


def tensor_to_array(
  t: torch.Tensor, copy: bool | None, api: str, where: Callable[[], str]
) -> jax.Array:
  """`bridge.to_jax` of a `jax`-device tensor: the JAX array it holds, with its placement (a
  whole tensor's is its storage's array itself: no copy), or a view's elements gathered into a
  new array (JAX arrays have no views: `copy=False` refuses one); `copy=True`: a copy."""
  if copy is False and not t._whole:  # type: ignore[attr-defined]
    raise TransferError(
      f"`{api}`: {where()} (shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}) is a "
      "view of a `jax` tensor's storage: a JAX array cannot be a view, so its elements must "
      "be gathered into a new array. Pass copy=None (the default)."
    )
  a = tensor_lib.value(t.detach())  # type: ignore[arg-type]
  return jnp.array(a, copy=True) if copy else a


# (`transfer.tensor_to_jax` hands `jax` tensors here: it cannot import this layer)
transfer.own_device = (tensor_lib.device_type(), tensor_to_array)
