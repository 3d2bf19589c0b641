"""Recurrent family: torch's fused GRU/LSTM cells, and the `nn` RNN modules built on them.

CPU has no kernel for the fused cell ops (they are CUDA/XPU/PrivateUse1 only), so
the op-level references are torch's own CPU code paths: `torch.gru_cell` /
`torch.lstm_cell` (unfused) for `hy`/`cy`, the CompositeImplicit
`_thnn_differentiable_*_cell_backward` ops for the gradients, and the CUDA
kernels' formulas (`aten/src/ATen/native/cuda/RNN.cu`) for the workspace layout.
Module tests compare the `jax` device (torch autograd) and `extract_jax` +
`jax.grad` (JAX autodiff) with torch on CPU.
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from tests.ops.harness import lowering_of

aten = torch.ops.aten
B, H = 3, 5

# (rtol, atol) per dtype: float32 differs from torch's CPU path by summation order only.
TOL = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-7, 1e-7), torch.bfloat16: (2e-2, 2e-2)}
DTYPES = list(TOL)


def _gen(seed: int = 0) -> torch.Generator:
  return torch.Generator().manual_seed(seed)


def _randn(*shape, dtype=torch.float32, g):
  return torch.randn(*shape, generator=g).to(dtype)


# --- running one op: its lowering directly, and on the jax device ----------------------------


def _to_jax(x):
  if isinstance(x, torch.Tensor):
    return (
      jnp.asarray(x.float().numpy()).astype(jnp.bfloat16)
      if x.dtype == torch.bfloat16
      else jnp.asarray(x.numpy())
    )
  return x


def _to_torch(x):
  if x is None:
    return None
  if x.dtype == jnp.bfloat16:
    return torch.from_numpy(np.array(x.astype(jnp.float32))).to(torch.bfloat16)
  return torch.from_numpy(np.array(x))


def _runs(op, *args):
  """[the lowering called on JAX arrays, the op on the jax device], as CPU torch tensors."""
  with jax.enable_x64(True):
    direct = [_to_torch(o) for o in lowering_of(op).fn(*[_to_jax(a) for a in args])]
  dev = op(*[a.to("jax") if isinstance(a, torch.Tensor) else a for a in args])
  return [direct, [None if o is None else o.cpu() for o in dev]]


def _close(actual, expected, dtype):
  rtol, atol = TOL[dtype]
  torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


def _cell_args(factor, dtype, has_bias, seed=0):
  g = _gen(seed)
  ig, hg = _randn(B, factor * H, dtype=dtype, g=g), _randn(B, factor * H, dtype=dtype, g=g)
  h = _randn(B, H, dtype=dtype, g=g)
  biases = [_randn(factor * H, dtype=dtype, g=g) for _ in range(2)] if has_bias else [None] * 2
  return ig, hg, h, *biases


def _cpu_cell(factor, ig, hg, state, bi):
  """torch's own (unfused) CPU cell on these gates, in float64, row by row: identity input
  weights, zero hidden weights, the row's hidden gates (bias included) as the hidden bias."""
  eye = torch.eye(factor * H, dtype=torch.float64)
  zeros = torch.zeros(factor * H, H, dtype=torch.float64)
  d = lambda t: None if t is None else t.double()
  rows = []
  for r in range(B):
    s = [t[r : r + 1].double() for t in state]
    op = torch.gru_cell if factor == 3 else torch.lstm_cell
    out = op(ig[r : r + 1].double(), s[0] if factor == 3 else s, eye, zeros, d(bi), hg[r].double())
    rows.append(out if factor == 3 else torch.cat(out, 1))
  return torch.cat(rows, 0)


def _hidden_gates_with_bias(hg, bh):
  return hg.double() if bh is None else hg.double() + bh.double()


# --- GRU cell --------------------------------------------------------------------------------


def _gru_ref(ig, hg, hx, bi, bh):
  """RNN.cu's gru_cell_forward in float64: (hy, workspace [r, z, n, hx, h_n + b_hn])."""
  f = lambda t: torch.zeros(3 * H, dtype=torch.float64) if t is None else t.double()
  (ir, ii, in_), (hr, hi, hn) = ig.double().chunk(3, 1), hg.double().chunk(3, 1)
  (b1r, b1i, b1n), (b2r, b2i, b2n) = f(bi).chunk(3), f(bh).chunk(3)
  r, z = torch.sigmoid(ir + hr + b1r + b2r), torch.sigmoid(ii + hi + b1i + b2i)
  n = torch.tanh(in_ + b1n + r * (hn + b2n))
  return n + z * (hx.double() - n), torch.cat([r, z, n, hx.double(), hn + b2n], 1)


@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_gru_cell(dtype, has_bias):
  ig, hg, hx, bi, bh = args = _cell_args(3, dtype, has_bias)
  hy_ref, ws_ref = _gru_ref(*args)
  cpu = _cpu_cell(3, ig, _hidden_gates_with_bias(hg, bh), [hx], bi)
  torch.testing.assert_close(cpu, hy_ref)
  for hy, ws in _runs(aten._thnn_fused_gru_cell.default, *args):
    assert hy.dtype == ws.dtype == dtype and ws.shape == (B, 5 * H)
    _close(hy, hy_ref.to(dtype), dtype)
    _close(ws, ws_ref.to(dtype), dtype)


@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_gru_cell_backward(dtype, has_bias):
  args = _cell_args(3, dtype, has_bias)
  ws = _gru_ref(*args)[1].to(dtype)
  grad_hy = _randn(B, H, dtype=dtype, g=_gen(1))
  d = lambda t: None if t is None else t.double()
  expected = aten._thnn_differentiable_gru_cell_backward(d(grad_hy), *[d(a) for a in args])
  expected = [None if e is None else e.to(dtype) for e in expected]
  for out in _runs(aten._thnn_fused_gru_cell_backward.default, grad_hy, ws, has_bias):
    _close(out, expected, dtype)


# --- LSTM cell -------------------------------------------------------------------------------


def _lstm_ref(ig, hg, cx, bi, bh):
  """RNN.cu's lstm_cell_forward in float64: (hy, cy, workspace [i, f, g, o])."""
  f = lambda t: torch.zeros(4 * H, dtype=torch.float64) if t is None else t.double()
  gates = (ig.double() + hg.double() + f(bi) + f(bh)).chunk(4, 1)
  i, fg, g, o = gates[0].sigmoid(), gates[1].sigmoid(), gates[2].tanh(), gates[3].sigmoid()
  cy = fg * cx.double() + i * g
  return o * cy.tanh(), cy, torch.cat([i, fg, g, o], 1)


@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_lstm_cell(dtype, has_bias):
  ig, hg, cx, bi, bh = args = _cell_args(4, dtype, has_bias)
  hy_ref, cy_ref, ws_ref = _lstm_ref(*args)
  cpu = _cpu_cell(4, ig, _hidden_gates_with_bias(hg, bh), [torch.zeros(B, H), cx], bi)
  torch.testing.assert_close(cpu, torch.cat([hy_ref, cy_ref], 1))
  for hy, cy, ws in _runs(aten._thnn_fused_lstm_cell.default, *args):
    assert hy.dtype == cy.dtype == ws.dtype == dtype and ws.shape == (B, 4 * H)
    _close((hy, cy, ws), (hy_ref.to(dtype), cy_ref.to(dtype), ws_ref.to(dtype)), dtype)


LSTM_GRADS = ["hy_and_cy", "hy", "cy", "none"]


@pytest.mark.parametrize("grads", LSTM_GRADS)
@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_lstm_cell_backward(dtype, has_bias, grads):
  args = _cell_args(4, dtype, has_bias)
  _, cy, ws = (t.to(dtype) for t in _lstm_ref(*args))
  g = _gen(1)
  grad_hy = _randn(B, H, dtype=dtype, g=g) if grads in ("hy_and_cy", "hy") else None
  grad_cy = _randn(B, H, dtype=dtype, g=g) if grads in ("hy_and_cy", "cy") else None
  d = lambda t: None if t is None else t.double()
  ig, hg, cx, bi, bh = args
  expected = aten._thnn_differentiable_lstm_cell_backward(
    d(grad_hy), d(grad_cy), d(ig), d(hg), d(bi), d(bh), d(cx), d(cy)
  )
  expected = [None if e is None else e.to(dtype) for e in expected]
  # the CompositeImplicit op autograd calls repeats `_impl`'s gate and bias gradients
  impl = [expected[0], expected[2], expected[3]]
  for out in _runs(
    aten._thnn_fused_lstm_cell_backward_impl.default, grad_hy, grad_cy, cx, cy, ws, has_bias
  ):
    _close(out, impl, dtype)
  with torch.no_grad():  # as in autograd's backward (the composite asserts it)
    dev = aten._thnn_fused_lstm_cell_backward(
      *[None if t is None else t.to("jax") for t in (grad_hy, grad_cy, cx, cy, ws)], has_bias
    )
  _close([None if o is None else o.cpu() for o in dev], expected, dtype)


# --- modules on the jax device: forward and torch autograd -----------------------------------


def _state(kind, dirs_layers, batch, g):
  shape = (dirs_layers, batch, H) if dirs_layers else (batch, H)
  h = torch.randn(*shape, generator=g)
  return (h, torch.randn(*shape, generator=g)) if kind in ("lstm", "lstm_cell") else h


def _module(kind, bias=True, batch_first=False):
  torch.manual_seed(0)
  if kind == "gru_cell":
    return torch.nn.GRUCell(4, H, bias=bias)
  if kind == "lstm_cell":
    return torch.nn.LSTMCell(4, H, bias=bias)
  cls = torch.nn.GRU if kind == "gru" else torch.nn.LSTM
  return cls(4, H, num_layers=2, bidirectional=True, batch_first=batch_first, bias=bias)


def _flat(out):
  if isinstance(out, (tuple, list)):
    return [t for o in out for t in _flat(o)]
  return [out]


def _forward_and_grads(module, inputs, create_graph=False):
  """Outputs, and gradients of a loss of all outputs w.r.t. the parameters and inputs."""
  leaves = [t.requires_grad_() for t in _flat(inputs)]
  outs = _flat(module(*inputs))
  loss = sum(((k + 1.0) * o).sin().sum() for k, o in enumerate(outs))
  wrt = list(module.parameters()) + leaves
  grads = torch.autograd.grad(loss, wrt, create_graph=create_graph)
  if create_graph:  # a gradient penalty: the backward itself differentiated
    penalty = sum(gr.square().sum() for gr in grads)
    grads = torch.autograd.grad(penalty, wrt)
  return [o.detach().cpu() for o in outs], [gr.cpu() for gr in grads]


def _on(device, inputs):
  if isinstance(inputs, (tuple, list)):
    return type(inputs)(_on(device, x) for x in inputs)
  return inputs.detach().clone().to(device)


def _compare_on_device(module, inputs, create_graph=False, rtol=1e-5, atol=1e-5):
  expected = _forward_and_grads(module, _on("cpu", inputs), create_graph)
  actual = _forward_and_grads(copy.deepcopy(module).to("jax"), _on("jax", inputs), create_graph)
  torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


CELL_CASES = {  # id: (kind, bias, input shape, give the state)
  "gru": ("gru_cell", True, (B, 4), True),
  "gru_no_bias": ("gru_cell", False, (B, 4), True),
  "gru_no_state": ("gru_cell", True, (B, 4), False),
  "gru_unbatched": ("gru_cell", True, (4,), True),
  "lstm": ("lstm_cell", True, (B, 4), True),
  "lstm_no_bias": ("lstm_cell", False, (B, 4), True),
  "lstm_no_state": ("lstm_cell", True, (B, 4), False),
  "lstm_unbatched": ("lstm_cell", True, (4,), True),
}


def _cell_inputs(kind, shape, with_state, g):
  x = torch.randn(*shape, generator=g)
  if not with_state:
    return (x,)
  return (
    x,
    _state(kind, None, shape[0], g)
    if len(shape) == 2
    else jax.tree_util.tree_map(lambda t: t[0], _state(kind, None, 1, g)),
  )


@pytest.mark.parametrize("case", CELL_CASES)
def test_cell_module_on_device(case):
  kind, bias, shape, with_state = CELL_CASES[case]
  _compare_on_device(_module(kind, bias), _cell_inputs(kind, shape, with_state, _gen()))


@pytest.mark.parametrize("kind", ["gru_cell", "lstm_cell"])
def test_cell_double_backward_on_device(kind):
  """`create_graph=True`: torch's autograd takes the differentiable composite backward."""
  _compare_on_device(
    _module(kind), _cell_inputs(kind, (B, 4), True, _gen()), create_graph=True, rtol=1e-4, atol=1e-5
  )


# Known failures, each with its reason.
KNOWN_FAILURES: dict = {}  # (kind, batch_first) -> (exception, reason); empty since the core
# runs in-place metadata ops (`output.transpose_(0, 1)` ends torch's batch_first `gru`)


@pytest.mark.parametrize("with_state", [True, False], ids=["h0", "no_h0"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["seq_first", "batch_first"])
@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_rnn_module_on_device(kind, batch_first, with_state):
  module = _module(kind, batch_first=batch_first)
  g = _gen()
  seq, batch = 6, B
  x = torch.randn(*((batch, seq) if batch_first else (seq, batch)), 4, generator=g)
  inputs = (x, _state(kind, 4, batch, g)) if with_state else (x,)
  failure = KNOWN_FAILURES.get((kind, batch_first))
  if failure is not None:
    with pytest.raises(failure[0]):
      _compare_on_device(module, inputs)
    pytest.xfail(failure[1])
  _compare_on_device(module, inputs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_rnn_module_no_bias_on_device(kind):
  module = _module(kind, bias=False)
  x = torch.randn(6, B, 4, generator=_gen())
  _compare_on_device(module, (x,), rtol=1e-4, atol=1e-5)


# --- through JAX: extract_jax + jax.grad -----------------------------------------------------


def _np(t):
  return t.detach().numpy()


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("kind", ["gru_cell", "lstm_cell"])
def test_cell_scan_gradients_match_torch(kind, jit):
  """`jax.lax.scan` over time of the cell's JAX function: value and parameter gradients equal
  torch autograd of the same loop on the CPU."""
  cell = _module(kind)
  params, fn = bridge.extract_jax(cell)
  g = _gen()
  seq = torch.randn(7, B, 4, generator=g)
  state0 = _state(kind, None, B, g)
  lstm = kind == "lstm_cell"

  def run(p, xs, s0):
    def step(s, x):
      s = fn(p, x, s)
      return (tuple(s) if lstm else s), None

    s, _ = jax.lax.scan(step, s0, xs)
    h = s[0] if lstm else s
    return jnp.sum(jnp.sin(h)) + (jnp.sum(s[1] ** 2) if lstm else 0.0)

  s0 = tuple(_np(t) for t in state0) if lstm else _np(state0)
  grad_fn = jax.value_and_grad(run, argnums=(0, 2))
  value, (grads, grad_s0) = (jax.jit(grad_fn) if jit else grad_fn)(params, _np(seq), s0)

  ts0 = [t.clone().requires_grad_() for t in (state0 if lstm else (state0,))]
  s = tuple(ts0) if lstm else ts0[0]
  for x in seq:
    s = cell(x, s)
  h = s[0] if lstm else s
  loss = h.sin().sum() + (s[1].square().sum() if lstm else 0.0)
  loss.backward()
  torch.testing.assert_close(torch.tensor(np.array(value)), loss.detach(), rtol=1e-5, atol=1e-5)
  for name, p in cell.named_parameters():
    torch.testing.assert_close(
      torch.from_numpy(np.array(grads[name])), p.grad, rtol=1e-4, atol=1e-5
    )
  for a, t in zip(grad_s0 if lstm else (grad_s0,), ts0):
    torch.testing.assert_close(torch.from_numpy(np.array(a)), t.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_rnn_module_jit_gradients_match_torch(kind):
  """A whole `nn.GRU`/`nn.LSTM` (2 layers, bidirectional) as one jitted JAX function."""
  module = _module(kind)
  params, fn = bridge.extract_jax(module)
  x = torch.randn(6, B, 4, generator=_gen())

  def loss(p, x):
    out, _ = fn(p, x)
    return jnp.sum(jnp.sin(out))

  value, grads = jax.jit(jax.value_and_grad(loss))(params, _np(x))
  out, _ = module(x)
  expected = out.sin().sum()
  expected.backward()
  torch.testing.assert_close(torch.tensor(np.array(value)), expected.detach(), rtol=1e-5, atol=1e-5)
  for name, p in module.named_parameters():
    torch.testing.assert_close(
      torch.from_numpy(np.array(grads[name])), p.grad, rtol=1e-4, atol=1e-5
    )
