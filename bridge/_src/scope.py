"""The trace scope: what changes while torch code runs as part of a JAX program.

`bridge.call_torch`, `extract_jax` functions and `bridge.compile` run torch code
on `bridge.Tensor`s that hold JAX tracers. For the length of that call:

* CPU tensors the code meets (factory calls without a device, constants kept on
  a module) join the program as constants instead of raising a device mismatch
  (noted for `bridge.compile`'s guard: `collecting_constants`);
* torch's autograd engine runs backward passes on the calling thread, where the
  JAX trace lives (its device threads would not see the trace);
* reading a traced value in Python (`.item()`, `if t:`) raises `TracedValueError`
  naming the torch line that did it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import linecache
import os
import sys
import threading
import types
import warnings
import weakref
from typing import Any, Callable, Iterator

import torch
from jax._src import core as _jax_core

import _bridge_autoload

from bridge._src import compat
from bridge._src import dtypes
from bridge._src.errors import LeakedTracerError, TracedValueError


class _Scope:
  """What the current trace scope is: for which API, and how values are staged."""

  __slots__ = ("api", "narrow", "staged", "grad", "bounds")

  def __init__(self, api: str, narrow: bool, staged: bool, grad: bool = False):
    self.api, self.narrow, self.staged = api, narrow, staged
    # in a 32-bit program: id(int32 array holding an int64 tensor) -> (array, bound on its
    # absolute values), what `narrowing` proves exactness with
    self.bounds: dict | None = {} if narrow else None
    pending = getattr(_pending, "bounds", None)
    if pending:  # recorded for this call's inputs before its scope began (`narrowing.track`)
      if self.bounds is not None:
        self.bounds.update(pending)
      _pending.bounds = None
    # torch's grad mode when the scope was entered: a `torch.no_grad()` block inside the
    # traced code (grad mode off while this is True) makes its results constants for JAX's
    # derivatives, as for torch's
    self.grad = grad


_pending = threading.local()  # .bounds: a `_Scope.bounds` table for the next scope, or None
_NONE = _Scope("", False, False)
_ACTIVE: contextvars.ContextVar[_Scope] = contextvars.ContextVar(
  "bridge_trace_scope", default=_NONE
)


_constants = threading.local()  # .into: the list `collecting_constants` fills, or None


@contextlib.contextmanager
def collecting_constants() -> Iterator[list]:
  """A list of weak references to the CPU tensors that join the program traced in the block
  as constants (one per use): `bridge.compile` traces again when one of them changes in place
  (as torch.compile, which reads them on every call)."""
  outer = getattr(_constants, "into", None)
  found: list[weakref.ref] = []
  _constants.into = found
  try:
    yield found
  finally:
    _constants.into = outer


def note_constant(t: torch.Tensor) -> None:
  """Note the CPU tensor `t` joining the program as a constant (see `collecting_constants`);
  counted per thread (`_drew_while_traced` asks whether any did)."""
  _constants.count = getattr(_constants, "count", 0) + 1
  into = getattr(_constants, "into", None)
  if into is not None:
    into.append(weakref.ref(t))
    if t._base is not None:  # a view made as the trace ran (`w.t()`, `F.linear`'s): it is
      into.append(weakref.ref(t._base))  # gone after it, but a change to its base shows


def no_grad_inside() -> bool:
  """Whether torch code being traced runs inside its own `torch.no_grad()` or
  `torch.inference_mode()` block.

  A `no_grad()` block turns off torch's grad mode only; the forward of a custom
  `torch.autograd.Function` turns off forward-mode AD too, and is not taken for `no_grad()`
  (a Function's derivative is its backward: `functions`). `inference_mode()` turns off both
  as well, and is told apart by its own flag.
  """
  return (
    _ACTIVE.get().grad
    and not torch.is_grad_enabled()
    and (torch._C._is_fwd_grad_enabled() or torch.is_inference_mode_enabled())
  )


def active() -> str | None:
  """The API whose trace scope is current (e.g. `'bridge.call_torch'`), or None."""
  return _ACTIVE.get().api or None


def narrow() -> bool:
  """Whether torch code is being staged into a JAX program built with 64-bit types off.

  Such a program is lowered with JAX's 64-bit types disabled, so it cannot hold
  int64/float64 values: torch's int64 tensors are held as int32 arrays, each op proven
  exact (every value fits) or refused (`narrowing`); float64 values are refused. Everywhere
  else the bridge keeps 64-bit types exact.
  """
  return _ACTIVE.get().narrow


def staged() -> bool:
  """Whether the current trace scope stages torch code into a JAX program (so each op can run
  straight into it: jitting ops one by one would only add nested programs to compile)."""
  return _ACTIVE.get().staged


def is_staged() -> bool:
  """Whether JAX is staging a program here (`jax.jit`, `scan`...), so values become tracers
  whose concrete values are unknown."""
  trace = _jax_core.unsafe_get_current_trace()
  while trace is not None:
    if isinstance(trace, _jax_core.EvalTrace):
      return False
    if type(trace).__name__ == "DynamicJaxprTrace":
      return True
    trace = getattr(trace, "parent_trace", None)
  return False


def warn(message: str) -> None:
  """`warnings.warn(message)` (a `UserWarning`) from the user's innermost frame (as
  `user_line` finds it), so that its location and filters by module are the user's code."""
  level = 2  # (the caller of this function)
  f: types.FrameType | None = sys._getframe(1)
  while f is not None and _internal(f.f_code.co_filename):
    level += 1
    f = f.f_back
  warnings.warn(message, UserWarning, stacklevel=level if f is not None else 2)


# (enter, exit) pairs run as each trace scope opens and closes, registered by the layers above
# (`functions`: torch's autograd.Function routed through `jax.custom_vjp`)
_TRACE_HOOKS: list[tuple[Callable[[], None], Callable[[], None]]] = []


def on_trace(enter: Callable[[], None], leave: Callable[[], None]) -> None:
  """Run `enter()` as each trace scope opens and `leave()` as it closes."""
  _TRACE_HOOKS.append((enter, leave))


class trace_scope:
  """Enter the trace scope for `api` (see the module docstring)."""

  def __init__(self, api: str):
    self.api = api
    self._token: Any = None
    self._threads: Any = None
    self._marks: list[tuple[int, Any]] | None = None
    self._constants = 0

  def __enter__(self) -> None:
    compat.tell_libraries()
    for enter, _ in _TRACE_HOOKS:  # (custom autograd.Functions keep their backward: `functions`)
      enter()
    staged = is_staged()
    # torch's own generators, read as the outermost staged scope opens (`_drew_while_traced`)
    self._marks = _generator_marks() if staged and not _ACTIVE.get().staged else None
    self._constants = getattr(_constants, "count", 0)
    self._token = _ACTIVE.set(
      _Scope(self.api, staged and not dtypes.x64_enabled(), staged, torch.is_grad_enabled())
    )
    # (torch's context manager switches the mode when it is constructed)
    self._threads = torch.autograd.set_multithreading_enabled(False)
    self._threads.__enter__()

  def __exit__(self, *exc: Any) -> None:
    self._threads.__exit__(*exc)
    _ACTIVE.reset(self._token)
    for _, leave in reversed(_TRACE_HOOKS):
      leave()
    if (
      self._marks is not None
      and exc[0] is None
      and getattr(_constants, "count", 0) != self._constants
      and _moved(self._marks, _generator_marks())
    ):
      _drew_while_traced(self.api)


def _generator_marks() -> list[tuple[int, Any]]:
  """Where torch's default generators stand, as (seed, position): the CPU's (its state), and
  each initialized CUDA device's (its offset)."""
  cpu = torch.default_generator
  marks: list[tuple[int, Any]] = [(cpu.initial_seed(), bytes(cpu.get_state().numpy()))]
  if torch.cuda.is_initialized():
    marks += [(g.initial_seed(), g.get_offset()) for g in torch.cuda.default_generators]
  return marks


def _moved(before: list, after: list) -> bool:
  """Whether a generator drew between the two marks: same seed, another position (one whose
  seed changed was reseeded in the trace, `torch.manual_seed`: not counted)."""
  return any(b[0] == a[0] and b[1] != a[1] for b, a in zip(before, after))


def _drew_while_traced(api: str) -> None:
  """Torch code staged into a program drew from torch's own generator (`torch.rand(n)` makes a
  CPU tensor) and CPU tensors joined the program as constants: those numbers were drawn once,
  as the program was traced, and are constants of it. Said, not refused: a lazy module
  drawing its initial parameters does the same. (The generators are global: another thread
  drawing meanwhile, while this trace took a CPU constant, is said too.)"""
  warn(
    f"`{api}`: the traced torch code drew random numbers from torch's own generator (a "
    "random tensor made without a device, e.g. `torch.rand(n)`, is a CPU tensor) while it "
    "was traced: they are constants of the program, the same numbers on every call. Make "
    "them on the traced tensors' device (`torch.rand(n, device=x.device)`, "
    "`torch.rand_like(x)`) to draw anew on every call."
  )


@functools.cache
def _internal_dirs() -> tuple[str, ...]:
  """Where torch, JAX and the bridge live (and the stdlib modules their frames pass through)."""
  import jax  # (imported by then; kept out of this module's import-time work)

  mods = [torch, jax]
  try:
    import bridge_ops  # the lowerings' own frames are not the user's line either

    mods.append(bridge_ops)
  except ImportError:  # pragma: no cover
    pass
  dirs = [os.path.dirname(f) + os.sep for f in (getattr(m, "__file__", None) for m in mods) if f]
  dirs += [p + os.sep for m in mods for p in getattr(m, "__path__", [])]
  dirs.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)  # bridge/
  stdlib = os.path.dirname(os.__file__) + os.sep
  dirs += [stdlib + "contextlib.py", stdlib + "functools.py"]
  # (the device's kernels below torch's Python key: `torch.tensor([t])` reads `t` there)
  dirs.append(os.path.abspath(_bridge_autoload.__file__))
  return tuple(dirs)


def _internal(filename: str) -> bool:
  """Whether a frame of `filename` is torch's, JAX's, the bridge's or Python's own machinery,
  not the user's code (`user_line`, `warn`)."""
  return filename.startswith((*_internal_dirs(), "<frozen"))


def user_line(tb: Any = None) -> str:
  """`File "...", line N, in f: <code>` for the innermost frame of user code.

  Frames inside torch, JAX and the bridge are skipped. With `tb` (a traceback) the
  search runs over it; otherwise over the current stack.
  """
  frames = []
  if tb is not None:
    while tb is not None:
      frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_code.co_name))
      tb = tb.tb_next
  else:
    f: types.FrameType | None = sys._getframe(1)
    while f is not None:
      frames.insert(0, (f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
      f = f.f_back
  torch_dir = os.path.dirname(torch.__file__) + os.sep
  inside = None  # the innermost frame of torch's own Python code (a module's forward)
  for filename, lineno, name in reversed(frames):
    if _internal(filename):
      if inside is None and filename.startswith(torch_dir):
        inside = (filename, lineno, name)
      continue
    found = _frame_text(filename, lineno, name)
    if inside is not None:  # (the user called torch code that needs the value: name it too)
      found += f"\n  in torch's code at {_frame_text(*inside)}"
    return found
  return "(no user frame found)"


def _frame_text(filename: str, lineno: int, name: str) -> str:
  code = linecache.getline(filename, lineno).strip()
  return f'File "{filename}", line {lineno}, in {name}' + (f":\n    {code}" if code else "")


def traced_value_error(what: str, tb: Any = None) -> TracedValueError:
  """The error for torch code that needs a traced tensor's value in Python."""
  api = active() or "jax.jit"
  return TracedValueError(
    f"`{api}`: torch code needs the value of a tensor that JAX is tracing ({what}), at\n"
    f"  {user_line(tb)}\n"
    "Inside `jax.jit` (and `lax.scan`, `jax.vmap`, `bridge.compile`) a tensor's value is "
    "not known while the program is built, so Python cannot branch on it. Keep the "
    "computation in tensors (`torch.where(cond, a, b)` instead of `if`, masks instead of "
    "`.item()`), or make the value a static argument (`jax.jit(..., static_argnums=...)`, "
    "a Python number passed to `bridge.compile`), or call the function outside `jax.jit`. "
    "Or let torch run it for real inside the program: `bridge.call_torch(fn, ..., "
    "mode='callback', result_shape_dtypes=...)` (its outputs' shapes must not depend "
    "on the values; see recipes/torch_code_in_jax_callback_mode.ipynb)."
  )


def leaked_tracer_error(cause: BaseException) -> LeakedTracerError:
  """The error for a tensor that outlived the trace it was made in."""
  return LeakedTracerError(
    "bridge: a `jax` tensor made while JAX traced an earlier call (`bridge.call_torch`, an "
    "`extract_jax` function, `bridge.compile`, `jax.jit`) was kept and used after that "
    f"call ended, at\n  {user_line()}\n"
    "Its value only existed inside that program. Do not store tensors computed in "
    "`forward` on the module or in globals; return them as outputs (or register them as "
    f"buffers, which are threaded through). JAX said: {str(cause).splitlines()[0]}"
  )
