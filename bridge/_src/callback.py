"""Callback mode: torch code run for real, in eager torch, from inside a JAX program.

`call_torch(fn, *args, mode="callback")` stages one host call (`bridge._src.ffi`)
into the program instead of tracing `fn` op by op, so any torch code works: ops
with no lowering, custom ops, third-party extensions.

* Shapes: the program must know the outputs' shapes and dtypes before it runs, so
  `fn` first runs once on torch's fake tensors (no data, no compute); the result
  is cached per input shapes and dtypes. `result_shape_dtypes=` gives them instead.
* The fake run also says whether `fn` writes to its inputs in place (those are
  then copied first: the caller's JAX arrays are immutable and stay unchanged) and
  whether it draws random numbers (then each call draws a seed, and a backward
  pass replays the same randomness).
* Gradients: a `jax.custom_vjp` whose backward is another host call that runs
  `fn` again under torch autograd and returns `torch.autograd.grad` of it. That
  backward is itself a callback-mode function, so it can be differentiated again
  (reverse over reverse, through torch's double backward).
* `jax.vmap`: `vmap_method` as in `jax.pure_callback` ("sequential": one torch
  call per example; "broadcast_all" / "expand_dims": one call on the whole batch,
  for functions that treat a leading dimension as a batch).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import weakref
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._subclasses.fake_tensor import (
  DataDependentOutputException,
  DynamicOutputShapeException,
  FakeTensorMode,
  UnsupportedOperatorException,
)

from bridge._src import dtypes
from bridge._src import ffi
from bridge._src import module_state as state_lib
from bridge._src import narrowing
from bridge._src import scope
from bridge._src import transfer
from bridge._src import tree as tree_lib
from bridge._src.errors import BridgeError, NarrowingError
from bridge._src.tracing import check_mode

API = "bridge.call_torch"
# `api` of the per-op fallback's calls (`dispatch/fallback`): the user called no API of callback
# mode there, so messages speak as the bridge and advise a lowering, not `result_shape_dtypes=`.
FALLBACK = "the per-op fallback"

_DYN = tree_lib.DYN


def _hashable(x: Any) -> Any:
  """`x` as a static leaf of a cache key: tensors and unhashable values by identity."""
  if isinstance(x, torch.Tensor):
    return tree_lib.ByIdentity(x)
  try:
    hash(x)
    return x
  except TypeError:
    return tree_lib.ByIdentity(x)


def _unbox(x: Any) -> Any:
  return x.v if type(x) is tree_lib.ByIdentity else x


def _is_float(dtype: Any) -> bool:
  return jnp.issubdtype(dtype, jnp.inexact)


# --- the fake run ----------------------------------------------------------------------------


# Ops that write to arguments their schema does not mark as written (nor bump the version
# counter of): argument positions, when the `training` argument (position 5) is true.
_UNMARKED_WRITES = {torch.ops.aten.native_batch_norm.default: (3, 4)}


def _memory(t: torch.Tensor) -> int | None:
  """Which memory `t` reads: its storage's identity, shared by its views and by tensors that
  torch does not count as views of it (`t.data`, `torch.empty(0).set_(t.untyped_storage())`,
  which have no `_base` and a version counter of their own); None where it has no storage."""
  try:
    return t.untyped_storage()._cdata
  except (RuntimeError, NotImplementedError):  # (sparse, nested: no storage to share)
    return None


def _version(t: torch.Tensor) -> int | None:
  """`t`'s version counter, or None for an inference tensor (made under
  `torch.inference_mode()`), which has none: writes to it are seen by `_Recorder`, from the
  ops' schemas."""
  return None if t.is_inference() else t._version


class _Recorder(torch.utils._python_dispatch.TorchDispatchMode):
  """Notes whether any op draws random numbers, and which tensors ops write to."""

  def __init__(self) -> None:
    super().__init__()
    self.random = False
    self.written: set[int | None] = set()  # the memory written to (`_memory`)

  def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
    kwargs = kwargs or {}
    if torch.Tag.nondeterministic_seeded in func.tags:
      self.random = True
    positions = _written_args(func)
    if positions:
      for i, a in enumerate(func._schema.arguments):
        if i in positions:
          value = args[i] if i < len(args) else kwargs.get(a.name)
          if isinstance(value, torch.Tensor):
            self.written.add(_memory(value))
    unmarked = _UNMARKED_WRITES.get(func)
    if unmarked and len(args) > 5 and args[5]:
      for i in unmarked:
        if isinstance(args[i], torch.Tensor):
          self.written.add(_memory(args[i]))
    return func(*args, **kwargs)


_writes: dict[Any, frozenset[int]] = {}


def _written_args(func: Any) -> frozenset[int]:
  positions = _writes.get(func)
  if positions is None:
    positions = _writes[func] = frozenset(
      i
      for i, a in enumerate(func._schema.arguments)
      if a.alias_info is not None and a.alias_info.is_write
    )
  return positions


class _FakeResult:
  """What the fake run learnt: the outputs' structure and specs, mutations, randomness."""

  def __init__(self, out: Any, mutated: tuple[bool, ...], random: bool, writes_state: bool):
    self.out, self.mutated, self.random = out, mutated, random
    self.writes_state = writes_state  # it updates its module's buffers


_quiet = threading.local()  # .on: this thread is in a fake run (`_fake_run`)


class _QuietFakeRuns(logging.Filter):
  """Drops torch's FakeTensor log of a meta kernel's failure ("failed while attempting to run
  meta for aten.mm.default" and its traceback, about 20 lines) during the bridge's own fake
  runs: the exception itself reaches the user, with the bridge's note."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not getattr(_quiet, "on", False)


_quiet_filter = _QuietFakeRuns()


def _fake_run(
  call: Callable[[list], Any],
  in_specs: Sequence[tuple],
  name: str,
  module: torch.nn.Module | None = None,
  api: str = API,
  values: Sequence[Any] | None = None,
) -> _FakeResult:
  """`call` run on fake tensors of `in_specs`; if that raises, torch's own exception for the
  call where it differs (`_torchs_own_error`, run on copies of `values`, the arguments'
  arrays when they are concrete, else on zeros)."""
  mode = FakeTensorMode(allow_non_fake_inputs=True)
  recorder = _Recorder()
  # A module runs with fake copies of its state: fake mode would otherwise run in-place
  # updates of small real buffers (a step counter) for real.
  state: Any = contextlib.nullcontext()
  fake_state: dict[str, torch.Tensor] = {}
  if module is not None:
    fake_state = {n: mode.from_tensor(t) for n, t in state_lib.module_state(module).items()}
    state = state_lib.reparametrized(module, fake_state)  # for this thread only
  state_versions = {n: _version(t) for n, t in fake_state.items()}
  failure: Exception | None = None
  with mode, state:
    device = ffi.torch_device()  # where the real run's tensors will be
    fakes = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in in_specs]
    versions = [_version(t) for t in fakes]
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    if _quiet_filter not in fake_log.filters:
      fake_log.addFilter(_quiet_filter)
    _quiet.on = True
    try:
      with recorder:
        out = call(fakes)
    except (DataDependentOutputException, DynamicOutputShapeException) as e:
      fixed = (
        "If they are in fact fixed, pass them: "
        f"{_with_shapes(api, 'jax.ShapeDtypeStruct(shape, dtype)')} (a pytree of them, like "
        "the outputs); otherwise return fixed-size results (pad, or return a mask instead of "
        "selecting)."
        if api != FALLBACK
        else "Run the op outside the JAX program, or register a lowering for it "
        "(`bridge.register_lowering`) with fixed-size results."
      )
      raise scope.TracedValueError(
        f"{_speaker(api)}: the shapes of {name}'s outputs cannot be found "
        f"before it runs: it {_data_dependence(e)}, at\n  {scope.user_line(e.__traceback__)}\n"
        f"A JAX program needs every output's shape and dtype when it is built. {fixed}"
      ) from e
    except UnsupportedOperatorException as e:
      if not isinstance(getattr(e, "func", None), torch._ops.OpOverload):
        raise
      raise BridgeError(
        f"{_speaker(api)}: {name} calls {e.func}, which has no fake (meta) "
        "implementation, so its outputs' shapes cannot be found without running it. Give "
        f"the op one (`torch.library.register_fake`), or {_shapes_advice(api)}."
      ) from e
    except RuntimeError as e:
      if "fake impl" in str(e).lower():
        raise BridgeError(
          f"{_speaker(api)}: {name} calls an op with no fake implementation, so "
          "its outputs' shapes cannot be found without running it. Give the op one "
          f"(`torch.library.register_fake`), or {_shapes_advice(api)}. Torch said: "
          f"{str(e).splitlines()[0]}"
        ) from e
      failure = e
    except Exception as e:  # noqa: BLE001 - the user's code: any exception, raised below
      failure = e
    finally:
      _quiet.on = False
  if failure is not None:  # (outside fake mode, and with the module's own state back)
    own = _torchs_own_error(failure, call, in_specs, module, values)
    if own is not None:
      if values is None:
        own.add_note(
          f"(bridge: torch raised this running {name} on zeros of its arguments' shapes and "
          f"dtypes, after its run on fake tensors (which {_speaker(api)} makes to find its "
          "outputs' shapes before the JAX program runs) failed.)"
        )
      raise own from None
    _note_fake_run(failure, name, api)
    raise failure
  written = recorder.written
  written.discard(None)
  mutated = tuple(_version(t) != v or _memory(t) in written for t, v in zip(fakes, versions))
  writes_state = any(
    _version(t) != state_versions[n] or _memory(t) in written for n, t in fake_state.items()
  )
  return _FakeResult(out, mutated, recorder.random, writes_state)


# The most bytes of arguments that `_torchs_own_error` copies, or makes zeros of.
_OWN_ERROR_BYTES = 1 << 28


def _torchs_own_error(
  failure: Exception,
  call: Callable[[list], Any],
  in_specs: Sequence[tuple],
  module: torch.nn.Module | None,
  values: Sequence[Any] | None,
) -> BaseException | None:
  """Torch's own exception where the fake run's `failure` is a fake (meta) kernel's (for
  `t @ t` on (2, 3): "a and b must have same reduction dim", where torch says "mat1 and mat2
  shapes cannot be multiplied (2x3 and 2x3)"): `call` run for real, on copies of the
  arguments' concrete arrays `values`, or else on zeros of their specs. Any exception of
  the first; on zeros only one of `failure`'s type (another could come from the zeros, a
  singular matrix). None if the run raises none, the same one, or is not made (bridge
  errors; large arguments). The run leaves torch's generators and a module's state as they
  were (it runs on copies of the state, in this thread only)."""
  if isinstance(failure, BridgeError):
    return None
  if sum(math.prod(shape) * dtype.itemsize for shape, dtype in in_specs) > _OWN_ERROR_BYTES:
    return None
  device = ffi.torch_device()
  if values is not None:
    with jax.enable_x64(True):
      inputs = [
        transfer.array_to_torch_arg(a, api=API, where=lambda: "an argument").clone() for a in values
      ]
  else:
    inputs = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype in in_specs]
  state: Any = contextlib.nullcontext()
  if module is not None:
    copies = {n: _state_copy(t) for n, t in state_lib.module_state(module).items()}
    state = state_lib.reparametrized(module, copies)  # for this thread only
  cuda = [device.index or 0] if device.type == "cuda" else []
  try:
    with torch.random.fork_rng(devices=cuda), state:
      call(inputs)
  except Exception as e:  # noqa: BLE001 - torch's own exception is what is wanted
    same = type(e) is type(failure) and str(e) == str(failure)
    if same or (values is None and type(e) is not type(failure)):
      return None
    return e
  return None


def _state_copy(t: torch.Tensor) -> torch.Tensor:
  """A copy of a module's parameter or buffer, for a run that must not change it."""
  copy = t.detach().clone()
  return copy.requires_grad_() if t.requires_grad and torch.is_grad_enabled() else copy


def _note_fake_run(e: BaseException, name: str, api: str) -> None:
  who = FALLBACK if api == FALLBACK else _speaker(api)
  e.add_note(
    f"(bridge: this happened while {who} ran {name} on torch's "
    "fake tensors, which have shapes and dtypes but no data, to find its outputs' "
    "shapes before the JAX program runs. If the function needs real data for that, "
    f"{_shapes_advice(api)}.)"
  )


def _speaker(api: str) -> str:
  """Who a callback-mode message speaks as: the API the user called, or the bridge itself
  for the per-op fallback."""
  return "bridge" if api == FALLBACK else f"`{api}(..., mode='callback')`"


def _shapes_advice(api: str) -> str:
  """What to do when the outputs' shapes cannot be found from fake tensors."""
  if api == FALLBACK:
    return "register a lowering for the op (`bridge.register_lowering`), which runs it in JAX"
  return f"pass the outputs' shapes: {_with_shapes(api)}"


# How each API that runs torch in callback mode is given the outputs' shapes.
_WITH_SHAPES = {
  "bridge.call_torch": "bridge.call_torch(fn, ..., mode='callback', result_shape_dtypes={})",
  "bridge.jax_view": "bridge.jax_view(fn, mode='callback', result_shape_dtypes={})",
  "bridge.extract_jax": "bridge.extract_jax(module, mode='callback', result_shape_dtypes={})",
}


def _with_shapes(api: str, shapes: str = "...") -> str:
  """The call of `api` that passes the outputs' shapes `shapes`, for advice in messages."""
  return f"`{_WITH_SHAPES.get(api, 'result_shape_dtypes={}').format(shapes)}`"


def _data_dependence(e: BaseException) -> str:
  func = getattr(e, "func", None)
  if func is not None and "_local_scalar_dense" in str(func):
    return "reads a tensor's value in Python (`.item()`, `if t:`, `int(t)`)"
  return (
    f"calls {func}, whose output shape depends on the data"
    if func is not None
    else "has an output shape that depends on the data"
  )


# --- programs: one per function, input structure and input specs ---------------------------


class _Program:
  """A flat torch function of tensors as a differentiable, batchable JAX function.

  `flat_fn(inputs) -> outputs` takes and returns lists of torch tensors. `ins` and
  `outs` are the JAX specs of both sides; `random` programs take a uint32 seed as
  their first input.
  """

  def __init__(
    self,
    flat_fn: Callable[[list], list],
    ins: Sequence[jax.ShapeDtypeStruct],
    outs: Sequence[jax.ShapeDtypeStruct],
    *,
    name: str,
    vmap_method: ffi.VmapMethod,
    random: bool,
    restore: Callable[[], Any] | None = None,
    side_effect: bool = False,
    keep: Any = None,
  ):
    self.flat_fn, self.ins, self.outs, self.name = flat_fn, list(ins), list(outs), name
    self.vmap_method, self.random, self.restore = vmap_method, random, restore
    self.side_effect = side_effect  # never dropped as dead code (it updates module buffers)
    self.diff_in = [i for i, s in enumerate(self.ins) if _is_float(s.dtype)]
    self.diff_out = [i for i, s in enumerate(self.outs) if _is_float(s.dtype)]
    # With `keep` (the user's function or module, which `flat_fn` refers to weakly: `_build`),
    # the host function is registered while this program lives, and the programs that call
    # it keep `keep` alive (`ffi.emit`): nothing here keeps the user's function alive.
    self.keep = weakref.ref(keep) if keep is not None else None
    self._host = _seeded(flat_fn) if random else flat_fn  # (refers to `flat_fn`, not `self`)
    self.key = ffi.register(self._host, name, self if keep is not None else None)
    self._vjps: dict[tuple, _Program] = {}
    # (a custom_vjp even without float outputs: JAX must not try to differentiate the raw call)
    self.apply = self._differentiable() if self.diff_in else self._emit

  def _emit(self, *dyn: Any) -> tuple:
    if not self.random and not any(isinstance(d, jax.core.Tracer) for d in dyn):
      # concrete values (the forward of `jax.grad` without jit): run now, as a plain call
      # does, rather than compile a program of one host call per function
      return tuple(_call_now(self, list(dyn)))
    keep = self.keep() if self.keep is not None else None
    return tuple(
      ffi.emit(
        self.key,
        dyn,
        self.outs,
        vmap_method=self.vmap_method,
        side_effect=self.side_effect,
        keep=keep,
      )
    )

  def _differentiable(self) -> Callable[..., tuple]:
    @jax.custom_vjp
    def f(*dyn: Any) -> tuple:
      return self._emit(*dyn)

    def fwd(*primals: Any) -> tuple:
      dyn = tuple(p.value for p in primals)
      # Which inputs JAX differentiates: only those get torch gradients (a BatchNorm
      # buffer, say, must not be made to require grad). The residuals' structure
      # carries the choice to `bwd`: () for a perturbed input, None otherwise.
      marks = tuple(() if p.perturbed else None for p in primals)
      # (f, not the bare call: reverse over reverse; the user's function rides along in the
      # residuals' structure, so that it lives until the backward has run)
      return f(*dyn), (dyn, marks, _Kept(self.keep() if self.keep is not None else None))

    def bwd(res: tuple, cts: tuple) -> tuple:
      dyn, marks, _ = res
      wrt = tuple(i for i in self.diff_in if marks[i] == ())
      out: list[Any] = [None] * len(dyn)
      if not wrt or not self.diff_out:
        return tuple(out)
      zero = jax.custom_derivatives.SymbolicZero
      given = [
        cts[i]
        if not isinstance(cts[i], zero)
        else jnp.zeros(self.outs[i].shape, self.outs[i].dtype)
        for i in self.diff_out
      ]
      program = self.vjp(wrt)
      args = (*dyn, *given)
      grads = (
        _call_now(program, list(args))
        if not any(isinstance(a, jax.core.Tracer) for a in args)
        else program.apply(*args)
      )
      for j, i in enumerate(wrt):
        out[i] = grads[j]
      return tuple(out)

    f.defvjp(fwd, bwd, symbolic_zeros=True)
    return f

  def vjp(self, wrt: tuple[int, ...]) -> "_Program":
    """The backward with respect to inputs `wrt`, as a program of (inputs..., output
    cotangents...) -> cotangents of the inputs `wrt`."""
    program = self._vjps.get(wrt)
    if program is None:
      n, diff_out = len(self.ins), self.diff_out
      forward, restore = self._host, self.restore  # (_host: seeded like the forward)

      def vjp_fn(inputs: list) -> list:
        primals, cts = inputs[:n], inputs[n:]
        create = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
        leaves = list(primals)
        for i in wrt:
          if not leaves[i].requires_grad:
            leaves[i] = leaves[i].detach().requires_grad_()
        with torch.enable_grad(), restore() if restore else contextlib.nullcontext():
          outs = forward(leaves)
          ys, gs = [], []
          for j, i in enumerate(diff_out):
            y = outs[i]
            if y.requires_grad:
              ys.append(y)
              # JAX's cotangent of a complex value is the conjugate of torch's grad_output;
              # in a 32-bit program it may be narrower than torch's output
              ct = cts[j].conj() if cts[j].is_complex() else cts[j]
              gs.append(ct if ct.dtype == y.dtype else ct.to(y.dtype))
          xs = [leaves[i] for i in wrt]
          grads = (
            torch.autograd.grad(ys, xs, gs, allow_unused=True, create_graph=create)
            if ys
            else [None] * len(xs)
          )
        result = []
        for x, g in zip(xs, grads):
          g = torch.zeros_like(x) if g is None else g
          g = g.conj() if g.is_complex() else g
          result.append(g if g.dtype == x.dtype else g.to(x.dtype))
        return result

      ins = self.ins + [self.outs[i] for i in diff_out]
      outs = [self.ins[i] for i in wrt]
      program = self._vjps[wrt] = _Program(
        vjp_fn,
        ins,
        outs,
        name=f"the backward of {self.name}",
        vmap_method=_BACKWARD_VMAP.get(self.vmap_method, self.vmap_method),
        random=False,
        restore=None,
        keep=self.keep() if self.keep is not None else None,
      )
    return program


# A backward under `vmap` gets its unbatched inputs broadcast in full: cotangents of inputs
# that had a size-1 batch dimension would come back summed over the batch.
_BACKWARD_VMAP: dict[ffi.VmapMethod, ffi.VmapMethod] = {"expand_dims": "broadcast_all"}


# --- call_torch(..., mode="callback") -------------------------------------------------------


def run_eagerly_or_stage(apply: Callable[..., tuple], dyn: Sequence[Any]) -> tuple:
  """`apply(*dyn)`; run now when the values are concrete, so that a torch exception inside is
  raised here as itself (inside a program being built there is nothing to run yet)."""
  concrete = not any(isinstance(d, jax.core.Tracer) for d in dyn)
  try:
    outs = apply(*dyn)
    if concrete:
      jax.block_until_ready(outs)
  except (jax.errors.JaxRuntimeError, ValueError) as e:  # (JAX's error type varies)
    ffi.reraise(e)  # torch's own exception, as torch raised it
    raise
  return outs


def _call_now(program: _Program, dyn: list, api: str = API) -> list:
  """A call on concrete arrays, outside any JAX transformation: no program to build, so the
  host function runs directly on zero-copy tensors of the arrays (exceptions propagate as
  they are); the results are copied into new arrays, as a program's outputs would be."""
  specs = program.ins[1:] if program.random else program.ins
  inputs: list[torch.Tensor | None] = []
  with jax.enable_x64(True):
    for a, spec in zip(dyn, specs):
      if not isinstance(a, jax.Array):  # a Python scalar JAX passed along (a cotangent)
        a = jnp.asarray(a, spec.dtype)
      # (the caller holds `a`: a tensor the function keeps, or its traceback does, must not
      # hold `a` itself, whose `.delete()` would then abort the process)
      inputs.append(transfer.array_to_torch(a, api=API, where=lambda: "an argument"))
  if program.random:
    inputs.insert(0, None)  # (torch's generator draws as it would: nothing to replay)
  results = program.flat_fn(inputs)
  outs = []
  with jax.enable_x64(True):  # torch's dtypes exactly, as in trace mode
    for i, (r, spec) in enumerate(zip(results, program.outs)):
      want = dtypes.JAX_TO_TORCH[np.dtype(spec.dtype)]
      r = ffi.check_result(r, spec.shape, want, i, program.name).detach()
      outs.append(
        transfer.tensor_to_jax(
          r if r.dtype == want else r.to(want),
          copy=True,
          api=api,
          where=lambda: f"output {i} of {program.name}",
        )
      )
  return outs


def _seed() -> Any:
  """A fresh uint32 seed drawn, when the program runs, from torch's default generator."""
  return ffi.emit(
    _SEED_KEY, (), [jax.ShapeDtypeStruct((), np.uint32)], vmap_method="sequential", side_effect=True
  )[0]


_SEED_KEY = ffi.register(
  lambda inputs: [torch.randint(0, 2**31 - 1, (), dtype=torch.int64).to(torch.uint32)],
  "the seed of a random torch function",
)


class _Kept:
  """A pytree node without leaves that holds an object in its structure (see `fwd`)."""

  __slots__ = ("obj",)

  def __init__(self, obj: Any):
    self.obj = obj


jax.tree_util.register_pytree_node(_Kept, lambda k: ((), k.obj), lambda obj, _: _Kept(obj))


def _seeded(flat_fn: Callable[[list], list]) -> Callable[[list], list]:
  """A random program's host function: `flat_fn` with torch's generator of the tensors' device
  (the CPU's; a CUDA GPU's on the `buffers` route) seeded from the program's first input,
  restored after. Not `torch.manual_seed`, which seeds every device: also the `jax` device,
  whose generator a running compiled program that draws holds locked (a deadlock), and the
  GPUs', for good."""

  def host(inputs: list) -> list:
    seed = int(inputs[0].reshape(-1)[0])
    cuda = [inputs[0].device.index or 0] if inputs[0].is_cuda else []
    with torch.random.fork_rng(devices=cuda):
      torch.default_generator.manual_seed(seed)
      for index in cuda:
        torch.cuda.default_generators[index].manual_seed(seed)
      return flat_fn(inputs)

  return host


_programs: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
_programs_strong: dict[int, tuple[Any, dict]] = {}


def _cache_for(fn: Any) -> tuple[dict, Any]:
  """`fn`'s programs, and the object whose life they share: `fn`, or the object of a bound
  method (None for one that cannot be referred to weakly, kept here for good)."""
  owner = getattr(fn, "__self__", None)
  anchor, sub = (owner, getattr(fn, "__func__", fn)) if owner is not None else (fn, None)
  try:
    table = _programs.setdefault(anchor, {})
  except TypeError:  # not weak-referenceable: kept alive here, so its id is never reused
    table = _programs_strong.setdefault(id(anchor), (anchor, {}))[1]
    anchor = None
  return (table.setdefault(sub, {}) if sub is not None else table), anchor


def _weakly(obj: Any, anchor: Any) -> Callable[[], Any]:
  """A getter of `obj` (the user's function or its module) that does not keep it alive,
  where `anchor` shares its life; the programs that can call it keep `anchor` alive."""
  if anchor is None:
    return lambda: obj
  try:
    bound = getattr(obj, "__self__", None) is anchor and hasattr(obj, "__func__")
    ref: Callable[[], Any] = weakref.WeakMethod(obj) if bound else weakref.ref(obj)
  except TypeError:  # (a builtin bound to a module: long-lived anyway)
    return lambda: obj

  def get() -> Any:
    found = ref()
    if found is None:  # (`keep` prevents it)
      raise BridgeError("bridge: callback mode's torch function no longer exists.")
    return found

  return get


@contextlib.contextmanager
def _buffers_kept(module: torch.nn.Module) -> Any:
  """Run a recomputation without letting it update `module`'s buffers a second time."""
  # (all of them: BatchNorm writes its running statistics without bumping their version)
  saved = [(b, b.detach().clone()) for b in module.buffers()]
  try:
    yield
  finally:
    with torch.no_grad():
      for b, value in saved:
        b.copy_(value)


def _to_array(x: Any) -> Any:
  if isinstance(x, np.ndarray):
    with jax.enable_x64(True):  # exact dtypes: a float64 array stays float64
      return jnp.asarray(x)
  return x


def _shapes_key(result_shape_dtypes: Any) -> Any:
  if result_shape_dtypes is None:
    return None
  leaves, spec = tree_lib.flatten(result_shape_dtypes)
  return spec, tuple((tuple(s.shape), np.dtype(s.dtype)) for s in leaves)


def _describe(fn: Any) -> str:
  """How messages name `fn`: `f`, `MyModule.forward`, `mylib::op` (a custom op)."""
  if isinstance(fn, torch.nn.Module):
    return f"`{type(fn).__name__}.forward`"
  label = (
    getattr(fn, "__qualname__", None)
    or getattr(fn, "_qualname", None)
    or getattr(fn, "__name__", None)
    or type(fn).__name__
  )
  return f"`{label}`"


def _where(i: int) -> str:
  return f"argument leaf {i}"


def call(
  fn: Callable[..., Any],
  args: tuple,
  kwargs: dict,
  *,
  vmap_method: ffi.VmapMethod | None = None,
  result_shape_dtypes: Any = None,
  name: str | None = None,
  return_mutated: bool = False,
  api: str = API,
  owner: Any = None,
  unshaped_now: bool = False,
) -> Any:
  """`fn(*args, **kwargs)` run for real by torch, from JAX (see the module docstring).

  With `return_mutated`, returns `(outputs, {leaf index: new value})` for the array
  leaves of `(args, kwargs)` (in `tree.flatten` order) that `fn` wrote to in place.
  `api` is the API the user called, for messages; `owner` the user's torch function or
  module whose outputs these are (None for the bridge's own calls: an op's fallback), for
  the warning about int64 outputs returned as int32 (`narrowing.returned`). With
  `unshaped_now` (an eager op's fallback), a call whose outputs' shapes depend on the data
  runs at once when its arrays are concrete and no program is being built, as torch would
  run it (`_call_unshaped`); inside a program it is still a `TracedValueError`.
  """
  check_mode("callback", vmap_method, result_shape_dtypes, api=api)
  vmap_method = vmap_method or "sequential"
  name = name or _describe(fn)
  if not ffi.supported():
    raise BridgeError(
      f"{_speaker(api)}: JAX's {ffi.platform()} backend cannot call back "
      "into Python from a program. Use the default trace mode, or run on CPU or GPU."
    )
  leaves, spec = tree_lib.flatten((args, kwargs))
  dyn: list[Any] = []
  statics: list[Any] = []
  for leaf in leaves:
    leaf = _to_array(leaf)
    if isinstance(leaf, jax.Array):
      dyn.append(leaf)
      statics.append(_DYN)
    else:
      statics.append(_hashable(leaf))
  narrow = scope.is_staged() and not dtypes.x64_enabled()
  avals = tuple((tuple(np.shape(d)), np.dtype(d.dtype)) for d in dyn)
  # (types too: 1, 1.0 and True are equal and hash alike, but are not the same argument)
  cache_key = (
    spec,
    tuple(statics),
    tuple(type(s) for s in statics),
    avals,
    vmap_method,
    narrow,
    return_mutated,
    _shapes_key(result_shape_dtypes),
  )
  table, anchor = _cache_for(fn)
  entry = table.get(cache_key)
  concrete = not any(isinstance(d, jax.core.Tracer) for d in dyn)
  now = unshaped_now and not scope.is_staged() and concrete
  if entry is _UNSHAPED and now:
    return _call_unshaped(fn, spec, tuple(statics), dyn, return_mutated, api, name)
  if entry is None or entry is _UNSHAPED:
    try:
      entry = _build(
        fn,
        spec,
        tuple(statics),
        avals,
        vmap_method,
        result_shape_dtypes,
        name,
        narrow,
        return_mutated,
        api,
        owner,
        anchor,
        dyn if concrete else None,
      )
    except scope.TracedValueError as e:
      if not (now and isinstance(e.__cause__, _SHAPE_FROM_DATA)):
        raise
      table[cache_key] = _UNSHAPED  # (the next such call skips the fake run)
      return _call_unshaped(fn, spec, tuple(statics), dyn, return_mutated, api, name)
    table[cache_key] = entry
  program, out_spec, out_statics, written = entry
  outs: Sequence[Any]
  if concrete and not (program.random and scope.is_staged()):
    # nothing to stage: torch runs it right here. (Not a random function while a program is
    # built on known inputs, `torch.empty(n).normal_()`: run now, its numbers would be
    # constants of the program, the same on every run.)
    outs = _call_now(program, dyn, api)
  else:
    if program.random:
      dyn.insert(0, _seed())
    outs = run_eagerly_or_stage(program.apply, dyn)
  it = iter(outs)
  result = tree_lib.unflatten(out_spec, tree_lib.merge(out_statics, it))
  if not return_mutated:
    return result
  leaf_of_dyn = [i for i, s in enumerate(statics) if s is _DYN]
  return result, {leaf_of_dyn[i]: v for i, v in zip(written, it)}


# The fake run's exceptions for outputs whose shapes depend on the inputs' values.
_SHAPE_FROM_DATA = (DataDependentOutputException, DynamicOutputShapeException)
# A cache entry: the outputs' shapes depend on the data, so there is no program to keep.
_UNSHAPED = object()


def _call_unshaped(
  fn: Callable[..., Any],
  spec: Any,
  statics: tuple,
  dyn: list,
  return_mutated: bool,
  api: str,
  name: str,
) -> Any:
  """`fn` run now on concrete arrays (`call`'s `unshaped_now`), for outputs whose shapes only
  its run tells: no program is built, so none needs them. Whether `fn` writes to its inputs
  is not known before it runs (its fake run stopped), so it runs on copies of them; a copy
  it writes to (its version counter, or an op's schema, says so) is returned as the input's
  new value with `return_mutated`, as `call` returns it."""
  with jax.enable_x64(True):
    inputs = [
      transfer.array_to_torch_arg(a, api=API, where=lambda: "an argument").clone() for a in dyn
    ]
  versions = [_version(t) for t in inputs]
  recorder = _Recorder()
  args, kwargs = tree_lib.unflatten(spec, tree_lib.merge(statics, iter(inputs), _unbox))
  with recorder:
    out = fn(*args, **kwargs)
  if type(out) is not torch.Tensor and type(out).__module__ == "torch.return_types":
    out = tuple(out)

  def to_jax(t: torch.Tensor, i: int) -> jax.Array:
    with jax.enable_x64(True):  # torch's dtypes exactly, as in trace mode
      return transfer.tensor_to_jax(
        t.detach(), copy=True, api=api, where=lambda: f"output {i} of {name}"
      )

  tree_lib.register_output_types(out)
  leaves, out_spec = tree_lib.flatten(out)
  result = tree_lib.unflatten(
    out_spec, [to_jax(x, i) if isinstance(x, torch.Tensor) else x for i, x in enumerate(leaves)]
  )
  if not return_mutated:
    return result
  leaf_of_dyn = [i for i, s in enumerate(statics) if s is _DYN]
  return result, {
    leaf_of_dyn[i]: to_jax(t, i)
    for i, (t, v) in enumerate(zip(inputs, versions))
    if _version(t) != v or _memory(t) in recorder.written
  }


def _build(
  fn: Callable[..., Any],
  spec: Any,
  statics: tuple,
  avals: tuple,
  vmap_method: ffi.VmapMethod,
  result_shape_dtypes: Any,
  name: str,
  narrow: bool,
  return_mutated: bool,
  api: str,
  owner: Any,
  anchor: Any = None,
  values: Sequence[Any] | None = None,
) -> tuple:
  """The program of `fn` for one argument structure; with `anchor` (`_cache_for`), it refers
  to `fn` and its module weakly. `values`: the arguments' arrays, where they are concrete
  (for torch's own exception if the fake run fails: `_fake_run`)."""
  in_torch = [
    (shape, dtypes.torch_dtype(dt, api=api, where=_where(i))) for i, (shape, dt) in enumerate(avals)
  ]
  module = state_lib.module_of(fn)
  # until the fake run says otherwise:
  state: dict[str, Any] = {"mutated": (False,) * len(avals), "random": False, "writes_state": False}

  # the common case, `fn(x, y)` with arrays only, skips the rebuilding of the arguments' tree
  positional = (
    not spec.nodes
    and all(s is _DYN for s in statics)
    and spec.treedef == tree_lib.flatten((tuple(range(len(statics))), {}))[1].treedef
  )

  def make_run(
    mutated: tuple[bool, ...], random: bool, get_fn: Callable[[], Any]
  ) -> Callable[[list], tuple[Any, list]]:
    """`fn` (as `get_fn` gives it) on a list of input tensors -> (its output, the inputs it
    saw)."""
    copies = any(mutated)

    def run(inputs: list) -> tuple[Any, list]:
      if random:
        inputs = inputs[1:]
      if copies:  # written in place: on copies, so the caller's arrays stay as they are
        inputs = [t.clone() if m else t for t, m in zip(inputs, mutated)]
      if positional:
        out = get_fn()(*inputs)
      else:
        it = iter(inputs)
        args, kwargs = tree_lib.unflatten(spec, tree_lib.merge(statics, it, _unbox))
        out = get_fn()(*args, **kwargs)
      if type(out) is not torch.Tensor and type(out).__module__ == "torch.return_types":
        out = tuple(out)
      return out, inputs

    return run

  if result_shape_dtypes is None:
    fake_run = make_run(state["mutated"], False, lambda: fn)
    fake = _fake_run(lambda inputs: fake_run(inputs)[0], in_torch, name, module, api, values)
    state["mutated"], state["random"] = fake.mutated, fake.random
    state["writes_state"] = fake.writes_state
    tree_lib.register_output_types(fake.out)  # (a `ModelOutput`, a cache: JAX nodes)
    out_leaves, out_spec = tree_lib.flatten(fake.out)
    outs = []
    out_statics = []
    narrowed: list[tuple[int, tuple, torch.dtype]] = []
    for i, leaf in enumerate(out_leaves):
      if isinstance(leaf, torch.Tensor):
        dt = leaf.dtype
        if narrow and dt in dtypes.NARROWED:  # the edge of a 32-bit program
          if dt.is_floating_point or dt.is_complex:
            raise NarrowingError(
              f"{_speaker(api)}: output leaf {i} of {name} is "
              f"{str(dt).removeprefix('torch.')}, but "
              "the JAX program it is called from is built with JAX's 64-bit types disabled "
              "and cannot hold it; rounding it to 32 bits would change it. Return a 32-bit "
              "tensor from the torch code (`.float()`), or enable 64-bit types "
              "(`jax.config.update('jax_enable_x64', True)`)."
            )
          # int64 leaves as int32, checked to fit when it runs (`ffi.check_result`)
          narrowed.append((i, tuple(leaf.shape), dt))
          dt = dtypes.NARROWED[dt]
        outs.append(
          jax.ShapeDtypeStruct(
            tuple(leaf.shape), dtypes.jax_dtype(dt, api=api, where=f"output leaf {i} of {name}")
          )
        )
        out_statics.append(_DYN)
      else:
        out_statics.append(leaf)
    if narrowed and owner is not None:
      narrowing.returned(owner, fake.out, narrowed, api)
  else:
    state["mutated"] = (True,) * len(avals)  # unknown: the caller's arrays are kept safe
    out_leaves, out_spec = tree_lib.flatten(result_shape_dtypes)
    outs = [jax.ShapeDtypeStruct(tuple(s.shape), np.dtype(s.dtype)) for s in out_leaves]
    out_statics = [_DYN] * len(outs)
  tensor_positions = [i for i, s in enumerate(out_statics) if s is _DYN]
  written = [i for i, m in enumerate(state["mutated"]) if m] if return_mutated else []
  outs += [jax.ShapeDtypeStruct(*avals[i]) for i in written]
  single = len(tensor_positions) == 1 and not written
  run = make_run(state["mutated"], state["random"], _weakly(fn, anchor))

  def flat_fn(inputs: list) -> list:
    out, after = run(inputs)
    if single and isinstance(out, torch.Tensor):
      return [out]
    leaves, _ = tree_lib.flatten(out)
    if len(leaves) != len(out_statics):
      raise BridgeError(
        f"{name} returned {len(leaves)} output leaves, but {len(out_statics)} were expected "
        "(from its fake run or `result_shape_dtypes`)."
      )
    return [leaves[i] for i in tensor_positions] + [after[i] for i in written]

  ins = [jax.ShapeDtypeStruct(shape, dt) for shape, dt in avals]
  if state["random"]:
    ins.insert(0, jax.ShapeDtypeStruct((), np.dtype(np.uint32)))
  restore = None
  if module is not None:
    get_module = _weakly(module, anchor)
    restore = lambda: _buffers_kept(get_module())
  program = _Program(
    flat_fn,
    ins,
    outs,
    name=name,
    vmap_method=vmap_method,
    random=state["random"],
    restore=restore,
    # (one that returns nothing runs for what it does: an assertion, a print; never dropped)
    side_effect=state["writes_state"] or not outs,
    keep=anchor,
  )
  return program, out_spec, out_statics, written
