"""`torch.autocast(device_type="jax")`: torch's CPU autocast policy, on the jax device, under
`bridge.compile` and inside `call_torch`; results match torch's CPU autocast."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bridge

BF16 = {"rtol": 2e-2, "atol": 2e-2}  # bfloat16 keeps 8 bits of mantissa (eps 7.8e-3)
G = torch.Generator().manual_seed(0)


def _t(*shape):
  return torch.randn(*shape, generator=G)


OPS = {  # name: (function, inputs); the dtype each gives comes from torch's CPU autocast
  "mm": (torch.mm, (_t(4, 8), _t(8, 3))),
  "matmul": (torch.matmul, (_t(2, 4, 8), _t(8, 3))),
  "linear": (F.linear, (_t(4, 8), _t(3, 8), _t(3))),
  "bmm": (torch.bmm, (_t(2, 4, 8), _t(2, 8, 3))),
  "conv2d": (F.conv2d, (_t(1, 2, 6, 6), _t(3, 2, 3, 3))),
  "cross_entropy": (lambda x, y: F.cross_entropy(x, y), (_t(4, 5), torch.tensor([0, 1, 4, 2]))),
  "mse_loss": (F.mse_loss, (_t(4, 5), _t(4, 5))),
  "prod": (lambda x: x.prod(dim=1), (_t(3, 4),)),
  "softmax": (lambda x: torch.softmax(x @ x.t(), -1), (_t(4, 8),)),
  "cat": (lambda a, b: torch.cat([a.to(torch.bfloat16), b]), (_t(2, 3), _t(2, 3))),
  "elementwise": (lambda a: (a * 2).exp(), (_t(3, 3),)),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_policy_matches_cpu_autocast(name):
  fn, inputs = OPS[name]
  with torch.autocast("cpu", dtype=torch.bfloat16):
    expected = fn(*inputs)
  with torch.autocast("jax", dtype=torch.bfloat16):
    actual = fn(*(t.to("jax") for t in inputs))
  assert actual.device.type == "jax" and actual.dtype == expected.dtype, (
    actual.dtype,
    expected.dtype,
  )
  torch.testing.assert_close(actual.cpu(), expected, **BF16)


def _model():
  torch.manual_seed(0)
  return torch.nn.Sequential(
    torch.nn.Conv2d(3, 8, 3),
    torch.nn.ReLU(),
    torch.nn.Flatten(),
    torch.nn.Linear(8 * 6 * 6, 16),
    torch.nn.LayerNorm(16),
    torch.nn.GELU(),
    torch.nn.Linear(16, 5),
  )


def test_training_step_on_jax_device_matches_cpu_autocast():
  model = _model()
  device_model = copy.deepcopy(model).to("jax")
  x, y = _t(4, 3, 8, 8), torch.tensor([0, 1, 2, 4])
  with torch.autocast("cpu", dtype=torch.bfloat16):
    loss = F.cross_entropy(model(x), y)
  with torch.autocast("jax", dtype=torch.bfloat16):
    device_loss = F.cross_entropy(device_model(x.to("jax")), y.to("jax"))
  assert device_loss.dtype == loss.dtype == torch.float32
  torch.testing.assert_close(device_loss.cpu(), loss, **BF16)
  loss.backward()
  device_loss.backward()
  for (name, p), q in zip(model.named_parameters(), device_model.parameters()):
    assert q.grad.dtype == torch.float32, name  # parameters and their grads stay float32
    torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=5e-2, atol=5e-2, msg=name)


def test_compile_under_autocast_keeps_its_own_program():
  model = _model()
  compiled = bridge.compile(model)
  x = _t(2, 3, 8, 8)
  with torch.no_grad():
    full = compiled(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
      half = compiled(x)
      expected = model(x)
    again = compiled(x)
  assert full.dtype == again.dtype == torch.float32 and half.dtype == torch.bfloat16
  torch.testing.assert_close(half, expected, **BF16)
  torch.testing.assert_close(again, full)


def test_autocast_inside_call_torch_under_jit():
  model = _model()
  x = _t(2, 3, 8, 8)

  def forward(x):
    with torch.autocast("jax", dtype=torch.bfloat16):
      return model(x)

  out = jax.jit(bridge.jax_view(forward))(jnp.asarray(x.numpy()))
  with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
    expected = model(x)
  assert out.dtype == jnp.bfloat16
  torch.testing.assert_close(
    torch.from_numpy(np.array(out.astype(jnp.float32))), expected.float(), **BF16
  )


def test_whole_model_cast_to_bfloat16():
  model = _model().to(torch.bfloat16)
  device_model = copy.deepcopy(model).to("jax")
  x = _t(2, 3, 8, 8).to(torch.bfloat16)
  with torch.no_grad():
    out = device_model(x.to("jax"))
    expected = model(x)
  assert out.dtype == torch.bfloat16
  torch.testing.assert_close(out.cpu(), expected, **BF16)


def test_lstm_under_autocast_gives_the_autocast_dtype_as_on_cpu():
  # CPU's lstm runs oneDNN's mkldnn_rnn_layer, on torch's lower-precision list; the jax
  # device lowers lstm whole and gave float32 outputs
  torch.manual_seed(0)
  lstm, x = torch.nn.LSTM(4, 3), torch.randn(5, 2, 4)
  on_jax = copy.deepcopy(lstm).to("jax")
  with torch.autocast("cpu", dtype=torch.bfloat16):
    y, (h, c) = lstm(x)
  with torch.autocast("jax", dtype=torch.bfloat16):
    yj, (hj, cj) = on_jax(x.to("jax"))
  for want, got in ((y, yj), (h, hj), (c, cj)):
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu(), want, **BF16)


def test_a_float16_tensor_and_a_complex_scalar_raise_a_clear_error():
  # torch gives complex32, which JAX lacks: it was a bare KeyError
  with pytest.raises(RuntimeError, match=r"complex32 here, and JAX has no such type"):
    torch.ones(2, dtype=torch.float16, device="jax") + 1j
