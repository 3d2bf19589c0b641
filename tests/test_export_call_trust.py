"""An exported artifact's call, as probed: outputs keep their containers (dataclass fields by
name, a dict's keys in their order and of their kind), keyword inputs passed by position bind
by the signature, a torch input that requires grad is refused rather than cut from its graph;
and `pow` with a Scalar exponent of 0 has torch's gradient 0 at a base of 0 (JAX's rule gave
nan: in `call_torch` and exported programs)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge


@dataclasses.dataclass
class _Out:
  a: torch.Tensor
  b: torch.Tensor | None
  c: torch.Tensor


torch.export.register_dataclass(_Out)


@pytest.mark.parametrize("with_none", [False, True])
def test_dataclass_outputs_keep_every_field_by_name(with_none):
  def f(x):
    return _Out(a=x + 1, b=None if with_none else x * 2, c=x * 3)

  x = torch.ones(2)
  out = bridge.export(f, x)(x)
  assert list(out) == ["a", "c", "b"] if with_none else ["a", "b", "c"]
  torch.testing.assert_close(out["a"], x + 1)
  torch.testing.assert_close(out["c"], x * 3)
  if with_none:
    assert out["b"] is None
  else:
    torch.testing.assert_close(out["b"], x * 2)


def test_keyword_inputs_passed_by_position_bind_by_the_signature():
  def f(x, a, b):
    return x + 10 * a + 100 * b

  x, a, b = torch.zeros(1), torch.ones(1), 2 * torch.ones(1)
  exported = bridge.export(f, x, b=b, a=a)  # the example's keywords in another order
  for call in (
    lambda: exported(x, a=a, b=b),
    lambda: exported(x, a, b),
    lambda: exported(x, a, b=b),
  ):
    torch.testing.assert_close(call(), f(x, a, b))
  with pytest.raises(bridge.BridgeTypeError, match="takes 3 inputs by position, got 4"):
    exported(x, a, b, b)


def test_dict_outputs_keep_their_key_order_and_kinds(tmp_path):
  def f(x):
    return {"z": x + 1, "y": x * 2, "a": x - 1}

  x = torch.ones(2)
  exported = bridge.export(f, x)
  assert list(exported(x)) == ["z", "y", "a"]
  assert list(exported(jnp.ones(2))) == ["z", "y", "a"]
  numbered = bridge.export(lambda x: {0: x + 1, 1: x * 2}, x)
  numbered.save(tmp_path / "art")
  for artifact in (numbered, bridge.load(tmp_path / "art")):
    out = artifact(x)
    assert list(out) == [0, 1]
    torch.testing.assert_close(out[1], x * 2)


def test_a_torch_input_that_requires_grad_is_refused_not_cut():
  lin = torch.nn.Linear(4, 3)
  exported = bridge.export(lin, torch.randn(5, 4))
  x = torch.randn(5, 4, requires_grad=True)
  with pytest.raises(bridge.BridgeError, match="requires grad, but an artifact's call"):
    exported(x)
  with torch.no_grad():
    torch.testing.assert_close(exported(x), lin(x))
  torch.testing.assert_close(exported(x.detach()), lin(x).detach())


@pytest.mark.parametrize("exponent", [0.0, 1.0, 2.0, 0.5, -1.0, 2.5])
def test_pow_with_a_scalar_exponent_has_torchs_gradient(exponent):
  x = torch.tensor([0.0, 1.0, -2.0, 3.0])
  f = lambda t: t.pow(exponent)
  xt = x.clone().requires_grad_()
  f(xt).sum().backward()
  grad = jax.grad(lambda v: bridge.call_torch(f, v).sum())(jnp.asarray(x.numpy()))
  np.testing.assert_allclose(np.asarray(grad), xt.grad.numpy(), equal_nan=True)
  exported = bridge.export(f, x, vjp_order=1)
  grad = jax.grad(lambda v: exported.apply(exported.weights, v).sum())(jnp.asarray(x.numpy()))
  np.testing.assert_allclose(np.asarray(grad), xt.grad.numpy(), equal_nan=True)


def test_builtins_and_partials_of_them_export():
  import functools

  x = torch.randn(3)
  torch.testing.assert_close(bridge.export(torch.sin, x)(x), torch.sin(x))
  add = functools.partial(torch.add, alpha=2)
  torch.testing.assert_close(bridge.export(add, x, x)(x, x), x + 2 * x)


def test_a_module_or_example_on_the_jax_device_is_named_with_the_fix():
  with pytest.raises(bridge.BridgeTypeError, match="the module's 'weight' is on the `jax:0`"):
    bridge.export(torch.nn.Linear(3, 2).to("jax"), torch.randn(4, 3))
  with pytest.raises(bridge.BridgeTypeError, match=r"example_args\[0\] is on the `jax:0`"):
    bridge.export(torch.nn.Linear(3, 2), torch.randn(4, 3, device="jax"))


def test_a_damaged_manifest_is_named_not_a_python_error(tmp_path):
  import json

  bridge.export(torch.nn.Linear(3, 2), torch.randn(4, 3)).save(tmp_path / "art")
  manifest = tmp_path / "art" / "manifest.json"
  good = json.loads(manifest.read_text())
  cases = {
    "holds a list, not an artifact's manifest": [1, 2],
    "has artifact format True": {**good, "format": True},
    r"lacks \['weights'\]": {k: v for k, v in good.items() if k != "weights"},
  }
  for message, bad in cases.items():
    manifest.write_text(json.dumps(bad))
    with pytest.raises(bridge.BridgeError, match=message):
      bridge.load(tmp_path / "art")
