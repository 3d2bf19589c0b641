"""`call_torch` and `jax_view(torch_fn)`: a torch function or module as a JAX function.

JAX arrays (and tracers) in the arguments become `bridge.Tensor`s; the torch
code runs on them op by op, each aten op as JAX code (`bridge._src.dispatch`),
so under `jax.jit`, `jax.grad`, `jax.vmap`, `lax.scan` or `jax.checkpoint` the
torch code becomes part of the JAX program being built. Outputs come back as JAX
arrays in the same pytree. Modules run with their parameters and buffers as
JAX arrays (`bridge._src.modules`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import jax
import torch

from bridge._src import callback
from bridge._src.dispatch import fallback
from bridge._src import modules
from bridge._src import tensor as tensor_lib
from bridge._src.errors import BridgeTypeError
from bridge._src.module_state import module_of
from bridge._src.tracing import (
  Mode,
  VmapMethod,
  check_mode,
  inputs_to_torch,
  outputs_to_jax,
  run_traced,
)

API = "bridge.call_torch"

F = TypeVar("F", bound=Callable[..., Any])


def call_torch(
  fn: Callable[..., Any],
  /,
  *args: Any,
  mode: Mode = "trace",
  vmap_method: VmapMethod | None = None,
  result_shape_dtypes: Any = None,
  **kwargs: Any,
) -> Any:
  """Calls the torch function or module `fn` on JAX arrays; returns JAX arrays.

  As `fn(*args, **kwargs)` with `bridge.Tensor`s (torch tensors on the `jax`
  device) in place of the JAX arrays in any pytree position. The torch code runs
  op by op as JAX code, so inside `jax.jit`, `jax.grad`, `jax.vmap`, `lax.scan` or
  `jax.checkpoint` it becomes part of the JAX program: compiled and fused by XLA,
  differentiable by JAX (to any order), batched by `vmap`. Outputs (tensors in
  tuples, lists, dicts, dataclasses, `ModelOutput`s) come back as JAX arrays.

  Inside `fn`, torch code may use autograd (`torch.autograd.grad`, `.backward()`),
  `torch.no_grad()`, in-place updates, and factory calls without a device: tensors
  created on the CPU join the program as constants. As in torch, `detach()` and the
  results of a `torch.no_grad()` block inside `fn` get no gradient from JAX's transforms
  (the grad mode `fn` is called under does not count). Mutating an input tensor in
  place does not change the caller's JAX array (JAX arrays are immutable).

  An `nn.Module` (or a bound method of one) runs with its parameters and buffers
  as JAX arrays; under `jax.jit` they are constants of the program as of tracing
  (to differentiate with respect to them, or to pass them as inputs, use
  `bridge.extract_jax`). Buffer updates (BatchNorm running statistics) are written
  back to the module when the call is not being staged; inside `jax.jit` they
  cannot be and a warning says so (use `extract_jax(..., return_state=True)`).

  Random ops (`dropout`...) draw from the `jax` device's generator; inside
  `jax.jit` make a key current with `bridge.rng_key(key)`.

  With `mode="callback"`, `fn` is not traced: it runs for real, in eager torch
  on CPU tensors that share memory with the program's buffers, through a host
  call staged into the JAX program. Any torch code works that way (ops with no
  lowering, custom ops, extensions), at the price of a call out of the compiled
  program. The outputs' shapes are found by running `fn` once on fake tensors
  (cached per input shapes), or given as `result_shape_dtypes`. `jax.grad` runs
  torch autograd in a second host call (reverse-mode only: `jax.jvp`/`jacfwd`
  are refused); `jax.vmap` calls torch once per example (`vmap_method=
  "sequential"`) or once on the whole batch for functions that treat a leading
  dimension as a batch (`vmap_method="broadcast_all"` or `"expand_dims"`). A
  module runs with its own live parameters and buffers (its state is not a JAX
  input; use `extract_jax(module, mode="callback")` to differentiate it).

  `mode`, `vmap_method` and `result_shape_dtypes` are this function's own
  keywords; to pass a keyword of that name to `fn`, bind it first
  (`functools.partial(fn, mode=...)`).

  Args:
    fn: a torch callable: function, `nn.Module`, bound method.
    *args: positional arguments: pytrees of JAX arrays and other values.
    mode: "trace" (the default) or "callback".
    vmap_method: callback mode under `jax.vmap` (see above); default "sequential".
    result_shape_dtypes: callback mode: the outputs as a pytree of
      `jax.ShapeDtypeStruct`s, instead of finding them with fake tensors.
    **kwargs: keyword arguments, likewise.

  Returns:
    `fn`'s output with JAX arrays in place of tensors.

  Raises:
    TracedValueError: torch code needs a traced tensor's value in Python
      (`.item()`, `if t:`) while JAX stages a program; the message names the line.
    LeakedTracerError: a module kept a traced tensor as an attribute.
    OperatorNotFound: an aten op with no lowering and no decomposition.

  Example:
    >>> import jax, jax.numpy as jnp, torch, bridge
    >>> f = lambda x: torch.nn.functional.softplus(x).sum()
    >>> jax.grad(lambda x: bridge.call_torch(f, x))(jnp.zeros(2))
    Array([0.5, 0.5], dtype=float32)
  """
  check_callable(fn, API)
  if mode == "callback":
    return _in_callback_mode(fn, args, kwargs, vmap_method, result_shape_dtypes, API)
  check_mode(mode, vmap_method, result_shape_dtypes)
  module = module_of(fn)
  if module is not None:
    return modules.call_module(module, fn, args, kwargs, api=API)
  targs, tkwargs = inputs_to_torch((args, kwargs))
  return outputs_to_jax(run_traced(fn, targs, tkwargs))


def check_callable(fn: Any, api: str) -> None:
  """Refuse an `fn` that is not callable, naming `api` (`bridge.call_torch`...)."""
  if not callable(fn):
    raise BridgeTypeError(
      f"`{api}`: `fn` must be a torch callable (a function, an `nn.Module`, a bound method), "
      f"got {type(fn).__name__} {repr(fn)[:80]}. Pass the function first, then its "
      f"arguments: `{api}(fn, *args)`."
    )


def _in_callback_mode(
  fn: Callable[..., Any],
  args: tuple,
  kwargs: dict,
  vmap_method: VmapMethod | None,
  result_shape_dtypes: Any,
  api: str,
) -> Any:
  """`fn` run for real by torch through one host call; `api` is the API the user called."""
  module = module_of(fn)
  if module is not None:
    _check_host_state(module, api)
  return callback.call(
    fn,
    args,
    kwargs,
    vmap_method=vmap_method,
    result_shape_dtypes=result_shape_dtypes,
    api=api,
    owner=fn,
  )


def _check_host_state(module: torch.nn.Module, api: str) -> None:
  """Callback mode runs `module` as it is, in eager torch on the arrays' host tensors: its
  parameters and buffers must be there too (a `jax`-device module's are JAX arrays, which
  the host call cannot hand to torch's CPU kernels)."""
  # (a module's first parameter and buffer: every call goes through here)
  firsts = [next(module.named_parameters(), None), next(module.named_buffers(), None)]
  for name, t in [first for first in firsts if first is not None]:
    if t.device.type == tensor_lib.device_type():
      raise BridgeTypeError(
        f"`{api}(..., mode='callback')`: {type(module).__name__}'s {name!r} is on the "
        f"`{t.device}` device; callback mode runs the module as it is, in eager torch on the "
        "host, beside the arrays' host tensors. Pass its state as arrays with "
        "`bridge.extract_jax(module, mode='callback')`, move the module with `.cpu()`, or "
        "use trace mode (the default)."
      )


def jax_function(
  fn: F,
  *,
  mode: Mode = "trace",
  vmap_method: VmapMethod | None = None,
  result_shape_dtypes: Any = None,
) -> F:
  """`bridge.jax_view` of a torch callable `fn`: a JAX callable, `call_torch(fn, ...)` on each
  call.

  Usable as a decorator (`@bridge.jax_view`, or `@functools.partial(bridge.jax_view,
  mode="callback")`); `mode`, `vmap_method` and `result_shape_dtypes` are those of
  `call_torch`. The wrapper keeps `fn`'s name and docstring, and
  `wrapper.__wrapped__` is `fn`; `jax_view(torch_view(jax_fn))` gives back `jax_fn`.
  """
  check_callable(fn, "bridge.jax_view")
  check_mode(mode, vmap_method, result_shape_dtypes, api="bridge.jax_view")
  if mode == "callback":
    wrapped_cb = fn.forward if isinstance(fn, torch.nn.Module) else fn

    @functools.wraps(wrapped_cb)
    def callback_wrapper(*args: Any, **kwargs: Any) -> Any:
      return _in_callback_mode(
        fn, args, kwargs, vmap_method, result_shape_dtypes, "bridge.jax_view"
      )

    callback_wrapper.__bridge_torch_fn__ = fn  # type: ignore[attr-defined]
    return callback_wrapper  # type: ignore[return-value]
  inner = getattr(fn, "__bridge_jax_fn__", None)
  if inner is not None:  # a torch view of a JAX function: views of views cancel
    return inner
  if getattr(fn, "__bridge_torch_fn__", None) is not None:
    return fn  # already a JAX view

  wrapped = fn.forward if isinstance(fn, torch.nn.Module) else fn

  @functools.wraps(wrapped)
  def wrapper(*args: Any, **kwargs: Any) -> Any:
    return call_torch(fn, *args, **kwargs)

  wrapper.__bridge_torch_fn__ = fn  # type: ignore[attr-defined]
  return wrapper  # type: ignore[return-value]


def fallback_ops(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> list[str]:
  """The aten ops of `fn(*args, **kwargs)` that would run through the callback fallback.

  Traces `bridge.call_torch(fn, *args, **kwargs)` abstractly (`jax.eval_shape`:
  nothing is computed) and returns the names of the ops that had no lowering and
  no decomposition, sorted, e.g. `['mylib::fused_op.default']`. Arguments are as
  for `call_torch` (JAX arrays, or `jax.ShapeDtypeStruct`s); an empty list means
  the whole function runs as JAX code.

  Example:
    >>> import jax, jax.numpy as jnp, torch, bridge
    >>> bridge.fallback_ops(lambda x: torch.sin(x) * 2, jnp.ones(3))
    []
  """
  check_callable(fn, "bridge.fallback_ops")
  found: set[str] = set()
  token = fallback.recording.set(found)
  try:
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    positions = [
      i for i, x in enumerate(leaves) if isinstance(x, (jax.Array, jax.ShapeDtypeStruct))
    ]

    def traced(*arrays: Any) -> Any:
      filled = list(leaves)
      for i, a in zip(positions, arrays):
        filled[i] = a
      a, k = jax.tree_util.tree_unflatten(treedef, filled)
      return call_torch(fn, *a, **k)

    with jax.enable_x64(True):
      jax.eval_shape(
        traced, *(jax.ShapeDtypeStruct(leaves[i].shape, leaves[i].dtype) for i in positions)
      )
  finally:
    fallback.recording.reset(token)
  return sorted(found)
