"""Packed sequences (`pack_padded_sequence` -> `nn.LSTM`/`nn.GRU`/`nn.RNN` ->
`pad_packed_sequence`) through every path: `extract_jax` under `jax.jit(jax.grad)`,
`call_torch`, `bridge.compile` with torch autograd, and the `jax` device.

`lengths` stays a CPU tensor (or a Python list), as torch requires: the packed layout is then
known while tracing and the packed data are static-shape slices of the input.
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pack_sequence, pad_packed_sequence

import bridge

RNNS = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn": torch.nn.RNN}
TOL = dict(rtol=1e-5, atol=1e-5)


def _t(a) -> torch.Tensor:
  return torch.tensor(np.asarray(a))


class Packed(torch.nn.Module):
  """A two-layer bidirectional recurrent layer over padded, variable-length sequences."""

  def __init__(self, kind: str, enforce_sorted: bool):
    super().__init__()
    self.rnn = RNNS[kind](4, 5, num_layers=2, batch_first=True, bidirectional=True)
    self.enforce_sorted = enforce_sorted

  def forward(self, x: torch.Tensor, lengths) -> tuple[torch.Tensor, torch.Tensor]:
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=self.enforce_sorted)
    out, h = self.rnn(packed)
    if isinstance(h, tuple):
      h = h[0]
    padded, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return padded, h


def _loss(out: tuple) -> torch.Tensor:
  padded, h = out
  return (padded * padded).sum() + (h * h).sum()


def _case(kind: str, enforce_sorted: bool):
  torch.manual_seed(0)
  model = Packed(kind, enforce_sorted)
  x = torch.randn(3, 7, 4)
  lengths = [6, 4, 2] if enforce_sorted else [4, 6, 2]
  xr = x.clone().requires_grad_()
  expected = model(xr, torch.tensor(lengths))
  grads = torch.autograd.grad(_loss(expected), [xr, *model.parameters()])
  return model, x, lengths, expected, grads


@pytest.mark.parametrize(
  "kind,enforce_sorted", [("lstm", True), ("lstm", False), ("gru", True), ("rnn", False)]
)
@pytest.mark.filterwarnings("ignore:bridge. torch code is being traced into a JAX program built")
def test_extract_jax_under_jit_and_grad(kind, enforce_sorted):
  model, x, lengths, (want_out, want_h), (want_gx, *want_gp) = _case(kind, enforce_sorted)
  params, fn = bridge.extract_jax(model)
  xa = jnp.asarray(x.numpy())

  out, h = jax.jit(lambda p, a: fn(p, a, lengths))(params, xa)
  torch.testing.assert_close(_t(out), want_out.detach(), **TOL)
  torch.testing.assert_close(_t(h), want_h.detach(), **TOL)
  # padding past each sequence's length is zero, as torch pads
  assert not np.asarray(out)[2, 2:].any()

  def loss(p, a):
    o, hh = fn(p, a, lengths)
    return (o * o).sum() + (hh * hh).sum()

  gp, gx = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, xa)
  torch.testing.assert_close(_t(gx), want_gx, **TOL)
  for (name, _), want in zip(model.named_parameters(), want_gp):
    torch.testing.assert_close(_t(gp[name]), want, **TOL, msg=name)


@pytest.mark.parametrize("kind,enforce_sorted", [("lstm", False), ("gru", True)])
def test_compile_joins_torch_autograd(kind, enforce_sorted):
  model, x, lengths, (want_out, want_h), (want_gx, *want_gp) = _case(kind, enforce_sorted)
  compiled = bridge.compile(model)
  xr = x.clone().requires_grad_()
  out = compiled(xr, lengths)  # a list: static, like any Python value
  torch.testing.assert_close(out[0], want_out.detach(), **TOL)
  torch.testing.assert_close(out[1], want_h.detach(), **TOL)
  _loss(out).backward()
  torch.testing.assert_close(xr.grad, want_gx, **TOL)
  for p, want in zip(model.parameters(), want_gp):
    torch.testing.assert_close(p.grad, want, **TOL)


@pytest.mark.parametrize("kind,enforce_sorted", [("lstm", True), ("gru", False)])
def test_jax_device_forward_and_backward(kind, enforce_sorted):
  model, x, lengths, (want_out, want_h), (want_gx, *want_gp) = _case(kind, enforce_sorted)
  on_jax = copy.deepcopy(model).to("jax")
  xj = x.to("jax").requires_grad_()
  out = on_jax(xj, torch.tensor(lengths))
  assert out[0].device.type == "jax" and out[0].shape == want_out.shape
  torch.testing.assert_close(out[0].cpu(), want_out.detach(), **TOL)
  _loss(out).backward()
  torch.testing.assert_close(xj.grad.cpu(), want_gx, **TOL)
  for p, want in zip(on_jax.parameters(), want_gp):
    torch.testing.assert_close(p.grad.cpu(), want, **TOL)


def test_call_torch_pack_sequence_with_closed_over_lengths():
  torch.manual_seed(1)
  gru = torch.nn.GRU(3, 2)
  seqs = [torch.randn(n, 3) for n in (5, 3, 2)]

  def f(a, b, c):
    out, h = gru(pack_sequence([a, b, c]))
    data, sizes = out.data, out.batch_sizes
    assert sizes.device.type == "cpu"  # torch's kernels read it on the host
    return data, h

  want = f(*seqs)
  got = jax.jit(lambda *a: bridge.call_torch(f, *a))(*(jnp.asarray(s.numpy()) for s in seqs))
  assert got[0].shape == (10, 2)
  for g, w in zip(got, want):
    torch.testing.assert_close(_t(g), w.detach(), **TOL)


def test_packed_data_and_batch_sizes_match_torch():
  x = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3)
  want = torch._pack_padded_sequence(x, torch.tensor([5, 3]), True)
  data, sizes = torch._pack_padded_sequence(x.to("jax"), torch.tensor([5, 3]), True)
  assert data.device.type == "jax" and sizes.device.type == "cpu"
  assert sizes.dtype == torch.int64 and sizes.tolist() == want[1].tolist() == [2, 2, 2, 1, 1]
  torch.testing.assert_close(data.cpu(), want[0], rtol=0, atol=0)


@pytest.mark.parametrize(
  "lengths,message",
  [
    (
      [2, 4, 6],
      "`lengths` array must be sorted in decreasing order when `enforce_sorted` is "
      "True. You can pass `enforce_sorted=False`",
    ),
    (
      [6, 4, 0],
      "Length of all samples has to be greater than 0, but found an element in "
      "'lengths' that is <= 0",
    ),
    ([6, 4], r"Expected `len\(lengths\)` to be equal to batch_size, but got 2 \(batch_size=3\)"),
  ],
)
def test_bad_lengths_fail_as_in_torch(lengths, message):
  x = torch.randn(6, 3, 4)
  with pytest.raises(RuntimeError, match=message):
    torch._pack_padded_sequence(x, torch.tensor(lengths), False)
  with pytest.raises(RuntimeError, match=message):
    torch._pack_padded_sequence(x.to("jax"), torch.tensor(lengths), False)


def test_lengths_on_the_jax_device_or_traced_are_refused_clearly():
  x = torch.randn(6, 3, 4)
  with pytest.raises(
    RuntimeError,
    match="'lengths' argument should be a 1D CPU int64 tensor, but got 1D jax:0 Long tensor$",
  ):
    torch._pack_padded_sequence(x.to("jax"), torch.tensor([6, 4, 2], device="jax"), False)
  model = Packed("gru", True)
  with pytest.raises(
    RuntimeError,
    match="the packed layout must be known while tracing: pass the lengths as a Python list",
  ):
    bridge.compile(model)(x.transpose(0, 1), torch.tensor([6, 4, 2]))
