"""`bridge.compile`: a torch module's (or function's) forward as one cached `jax.jit` program.

Each call feeds the module's current parameters and buffers, the tensor
arguments and the `jax` device generator's key into one jitted program, and
takes back the outputs, the buffers the forward updated (written back into the
module) and the generator's next key. Programs are cached per argument
structure, static values (Python numbers, unless declared dynamic), train/eval
flags of the submodules and input shapes/dtypes; JAX compiles each once. With
grad mode on and a tensor that requires grad, the call is a torch autograd node
whose backward is the compiled JAX VJP (`bridge._src.vjp`).

The program is traced and lowered with JAX's 64-bit types on, so torch's dtypes
hold exactly inside it.

A module's programs are guarded (`modules.Guard`): a change to what a trace read (the
module tree, hooks, plain attributes) drops them, and they are traced again.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import contextlib
import functools
import importlib
import inspect
import os
import threading
import types
import warnings
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.extend.core
import numpy as np
import torch
import torch.autograd.forward_ad as _fwd_ad
from jax._src import config as _jax_config

from bridge._src import dtypes
from bridge._src import ffi
from bridge._src import modules as modules_lib
from bridge._src import rng
from bridge._src import scope
from bridge._src import tensor as tensor_lib
from bridge._src import tracing
from bridge._src import transfer
from bridge._src import tree as tree_lib
from bridge._src import vjp
from bridge._src.config import get_config
from bridge._src.arrays import array_to_tensor
from bridge._src.dispatch import special
from bridge._src.errors import BridgeError, BridgeTypeError, DeviceMismatchError, TransferError
from bridge._src.module_state import module_of, state_where
from bridge._src.placement import devices_of, placement_lines

API = "bridge.compile"
_JaxRuntimeError = jax.errors.JaxRuntimeError
_DYN = tree_lib.DYN
_x64_state = _jax_config.enable_x64
_SCALARS = (bool, int, float)

# Tiered compilation (see `_Program.first_call`). XLA:CPU's quick settings: no LLVM
# optimization and the older loop emitters. Measured on a TransformerEncoderLayer(128, 4)
# forward (2 cores, jaxlib 0.10.2): compile 40 ms instead of 174 ms; the program then runs
# 2.2x slower (900 us against 410 us) until the optimized one replaces it. XLA splits the
# LLVM module into 32 parts to compile in parallel; with fewer cores than that, as many
# parts as cores (GPT-2's quick compile on 2 cores: 75 ms instead of 120 ms).
_QUICK_OPTIONS = {
  "xla_backend_optimization_level": 0,
  "xla_cpu_use_fusion_emitters": False,
  "xla_cpu_parallel_codegen_split_count": min(
    32, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 32
  ),
}
_TIER_MIN_EQUATIONS = 32  # smaller programs (an MLP: 20) compile in tens of milliseconds
_compiler: list[concurrent.futures.ThreadPoolExecutor] = []
_compiler_lock = threading.Lock()


def _background() -> concurrent.futures.ThreadPoolExecutor:
  """One thread compiling optimized programs (XLA releases the GIL while it compiles)."""
  with _compiler_lock:
    if not _compiler:
      _compiler.append(
        concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="bridge-compile")
      )
    return _compiler[0]


def _equations(jaxpr: Any) -> int:
  """The number of equations in `jaxpr` and every jaxpr nested in it."""
  n = len(jaxpr.eqns)
  for eqn in jaxpr.eqns:
    for sub in jax._src.core.jaxprs_in_params(eqn.params):
      n += _equations(sub)
  return n


def _on_cpu(arrays: list) -> bool:
  for a in arrays:
    if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer):
      return all(d.platform == "cpu" for d in a.sharding.device_set)  # type: ignore[attr-defined]
  return jax.default_backend() == "cpu"


class _Info:
  """What tracing one program found out: its output structure, updates and randomness."""

  __slots__ = (
    "out_spec",
    "out_statics",
    "mutated",
    "written",
    "draws",
    "out_plain",
    "out_single",
    "constants",
    "out_plan",
    "restrided",
    "plain_io",
    "groups_written",
  )

  def __init__(
    self,
    out_spec: Any,
    out_statics: tuple,
    mutated: tuple,
    draws: bool,
    written: tuple = (),
    constants: tuple = (),
    out_plan: tuple = (),
    restrided: tuple = (),
  ):
    self.out_spec, self.out_statics = out_spec, out_statics
    # the CPU tensors baked into the program (`scope.collecting_constants`): changed in place,
    # the program is stale (`_constants_hold`)
    self.constants = constants
    self.mutated, self.draws = mutated, draws
    # the positions (among the tensor arguments) of those the forward writes in place: their
    # new values follow the state's updates, and the call copies them into the arguments
    self.written = written
    # every output leaf a tensor and no dataclass: the treedef alone rebuilds the output
    self.out_plain = not out_spec.nodes and all(s is _DYN for s in out_statics)
    self.out_single = (  # one bare tensor (not an empty tuple: also one node)
      self.out_plain and out_spec.treedef.num_nodes == 1 and out_spec.treedef.num_leaves == 1
    )
    # outputs that share memory with the inputs or with one another (`_output_plan`): made
    # views of them after the call; and the arguments whose shape or strides the forward
    # changed in place: (position, size, stride, offset, offset as given, in an alias group)
    self.out_plan, self.restrided = out_plan, restrided
    self.plain_io = not out_plan and not restrided  # (the shortcuts take only these)
    self.groups_written: tuple = ()  # the alias groups (`_Program.alias`) written into


class _Program:
  """One argument structure, static values and train/eval setting: a jitted forward."""

  def __init__(
    self,
    owner: "Compiled",
    spec: Any,
    statics: tuple,
    names: tuple,
    amp: torch.dtype | None = None,
    alias: tuple = (),
  ):
    if isinstance(spec, int):  # the fast path's spelling of `spec` tensors as positional args
      spec = tree_lib.flatten((tuple(range(spec)), {}))[1]
    self.owner, self.spec, self.statics, self.names = owner, spec, statics, names
    self.n_state = len(names)
    # tensors that share memory, one of them written (`_alias_plan`): each group one more input
    # (after the arguments), the memory they span, of which the program makes them views
    self.alias = alias
    self.amp = amp  # the autocast dtype the caller had on (for the inputs' device), or None
    self.name = owner.name
    self.info: _Info | None = None
    self.jitted = jax.jit(self.apply)
    self.forward: Callable[..., tuple] = self.first_call  # then a compiled program
    self.tiers: tuple[Any, concurrent.futures.Future] | None = None  # (quick, optimized)
    self.lean: Any = None  # see `_compile_lean`
    # (for calls that torch autograd records; an input the outputs do not reach gets no
    # gradient, None, as in eager torch: an unused parameter's `.grad` stays None)
    self.vjp = vjp.VjpCache(self.apply, none_for_unreached=True)
    self.spare_key: Any = None  # a key to pass once it is known the program draws nothing

  @property
  def traced(self) -> _Info:
    """`info` where the program has been traced (every run has: `first_call` traces it)."""
    info = self.info
    assert info is not None, "bridge: a compiled program used before its first trace"
    return info

  def first_call(self, *flat: Any) -> tuple:
    """Traces; a large program on the CPU is compiled in two tiers.

    XLA's full optimization is most of a large program's first call. So the first call
    compiles it quickly (`_QUICK_OPTIONS`) and runs that, while a background thread
    compiles it with JAX's default settings; the optimized program replaces the quick one
    as soon as it is ready (`bridge.config(tiered_compile=False)` compiles once, fully).
    Programs under `_TIER_MIN_EQUATIONS` equations, and programs on other platforms,
    are compiled once by `jax.jit`.
    """
    if not get_config().tiered_compile or any(isinstance(a, jax.core.Tracer) for a in flat):
      self.forward = self.jitted
      return self.jitted(*flat)
    traced = self.jitted.trace(*flat)  # runs `apply` once; `jax.jit` reuses this trace
    if _equations(traced.jaxpr.jaxpr) < _TIER_MIN_EQUATIONS or not _on_cpu(list(flat)):
      info = self.traced
      if (
        info.out_single
        and info.plain_io
        and not (info.mutated or info.draws or info.written or self.alias)
      ):
        self._compile_lean(traced.jaxpr, flat)
        return self.forward(*flat)
      self.forward = self.jitted
      return self.jitted(*flat)
    lowered = traced.lower()
    quick = lowered.compile(_QUICK_OPTIONS)
    self.forward = quick
    out = quick(*flat)
    # The optimized compile starts once this first run is done (it would slow it down)
    self.tiers = (quick, _background().submit(self._optimize, lowered, quick, [out]))
    return out

  def _optimize(self, lowered: Any, quick: Any, first: list) -> Any:
    try:  # `first` holds the first run's results; emptied, so this thread does not keep them
      jax.block_until_ready(first.pop())
    except Exception:  # noqa: BLE001 - a deleted or donated result: compile anyway
      pass
    try:
      optimized = lowered.compile()
    except Exception as e:  # the quick program keeps running
      warnings.warn(
        f"`{API}({self.name})`: compiling the optimized program failed ({e}); "
        "the quickly compiled one stays in use.",
        RuntimeWarning,
        stacklevel=1,
      )
      raise
    if self.forward is quick:
      self.forward = optimized
    return optimized

  def _compile_lean(self, closed: Any, flat: tuple) -> None:
    """A small program with one output tensor, no buffer updates and no randomness, compiled
    ahead of time without its two formalities: the key input (unused) and the
    (outputs, updates, key) structure of its result. `lean(*state, *args)` returns the
    output array and, being compiled for 64-bit types already, needs no x64 switch around
    its call; the shortcut's call of it (`_fast_call`) costs about what a direct `jax.jit`
    call of the same function does (0.5 us more on the 2-core machine). It is compiled
    instead of the `jax.jit` program, not besides it; the general path calls it through
    `_lean_forward`."""
    n = self.n_state
    body, key = jax.extend.core.jaxpr_as_fun(closed), flat[n]

    def lean(*arrays: Any) -> Any:
      return body(*arrays[:n], key, *arrays[n:])[0]

    self.lean = jax.jit(lean).lower(*flat[:n], *flat[n + 1 :]).compile()
    self.forward = self._lean_forward

  def _lean_forward(self, *flat: Any) -> tuple:
    n = self.n_state
    return (self.lean(*flat[:n], *flat[n + 1 :]),), (), None

  def written_back(self) -> frozenset[int]:
    """The positions (among the program's inputs) of the state its forward updates, which
    the call writes back in place afterwards: torch autograd must not hold that write
    against the call's own node (see `vjp._JaxFunction`)."""
    info = self.info
    if info is None or not (info.mutated or info.written):
      return frozenset()
    index = {name: i for i, name in enumerate(self.names)}
    n = self.n_state + 1  # (the key sits between the state and the arguments)
    return frozenset(
      [index[name] for name in info.mutated if name in index] + [n + i for i in info.written]
    )

  def mismatch(self) -> bool:
    """The arguments do not fit the ahead-of-time compiled program (the user replaced a
    parameter by one of another shape, or placed arrays elsewhere): from now on `jax.jit`
    runs this program, compiling what it needs. False if it already did."""
    if (self.tiers is None and self.lean is None) or self.forward is self.jitted:
      return False
    self.forward, self.lean = self.jitted, None
    return True

  def apply(self, *flat: Any) -> tuple:
    """(state..., key, dyn..., alias bases...) -> (outputs, updated state, next key or None)."""
    n, n_bases = self.n_state, len(self.alias)
    state, key = list(flat[:n]), flat[n]
    dyn, bases = flat[n + 1 : len(flat) - n_bases], flat[len(flat) - n_bases :]
    tensors = [array_to_tensor(a, lambda: "an argument", API) for a in dyn]
    module = self.owner.module
    if module is not None:  # (tensors here, so that an output that is one can be told)
      state = [
        array_to_tensor(a, functools.partial(state_where, name), API)
        for name, a in zip(self.names, state)
      ]
    # each group of tensors sharing memory: views of one storage holding the memory they span,
    # so that a write through one is read through the others (as torch's "synthetic bases")
    layout: dict[int, tuple] = {}  # argument -> (size, stride, offset) as given
    storages = []  # (each alias group's)
    for (dtype, _, members), base in zip(self.alias, bases):
      storage = array_to_tensor(base, lambda: "an argument", API)._storage
      storages.append(storage)
      for pos, size, stride, offset in members:
        view = tensor_lib.make_view(storage, size, stride, offset, dtype, storage.device)
        if pos < n:
          state[pos] = view
        else:
          tensors[pos - n - 1] = view
          layout[pos - n - 1] = (size, stride, offset)
    given = [
      (t._storage, tuple(t.shape), tuple(t.stride()), int(t.storage_offset())) for t in tensors
    ]
    # each input's storage -> (its flat position, its offset as given), for `_output_plan`
    given_at = [*enumerate(state), *[(n + 1 + i, t) for i, t in enumerate(tensors)]]
    origins: dict[int, tuple[int, int]] = {}
    for pos, t in given_at:
      if isinstance(t, tensor_lib.Tensor):
        origins.setdefault(id(t._storage), (pos, int(t.storage_offset())))
    inputs = {id(t): pos for pos, t in given_at}
    leaves = tree_lib.merge(self.statics, iter(tensors))
    args, kwargs = tree_lib.unflatten(self.spec, leaves)
    objects = _objects((args, kwargs))  # (what the forward may set attributes of)
    self.owner._traces += 1  # (the guard then takes in what the forward wrote: `_retake`)
    self.owner.last_traced = self
    amp = (
      torch.autocast(tensor_lib.device_type(), dtype=self.amp)
      if self.amp is not None
      else contextlib.nullcontext()
    )
    with rng.rng_key(key) as box, amp, scope.collecting_constants() as constants:
      if module is not None:
        out, mutated = modules_lib.apply(
          module, self.owner.call, dict(zip(self.names, state)), args, kwargs, API
        )
        modules_lib.check_no_leak(module, API)
      else:
        out, mutated = tracing.run_traced(self.owner.call, args, kwargs, API), {}
    _check_set_attributes(objects, out, self.name)
    if module is None and torch.is_grad_enabled():
      _warn_constants_requiring_grad(self.owner, constants)
    # tensors become arrays (torch's named tuples plain tuples); the rest stays static
    made: list = []  # the tensor behind each output array
    out_leaves, out_spec = tree_lib.flatten(tracing.outputs_to_jax(out, API, made))
    arrays, statics = [], []
    for leaf in out_leaves:
      if isinstance(leaf, jax.Array):
        arrays.append(leaf)
        statics.append(_DYN)
      else:
        statics.append(leaf)
    names = tuple(sorted(mutated))
    # an argument written in place (as `x.add_(1)`, or through a view of it): its new value
    # (in the layout it was given in); one whose shape or strides the forward changed in place
    # (`x.unsqueeze_(0)`): its new (size, stride, offset), which the call gives it too
    written, new_values, restrided = [], [], []
    for i, (t, (storage, size, stride, offset)) in enumerate(zip(tensors, given)):
      if t._storage is not storage or (i not in layout and storage.array.shape != size):
        raise BridgeError(
          f"`{API}`: {self.name} resizes its tensor argument {i} (shape {size}) in place or "
          "gives it other memory (`resize_`, `set_`): the compiled program cannot give the "
          "caller's tensor new memory. Return the new tensor instead."
        )
      if storage.version and i not in layout:  # (an alias group's memory: written whole)
        written.append(i)
        new_values.append(storage.array)
      now = (tuple(t.shape), tuple(t.stride()), int(t.storage_offset()))
      if now != (size, stride, offset):
        restrided.append((i, *now, offset, i in layout))
    out_plan, extra = _output_plan(made, inputs, origins) if self.owner.keep_aliases else ([], [])
    self.info = _Info(
      out_spec,
      tuple(statics),
      names,
      box.used,
      tuple(written),
      _as_traced(constants),
      tuple(out_plan),
      tuple(restrided),
    )
    # each alias group's memory, written back whole where the forward wrote into it
    spans = [(g, storages[g]) for g in range(len(storages)) if storages[g].version]
    self.info.groups_written = tuple([g for g, _ in spans])
    updates = tuple([mutated[k] for k in names] + new_values + [st.array for _, st in spans])
    return tuple(arrays + extra), updates, box.key if box.used else None


_ATOMS = (str, bytes, int, float, complex, bool, type(None), type, types.FunctionType)


def _objects(tree: Any, depth: int = 4) -> list[tuple[str, Any, dict]]:
  """The objects with attributes in the arguments `(args, kwargs)` (dataclasses, a Hugging Face
  cache and its layers, plain objects), each with its path and its attributes as they are."""
  found: list[tuple[str, Any, dict]] = []
  seen: set[int] = set()

  def walk(x: Any, path: str, level: int) -> None:
    if level > depth or id(x) in seen or isinstance(x, (*_ATOMS, torch.Tensor, torch.nn.Module)):
      return
    seen.add(id(x))
    if isinstance(x, dict):
      for k, v in x.items():
        walk(v, f"{path}[{k!r}]", level + 1)
    elif isinstance(x, (list, tuple)):
      for i, v in enumerate(x):
        walk(v, f"{path}[{i}]", level + 1)
    elif isinstance(getattr(x, "__dict__", None), dict):
      attrs = dict(vars(x))
      found.append((path, x, attrs))
      for k, v in attrs.items():
        walk(v, f"{path}.{k}", level + 1)

  args, kwargs = tree
  for i, a in enumerate(args):
    walk(a, f"argument {i}", 0)
  for k, v in kwargs.items():
    walk(v, f"argument {k!r}", 0)
  return found


def _check_set_attributes(objects: list[tuple[str, Any, dict]], out: Any, name: str) -> None:
  """Refuse a forward that sets a tensor attribute of an argument object (`state.total =
  state.total + x`; a Hugging Face cache's layers rebinding their keys) where the object is not
  among the outputs: a compiled call runs the program, not the forward, so the caller's object
  would keep its old tensors, silently (in-place writes to its tensors are carried back). Where
  the object is returned, the returned one has them: a warning says the caller's does not."""
  returned = {id(obj) for _, obj, _ in _objects(((out,), {}))}
  for path, obj, before in objects:
    now = vars(obj)
    for attr in {*before, *now}:
      old, new = before.get(attr), now.get(attr)
      if old is new or not (isinstance(old, torch.Tensor) or isinstance(new, torch.Tensor)):
        continue
      where = f"`{path}.{attr}`"
      if id(obj) not in returned:
        raise BridgeError(
          f"`{API}({name})`: the function sets {where}, a tensor attribute of an object it is "
          "given; a compiled call runs the program, not the function, so your object would "
          "keep its old tensor. Return the new value (and pass it back in), keep the state "
          "in a module buffer updated in place, or update the object's tensor in place "
          "(`obj.total.copy_(...)`, which is carried back)."
        )
      warnings.warn(
        f"`{API}({name})`: the function sets {where}, a tensor attribute of an object it is "
        "given and returns; the returned object has the new value, the one you passed keeps "
        "its old one (a compiled call runs the program, not the function). Use the returned "
        "one (`cache = out.past_key_values`, as `generate()` does).",
        stacklevel=4,
      )
      return


def _output_plan(made: list, inputs: dict, origins: dict) -> tuple[list, list]:
  """How each output relates to the call's tensors, where it shares memory with them or with
  another output (torch's views): (plan, the arrays of the new storages shared by outputs).

  `inputs`: id(tensor given to the forward) -> its flat position (the state's, then the
  arguments' after the key); `origins`: id(storage) -> (the flat position of the first input
  on it, that input's offset as given). The plan has one entry per output that is not a new
  tensor of its own: (output index, how, where, size, stride, offset, the input's offset as
  given), `how` being "same" (the input tensor itself, `return x`), "view" (a view of the
  input at `where`) or "base" (a view of the new storage `where`, whose array the program
  returns after its outputs). A view of another dtype, a lazy conjugate or negative view
  stays a new tensor."""
  plan: list = []
  fresh: dict[int, list[int]] = {}
  for k, t in enumerate(made):
    if type(t) is not tensor_lib.Tensor or t._as is not None or t.is_conj() or t.is_neg():
      continue
    meta = (tuple(t.shape), tuple(t.stride()), int(t.storage_offset()))
    if id(t) in inputs:
      plan.append((k, "same", inputs[id(t)], *meta, 0))
    elif id(t._storage) in origins:
      pos, origin = origins[id(t._storage)]
      plan.append((k, "view", pos, *meta, origin))
    else:
      fresh.setdefault(id(t._storage), []).append(k)
  extra: list = []
  for ks in fresh.values():
    if len(ks) < 2:
      continue  # a new tensor of its own (contiguous, as the program gives it)
    storage = made[ks[0]]._storage
    for k in ks:
      t = made[k]
      plan.append(
        (k, "base", len(extra), tuple(t.shape), tuple(t.stride()), int(t.storage_offset()), 0)
      )
    extra.append(storage.array)
  return sorted(plan), extra


def _single(program: "_Program") -> bool:
  """Whether the output is one bare tensor with no updates or key (for a shortcut being
  recorded)."""
  info = program.traced
  return (
    info.out_plain
    and info.out_single
    and info.plain_io
    and not (info.mutated or info.draws or info.written)
  )


def _locked(
  compiled: "Compiled", program: "_Program", call: Callable[..., Any]
) -> Callable[..., Any]:
  """`call`, holding the compiled module's lock if the program updates the module's buffers:
  reading the state, running the program and writing the updates back are then one step
  for other threads' calls (BatchNorm's counter counts each call); and the generator's lock
  too if it draws, so that no two calls draw from the same key."""
  info = program.traced
  if not (info.mutated or info.draws):
    return call
  lock = compiled._lock
  if info.draws:  # and the generator's, from reading its key to writing the next one
    generator = rng.generator_lock()

    def locked_drawing(self: "Compiled", *args: Any, **kwargs: Any) -> Any:
      with lock, generator:
        return call(self, *args, **kwargs)

    return locked_drawing

  def locked(self: "Compiled", *args: Any, **kwargs: Any) -> Any:
    with lock:
      return call(self, *args, **kwargs)

  return locked


def _fixed_key(program: "_Program", arrays: list, n_state: int) -> Any:
  """The key the recorded call passed, if the program never draws (its key input is unused,
  so the shortcut passes this one instead of looking up the generator's); else None."""
  return None if program.traced.draws else arrays[n_state]


def _warn_constants_requiring_grad(compiled: "Compiled", constants: list) -> None:
  """Say (once per compiled function) that tensors it closes over which require grad (a
  module's parameters, called from the function) are constants: they get no gradient."""
  if compiled._warned_constants:
    return
  found = [t for t in (ref() for ref in constants) if t is not None and t.requires_grad]
  if found:
    compiled._warned_constants = True
    scope.warn(
      f"`{API}`: {compiled.name} closes over {len(found)} tensor(s) that require grad (e.g. "
      f"shape {tuple(found[0].shape)}: a module's parameters, if it calls one). They are "
      "constants of the program, so no gradient reaches them and its outputs do not require "
      "grad through them. Compile the module itself (`bridge.compile(module)`, whose "
      "parameters are inputs), or pass the tensors as arguments."
    )


def _as_traced(constants: list) -> tuple:
  """The CPU tensors a trace baked in, once each, with their version and data pointer as the
  trace left them (a forward that changes one as it runs does not make its program stale)."""
  held = {}
  for ref in constants:
    t = ref()
    if t is not None and ref not in held:
      held[ref] = (ref, t._version, t.data_ptr())
  return tuple(held.values())


def _constants_hold(constants: tuple) -> bool:
  """Whether the CPU tensors baked into a program (`_Info.constants`) are as they were: none
  changed in place or given new memory (one that no longer exists cannot have changed)."""
  for ref, version, pointer in constants:
    t = ref()
    if t is not None and (t._version != version or t.data_ptr() != pointer):
      return False
  return True


def _has_tangent(state: Sequence[torch.Tensor], dyn: Sequence[Any]) -> bool:
  """Whether a tensor of the call carries a forward-mode tangent (`torch.autograd.forward_ad`)."""
  return any(
    isinstance(t, torch.Tensor) and _fwd_ad.unpack_dual(t).tangent is not None
    for t in (*state, *dyn)
  )


def _refusal(compiled: "Compiled", n_args: int, program: "_Program") -> Callable[..., bool]:
  """The checks both shortcuts make first: whether a call must take the general path because
  something the trace read changed (the module's guard: `modules.Guard.holds`; a CPU tensor
  baked into the program: `_constants_hold`; torch's default dtype), it passes keywords or
  another number of arguments, it is another instance's, or autocast is on."""
  snap, live = compiled._guarded()
  autocast_on = torch.is_autocast_enabled
  constants = program.traced.constants
  holds = _constants_hold
  default_dtype, get_default_dtype = torch.get_default_dtype(), torch.get_default_dtype

  def refused(self: "Compiled", args: tuple, kwargs: dict, device_type: str) -> bool:
    try:
      stale = snap != live
    except Exception:  # noqa: BLE001 - see `Guard.holds`
      stale = True
    return (
      stale
      or (bool(constants) and not holds(constants))
      or bool(kwargs)
      or len(args) != n_args
      or self is not compiled
      or autocast_on(device_type)
      or _fwd_ad._current_level >= 0  # (a tangent may ride on a tensor: the general path)
      or get_default_dtype() is not default_dtype
    )

  return refused


def _fast_call(
  compiled: "Compiled",
  program: "_Program",
  sig: tuple,
  device: torch.device,
  out_dtypes: tuple,
  fixed_key: Any,
  written: frozenset = frozenset(),
) -> Callable[..., Any]:
  """The recorded call as the compiled module's `__call__` (see `Compiled._record`): one
  closure over everything it checks, for a call like the recorded one with whole `jax`-device
  tensors only. On this hot path a method call or an attribute lookup is a tenth of a
  microsecond in a call of about ten, so the checks are written out (those both shortcuts
  share in one call, `_refusal`): the same parameter
  tensors holding the same storages (whose arrays are current: in-place updates replace
  `storage.array`; `.data =` replaces the storage, a resize in place may keep it and leave
  the tensor a part of it), the arguments' array
  shapes/dtypes/device, nothing the trace read changed (the module's guard, train flags
  included: `modules.Guard.holds`), autocast off, nothing that requires grad. Anything
  else goes to the general path (`Compiled._call`), which records again."""
  entries: tuple[Any, ...] = tuple(
    [(table, attr, table[attr], table[attr]._storage) for table, attr in compiled._slots or ()]
  )
  single = _single(program)
  refused = _refusal(compiled, len(sig), program)
  n_state = len(entries)
  tensor_cls, storage_cls = tensor_lib.Tensor, tensor_lib.Storage
  new_tensor, make_result = torch.Tensor._make_wrapper_subclass, tensor_lib.make_result
  grad_on = torch.is_grad_enabled
  swap, restore = _x64_state.swap_local, _x64_state.set_local
  current_key = rng.current_key
  general, finish = Compiled._call, compiled._finish
  out_dtype = out_dtypes[0] if single else None
  lean = program.lean  # a single-output program's own executable: no key, no x64 switch
  # its C++ call (what `jax.stages.Compiled.__call__` forwards to, set by the recorded call):
  # one Python frame less. It checks the arguments' shapes and dtypes itself and raises
  # TypeError on a mismatch, so the loop below leaves those checks to it.
  lean_call = getattr(lean, "_call", None) or lean
  strided = torch.strided

  def call(self: "Compiled", *args: Any, **kwargs: Any) -> Any:
    if refused(self, args, kwargs, tensor_lib.device_type()):
      return general(self, args, kwargs)
    grad = grad_on()
    arrays = []
    for table, attr, t, storage in entries:
      if (
        table.get(attr) is not t
        or t._storage is not storage
        or not t._whole  # (resized in place: a part of its storage)
        or (grad and t.requires_grad)
      ):
        return general(self, args, kwargs)
      arrays.append(storage.array)
    if lean is not None:  # shapes and dtypes: `lean_call` checks them
      for a in args:
        if type(a) is not tensor_cls or not a._whole or (grad and a.requires_grad):
          return general(self, args, kwargs)
        storage = a._storage
        if storage.device is not device:
          return general(self, args, kwargs)
        arrays.append(storage.array)
    else:
      key = fixed_key if fixed_key is not None else rng._key
      arrays.append(key if key is not None else current_key())
      for a, (shape, dtype) in zip(args, sig):
        if type(a) is not tensor_cls or not a._whole or (grad and a.requires_grad):
          return general(self, args, kwargs)
        storage = a._storage
        array = storage.array
        if (
          storage.device is not device
          or array.shape != shape
          or (array.dtype is not dtype and array.dtype != dtype)
          or (written and id(storage) in written)  # (a buffer the forward writes)
        ):  # mostly the same object
          return general(self, args, kwargs)
        arrays.append(array)
    if lean is not None:  # (then the output is single)
      try:
        o = lean_call(*arrays)
      except (TypeError, ValueError):  # refused: the general path hands it to `jax.jit`
        return general(self, args, kwargs)
      except _JaxRuntimeError as e:
        ffi.reraise(e)  # a value check's (or a fallback op's) own error, as torch raises it
        raise
    else:
      prev = swap(True)
      try:
        outs, updates, new_key = self._forward(program, arrays, n_state)
      finally:
        restore(prev)
      if not single:
        results = [make_result(o, device, dtype) for o, dtype in zip(outs, out_dtypes)]
        return finish(program, results, updates, new_key)
      o = outs[0]
    # `tensor_lib.make_result`, written out (positional: cheaper to parse than keywords)
    t = new_tensor(tensor_cls, o.shape, None, None, None, out_dtype, strided, device)
    t._storage = storage_cls(o, device)
    return t

  return call


# A torch tensor's JAX array as imported: (tensor, (version, data pointer, shape, dtype, strides) then,
# the array, how `_current` judges it: `_SHARED` (the array is the tensor's CPU memory),
# `_BY_VERSION` (a zero-copy GPU array: imported again after an in-place update, for the
# stream order) or `_COPY` (a copy: imported again on every call)).
_Held = tuple[torch.Tensor, tuple, Any, int]
_SHARED, _BY_VERSION, _COPY = 0, 1, 2
_realign_lock = threading.Lock()


def _hold(t: torch.Tensor, what: str) -> _Held:
  """`t` (a parameter or buffer) imported into JAX, with what `_current` checks later.

  A tensor JAX cannot take zero-copy (CPU memory not 64-byte aligned: a model loaded from
  safetensors with `assign=True` or by `from_pretrained`) is first moved to aligned memory
  where no other tensor shares it (`_realign`), so that the program reads it in place from
  then on, like any other parameter."""
  a = transfer.tensor_to_jax(t.detach(), api=API, where=lambda: what)
  copied = t.numel() and a.unsafe_buffer_pointer() != t.data_ptr()
  if copied and t.data_ptr() % 64 and _realign(t):
    a = transfer.tensor_to_jax(t.detach(), api=API, where=lambda: what)
    copied = a.unsafe_buffer_pointer() != t.data_ptr()
  if copied:
    how = _COPY
  else:
    how = _SHARED if t.is_cpu else _BY_VERSION
  return (t, (t._version, t.data_ptr(), t.shape, t.dtype, t.stride()), a, how)


def _realign(t: torch.Tensor) -> bool:
  """Give `t` (a leaf) aligned memory of its own with the same values, as `t.data = copy`
  does, where nothing can tell: `t` is all of its storage and no other tensor shares that.
  Whether it did."""
  if t.grad_fn is not None or t.is_sparse or not t.is_contiguous():
    return False
  with _realign_lock:
    storage = t.untyped_storage()
    if (
      t.storage_offset() != 0
      or storage.nbytes() != t.numel() * t.element_size()
      or _storage_users(storage) != 2  # `t`, and `storage` here
    ):
      return False
    with torch.no_grad():
      t.data = t.detach().clone()
  return True


def _storage_users(storage: torch.UntypedStorage) -> int:
  """How many references hold `storage`'s memory (tensors and storage objects); 0 where
  this torch cannot say (then nothing is moved)."""
  count = getattr(torch._C, "_storage_Use_Count", None)
  return 0 if count is None else int(count(storage._cdata))


def _current(held: _Held, t: torch.Tensor) -> bool:
  """Whether the array `held` (made by `_hold` of the same tensor `t`) still has `t`'s values.
  `t.data = ...` and resizes change the pointer, shape, dtype or strides. An array that shares `t`'s
  CPU memory has them whatever ran in place since (an optimizer's step between two calls,
  which would otherwise import every parameter again: zero-copy, but a few microseconds
  each); a zero-copy GPU array while `t`'s version is the same (an in-place update runs on
  torch's stream, which the import orders JAX after). A copy never: a write through `t.data`
  or NumPy leaves the version as it was, so it is imported again on every call."""
  version, pointer, shape, dtype, stride = held[1]
  how = held[3]
  return (
    how != _COPY
    and t.data_ptr() == pointer
    and (how == _SHARED or t._version == version)
    and t.shape == shape
    and t.dtype is dtype
    # (`p.t_()`, `p.data = p.data.t()`: the same memory, read another way)
    and t.stride() == stride
  )


def _fast_cpu_call(
  compiled: "Compiled",
  program: "_Program",
  sig: tuple,
  imported: list,
  fixed_key: Any,
  gpu: int | None = None,
  written: dict | None = None,
) -> Callable[..., Any]:
  """`_fast_call` for plain CPU tensors: the parameters' zero-copy arrays as recorded (each
  parameter must be the same tensor, unchanged since: same version counter and data
  pointer), the arguments shared with JAX through NumPy, the outputs through DLPack.

  With `gpu`, the same for plain tensors on CUDA GPU `gpu` (JAX on the same GPU): the
  arguments are imported through DLPack in the order of torch's current stream
  (`transfer.cuda_tensor_arg`), the outputs handed back in that order."""
  slots = tuple(compiled._slots or ())
  entries: tuple[Any, ...] = tuple(
    [(table, attr, held[0], held) for (table, attr), held in zip(slots, imported)]
  )
  single = _single(program)
  refused = _refusal(compiled, len(sig), program)
  n_state = len(slots)
  plain = _PLAIN
  grad_on = torch.is_grad_enabled
  swap, restore = _x64_state.swap_local, _x64_state.set_local
  current_key, on_cpu = rng.current_key, transfer.default_device_is_cpu
  to_torch, general, finish = transfer.fast_array_out, Compiled._call, compiled._finish
  lean = program.lean
  lean_call = getattr(lean, "_call", None) or lean  # see `_fast_call`
  # the lean output straight through DLPack: a fresh array of the CPU device, of a dtype
  # torch has (else `to_torch` checks it and `_to_torch` takes it)
  out_info: Any = getattr(lean, "out_info", None)
  to_dlpack = (
    transfer.buffer_to_dlpack
    if (
      gpu is None
      and lean is not None
      and transfer.buffer_to_dlpack is not None
      and hasattr(out_info, "dtype")
      and hasattr(out_info, "sharding")
      and transfer.is_one_cpu_device(out_info.sharding)
      and id(out_info.dtype) in dtypes.JAX_TO_TORCH_BY_ID
    )
    else None
  )
  from_dlpack = torch._C._from_dlpack
  # on a GPU: the lean output (one array on that GPU, of a dtype torch has) straight back
  on_gpu = (
    gpu is not None
    and lean is not None
    and hasattr(out_info, "dtype")
    and isinstance(getattr(out_info, "sharding", None), jax.sharding.SingleDeviceSharding)
    and all(d.platform == "gpu" for d in out_info.sharding.device_set)
    and id(out_info.dtype) in dtypes.JAX_TO_TORCH_BY_ID
  )
  cuda_arg, gpu_to_torch = transfer.cuda_tensor_arg, transfer.gpu_array_to_torch
  touches, span = _touches, _span
  amp_type = "cpu" if gpu is None else "cuda"
  parameter = torch.nn.Parameter
  # A parameter passed as an argument (torch.compile's graphs take them so) keeps its JAX
  # array while it is the same tensor, unchanged (version counter and data pointer), as a
  # module's own parameters do (`Compiled._state_arrays`); another argument is imported anew.
  held: dict[int, _Held] = {}

  def parameter_array(t: Any) -> Any:
    hit = held.get(id(t))
    if hit is not None and hit[0] is t and _current(hit, t):
      return hit[2]
    hit = held[id(t)] = _hold(t, "a parameter argument")
    return hit[2]

  def call(self: "Compiled", *args: Any, **kwargs: Any) -> Any:
    if refused(self, args, kwargs, amp_type) or (gpu is None and not on_cpu()):
      return general(self, args, kwargs)
    grad = grad_on()
    arrays = []
    for table, attr, t, held in entries:
      if table.get(attr) is not t or (grad and t.requires_grad) or not _current(held, t):
        return general(self, args, kwargs)
      arrays.append(held[2])
    if to_dlpack is not None:  # lean: it checks the arguments' shapes and dtypes itself
      prev = swap(True)  # int64/float64 arguments stay 64-bit
      try:
        for a in args:
          if type(a) not in plain or not a.is_cpu:
            return general(self, args, kwargs)
          if a.requires_grad:
            if grad:
              return general(self, args, kwargs)
            if type(a) is parameter:
              arrays.append(parameter_array(a))
              continue
            a = a.detach()
          if not a.is_contiguous():  # the executable takes row-major arrays only
            a = a.contiguous()
          try:
            arrays.append(a.numpy())  # zero-copy
          except (TypeError, RuntimeError):  # what NumPy cannot hold (bfloat16, conj views)
            arrays.append(_array(a))
        o = lean_call(*arrays)
      except _JaxRuntimeError as e:
        ffi.reraise(e)  # a value check's (or a fallback op's) own error, as torch raises it
        return general(self, args, kwargs)
      except (TypeError, ValueError, RuntimeError):  # the general path explains or retries
        return general(self, args, kwargs)
      finally:
        restore(prev)
      return from_dlpack(to_dlpack(o))
    if on_gpu:  # lean, on the GPU: tensors of the recorded shapes and dtypes, shared
      prev = swap(True)
      try:
        for a, (shape, dtype) in zip(args, sig):
          if (
            type(a) not in plain
            or a.get_device() != gpu
            or a.dtype is not dtype
            or a.shape != shape
            or (grad and a.requires_grad)
          ):
            return general(self, args, kwargs)
          arg = parameter_array(a) if type(a) is parameter else cuda_arg(a)
          if arg is None:  # a view to copy, a lazy conjugate: the general path
            return general(self, args, kwargs)
          arrays.append(arg)
        o = lean_call(*arrays)
      except _JaxRuntimeError as e:
        ffi.reraise(e)  # a value check's (or a fallback op's) own error, as torch raises it
        return general(self, args, kwargs)
      except (TypeError, ValueError, RuntimeError):  # the general path explains or retries
        return general(self, args, kwargs)
      finally:
        restore(prev)
      return gpu_to_torch(o)
    if lean is None:
      key = fixed_key if fixed_key is not None else rng._key
      arrays.append(key if key is not None else current_key())
    for a, (shape, dtype) in zip(args, sig):
      if (
        type(a) not in plain
        or a.dtype is not dtype
        or a.shape != shape
        or (not a.is_cpu if gpu is None else a.get_device() != gpu)
        or (grad and a.requires_grad)
        or (written is not None and touches(written, span(a)))  # (a buffer it writes)
      ):
        return general(self, args, kwargs)
    prev = swap(True)  # before the arguments' arrays: int64/float64 tensors stay 64-bit
    try:
      for a in args:
        arrays.append(parameter_array(a) if type(a) is parameter else _array(a))
      if lean is not None:  # (then the output is single)
        try:
          outs = (lean_call(*arrays),)
        except (TypeError, ValueError):
          outs = None
        except _JaxRuntimeError as e:
          ffi.reraise(e)  # a value check's (or a fallback op's) own error, as torch raises it
          raise
      else:
        outs, updates, new_key = self._forward(program, arrays, n_state)
    finally:
      restore(prev)
    if outs is None:  # the lean executable refused: the general path hands it to `jax.jit`
      return general(self, args, kwargs)
    if single:
      o = outs[0]
      t = to_torch(o)
      return t if t is not None else _to_torch(o, None)
    results = []
    for o in outs:
      t = to_torch(o)
      results.append(t if t is not None else _to_torch(o, None))
    return finish(program, results, updates, new_key)

  return call


class Compiled:
  """A torch callable that runs a module's (or function's) forward as one `jax.jit` program.

  Made by `bridge.compile`; attributes it does not have are looked up on the
  module, so `compiled.train()`, `compiled.parameters()` work as on the module.
  """

  def __new__(cls, *args: Any, **kwargs: Any) -> "Compiled":
    # Each compiled callable is the one instance of a class of its own, so that a recorded
    # call can become that class's `__call__` (`_record`): Python calls `type(c).__call__`,
    # and a call that goes straight to the shortcut saves a Python frame.
    own = type(
      cls.__name__, (cls,), {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
    )
    return super().__new__(own)

  def __reduce__(self) -> tuple:
    # pickled (`torch.save`) as what it compiles: the class of its own is not importable,
    # and programs are rebuilt on first use after loading; a function compiled where it is
    # defined (`@bridge.compile`) by its name, which is this object (pickle refuses a function
    # whose name is another object)
    name = (getattr(self.target, "__module__", None), getattr(self.target, "__qualname__", None))
    if isinstance(self.target, types.FunctionType) and _named(*name) is self:
      return (_named, name)
    return (_recompile, (self.target, tuple(self.dynamic_argnums), tuple(self.dynamic_argnames)))

  def __init__(
    self,
    target: Callable[..., Any],
    dynamic_argnums: Iterable[int] = (),
    dynamic_argnames: Iterable[str] = (),
  ):
    self.target = target
    self.module = module_of(target)
    self.call = target
    self.name = getattr(target, "__qualname__", None) or type(target).__name__
    self._warned_constants = False  # (`_warn_constants_requiring_grad`)
    self.dynamic_argnums, self.dynamic_argnames = _dynamic_arguments(
      target, dynamic_argnums, dynamic_argnames
    )
    self._programs: dict[tuple, _Program] = {}
    self._imported: list[_Held | None] = []  # see _state_arrays
    self._slots: list[tuple[dict, str]] | None = None
    self._names: tuple[str, ...] = ()
    self._submodules: list[torch.nn.Module] = []
    self._fast: Callable[..., Any] | None = None  # the recorded call, see `_record`
    self._guard: modules_lib.Guard | None = None  # what the traces read (`_reguard`)
    self._traces = 0  # how many times a program traced the forward
    self.last_traced: _Program | None = None  # the program that traced last
    self._state_gen = 0  # counts changes of the state's arrays (`_state_spans`)
    self._spans: tuple | None = None
    self._index: tuple = ((), {})
    self._lock = threading.RLock()  # see `_locked`
    # outputs that are inputs, state or views of them or of one another come back so
    # (`_output_plan`); the torch.compile backend, whose graphs' outputs leave through
    # aot_autograd's Function (which makes their views itself), turns it off
    self.keep_aliases = True
    if self.module is not None:
      self._submodules = list(self.module.modules())
    functools.update_wrapper(
      self, target.forward if isinstance(target, torch.nn.Module) else target, updated=()
    )

  def wait_optimized(self) -> "Compiled":
    """Blocks until every program compiled so far runs with XLA's full optimization.

    A large program's first call runs a quickly compiled version while the optimized one
    compiles in the background (see `bridge.config(tiered_compile=...)`). Call this
    before timing steady-state calls. Raises the compile error if that compile failed.
    """
    for program in list(self._programs.values()):
      if program.tiers is not None:
        program.tiers[1].result()
    return self

  def __getattr__(self, name: str) -> Any:
    module = self.__dict__.get("module")
    if module is None:
      raise AttributeError(name)
    return getattr(module, name)

  def __repr__(self) -> str:
    return f"bridge.compile({self.target!r})"

  # --- module state ---------------------------------------------------------------------

  def _guarded(self) -> tuple[Any, Any]:
    """The guard's snapshot and live dicts, for a shortcut to compare (`Guard.holds`)."""
    guard = self._guard
    return (guard.snap, guard.live) if guard is not None else ((), ())

  def _reguard(self) -> None:
    """The guard's quick test failed: compare what the traces read exactly, and drop every
    program if the module changed in it (each is traced again when next called)."""
    old = self._guard
    assert self.module is not None  # (only a module's calls are guarded)
    new = modules_lib.Guard(self.module, old.volatile if old is not None else frozenset())
    if old is not None and not new.same_trace(old):
      self._programs = {}
      self._record(None)
      self._slots = None
    self._guard = new
    self._submodules = new.modules

  def _retake(self) -> None:
    """A call traced the forward: the guard takes in what the forward itself wrote."""
    if self._guard is not None:
      self._guard = self._guard.after_trace()

  def _build_slots(self) -> list[tuple[dict, str]]:
    assert self.module is not None  # (`_state` asks only for a module)
    state = modules_lib.module_state(self.module)
    slots = []
    for name in state:
      owner_name, _, attr = name.rpartition(".")
      owner = self.module.get_submodule(owner_name)
      params = modules_lib.own_table(owner, "_parameters")
      slots.append((params if attr in params else modules_lib.own_table(owner, "_buffers"), attr))
    if self._slots is not None and tuple(state) != self._names:
      self._programs = {}  # traced with other state names
      self._record(None)
    self._slots, self._names = slots, tuple(state)
    self._submodules = list(self.module.modules())
    return slots

  def _state(self) -> list[torch.Tensor]:
    if self.module is None:
      return []
    slots = self._slots
    if slots is None:
      slots = self._build_slots()
    try:
      state = [table[attr] for table, attr in slots]
    except KeyError:
      state = [None]
    if any(t is None for t in state):  # a parameter or buffer was removed or added
      slots = self._build_slots()
      state = [table[attr] for table, attr in slots]
    return state

  def _name_index(self) -> dict[str, int]:
    """The state's positions by name."""
    names, index = self._index
    if names is not self._names:
      index = {name: i for i, name in enumerate(self._names)}
      self._index = (self._names, index)
    return index

  def _state_spans(self, state: list) -> tuple[list, list, dict]:
    """The state's memory (`_span`), kept while the state's arrays are (`_state_arrays`):
    (position, span)s, the groups of them that overlap, and per memory the sorted starts and
    running maximum of the ends (`_touches`)."""
    cached = self._spans
    if cached is None or cached[0] != self._state_gen or len(cached[1]) > len(state):
      spans = [(i, span) for i, span in enumerate(map(_span, state)) if span is not None]
      cached = self._spans = (self._state_gen, spans, _overlapping(spans), _span_index(spans))
    return list(cached[1]), cached[2], cached[3]

  def _written_memory(self, program: _Program, state: list) -> dict | None:
    """For a shortcut, the memory of the state `program` writes, which an argument must not
    share (`_touches`): per memory (a `jax` tensor's storage, or a device's address space) the
    sorted starts and running maximum of the ends; {} where it writes none, None where two
    tensors of the state share memory it writes (the general path takes such calls)."""
    if not program.traced.mutated:
      return {}
    index = self._name_index()
    written = {index[k] for k in program.traced.mutated if k in index}
    spans, groups, _ = self._state_spans(state)
    if any([written.intersection(group) for group in groups]):
      return None
    return _span_index([(pos, span) for pos, span in spans if pos in written])

  def _aliased(self, key: tuple, plan: tuple, program: _Program) -> _Program:
    """The program of `key` for tensors sharing memory as `plan` says (`_alias_plan`)."""
    full = (*key, plan)
    aliased = self._programs.get(full)
    if aliased is None:
      aliased = self._programs[full] = _Program(
        self, program.spec, program.statics, self._names, program.amp, plan
      )
    return aliased

  def _state_arrays(self, state: list) -> tuple[list, Any]:
    """The state's JAX arrays and device (None: the CPU). A torch tensor's array is kept
    while it holds the tensor's values (`_current`), so parameters are not imported again
    on every call."""
    cache = self._imported
    if len(cache) != len(state):
      cache[:] = [None] * len(state)
      self._state_gen += 1
    arrays = []
    device: Any = _NO_DEVICE
    for i, t in enumerate(state):
      d = t._storage.device if type(t) is tensor_lib.Tensor else None if t.is_cpu else t.device
      if device is _NO_DEVICE:
        device = d
      elif d is not device and d != device:
        raise _device_error(self.name, device, d)
      if type(t) is tensor_lib.Tensor:
        arrays.append(t._storage.array if t._whole else tensor_lib.value(t))
        hit = cache[i]
        if hit is None or hit[0] is not t or hit[2] is not t._storage:
          cache[i] = (t, (), t._storage, _COPY)  # (its memory, for `_state_spans`)
          self._state_gen += 1
        continue
      hit = cache[i]
      if hit is None or hit[0] is not t or not _current(hit, t):
        hit = cache[i] = _hold(t, "a parameter or buffer")
        self._state_gen += 1
      arrays.append(hit[2])
    return arrays, device

  # --- arguments -------------------------------------------------------------------------

  def _split(self, args: tuple, kwargs: dict) -> tuple[Any, tuple, list, tuple]:
    """(spec, statics, dynamic values, shape/dtype key) of the arguments."""
    leaves, spec = tree_lib.flatten((args, kwargs))
    dynamic = (
      self._dynamic_leaves(args, kwargs, len(leaves))
      if (self.dynamic_argnums or self.dynamic_argnames)
      else None
    )
    statics, dyn, sig = [], [], []
    for i, leaf in enumerate(leaves):
      if isinstance(leaf, torch.Tensor):
        dyn.append(leaf)
        statics.append(_DYN)
        sig.append((leaf.shape, leaf.dtype))
      elif dynamic is not None and dynamic[i] and type(leaf) in _SCALARS:
        value = torch.tensor(leaf)  # a 0-dim tensor of torch's dtype for the number
        dyn.append(value)
        statics.append(_DYN)
        sig.append((value.shape, value.dtype))
      else:
        try:
          hash(leaf)
        except TypeError:
          path = self._argument_path(args, kwargs, i)
          if isinstance(leaf, np.ndarray):
            raise BridgeTypeError(
              f"`{API}`: argument {path} is a NumPy array; the compiled callable takes torch "
              "tensors (CPU or `jax` device). Pass `torch.from_numpy(...)` (no copy), or call "
              "a JAX function with `bridge.call_jax`, which takes arrays."
            ) from None
          raise BridgeTypeError(
            f"`{API}`: argument {path} is a {type(leaf).__name__}, neither a tensor nor a "
            "hashable value, so it cannot be a static argument of the compiled program. Pass "
            "a tensor, a hashable value (e.g. a tuple), or close over it."
          ) from None
        statics.append(leaf)
    return spec, tuple(statics), dyn, tuple(sig)

  def _argument_path(self, args: tuple, kwargs: dict, i: int) -> str:
    """Leaf `i` of (args, kwargs) named as the user wrote it: `x`, `batch['ids']`, `args[2]`."""
    arg_paths = tree_lib.leaf_paths(args)
    if i >= len(arg_paths):
      return (
        tree_lib.leaf_paths(kwargs)[i - len(arg_paths)].replace("['", "", 1).replace("']", "", 1)
      )
    path = arg_paths[i]  # "[k]..." for positional argument k
    k = int(path[1 : path.index("]")])
    sig = _signature(self.target)
    params = _positional(sig) if sig is not None else []
    name = params[k].name if k < len(params) else f"args[{k}]"
    return name + path[path.index("]") + 1 :]

  def _dynamic_leaves(self, args: tuple, kwargs: dict, n: int) -> list[bool]:
    marks = []
    for i, a in enumerate(args):
      marks += [i in self.dynamic_argnums] * len(tree_lib.flatten(a)[0])
    for k in sorted(kwargs):
      marks += [k in self.dynamic_argnames] * len(tree_lib.flatten(kwargs[k])[0])
    return marks if len(marks) == n else [False] * n

  # --- the call ----------------------------------------------------------------------------

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    """Runs the compiled program on these arguments (tracing and compiling it first for a
    new argument signature); torch tensors in, torch tensors out, in the forward's pytree."""
    return self._call(args, kwargs)

  def _call(self, args: tuple, kwargs: dict) -> Any:
    """The general path of a call; it records a plain call for the shortcuts (`_record`)."""
    if self.module is not None:
      guard = self._guard
      if guard is None or not guard.holds():
        self._reguard()
    state = self._state()
    fast = not kwargs
    if fast:  # the common case, tensors only, skips the pytree machinery
      for a in args:
        if not isinstance(a, torch.Tensor):
          fast = False
          break
    dyn: Sequence[Any]
    if fast:
      spec, statics, dyn = len(args), (_DYN,) * len(args), args
      sig = tuple([(a.shape, a.dtype) for a in args])
    else:
      spec, statics, dyn, sig = self._split(args, kwargs)
    first = dyn[0] if dyn else state[0] if state else None
    amp_device = tensor_lib.device_type() if type(first) is tensor_lib.Tensor else "cpu"
    amp = torch.get_autocast_dtype(amp_device) if torch.is_autocast_enabled(amp_device) else None
    # (static arguments by type too: `1`, `True` and `1.0` are equal but trace differently;
    # and torch's default dtype, which a factory in the forward reads)
    key = (
      spec,
      statics,
      None if fast else tuple([type(s) for s in statics]),
      tuple([m.training for m in self._submodules]),
      sig,
      amp,
      torch.get_default_dtype(),
    )
    program = self._programs.get(key)
    if program is None or (
      program.info is not None
      and program.info.constants
      and not _constants_hold(program.info.constants)
    ):  # (a CPU tensor baked into the program changed: traced again, as for a new key)
      program = self._programs[key] = _Program(self, spec, statics, self._names, amp)
    info = program.info
    if info is None or info.draws:  # (`_locked`; not yet traced: it may draw and update)
      with self._lock, rng.generator_lock():
        return self._run(program, state, args, dyn, fast, amp, key)
    if info.mutated:
      with self._lock:
        return self._run(program, state, args, dyn, fast, amp, key)
    return self._run(program, state, args, dyn, fast, amp, key)

  def _run(
    self,
    program: _Program,
    state: list,
    args: tuple,
    dyn: Any,
    fast: bool,
    amp: torch.dtype | None,
    key: tuple = (),
  ) -> Any:
    """Runs `program` on the module's state and the call's tensors `dyn` (a plain call's
    `args`, when `fast`), and writes back what it updated. Where the program writes a tensor
    that shares memory with another, its variant for that sharing runs (`_alias_plan`)."""
    traces = self._traces
    grad = torch.is_grad_enabled()
    prev = _x64_state.swap_local(True)
    try:
      arrays, device = self._state_arrays(state)
      info = program.info
      if info is not None and not program.alias and (info.mutated or info.written):
        plan = _alias_plan(self, info, state, dyn, grad)
        if plan:
          return self._run(self._aliased(key, plan, program), state, args, dyn, fast, amp, key)
      if info is not None and not info.draws and program.spare_key is not None:
        arrays.append(program.spare_key)  # (unused: no generator advanced, as in eager)
      else:
        drawn = rng._key if rng._key is not None else rng.current_key()
        if program.spare_key is None:
          program.spare_key = drawn
        arrays.append(drawn)
      for t in dyn:
        if type(t) is tensor_lib.Tensor:
          arrays.append(t._storage.array if t._whole else tensor_lib.value(t))
          d: torch.device | None = t._storage.device
        else:
          arrays.append(_array(t))
          if t.is_cpu and t.dim() == 0:
            continue  # (a 0-d CPU tensor goes beside any device's tensors, as in eager torch)
          d = None if t.is_cpu else t.device
        if device is _NO_DEVICE:
          device = d
        elif d is not device and d != device:
          raise _device_error(self.name, device, d)
      if device is _NO_DEVICE:  # no tensor in or kept (a call without arguments): the CPU's
        device = None
      n = len(state)
      for _, (rel, numel), rows in program.alias:  # each group's memory, one more input
        pos = rows[0][0]
        first = state[pos] if pos < n else dyn[pos - n - 1]
        arrays.append(
          _array(first.detach().as_strided((numel,), (1,), int(first.storage_offset()) + rel))
        )
      try:
        recorded = grad and (
          any([t.requires_grad for t in state]) or any([t.requires_grad for t in dyn])
        )
        # (forward-mode AD: a tangent goes through the same autograd node's `jvp`)
        if recorded or (_fwd_ad._current_level >= 0 and _has_tangent(state, dyn)):
          if recorded and self._guard is not None and self._guard.backward_hooks:
            raise self._backward_hooks_error()
          outs, updates, new_key = self._call_with_grad(
            program, arrays, state + list(dyn), len(state), device
          )
          if self._traces != traces:
            self._retake()
          if program.traced.written:
            _check_written(program.traced.written, dyn, self.name)
        else:
          outs, updates, new_key = self._forward(program, arrays, len(state))
          if self._traces != traces:  # before a shortcut records the guard
            self._retake()
          info = program.traced
          plain = fast and amp is None and not info.written and info.plain_io and not program.alias
          if type(device) is torch.device and device.type == tensor_lib.device_type():
            outs = [tensor_lib.make_result(o, device) for o in outs]
            if plain:
              self._record_fast(program, state, args, device, outs, arrays)
          else:
            outs = [_to_torch(o, None) for o in outs]
            if plain and (device is None or device.type == "cuda"):
              self._record_fast_cpu(program, state, args, arrays, device)
      except ValueError as e:
        if "incompatible devices" not in str(e):
          raise
        raise self._placement_error(arrays, len(state)) from e
      info = program.traced
      if self._traces != traces and not program.alias and (info.mutated or info.written):
        # (just traced: now that what it writes is known, the tensors sharing memory)
        plan = _alias_plan(self, info, state, dyn, grad)
        if plan:
          return self._run(self._aliased(key, plan, program), state, args, dyn, fast, amp, key)
    finally:
      _x64_state.set_local(prev)
    return self._finish(program, outs, updates, new_key, dyn, state)

  def _record(self, call: Callable[..., Any] | None) -> None:
    """Makes `call` (a `_fast_call` / `_fast_cpu_call` closure, or None to forget the last
    one) what calling this object runs first."""
    if call is None and self._fast is None:
      return
    self._fast = call
    own = type(self)
    if call is None:
      if "__call__" in own.__dict__:
        delattr(own, "__call__")
    else:
      own.__call__ = call  # type: ignore[method-assign]

  def _record_fast(
    self,
    program: _Program,
    state: list,
    args: tuple,
    device: torch.device,
    outs: list,
    arrays: list,
  ) -> None:
    """Records this call for the shortcut if it was a plain one on the `jax` device."""
    tensors = state + list(args)
    written = self._written_memory(program, state)
    if written is not None and all(
      [type(t) is tensor_lib.Tensor and t._whole and t._storage.device is device for t in tensors]
    ):
      sig = tuple([(a._storage.array.shape, a._storage.array.dtype) for a in args])
      self._record(
        _locked(
          self,
          program,
          _fast_call(
            self,
            program,
            sig,
            device,
            tuple([o.dtype for o in outs]),
            _fixed_key(program, arrays, len(state)),
            frozenset(written),
          ),
        )
      )
    else:
      self._record(None)

  def _record_fast_cpu(
    self, program: _Program, state: list, args: tuple, arrays: list, device: Any = None
  ) -> None:
    """Records this call for the shortcut if it was a plain one with CPU tensors, or with
    tensors of one CUDA GPU (`device`)."""
    imported = self._imported
    written = self._written_memory(program, state)
    if (
      written is not None
      and len(imported) == len(state)
      and all([h is not None and h[0] is t for h, t in zip(imported, state)])
      and all([type(a) in _PLAIN for a in args])
    ):
      sig = tuple([(a.shape, a.dtype) for a in args])
      gpu = None if device is None else device.index or 0
      self._record(
        _locked(
          self,
          program,
          _fast_cpu_call(
            self,
            program,
            sig,
            list(imported),
            _fixed_key(program, arrays, len(state)),
            gpu,
            written or None,
          ),
        )
      )
    else:
      self._record(None)

  def _finish(
    self,
    program: _Program,
    outs: list,
    updates: tuple,
    new_key: Any,
    dyn: Sequence[Any] = (),
    state: Sequence[Any] = (),
  ) -> Any:
    """Writes back the key, the updated buffers and the arguments written in place (`dyn`:
    the call's tensors; shortcuts take no program that writes them), and the arguments' new
    shapes and strides; the outputs in the forward's structure, those that share memory with
    the call's tensors or with one another made views of them (`_output_plan`)."""
    info = program.traced
    if info.restrided:
      _check_restrided(info.restrided, dyn, self.name)
    if new_key is not None:
      rng.set_key(new_key)
    if info.groups_written:  # each alias group's memory, whole
      n = len(info.mutated) + len(info.written)
      tensors = [*state, None, *dyn]
      for g, new in zip(info.groups_written, updates[n:]):
        _, (rel, numel), rows = program.alias[g]
        first = tensors[rows[0][0]]
        span = first.detach().as_strided((numel,), (1,), int(first.storage_offset()) + rel)
        with torch.no_grad():
          special.copy_into(span, array_to_tensor(new, lambda: "an argument", API))
      updates = updates[:n]
    if info.written:
      n = len(info.mutated)
      for i, new in zip(info.written, updates[n:]):
        if isinstance(new, torch.Tensor):  # an output of the call's autograd node: a copy
          dyn[i].copy_(new)  # torch records (the argument's new value has its gradient)
        else:
          special.copy_into(dyn[i], array_to_tensor(new, lambda: "an argument", API))
      updates = updates[:n]
    if updates:  # (only a module's forward has state to update)
      modules_lib.write_back(self.module, dict(zip(info.mutated, updates)))  # type: ignore[arg-type]
    for i, size, stride, offset, given, _ in info.restrided:
      t = dyn[i]
      with torch.no_grad() if t.is_leaf else contextlib.nullcontext():
        t.as_strided_(size, stride, int(t.storage_offset()) - given + offset)
    if info.out_plan:
      grouped = {row[0] for _, _, rows in program.alias for row in rows}
      outs = _as_views(info.out_plan, outs, list(state) + [None] + list(dyn), grouped)
    if info.out_plain:
      return outs[0] if info.out_single else info.out_spec.treedef.unflatten(outs)
    it = iter(outs)
    leaves = tree_lib.merge(info.out_statics, it)
    return tree_lib.unflatten(info.out_spec, leaves)

  def _forward(self, program: _Program, arrays: list, n: int) -> tuple:
    """`program.forward(*arrays)`; where it refuses the arguments, as `_retry` decides."""
    try:
      return program.forward(*arrays)
    except (TypeError, ValueError) as e:
      return self._retry(program, arrays, n, e)
    except _JaxRuntimeError as e:
      ffi.reraise(e)  # a value check's (or a fallback op's) own error, as torch raises it
      raise

  def _retry(self, program: _Program, arrays: list, n: int, error: Exception) -> tuple:
    """`program.forward` refused the arguments: an ahead-of-time compiled tier gives way to
    `jax.jit`; `jax.jit` itself refusing arrays placed on different devices is the user's."""
    if program.mismatch():
      try:
        return program.forward(*arrays)
      except ValueError as e:
        error = e
    if isinstance(error, ValueError) and "incompatible devices" in str(error):
      raise self._placement_error(arrays, n) from error
    raise error

  def _backward_hooks_error(self) -> BridgeError:
    return BridgeError(
      f"`{API}({self.name})`: {', '.join(self._guard.backward_hooks[:3])} has a module "  # type: ignore[union-attr]
      "backward hook (`register_full_backward_hook`, `register_full_backward_pre_hook` or "
      "a global one). A compiled call's backward is JAX's derivative of the traced forward, "
      "which cannot run torch's module backward hooks, so its gradients would skip them. "
      "Remove the hook (`handle.remove()`), or hook tensors instead (`out.register_hook(...)` "
      "on the call's output, `param.register_hook(...)` on a parameter), or call it under "
      "`torch.no_grad()` where no backward is needed."
    )

  def _placement_error(self, arrays: list, n: int) -> Exception:
    """The module's state and the arguments are on different sets of devices (meshes)."""
    state = [f"parameter/buffer {name}" for name in self._names]
    # a line per set of devices the state is on, and one per argument (the user's own
    # tensors, each named); the bridge's key only where it is alone on its devices
    lines = placement_lines(zip(state, arrays[:n]), distinct=True)
    lines += placement_lines((f"argument {i}", a) for i, a in enumerate(arrays[n + 1 :]))
    if len(arrays) > n and devices_of(arrays[n]) not in {
      devices_of(a) for i, a in enumerate(arrays) if i != n
    }:
      lines += placement_lines([("the random key", arrays[n])])
    return DeviceMismatchError(
      f"`{API}({self.name})`: the module's state and the arguments are placed on different "
      "sets of devices:\n" + "\n".join(lines) + "\nOne compiled program runs on one mesh: "
      "place them together first (`bridge.shard(module, sharding)` and "
      "`bridge.shard(x, sharding)` with shardings over the same mesh)."
    )

  def _call_with_grad(
    self, program: _Program, arrays: list, tensors: list, n: int, device: torch.device | None
  ) -> tuple:
    positions = [i if i < n else i + 1 for i in range(len(tensors))]  # the key sits at n
    entries = [(pos, pos, t) for pos, t in zip(positions, tensors)]
    if not (type(device) is torch.device and device.type == tensor_lib.device_type()):
      device = None  # the CPU (or a CUDA device): outputs cross by transfer
    to_torch = functools.partial(_outputs_to_torch, device)
    try:
      flat, out_def = vjp.call_with_grad(program, arrays, entries, to_torch, device)
    except _JaxRuntimeError as e:
      ffi.reraise(e)  # a value check's (or a fallback op's) own error, as torch raises it
      raise
    outs, updates, new_key = out_def.unflatten(flat)
    # (the arguments' new values stay outputs of the autograd node: `_finish` writes them with
    # a copy torch records, as eager torch records the forward's in-place ops)
    n_mutated = len(program.traced.mutated)
    updates = [
      u
      if i >= n_mutated
      else tensor_lib.value(u)
      if type(u) is tensor_lib.Tensor
      else transfer.tensor_to_jax(u.detach(), api=API, where=lambda: "a buffer update")
      for i, u in enumerate(updates)
    ]
    if new_key is not None:
      new_key = (
        tensor_lib.value(new_key)
        if isinstance(new_key, tensor_lib.Tensor)
        else transfer.tensor_to_jax_arg(new_key, api=API, where=lambda: "the key")
      )
    return list(outs), updates, new_key


def _named(module: str | None, qualname: str | None) -> Any:
  """The object `module.qualname` names (importing the module), or None."""
  if not module or not qualname or "<" in qualname:
    return None
  try:
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
      found = getattr(found, part)
  except (ImportError, AttributeError):
    return None
  return found


def _recompile(target: Any, argnums: tuple, argnames: tuple) -> "Compiled":
  """`pickle`'s way back to a `Compiled` (see `Compiled.__reduce__`)."""
  return Compiled(target, dynamic_argnums=argnums, dynamic_argnames=argnames)


def _signature(target: Any) -> inspect.Signature | None:
  """The signature a call of `target` binds to (a module's `forward`), or None (a builtin)."""
  fn = target.forward if isinstance(target, torch.nn.Module) else target
  try:
    return inspect.signature(fn)
  except (TypeError, ValueError):
    return None


def _positional(sig: inspect.Signature) -> list[inspect.Parameter]:
  kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
  return [p for p in sig.parameters.values() if p.kind in kinds]


def _dynamic_arguments(
  target: Callable[..., Any], argnums: Iterable[int], argnames: Iterable[str]
) -> tuple[frozenset[int], frozenset[str]]:
  """`dynamic_argnums`/`dynamic_argnames` completed through the signature, as `jax.jit`
  completes its static ones: each number's name and each name's position, so an argument
  is dynamic whichever way it is passed. An unknown name or an out-of-range number raises."""
  nums: set[Any] = {argnums} if isinstance(argnums, int) else set(argnums)
  names: set[Any] = {argnames} if isinstance(argnames, str) else set(argnames)
  for num in nums:
    if not isinstance(num, int) or isinstance(num, bool) or num < 0:
      raise BridgeTypeError(
        f"`{API}`: dynamic_argnums takes argument positions (ints >= 0), got {num!r}."
      )
  for name in names:
    if not isinstance(name, str):
      raise BridgeTypeError(f"`{API}`: dynamic_argnames takes argument names, got {name!r}.")
  sig = _signature(target)
  if sig is None:  # no signature to check against (a builtin)
    return frozenset(nums), frozenset(names)
  kinds = inspect.Parameter
  params = list(sig.parameters.values())
  positional = _positional(sig)
  var_positional = any(p.kind == kinds.VAR_POSITIONAL for p in params)
  var_keyword = any(p.kind == kinds.VAR_KEYWORD for p in params)
  fn = target.forward if isinstance(target, torch.nn.Module) else target
  where = f"{getattr(fn, '__qualname__', type(target).__name__)}{sig}"
  for n in sorted(nums):
    if n < len(positional):
      if positional[n].kind == kinds.POSITIONAL_OR_KEYWORD:
        names.add(positional[n].name)
    elif not var_positional:
      raise BridgeTypeError(
        f"`{API}`: dynamic_argnums has {n}, but {where} takes {len(positional)} positional "
        "argument(s)."
      )
  for name in sorted(names):
    p = sig.parameters.get(name)
    if p is None:
      if not var_keyword:
        raise BridgeTypeError(
          f"`{API}`: dynamic_argnames has {name!r}, which is not an argument of {where}."
        )
    elif p.kind in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD):
      raise BridgeTypeError(
        f"`{API}`: dynamic_argnames has {name!r}, the *{name} of {where}; name the "
        "arguments themselves (or give their positions in dynamic_argnums)."
      )
    elif p.kind == kinds.POSITIONAL_OR_KEYWORD:
      nums.add(positional.index(p))
  return frozenset(nums), frozenset(names)


def _array(t: torch.Tensor) -> Any:
  if type(t) is tensor_lib.Tensor:
    return t._storage.array if t._whole else tensor_lib.value(t)
  a = transfer.fast_tensor_arg(t) if transfer.default_device_is_cpu() else None
  if a is None:
    a = transfer.tensor_to_jax_arg(t.detach(), api=API, where=lambda: "a tensor argument")
  return a


_NO_DEVICE = object()  # no tensor seen yet
# the CPU shortcut's argument types: plain tensors, and parameters (which torch.compile's
# graphs take as arguments)
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _check_written(written: tuple, dyn: Sequence[Any], name: str) -> None:
  """A forward that writes in place into an argument torch autograd records: torch's error for
  a leaf that requires grad, as eager torch raises it. (Another argument is written with a
  copy torch records: `Compiled._finish`.)"""
  for i in written:
    t = dyn[i]
    if t.requires_grad and t.is_leaf:
      raise RuntimeError(
        "a leaf Variable that requires grad is being used in an in-place operation."
      )


def _extent(t: torch.Tensor) -> int:
  """Elements from a tensor's first to past its last in memory (torch's strides are >= 0)."""
  return 1 + sum([(n - 1) * st for n, st in zip(t.shape, t.stride())])


def _span(t: Any) -> tuple | None:
  """(what memory, first byte, past the last byte) of a tensor's elements: a `jax` tensor's
  storage, or a device's memory by address; None for an empty or non-strided one."""
  if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.numel() == 0:
    return None
  size = t.element_size()
  if type(t) is tensor_lib.Tensor:
    lo = int(t.storage_offset()) * size
    return (id(t._storage), lo, lo + _extent(t) * size)
  lo = t.data_ptr()
  return (str(t.device), lo, lo + _extent(t) * size)


def _overlapping(spans: list) -> list[list[int]]:
  """The groups (of two or more) of the `(position, span)`s whose memory overlaps, each
  group's overlaps linking them (a sweep over each memory's spans sorted by address)."""
  by_memory: dict[Any, list] = {}
  for pos, (memory, lo, hi) in spans:
    by_memory.setdefault(memory, []).append((lo, hi, pos))
  groups = []
  for items in by_memory.values():
    if len(items) < 2:
      continue
    items.sort()
    group, end = [items[0][2]], items[0][1]
    for lo, hi, pos in items[1:]:
      if lo < end:
        group.append(pos)
        end = max(end, hi)
      else:
        if len(group) > 1:
          groups.append(group)
        group, end = [pos], hi
    if len(group) > 1:
      groups.append(group)
  return groups


def _span_index(spans: list) -> dict:
  """Per memory, the starts of the `(position, span)`s' spans sorted and the running maximum of
  their ends: what `_touches` searches."""
  index: dict[Any, tuple[list, list]] = {}
  for _, (memory, lo, hi) in sorted(spans, key=lambda p: p[1][1]):
    starts, ends = index.setdefault(memory, ([], []))
    starts.append(lo)
    ends.append(max(hi, ends[-1]) if ends else hi)
  return index


def _touches(index: dict, span: tuple | None) -> bool:
  """Whether `span` overlaps one of the spans `index` holds: per memory, their starts sorted
  and the running maximum of their ends (`Compiled._state_spans`)."""
  if span is None:
    return False
  entry = index.get(span[0])
  if entry is None:
    return False
  starts, ends = entry
  j = bisect.bisect_left(starts, span[2])
  return j > 0 and ends[j - 1] > span[1]


def _alias_plan(
  compiled: "Compiled", info: "_Info", state: list, dyn: Sequence[Any], grad: bool
) -> tuple:
  """The tensors of a call that share memory where the forward writes one of them (a buffer
  passed as an argument too, two buffers that are views of one tensor): () where none does.

  Each group becomes one input of the program, the memory the group spans, of which the
  program makes its tensors views (`_Program.apply`), so that a write through one is read
  through the others as in eager torch: (dtype, the span's offset in elements from the first
  tensor's, members), each member (flat position, size, stride, offset in the span). Tensors
  sharing memory that cannot be so (different storages over the same memory, different
  dtypes, a tensor that requires grad where a gradient is recorded) raise a `BridgeError`."""
  n = len(state)
  index = compiled._name_index()
  written = {index[k] for k in info.mutated if k in index}
  written.update(n + 1 + i for i in info.written)
  if not written:
    return ()
  spans, groups, index = compiled._state_spans(state)
  hit = any([written.intersection(group) for group in groups])
  arg_spans = []
  for i, t in enumerate(dyn):
    span = _span(t)
    if span is not None:
      arg_spans.append((n + 1 + i, span))
      hit = hit or _touches(index, span)
  if not hit and len(arg_spans) > 1:
    hit = bool(_overlapping(arg_spans))
  if not hit:
    return ()
  spans = spans + arg_spans
  grad = grad and any([t.requires_grad for t in [*state, *dyn] if isinstance(t, torch.Tensor)])
  tensors = {pos: (state[pos] if pos < n else dyn[pos - n - 1]) for pos, _ in spans}
  plan = []
  for group in _overlapping(spans):
    if not written.intersection(group):
      continue  # (read-only sharing: the program reads the same values)
    group.sort()
    members = [tensors[pos] for pos in group]
    refusal = _unaliasable(members, grad)
    if refusal:
      raise _aliasing_error(compiled, group, written, refusal)
    low = min(int(t.storage_offset()) for t in members)
    rows = tuple(
      [
        (pos, tuple(t.shape), tuple(t.stride()), int(t.storage_offset()) - low)
        for pos, t in zip(group, members)
      ]
    )
    numel = max(off + _extent(t) for (_, _, _, off), t in zip(rows, members))
    plan.append((members[0].dtype, (low - int(members[0].storage_offset()), numel), rows))
  return tuple(plan)


def _unaliasable(members: list, grad: bool) -> str:
  """Why tensors sharing memory cannot be views of one span in the program ('' if they can)."""
  first = members[0]
  if any(t.dtype != first.dtype for t in members):
    return "they have different dtypes"
  if grad:
    return "a gradient is recorded through the call (call it under `torch.no_grad()`)"
  if type(first) is tensor_lib.Tensor:
    if any(
      type(t) is not tensor_lib.Tensor
      or t._storage is not first._storage
      or t._as is not None
      or t.is_conj()
      or t.is_neg()
      for t in members
    ):
      return "they are views of one memory as different types"
    return ""
  base = first.untyped_storage().data_ptr()
  if any(t.is_conj() or t.is_neg() or t.untyped_storage().data_ptr() != base for t in members):
    return "they are different storages over the same memory (e.g. two `torch.from_numpy`)"
  return ""


def _aliasing_error(compiled: "Compiled", group: list, written: set, why: str) -> BridgeError:
  n = len(compiled._names)

  def name(pos: int) -> str:
    return (
      f"parameter/buffer {compiled._names[pos]!r}" if pos < n else f"tensor argument {pos - n - 1}"
    )

  writes = [name(p) for p in group if p in written]
  others = [name(p) for p in group if p not in written]
  return BridgeError(
    f"`{API}`: {compiled.name} writes in place into {', '.join(writes)}, which shares memory "
    f"with {', '.join(others) or 'one another'}; the compiled program cannot make them views "
    f"of one memory, as {why}, so it would not see the write through the other. Pass tensors "
    "that do not share memory (`.clone()` one of them), or register them as one buffer and "
    "take views of it in `forward`."
  )


def _check_restrided(restrided: tuple, dyn: Sequence[Any], name: str) -> None:
  """The forward changed an argument's shape or strides in place (`x.unsqueeze_(0)`): the
  call gives the caller's tensor the traced ones, which are its own where it was given
  contiguous (the program holds an argument as its values, contiguous) or as a view of a
  memory shared with other tensors. A view of other strides is refused."""
  for i, size, _, _, _, grouped in restrided:
    t = dyn[i]
    if not (grouped or t.is_contiguous()):
      raise BridgeError(
        f"`{API}`: {name} changes the shape or strides of its tensor argument {i} in place "
        f"(to {size}), which is a non-contiguous view (shape {tuple(t.shape)}, stride "
        f"{tuple(t.stride())}): the compiled program cannot tell its strides. Pass a "
        "contiguous tensor (`x.contiguous()`), or return the reshaped tensor instead."
      )


def _as_views(plan: tuple, outs: list, tensors: list, grouped: set) -> list:
  """The outputs `_output_plan` relates to the call's tensors (`tensors`: the state, None
  for the key, the arguments) or to one another, made those tensors or views of them; the
  arrays of the new storages shared by outputs, after the outputs, taken off. A view of a
  tensor the program took as its values (not in an alias group, `grouped`) is made where
  that tensor is contiguous (the program's strides are then its own); otherwise it stays
  the program's new tensor."""
  n_outs = len(outs) - len({where for _, how, where, *_ in plan if how == "base"})
  bases = outs[n_outs:]
  outs = outs[:n_outs]
  for k, how, where, size, stride, offset, given in plan:
    if how == "base":
      base = bases[where]
      outs[k] = base.as_strided(size, stride, offset)
      continue
    t = tensors[where]
    if how == "same":
      outs[k] = t
    elif where in grouped or t.is_contiguous():
      outs[k] = t.as_strided(size, stride, int(t.storage_offset()) - given + offset)
  return outs


def _device_error(name: str, first: Any, other: Any) -> TransferError:
  first, other = first or torch.device("cpu"), other or torch.device("cpu")
  return TransferError(
    f"`{API}`: {name} got tensors on two devices, {first} and {other} (parameters, "
    f"buffers and arguments together). Move them to one device first, e.g. "
    f"`module.to('{first}')` and `x.to('{first}')`."
  )


def _to_torch(a: Any, device: torch.device | None) -> torch.Tensor:
  if device is not None:
    return tensor_lib.make_result(a, device)
  t = transfer.fast_array_out(a)
  if t is None:
    t = transfer.array_to_torch(a, api=API, where=lambda: "an output")
  return t


def _outputs_to_torch(device: torch.device | None, entry: Any, out: Any) -> tuple[list, Any]:
  leaves, treedef = jax.tree_util.tree_flatten(out)
  return [_to_torch(a, device) for a in leaves], treedef


def compile(
  target: Callable[..., Any],
  *,
  dynamic_argnums: Iterable[int] = (),
  dynamic_argnames: Iterable[str] = (),
) -> Compiled:
  """Compiles a torch module or function into one cached `jax.jit` program; call it from torch.

  The returned callable takes and returns torch tensors (on the CPU or the `jax`
  device, outputs where the inputs are). Each call runs the whole forward as one
  XLA program, cached per input shapes/dtypes, argument structure, static
  arguments and the train/eval mode of every submodule (`.train()` / `.eval()`
  switch programs).

  Module state is threaded through on every call: the current parameters and
  buffers are inputs (a change made by the user between calls is seen by the next
  one), buffers the forward updates (BatchNorm running statistics) are written
  back after it, and random ops (dropout in train mode) draw from the `jax`
  device's generator, whose key goes in and comes out of the program, so each call
  draws fresh numbers and `torch.manual_seed` makes runs reproducible.

  Under `torch.autocast` (for the inputs' device, `"cpu"` or `"jax"`), the program
  is traced with the same mixed-precision policy, and kept apart from the
  full-precision one.

  Python `bool`/`int`/`float` arguments are static (a new value compiles a new
  program) unless named in `dynamic_argnums` / `dynamic_argnames`, which pass them
  as 0-dim tensors. With grad mode on and an input or parameter that requires grad,
  the call joins torch's autograd graph; `loss.backward()` runs the compiled JAX
  VJP, so a torch optimizer can train the compiled module.

  A function (rather than a module) has no state threaded: tensors it closes over
  are constants of the program, as are CPU tensors a module keeps as plain
  attributes; one changed in place makes the next call trace again with its new
  values (binding the name to another tensor is not seen).

  As with `torch.compile`'s guards, each call checks that the module still computes
  what was traced, and traces again where it changed: its tree of submodules (one
  replaced, added, removed or set to None; a parametrization registered), the
  names of its parameters and buffers (one registered, deleted or set to None),
  forward and forward-pre hooks on any submodule and torch's global module hooks,
  and the plain attributes of every submodule (`Dropout.p`, `LayerNorm.eps`, your
  own `self.scale = 2.0`): numbers, strings, dtypes and tuples of them by value,
  other objects by identity. Every attribute counts, read by the forward or not, so
  a value kept on the module and changed between calls (a step counter) makes each
  next call trace again: pass it as an argument instead (`dynamic_argnums` for a
  number that changes). Train/eval modes are part of the cache key; parameters
  and buffers are inputs of the program, so a new tensor, shape, dtype or device is
  seen without a new trace. Attributes the forward itself sets while it is traced
  (a call counter) are its own business, not guarded. Hooks and other Python side
  effects of the forward run when it is traced, not on every call. Module backward
  hooks cannot run in the compiled backward (JAX's derivative of the trace): a call
  that torch autograd records raises instead of skipping them. A tensor argument the
  forward writes in place is written back after the call, as in eager torch (recorded by
  autograd; torch's error for a leaf that requires grad), with any shape or stride change
  made in place. Tensors that share memory, one of them written (a buffer passed as an
  argument), are views of one memory in the program; outputs that are inputs, state or
  views of them or of one another come back as those tensors or views (see
  docs/compile.md for what is not kept).

  The guards cannot see: what the forward reads outside the module (globals,
  closures, attributes of other objects), other than CPU tensors changed in place through
  torch (a write that leaves the version counter alone, `w.data[0] += 1`, is not seen);
  changes inside a container or object kept as an attribute (`self.cfg["k"] = v`, a
  list appended to, `self.cfg.k = v`); a number replaced by an equal one of another
  type (2 by 2.0, 1 by True) when nothing else changed; an assignment to a
  submodule's `__class__` or `__dict__`. After such a change, compile the module
  again.

  Threads: a trace swaps the module's parameters for traced tensors in the tracing
  thread only, so other threads may meanwhile run the module eagerly or call the
  compiled module (with new shapes too). A program that updates buffers runs under
  the compiled module's lock: reading the state, running and writing the updates
  back is one step, so BatchNorm called from several threads counts every call.

  A large CPU program compiles in two tiers: its first call runs a version compiled
  with XLA's optimizations off, while the optimized version compiles in a background
  thread and takes over when ready (`Compiled.wait_optimized()` waits for it;
  `bridge.config(tiered_compile=False)` compiles once, fully).

  Args:
    target: an `nn.Module`, a bound method of one, or a torch function.
    dynamic_argnums: positions of Python-number arguments to pass as tensors.
    dynamic_argnames: names of keyword Python-number arguments to pass as tensors.

  Returns:
    A `Compiled` callable.

  Example:
    >>> import torch, bridge
    >>> model = bridge.compile(torch.nn.Linear(4, 2))
    >>> model(torch.ones(3, 4)).shape
    torch.Size([3, 2])
  """
  if not callable(target):
    raise BridgeTypeError(
      f"`{API}`: expected a module or a function, got a {type(target).__name__}."
    )
  return Compiled(target, dynamic_argnums, dynamic_argnames)
