"""Host calls: a Python function on torch tensors, called from inside a running XLA program.

`emit(key, args, results, ...)` stages a call of the host function registered
under `key` (`register`) into the JAX program being built. When the program runs,
the function gets the input buffers as torch tensors and returns torch tensors,
which are copied into the program's output buffers.

On the CPU the call is an XLA FFI custom call whose handler is written with
`ctypes` (no compiled extension): XLA calls it on the thread running the program,
the input tensors are views of XLA's own buffers (zero-copy) and the results are
copied straight into XLA's output buffers.

On a CUDA GPU it is JAX's buffer callback (`jax.experimental.buffer_callback`): the
function gets CUDA tensors over XLA's device buffers (zero-copy) and runs on XLA's
own stream (`torch.cuda.ExternalStream`), so torch's kernels are ordered after the
program's earlier work and before its later work with no synchronization, and the
results are copied into XLA's output buffers on that stream. Where neither is
available (another accelerator, a JAX without buffer callbacks, a torch without
CUDA) it is `jax.pure_callback`, which moves the data through host memory.
`route()` says which.

An exception in the host function does not cross into XLA: the handler returns
an XLA error carrying the torch traceback, and keeps the exception so that a
caller who runs the program eagerly can raise it again as it was (`reraise`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import os
import threading
import traceback
import weakref
from typing import Any, Callable, Hashable, Literal, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.experimental import io_callback

from bridge._src import dtypes, transfer
from bridge._src.errors import BridgeError, NarrowingError

# how a host call is batched under `jax.vmap` (JAX's `vmap_method` of its callbacks)
VmapMethod = Literal["sequential", "sequential_unrolled", "expand_dims", "broadcast_all"]

TARGET = "bridge_torch_host_call"

HostFn = Callable[[list], Sequence[torch.Tensor]]

# XLA's primitive types (xla_data.proto; `XLA_FFI_DataType` in XLA's FFI C API).
_XLA_TYPES = {
  1: torch.bool,
  2: torch.int8,
  3: torch.int16,
  4: torch.int32,
  5: torch.int64,
  6: torch.uint8,
  7: torch.uint16,
  8: torch.uint32,
  9: torch.uint64,
  10: torch.float16,
  11: torch.float32,
  12: torch.float64,
  16: torch.bfloat16,
  15: torch.complex64,
  18: torch.complex128,
  19: getattr(torch, "float8_e5m2", None),
  20: getattr(torch, "float8_e4m3fn", None),
  24: getattr(torch, "float8_e5m2fnuz", None),
  25: getattr(torch, "float8_e4m3fnuz", None),
}

_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_HOST: dict[int, tuple[HostFn, str]] = {}
_KEYS = itertools.count(1)
_ERRORS: dict[int, BaseException] = {}
_ERROR_IDS = itertools.count(1)
_LOCK = threading.Lock()


def register(fn: HostFn, name: str, owner: Any = None) -> int:
  """Keep `fn` callable from programs; returns the key to `emit` it with. With `owner`, only
  while `owner` lives (the caller's record of `fn`: `fn` must not refer to it); the programs
  that call it keep what it needs alive through `emit`'s `keep`."""
  key = next(_KEYS)
  _HOST[key] = (fn, name)
  if owner is not None:
    weakref.finalize(owner, _HOST.pop, key, None)
  return key


def _host_fn(key: int) -> tuple[HostFn, str]:
  found = _HOST.get(key)
  if found is None:  # (`keep` prevents it; a broken promise should not crash the process)
    raise BridgeError(
      "bridge: a JAX program called back into torch code that no longer exists. Please "
      "report this with the program."
    )
  return found


# --- the CPU handler (XLA FFI C API, read with ctypes) ------------------------------------

_I64 = ctypes.c_int64
_FRAME = _I64 * 22  # XLA_FFI_CallFrame: 22 machine words on a 64-bit platform
_BUFFER = _I64 * 6  # XLA_FFI_Buffer
_PAIR = _I64 * 2
_STAGE_EXECUTE = 3
_API_MAJOR, _API_MINOR = 0, 1
_ERROR_UNKNOWN = 2
_views: dict[tuple, torch.Tensor] = {}  # (address, dtype, dims) -> a tensor over that memory


def _view(ptr: int) -> torch.Tensor:
  """A torch tensor over the XLA buffer described at `ptr` (an `XLA_FFI_Buffer*`)."""
  b = _BUFFER.from_address(ptr)
  data, code, rank = b[3], b[2] & 0xFFFFFFFF, b[4]
  dims = tuple((_I64 * rank).from_address(b[5])) if rank else ()
  key = (data, code, dims)
  t = _views.get(key)
  if t is None:
    dtype = _XLA_TYPES.get(code)
    if dtype is None:
      raise BridgeError(
        f"bridge: a host call got a buffer of XLA type {code}, which torch has no equivalent for."
      )
    n = int(np.prod(dims, dtype=np.int64))
    if n == 0:
      return torch.empty(dims, dtype=dtype)
    raw = (ctypes.c_char * (n * dtype.itemsize)).from_address(data)
    t = torch.frombuffer(raw, dtype=dtype).view(dims)
    if len(_views) > 512:  # buffers come and go; keep the recent ones
      _views.clear()
    _views[key] = t
  return t


_ARRAYS = [_I64 * n for n in range(16)]


def _pointers(address: int, n: int) -> Any:
  """The `n` pointers stored at `address`, as ints."""
  return (_ARRAYS[n] if n < 16 else _I64 * n).from_address(address) if n else ()


def _pointer_at(address: int) -> int:
  """The pointer stored at `address` in one of XLA's FFI structs (never null where read)."""
  value = ctypes.c_void_p.from_address(address).value
  if value is None:
    raise BridgeError(
      f"bridge: XLA's FFI frame holds a null pointer at {address:#x}; "
      "this XLA speaks another FFI version. Please report it."
    )
  return value


def _fill_metadata(ext: int) -> None:
  """Answer XLA's metadata query (the API version this handler speaks)."""
  if ctypes.c_int.from_address(ext + 8).value != 1:  # XLA_FFI_Extension_Metadata
    return
  meta = _pointer_at(ext + 24)
  ctypes.c_int.from_address(meta + 24).value = _API_MAJOR
  ctypes.c_int.from_address(meta + 28).value = _API_MINOR
  ctypes.c_uint32.from_address(meta + 32).value = 0  # traits


_ERROR_CREATE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)


def _xla_error(api: int, message: str) -> int:
  """An `XLA_FFI_Error*` carrying `message` (XLA takes ownership)."""
  create = _ERROR_CREATE(_pointer_at(api + 48))
  text = ctypes.create_string_buffer(message.encode("utf-8", "replace"))
  args = _I64 * 4
  a = args(28, 0, ctypes.addressof(text), _ERROR_UNKNOWN)
  return create(ctypes.addressof(a)) or 0


def _handler(frame_ptr: int) -> int:
  try:
    f = _FRAME.from_address(frame_ptr)
    if f[1]:  # an extension: XLA asks for metadata when the handler is registered
      _fill_metadata(f[1])
      return 0
    if f[4] & 0xFFFFFFFF != _STAGE_EXECUTE:
      return 0
    scalar = _pointer_at(f[20])  # the one attribute, `key`
    key = _I64.from_address(_PAIR.from_address(scalar)[1]).value
    fn, name = _host_fn(key)
    results = fn([_view(p) for p in _pointers(f[9], f[7])])
    for i, p in enumerate(_pointers(f[14], f[12])):
      result = results[i]
      b = _BUFFER.from_address(p)
      rank = b[4]
      if (
        type(result) is torch.Tensor
        and result.dtype is _XLA_TYPES.get(b[2] & 0xFFFFFFFF)
        and result.shape == (tuple((_I64 * rank).from_address(b[5])) if rank else ())
        and result.is_cpu
        and result.is_contiguous()
        and not result.dtype.is_complex
      ):
        ctypes.memmove(b[3], result.data_ptr(), result.nbytes)  # the common case, inline
      else:  # (complex: a conjugate view's bytes are not its values)
        copy_result(_view(p), result, i, name)
    return 0
  except BaseException as e:  # noqa: BLE001 - nothing may unwind into XLA
    try:
      return _xla_error(f[2], describe_error(e, locals().get("name", "a torch function")))
    except BaseException:  # noqa: BLE001
      return 0


def check_result(
  result: Any, shape: Sequence[int], dtype: torch.dtype, i: int, name: str
) -> torch.Tensor:
  """`result`, if it is a tensor of the shape and dtype (or 32-bit counterpart) expected."""
  if not isinstance(result, torch.Tensor):
    raise BridgeError(f"{name}: output {i} is a {type(result).__name__}, not a tensor.")
  if tuple(result.shape) != tuple(shape) or (
    result.dtype != dtype and dtypes.NARROWED.get(result.dtype) != dtype
  ):
    raise BridgeError(
      f"{name}: output {i} came out as {str(result.dtype).removeprefix('torch.')}"
      f"{list(result.shape)}, but the JAX program was built for "
      f"{str(dtype).removeprefix('torch.')}{list(shape)}, the shape found before "
      "running it (from fake tensors, or `result_shape_dtypes`). In callback mode an "
      "output's shape and dtype must follow from the inputs' shapes and dtypes alone; "
      "pass the true ones with `result_shape_dtypes=` if they are static."
    )
  if result.dtype != dtype and not (dtype.is_floating_point or dtype.is_complex) and result.numel():
    # an int64 result leaving as int32 (the edge of a 32-bit program): only if it fits
    limits = torch.iinfo(dtype)
    bad = (result < limits.min) | (result > limits.max)
    if bool(bad.any()):
      position = int(torch.nonzero(bad.reshape(-1))[0, 0])
      raise NarrowingError(
        f"{name}: output {i} is {str(result.dtype).removeprefix('torch.')}, and the JAX "
        "program it is called from is built with JAX's 64-bit types disabled, so it leaves "
        f"as {str(dtype).removeprefix('torch.')}; but it holds "
        f"{result.reshape(-1)[position].item()} (at flat position {position}), which "
        f"{str(dtype).removeprefix('torch.')} cannot hold. Enable 64-bit types "
        "(`jax.config.update('jax_enable_x64', True)`) to keep it exactly."
      )
  return result


def copy_result(out: torch.Tensor, result: Any, i: int, name: str) -> None:
  """Copy one result into its output buffer, after checking it is what the program expects
  (`copy_` moves it across devices, in the current stream's order)."""
  out.copy_(check_result(result, out.shape, out.dtype, i, name))


def describe_error(e: BaseException, name: str) -> str:
  """The message of the XLA error for an exception raised by a host function (and keep `e`)."""
  with _LOCK:
    ident = next(_ERROR_IDS)
    _ERRORS[ident] = e
    while len(_ERRORS) > 32:
      _ERRORS.pop(next(iter(_ERRORS)))
  tb = e.__traceback__
  while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_OWN_DIR):
    tb = tb.tb_next  # the frames of this module and of callback mode are not the user's
  text = "".join(traceback.format_exception(type(e), e, tb))
  return (
    f"{name} raised {type(e).__name__}: {e} [bridge host error #{ident}]\n\n"
    f"The torch traceback, from inside the JAX program:\n{text}"
  )


def reraise(error: BaseException) -> None:
  """If `error` (raised by running a program) carries a host function's exception, raise that."""
  text = str(error)
  start = text.find("[bridge host error #")
  if start < 0:
    return
  ident = int(text[start + 20 : text.index("]", start)])
  original = _ERRORS.pop(ident, None)
  if original is not None:
    raise original.with_traceback(original.__traceback__)


_HANDLER_TYPE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
_handler_c = _HANDLER_TYPE(_handler)
_registered: set[str] = set()


def _register_target(platform: str) -> None:
  with _LOCK:
    if platform in _registered:
      return
    capsule = jax.ffi.pycapsule(ctypes.cast(_handler_c, ctypes.c_void_p))
    jax.ffi.register_ffi_target(TARGET, capsule, platform=platform, api_version=1)
    _registered.add(platform)


# --- emitting a call ---------------------------------------------------------------------------


# A staged check's id -> the function that makes its exception from the offending value and
# its flat position (`stage_check`); and the id of each check's name, so that the checks of
# every trace of the same op share one entry (a program holds its id for as long as JAX keeps
# it, which no hook tells: one entry per trace would grow with every new function traced).
_CHECKS: dict[int, Callable[[Any, int], BaseException]] = {}
_CHECK_IDS_BY_NAME: dict[Hashable, int] = {}
_CHECK_IDS = itertools.count()
_check_key: list[int] = []


def check_name(*parts: Any) -> Hashable:
  """A name for `stage_check` from the parts its error depends on; a function among them
  (a message made from the value and position) by its code and the values it closes over,
  or by its identity where those cannot be hashed."""
  named: list[Any] = []
  for part in parts:
    code = getattr(part, "__code__", None)
    if code is not None:
      cells = tuple(c.cell_contents for c in part.__closure__ or ())
      by_value = (code, part.__defaults__, cells)
      try:
        hash(by_value)
      except TypeError:
        by_value = part
      named.append(by_value)
    else:
      named.append(part)
  return tuple(named)


def stage_check(
  bad: Any, values: Any, error: Callable[[Any, int], BaseException], name: Hashable
) -> None:
  """A host call in the program being staged that fails its run with `error(value, position)`
  for the first True element of bool array `bad` (`values`: what to report there, broadcast
  to `bad`'s shape; None reports the position). `name` (`check_name`) is the same exactly
  for checks whose `error` is the same. The caller checks `supported()` first."""
  if not _check_key:
    _check_key.append(register(_raise_check, "a value check"))
  ident = _CHECK_IDS_BY_NAME.get(name)
  if ident is None:
    ident = next(_CHECK_IDS)
    _CHECKS[ident] = error
    _CHECK_IDS_BY_NAME[name] = ident
  flat = jnp.ravel(bad)
  position = jnp.argmax(flat)
  value = position if values is None else jnp.ravel(jnp.broadcast_to(values, bad.shape))[position]
  emit(
    _check_key[0],
    [jnp.any(flat), value, position, np.int32(ident)],
    [],
    vmap_method="broadcast_all",
    side_effect=True,
  )


def _raise_check(tensors: list) -> list:
  """The host side of `stage_check` (under `jax.vmap`, every input has the batch dims)."""
  flags, values, positions, idents = (t.reshape(-1) for t in tensors)
  hits = torch.nonzero(flags)
  if len(hits):
    i = int(hits[0, 0])
    raise _CHECKS[int(idents[i])](values[i].item(), int(positions[i]))
  return []


def platform() -> str:
  """The platform host calls would run on: that of JAX's default backend."""
  return jax.default_backend()


def supported(platform_name: str | None = None) -> bool:
  """Whether programs on this platform can call back into Python (CPU and GPU can)."""
  return (platform_name or platform()) in ("cpu", "gpu", "cuda", "rocm")


def route(platform_name: str | None = None) -> str:
  """How host calls run on a platform: "ffi" (CPU: the ctypes FFI handler), "buffers" (a CUDA
  GPU: XLA's device buffers on XLA's stream) or "host" (JAX's Python callbacks, through host
  memory)."""
  name = platform_name or platform()
  if name == "cpu":
    return "ffi"
  if (
    name in ("gpu", "cuda")
    and _buffer_callback is not None
    and torch.cuda.is_available()
    and torch.version.cuda is not None
  ):
    return "buffers"
  return "host"


def torch_device(platform_name: str | None = None) -> torch.device:
  """The torch device of the tensors a host function gets (its fake run uses the same)."""
  device = jax.devices()[0]
  if route(platform_name) == "buffers" and device.platform in ("gpu", "cuda"):
    return torch.device("cuda", _cuda_index(device))
  return torch.device("cpu")


def _cuda_index(device: Any) -> int:
  index = getattr(device, "local_hardware_id", None)
  return int(index) if index is not None else int(device.id)


def emit(
  key: int,
  args: Sequence[Any],
  results: Sequence[jax.ShapeDtypeStruct],
  *,
  vmap_method: VmapMethod,
  side_effect: bool = False,
  keep: Any = None,
) -> Sequence[Any]:
  """Stage (or run, for concrete arguments) a call of host function `key`; `keep` (the user's
  torch function or module that `key`'s function runs) stays alive while a compiled program
  holds the call."""
  how = route()
  if how == "ffi":
    _register_target("cpu")
    kept = _host_call(args, results, key, keep, vmap_method, side_effect)
    if kept is not None:
      return kept
    call = jax.ffi.ffi_call(
      TARGET, list(results), has_side_effect=side_effect, vmap_method=vmap_method
    )
    return call(*args, key=np.int64(key))
  if args and all(_eager(a) for a in args):
    # nothing is being staged (concrete values, `jax.vmap` without jit): the host function
    # runs now, where JAX's callbacks would compile a program for each function (and under
    # "sequential", a scan for every call). `bridge_host_call` is bound only so: it has no
    # lowering for this platform.
    kept = _host_call(args, results, key, keep, vmap_method, side_effect)
    if kept is not None:
      return kept
  if how == "buffers":
    return _emit_on_device(
      key, args, results, vmap_method=vmap_method, side_effect=side_effect, keep=keep
    )
  return _emit_through_host(
    key, args, results, vmap_method=vmap_method, side_effect=side_effect, keep=keep
  )


# The CPU route's primitive, `bridge_host_call`: JAX's `ffi_call` with two more parameters,
# `host_key` and `keep`. Its lowering is `ffi_call`'s with the key as the custom call's
# attribute, and hands `keep` (the user's function) to the compiled program as a keepalive,
# as JAX's own Python callbacks keep their functions: the program holds the function for as
# long as it can call it, and nothing else does (callback mode's caches refer to it weakly).
# Outside `jax.jit` it compiles nothing: on concrete arrays (an eager call, `jax.vmap`
# without jit) the host function runs directly on torch views of them, where `ffi_call`
# would compile a program for each key (and, under `vmap`'s "sequential" method, a scan
# for each call). Its other rules are `ffi_call`'s own, from the primitive this JAX's
# `ffi_call` binds.
_host_call_p: list[Any] = []  # [the primitive] once made; [None] where this JAX lacks its rules
_PARAMS_CACHE_SIZE = 256
_params: dict[tuple, dict[str, Any] | None] = {}
_MISSING = object()


def _host_call(
  args: Sequence[Any],
  results: Sequence[jax.ShapeDtypeStruct],
  key: int,
  keep: Any,
  vmap_method: VmapMethod,
  side_effect: bool,
) -> list[Any] | None:
  """The host call `key` bound as `bridge_host_call`, or None where that cannot be done."""
  avals = tuple((np.shape(a), jnp.result_type(a)) for a in args)
  results = tuple(jax.ShapeDtypeStruct(r.shape, r.dtype) for r in results)
  signature = (avals, results, vmap_method, side_effect, dtypes.x64_enabled())
  params: Any = _params.get(signature, _MISSING)  # (a get: another thread may clear it)
  if params is _MISSING:
    params = _ffi_params(avals, results, vmap_method, side_effect)
    if len(_params) >= _PARAMS_CACHE_SIZE:
      _params.clear()
    _params[signature] = params
  if params is None:
    return None
  prim = _host_call_p[0] if _host_call_p else _make_host_call_p()
  if prim is None:
    return None
  return list(prim.bind(*args, keep=keep, host_key=key, **params))


def _ffi_params(
  avals: tuple, results: tuple, vmap_method: VmapMethod, side_effect: bool
) -> dict[str, Any] | None:
  """The parameters `ffi_call` binds for such a call, less its attributes (the key)."""
  call = jax.ffi.ffi_call(
    TARGET, list(results), has_side_effect=side_effect, vmap_method=vmap_method
  )
  specs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in avals]
  try:
    eqns = jax.make_jaxpr(lambda *a: call(*a, key=np.int64(0)))(*specs).jaxpr.eqns
  except Exception:  # noqa: BLE001 - the plain call explains
    return None
  if len(eqns) != 1 or eqns[0].primitive.name != "ffi_call":
    return None
  _make_host_call_p(eqns[0].primitive)
  return {k: v for k, v in eqns[0].params.items() if k != "attributes"}


def _make_host_call_p(ffi_prim: Any = None) -> Any:
  with _LOCK:
    if not _host_call_p and ffi_prim is not None:
      _host_call_p.append(_new_host_call_p(ffi_prim))
    return _host_call_p[0] if _host_call_p else None


class _Held:
  """What a program's host call needs alive (the user's function), as a host callback of the
  program: XLA keeps those as long as the executable and its running executions. Never called."""

  __slots__ = ("obj",)

  def __init__(self, obj: Any):
    self.obj = obj

  def __call__(self, *args: Any) -> Any:  # pragma: no cover - never called
    raise RuntimeError("bridge: a keep-alive holder was called")


def _new_host_call_p(ffi_prim: Any) -> Any:
  from jax.extend.core import Primitive
  from jax.interpreters import batching, mlir

  try:  # `ffi_call`'s batching rule, which binds the primitive it is given
    from jax._src.ffi import ffi_batching_rule
  except ImportError:  # another JAX: the plain call (which keeps the function alive for good)
    return None
  prim = Primitive("bridge_host_call")
  prim.multiple_results = True

  def impl(*args: Any, keep: Any, host_key: int, result_avals: Any, **params: Any) -> Any:
    return _run_now(host_key, args, (None,) * len(args), result_avals)

  def abstract_eval(*avals: Any, keep: Any, host_key: int, **params: Any) -> Any:
    return ffi_prim.abstract_eval(*avals, **params)

  def lower(ctx: Any, *operands: Any, keep: Any, host_key: int, **params: Any) -> Any:
    if keep is not None:
      # held by the runtime executable, which a running execution holds: a throw-away
      # `jax.jit` may drop its Python executable (and what `add_keepalive` holds) while the
      # program is still queued, and the host function must outlive that run
      ctx.module_context.add_host_callback(_Held(keep))
    lowering = jax.ffi.ffi_lowering(TARGET, has_side_effect=params["has_side_effect"])
    return lowering(ctx, *operands, key=np.int64(host_key))

  def batch(args: Sequence[Any], dims: Sequence[Any], **params: Any) -> Any:
    method = params["vmap_method"]
    if method in ("sequential", "sequential_unrolled"):
      if not any(isinstance(a, jax.core.Tracer) for a in args):  # `jax.vmap` without jit
        outs = _run_now(params["host_key"], args, dims, params["result_avals"])
        return outs, (0,) * len(outs)
      if all(_eager(a) for a in args):  # a `vmap` of a `vmap`, without jit
        return _unstacked(prim, args, dims, params), (0,) * len(params["result_avals"])
    return ffi_batching_rule(prim, args, dims, **params)

  prim.def_impl(impl)
  prim.def_effectful_abstract_eval(abstract_eval)
  batching.primitive_batchers[prim] = batch
  mlir.register_lowering(prim, lower, platform="cpu")
  return prim


try:
  from jax._src.interpreters.batching import BatchTracer as _BatchTracer
except ImportError:  # pragma: no cover - another JAX: a vmap of a vmap takes JAX's rule
  _BatchTracer = ()  # type: ignore[assignment,misc]


def _eager(a: Any) -> bool:
  """Whether `a` is concrete under `jax.vmap`s alone (no program is being staged)."""
  while isinstance(a, _BatchTracer):
    a = a.val
  return not isinstance(a, jax.core.Tracer)


def _unstacked(prim: Any, args: Sequence[Any], dims: Sequence[Any], params: dict) -> list[Any]:
  """The batched call as one call per element (each runs now), stacked."""
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  rows = [
    prim.bind(
      *(a if d is None else jax.lax.index_in_dim(a, i, d, False) for a, d in zip(args, dims)),
      **params,
    )
    for i in range(size)
  ]
  return [
    jnp.stack([row[j] for row in rows]) if size else jnp.zeros((0, *aval.shape), aval.dtype)
    for j, aval in enumerate(params["result_avals"])
  ]


def _run_now(host_key: int, args: Sequence[Any], dims: Sequence[Any], result_avals: Any) -> list:
  """The host call on concrete values, without a program: the host function gets torch views
  of them (of each element in turn where `dims` names a batch dimension: `vmap`'s
  "sequential") on the device its program would give it (`torch_device`), and its results
  are checked and copied into new arrays, as into a program's output buffers. Its
  exceptions propagate as they are."""
  fn, name = _host_fn(host_key)
  device = torch_device()
  tensors = []
  size = None
  for a, d in zip(args, dims):
    if not isinstance(a, jax.Array):
      a = jnp.asarray(a)  # a NumPy or Python value: its dtype in the program
    t = transfer.array_to_torch(a, copy=None, api="bridge", where=lambda: "a host call's input")
    if t.device != device:
      t = t.to(device)
    if d is not None:
      t = t.movedim(d, 0).contiguous()
      size = t.shape[0]
    tensors.append(t)
  outs = [
    torch.empty(
      (*(() if size is None else (size,)), *aval.shape),
      dtype=dtypes.JAX_TO_TORCH[np.dtype(aval.dtype)],
      device=device,
    )
    for aval in result_avals
  ]
  for i in range(1 if size is None else size):
    inputs = tensors if size is None else [t if d is None else t[i] for t, d in zip(tensors, dims)]
    results = fn(inputs)
    for j, out in enumerate(outs):
      copy_result(out if size is None else out[i], results[j], j, name)
  with jax.enable_x64(True):  # (the program's own types: 64-bit ones where it has them)
    return [
      transfer.tensor_to_jax(out, copy=None, api="bridge", where=lambda: "a host call's output")
      for out in outs
    ]


try:
  from jax.experimental.buffer_callback import buffer_callback as _buffer_callback
except ImportError:  # pragma: no cover - a JAX before buffer callbacks
  _buffer_callback = None  # type: ignore[assignment]

_DL_CUDA = 2  # DLDeviceType.kDLCUDA


def _buffer_tensor(buffer: Any) -> torch.Tensor:
  """A torch tensor over one of XLA's buffers in a buffer callback (zero-copy)."""
  # (the capsule, not the object: torch would ask the producer to order itself after torch's
  # current stream, which is XLA's own stream here already)
  return torch.utils.dlpack.from_dlpack(buffer.__dlpack__())


@functools.lru_cache(maxsize=16)
def _external_stream(pointer: int, index: int) -> Any:
  """torch's handle on XLA's stream `pointer` of GPU `index` (XLA keeps its streams)."""
  return torch.cuda.ExternalStream(pointer, device=torch.device("cuda", index))


class _OnStream:
  """Runs torch on `stream` of GPU `index`, the current device: `torch.cuda.stream(stream)`
  without its device checks and switches (a fifth of a small host call's cost)."""

  __slots__ = ("stream", "index", "prev")

  def __init__(self, stream: Any, index: int):
    self.stream, self.index = stream, index

  def __enter__(self) -> None:
    self.prev = torch._C._cuda_getCurrentStream(self.index)
    s = self.stream
    torch._C._cuda_setStream(
      stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type
    )

  def __exit__(self, *exc: Any) -> None:
    stream_id, device_index, device_type = self.prev
    torch._C._cuda_setStream(
      stream_id=stream_id, device_index=device_index, device_type=device_type
    )


def _xla_stream(ctx: Any, bufs: Sequence[Any]) -> Any:
  """A context running torch on XLA's stream for this call (nothing on the CPU)."""
  device = next((b.__dlpack_device__() for b in bufs), None)
  if device is None or device[0] != _DL_CUDA:
    return contextlib.nullcontext()
  index = int(device[1])
  stream = _external_stream(ctx.stream, index)
  if torch._C._cuda_getDevice() != index:  # another device is current: torch switches it too
    return torch.cuda.stream(stream)
  return _OnStream(stream, index)


def _emit_on_device(
  key: int,
  args: Sequence[Any],
  results: Sequence[jax.ShapeDtypeStruct],
  *,
  vmap_method: VmapMethod,
  side_effect: bool,
  keep: Any = None,
) -> list[Any]:
  """The host call through JAX's buffer callback: torch works on XLA's device buffers, in the
  order of XLA's stream (see the module docstring). (The callback, which JAX keeps with the
  program, holds `keep`.)"""
  fn, name = _host_fn(key)

  def callback(ctx: Any, outs: Sequence[Any], *bufs: Any, _keep: Any = keep) -> None:
    try:
      with _xla_stream(ctx, [*bufs, *outs]):
        results_ = fn([_buffer_tensor(b) for b in bufs])
        for i, out in enumerate(outs):
          copy_result(_buffer_tensor(out), results_[i], i, name)
    except BaseException as e:  # noqa: BLE001 - kept for `reraise`, described for JAX
      raise RuntimeError(describe_error(e, name)) from None

  call = _buffer_callback(
    callback, list(results), has_side_effect=side_effect, vmap_method=vmap_method
  )
  return list(call(*args))


def _numpy_to_torch(a: np.ndarray) -> torch.Tensor:
  dtype = dtypes.JAX_TO_TORCH[a.dtype]
  if a.dtype.kind == "V" or a.dtype.name.startswith(("bfloat16", "float8")):  # ml_dtypes
    raw = np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")
    return torch.from_numpy(raw.copy()).view(dtype)
  return torch.from_numpy(np.array(a))  # (a writable copy: JAX's host buffer is read-only)


def _torch_to_numpy(t: torch.Tensor, spec: jax.ShapeDtypeStruct) -> np.ndarray:
  want = dtypes.JAX_TO_TORCH[np.dtype(spec.dtype)]
  t = t.detach().cpu().resolve_conj().resolve_neg()
  if t.dtype != want:
    if dtypes.NARROWED.get(t.dtype) != want:
      raise BridgeError(f"bridge: a host call returned {t.dtype} where the program expects {want}.")
    t = t.to(want)
  if np.dtype(spec.dtype).name.startswith(("bfloat16", "float8")):
    raw = t.contiguous().view(getattr(torch, f"uint{8 * t.element_size()}"))
    return raw.numpy().view(spec.dtype)
  return t.numpy()


def _emit_through_host(
  key: int,
  args: Sequence[Any],
  results: Sequence[jax.ShapeDtypeStruct],
  *,
  vmap_method: VmapMethod,
  side_effect: bool,
  keep: Any = None,
) -> list[Any]:
  """The host call where no FFI handler is registered: JAX's Python callbacks (the data goes
  through host memory). (The callback, which JAX keeps with the program, holds `keep`.)"""
  fn, name = _host_fn(key)

  def host(*arrays: Any, _keep: Any = keep) -> list[np.ndarray]:
    try:
      outs = fn([_numpy_to_torch(np.asarray(a)) for a in arrays])
      return [_torch_to_numpy(o, spec) for o, spec in zip(outs, results)]
    except BaseException as e:  # noqa: BLE001 - kept for `reraise`, described for JAX
      raise RuntimeError(describe_error(e, name)) from None

  if side_effect:
    return list(io_callback(host, list(results), *args, ordered=False))
  return list(jax.pure_callback(host, list(results), *args, vmap_method=vmap_method))
