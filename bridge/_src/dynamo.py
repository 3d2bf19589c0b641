"""`torch.compile(model, backend="jax")`: the graphs dynamo captures, run as `jax.jit` programs.

Dynamo hands each captured graph to `backend`, which gives it to torch's `aot_autograd`:
functionalization, the forward/backward partition and the inference graph for calls under
`torch.no_grad()`. Each graph aot_autograd makes (forward, backward or inference, aten ops
only) becomes one `bridge.compile` program (`bridge._src.compile`): traced once per input
structure and shapes by running the graph on `bridge.Tensor`s, each aten op through the
bridge's dispatch (a lowering, torch's decomposition, or the per-op callback fallback), then
cached by `jax.jit`. Its inputs and outputs cross zero-copy; outputs come back on the inputs'
device. A graph that records no gradient skips aot_autograd: dynamo's graph itself, torch-level
ops and all, is the program (`_direct`), which saves aot's tracing and its per-call wrapper.

What torch does around the graphs stays torch's: aot_autograd's runtime applies buffer
updates (BatchNorm's running statistics) and accumulates gradients into `.grad`, dynamo
guards and recompiles, graph breaks run in eager Python between graphs.

`compile_stats()` counts what the backend did; the logger `bridge.backend` says it as it
happens (at INFO: each graph, each program traced, and what changed at a recompile), shown
with `TORCH_LOGS=bridge` (`_bridge_autoload.register_log`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import pathlib
import threading
import warnings
import weakref
from typing import Any, Callable, Sequence, cast

import torch

from bridge._src import compat
from bridge._src import compile as compile_lib
from bridge._src import config as config_lib
from bridge._src import ffi
from bridge._src import rng
from bridge._src import strided
from bridge._src import tensor as tensor_lib
from bridge._src.dispatch import higher_order
from bridge._src.errors import BridgeTypeError

log = logging.getLogger("bridge.backend")

NAME = "jax"

# `torch.compile(..., options={...})`: each option is a setting of `bridge.config`, in force
# while the compiled graphs trace and run.
OPTIONS: dict[str, tuple[type, str]] = {
  "fallback": (str, "what an op with no lowering and no decomposition does: 'callback' or 'error'"),
  "decompose_missing_ops": (bool, "run an op with no lowering through torch's decomposition"),
  "tiered_compile": (bool, "compile a large CPU program quickly first, then fully"),
  "check_indices": (
    bool,
    "check indices and the other values torch checks inside the programs (a host call per "
    "checked op)",
  ),
  "debug_print_each_op": (bool, "print each aten op as the programs trace it"),
  "cpu_convolution": (str, "who convolves in a CPU program: 'torch' (its kernel) or 'xla'"),
}


@dataclasses.dataclass
class CompileStats:
  """What `torch.compile(..., backend="jax")` did in this process (`bridge.compile_stats()`).

  Attributes:
    graphs: graphs dynamo handed to the backend (each graph break and each dynamo
      recompile makes one more).
    direct: those of them that record no gradient and so became programs as dynamo
      captured them, without `aot_autograd`.
    eager: those of them that torch ran itself: a graph that takes an integer from a
      tensor's values (`.item()` under `capture_scalar_outputs`), which no program can.
    programs: JAX programs traced: one per forward, backward or inference graph and
      input shapes/dtypes/static values.
    calls: calls of the compiled graphs.
    cache_hits: calls that ran a program already traced.
    recompiles: for each graph or program made again for code seen before, what changed:
      which input, and its shape, dtype or value before and after.
  """

  graphs: int = 0
  direct: int = 0
  eager: int = 0
  programs: int = 0
  calls: int = 0
  cache_hits: int = 0
  recompiles: list[str] = dataclasses.field(default_factory=list)


_stats = CompileStats()
_stats_lock = threading.Lock()
_frames: dict[int, dict[str, Any]] = {}  # dynamo frame id -> its last graph's input signature


def compile_stats(reset: bool = False) -> CompileStats:
  """A copy of the counts of what `torch.compile(..., backend="jax")` did in this process.

  Args:
    reset: start the counts again from zero (after taking this copy).

  Example:
    >>> import torch, bridge
    >>> f = torch.compile(lambda x: x.sin() + 1, backend="jax")
    >>> _ = bridge.compile_stats(reset=True)
    >>> _ = f(torch.ones(3)); _ = f(torch.ones(3))
    >>> s = bridge.compile_stats()
    >>> (s.graphs, s.programs, s.calls, s.cache_hits)
    (1, 1, 2, 1)
  """
  global _stats
  with _stats_lock:
    out = dataclasses.replace(_stats, recompiles=list(_stats.recompiles))
    if reset:
      _stats = CompileStats()
      _frames.clear()
  return out


def teach_dynamo() -> None:
  """Two things dynamo must know about the bridge, whatever the backend (run at import; it
  imports nothing of dynamo's, which `import torch` leaves unloaded: about 1.3 s).

  * It does not trace the bridge's own code, nor JAX's: an op on a `jax`-device tensor inside
    a function torch.compile traces reaches `bridge.Tensor.__torch_dispatch__` from C, and
    dynamo would otherwise compile the dispatcher's frames as user code (which breaks their
    calls into JAX's C++). Their frames run as they are, like numpy's. Told when dynamo's
    rules load (`compat.after_import`).
  * Libraries the bridge teaches to see its tracing (`compat`: transformers' tracing check)
    are taught as soon as they are loaded, before dynamo reads them: taught later (by the
    bridge's first trace), they would change a function dynamo's guards hold, and the frame
    would be compiled again on its second call.

  And one thing that only saves time: `_name_functions_only_for_logs`; and one that aot_autograd
  needs (`_higher_order_past_aot_check`).
  """
  compat.after_import("torch._dynamo.trace_rules", _skip_own_frames)
  compat.after_import("torch._dynamo.symbolic_convert", _name_functions_only_for_logs)
  compat.after_import(
    "torch._functorch._aot_autograd.runtime_wrappers", _higher_order_past_aot_check
  )
  compat.teach_on_import()


def _skip_own_frames(trace_rules: Any) -> None:
  """Every file of the bridge but `compat` (whose function transformers calls is traced as
  transformers' own), the plugin's, and JAX's."""
  src = pathlib.Path(__file__).resolve().parent
  names = ["bridge", "bridge_ops", "jax", "jaxlib", "ml_dtypes", "opt_einsum"]
  skipped = [
    f"bridge._src.{p.stem}"
    for p in sorted(src.glob("*.py"))
    if p.stem not in ("compat", "__init__")
  ]
  for name in [*skipped, "bridge._src.dispatch", "_bridge_autoload", *names[1:]]:
    trace_rules.add(name)
  # (the packages' own `__init__`s: `add` takes a package's directory, which holds `compat`)
  trace_rules.SKIP_DIRS += [str(src.parent / "__init__.py"), str(src / "__init__.py")]
  trace_rules._recompile_re()


def _name_functions_only_for_logs(symbolic_convert: Any) -> None:
  """Dynamo names the function around each traced line (`get_funcname`) for the headers of
  two debug logs, `trace_call` and `trace_source`, and computes the header of every graph
  node it records whether or not those logs are on: the first name asked of a file
  tokenizes the whole file (for GPT-2's first compile, 0.1-0.15 s of about 0.9: its
  modeling file and torch's). The name is looked up only while one of those logs is on;
  their lines read as before. Skipped where this torch has no such function."""
  original = getattr(symbolic_convert, "get_funcname", None)
  try:
    from torch._logging._internal import log_state
  except ImportError:  # pragma: no cover - another torch
    return
  if not callable(original) or getattr(original, "_only_for_logs", False):
    return
  enabled = log_state.is_artifact_enabled

  def get_funcname(filename: str, lineno: int) -> str | None:
    if enabled("trace_call") or enabled("trace_source"):
      return original(filename, lineno)
    return None

  get_funcname._only_for_logs = True  # type: ignore[attr-defined]
  symbolic_convert.get_funcname = get_funcname


def _higher_order_past_aot_check(runtime_wrappers: Any) -> None:
  """aot_autograd runs a compiled graph's first call under a dispatch mode that checks custom
  ops for aliasing (`_AnalyzeCustomOpInputOutputMode`): it declines the ops of tensor types it
  does not know, which then reach the tensors' own `__torch_dispatch__`; but a higher-order
  operator it declines is handed back to the graph as `NotImplemented` (torch 2.13), so a
  `torch.cond` in a graph of `backend="jax"` failed its first call. The mode checks no such
  operator: for those the bridge implements (`dispatch.higher_order`), it passes the call on.
  For the tensors it knows, that is what it did."""
  mode = getattr(runtime_wrappers, "_AnalyzeCustomOpInputOutputMode", None)
  if mode is None:  # pragma: no cover - another torch
    return
  for op in higher_order.IMPLEMENTATIONS:
    if mode not in op.python_key_table:
      op.py_impl(mode)(functools.partial(_pass_on, op))


def _pass_on(op: Any, mode: Any, *args: Any, **kwargs: Any) -> Any:
  del mode  # (popped by the operator's dispatch)
  return op(*args, **kwargs)


def _settings(options: Any, mode: Any) -> dict[str, Any]:
  """`options` checked against `OPTIONS` (the settings to enter around each call)."""
  if mode not in (None, "default"):
    raise BridgeTypeError(
      f"torch.compile(backend={NAME!r}) has no mode {mode!r}: its modes are inductor's. "
      "Leave `mode` out; the backend's own settings go in `options` "
      f"({', '.join(sorted(OPTIONS))})."
    )
  if options is None:
    return {}
  if not isinstance(options, dict):
    raise BridgeTypeError(
      f"torch.compile(backend={NAME!r}): `options` must be a dict, got {type(options).__name__}."
    )
  settings: dict[str, Any] = {}
  for name, value in options.items():
    if name not in OPTIONS:
      known = "\n".join(f"  {k}: {doc}" for k, (_, doc) in sorted(OPTIONS.items()))
      raise BridgeTypeError(
        f"torch.compile(backend={NAME!r}) has no option {name!r}. Its options:\n{known}"
      )
    kind = OPTIONS[name][0]
    if type(value) is not kind:
      raise BridgeTypeError(
        f"torch.compile(backend={NAME!r}): option {name!r} must be a {kind.__name__}, got "
        f"{value!r}."
      )
    settings[name] = value
  config_lib.config(**cast(config_lib.Settings, settings))  # (its own checks: the fallback's names)
  return settings


def _check_inputs(example_inputs: Sequence[Any]) -> None:
  """Refuse the tensor kinds a JAX program cannot take (sparse, nested, quantized)."""
  for i, x in enumerate(example_inputs):
    if not isinstance(x, torch.Tensor):
      continue
    kind = (
      "sparse"
      if x.is_sparse or x.layout not in (torch.strided,)
      else "nested"
      if x.is_nested
      else "quantized"
      if x.is_quantized
      else None
    )
    if kind is not None:
      raise BridgeTypeError(
        f"torch.compile(backend={NAME!r}): graph input {i} is a {kind} tensor "
        f"({x.layout}, {x.dtype}); JAX programs take dense tensors. Convert it first "
        "(`x.to_dense()`, `x.dequantize()`), or compile with another backend."
      )


def _signature(names: Sequence[str], inputs: Sequence[Any]) -> dict[str, Any]:
  """What a recompile may differ in, for each input by name: shape and dtype, or a value."""
  sig: dict[str, Any] = {}
  for name, x in zip(names, inputs):
    if isinstance(x, torch.Tensor):  # (sizes as text: a symbolic one must not be compared)
      sig[name] = (tuple([str(n) for n in x.shape]), x.dtype)
    else:
      sig[name] = ("value", str(x))
  return sig


def _changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
  """What differs between two input signatures, input by input; inputs that are new or gone
  are counted, with the first few named (another model through the same code: a hundred)."""
  out = []
  added = [name for name in new if name not in old]
  gone = [name for name in old if name not in new]
  for name in new:
    if name not in old:
      continue
    if old[name] != new[name]:
      a, b = old[name], new[name]
      if a[0] == "value" or b[0] == "value":
        out.append(f"{name}: value {a[-1]} -> {b[-1]}")
      elif a[0] != b[0]:
        out.append(f"{name}: shape ({', '.join(a[0])}) -> ({', '.join(b[0])})")
      else:
        out.append(f"{name}: dtype {a[1]} -> {b[1]}")
  for names, what in ((added, "new"), (gone, "gone")):
    if len(names) == 1:
      out.append(f"{names[0]} is {what}")
    elif names:
      shown = ", ".join(names[:_NAMED])
      more = f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
      out.append(f"{len(names)} inputs are {what}: {shown}{more}")
  return out


_NAMED = 3  # inputs named in a recompile's "new"/"gone" line


def _note_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> int:
  """Counts a graph from dynamo; for a frame dynamo compiles again, records what changed."""
  names = [str(n.target) for n in gm.graph.nodes if n.op == "placeholder"]
  sig = _signature(names, example_inputs)
  compile_id = torch._guards.CompileContext.current_compile_id()
  frame = getattr(compile_id, "frame_id", None)
  with _stats_lock:
    _stats.graphs += 1
    number = _stats.graphs
    if frame is not None:
      old = _frames.get(frame)
      if old is not None and getattr(compile_id, "frame_compile_id", None):
        what = "; ".join([*_dynamo_reason(), *_changes(old, sig)]) or "a guard failed"
        _stats.recompiles.append(f"graph {number} (dynamo recompiled {_code_name(gm)}): {what}")
        log.info("recompile: %s", _stats.recompiles[-1])
      _frames[frame] = sig
      if len(_frames) > 4096:  # (the oldest frames' signatures: a recompile there says less)
        del _frames[next(iter(_frames))]
  log.info("graph %d: %s, %d inputs", number, _code_name(gm), len(example_inputs))
  return number


def _dynamo_reason() -> list[str]:
  """The guard that failed, as dynamo gives it for this recompile (its metrics; none when
  torch no longer keeps it there)."""
  try:
    metrics = torch._dynamo.utils.get_metrics_context()._metrics
    reason = metrics.get("recompile_reason")
  except Exception:  # noqa: BLE001 - a private place of torch's: only for the message
    return []
  if not isinstance(reason, str) or not reason:
    return []
  first = reason.strip().splitlines()[0].split("  #")[0].strip()  # the guard, not its source
  return [f"guard {first}"]


_graphs: "weakref.WeakSet[_Graph]" = weakref.WeakSet()


def wait_optimized() -> None:
  """Blocks until every program the backend compiled so far runs with XLA's full optimization
  (a large CPU program first runs quickly compiled: `Compiled.wait_optimized`)."""
  for graph in list(_graphs):
    graph.compiled.wait_optimized()


class _Graph:
  """One graph as a `bridge.compile` program, called with its flat arguments: an aot_autograd
  graph (forward, backward or inference, aten ops only), or dynamo's own for a call that
  records no gradient (`direct`: torch-level ops, each run through the bridge's dispatch as
  `bridge.compile` runs a module)."""

  def __init__(
    self, gm: torch.fx.GraphModule, kind: str, number: int, settings: dict, direct: bool = False
  ):
    self.gm, self.kind, self.number, self.settings = gm, kind, number, settings
    _graphs.add(self)
    outputs = gm.graph.find_nodes(op="output")[0].args[0]
    self.single = isinstance(outputs, (tuple, list)) and len(outputs) == 1
    if direct:
      _for_the_program(gm)
    else:
      _for_the_jax_device(gm)
    key = "example_value" if direct else "val"  # (where dynamo and aot keep fake values)
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    # Numbers the graph only passes on or ignores (a view input's symbolic storage offset and
    # size, saved by the forward for the backward): not arguments of the program, where each
    # new value would be a static one, traced and compiled again (a batch sliced at a new
    # offset every step); the passthrough below returns them as they came.
    self.idle = {
      i
      for i, p in enumerate(placeholders)
      if isinstance(p.meta.get(key), torch.SymInt) and all(u.op == "output" for u in p.users)
    }
    idle, n = sorted(self.idle), len(placeholders)
    forward = gm.forward
    # (the graph's own code is called, not `gm.__call__`, whose error handling prints the
    # generated code and drops the traceback)
    if idle:
      whole = forward

      def forward(*args: Any) -> Any:
        given = iter(args)
        return whole(*[0 if i in self.idle else next(given) for i in range(n)])

    if self.single:  # one bare output: `bridge.compile`'s leanest program and shortcut

      def graph(*args: Any) -> Any:
        return forward(*args)[0]

    else:

      def graph(*args: Any) -> Any:
        return forward(*args)

    graph.__qualname__ = graph.__name__ = f"{kind}_graph_{number}"
    # Outputs that are inputs as they came (a forward saving an input for its backward): the
    # input itself, as torch's graph returns it, not the program's copy; so torch's version
    # check sees it changed in place before the backward, as in eager.
    flat = outputs if isinstance(outputs, (tuple, list)) else [outputs]
    self.passthrough = [
      (i, placeholders.index(o))
      for i, o in enumerate(flat)
      if isinstance(o, torch.fx.Node) and o.op == "placeholder"
    ]
    # torch's layouts for the caller's outputs: all of an inference graph's; of a forward's
    # outputs not those it saves for the backward
    self.layouts: _Layouts | None = None
    if kind == "inference":
      self.layouts = _Layouts(flat, key, placeholders=placeholders)
    elif kind == "forward":
      self.layouts = _Layouts(flat, key, _user_outputs(), placeholders)
    self.compiled = compile_lib.compile(graph)
    self.compiled.keep_aliases = False  # (the layouts and passthrough above make them)
    # torch's generator for a program that draws on CPU or CUDA inputs (`_generator`)
    self.generator = _generator(gm, key)
    self.names = [str(n.target) for n in gm.graph.nodes if n.op == "placeholder"]
    self.traced: dict[str, Any] | None = None  # the input signature of the last trace

  def __call__(self, *args: Any) -> Any:
    compiled = self.compiled
    before = compiled._traces
    given = args if not self.idle else [a for i, a in enumerate(args) if i not in self.idle]
    try:
      if not self.settings and self.generator is None:
        out = compiled(*given)
      else:
        with contextlib.ExitStack() as stack:
          if self.settings:
            stack.enter_context(config_lib.config(**self.settings))
          generator, state = self.generator, None
          if generator is not None:
            stack.enter_context(rng.from_torch_generator(generator))
            state = _rng_state(generator)
          out = compiled(*given)
          if generator is not None and state is not None and compiled._traces != before:
            last = compiled.last_traced
            if last is not None and last.info is not None and not last.info.draws:
              # (the tracing call took a key before it knew the program draws nothing, as
              # a graph with `dropout(training=False)` does: torch's generator as it was)
              _set_rng_state(generator, state)
    except Exception as e:
      ffi.reraise(e)  # a host call's own exception (a value check, a fallback op), as raised
      if compiled._traces != before or self.traced is None:
        _locate(e, self.gm)
      raise
    traced = compiled._traces != before
    with _stats_lock:
      _stats.calls += 1
      if traced:
        _stats.programs += 1
      else:
        _stats.cache_hits += 1
    if traced:
      self._note_trace(args)
    out = (out,) if self.single else out
    if self.layouts:
      out = self.layouts.apply(out, args)
    if self.passthrough:
      out = list(out)
      for i, j in self.passthrough:
        out[i] = args[j]
    return out

  def _note_trace(self, args: tuple) -> None:
    sig = _signature(self.names, args)
    where = f"graph {self.number} ({self.kind})"
    if self.traced is not None:
      what = "; ".join(_changes(self.traced, sig)) or "the module's state or settings"
      with _stats_lock:
        _stats.recompiles.append(f"{where}: {what}")
      log.info("recompile: %s: %s", where, what)
    else:
      log.info("program: %s, %d inputs", where, len(args))
    self.traced = sig


class _Layouts:
  """Torch's memory layout of a graph's outputs, which a program's (new, contiguous) outputs
  lack: each output's strides as eager torch gives them (a transpose, channels_last, an
  `expand`'s zero strides), and outputs that are views of one another (`z` and `z.view(3,
  2)`: a write to one shows in the other). Taken from the example outputs; the outputs of
  each call are then copied into that layout.

  Sizes, strides and offsets that are symbolic (dynamic shapes) are worked out for each
  call from the symbols' values in its inputs. There the offset is kept too: aot_autograd
  makes an output that is a view of an input from that input with the program's output's
  size, stride and offset when it cannot replay the view (`x.narrow(1, 1, n - 1)` with a
  symbolic `n`), so they must be eager's."""

  def __init__(
    self,
    outputs: Sequence[Any],
    key: str,
    only: set[int] | None = None,
    placeholders: Sequence[torch.fx.Node] = (),
  ):
    # (`only`: a forward's outputs, which leave through aot's autograd.Function: no views
    # there, where torch forbids writing to them; aot makes the views of its outputs itself)
    values = [
      o.meta.get(key) if isinstance(o, torch.fx.Node) and (only is None or i in only) else None
      for i, o in enumerate(outputs)
    ]
    groups: dict[Any, list[tuple[int, torch.Tensor]]] = {}
    for i, v in enumerate(values):
      if isinstance(v, torch.Tensor) and _strided(v):
        groups.setdefault(i if only is not None else _storage_key(v), []).append((i, v))
    # (output indices, their (size, stride, offset from the first element used), extent)
    self.plan: list[tuple[list[int], list[tuple], Any]] = []
    # the symbolic ones: (output indices, their (size, stride, offset) as expressions)
    self.symbolic: list[tuple[list[int], list[tuple]]] = []
    for group in groups.values():
      indices = [i for i, _ in group]
      vs = [v for _, v in group]
      if len({v.dtype for v in vs}) > 1:
        continue  # views of one memory as two dtypes: left as they come
      if not all(_static_layout(v) for v in vs):
        self.symbolic.append((indices, [_layout_exprs(v) for v in vs]))
        continue
      if len(indices) == 1 and (vs[0].is_contiguous() or vs[0].numel() == 0):
        continue  # the program's own layout
      low = min(v.storage_offset() for v in vs)
      extent = max(
        v.storage_offset() - low + _extent_of(tuple(v.shape), tuple(v.stride())) for v in vs
      )
      views = [(tuple(v.shape), tuple(v.stride()), v.storage_offset() - low) for v in vs]
      self.plan.append((indices, views, extent))
    self.binders: list[tuple[int, Any, Any]] = []  # (input, what of it, its symbol)
    self._plans: dict[tuple, list] = {}  # the symbols' values -> their plan
    if self.symbolic:
      self.binders = _binders(placeholders, key)
      needed = set().union(*(_free(views) for _, views in self.symbolic))
      if not needed <= {symbol for _, _, symbol in self.binders}:
        self.symbolic = []  # (a symbol no input gives: left as it comes)

  def __bool__(self) -> bool:
    return bool(self.plan or self.symbolic)

  def _plan_for(self, args: Sequence[Any]) -> list:
    """The plan of a call's layouts: the static one and the symbolic one worked out."""
    if not self.symbolic:
      return self.plan
    values = tuple(_bound(args[i], what) for i, what, _ in self.binders)
    plan = self._plans.get(values)
    if plan is None:
      import sympy  # (lazy: loaded by dynamo's symbolic shapes already)

      bindings = {sym: sympy.Integer(n) for (_, _, sym), n in zip(self.binders, values)}
      plan = list(self.plan)
      for indices, exprs in self.symbolic:
        views = [
          (
            tuple(int(e.xreplace(bindings)) for e in size),
            tuple(int(e.xreplace(bindings)) for e in stride),
            int(offset.xreplace(bindings)),
          )
          for size, stride, offset in exprs
        ]
        if len(indices) == 1:
          size, stride, offset = views[0]
          if offset == 0 and (
            stride == strided.contiguous_strides(size) or any(n == 0 for n in size)
          ):
            continue  # the program's own layout
        extent = max(offset + _extent_of(size, stride) for size, stride, offset in views)
        plan.append((indices, views, extent))
      if len(self._plans) < 64:
        self._plans[values] = plan
    return plan

  def apply(self, outs: Any, args: Sequence[Any] = ()) -> Any:
    outs = list(outs)
    for indices, views, extent in self._plan_for(args):
      first = outs[indices[0]]
      if type(first) is not torch.Tensor:
        continue  # (`jax`-device outputs: as the device makes them)
      if len(indices) == 1 and views[0][2] == 0:  # a tensor of its own, no view
        base = None
      else:
        base = torch.empty(extent, dtype=first.dtype, device=first.device)
      made = []
      for i, (size, stride, offset) in zip(indices, views):
        if base is None:
          view = torch.empty_strided(size, stride, dtype=first.dtype, device=first.device)
        else:
          view = base.as_strided(size, stride, offset)
        target, source = view, outs[i]
        for d in range(len(size)):  # an expanded dimension: its one distinct slice
          if stride[d] == 0 and size[d] > 1:
            target, source = target.narrow(d, 0, 1), source.narrow(d, 0, 1)
        with torch.no_grad():
          target.copy_(source)
        made.append((i, view))
      for i, view in made:
        outs[i] = view
    return tuple(outs)


def _strided(v: torch.Tensor) -> bool:
  try:
    return v.layout == torch.strided
  except (RuntimeError, NotImplementedError):
    return False


def _expr(n: Any) -> Any:
  """An int or SymInt as a sympy expression."""
  import sympy  # (lazy: see `_Layouts._plan_for`)

  return n.node.expr if isinstance(n, torch.SymInt) else sympy.Integer(int(n))


def _layout_exprs(v: torch.Tensor) -> tuple:
  """(size, stride, storage offset) of an example output, as sympy expressions."""
  return (
    tuple(_expr(n) for n in v.shape),
    tuple(_expr(n) for n in v.stride()),
    _expr(v.storage_offset()),
  )


def _free(views: list[tuple]) -> set:
  out: set = set()
  for size, stride, offset in views:
    for e in (*size, *stride, offset):
      out |= e.free_symbols
  return out


def _binders(placeholders: Sequence[torch.fx.Node], key: str) -> list[tuple[int, Any, Any]]:
  """Where each symbol of a graph's inputs shows in a call's arguments: a size passed as a
  number, or a size, stride or offset of an input tensor (the first place it shows)."""
  import sympy  # (lazy: see `_Layouts._plan_for`)

  out: list[tuple[int, Any, Any]] = []
  seen: set = set()

  def note(i: int, what: Any, n: Any) -> None:
    if isinstance(n, torch.SymInt) and isinstance(n.node.expr, sympy.Symbol):
      if n.node.expr not in seen:
        seen.add(n.node.expr)
        out.append((i, what, n.node.expr))

  for i, p in enumerate(placeholders):
    v = p.meta.get(key)
    if isinstance(v, torch.SymInt):
      note(i, None, v)
    elif isinstance(v, torch.Tensor) and _strided(v):
      for d, n in enumerate(v.shape):
        note(i, ("size", d), n)
      for d, n in enumerate(v.stride()):
        note(i, ("stride", d), n)
      note(i, ("offset", 0), v.storage_offset())
  return out


def _bound(arg: Any, what: Any) -> int:
  """The value of a symbol in a call's argument (`_binders`)."""
  if what is None:
    return int(arg)
  kind, d = what
  if kind == "size":
    return int(arg.shape[d])
  if kind == "stride":
    return int(arg.stride()[d])
  return int(arg.storage_offset())


def _extent_of(size: tuple, stride: tuple) -> int:
  if any(n == 0 for n in size):
    return 0
  return 1 + sum((n - 1) * st for n, st in zip(size, stride))


def _user_outputs() -> set[int]:
  """The positions, among the outputs of the forward graph aot_autograd is compiling, of the
  caller's outputs (after the updated inputs; before the saved tensors). aot makes those that
  are views again from their bases with the strides the program gives them."""
  from torch._guards import TracingContext  # (lazy: `_compiler`)

  meta = getattr(TracingContext.try_get(), "fw_metadata", None)
  if meta is None:
    return set()
  first = meta.num_mutated_inp_runtime_indices
  return set(range(first, first + len(meta.output_info)))


def _static_layout(v: torch.Tensor) -> bool:
  try:
    return (
      all(isinstance(n, int) for n in (*v.shape, *v.stride(), v.storage_offset()))
      and v.layout == torch.strided
    )
  except (RuntimeError, NotImplementedError):
    return False


def _storage_key(v: torch.Tensor) -> Any:
  from torch.multiprocessing.reductions import StorageWeakRef  # (lazy: `_compiler`)

  return StorageWeakRef(v.untyped_storage())


def _for_the_program(gm: torch.fx.GraphModule) -> None:
  """Rewrites dynamo's own graph for its run as a program (no aot_autograd).

  * `Tensor.to` calls that name the inputs' own device lose that device (`x.to(y.device)`:
    dynamo writes the device it saw as a constant): inside the program such a call moves
    nothing, and a move to the CPU would leave the program.
  * inductor's `prims.fma` (`_fma_to_mul_add`).
  """
  devices = _input_devices(gm, "example_value")

  def same(d: Any) -> bool:
    try:
      return isinstance(d, (torch.device, str)) and torch.device(d) in devices
    except (RuntimeError, TypeError):  # a string that names no device (a dtype's name)
      return False

  changed = _fma_to_mul_add(gm)
  for node in gm.graph.find_nodes(op="call_method", target="to"):
    args = [node.args[0], *[a for a in node.args[1:] if not same(a)]]
    kwargs = {k: v for k, v in node.kwargs.items() if not (k == "device" and same(v))}
    if len(args) != len(node.args) or len(kwargs) != len(node.kwargs):
      node.args, node.kwargs = tuple(args), kwargs
      changed = True
  if changed:
    gm.recompile()


def _for_the_jax_device(gm: torch.fx.GraphModule) -> None:
  """Rewrites a graph aot_autograd traced on CPU tensors for its run on `jax`-device ones.

  * `view` -> `reshape` (the graph is functional: nothing writes through a view, so the two
    compute the same values). CPU kernels may return tensors of a permuted layout that a
    later `view` relies on (the CPU flash attention's output, transposed and flattened);
    the `jax` device's results are always contiguous, so that `view` would be refused.
  * `_to_copy(x, device=<the inputs' device>)` loses its `device`: in the graph it moves
    nothing (`mask.to(device=x.device)`), in the program it would leave the program.
  * A random tensor made on the inputs' device (`torch.rand(n)`, or `torch.empty(n)` that a
    random op fills: the CPU, where the inputs are CPU tensors) is made in the program (on its
    `jax` device). Made by torch's CPU kernel while the program is traced, it was a constant of
    the program: numbers drawn once and returned by every call. (Other tensors made there stay
    constants: values known while tracing, which ops that need them concrete can read.)
  * inductor's `prims.fma` (`_fma_to_mul_add`).

  The subgraphs of control-flow operators (`torch.cond`'s branches...) are rewritten alike.
  """
  devices = _input_devices(gm, "val") or {torch.device("cpu")}
  program = tensor_lib.jax_device(0)  # (where the program's CPU inputs are; jax ones stay)
  for sub in gm.modules():
    if isinstance(sub, torch.fx.GraphModule):
      _rewrite_for_the_jax_device(sub, devices, program)


def _rewrite_for_the_jax_device(
  gm: torch.fx.GraphModule, devices: set[torch.device], program: torch.device
) -> None:
  changed = False
  for node in gm.graph.nodes:
    if node.op != "call_function":
      continue
    device = node.kwargs.get("device")
    if node.target is torch.ops.aten.view.default:
      node.target = torch.ops.aten.reshape.default
      changed = True
    elif node.target is torch.ops.aten._to_copy.default and device in devices:
      node.kwargs = {k: v for k, v in node.kwargs.items() if k != "device"}
      changed = True
    elif (
      isinstance(node.target, torch._ops.OpOverload)
      and device in devices
      and device.type != program.type
      and (_draws(node) or any(_draws(user) for user in node.users))
    ):
      node.kwargs = {**node.kwargs, "device": program}
      changed = True
  if _fma_to_mul_add(gm) or changed:
    gm.recompile()


def _rng_state(device: torch.device) -> torch.Tensor:
  if device.type == "cuda":
    return torch.cuda.get_rng_state(device.index or 0)
  return torch.get_rng_state()


def _set_rng_state(device: torch.device, state: torch.Tensor) -> None:
  if device.type == "cuda":
    torch.cuda.set_rng_state(state, device.index or 0)
  else:
    torch.set_rng_state(state)


def _generator(gm: torch.fx.GraphModule, key: str) -> torch.device | None:
  """The device whose torch generator a graph's random ops draw from, as eager torch's
  would: the inputs' (CPU or CUDA) device, for a graph with a random op (in itself or a
  subgraph); None for one without, or on `jax`-device inputs (the `jax` device's own)."""
  devices = _input_devices(gm, key) or {torch.device("cpu")}
  if len(devices) != 1:
    return None
  (device,) = devices
  if device.type not in ("cpu", "cuda"):
    return None
  for sub in gm.modules():
    if isinstance(sub, torch.fx.GraphModule):
      for node in sub.graph.nodes:
        if node.op != "call_function" and node.op != "call_method":
          continue
        name = getattr(node.target, "__name__", node.target)
        if _draws(node) or name in _NEW_RANDOM or name in _RANDOM_FUNCTIONS:
          return device
  return None


# torch-level random functions in dynamo's own graphs (aot's are aten ops: `_draws`)
_RANDOM_FUNCTIONS = frozenset(
  ["dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"]
  + ["rrelu", "rand_like", "randn_like", "randint_like", "native_dropout"]
)


def _draws(node: torch.fx.Node) -> bool:
  """Whether the node is an op that draws random numbers (torch's `nondeterministic_seeded`)."""
  target = node.target
  return isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in (
    target.tags
  )


def _moves_onto_the_device(gm: torch.fx.GraphModule) -> str | None:
  """For a graph whose inputs are not on the `jax` device and which returns a tensor there
  (`x.to("jax")`, `torch.ones(3, device="jax")`), the node that made it, named with the user's
  line; else None. (A tensor moved there and not returned is left to the program, where it
  stays on the program's one device: transformers' `is_jax_jitting` asks `x.jax()` and drops
  it.)"""
  if any(d.type == tensor_lib.device_type() for d in _input_devices(gm, "example_value")):
    return None
  outs: list[torch.fx.Node] = []
  torch.fx.node.map_arg(gm.graph.find_nodes(op="output")[0].args[0], outs.append)
  for node in outs:
    value = node.meta.get("example_value")
    if isinstance(value, torch.Tensor) and value.device.type == tensor_lib.device_type():
      while node.op == "call_function" and node.args and isinstance(node.args[0], torch.fx.Node):
        made = node.args[0].meta.get("example_value")  # (back to where it first got there)
        if not (isinstance(made, torch.Tensor) and made.device == value.device):
          break
        node = node.args[0]
      name = f"`{getattr(node.target, '__name__', node.target)}`"
      frame = user_frame(node)
      return name if frame is None else f"{name} at {frame[0]}: {frame[1]}"
  return None


def _input_devices(gm: torch.fx.GraphModule, key: str) -> set[torch.device]:
  """The devices of the graph's tensor inputs, from each placeholder's fake value (`key`:
  dynamo keeps it as "example_value", aot_autograd as "val")."""
  return {
    node.meta[key].device
    for node in gm.graph.find_nodes(op="placeholder")
    if isinstance(node.meta.get(key), torch.Tensor)
  }


def _fma_to_mul_add(gm: torch.fx.GraphModule) -> bool:
  """Inductor's `prims.fma(a, b, c)` -> `a * b + c` (whether anything changed): dynamo writes
  `addcmul_` and `lerp_` (an optimizer step) with it, importing it as it traces, so it may
  not exist yet when the plugin registers its lowerings (aot's graphs and dynamo's alike)."""
  fma = getattr(torch.ops.prims, "fma", None)
  if fma is None:
    return False
  changed = False
  for node in gm.graph.find_nodes(op="call_function", target=fma.default):
    if not node.kwargs:
      a, b, c = node.args
      with gm.graph.inserting_before(node):
        product = gm.graph.call_function(torch.ops.aten.mul.Tensor, (a, b))
      node.target, node.args = torch.ops.aten.add.Tensor, (product, c)
      changed = True
  return changed


def user_frame(node: torch.fx.Node) -> tuple[str, str] | None:
  """The innermost frame of the user's code that made an FX node, from the `stack_trace`
  that dynamo, aot_autograd and torch.export keep: ("File ..., line N, in f", its source
  line, or "" if none), or None."""
  stack = node.meta.get("stack_trace") or ""
  frames = [line.strip() for line in stack.strip().splitlines() if line.strip()]
  for i in range(len(frames) - 1, -1, -1):
    if frames[i].startswith("File "):
      return frames[i], frames[i + 1] if i + 1 < len(frames) else ""
  return None


def _locate(error: BaseException, gm: torch.fx.GraphModule) -> None:
  """Adds to `error` the line of the user's code that made the graph node it came from (the
  node's `stack_trace`, which dynamo and aot_autograd keep)."""
  code = getattr(type(gm).forward, "__code__", None)
  lineno = None
  tb = error.__traceback__
  while tb is not None:
    if tb.tb_frame.f_code is code:
      lineno = tb.tb_lineno
    tb = tb.tb_next
  lines = getattr(gm, "_lineno_map", None)  # (line - first line of `forward`) -> node index
  if lineno is None or code is None or not lines:
    return
  index = lines.get(lineno - code.co_firstlineno)
  nodes = list(gm.graph.nodes)
  if index is None or index >= len(nodes):
    return
  node = nodes[index]
  frame = user_frame(node)
  source = ""
  if frame is not None:
    source = "  " + frame[0] + ("\n    " + frame[1] if frame[1] else "")
  target = getattr(node.target, "__name__", None) or str(node.target)
  where = f"(in the graph compiled by torch.compile(backend={NAME!r}): the op {target}"
  where += f", from:\n{source})" if source else ")"
  if len(error.args) == 1 and isinstance(error.args[0], str) and where not in error.args[0]:
    error.args = (f"{error.args[0]}\n{where}",)
  else:
    error.add_note(where)


def _sdpa_math(
  query: torch.Tensor,
  key: torch.Tensor,
  value: torch.Tensor,
  attn_mask: torch.Tensor | None = None,
  dropout_p: float = 0.0,
  is_causal: bool = False,
  scale: float | None = None,
  enable_gqa: bool = False,
) -> torch.Tensor:
  if attn_mask is not None and attn_mask.dtype == torch.bool:
    # `F.scaled_dot_product_attention` turns a boolean mask (True: attend) into an additive
    # one before its kernels; the math kernel itself would add the booleans as 0 and 1
    attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
      attn_mask.logical_not(), float("-inf")
    )
  return torch.ops.aten._scaled_dot_product_attention_math.default(
    query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
  )[0]


# Decompositions aot_autograd applies while it traces. `F.scaled_dot_product_attention` takes
# its math form (matmuls, softmax, dropout: XLA fuses them, and their derivatives are the
# ordinary ones): on CPU tensors torch would pick its flash-attention kernel, whose
# decomposition returns the attention weights where the kernel returns the log-sum-exp, and
# whose backward has no decomposition at all.
_DECOMPOSITIONS = {torch.ops.aten.scaled_dot_product_attention.default: _sdpa_math}


def _compiler(kind: str, number: int, settings: dict) -> Callable[..., Any]:
  # (lazy: torch's functorch/dynamo modules are loaded by torch.compile, not by `import bridge`)
  from torch._functorch.aot_autograd import make_boxed_func

  def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    return make_boxed_func(_Graph(gm, kind, number, settings))

  return compile_graph


def backend(
  gm: torch.fx.GraphModule,
  example_inputs: Sequence[Any],
  *,
  options: dict[str, Any] | None = None,
  mode: str | None = None,
) -> Callable[..., Any]:
  """The `torch.compile` backend named "jax": `torch.compile(model, backend="jax")`.

  Registered through torch's `torch_dynamo_backends` entry point, so `backend="jax"` works
  without `import bridge`. Each graph dynamo captures goes through torch's `aot_autograd`
  (training works: `loss.backward()`, `torch.optim`, BatchNorm's running statistics,
  dropout, autocast); each forward, backward and inference graph becomes one cached
  `jax.jit` program (`bridge.compile`), entered and left zero-copy. Inputs are CPU tensors
  (CUDA tensors where JAX has the same GPU) or `jax`-device tensors; outputs come back on
  the inputs' device. Ops with no lowering run through the per-op callback fallback inside
  the program, so the graph stays whole.

  Args:
    gm: the graph dynamo captured.
    example_inputs: its inputs as dynamo saw them.
    options: `torch.compile(..., options={...})`: settings of `bridge.config` for the
      compiled graphs (`OPTIONS`: "fallback", "decompose_missing_ops", "tiered_compile",
      "check_indices", "debug_print_each_op", "cpu_convolution"). Unknown names raise.
    mode: `torch.compile`'s `mode`: only the default (inductor's modes do not apply).

  Example:
    >>> import torch
    >>> f = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2, backend="jax")
    >>> f(torch.zeros(2))
    tensor([0., 0.])
  """
  from torch._dynamo.backends.common import aot_autograd  # (lazy: see `_compiler`)

  settings = _settings(options, mode)
  _check_inputs(example_inputs)
  number = _note_graph(gm, example_inputs)
  why = _why_eager(gm)
  if why is not None:  # no program can run it
    return _run_eagerly(gm, number, why)
  if _direct(gm, example_inputs):  # no gradient to record: dynamo's graph as it is
    graph = _Graph(gm, "inference", number, settings, direct=True)
    with _stats_lock:
      _stats.direct += 1
    return graph
  return aot_autograd(
    decompositions=_DECOMPOSITIONS,
    fw_compiler=_compiler("forward", number, settings),
    bw_compiler=_compiler("backward", number, settings),
    inference_compiler=_compiler("inference", number, settings),
  )(gm, example_inputs)


def _why_eager(gm: torch.fx.GraphModule) -> str | None:
  """Why no program can run this graph, said as the warning goes on; None where one can."""
  read = _int_from_values(gm)
  if read is not None:
    return (
      f"uses an integer read from a tensor's values ({read}; `.item()` kept in the graph by "
      "`torch._dynamo.config.capture_scalar_outputs`), which a JAX program cannot take as a "
      "number; that graph runs in eager torch. Leave capture_scalar_outputs off (the "
      "default) so that dynamo breaks the graph there and the rest compiles."
    )
  moved = _moves_onto_the_device(gm)
  if moved is not None:  # (a program has one device)
    return (
      f"moves its inputs onto the `{tensor_lib.device_type()}` device ({moved}), which a "
      "program on their own device cannot do; that graph runs in eager torch. Move the "
      "inputs before calling the compiled function (its ops on `jax`-device tensors run on "
      "the device as they are)."
    )
  return None


def _run_eagerly(gm: torch.fx.GraphModule, number: int, why: str) -> Callable[..., Any]:
  """A graph no program can run: torch runs it (as `backend="eager"`), with a warning."""
  warnings.warn(f'bridge: graph {number} of torch.compile(..., backend="jax") {why}', stacklevel=3)
  with _stats_lock:
    _stats.eager += 1
  return gm.forward


def _int_from_values(gm: torch.fx.GraphModule) -> str | None:
  """The first node of the graph that makes an integer from a tensor's values (an unbacked
  symbol: `.item()` of an integer tensor under `capture_scalar_outputs`), or None."""
  from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols  # (lazy: `_compiler`)

  for node in gm.graph.nodes:
    value = node.meta.get("example_value")
    if isinstance(value, torch.SymInt) and free_unbacked_symbols(value):
      name = (
        f"`.{node.target}()`"
        if node.op == "call_method"
        else f"`{getattr(node.target, '__name__', node.target)}`"
      )
      frame = user_frame(node)
      return name if frame is None else f"{name} at {frame[0]}: {frame[1]}"
  return None


def _direct(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
  """Whether dynamo's graph can run as it is, without aot_autograd (whose tracing is a share
  of a small graph's compile time, and whose runtime wrapper a share of each call): a graph
  that records no gradient (compiled under `torch.no_grad()` / `inference_mode()`, which
  dynamo guards, or with no input that requires grad), whose outputs share no input's memory
  nor each other's (aot rebuilds such views; a program's outputs are new tensors), and with no
  operator of a kind only aot takes apart (higher-order operators, autocast and grad-mode
  switches, numbers read from tensors, as dynamo passes a changing float). Symbolic sizes
  are fine: dynamo passes them as ints, each its own program (`bridge.compile`'s static ints).
  """
  from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols  # (lazy: `_compiler`)

  if torch.is_grad_enabled() and any(
    isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs
  ):
    return False
  if any(True for _ in gm.parameters()) or any(True for _ in gm.buffers()):
    return False  # state kept on the graph module (dynamo lifts a module's own as inputs)
  storages = set()
  for node in gm.graph.nodes:
    value = node.meta.get("example_value")
    if node.op == "placeholder":
      if isinstance(value, torch.SymInt):
        continue  # a size
      if not isinstance(value, torch.Tensor):
        return False  # a float dynamo made symbolic, or another input aot handles
      storage = _storage_key(value)
      if storage in storages:
        return False  # two inputs sharing memory (a tensor and a view of it): aot's aliasing
      storages.add(storage)
    elif node.op in ("call_function", "call_method", "call_module"):
      target = node.target
      if (
        isinstance(target, torch._ops.HigherOrderOperator)
        or target in _AOT_ONLY
        or target == "requires_grad_"
        or getattr(target, "__name__", target) in _NEW_RANDOM
        or _draws(node)  # (an op tagged random: a custom op's inputs may be made here too)
      ):
        return False  # (random numbers made apart from the inputs: aot's graph makes them
        # in the program, `_for_the_jax_device`)
      if isinstance(value, (torch.SymFloat, torch.SymBool)) or free_unbacked_symbols(value):
        return False  # a number read from a tensor's values
    elif node.op == "output":
      outs: list[torch.fx.Node] = []
      torch.fx.node.map_arg(node.args[0], outs.append)
      for out in outs:
        value = out.meta.get("example_value")
        if isinstance(value, torch.Tensor):
          storage = _storage_key(value)
          if storage in storages:
            return False  # an output sharing an input's memory, or another output's (`z`
            # and `z.view(...)`: aot returns the second as a view of the first)
          storages.add(storage)
  return True


# Random tensors a graph makes from nothing (`torch.rand(n)`) or fills (`t.uniform_()`): their
# device is the default one, not the inputs', so they take aot's graph, where that is rewritten.
_NEW_RANDOM = frozenset(
  ["rand", "randn", "randint", "randperm", "normal", "poisson", "multinomial", "bernoulli"]
  + [f"{name}_" for name in ["uniform", "normal", "bernoulli", "exponential", "geometric"]]
  + ["log_normal_", "cauchy_", "random_"]
)

# Graph nodes that switch torch's global state: aot_autograd functionalizes them away.
_AOT_ONLY = frozenset(
  [
    torch._C._set_grad_enabled,
    torch.amp.autocast_mode._enter_autocast,
    torch.amp.autocast_mode._exit_autocast,
  ]
)


def _code_name(gm: torch.fx.GraphModule) -> str:
  """The user's function the graph came from, from its nodes' stack traces."""
  for node in gm.graph.nodes:
    frame = user_frame(node)
    if frame is not None:
      return frame[0]
  return "a graph"
