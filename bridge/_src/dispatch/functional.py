"""The plan of a functional op (one that writes none of its arguments): its lowering,
jitted and cached per static signature, run eagerly or staged; the checks torch makes of its
arguments before computing (a Python scalar converted to a tensor's dtype, a generator; the
dtypes its CPU kernels lack are `Executable.check_kernel`'s), and CPU scalars placed beside the
op's other tensors.
"""

from __future__ import annotations

import math
import re
import threading
from typing import Any, Sequence

import jax
import numpy as np
import torch
from jax._src import config as _jax_config

from bridge._src import config as config_lib
from bridge._src import dtypes, ffi, narrowing, rng, scope
from bridge._src import tensor as tensor_lib
from bridge._src import tree as tree_lib
from bridge._src.dispatch.checks import install_checks
from bridge._src.dispatch.executable import (
  NO_KEY,
  TRACED_SCALARS,
  Executable,
  replayable,
)
from bridge._src.dispatch.folding import UNKNOWN, fold
from bridge._src.dispatch.meta import STAND_INS, weak
from bridge._src.dispatch.resolve import decomposing, lowering_fn
from bridge._src.dispatch.schema import is_dynamic_type, quiet_narrowing
from bridge._src.dispatch.tensors import (
  FOLD_MAX,
  LIKE_OPS,
  device_error,
  factory_device,
  placed_like,
  scalar_from_cpu,
  wrap,
)
from bridge._src.errors import DeviceMismatchError
from bridge._src.placement import devices_of, placement_lines
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
    # 0 static, 1 traced, 2 traced (CPU allowed), 3 an index of a list (CPU allowed, and put
    # where the indexed tensor is: torch makes `s[[0, 2]]`'s index on `s.device`)
    self.kinds: dict[Any, tuple[int, ...]] = {}
    self.exes: dict[tuple, Executable] = {}
    self.fitting: set[tuple] = set()  # Python scalars out of a dtype's range torch takes
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
    # (position, name) of a `Generator?` argument: the `jax` device has no generators
    self.generator = next(
      (
        (i, a.name)
        for i, a in enumerate(func._schema.arguments)
        if isinstance(a.type, torch.OptionalType)
        and a.type.getElementType().kind() == "GeneratorType"
      ),
      None,
    )

  def _leaf_kinds(self, treedef: Any, args: tuple, kwargs: dict) -> tuple[int, ...]:
    schema = self.func._schema.arguments
    kinds: list[int] = []
    named = {a.name: a for a in schema}

    def kind(arg: Any) -> int:
      if arg is None or not is_dynamic_type(arg.type) or arg.name in self.static_names:
        return 0
      # Index tensors may stay on the CPU, as torch allows for CUDA tensors.
      if arg.name == "indices":
        return 3 if isinstance(arg.type, torch.ListType) else 2
      # The one value per tensor of `_foreach_addcmul_`/`addcdiv_(..., scalars)`: torch reads
      # them from a CPU tensor (CUDA's kernels want them there)
      if arg.name == "scalars" and isinstance(arg.type, torch.TensorType):
        return 2
      return 1

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
    movable: list[int] | None = None  # where in `dyn` CPU tensors' values (and indices) are
    wide = False  # a Python scalar some dtype may not hold
    for leaf, dynamic in zip(leaves, kinds):
      if type(leaf) is Tensor:
        storage = leaf._storage
        if device is None:
          device = storage.device
        elif storage.device is not device and storage.device != device:
          raise device_error(device, storage.device)
        if dynamic == 3:
          if movable is None:
            movable = []
          movable.append(len(dyn))
        dyn.append(storage.array if leaf._whole else value(leaf))
        statics.append(_DYN)
      elif isinstance(leaf, torch.Tensor):
        if leaf.device.type == "cpu" and (
          dynamic >= 2 or (dynamic and leaf.dim() == 0) or scope.active()
        ):
          # (in a trace scope, CPU tensors are constants of the program being built, noted
          # for `bridge.compile`'s guard where it collects them)
          scope.note_constant(leaf)
          if movable is None:
            movable = []
          movable.append(len(dyn))
          dyn.append(scalar_from_cpu(leaf))
          statics.append(_DYN)
        else:
          raise device_error(device or "jax:0", leaf.device)
      elif dynamic and type(leaf) in TRACED_SCALARS:
        # (every dtype holds an integer of [-128, 127]: other values are checked below, and
        # negative floats, which no unsigned type holds)
        if type(leaf) is complex or not -128 <= leaf <= 127 or (type(leaf) is float and leaf < 0):
          wide = True
        if self.trace_scalars:
          dyn.append(leaf)
          statics.append(_DYN)
        else:
          statics.append(leaf)
      else:
        statics.append(leaf)
    if movable is not None:
      _beside_placed(dyn, movable)
    if wide and not decomposing():  # (torch checks the op called, not a decomposition's)
      self._check_conversions(args, kwargs, leaves, kinds)
    return dyn, tuple(statics), treedef, device

  def _check_conversions(self, args: tuple, kwargs: dict, leaves: Sequence, kinds: tuple) -> None:
    """torch's error for a Python scalar its kernel converts to a tensor's dtype that cannot
    hold it (`uint8_tensor.fill_(300)`: "value cannot be converted to type uint8_t without
    overflow"), where the lowering would wrap it silently.

    Which scalars torch converts (`fill_`'s value, `clamp`'s bounds, `add`'s alpha) and which
    it promotes with (`int8_tensor + 1000` wraps in torch too) is its CPU kernel's to say:
    where a scalar does not fit a dtype of the op, the kernel runs on stand-ins of the tensors
    (zeros of their shapes and dtypes) and its overflow error, if any, is raised. The scalar is
    a Python value here, also while torch code is staged into a JAX program. A verdict that
    it fits is kept per scalar, shapes and dtypes."""
    scalars: list[Any] = []
    wanted: set[torch.dtype] = set()
    for leaf, k in zip(leaves, kinds):
      if isinstance(leaf, torch.Tensor):
        wanted.add(leaf.dtype)
      elif isinstance(leaf, torch.dtype):
        wanted.add(leaf)
      elif k and type(leaf) in TRACED_SCALARS:
        scalars.append(leaf)
    wanted = wanted or {torch.get_default_dtype(), torch.int64}
    if not any(_may_overflow(v, d) for v in scalars for d in wanted):
      return  # (the common case: a float32 tensor and a scalar such as -1e9)
    tensors = tuple((t.dtype, tuple(t.shape)) for t in leaves if isinstance(t, torch.Tensor))
    named = tuple(leaf for leaf in leaves if isinstance(leaf, torch.dtype))
    # (not in a 32-bit program, where an int32 tensor may stand for an int64 one)
    key: tuple | None = None
    if _scope_var.get().bounds is None:
      key = (tuple((type(v), v) for v in scalars), tensors, named)
      try:
        if key in self.fitting:
          return
      except TypeError:  # (a symbolic shape)
        key = None
    error = _cpu_error(self.func, args, kwargs)
    if error is not None and type(error) is RuntimeError and _OVERFLOW.fullmatch(str(error)):
      raise error from None
    if key is not None:
      if len(self.fitting) > 256:
        self.fitting.clear()
      self.fitting.add(key)

  def executable(self, treedef: Any, statics: tuple, policy: tuple | None = None) -> Executable:
    """The executable for these arguments; `policy`: the settings in force, for an op with no
    lowering whose first executable another policy chose (`Executable.policy`)."""
    key = (treedef, statics) if policy is None else (treedef, statics, policy)
    exe = self.exes.get(key)
    if exe is None:
      fn, lowering = lowering_fn(self.func)
      structure = treedef
      if isinstance(treedef, int):  # a flat argument tuple of that length
        structure = _tree_flatten((tuple(range(treedef)), {}))[1]
      made = Executable(self.func, fn, lowering, structure, statics)
      if lowering is None or lowering.source == "callback fallback":
        config = _config_var.get()
        made.policy = (config.decompose_missing_ops, config.fallback)
      with self.lock:
        exe = self.exes.setdefault(key, made)
    return exe

  def __call__(self, args: tuple, kwargs: dict) -> Any:
    if self.generator is not None:
      _check_generator(self.generator, args, kwargs)
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
    config = _config_var.get()
    if exe.policy is not None and exe.policy != (config.decompose_missing_ops, config.fallback):
      # (an op with no lowering, first seen under other settings: this thread's decide)
      exe = self.executable(treedef, statics, (config.decompose_missing_ops, config.fallback))
    if device is None:
      device = factory_device(kwargs)
    if config.debug_print_each_op:
      _debug_print(self.func, dyn)
    # JAX's 64-bit types on for this op only (what `jax.enable_x64(True)` does, without
    # building a context manager per op).
    where = _scope_var.get()
    given = len(dyn)  # (before a key is appended)
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
        raise _placement_error(self.func, dyn[:given]) from e
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


# --- torch's checks of an op's arguments ---------------------------------------------------------


def _check_generator(at: tuple[int, str], args: tuple, kwargs: dict) -> None:
  """torch's `check_generator`: a generator of another device is refused, not ignored (the
  `jax` device has none of its own: its random ops draw from `torch.manual_seed`'s key)."""
  i, name = at
  generator = args[i] if i < len(args) else kwargs.get(name)
  if generator is not None:
    raise RuntimeError(
      f"Expected a '{tensor_lib.device_type()}' device type for generator but found "
      f"'{generator.device.type}'"
    )


def _limits(dtype: torch.dtype) -> tuple[float, float, str] | None:
  """(lowest, max, kind) of the values `dtype` holds: `i`/`u` integers, `f` floating (of a
  complex dtype, each part); None for bool (any value converts to it)."""
  if dtype == torch.bool:
    return None
  if dtype.is_floating_point or dtype.is_complex:
    info = torch.finfo(dtype)
    return float(info.min), float(info.max), "f"
  iinfo = torch.iinfo(dtype)
  return iinfo.min, iinfo.max, "u" if iinfo.min == 0 else "i"


_LIMITS = {
  d: _limits(d) for d in dtypes.TORCH_TO_JAX if isinstance(d, torch.dtype) and d != torch.bool
}


def _may_overflow(v: int | float | complex, dtype: torch.dtype) -> bool:
  """Whether torch's `checked_convert` may refuse Python scalar `v` converted to `dtype`
  (c10's `overflows`: a negative integer wraps into an unsigned type down to -max, a negative
  float does not; an infinity or NaN fits a floating type; a complex value with an imaginary
  part, no real one)."""
  limits = _LIMITS.get(dtype)
  if limits is None:
    return False
  lo, hi, kind = limits
  if isinstance(v, complex):
    if not dtype.is_complex and v.imag != 0:
      return True
    return _may_overflow(v.real, dtype) or _may_overflow(v.imag, dtype)
  if kind == "f":
    return abs(v) > hi and not math.isinf(v)
  if type(v) is float and v != v:  # NaN: no integer
    return True
  return not (lo if kind == "i" or type(v) is float else -hi) <= v <= hi


_OVERFLOW = re.compile(r"value cannot be converted to type .+ without overflow")


def _stand_in(x: Any, other: bool = False) -> Any:
  """A `jax` tensor, or a JAX array or tracer, as a CPU tensor of zeros of its shape and dtype
  (stride 0 if large); a traced Python scalar (a weak 0-d array) as a number of its kind."""
  if type(x) is Tensor:
    shape, dtype = tuple(x.shape), x.dtype
    bounds = _scope_var.get().bounds
    if dtype is torch.int32 and bounds is not None and narrowing._is_tracked(bounds, x):
      dtype = torch.int64  # (an int64 tensor held in int32 by a 32-bit program: `narrowing`)
  elif isinstance(x, (jax.core.Tracer, jax.Array)):
    shape, dtype = tuple(x.shape), dtypes.JAX_TO_TORCH[np.dtype(x.dtype)]
    if not shape and weak(x):
      return STAND_INS[other][np.dtype(x.dtype).kind]
  else:
    return x
  if math.prod(shape) <= FOLD_MAX:
    return torch.zeros(shape, dtype=dtype)
  return torch.zeros((), dtype=dtype).expand(shape)


def _cpu_error(func: Any, args: Any, kwargs: dict, other: bool = False) -> Exception | None:
  """The exception torch's CPU kernel raises for arguments of these shapes and dtypes (and
  these Python values; `meta.STAND_INS[other]` for traced ones: two sets, as a verdict may
  depend on the value, `pow(x, 1)` copies `x` where `pow(x, 2)` computes), or None. It
  computes on the stand-ins: it is asked only where a scalar is out of a dtype's range, and
  torch's random state is left as it was."""
  try:
    cargs, ckwargs = jax.tree_util.tree_map(
      lambda x: _stand_in(x, other), (args, kwargs), is_leaf=lambda x: isinstance(x, torch.Tensor)
    )
  except (RuntimeError, TypeError, ValueError, KeyError):  # (a symbolic shape, a dtype torch lacks)
    return None
  ckwargs.pop("key", None)
  if ckwargs.get("device") is not None:
    ckwargs["device"] = "cpu"
  try:
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
      func(*cargs, **ckwargs)
  except Exception as e:  # noqa: BLE001 - the caller picks the errors it trusts
    return e
  return None


def _placement_error(func: Any, dyn: list) -> DeviceMismatchError:
  """Tensors of one op placed on different sets of devices (different meshes), or on one set
  in different orders (meshes of the same devices listed otherwise): each of them listed,
  0-dimensional ones too (Python scalars and random keys are not arguments here)."""
  arrays = [(f"argument {i}", a) for i, a in enumerate(dyn) if type(a) not in TRACED_SCALARS]
  placed = placement_lines(arrays)
  sets = {devices_of(a) for _, a in arrays} - {None}
  if len(sets) == 1:
    orders = [
      f"  {name}: devices in the order {[d.id for d in a.sharding.mesh.devices.flat]}"
      for name, a in arrays
      if isinstance(getattr(a, "sharding", None), jax.sharding.NamedSharding)
    ]
    return DeviceMismatchError(
      f"bridge: {func} got `jax` tensors placed on the same devices in different orders "
      "(meshes that list the devices otherwise):\n"
      + "\n".join(placed + orders)
      + "\nOne op runs on one mesh: place them together first (`bridge.shard(t, sharding)` "
      "with a sharding over the same mesh, its devices in the same order)."
    )
  return DeviceMismatchError(
    f"bridge: {func} got `jax` tensors placed on different sets of devices:\n"
    + "\n".join(placed)
    + "\nOne op runs on one mesh: place them together first "
    "(`bridge.shard(t, sharding)` with a sharding over the same mesh); a CPU tensor torch "
    "lets beside it (a 0-dimensional one, an index) is replicated over its mesh."
  )


def _beside_placed(dyn: list, movable: list[int]) -> None:
  """The values of CPU tensors torch lets beside device tensors (0-dimensional ones, indices),
  and the indices of an indexing op (`s[[0, 2]]`: torch makes them on `s.device`), placed where
  the op's first other operand is: on its device (`jax:3`'s, not JAX's first, where a CPU
  value arrives), or replicated over its mesh when it spans several devices (JAX refuses an
  array on one device beside an array on others)."""
  target = None
  for i, a in enumerate(dyn):
    if type(a) is ArrayImpl and i not in movable:
      target = a.sharding
      break
  if target is None:
    return
  devices = target.device_set
  if len(devices) > 1:
    if not isinstance(target, jax.sharding.NamedSharding):
      return
    target = jax.sharding.NamedSharding(target.mesh, jax.sharding.PartitionSpec())
  for i in movable:
    a = dyn[i]
    if type(a) is ArrayImpl and a.sharding.device_set != devices:
      if len(a.sharding.device_set) == 1:
        dyn[i] = jax.device_put(a, target)
