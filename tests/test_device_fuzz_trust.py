"""What a differential fuzzer of the `jax` device against CPU torch found: views reaching past
their storage, in-place ops whose functional form has another overload name or a dunder name,
foreach `lerp_` with a Scalar weight on half types, `index_select` of a 0-dim tensor."""

from __future__ import annotations

import warnings

import pytest
import torch

import bridge  # noqa: F401 - registers the `jax` device


def _on(device: str, fn):
  """fn(device) as (the CPU result, or the exception's type and message)."""
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      out = fn(device)
  except Exception as e:  # noqa: BLE001 - compared with CPU's
    return ("raised", isinstance(e, RuntimeError), str(e))
  return out.cpu() if isinstance(out, torch.Tensor) else out


def _same_as_cpu(fn) -> None:
  cpu, jax = _on("cpu", fn), _on("jax", fn)
  if isinstance(cpu, torch.Tensor):
    assert isinstance(jax, torch.Tensor), jax
    torch.testing.assert_close(jax, cpu, rtol=0, atol=0, equal_nan=True)
  else:
    assert jax == cpu


_OUT_OF_STORAGE = [((3,), (1,), 2), ((2,), (4,), 0), ((2, 2), (1, 1), 3)]


@pytest.mark.parametrize("layout", _OUT_OF_STORAGE)
def test_as_strided_past_the_storage_raises_torchs_error(layout):
  _same_as_cpu(lambda d: torch.arange(4.0, device=d).as_strided(*layout))
  _same_as_cpu(lambda d: torch.arange(4.0, device=d)[1:].as_strided(*layout))


def test_a_write_through_a_view_past_the_storage_leaves_the_tensor():
  x = torch.arange(4.0, device="jax")
  with pytest.raises(RuntimeError, match="out of bounds for storage of size 16"):
    x.as_strided((3,), (1,), 2).fill_(9)
  assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize(
  "layout", [((2,), (1,), 2), ((0,), (1,), 9), ((2, 2), (2, 1), 0), ((4,), (1,), 0)]
)
def test_as_strided_inside_the_storage_or_empty_still_works(layout):
  _same_as_cpu(lambda d: torch.arange(4.0, device=d).as_strided(*layout))


def _floordiv_assign(d):
  x = torch.tensor([5.0, -3.0, 7.5], device=d)
  x //= 2
  return x


def _lshift_bool(d):
  b = torch.tensor([True, False], device=d)
  b <<= 1
  return b


def _shifts(d):
  b = torch.tensor([8, 4, -16], device=d)
  b <<= torch.tensor([1, 2, 0], device=d)
  b >>= 1
  b &= 7
  b |= 8
  b ^= 1
  return b


@pytest.mark.parametrize(
  "fn",
  [
    _floordiv_assign,
    lambda d: torch.tensor([5.0, -3.0], device=d).floor_divide_(torch.tensor(2.0, device=d)),
    lambda d: torch.tensor([5.0, -3.0], device=d).pow_(torch.tensor([2.0, 3.0], device=d)),
    lambda d: torch.tensor([5.0, -3.0], device=d).float_power_(torch.tensor([2.0, 3.0], device=d)),
    lambda d: torch.tensor([5.0, -3.0], device=d, dtype=torch.float64).float_power_(2),
    _lshift_bool,
    _shifts,
  ],
  ids=[
    "floordiv_assign",
    "floor_divide_",
    "pow_",
    "float_power_",
    "float_power_64",
    "lshift_bool",
    "shifts",
  ],
)
def test_in_place_ops_take_their_functional_forms_checks(fn):
  _same_as_cpu(fn)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scalars", ["scalar", "scalar_list"])
def test_foreach_lerp_reads_a_scalar_weight_unrounded(dtype, scalars):
  g = torch.Generator().manual_seed(0)
  start = torch.randn(400, generator=g).to(dtype)
  end = torch.randn(400, generator=g).to(dtype)
  weight = 0.9937  # 0.9921875 in bfloat16: Adam's exp_avg.lerp_(grad, 1 - beta1) drifted

  def step(d):
    a, b = start.clone().to(d), end.clone().to(d)
    torch._foreach_lerp_([a], [b], weight if scalars == "scalar" else [weight])
    return torch.cat([a, torch._foreach_lerp([a], [b], 1 - weight)[0]])

  _same_as_cpu(step)


@pytest.mark.parametrize("index", [[0, 0], [], [0]])
def test_index_select_of_a_0_dim_tensor(index):
  _same_as_cpu(
    lambda d: torch.tensor(3.0, device=d).index_select(
      0, torch.tensor(index, dtype=torch.long, device=d)
    )
  )


def _uint8(d):
  return torch.tensor([1, 2], dtype=torch.uint8, device=d)


@pytest.mark.parametrize(
  "fn",
  [
    lambda d: _uint8(d).fill_(-1.0),
    lambda d: _uint8(d).masked_fill(torch.tensor([True, False], device=d), -0.5),
    lambda d: torch.full_like(_uint8(d), -3.0),
    lambda d: _uint8(d).index_fill(0, torch.tensor([0], device=d), -2.0),
    lambda d: _uint8(d).fill_(-1),  # an integer wraps, as in torch
    lambda d: _uint8(d).fill_(-0.0),
    lambda d: _uint8(d).fill_(254.5),
    lambda d: torch.zeros(2, dtype=torch.int8, device=d).fill_(-128.5),
    lambda d: _uint8(d) * -1,
    lambda d: _uint8(d) + (-1.0),
  ],
  ids=[
    "fill",
    "masked_fill",
    "full_like",
    "index_fill",
    "fill_int",
    "minus_zero",
    "254.5",
    "int8",
    "mul",
    "add",
  ],
)
def test_a_negative_float_into_an_unsigned_tensor_raises_torchs_overflow_error(fn):
  _same_as_cpu(fn)


@pytest.mark.parametrize(
  "shapes",
  [((4,), (3,)), ((3, 4), (2, 3, 4)), ((2, 3), (3, 1)), ((1, 3), (2, 3)), ((2, 3), (2, 1))],
)
@pytest.mark.parametrize("source", ["jax", "cpu"])
def test_copy_of_a_source_that_does_not_broadcast_raises_torchs_error(shapes, source):
  dst, src = shapes
  _same_as_cpu(
    lambda d: torch.zeros(dst, device=d).copy_(
      torch.ones(src, device=d if source == "jax" else "cpu")
    )
  )


@pytest.mark.parametrize(
  "fn",
  [
    lambda d: torch.tensor([], dtype=torch.int8, device=d).expand(2, 0).add_(1),
    lambda d: torch.zeros(1, 3, device=d).expand(0, 3).fill_(5),
  ],
)
def test_a_write_into_an_empty_expanded_tensor_is_no_write(fn):
  _same_as_cpu(fn)
