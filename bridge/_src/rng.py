"""The `jax` device's random number generator: a JAX PRNG key, seeded by `torch.manual_seed`.

Each random op takes a fresh subkey split from the current key, so successive
calls differ and no op ever uses a constant key. Before any seeding, the key is
derived from torch's own (random unless seeded) initial seed.

Inside a staged JAX program (`jax.jit`, `lax.scan`, `bridge.compile`) a concrete
key would be baked into the program as a constant, so every run would draw the
same numbers. There the key is state threaded through the program instead: a
`KeyBox` made current by `bridge.rng_key(key)` (or by `bridge.compile`, which
feeds the generator's key in and its successor out). A random op in a staged
program with no key raises and says so.
"""

from __future__ import annotations

import contextvars
import threading
from typing import Any

import jax
import numpy as np
import torch

from bridge._src import scope
from bridge._src.errors import BridgeError

_lock = threading.RLock()  # also held by a compiled call that draws (`generator_lock`)
_key: Any = None
_seed: int | None = None


def generator_lock() -> Any:
  """The generator's lock, reentrant: a compiled program that draws holds it from reading the
  key to setting its successor, so two threads' calls never draw from the same key."""
  return _lock


def _make_key(seed: int) -> Any:
  # The generator's key is a concrete array even when torch code being traced reseeds it
  # (`torch.manual_seed` inside `jax.jit`): built in the trace, it would be a tracer that
  # outlives the trace and breaks every later draw.
  with jax.enable_x64(True), jax.ensure_compile_time_eval():
    return jax.random.PRNGKey(np.uint64(seed % 2**64).astype(np.int64))


def manual_seed(seed: int) -> None:
  global _key, _seed
  with _lock:
    _seed = seed
    _key = _make_key(seed)


def initial_seed() -> int:
  with _lock:
    if _seed is None:
      return torch.initial_seed()
    return _seed


@jax.jit
def _split(key: Any) -> tuple[Any, Any]:
  new, sub = jax.random.split(key)
  return new, sub


class KeyBox:
  """A (possibly traced) key that random ops split from while it is current."""

  __slots__ = ("key", "used")

  def __init__(self, key: Any):
    self.key = key
    self.used = False

  def split(self) -> Any:
    self.key, sub = jax.random.split(self.key)
    self.used = True
    return sub


_BOX: contextvars.ContextVar[KeyBox | None] = contextvars.ContextVar("bridge_rng_box", default=None)


class rng_key:  # (used like a function: `with bridge.rng_key(key):`)
  """Context manager: random torch ops in the block draw from the JAX key `key`.

  Inside `jax.jit` (and `lax.scan`, `jax.checkpoint`...) torch's random ops
  (`dropout`, `torch.randn`, `bernoulli`...) run by `bridge.call_torch` or an
  `extract_jax` function need a key that is an input of the program; otherwise
  each run would repeat the same numbers. The block splits `key` as it goes, so
  successive ops get different subkeys. Outside a staged program the `jax`
  device's generator (seeded by `torch.manual_seed`) is used when no key is given.

  Args:
    key: a JAX PRNG key (`jax.random.key(0)` or `jax.random.PRNGKey(0)`), typically
      an argument of the jitted function.

  Example:
    >>> import jax, torch, bridge
    >>> @jax.jit
    ... def noisy(x, key):
    ...   with bridge.rng_key(key):
    ...     return bridge.call_torch(torch.nn.functional.dropout, x, 0.5)
    >>> noisy(jax.numpy.ones(4), jax.random.key(0)).shape
    (4,)
  """

  def __init__(self, key: Any):
    self.box = KeyBox(key)
    self._token: Any = None

  def __enter__(self) -> KeyBox:
    self._token = _BOX.set(self.box)
    return self.box

  def __exit__(self, *exc: Any) -> None:
    _BOX.reset(self._token)


def next_key(op: Any = None) -> Any:
  """A fresh PRNG key for one random op; advances the generator (or the current `rng_key`)."""
  box = _BOX.get()
  if box is not None:
    return box.split()
  if scope.is_staged():
    raise BridgeError(
      f"bridge: the random op {op or 'here'} runs inside a staged JAX program (`jax.jit`, "
      "`lax.scan`, ...), where the `jax` device's generator would be baked in as a constant "
      "key and repeat the same numbers on every run. Pass a key into the program and make "
      "it current with `with bridge.rng_key(key): ...` around the call, or use "
      "`bridge.compile`, which threads the generator through for you."
    )
  return _next_global_key()


def _key_locked() -> Any:
  """The generator's key, made from torch's initial seed on first use (hold `_lock`)."""
  global _key
  if _key is None:
    _key = _make_key(torch.initial_seed())
  return _key


def _next_global_key() -> Any:
  global _key
  with _lock, jax.ensure_compile_time_eval():  # concrete, as in `_make_key`
    _key, sub = _split(_key_locked())
    return sub


def current_key() -> Any:
  """The generator's key (not advanced): what `bridge.compile` feeds into a program."""
  with _lock:
    return _key_locked()


def set_key(key: Any) -> None:
  """Make `key` (a program's successor key) the generator's key."""
  global _key
  with _lock:
    _key = key


def get_state() -> bytes:
  with _lock:
    key = _key if _key is not None else _make_key(torch.initial_seed())
    return np.asarray(key, dtype=np.uint32).tobytes()


def set_state(state: bytes) -> None:
  global _key
  with _lock, jax.ensure_compile_time_eval():  # concrete, as in `_make_key`
    _key = jax.numpy.asarray(np.frombuffer(state, dtype=np.uint32).copy())
