"""Placements in messages and checks: how a sharding is described, and whether JAX can use it
for an array of a given shape. Below dispatch (its placement errors) and `bridge.shard`.
"""

from __future__ import annotations

import math
from typing import Any

import jax

from bridge._src.errors import ShardingError

API = "bridge.shard"


def describe(sharding: Any) -> str:
  """A short description of a sharding, for messages: its mesh axes and partition spec."""
  if isinstance(sharding, jax.sharding.NamedSharding):
    axes = ", ".join(f"{n}={s}" for n, s in sharding.mesh.shape.items())
    return f"NamedSharding(mesh {{{axes}}}, spec {sharding.spec})"
  devices = sorted(d.id for d in sharding.device_set)
  return f"{type(sharding).__name__} over devices {devices}"


def placement_lines(named: Any, *, distinct: bool = False) -> list[str]:
  """`  name: shape ..., <sharding>, devices [...]` for each (name, array) with a sharding (an
  error message's listing); with `distinct`, only the first array on each set of devices."""
  lines, seen = [], set()
  for name, a in named:
    devices = devices_of(a)
    if devices is None or (distinct and devices in seen):
      continue
    seen.add(devices)
    lines.append(
      f"  {name}: shape {tuple(a.shape)}, {describe(a.sharding)}, devices {list(devices)}"
    )
  return lines


def devices_of(a: Any) -> tuple[int, ...] | None:
  """The ids of the devices an array is on, sorted (None: not a placed array)."""
  sharding = getattr(a, "sharding", None)
  if sharding is None or not hasattr(sharding, "device_set"):
    return None
  return tuple(sorted(d.id for d in sharding.device_set))


def check_devices(sharding: Any, what: str, api: str = API) -> None:
  """Refuse a sharding over no devices (an abstract mesh) or over devices JAX does not have."""
  mesh = getattr(sharding, "mesh", None)
  if mesh is not None and isinstance(mesh, jax.sharding.AbstractMesh):
    raise ShardingError(
      f"`{api}`: the sharding for {what} is over an `AbstractMesh` {dict(mesh.shape)}, which "
      "has no devices to hold data. Build the mesh from devices: `jax.make_mesh(...)` or "
      "`Mesh(np.array(jax.devices()).reshape(...), axis_names)`."
    )
  known = {d.id: d for d in jax.devices()}
  missing = sorted(d.id for d in sharding.device_set if known.get(d.id) is not d)
  if missing:
    raise ShardingError(
      f"`{api}`: the sharding for {what} ({describe(sharding)}) uses devices {missing}, which "
      f"this JAX does not have (it has {len(known)}: {sorted(known)}). Build the mesh from "
      "`jax.devices()`."
    )


def check_divides(shape: tuple, sharding: Any, what: str, api: str = API) -> None:
  """Refuse a sharding this JAX cannot use, or whose mesh axes do not divide the dimensions
  they split."""
  if not isinstance(sharding, jax.sharding.NamedSharding):
    check_devices(sharding, what, api)
    return
  spec = tuple(sharding.spec)
  if len(spec) > len(shape):
    raise ShardingError(
      f"`{api}`: {what} has shape {tuple(shape)} ({len(shape)} dimensions), but the "
      f"sharding {describe(sharding)} partitions {len(spec)} dimensions."
    )
  for dim, axes in enumerate(spec):
    if axes is None:
      continue
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    unknown = [n for n in names if n not in sharding.mesh.shape]
    if unknown:
      raise ShardingError(
        f"`{api}`: the sharding for {what} names mesh axis {unknown[0]!r}, but the mesh "
        f"has axes {tuple(sharding.mesh.shape)}."
      )
    parts = math.prod(sharding.mesh.shape[n] for n in names)
    if shape[dim] % parts:
      raise ShardingError(
        f"`{api}`: {what} has shape {tuple(shape)}; its dimension {dim} ({shape[dim]}) "
        f"cannot be split {parts} ways over mesh axis {'x'.join(names)} of "
        f"{describe(sharding)}. Pad it to a multiple of {parts}, or shard another "
        "dimension (or replicate it: `PartitionSpec()`)."
      )
  check_devices(sharding, what, api)
