"""Module state: a module's parameters and buffers by name, as JAX arrays, and swapped for
other tensors in one thread only (`reparametrized`).

The swap is the calling thread's own: every other thread, an eager forward of the
same module included, sees the module's real tensors meanwhile. Both the traced
front doors (`call_torch`, `extract_jax`, `bridge.compile`) and callback mode's fake
run use it.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from typing import Any, Iterator, Mapping

import jax
import torch

from bridge._src import tensor as tensor_lib
from bridge._src import transfer


def module_state(
  module: torch.nn.Module, *, persistent_only: bool = False
) -> dict[str, torch.Tensor]:
  """Parameters and buffers by state-dict name; a tied tensor once, under its first name.

  With `persistent_only`, exactly the names of `module.state_dict()` (less tied
  duplicates); otherwise non-persistent buffers too.
  """
  state: dict[str, torch.Tensor] = {}
  seen: set[int] = set()
  for name, t in module.state_dict(keep_vars=True).items():
    if isinstance(t, torch.Tensor) and id(t) not in seen:
      seen.add(id(t))
      state[name] = t
  if not persistent_only:
    for name, t in module.named_buffers(remove_duplicate=True):
      if id(t) not in seen:
        seen.add(id(t))
        state[name] = t
  return state


def state_to_jax(
  state: Mapping[str, torch.Tensor], *, copy: bool | None, api: str
) -> dict[str, Any]:
  """The JAX arrays of module state (exact dtypes: 64-bit stays 64-bit)."""
  out: dict[str, Any] = {}
  with jax.enable_x64(True):
    for name, t in state.items():
      if isinstance(t, tensor_lib.Tensor):
        out[name] = tensor_lib.value(t)  # immutable: no copy needed
      else:
        out[name] = transfer.tensor_to_jax(
          t.detach(), copy=copy, api=api, where=functools.partial(state_where, name)
        )
  return out


def state_where(name: str) -> str:
  return f"module state {name!r}"


# --- the tracing thread's own parameters ---------------------------------------------------

TABLES = ("_parameters", "_buffers")
_get_ident = threading.get_ident
_overlay_lock = threading.Lock()  # installs and removes overlays, and counts their users


class _Overlay(dict):
  """A module's `_parameters` or `_buffers` dict while threads trace the module.

  Its own entries are the module's tensors, and a write from a thread that is not tracing
  goes to them and to the dict it stands in for (`original`, which is back in the module
  once the last trace has ended), so such threads see the module as it is. A tracing thread
  sees its layer instead: the whole table with its traced tensors in place, written to by
  its forward (a reassigned buffer). torch reads these tables through their Python methods
  (`Module.__getattr__`, `named_parameters`, `state_dict`), which are the ones overridden.
  """

  __slots__ = ("original", "layers", "users")

  def __init__(self, original: dict):
    super().__init__(original)
    self.original = original
    self.layers: dict[int, dict] = {}  # thread id -> that thread's table
    self.users = 0

  def _layer(self) -> dict | None:
    return self.layers.get(_get_ident()) if self.layers else None

  def __getitem__(self, key: Any) -> Any:
    layer = self._layer()
    return dict.__getitem__(self, key) if layer is None else layer[key]

  def __contains__(self, key: Any) -> bool:
    layer = self._layer()
    return dict.__contains__(self, key) if layer is None else key in layer

  def get(self, key: Any, default: Any = None) -> Any:
    layer = self._layer()
    return dict.get(self, key, default) if layer is None else layer.get(key, default)

  def __iter__(self) -> Iterator[Any]:
    layer = self._layer()
    return dict.__iter__(self) if layer is None else iter(layer)

  def __len__(self) -> int:
    layer = self._layer()
    return dict.__len__(self) if layer is None else len(layer)

  def keys(self) -> Any:
    layer = self._layer()
    return dict.keys(self) if layer is None else layer.keys()

  def values(self) -> Any:
    layer = self._layer()
    return dict.values(self) if layer is None else layer.values()

  def items(self) -> Any:
    layer = self._layer()
    return dict.items(self) if layer is None else layer.items()

  def copy(self) -> dict:
    layer = self._layer()
    return dict(dict.items(self)) if layer is None else dict(layer)

  def __repr__(self) -> str:
    return repr(self.copy())

  def __reduce_ex__(self, protocol: Any) -> Any:  # copies and pickles are plain dicts
    return dict, (dict(dict.items(self)),)

  def __setitem__(self, key: Any, value: Any) -> None:
    layer = self._layer()
    if layer is not None:
      layer[key] = value
      return
    self.original[key] = value
    dict.__setitem__(self, key, value)

  def __delitem__(self, key: Any) -> None:
    layer = self._layer()
    if layer is not None:
      del layer[key]
      return
    self.original.pop(key, None)
    dict.__delitem__(self, key)

  def pop(self, key: Any, *default: Any) -> Any:
    layer = self._layer()
    if layer is not None:
      return layer.pop(key, *default)
    self.original.pop(key, None)
    return dict.pop(self, key, *default)

  def setdefault(self, key: Any, default: Any = None) -> Any:
    if key not in self:
      self[key] = default
    return self[key]

  def update(self, *args: Any, **kwargs: Any) -> None:
    for key, value in dict(*args, **kwargs).items():
      self[key] = value

  def clear(self) -> None:
    for key in list(self.keys()):
      del self[key]

  def popitem(self) -> tuple:
    key = next(reversed(list(self.keys())))
    return key, self.pop(key)


def own_table(module: torch.nn.Module, name: str) -> dict:
  """`module._parameters` or `module._buffers` (`name`), the module's own dict even while a
  thread traces the module (`reparametrized`)."""
  table = module.__dict__[name]
  return table.original if type(table) is _Overlay else table


_folded_warned: set[type] = set()


def _warn_folded(module: torch.nn.Module, folded: list[str]) -> None:
  """Say (once per module class) that values given for the other names of a tied tensor
  are not used."""
  if type(module) in _folded_warned:
    return
  _folded_warned.add(type(module))
  warnings.warn(
    f"bridge: the parameters given to {type(module).__name__} include more than one name of "
    f"a tensor it ties ({', '.join(map(repr, folded[:4]))}{' ...' if len(folded) > 4 else ''}"
    " besides the first name of each): as in torch the tie is kept, so the first name's "
    "value is used for all, and the values given for these names are not (their gradient "
    "is zero). Pass one name per tied tensor, as `extract_jax` returns them "
    "(`module.state_dict()` lists every name).",
    stacklevel=5,
  )


@contextlib.contextmanager
def reparametrized(
  module: torch.nn.Module, tensors: Mapping[str, torch.Tensor]
) -> Iterator[dict[str, Any]]:
  """`module` with the named parameters and buffers replaced by `tensors`, in this thread only.

  As torch's `_reparametrize_module(module, tensors, tie_weights=True)`, but other threads
  keep seeing the module's own tensors: each of the tree's parameter and buffer tables is
  replaced by an `_Overlay` (shared by the threads tracing it) whose layer for this thread
  holds `tensors`. Names tied to a given one (the same tensor under two names) get its
  value. Yields a dict that holds, once the block is left, each given name's value at its
  end (the forward may have reassigned a buffer).
  """
  untied = dict(tensors)
  by_id: dict[int, list[str]] = {}
  for name, t in [
    *module.named_parameters(remove_duplicate=False),
    *module.named_buffers(remove_duplicate=False),
  ]:
    by_id.setdefault(id(t), []).append(name)
  folded: list[str] = []  # names of a tied tensor given besides its first: not used
  for names in by_id.values():
    given = [n for n in names if n in tensors]
    if given:
      for n in names:
        untied[n] = tensors[given[0]]  # (the tie kept: every name is the first one given)
      folded += given[1:]
  if folded:
    _warn_folded(module, folded)
  slots: dict[str, tuple[torch.nn.Module, str, str]] = {}
  for name in untied:
    prefix, _, attr = name.rpartition(".")
    owner = module.get_submodule(prefix)
    slots[name] = (
      owner,
      "_parameters" if attr in own_table(owner, "_parameters") else "_buffers",
      attr,
    )
  ident = _get_ident()
  installed = []
  with _overlay_lock:
    for m in module.modules():
      for key in TABLES:
        table = m.__dict__.get(key)
        if table is None:
          continue
        if type(table) is not _Overlay:
          table = _Overlay(table)
          m.__dict__[key] = table
        table.users += 1
        before = table.layers.get(ident)  # a trace of this module inside another one's
        table.layers[ident] = dict(before if before is not None else dict.items(table))
        installed.append((m, key, table, before))
  layers = {(id(m), key): table.layers[ident] for m, key, table, _ in installed}
  after: dict[str, Any] = {}
  try:
    for name, t in untied.items():  # (this thread's own layers: no lock needed)
      owner, key, attr = slots[name]
      layers[id(owner), key][attr] = t
    yield after
    for name in tensors:
      if name in folded:
        continue
      owner, key, attr = slots[name]
      layer = layers[id(owner), key]
      if attr in layer:
        after[name] = layer[attr]
  finally:
    with _overlay_lock:
      for m, key, table, before in reversed(installed):
        if before is None:
          del table.layers[ident]
        else:
          table.layers[ident] = before
        table.users -= 1
        if not table.users and m.__dict__.get(key) is table:
          m.__dict__[key] = table.original


def module_of(fn: Any) -> torch.nn.Module | None:
  """The module `fn` is, or whose bound method it is; else None."""
  if isinstance(fn, torch.nn.Module):
    return fn
  owner = getattr(fn, "__self__", None)
  return owner if isinstance(owner, torch.nn.Module) else None
