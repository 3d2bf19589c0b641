"""`bridge.export` / `bridge.load` where a wrong number or a confusing error would hide: 64-bit
derivatives, output containers, `Tensor.conj()`, weights of the wrong kind, BatchNorm's buffers
(refused in training mode, kept out of `jax.grad` when fine-tuning)."""

from __future__ import annotations

import collections
import doctest
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from bridge._src import export as export_lib


def _artifact(exported: bridge.Exported, where: str, tmp_path) -> bridge.Exported:
  """`exported` itself ("memory"), or saved and loaded back ("loaded")."""
  if where == "memory":
    return exported
  exported.save(tmp_path / "m")
  return bridge.load(tmp_path / "m")


# --- derivatives keep the program's 64-bit types --------------------------------------------


@pytest.mark.parametrize("x64", [False, True], ids=["x64_off", "x64_on"])
@pytest.mark.parametrize("where", ["memory", "loaded"])
def test_float64_gradients_have_float64_precision(tmp_path, where, x64):
  """The VJP `jax.export` traces lazily (at `save`, or at the first `jax.grad`) is traced with
  64-bit types on: with them off, it rounded the float64 program's derivatives to float32."""
  torch.manual_seed(0)
  model = torch.nn.Linear(3, 2).double()
  x = torch.randn(4, 3, dtype=torch.float64) + 1
  loaded = _artifact(bridge.export(model, x, vjp_order=1), where, tmp_path)
  model(x).pow(3).sum().backward()
  with jax.enable_x64(x64):
    g = jax.grad(lambda w: (loaded.apply(w, x.numpy()) ** 3).sum())(loaded.weights)
  for name, p in model.named_parameters():
    assert g[name].dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(g[name]), p.grad.numpy(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("where", ["memory", "loaded"])
def test_float64_second_derivatives(tmp_path, where):
  def f(x):
    return (x.sin() * x**3).sum()

  x = torch.tensor([0.3, 1.7, -2.1], dtype=torch.float64)
  loaded = _artifact(bridge.export(f, x, vjp_order=2), where, tmp_path)
  want = torch.autograd.functional.hessian(f, x).diagonal().numpy()
  with jax.enable_x64(True):
    xs = jnp.asarray(x.numpy())
  # (64-bit types off here: the derivatives are built with them on all the same)
  got = jax.grad(lambda v: jax.grad(lambda u: loaded.apply({}, u))(v).sum())(xs)
  # (a sum of the Hessian's rows: x's elements are independent, so its diagonal)
  assert got.dtype == jnp.float64
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)


class _TimesArgmax(torch.nn.Module):
  def forward(self, x):
    return x * x.argmax(-1, keepdim=True)


@pytest.mark.parametrize("where", ["memory", "loaded"])
def test_an_int64_intermediate_with_derivatives(tmp_path, where):
  """`save` with `vjp_order=1` failed in MLIR's verifier (the VJP's argmax was int32 where the
  program's is int64), and so did `jax.grad` in memory."""
  x = torch.randn(4, 3)
  loaded = _artifact(bridge.export(_TimesArgmax(), x, vjp_order=1), where, tmp_path)
  xr = x.clone().requires_grad_()
  _TimesArgmax()(xr).pow(2).sum().backward()
  g = jax.grad(lambda v: (loaded.apply({}, v) ** 2).sum())(x.numpy())
  np.testing.assert_allclose(np.asarray(g), xr.grad.numpy(), rtol=1e-6)
  torch.testing.assert_close(loaded(x), _TimesArgmax()(x))


# --- output containers ------------------------------------------------------------------------


def _nested(x):
  return [x + 1, {"b": [x * 2], "c": (x, x - 1)}]


def _ordered(x):
  return collections.OrderedDict([("z", x * 3), ("a", [x])])


@pytest.mark.parametrize("fn", [_nested, _ordered, lambda x: (x, [x * 2]), lambda x: [x]])
@pytest.mark.parametrize("where", ["memory", "loaded"])
def test_outputs_keep_their_containers(tmp_path, fn, where):
  x = torch.randn(2, 3)
  loaded = _artifact(bridge.export(fn, x), where, tmp_path)
  want = fn(x)
  for got in (loaded(x), loaded.apply(loaded.weights, x.numpy())):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    assert _types(got) == _types(want)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
      np.testing.assert_allclose(np.asarray(a), b.numpy())


def _types(tree):
  if isinstance(tree, dict):
    return (type(tree), [(k, _types(v)) for k, v in tree.items()])
  if isinstance(tree, (list, tuple)):
    return (type(tree), [_types(v) for v in tree])
  return None


def test_an_artifact_without_container_records_loads_as_before(tmp_path):
  """An older bridge's manifest has no "container": its sequences come back as tuples."""
  x = torch.randn(2, 3)
  bridge.export(_nested, x).save(tmp_path / "m")
  path = tmp_path / "m" / "manifest.json"
  manifest = json.loads(path.read_text())

  def strip(tree):
    tree.pop("container", None)
    for child in tree.get("items", []):
      strip(child)

  strip(manifest["outputs"])
  path.write_text(json.dumps(manifest))
  out = bridge.load(tmp_path / "m")(x)
  assert isinstance(out, tuple) and isinstance(out[1]["b"], tuple)
  torch.testing.assert_close(out[1]["b"][0], x * 2)


# --- Tensor.conj() ----------------------------------------------------------------------------


def _conj_fn(x, w):
  return (x * x.conj()).real + (x.conj() * w).imag


def test_conj_exports_and_agrees_with_compile_the_jax_device_and_torch():
  torch.manual_seed(0)
  x, w = torch.randn(5, dtype=torch.complex64), torch.randn(5, dtype=torch.complex64)
  want = _conj_fn(x, w)
  xr = x.clone().requires_grad_()
  _conj_fn(xr, w).sum().backward()

  exported = bridge.export(_conj_fn, x, w)
  torch.testing.assert_close(exported(x, w), want)
  g = jax.grad(lambda a: exported.apply({}, a, w.numpy()).sum())(x.numpy())
  # (JAX's gradient of a real function of a complex input is the conjugate of torch's)
  np.testing.assert_allclose(np.conj(np.asarray(g)), xr.grad.numpy(), rtol=1e-6, atol=1e-6)

  compiled = bridge.compile(_conj_fn)
  xc = x.clone().requires_grad_()
  out = compiled(xc, w)
  torch.testing.assert_close(out, want)
  out.sum().backward()
  torch.testing.assert_close(xc.grad, xr.grad)

  xj = x.to("jax").requires_grad_()
  out = _conj_fn(xj, w.to("jax"))
  torch.testing.assert_close(out.cpu(), want)
  out.sum().backward()
  torch.testing.assert_close(xj.grad.cpu(), xr.grad)


def test_conj_of_a_real_array_is_itself():
  from bridge._src.registry import REGISTRY

  conj = REGISTRY.lookup(torch.ops.aten._conj_copy.default).fn
  x = jnp.asarray([1.0, -2.0])
  np.testing.assert_array_equal(np.asarray(conj(x)), np.asarray(x))
  z = jnp.asarray([1 + 2j])
  np.testing.assert_array_equal(np.asarray(conj(z)), np.asarray([1 - 2j]))


# --- weights and inputs of the wrong kind ---------------------------------------------------


@pytest.mark.parametrize("where", ["memory", "loaded"])
def test_a_weight_of_another_dtype_or_shape_is_named(tmp_path, where):
  exported = _artifact(bridge.export(torch.nn.Linear(3, 2), torch.ones(1, 3)), where, tmp_path)
  x = jnp.ones((1, 3))
  bad = {**exported.weights, "weight": exported.weights["weight"].astype(jnp.bfloat16)}
  with pytest.raises(
    bridge.BridgeTypeError, match=r"weight 'weight' has dtype bfloat16; the program takes float32"
  ):
    exported.apply(bad, x)
  bad = {**exported.weights, "bias": exported.weights["bias"][:1]}
  with pytest.raises(
    bridge.BridgeTypeError, match=r"weight 'bias' has shape \(1,\); the program takes \(2,\)"
  ):
    exported.apply(bad, x)
  with pytest.raises(bridge.BridgeTypeError, match=r"weight 'bias' is a list"):
    exported.apply({**exported.weights, "bias": [0.0, 0.0]}, x)
  with pytest.raises(bridge.BridgeTypeError, match=r"weights lack \['bias'\]"):
    exported.apply({"weight": exported.weights["weight"]}, x)


def test_float32_weights_stand_for_float64_ones_as_inputs_do():
  """JAX without 64-bit types holds a float64 weight as float32; the program casts it back."""
  model = torch.nn.Linear(3, 2).double()
  exported = bridge.export(model, torch.ones(1, 3, dtype=torch.float64))
  w32 = {n: np.asarray(a, np.float32) for n, a in exported.weights.items()}
  out = exported.apply(w32, np.ones((1, 3), np.float32))
  assert out.dtype == jnp.float64
  np.testing.assert_allclose(np.asarray(out), np.asarray(exported(np.ones((1, 3)))), rtol=1e-6)


def test_a_list_where_a_tensor_is_expected_is_named():
  exported = bridge.export(torch.nn.Linear(3, 2), torch.ones(1, 3))
  with pytest.raises(
    bridge.BridgeTypeError, match=r"input 'input' is a list; the program takes a tensor"
  ):
    exported([torch.ones(1, 3)])
  with pytest.raises(bridge.BridgeTypeError, match=r"input 'input' is a NoneType"):
    exported.apply(exported.weights, None)


# --- BatchNorm's buffers --------------------------------------------------------------------


def _bn_model() -> torch.nn.Module:
  torch.manual_seed(0)
  model = torch.nn.Sequential(
    torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.Tanh(), torch.nn.Linear(6, 2)
  )
  model.train()
  model(torch.randn(16, 4))  # running statistics away from their defaults
  return model.eval()


def test_batchnorm_in_training_mode_names_its_buffers_and_the_fix():
  model = _bn_model().train()
  with pytest.raises(bridge.BridgeError) as info:
    bridge.export(model, torch.randn(3, 4))
  message = str(info.value)
  for name in ("1.running_mean", "1.running_var", "1.num_batches_tracked"):
    assert f"'{name}'" in message
  assert "module.eval()" in message and "getitem" not in message

  def add_one(x):
    x.add_(1)
    return x * 2

  with pytest.raises(bridge.BridgeError, match=r"updates its input\(s\) \['x'\] in place"):
    bridge.export(add_one, torch.randn(3))


@pytest.mark.parametrize("where", ["memory", "loaded"])
def test_fine_tuning_a_batchnorm_model_with_jax_grad(tmp_path, where):
  """`jax.grad` over all `exported.weights` meets BatchNorm's int64 `num_batches_tracked`;
  `split_weights` gives the trainable ones, whose gradients are torch autograd's."""
  model = _bn_model()
  x, y = torch.randn(8, 4), torch.randn(8, 2)
  loaded = _artifact(bridge.export(model, x, vjp_order=1), where, tmp_path)
  params, rest = loaded.split_weights()
  assert sorted(params) == sorted(n for n, _ in model.named_parameters())
  assert sorted(rest) == ["1.num_batches_tracked", "1.running_mean", "1.running_var"]
  assert rest["1.num_batches_tracked"].dtype == jnp.int64

  def loss(p, x, y):
    return jnp.mean((loaded.apply((p, rest), x) - y) ** 2)

  grads = jax.grad(loss)(params, x.numpy(), y.numpy())
  torch.nn.functional.mse_loss(model(x), y).backward()
  for name, p in model.named_parameters():
    np.testing.assert_allclose(np.asarray(grads[name]), p.grad.numpy(), rtol=1e-4, atol=1e-6)

  stepped = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
  model.load_state_dict(loaded.state_dict((stepped, rest)))
  np.testing.assert_allclose(
    model(x).detach().numpy(), np.asarray(loaded.apply((stepped, rest), x.numpy())), rtol=1e-5
  )
  with pytest.raises(bridge.BridgeTypeError, match=r"in both dicts of the pair"):
    loaded.apply((params, loaded.weights), x.numpy())


def test_a_frozen_parameter_is_not_trainable():
  model = _bn_model()
  model[0].weight.requires_grad_(False)
  params, rest = bridge.export(model, torch.randn(2, 4)).split_weights()
  assert "0.weight" in rest and "0.weight" not in params and "0.bias" in params


def test_split_weights_docstring_example_runs():
  finder = doctest.DocTestFinder()
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  (test,) = finder.find(export_lib.Exported.split_weights, "split_weights", globs={})
  runner.run(test)
  assert runner.summarize(verbose=False).failed == 0 and test.examples
