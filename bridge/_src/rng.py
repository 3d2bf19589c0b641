"""The `jax` device's random number generator: a JAX PRNG key, seeded by `torch.manual_seed`.

Each random op takes a fresh subkey split from the current key, so successive
calls differ and no op ever uses a constant key. Before any seeding, the key is
derived from torch's own (random unless seeded) initial seed.
"""

from __future__ import annotations

import threading
from typing import Any

import jax
import numpy as np
import torch

_lock = threading.Lock()
_key: Any = None
_seed: int | None = None


def _make_key(seed: int) -> Any:
  with jax.enable_x64(True):
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


def next_key() -> Any:
  """A fresh PRNG key for one random op; advances the generator."""
  global _key
  with _lock:
    if _key is None:
      _key = _make_key(torch.initial_seed())
    _key, sub = _split(_key)
    return sub


def get_state() -> bytes:
  with _lock:
    key = _key if _key is not None else _make_key(torch.initial_seed())
    return np.asarray(key, dtype=np.uint32).tobytes()


def set_state(state: bytes) -> None:
  global _key
  with _lock:
    _key = jax.numpy.asarray(np.frombuffer(state, dtype=np.uint32).copy())
