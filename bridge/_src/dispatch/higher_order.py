"""torch's higher-order operators on `bridge.Tensor`s. The control-flow ones run as JAX's own:
`torch.cond` as `lax.cond`, `while_loop` as `lax.while_loop`, `scan` as `lax.scan` and `map` as
`lax.map`; `flex_attention` runs torch's own math implementation of it, and a
`torch.compiler.nested_compile_region` its graph, op by op into the program. The random ops
activation checkpointing replays in the backward (`run_and_save_rng_state`,
`run_with_rng_state`) save and reuse the program's key.

Each control-flow subgraph (an FX graph module that torch.compile captured, or any function of
tensors) is traced once as a JAX function of the tensors' arrays, so the program holds the control
flow itself: one branch runs, a loop runs as a loop, whatever the values. They reach the bridge in
the graphs of `torch.compile(..., backend="jax")`: dynamo captures them whole, and aot_autograd
writes their backward as more of them. Operands are the op's tensors (on one `jax` device; a CPU
scalar tensor is a constant) and Python numbers, which stay static. Random ops inside a subgraph
draw from the program's key (`rng.rng_key`), threaded through as one more operand and result,
so each branch, iteration and element draws its own numbers.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Sequence

import jax
import torch
import torch.utils._pytree as pytree

from bridge._src import dtypes as dtypes_lib
from bridge._src import rng
from bridge._src import tensor as tensor_lib
from bridge._src.dispatch import tensors
from bridge._src.dispatch.schema import x64
from bridge._src.errors import BridgeTypeError

Tensor = tensor_lib.Tensor
_hop = torch.ops.higher_order


def _device(values: Sequence[Any]) -> torch.device:
  """The one `jax` device of the op's tensors."""
  device = None
  for v in values:
    if type(v) is Tensor:
      if device is None:
        device = v.device
      elif v.device != device:
        raise tensors.device_error(device, v.device)
  return device if device is not None else tensor_lib.jax_device(0)


class _Slots:
  """A flat list of operands as (arrays, torch dtypes) for the traced values and the rest
  (Python numbers) kept in place, to rebuild the operands inside a subgraph's trace."""

  def __init__(
    self,
    op: str,
    what: str,
    values: Sequence[Any],
    device: torch.device,
    traced_only: bool = False,
  ):
    self.values = list(values)
    self.arrays: list[Any] = []
    self.dtypes: list[torch.dtype] = []
    self.traced: list[int] = []
    for i, v in enumerate(self.values):
      if isinstance(v, torch.Tensor):
        if type(v) is Tensor:
          array = tensor_lib.value(v)
        elif v.dim() == 0 and v.device.type == "cpu":
          array = tensors.scalar_from_cpu(v)  # a constant of the program
        else:
          raise tensors.device_error(device, v.device)
        self.arrays.append(array)
        self.dtypes.append(v.dtype)
        self.traced.append(i)
      elif traced_only:
        raise BridgeTypeError(
          f"bridge: `{op}` takes tensors only as its {what} inside a JAX program, got a "
          f"{type(v).__name__} ({v!r}); make it a tensor (`torch.tensor({v!r})`)."
        )

  def rebuild(self, arrays: Sequence[Any], device: torch.device) -> list[Any]:
    """The operands with the traced ones made from `arrays` (this trace's values)."""
    out = list(self.values)
    for i, a, dtype in zip(self.traced, arrays, self.dtypes):
      out[i] = tensor_lib.make(a, device, dtype)
    return out


def _outputs(op: str, what: str, result: Any, dtypes: list | None = None) -> tuple[list, Any]:
  """A subgraph's result as flat arrays (each of its torch dtype's JAX type, not weak, so the
  branches and iterations agree) and its structure; `dtypes` gets their torch dtypes."""
  flat, spec = pytree.tree_flatten(result)
  arrays = []
  for o in flat:
    if type(o) is not Tensor:
      raise BridgeTypeError(
        f"bridge: `{op}`'s {what} must return tensors on the `jax` device, got "
        f"{type(o).__name__}{f' on {o.device}' if isinstance(o, torch.Tensor) else ''}."
      )
    arrays.append(dtypes_lib.strong(tensor_lib.value(o)))
    if dtypes is not None:
      dtypes.append(o.dtype)
  return arrays, spec


class _Key:
  """The current `rng_key` block's key, threaded through a subgraph: one more operand, and one
  more result (the key after the subgraph's random ops split it; the same key if none did)."""

  def __init__(self) -> None:
    self.box = rng.current_box()
    self.start = None if self.box is None else self.box.key

  def arrays(self) -> list:
    return [] if self.box is None else [self.start]

  def enter(self, arrays: Sequence[Any]) -> list:
    """This trace's operands less the key, which the random ops now split."""
    if self.box is None:
      return list(arrays)
    self.box.key = arrays[-1]
    return list(arrays[:-1])

  def leave(self) -> list:
    """The key as the subgraph leaves it (a result of the subgraph)."""
    return [] if self.box is None else [self.box.key]

  def done(self, outs: Sequence[Any]) -> list:
    """The op's results less the key, which is now current."""
    if self.box is None:
      return list(outs)
    self.box.key = outs[-1]
    return list(outs[:-1])

  def __enter__(self) -> "_Key":
    return self

  def __exit__(self, kind: Any, *exc: Any) -> None:
    """Where the op failed: the key it started from again (not a tracer of a subgraph)."""
    if kind is not None and self.box is not None:
      self.box.key = self.start


def _results(arrays: Sequence[Any], dtypes: Sequence[torch.dtype], device: torch.device) -> list:
  return [tensor_lib.make(a, device, d) for a, d in zip(arrays, dtypes)]


def _predicate(op: str, pred: Any) -> Any:
  if isinstance(pred, (bool, int)):
    return bool(pred)
  if not isinstance(pred, torch.Tensor) or pred.numel() != 1:
    raise BridgeTypeError(
      f"bridge: `{op}` needs a bool or a one-element boolean tensor as its predicate, got {pred}."
    )
  array = tensor_lib.value(pred) if type(pred) is Tensor else tensors.scalar_from_cpu(pred)
  return jax.numpy.reshape(array, ()).astype(bool)


def cond(pred: Any, true_fn: Callable, false_fn: Callable, operands: Any) -> Any:
  """`torch.cond` as `lax.cond`: both branches traced, the one the predicate picks runs."""
  flat, spec = pytree.tree_flatten(operands)
  device = _device([pred, *flat])
  slots = _Slots("torch.cond", "operands", flat, device)
  key = _Key()
  structures: list[Any] = []
  dtypes: list[list] = []

  def branch(fn: Callable) -> Callable:
    def run(arrays: list) -> list:
      args = pytree.tree_unflatten(slots.rebuild(key.enter(arrays), device), spec)
      dtypes.append([])
      outs, structure = _outputs("torch.cond", "branches", fn(*args), dtypes[-1])
      structures.append(structure)
      return outs + key.leave()

    return run

  with key, x64():
    p = _predicate("torch.cond", pred)
    outs = jax.lax.cond(p, branch(true_fn), branch(false_fn), slots.arrays + key.arrays())
  outs = key.done(outs)
  if structures[0] != structures[-1] or dtypes[0] != dtypes[-1]:
    raise BridgeTypeError(
      "bridge: `torch.cond`'s branches must return the same structure of tensors of the same "
      f"dtypes, got {dtypes[0]} and {dtypes[-1]}."
    )
  return pytree.tree_unflatten(_results(outs, dtypes[0], device), structures[0])


def while_loop(
  cond_fn: Callable,
  body_fn: Callable,
  carried_inputs: Sequence[Any],
  additional_inputs: Sequence[Any],
  **kwargs: Any,
) -> tuple:
  """`torch._higher_order_ops.while_loop` as `lax.while_loop` (the carried values: tensors of
  fixed shapes and dtypes; the additional inputs are read by every iteration)."""
  if kwargs.get("stack_output") or kwargs.get("mutated_arg_indices"):
    raise BridgeTypeError(
      f"bridge: `while_loop` with {sorted(k for k, v in kwargs.items() if v)} is not supported "
      "inside a JAX program."
    )
  device = _device([*carried_inputs, *additional_inputs])
  carried = _Slots("while_loop", "carried inputs", carried_inputs, device, True)
  extra = _Slots("while_loop", "additional inputs", additional_inputs, device)
  key = _Key()

  def body(arrays: list) -> list:
    args = [*carried.rebuild(key.enter(arrays), device), *extra.rebuild(extra.arrays, device)]
    dtypes: list[torch.dtype] = []
    outs, _ = _outputs("while_loop", "body_fn", body_fn(*args), dtypes)
    if dtypes != carried.dtypes:
      raise BridgeTypeError(
        "bridge: `while_loop`'s body_fn must return tensors like its carried inputs "
        f"({carried.dtypes}), got {dtypes}."
      )
    return outs + key.leave()

  def test(arrays: list) -> Any:
    args = [*carried.rebuild(key.enter(arrays), device), *extra.rebuild(extra.arrays, device)]
    pred = _predicate("while_loop", cond_fn(*args))
    if key.box is not None and key.box.key is not arrays[-1]:
      raise BridgeTypeError(
        "bridge: `while_loop`'s cond_fn draws random numbers, which only body_fn may do."
      )
    return pred

  with key, x64():
    outs = jax.lax.while_loop(
      test, body, [dtypes_lib.strong(a) for a in carried.arrays] + key.arrays()
    )
  return tuple(_results(key.done(outs), carried.dtypes, device))


def scan(
  combine_fn: Callable, init: Sequence[Any], xs: Sequence[Any], additional_inputs: Sequence[Any]
) -> tuple:
  """`torch._higher_order_ops.scan` as `lax.scan` along dimension 0 of `xs`: returns the final
  carry and the stacked outputs."""
  device = _device([*init, *xs, *additional_inputs])
  carry = _Slots("scan", "init", init, device, True)
  scanned = _Slots("scan", "xs", xs, device, True)
  extra = _Slots("scan", "additional inputs", additional_inputs, device)
  if not scanned.arrays:  # nothing to scan over: torch returns the init as it is
    return tuple(init)
  key = _Key()
  out_dtypes: list[torch.dtype] = []

  def step(c: list, x: list) -> tuple[list, list]:
    c = key.enter(c)
    args = [
      *carry.rebuild(c, device),
      *scanned.rebuild(x, device),
      *extra.rebuild(extra.arrays, device),
    ]
    out_dtypes.clear()
    outs, _ = _outputs("scan", "combine_fn", combine_fn(*args), out_dtypes)
    n = len(c)
    if out_dtypes[:n] != carry.dtypes:
      raise BridgeTypeError(
        "bridge: `scan`'s combine_fn must return its next carry like its init "
        f"({carry.dtypes}) first, got {out_dtypes[:n]}."
      )
    return outs[:n] + key.leave(), outs[n:]

  with key, x64():
    final, ys = jax.lax.scan(
      step, [dtypes_lib.strong(a) for a in carry.arrays] + key.arrays(), scanned.arrays
    )
  return (
    *_results(key.done(final), carry.dtypes, device),
    *_results(ys, out_dtypes[len(carry.dtypes) :], device),
  )


def map_impl(f: Callable, xs: Sequence[Any], pos_args: Sequence[Any]) -> Any:
  """`torch._higher_order_ops.map` as a `lax.scan` along dimension 0 of `xs` (`lax.map`, with
  the random key carried from one element to the next)."""
  device = _device([*xs, *pos_args])
  mapped = _Slots("map", "xs", xs, device, True)
  extra = _Slots("map", "arguments", pos_args, device)
  key = _Key()
  dtypes: list[torch.dtype] = []
  structures: list[Any] = []

  def one(c: list, x: list) -> tuple[list, list]:
    key.enter(c)
    dtypes.clear()
    result = f(*mapped.rebuild(x, device), *extra.rebuild(extra.arrays, device))
    outs, structure = _outputs("map", "function", result, dtypes)
    structures.append(structure)
    return key.leave(), outs

  with key, x64():
    final, outs = jax.lax.scan(one, key.arrays(), mapped.arrays)
  key.done(final)
  return pytree.tree_unflatten(_results(outs, dtypes, device), structures[-1])


def invoke_subgraph(subgraph: Callable, identifier: Any, *operands: Any) -> Any:
  """`torch.compiler.nested_compile_region`'s operator: the region's graph, traced in place
  (the program holds one copy per call; XLA sees them whole)."""
  del identifier
  if getattr(subgraph, "_boxed_call", False):
    return subgraph(list(operands))
  return subgraph(*operands)


def run_and_save_rng_state(op: Any, *args: Any, **kwargs: Any) -> tuple:
  """aot_autograd's replayable random op (activation checkpointing around dropout): the key
  `op` is about to draw from, as a uint32 tensor, and `op`'s result."""
  device = _device([*args, *kwargs.values()])
  state = tensor_lib.make(_rng_key(rng.current_box()), device, torch.uint32)
  return state, op(*args, **kwargs)


def run_with_rng_state(rng_state: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
  """`op` drawing from the key `run_and_save_rng_state` saved (its recomputation in the
  backward: the same numbers); the key in use before is current again after."""
  key = tensor_lib.value(rng_state) if type(rng_state) is Tensor else None
  if key is None or rng_state.dtype != torch.uint32 or tuple(rng_state.shape) != (2,):
    raise BridgeTypeError(
      "bridge: `run_with_rng_state` needs the key `run_and_save_rng_state` saved on the `jax` "
      f"device (a uint32 tensor of 2), got {type(rng_state).__name__} "
      f"{getattr(rng_state, 'dtype', '')}{tuple(getattr(rng_state, 'shape', ()))}."
    )
  box = rng.current_box()
  before = _rng_key(box)
  _set_rng_key(box, key)
  try:
    return op(*args, **kwargs)
  finally:
    _set_rng_key(box, before)


def _rng_key(box: Any) -> Any:
  """The key the next random op splits: the program's (`box`, from `rng_key`), or the
  generator's."""
  return box.key if box is not None else rng.current_key()


def _set_rng_key(box: Any, key: Any) -> None:
  if box is not None:
    box.key = key
  else:
    rng.set_key(key)


def _flex_attention() -> dict[Any, Callable]:
  """`flex_attention` and its backward: torch's math implementations (`sdpa_dense`, which
  applies the score and mask functions with `torch.vmap`), run on `bridge.Tensor`s like any
  torch code. (torch allows its backward on CUDA tensors only.)"""
  try:
    flex = importlib.import_module("torch._higher_order_ops.flex_attention")
    return {
      flex.flex_attention: flex.sdpa_dense,
      flex.flex_attention_backward: flex.sdpa_dense_backward,
    }
  except (ImportError, AttributeError):  # pragma: no cover - another torch
    return {}


def _torch_dense(*names: str) -> dict[Any, Callable]:
  """torch's own implementations of these operators in torch code (their
  `CompositeExplicitAutograd` kernels), run on `bridge.Tensor`s like any torch code:
  `auto_functionalized` (a custom op that writes its arguments, in aot_autograd's functional
  graphs: run on copies of them, which `dispatch.mutation` hands to the fallback)."""
  table = {}
  for name in names:
    op = getattr(_hop, name, None)
    kernel = getattr(op, "py_kernels", {}).get(torch._C.DispatchKey.CompositeExplicitAutograd)
    if kernel is not None:
      table[op] = kernel
  return table


def _if_present(**impls: Callable) -> dict[Any, Callable]:
  """The operators of these names this torch has, with their implementations."""
  return {getattr(_hop, n): f for n, f in impls.items() if hasattr(_hop, n)}


# The operators and their implementations on `bridge.Tensor`s.
IMPLEMENTATIONS: dict[Any, Callable] = {
  _hop.cond: cond,
  _hop.while_loop: while_loop,
  _hop.scan: scan,
  _hop.map_impl: map_impl,
  _hop.invoke_subgraph: invoke_subgraph,
  **_if_present(
    run_and_save_rng_state=run_and_save_rng_state, run_with_rng_state=run_with_rng_state
  ),
  **_flex_attention(),
  **_torch_dense("auto_functionalized", "auto_functionalized_v2"),
}


def register() -> None:
  """Make the operators take these implementations for `bridge.Tensor`s (once)."""
  for op, impl in IMPLEMENTATIONS.items():
    if Tensor not in op.python_key_table:
      op.py_impl(Tensor)(impl)
