"""`bridge.export`: a torch model as a portable JAX artifact (`jax.export`), and `bridge.load`.

The torch function is captured by `torch.export` (so `torch.export.Dim` dynamic dimensions
keep their symbols, and Python control flow is resolved once, with torch's own checks),
decomposed to core ATen except the ops the lowering registry covers itself, and its graph
is then interpreted over JAX arrays, op by op through the same lowerings the `jax` device
uses. The bridge's own tracing (`bridge.Tensor`) cannot do this: a torch tensor's sizes
are integers, and JAX's symbolic dimensions are not.

The module's parameters, buffers and lifted constants are inputs of the JAX program, not
constants in it; tied weights (one tensor under two names) are one input. `Exported.save`
writes one directory:

- ``program.jaxexport``: `jax.export`'s versioned serialization of the program, which takes
  the weights (in the manifest's ``weights`` order) and then the flat user inputs;
- ``weights.safetensors``: the weights;
- ``manifest.json``: inputs, outputs, symbolic dimensions, weights, versions, checksums.

`load` checks all of it before anything runs. A process without torch can run the
artifact with `jax.export.deserialize` and `safetensors` (README, "Export").
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import importlib.metadata
import inspect
import itertools
import json
import operator
import os
import re
from typing import Any, Callable, Sequence, TypeAlias

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import torch

from bridge._src import dtypes, transfer
from bridge._src import tensor as tensor_lib
from bridge._src.dispatch import checks, resolve
from bridge._src.dynamo import _sdpa_math, user_frame
from bridge._src.errors import BridgeError, BridgeTypeError, OperatorNotFound, TracedValueError
from bridge._src.registry import REGISTRY

API = "bridge.export"
APPLY = "bridge.Exported.apply"
# weights: a dict name -> array, or `Exported.split_weights`' pair (trainable, rest)
Weights: TypeAlias = dict[str, Any] | tuple[dict[str, Any], dict[str, Any]]
FORMAT = 1  # the artifact layout's own version (manifest "format")
PROGRAM_FILE, WEIGHTS_FILE, MANIFEST_FILE = (
  "program.jaxexport",
  "weights.safetensors",
  "manifest.json",
)
_PLATFORMS = ("cpu", "cuda", "rocm", "tpu")

# graph nodes that check what torch.export already proved, or only annotate
_NO_OPS = frozenset(
  name
  for name in (
    "_assert_tensor_metadata",
    "_assert_scalar",
    "_assert_async",
    "sym_constrain_range",
    "sym_constrain_range_for_size",
  )
  if hasattr(torch.ops.aten, name)
)

_SYM_FUNCTIONS: dict[Any, Callable[..., Any]] = {
  operator.add: operator.add,
  operator.sub: operator.sub,
  operator.mul: operator.mul,
  operator.floordiv: operator.floordiv,
  operator.mod: operator.mod,
  operator.neg: operator.neg,
  operator.getitem: operator.getitem,
  torch.sym_max: max,
  torch.sym_min: min,
}


# ----------------------------------------------------------------------------- export


def export(
  module_or_fn: torch.nn.Module | Callable[..., Any],
  *example_args: Any,
  dynamic_shapes: Any = None,
  platforms: Sequence[str] | None = None,
  vjp_order: int = 0,
  **example_kwargs: Any,
) -> "Exported":
  """A torch module or function as a portable JAX program with its weights.

  Args:
    module_or_fn: a `torch.nn.Module` (its parameters and buffers become the artifact's
      weights) or a function of tensors.
    *example_args: example tensors, as the function is called.
    dynamic_shapes: `torch.export`'s form, e.g. ``{"x": {0: torch.export.Dim("batch")}}``:
      each named dimension becomes a JAX symbolic dimension of the same name.
    platforms: where the artifact may run (`jax.export` names: "cpu", "cuda", "tpu");
      default: the current platform.
    vjp_order: how many orders of derivatives the saved artifact carries (1: `jax.grad`
      through the loaded program works, for fine-tuning).
    **example_kwargs: example tensors passed by keyword.

  Returns:
    A `bridge.Exported`: callable with torch tensors or JAX arrays, `.apply(weights, ...)`
    as a pure JAX function, `.save(path)` for `bridge.load`.
  """
  if not isinstance(vjp_order, int) or isinstance(vjp_order, bool) or vjp_order < 0:
    raise BridgeTypeError(f"`{API}`: vjp_order must be an int >= 0, got {vjp_order!r}.")
  platforms = _platforms(platforms)
  module = (
    module_or_fn if isinstance(module_or_fn, torch.nn.Module) else _function_module(module_or_fn)
  )
  _check_example(example_args, example_kwargs)
  _check_on_host(module, example_args, example_kwargs)
  ep = _torch_export(module, example_args, example_kwargs, dynamic_shapes)
  ep = ep.run_decompositions(_decomposition_table())
  return _Builder(ep, module, example_args, example_kwargs, dynamic_shapes).build(
    platforms, vjp_order
  )


def _function_module(fn: Callable[..., Any]) -> torch.nn.Module:
  """A plain function as a module without state (torch.export takes modules), whose
  `forward` has the function's signature (so `dynamic_shapes` names its arguments)."""
  if not callable(fn):
    raise BridgeTypeError(
      f"`{API}`: expected a torch.nn.Module or a function, got {type(fn).__name__}."
    )
  try:
    sig: inspect.Signature | None = inspect.signature(fn)
  except (TypeError, ValueError):  # a builtin (`torch.sin`) or a partial of one: no signature
    sig = None

  def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)

  if sig is not None:
    me = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    forward.__signature__ = sig.replace(parameters=[me, *sig.parameters.values()])  # type: ignore[attr-defined]
  name = getattr(fn, "__name__", "function")
  return type(f"Exported_{name}", (torch.nn.Module,), {"forward": forward})()


def _platforms(platforms: Sequence[str] | None) -> tuple[str, ...]:
  if platforms is None:
    return (jax.default_backend(),)
  if isinstance(platforms, str):
    platforms = (platforms,)
  out = tuple(platforms)
  bad = [p for p in out if p not in _PLATFORMS]
  if bad or not out:
    raise BridgeTypeError(
      f"`{API}`: unknown platform(s) {bad or out!r}; use some of {list(_PLATFORMS)}."
    )
  return out


def _check_example(args: tuple, kwargs: dict) -> None:
  leaves = [(f"example_args[{i}]", a) for i, a in enumerate(args)]
  leaves += [(f"example_kwargs[{k!r}]", v) for k, v in kwargs.items()]
  for where, value in leaves:
    if not isinstance(value, torch.Tensor):
      raise BridgeTypeError(
        f"`{API}`: {where} is a {type(value).__name__}; the artifact's inputs are tensors. "
        "Bind other arguments first (functools.partial, or a small wrapper module)."
      )
    if value.layout != torch.strided or value.is_nested:
      raise BridgeTypeError(f"`{API}`: {where} is a {value.layout} tensor; only dense tensors.")


def _check_on_host(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
  """torch.export traces on fake copies of the state and examples, which it cannot make of
  `jax` tensors (their data is a JAX array, not a torch storage): the first one named."""
  state = itertools.chain(module.named_parameters(), module.named_buffers())
  leaves = [(f"the module's {name!r}", t) for name, t in state]
  leaves += [(f"example_args[{i}]", a) for i, a in enumerate(args)]
  leaves += [(f"example_kwargs[{k!r}]", v) for k, v in kwargs.items()]
  for where, t in leaves:
    if t.device.type == tensor_lib.device_type():
      raise BridgeTypeError(
        f"`{API}`: {where} is on the `{t.device}` device; `torch.export` traces the module on "
        "fake copies of its state and examples, which it cannot make of `jax` tensors. Export "
        "it from the CPU (`module.cpu()`, `x.cpu()`); the artifact runs on any JAX platform."
      )


def _torch_export(module: torch.nn.Module, args: tuple, kwargs: dict, dynamic_shapes: Any) -> Any:
  try:
    return torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
  except Exception as e:
    name = type(e).__name__
    text = str(e)
    if "DataDependent" in name or "data-dependent" in text or "data dependent" in text:
      line = _user_line(text)
      raise TracedValueError(
        f"`{API}`: the function's control flow depends on a tensor's value"
        + (f" ({line})" if line else "")
        + ", which one exported program cannot hold. Compute both branches and select "
        "with torch.where, branch with torch.cond (both branches are in the program), or "
        "export each case separately.\ntorch.export said: " + text.strip().splitlines()[0]
      ) from e
    raise


def _user_line(text: str) -> str:
  """The last user-code frame (not torch's or transformers') in torch.export's message."""
  frames = re.findall(r'File "([^"]+)", line (\d+)', text)
  frames = [f for f in frames if "site-packages" not in f[0] and "/torch/" not in f[0]]
  return f"{frames[-1][0]}, line {frames[-1][1]}" if frames else ""


def _decomposition_table() -> dict:
  """torch.export's core-ATen decompositions, less the ops the lowerings cover themselves;
  attention takes its math form (matmuls and softmax, as the torch.compile backend)."""
  REGISTRY.require_plugins()
  table = torch.export.default_decompositions()
  for op in list(table):
    if isinstance(op, torch._ops.OpOverload) and REGISTRY.lookup(op) is not None:
      del table[op]
  table[torch.ops.aten.scaled_dot_product_attention.default] = _sdpa_math
  return table


# ----------------------------------------------------------------------------- interpreting


def _run_graph(gm: torch.fx.GraphModule, inputs: list) -> list:
  """The graph's outputs, each op run by its lowering on JAX arrays (traced or symbolic)."""
  env: dict[torch.fx.Node, Any] = {}
  it = iter(inputs)

  def value(a: Any) -> Any:
    return torch.fx.node.map_arg(a, lambda n: env[n])

  out: list = []
  for node in gm.graph.nodes:
    if node.op == "placeholder":
      env[node] = next(it)
    elif node.op == "call_function":
      args, kwargs = value(node.args), value(node.kwargs)
      try:
        env[node] = _call(node, args, kwargs)
      except BridgeError:
        raise
      except Exception as e:
        raise BridgeError(
          f"`{API}`: {node.target} failed while building the JAX program: "
          f"{type(e).__name__}: {e}{_where(node)}"
        ) from e
    elif node.op == "get_attr":  # a subgraph of a control-flow operator (torch.cond's branches)
      env[node] = operator.attrgetter(node.target)(gm)
    elif node.op == "output":
      result = value(node.args[0])  # (a subgraph may return one bare value: a predicate)
      out = list(result) if isinstance(result, (list, tuple)) else [result]
    else:
      raise BridgeError(f"`{API}`: unexpected graph node {node.op} ({node.target}).")
  return out


# torch's control-flow operators, as JAX's: their subgraphs are interpreted like the graph


def _subgraph(gm: Any) -> Callable[[list], list]:
  return lambda arrays: [dtypes.strong(a) for a in _run_graph(gm, list(arrays))]


def _predicate(pred: Any) -> Any:
  return pred if isinstance(pred, bool) else jnp.reshape(pred, ()).astype(bool)


def _cond(pred: Any, true_gm: Any, false_gm: Any, operands: Any) -> list:
  return jax.lax.cond(
    _predicate(pred), _subgraph(true_gm), _subgraph(false_gm), [dtypes.strong(a) for a in operands]
  )


def _while_loop(cond_gm: Any, body_gm: Any, carried: Any, additional: Any, **kw: Any) -> list:
  if any(kw.values()):
    raise BridgeError(f"`{API}`: while_loop with {sorted(k for k, v in kw.items() if v)}.")
  more = list(additional)
  return jax.lax.while_loop(
    lambda c: _predicate(_run_graph(cond_gm, [*c, *more])[0]),
    lambda c: _subgraph(body_gm)([*c, *more]),
    [dtypes.strong(a) for a in carried],
  )


def _scan(combine_gm: Any, init: Any, xs: Any, additional: Any) -> list:
  n, more = len(init), list(additional)
  if not xs:
    return list(init)

  def step(c: list, x: list) -> tuple[list, list]:
    outs = _subgraph(combine_gm)([*c, *x, *more])
    return outs[:n], outs[n:]

  final, ys = jax.lax.scan(step, [dtypes.strong(a) for a in init], list(xs))
  return [*final, *ys]


def _map(f_gm: Any, xs: Any, pos_args: Any) -> list:
  more = list(pos_args)
  return jax.lax.map(lambda x: _subgraph(f_gm)([*x, *more]), list(xs))


_CONTROL_FLOW: dict[Any, Callable[..., Any]] = {
  torch.ops.higher_order.cond: _cond,
  torch.ops.higher_order.while_loop: _while_loop,
  torch.ops.higher_order.scan: _scan,
  torch.ops.higher_order.map_impl: _map,
}


def _where(node: torch.fx.Node) -> str:
  frame = user_frame(node)
  return "" if frame is None else "\n  at " + " ".join(f for f in frame if f)


def _call(node: torch.fx.Node, args: tuple, kwargs: dict) -> Any:
  target = node.target
  if target in _SYM_FUNCTIONS:
    return _SYM_FUNCTIONS[target](*args, **kwargs)
  if target in _CONTROL_FLOW:
    return _CONTROL_FLOW[target](*args, **kwargs)
  if not isinstance(target, torch._ops.OpOverload):
    raise BridgeError(f"`{API}`: cannot run {target} in a JAX program{_where(node)}.")
  name = target._schema.name.split("::")[-1]
  if name in _NO_OPS:
    return None
  if target is torch.ops.aten.sym_size.int:
    return args[0].shape[args[1]]
  if target is torch.ops.aten.sym_numel.default:
    return _prod(args[0].shape)
  special = _SPECIAL.get(name)
  if special is not None:
    return _conform(special(*args, **kwargs), node.meta.get("val"))
  lowering = REGISTRY.lookup(target) or _copy_twin(target)
  if lowering is None:
    return _decomposed(node, target, args, kwargs)
  if lowering.random:
    raise BridgeError(
      f"`{API}`: {target} draws random numbers; an exported program has no generator. Export "
      f"the module in eval mode (dropout off){_where(node)}."
    )
  out = lowering.fn(*args, **kwargs)
  return _conform(out, node.meta.get("val"))


def _copy_twin(op: Any) -> Any:
  """A view op's lowering: its `_copy` twin's (the graph is functional, so a view's value is
  all that matters)."""
  name = op._schema.name.split("::")[-1]
  twin = getattr(getattr(torch.ops.aten, name + "_copy", None), op._overloadname, None)
  return REGISTRY.lookup(twin) if twin is not None else None


def _to_copy(x: Any, *, dtype: Any = None, **_: Any) -> Any:
  return x if dtype is None else jnp.asarray(x).astype(dtypes.TORCH_TO_JAX[dtype])


def _empty(size: Any, *, dtype: Any = None, **_: Any) -> Any:
  return jnp.zeros(tuple(size), dtypes.TORCH_TO_JAX[dtype or torch.get_default_dtype()])


def _identity(x: Any, *_: Any, **__: Any) -> Any:
  return x


def _item(*_: Any, **__: Any) -> Any:
  raise TracedValueError(
    f"`{API}`: the function reads a tensor's value as a Python number (`.item()`, `int(t)`), "
    "which one exported program cannot hold."
  )


# ops the core handles itself (casts, aliases, host reads), as functions of arrays
_SPECIAL: dict[str, Callable[..., Any]] = {
  "_to_copy": _to_copy,
  "detach": _identity,
  "alias": _identity,
  "lift_fresh_copy": _identity,
  "lift_fresh": _identity,
  "empty": lambda size, **kw: _empty(size, **kw),
  "empty_strided": lambda size, stride, **kw: _empty(size, **kw),
  "_local_scalar_dense": _item,
}


def _decomposed(node: torch.fx.Node, target: Any, args: tuple, kwargs: dict) -> Any:
  decomp = resolve.decomposition(target)
  if decomp is None:
    raise OperatorNotFound(
      f"`{API}`: {target} has no JAX lowering, and the callback fallback (torch running on the "
      "host) cannot be part of a portable artifact. Register a lowering "
      f"(`bridge.register_lowering({target})`) or avoid the op{_where(node)}."
    )
  if any(_symbolic(getattr(a, "shape", ())) for a in jax.tree_util.tree_leaves((args, kwargs))):
    raise BridgeError(
      f"`{API}`: {target} has no JAX lowering of its own, and torch's decomposition of it needs "
      f"concrete sizes; export that dimension as static{_where(node)}."
    )
  return _conform(
    resolve._decomposition_as_lowering(target, decomp)(*args, **kwargs), node.meta.get("val")
  )


def _symbolic(shape: Any) -> bool:
  return any(not isinstance(d, (int, np.integer)) for d in shape)


def _prod(shape: Any) -> Any:
  out: Any = 1
  for d in shape:
    out = out * d
  return out


def _conform(out: Any, expected: Any) -> Any:
  """Cast a lowering's result to the dtype torch.export recorded for the node; refuse a
  shape that differs from torch's where both are known (a lowering's bug: never a wrong
  result)."""
  if isinstance(out, (tuple, list)) and isinstance(expected, (tuple, list)):
    return type(out)(_conform(o, e) for o, e in zip(out, expected))
  if isinstance(expected, torch.Tensor) and hasattr(out, "dtype"):
    shape = tuple(out.shape)
    if all(isinstance(n, int) for n in expected.shape) and expected.numel() == 0:
      # an empty result torch gives where the lowering fills one (batch norm's saved
      # statistics in eval mode): torch's, which has no values to differ in
      return jnp.zeros(tuple(expected.shape), dtypes.TORCH_TO_JAX[expected.dtype])
    if len(shape) != expected.dim() or any(
      isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(shape, expected.shape)
    ):
      raise BridgeError(
        f"`{API}`: a lowering returned shape {shape} where torch gives "
        f"{tuple(expected.shape)}. This is a bug in the lowering; please report it."
      )
    want = dtypes.TORCH_TO_JAX.get(expected.dtype)
    if want is not None and np.dtype(out.dtype) != want:
      return jnp.asarray(out).astype(want)
  return out


# ----------------------------------------------------------------------------- building


def _refuse_mutations(sig: Any) -> None:
  """An exported program is pure: refuse a function that updates a buffer or an input in
  place, naming them (torch.export's signature maps graph outputs to what they overwrite)."""
  buffers = sorted(sig.buffers_to_mutate.values())
  if buffers:
    raise BridgeError(
      f"`{API}`: the module updates its buffers {buffers} in place (a BatchNorm in training "
      "mode updates its running statistics on every call); an exported program is pure and "
      "cannot. Export the module in eval mode: `module.eval()` before `bridge.export` (a "
      "BatchNorm then uses its running statistics), or move the update out of `forward`."
    )
  inputs = sorted(getattr(sig, "user_inputs_to_mutate", {}).values())
  if inputs:
    raise BridgeError(
      f"`{API}`: the function updates its input(s) {inputs} in place (`x.add_(...)`, "
      "`x[i] = ...`); an exported program is pure and cannot. Compute a new tensor "
      "(`x = x + ...`) and return it."
    )


@dataclasses.dataclass
class _Weight:
  name: str
  kind: str  # "parameter", "buffer" (persistent), "constant" (non-persistent buffer, lifted)
  value: np.ndarray
  trainable: bool  # a floating-point parameter that requires grad (what torch's optimizer takes)


class _Builder:
  """An ExportedProgram (decomposed) -> `Exported`."""

  def __init__(self, ep: Any, module: torch.nn.Module, args: tuple, kwargs: dict, dyn: Any):
    self.ep, self.module, self.args, self.kwargs, self.dyn = ep, module, args, kwargs, dyn

  def build(self, platforms: tuple[str, ...], vjp_order: int) -> "Exported":
    ep = self.ep
    sig = ep.graph_signature
    _refuse_mutations(sig)
    weights, aliases, sources = self._weights()
    placeholders = [n for n in ep.graph_module.graph.nodes if n.op == "placeholder"]
    user = [n for n in placeholders if n.name in set(sig.user_inputs)]
    names = self._symbol_names(user)
    inputs = [_input_manifest(n, names) for n in user]
    symbols = _symbols(ep, names)
    scope = jax.export.SymbolicScope(_constraints(symbols))
    shapes = [
      jax.ShapeDtypeStruct(_jax_shape(i["shape"], scope), np.dtype(i["dtype"])) for i in inputs
    ]
    order = [w.name for w in weights]
    index = {name: i for i, name in enumerate(order)}
    gm = ep.graph_module

    def program(*flat: Any) -> tuple:
      ws, xs = flat[: len(order)], flat[len(order) :]
      feed = [ws[index[s]] for s in sources] + list(xs)
      return tuple(_run_graph(gm, feed))

    w_shapes = [jax.ShapeDtypeStruct(w.value.shape, w.value.dtype) for w in weights]
    checks.install_checks()
    with jax.enable_x64(True):
      try:
        exported = jax.export.export(jax.jit(program), platforms=platforms)(*w_shapes, *shapes)
      except BridgeError:
        raise
    outputs = _tree_json(ep.call_spec.out_spec)
    in_spec = ep.call_spec.in_spec
    positional = in_spec.children()[0].num_children if in_spec is not None else len(user)
    keywords = list(in_spec.children()[1].context) if in_spec is not None else []
    manifest = {
      "format": FORMAT,
      "versions": _versions(),
      "platforms": list(platforms),
      "vjp_order": vjp_order,
      "inputs": inputs,
      "positional": positional,
      "keywords": keywords,
      "keyword_order": _keyword_order(self.module, positional, keywords),
      "outputs": outputs,
      "output_names": _leaf_names(outputs),
      "symbols": symbols,
      "weights": [
        {
          "name": w.name,
          "kind": w.kind,
          "trainable": w.trainable,
          "dtype": str(w.value.dtype),
          "shape": list(w.value.shape),
        }
        for w in weights
      ],
      "aliases": aliases,
    }
    with jax.enable_x64(True):  # (int64 buffers stay int64)
      arrays = {w.name: jnp.asarray(w.value) for w in weights}
    return Exported(exported, arrays, manifest)

  def _weights(self) -> tuple[list[_Weight], dict[str, str], list[str]]:
    """The weights (unique tensors), aliases (tied name -> its first name), and for each
    non-user placeholder the weight that feeds it."""
    ep = self.ep
    kinds = torch.export.graph_signature.InputKind
    weights: list[_Weight] = []
    aliases: dict[str, str] = {}
    sources: list[str] = []
    seen: dict[tuple, str] = {}
    for spec in ep.graph_signature.input_specs:
      if spec.kind == kinds.USER_INPUT:
        continue
      if spec.kind == kinds.PARAMETER:
        kind, t = "parameter", ep.state_dict[spec.target]
      elif spec.kind == kinds.BUFFER:
        if spec.persistent:
          kind, t = "buffer", ep.state_dict[spec.target]
        else:
          kind, t = "constant", ep.constants[spec.target]
      elif spec.kind == kinds.CONSTANT_TENSOR:
        kind, t = "constant", ep.constants[spec.target]
      else:
        raise BridgeError(
          f"`{API}`: the function holds a {spec.kind.name} ({spec.target}); only tensors can be exported."
        )
      key = (
        t.untyped_storage().data_ptr(),
        t.storage_offset(),
        tuple(t.shape),
        t.stride(),
        t.dtype,
      )
      first = seen.get(key)
      if first is not None and t.numel():
        aliases[spec.target] = first
        sources.append(first)
        continue
      seen[key] = spec.target
      trainable = (
        kind == "parameter" and t.requires_grad and (t.is_floating_point() or t.is_complex())
      )
      weights.append(_Weight(spec.target, kind, _numpy(t.detach()), trainable))
      sources.append(spec.target)
    return weights, aliases, sources

  def _symbol_names(self, user: list) -> dict[str, str]:
    """torch's symbol (s0, ...) -> the user's `Dim` name, where the dynamic shapes name one."""
    specs = _flat_dynamic_shapes(self.module, self.args, self.kwargs, self.dyn)
    names: dict[str, str] = {}
    for node, spec in zip(user, specs):
      shape = node.meta["val"].shape
      axes = spec.items() if isinstance(spec, dict) else enumerate(spec or ())
      for axis, dim in axes:
        name = getattr(dim, "__name__", None)
        if name is None or not isinstance(shape[axis], torch.SymInt):
          continue
        expr = shape[axis].node.expr
        if getattr(expr, "is_Symbol", False) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
          names[str(expr)] = name
    return names


def _numpy(t: torch.Tensor) -> np.ndarray:
  t = t.cpu().contiguous()
  if t.dtype == torch.bfloat16:
    return t.view(torch.int16).numpy().view(dtypes.TORCH_TO_JAX[torch.bfloat16]).copy()
  return t.numpy().copy()


def _flat_dynamic_shapes(module: torch.nn.Module, args: tuple, kwargs: dict, dyn: Any) -> list:
  """Each user input's per-axis spec (dict or sequence of Dims), in the graph's input order."""
  n = len(args) + len(kwargs)
  if dyn is None:
    return [None] * n
  if isinstance(dyn, dict):
    try:
      bound = inspect.signature(module.forward).bind(*args, **kwargs)
    except TypeError:
      return [None] * n
    by_name = {}
    for name, value in bound.arguments.items():
      param = bound.signature.parameters[name]
      if param.kind == param.VAR_POSITIONAL:
        specs = dyn.get(name) or [None] * len(value)
        for v, s in zip(value, specs):
          by_name[id(v)] = s
      elif param.kind == param.VAR_KEYWORD:
        for k, v in value.items():
          by_name[id(v)] = (dyn.get(name) or {}).get(k, dyn.get(k))
      else:
        by_name[id(value)] = dyn.get(name)
    return [by_name.get(id(a)) for a in (*args, *kwargs.values())]
  specs = list(dyn)
  return (specs + [None] * n)[:n]


def _input_manifest(node: torch.fx.Node, names: dict[str, str]) -> dict:
  val = node.meta["val"]
  return {
    "name": node.name,
    "dtype": str(np.dtype(dtypes.TORCH_TO_JAX[val.dtype])),
    "shape": [_dim(d, names) for d in val.shape],
  }


def _dim(d: Any, names: dict[str, str]) -> int | str:
  if isinstance(d, int):
    return d
  expr = d.node.expr
  text = str(expr)
  for sym in sorted(expr.free_symbols, key=lambda s: -len(str(s))):
    text = re.sub(rf"\b{re.escape(str(sym))}\b", names.get(str(sym), str(sym)), text)
  return text


def _symbols(ep: Any, names: dict[str, str]) -> dict[str, dict]:
  """Each symbolic dimension's name -> its range ({"min": int, "max": int or None})."""
  out = {}
  for sym, vr in ep.range_constraints.items():
    if not getattr(sym, "is_Symbol", False):
      continue  # a derived dimension (`2 * batch`): its range follows from its symbol's
    name = names.get(str(sym), str(sym))
    low = max(_bound(vr.lower) or 1, 1)
    high = _bound(vr.upper)
    out[name] = {"min": low, "max": high}
  return out


def _bound(v: Any) -> int | None:
  """A range bound as an int; None for torch's infinities."""
  if str(v) in ("oo", "-oo", "int_oo", "-int_oo"):
    return None
  try:
    return int(v)
  except Exception:  # noqa: BLE001 - another spelling of infinity
    return None


def _constraints(symbols: dict[str, dict]) -> list[str]:
  out = []
  for name, r in symbols.items():
    if r["min"] > 1:
      out.append(f"{name} >= {r['min']}")
    if r["max"] is not None:
      out.append(f"{name} <= {r['max']}")
  return out


def _keyword_order(module: torch.nn.Module, positional: int, keywords: list[str]) -> list[str]:
  """The keyword inputs in the order the function's signature takes them by position after its
  first `positional` (how `exported(x, a, b)` binds `a` and `b`; the example's keywords are in
  the order they were given, which need not be the signature's)."""
  try:
    params = list(inspect.signature(module.forward).parameters.values())
  except (TypeError, ValueError):
    return []
  names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  return list(itertools.takewhile(lambda n: n in keywords, names[positional:]))


def _jax_shape(shape: list, scope: Any) -> tuple:
  if not any(isinstance(d, str) for d in shape):
    return tuple(shape)
  spec = ", ".join(str(d) for d in shape)
  return tuple(jax.export.symbolic_shape(spec, scope=scope))


def _tree_json(spec: Any) -> dict:
  """A torch pytree spec of the outputs as JSON: tensors, sequences and named fields (dicts,
  Hugging Face `ModelOutput`s and named tuples become dicts of arrays). Each container
  records its Python type ("container": list, tuple, dict or OrderedDict) for `_unflatten`."""
  if spec is None or spec.is_leaf():
    return {"kind": "array"}
  children = [_tree_json(c) for c in spec.children()]
  t = spec.type
  context = spec.context
  if isinstance(context, type) and hasattr(context, "_fields"):
    t = context  # a named tuple: torch's spec has `namedtuple` as its type, the class here
  if t in (tuple, list) or (
    isinstance(t, type) and issubclass(t, tuple) and not hasattr(t, "_fields")
  ):
    return {"kind": "list", "container": "list" if t is list else "tuple", "items": children}
  if t is type(None):
    return {"kind": "none"}
  if hasattr(t, "_fields"):  # a named tuple
    keys = list(t._fields)
  elif dataclasses.is_dataclass(t) and isinstance(context, (list, tuple)) and len(context) == 2:
    # (torch's context of a registered dataclass: the fields it flattens, the fields None)
    fields, nones = list(context[0]), list(context[1])
    keys = fields + nones
    children += [{"kind": "none"}] * len(nones)
  elif isinstance(context, (list, tuple)):
    keys = [k if type(k) in (str, int) else str(k) for k in context]
  else:
    keys = None
  if keys is None or len(keys) != len(children):
    raise BridgeTypeError(
      f"`{API}`: the function returns a {getattr(t, '__name__', t)}; outputs must be tensors, tuples, lists, "
      "dicts, named tuples or dataclasses of them."
    )
  container = "OrderedDict" if t is collections.OrderedDict else "dict"
  return {"kind": "dict", "container": container, "keys": keys, "items": children}


def _leaf_names(tree: dict, prefix: str = "output") -> list[str]:
  if tree["kind"] == "array":
    return [prefix]
  if tree["kind"] == "none":
    return []
  if tree["kind"] == "list":
    return [n for i, c in enumerate(tree["items"]) for n in _leaf_names(c, f"{prefix}.{i}")]
  if prefix == "output":
    return [n for k, c in zip(tree["keys"], tree["items"]) for n in _leaf_names(c, k)]
  return [n for k, c in zip(tree["keys"], tree["items"]) for n in _leaf_names(c, f"{prefix}.{k}")]


def _unflatten(tree: dict, leaves: Any) -> Any:
  """The outputs' structure from the manifest's tree; a tree without "container" records
  (an artifact of an older bridge) gives tuples and dicts, as that bridge did."""
  if tree["kind"] == "array":
    return next(leaves)
  if tree["kind"] == "none":
    return None
  items = [_unflatten(c, leaves) for c in tree["items"]]
  container = tree.get("container")
  if tree["kind"] == "list":
    return list(items) if container == "list" else tuple(items)
  if container == "OrderedDict":
    return collections.OrderedDict(zip(tree["keys"], items))
  return dict(zip(tree["keys"], items))


def _refuse_recorded_inputs(leaves: list) -> None:
  """An artifact's call records no torch gradient: a tensor that requires grad would find its
  gradient silently cut (the program runs in JAX on a copy of its values), so it is refused."""
  for i, x in enumerate(leaves):
    if isinstance(x, torch.Tensor) and x.requires_grad:
      raise BridgeError(
        f"`{API}`: input {i} of the exported program requires grad, but an artifact's call is "
        "not recorded by torch autograd (it runs the JAX program on the input's values), so "
        "its gradient would be lost. Call it under `torch.no_grad()` (or pass `x.detach()`) "
        "for inference; for gradients, differentiate `exported.apply` with `jax.grad` "
        "(exported with vjp_order >= 1), or train the torch module with `bridge.compile`."
      )


def _map_outputs(fn: Callable[[Any], Any], out: Any) -> Any:
  """`fn` on each array of `_unflatten`'s outputs, their containers as they are (a dict's keys
  in their order: `jax.tree_util` would sort them)."""
  if isinstance(out, dict):
    return type(out)((k, _map_outputs(fn, v)) for k, v in out.items())
  if isinstance(out, (list, tuple)):
    return type(out)(_map_outputs(fn, v) for v in out)
  return out if out is None else fn(out)


def _versions() -> dict[str, str]:
  try:
    bridge_version = importlib.metadata.version("bridge")
  except importlib.metadata.PackageNotFoundError:  # (run from a source tree)
    bridge_version = "unknown"
  return {
    "bridge": bridge_version,
    "torch": torch.__version__,
    "jax": jax.__version__,
    "jaxlib": jaxlib.__version__,
  }


# ----------------------------------------------------------------------------- the artifact


class Exported:
  """A torch model exported as a JAX program with its weights (`bridge.export`/`bridge.load`).

  - ``exported(*args, **kwargs)``: torch tensors in, torch tensors out; JAX arrays (or NumPy)
    in, JAX arrays out. Outputs keep the function's structure; named fields (dicts, Hugging
    Face outputs) become dicts.
  - ``exported.apply(weights, *args, **kwargs)``: the same as a pure JAX function of the
    weights (a dict name -> array, as `exported.weights`): `jax.jit`-able, and
    `jax.grad`-able (a loaded artifact: when exported with ``vjp_order >= 1``).
  - ``exported.state_dict(weights)``: weights as torch tensors under every name the module
    has for them (tied ones too), for `module.load_state_dict`.
  - ``exported.save(path)``; ``exported.program``: the `jax.export.Exported`.

  `jax.vmap` does not apply (JAX has no batching rule for an exported program): export with a
  dynamic batch dimension instead.
  """

  def __init__(self, program: Any, weights: dict[str, jax.Array], manifest: dict):
    self.program = program
    self.weights = weights
    self.manifest = manifest
    self._order = [w["name"] for w in manifest["weights"]]
    self._call = jax.jit(_differentiable(program))  # (compiled once per input shape)

  def __repr__(self) -> str:
    ins = ", ".join(f"{i['name']}: {i['dtype']}{i['shape']}" for i in self.manifest["inputs"])
    return f"bridge.Exported({ins}; {len(self._order)} weights; {self.manifest['platforms']})"

  # -- calling

  def _flat_inputs(self, args: tuple, kwargs: dict, exact: bool = False) -> list:
    m = self.manifest
    positional, keywords = m["positional"], m["keywords"]
    unknown = [k for k in kwargs if k not in keywords]
    if unknown and len(args) < positional:
      raise BridgeTypeError(
        f"`{API}`: keyword input(s) {unknown} given, but the exported function's first "
        f"{positional} inputs are positional: pass them by position, not by keyword "
        f"(`exported(x, ...)`); its keyword inputs are {keywords}."
      )
    if len(args) < positional:
      raise BridgeTypeError(
        f"`{API}`: the exported function takes {positional} positional inputs, got {len(args)}."
      )
    flat = list(args[:positional])
    # (by the signature's order: an artifact of an older bridge has none, and binds by keyword)
    order = m.get("keyword_order", [])
    if len(args) - positional > len(order):
      raise BridgeTypeError(
        f"`{API}`: the exported function takes {positional + len(order)} inputs by position, "
        f"got {len(args)}; pass its keyword inputs {keywords} by keyword."
      )
    extra = dict(zip(order, args[positional:]))
    for k, v in kwargs.items():
      if k not in keywords:
        raise BridgeTypeError(
          f"`{API}`: unexpected keyword input {k!r}; the exported function's keyword inputs "
          f"are {keywords}."
        )
      extra[k] = v
    missing = [k for k in keywords if k not in extra]
    if missing:
      raise BridgeTypeError(f"`{API}`: missing keyword input(s) {missing}.")
    flat += [extra[k] for k in keywords]
    self._check_shapes(flat, exact)
    return flat

  def _check_shapes(self, flat: list, exact: bool) -> None:
    """Each input's dtype and shape against the manifest, naming the dimension that breaks.
    Dtypes must match (`exact`: torch's inputs) or be JAX's 32-bit type of a 64-bit one
    (int32 ids for an int64 input: JAX without 64-bit types)."""
    m = self.manifest
    bound: dict[str, tuple[int, str]] = {}
    for x, spec in zip(flat, m["inputs"]):
      name = spec["name"]
      if not (isinstance(x, (int, float, complex, np.generic)) or hasattr(x, "shape")):
        got = type(x).__name__
        raise BridgeTypeError(
          f"`{API}`: input {name!r} is a {got}; the program takes a tensor there (torch, JAX or "
          f"NumPy) of shape {tuple(spec['shape'])} and dtype {spec['dtype']}: pass one tensor, "
          f"not a {got}."
        )
      shape = tuple(getattr(x, "shape", ()))
      if len(shape) != len(spec["shape"]):
        raise BridgeTypeError(
          f"`{API}`: input {name!r} has shape {shape}; the program takes {len(spec['shape'])} "
          f"dimensions {tuple(spec['shape'])}."
        )
      for axis, (got, want) in enumerate(zip(shape, spec["shape"])):
        where = f"input {name!r} dimension {axis}"
        if isinstance(want, int):
          if got != want:
            raise BridgeTypeError(
              f"`{API}`: {where} is {got}; it was exported as static {want} (name it in "
              "`dynamic_shapes` to vary it)."
            )
          continue
        r = m["symbols"].get(want)
        if r is None:
          continue  # an expression of symbols: jax.export checks it
        if got < r["min"] or (r["max"] is not None and got > r["max"]):
          hi = "" if r["max"] is None else f"..{r['max']}"
          raise BridgeTypeError(
            f"`{API}`: {where} ({want!r}) is {got}, outside the exported range "
            f"{r['min']}{hi or '..'}."
          )
        other = bound.setdefault(want, (got, where))
        if other[0] != got:
          raise BridgeTypeError(
            f"`{API}`: {where} ({want!r}) is {got}, but {other[1]} gave {want!r} = {other[0]}."
          )
      dtype = getattr(x, "dtype", None)
      if dtype is not None and not isinstance(dtype, torch.dtype):
        got_dtype, want_dtype = np.dtype(dtype), np.dtype(spec["dtype"])
        if got_dtype != want_dtype and (exact or not _widens(got_dtype, want_dtype)):
          raise BridgeTypeError(
            f"`{API}`: input {name!r} has dtype {_dtype_name(got_dtype, exact)}; the program "
            f"takes {_dtype_name(want_dtype, exact)} (it was exported with that dtype: convert "
            "the input, or export again with an input of this dtype)."
          )

  def apply(self, weights: Weights, *args: Any, **kwargs: Any) -> Any:
    """The program as a pure JAX function of `weights` and the inputs.

    Args:
      weights: a dict name -> array, as `exported.weights`; or the pair
        ``(trainable, rest)`` that `split_weights` gives, for `jax.grad` of the trainable ones.
      *args: the inputs, as the exported function takes them.
      **kwargs: its keyword inputs.

    Returns:
      The outputs as JAX arrays, in the function's structure.
    """
    return self._apply(weights, args, kwargs, exact=False)

  def _apply(self, weights: Weights, args: tuple, kwargs: dict, exact: bool) -> Any:
    merged = _merge_weights(weights)
    missing = [n for n in self._order if n not in merged]
    if missing:
      raise BridgeTypeError(
        f"`{APPLY}`: weights lack {missing[:5]}{'...' if len(missing) > 5 else ''}; pass "
        "every name of `exported.weights` (or the pair `exported.split_weights()` gives)."
      )
    known = set(self._order)
    unknown = [n for n in merged if n not in known]
    if unknown:
      raise BridgeTypeError(
        f"`{APPLY}`: weights has name(s) the program does not take: "
        f"{unknown[:5]}{'...' if len(unknown) > 5 else ''}; pass exactly the names of "
        "`exported.weights` (or the pair `exported.split_weights()` gives)."
      )
    flat = self._flat_inputs(args, kwargs, exact)
    with jax.enable_x64(True):
      ws = [_weight_array(merged[w["name"]], w) for w in self.manifest["weights"]]
      xs = [
        jnp.asarray(x, dtype=np.dtype(s["dtype"])) for x, s in zip(flat, self.manifest["inputs"])
      ]
      outs = self._call(*ws, *xs)
    return _unflatten(self.manifest["outputs"], iter(outs))

  def split_weights(self, weights: Weights | None = None) -> tuple[dict, dict]:
    """`weights` (default: `exported.weights`) as ``(trainable, rest)``, for fine-tuning.

    ``trainable`` holds the floating-point parameters that required grad in torch (what
    `jax.grad` and an optimizer take); ``rest`` the buffers and constants, which stay as they
    are (BatchNorm's running statistics, and its int64 ``num_batches_tracked``, which
    `jax.grad` refuses). `apply` and `state_dict` take the pair as they take one dict.

    Example:
      >>> import jax, jax.numpy as jnp, torch, bridge
      >>> model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).eval()
      >>> exported = bridge.export(model, torch.randn(4, 3))
      >>> params, rest = exported.split_weights()
      >>> sorted(params)
      ['0.bias', '0.weight', '1.bias', '1.weight']
      >>> grads = jax.grad(lambda p: exported.apply((p, rest), jnp.ones((4, 3))).sum())(params)
    """
    merged = _merge_weights(self.weights if weights is None else weights)
    trainable = {w["name"] for w in self.manifest["weights"] if _trainable(w)}
    return (
      {n: a for n, a in merged.items() if n in trainable},
      {n: a for n, a in merged.items() if n not in trainable},
    )

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    """Runs the program with the artifact's own weights: torch tensors in give torch tensors
    out (on the inputs' device), JAX arrays in give JAX arrays out."""
    leaves = [*args, *kwargs.values()]
    from_torch = any(isinstance(x, torch.Tensor) for x in leaves)
    if from_torch:
      if torch.is_grad_enabled():
        _refuse_recorded_inputs(leaves)
      device = next(x.device for x in leaves if isinstance(x, torch.Tensor))
      with jax.enable_x64(True):  # torch's dtypes exactly (int64 ids stay int64)
        args = tuple(_to_jax(x) for x in args)
        kwargs = {k: _to_jax(v) for k, v in kwargs.items()}
        out = self._apply(self.weights, args, kwargs, exact=True)
        return _map_outputs(
          lambda a: transfer.array_to_torch(a, copy=None, api=API, where=lambda: "an output").to(
            device
          ),
          out,
        )
    return self.apply(self.weights, *args, **kwargs)

  # -- torch

  def state_dict(self, weights: Weights | None = None) -> dict[str, torch.Tensor]:
    """The parameters and persistent buffers as CPU tensors under the module's names (tied
    names too): ``module.load_state_dict(exported.state_dict(trained))``; `weights` is a dict
    or `split_weights`' pair."""
    weights = self.weights if weights is None else _merge_weights(weights)
    kinds = {w["name"]: w["kind"] for w in self.manifest["weights"]}
    out = {}
    for name, kind in kinds.items():
      if kind != "constant":
        out[name] = transfer.array_to_torch(
          jnp.asarray(weights[name]), copy=True, api=API, where=lambda: f"weight {name!r}"
        )
    for alias, first in self.manifest["aliases"].items():
      if first in out:
        out[alias] = out[first]
    return out

  # -- files

  def save(self, path: str | os.PathLike) -> None:
    """Writes the artifact directory (program, weights, manifest); see `bridge.load`."""
    from safetensors.numpy import save_file  # (import cost: only when saving)

    os.makedirs(path, exist_ok=True)
    with jax.enable_x64(True):  # (`serialize` traces the VJPs: with the program's 64-bit types)
      program = self.program.serialize(vjp_order=self.manifest["vjp_order"])
    weights_path = os.path.join(path, WEIGHTS_FILE)
    save_file({n: np.asarray(self.weights[n]) for n in self._order}, weights_path)
    with open(os.path.join(path, PROGRAM_FILE), "wb") as f:
      f.write(program)
    manifest = dict(self.manifest)
    manifest["sha256"] = {
      PROGRAM_FILE: hashlib.sha256(bytes(program)).hexdigest(),
      WEIGHTS_FILE: _sha256(weights_path),
    }
    with open(os.path.join(path, MANIFEST_FILE), "w") as f:
      json.dump(manifest, f, indent=1)


def _merge_weights(weights: Any) -> dict[str, Any]:
  """One dict name -> array from a dict or `split_weights`' pair ``(trainable, rest)``."""
  if isinstance(weights, dict):
    return weights
  if (
    isinstance(weights, (tuple, list))
    and len(weights) == 2
    and all(isinstance(w, dict) for w in weights)
  ):
    both = sorted(set(weights[0]) & set(weights[1]))
    if both:
      raise BridgeTypeError(
        f"`{APPLY}`: weights {both[:5]} are in both dicts of the pair; each name goes in one "
        "(`exported.split_weights()` splits them)."
      )
    return {**weights[1], **weights[0]}
  raise BridgeTypeError(
    f"`{APPLY}`: weights must be a dict name -> array (as `exported.weights`) or the pair "
    f"(trainable, rest) that `exported.split_weights()` gives; got a {type(weights).__name__}."
  )


def _trainable(spec: dict) -> bool:
  """A manifest weight's "trainable" (an artifact of an older bridge lacks it: its
  floating-point parameters)."""
  if "trainable" in spec:
    return bool(spec["trainable"])
  return spec["kind"] == "parameter" and np.dtype(spec["dtype"]).kind in "fc"


def _weight_array(value: Any, spec: dict) -> Any:
  """One weight as the program takes it, checked against its manifest entry: its shape
  exactly, its dtype exactly or as JAX's 32-bit type of a 64-bit one (cast back)."""
  name, want_shape, want = spec["name"], tuple(spec["shape"]), np.dtype(spec["dtype"])
  if isinstance(value, torch.Tensor):
    value = _to_jax(value)
  if not (hasattr(value, "shape") and hasattr(value, "dtype")):
    raise BridgeTypeError(
      f"`{APPLY}`: weight {name!r} is a {type(value).__name__}; the program takes an array "
      f"of shape {want_shape} and dtype {want} (as `exported.weights[{name!r}]`)."
    )
  shape = tuple(value.shape)
  if shape != want_shape:
    raise BridgeTypeError(
      f"`{APPLY}`: weight {name!r} has shape {shape}; the program takes {want_shape}, its shape "
      "when exported. Pass an array of that shape (as `exported.weights` holds), or export "
      "again from a module with the new shape."
    )
  got = np.dtype(value.dtype)
  if got != want and not _widens(got, want):
    raise BridgeTypeError(
      f"`{APPLY}`: weight {name!r} has dtype {got}; the program takes {want}, its dtype when "
      f"exported. Convert it (`.astype(jnp.{want})`), or export again from the module in "
      f"{got}."
    )
  return jnp.asarray(value, dtype=want)


def _differentiable(program: Any) -> Callable[..., Any]:
  """`program.call`, whose derivatives are built with JAX's 64-bit types on, as the program
  was. (`jax.export` traces a program's VJP when a derivative or `serialize` first asks for it;
  with 64-bit types off that trace would narrow its float64 and int64 values: float32-precision
  gradients, an int32 argmax where the program returns int64.) Without a VJP (an artifact saved
  with `vjp_order=0`), a derivative says how to save one."""
  if not program.has_vjp():
    plain = jax.custom_jvp(program.call)
    plain.defjvp(_no_derivatives)
    return plain
  vjp: list[Callable[..., Any]] = []  # (exported once, on the first derivative)

  @jax.custom_vjp
  def call(*args: Any) -> tuple:
    return tuple(program.call(*args))

  def forward(*args: Any) -> tuple:
    return call(*args), args

  def backward(args: tuple, cotangents: tuple) -> tuple:
    if not vjp:
      with jax.enable_x64(True):
        vjp.append(_differentiable(program.vjp()))
    return tuple(vjp[0](*args, *cotangents))

  call.defvjp(forward, backward)
  return call


def _no_derivatives(primals: Any, tangents: Any) -> Any:
  raise BridgeError(
    f"`{API}`: this artifact was saved without derivatives (`vjp_order=0`, the default), so "
    "`jax.grad`/`jax.jvp` cannot go through it. Export it again with "
    "`bridge.export(..., vjp_order=1)` (2 for second derivatives) and save that."
  )


def _widens(got: np.dtype, want: np.dtype) -> bool:
  """An input JAX holds narrower without 64-bit types (int32 for int64, float32 for float64,
  complex64 for complex128); not float16 for float32, which no JAX default makes."""
  return got.kind == want.kind and want.itemsize in (8, 16) and got.itemsize * 2 == want.itemsize


def _dtype_name(dtype: np.dtype, torch_names: bool) -> str:
  """`dtype` as the caller knows it: `torch.float16` for a torch caller, `float16` for JAX."""
  if torch_names:
    return str(dtypes.JAX_TO_TORCH.get(dtype, dtype))
  return str(dtype)


def _to_jax(x: Any) -> Any:
  if isinstance(x, torch.Tensor):
    return transfer.tensor_to_jax(x.detach(), api=API, where=lambda: "an input")
  return x


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


# what every manifest of this format holds
_MANIFEST_KEYS = ("weights", "inputs", "outputs", "positional", "keywords", "sha256")


def load(path: str | os.PathLike) -> Exported:
  """An artifact `Exported.save` wrote, checked (format, versions, checksums) before use."""
  from safetensors.numpy import load_file  # (import cost: only when loading)

  manifest_path = os.path.join(path, MANIFEST_FILE)
  try:
    with open(manifest_path) as f:
      manifest = json.load(f)
  except FileNotFoundError:
    raise BridgeError(
      f"`bridge.load`: {manifest_path} does not exist; is {path} an artifact `bridge.export(...).save` wrote?"
    ) from None
  except json.JSONDecodeError as e:
    raise BridgeError(
      f"`bridge.load`: {manifest_path} is not valid JSON ({e}); the artifact is damaged."
    ) from None
  if not isinstance(manifest, dict):
    raise BridgeError(
      f"`bridge.load`: {manifest_path} holds a {type(manifest).__name__}, not an artifact's "
      "manifest; the artifact is damaged."
    )
  fmt = manifest.get("format")
  if type(fmt) is not int or fmt != FORMAT:  # (`true` equals 1 in Python: not a format)
    wrote = manifest.get("versions")
    raise BridgeError(
      f"`bridge.load`: {path} has artifact format {fmt!r}; this bridge "
      f"({_versions()['bridge']}) reads format {FORMAT}. Export it again with this bridge, "
      "or load it with the bridge that wrote it "
      f"({wrote.get('bridge') if isinstance(wrote, dict) else None})."
    )
  missing = [k for k in _MANIFEST_KEYS if k not in manifest]
  if missing:
    raise BridgeError(
      f"`bridge.load`: {manifest_path} lacks {missing}; the artifact is damaged. Export it again."
    )
  for name in (PROGRAM_FILE, WEIGHTS_FILE):
    file = os.path.join(path, name)
    want = manifest.get("sha256", {}).get(name)
    if not os.path.exists(file):
      raise BridgeError(f"`bridge.load`: {file} is missing.")
    if _sha256(file) != want:
      raise BridgeError(
        f"`bridge.load`: {file} does not match the checksum in its manifest: the file is "
        "truncated or was changed after `save`. Export the artifact again."
      )
  with open(os.path.join(path, PROGRAM_FILE), "rb") as f:
    data = f.read()
  try:
    program = jax.export.deserialize(bytearray(data))
  except Exception as e:
    wrote = manifest.get("versions", {}).get("jax")
    raise BridgeError(
      f"`bridge.load`: JAX {jax.__version__} cannot read the program that JAX {wrote} wrote "
      f"({type(e).__name__}: {e})."
    ) from e
  arrays = load_file(os.path.join(path, WEIGHTS_FILE))
  weights = {}
  for w in manifest["weights"]:
    a = arrays.get(w["name"])
    if a is None or list(a.shape) != w["shape"] or str(a.dtype) != w["dtype"]:
      raise BridgeError(f"`bridge.load`: weight {w['name']!r} does not match the manifest.")
    with jax.enable_x64(True):  # (int64 buffers stay int64)
      weights[w["name"]] = jnp.asarray(a)
  return Exported(program, weights, manifest)
