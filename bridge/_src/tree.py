"""Pytrees as the bridge sees them: JAX's pytrees, plus plain dataclasses.

JAX does not descend into a dataclass unless its class is registered; users of
torch pass dataclasses of tensors around all the time, so the bridge treats an
unregistered dataclass instance as a node whose children are its fields. The
fast path (no dataclass anywhere) is one C++ `tree_flatten` call.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import threading
from typing import Any, Callable, Iterable, Iterator

import jax

_tu = jax.tree_util


def is_dataclass_instance(x: Any) -> bool:
  return hasattr(type(x), "__dataclass_fields__") and not isinstance(x, type)


@dataclasses.dataclass(frozen=True)
class _DataclassNode:
  """How to rebuild one dataclass leaf: its class, field names and the fields' spec."""

  cls: type
  names: tuple[str, ...]
  spec: "Spec"
  # The instance seen when flattening, copied to keep non-field attributes; it is
  # not part of equality so that specs from different calls compare equal.
  template: Any = dataclasses.field(compare=False, hash=False, repr=False)


@dataclasses.dataclass(frozen=True)
class Spec:
  """A hashable description of a tree's structure (a `PyTreeDef` plus dataclasses)."""

  treedef: Any
  nodes: tuple[tuple[int, _DataclassNode], ...] = ()

  @property
  def num_leaves(self) -> int:
    return self.treedef.num_leaves + sum(n.spec.num_leaves - 1 for _, n in self.nodes)


def flatten(tree: Any) -> tuple[list[Any], Spec]:
  """Flatten `tree` into leaves and a `Spec`; dataclass fields are flattened too."""
  leaves, treedef = _tu.tree_flatten(tree)
  if not any(is_dataclass_instance(x) for x in leaves):
    return leaves, Spec(treedef)
  out: list[Any] = []
  nodes = []
  for i, leaf in enumerate(leaves):
    if is_dataclass_instance(leaf):
      names = tuple(f.name for f in dataclasses.fields(leaf))
      sub, sub_spec = flatten(tuple(getattr(leaf, n) for n in names))
      nodes.append((i, _DataclassNode(type(leaf), names, sub_spec, leaf)))
      out.extend(sub)
    else:
      out.append(leaf)
  return out, Spec(treedef, tuple(nodes))


def unflatten(spec: Spec, leaves: list[Any]) -> Any:
  """Inverse of `flatten`."""
  if not spec.nodes:
    return spec.treedef.unflatten(leaves)
  nodes = dict(spec.nodes)
  top, pos = [], 0
  for i in range(spec.treedef.num_leaves):
    node = nodes.get(i)
    if node is None:
      top.append(leaves[pos])
      pos += 1
      continue
    n = node.spec.num_leaves
    values = unflatten(node.spec, leaves[pos : pos + n])
    pos += n
    obj = copy.copy(node.template)
    for name, value in zip(node.names, values):
      object.__setattr__(obj, name, value)  # works for frozen dataclasses too
      if isinstance(obj, dict) and name in obj:  # a mapping dataclass (HF `ModelOutput`)
        dict.__setitem__(obj, name, value)
    top.append(obj)
  return spec.treedef.unflatten(top)


def leaf_paths(tree: Any, prefix: str = "") -> list[str]:
  """The path of each leaf of `flatten(tree)`, in order, e.g. `args[0]['w'].bias`."""
  paths = []
  for path, leaf in _tu.tree_flatten_with_path(tree)[0]:
    here = prefix + _tu.keystr(path)
    if is_dataclass_instance(leaf):
      for f in dataclasses.fields(leaf):
        paths.extend(leaf_paths(getattr(leaf, f.name), f"{here}.{f.name}"))
    else:
      paths.append(here)
  return paths


def tree_map(fn: Callable[[Any, Callable[[], str]], Any], tree: Any) -> Any:
  """Map `fn(leaf, path_thunk)` over the leaves; `path_thunk()` gives the leaf's path.

  Paths are only computed when asked for (in error messages), so the common
  path costs one flatten and one unflatten.
  """
  leaves, spec = flatten(tree)
  paths: list[str] = []

  def path_of(i: int) -> Callable[[], str]:
    def thunk() -> str:
      if not paths:
        paths.extend(leaf_paths(tree))
      return paths[i] or "<root>"

    return thunk

  return unflatten(spec, [fn(leaf, path_of(i)) for i, leaf in enumerate(leaves)])


class _ArrayLeaf:
  __slots__ = ()

  def __repr__(self) -> str:
    return "<array leaf>"


# Stands for an array leaf in a call's list of static leaves (its arguments' or outputs'
# structure, a cache key); `merge` puts the arrays back in its place.
DYN = _ArrayLeaf()


def merge(
  statics: Iterable[Any], arrays: Iterator[Any], static: Callable[[Any], Any] | None = None
) -> list:
  """`statics` with each `DYN` replaced by the next item of `arrays` (an iterator, which the
  caller may go on reading); `static`, if given, maps the other leaves."""
  if static is None:
    return [next(arrays) if s is DYN else s for s in statics]
  return [next(arrays) if s is DYN else static(s) for s in statics]


class ByIdentity:
  """A static value of a cache key that is not hashable (a Generator, a tensor): compared by
  identity."""

  def __init__(self, v: Any):
    self.v = v

  def __hash__(self) -> int:
    return id(self.v)

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, ByIdentity) and other.v is self.v


# ----------------------------------------------------------------------------- JAX pytrees

_registered: set[type] = set()
_register_lock = threading.Lock()


def _mapping_node(cls: Any) -> None:
  """A dict subclass with attribute fields (Hugging Face's `ModelOutput`) as a JAX node: its
  keys in order, rebuilt without running `__init__` (which inspects its first value)."""

  def flatten(obj: Any) -> tuple[list, tuple]:
    keys = tuple(obj.keys())
    return [obj[k] for k in keys], keys

  fields = hasattr(cls, "__dataclass_fields__")  # (ModelOutput's keys are attributes too)
  base: Any = collections.OrderedDict if issubclass(cls, collections.OrderedDict) else dict

  def unflatten(keys: tuple, children: Iterable[Any]) -> Any:
    obj = cls.__new__(cls)
    base.__init__(obj)
    for k, v in zip(keys, children):
      base.__setitem__(obj, k, v)
      if fields:
        object.__setattr__(obj, k, v)
    return obj

  _tu.register_pytree_node(cls, flatten, unflatten)


def register_output_types(tree: Any) -> None:
  """Make the containers in `tree` that JAX does not know JAX pytree nodes, so the outputs of
  torch code (a Hugging Face `ModelOutput`, a dataclass of tensors) can leave `jax.jit` and
  pass through `jax.grad(has_aux=True)` and `jax.tree_util`, keeping key and attribute
  access. Registered once per class, for the whole process (JAX's registry is global)."""
  stack = [tree]
  while stack:
    x = stack.pop()
    cls = type(x)
    if isinstance(x, (list, tuple)) and cls in (list, tuple):
      stack.extend(x)
      continue
    if cls in (dict, collections.OrderedDict):
      stack.extend(x.values())
      continue
    if isinstance(x, dict):  # a dict subclass (ModelOutput)
      _register(cls, functools.partial(_mapping_node, cls))
      stack.extend(x.values())
    elif is_dataclass_instance(x):
      names = [f.name for f in dataclasses.fields(x)]
      _register(
        cls, functools.partial(_tu.register_dataclass, cls, data_fields=names, meta_fields=[])
      )
      stack.extend(getattr(x, n) for n in names)
    elif isinstance(x, tuple) and hasattr(cls, "_fields"):  # a named tuple: JAX knows them
      stack.extend(x)


def _register(cls: type, how: Callable[[], Any]) -> None:
  if cls in _registered:
    return
  with _register_lock:
    if cls in _registered:
      return
    try:
      how()
    except ValueError:  # registered already (by the user, or another library)
      pass
    _registered.add(cls)
