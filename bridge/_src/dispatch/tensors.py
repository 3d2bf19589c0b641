"""Tensors in and out of an op: one device per op, CPU scalars beside `jax` tensors, results
placed like their argument (or on the device a `_like`/`new_` op names), JAX results as
`bridge.Tensor`s, new zero-filled tensors.
"""

from __future__ import annotations

import math
import mmap
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from bridge._src import devices as device_lib
from bridge._src import dtypes, narrowing, scope, transfer
from bridge._src import tensor as tensor_lib
from bridge._src.dispatch.schema import aten, x64
from bridge._src.errors import DeviceMismatchError
from bridge._src.registry import REGISTRY
from bridge._src.tensor import Tensor, make
from bridge._src.transfer import ArrayImpl


_last_result: list[Any] = [None]


def wait_for_last_result() -> None:
  out = _last_result[0]
  if out is not None:
    jax.block_until_ready(out)


def device_error(a: Any, b: Any) -> DeviceMismatchError:
  return DeviceMismatchError(
    f"Expected all tensors to be on the same device, but found at least two devices, {a} and "
    f"{b}! Move them together first, e.g. `t.to('{a}')`."
  )


LIKE_OPS = frozenset(
  getattr(getattr(aten, name), overload)
  for name, overloads in (
    ("zeros_like", ("default",)),
    ("ones_like", ("default",)),
    ("empty_like", ("default",)),
    ("full_like", ("default",)),
    ("rand_like", ("default",)),
    ("randn_like", ("default",)),
    ("randint_like", ("default", "low_dtype")),
    ("new_zeros", ("default",)),
    ("new_ones", ("default",)),
    ("new_empty", ("default",)),
    ("new_full", ("default",)),
    ("new_empty_strided", ("default",)),
  )
  for overload in overloads
  if hasattr(getattr(aten, name, None), overload)
)


def made_elsewhere(func: Any, plan: Any, args: tuple, kwargs: dict) -> Any:
  """A `_like`/`new_` op (`LIKE_OPS`) given `device=`, `pin_memory=True` or `layout=`: its
  result where torch makes it (`plans` sends only such calls here; without them `plan`, the
  op's lowering, makes it where the input is).

  On the input's own device with a strided layout, `plan` makes it. Anywhere else torch's own
  kernel of the op makes it, on a CPU stand-in of the input that has what the op reads of it
  (dtype; for a `_like` op its size and strides too, over memory never touched): as for a CUDA
  tensor, `device="cpu"` gives a CPU tensor (a random op draws from torch's CPU generator, as
  `rand_like(x.cpu())`), "meta" a meta tensor, another `jax:i` one made by the device's
  factory kernels there, with torch's dtype, layout, memory format and strides, and its
  errors. Inside a trace a CPU result is what `torch.zeros(n, device="cpu")` makes there: a
  real tensor, a constant of the program where it meets traced ones (`scope`). torch sets
  `requires_grad=` on the result afterwards.
  """
  x = args[0]
  device = kwargs.get("device")
  target = x.device if device is None else torch.device(device)
  if target.type == tensor_lib.device_type():
    if kwargs.get("pin_memory"):  # (CUDA's `empty_cuda` check: only CPU memory is pinned)
      raise RuntimeError("Only dense CPU tensors can be pinned")
    layout = kwargs.get("layout")
    index = device_lib.device_index(target)
    if index == x.device.index and (layout is None or layout is torch.strided):
      return plan(args, kwargs)
    kwargs = {**kwargs, "device": tensor_lib.jax_device(index)}
  # (a CPU tensor, so that torch's C++ kernels of the op run, as they do for a CUDA tensor; a
  # meta one would run its Python meta kernels, whose strides and errors differ)
  if func in _READ_GEOMETRY:
    stand_in = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype)
  else:
    stand_in = torch.empty(0, dtype=x.dtype)
  return func(stand_in, *args[1:], **kwargs)


# (the `_like` ops, whose result has the input's size and, by default, its memory format)
_READ_GEOMETRY = frozenset(f for f in LIKE_OPS if f.__name__.split(".")[0].endswith("_like"))


def placed_like(out: Any, like: Any) -> Any:
  """A `_like`/`new_` op's result, put where its argument is when that spans several devices:
  the same layout for the same shape, else replicated over the argument's mesh."""
  sharding = like.sharding
  if len(sharding.device_set) == 1:
    return out
  if tuple(out.shape) != tuple(like.shape):
    if not isinstance(sharding, jax.sharding.NamedSharding):
      return out
    sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
  return jax.device_put(out, sharding)


def scalar_from_cpu(t: torch.Tensor) -> Any:
  """A CPU tensor torch allows beside device tensors (0-dim values, index tensors)."""
  t, bound = narrowing.known(t.detach(), f"a {t.dtype} CPU tensor (shape {tuple(t.shape)})")
  with x64():
    a = transfer.tensor_to_jax(t.contiguous(), api="the jax device", where=lambda: "a CPU tensor")
    if device_lib.jax_devices()[0].platform != "cpu":
      # (on JAX's CPU device, committed there: beside GPU arrays, an uncommitted copy that
      # JAX places with the op's other arguments)
      a = jax.device_put(np.asarray(a))
  return a if bound is None else narrowing.track(a, bound)


def wrap(out: Any, device: torch.device) -> Any:
  """JAX results -> `bridge.Tensor`s (tuples, lists and None kept)."""
  if type(out) is ArrayImpl:
    _last_result[0] = out
    if device.index:  # (jax:0's arrays are where JAX puts a result by default)
      out = _on_device(out, device.index)
    return tensor_lib.make_result(out, device)
  if isinstance(out, (tuple, list)):
    return (list if isinstance(out, list) else tuple)(wrap(o, device) for o in out)
  if out is None or not hasattr(out, "dtype"):
    return out
  if not isinstance(out, jax.core.Tracer):  # a tracer must not outlive its trace here
    _last_result[0] = out
  return make(out, device)


def _on_device(out: Any, index: int) -> Any:
  """A result on one JAX device moved to `jax:index`'s, the device its tensor says it is on:
  JAX puts a result that depends on no committed input (`zeros_like(x)`, `x.zero_()`'s
  zeros, `torch.ones(n, device="jax:1")`'s fill: values from shapes and Python scalars) on
  its default device, whatever device the op's tensors are on. (A result over several devices
  is left where it is: `placed_like`.)"""
  devices = out.sharding.device_set
  if len(devices) == 1 and device_lib.jax_devices()[index] not in devices:
    return jax.device_put(out, device_lib.jax_devices()[index])
  return out


_MOVED = "bridge.moved_from"  # an autograd node's metadata: its outputs' placements, by number


def remember_placement(src: Any, array: Any) -> None:
  """Note the placement of `src` (its value `array`), a tensor being moved to another device
  (`t.cpu()`, `t.to("jax:1")`) while autograd records, where it spans several devices: the
  gradient of the move then comes back placed so (`moved_placement`), not on its `jax:0`
  alone, where it would meet the sharded tensors of `src`'s graph. A leaf's placement is read
  from the leaf itself."""
  if type(array) is not ArrayImpl or len(array.sharding.device_set) == 1:
    return
  if src.requires_grad and torch.is_grad_enabled() and src.grad_fn is not None:
    metadata: Any = src.grad_fn.metadata  # (a dict the node keeps)
    metadata.setdefault(_MOVED, {})[src.output_nr] = array.sharding


def moved_placement() -> Any:
  """In the backward of a device move (torch's `ToCopyBackward0`) whose source spans several
  devices: that source's placement, which its gradient takes; else None."""
  if torch._C._current_graph_task_id() == -1:
    return None
  node = torch._C._current_autograd_node()
  if node is None or node.name() != "ToCopyBackward0":
    return None
  source, number = node.next_functions[0]
  if source is None:
    return None
  leaf = getattr(source, "variable", None)  # (an AccumulateGrad node: the leaf itself)
  if leaf is not None:
    array = leaf._storage.array if type(leaf) is Tensor and leaf._whole else None
    if type(array) is ArrayImpl and len(array.sharding.device_set) > 1:
      return array.sharding
    return None
  metadata: Any = source.metadata
  return metadata.get(_MOVED, {}).get(number)


def new_zeros(size: tuple, dtype: Any, device: Any) -> Tensor:
  """A new zero-filled tensor (what `empty` gives on the jax device)."""
  REGISTRY.require_plugins()
  dtype = dtype or torch.get_default_dtype()
  index = device_lib.device_index(device)
  wide = dtype
  dtype = narrowing.narrow_dtype(dtype, f"a new {dtype} tensor")
  jdtype = dtypes.jax_dtype(dtype, api="torch.empty", where="the requested dtype")
  target = device_lib.jax_devices()[index]
  with x64():
    if not scope.staged():
      # (the tensor a device move's gradient is copied into: placed as the moved tensor)
      array = jax.device_put(_host_zeros(size, jdtype), moved_placement() or target)
    elif math.prod(size) <= FOLD_MAX:
      # a known value while a program is staged (see `fold`): made by NumPy, not compiled
      with jax.ensure_compile_time_eval():
        array = jax.device_put(np.zeros(size, jdtype), target)
    else:
      array = jnp.zeros(size, jdtype)
      array = jax.device_put(array, target) if index else array
  if dtype is not wide:  # an int64 tensor in a 32-bit program: its zeros fit (`narrowing`)
    narrowing.track(array, 0)
  return make(array, tensor_lib.jax_device(index), dtype)


def _host_zeros(size: tuple, dtype: np.dtype) -> np.ndarray:
  """Zeros in a 64-byte aligned NumPy buffer, which a CPU device takes without copying.

  `empty` (and so `tensor.to("jax")`, `module.to("jax")`, whose `copy_` then replaces the
  array) costs an allocation, not an XLA compile per new shape (tens of milliseconds
  each). A large buffer is a fresh anonymous mapping: its zero pages are not written
  until used, where `np.zeros` would clear recycled heap memory (a pass over all of it).
  """
  dtype = np.dtype(dtype)
  nbytes = math.prod(size) * dtype.itemsize
  if nbytes >= _MAP_BYTES:
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype).reshape(size)  # page-aligned
  raw = np.zeros(nbytes + transfer._ALIGNMENT, np.uint8)
  start = -raw.ctypes.data % transfer._ALIGNMENT
  return raw[start : start + nbytes].view(dtype).reshape(size)


_MAP_BYTES = 1 << 20


FOLD_MAX = 4096  # elements: larger known values stay computations of the program


def factory_device(kwargs: dict) -> torch.device:
  return tensor_lib.jax_device(device_lib.device_index(kwargs.get("device")))
