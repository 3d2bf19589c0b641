"""One op for one argument structure and static values, jitted: the eager call with its
value-check flag, the staged call that jit's cache replays, and random keys.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import config as _jax_config

from bridge._src import config as config_lib
from bridge._src import rng, scope
from bridge._src import tree as tree_lib
from bridge._src.dispatch.checks import check_state, concrete
from bridge._src.dispatch.meta import (
  conform,
  kernel_refusal,
  meta_outputs,
  rare_dtype_arguments,
  rare_dtypes,
  torch_error,
  weak,
)
from bridge._src.dispatch.resolve import decomposing
from bridge._src.errors import BridgeError
from bridge._src.transfer import ArrayImpl

_config_var = config_lib._CURRENT
_disable_jit = _jax_config.disable_jit  # a thread-local state, like `_x64_state`


class Executable:
  """One op with one argument structure and static values, jitted.

  A lowering marked `random` gets a fresh key as keyword `key`. A decomposition is
  torch code that may draw random numbers itself, so it takes a key too and makes it
  current while it runs; once its first trace shows it draws none, it is given a
  fixed placeholder key instead of a fresh one (no split per call).
  """

  def __init__(self, func: Any, fn: Callable, lowering: Any, treedef: Any, statics: tuple):
    self.func, self.fn, self.treedef, self.statics = func, fn, treedef, statics
    self.decomposed = lowering is None
    # the settings that chose a decomposition or the fallback for an op with no lowering
    # (`FunctionalPlan.__call__` takes another executable where they differ); None for a
    # lowering, which no setting changes
    self.policy: tuple | None = None
    self.random = lowering is not None and lowering.random
    self.keyed = self.random or self.decomposed  # the last dynamic argument is a key
    self.draws: bool | None = None if self.decomposed else self.random
    # A plugin's lowering traced with jit off: jnp's own jitted helpers (every `x * y` on a
    # tracer is one) then trace inline rather than as nested programs, about a quarter of a
    # model's trace (see `registry.Lowering.jit_free`).
    self.jit_free = lowering is not None and lowering.jit_free
    self.dynamic_shape = lowering.dynamic_shape if lowering is not None else False
    # torch's CPU kernel is asked whether it takes the arguments' dtypes where one is rare
    # (`kernel_refusal`); the signatures (shapes, dtypes) it took, for the calls that trace
    # the op again each time (no jit: a value-dependent shape, `jax.grad` without jit)
    self.rare_statics = rare_dtype_arguments(statics)
    self.kernel_takes: set = set()
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
      self.staged_checked = (
        self.run if self.dynamic_shape else jax.jit(self.run_checking_indices, inline=True)
      )
      return self.staged_checked
    if name == "call":
      # eager: (results, flag of the value checks or None), see `checked`
      checked = jax.jit(self.checked)
      self.call: Callable[..., tuple[Any, Any]]
      if not self.dynamic_shape:
        self.call = checked
      elif self.dynamic_shape == "bool_inputs":  # value-dependent shapes only with masks
        self.call = lambda *dyn: (
          (self.run(*dyn), None)
          if any(  # (torch also reads uint8
            getattr(d, "dtype", None) in (np.bool_, np.uint8) for d in dyn
          )  # index tensors
          else checked(*dyn)
        )  # as masks)
      else:
        self.call = lambda *dyn: (self.run(*dyn), None)  # (concrete: checked as it runs)
      return self.call
    raise AttributeError(name)

  def checked(self, *dyn: Any) -> tuple[Any, Any]:
    """`run`, and one bool: whether a value check the lowering declared fails (None if it
    declares none). Traced by the eager `call`."""
    prev = getattr(check_state, "found", None)
    found = check_state.found = []
    try:
      out = self.run(*dyn)
    finally:
      check_state.found = prev
    return out, (functools.reduce(jnp.logical_or, found) if found else None)

  def run_checking_indices(self, *dyn: Any) -> Any:
    return self.run(*dyn)

  def check(self, flag: Any, dyn: list) -> None:
    """After an eager call: raise torch's error where the program's check flag is set."""
    if type(flag) is ArrayImpl:
      if np.asarray(flag):  # (several times quicker than `bool(flag)`)
        self.raise_failed_check(dyn)
      return
    known = concrete(flag)
    if known is not None:
      if known:
        self.raise_failed_check(dyn)
      return
    # run inside another trace: a decomposition being traced (its flag joins the outer op's),
    # or `jax.vmap` without `jax.jit`
    found = getattr(check_state, "found", None)
    if found is not None:
      found.append(flag)
    elif _config_var.get().check_indices:
      self.run(*dyn)  # (stages the value checks, which run at once here)

  def raise_failed_check(self, dyn: list) -> None:
    """Run the op again on the same arrays, op by op: the failing rule raises torch's error."""
    prev = getattr(check_state, "found", None)
    check_state.found = None
    try:
      self.run(*dyn)
    finally:
      check_state.found = prev
    raise BridgeError(
      f"bridge: a value check of {self.func} failed in its program but not when the op ran "
      "again on the same inputs. This is a bug in its lowering; please report it."
    )

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
    # torch's checks before computing: its meta kernel's (raises torch's error where it
    # refuses the arguments), then its CPU kernel's where a dtype is rare
    expected = meta_outputs(self.func, args, kwargs)
    if (self.rare_statics or rare_dtypes(dyn)) and not decomposing():
      self.check_kernel(dyn, args, kwargs, expected)
    jit_off = self.jit_free and any(isinstance(d, jax.core.Tracer) for d in dyn)
    prev = _disable_jit.swap_local(True) if jit_off else None
    op, check_state.op = getattr(check_state, "op", None), self.func  # (named by staged checks)
    try:
      if self.random:
        out = self.fn(*args, **dict(kwargs, key=rng.typed(key)))
      elif key is not None:
        with rng.rng_key(key) as box:
          out = self.fn(*args, **kwargs)
        self.draws = box.used
      else:
        out = self.fn(*args, **kwargs)
    except (TypeError, ValueError, IndexError):
      # JAX's complaint about a shape or dtype (`dot_general requires contracting
      # dimensions...`): where torch refuses the same arguments, its own exception instead
      # (torch turns a TypeError from `a + b` into "unsupported operand type(s)")
      error = torch_error(self.func, args, kwargs)
      if error is None:
        raise
      raise error from None
    finally:
      check_state.op = op
      if jit_off:
        _disable_jit.set_local(prev)
    return conform(self.func, out, expected)

  def check_kernel(self, dyn: tuple, args: Any, kwargs: dict, expected: Any) -> None:
    """Raise torch's error where its CPU kernel lacks the arguments' dtypes (`softmax` of
    integers: `NotImplementedError: "softmax_lastdim_kernel_impl" not implemented for
    'Long'`), asked once per signature (`meta.kernel_refusal`). Not asked for the ops of a
    decomposition (torch checks the op called), nor in a 32-bit program of an int32 array,
    which may stand for an int64 tensor (`narrowing`)."""
    signature: tuple | None = tuple(
      (np.shape(d), d.dtype, weak(d)) if hasattr(d, "dtype") else type(d) for d in dyn
    )
    try:
      if signature in self.kernel_takes:
        return
    except TypeError:  # (a symbolic shape)
      signature = None
    if scope._ACTIVE.get().narrow and any(getattr(d, "dtype", None) == np.int32 for d in dyn):
      return
    error = kernel_refusal(self.func, args, kwargs, expected)
    if error is not None:
      raise error from None
    if signature is not None:
      if len(self.kernel_takes) > 256:
        self.kernel_takes.clear()
      self.kernel_takes.add(signature)


NO_KEY = np.zeros(2, np.uint32)  # the placeholder key of a decomposition that draws none


_STAGED_TRACER = jax._src.interpreters.partial_eval.DynamicJaxprTracer


TRACED_SCALARS = (int, float, complex)  # Python numbers that ops take as traced values


def replayable(dyn: list) -> bool:
  """Arguments that jit's cache can replay an op for: values of a program being staged out
  (jax.jit, bridge.compile) and Python scalars. Under other transformations (jax.grad
  without jit) and with concrete arrays (CPU constants), the op runs as it is."""
  for d in dyn:
    t = type(d)
    if t is not _STAGED_TRACER and t not in TRACED_SCALARS:
      return False
  return True
