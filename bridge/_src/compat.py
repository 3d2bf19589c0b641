"""Telling other libraries that torch code is being traced by JAX.

Hugging Face `transformers` skips some shortcuts that read tensor values (for
example "no token is padded, so drop the attention mask") when it sees that a
graph is being traced: `transformers.utils.import_utils.is_tracing(tensor)`,
which recognises torchax's tensors holding JAX tracers. The bridge teaches it to
recognise `bridge.Tensor`s holding tracers the same way; its answer for every
other tensor is unchanged. Without this, such a shortcut raises `TracedValueError`
under `jax.jit`.

It is taught when `bridge` is imported, or, if transformers is imported later, as
soon as its module is loaded (`teach_on_import`): before torch.compile's dynamo can
read the function, whose guards would otherwise see it change at the bridge's first
trace and compile the frame again. (The trace scope also checks, in case the module
was loaded some other way.)
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from typing import Any, Callable, Sequence

import jax
import torch

from bridge._src import tensor as tensor_lib

_NAME = "transformers.utils.import_utils"
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
  # `dynamo.teach_dynamo`): skipped, it would break the graph of every model that asks
  return torch._dynamo.dont_skip_tracing(is_jax_jitting)


def tell_libraries() -> None:
  """Teach the loaded libraries to see bridge tracing (idempotent, cheap when done)."""
  if _NAME in _patched:
    return
  module = sys.modules.get(_NAME)
  if module is not None:
    _teach(module)


def _teach(module: Any) -> None:
  if not hasattr(module, "is_jax_jitting"):
    return
  with _lock:
    if _NAME not in _patched:
      module.is_jax_jitting = _recognising_bridge_tensors(module.is_jax_jitting)
      _patched.add(_NAME)


class _TeachingLoader(importlib.abc.Loader):
  """The module's own loader, then `_teach` on the loaded module."""

  def __init__(self, inner: Any):
    self.inner = inner

  def create_module(self, spec: Any) -> Any:
    return self.inner.create_module(spec)

  def exec_module(self, module: Any) -> None:
    self.inner.exec_module(module)
    _teach(module)

  def __getattr__(self, name: str) -> Any:  # `get_source`, `is_package`... as the inner one
    return getattr(self.inner, name)


class _TeachOnImport(importlib.abc.MetaPathFinder):
  """Finds transformers' `import_utils` as Python would, with `_TeachingLoader` around its
  loader; any other module is left to the other finders."""

  def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
    if fullname != _NAME or _NAME in _patched:
      return None
    spec = importlib.machinery.PathFinder.find_spec(fullname, path)
    if spec is not None and spec.loader is not None:
      spec.loader = _TeachingLoader(spec.loader)
    return spec


def teach_on_import() -> None:
  """Teach transformers now if it is loaded, else as soon as it is (run at `import bridge`)."""
  tell_libraries()
  if _NAME not in _patched and not any(isinstance(f, _TeachOnImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _TeachOnImport())
