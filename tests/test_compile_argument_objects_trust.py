"""`bridge.compile` of a function that sets a tensor attribute of an object it is given (a
dataclass, a plain object, a Hugging Face cache's layers): a compiled call runs the program,
not the function, so the caller's object kept its old tensor and every later call gave the
first call's result, silently. Refused where the object is not returned, warned where it is
(the returned one has the new value); in-place updates of its tensors are carried back. And a
0-d CPU tensor argument beside `jax` tensors, which eager torch allows."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import bridge


@dataclasses.dataclass
class _State:
  total: torch.Tensor


class _Plain:
  def __init__(self):
    self.total = torch.zeros(2)
    self.buf = None


class _Rebinds(torch.nn.Module):
  def forward(self, x, st):
    st.total = st.total + x
    return st.total * 1


class _FillsLazily(torch.nn.Module):
  def forward(self, x, st):
    if st.buf is None:
      st.buf = torch.zeros_like(x)
    return x + st.buf


@pytest.mark.parametrize(
  "module, state",
  [(_Rebinds, lambda: _State(torch.zeros(2))), (_Rebinds, _Plain), (_FillsLazily, _Plain)],
)
def test_setting_a_tensor_attribute_of_an_argument_object_is_refused(module, state):
  compiled = bridge.compile(module())
  with pytest.raises(
    bridge.BridgeError, match=r"sets `argument 1\.(total|buf)`, a tensor attribute"
  ):
    compiled(torch.ones(2), state())


class _UpdatesInPlace(torch.nn.Module):
  def forward(self, x, st):
    st.total.add_(x)
    return st.total * 1


def test_an_in_place_update_of_an_argument_objects_tensor_is_carried_back():
  st = _State(torch.zeros(2))
  compiled = bridge.compile(_UpdatesInPlace())
  outs = [compiled(torch.ones(2), st).tolist() for _ in range(3)]
  assert outs == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
  assert st.total.tolist() == [3.0, 3.0]


class _RebindsAndReturns(torch.nn.Module):
  def forward(self, x, st):
    st.total = st.total + x
    return st.total * 1, st


def test_a_returned_object_has_the_new_value_and_a_warning_says_the_given_one_does_not():
  st = _State(torch.zeros(2))
  compiled = bridge.compile(_RebindsAndReturns())
  with pytest.warns(UserWarning, match="the returned object has the new value"):
    out, returned = compiled(torch.ones(2), st)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    out2, returned2 = compiled(torch.ones(2), returned)  # the way the warning gives
  assert out.tolist() == [1.0, 1.0] and returned.total.tolist() == [1.0, 1.0]
  assert out2.tolist() == [2.0, 2.0] and returned2.total.tolist() == [2.0, 2.0]


def test_a_0_dim_cpu_tensor_argument_goes_beside_jax_tensors_as_in_eager():
  # (an uninitialised `StaticLayer.cumulative_length` is `torch.tensor(0)` on the CPU)
  x = torch.ones(2, 3, device="jax")
  f = bridge.compile(lambda x, s: x * 2 + s)
  for s in (torch.tensor(2), torch.tensor(5.0)):
    out = f(x, s)
    assert out.device == x.device
    torch.testing.assert_close(out.cpu(), (x.cpu() * 2 + s))
  with pytest.raises(bridge.TransferError, match="got tensors on two devices"):
    f(x, torch.ones(3))  # (a 1-d one does not, as in eager torch)
