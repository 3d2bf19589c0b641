"""The trace of torch code as JAX code: JAX arrays in as `bridge.Tensor`s, the call in the
trace scope, JAX arrays out; and the two modes torch code can run in inside JAX.

The front doors build on it: `call_torch` (`bridge._src.call_torch`), `extract_jax` and
the module-state threading (`bridge._src.modules`), `bridge.compile`, `jax_view`.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np
import torch

from bridge._src import ffi
from bridge._src import functions  # noqa: F401 - its hook on the trace scope (`scope.on_trace`)
from bridge._src import narrowing
from bridge._src import scope
from bridge._src import tensor as tensor_lib
from bridge._src import transfer
from bridge._src import tree as tree_lib
from bridge._src.arrays import array_to_tensor
from bridge._src.errors import BridgeTypeError

API = "bridge.call_torch"


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


def _output(x: Any, where: Callable[[], str], api: str, record: list | None = None) -> Any:
  if isinstance(x, tensor_lib.Tensor):
    if record is not None:
      record.append(x)
    return tensor_lib.value(x)
  if isinstance(x, torch.Tensor):  # made on the CPU (a constant of the program)
    if record is not None:
      record.append(x)
    with jax.enable_x64(True):
      return transfer.tensor_to_jax(
        x.detach(), copy=True, api=api, where=lambda: f"output {where()}"
      )
  if type(x).__module__ == "torch.return_types":  # torch's named tuples (values, indices)
    # (their fields may be lists of tensors: histogramdd's bin edges)
    return tree_lib.tree_map(lambda v, w: _output(v, w, api, record), tuple(x))
  if record is not None and isinstance(x, jax.Array):
    record.append(None)  # (an array returned as it is: no tensor behind it)
  return x


def outputs_to_jax(tree: Any, api: str = API, record: list | None = None) -> Any:
  """Tensors in `tree` -> JAX arrays (`bridge.Tensor`s give their arrays, no copy); the
  containers JAX does not know (a `ModelOutput`, a dataclass) become JAX pytree nodes.
  `record`: a list that gets, for each array leaf of the result in order, the tensor it came
  from (None for an array returned as it is)."""
  tree_lib.register_output_types(tree)  # first: the tensors inside them are converted too
  return tree_lib.tree_map(lambda x, where: _output(x, where, api, record), tree)


def run_traced(call: Callable[..., Any], args: tuple, kwargs: dict, api: str = API) -> Any:
  """`call(*args, **kwargs)` in the trace scope, with JAX's tracing errors put in torch terms
  (and, in a 32-bit program, a warning about int64 results held as int32: `narrowing`)."""
  with scope.trace_scope(api):
    try:
      out = call(*args, **kwargs)
    except (
      jax.errors.ConcretizationTypeError,
      jax.errors.NonConcreteBooleanIndexError,
      jax.errors.TracerArrayConversionError,
    ) as e:
      # an op whose output shape depends on values (`nonzero`, boolean indexing...).
      raise scope.traced_value_error(
        "an op whose result's shape depends on tensor values, e.g. `nonzero`, "
        "`masked_select`, `x[mask]`, `unique`",
        tb=e.__traceback__,
      ) from e
    except Exception as e:
      if type(e).__name__ == "UncapturedHigherOrderOpError" and _READS_BRIDGE in str(e):
        raise _control_flow_error(api, e) from e
      raise
    narrowing.returned_held(call, out, api)  # (while the scope knows which they are)
    return out


_READS_BRIDGE = "bridge._src.tensor.Tensor"  # (the traced tensors, as dynamo names their type)


def _control_flow_error(api: str, error: Exception) -> BridgeTypeError:
  """torch's control-flow operators (`torch.cond`...) called in traced code: torch runs them by
  compiling their branches with dynamo, which cannot read a traced `bridge.Tensor`."""
  return BridgeTypeError(
    f"`{api}`: torch's control-flow operators (`torch.cond`, `while_loop`, `scan`, `map`) "
    "compile their branches with torch.compile's dynamo, which cannot read the tensors "
    f"{api} traces, at\n  {scope.user_line(error.__traceback__)}\nCompute both sides and "
    "pick with `torch.where`, or compile the torch code with "
    '`torch.compile(fn, backend="jax")`, which runs these operators as `lax.cond` / '
    "`lax.while_loop` / `lax.scan`."
  )


# How torch code runs inside JAX: traced op by op ("trace"), or run for real by one host call
# ("callback"); and how a callback-mode call is batched under `jax.vmap` (as `jax.pure_callback`).
Mode = Literal["trace", "callback"]
VmapMethod = ffi.VmapMethod
MODES: tuple[str, ...] = get_args(Mode)
VMAP_METHODS: tuple[str, ...] = get_args(VmapMethod)


def check_mode(mode: Any, vmap_method: Any, result_shape_dtypes: Any, api: str = API) -> None:
  """Refuse a mode that is not one, and callback options given to trace mode."""
  if mode not in MODES:
    raise BridgeTypeError(
      f"`{api}`: mode={mode!r} is not one of 'trace', 'callback'. (`mode` is {api}'s own "
      "argument; to pass `mode=` to the torch function, bind it first: "
      "`functools.partial(fn, mode=...)`.)"
    )
  if vmap_method is not None and vmap_method not in VMAP_METHODS:
    raise BridgeTypeError(
      f"`{api}`: vmap_method={vmap_method!r} is not one of {', '.join(VMAP_METHODS)}."
    )
  if mode == "trace" and (vmap_method is not None or result_shape_dtypes is not None):
    raise BridgeTypeError(
      f"`{api}`: `vmap_method` and `result_shape_dtypes` are options of "
      "mode='callback'; in trace mode JAX batches and shapes the torch code itself."
    )
