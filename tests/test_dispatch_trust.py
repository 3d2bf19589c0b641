"""The dispatcher keeps torch's semantics where they are easy to lose: gradients cut by
`torch.inference_mode()`, composite ops that write their arguments below autograd (BatchNorm's
running statistics), in-place view ops (`squeeze_`), and torch's refusal of overlapping
in-place writes. Values against CPU torch, gradients against torch's autograd."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bridge  # (registers the jax device)
from bridge._src.dispatch import resolve

OVERLAP = (
  "unsupported operation: some elements of the input tensor and the written-to tensor refer "
  "to a single memory location. Please clone() the tensor before performing the operation."
)


def _np(a: jax.Array) -> torch.Tensor:
  return torch.from_numpy(np.array(a))


# --- gradients: `torch.inference_mode()` and `detach_` ------------------------------------


def _inference_value(t):
  with torch.inference_mode():
    c = t * t
  return (c.clone() * t).sum()


def _inference_view(t):
  with torch.inference_mode():
    c = t[1:]
  return (c * t[1:]).sum()


def _inference_nested_no_grad(t):
  with torch.no_grad(), torch.inference_mode():
    c = t.exp()
  return (c.clone() * t).sum()


def _detach_in_place(t):
  u = t * 2
  u.detach_()
  return (u * t).sum()


GRAD_CASES = {
  "inference_mode_value": _inference_value,
  "inference_mode_view": _inference_view,
  "inference_mode_under_no_grad": _inference_nested_no_grad,
  "detach_": _detach_in_place,
}
# (`detach_` never reaches the dispatcher: torch's autograd kernel does all of it, so
# `bridge.Tensor.detach_` marks a traced tensor detached itself)
TRACED_GRAD_CASES = GRAD_CASES


@pytest.mark.parametrize("fn", TRACED_GRAD_CASES.values(), ids=TRACED_GRAD_CASES.keys())
@pytest.mark.parametrize("jit", [False, True], ids=["eager_grad", "jit_grad"])
def test_traced_gradient_matches_torch(fn, jit):
  t = torch.arange(1.0, 4.0, requires_grad=True)
  (expected,) = torch.autograd.grad(fn(t), t)
  grad = jax.grad(lambda a: bridge.call_torch(fn, a))
  got = (jax.jit(grad) if jit else grad)(jnp.arange(1.0, 4.0))
  torch.testing.assert_close(_np(got), expected)


@pytest.mark.parametrize("fn", GRAD_CASES.values(), ids=GRAD_CASES.keys())
def test_jax_device_gradient_matches_torch(fn):
  t = torch.arange(1.0, 4.0, requires_grad=True)
  (expected,) = torch.autograd.grad(fn(t), t)
  tj = torch.arange(1.0, 4.0, device="jax", requires_grad=True)
  (got,) = torch.autograd.grad(fn(tj), tj)
  torch.testing.assert_close(got.cpu(), expected)


# --- composite ops below autograd (`torch.inference_mode()`) -------------------------------

MODULES = {
  "batch_norm_1d": (lambda: torch.nn.BatchNorm1d(3), (4, 3)),
  "batch_norm_2d": (lambda: torch.nn.BatchNorm2d(3), (2, 3, 4, 4)),
  "batch_norm_cumulative": (lambda: torch.nn.BatchNorm1d(3, momentum=None), (4, 3)),
  "batch_norm_eval": (lambda: torch.nn.BatchNorm1d(3).eval(), (4, 3)),
  "instance_norm_stats": (lambda: torch.nn.InstanceNorm1d(3, track_running_stats=True), (2, 3, 5)),
  "instance_norm_affine": (
    lambda: torch.nn.InstanceNorm2d(3, affine=True, track_running_stats=True),
    (2, 3, 4, 4),
  ),
  "conv_then_batch_norm": (
    lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)),
    (2, 3, 5, 5),
  ),
  "group_and_layer_norm": (
    lambda: torch.nn.Sequential(torch.nn.GroupNorm(1, 3), torch.nn.LayerNorm(4)),
    (2, 3, 4),
  ),
}


@pytest.mark.parametrize("make, shape", MODULES.values(), ids=MODULES.keys())
def test_module_under_inference_mode_matches_cpu(make, shape):
  torch.manual_seed(0)
  cpu = make()
  jx = make().to("jax")
  jx.load_state_dict(cpu.state_dict())
  x = torch.randn(shape)
  for _ in range(2):  # (the second call runs the plans the first one settled on)
    with torch.inference_mode():
      expected = cpu(x)
      got = jx(x.to("jax"))
    torch.testing.assert_close(got.cpu(), expected)
  for name, value in cpu.state_dict().items():
    torch.testing.assert_close(jx.state_dict()[name].cpu(), value, msg=name)


def _batch_norm(x, mean, var):
  with torch.inference_mode():
    y = F.batch_norm(x, mean, var, training=True, momentum=0.3)
  return y, mean, var


def _instance_norm(x, mean, var):
  with torch.inference_mode():
    y = F.instance_norm(x, mean, var, use_input_stats=True, momentum=0.3)
  return y, mean, var


@pytest.mark.parametrize("fn", [_batch_norm, _instance_norm], ids=["batch_norm", "instance_norm"])
def test_traced_norm_under_inference_mode_writes_its_statistics(fn):
  x = torch.randn(2, 3, 5)
  expected = fn(x, torch.zeros(3), torch.ones(3))
  got = jax.jit(lambda *a: bridge.call_torch(fn, *a))(
    jnp.asarray(x.numpy()), jnp.zeros(3), jnp.ones(3)
  )
  for e, g in zip(expected, got):
    torch.testing.assert_close(_np(g), e)


def test_python_values_under_inference_mode():
  x = torch.tensor(2.5, device="jax")
  with torch.inference_mode():
    assert (x.item(), float(x), int(x), bool(x)) == (2.5, 2.5, 2, True)


INFERENCE_VIEWS = {
  "setitem": lambda x: x.__setitem__(0, 5.0),
  "select_add_": lambda x: x[1].add_(2),
  "split_parts": lambda x: [p.mul_(2) for p in x.split(2)],
  "transpose_": lambda x: x.t_(),
}


@pytest.mark.parametrize("fn", INFERENCE_VIEWS.values(), ids=INFERENCE_VIEWS.keys())
def test_views_of_normal_tensors_under_inference_mode(fn):
  results = []
  for device in ("cpu", "jax"):
    x = torch.arange(12.0, device=device).reshape(3, 4)
    with torch.inference_mode():
      fn(x)
      view = x[1]
    results.append((x.cpu(), x._version, x.is_inference(), view.is_inference()))
  (x_cpu, *meta_cpu), (x_jax, *meta_jax) = results
  torch.testing.assert_close(x_jax, x_cpu)
  assert meta_jax == meta_cpu


def test_decomposition_writing_an_argument_is_refused():
  """Run as one lowering, a decomposition that writes an argument its schema does not mark
  (here `batch_norm`'s, in training) would lose the write: it raises instead."""
  func = torch.ops.aten.batch_norm.default
  run = resolve._decomposition_as_lowering(func, func.decompose)
  x, mean, var = jnp.ones((2, 3)), jnp.zeros(3), jnp.ones(3)
  with pytest.raises(resolve.ArgumentWritten, match="running_mean"):
    run(x, None, None, mean, var, True, 0.1, 1e-5, False)
  run(x, None, None, mean, var, False, 0.1, 1e-5, False)  # (in eval, it writes nothing)


# --- in-place view ops --------------------------------------------------------------------

RESTRIDES = {
  "squeeze_": lambda x: x.squeeze_(),
  "squeeze_dim": lambda x: x.squeeze_(1),
  "squeeze_dims": lambda x: x.squeeze_([1, 3]),
  "squeeze_dims_tuple": lambda x: x.squeeze_((3,)),
  "unsqueeze_": lambda x: x.unsqueeze_(2),
  "transpose_": lambda x: x.transpose_(0, 2),
  "swapdims_": lambda x: x.swapdims_(0, 2),
  "swapaxes_": lambda x: x.swapaxes_(2, 0),
  "t_": lambda x: x.view(2, 3).t_(),
  "as_strided_": lambda x: x.as_strided_((2, 2), (1, 3), 1),
  "squeeze_dims_of_view": lambda x: x[:, :, 1:].squeeze_([1, 3]),
}


def _layout(t: torch.Tensor) -> tuple:
  return tuple(t.shape), t.stride(), t.storage_offset()


@pytest.mark.parametrize("fn", RESTRIDES.values(), ids=RESTRIDES.keys())
def test_in_place_view_op_matches_cpu(fn):
  x = torch.arange(6.0).reshape(2, 1, 3, 1)
  xj = x.to("jax")
  expected, got = fn(x), fn(xj)
  torch.testing.assert_close(got.cpu(), expected)
  assert _layout(got) == _layout(expected)
  assert _layout(xj) == _layout(x)
  traced = jax.jit(lambda a: bridge.call_torch(lambda t: fn(t.reshape(2, 1, 3, 1) * 1), a))
  torch.testing.assert_close(_np(traced(jnp.arange(6.0))), expected)


def test_vmap_matmul_on_jax_device():
  w, x = torch.randn(3, 2), torch.randn(4, 3)
  expected = torch.func.vmap(lambda r: r @ w)(x)
  got = torch.func.vmap(lambda r: r @ w.to("jax"))(x.to("jax"))
  torch.testing.assert_close(got.cpu(), expected)


# --- overlapping in-place writes ----------------------------------------------------------

OVERLAPS = {  # of a fresh `x = arange(8.)`: torch refuses those marked True
  "add_partial": (lambda x: x[2:].add_(x[:6]), True),
  "iadd_partial": (lambda x: x[2:].__iadd__(x[:6]), True),
  "copy_partial": (lambda x: x[1:].copy_(x[:-1]), True),
  "setitem_partial": (lambda x: x.__setitem__(slice(1, None), x[:-1]), True),
  "copy_transposed": (lambda x: x.view(2, 2, 2)[0].copy_(x.view(2, 2, 2)[0].t()), True),
  "mul_out_partial": (lambda x: torch.mul(x[:6], 2, out=x[2:]), True),
  "neg_out_partial": (lambda x: torch.neg(x[:6], out=x[2:]), True),
  "where_out_partial": (lambda x: torch.where(x[:6] > 2, x[:6], x[:6], out=x[2:]), True),
  "eq_partial": (lambda x: x[2:].eq_(x[:6]), True),
  "clamp_partial": (lambda x: x[2:].clamp_(x[:6], None), True),
  "lerp_partial": (lambda x: x[2:].lerp_(x[:6], 0.5), True),
  "addcmul_partial": (lambda x: x[2:].addcmul_(x[:6], x[:6]), True),
  "index_put_partial": (
    lambda x: x.index_put_((torch.tensor([0, 1], device=x.device),), x[:2]),
    True,
  ),
  "index_put_same": (
    lambda x: x[:2].index_put_((torch.tensor([0, 1], device=x.device),), x[:2]),
    True,
  ),
  "cat_out_partial": (lambda x: torch.cat([x[:2], x[2:4]], out=x[1:5]), True),
  "add_full": (lambda x: x.add_(x), False),
  "add_full_other_view": (lambda x: x.view(2, 4).add_(x.view(2, 4)), False),
  "copy_full": (lambda x: x.copy_(x), False),
  "add_disjoint": (lambda x: x[:4].add_(x[4:]), False),
  "masked_fill_mask": (lambda x: x[2:].masked_fill_(x[:6] > 3, 0.0), False),
  "mul_scalar": (lambda x: x[2:].mul_(2), False),
}


@pytest.mark.parametrize("fn, refused", OVERLAPS.values(), ids=OVERLAPS.keys())
def test_overlapping_in_place_write_as_cpu(fn, refused):
  x, xj = torch.arange(8.0), torch.arange(8.0, device="jax")
  if refused:
    with pytest.raises(RuntimeError, match="^unsupported operation") as cpu_error:
      fn(x)
    with pytest.raises(RuntimeError) as jax_error:
      fn(xj)
    assert str(cpu_error.value) == str(jax_error.value) == OVERLAP
    torch.testing.assert_close(xj.cpu(), torch.arange(8.0))  # (nothing written)
  else:
    fn(x)
    fn(xj)
    torch.testing.assert_close(xj.cpu(), x)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_traced_overlapping_write_raises(jit):
  def shift(a):
    x = a * 1
    x[1:] = x[:-1]
    return x

  def run(a):
    return bridge.call_torch(shift, a)

  with pytest.raises(RuntimeError) as e:
    (jax.jit(run) if jit else run)(jnp.arange(6.0))
  assert str(e.value) == OVERLAP
