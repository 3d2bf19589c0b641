"""Torch autograd through JAX: the `torch.autograd.Function` behind a differentiable `call_jax`.

The forward runs `jax.vjp` under `jit` and keeps JAX's residuals (no
recomputation in the backward); the pullback's structure is remembered per
input signature on the Python side, so only arrays cross the `jit` boundary and
the backward is one cached jitted call. Complex gradients follow torch's
convention: the conjugate of JAX's cotangent.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from bridge._src import dtypes
from bridge._src import tensor as tensor_lib
from bridge._src import transfer
from bridge._src.errors import BridgeError

_API = "bridge.call_jax"


def _concrete_signature(arrays: tuple) -> tuple:
  x64 = dtypes.x64_enabled()
  return tuple((a.shape, a.dtype if x64 else jax.dtypes.canonicalize_dtype(a.dtype),
                getattr(a, "weak_type", False)) for a in arrays) + (x64,)


def _abstract_signature(tracers: tuple) -> tuple:
  return tuple((t.aval.shape, t.aval.dtype, t.aval.weak_type)
               for t in tracers) + (dtypes.x64_enabled(),)


class VjpCache:
  """The jitted forward-with-residuals and backward of one function, per input mask."""

  def __init__(self, apply: Callable[..., Any]):
    self.apply = apply
    self.errors: dict[tuple[bool, ...], Exception] = {}  # masks JAX cannot differentiate
    self._forwards: dict[tuple[bool, ...], Callable] = {}
    self._residual_defs: dict[tuple, Any] = {}
    self._backwards: dict[tuple, Callable] = {}
    self._lock = threading.Lock()

  def _merge(self, mask: tuple[bool, ...], diff: tuple, rest: tuple) -> list:
    d, r = iter(diff), iter(rest)
    return [next(d) if m else next(r) for m in mask]

  def forward(self, mask: tuple[bool, ...]) -> Callable:
    """The jitted `(diff, rest) -> (out, residuals)`; `mask` marks the differentiated inputs."""
    fwd = self._forwards.get(mask)
    if fwd is None:
      def fwd_impl(diff: tuple, rest: tuple) -> Any:
        out, pullback = jax.vjp(lambda *d: self.apply(*self._merge(mask, d, rest)), *diff)
        residuals, res_def = jax.tree_util.tree_flatten(pullback)
        self._residual_defs[(mask, _abstract_signature(diff + rest))] = res_def
        return out, residuals
      with self._lock:
        fwd = self._forwards.setdefault(mask, jax.jit(fwd_impl))
    return fwd

  def backward(self, mask: tuple[bool, ...], diff: tuple, rest: tuple,
               out_shapes: tuple) -> Callable:
    """The jitted `(residuals, cotangents) -> input cotangents` for this forward's inputs.

    Cotangents may come in smaller than the outputs (the stride-0 gradient of `.sum()` is
    passed as its one distinct value); they are broadcast to `out_shapes` inside.
    """
    key = (mask, _concrete_signature(diff + rest))
    bwd = self._backwards.get(key)
    if bwd is None:
      res_def = self._residual_defs[key]

      def bwd_impl(res: list, cts: Any) -> Any:
        leaves, ct_def = jax.tree_util.tree_flatten(cts)
        full = [c if np.dtype(c.dtype) == jax.dtypes.float0 else jnp.broadcast_to(c, shape)
                for c, shape in zip(leaves, out_shapes)]
        return res_def.unflatten(res)(ct_def.unflatten(full))
      with self._lock:
        bwd = self._backwards.setdefault(key, jax.jit(bwd_impl))
    return bwd


class _Call:
  """One differentiable call: the forward with residuals, then the backward."""

  def __init__(self, entry: Any, mask: tuple[bool, ...], arrays: list,
               outputs_to_torch: Callable):
    self.entry, self.mask = entry, mask
    self.diff = tuple(a for a, m in zip(arrays, mask) if m)
    self.rest = tuple(a for a, m in zip(arrays, mask) if not m)
    self.outputs_to_torch = outputs_to_torch
    self.x64 = dtypes.x64_enabled()
    self.residuals: Any = None
    self.out_def: Any = None
    self.out_avals: list[tuple[tuple, np.dtype]] = []
    self.device: torch.device | None = None  # the `jax` device when the inputs live there

  def forward(self) -> list[torch.Tensor]:
    # torch runs `Function.forward` with grad mode off; the traced torch code of a compiled
    # module gets the caller's mode (on) back, so that its own `torch.no_grad()` blocks stand
    # out (their results are constants for the VJP, as for torch autograd)
    with torch.enable_grad(), torch.autograd.forward_ad._set_fwd_grad_enabled(True):
      return self._forward()

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
      out = self.entry.forward(*cache._merge(self.mask, self.diff, self.rest))
      cache.errors[self.mask] = self.residuals = error
    outs, self.out_def = self.outputs_to_torch(self.entry, out)
    self.out_avals = [(tuple(o.shape), o.dtype) for o in outs]
    return outs

  def backward(self, grads: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor]:
    if isinstance(self.residuals, Exception):
      raise _differentiation_error(self.entry.name, self.residuals) from self.residuals
    with _x64_scope(self.x64):
      cts = [_cotangent(g, shape, dtype) for g, (shape, dtype) in zip(grads, self.out_avals)]
      bwd = self.entry.vjp.backward(self.mask, self.diff, self.rest,
                                    tuple(shape for shape, _ in self.out_avals))
      try:
        in_cts = bwd(self.residuals, self.out_def.unflatten(cts))
      except Exception as e:  # noqa: BLE001 - re-raised with the call named
        # e.g. JAX linearizes a while_loop but cannot transpose it.
        raise _differentiation_error(self.entry.name, e) from e
      return [_gradient(c, self.device) for c in in_cts]


def _differentiation_error(name: str, cause: Exception) -> BridgeError:
  return BridgeError(
      f"`{_API}`: a gradient was requested through {name}, but JAX cannot differentiate "
      f"it: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''} Give "
      "it a derivative with `jax.custom_vjp`, or detach its inputs if no gradient is needed.")


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
  if 0 in strides and g.dim():  # an expanded gradient (e.g. of .sum()): pass what is distinct
    g = g[tuple(slice(0, 1) if st == 0 else slice(None) for st in strides)]
  ct = transfer.tensor_to_jax_arg(g, api=_API, where=lambda: "an output gradient")
  return np.conj(ct) if g.is_complex() else ct


def _gradient(c: jax.Array, device: torch.device | None) -> torch.Tensor:
  if c.dtype.kind == "c":
    c = c.conj()
  if device is not None:
    return tensor_lib.make(c, device)
  return transfer.array_to_torch_arg(c, api=_API, where=lambda: "an input gradient")


class _JaxFunction(torch.autograd.Function):
  """The torch autograd node of a differentiable `call_jax`."""

  @staticmethod
  def forward(ctx: Any, call: _Call, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    outs = call.forward()
    ctx.call = call
    ctx.mark_non_differentiable(*(o for o in outs
                                  if not (o.is_floating_point() or o.is_complex())))
    return tuple(outs)

  @staticmethod
  def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    call: _Call = ctx.call
    in_grads = iter(call.backward(grads))
    # One gradient per tensor given to forward(); the mask picked exactly the
    # tensors that require grad, in the same order.
    return (None, *(next(in_grads) if m else None for m in call.tensor_mask))


def call_with_grad(entry: Any, arrays: list, tensors: list, outputs_to_torch: Callable,
                   device: torch.device | None = None) -> tuple[list[torch.Tensor], Any]:
  """Run `entry` on `arrays` as a torch autograd node; returns (outputs, output treedef).

  `device`: the `jax` device when the tensors live there (gradients are made there too).
  """
  wanted = {pos for pos, _, t in tensors if t.requires_grad}
  call = _Call(entry, tuple(i in wanted for i in range(len(arrays))), arrays, outputs_to_torch)
  call.device = device
  call.tensor_mask = tuple(t.requires_grad for _, _, t in tensors)
  outs = _JaxFunction.apply(call, *(t for _, _, t in tensors))
  return list(outs), call.out_def
