"""The environment: bridge's configuration as a value, changed by stacking context managers.

`bridge.config(debug_print_each_op=True)` is a context manager: entering it makes
a new configuration current (in this thread and async task), leaving it restores
the previous one, however deeply nested. `bridge.get_config()` returns the
current value. Nothing is global: there is no setter.
"""

from __future__ import annotations

import contextvars
import dataclasses
import sys
from typing import Any, Literal, TextIO, TypedDict, get_args

from typing_extensions import Unpack

from bridge._src.errors import BridgeTypeError


# What an op with neither a lowering nor a decomposition does (`Config.fallback`).
Fallback = Literal["callback", "error"]

# Who convolves in a program that runs on the CPU (`Config.cpu_convolution`).
CpuConvolution = Literal["torch", "xla"]


@dataclasses.dataclass(frozen=True)
class Config:
  """The bridge's settings.

  Attributes:
    debug_print_each_op: print every aten op that runs on the `jax` device, with
      its inputs' shapes and dtypes, as it runs.
    debug_file: where the debug print goes (default: `sys.stderr`).
    decompose_missing_ops: run an op with no lowering through torch's own
      decomposition (`torch._decomp`); when False, such an op raises
      `OperatorNotFound` instead (or falls back, see `fallback`).
    fallback: what an op with neither a lowering nor a decomposition does:
      "callback" (the default) runs it in eager torch through a host callback
      inside the JAX program, with a `bridge.FallbackWarning` once per op; "error"
      raises `OperatorNotFound`. On a platform whose programs cannot call back into
      Python, "callback" acts as "error".
    tiered_compile: `bridge.compile` compiles a large program for the CPU twice: first
      quickly with XLA's optimizations off, so that the first call returns sooner, then
      fully in a background thread, whose program replaces the quick one when ready.
      False compiles once, fully, on the first call. Read at each program's first call.
    check_indices: check inside JAX programs too the values torch checks: indices (the
      name), and every other value an op's lowering checks. In eager mode the `jax` device
      always raises torch's error for an index out of range (`x[i]`, `gather`,
      `index_select`, `scatter`, `embedding`...), an integer division or remainder by
      zero, an integer to a negative power, invalid `multinomial` weights (NaN, inf,
      negative, a row of zeros)..., as under `jax.grad` without `jax.jit`. Inside
      `jax.jit`, `bridge.compile`, `lax.scan`... (and `jax.vmap`) the values are unknown
      while the program is built, and by default unchecked: JAX clamps an out-of-range read
      into range and drops an out-of-range write, an integer division by zero gives an
      unspecified number, `multinomial` samples from invalid weights. True adds a host call
      after each such op that fails the program's run with torch's error naming the op and
      the first bad value (a `jax.errors.JaxRuntimeError`, raised when the result is waited
      for; `torch.compile` re-raises torch's exception itself). It costs a host round trip
      per checked op, and needs a platform whose programs can call back into Python (CPU,
      GPU). Read when a program is traced: a program built without it stays unchecked.
    cpu_convolution: who runs a convolution (`aten.convolution` and its backward) in a
      program for the CPU: "torch" (the default) calls torch's own CPU kernel (oneDNN)
      from inside the program, on XLA's buffers, as the fallback runs an op (no warning),
      except for a 1x1 convolution with stride 1 and no padding (a matrix product, which
      XLA fuses with its neighbours); "xla" uses the JAX lowering. XLA:CPU's convolutions,
      and more so their gradients, are slower than oneDNN's (docs/sharp_edges.md has the
      figures). Choose "xla" to keep convolutions inside XLA, e.g. under `jax.vmap` (where
      the host call runs once per batch element). Only where JAX has one CPU device: with
      several (sharding), on other platforms and in `bridge.export`'s artifacts the
      lowering is used. Read when a program is traced.
  """

  debug_print_each_op: bool = False
  debug_file: TextIO | None = None
  decompose_missing_ops: bool = True
  fallback: Fallback = "callback"
  tiered_compile: bool = True
  check_indices: bool = False
  cpu_convolution: CpuConvolution = "torch"


class Settings(TypedDict, total=False):
  """The keyword arguments of `bridge.config`: `Config`'s fields, each optional."""

  debug_print_each_op: bool
  debug_file: TextIO | None
  decompose_missing_ops: bool
  fallback: Fallback
  tiered_compile: bool
  check_indices: bool
  cpu_convolution: CpuConvolution


# The settings that take one of a few names, and their choices.
_CHOICES = {"fallback": Fallback, "cpu_convolution": CpuConvolution}

_CURRENT: contextvars.ContextVar[Config] = contextvars.ContextVar("bridge_config", default=Config())


def get_config() -> Config:
  """The configuration in force here (see `bridge.config` to change it for a block)."""
  return _CURRENT.get()


class config:  # (used like a function: `with bridge.config(...):`)
  """Context manager that changes settings of the bridge for the enclosed block.

  Example:
    >>> import bridge
    >>> with bridge.config(debug_print_each_op=True):
    ...   assert bridge.get_config().debug_print_each_op
    >>> bridge.get_config().debug_print_each_op
    False
  """

  def __init__(self, **changes: Unpack[Settings]):
    names = {f.name for f in dataclasses.fields(Config)}
    unknown = sorted(set(changes) - names)
    if unknown:
      raise BridgeTypeError(
        f"`bridge.config`: unknown setting(s) {', '.join(unknown)}; the settings are "
        f"{', '.join(sorted(names))}."
      )
    given: dict[str, Any] = dict(changes)
    for name, kind in _CHOICES.items():
      if name in given and given[name] not in get_args(kind):
        raise BridgeTypeError(
          f"`bridge.config`: {name}={given[name]!r} is not one of "
          f"{', '.join(repr(c) for c in get_args(kind))}."
        )
    if "check_indices" in changes and not isinstance(changes["check_indices"], bool):
      raise BridgeTypeError(
        f"`bridge.config`: check_indices={changes['check_indices']!r} is not a bool; pass "
        "True or False."
      )
    self._changes = changes
    self._tokens: list[contextvars.Token] = []

  def __enter__(self) -> Config:
    value = dataclasses.replace(_CURRENT.get(), **self._changes)
    self._tokens.append(_CURRENT.set(value))
    return value

  def __exit__(self, *exc: Any) -> None:
    _CURRENT.reset(self._tokens.pop())


def debug_file() -> TextIO:
  return get_config().debug_file or sys.stderr
