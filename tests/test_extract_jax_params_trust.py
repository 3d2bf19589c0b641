"""The parameters given to an `extract_jax` function: a tied tensor stays tied when every name
of it is given (each name was installed on its own: the tie was lost and training diverged from
torch), NumPy arrays work outside `jax.jit` as inside (AttributeError), other values are named,
and a dtype mismatch names the parameter."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge


class _Tied(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.emb = torch.nn.Embedding(5, 3)
    self.head = torch.nn.Linear(3, 5, bias=False)
    self.head.weight = self.emb.weight

  def forward(self, i):
    return self.head(torch.tanh(self.emb(i)))


IDS = [0, 3, 4]


def _every_name(module):
  return {k: bridge.to_jax(v.detach().clone()) for k, v in module.state_dict().items()}


def test_every_name_of_a_tied_weight_given_keeps_the_tie_and_its_gradient():
  torch.manual_seed(0)
  model = _Tied()
  _, fn = bridge.extract_jax(model)
  params = _every_name(model)
  assert set(params) == {"emb.weight", "head.weight"}
  with pytest.warns(UserWarning, match=r"more than one name of a tensor it ties \('head.weight'"):
    grads = jax.grad(lambda p: (fn(p, jnp.array(IDS)) ** 2).sum())(params)
  (model(torch.tensor(IDS)) ** 2).sum().backward()
  torch.testing.assert_close(
    torch.from_numpy(np.asarray(grads["emb.weight"])), model.emb.weight.grad, rtol=1e-5, atol=1e-6
  )
  assert not np.asarray(grads["head.weight"]).any()  # (its value is not used)


def test_a_module_used_twice_under_two_names_is_not_overwritten():
  torch.manual_seed(0)
  lin = torch.nn.Linear(2, 2)
  seq = torch.nn.Sequential(lin, torch.nn.Tanh(), lin)
  _, fn = bridge.extract_jax(seq, return_state=True)
  params = _every_name(seq)
  params["2.weight"] = params["2.weight"] + 1  # (another value under the second name: unused)
  x = torch.ones(1, 2)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out, new = fn(params, jnp.asarray(x.numpy()))
  assert not [w for w in caught if "updated" in str(w.message)]  # (no false in-place warning)
  torch.testing.assert_close(torch.from_numpy(np.asarray(out)), seq(x).detach())
  for name in ("0.weight", "0.bias"):
    np.testing.assert_array_equal(np.asarray(new[name]), np.asarray(params[name]))


def test_numpy_parameters_work_outside_jit_as_inside():
  params, fn = bridge.extract_jax(torch.nn.Linear(4, 2))
  as_numpy = {k: np.asarray(v) for k, v in params.items()}
  x = jnp.ones((3, 4))
  np.testing.assert_allclose(np.asarray(fn(as_numpy, x)), np.asarray(jax.jit(fn)(as_numpy, x)))


@pytest.mark.parametrize(
  "bad, match",
  [
    ([0.0, 0.0], r"'bias' is a builtins.list, not a JAX array"),
    (torch.zeros(2), r"'bias' is a torch.Tensor, not a JAX array \(a torch tensor: convert it"),
  ],
  ids=["list", "torch"],
)
def test_a_parameter_that_is_not_an_array_is_named(bad, match):
  params, fn = bridge.extract_jax(torch.nn.Linear(4, 2))
  with pytest.raises(bridge.BridgeTypeError, match=match):
    fn({**params, "bias": bad}, jnp.ones((3, 4)))


def test_a_parameter_of_another_dtype_is_named_in_the_error():
  params, fn = bridge.extract_jax(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)))
  wrong = {**params, "0.weight": params["0.weight"].astype(jnp.bfloat16)}
  with pytest.raises(RuntimeError, match="must have the same dtype") as info:
    jax.jit(fn)(wrong, jnp.ones((3, 4)))
  assert any(
    "'0.weight' is bfloat16 where Sequential has float32" in n for n in info.value.__notes__
  )
