"""`torch.compile(..., backend="jax")` against eager on what a probe found wrong: outputs that
are views of an input under dynamic shapes (their values, strides, gradients and writes), and
assertions on tensor values (they were dropped from the program)."""

from __future__ import annotations

import warnings

import pytest
import torch

import bridge


def _views():
  return {
    "chunk": lambda x: x.chunk(2, 1)[0],
    "narrow": lambda x: x.narrow(1, 1, x.shape[1] - 1),
    "view_t": lambda x: x.view(x.shape[1], x.shape[0]).t(),
    "reshape_view_transpose": lambda x: x.reshape(-1).view(x.shape[1], -1).transpose(0, 1),
    "computed_t": lambda x: (x * 2).t(),
    "computed_transpose": lambda x: (x + 1).transpose(0, 1),
    "two_views": lambda x: (x[:, 1:], x.view(x.shape[1], x.shape[0]).t()),
  }


def _outputs(out):
  return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("name", list(_views()))
@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "recompiled"])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_views_of_inputs_with_symbolic_sizes_are_eagers(name, dynamic, grad):
  fn = _views()[name]
  compiled = torch.compile(fn, backend="jax", dynamic=dynamic)
  for shape in [(2, 4), (3, 6), (4, 10)]:  # (the default recompiles with symbolic sizes)
    x = torch.arange(float(shape[0] * shape[1])).reshape(shape).requires_grad_(grad)
    x_eager = x.detach().clone().requires_grad_(grad)
    got, want = _outputs(compiled(x)), _outputs(fn(x_eager))
    for g, w in zip(got, want):
      torch.testing.assert_close(g, w, rtol=0, atol=0)
      assert g.stride() == w.stride() and g.storage_offset() == w.storage_offset(), shape
    if grad:
      sum((o * torch.arange(float(o.numel())).reshape(o.shape)).sum() for o in got).backward()
      sum((o * torch.arange(float(o.numel())).reshape(o.shape)).sum() for o in want).backward()
      torch.testing.assert_close(x.grad, x_eager.grad, rtol=0, atol=0)


def test_a_write_into_a_view_output_lands_where_eagers_does():
  fn = lambda x: x.narrow(1, 1, x.shape[1] - 1)
  compiled = torch.compile(fn, backend="jax", dynamic=True)
  for n in (4, 5):
    x, x_eager = torch.zeros(2, n), torch.zeros(2, n)
    compiled(x)[0, 0] = 7.0
    fn(x_eager)[0, 0] = 7.0
    torch.testing.assert_close(x, x_eager, rtol=0, atol=0)


def _asserting(x):
  torch._assert_async(x.sum() > 100, "the sum is small")
  return x * 2


# (compiled from source here: pytest rewrites the asserts of a test file, and its rewrite makes
# dynamo break the graph there instead of capturing the assertion)
_namespace: dict = {}
exec(
  compile(
    "def _python_assert(x):\n  assert x.sum() > 100, 'the sum is small'\n  return x * 2\n",
    __file__,
    "exec",
  ),
  _namespace,
)
_python_assert = _namespace["_python_assert"]


@pytest.mark.parametrize("fn", [_asserting, _python_assert], ids=["assert_async", "assert"])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_an_assertion_on_tensor_values_is_checked_in_the_program(fn, grad):
  compiled = torch.compile(fn, backend="jax")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    with pytest.raises(RuntimeError, match="the sum is small"):
      compiled(torch.arange(3.0).requires_grad_(grad))
    big = torch.arange(300.0).requires_grad_(grad)
    torch.testing.assert_close(compiled(big), big.detach() * 2)


def test_bridge_compile_checks_an_assertion_too():
  compiled = bridge.compile(_asserting)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    with pytest.raises(RuntimeError, match="the sum is small"):
      compiled(torch.arange(3.0))
    torch.testing.assert_close(compiled(torch.arange(300.0)), torch.arange(300.0) * 2)


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_a_graph_moving_its_inputs_onto_the_jax_device_runs_as_eager_does(grad):
  fn = lambda x: x.to("jax") * 2
  x = torch.arange(3.0).requires_grad_(grad)
  before = bridge.compile_stats().eager
  with pytest.warns(UserWarning, match=r"moves its inputs onto the `jax` device \(`to` at "):
    y = torch.compile(fn, backend="jax")(x)
  assert y.device == torch.device("jax", 0)  # (it came back on the CPU)
  assert y.cpu().tolist() == [0.0, 2.0, 4.0]
  assert bridge.compile_stats().eager == before + 1
  if grad:  # (the backward raised TracedValueError)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


def test_a_factory_on_the_jax_device_in_a_cpu_graph_runs_as_eager_does():
  fn = lambda x: (torch.ones(3, device="jax") + x.to("jax"), x * 2)
  with pytest.warns(UserWarning, match="`ones` at"):
    a, b = torch.compile(fn, backend="jax")(torch.arange(3.0))
  assert (a.device, b.device) == (torch.device("jax", 0), torch.device("cpu"))
  assert a.cpu().tolist() == [1.0, 2.0, 3.0] and b.tolist() == [0.0, 2.0, 4.0]


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_a_graph_that_draws_nothing_leaves_torchs_generator_as_eager_does(mode):
  # (the tracing call of an eval-mode graph with a dropout took a key from torch's generator,
  # shifting every later torch.rand / randperm / dropout mask, at each new shape)
  model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).eval()
  compiled = torch.compile(model, backend="jax")
  context = torch.no_grad if mode == "no_grad" else torch.inference_mode
  for rows in (2, 2, 3, 3):  # first call, cached call, recompile for a new shape, cached
    x = torch.randn(rows, 4)
    torch.manual_seed(0)
    with context():
      model(x)
    want = torch.rand(3)
    torch.manual_seed(0)
    with context():
      compiled(x)
    torch.testing.assert_close(torch.rand(3), want, rtol=0, atol=0)


def test_a_batch_sliced_at_a_new_offset_each_step_compiles_no_new_program():
  # (after dynamo's recompile with symbolic sizes, a view input's storage offset is a number
  # the graphs only pass on: each new offset was a static argument, traced and compiled
  # again, forward and backward, every step)
  torch.manual_seed(0)
  data = torch.randn(10, 16, 8)
  model, eager = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
  eager.load_state_dict(model.state_dict())
  compiled = torch.compile(model, backend="jax")
  compiled(data[0])
  compiled(data[1, :5])  # a partial batch: dynamo recompiles with symbolic sizes
  before = None
  for i in range(2, 10):
    out = compiled(data[i, :5])
    out.sum().backward()
    want = eager(data[i, :5])
    want.sum().backward()
    torch.testing.assert_close(out, want)
    if before is None:
      before = bridge.compile_stats().programs  # (the backward's first program included)
  assert bridge.compile_stats().programs == before
  torch.testing.assert_close(model.weight.grad, eager.weight.grad)
  torch.testing.assert_close(model.bias.grad, eager.bias.grad)
