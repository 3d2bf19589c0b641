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
from typing import Any, Callable, Literal, TypeVar, get_args

import jax
import jax.numpy as jnp
import numpy as np
import torch

from bridge._src import functions  # noqa: F401 - its hook on the trace scope (`scope.on_trace`)
from bridge._src import scope
from bridge._src import tensor as tensor_lib
from bridge._src import transfer
from bridge._src import tree as tree_lib
from bridge._src.arrays import array_to_tensor
from bridge._src.errors import BridgeTypeError

API = "bridge.call_torch"

F = TypeVar("F", bound=Callable[..., Any])


def inputs_to_torch(tree: Any, api: str = API) -> Any:
  """JAX arrays, tracers and NumPy arrays in `tree` -> `bridge.Tensor`s; other leaves kept."""
  def leaf(x: Any, where: Callable[[], str]) -> Any:
    if isinstance(x, jax.Array):  # tracers included
      return array_to_tensor(x, lambda: f"argument {where()}", api)
    if isinstance(x, np.ndarray):
      with jax.enable_x64(True):  # exact dtypes: a float64 array stays float64
        return array_to_tensor(jnp.asarray(x), lambda: f"argument {where()}", api)
    return x
  return tree_lib.tree_map(leaf, tree)


def _output(x: Any, where: Callable[[], str], api: str) -> Any:
  if isinstance(x, tensor_lib.Tensor):
    return tensor_lib.value(x)
  if isinstance(x, torch.Tensor):  # made on the CPU (a constant of the program)
    with jax.enable_x64(True):
      return transfer.tensor_to_jax(x.detach(), copy=True, api=api,
                                    where=lambda: f"output {where()}")
  if type(x).__module__ == "torch.return_types":  # torch's named tuples (values, indices)
    # (their fields may be lists of tensors: histogramdd's bin edges)
    return tree_lib.tree_map(lambda v, w: _output(v, w, api), tuple(x))
  return x


def outputs_to_jax(tree: Any, api: str = API) -> Any:
  """Tensors in `tree` -> JAX arrays (`bridge.Tensor`s give their arrays, no copy)."""
  return tree_lib.tree_map(lambda x, where: _output(x, where, api), tree)


def run_traced(call: Callable[..., Any], args: tuple, kwargs: dict, api: str = API) -> Any:
  """`call(*args, **kwargs)` in the trace scope, with JAX's tracing errors put in torch terms."""
  with scope.trace_scope(api):
    try:
      return call(*args, **kwargs)
    except (jax.errors.ConcretizationTypeError, jax.errors.NonConcreteBooleanIndexError,
            jax.errors.TracerArrayConversionError) as e:
      # an op whose output shape depends on values (`nonzero`, boolean indexing...).
      raise scope.traced_value_error(
          "an op whose result's shape depends on tensor values, e.g. `nonzero`, "
          "`masked_select`, `x[mask]`, `unique`", tb=e.__traceback__) from e


# How torch code runs inside JAX: traced op by op ("trace"), or run for real by one host call
# ("callback"); and how a callback-mode call is batched under `jax.vmap` (as `jax.pure_callback`).
Mode = Literal["trace", "callback"]
VmapMethod = Literal["sequential", "sequential_unrolled", "expand_dims", "broadcast_all"]
MODES: tuple[str, ...] = get_args(Mode)
VMAP_METHODS: tuple[str, ...] = get_args(VmapMethod)


def call_torch(fn: Callable[..., Any], /, *args: Any, mode: Mode = "trace",
               vmap_method: VmapMethod | None = None, result_shape_dtypes: Any = None,
               **kwargs: Any) -> Any:
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
  if mode == "callback":
    from bridge._src import callback  # it builds on this module
    return callback.call(fn, args, kwargs, vmap_method=vmap_method,
                         result_shape_dtypes=result_shape_dtypes)
  check_mode(mode, vmap_method, result_shape_dtypes)
  module = _module_of(fn)
  if module is not None:
    from bridge._src import modules  # it builds on this module
    return modules.call_module(module, fn, args, kwargs, api=API)
  targs, tkwargs = inputs_to_torch((args, kwargs))
  return outputs_to_jax(run_traced(fn, targs, tkwargs))


def check_mode(mode: Any, vmap_method: Any, result_shape_dtypes: Any, api: str = API) -> None:
  """Refuse a mode that is not one, and callback options given to trace mode."""
  if mode not in MODES:
    raise BridgeTypeError(
        f"`{api}`: mode={mode!r} is not one of 'trace', 'callback'. (`mode` is {api}'s own "
        "argument; to pass `mode=` to the torch function, bind it first: "
        "`functools.partial(fn, mode=...)`.)")
  if vmap_method is not None and vmap_method not in VMAP_METHODS:
    raise BridgeTypeError(
        f"`{api}`: vmap_method={vmap_method!r} is not one of {', '.join(VMAP_METHODS)}.")
  if mode == "trace" and (vmap_method is not None or result_shape_dtypes is not None):
    raise BridgeTypeError(
        f"`{api}`: `vmap_method` and `result_shape_dtypes` are options of "
        "mode='callback'; in trace mode JAX batches and shapes the torch code itself.")


def _module_of(fn: Any) -> torch.nn.Module | None:
  if isinstance(fn, torch.nn.Module):
    return fn
  owner = getattr(fn, "__self__", None)
  return owner if isinstance(owner, torch.nn.Module) else None


def jax_view(fn: F, *, mode: Mode = "trace", vmap_method: VmapMethod | None = None,
             result_shape_dtypes: Any = None) -> F:
  """Wraps the torch callable `fn` as a JAX callable: `call_torch(fn, ...)` on each call.

  Usable as a decorator (`@bridge.jax_view`, or `@functools.partial(bridge.jax_view,
  mode="callback")`); `mode`, `vmap_method` and `result_shape_dtypes` are those of
  `call_torch`. The wrapper keeps `fn`'s name and docstring, and
  `wrapper.__wrapped__` is `fn`; `jax_view(torch_view(jax_fn))` gives back `jax_fn`.
  """
  if not callable(fn):
    raise BridgeTypeError(f"`bridge.jax_view`: expected a callable, got a {type(fn).__name__}.")
  check_mode(mode, vmap_method, result_shape_dtypes, api="bridge.jax_view")
  if mode == "callback":
    wrapped_cb = fn.forward if isinstance(fn, torch.nn.Module) else fn

    @functools.wraps(wrapped_cb)
    def callback_wrapper(*args: Any, **kwargs: Any) -> Any:
      return call_torch(fn, *args, mode="callback", vmap_method=vmap_method,
                        result_shape_dtypes=result_shape_dtypes, **kwargs)
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
