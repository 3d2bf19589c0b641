"""Lowerings of torch's fused recurrent cells: what `nn.GRUCell`/`nn.GRU` and
`nn.LSTMCell`/`nn.LSTM` reach on a non-CPU device.

On CUDA, XPU and PrivateUse1 (the `jax` device) torch's cells compute the gate
matmuls themselves and hand the elementwise rest to one fused op; the full
modules (`aten.gru.input`, `aten.lstm.input`) are CompositeImplicitAutograd and
loop over these same cells. CPU has no kernel for the fused ops, so their
semantics follow `aten/src/ATen/native/cuda/RNN.cu`, workspace layout included
(the backward ops read it):

* GRU gates are (reset, update, new), chunks of `input_gates`/`hidden_gates` of
  width H; the hidden bias of the new gate sits inside the reset product:
  `n = tanh(i_n + b_in + r * (h_n + b_hn))`, `hy = n + z * (hx - n)`. The
  workspace is (B, 5H): `[r, z, n, hx, h_n + b_hn]`.
* LSTM gates are (input, forget, cell, output); `cy = f * cx + i * g`,
  `hy = o * tanh(cy)`. The workspace is (B, 4H): the activated `[i, f, g, o]`.

torch's autograd calls `_thnn_fused_gru_cell_backward` and
`_thnn_fused_lstm_cell_backward` (CompositeImplicitAutograd, it calls
`_thnn_fused_lstm_cell_backward_impl` and repeats the gate and bias gradients for
the input and hidden sides) when the backward itself is not differentiated; under
`create_graph=True` it uses the composite `_thnn_differentiable_*_backward` ops
instead, which need nothing here. Half types compute in float32, as the CUDA
kernels do in their accumulate type.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bridge_ops._lowering import aten, lowering, opmath


def _chunks(x, n: int, dtype):
  """`x` split into `n` gate chunks along its last axis, in `dtype`; zeros for a missing bias."""
  return jnp.split(x.astype(dtype), n, axis=-1) if x is not None else [0.0] * n


@lowering(aten._thnn_fused_gru_cell.default)
def _thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
  f = opmath(input_gates.dtype)
  ir, ii, in_ = _chunks(input_gates, 3, f)
  hr, hi, hn = _chunks(hidden_gates, 3, f)
  b1r, b1i, b1n = _chunks(input_bias, 3, f)
  b2r, b2i, b2n = _chunks(hidden_bias, 3, f)
  r = jax.nn.sigmoid(ir + hr + b1r + b2r)
  z = jax.nn.sigmoid(ii + hi + b1i + b2i)
  hn = hn + b2n
  n = jnp.tanh(in_ + b1n + r * hn)
  hy = n + z * (hx.astype(f) - n)
  workspace = jnp.concatenate([r, z, n, hx.astype(f), hn], axis=-1)
  return hy.astype(hx.dtype), workspace.astype(hx.dtype)


@lowering(aten._thnn_fused_gru_cell_backward.default, static_argnames=("has_bias",))
def _thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
  dtype = grad_hy.dtype
  r, z, n, hx, hn = _chunks(workspace, 5, opmath(dtype))
  go = grad_hy.astype(r.dtype)
  gz = go * (hx - n) * (1 - z) * z
  gn = go * (1 - z) * (1 - n * n)
  gr = gn * hn * (1 - r) * r
  grad_input_gates = jnp.concatenate([gr, gz, gn], axis=-1).astype(dtype)
  grad_hidden_gates = jnp.concatenate([gr, gz, gn * r], axis=-1).astype(dtype)
  grad_hx = (go * z).astype(dtype)
  if not has_bias:
    return grad_input_gates, grad_hidden_gates, grad_hx, None, None
  return (
    grad_input_gates,
    grad_hidden_gates,
    grad_hx,
    grad_input_gates.sum(axis=0),
    grad_hidden_gates.sum(axis=0),
  )


@lowering(aten._thnn_fused_lstm_cell.default)
def _thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
  f = opmath(input_gates.dtype)
  gates = [
    x + h + b1 + b2
    for x, h, b1, b2 in zip(
      _chunks(input_gates, 4, f),
      _chunks(hidden_gates, 4, f),
      _chunks(input_bias, 4, f),
      _chunks(hidden_bias, 4, f),
    )
  ]
  i, fg, o = (jax.nn.sigmoid(gates[k]) for k in (0, 1, 3))
  g = jnp.tanh(gates[2])
  cy = fg * cx.astype(f) + i * g
  hy = o * jnp.tanh(cy)
  workspace = jnp.concatenate([i, fg, g, o], axis=-1)
  return hy.astype(cx.dtype), cy.astype(cx.dtype), workspace.astype(input_gates.dtype)


@lowering(aten._thnn_fused_lstm_cell_backward_impl.default, static_argnames=("has_bias",))
def _thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
  if grad_hy is None and grad_cy is None:
    return None, None, None
  i, fg, g, o = _chunks(workspace, 4, opmath(workspace.dtype))
  go = 0.0 if grad_hy is None else grad_hy.astype(i.dtype)
  goc = 0.0 if grad_cy is None else grad_cy.astype(i.dtype)
  t = jnp.tanh(cy.astype(i.dtype))
  gc = go * o * (1 - t * t) + goc
  grad_gates = jnp.concatenate(
    [
      gc * g * (1 - i) * i,
      gc * cx.astype(i.dtype) * (1 - fg) * fg,
      gc * i * (1 - g * g),
      go * t * (1 - o) * o,
    ],
    axis=-1,
  ).astype(workspace.dtype)
  grad_cx = (gc * fg).astype(cx.dtype)
  return grad_gates, grad_cx, grad_gates.sum(axis=0) if has_bias else None
