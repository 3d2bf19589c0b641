"""Convolutions in programs for the CPU run as torch's own kernel (`bridge.config(cpu_convolution)`).

XLA:CPU's convolutions and their gradients are slower than torch's oneDNN kernels (a ResNet-18
forward about 2x, its training step about 4.5x on the project's CPU), so by default a program for
one CPU device calls torch's kernel from inside itself, as the per-op fallback does, with no
warning; `cpu_convolution="xla"` keeps the JAX lowering.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import pytest
import torch

import bridge
from bridge._src import ffi

pytestmark = pytest.mark.skipif(
  jax.default_backend() != "cpu" or jax.local_device_count() != 1,
  reason="the route is taken only where JAX has one CPU device",
)


def _net() -> torch.nn.Module:
  torch.manual_seed(0)
  return torch.nn.Sequential(
    torch.nn.Conv2d(3, 8, 3, padding=1),
    torch.nn.BatchNorm2d(8),
    torch.nn.ReLU(),
    torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2),
    torch.nn.Flatten(),
    torch.nn.Linear(8 * 4 * 4, 5),
  )


def _who_convolves(module: torch.nn.Module, shape: tuple, setting: str | None = None) -> tuple:
  """(host calls, XLA convolutions) in the program of `module` on an input of `shape`. A value
  check is a host call too, with a side effect (BatchNorm's int64 counter in a 32-bit
  program): not counted."""
  params, fn = bridge.extract_jax(module)
  with bridge.config(**({} if setting is None else {"cpu_convolution": setting})):
    text = jax.jit(fn).lower(params, jnp.ones(shape)).as_text()
  host_calls = sum(
    ffi.TARGET in line and "has_side_effect = true" not in line for line in text.splitlines()
  )
  return host_calls, text.count("stablehlo.convolution")


@pytest.mark.parametrize("setting", [None, "torch", "xla"])
def test_the_setting_picks_who_convolves(setting):
  host_calls, convolutions = _who_convolves(_net().eval(), (2, 3, 8, 8), setting)
  if setting == "xla":
    assert (host_calls, convolutions) == (0, 2)
  else:  # the default is torch's kernel
    assert (host_calls, convolutions) == (2, 0)


@pytest.mark.parametrize("setting", ["torch", "xla"])
def test_compiled_training_matches_torch_either_way(setting):
  x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
  y = torch.tensor([0, 1, 2, 3])
  ref, net = _net(), _net()
  loss_ref = torch.nn.functional.cross_entropy(ref(x), y)
  loss_ref.backward()
  with bridge.config(cpu_convolution=setting), warnings.catch_warnings():
    warnings.simplefilter("error", bridge.FallbackWarning)  # a chosen route, not a missing op
    compiled = bridge.compile(net)
    loss = torch.nn.functional.cross_entropy(compiled(x), y)
    loss.backward()
  torch.testing.assert_close(loss, loss_ref)
  for (name, p), p_ref in zip(net.named_parameters(), ref.parameters()):
    torch.testing.assert_close(p.grad, p_ref.grad, msg=name)
  torch.testing.assert_close(net[1].running_mean, ref[1].running_mean)


def test_second_derivatives_through_torchs_kernel():
  conv = torch.nn.Conv2d(2, 3, 3, padding=1).double()
  x = torch.randn(1, 2, 5, 5, dtype=torch.float64, requires_grad=True)
  compiled = bridge.compile(conv)

  def penalty(f):
    (g,) = torch.autograd.grad(f(x).pow(2).sum(), x, create_graph=True)
    return torch.autograd.grad(g.pow(2).sum(), conv.weight)[0]

  torch.testing.assert_close(penalty(compiled), penalty(conv))


def test_the_jax_device_runs_torchs_kernel_with_its_gradients_mask():
  x = torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(2))
  w = torch.randn(6, 2, 3, 3, generator=torch.Generator().manual_seed(3))
  g = torch.randn(2, 6, 6, 6, generator=torch.Generator().manual_seed(4))
  args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 2)
  expected = torch.ops.aten.convolution_backward.default(g, x, w, [6], *args, [False, False, True])
  out = torch.ops.aten.convolution_backward.default(
    g.to("jax"), x.to("jax"), w.to("jax"), [6], *args, [False, False, True]
  )
  # torch's CPU kernel computes a weight gradient nobody asked for; meta and the device do not
  assert out[0] is None and out[1] is None and expected[1] is not None
  torch.testing.assert_close(out[2].cpu(), expected[2])


def test_an_unknown_setting_is_refused():
  with pytest.raises(bridge.BridgeTypeError, match="cpu_convolution='onednn' is not one of"):
    bridge.config(cpu_convolution="onednn")  # type: ignore[arg-type]


@pytest.mark.parametrize(
  "make,shape",
  [
    (lambda: torch.nn.Conv1d(3, 4, 3, stride=2, padding=1, dilation=2), (2, 3, 11)),
    (
      lambda: torch.nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1),
      (2, 4, 5, 5),
    ),
    (lambda: torch.nn.Conv3d(2, 4, 2, groups=2, bias=False), (1, 2, 3, 4, 4)),
  ],
  ids=["conv1d", "conv_transpose2d", "conv3d_groups_no_bias"],
)
def test_gradients_of_every_input_match_torch(make, shape):
  torch.manual_seed(5)
  conv = make().double()
  x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
  g = torch.randn_like(conv(x))
  expected = torch.autograd.grad(conv(x), [x, *conv.parameters()], g)
  got = torch.autograd.grad(bridge.compile(conv)(x), [x, *conv.parameters()], g)
  torch.testing.assert_close(got, expected)


@pytest.mark.parametrize(
  "conv,host_calls",
  [
    (torch.nn.Conv2d(4, 8, 1), 0),  # a matrix product: XLA fuses it with its neighbours
    (torch.nn.Conv2d(4, 8, 1, stride=2), 1),
    (torch.nn.Conv2d(4, 8, 1, padding=1), 1),
    (torch.nn.Conv2d(4, 4, 3, padding=1, groups=4), 1),  # depthwise
  ],
  ids=["pointwise", "strided_1x1", "padded_1x1", "depthwise_3x3"],
)
def test_pointwise_convolutions_stay_in_xla(conv, host_calls):
  assert _who_convolves(conv, (2, 4, 6, 6)) == (host_calls, 1 - host_calls)
  x = torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(6), requires_grad=True)
  expected = torch.autograd.grad(conv(x).pow(2).sum(), [x, *conv.parameters()])
  got = torch.autograd.grad(bridge.compile(conv)(x).pow(2).sum(), [x, *conv.parameters()])
  torch.testing.assert_close(got, expected)
