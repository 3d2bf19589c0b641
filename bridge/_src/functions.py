"""Custom `torch.autograd.Function`s in traced torch code, differentiated with their `backward`.

torch autograd differentiates a custom Function with its own `backward`, whatever its
forward computes: a straight-through estimator (forward `round`, backward the identity), a
gradient reversal layer (backward `-g`), an analytic or memory-saving derivative. Traced
torch code (`call_torch`, `extract_jax` functions, `bridge.compile`) runs the Function's
forward op by op as JAX code; left at that, JAX would differentiate those ops instead.

While torch code is being traced (`scope.trace_scope`), `Function.apply` is routed here. A
Function applied to traced tensors becomes a `jax.custom_vjp` whose forward runs the
Function's `forward` (and `setup_context`) and whose backward runs its `backward` on the
cotangents, both traced torch code on `bridge.Tensor`s. So `jax.grad`, `jax.vjp`,
`jax.vmap` of them, and `bridge.compile`'s backward use the Function's own rule; like torch
without a `jvp` method, forward-mode derivatives (`jax.jvp`, `jax.jacfwd`) then fail.

The forward is a trace of its own (JAX traces a `custom_vjp`'s function apart), so the
current `rng_key` block's key is threaded through it, as through torch's higher-order ops: one
more input, split by the forward's random ops (`dropout`), and one more output, the key after
them, current again outside. The backward draws nothing from it (torch's backward uses what
the forward saved); random ops a `backward` calls itself draw, as torch's do from its
generator, from the key current where the backward runs.

Left to torch's own `apply`: Functions defined in torch and in the bridge (their backward is
their forward's derivative), calls on untraced tensors, calls that torch autograd records
itself (an input that requires grad under grad mode, inside code that runs
`torch.autograd.grad`), tensors nested in containers, forwards that read traced tensors they
were not given as arguments (JAX cannot differentiate a custom rule with respect to those),
and forwards that modify an input in place (with a warning): JAX then differentiates the
forward as traced.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.utils._pytree as torch_pytree
from torch.autograd import function as _function

from bridge._src import rng
from bridge._src import scope
from bridge._src.arrays import array_to_tensor
from bridge._src import tensor as tensor_lib
from bridge._src import transfer
from bridge._src.errors import BridgeError, BridgeTypeError

_Function = _function.Function
_ORIGINAL = _Function.__dict__["apply"]  # the classmethod torch defines
_original_apply = _ORIGINAL.__func__
_lock = threading.Lock()
_users = [0]  # trace scopes open (all threads): the routing is installed while any is


def install() -> None:
  """Route `Function.apply` through `_apply` (called as a trace scope opens)."""
  with _lock:
    _users[0] += 1
    if _users[0] == 1:
      _Function.apply = classmethod(_apply)  # type: ignore[method-assign,assignment]


def uninstall() -> None:
  """Give `Function.apply` back to torch once the last trace scope has closed."""
  with _lock:
    _users[0] -= 1
    if _users[0] == 0:
      _Function.apply = _ORIGINAL  # type: ignore[method-assign]


class _InPlace(Exception):
  """The forward modified an input in place (its inputs here are the custom_vjp's own)."""


class _Ctx:
  """The `ctx` a traced Function's `forward`/`setup_context` and `backward` see."""

  def __init__(self, needs_input_grad: tuple[bool, ...]):
    self.needs_input_grad = needs_input_grad
    self.materialize_grads = True
    self.to_save: tuple = ()
    self.dirty_tensors: tuple = ()
    self.non_differentiable: tuple = ()

  def save_for_backward(self, *tensors: Any) -> None:
    self.to_save = tensors

  def save_for_forward(self, *tensors: Any) -> None:
    self.saved_for_forward = tensors

  @property
  def saved_tensors(self) -> tuple:
    return tuple(self.to_save)

  def mark_dirty(self, *tensors: Any) -> None:
    self.dirty_tensors = tensors

  def mark_non_differentiable(self, *tensors: Any) -> None:
    self.non_differentiable = tuple(self.non_differentiable) + tensors

  def set_materialize_grads(self, value: bool) -> None:
    self.materialize_grads = bool(value)


def _user_backward(cls: Any) -> Callable[..., Any] | None:
  """The Function's `backward` (or `vjp`), as torch picks it; None if it has neither."""
  backward, vjp = cls.backward, cls.vjp
  if vjp is not _Function.vjp:
    return vjp
  if backward is not _Function.backward:
    return backward
  return None


def _is_traced(t: tensor_lib.Tensor) -> bool:
  return isinstance(t._storage.array, jax.core.Tracer)


def _apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
  api = scope.active()
  if (
    api is None
    or cls.__module__.split(".")[0] in ("torch", "bridge")
    or _user_backward(cls) is None
  ):
    return _original_apply(cls, *args, **kwargs)
  setup = _function._is_setup_context_defined(cls.setup_context)
  if setup and kwargs:  # as torch does: bind keyword and default arguments to positions
    bound = inspect.signature(cls.forward).bind(*args, **kwargs)
    bound.apply_defaults()
    args, kwargs = bound.args, bound.kwargs
  positions = [i for i, a in enumerate(args) if type(a) is tensor_lib.Tensor]
  grad_on = torch.is_grad_enabled()
  if (
    kwargs
    or not any(_is_traced(args[i]) for i in positions)
    or (grad_on and any(args[i].requires_grad for i in positions))
    or any(_nested_tensor(a) for a in args)
  ):
    return _original_apply(cls, *args, **kwargs)
  try:
    return _traced_apply(cls, api, setup, args, positions)
  except (scope.LeakedTracerError, jax.errors.UnexpectedTracerError):
    # the forward reads a traced tensor it was not given (`self.weight` of a module passed
    # in): JAX differentiates the traced forward instead
    return _original_apply(cls, *args)
  except _InPlace:
    warnings.warn(
      f"bridge: the custom autograd.Function {cls.__name__} modifies an input in place, at\n"
      f"  {scope.user_line()}\nTraced, its in-place forward is differentiated as JAX code, "
      "not with its `backward` (right when that is the forward's derivative). For its own "
      "backward, return a new tensor instead or run this code with `mode='callback'`.",
      stacklevel=2,
    )
    return _original_apply(cls, *args)


def _nested_tensor(a: Any) -> bool:
  if isinstance(a, (tuple, list, dict)):
    return any(isinstance(leaf, torch.Tensor) for leaf in torch_pytree.tree_leaves(a))
  return False


class _Key:
  """The current `rng_key` block's key, threaded through the `custom_vjp`: one more input, and
  one more output (the key after the forward's random ops split it).

  Not threaded where no block is open, or where the block's key cannot serve the frame the
  Function is applied in (a body JAX reuses, `jax.vmap` with one key): the forward's random
  ops then raise, saying why, as any random op there does.
  """

  def __init__(self) -> None:
    box = rng.current_box()
    self.box = box if box is not None and _serves_here(box) else None
    self.start: Any = None if self.box is None else self.box.key
    self.drew = False  # whether the forward split the key (then its successor is current)

  def arrays(self) -> list:
    return [] if self.box is None else [self.start]

  def cotangents(self) -> list:
    """The key input's (zero) cotangent, for the backward."""
    return [] if self.box is None else [np.zeros(np.shape(self.start), jax.dtypes.float0)]

  def run(self, forward: Callable[[tuple], tuple], arrays: tuple) -> tuple:
    """`forward` of the inputs (`arrays` less the key), in a block of the key input (JAX may
    trace the forward again later, differentiating a jitted function, when the caller's
    block has closed); its outputs and the key its random ops leave."""
    if self.box is None:
      return forward(arrays)
    with rng.rng_key(arrays[-1]) as box:
      outs, ctx = forward(arrays[:-1])
    self.drew = box.used
    return (*outs, box.key), ctx

  def done(self, outs: tuple) -> tuple:
    """The Function's outputs less the key, which is now current (if the forward drew)."""
    if self.box is None:
      return outs
    if self.drew:
      self.box.key, self.box.used = outs[-1], True
    return outs[:-1]


def _serves_here(box: rng.KeyBox) -> bool:
  """Whether random ops may draw from `box`'s key where the Function is applied."""
  try:
    box.check()
  except BridgeError:
    return False
  return True


def _scope(api: str) -> Any:
  """The trace scope for a trace of the forward that JAX makes after the call's scope has
  closed (differentiating a jitted function traced before); nothing more inside it."""
  return scope.trace_scope(api) if scope.active() is None else contextlib.nullcontext()


class _FwdGradOff:
  """torch runs a Function's forward with forward-mode AD off too (`scope.no_grad_inside`)."""

  def __enter__(self) -> None:
    self.prev = torch._C._is_fwd_grad_enabled()
    torch._C._set_fwd_grad_enabled(False)

  def __exit__(self, *exc: Any) -> None:
    torch._C._set_fwd_grad_enabled(self.prev)


def _traced_apply(cls: Any, api: str, setup: bool, args: tuple, positions: list[int]) -> Any:

  name = cls.__name__
  inputs = [tensor_lib.value(args[i]) for i in positions]
  avals = [(a.shape, a.dtype) for a in inputs]
  needs_input_grad = tuple(
    type(a) is tensor_lib.Tensor and (a.is_floating_point() or a.is_complex()) for a in args
  )
  structure: dict[str, Any] = {}  # what the forward's trace found out (Python values)
  key = _Key()

  def forward(arrays: tuple) -> tuple[tuple, _Ctx]:
    full = list(args)
    given = []
    for i, a in zip(positions, arrays):
      full[i] = array_to_tensor(a, lambda: f"an input of {name}", api)
      given.append(full[i])
    versions = [t._storage.version for t in given]
    ctx = _Ctx(needs_input_grad)
    with torch.no_grad(), _FwdGradOff():
      if setup:
        out = cls.forward(*full)
        cls.setup_context(ctx, tuple(full), out)
      else:
        out = cls.forward(ctx, *full)
    if ctx.dirty_tensors or any(t._storage.version != v for t, v in zip(given, versions)):
      raise _InPlace  # the change would not reach the caller's tensor
    single = isinstance(out, torch.Tensor)
    outs = (out,) if single else tuple(out)
    arrays_out: list[Any] = []
    statics: list[Any] = []
    meta: list[Any] = []
    frozen: list[Any] = []
    for o in outs:
      if type(o) is tensor_lib.Tensor:
        v = tensor_lib.value(o)
        arrays_out.append(v)
        statics.append(None)
        meta.append((v.shape, v.dtype))
        frozen.append(any(o is n for n in ctx.non_differentiable))
      else:  # a CPU tensor (a constant) or a Python value: returned as it is
        statics.append((o,))
    structure.update(
      single=single, statics=statics, meta=meta, frozen=frozen, materialize=ctx.materialize_grads
    )
    return tuple(arrays_out), ctx

  @jax.custom_vjp
  def function(*arrays: Any) -> tuple:
    with _scope(api):
      return key.run(forward, arrays)[0]

  def function_fwd(*arrays: Any) -> tuple[tuple, list]:
    with _scope(api):
      outs, ctx = key.run(forward, arrays)
    leaves, treedef = torch_pytree.tree_flatten(dict(vars(ctx)))
    residuals = [tensor_lib.value(x) for x in leaves if type(x) is tensor_lib.Tensor]
    structure["ctx"] = (treedef, [None if type(x) is tensor_lib.Tensor else (x,) for x in leaves])
    return outs, residuals

  def function_bwd(residuals: list, cotangents: tuple) -> tuple:
    cotangents = cotangents[: len(structure["meta"])]  # (less the key's)
    with scope.trace_scope(api):
      grads = _backward(cls, api, structure, residuals, cotangents, avals, positions, len(args))
    return (*grads, *key.cotangents())

  function.defvjp(function_fwd, function_bwd)
  outs = iter(key.done(function(*inputs, *key.arrays())))
  results = []
  for s in structure["statics"]:
    results.append(
      array_to_tensor(next(outs), lambda: f"an output of {name}", api) if s is None else s[0]
    )
  return results[0] if structure["single"] else tuple(results)


def _backward(
  cls: Any,
  api: str,
  structure: dict,
  residuals: list,
  cotangents: tuple,
  avals: list,
  positions: list[int],
  n_args: int,
) -> tuple:

  name = cls.__name__
  it = iter(residuals)
  treedef, slots = structure["ctx"]
  leaves = [
    array_to_tensor(next(it), lambda: f"a value {name} saved", api) if s is None else s[0]
    for s in slots
  ]
  ctx = object.__new__(_Ctx)
  vars(ctx).update(torch_pytree.tree_unflatten(leaves, treedef))
  grads_out = []
  for ct, (shape, dtype), frozen in zip(cotangents, structure["meta"], structure["frozen"]):
    if frozen or ct.dtype == jax.dtypes.float0:
      with jax.enable_x64(True):  # an int64 output's zeros stay int64
        zeros = jnp.zeros(shape, dtype)
      grads_out.append(
        array_to_tensor(zeros, lambda: "a zero gradient", api) if structure["materialize"] else None
      )
    else:
      grads_out.append(array_to_tensor(ct, lambda: f"a gradient of {name}'s output", api))
  with torch.enable_grad():  # a backward is differentiable (JAX's higher derivatives)
    backward = _user_backward(cls)
    assert backward is not None  # (checked when the function was traced)
    grads = backward(ctx, *grads_out)
  if not isinstance(grads, tuple):
    grads = (grads,)
  if len(grads) < n_args or any(g is not None for g in grads[n_args:]):
    raise BridgeError(
      f"`{api}`: {name}.backward returned {len(grads)} gradients for a forward of {n_args} "
      "inputs; it must return one per input (None for inputs without a gradient), as torch "
      "requires."
    )
  result: list[Any] = []
  for i, (shape, dtype) in zip(positions, avals):
    g = grads[i]
    if not jnp.issubdtype(dtype, jnp.inexact):
      result.append(np.zeros(shape, jax.dtypes.float0))
      continue
    if g is None:
      result.append(jnp.zeros(shape, dtype))
      continue
    if type(g) is tensor_lib.Tensor:
      v = tensor_lib.value(g)
    elif isinstance(g, torch.Tensor):  # computed on the CPU: a constant
      v = transfer.tensor_to_jax(
        g.detach(), copy=True, api=api, where=lambda: f"a gradient {name}.backward returned"
      )
    else:
      raise BridgeTypeError(
        f"`{api}`: {name}.backward returned a {type(g).__name__} as the gradient of input "
        f"{i}; it must return tensors (or None)."
      )
    if tuple(v.shape) != tuple(shape):
      v = _sum_to(v, tuple(shape), name, i, api)
    result.append(v.astype(dtype))
  return tuple(result)


def _sum_to(v: Any, shape: tuple, name: str, i: int, api: str) -> Any:
  """torch's rule for a gradient of another shape: summed to the input's if it broadcasts."""
  try:
    if np.broadcast_shapes(shape, v.shape) != tuple(v.shape):
      raise ValueError
  except ValueError:
    raise BridgeError(
      f"`{api}`: {name}.backward returned a gradient of shape {tuple(v.shape)} for input {i} "
      f"of shape {shape}."
    ) from None
  lead = len(v.shape) - len(shape)
  axes = tuple(range(lead)) + tuple(
    lead + k for k, n in enumerate(shape) if n == 1 and v.shape[lead + k] != 1
  )
  return jnp.sum(v, axis=axes, keepdims=False).reshape(shape) if axes else v.reshape(shape)


scope.on_trace(install, uninstall)  # custom Functions keep their backward in every trace scope
