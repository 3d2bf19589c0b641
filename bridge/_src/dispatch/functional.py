"""The plan of a functional op (one that writes none of its arguments): its lowering,
jitted and cached per static signature, run eagerly or staged.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import jax
import numpy as np
import torch
from jax._src import config as _jax_config

from bridge._src import config as config_lib
from bridge._src import ffi, narrowing, rng, scope
from bridge._src import tree as tree_lib
from bridge._src.dispatch.checks import install_checks
from bridge._src.dispatch.executable import (
  NO_KEY,
  TRACED_SCALARS,
  Executable,
  replayable,
)
from bridge._src.dispatch.folding import UNKNOWN, fold
from bridge._src.dispatch.resolve import lowering_fn
from bridge._src.dispatch.schema import is_dynamic_type, quiet_narrowing
from bridge._src.dispatch.tensors import (
  LIKE_OPS,
  device_error,
  factory_device,
  placed_like,
  placement_error,
  scalar_from_cpu,
  wrap,
)
from bridge._src.registry import REGISTRY
from bridge._src.tensor import Tensor, value
from bridge._src.transfer import ArrayImpl

_tree_flatten = jax.tree_util.tree_flatten
_config_var = config_lib._CURRENT
_scope_var = scope._ACTIVE
_CONTAINERS = (list, tuple, dict)
_x64_state = _jax_config.enable_x64
_DYN = tree_lib.DYN


class FunctionalPlan:
  """A non-mutating op: lowering (or decomposition), cached per static signature."""

  def __init__(self, func: Any):
    self.func = func
    self.kinds: dict[Any, tuple[int, ...]] = {}  # 0 static, 1 traced, 2 traced (CPU allowed)
    self.exes: dict[tuple, Executable] = {}
    self.lock = threading.Lock()
    lowering = REGISTRY.lookup(func)
    install_checks()
    self.static_names = lowering.static_argnames if lowering is not None else frozenset()
    self.like = func in LIKE_OPS  # its result goes where its first argument is
    # `-> bool` (equal, allclose, is_nonzero...): torch code receives a Python value
    rets = func._schema.returns
    self.python_result = len(rets) == 1 and isinstance(
      rets[0].type, (torch.BoolType, torch.IntType, torch.FloatType)
    )
    # Decompositions are torch code: they need Python numbers, so scalars stay static.
    self.trace_scalars = lowering is not None
    # torch's CPU kernel may compute it on known values while a program is staged (`fold`)
    self.foldable = torch.Tag.nondeterministic_seeded not in func.tags and not (
      lowering is not None and lowering.random
    )

  def _leaf_kinds(self, treedef: Any, args: tuple, kwargs: dict) -> tuple[int, ...]:
    schema = self.func._schema.arguments
    kinds: list[int] = []
    named = {a.name: a for a in schema}

    def kind(arg: Any) -> int:
      if arg is None or not is_dynamic_type(arg.type) or arg.name in self.static_names:
        return 0
      # Index tensors may stay on the CPU, as torch allows for CUDA tensors.
      return 2 if arg.name == "indices" else 1

    flat = isinstance(treedef, int)  # split() kept the arguments as they are (None included)
    for i, a in enumerate(args):
      kinds.extend(
        [kind(schema[i] if i < len(schema) else None)]
        * (1 if flat else len(jax.tree_util.tree_leaves(a)))
      )
    for name in sorted(kwargs):
      kinds.extend([kind(named.get(name))] * len(jax.tree_util.tree_leaves(kwargs[name])))
    result = tuple(kinds)
    self.kinds[treedef] = result
    return result

  def split(self, args: tuple, kwargs: dict) -> tuple[list, tuple, Any, torch.device | None]:
    leaves: Sequence[Any]
    treedef: Any
    leaves, treedef = args, len(args)  # the common case, a flat tuple: its length is its structure
    if kwargs:
      leaves, treedef = _tree_flatten((args, kwargs))
    else:
      for a in args:  # a plain loop: a generator expression costs more on this hot path
        if type(a) in _CONTAINERS:
          leaves, treedef = _tree_flatten((args, kwargs))
          break
    kinds = self.kinds.get(treedef)
    if kinds is None:
      kinds = self._leaf_kinds(treedef, args, kwargs)
    dyn: list[Any] = []
    statics: list[Any] = []
    device = None
    for leaf, dynamic in zip(leaves, kinds):
      if type(leaf) is Tensor:
        storage = leaf._storage
        if device is None:
          device = storage.device
        elif storage.device is not device and storage.device != device:
          raise device_error(device, storage.device)
        dyn.append(storage.array if leaf._whole else value(leaf))
        statics.append(_DYN)
      elif isinstance(leaf, torch.Tensor):
        if leaf.device.type == "cpu" and (
          dynamic == 2 or (dynamic and leaf.dim() == 0) or scope.active()
        ):
          # (in a trace scope, CPU tensors are constants of the program being built, noted
          # for `bridge.compile`'s guard where it collects them)
          scope.note_constant(leaf)
          dyn.append(scalar_from_cpu(leaf))
          statics.append(_DYN)
        else:
          raise device_error(device or "jax:0", leaf.device)
      elif dynamic and self.trace_scalars and type(leaf) in TRACED_SCALARS:
        dyn.append(leaf)
        statics.append(_DYN)
      else:
        statics.append(leaf)
    return dyn, tuple(statics), treedef, device

  def executable(self, treedef: Any, statics: tuple) -> Executable:
    key = (treedef, statics)
    exe = self.exes.get(key)
    if exe is None:
      fn, lowering = lowering_fn(self.func)
      structure = treedef
      if isinstance(treedef, int):  # a flat argument tuple of that length
        structure = _tree_flatten((tuple(range(treedef)), {}))[1]
      with self.lock:
        exe = self.exes.setdefault(key, Executable(self.func, fn, lowering, structure, statics))
    return exe

  def __call__(self, args: tuple, kwargs: dict) -> Any:
    if self.foldable:
      where = _scope_var.get()
      if where.staged:
        folded = fold(self.func, args, kwargs, where.narrow)
        if folded is not UNKNOWN:
          if where.narrow:  # a 32-bit program: int64 results proven exact, or refused
            narrowing.after_call(self.func, args, kwargs, folded)
          return folded
    dyn, statics, treedef, device = self.split(args, kwargs)
    try:
      exe = self.exes.get((treedef, statics))
    except TypeError:  # an unhashable static argument (e.g. a Generator): compared by identity
      statics = tuple(tree_lib.ByIdentity(s) for s in statics)
      exe = self.exes.get((treedef, statics))
    if exe is None:
      exe = self.executable(treedef, statics)
    if device is None:
      device = factory_device(kwargs)
    config = _config_var.get()
    if config.debug_print_each_op:
      _debug_print(self.func, dyn)
    # JAX's 64-bit types on for this op only (what `jax.enable_x64(True)` does, without
    # building a context manager per op).
    where = _scope_var.get()
    prev = _x64_state.swap_local(not where.narrow)
    quiet = quiet_narrowing() if where.narrow else None
    try:
      if not exe.keyed:
        if not where.staged:
          out, flag = exe.call(*dyn)
          if flag is not None:
            exe.check(flag, dyn)
        elif replayable(dyn):
          out = (exe.staged_checked if config.check_indices else exe.staged)(*dyn)
        else:
          out = exe.run(*dyn)
      elif exe.decomposed and (where.staged or scope.is_staged()):
        out = exe.inline(*dyn)
      else:
        dyn.append(rng.next_key(self.func) if exe.draws is not False else NO_KEY)
        if where.staged:
          out = exe.run(*dyn)
        else:
          out, flag = exe.call(*dyn)
          if flag is not None:
            exe.check(flag, dyn)
    except jax.errors.UnexpectedTracerError as e:
      raise scope.leaked_tracer_error(e) from e
    except OverflowError as e:  # a Python int past int32, in a 32-bit program
      if where.narrow:
        raise narrowing.refuse_int(
          f"the result of {self.func}", narrowing.INF, f"it needs a 64-bit integer: {e}"
        ) from e
      raise
    except (jax.errors.JaxRuntimeError, ValueError) as e:  # (JAX's error type varies)
      ffi.reraise(e)  # an op that fell back to torch raised: torch's own exception
      if "incompatible devices" in str(e):
        raise placement_error(self.func, dyn) from e
      raise
    finally:
      _x64_state.set_local(prev)
      if quiet is not None:
        quiet.__exit__(None, None, None)
    if self.like and dyn and type(out) is ArrayImpl and type(dyn[0]) is ArrayImpl:
      out = placed_like(out, dyn[0])
    if where.grad and scope.no_grad_inside():  # in a `no_grad()` block of traced code
      out = _stop_gradient(out)
    if self.python_result:
      return _python_value(self.func, out)
    result = wrap(out, device)
    if where.narrow:  # a 32-bit program: int64 results proven exact, or refused
      narrowing.after_call(self.func, args, kwargs, result)
    return result


def _stop_gradient(out: Any) -> Any:
  """An op's traced results as constants for JAX's derivatives (torch records no gradient
  for ops run under `torch.no_grad()`)."""
  return jax.tree_util.tree_map(
    lambda o: jax.lax.stop_gradient(o) if isinstance(o, jax.core.Tracer) else o, out
  )


def _python_value(func: Any, out: Any) -> Any:
  """The Python bool/int/float an op's schema returns, from its lowering's 0-d array."""
  if isinstance(out, jax.core.Tracer):
    raise scope.traced_value_error(f"`{func}` returns a Python value")
  kind = func._schema.returns[0].type
  cast = (
    bool if isinstance(kind, torch.BoolType) else int if isinstance(kind, torch.IntType) else float
  )
  return cast(np.asarray(out))


def _debug_print(func: Any, dyn: list) -> None:
  def describe(x: Any) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
      return f"{np.dtype(x.dtype).name}{list(np.shape(x))}"
    return repr(x)

  print(
    f"[bridge] {func}({', '.join(describe(x) for x in dyn)})",
    file=config_lib.debug_file(),
    flush=True,
  )
