"""Modules as pure JAX functions: `extract_jax`, and the module state `call_torch` threads.

A module's forward runs with its parameters and buffers swapped for
`bridge.Tensor`s holding JAX arrays (with tied weights kept tied), so they can be
inputs of a JAX program and be differentiated. The swap is the tracing thread's
own (`reparametrized`): every other thread, an eager forward of the same module
included, sees the module's real tensors meanwhile. Buffers the forward updates
in place (BatchNorm running statistics, counters) are seen after the call:
written back to the module when the values are concrete, returned as new state
by `extract_jax(..., return_state=True)`, and otherwise reported, never silently
dropped.

`Guard` records what a trace of a module depends on besides its inputs (the
module tree, hooks, plain attributes), so `bridge.compile` can tell when a
program no longer matches its module.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
import warnings
import weakref
from typing import Any, Callable, Iterator, Mapping

import jax
import numpy as np
import torch
from torch.nn.modules import module as torch_module

from bridge._src import callback
from bridge._src import dtypes
from bridge._src import narrowing
from bridge._src import scope
from bridge._src import tensor as tensor_lib
from bridge._src import tracing
from bridge._src.arrays import array_to_tensor
from bridge._src.dispatch import special
from bridge._src.errors import BridgeError, BridgeTypeError
from bridge._src.module_state import (
  TABLES,
  module_state,
  own_table,
  reparametrized,
  state_to_jax,
  state_where,
)

API = "bridge.extract_jax"


def _note_reshaped(
  error: BaseException, module: torch.nn.Module, params: Mapping, api: str
) -> None:
  """Name the entries of `params` whose shapes or dtypes differ from the module's own tensors
  on an error of the call (a parameter of another shape or dtype is allowed, and is the
  likely cause)."""
  own = module_state(module)
  odd = []
  for name, a in params.items():
    if name not in own:
      continue
    mine = own[name]
    if tuple(getattr(a, "shape", ())) != tuple(mine.shape):
      odd.append(
        f"{name!r} is {tuple(a.shape)} where {type(module).__name__} has {tuple(mine.shape)}"
      )
    elif hasattr(a, "dtype") and _dtype_name(a.dtype) != _dtype_name(mine.dtype):
      odd.append(
        f"{name!r} is {_dtype_name(a.dtype)} where {type(module).__name__} has "
        f"{_dtype_name(mine.dtype)}"
      )
  if odd:
    error.add_note(f"(bridge: `{api}`: of the parameters passed, {'; '.join(odd[:5])})")


def _dtype_name(dtype: Any) -> str:
  """A torch or JAX/NumPy dtype by one name (`float32`, `bfloat16`, `int64`)."""
  return str(dtype).removeprefix("torch.")


def apply(
  module: torch.nn.Module,
  call: Callable[..., Any],
  params: Mapping[str, Any],
  args: tuple,
  kwargs: dict,
  api: str,
) -> tuple[Any, dict[str, Any]]:
  """Run `call(*args, **kwargs)` with `module`'s state replaced by `params` (JAX arrays).

  Names missing from `params` keep the module's own tensors (constants of the program).
  Returns the output (torch values) and the new values of state entries the call changed.
  """
  if not isinstance(params, Mapping):
    raise BridgeTypeError(
      f"`{api}`: the parameters must be a mapping from state-dict names to arrays (as "
      f"`extract_jax` returns them), got a {type(params).__name__}."
    )
  known = _known_names(module)
  unknown = [k for k in params if k not in known]
  if unknown:
    raise BridgeError(
      f"`{api}`: {type(module).__name__} has no parameter or buffer named "
      f"{', '.join(map(repr, unknown[:5]))}{' ...' if len(unknown) > 5 else ''}. Use the "
      "names of `module.state_dict()` (the keys `extract_jax` returns)."
    )
  tensors = {
    name: a
    if isinstance(a, tensor_lib.Tensor)
    else array_to_tensor(a, functools.partial(state_where, name), api)
    for name, a in params.items()
  }
  missing = {name: t for name, t in module_state(module).items() if name not in tensors}
  if missing:  # the module's own values, as copies: an in-place update must not reach them
    # (inside a 32-bit program a 64-bit one must fit; its bound is kept for the call's scope)
    narrow = scope.is_staged() and not dtypes.x64_enabled()
    bounded = {n: narrowing.known(t, f"the module's {n!r}", narrow) for n, t in missing.items()}
    arrays = state_to_jax({n: t for n, (t, _) in bounded.items()}, copy=True, api=api)
    for name, a in arrays.items():
      if bounded[name][1] is not None:
        narrowing.track(a, bounded[name][1])
      tensors[name] = array_to_tensor(a, functools.partial(state_where, name), api)
  arrays = {name: t._storage.array for name, t in tensors.items()}
  derived = _derived_attributes(module)
  try:
    with reparametrized(module, tensors) as after:
      out = tracing.run_traced(call, args, kwargs, api)
  except Exception as e:  # (the module's own tensors are back: compared in the note)
    _note_reshaped(e, module, params, api)
    raise
  finally:
    for m, name, before in derived:  # the hooks compute them again before each forward
      m.__dict__[name] = before
  mutated = {}
  for name, t in after.items():  # reassigned, or updated in place
    if t is not tensors[name] or t._storage.array is not arrays[name]:
      mutated[name] = (
        tensor_lib.value(t) if isinstance(t, tensor_lib.Tensor) else tracing.outputs_to_jax(t, api)
      )
  return out, mutated


def _derived_attributes(module: torch.nn.Module) -> list[tuple[torch.nn.Module, str, Any]]:
  """The plain tensor attributes torch's older reparametrizations set in a forward pre-hook
  from the module's parameters (`torch.nn.utils.prune`: `weight = weight_orig * weight_mask`;
  the old `weight_norm` and `spectral_norm`), with their values now: a traced call leaves a
  traced tensor there, which `apply` puts back (each forward computes it again first)."""
  # (lazy: rarely used; `torch.nn.utils.weight_norm` is also the name of the function)
  from torch.nn.utils import prune
  from torch.nn.utils.spectral_norm import SpectralNorm
  from torch.nn.utils.weight_norm import WeightNorm

  kinds = (prune.BasePruningMethod, WeightNorm, SpectralNorm)
  found = []
  for m in module.modules():
    for hook in m._forward_pre_hooks.values():
      if isinstance(hook, kinds):
        name = getattr(hook, "_tensor_name", None) or getattr(hook, "name", None)
        if isinstance(name, str) and isinstance(m.__dict__.get(name), torch.Tensor):
          found.append((m, name, m.__dict__[name]))
  return found


def _known_names(module: torch.nn.Module) -> set[str]:
  names = {n for n, _ in module.named_parameters(remove_duplicate=False)}
  names.update(n for n, _ in module.named_buffers(remove_duplicate=False))
  return names


def check_no_leak(module: torch.nn.Module, api: str) -> None:
  """Refuse a module that kept a traced tensor as a plain attribute during the call."""
  for prefix, m in module.named_modules():
    for attr, v in vars(m).items():
      items = v.items() if isinstance(v, dict) and not attr.startswith("_") else [(None, v)]
      for key, t in items:
        if isinstance(t, tensor_lib.Tensor) and isinstance(t._storage.array, jax.core.Tracer):
          where = f"{prefix + '.' if prefix else ''}{attr}{'' if key is None else f'[{key!r}]'}"
          raise scope.LeakedTracerError(
            f"`{api}`: during the call, {type(module).__name__} stored a traced tensor in "
            f"`{where}` (shape {tuple(t.shape)}, dtype {t.dtype}). Its value only exists "
            "inside the JAX program being built, so it cannot be kept on the module. Return "
            "it from `forward`, or register it as a buffer (`self.register_buffer(...)`) "
            "and update it in place: buffers are threaded through (`extract_jax(..., "
            "return_state=True)`, `bridge.compile`)."
          )


# --- what a trace of a module depends on ---------------------------------------------------

_HOOKS = (
  "_forward_pre_hooks",
  "_forward_pre_hooks_with_kwargs",
  "_forward_hooks",
  "_forward_hooks_with_kwargs",
  "_forward_hooks_always_called",
  "_backward_pre_hooks",
  "_backward_hooks",
)
# those `holds` compares (the other three change only with `_forward[_pre]_hooks`)
_QUICK_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_GLOBAL_HOOKS = (
  "_global_forward_pre_hooks",
  "_global_backward_pre_hooks",
  "_global_backward_hooks",
  "_global_forward_hooks",
  "_global_forward_hooks_with_kwargs",
  "_global_forward_hooks_always_called",
)
# a module's own bookkeeping: the tables are compared by content, the rest does not change
# what its forward computes (`training` is part of `bridge.compile`'s cache key instead)
_INTERNAL = frozenset(
  _HOOKS
  + TABLES
  + (
    "_modules",
    "_non_persistent_buffers_set",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
    "training",
  )
)
_SCALARS = (
  bool,
  int,
  float,
  complex,
  str,
  bytes,
  type(None),
  torch.dtype,
  torch.device,
  torch.layout,
  torch.memory_format,
)


class _Same:
  """Equal to `obj` itself only (a snapshot's stand-in for a value compared by identity)."""

  __slots__ = ("obj",)

  def __init__(self, obj: Any):
    self.obj = obj

  def __eq__(self, other: Any) -> bool:
    return other is self.obj or (type(other) is _Same and other.obj is self.obj)

  def __hash__(self) -> int:
    return id(self.obj)


def _scalar(v: Any) -> bool:
  """A value whose equality is its meaning (numbers, strings, dtypes, tuples of them)."""
  if type(v) in _SCALARS:
    return True
  return type(v) in (tuple, frozenset, torch.Size) and all(_scalar(e) for e in v)


def _value(v: Any) -> Any:
  """An attribute's value as a fingerprint compares it: scalars by type and value (2 is not
  2.0), anything else by identity."""
  if type(v) in (tuple, frozenset, torch.Size) and _scalar(v):
    return type(v), tuple(_value(e) for e in v)
  return (type(v), v) if type(v) in _SCALARS else _Same(v)


def _module_print(m: torch.nn.Module) -> tuple:
  """What of `m` a trace depends on: class, children, state names, hooks; its plain
  attributes last, as a dict."""
  d = m.__dict__
  hooks = tuple(
    tuple((k, _Same(h)) for k, h in d[key].items()) if key in d else None for key in _HOOKS
  )
  tables = tuple(
    tuple((k, v is None) for k, v in own_table(m, key).items()) if key in d else None
    for key in TABLES
  )
  children = tuple((k, _Same(c)) for k, c in d.get("_modules", {}).items())
  attrs = {k: _value(v) for k, v in d.items() if k not in _INTERNAL}
  return _Same(m), type(m), children, tables, hooks, attrs


_NO_HOOKS: dict = {}  # a global hook dict this torch does not have


def _global_hook_dicts() -> list[dict]:
  """torch's dicts of global module hooks (`register_module_forward_hook`...), as named in
  `_GLOBAL_HOOKS`."""
  return [getattr(torch_module, name, _NO_HOOKS) for name in _GLOBAL_HOOKS]


class Guard:
  """What a trace of `module`'s forward read besides its inputs, to tell when it is stale.

  Two levels. `holds()` is the check made on every call, a fraction of a microsecond per
  submodule: a list of live dicts (each submodule's `__dict__`, `_modules`, hook dicts and
  the keys of its parameter and buffer tables; torch's global hook dicts) compared in C
  with a snapshot of them that shares their unchanged values, so most comparisons are
  identity tests (values whose `==` could mean something else, tensors and containers,
  are held by `_Same`). It fails on any change there (a hook's `with_kwargs` and
  `always_call` entries come and go with the hook), including ones that leave the trace
  valid (`.eval()`, a counter the forward bumps, an attribute set to an equal value).
  `same_trace(other)` then compares two `fingerprint`s exactly (scalars by type and value,
  the rest by identity), leaving out `training` and the attributes in `volatile`: those a
  traced forward wrote itself (`after_trace`). Parameter and buffer objects are not part
  of it: they are inputs of the program.
  """

  def __init__(self, module: torch.nn.Module, volatile: frozenset = frozenset()):
    self.module = module
    named = list(module.named_modules())
    self.modules = [m for _, m in named]
    self.volatile = volatile  # (id(submodule), attribute name) pairs
    hook_dicts = _global_hook_dicts()
    self.fingerprint = (
      tuple([_Same(d) for d in hook_dicts]),
      tuple([tuple(_Same(h) for h in d.values()) for d in hook_dicts]),
      [_module_print(m) for m in self.modules],
    )
    # where torch would run backward hooks (which a JAX derivative of the trace skips)
    self.backward_hooks = [
      f"`{name or type(module).__name__}`"
      for name, m in named
      if m.__dict__.get("_backward_hooks") or m.__dict__.get("_backward_pre_hooks")
    ]
    if any(d for d, name in zip(hook_dicts, _GLOBAL_HOOKS) if "backward" in name):
      self.backward_hooks.append("every module (a global hook)")
    live: list[Any] = hook_dicts[:4]  # (`_GLOBAL_HOOKS`: the other two come with the third)
    for m in self.modules:
      d = m.__dict__
      live.append(d)
      live += [d[key] for key in _QUICK_HOOKS + ("_modules",) if key in d]
      for key in TABLES:  # their keys (an empty one: itself, quicker to compare)
        if key in d:
          table = own_table(m, key)
          if any(v is None for v in table.values()):  # (a slot set from None to a tensor
            live.append(table)  # keeps the keys: the table itself, values by identity)
          else:
            live.append(table.keys() if table else table)
    self.live = live
    self.snap = [_snapshot(x) for x in live]

  def holds(self) -> bool:
    """Nothing the trace read has changed (a cheap test: False may still be the same trace)."""
    try:
      return self.snap == self.live
    except Exception:  # noqa: BLE001 - a value's own `==` failed: take it as changed
      return False

  def same_trace(self, other: "Guard") -> bool:
    """Whether a trace made under `other` still holds for the module as this guard saw it."""
    a, b = self.fingerprint, other.fingerprint
    if a[:2] != b[:2] or len(a[2]) != len(b[2]):
      return False
    volatile = self.volatile | other.volatile
    for pa, pb in zip(a[2], b[2]):
      if pa[:-1] != pb[:-1]:
        return False
      if pa[-1] != pb[-1]:
        key = id(pa[0].obj)
        if any((key, k) not in volatile for k in pa[-1].keys() ^ pb[-1].keys()):
          return False
        if any(
          (key, k) not in volatile and v != pb[-1][k] for k, v in pa[-1].items() if k in pb[-1]
        ):
          return False
    return True

  def after_trace(self) -> "Guard":
    """A guard for the module now that a trace ran: attributes the forward itself changed
    (a call counter, a cache it filled) join `volatile`, so an eager call that changes them
    again does not count as a change of the module."""
    new = Guard(self.module, self.volatile)
    changed: set[tuple[int, str]] = set()
    for pa, pb in zip(self.fingerprint[2], new.fingerprint[2]):
      if pa[0] == pb[0] and pa[-1] != pb[-1]:
        key = id(pa[0].obj)
        changed.update((key, k) for k in pa[-1].keys() ^ pb[-1].keys())
        changed.update((key, k) for k, v in pa[-1].items() if k in pb[-1] and v != pb[-1][k])
    if changed:
      new.volatile = self.volatile | changed
    return new


def _snapshot(x: Any) -> Any:
  """A copy of a live dict (or a table's keys) for `Guard.holds`."""
  if not isinstance(x, dict):  # a keys view
    return frozenset(x)
  copy = type(x)()  # an OrderedDict stays one: its `==` also compares the order
  for k, v in x.items():
    copy[k] = (
      v
      if (
        k in _INTERNAL
        or _scalar(v)
        or type(v).__eq__ is object.__eq__
        or isinstance(v, (torch.nn.Module, types.MethodType))
      )
      else _Same(v)
    )
  return copy


_warned: set[tuple[type, str]] = set()


def warn_dropped_updates(module: torch.nn.Module, names: list[str], api: str, fix: str) -> None:
  """Say (once per module class and API) that buffer updates made under a trace are dropped."""
  key = (type(module), api)
  if key in _warned:
    return
  _warned.add(key)
  warnings.warn(
    f"`{api}`: {type(module).__name__}'s forward updated {', '.join(map(repr, names[:4]))}"
    f"{' ...' if len(names) > 4 else ''} in place while JAX was tracing it; the new values "
    f"are not written back to the module. {fix}",
    stacklevel=4,
  )


def write_back(module: torch.nn.Module, mutated: Mapping[str, Any]) -> None:
  """Store concrete new state values into the module's own tensors."""
  for name, new in mutated.items():
    target = module.get_parameter(name) if _is_param(module, name) else module.get_buffer(name)
    src = array_to_tensor(new, functools.partial(state_where, name))
    with torch.no_grad():
      special.copy_into(target, src)


def _is_param(module: torch.nn.Module, name: str) -> bool:
  owner, _, leaf = name.rpartition(".")
  return leaf in module.get_submodule(owner)._parameters


_locks: "weakref.WeakKeyDictionary[torch.nn.Module, threading.RLock]" = weakref.WeakKeyDictionary()
_locks_lock = threading.Lock()  # (held only to make a module's lock)


def state_lock(module: torch.nn.Module) -> threading.RLock:
  """The lock of `module`'s own parameters and buffers (reentrant: a forward may call its
  module, or a submodule, again)."""
  lock = _locks.get(module)
  if lock is None:
    with _locks_lock:
      lock = _locks.get(module)
      if lock is None:
        lock = _locks[module] = threading.RLock()
  return lock


@contextlib.contextmanager
def state_held(module: torch.nn.Module) -> Iterator[None]:
  """Hold the state locks of `module` and of every submodule, so that reading the state,
  running the forward and writing the updates back is one step for other threads' calls
  of it or of a module that shares a submodule with it. The locks are taken in one order
  (by `id`), so two calls on overlapping modules cannot wait for each other."""
  with contextlib.ExitStack() as stack:
    for _, m in sorted({id(m): m for m in module.modules()}.items()):
      stack.enter_context(state_lock(m))
    yield


def call_module(
  module: torch.nn.Module, fn: Callable[..., Any], args: tuple, kwargs: dict, api: str
) -> Any:
  """`call_torch` of a module or one of its bound methods. A call that runs now (not staged
  into a program) holds the module's state (`state_held`) from reading it to writing back
  what its forward updated (BatchNorm's statistics), so that concurrent calls count each."""
  held = contextlib.nullcontext() if scope.is_staged() else state_held(module)
  with held:
    params = state_to_jax(module_state(module), copy=None, api=api)
    targs, tkwargs = tracing.inputs_to_torch((args, kwargs), api)
    out, mutated = apply(module, fn, params, targs, tkwargs, api)
    check_no_leak(module, api)
    if any(isinstance(v, jax.core.Tracer) for v in mutated.values()):
      warn_dropped_updates(
        module,
        list(mutated),
        api,
        "To keep them, train through `bridge.extract_jax(module, "
        "return_state=True)` or use `bridge.compile`.",
      )
    else:  # concrete values (an eager call): as torch would, the module's buffers change
      write_back(module, mutated)
  return tracing.outputs_to_jax(out, api)


def _has_float64(params: Mapping[str, Any]) -> list[str]:
  return [k for k, a in params.items() if np.dtype(a.dtype) in (np.float64, np.complex128)]


def extract_jax(
  module: torch.nn.Module,
  *,
  return_state: bool = False,
  mode: tracing.Mode = "trace",
  vmap_method: tracing.VmapMethod | None = None,
  result_shape_dtypes: Any = None,
) -> tuple[dict[str, jax.Array], Callable[..., Any]]:
  """A torch module as `(params, fn)`: its state as JAX arrays and a pure JAX function.

  `params` maps state-dict names to JAX arrays (copies of the parameters and
  persistent buffers; a tied weight appears once, under its first name).
  `fn(params, *args, **kwargs)` runs the module's forward on JAX arrays, as
  `call_torch` does, with the module's state taken from `params`: it is pure, so
  `jax.jit`, `jax.grad` (with respect to `params`), `jax.vmap` and optax work on
  it. `params` may hold a subset of the names (say, only the floating-point
  parameters, to differentiate); the rest are the module's own values, as
  constants. Bring trained values back with
  `module.load_state_dict(bridge.torch_view(params))` (add `strict=False` when the
  module ties weights).

  The forward runs in whatever mode the module is in (`module.train()` /
  `.eval()`) when it runs, which under `jax.jit` means when it is traced: jit a
  separate function for evaluation. Buffers it updates in place (BatchNorm
  running statistics) come back with `return_state=True`: `fn` then returns
  `(output, new_params)`. Without it, such updates are dropped with a warning.
  Random ops inside `jax.jit` need a key: `with bridge.rng_key(key): fn(...)`.
  Tracing `fn` swaps the module's state for `params` in the tracing thread only:
  other threads may run the module eagerly meanwhile.

  With `mode="callback"` the forward is not traced but run for real by eager
  torch, from inside the JAX program, with the module's state swapped for CPU
  tensors that share memory with `params` (see `call_torch(..., mode="callback")`):
  any module works, including ones whose ops have no lowering, and `jax.grad`
  with respect to `params` runs torch autograd. Random ops then draw from torch's
  own generator (a seed per call, replayed by the backward pass).

  64-bit state (float64 parameters, int64 counters) is extracted exactly; note that a
  program built with JAX's 64-bit types disabled cannot hold it: there `fn` checks that
  int64 state fits in int32 (and returns it, as new state, as int64 again: the new state has
  the dtypes of `params`, so it can be a `lax.scan` carry) and refuses float64 state
  (`bridge.NarrowingError`; a warning says so here); enable them with
  `jax.config.update('jax_enable_x64', True)`.

  Args:
    module: any `torch.nn.Module`, on the CPU or the `jax` device.
    return_state: make `fn` return `(output, new_params)`.
    mode: "trace" (the default) or "callback".
    vmap_method: callback mode under `jax.vmap`, as in `call_torch`.
    result_shape_dtypes: callback mode: the forward's outputs as `jax.ShapeDtypeStruct`s
      (a pytree like them), where they cannot be found before it runs, as in `call_torch`.

  Returns:
    `(params, fn)`.

  Example:
    >>> import jax, jax.numpy as jnp, torch, bridge
    >>> params, fn = bridge.extract_jax(torch.nn.Linear(3, 1))
    >>> sorted(params)
    ['bias', 'weight']
    >>> grads = jax.grad(lambda p, x: fn(p, x).sum())(params, jnp.ones((2, 3)))
    >>> grads["weight"].shape
    (1, 3)
  """
  if not isinstance(module, torch.nn.Module):
    raise BridgeTypeError(
      f"`{API}`: expected a `torch.nn.Module`, got a {type(module).__name__}. For a "
      "function use `bridge.call_torch` / `bridge.jax_view`."
    )
  params = state_to_jax(module_state(module, persistent_only=True), copy=True, api=API)
  # (int64 state is not warned about: a 32-bit program checks that it fits, and then it is
  # exact; float64 state it refuses)
  wide = _has_float64(params)
  if wide and not dtypes.x64_enabled():
    warnings.warn(
      f"`{API}`: {type(module).__name__} has 64-bit floating-point state ({', '.join(wide[:4])}"
      f"{' ...' if len(wide) > 4 else ''}); the arrays keep their dtype, but a program built "
      "with JAX's 64-bit types disabled cannot hold them: `fn` refuses them there "
      "(`bridge.NarrowingError`). Enable them (`jax.config.update('jax_enable_x64', True)`) "
      "or cast the module first (`module.float()`).",
      stacklevel=2,
    )

  tracing.check_mode(mode, vmap_method, result_shape_dtypes, api=API)
  if mode == "callback":
    return params, _callback_fn(module, return_state, vmap_method, result_shape_dtypes)

  def fn(params: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
    targs, tkwargs = tracing.inputs_to_torch((args, kwargs), API)
    out, mutated = apply(module, module, params, targs, tkwargs, API)
    check_no_leak(module, API)
    out = tracing.outputs_to_jax(out, API)
    return _with_state(module, params, out, mutated, return_state)

  fn.__name__ = fn.__qualname__ = f"{type(module).__name__}_jax"
  fn.__doc__ = f"`{type(module).__name__}.forward` as a pure JAX function of (params, *args)."
  return params, fn


def _with_state(
  module: torch.nn.Module,
  params: Mapping[str, Any],
  out: Any,
  mutated: Mapping[str, Any],
  return_state: bool,
) -> Any:
  """An `extract_jax` function's result: `(out, new_params)` with the buffers the forward
  updated, or `out` (and a warning if there were updates to drop)."""
  if return_state:
    new = dict(params)
    for name, value in mutated.items():
      given = params.get(name)
      if given is None:
        given = module_state(module)[name]
      new[name] = _in_dtype_of(value, given)
    return out, new
  if mutated:
    warn_dropped_updates(
      module, list(mutated), API, "Pass `return_state=True` to `extract_jax` to get them."
    )
  return out


# (held, given) dtypes of integer state that a 32-bit program holds narrower: int32 for int64
_HELD_NARROWER = {
  (dtypes.TORCH_TO_JAX[narrow], dtypes.TORCH_TO_JAX[wide])
  for wide, narrow in dtypes.NARROWED.items()
  if not (wide.is_floating_point or wide.is_complex)
}


def _in_dtype_of(value: Any, given: Any) -> Any:
  """A new state value in the dtype of the value it replaces (`given`, an array or the
  module's tensor), where a program built with JAX's 64-bit types off holds it narrower: an
  int64 counter held as int32, checked to fit (`narrowing`), goes back to int64, exactly, so
  that the state keeps its types (a `lax.scan` carry)."""
  given_dtype = given.dtype
  if isinstance(given_dtype, torch.dtype):
    given_dtype = dtypes.TORCH_TO_JAX.get(given_dtype)
  if (np.dtype(value.dtype), given_dtype) not in _HELD_NARROWER:
    return value
  with jax.enable_x64(True):  # (the bridge's own computation: 64-bit in a scoped way)
    return jax.lax.convert_element_type(value, np.dtype(given_dtype))


def _callback_fn(
  module: torch.nn.Module,
  return_state: bool,
  vmap_method: tracing.VmapMethod | None,
  result_shape_dtypes: Any,
) -> Callable[..., Any]:
  """`extract_jax(module, mode="callback")`'s function of (params, *args, **kwargs)."""

  def forward(state: dict, args: tuple, kwargs: dict) -> Any:
    with reparametrized(module, state):
      return module(*args, **kwargs)

  name = f"`{type(module).__name__}.forward`"

  def fn(params: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
    state = dict(params)
    out, written = callback.call(
      forward,
      (state, args, kwargs),
      {},
      vmap_method=vmap_method,
      result_shape_dtypes=result_shape_dtypes,
      name=name,
      return_mutated=True,
      api=API,
      owner=module,
    )
    names = sorted(state)  # the state's leaves come first, in JAX's (sorted) key order
    mutated = {names[i]: v for i, v in written.items() if i < len(names)}
    return _with_state(module, params, out, mutated, return_state)

  fn.__name__ = fn.__qualname__ = f"{type(module).__name__}_jax"
  fn.__doc__ = (
    f"`{type(module).__name__}.forward` as a JAX function of (params, *args), "
    "run by torch through a host callback."
  )
  return fn
