"""Sharded torch tensors: JAX's shardings applied to the arrays inside `bridge.Tensor`s.

The bridge has no distribution of its own. `shard(x, sharding)` places torch
tensors, JAX arrays, pytrees of them, or a module's parameters and buffers with
a `jax.sharding.Sharding` (a `NamedSharding` over a `Mesh`, usually); the
tensors stay `jax`-device tensors whose arrays are sharded, so eager ops,
`bridge.compile` and `call_torch` under `jax.jit` run as GSPMD programs over the
mesh. `constrain(t, sharding)` is `jax.lax.with_sharding_constraint` for torch
code.
"""

from __future__ import annotations

from typing import Any, Callable, Union

import jax
import numpy as np
import torch

from bridge._src import devices as device_lib
from bridge._src import tensor as tensor_lib
from bridge._src import transfer
from bridge._src import tree as tree_lib
from bridge._src.errors import BridgeTypeError, ShardingError
from bridge._src.module_state import module_state
from bridge._src.placement import check_divides

API = "bridge.shard"

ShardingSpec = Union[jax.sharding.Sharding, Callable[[str, Any], Any]]


def _sharding_for(spec: ShardingSpec, name: str, leaf: Any, what: str | None = None) -> Any:
  if callable(spec) and not isinstance(spec, jax.sharding.Sharding):
    try:
      sharding = spec(name, leaf)
    except Exception as e:  # (said again with the tensor's name)
      raise ShardingError(
        f"`{API}`: the sharding rule failed for {what or name} (shape "
        f"{tuple(leaf.shape)}): {type(e).__name__}: {e}"
      ) from e
  else:
    sharding = spec
  if sharding is not None and not isinstance(sharding, jax.sharding.Sharding):
    raise BridgeTypeError(
      f"`{API}`: the sharding for {name} is a {type(sharding).__name__}; expected a "
      "`jax.sharding.Sharding` (e.g. `NamedSharding(mesh, PartitionSpec(...))`) or None."
    )
  return sharding


def _place_array(a: Any, sharding: Any, what: str) -> jax.Array:
  check_divides(tuple(a.shape), sharding, what)
  if not sharding.is_fully_addressable and getattr(a, "is_fully_addressable", False):
    # A mesh over several processes: each process holds the same host value and places its
    # own shards (JAX does not move a committed local array across hosts).
    a = np.asarray(a)
  return jax.device_put(a, sharding)


def _place_tensor(t: torch.Tensor, sharding: Any, what: str) -> torch.Tensor:
  """`t` placed with `sharding`. A leaf (a parameter being placed) comes back a leaf, with its
  `requires_grad`; a tensor computed with gradients keeps its graph (`_Place`)."""
  if t.requires_grad and not t.is_leaf:
    if torch.is_grad_enabled():
      return _Place.apply(t, sharding, what)
    return _placed(t.detach(), sharding, what)  # (as any op's result under `no_grad`)
  out = _placed(t.detach(), sharding, what)
  if t.requires_grad:
    out.requires_grad_(True)
  return out


def _placed(t: torch.Tensor, sharding: Any, what: str) -> tensor_lib.Tensor:
  if isinstance(t, tensor_lib.Tensor):
    array = tensor_lib.value(t)
  else:
    with jax.enable_x64(True):  # exact dtypes: 64-bit stays 64-bit
      array = transfer.tensor_to_jax(t, copy=True, api=API, where=lambda: what)
  with jax.enable_x64(True):
    placed = _place_array(array, sharding, what)
  return tensor_lib.make(placed, _torch_device(sharding), t.dtype)


def _torch_device(sharding: Any) -> torch.device:
  """The `jax:i` of a tensor placed with `sharding`: the device it names when it names one
  (a `SingleDeviceSharding`, a mesh of one device), else `jax:0`, as every tensor spanning
  several devices."""
  devices = sharding.device_set
  if len(devices) == 1:
    (device,) = devices
    local = device_lib.jax_devices()
    if device in local:
      return tensor_lib.jax_device(local.index(device))
  return tensor_lib.jax_device(0)


class _Place(torch.autograd.Function):
  """`bridge.shard` of a tensor computed with gradients: differentiable, its gradient placed
  back where the tensor was (its device, its sharding)."""

  @staticmethod
  def forward(ctx: Any, t: torch.Tensor, sharding: Any, what: str) -> torch.Tensor:
    ctx.device, ctx.sharding = (
      t.device,
      sharding_of(t) if isinstance(t, tensor_lib.Tensor) else None,
    )
    return _placed(t.detach(), sharding, what)

  @staticmethod
  def backward(ctx: Any, grad: torch.Tensor) -> tuple:
    if ctx.sharding is None or not isinstance(grad, tensor_lib.Tensor):
      return grad.to(ctx.device), None, None
    return _Place.apply(grad, ctx.sharding, "the gradient"), None, None


def shard(x: Any, sharding: ShardingSpec, /) -> Any:
  """Places `x` with a JAX sharding: a module's state, a tensor, an array, or a pytree of them.

  `sharding` is one `jax.sharding.Sharding` for everything, or a function
  `(name, tensor) -> Sharding | None` choosing one per tensor (its state-dict
  name for a module, its pytree path otherwise; None leaves it where it is).

  * A module: its parameters and buffers become `jax`-device tensors holding
    sharded arrays, in place (as `module.to("jax")` does), so a torch optimizer
    made afterwards, `bridge.compile(module)` and eager calls all run over the mesh.
    Returns the module.
  * A torch tensor becomes a `jax`-device tensor holding a sharded array (a copy:
    the original is untouched); a JAX array is `jax.device_put`.

  Every named sharding is checked first: a mesh axis that does not divide the
  dimension it splits raises `ShardingError` naming the tensor and the mesh.

  Example:
    >>> import jax, numpy as np, torch, bridge
    >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    >>> mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    >>> model = bridge.shard(torch.nn.Linear(4, 2), NamedSharding(mesh, P()))
    >>> model.weight.device.type
    'jax'
  """
  if isinstance(x, torch.nn.Module):
    return _shard_module(x, sharding)
  leaves, spec = tree_lib.flatten(x)
  paths: list[str] = []

  def name(i: int) -> str:
    if not paths:
      paths.extend(tree_lib.leaf_paths(x))
    return f"leaf {paths[i]}" if paths[i] else "the tensor"

  out = []
  for i, leaf in enumerate(leaves):
    if isinstance(leaf, (torch.Tensor, jax.Array)):
      s = _sharding_for(sharding, name(i), leaf)
      if s is not None:
        leaf = (
          _place_tensor(leaf, s, name(i))
          if isinstance(leaf, torch.Tensor)
          else _place_array(leaf, s, name(i))
        )
    out.append(leaf)
  return tree_lib.unflatten(spec, out)


def _shard_module(module: torch.nn.Module, sharding: ShardingSpec) -> torch.nn.Module:
  state = module_state(module)
  names: dict[int, str] = {}
  plan: dict[int, Any] = {}
  for n, t in state.items():  # check every placement before changing anything
    s = _sharding_for(sharding, n, t, f"{type(module).__name__}.{n}")
    if s is None:
      continue
    check_divides(tuple(t.shape), s, f"{type(module).__name__}.{n}")
    names[id(t)], plan[id(t)] = n, s
    if t.grad is not None:  # a gradient goes where its parameter goes
      names[id(t.grad)], plan[id(t.grad)] = f"{n}.grad", s
  # Where each tensor sits, to tie shared weights again afterwards: `Module._apply` gives
  # each module its own new Parameter for a tensor type like the `jax` tensor's.
  places: dict[int, list[tuple[torch.nn.Module, str]]] = {}
  for sub in module.modules():
    for attr, held in list(sub._parameters.items()) + list(sub._buffers.items()):
      if held is not None and id(held) in plan:
        places.setdefault(id(held), []).append((sub, attr))
  done: dict[int, torch.Tensor] = {}

  def place(t: torch.Tensor) -> torch.Tensor:
    s = plan.get(id(t))
    if s is None:
      return t
    if id(t) not in done:
      done[id(t)] = _place_tensor(t, s, f"{type(module).__name__}.{names[id(t)]}").detach()
    return done[id(t)]

  module._apply(place)
  for owners in places.values():
    if len(owners) > 1:  # a tied weight: one tensor again, under every name
      first, attr = owners[0]
      shared = getattr(first, attr)
      for sub, other in owners[1:]:
        table = sub._parameters if other in sub._parameters else sub._buffers
        table[other] = shared
  return module


def constrain(t: torch.Tensor, sharding: jax.sharding.Sharding) -> torch.Tensor:
  """`jax.lax.with_sharding_constraint` for torch code: `t` laid out with `sharding`.

  Inside a traced program (`call_torch`, `bridge.compile`) it tells GSPMD how `t`
  must be sharded at this point; on eager `jax` tensors it moves the data there.
  Differentiable (the gradient is constrained the same way).
  """
  if not isinstance(t, tensor_lib.Tensor):
    raise BridgeTypeError(
      f"`bridge.constrain`: expected a tensor on the `jax` device, got one on {t.device} "
      "(shardings apply to JAX arrays: move it with `bridge.shard` or `.to('jax')`)."
    )
  return _Constrain.apply(t, sharding)


def _constrained(t: tensor_lib.Tensor, sharding: Any) -> torch.Tensor:
  a = tensor_lib.value(t)
  check_divides(tuple(a.shape), sharding, "the tensor", api="bridge.constrain")
  if isinstance(a, jax.core.Tracer):
    out = jax.lax.with_sharding_constraint(a, sharding)
  else:
    out = jax.device_put(a, sharding)
  return tensor_lib.make(out, t.device, t.dtype)


class _Constrain(torch.autograd.Function):
  @staticmethod
  def forward(ctx: Any, t: tensor_lib.Tensor, sharding: Any) -> torch.Tensor:
    ctx.sharding = sharding
    return _constrained(t, sharding)

  @staticmethod
  def backward(ctx: Any, grad: torch.Tensor) -> tuple:
    if isinstance(grad, tensor_lib.Tensor):
      grad = _constrained(grad, ctx.sharding)
    return grad, None


def sharding_of(t: Any) -> Any:
  """The sharding of a `jax`-device tensor's array (None for a traced value)."""
  a = tensor_lib.value(t) if isinstance(t, tensor_lib.Tensor) else t
  return None if isinstance(a, jax.core.Tracer) else getattr(a, "sharding", None)
