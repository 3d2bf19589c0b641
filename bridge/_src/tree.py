"""Pytrees as the bridge sees them: JAX's pytrees, plus plain dataclasses.

JAX does not descend into a dataclass unless its class is registered; users of
torch pass dataclasses of tensors around all the time, so the bridge treats an
unregistered dataclass instance as a node whose children are its fields. The
fast path (no dataclass anywhere) is one C++ `tree_flatten` call.

The containers torch code returns (a `ModelOutput`, a dataclass, an object of
tensors such as a Hugging Face cache) are registered with JAX as they are met
(`register_output_types`), so they leave `jax.jit` and come back in as inputs.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import threading
import types
import weakref
from typing import Any, Callable, Iterable, Iterator

import jax
import numpy as np
import torch

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

# What counts as an array when deciding which attributes of an object are its children.
_ARRAYS = (jax.Array, np.ndarray, torch.Tensor, jax.ShapeDtypeStruct)
# Values with a `__dict__` that are not plain objects of data: never made pytree nodes.
_NOT_OBJECTS = (
  type,
  types.ModuleType,
  types.FunctionType,
  types.MethodType,
  functools.partial,
  torch.nn.Module,  # (its state is the module's, and JAX must keep treating it as a leaf)
  list,
  tuple,
  dict,
  set,
  frozenset,
  *_ARRAYS,
)


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


_slotted: dict[type, bool] = {}


def _has_slots(cls: type) -> bool:
  """Whether some of `cls`'s state lives in `__slots__`, outside the instance's `__dict__`."""
  found = _slotted.get(cls)
  if found is None:
    names = [c.__dict__.get("__slots__", ()) for c in cls.__mro__]
    found = _slotted[cls] = any(
      s not in ("__dict__", "__weakref__")
      for slots in names
      for s in ([slots] if isinstance(slots, str) else slots)
    )
  return found


def _plain_object(x: Any) -> bool:
  """An instance whose whole state is its `__dict__` (a Hugging Face cache or cache layer)."""
  return hasattr(x, "__dict__") and not isinstance(x, _NOT_OBJECTS) and not _has_slots(type(x))


def _is_child(x: Any) -> bool:
  """Whether an attribute's value is a child of its object's node, not static: an array, an
  object node (a cache layer, even one not yet filled), or a container or object holding one."""
  if isinstance(x, _ARRAYS) or type(x) in _object_nodes:
    return True
  if x is None or isinstance(x, (bool, int, float, complex, str, bytes, type)):
    return False
  if type(x) is list or isinstance(x, tuple):  # (torch's `return_types` too: JAX leaves)
    return any(map(_is_child, x))
  if type(x) is dict:
    return any(map(_is_child, x.values()))
  leaves = _tu.tree_leaves(x)
  if len(leaves) == 1 and leaves[0] is x:  # a leaf to JAX
    return _plain_object(x) and any(map(_is_child, vars(x).values()))
  return any(map(_is_child, leaves))


# The classes registered by `_object_node`.
_object_nodes: set[type] = set()
# id -> the attribute names an object rebuilt by `_object_node` keeps as children, whatever
# they now hold, so that a tree mapped to other leaves (ints for `in_axes`, shardings, `None`)
# keeps its structure. An entry lives as long as its object.
_children_of: dict[int, frozenset[str]] = {}


def _copy_static(v: Any) -> Any:
  # a static container is copied in and out of the treedef: torch code mutates its cache's
  # (`EncoderDecoderCache.is_updated`), and the treedef is a jit cache key.
  return copy.deepcopy(v) if isinstance(v, (list, dict, set)) else v


class _ObjectAux:
  """The static part of a plain object in a treedef: its attribute names, which of them are
  children, and the values of the others."""

  __slots__ = ("names", "children", "statics")

  def __init__(self, names: tuple[str, ...], children: tuple[bool, ...], statics: tuple) -> None:
    self.names, self.children, self.statics = names, children, statics

  def __eq__(self, other: Any) -> bool:
    return (
      isinstance(other, _ObjectAux)
      and self.names == other.names
      and self.children == other.children
      and all(type(a) is type(b) and bool(a == b) for a, b in zip(self.statics, other.statics))
    )

  def __hash__(self) -> int:  # (the static values may be unhashable: a dict of flags)
    return hash((self.names, self.children))

  def __repr__(self) -> str:
    statics = iter(self.statics)
    return ", ".join(f"{n}={next(statics)!r}" for n, c in zip(self.names, self.children) if not c)


def _object_node(cls: Any, names_of: Callable[[Any], tuple[str, ...]] | None = None) -> None:
  """A plain object (a Hugging Face `DynamicCache`, its `DynamicLayer`s, a dataclass) as a JAX
  node: the attributes that hold arrays are its children, the others (flags, sizes, a sliding
  window, a device, a name) are static; it is rebuilt without running `__init__`. `names_of`
  gives an object's attribute names in order (sorted names of its `__dict__` if not given)."""

  def split(obj: Any) -> tuple[dict, tuple[str, ...], tuple[bool, ...]]:
    if names_of is None:
      state = vars(obj)
      names = tuple(sorted(state))
    else:
      names = names_of(obj)
      state = {n: getattr(obj, n) for n in names}
    kept = _children_of.get(id(obj), frozenset())
    return state, names, tuple(n in kept or _is_child(state[n]) for n in names)

  def aux(state: dict, names: tuple[str, ...], children: tuple[bool, ...]) -> _ObjectAux:
    statics = tuple(_copy_static(state[n]) for n, c in zip(names, children) if not c)
    return _ObjectAux(names, children, statics)

  def flatten(obj: Any) -> tuple[list, _ObjectAux]:
    state, names, children = split(obj)
    return [state[n] for n, c in zip(names, children) if c], aux(state, names, children)

  def flatten_with_keys(obj: Any) -> tuple[list, _ObjectAux]:
    state, names, children = split(obj)
    keyed = [(_tu.GetAttrKey(n), state[n]) for n, c in zip(names, children) if c]
    return keyed, aux(state, names, children)

  def unflatten(aux: _ObjectAux, values: Iterable[Any]) -> Any:
    obj = cls.__new__(cls)
    values, statics = iter(values), iter(aux.statics)
    for n, c in zip(aux.names, aux.children):
      value = next(values) if c else _copy_static(next(statics))
      if names_of is None:
        obj.__dict__[n] = value
      else:  # (a frozen or slotted dataclass too)
        object.__setattr__(obj, n, value)
    try:
      weakref.finalize(obj, _children_of.pop, id(obj), None).atexit = False
    except TypeError:  # no weak references to it: its children go by what they hold
      return obj
    _children_of[id(obj)] = frozenset(n for n, c in zip(aux.names, aux.children) if c)
    return obj

  _tu.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
  _object_nodes.add(cls)


def _dataclass_names(obj: Any) -> tuple[str, ...]:
  """A dataclass's attribute names: its fields in order (those set), then any other
  attributes in its `__dict__` (set by `__post_init__`), sorted."""
  fields = tuple(f.name for f in dataclasses.fields(obj) if hasattr(obj, f.name))
  extra = vars(obj).keys() - set(fields) if hasattr(obj, "__dict__") else ()
  return fields + tuple(sorted(extra))


def register_output_types(tree: Any) -> None:
  """Make the containers in `tree` that JAX does not know JAX pytree nodes, so the outputs of
  torch code (a Hugging Face `ModelOutput` or cache, a dataclass of tensors, an object whose
  attributes hold tensors) can leave `jax.jit`, pass through `jax.grad(has_aux=True)` and
  `jax.tree_util`, keeping key and attribute access, and come back in as inputs. Registered
  once per class, for the whole process (JAX's registry is global)."""
  stack, seen = [tree], set()
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
    elif is_dataclass_instance(x):  # (its fields that hold no array are static, as below)
      _register(cls, functools.partial(_object_node, cls, _dataclass_names))
      stack.extend(getattr(x, n) for n in _dataclass_names(x))
    elif isinstance(x, tuple) and hasattr(cls, "_fields"):  # a named tuple: JAX knows them
      stack.extend(x)
    elif cls in _object_nodes or (_plain_object(x) and _is_child(x)):  # an object of tensors
      if id(x) in seen:  # (objects may refer to each other)
        continue
      seen.add(id(x))
      if cls not in _registered and _tu.treedef_is_leaf(_tu.tree_structure(x)):
        _register(cls, functools.partial(_object_node, cls))
      stack.extend(vars(x).values())


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
