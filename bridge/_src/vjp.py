"""Torch autograd through JAX: the `torch.autograd.Function` behind a differentiable `call_jax`.

The forward runs `jax.vjp` under `jit` and keeps JAX's residuals (no
recomputation in the backward); the pullback's structure is remembered per
input signature on the Python side, so only arrays cross the `jit` boundary and
the backward is one cached jitted call. Complex gradients follow torch's
convention: the conjugate of JAX's cotangent.

The residuals live as long as torch's graph does: a backward that does not
retain the graph (`retain_graph=False`, the default) releases them, and a second
one raises torch's own error, as for any torch op (the node saves its input
tensors, so torch also refuses a backward after an input was modified in place,
which would otherwise read the aliased new values). A backward that records a
graph (`create_graph=True`: gradient penalties, double backward, Hessian-vector
products) is itself a differentiable call: `_Pullback`, JAX's VJP as a function
of (inputs, output gradients), run through this same machinery, so every order
torch asks for is JAX's derivative of the one before.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import torch
import torch.autograd.forward_ad as _fwd_ad

from bridge._src import dtypes
from bridge._src import tensor as tensor_lib
from bridge._src import transfer
from bridge._src.errors import BridgeError

_API = "bridge.call_jax"


def _concrete_signature(arrays: tuple) -> tuple:
  x64 = dtypes.x64_enabled()
  return tuple(
    [
      (
        a.shape,
        a.dtype if x64 else _canonical(a.dtype),
        type(a) is not np.ndarray and getattr(a, "weak_type", False),
      )
      for a in arrays
    ]
  ) + (x64,)


@functools.lru_cache(maxsize=64)
def _canonical(dtype: Any) -> Any:
  """JAX's dtype for `dtype` while its 64-bit types are off."""
  return jax.dtypes.canonicalize_dtype(dtype)


def _abstract_signature(tracers: tuple) -> tuple:
  return tuple((t.aval.shape, t.aval.dtype, t.aval.weak_type) for t in tracers) + (
    dtypes.x64_enabled(),
  )


class VjpCache:
  """The jitted forward-with-residuals and backward of one function, per input mask.

  `none_for_unreached`: an input whose gradient the outputs cannot carry (its cotangent in
  JAX's VJP does not depend on the output cotangents: the input is unused, or used only
  through `stop_gradient` or integer-valued ops) gets no gradient (None) rather than zeros,
  as torch autograd leaves `.grad` None where its graph does not reach (`bridge.compile`'s
  programs: a torch module's parameters). False (`call_jax`): zeros, as `jax.grad` gives.
  The derivatives of those calls (`_Pullback`, `_Tangents`) inherit it.
  """

  def __init__(self, apply: Callable[..., Any], none_for_unreached: bool = False):
    self.apply = apply
    self.none_for_unreached = none_for_unreached
    self.errors: dict[tuple[bool, ...], Exception] = {}  # masks JAX cannot differentiate
    self._forwards: dict[tuple[bool, ...], Callable] = {}
    self._residual_defs: dict[tuple, Any] = {}
    self._backwards: dict[tuple, Callable] = {}
    self._unreached: dict[Callable, tuple[bool, ...]] = {}  # per backward (`unreached`)
    self._pullbacks: dict[tuple, _Pullback] = {}
    self._jvp: Callable | None = None
    self._tangents: dict[tuple[bool, ...], _Tangents] = {}
    self._lock = threading.Lock()

  def jvp(self) -> Callable:
    """The jitted `(primals, tangents) -> output tangents` (forward-mode AD)."""
    if self._jvp is None:
      with self._lock:
        if self._jvp is None:
          self._jvp = jax.jit(lambda p, t: jax.jvp(self.apply, p, t)[1])
    return self._jvp

  def tangents(self, inexact: tuple[bool, ...], name: str) -> "_Tangents":
    """The forward-mode derivative of the calls whose inputs are inexact where `inexact` says,
    as a function to call differentiably (forward-over-reverse)."""
    t = self._tangents.get(inexact)
    if t is None:
      with self._lock:
        t = self._tangents.setdefault(inexact, _Tangents(self, inexact, name))
    return t

  def forward(self, mask: tuple[bool, ...]) -> Callable:
    """The jitted `(diff, rest) -> (out, residuals)`; `mask` marks the differentiated inputs."""
    fwd = self._forwards.get(mask)
    if fwd is None:

      def fwd_impl(diff: tuple, rest: tuple) -> Any:
        out, pullback = jax.vjp(lambda *d: self.apply(*_merge(mask, d, rest)), *diff)
        residuals, res_def = jax.tree_util.tree_flatten(pullback)
        self._residual_defs[(mask, _abstract_signature(diff + rest))] = res_def
        return out, residuals

      with self._lock:
        fwd = self._forwards.setdefault(mask, jax.jit(fwd_impl))
    return fwd

  def backward(
    self, mask: tuple[bool, ...], diff: tuple, rest: tuple, out_shapes: tuple
  ) -> Callable:
    """The jitted `(residuals, cotangents) -> input cotangents` for this forward's inputs.

    Cotangents may come in smaller than the outputs (the stride-0 gradient of `.sum()` is
    passed as its one distinct value); they are broadcast to `out_shapes` inside.
    """
    key = (mask, _concrete_signature(diff + rest))
    bwd = self._backwards.get(key)
    if bwd is None:
      res_def: Any = self._residual_defs[key]

      def bwd_impl(res: list, cts: Any) -> Any:
        leaves, ct_def = jax.tree_util.tree_flatten(cts)
        full = [
          c if np.dtype(c.dtype) == jax.dtypes.float0 else jnp.broadcast_to(c, shape)
          for c, shape in zip(leaves, out_shapes)
        ]
        return res_def.unflatten(res)(jax.tree_util.tree_unflatten(ct_def, full))

      with self._lock:
        bwd = self._backwards.setdefault(key, jax.jit(bwd_impl))
    return bwd

  def unreached(self, bwd: Callable, residuals: list, cts: Any, n_diff: int) -> tuple[bool, ...]:
    """Per differentiated input of the backward `bwd` (made by `backward`, one per signature):
    its cotangent is a structural zero (it does not depend on the output cotangents `cts`),
    found once per backward from its jaxpr. (The trace is `jax.jit`'s own: the backward's call
    reuses it.)"""
    found = self._unreached.get(bwd)
    if found is None:
      jaxpr = bwd.trace(residuals, cts).jaxpr.jaxpr  # type: ignore[attr-defined]
      n_res = len(jax.tree_util.tree_leaves(residuals))
      reached = _reached(jaxpr, [i >= n_res for i in range(len(jaxpr.invars))], {})
      found = tuple(not r for r in reached)
      if len(found) != n_diff:  # (not one array per input: assume every one reached)
        found = (False,) * n_diff
      self._unreached[bwd] = found
    return found

  def pullback(self, mask: tuple[bool, ...], out_def: Any, name: str) -> "_Pullback":
    """The backward of the calls with this mask and output structure, as a function to call
    differentiably (a backward under `create_graph=True`)."""
    key = (mask, out_def)
    pb = self._pullbacks.get(key)
    if pb is None:
      with self._lock:
        pb = self._pullbacks.setdefault(key, _Pullback(self, mask, out_def, name))
    return pb


def _split(mask: tuple[bool, ...], arrays: Any) -> tuple[tuple, tuple]:
  """(the arrays `mask` marks, the others), each in order."""
  return (
    tuple(a for a, m in zip(arrays, mask) if m),
    tuple(a for a, m in zip(arrays, mask) if not m),
  )


def _merge(mask: tuple[bool, ...], diff: Any, rest: Any) -> list:
  """The inverse of `_split`."""
  d, r = iter(diff), iter(rest)
  return [next(d) if m else next(r) for m in mask]


# primitives whose one sub-jaxpr (`jaxpr` or `call_jaxpr`) takes the equation's inputs and
# gives its outputs one to one: the dependency walk goes inside them
_CALLS = frozenset(
  ["pjit", "jit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call"]
)


def _reached(jaxpr: Any, dependent: list[bool], memo: dict) -> list[bool]:
  """Which of `jaxpr`'s outputs depend on the inputs marked in `dependent`. An equation's
  output depends on its inputs (all of them: control flow and other sub-jaxprs are not looked
  into), except a call's, which follow its body (`_CALLS`). `memo`: per (body, inputs)."""
  reached = {v for v, d in zip(jaxpr.invars, dependent) if d}
  for eqn in jaxpr.eqns:
    ins = [not isinstance(v, jex.Literal) and v in reached for v in eqn.invars]
    if not any(ins):
      continue
    body = _body(eqn)
    if body is None:
      reached.update(eqn.outvars)
      continue
    key = (id(body), tuple(ins))
    outs = memo.get(key)
    if outs is None:
      outs = memo[key] = _reached(body, ins, memo)  # (`jaxpr` holds `body`: its id stays)
    reached.update(v for v, r in zip(eqn.outvars, outs) if r)
  return [not isinstance(v, jex.Literal) and v in reached for v in jaxpr.outvars]


def _body(eqn: Any) -> Any:
  """The open jaxpr of a call equation (`_CALLS`) whose inputs and outputs are its own;
  None for any other equation."""
  if eqn.primitive.name not in _CALLS:
    return None
  body = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
  if isinstance(body, jex.ClosedJaxpr):
    body = body.jaxpr
  if (
    not isinstance(body, jex.Jaxpr)
    or len(body.invars) != len(eqn.invars)
    or len(body.outvars) != len(eqn.outvars)
  ):
    return None
  return body


def _inexact(dtype: Any) -> bool:
  return jnp.issubdtype(dtype, jnp.inexact)


class _Pullback:
  """JAX's VJP of one function as a function of its own: `(*inputs, *output gradients) ->
  input gradients`, in torch's conventions (complex gradients conjugated, no gradient
  arrays for integer outputs). It has what `call_with_grad` needs of an entry (`apply`,
  `forward`, `vjp`, `name`), so a backward that torch records (`create_graph=True`) is a
  differentiable call of it, and its own backward a `_Pullback` of it, to any order."""

  def __init__(self, cache: VjpCache, mask: tuple[bool, ...], out_def: Any, name: str):
    self.fn_apply, self.mask, self.out_def = cache.apply, mask, out_def
    self.name = f"the backward of {name}"
    self.forward = jax.jit(self.apply)
    self.vjp = VjpCache(self.apply, cache.none_for_unreached)

  def apply(self, *arrays: Any) -> tuple:
    mask = self.mask
    given = iter(arrays[len(mask) :])
    diff, rest = _split(mask, arrays[: len(mask)])
    out, pullback = jax.vjp(lambda *d: self.fn_apply(*_merge(mask, d, rest)), *diff)
    cts = []
    for o in jax.tree_util.tree_leaves(out):
      if _inexact(o.dtype):
        g = next(given)
        cts.append(jnp.conj(g) if jnp.iscomplexobj(g) else g)
      else:
        cts.append(np.zeros(np.shape(o), jax.dtypes.float0))
    in_cts = pullback(self.out_def.unflatten(cts))
    return tuple(jnp.conj(c) if jnp.iscomplexobj(c) else c for c in in_cts)


class _Tangents:
  """JAX's JVP of one function as a function of its own: `(*inputs, *tangents of the inexact
  inputs) -> tangents of the inexact outputs`. Called differentiably when torch records the
  forward-mode derivative itself (a tangent whose backward is asked for: forward-over-reverse),
  as torch records what a `Function.jvp` computes with torch ops."""

  def __init__(self, cache: VjpCache, inexact: tuple[bool, ...], name: str):
    self.fn_apply, self.inexact = cache.apply, inexact
    self.name = f"the forward-mode derivative of {name}"
    self.forward = jax.jit(self.apply)
    self.vjp = VjpCache(self.apply, cache.none_for_unreached)

  def apply(self, *arrays: Any) -> tuple:
    n = len(self.inexact)
    primals, given = arrays[:n], iter(arrays[n:])
    tans = [
      next(given) if m else np.zeros(np.shape(a), jax.dtypes.float0)
      for a, m in zip(primals, self.inexact)
    ]
    out = jax.jvp(self.fn_apply, tuple(primals), tuple(tans))[1]
    return tuple(t for t in jax.tree_util.tree_leaves(out) if _inexact(t.dtype))


class _Call:
  """One differentiable call: the forward with residuals, then the backward."""

  def __init__(self, entry: Any, mask: tuple[bool, ...], arrays: list, outputs_to_torch: Callable):
    self.entry, self.mask = entry, mask
    self.diff: Any
    self.rest: Any
    self.diff, self.rest = _split(mask, arrays)
    self.outputs_to_torch = outputs_to_torch
    self.x64 = dtypes.x64_enabled()
    self.residuals: Any = None
    self.out_def: Any = None
    self.out_avals: list[tuple[tuple, torch.dtype]] = []
    self.device: torch.device | None = None  # the `jax` device when the inputs live there
    self.positions: tuple[int, ...] = ()  # each tensor's position among the arrays
    self.tensor_mask: tuple[bool, ...] = ()  # which tensors require grad
    self.inputs: tuple[torch.Tensor, ...] = ()  # the tensors, while forward-mode AD is on

  def forward(self) -> list[torch.Tensor]:
    # torch runs `Function.forward` with grad mode off; the traced torch code of a compiled
    # module gets the caller's mode (on) back, so that its own `torch.no_grad()` blocks stand
    # out (their results are constants for the VJP, as for torch autograd). (torch's own
    # switches, not its context managers: this is every differentiable call's hot path.)
    grad, fwd_grad = torch.is_grad_enabled(), _fwd_grad_enabled()
    _set_grad_enabled(True)
    _set_fwd_grad_enabled(True)
    try:
      return self._forward()
    finally:
      _set_grad_enabled(grad)
      _set_fwd_grad_enabled(fwd_grad)

  def _forward(self) -> list[torch.Tensor]:
    cache: VjpCache = self.entry.vjp
    error = cache.errors.get(self.mask)
    if error is None:
      try:
        out, self.residuals = cache.forward(self.mask)(self.diff, self.rest)
      except Exception as e:  # noqa: BLE001 - kept, and raised by backward()
        # JAX cannot differentiate fn (a raw Pallas kernel, a while_loop...). As in
        # torch, the forward still runs and the error belongs to the backward pass.
        # If fn itself is broken, the plain forward below raises that error instead.
        error = e
    if error is not None:
      out = self.entry.forward(*_merge(self.mask, self.diff, self.rest))
      cache.errors[self.mask] = self.residuals = error
    outs, self.out_def = self.outputs_to_torch(self.entry, out)
    self.out_avals = [(tuple(o.shape), o.dtype) for o in outs]
    return outs

  def backward(
    self, grads: tuple[torch.Tensor | None, ...], keep: bool
  ) -> list[torch.Tensor | None]:
    """The input gradients from the saved residuals; `keep`: the graph is retained (else the
    residuals are released: torch refuses a second backward through this node)."""
    self._check_usable()
    try:
      return self._backward(grads)
    finally:
      if not keep:
        self._release()

  def _backward(self, grads: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor | None]:
    if self.x64 != dtypes.x64_enabled():
      with jax.enable_x64(self.x64):  # the forward's 64-bit setting: the same types
        return self._backward(grads)
    cts = [_cotangent(g, shape, dtype) for g, (shape, dtype) in zip(grads, self.out_avals)]
    cache: VjpCache = self.entry.vjp
    out_shapes = tuple(shape for shape, _ in self.out_avals)
    bwd = cache.backward(self.mask, self.diff, self.rest, out_shapes)
    cts_tree = self.out_def.unflatten(cts)
    unreached = None
    try:
      if cache.none_for_unreached:
        unreached = cache.unreached(bwd, self.residuals, cts_tree, len(self.diff))
      in_cts = bwd(self.residuals, cts_tree)
    except Exception as e:  # (re-raised with the call named)
      # e.g. JAX linearizes a while_loop but cannot transpose it.
      raise _differentiation_error(self.entry.name, e) from e
    device = self.device
    if unreached is None or not any(unreached):
      return [_gradient(c, device) for c in in_cts]
    # torch's "no gradient" (`.grad` stays None, as torch autograd leaves it)
    return [None if u else _gradient(c, device) for c, u in zip(in_cts, unreached)]

  def _unreached_abstract(self) -> tuple[bool, ...] | None:
    """`VjpCache.unreached` for this call, found with abstract full-size output cotangents
    (a backward that torch records runs the `_Pullback` instead); None: every input gets
    its gradient (`call_jax`)."""
    cache: VjpCache = self.entry.vjp
    if not cache.none_for_unreached:
      return None
    cts = [
      jax.ShapeDtypeStruct(
        shape,
        dtypes.TORCH_TO_JAX[dtype]
        if (dtype.is_floating_point or dtype.is_complex)
        else jax.dtypes.float0,
      )
      for shape, dtype in self.out_avals
    ]
    out_shapes = tuple(shape for shape, _ in self.out_avals)
    try:
      bwd = cache.backward(self.mask, self.diff, self.rest, out_shapes)
      return cache.unreached(bwd, self.residuals, self.out_def.unflatten(cts), len(self.diff))
    except Exception as e:  # (re-raised with the call named)
      raise _differentiation_error(self.entry.name, e) from e

  def differentiable_backward(
    self, saved: tuple[torch.Tensor, ...], grads: tuple[torch.Tensor, ...]
  ) -> list[torch.Tensor | None]:
    """The input gradients as a differentiable call of the `_Pullback` on the saved input
    tensors and the output gradients (`create_graph=True`). None for an input the gradient
    cannot reach, as in `backward` (where the entry's cache says so)."""
    self._check_usable()
    with _x64_scope(self.x64):
      unreached = self._unreached_abstract()
      pullback = self.entry.vjp.pullback(self.mask, self.out_def, self.entry.name)
      arrays = _merge(self.mask, self.diff, self.rest)
      tensors = [(pos, pos, t) for pos, t in zip(self.positions, saved)]
      for g, (shape, dtype) in zip(grads, self.out_avals):
        if not (dtype.is_floating_point or dtype.is_complex):
          continue
        if g is None:
          g = torch.zeros(shape, dtype=dtype, device=self.device or "cpu")
        elif tuple(g.shape) != shape:
          g = g.expand(shape)
        tensors.append((len(arrays), len(arrays), g))
        arrays.append(_full_array(g))
      if torch.is_grad_enabled() and any(t.requires_grad for _, _, t in tensors):
        outs, _ = call_with_grad(pullback, arrays, tensors, self.outputs_to_torch, self.device)
      else:
        outs, _ = self.outputs_to_torch(pullback, pullback.forward(*arrays))
    if not _keep_graph():  # `create_graph=True, retain_graph=False`
      self._release()
    if unreached is None or not any(unreached):
      return list(outs)
    return [None if u else o for o, u in zip(outs, unreached)]

  def jvp(self, tangents: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor | None]:
    """Forward-mode AD (`torch.autograd.forward_ad`): the output tangents, JAX's JVP at this
    call's inputs of the given input tangents (one per tensor; None: zero)."""
    if torch.is_grad_enabled() and any(
      t.requires_grad for t in (*self.inputs, *(t for t in tangents if t is not None))
    ):
      return self._recorded_jvp(tangents)
    with _x64_scope(self.x64):
      primals = _merge(self.mask, self.diff, self.rest)
      tans: list[Any] = [
        jnp.zeros(np.shape(a), a.dtype)
        if _inexact(a.dtype)
        else np.zeros(np.shape(a), jax.dtypes.float0)
        for a in primals
      ]
      for pos, t in zip(self.positions, tangents):
        if t is not None and _inexact(primals[pos].dtype):
          tans[pos] = _full_array(t, "a tangent")
      out = self.entry.vjp.jvp()(tuple(primals), tuple(tans))
      return [
        (_on_device(c, self.device, "an output tangent") if _inexact(c.dtype) else None)
        for c in jax.tree_util.tree_leaves(out)
      ]

  def _recorded_jvp(self, tangents: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor | None]:
    """The output tangents as a differentiable call of `_Tangents` on the input tensors and
    their tangents: torch's backward then reaches them (forward-over-reverse)."""
    with _x64_scope(self.x64):
      primals = _merge(self.mask, self.diff, self.rest)
      inexact = tuple(_inexact(a.dtype) for a in primals)
      entry = self.entry.vjp.tangents(inexact, self.entry.name)
      arrays = list(primals)
      tensors = [(pos, pos, t) for pos, t in zip(self.positions, self.inputs)]
      by_position = {pos: t for pos, t in zip(self.positions, tangents) if t is not None}
      for pos, a in enumerate(primals):
        if not inexact[pos]:
          continue
        t = by_position.get(pos)
        if t is None:
          arrays.append(jnp.zeros(np.shape(a), a.dtype))
        else:
          tensors.append((len(arrays), len(arrays), t))
          arrays.append(_full_array(t, "a tangent"))
      outs, _ = call_with_grad(entry, arrays, tensors, self.outputs_to_torch, self.device)
    found = iter(outs)
    return [
      next(found) if (dtype.is_floating_point or dtype.is_complex) else None
      for _, dtype in self.out_avals
    ]

  def _release(self) -> None:
    self.residuals = self.diff = self.rest = None

  def _check_usable(self) -> None:
    """Raises if the forward could not be differentiated, or a backward released it."""
    if isinstance(self.residuals, Exception):
      raise _differentiation_error(self.entry.name, self.residuals) from self.residuals
    # torch raises this itself from `ctx.saved_tensors`; this covers a node that saved none
    if self.diff is None:
      raise RuntimeError(
        f"`{_API}`: trying to backward through the graph a second time (or directly "
        "access saved tensors after they have already been freed): the residuals of "
        f"{self.entry.name} were released by the first backward. Specify "
        "retain_graph=True if you need to backward through the graph a second time."
      )

  def written_back(self) -> frozenset[int]:
    """Positions of inputs the entry's caller overwrites after the forward (compiled state)."""
    written = getattr(self.entry, "written_back", None)
    return written() if written is not None else frozenset()


def _full_array(g: torch.Tensor, what: str = "an output gradient") -> Any:
  """An output gradient (or a tangent) as an array of its full shape (a differentiable input
  of the pullback, so no stride-0 shortcut)."""
  if isinstance(g, tensor_lib.Tensor):
    return tensor_lib.value(g)
  return transfer.tensor_to_jax_arg(g.detach(), api=_API, where=lambda: what)


def _batched_error(name: str) -> BridgeError:
  return BridgeError(
    f"`{_API}`: the backward of {name} was asked for with batched output gradients "
    "(`torch.autograd.grad(..., is_grads_batched=True)`, or a torch.func transform), which "
    "the JAX pullback does not take. Ask for one gradient at a time (a loop over the "
    "grad_outputs), or take the batched derivative in JAX (`jax.vmap` of `jax.vjp`, or "
    "`jax.jacrev`) inside the function."
  )


def _differentiation_error(name: str, cause: Exception) -> BridgeError:
  return BridgeError(
    f"`{_API}`: a gradient was requested through {name}, but JAX cannot differentiate "
    f"it: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''} Give "
    "it a derivative with `jax.custom_vjp`, or detach its inputs if no gradient is needed."
  )


def _x64_scope(x64: bool) -> Any:
  """Re-enter the forward's 64-bit setting, so the backward sees the same types."""
  return contextlib.nullcontext() if x64 == dtypes.x64_enabled() else jax.enable_x64(x64)


def _cotangent(g: torch.Tensor | None, shape: tuple, dtype: torch.dtype) -> Any:
  if not (dtype.is_floating_point or dtype.is_complex):
    return np.zeros(shape, jax.dtypes.float0)  # integer and bool outputs: no cotangent
  if g is None:
    return jnp.zeros(shape, dtypes.TORCH_TO_JAX[dtype])
  if isinstance(g, tensor_lib.Tensor):
    ct = tensor_lib.value(g)
    return jnp.conj(ct) if g.is_complex() else ct
  strides = g.stride()
  if 0 in strides:  # an expanded gradient (e.g. of .sum()): pass what is distinct
    index = _DISTINCT.get(strides)
    if index is None:
      index = tuple(slice(0, 1) if st == 0 else slice(None) for st in strides)
      if len(_DISTINCT) < 256:
        _DISTINCT[strides] = index
    arg = transfer.fast_tensor_arg(g, index) if transfer.default_device_is_cpu() else None
    if arg is not None:
      return np.conj(arg) if g.is_complex() else arg
    g = g[index]
  ct = transfer.tensor_to_jax_arg(g, api=_API, where=lambda: "an output gradient")
  return np.conj(ct) if g.is_complex() else ct


# strides with a 0 -> the basic index of an expanded gradient's distinct values
_DISTINCT: dict[tuple[int, ...], tuple[slice, ...]] = {}


def _on_device(c: jax.Array, device: torch.device | None, what: str) -> torch.Tensor:
  """`c` as a tensor: on the `jax` device `device`, or (None) where the array is."""
  if device is not None:
    return tensor_lib.make(c, device)
  return transfer.array_to_torch_arg(c, api=_API, where=lambda: what)


def _gradient(c: jax.Array, device: torch.device | None) -> torch.Tensor:
  complex_ = c.dtype.kind == "c"
  if device is None and not complex_:  # (a fresh output of the backward: nothing else holds it)
    t = transfer.fast_array_out(c)
    if t is not None:
      return t
  return _on_device(c.conj() if complex_ else c, device, "an input gradient")


class _JaxFunction(torch.autograd.Function):
  """The torch autograd node of a differentiable `call_jax`."""

  @staticmethod
  def forward(ctx: Any, call: _Call, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    outs = call.forward()
    ctx.call = call
    if _fwd_ad._current_level >= 0:  # for a tangent torch records (`_Call._recorded_jvp`)
      call.inputs = tensors
    # Saved as torch saves an op's inputs: torch then refuses a second backward once the
    # graph is freed and a backward after an input was changed in place (the residuals may
    # alias its memory), and a recorded backward (`create_graph`) links to these tensors.
    # Module state that a compiled forward updates is written back in place by the call
    # itself, after this: those tensors are kept without torch's version check.
    written = call.written_back()
    if written:
      ctx.unchecked = {i: t for i, t in enumerate(tensors) if call.positions[i] in written}
      ctx.save_for_backward(*(t for i, t in enumerate(tensors) if i not in ctx.unchecked))
    else:
      ctx.unchecked = None
      ctx.save_for_backward(*tensors)
    integral = [o for o in outs if not (o.is_floating_point() or o.is_complex())]
    if integral:
      ctx.mark_non_differentiable(*integral)
    return tuple(outs)

  @staticmethod
  def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    call: _Call = ctx.call
    saved = ctx.saved_tensors  # torch's error if the graph was freed by an earlier backward
    if ctx.unchecked:
      rest = iter(saved)
      saved = tuple(
        ctx.unchecked[i] if i in ctx.unchecked else next(rest) for i in range(len(call.positions))
      )
    try:
      if torch.is_grad_enabled():  # create_graph=True: a backward that is itself recorded
        in_grads = iter(call.differentiable_backward(saved, grads))
      else:
        in_grads = iter(call.backward(grads, _keep_graph()))
    except RuntimeError as e:
      if any(g is not None and (_legacy_batched(g) or _functorch_wrapped(g)) for g in grads):
        raise _batched_error(call.entry.name) from e
      raise
    # One gradient per tensor given to forward(); the mask picked exactly the
    # tensors that require grad, in the same order.
    if all(call.tensor_mask):
      return (None, *in_grads)
    return (None, *(next(in_grads) if m else None for m in call.tensor_mask))

  @staticmethod
  def jvp(ctx: Any, _: Any, *tangents: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    return tuple(ctx.call.jvp(tangents))


_get_keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
_set_grad_enabled = torch._C._set_grad_enabled
_set_fwd_grad_enabled = torch._C._set_fwd_grad_enabled
_fwd_grad_enabled = torch._C._is_fwd_grad_enabled


def _keep_graph() -> bool:
  """Whether the running backward retains the graph (`retain_graph=True`); True if this
  torch cannot tell, so residuals are then kept as long as the graph."""
  return True if _get_keep_graph is None else bool(_get_keep_graph())


def call_with_grad(
  entry: Any,
  arrays: list,
  tensors: list,
  outputs_to_torch: Callable,
  device: torch.device | None = None,
) -> tuple[list[torch.Tensor], Any]:
  """Run `entry` on `arrays` as a torch autograd node; returns (outputs, output treedef).

  `device`: the `jax` device when the tensors live there (gradients are made there too).
  """
  given = [t for _, _, t in tensors]
  tensor_mask = tuple([t.requires_grad for t in given])
  mask = [False] * len(arrays)
  for (pos, _, _), m in zip(tensors, tensor_mask):
    mask[pos] = m
  call = _Call(entry, tuple(mask), arrays, outputs_to_torch)
  call.device = device
  call.positions = tuple([pos for pos, _, _ in tensors])
  call.tensor_mask = tensor_mask
  if _transforms_active() or any(_functorch_wrapped(t) for t in given):
    outs = _JaxFunction.apply(call, *given)
  else:
    # torch's own C `apply`: `Function.apply`'s Python layer only binds default arguments
    # for a `setup_context` (there is none) and unwraps dead torch.func wrappers (none here)
    outs = _apply(call, *given)
  return list(outs), call.out_def


_transforms_active = torch._C._are_functorch_transforms_active
_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_legacy_batched = torch._C._functorch.is_legacy_batchedtensor
_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, _JaxFunction)
