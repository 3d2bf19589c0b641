"""Torch's view and in-place semantics hold on the `jax` device, case by case against CPU.

Each case is a function of a fresh 3x4 tensor `x` (and a helper tensor `y`) that
mutates through views and returns some tensors; it runs on CPU and on `jax`, and
afterwards `x`, `y` and every returned tensor must be equal on both.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
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


# --- views of another dtype, and lazy conjugate/negative views -------------------------
#
# `view(dtype)`, `view_as_real`, `view_as_complex`, `.real`, `.imag` read the storage's
# bytes as another dtype, and `conj()` (and `.imag` of it) are views with torch's conj and
# neg bits: writes through each reach the base and every other view, both ways.


def _z(device):
  return torch.tensor([1 + 2j, 3 - 4j, -5 + 6j, 7 + 8j], device=device)


def _f(device, n=8):
  return torch.arange(float(n), device=device)


def _written_base(x, view_of, write):
  """A view taken first, then the base written: the view sees the write."""
  v = view_of(x)
  write(x)
  return v, x


def _set_data(t, new):
  with torch.no_grad():
    t.data = new
  return t


DTYPE_VIEW_CASES = {
  "view_as_real_select_fill_": lambda d: (lambda z: (torch.view_as_real(z)[..., 1].fill_(3), z))(
    _z(d)
  ),
  "view_as_real_slice_mul_": lambda d: (lambda z: (torch.view_as_real(z)[1:, 0].mul_(3), z))(_z(d)),
  "view_as_real_sees_base_add_": lambda d: _written_base(
    _z(d), torch.view_as_real, lambda z: z.add_(1j)
  ),
  "view_as_real_of_strided_then_base": lambda d: _written_base(
    _z(d), lambda z: torch.view_as_real(z[::2]).t(), lambda z: z.mul_(2)
  ),
  "view_as_real_0_dim": lambda d: (lambda z: (torch.view_as_real(z).add_(1), z))(
    torch.tensor(1 + 2j, device=d)
  ),
  "view_as_real_empty": lambda d: torch.view_as_real(
    torch.zeros(0, dtype=torch.complex64, device=d)
  ),
  "view_as_complex_add_": lambda d: (lambda y: (torch.view_as_complex(y).add_(1 + 2j), y))(
    torch.zeros(2, 2, device=d)
  ),
  "view_as_complex_of_view_as_real": lambda d: (
    lambda z: (torch.view_as_complex(torch.view_as_real(z)).mul_(1j), z)
  )(_z(d)),
  "view_as_complex_sees_base": lambda d: _written_base(
    _f(d).view(4, 2), torch.view_as_complex, lambda y: y[:, 1].fill_(-1)
  ),
  "real_mul_": lambda d: (lambda z: (z.real.mul_(10), z))(_z(d)),
  "imag_fill_": lambda d: (lambda z: (z.imag.fill_(5), z))(_z(d)),
  "real_imag_read": lambda d: (lambda z: (z.real, z.imag))(_z(d)),
  "complex_as_float32": lambda d: (lambda z: (z.view(torch.float32), z))(_z(d)),
  "complex_as_float32_add_": lambda d: (lambda z: (z.view(torch.float32).add_(1), z))(_z(d)),
  "complex128_as_float32": lambda d: (lambda z: (z.view(torch.float32)[::3].neg_(), z))(
    _z(d).to(torch.complex128)
  ),
  "float32_as_complex64_2d": lambda d: (lambda x: (x.view(torch.complex64).mul_(1j), x))(
    _f(d).view(2, 4)
  ),
  "float32_as_complex64_offset": lambda d: (
    lambda x: (x.view(2, 4)[:, 2:].view(torch.complex64).add_(1j), x)
  )(_f(d)),
  "float32_as_complex128": lambda d: (lambda x: (x.view(torch.complex128).mul_(2), x))(
    _f(d).view(2, 4)
  ),
  "float32_as_int32_add_": lambda d: (lambda x: (x.view(torch.int32).add_(1), x))(_f(d, 3)),
  "float32_as_int16_zero_": lambda d: (lambda x: (x.view(torch.int16).zero_(), x))(_f(d, 4)),
  "float32_as_int8_strided": lambda d: (lambda x: (x.view(torch.int8)[..., ::4].add_(1), x))(
    _f(d, 6).view(2, 3)
  ),
  "float32_as_bfloat16": lambda d: (lambda x: (x.view(torch.bfloat16).add_(1), x))(_f(d, 4)),
  "float32_as_float64_slice": lambda d: (lambda x: (x[2:6].view(torch.float64).add_(1), x))(_f(d)),
  "float32_as_float64_tail_kept": lambda d: (lambda x: (x[:2].view(torch.float64).mul_(2), x))(
    _f(d, 3)
  ),
  "uint8_as_bool": lambda d: (lambda x: (x.view(torch.bool).logical_not_(), x))(
    torch.tensor([0, 1, 0, 1], dtype=torch.uint8, device=d)
  ),
  "int_view_sees_base": lambda d: _written_base(
    _f(d, 4), lambda x: x.view(torch.int32)[1:], lambda x: x.add_(1)
  ),
  "view_of_int_view": lambda d: (
    lambda x: (x.view(torch.int32).view(torch.int16)[1::2].add_(3), x)
  )(_f(d, 4)),
  "data_of_int_view": lambda d: (lambda x: (x.view(torch.int32).data.add_(1), x))(_f(d, 4)),
  "data_set_to_int_view": lambda d: (
    lambda x: (
      _set_data(torch.zeros(4, dtype=torch.int32, device=d), x.view(torch.int32)).add_(1),
      x,
    )
  )(_f(d, 4)),
  "conj_add_": lambda d: (lambda z: (z.conj().add_(1), z))(_z(d)),
  "conj_flags_and_values": lambda d: (lambda z: (z.conj(), z.conj().conj(), z.conj().imag))(_z(d)),
  "conj_sees_base": lambda d: _written_base(_z(d), torch.conj, lambda z: z.add_(1j)),
  "conj_copy_": lambda d: (lambda z: (z.conj().copy_(torch.full((4,), 2j, device=d)), z))(_z(d)),
  "conj_view_of_view": lambda d: (lambda z: (z.conj().view(2, 2).t().mul_(2), z))(_z(d)),
  "conj_imag_fill_": lambda d: (lambda z: (z.conj().imag.fill_(7), z))(_z(d)),
  "conj_imag_add_": lambda d: (lambda z: (z.conj().imag.add_(1), z))(_z(d)),
  "conj_conj_add_": lambda d: (lambda z: (z.conj().conj().add_(1), z))(_z(d)),
  "conj_ops": lambda d: (
    lambda z: (z.conj() + 1, z.conj() * z, torch.vdot(z.conj(), z), z.conj().resolve_conj())
  )(_z(d)),
  "conj_matmul": lambda d: (
    lambda m: (m.conj() @ m, m.mH @ m.conj(), torch.bmm(m[None].conj(), m[None]))
  )(_z(d).view(2, 2)),
}


def _flat(out):
  return [
    o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor)
  ]


@pytest.mark.parametrize("name", list(DTYPE_VIEW_CASES))
def test_dtype_and_conj_views_alias_like_cpu(name):
  cpu = _flat(DTYPE_VIEW_CASES[name]("cpu"))
  dev = _flat(DTYPE_VIEW_CASES[name]("jax"))
  assert len(dev) == len(cpu)
  for j, c in zip(dev, cpu):
    assert isinstance(j, bridge.Tensor)
    assert (j.shape, j.dtype, j.stride(), j.storage_offset()) == (
      c.shape,
      c.dtype,
      c.stride(),
      c.storage_offset(),
    )
    assert (j.is_conj(), j.is_neg()) == (c.is_conj(), c.is_neg())
    torch.testing.assert_close(j.cpu(), c.resolve_conj().resolve_neg(), rtol=0, atol=0)


DTYPE_VIEW_ERRORS = {
  "last_dim_odd": lambda d: _f(d, 3).view(torch.complex64),
  "offset_odd": lambda d: _f(d).view(2, 4)[:, 1:3].view(torch.complex64),
  "last_stride": lambda d: _f(d).view(2, 4).t().view(torch.float64),
  "offset_to_wider": lambda d: _f(d)[1:3].view(torch.float64),
  "zero_dim_to_wider": lambda d: torch.tensor(1.0, device=d).view(torch.complex64),
  "view_as_complex_last_dim": lambda d: torch.view_as_complex(_f(d, 6).view(2, 3)),
  "view_as_complex_stride": lambda d: torch.view_as_complex(_f(d).view(2, 4)[:, ::2]),
  "view_as_real_of_real": lambda d: torch.view_as_real(_f(d, 2)),
  "view_as_real_of_conj": lambda d: torch.view_as_real(_z(d).conj()),
  "dtype_view_of_conj": lambda d: _z(d).conj().view(torch.float32),
}


@pytest.mark.parametrize("name", list(DTYPE_VIEW_ERRORS))
def test_dtype_views_refuse_like_torch(name):
  with pytest.raises(RuntimeError) as cpu:
    DTYPE_VIEW_ERRORS[name]("cpu")
  with pytest.raises(type(cpu.value), match=re.escape(str(cpu.value))):
    DTYPE_VIEW_ERRORS[name]("jax")


def test_complex_viewed_as_float32():
  out = torch.tensor([1 + 2j, 3 + 4j], device="jax").view(torch.float32)
  torch.testing.assert_close(out.cpu(), torch.tensor([1.0, 2.0, 3.0, 4.0]), rtol=0, atol=0)


def _grad_case(device):
  z = torch.tensor([1 + 2j, 3 - 4j], device=device, requires_grad=True)
  w = z * 1
  torch.view_as_real(w)[:, 1].mul_(3)
  loss = (w.abs() ** 2).sum() + (z.conj() * torch.tensor([2 + 1j, 1j], device=device)).real.sum()
  x = torch.arange(4.0, device=device, requires_grad=True)
  y = torch.view_as_complex(x.view(2, 2) * 2)
  h = x * 1
  h.view(torch.int32).add_(1)  # (not recorded by torch: `h` keeps its derivative)
  loss = loss + (y * y.conj()).real.sum() + y.imag.sum() + h.sum()
  loss.backward()
  return z.grad, x.grad


def test_dtype_and_conj_views_under_autograd():
  for j, c in zip(_grad_case("jax"), _grad_case("cpu")):
    torch.testing.assert_close(j.cpu(), c)


def _traced_fill_view_as_real(z):
  z = z.clone()
  torch.view_as_real(z)[..., 1].fill_(3)
  return z


def _traced_imag_mul_(z):
  z = z.clone()
  z.imag.mul_(2)
  return z


def _traced_int_view_add_(x):
  x = x.clone()
  x.view(torch.int32).add_(1)
  return x


def _traced_conj_add_(z):
  z = z.clone()
  z.conj().add_(1)
  z.conj().imag.add_(1)
  return z


def _traced_view_as_complex(x):
  x = x.clone()
  torch.view_as_complex(x.view(-1, 2)).mul_(1j)
  return x


@pytest.mark.parametrize(
  "fn,array",
  [
    (_traced_fill_view_as_real, np.arange(3.0).astype(np.complex64)),
    (_traced_imag_mul_, (np.arange(3.0) + 1j).astype(np.complex64)),
    (_traced_int_view_add_, np.arange(3.0, dtype=np.float32)),
    (_traced_conj_add_, np.array([1 + 2j, 3 - 4j], np.complex64)),
    (_traced_view_as_complex, np.arange(4.0, dtype=np.float32)),
  ],
  ids=lambda v: v.__name__.removeprefix("_traced_") if callable(v) else str(v.dtype),
)
def test_writes_through_dtype_and_conj_views_in_call_torch_under_jit(fn, array):
  expected = fn(torch.from_numpy(array.copy()))
  got = np.asarray(jax.jit(lambda a: bridge.call_torch(fn, a))(jnp.asarray(array)))
  torch.testing.assert_close(torch.from_numpy(got.copy()), expected, rtol=0, atol=0)


def _traced_grad_case(v):
  z = torch.view_as_complex(v.reshape(-1, 2) * 1)
  z.imag.mul_(2)
  h = v * 1
  h.view(torch.int32).add_(1)
  return (z.conj() * z).real.sum() + (h * 2).sum()


def test_dtype_views_under_jax_grad_of_call_torch():
  v = np.array([1.0, 2.0, 3.0, -4.0], np.float32)
  ref = torch.from_numpy(v.copy()).requires_grad_()
  _traced_grad_case(ref).backward()
  got = jax.jit(jax.grad(lambda a: bridge.call_torch(_traced_grad_case, a)))(jnp.asarray(v))
  torch.testing.assert_close(torch.from_numpy(np.asarray(got).copy()), ref.grad)


def test_deepcopy_keeps_views_views_on_the_jax_device():
  # A view at an offset (`t[1:]`) could not be deep-copied at all: torch took its storage path
  # (a nonzero data pointer) and `untyped_storage()` refused.
  import copy

  t = torch.arange(6.0, device="jax").requires_grad_()
  t.grad = torch.ones(6, device="jax")
  t.note = "kept"
  z = torch.tensor([1 + 2j, 3 - 1j], device="jax")
  with torch.no_grad():
    got = copy.deepcopy(
      {"t": t, "v": t.detach()[1:].view(5), "w": t.detach()[2:4], "z": [z, z.conj()]}
    )
    got["t"].add_(10)
    got["z"][0].mul_(2)
  assert got["t"].requires_grad and got["t"].note == "kept"
  torch.testing.assert_close(got["t"].grad.cpu(), torch.ones(6))
  torch.testing.assert_close(got["v"].cpu(), torch.arange(1.0, 6.0) + 10)
  torch.testing.assert_close(got["w"].cpu(), torch.arange(2.0, 4.0) + 10)
  torch.testing.assert_close(got["z"][1].cpu(), (2 * z.cpu()).conj())
  assert got["z"][1].is_conj()
  torch.testing.assert_close(t.detach().cpu(), torch.arange(6.0))  # the original is untouched
  with pytest.raises(RuntimeError, match="graph leaves"):
    copy.deepcopy(t * 2)
