"""Dispatch: every aten op that reaches a `bridge.Tensor` runs as JAX code.

Each overload gets a plan once, by what its schema says it does:

* view ops (`view`, `t`, `select`, `expand`...) share the input's storage; their
  metadata comes from torch's own meta kernels (`bridge._src.tensor`);
* functional ops run a lowering from the registry, or torch's decomposition,
  jitted and cached per (static arguments, argument structure); JAX caches per
  shapes and dtypes. Results are cast to the dtype torch's meta kernel gives;
* in-place and `out=` ops run their functional twin and store the result;
* where torch raises for a value (an index out of range, an integer division by zero), the
  lowering declares the rule and the op raises torch's error (see "value checks" below).

`Scalar` arguments are traced, so a changing learning rate does not recompile.
All of it runs with JAX's 64-bit types enabled for the duration of the op only,
so int64/float64 tensors keep their dtype without touching global JAX config.
"""

from __future__ import annotations

import contextlib
import functools
import math
import mmap
import threading
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax._src import config as _jax_config
from jax._src import core as _jax_core
from torch._decomp import decomposition_table

from bridge._src import config as config_lib
from bridge._src import devices as device_lib
from bridge._src import dtypes
from bridge._src import fallback
from bridge._src import ffi
from bridge._src import narrowing
from bridge._src import rng
from bridge._src import scope
from bridge._src import tensor as tensor_lib
from bridge._src import transfer
from bridge._src import tree as tree_lib
from bridge._src.errors import (BridgeError, DeviceMismatchError, TorchIndexError,
                               TorchRuntimeError)
from bridge._src.registry import REGISTRY
from bridge._src.placement import placement_lines
from bridge._src.tensor import Tensor, make, make_view, value

aten = torch.ops.aten
_tree_flatten = jax.tree_util.tree_flatten
_config_var = config_lib._CURRENT
_scope_var = scope._ACTIVE
_CONTAINERS = (list, tuple, dict)
try:
  from jax._src.array import ArrayImpl as _ArrayImpl
except ImportError:  # pragma: no cover
  _ArrayImpl = None
_x64_state = _jax_config.enable_x64
_disable_jit = _jax_config.disable_jit  # a thread-local state, like `_x64_state`
_DYN = tree_lib.DYN
_last_result: list[Any] = [None]


def wait_for_last_result() -> None:
  out = _last_result[0]
  if out is not None:
    jax.block_until_ready(out)


def _x64() -> Any:
  """JAX's 64-bit types on for a block (the bridge's own computations), if they are off
  (and unless torch code is staged into a 32-bit JAX program: see `scope.narrow`)."""
  if dtypes.x64_enabled() or scope.narrow():
    return contextlib.nullcontext()
  return jax.enable_x64(True)


def _quiet_narrowing() -> Any:
  """JAX's warnings about unavailable 64-bit dtypes, silenced (the bridge warns once itself)."""
  ctx = warnings.catch_warnings()
  ctx.__enter__()
  warnings.filterwarnings("ignore", message="Explicitly requested dtype")
  return ctx


# --- schema helpers ----------------------------------------------------------------


def _is_dynamic_type(t: Any) -> bool:
  """Whether values of schema type `t` may be traced (tensors and Scalar/float/complex)."""
  if isinstance(t, torch.OptionalType):
    return _is_dynamic_type(t.getElementType())
  if isinstance(t, torch.ListType):
    return _is_dynamic_type(t.getElementType())
  return isinstance(t, (torch.TensorType, torch.NumberType, torch.FloatType, torch.ComplexType))


def _mutated(func: Any) -> list[str]:
  return [a.name for a in func._schema.arguments
          if a.alias_info is not None and a.alias_info.is_write]


def _is_view(func: Any) -> bool:
  rets = func._schema.returns
  return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write
                            for r in rets) and not _mutated(func)


# --- tensors in and out -------------------------------------------------------------


def _device_error(a: Any, b: Any) -> DeviceMismatchError:
  return DeviceMismatchError(
      f"Expected all tensors to be on the same device, but found at least two devices, {a} and "
      f"{b}! Move them together first, e.g. `t.to('{a}')`.")


_LIKE_OPS = frozenset(
    getattr(getattr(aten, name), overload)
    for name, overloads in (
        ("zeros_like", ("default",)), ("ones_like", ("default",)), ("empty_like", ("default",)),
        ("full_like", ("default",)), ("rand_like", ("default",)), ("randn_like", ("default",)),
        ("randint_like", ("default", "low_dtype")), ("new_zeros", ("default",)),
        ("new_ones", ("default",)), ("new_empty", ("default",)), ("new_full", ("default",)),
        ("new_empty_strided", ("default",)))
    for overload in overloads if hasattr(getattr(aten, name, None), overload))


def _placed_like(out: Any, like: Any) -> Any:
  """A `_like`/`new_` op's result, put where its argument is when that spans several devices:
  the same layout for the same shape, else replicated over the argument's mesh."""
  sharding = like.sharding
  if len(sharding.device_set) == 1:
    return out
  if tuple(out.shape) != tuple(like.shape):
    if not isinstance(sharding, jax.sharding.NamedSharding):
      return out
    sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
  return jax.device_put(out, sharding)


def _placement_error(func: Any, dyn: list) -> DeviceMismatchError:
  """Tensors of one op placed on different sets of devices (different meshes)."""
  placed = placement_lines((f"argument {i}", a) for i, a in enumerate(dyn) if np.ndim(a) > 0)
  return DeviceMismatchError(
      f"bridge: {func} got `jax` tensors placed on different sets of devices:\n"
      + "\n".join(placed) + "\nOne op runs on one mesh: place them together first "
      "(`bridge.shard(t, sharding)` with a sharding over the same mesh).")


def _scalar_from_cpu(t: torch.Tensor) -> Any:
  """A CPU tensor torch allows beside device tensors (0-dim values, index tensors)."""
  t, bound = narrowing.known(t.detach(), f"a {t.dtype} CPU tensor (shape {tuple(t.shape)})")
  with _x64():
    a = transfer.tensor_to_jax(t.contiguous(), api="the jax device",
                               where=lambda: "a CPU tensor")
    if device_lib.jax_devices()[0].platform != "cpu":
      # (on JAX's CPU device, committed there: beside GPU arrays, an uncommitted copy that
      # JAX places with the op's other arguments)
      a = jax.device_put(np.asarray(a))
  return a if bound is None else narrowing.track(a, bound)


def wrap(out: Any, device: torch.device) -> Any:
  """JAX results -> `bridge.Tensor`s (tuples, lists and None kept)."""
  if type(out) is _ArrayImpl:
    _last_result[0] = out
    return tensor_lib.make_result(out, device)
  if isinstance(out, (tuple, list)):
    return (list if isinstance(out, list) else tuple)(wrap(o, device) for o in out)
  if out is None or not hasattr(out, "dtype"):
    return out
  if not isinstance(out, jax.core.Tracer):  # a tracer must not outlive its trace here
    _last_result[0] = out
  return make(out, device)


def new_zeros(size: tuple, dtype: Any, device: Any) -> Tensor:
  """A new zero-filled tensor (what `empty` gives on the jax device)."""
  REGISTRY.require_plugins()
  dtype = dtype or torch.get_default_dtype()
  index = device_lib.device_index(device)
  wide = dtype
  dtype = narrowing.narrow_dtype(dtype, f"a new {dtype} tensor")
  jdtype = dtypes.jax_dtype(dtype, api="torch.empty", where="the requested dtype")
  target = device_lib.jax_devices()[index]
  with _x64():
    if not scope.staged():
      array = jax.device_put(_host_zeros(size, jdtype), target)
    elif math.prod(size) <= _FOLD_MAX:
      # a known value while a program is staged (see `_fold`): made by NumPy, not compiled
      with jax.ensure_compile_time_eval():
        array = jax.device_put(np.zeros(size, jdtype), target)
    else:
      array = jnp.zeros(size, jdtype)
      array = jax.device_put(array, target) if index else array
  if dtype is not wide:  # an int64 tensor in a 32-bit program: its zeros fit (`narrowing`)
    narrowing.track(array, 0)
  return make(array, tensor_lib.jax_device(index), dtype)


def _host_zeros(size: tuple, dtype: np.dtype) -> np.ndarray:
  """Zeros in a 64-byte aligned NumPy buffer, which a CPU device takes without copying.

  `empty` (and so `tensor.to("jax")`, `module.to("jax")`, whose `copy_` then replaces the
  array) costs an allocation, not an XLA compile per new shape (tens of milliseconds
  each). A large buffer is a fresh anonymous mapping: its zero pages are not written
  until used, where `np.zeros` would clear recycled heap memory (a pass over all of it).
  """
  dtype = np.dtype(dtype)
  nbytes = math.prod(size) * dtype.itemsize
  if nbytes >= _MAP_BYTES:
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype).reshape(size)  # page-aligned
  raw = np.zeros(nbytes + transfer._ALIGNMENT, np.uint8)
  start = -raw.ctypes.data % transfer._ALIGNMENT
  return raw[start:start + nbytes].view(dtype).reshape(size)


_MAP_BYTES = 1 << 20


# --- meta: torch's own shapes and dtypes ---------------------------------------------


def _meta_arg(x: Any) -> Any:
  if isinstance(x, jax.core.Tracer) or isinstance(x, (jax.Array, np.ndarray)):
    shape, dtype = np.shape(x), np.dtype(x.dtype)
    weak = getattr(getattr(x, "aval", None), "weak_type", False) or getattr(x, "weak_type", False)
    if weak and not shape:
      return {"b": True, "i": 1, "u": 1, "f": 1.0, "c": 1j}[dtype.kind]
    return torch.empty(shape, dtype=dtypes.JAX_TO_TORCH[dtype], device="meta")
  return x


def _meta_outputs(func: Any, args: tuple, kwargs: dict) -> Any:
  """torch's output metadata for these (traced) arguments, or None if torch has no meta kernel."""
  margs, mkwargs = jax.tree_util.tree_map(_meta_arg, (args, kwargs))
  mkwargs.pop("key", None)
  if "device" in mkwargs:  # a factory: ask for meta tensors, never re-enter the jax device
    mkwargs["device"] = "meta"
  try:
    return func(*margs, **mkwargs)
  except Exception:  # noqa: BLE001 - no meta kernel: the lowering's own dtypes stand
    return None


def _conform(func: Any, out: Any, expected: Any) -> Any:
  """Cast a lowering's results to torch's dtypes; refuse a wrong shape."""
  if expected is None:
    return out
  if isinstance(out, (tuple, list)):
    kind = list if isinstance(out, list) else tuple  # torch's named return types -> tuple
    if not isinstance(expected, (tuple, list)) or len(expected) != len(out):
      return kind(out)
    return kind(_conform(func, o, e) for o, e in zip(out, expected))
  if not isinstance(expected, torch.Tensor) or not hasattr(out, "dtype"):
    return out
  if tuple(out.shape) != tuple(expected.shape):
    raise BridgeError(
        f"bridge: the lowering of {func} returned shape {tuple(out.shape)}, but torch's "
        f"{func} gives {tuple(expected.shape)} for these inputs. This is a bug in the "
        "lowering; please report it.")
  want = dtypes.TORCH_TO_JAX.get(expected.dtype)
  if want is not None and np.dtype(out.dtype) != want:
    if want.itemsize == 8 or want == np.complex128:
      narrowed = jax.dtypes.canonicalize_dtype(want)
      if narrowed != want:  # a 32-bit program (see `scope.narrow`; proven by `narrowing`)
        if want.kind not in "iu":
          raise narrowing.refuse_float(f"the result of {func}", expected.dtype)
        scope.warn_narrowed(f"the {expected.dtype} result of {func}")
        out = narrowing.track(out.astype(narrowed), None)  # proven in `narrowing.after_call`
        want = narrowed
    if np.dtype(out.dtype) != want:
      out = out.astype(want)
  return out


# --- value checks ------------------------------------------------------------------------
#
# torch raises for some values: an index out of range, an integer division by zero... JAX
# clamps, drops or computes something. A lowering declares each such rule
# (`bridge_ops._lowering.check`: a bool array `bad`, the offending values, torch's exception
# and message), and `_report_check` enforces it:
# * on concrete arrays (an op run on known values: `dynamic_shape` ops, `jax.grad` without
#   `jax.jit`, the re-run below), at once: torch's exception with torch's message;
# * while an eager op's program is traced (`_Executable.checked`), `any(bad)` joins one bool
#   flag the program returns beside its results. The dispatch reads it after the call (one
#   bool to the host) and, when set, runs the op again op by op on the same arrays, where the
#   rule that failed raises with torch's message: the message costs only on the error path;
# * while torch code is staged into a JAX program (`jax.jit`, `bridge.compile`), the values
#   are unknown: unchecked (JAX clamps reads, drops writes) unless
#   `bridge.config(check_indices=True)`, which stages a host call per index check that fails
#   the program's run with the op and the bad index.

_TORCH_ERRORS = {IndexError: TorchIndexError, RuntimeError: TorchRuntimeError}
_checks = threading.local()  # .found: flags of the eager op being traced, or None; .op: its op


def _concrete(x: Any) -> np.ndarray | None:
  """`x`'s value, if known here (a JVP tracer of a known value too), else None."""
  if not isinstance(x, jax.core.Tracer):
    return np.asarray(x)
  known = _jax_core.to_concrete_value(x)
  return None if known is None else np.asarray(known)


def _check_message(message: Any, value: Any, position: int) -> str:
  if isinstance(message, str):
    return message.format(value=value, position=position)
  return message(value, position)


def _check_error(error: type[Exception], message: Any, bad: np.ndarray,
                values: np.ndarray | None) -> Exception:
  """torch's exception for the first True element of `bad` (in C order)."""
  position = int(np.argmax(np.ravel(bad)))
  value = None
  if values is not None:
    value = np.ravel(np.broadcast_to(values, np.shape(bad)))[position].item()
  return _TORCH_ERRORS.get(error, error)(_check_message(message, value, position))


def _report_check(bad: Any, values: Any, error: type[Exception], message: Any,
                  kind: str) -> None:
  """Enforce one rule a lowering declares (`bridge_ops._lowering.check`; see above)."""
  known = _concrete(bad)
  if known is not None:
    if known.any():
      raise _check_error(error, message, known, None if values is None else _concrete(values))
    return
  found = getattr(_checks, "found", None)
  if found is not None:
    found.append(jnp.any(bad))
  elif kind == "index" and _config_var.get().check_indices:
    _stage_check(bad, values, error, message)


def _stage_check(bad: Any, values: Any, error: type[Exception], message: Any) -> None:
  """A host call in the program being staged that raises torch's error if `bad` holds."""
  op = getattr(_checks, "op", None)
  if not ffi.supported():
    raise BridgeError(
        f"`bridge.config(check_indices=True)`: checking the indices of {op} inside a JAX "
        f"program needs a host call, which programs on {ffi.platform()} cannot make. Leave "
        "check_indices off there (out-of-range reads are clamped, writes dropped), or check "
        "the indices before the program.")
  kind = _TORCH_ERRORS.get(error, error)
  ffi.stage_check(bad, values, lambda value, position: kind(
      f"`bridge.config(check_indices=True)`: {op}: "
      + _check_message(message, value, position)))


_installed_checks: list[bool] = []


def _install_checks() -> None:
  """Hand `_report_check` to the plugins that declare value checks (once, when loaded)."""
  if _installed_checks:
    return
  for info in REGISTRY.plugins:
    install = getattr(info.module, "install_checks", None)
    if callable(install):
      install(_report_check)
  _installed_checks.append(True)


# --- executables ----------------------------------------------------------------------


def _lowering_fn(func: Any) -> tuple[Callable, Any]:
  """(function of jax arrays, Lowering or None) for `func`: a lowering, or a decomposition."""
  lowering = REGISTRY.lookup(func)
  if lowering is not None:
    return lowering.fn, lowering
  REGISTRY.require_plugins()
  decomp = _decomposition(func) if config_lib.get_config().decompose_missing_ops else None
  if decomp is None:
    lowering = fallback.lowering(func)
    if lowering is None:
      fallback.raise_not_found(func)
    return lowering.fn, lowering
  return _decomposition_as_lowering(func, decomp), None


def _decomposition(func: Any) -> Callable | None:
  """torch's decomposition of `func`, or its CompositeImplicitAutograd kernel (which, below
  autograd, torch does not run by itself)."""
  decomp = decomposition_table.get(func)
  if decomp is not None:
    return decomp
  if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
    return func.decompose
  return None


_decomp_state = threading.local()


def _decomposing() -> set:
  active = getattr(_decomp_state, "active", None)
  if active is None:
    active = _decomp_state.active = set()
  return active


class _decomposing_scope:  # noqa: N801
  """Marks `func` as being decomposed, so a decomposition that calls its own op fails cleanly."""

  def __init__(self, func: Any):
    self.func = func

  def __enter__(self) -> None:
    _decomposing().add(self.func)

  def __exit__(self, *exc: Any) -> None:
    _decomposing().discard(self.func)


def _decomposition_as_lowering(func: Any, decomp: Callable) -> Callable:
  """Run torch's decomposition on tensors that wrap the traced JAX values."""
  def run(*args: Any, **kwargs: Any) -> Any:
    if func in _decomposing():
      fallback.raise_not_found(func)
    with _decomposing_scope(func):
      return run_inner(*args, **kwargs)

  def run_inner(*args: Any, **kwargs: Any) -> Any:
    device = tensor_lib.jax_device(0)
    # Traced arrays become tensors again; a weakly typed 0-d tracer is a traced Python scalar.
    targs, tkwargs = jax.tree_util.tree_map(
        lambda x: make(x, device) if isinstance(x, (jax.core.Tracer, jax.Array))
        and (np.ndim(x) > 0 or not x.aval.weak_type) else x, (args, kwargs))
    out = decomp(*targs, **tkwargs)
    if out is NotImplemented:  # torch's decomposition does not cover these arguments
      lowering = fallback.lowering(func)
      if lowering is None:
        fallback.raise_not_found(func)
      return lowering.fn(*args, **kwargs)
    return jax.tree_util.tree_map(lambda t: value(t) if isinstance(t, Tensor) else t, out,
                                  is_leaf=lambda t: isinstance(t, torch.Tensor))
  return run


class _Executable:
  """One op with one argument structure and static values, jitted.

  A lowering marked `random` gets a fresh key as keyword `key`. A decomposition is
  torch code that may draw random numbers itself, so it takes a key too and makes it
  current while it runs; once its first trace shows it draws none, it is given a
  fixed placeholder key instead of a fresh one (no split per call).
  """

  def __init__(self, func: Any, fn: Callable, lowering: Any, treedef: Any, statics: tuple):
    self.func, self.fn, self.treedef, self.statics = func, fn, treedef, statics
    self.decomposed = lowering is None
    self.random = lowering is not None and lowering.random
    self.keyed = self.random or self.decomposed  # the last dynamic argument is a key
    self.draws: bool | None = None if self.decomposed else self.random
    # A plugin's lowering traced with jit off: jnp's own jitted helpers (every `x * y` on a
    # tracer is one) then trace inline rather than as nested programs, about a quarter of a
    # model's trace (see `registry.Lowering.jit_free`).
    self.jit_free = lowering is not None and lowering.jit_free
    self.dynamic_shape = lowering.dynamic_shape if lowering is not None else False
    # `call` (eager) and `staged` are made on first use (`__getattr__`): an op met only while
    # a program is staged never needs the eager one, and each `jax.jit` costs tens of us.

  def __getattr__(self, name: str) -> Any:
    if name == "staged":
      # Staged into a surrounding trace: jit's cache (by the arguments' types) replays the
      # op's equations into that trace when it recurs with the same types (a model's next
      # layer) instead of running the lowering and torch's meta kernel again.
      self.staged = self.run if self.dynamic_shape else jax.jit(self.run, inline=True)
      return self.staged
    if name == "staged_checked":
      # The same with `check_indices` on: another function, so another entry in jit's cache
      # (one traced without the setting would replay without its checks)
      self.staged_checked = (self.run if self.dynamic_shape
                             else jax.jit(self.run_checking_indices, inline=True))
      return self.staged_checked
    if name == "call":
      # eager: (results, flag of the value checks or None), see `checked`
      checked = jax.jit(self.checked)
      if not self.dynamic_shape:
        self.call = checked
      elif self.dynamic_shape == "bool_inputs":  # value-dependent shapes only with masks
        self.call = lambda *dyn: ((self.run(*dyn), None) if any(  # (torch also reads uint8
            getattr(d, "dtype", None) in (np.bool_, np.uint8) for d in dyn)  # index tensors
            else checked(*dyn))  # as masks)
      else:
        self.call = lambda *dyn: (self.run(*dyn), None)  # (concrete: checked as it runs)
      return self.call
    raise AttributeError(name)

  def checked(self, *dyn: Any) -> tuple[Any, Any]:
    """`run`, and one bool: whether a value check the lowering declared fails (None if it
    declares none). Traced by the eager `call`."""
    prev = getattr(_checks, "found", None)
    found = _checks.found = []
    try:
      out = self.run(*dyn)
    finally:
      _checks.found = prev
    return out, (functools.reduce(jnp.logical_or, found) if found else None)

  def run_checking_indices(self, *dyn: Any) -> Any:
    return self.run(*dyn)

  def check(self, flag: Any, dyn: list) -> None:
    """After an eager call: raise torch's error where the program's check flag is set."""
    if type(flag) is _ArrayImpl:
      if np.asarray(flag):  # (several times quicker than `bool(flag)`)
        self.raise_failed_check(dyn)
      return
    known = _concrete(flag)
    if known is not None:
      if known:
        self.raise_failed_check(dyn)
      return
    # run inside another trace: a decomposition being traced (its flag joins the outer op's),
    # or `jax.vmap` without `jax.jit`
    found = getattr(_checks, "found", None)
    if found is not None:
      found.append(flag)
    elif _config_var.get().check_indices:
      self.run(*dyn)  # (stages the index checks, which run at once here)

  def raise_failed_check(self, dyn: list) -> None:
    """Run the op again on the same arrays, op by op: the failing rule raises torch's error."""
    prev = getattr(_checks, "found", None)
    _checks.found = None
    try:
      self.run(*dyn)
    finally:
      _checks.found = prev
    raise BridgeError(
        f"bridge: a value check of {self.func} failed in its program but not when the op ran "
        "again on the same inputs. This is a bug in its lowering; please report it.")

  def run(self, *dyn: Any) -> Any:
    if self.keyed:
      return self._apply(dyn[:-1], dyn[-1])
    return self._apply(dyn, None)

  def inline(self, *dyn: Any) -> Any:
    """Run a decomposition straight into the surrounding staged program (no key: its random
    ops draw from the program's own key, or fail for want of one)."""
    return self._apply(dyn, None)

  def _apply(self, dyn: tuple, key: Any) -> Any:
    it = iter(dyn)
    args, kwargs = self.treedef.unflatten(tree_lib.merge(self.statics, it))
    jit_off = self.jit_free and any(isinstance(d, jax.core.Tracer) for d in dyn)
    prev = _disable_jit.swap_local(True) if jit_off else None
    op, _checks.op = getattr(_checks, "op", None), self.func  # (named by staged checks)
    try:
      if self.random:
        out = self.fn(*args, **dict(kwargs, key=key))
      elif key is not None:
        with rng.rng_key(key) as box:
          out = self.fn(*args, **kwargs)
        self.draws = box.used
      else:
        out = self.fn(*args, **kwargs)
    finally:
      _checks.op = op
      if jit_off:
        _disable_jit.set_local(prev)
    return _conform(self.func, out, _meta_outputs(self.func, args, kwargs))


_NO_KEY = np.zeros(2, np.uint32)  # the placeholder key of a decomposition that draws none
_STAGED_TRACER = jax._src.interpreters.partial_eval.DynamicJaxprTracer
_TRACED_SCALARS = (int, float, complex)  # Python numbers that ops take as traced values


def _replayable(dyn: list) -> bool:
  """Arguments that jit's cache can replay an op for: values of a program being staged out
  (jax.jit, bridge.compile) and Python scalars. Under other transformations (jax.grad
  without jit) and with concrete arrays (CPU constants), the op runs as it is."""
  for d in dyn:
    t = type(d)
    if t is not _STAGED_TRACER and t not in _TRACED_SCALARS:
      return False
  return True


_UNKNOWN = object()
_FOLD_MAX = 4096  # elements: larger known values stay computations of the program


class _NotFoldable(Exception):
  """A known value `_fold` leaves to the lowering (too large, another dtype view)."""


def _fold(func: Any, args: tuple, kwargs: dict, narrow: bool) -> Any:
  """An op on known values while torch code is staged into a JAX program, computed by torch's
  own CPU kernel; `_UNKNOWN` if it depends on traced values or is too large.

  Values that do not depend on the program's inputs (positions from `torch.arange`, a
  mask built from them) are then known when the torch code asks for them, as in eager torch:
  code that checks them in Python (Hugging Face's "no packed sequences, so no attention mask"
  test) takes torch's eager path instead of building what the values made unnecessary. Their
  results join the program as constants. Compiling each such op in XLA instead (JAX's eager
  mode) costs milliseconds per op.
  """
  for a in args:  # the common case, an op on traced values, found at once
    if type(a) is Tensor and type(a._storage.array) is not _ArrayImpl:
      return _UNKNOWN
  leaves = _tree_flatten((args, kwargs))[0]
  device = None
  for leaf in leaves:
    if type(leaf) is Tensor:
      a = leaf._storage.array
      if type(a) is not _ArrayImpl or a.size > _FOLD_MAX or not _is_cpu_array(a):
        return _UNKNOWN
      device = device or leaf._storage.device
    elif isinstance(leaf, torch.Tensor) and not (leaf.device.type == "cpu"
                                                 and leaf.numel() <= _FOLD_MAX):
      return _UNKNOWN

  def to_cpu(x: Any) -> Any:
    if type(x) is Tensor:
      base = transfer.array_to_torch(x._storage.array, copy=None)
      if base.dtype != x.dtype:
        raise _NotFoldable
      return base.as_strided(x.shape, x.stride(), x.storage_offset())
    return x

  def to_jax(o: Any) -> Any:
    if isinstance(o, torch.Tensor):
      if o.numel() > _FOLD_MAX or o.device.type != "cpu":
        raise _NotFoldable
      o, bound = narrowing.known(o.detach(), f"the {o.dtype} result of {func}", narrow)
      a = transfer.tensor_to_jax(o.contiguous(), copy=True)
      return a if bound is None else narrowing.track(a, bound)
    if isinstance(o, (tuple, list)):  # (torch's named tuples become plain ones, as in `wrap`)
      return (list if isinstance(o, list) else tuple)(to_jax(x) for x in o)
    return o

  try:
    cpu_args, cpu_kwargs = jax.tree_util.tree_map(
        to_cpu, (args, kwargs), is_leaf=lambda x: isinstance(x, torch.Tensor))
    if "device" in cpu_kwargs:
      cpu_kwargs["device"] = "cpu"
    with torch.no_grad():
      out = func(*cpu_args, **cpu_kwargs)
    if not isinstance(out, (torch.Tensor, tuple, list)):
      return out  # a Python value
    device = device or _factory_device(kwargs)
    index = device.index or 0
    with jax.ensure_compile_time_eval(), jax.enable_x64(True):
      out = jax.tree_util.tree_map(
          lambda a: device_lib.place(a, index) if isinstance(a, jax.Array) else a, to_jax(out))
  except (_NotFoldable, RuntimeError, TypeError, ValueError, NotImplementedError):
    return _UNKNOWN  # (torch's CPU kernel refused: the lowering decides)
  return wrap(out, device)


def _is_cpu_array(a: Any) -> bool:
  devices = a.sharding.device_set
  return len(devices) == 1 and next(iter(devices)).platform == "cpu"


class _FunctionalPlan:
  """A non-mutating op: lowering (or decomposition), cached per static signature."""

  def __init__(self, func: Any):
    self.func = func
    self.kinds: dict[Any, tuple[int, ...]] = {}  # 0 static, 1 traced, 2 traced (CPU allowed)
    self.exes: dict[tuple, _Executable] = {}
    self.lock = threading.Lock()
    lowering = REGISTRY.lookup(func)
    _install_checks()
    self.static_names = lowering.static_argnames if lowering is not None else frozenset()
    self.like = func in _LIKE_OPS  # its result goes where its first argument is
    # `-> bool` (equal, allclose, is_nonzero...): torch code receives a Python value
    rets = func._schema.returns
    self.python_result = (len(rets) == 1 and isinstance(
        rets[0].type, (torch.BoolType, torch.IntType, torch.FloatType)))
    # Decompositions are torch code: they need Python numbers, so scalars stay static.
    self.trace_scalars = lowering is not None
    # torch's CPU kernel may compute it on known values while a program is staged (`_fold`)
    self.foldable = (torch.Tag.nondeterministic_seeded not in func.tags
                     and not (lowering is not None and lowering.random))

  def _leaf_kinds(self, treedef: Any, args: tuple, kwargs: dict) -> tuple[int, ...]:
    schema = self.func._schema.arguments
    kinds: list[int] = []
    named = {a.name: a for a in schema}
    def kind(arg: Any) -> int:
      if arg is None or not _is_dynamic_type(arg.type) or arg.name in self.static_names:
        return 0
      # Index tensors may stay on the CPU, as torch allows for CUDA tensors.
      return 2 if arg.name == "indices" else 1
    flat = isinstance(treedef, int)  # split() kept the arguments as they are (None included)
    for i, a in enumerate(args):
      kinds.extend([kind(schema[i] if i < len(schema) else None)]
                   * (1 if flat else len(jax.tree_util.tree_leaves(a))))
    for name in sorted(kwargs):
      kinds.extend([kind(named.get(name))] * len(jax.tree_util.tree_leaves(kwargs[name])))
    result = tuple(kinds)
    self.kinds[treedef] = result
    return result

  def split(self, args: tuple, kwargs: dict) -> tuple[list, tuple, Any, torch.device | None]:
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
          raise _device_error(device, storage.device)
        dyn.append(storage.array if leaf._whole else value(leaf))
        statics.append(_DYN)
      elif isinstance(leaf, torch.Tensor):
        if leaf.device.type == "cpu" and (dynamic == 2 or (dynamic and leaf.dim() == 0)
                                          or scope.active()):
          # (in a trace scope, CPU tensors are constants of the program being built)
          dyn.append(_scalar_from_cpu(leaf))
          statics.append(_DYN)
        else:
          raise _device_error(device or "jax:0", leaf.device)
      elif dynamic and self.trace_scalars and type(leaf) in _TRACED_SCALARS:
        dyn.append(leaf)
        statics.append(_DYN)
      else:
        statics.append(leaf)
    return dyn, tuple(statics), treedef, device

  def executable(self, treedef: Any, statics: tuple) -> _Executable:
    key = (treedef, statics)
    exe = self.exes.get(key)
    if exe is None:
      fn, lowering = _lowering_fn(self.func)
      structure = treedef
      if isinstance(treedef, int):  # a flat argument tuple of that length
        structure = _tree_flatten((tuple(range(treedef)), {}))[1]
      with self.lock:
        exe = self.exes.setdefault(key, _Executable(self.func, fn, lowering, structure, statics))
    return exe

  def __call__(self, args: tuple, kwargs: dict) -> Any:
    if self.foldable:
      where = _scope_var.get()
      if where.staged:
        folded = _fold(self.func, args, kwargs, where.narrow)
        if folded is not _UNKNOWN:
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
      device = _factory_device(kwargs)
    config = _config_var.get()
    if config.debug_print_each_op:
      _debug_print(self.func, dyn)
    # JAX's 64-bit types on for this op only (what `jax.enable_x64(True)` does, without
    # building a context manager per op).
    where = _scope_var.get()
    prev = _x64_state.swap_local(not where.narrow)
    quiet = _quiet_narrowing() if where.narrow else None
    try:
      if not exe.keyed:
        if not where.staged:
          out, flag = exe.call(*dyn)
          if flag is not None:
            exe.check(flag, dyn)
        elif _replayable(dyn):
          out = (exe.staged_checked if config.check_indices else exe.staged)(*dyn)
        else:
          out = exe.run(*dyn)
      elif exe.decomposed and (where.staged or scope.is_staged()):
        out = exe.inline(*dyn)
      else:
        dyn.append(rng.next_key(self.func) if exe.draws is not False else _NO_KEY)
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
        raise narrowing.refuse_int(f"the result of {self.func}", narrowing.INF,
                                   f"it needs a 64-bit integer: {e}") from e
      raise
    except (jax.errors.JaxRuntimeError, ValueError) as e:  # (JAX's error type varies)
      ffi.reraise(e)  # an op that fell back to torch raised: torch's own exception
      if "incompatible devices" in str(e):
        raise _placement_error(self.func, dyn) from e
      raise
    finally:
      _x64_state.set_local(prev)
      if quiet is not None:
        quiet.__exit__(None, None, None)
    if self.like and dyn and type(out) is _ArrayImpl and type(dyn[0]) is _ArrayImpl:
      out = _placed_like(out, dyn[0])
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
      lambda o: jax.lax.stop_gradient(o) if isinstance(o, jax.core.Tracer) else o, out)


def _python_value(func: Any, out: Any) -> Any:
  """The Python bool/int/float an op's schema returns, from its lowering's 0-d array."""
  if isinstance(out, jax.core.Tracer):
    raise scope.traced_value_error(f"`{func}` returns a Python value")
  kind = func._schema.returns[0].type
  cast = bool if isinstance(kind, torch.BoolType) else int if isinstance(kind, torch.IntType) else float
  return cast(np.asarray(out))


def _factory_device(kwargs: dict) -> torch.device:
  return tensor_lib.jax_device(device_lib.device_index(kwargs.get("device")))


def _debug_print(func: Any, dyn: list) -> None:
  def describe(x: Any) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
      return f"{np.dtype(x.dtype).name}{list(np.shape(x))}"
    return repr(x)
  print(f"[bridge] {func}({', '.join(describe(x) for x in dyn)})",
        file=config_lib.debug_file(), flush=True)


# --- views ------------------------------------------------------------------------------


class _ViewPlan:
  """A view op: the result shares its input's storage, with torch's metadata."""

  def __init__(self, func: Any):
    self.func = func
    self.cache: dict[tuple, Any] = {}
    self.detaches = func in (aten.detach.default, aten.detach_.default)

  def __call__(self, args: tuple, kwargs: dict) -> Any:
    self_t = args[0]
    rest = args[1:]
    key = (tuple(self_t.shape), tuple(self_t.stride()), self_t.storage_offset(), self_t.dtype,
           _freeze(rest), _freeze(kwargs))
    meta = self.cache.get(key)
    if meta is None:
      meta = self.cache[key] = self._meta(self_t, rest, kwargs)
    if meta is _COPIES:
      # A "maybe view" op (`reshape`, `contiguous`, `flatten` of a non-viewable
      # layout) copies here: its composite kernel does the copy with ordinary ops.
      return self.func.decompose(*args, **kwargs)
    storage, device, dtype = self_t._storage, self_t._dev, self_t.dtype
    if isinstance(meta, list):
      out = [make_view(storage, *m, dtype, device) for m in meta]
    else:
      out = make_view(storage, *meta, dtype, device)
    # `detach()`, views of a detached tensor, and views made in a `torch.no_grad()` block of
    # traced code are constants for JAX's derivatives (torch gives them no gradient)
    if ((self.detaches or self_t._detached or scope.no_grad_inside())
        and isinstance(storage.array, jax.core.Tracer)):
      tensor_lib.detach_traced(out)
    return out

  def _meta(self, t: Tensor, rest: tuple, kwargs: dict) -> Any:
    numel = int(np.prod(t._storage.array.shape))
    base = torch.empty(numel, dtype=t.dtype, device="meta")
    m = base.as_strided(tuple(t.shape), tuple(t.stride()), t.storage_offset())
    composite = torch._C._dispatch_has_kernel_for_dispatch_key(
        self.func.name(), "CompositeImplicitAutograd")
    try:
      out = self.func(m, *rest, **kwargs)
    except (NotImplementedError, RuntimeError):
      if composite:  # `to(device="cpu")`: no meta answer, a copy
        return _COPIES
      raise
    if composite and any(not o._is_view() for o in (out if isinstance(out, (list, tuple)) else [out])):
      return _COPIES
    if isinstance(out, (list, tuple)):
      return [(tuple(o.shape), tuple(o.stride()), o.storage_offset()) for o in out]
    return (tuple(out.shape), tuple(out.stride()), out.storage_offset())


_COPIES = object()  # a `_ViewPlan` cache entry: the op copies for this layout


def _freeze(x: Any) -> Any:
  if isinstance(x, (list, tuple)):
    return tuple(_freeze(v) for v in x)
  if isinstance(x, dict):
    return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
  if isinstance(x, torch.Tensor):
    return ("tensor", id(x))
  return x


# --- entry ---------------------------------------------------------------------------


_PLANS: dict[Any, Callable] = tensor_lib._PLANS
_plans_lock = threading.Lock()


def get_plan(func: Any) -> Callable:
  plan = _PLANS.get(func)
  if plan is None:
    from bridge._src import mutation, special_ops  # they build on this module
    if func in special_ops.SPECIAL:
      plan = special_ops.SPECIAL[func]
      if func in special_ops.NEW_VALUES:
        plan = _proven(func, plan)
    elif _is_view(func):
      plan = _ViewPlan(func)
    elif _mutated(func):
      view = mutation.restride_twin(func)
      plan = mutation.RestridePlan(func, view) if view is not None else mutation.MutatingPlan(func)
    else:
      plan = _FunctionalPlan(func)
    with _plans_lock:
      plan = _PLANS.setdefault(func, plan)
  return plan


def _proven(func: Any, plan: Callable) -> Callable:
  """`plan` (a special op's that makes new tensors), whose int64 results in a 32-bit program
  are proven exact or refused (`narrowing`; the other plans do it themselves)."""
  def proven(args: tuple, kwargs: dict) -> Any:
    out = plan(args, kwargs)
    if _scope_var.get().narrow:
      narrowing.after_call(func, args, kwargs, out)
    return out
  return proven


# `bridge.Tensor.__torch_dispatch__` looks plans up in `_PLANS` and builds missing ones here.
tensor_lib._get_plan = get_plan

