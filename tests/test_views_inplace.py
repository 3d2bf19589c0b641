"""Torch's view and in-place semantics hold on the `jax` device, case by case against CPU.

Each case is a function of a fresh 3x4 tensor `x` (and a helper tensor `y`) that
mutates through views and returns some tensors; it runs on CPU and on `jax`, and
afterwards `x`, `y` and every returned tensor must be equal on both.
"""

from __future__ import annotations

import pytest
import torch

import bridge  # (registers the jax device)


def _case(fn):
  return fn


CASES = {
  "select_add_": lambda x, y: x[0].add_(1),
  "slice_mul_": lambda x, y: x[:, 1:3].mul_(2),
  "t_add_": lambda x, y: x.t().add_(1),
  "transpose_select_": lambda x, y: x.transpose(0, 1)[1].mul_(10),
  "narrow_fill_": lambda x, y: x.narrow(1, 1, 2).fill_(7),
  "diagonal_zero_": lambda x, y: x.diagonal().zero_(),
  "diagonal_offset_": lambda x, y: x.diagonal(1).add_(100),
  "unsqueeze_add_": lambda x, y: x.unsqueeze(0).add_(3),
  "squeeze_of_unsqueeze": lambda x, y: x.unsqueeze(1).squeeze(1).sub_(2),
  "view_flat_add_": lambda x, y: x.view(-1).add_(1),
  "view_then_slice": lambda x, y: x.view(2, 6)[:, 2:4].mul_(-1),
  "reshape_is_a_view": lambda x, y: x.reshape(12)[5:].zero_(),
  "chained_views": lambda x, y: x[1:, :][0, ::2].add_(5),
  "step_slice": lambda x, y: x[:, ::2].add_(1),
  "as_strided": lambda x, y: x.as_strided((2, 2), (1, 4)).add_(1),
  "unbind_middle": lambda x, y: x.unbind(0)[1].add_(1),
  "split_part": lambda x, y: x.split(2, dim=1)[1].zero_(),
  "chunk_part": lambda x, y: x.chunk(3, dim=0)[2].mul_(4),
  "view_sees_base_update": lambda x, y: (lambda v: (x.mul_(2), v)[1])(x[1]),
  "expand_sees_base_update": lambda x, y: (lambda e: (x.add_(1), e)[1])(x[0:1].expand(3, 4)),
  "two_overlapping_views": lambda x, y: (lambda a, b: (a.add_(1), b)[1])(x[0], x[:, 0]),
  "setitem_scalar": lambda x, y: x.__setitem__((0, 1), 5.0),
  "setitem_row_tensor": lambda x, y: x.__setitem__(1, y[0]),
  "setitem_slice_tensor": lambda x, y: x.__setitem__(slice(1, 3), y[:2]),
  "setitem_bool_mask": lambda x, y: x.__setitem__(x > 0, 0.0),
  "index_put_accumulate": lambda x, y: x.index_put_(
    (torch.tensor([0, 0, 2]),), y[:3], accumulate=True
  ),
  "copy_into_view": lambda x, y: x[:, 0].copy_(y[0, :3]),
  "copy_broadcasts_into_whole": lambda x, y: x.copy_(y[0]),
  "inplace_broadcasts_other": lambda x, y: x.add_(y[1]),
  "out_argument": lambda x, y: torch.add(x, 1, out=y),
  "out_argument_resizes": lambda x, y: torch.mul(x, 2, out=torch.empty(0, device=x.device)),
  "data_shares": lambda x, y: x.data.add_(1),
  "detach_shares": lambda x, y: x.detach().mul_(2),
  "clamp_": lambda x, y: x.clamp_(min=0),
  "masked_fill_view": lambda x, y: x[1:].masked_fill_(x[1:] < 0, -1.0),
  "inplace_on_transposed_then_read_view": lambda x, y: (lambda v: (x.t().mul_(3), v)[1])(x[2]),
  "zero_dim_select_item": lambda x, y: x[2, 3].add_(1),
}


def _run(name: str, device: str):
  g = torch.Generator().manual_seed(7)
  x = torch.randn(3, 4, generator=g).to(device)
  y = torch.randn(3, 4, generator=g).to(device)
  out = CASES[name](x, y)
  outs = out if isinstance(out, (tuple, list)) else [out]
  return x, y, [o for o in outs if isinstance(o, torch.Tensor)]


@pytest.mark.parametrize("name", list(CASES))
def test_view_and_inplace_semantics_match_cpu(name):
  cx, cy, couts = _run(name, "cpu")
  jx, jy, jouts = _run(name, "jax")
  assert isinstance(jx, bridge.Tensor)
  torch.testing.assert_close(jx.cpu(), cx)
  torch.testing.assert_close(jy.cpu(), cy)
  assert len(jouts) == len(couts)
  for j, c in zip(jouts, couts):
    assert j.shape == c.shape and j.dtype == c.dtype
    assert j.stride() == c.stride() or not c.is_contiguous() or j.is_contiguous()
    torch.testing.assert_close(j.cpu(), c)


def test_at_least_25_cases():
  assert len(CASES) >= 25


def test_inplace_on_expanded_view_raises_like_torch():
  for device in ("cpu", "jax"):
    x = torch.zeros(1, 4, device=device)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
      x.expand(3, 4).add_(1)


def test_modified_saved_tensor_is_caught_by_autograd():
  for device in ("cpu", "jax"):
    w = torch.ones(3, device=device, requires_grad=True)
    h = w.exp()
    out = h * h
    h.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
      out.sum().backward()


def test_views_report_torch_metadata():
  x = torch.zeros(3, 4, device="jax")
  v = x.t()
  assert v.stride() == (1, 4) and not v.is_contiguous()
  assert x[1].storage_offset() == 4
  assert x[:, 1:].stride() == (4, 1)
  assert v._base is x


@pytest.mark.parametrize(
  "name,op",
  [
    ("transpose_", lambda t: t.transpose_(0, 2)),
    ("t_", lambda t: t[0].t_()),
    ("squeeze_", lambda t: t.squeeze_()),
    ("squeeze_dim", lambda t: t.squeeze_(0)),
    ("unsqueeze_", lambda t: t.unsqueeze_(1)),
    ("swapaxes_", lambda t: t.swapaxes_(1, 2)),
    ("as_strided_", lambda t: t.as_strided_((3, 2), (1, 3))),
  ],
)
def test_in_place_metadata_ops(name, op):
  cpu = torch.arange(6.0).reshape(1, 2, 3)
  dev = cpu.to("jax")
  cpu_view, dev_view = cpu[0], dev[0]  # a view taken before: still shares the storage
  out_cpu, out_dev = op(cpu), op(dev)
  assert tuple(out_dev.shape) == tuple(out_cpu.shape) and out_dev.stride() == out_cpu.stride()
  torch.testing.assert_close(out_dev.cpu(), out_cpu)
  out_cpu.mul_(10)
  out_dev.mul_(10)
  torch.testing.assert_close(dev.cpu(), cpu)
  torch.testing.assert_close(dev_view.cpu(), cpu_view)


@pytest.mark.parametrize("shape", [(2, 2), (3, 3), (6,), (1, 6)])
def test_resize_changes_the_shape_in_place(shape):
  cpu = torch.arange(6.0)
  dev = cpu.to("jax")
  out = dev.resize_(*shape)
  assert out is dev and dev.shape == torch.Size(shape)
  n = min(6, torch.Size(shape).numel())
  torch.testing.assert_close(dev.cpu().flatten()[:n], cpu.flatten()[:n])


@pytest.mark.parametrize("view", ["contiguous", "transposed", "strided", "offset", "expanded"])
def test_as_strided_scatter_addresses_self_storage_like_torch(view):
  # torch clones self's whole storage and keeps its strides: the scatter's offset and
  # strides address that storage, elements outside the view included.
  make = {
    "contiguous": lambda x: x,
    "transposed": lambda x: x.t(),
    "strided": lambda x: x[:, ::2],
    "offset": lambda x: x.t()[:, 1:],
    "expanded": lambda x: x[0].expand(3, 5),
  }[view]
  x = torch.randn(4, 5)
  src = torch.randn(3, 2)
  expected = torch.as_strided_scatter(make(x), src, (3, 2), (1, 3), 2)
  got = torch.as_strided_scatter(make(x.to("jax")), src.to("jax"), (3, 2), (1, 3), 2)
  torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
  assert (got.shape, got.stride(), got.storage_offset()) == (
    expected.shape,
    expected.stride(),
    expected.storage_offset(),
  )
