"""What eager torch guarantees around a graph, kept by `torch.compile(..., backend="jax")`: the
outputs' layouts (strides of a transpose, channels_last, an `expand`; outputs that are views of
one another), with and without a gradient recorded, and random ops that draw from torch's own
generator (`torch.set_rng_state` replays them); checked against eager torch."""

from __future__ import annotations

import pytest
import torch

import bridge
from bridge._src import dynamo


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


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


def _dropout_and_rand(x):
  return torch.nn.functional.dropout(x, 0.5, training=True) + torch.rand_like(x)


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_random_ops_draw_from_torchs_generator(grad):
  # They drew from the `jax` device's generator: `torch.set_rng_state` did not replay them,
  # `fork_rng` did not restore them, and torch's CPU generator never moved.
  g = torch.compile(_dropout_and_rand, backend="jax")
  x = torch.randn(1000, requires_grad=grad)
  torch.manual_seed(0)
  g(x)  # (compiled)
  state = torch.get_rng_state()
  a = g(x)
  assert not torch.equal(torch.get_rng_state(), state)  # the draw advanced torch's generator
  b = g(x)
  assert not torch.equal(a, b)  # a new mask each call
  torch.set_rng_state(state)
  torch.testing.assert_close(g(x), a)  # replayed
  with torch.random.fork_rng():
    c = g(x)
  torch.testing.assert_close(g(x), c)  # fork_rng restored the state
  torch.manual_seed(0)
  g(x)
  torch.testing.assert_close(g(x), a)  # and manual_seed reproduces the sequence


def test_the_jax_devices_generator_is_left_alone():
  g = torch.compile(_dropout_and_rand, backend="jax")
  x = torch.randn(100)
  g(x)
  before = torch.jax.get_rng_state()
  g(x)
  assert torch.equal(torch.jax.get_rng_state(), before)


def test_an_input_changed_in_place_before_the_backward_that_needs_it_raises_torchs_error():
  # The forward saved the program's copy of `x` for the backward: torch's version check never
  # saw `x.add_(10)`, and the gradient was the one of the old values.
  def f(w, x):
    return (w @ x).sum()

  g = torch.compile(f, backend="jax")
  w = torch.ones(2, 2, requires_grad=True)
  x = torch.arange(1.0, 5.0).reshape(2, 2)
  g(w, x).backward()
  torch.testing.assert_close(w.grad, x.sum(1).expand(2, 2))
  y = g(w, x)
  x.add_(10)
  with pytest.raises(RuntimeError, match="modified by an inplace operation"):
    y.backward()


@pytest.mark.parametrize("case", ["scale", "index"])
def test_an_integer_item_kept_in_the_graph_runs_the_graph_in_eager_torch(case):
  # With capture_scalar_outputs, `.item()` of an integer stays in the graph as an unbacked
  # size, which no JAX program can take: the call failed with TracedValueError.
  fn = {
    "scale": lambda x: x * (x > 0).sum().item(),
    "index": lambda x: x[x.argmax().item()] * 2,
  }[case]
  x = torch.tensor([3.0, -1.0, 5.0, 2.0], requires_grad=True)
  with torch._dynamo.config.patch(capture_scalar_outputs=True):
    with pytest.warns(UserWarning, match=r"integer read from a tensor's values .*\.item\(\)"):
      out = torch.compile(fn, backend="jax")(x)
  torch.testing.assert_close(out, fn(x.detach()))
  out.sum().backward()
  assert x.grad is not None and bridge.compile_stats().eager == 1
