"""Telling other libraries that torch code is being traced by JAX.

Hugging Face `transformers` skips some shortcuts that read tensor values (for
example "no token is padded, so drop the attention mask") when it sees that a
graph is being traced: `transformers.utils.import_utils.is_tracing(tensor)`,
which recognises torchax's tensors holding JAX tracers. The bridge teaches it to
recognise `bridge.Tensor`s holding tracers the same way, when transformers is
loaded and torch code is first traced; its answer for every other tensor is
unchanged. Without this, such a shortcut raises `TracedValueError` under
`jax.jit`.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

import jax
import torch

from bridge._src import tensor as tensor_lib

_lock = threading.Lock()
_patched: set[str] = set()


def _recognising_bridge_tensors(original: Callable[[Any], bool]) -> Callable[[Any], bool]:
  def is_jax_jitting(x: Any) -> bool:
    if type(x) is tensor_lib.Tensor:
      return isinstance(x._storage.array, jax.core.Tracer)
    return original(x)

  is_jax_jitting.__wrapped__ = original  # type: ignore[attr-defined]
  is_jax_jitting.__doc__ = original.__doc__
  # torch.compile traces it as the library's own (the bridge's files are skipped by dynamo,
  # `dynamo.skip_own_frames`): skipped, it would break the graph of every model that asks
  return torch._dynamo.dont_skip_tracing(is_jax_jitting)


def tell_libraries() -> None:
  """Teach the loaded libraries to see bridge tracing (idempotent, cheap when done)."""
  name = "transformers.utils.import_utils"
  if name in _patched:
    return
  module = sys.modules.get(name)
  if module is None or not hasattr(module, "is_jax_jitting"):
    return
  with _lock:
    if name not in _patched:
      module.is_jax_jitting = _recognising_bridge_tensors(  # type: ignore[attr-defined]
        module.is_jax_jitting
      )
      _patched.add(name)
