"""`call_jax` and `torch_view`: call a JAX function from torch code.

Torch tensors in the arguments cross by zero-copy transfer; every other hashable
leaf is a static argument. The function is jitted once per (function, argument
structure, static values), JAX caches the compilation per shapes and dtypes, and
the per-call path is kept lean: a repeated call costs the JAX call plus a few
microseconds. Gradients are the business of `bridge._src.vjp`.

The cache holds a function only weakly where it can (functions, jitted functions,
partials, bound methods through their object): when the function dies, its entries
and their compiled programs go too, so a fresh `lambda` per call costs what it costs
in `jax.jit` and no more. Static values are keyed exactly: `0.0` and `-0.0`, or
`1` and `True`, get entries of their own, and a NaN finds its entry again.
"""

from __future__ import annotations

import collections
import functools
import struct
import threading
import types
import weakref
from typing import Any, Callable, TypeVar

import jax
import numpy as np
import torch
import torch.autograd.forward_ad as _fwd_ad
from torch._subclasses.fake_tensor import FakeTensor

from bridge._src import dtypes
from bridge._src import tensor as tensor_lib
from bridge._src import transfer
from bridge._src import tree as tree_lib
from bridge._src import vjp
from bridge._src.errors import BridgeError, BridgeTypeError, DeviceMismatchError, TransferError
from bridge._src.placement import placement_lines

API = "bridge.call_jax"
_DYN = tree_lib.DYN
_CACHE_SIZE = 4096
_OUT_TYPES = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)
_tree_flatten = jax.tree_util.tree_flatten
_FunctionType = types.FunctionType
_ref = weakref.ref
# The structure of one leaf (a lone output array).
_LEAF = _tree_flatten(0)[1]
_DOUBLE = struct.Struct("<d")
_COMPLEX = struct.Struct("<dd")
_X64 = dtypes.TORCH_X64  # (64-bit torch dtypes: refused while JAX has 64-bit types off)

F = TypeVar("F", bound=Callable[..., Any])


class Entry:
  """A function with one argument structure and static values, and its jitted forms.

  The entry holds `fn` weakly when the cache does (`weak`): a strong reference here
  would keep `fn`, and so the entry, alive for as long as the cache holds the entry.
  A call's autograd graph holds `fn` itself (`_keeping`), for derivatives that trace it
  again after the caller dropped it.
  """

  def __init__(self, fn: Callable, spec: Any, statics: tuple):
    self.name = _name(fn)
    self.spec = spec  # a PyTreeDef, or a tree_lib.Spec when dataclasses are involved
    self.statics = statics  # the leaves, with _DYN at the array positions
    self.fn_ref = _fn_ref(fn)  # () -> fn, or None once fn is dead
    self.weak = not isinstance(self.fn_ref, _Strong)
    self.watch: weakref.ref | None = None  # set by the cache: its death drops this entry
    self.apply = _make_apply(self.fn_ref, spec, statics, self.name)
    self.forward = jax.jit(self.apply)
    self.vjp = vjp.VjpCache(self.apply)

  @property
  def fn(self) -> Callable | None:
    """The function, or None once it has been garbage-collected."""
    return self.fn_ref()


class _Strong:
  """A strong reference with `weakref.ref`'s interface, for functions held strongly."""

  __slots__ = ("fn",)

  def __init__(self, fn: Callable):
    self.fn = fn

  def __call__(self) -> Callable:
    return self.fn


def _fn_ref(fn: Callable) -> Callable[[], Callable | None]:
  kind = _fn_kind(type(fn))
  if kind is _WEAK:
    return _ref(fn)
  if kind is _METHOD and _weak_method(fn):
    return weakref.WeakMethod(fn)
  return _Strong(fn)


def _weak_method(method: Any) -> bool:
  return bool(type(method.__self__).__weakrefoffset__ and type(method.__func__).__weakrefoffset__)


def _make_apply(
  fn_ref: Callable[[], Callable | None], spec: Any, statics: tuple, name: str
) -> Callable[..., Any]:
  """`apply(*arrays)`: calls the function with `arrays` put back into the argument structure.

  A closure over `fn_ref` only (not over the entry, nor over the function itself).
  """
  unflatten = (
    functools.partial(tree_lib.unflatten, spec)
    if isinstance(spec, tree_lib.Spec)
    else spec.unflatten
  )

  def apply(*arrays: Any) -> Any:
    it = iter(arrays)
    args, kwargs = unflatten(tree_lib.merge(statics, it))
    fn = fn_ref()
    if fn is None:
      raise BridgeError(
        f"`{API}`: {name} was garbage-collected, but JAX needs to trace it again (a new "
        "input shape, or a derivative of higher order than the graph recorded). Keep a "
        "reference to the function for as long as its results are differentiated."
      )
    out = fn(*args, **kwargs)
    _check_outputs(name, out)
    return out

  return apply


def _keeping(fn: Callable, to_torch: Callable, entry: Any, out: Any) -> Any:
  """`to_torch(entry, out)`; as `functools.partial(_keeping, fn, to_torch)`, it holds `fn`.

  The converter a differentiable call hands to `vjp.call_with_grad`: the autograd graph keeps
  it, and hands it on to the calls that higher-order backwards make, so the graph holds the
  function that the cache holds only weakly. A backward with `create_graph=True` traces the
  function again, possibly after the caller dropped it.
  """
  del fn
  return to_torch(entry, out)


# How the cache keys and holds a callable of each type: _WEAK, by a weak reference (a
# function, a jitted function, a partial: anything compared by identity); _METHOD, a bound
# method, by its object (weakly) and its function; _STRONG, by the callable itself (one
# that compares by value, e.g. a `jnp.ufunc`, is a value like a static argument; one that
# cannot be weakly referenced has no other way).
_WEAK, _METHOD, _STRONG = "weak", "method", "strong"
_KINDS: dict[type, str] = {}


def _fn_kind(tp: type) -> str:
  kind = _KINDS.get(tp)
  if kind is None:
    if tp is types.MethodType:
      kind = _METHOD
    elif tp.__eq__ is object.__eq__ and tp.__weakrefoffset__:
      kind = _WEAK
    else:
      kind = _STRONG
    if len(_KINDS) < 1024:
      _KINDS[tp] = kind
  return kind


def _fn_key(fn: Any) -> Any:
  """The function's part of a cache key (plain functions take a shortcut in `call_jax`)."""
  kind = _fn_kind(type(fn))
  if kind is _WEAK:
    return _ref(fn)
  if kind is _METHOD and _weak_method(fn):
    # by the object's identity, as bound methods compare: an id is safe in a key because
    # the entry goes (`_Cache.purge`, before any lookup) as soon as the object dies
    return (_METHOD, id(fn.__self__), _ref(fn.__func__))
  return fn


def _anchor(fn: Any) -> Any:
  """The object whose death ends the cache entries of `fn`, or None if they never end."""
  kind = _fn_kind(type(fn))
  if kind is _WEAK:
    return fn
  if kind is _METHOD and _weak_method(fn):
    return fn.__self__
  return None


def _check_outputs(name: str, out: Any) -> None:
  for path, leaf in jax.tree_util.tree_flatten_with_path(out)[0]:
    if not isinstance(leaf, _OUT_TYPES):
      raise BridgeTypeError(
        f"`{API}`: {name} returned a {type(leaf).__name__} at output"
        f"{jax.tree_util.keystr(path) or ' <root>'} ({leaf!r:.60}); a JAX function called "
        "from torch must return a pytree of arrays (tuples, lists, dicts, None). Compute "
        "non-array values outside the function."
      )


def _name(fn: Callable) -> str:
  name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
  return f"`{name}`" if name else f"`{type(fn).__name__}` object"


class _Watch(weakref.ref):
  """A weak reference to what a cache entry's life hangs on; knows the entry's key."""

  __slots__ = ("key",)
  key: Any


# The watches whose object died. The callback only appends (it may run at any allocation,
# in any thread, even while the cache's lock is held); `_Cache.purge` drops their entries,
# and `call_jax` calls it before its lookup whenever this list is not empty.
_dead: list[_Watch] = []
_on_death = _dead.append


class _Cache:
  """A thread-safe, bounded cache of `Entry`s keyed by (function, structure, static values).

  When full it drops the oldest entry (a hit does not refresh an entry: that would
  cost the hot path a lock); a dropped function is simply jitted again on next use.
  An entry whose function (or a bound method's object) dies is dropped too.
  """

  def __init__(self, size: int):
    self.size = size
    self._entries: collections.OrderedDict = collections.OrderedDict()
    self._lock = threading.Lock()

  def get(self, key: tuple, make: Callable[[], Entry], anchor: Any = None) -> Entry:
    """The entry for `key`, made by `make()` if missing; `anchor`'s death drops it."""
    entry = self._entries.get(key)
    if entry is not None:
      return entry
    with self._lock:
      self._purge()
      entry = self._entries.get(key)
      if entry is None:
        entry = make()
        if anchor is not None:
          entry.watch = _Watch(anchor, _on_death)
          entry.watch.key = key
        self._entries[key] = entry
        while len(self._entries) > self.size:
          self._entries.popitem(last=False)
      return entry

  def purge(self) -> None:
    """Drop the entries whose function died."""
    with self._lock:
      self._purge()

  def _purge(self) -> None:
    while _dead:
      watch = _dead.pop()
      entry = self._entries.get(watch.key)
      if entry is not None and entry.watch is watch:
        del self._entries[watch.key]

  def __len__(self) -> int:
    return len(self._entries)

  def clear(self) -> None:
    with self._lock:
      self._entries.clear()
      _dead.clear()


_cache = _Cache(_CACHE_SIZE)
_cache_entries = _cache._entries  # read without the lock on the hot path (dict reads are atomic)


def clear_cache() -> None:
  """Drops every cached jitted function (JAX's own compilation cache is separate)."""
  _cache.clear()


class _Args:
  """The arguments of one call, for error messages: paths are computed on demand."""

  def __init__(self, args: tuple, kwargs: dict):
    self.args, self.kwargs = args, kwargs

  @functools.cached_property
  def paths(self) -> list[str]:
    return [f"args{p}" for p in tree_lib.leaf_paths(self.args)] + [
      f"kwargs{p}" for p in tree_lib.leaf_paths(self.kwargs)
    ]

  def describe(self, leaf_index: int) -> str:
    return f"argument {self.paths[leaf_index]}"


class _Leaves:
  """The leaves of one call's arguments, sorted into arrays and static values."""

  __slots__ = ("spec", "leaves", "arrays", "tensors", "key_statics", "slow", "needs_grad", "device")

  def __init__(self, leaves: list, spec: Any, args: tuple, kwargs: dict):
    self.spec, self.leaves = spec, leaves
    self.arrays: list[Any] = []
    self.tensors: list[tuple[int, int, torch.Tensor]] = []  # (array pos, leaf index, tensor)
    self.key_statics: list[Any] = []  # (leaf index, type, exact key of the value)
    self.slow = self.needs_grad = False
    self.device: torch.device | None = None  # the `jax` device, when the tensors live there
    fast = transfer.fast_tensor_arg if transfer.default_device_is_cpu() else _no_fast_path
    arrays, tensors, key_statics = self.arrays, self.tensors, self.key_statics
    for i, leaf in enumerate(leaves):
      tp = type(leaf)
      if tp is tensor_lib.Tensor:  # a `jax` tensor: its array, no transfer
        if leaf.requires_grad:
          self.needs_grad = True
        if self.device is None:
          self.device = leaf._storage.device
        if tensors and tensors[0][2].device != leaf.device:
          self.slow = True  # another device, or a plain tensor before: convert_slow() says so
        tensors.append((len(arrays), i, leaf))
        if leaf.dtype in _X64 and not dtypes.x64_enabled():
          self.slow = True  # refused by `convert_slow`, as a CPU tensor would be: JAX narrows it
          arrays.append(leaf)
          continue
        arrays.append(leaf._storage.array if leaf._whole else tensor_lib.value(leaf))
      elif isinstance(leaf, torch.Tensor):
        if tp is not torch.Tensor and isinstance(leaf, FakeTensor):
          raise _HasFake
        tensors.append((len(arrays), i, leaf))
        if leaf.requires_grad:
          self.needs_grad = True
        arg = fast(leaf) if self.device is None else None  # after a `jax` tensor: an error
        if arg is None:  # not a plain CPU tensor: converted (or refused) by `convert_slow`
          self.slow, arg = True, leaf
        arrays.append(arg)
      elif tp is float:
        # 0.0 == -0.0 and nan != nan: such values are keyed by their bits
        key_statics.append((i, tp, _DOUBLE.pack(leaf) if leaf == 0.0 or leaf != leaf else leaf))
      elif tp is int or tp is bool or tp is str:
        key_statics.append((i, tp, leaf))
      elif isinstance(leaf, jax.Array):
        arrays.append(leaf)
      elif isinstance(leaf, np.ndarray):
        transfer.check_numpy_x64(leaf, api=API, where=lambda: _Args(args, kwargs).describe(i))
        arrays.append(leaf)
      elif tree_lib.is_dataclass_instance(leaf):
        raise _HasDataclass
      else:
        key_statics.append((i, tp, _static_key(leaf, i, args, kwargs)))

  def statics(self) -> tuple:
    statics: list[Any] = [_DYN] * len(self.leaves)
    for i, _, _ in self.key_statics:
      statics[i] = self.leaves[i]
    return tuple(statics)

  def convert_slow(self, args: tuple, kwargs: dict) -> None:
    """Convert the tensors the fast path left alone; check that all share one device.

    One rule: every tensor of a call is on the same torch device (all plain tensors on
    one device, or all `jax` tensors on one `jax` device).
    """
    described = _Args(args, kwargs)
    _, first, t0 = self.tensors[0]
    for pos, i, t in self.tensors:
      if t.device != t0.device:
        raise TransferError(
          f"`{API}`: tensors on two devices: {described.describe(first)} is on "
          f"{t0.device} and {described.describe(i)} is on {t.device}. One JAX call runs on "
          f"one device: move them together first, e.g. `.to('{t0.device}')` or "
          f"`.to('{t.device}')`."
        )
    for pos, i, t in self.tensors:
      if self.arrays[pos] is t:
        if _functorch_wrapped(t):
          raise BridgeTypeError(
            f"`{API}`: {described.describe(i)} is a tensor of a `torch.func` transform "
            "(`grad`, `vmap`, `jvp`, `jacrev`, `jacfwd`...), which `call_jax` does not run "
            "under. Use torch autograd (`.backward()`, `torch.autograd.grad`, "
            "`torch.autograd.forward_ad`), or apply the transform in JAX inside the function "
            "(`jax.vmap`, `jax.jacrev`)."
          )
        self.arrays[pos] = transfer.tensor_to_jax(
          t, copy=None, api=API, where=functools.partial(described.describe, i)
        )


def _static_key(leaf: Any, i: int, args: tuple, kwargs: dict) -> Any:
  """The exact key of a static value other than a float, int, bool or str (the hot path's)."""
  if isinstance(leaf, np.generic):
    transfer.check_numpy_x64(leaf, api=API, where=lambda: _Args(args, kwargs).describe(i))
    if isinstance(leaf, np.inexact):  # the bits: no -0.0 == 0.0, no nan != nan
      return leaf.tobytes()
  elif type(leaf) is complex:
    return _COMPLEX.pack(leaf.real, leaf.imag)
  try:
    hash(leaf)
  except TypeError:
    raise BridgeTypeError(
      f"`{API}`: {_Args(args, kwargs).describe(i)} is a {type(leaf).__name__}, which "
      "is neither a tensor nor an array, so it must be a static argument, and static "
      "arguments must be hashable. Pass it as a tensor or array, make it hashable "
      "(e.g. a tuple), or close over it: `call_jax(functools.partial(fn, ...), ...)`. "
      f"Got: {leaf!r:.80}"
    ) from None
  return leaf


class _HasDataclass(Exception):
  """Raised by `_Leaves` on a dataclass leaf: flatten again, field by field."""


class _HasFake(Exception):
  """Raised by `_Leaves` on a fake tensor: `call_jax` answers with shapes only."""


def _call_jax_fake(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
  """`call_jax` on torch's fake tensors (shape propagation, e.g. `torch.compile` tracing or
  `call_torch(..., mode="callback")` finding output shapes): fake outputs from `jax.eval_shape`."""
  leaves, spec = tree_lib.flatten((args, kwargs))
  positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
  mode = next(leaves[i].fake_mode for i in positions if isinstance(leaves[i], FakeTensor))
  device = next(leaves[i].device for i in positions if isinstance(leaves[i], FakeTensor))
  specs = []
  with jax.enable_x64(True):
    for i in positions:
      t = leaves[i]
      specs.append(
        jax.ShapeDtypeStruct(
          tuple(t.shape), dtypes.jax_dtype(t.dtype, api=API, where=_Args(args, kwargs).describe(i))
        )
      )

    def run(*arrays: Any) -> Any:
      filled = list(leaves)
      for i, a in zip(positions, arrays):
        filled[i] = a
      a, k = tree_lib.unflatten(spec, filled)
      return fn(*a, **k)

    out = jax.eval_shape(run, *specs)
  with mode:
    return jax.tree_util.tree_map(
      lambda s: torch.empty(
        s.shape, dtype=dtypes.torch_dtype(s.dtype, api=API, where="an output"), device=device
      ),
      out,
    )


def _no_fast_path(t: torch.Tensor) -> None:
  del t  # JAX's default device is not the CPU: every tensor takes the DLPack path
  return None


def _leaves(args: tuple, kwargs: dict) -> _Leaves:
  leaves, spec = _tree_flatten((args, kwargs))
  try:
    return _Leaves(leaves, spec, args, kwargs)
  except _HasDataclass:
    leaves, spec = tree_lib.flatten((args, kwargs))
    return _Leaves(leaves, spec, args, kwargs)


def outputs_to_torch(entry: Entry, out: Any) -> tuple[list[torch.Tensor], Any]:
  """Flatten a JAX output pytree and move its leaves to torch."""
  if type(out) is transfer.ArrayImpl:  # one array (the common case): no pytree
    t = transfer.fast_array_out(out)
    if t is not None:
      return [t], _LEAF
  leaves, treedef = _tree_flatten(out)
  fast = transfer.fast_array_out
  outs = []
  for o in leaves:
    t = fast(o)
    if t is None:
      t = transfer.array_to_torch(o, api=API, where=lambda: f"an output of {entry.name}")
    outs.append(t)
  return outs, treedef


def _outputs_on_device(
  device: torch.device, entry: Entry, out: Any
) -> tuple[list[torch.Tensor], Any]:
  """Outputs as `jax` tensors on `device` (the inputs' device): no transfer."""
  leaves, treedef = _tree_flatten(out)
  return [
    tensor_lib.make(o, device)
    if isinstance(o, jax.Array)
    else tensor_lib.make(jax.numpy.asarray(o), device)
    for o in leaves
  ], treedef


def call_jax(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
  """Calls the JAX function `fn` on torch tensors; returns torch tensors.

  As `fn(*args, **kwargs)` with JAX arrays in place of tensors, but run from
  torch: tensors in any pytree position cross zero-copy (all of a call's tensors
  must be on one torch device: all plain tensors on one device, or all `jax`
  tensors on one `jax` device, which simply hand over their arrays), other hashable
  leaves are static arguments, and the outputs come back as torch tensors on
  that device in the same pytree. `fn` is jitted and
  cached per function, argument structure and static values; JAX compiles once
  per input shapes and dtypes. Static values are keyed exactly (`0.0` and `-0.0`,
  `1` and `True` are different keys; a NaN is the same key again). The cache
  holds `fn` weakly where Python allows (functions, jitted functions, partials,
  bound methods through their object): when `fn` dies its compiled programs go.

  When grad mode is on and an input requires grad, the result joins torch's
  autograd graph: `backward()` runs JAX's pullback (`jax.vjp` of the same
  function, residuals kept from the forward). Integer and bool outputs are
  non-differentiable. A function JAX cannot differentiate (a raw Pallas kernel)
  still runs forward; the error comes only if a gradient is asked for. Under
  `torch.no_grad()` or `torch.inference_mode()` no VJP is built.

  64-bit tensors, NumPy arrays and NumPy scalars (int64, float64, ...) are passed
  exactly and need JAX's 64-bit types enabled (`jax.config.update('jax_enable_x64',
  True)` or a surrounding `with jax.enable_x64(True):`); otherwise
  `BridgeTypeError`, never a silent narrowing to 32 bits.

  Outputs share JAX's buffers (zero-copy): writing into one in place is fine, as
  nothing else holds it.

  Args:
    fn: any JAX callable: a function, a `jax.jit`-ed function, a Pallas kernel.
    *args: positional arguments, pytrees of tensors, arrays and static values.
    **kwargs: keyword arguments, likewise.

  Returns:
    `fn`'s output pytree with torch tensors in place of JAX arrays.

  Raises:
    BridgeTypeError: an unhashable non-array argument, an unsupported tensor or
      dtype, a 64-bit tensor or NumPy value while JAX's 64-bit types are off, or
      an output leaf that is not an array.
    TransferError: tensors on different devices (plain and `jax` tensors mixed).

  Example:
    >>> import torch, jax.numpy as jnp, bridge
    >>> x = torch.tensor([1.0, 2.0], requires_grad=True)
    >>> y = bridge.call_jax(lambda x: jnp.sum(jnp.sin(x) ** 2), x)
    >>> y.backward()
    >>> torch.testing.assert_close(x.grad, torch.sin(2 * x.detach()))
  """
  if (
    not kwargs
    and 0 < len(args) <= _MAX_PLAIN
    and not _dead
    and (type(fn) is _FunctionType or _KINDS.get(type(fn)) is _WEAK)
    and _fwd_ad._current_level < 0
  ):
    # `call_jax(f, x, ...)` on plain CPU tensors only, given positionally, of a function (a
    # jitted one, a partial...) called so before, with no forward-AD level open (in which a
    # tensor may carry a tangent): straight to its entry, skipping the general sorting of
    # the arguments (which finds the same entry and does the same transfers). The commonest,
    # one tensor outside autograd, written out here (a call of about 7 us)
    x = args[0]
    if (
      len(args) == 1
      and type(x) is torch.Tensor
      and not (x.requires_grad and torch.is_grad_enabled())
    ):
      entry = _cache_entries.get((_ref(fn), _PLAIN_SPECS[1], ()))
      if entry is not None and transfer.default_device_is_cpu():
        a = transfer.fast_tensor_arg(x)
        if a is not None:
          out = entry.forward(a)
          t = transfer.fast_array_out(out)  # one array out: the tensor itself
          if t is not None:
            return t
          outs, out_def = outputs_to_torch(entry, out)
          return out_def.unflatten(outs)
    else:
      out = _call_plain(fn, args)
      if out is not _NOT_PLAIN:
        return out
  if not callable(fn):
    raise BridgeTypeError(
      f"`{API}`: `fn` must be a JAX callable (a function, a `jax.jit`-ed function, a Pallas "
      f"kernel), got {type(fn).__name__} {repr(fn)[:80]}. Pass the function first, then its "
      "arguments: `bridge.call_jax(fn, *args)`."
    )
  try:
    split = _leaves(args, kwargs)
  except _HasFake:
    return _call_jax_fake(fn, args, kwargs)
  key = (
    _ref(fn) if type(fn) is _FunctionType else _fn_key(fn),
    split.spec,
    tuple(split.key_statics),
  )
  if _dead:  # a function died: drop its entries (before a lookup, see `_fn_key`)
    _cache.purge()
  entry = _cache_entries.get(key)
  if entry is None:
    entry = _cache.get(key, lambda: Entry(fn, split.spec, split.statics()), _anchor(fn))
  if split.slow:
    split.convert_slow(args, kwargs)
  to_torch = (
    outputs_to_torch
    if split.device is None
    else functools.partial(_outputs_on_device, split.device)
  )
  try:
    if (split.needs_grad and torch.is_grad_enabled()) or (
      _fwd_ad._current_level >= 0 and _has_tangent(split.tensors)
    ):
      if entry.weak:  # the graph holds the function (see `_keeping`)
        to_torch = functools.partial(_keeping, fn, to_torch)
      outs, out_def = vjp.call_with_grad(entry, split.arrays, split.tensors, to_torch, split.device)
    else:
      outs, out_def = to_torch(entry, entry.forward(*split.arrays))
  except ValueError as e:
    if split.device is None or "incompatible devices" not in str(e):
      raise
    raise _placement_error(split, args, kwargs) from e
  return out_def.unflatten(outs)


_MAX_PLAIN = 8
# The argument structures `call_jax(f, x1, ..., xn)` of n positional leaves, n <= _MAX_PLAIN.
_PLAIN_SPECS = (None, *(_tree_flatten(((0,) * n, {}))[1] for n in range(1, _MAX_PLAIN + 1)))
_NOT_PLAIN = object()


def _call_plain(fn: Callable, args: tuple) -> Any:
  """`call_jax(fn, *args)` for positional plain CPU tensors and a cached entry, or `_NOT_PLAIN`
  (then the general path decides)."""
  for x in args:
    if type(x) is not torch.Tensor:
      return _NOT_PLAIN
  entry = _cache_entries.get((_ref(fn), _PLAIN_SPECS[len(args)], ()))
  if entry is None or not transfer.default_device_is_cpu():
    return _NOT_PLAIN
  fast = transfer.fast_tensor_arg
  arrays = []
  for x in args:
    a = fast(x)
    if a is None:
      return _NOT_PLAIN
    arrays.append(a)
  if torch.is_grad_enabled() and any(x.requires_grad for x in args):
    to_torch: Callable = outputs_to_torch
    if entry.weak:  # the graph holds the function (see `_keeping`)
      to_torch = functools.partial(_keeping, fn, to_torch)
    tensors = [(i, i, x) for i, x in enumerate(args)]
    outs, out_def = vjp.call_with_grad(entry, arrays, tensors, to_torch)
  else:
    out = entry.forward(*arrays)
    t = transfer.fast_array_out(out)  # one array out: the tensor itself
    if t is not None:
      return t
    outs, out_def = outputs_to_torch(entry, out)
  return out_def.unflatten(outs)


def _placement_error(split: _Leaves, args: tuple, kwargs: dict) -> DeviceMismatchError:
  """`jax` tensors of one call placed on different sets of devices (meshes)."""
  described = _Args(args, kwargs)
  lines = placement_lines((described.describe(i), split.arrays[pos]) for pos, i, _ in split.tensors)
  return DeviceMismatchError(
    f"`{API}`: the tensors of one call are placed on different sets of devices:\n"
    + "\n".join(lines)
    + "\nOne JAX call runs on one mesh: place them together first (`bridge.shard(x, "
    "sharding)` with shardings over the same mesh, or `.to('jax')` for one device)."
  )


_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def _has_tangent(tensors: list) -> bool:
  """Whether a tensor carries a forward-mode tangent (`torch.autograd.forward_ad`)."""
  return any(_fwd_ad.unpack_dual(t).tangent is not None for _, _, t in tensors)


def _traced_jax_only(args: tuple, kwargs: dict) -> bool:
  """Whether the arguments hold a JAX tracer and no torch tensor: a torch view of a JAX
  function called inside `jax.jit`/`grad`/`vmap` (there is no torch side to hand results to)."""
  leaves = jax.tree_util.tree_leaves((args, kwargs))
  return any(isinstance(x, jax.core.Tracer) for x in leaves) and not any(
    isinstance(x, torch.Tensor) for x in leaves
  )


def torch_function(fn: F) -> F:
  """`bridge.torch_view` of a JAX callable `fn`: a torch callable, `call_jax(fn, ...)` on each
  call.

  Usable as a decorator. The wrapper keeps `fn`'s name and docstring, and
  `wrapper.__wrapped__` is `fn`; wrapping a wrapper returns it unchanged.

  Example:
    >>> import torch, jax.numpy as jnp, bridge
    >>> @bridge.torch_view
    ... def softplus(x):
    ...   return jnp.logaddexp(x, 0.0)
    >>> softplus(torch.zeros(2))
    tensor([0.6931, 0.6931])
  """
  if not callable(fn):
    raise BridgeTypeError(
      f"`bridge.torch_view`: expected a JAX callable, got a {type(fn).__name__}. To move "
      "arrays to torch use `bridge.to_torch(tree)`."
    )
  if getattr(fn, "__bridge_jax_fn__", None) is not None:
    return fn  # already a torch view
  inner = getattr(fn, "__bridge_torch_fn__", None)
  if inner is not None:  # a JAX view of a torch function: views of views cancel
    return inner

  @functools.wraps(fn)
  def wrapper(*args: Any, **kwargs: Any) -> Any:
    if _traced_jax_only(args, kwargs):  # called from JAX code being traced: it is JAX's own
      return fn(*args, **kwargs)
    return call_jax(fn, *args, **kwargs)

  wrapper.__bridge_jax_fn__ = fn  # type: ignore[attr-defined]
  return wrapper  # type: ignore[return-value]
