"""`torch_view` / `jax_view`: the same data seen from the other framework, without copying.

`torch_view(jax_array)` is a `bridge.Tensor` on the `jax` device whose storage is
the array itself; `jax_view(tensor)` is the JAX array inside a `bridge.Tensor`.
Views of views cancel: `jax_view(torch_view(a)) is a`. Both walk pytrees.
`torch_view(jax_fn)` is a torch-callable (see `call_jax`), `jax_view(torch_fn)` a
JAX-callable (see `call_torch`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import torch

from bridge._src import call_torch as call_torch_lib
from bridge._src import call_jax as call_jax_lib
from bridge._src import dtypes
from bridge._src import tensor as tensor_lib
from bridge._src import tracing
from bridge._src import tree as tree_lib
from bridge._src.arrays import array_to_tensor
from bridge._src.errors import BridgeTypeError


def torch_view(x: Any) -> Any:
  """Torch's view of JAX things: arrays become `jax`-device tensors, functions torch functions.

  Args:
    x: a JAX callable (returns a torch-callable wrapper, as `call_jax`), or a
      pytree whose `jax.Array` leaves become `bridge.Tensor`s sharing the array
      (no copy). Other leaves pass through.

  Example:
    >>> import jax.numpy as jnp, bridge
    >>> t = bridge.torch_view(jnp.arange(3.0))
    >>> t.device, (t * 2).tolist()
    (device(type='jax', index=0), [0.0, 2.0, 4.0])
  """
  if callable(x) and not isinstance(x, (jax.Array, torch.Tensor)):
    return call_jax_lib.torch_function(x)

  def leaf(v: Any, where: Any) -> Any:
    if isinstance(v, jax.Array):
      return array_to_tensor(v, lambda: f"leaf {where()}")
    return v

  return tree_lib.tree_map(leaf, x)


_NOTHING = object()
# 64-bit arrays, which JAX narrows when used while its 64-bit types are off (a 64-bit tensor
# in a 32-bit program holds a 32-bit array: that one is handed out)
_WIDE = frozenset(np.dtype(d) for d in ("int64", "uint64", "float64", "complex128"))


def jax_view(
  x: Any = _NOTHING,
  *,
  mode: tracing.Mode = "trace",
  vmap_method: tracing.VmapMethod | None = None,
  result_shape_dtypes: Any = None,
) -> Any:
  """JAX's view of `jax`-device tensors: the JAX arrays inside them, without copying.

  Args:
    x: a torch callable (function, `nn.Module`, bound method: returns a JAX-callable
      wrapper, as `call_torch`), or a pytree whose `bridge.Tensor` leaves become their
      JAX arrays. A torch tensor on another device is refused (use `bridge.to_jax`,
      which transfers). Without `x`, a decorator:
      `@bridge.jax_view(mode="callback", vmap_method="broadcast_all")`.
    mode: for a callable, as in `call_torch`.
    vmap_method: for a callable, as in `call_torch`.
    result_shape_dtypes: for a callable, as in `call_torch`.

  Example:
    >>> import torch, bridge
    >>> a = bridge.jax_view(torch.ones(2, device="jax"))
    >>> type(a).__name__, a.dtype
    ('ArrayImpl', dtype('float32'))
  """
  if x is _NOTHING:
    return lambda fn: jax_view(
      fn, mode=mode, vmap_method=vmap_method, result_shape_dtypes=result_shape_dtypes
    )
  if callable(x) and not isinstance(x, torch.Tensor):
    return call_torch_lib.jax_function(
      x, mode=mode, vmap_method=vmap_method, result_shape_dtypes=result_shape_dtypes
    )
  tracing.check_mode(mode, vmap_method, result_shape_dtypes, api="bridge.jax_view")
  if mode != "trace":
    raise BridgeTypeError(
      f"`bridge.jax_view`: `mode` applies to a torch callable, not to a {type(x).__name__}."
    )

  def leaf(v: Any, where: Any) -> Any:
    if isinstance(v, tensor_lib.Tensor):
      a = tensor_lib.value(v)
      if np.dtype(a.dtype) in _WIDE and not dtypes.x64_enabled():  # (as `to_jax` refuses it)
        dtypes.check_x64(
          v.dtype,
          api="bridge.jax_view",
          where=f"leaf {where()} (shape {tuple(v.shape)}, dtype {v.dtype}, device {v.device})",
        )
      return a
    if isinstance(v, torch.Tensor):
      raise BridgeTypeError(
        f"`bridge.jax_view`: leaf {where()} is a torch tensor on {v.device} (shape "
        f"{tuple(v.shape)}, dtype {v.dtype}), not on the `jax` device, so there is no JAX "
        "array to view. Transfer it with `bridge.to_jax(t)` or move it with `t.to('jax')`."
      )
    return v

  return tree_lib.tree_map(leaf, x)
