"""The outputs of `torch.compile(..., backend="jax")` as eager torch lays them out: strides
(a transpose, channels_last, an `expand`), and outputs that are views of one another, with and
without a gradient recorded; checked against eager torch."""

from __future__ import annotations

import pytest
import torch

from bridge._src import dynamo
from tests.test_torch_compile_backend import _fresh_dynamo  # noqa: F401 - (autouse)


def _both(fn, *args):
  """(eager, compiled) results of `fn` on fresh copies of `args`."""
  eager = fn(*[a.detach().clone().requires_grad_(a.requires_grad) for a in args])
  compiled = torch.compile(fn, backend="jax")(*args)
  return eager, compiled


CASES = {
  "transpose": (lambda a: (a + 1).t(), lambda: torch.randn(3, 4)),
  "channels_last": (
    lambda a: a + 1,
    lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
  ),
  "expand": (lambda a: (a + 1).expand(3, 4), lambda: torch.randn(3, 1)),
  "column": (lambda a: (a * 2)[:, 1], lambda: torch.randn(3, 4)),
}


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("case", list(CASES))
def test_output_strides_are_eagers(case, grad):
  # Every output came back contiguous: (a + 1).t() had strides (3, 1), not (1, 4).
  fn, make = CASES[case]
  a = make().requires_grad_(grad)
  eager, compiled = _both(fn, a)
  torch.testing.assert_close(compiled, eager)
  assert compiled.stride() == eager.stride(), (compiled.stride(), eager.stride())
  if grad:
    compiled.sum().backward()
    assert a.grad is not None


def test_a_channels_last_convolution_stays_channels_last():
  torch.manual_seed(0)
  conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
  x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
  with torch.no_grad():
    out = torch.compile(conv, backend="jax")(x)
    torch.testing.assert_close(out, conv(x), rtol=1e-4, atol=1e-5)
  assert out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_outputs_that_are_views_of_one_another_stay_views(grad):
  # With no gradient recorded the two came back as separate tensors: a write to one did not
  # show in the other, as it does in eager torch.
  def f(x, y):
    z = x + y
    return z, z.view(3, 2), z[1]

  x, y = torch.arange(6.0).reshape(2, 3).requires_grad_(grad), torch.ones(2, 3)
  eager, compiled = _both(f, x, y)
  for got, want in zip(compiled, eager):
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride()
  a, b, c = compiled
  with torch.no_grad():  # (aot_autograd's own rule for outputs that require grad: as aot_eager)
    a.add_(100)
  torch.testing.assert_close(b, (x.detach() + y + 100).view(3, 2))
  torch.testing.assert_close(c, x.detach()[1] + y[1] + 100)


def test_contiguous_outputs_take_no_copy(monkeypatch):
  def copying(*args):
    raise AssertionError("copied")

  monkeypatch.setattr(dynamo._Layouts, "apply", copying)
  f = torch.compile(lambda a: (a + 1, a.sum(), a.t() @ a), backend="jax")
  with torch.no_grad():
    f(torch.randn(3, 4))
  f(torch.randn(3, 4, requires_grad=True))
