"""Callback mode with `nn.Module`s: `call_torch(module, ..., mode="callback")` and
`extract_jax(module, mode="callback")`, trained with optax."""

import copy
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

import bridge

BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


# An op only torch has (no lowering, no decomposition): a module that uses it can only
# run in callback mode (or through the per-op fallback).
@torch.library.custom_op("bridge_test_cbm::soft_clip", mutates_args=())
def soft_clip(x: torch.Tensor) -> torch.Tensor:
  return 3.0 * torch.tanh(x / 3.0)


@soft_clip.register_fake
def _(x):
  return torch.empty_like(x)


def _setup(ctx, inputs, output):
  ctx.save_for_backward(output)


def _backward(ctx, grad):
  (y,) = ctx.saved_tensors
  return grad * (1 - (y / 3.0) ** 2)


soft_clip.register_autograd(_backward, setup_context=_setup)


class ClipNet(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.fc1 = torch.nn.Linear(5, 16, bias=False)  # (BatchNorm follows: a bias would cancel)
    self.bn = torch.nn.BatchNorm1d(16)
    self.fc2 = torch.nn.Linear(16, 1)

  def forward(self, x):
    return self.fc2(soft_clip(self.bn(self.fc1(x))))


def _data(n=64, seed=0):
  rng = np.random.RandomState(seed)
  x = rng.randn(n, 5).astype(np.float32)
  y = (np.sin(x[:, :1] * 2) + 0.5 * x[:, 1:2]).astype(np.float32)
  return x, y


def test_call_torch_module_runs_live_and_updates_buffers_once_per_execution():
  torch.manual_seed(0)
  model = ClipNet()
  reference = copy.deepcopy(model)
  x, _ = _data(8)
  step = jax.jit(lambda a: bridge.call_torch(model, a, mode="callback"))
  out = step(jnp.asarray(x))
  want = reference(torch.tensor(x))
  torch.testing.assert_close(torch.tensor(np.asarray(out)), want.detach())
  assert model.bn.num_batches_tracked.item() == 1  # the fake run did not count
  torch.testing.assert_close(model.bn.running_mean, reference.bn.running_mean)
  step(jnp.asarray(x)).block_until_ready()
  assert model.bn.num_batches_tracked.item() == 2


def test_call_torch_module_input_gradient_matches_torch_and_backward_does_not_recount():
  torch.manual_seed(1)
  model = ClipNet()
  reference = copy.deepcopy(model)
  x, _ = _data(8)
  grad = jax.jit(jax.grad(lambda a: bridge.call_torch(model, a, mode="callback").sum()))
  g = grad(jnp.asarray(x))
  t = torch.tensor(x, requires_grad=True)
  reference(t).sum().backward()
  np.testing.assert_allclose(np.asarray(g), t.grad.numpy(), rtol=1e-5, atol=1e-6)
  # the backward pass runs the forward again; the buffers are updated by the forward only
  assert model.bn.num_batches_tracked.item() == 1
  torch.testing.assert_close(model.bn.running_var, reference.bn.running_var)


def test_extract_jax_callback_params_have_the_trace_mode_layout():
  model = ClipNet()
  p_trace, _ = bridge.extract_jax(model)
  p_cb, _ = bridge.extract_jax(model, mode="callback")
  assert sorted(p_cb) == sorted(p_trace) == sorted(model.state_dict())
  for name in p_trace:
    assert p_cb[name].shape == p_trace[name].shape and p_cb[name].dtype == p_trace[name].dtype
    np.testing.assert_array_equal(np.asarray(p_cb[name]), np.asarray(p_trace[name]))


def test_extract_jax_callback_param_gradients_match_torch_autograd():
  torch.manual_seed(2)
  model = ClipNet().eval()
  params, fn = bridge.extract_jax(model, mode="callback")
  trainable = {k: params[k] for k, _ in model.named_parameters()}
  x, y = _data(16)
  loss = lambda p: jnp.mean((fn({**params, **p}, jnp.asarray(x)) - y) ** 2)
  value, grads = jax.jit(jax.value_and_grad(loss))(trainable)
  t_loss = torch.mean((model(torch.tensor(x)) - torch.tensor(y)) ** 2)
  t_loss.backward()
  np.testing.assert_allclose(float(value), t_loss.item(), rtol=1e-6)
  for name, p in model.named_parameters():
    np.testing.assert_allclose(
      np.asarray(grads[name]), p.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=name
    )


def test_extract_jax_callback_return_state_gives_the_new_running_statistics():
  torch.manual_seed(3)
  model = ClipNet()
  reference = copy.deepcopy(model)
  params, fn = bridge.extract_jax(model, mode="callback", return_state=True)
  x, _ = _data(16)
  out, new = jax.jit(fn)(params, jnp.asarray(x))
  want = reference(torch.tensor(x))
  np.testing.assert_allclose(np.asarray(out), want.detach().numpy(), rtol=1e-5, atol=1e-6)
  for name in ("bn.running_mean", "bn.running_var"):
    np.testing.assert_allclose(
      np.asarray(new[name]),
      reference.state_dict()[name].numpy(),
      rtol=1e-6,
      atol=1e-7,
      err_msg=name,
    )
  assert int(new["bn.num_batches_tracked"]) == 1
  # the inputs are untouched: JAX arrays are immutable, the module's own buffers too
  np.testing.assert_array_equal(np.asarray(params["bn.running_mean"]), np.zeros(16))
  assert model.bn.num_batches_tracked.item() == 0


def test_extract_jax_callback_without_return_state_warns_about_dropped_updates():
  params, fn = bridge.extract_jax(ClipNet(), mode="callback")
  x, _ = _data(8)
  with pytest.warns(UserWarning, match="bn.running_mean"):
    fn(params, jnp.asarray(x))


def test_extract_jax_callback_per_example_gradients_with_vmap():
  torch.manual_seed(4)
  model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
  params, fn = bridge.extract_jax(model, mode="callback")
  x, y = _data(6)
  per_example = jax.vmap(
    jax.grad(lambda p, a, b: jnp.sum((fn(p, a[None]) - b) ** 2)), in_axes=(None, 0, 0)
  )(params, jnp.asarray(x), jnp.asarray(y))
  for i in range(len(x)):
    model.zero_grad()
    torch.sum((model(torch.tensor(x[i : i + 1])) - torch.tensor(y[i])) ** 2).backward()
    for name, p in model.named_parameters():
      np.testing.assert_allclose(
        np.asarray(per_example[name][i]),
        p.grad.numpy(),
        rtol=1e-5,
        atol=1e-6,
        err_msg=f"{name}[{i}]",
      )


def test_extract_jax_callback_rejects_unknown_mode():
  with pytest.raises(bridge.BridgeTypeError, match="mode='eager' is not one of"):
    bridge.extract_jax(ClipNet(), mode="eager")


def test_optax_trains_a_callback_only_module_like_torch_adamw():
  """A module whose custom op has no lowering, trained with optax through callback mode,
  follows the same training in torch with `torch.optim.AdamW` step for step."""
  torch.manual_seed(5)
  model = ClipNet()
  twin = copy.deepcopy(model)
  x, y = _data(64)
  with warnings.catch_warnings():
    warnings.simplefilter("error", bridge.FallbackWarning)  # nothing falls back: callback mode
    params, fn = bridge.extract_jax(model, mode="callback", return_state=True)
  trainable = {k: params[k] for k, _ in model.named_parameters()}
  buffers = {k: params[k] for k in params if k.endswith(BUFFERS)}
  opt = optax.adamw(1e-2, weight_decay=1e-2)
  state = opt.init(trainable)

  def loss_fn(p, b):
    out, new = fn({**p, **b}, jnp.asarray(x))
    return jnp.mean((out - y) ** 2), {k: new[k] for k in b}

  @jax.jit
  def step(p, b, s):
    (loss, b), g = jax.value_and_grad(loss_fn, has_aux=True)(p, b)
    updates, s = opt.update(g, s, p)
    return optax.apply_updates(p, updates), b, s, loss

  torch_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=1e-2)
  jax_losses, torch_losses = [], []
  for _ in range(60):
    trainable, buffers, state, loss = step(trainable, buffers, state)
    jax_losses.append(float(loss))
    torch_opt.zero_grad()
    t_loss = torch.mean((twin(torch.tensor(x)) - torch.tensor(y)) ** 2)
    t_loss.backward()
    torch_opt.step()
    torch_losses.append(t_loss.item())
  assert jax_losses[-1] < 0.6 * jax_losses[0]
  np.testing.assert_allclose(jax_losses, torch_losses, rtol=2e-3, atol=1e-5)
  model.load_state_dict(bridge.torch_view({**trainable, **buffers}))
  for name, value in twin.state_dict().items():
    torch.testing.assert_close(model.state_dict()[name], value, rtol=2e-3, atol=2e-4, msg=name)


def test_extract_jax_callback_mode_takes_result_shape_dtypes():
  class ValueDependent(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.fc = torch.nn.Linear(3, 2)

    def forward(self, x):
      n = int((x > 0).sum())  # a value read in Python: the fake run cannot find the shapes
      return self.fc(x) * n

  torch.manual_seed(0)
  model = ValueDependent()
  x = jnp.ones((4, 3))
  params, fn = bridge.extract_jax(model, mode="callback")
  with pytest.raises(bridge.TracedValueError, match="result_shape_dtypes"):
    jax.jit(fn)(params, x)
  spec = jax.ShapeDtypeStruct((4, 2), jnp.float32)
  params, fn = bridge.extract_jax(model, mode="callback", result_shape_dtypes=spec)
  out = jax.jit(fn)(params, x)
  torch.testing.assert_close(torch.from_numpy(np.asarray(out)), model(torch.ones(4, 3)))
  grads = jax.grad(lambda p: fn(p, x).sum())(params)
  model(torch.ones(4, 3)).sum().backward()
  np.testing.assert_allclose(
    np.asarray(grads["fc.weight"]), model.fc.weight.grad.numpy(), rtol=1e-6
  )
  with pytest.raises(bridge.BridgeTypeError, match="options of mode='callback'"):
    bridge.extract_jax(model, result_shape_dtypes=spec)
