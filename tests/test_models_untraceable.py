"""Models the bridge cannot trace: clear errors that point to callback mode, never a hidden one."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from bridge._src.dispatch import fallback as fallback_lib

RECIPE = "recipes/torch_code_in_jax_callback_mode.ipynb"


class GatedMLP(torch.nn.Module):
  """Branches in Python on a tensor's value: untraceable under `jax.jit`."""

  def __init__(self):
    super().__init__()
    self.fc1, self.fc2 = torch.nn.Linear(6, 12), torch.nn.Linear(12, 3)

  def forward(self, x):
    h = torch.relu(self.fc1(x))
    if h.mean() > 0.25:  # data-dependent control flow
      h = h / h.mean()
    return self.fc2(h)


@torch.library.custom_op("bridge_test_models::rms_gate", mutates_args=())
def rms_gate(x: torch.Tensor) -> torch.Tensor:
  return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


@rms_gate.register_fake
def _(x):
  return torch.empty_like(x)


def _rms_gate_backward(ctx, grad):
  (x,) = ctx.saved_tensors
  with torch.enable_grad():
    x = x.detach().requires_grad_()
    return torch.autograd.grad(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), x, grad)[0]


rms_gate.register_autograd(
  _rms_gate_backward, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0])
)


class CustomOpNet(torch.nn.Module):
  """Uses an op only torch has: no lowering, no decomposition."""

  def __init__(self):
    super().__init__()
    self.fc1, self.fc2 = torch.nn.Linear(6, 12), torch.nn.Linear(12, 3)

  def forward(self, x):
    return self.fc2(rms_gate(self.fc1(x)))


X = np.random.RandomState(0).randn(5, 6).astype(np.float32)


@pytest.mark.parametrize("how", ["call_torch", "extract_jax", "compile"])
def test_data_dependent_branch_names_the_line_and_the_callback_recipe(how):
  model = GatedMLP()
  with pytest.raises(bridge.TracedValueError) as info:
    if how == "call_torch":
      jax.jit(lambda a: bridge.call_torch(model, a))(jnp.asarray(X))
    elif how == "extract_jax":
      params, fn = bridge.extract_jax(model)
      jax.jit(fn)(params, jnp.asarray(X))
    else:
      bridge.compile(model)(torch.tensor(X))
  message = str(info.value)
  assert "if h.mean() > 0.25:" in message  # the user's torch line
  assert "mode='callback'" in message and RECIPE in message


def test_the_same_model_runs_in_callback_mode_with_torch_numbers():
  torch.manual_seed(0)
  model = GatedMLP()
  spec = jax.ShapeDtypeStruct((5, 3), jnp.float32)
  run = jax.jit(lambda a: bridge.call_torch(model, a, mode="callback", result_shape_dtypes=spec))
  for scale in (1.0, 0.01):  # both branches
    x = X * scale
    torch.testing.assert_close(
      torch.tensor(np.asarray(run(jnp.asarray(x)))), model(torch.tensor(x)).detach()
    )


def test_op_without_lowering_falls_back_with_a_warning_naming_the_recipe(monkeypatch):
  monkeypatch.setattr(fallback_lib, "_warned", set())
  torch.manual_seed(1)
  model = CustomOpNet()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = bridge.compile(model)(torch.tensor(X))
  ours = [str(w.message) for w in caught if issubclass(w.category, bridge.FallbackWarning)]
  assert len(ours) == 1
  assert "bridge_test_models::rms_gate.default" in ours[0] and RECIPE in ours[0]
  torch.testing.assert_close(out, model(torch.tensor(X)))
  assert bridge.fallback_ops(model, jnp.asarray(X)) == ["bridge_test_models::rms_gate.default"]


def test_op_without_lowering_with_the_fallback_off_raises_and_names_the_recipe():
  model = CustomOpNet()
  with bridge.config(fallback="error"), pytest.raises(bridge.OperatorNotFound) as info:
    jax.jit(lambda a: bridge.call_torch(model, a))(jnp.asarray(X))
  message = str(info.value)
  assert "bridge_test_models.rms_gate.default" in message and RECIPE in message
