"""The lowering registry: aten overload -> JAX function, filled by plugins.

The core ships no lowering. Plugins (the `bridge-ops` distribution first) are
found through the `bridge.lowerings` entry points (`bridge._src.plugins`) and
loaded the first time an op needs a lowering; each plugin's `register(registry)`
calls `Registry.register` once per overload.

The lowering contract (registry API version 1):

* A lowering is called with the aten overload's arguments as torch passed them,
  positional and keyword, except that tensors are JAX arrays (or tracers).
  `Scalar`, `float` and `complex` arguments (and lists of them) arrive as Python
  numbers or 0-d weakly typed JAX values (they are traced so that a changing
  value does not recompile), unless named in `static_argnames`; never branch in
  Python on them. `int`, `int[]`, `bool`, `str`, dtype, layout, device and
  memory-format arguments are plain Python values.
* It returns a JAX array, or a tuple/list of them, as the schema's returns.
  The core casts results to the dtype torch's own meta kernel gives, and checks
  their shapes, so a lowering cannot silently change torch's semantics.
* Register functional overloads: the core derives in-place (`add_`) and `out=`
  variants. An overload that exists only in a mutating form (`normal_`,
  `fill_`, ...) may be registered directly; its lowering returns the new value
  of the mutated argument.
* `random=True`: the lowering gets a fresh JAX PRNG key as keyword `key`, split
  from the device generator that `torch.manual_seed` seeds.
* `dynamic_shape=True`: the output shape depends on values (`nonzero`); the
  lowering then runs eagerly on concrete arrays instead of under `jit`.
  `dynamic_shape="bool_inputs"`: only when a bool (or uint8) tensor is among the inputs
  (advanced indexing with a mask); otherwise the lowering is jitted as usual.
"""

from __future__ import annotations

import dataclasses
import threading
import types
from typing import Any, Callable, Literal, Mapping

import numpy as np
import torch

from bridge._src import dtypes, plugins
from bridge._src.errors import PluginError, RegistrationError

REGISTRY_API_VERSION = 1


# Whether a lowering's output shape depends on values: never (False), always (True), or only
# when a bool (or uint8) tensor is among its inputs ("bool_inputs"); see the module docstring.
DynamicShape = bool | Literal["bool_inputs"]

# The core's torch -> JAX dtype map, read-only, as `Registry.dtypes` hands it to plugins.
_DTYPES: Mapping[torch.dtype, np.dtype] = types.MappingProxyType(dtypes.TORCH_TO_JAX)


@dataclasses.dataclass(frozen=True)
class Lowering:
  """One registered lowering and how to call it."""

  op: torch._ops.OpOverload
  fn: Callable[..., Any]
  random: bool = False
  static_argnames: frozenset[str] = frozenset()
  dynamic_shape: DynamicShape = False
  source: str = ""  # who registered it (plugin name or "user")
  # Traced with `jax.disable_jit()` on (its plugin declares `TRACE_JIT_FREE`; see
  # `dispatch.executable.Executable`): jnp's jitted helpers trace inline instead of as nested programs.
  jit_free: bool = False


def _overloads(op: Any) -> list[torch._ops.OpOverload]:
  if isinstance(op, torch._ops.OpOverload):
    return [op]
  if isinstance(op, torch._ops.OpOverloadPacket):
    return [
      getattr(op, name) for name in op.overloads() if not getattr(op, name)._schema.is_mutable
    ]
  raise RegistrationError(
    f"bridge: lowerings are registered for aten overloads (e.g. `torch.ops.aten.add.Tensor`) "
    f"or packets (`torch.ops.aten.add`), got {op!r} of type {type(op).__name__}."
  )


class Registry:
  """aten overload -> `Lowering`; plugins are loaded on first use."""

  def __init__(self) -> None:
    self._table: dict[torch._ops.OpOverload, Lowering] = {}
    self._lock = threading.RLock()
    self._loaded = False
    self.plugins: list[plugins.PluginInfo] = []
    self._source = "user"
    self._jit_free = False  # the plugin being registered declares `TRACE_JIT_FREE`

  def register(
    self,
    op: Any,
    fn: Callable[..., Any],
    *,
    override: bool = False,
    random: bool = False,
    static_argnames: tuple[str, ...] = (),
    dynamic_shape: DynamicShape = False,
  ) -> None:
    """Registers `fn` as the lowering of `op` (an overload, or every functional overload of a packet)."""
    with self._lock:
      for overload in _overloads(op):
        old = self._table.get(overload)
        if old is not None and not override:
          raise RegistrationError(
            f"bridge: {overload} already has a lowering ({old.fn.__module__}."
            f"{old.fn.__qualname__}, from {old.source}); registering "
            f"{fn.__module__}.{fn.__qualname__} would replace it. Pass `override=True` "
            "to replace it on purpose."
          )
        self._table[overload] = Lowering(
          overload,
          fn,
          random,
          frozenset(static_argnames),
          dynamic_shape,
          self._source,
          self._jit_free,
        )

  @property
  def dtypes(self) -> Mapping[torch.dtype, np.dtype]:
    """torch dtype -> JAX dtype, the core's exact correspondence (read-only): a plugin takes it
    in `register(registry)` instead of keeping a copy of its own."""
    return _DTYPES

  def lookup(self, op: torch._ops.OpOverload) -> Lowering | None:
    """The lowering of `op`, loading the plugins first if they are not loaded yet."""
    if not self._loaded:
      self.load_plugins()
    return self._table.get(op)

  def __contains__(self, op: torch._ops.OpOverload) -> bool:
    return self.lookup(op) is not None

  def __len__(self) -> int:
    return len(self._table)

  def load_plugins(self) -> None:
    """Loads every `bridge.lowerings` plugin once (raises `PluginError` on a bad one)."""
    with self._lock:
      if self._loaded:
        return
      found = plugins.discover()
      for info in found:
        self._source = f"plugin {info.name!r} ({info.distribution} {info.version})"
        self._jit_free = getattr(info.module, "TRACE_JIT_FREE", False) is True
        try:
          info.module.register(self)
        finally:
          self._source, self._jit_free = "user", False
      self.plugins = found
      self._loaded = True

  def require_plugins(self) -> None:
    """Raise a clear error when no lowering plugin is installed."""
    self.load_plugins()
    if not self.plugins:
      raise PluginError(
        "bridge: no lowering plugin is installed, so ops on the `jax` device have nothing to "
        "run. Install the standard one: `pip install bridge-ops` (from this repository: "
        "`pip install -e ./bridge_ops`). Transfers and `call_jax` work without it."
      )


REGISTRY = Registry()


def register_lowering(
  *ops: Any,
  override: bool = False,
  random: bool = False,
  static_argnames: tuple[str, ...] = (),
  dynamic_shape: DynamicShape = False,
) -> Callable[[Callable], Callable]:
  """Registers the decorated JAX function as the lowering of aten `ops` on the `jax` device.

  Example:
    >>> import torch, jax.numpy as jnp, bridge
    >>> @bridge.register_lowering(torch.ops.aten.hypot.default, override=True)
    ... def hypot(self, other):
    ...   return jnp.hypot(self, other)
  """

  def decorate(fn: Callable) -> Callable:
    for op in ops:
      REGISTRY.register(
        op,
        fn,
        override=override,
        random=random,
        static_argnames=static_argnames,
        dynamic_shape=dynamic_shape,
      )
    return fn

  return decorate
