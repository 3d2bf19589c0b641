"""`bridge.compile` traces again when something its program baked in changed, as eager torch
would read it on every call: a probe found five changes it missed (each call then gave the old
result, silently)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import bridge

X = torch.ones(1, 2)


def test_a_closed_over_tensor_read_through_a_view_is_seen_changed():
  w = torch.ones(2, 2)
  f = bridge.compile(lambda x: x @ w.t())  # (the view `w.t()` is gone after the trace)
  f(X)
  w.mul_(3)
  torch.testing.assert_close(f(X), X @ w.t())


def test_a_module_called_from_a_compiled_function_is_seen_changed():
  lin = nn.Linear(2, 2, bias=False)
  with torch.no_grad():
    lin.weight.fill_(1.0)
  g = bridge.compile(lambda x: lin(x))  # (F.linear transposes the weight: a view)
  g(X)
  with torch.no_grad():
    lin.weight.mul_(3)
  torch.testing.assert_close(g(X), lin(X).detach())


def test_a_parameter_slot_set_from_none_is_seen():
  m = nn.Linear(2, 2, bias=False)
  with torch.no_grad():
    m.weight.fill_(1.0)
  c = bridge.compile(m)
  c(X)
  m.bias = nn.Parameter(torch.full((2,), 10.0))
  torch.testing.assert_close(c(X), m(X))
  torch.testing.assert_close(c(X), torch.full((1, 2), 12.0))


class _MaybeOffset(nn.Module):
  def __init__(self):
    super().__init__()
    self.register_buffer("offset", None)

  def forward(self, x):
    return x if self.offset is None else x + self.offset


def test_a_buffer_slot_set_from_none_is_seen():
  m = _MaybeOffset()
  c = bridge.compile(m)
  c(X)
  m.offset = torch.full((2,), 5.0)
  torch.testing.assert_close(c(X), torch.full((1, 2), 6.0))


@pytest.mark.parametrize("first, then", [(1, True), (True, 1), (3, 3.0)])
def test_static_arguments_equal_in_python_but_of_other_types_trace_apart(first, then):
  f = bridge.compile(lambda x, i: x[i] if isinstance(i, bool) or i < 2 else x + torch.arange(i))
  t = torch.arange(6.0).reshape(2, 3) if first != 3 else torch.zeros(3, dtype=torch.long)
  f(t, first)
  want = t[then] if isinstance(then, bool) or then < 2 else t + torch.arange(then)
  got = f(t, then)
  assert got.shape == want.shape and got.dtype == want.dtype
  torch.testing.assert_close(got, want)


def test_the_default_dtype_is_read_on_every_call():
  f = bridge.compile(lambda x: x + torch.zeros(2))
  half = torch.ones(2, dtype=torch.float16)
  assert f(half).dtype == torch.float32
  assert f(half).dtype == torch.float32  # (the recorded shortcut too)
  try:
    torch.set_default_dtype(torch.float64)
    assert f(half).dtype == torch.float64
  finally:
    torch.set_default_dtype(torch.float32)
  assert f(half).dtype == torch.float32


@pytest.mark.parametrize("how", ["t_", "data"])
def test_a_parameter_read_another_way_in_the_same_memory_is_seen(how):
  m = nn.Linear(2, 2, bias=False)
  with torch.no_grad():
    m.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
  c = bridge.compile(m)
  x = torch.tensor([[1.0, 0.0]])
  c(x)
  c(x)
  with torch.no_grad():
    if how == "t_":
      m.weight.t_()
    else:
      m.weight.data = m.weight.data.t()
  torch.testing.assert_close(c(x), m(x))
