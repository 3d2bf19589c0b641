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
  # (torch.compile's dynamo traces it as the library's own: this module is the one file of
  # the bridge it does not skip, `dynamo.teach_dynamo`; skipped, it would break the graph of
  # every model that asks)
  return is_jax_jitting


# Modules to act on as soon as they are loaded: name -> what to run on the module.
_AFTER_IMPORT: dict[str, Callable[[Any], None]] = {}


def after_import(name: str, act: Callable[[Any], None]) -> None:
  """Run `act(module)` now if module `name` is loaded, else as soon as it is (once)."""
  module = sys.modules.get(name)
  if module is not None:
    act(module)
    return
  _AFTER_IMPORT[name] = act
  if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterImport())


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


class _ActingLoader(importlib.abc.Loader):
  """The module's own loader, then the action registered for it."""

  def __init__(self, inner: Any, act: Callable[[Any], None]):
    self.inner, self.act = inner, act

  def create_module(self, spec: Any) -> Any:
    return self.inner.create_module(spec)

  def exec_module(self, module: Any) -> None:
    self.inner.exec_module(module)
    self.act(module)

  def __getattr__(self, name: str) -> Any:  # `get_source`, `is_package`... as the inner one
    return getattr(self.inner, name)


class _AfterImport(importlib.abc.MetaPathFinder):
  """Finds a module of `_AFTER_IMPORT` as Python would, with `_ActingLoader` around its
  loader; any other module is left to the other finders."""

  def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
    act = _AFTER_IMPORT.pop(fullname, None)
    if act is None:
      return None
    spec = importlib.machinery.PathFinder.find_spec(fullname, path)
    if spec is not None and spec.loader is not None:
      spec.loader = _ActingLoader(spec.loader, act)
    return spec


def teach_on_import() -> None:
  """Teach transformers now if it is loaded, else as soon as it is (run at `import bridge`)."""
  if _NAME not in _patched:
    after_import(_NAME, _teach)
