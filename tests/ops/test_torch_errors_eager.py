"""Value errors and signed zeros on the `jax` device, as torch on CPU: integer division by
zero, integers to negative integer powers and multinomial's bad weights raise torch's
RuntimeError in eager mode, and the
ops whose sign of zero torch's CPU kernels define keep it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F


def _t(dev, *values, dtype=torch.int64):
  return torch.tensor(values, device=dev, dtype=dtype)


# name -> op on device `dev`; torch on CPU raises RuntimeError for each.
RAISES = {
  "pow_negative_scalar": lambda d: torch.pow(_t(d, 2, 3), -1),
  "pow_negative_operator": lambda d: _t(d, 2, 3) ** -2,
  "pow_one_base": lambda d: torch.pow(_t(d, 1, 1), -2),
  "pow_int32": lambda d: torch.pow(_t(d, 2, dtype=torch.int32), -1),
  "pow_uint8": lambda d: torch.pow(_t(d, 2, dtype=torch.uint8), -1),
  "pow_bool": lambda d: torch.pow(_t(d, True, dtype=torch.bool), -1),
  "pow_in_place": lambda d: _t(d, 2, 3).pow_(-1),
  "div_floor": lambda d: torch.div(_t(d, 2, 3), _t(d, 0, 1), rounding_mode="floor"),
  "div_trunc": lambda d: torch.div(_t(d, 2, 3), _t(d, 0, 1), rounding_mode="trunc"),
  "div_trunc_scalar": lambda d: torch.div(_t(d, 2, 3), 0, rounding_mode="trunc"),
  "div_floor_in_place": lambda d: _t(d, 2, 3).div_(_t(d, 1, 0), rounding_mode="floor"),
  "floor_divide": lambda d: torch.floor_divide(_t(d, 2, 3), _t(d, 0, 1)),
  "floor_divide_scalar": lambda d: torch.floor_divide(_t(d, 2, 3), 0),
  "floor_divide_operator": lambda d: _t(d, 2, 3) // 0,
  "floor_divide_reflected": lambda d: 5 // _t(d, 0, 1),
  "floor_divide_int8": lambda d: torch.floor_divide(
    _t(d, 2, dtype=torch.int8), _t(d, 0, dtype=torch.int8)
  ),
  "remainder": lambda d: torch.remainder(_t(d, 2, 3), _t(d, 0, 1)),
  "remainder_scalar": lambda d: torch.remainder(_t(d, 2, 3), 0),
  "remainder_scalar_tensor": lambda d: torch.remainder(5, _t(d, 0, 1)),
  "remainder_operator": lambda d: _t(d, 2, 3) % 0,
  "remainder_uint8": lambda d: torch.remainder(
    _t(d, 2, dtype=torch.uint8), _t(d, 0, dtype=torch.uint8)
  ),
  "remainder_broadcast": lambda d: torch.remainder(_t(d, 2, 3), torch.tensor(0, device=d)),
  "fmod": lambda d: torch.fmod(_t(d, 2, 3), _t(d, 0, 1)),
  "fmod_scalar": lambda d: torch.fmod(_t(d, 2, 3), 0),
  "fmod_in_place": lambda d: _t(d, 2, 3).fmod_(0),
  "masked_scatter_short_source": lambda d: torch.zeros(3, device=d).masked_scatter(
    _t(d, True, False, True, dtype=torch.bool), torch.ones(1, device=d)
  ),
  "masked_scatter_empty_source": lambda d: torch.zeros(3, device=d).masked_scatter(
    _t(d, False, True, False, dtype=torch.bool), torch.ones(0, device=d)
  ),
}


def _p(dev, *rows):
  return torch.tensor(rows, device=dev, dtype=torch.float32)


_NAN, _INF = math.nan, math.inf

# name -> multinomial call on device `dev`; torch on CPU raises RuntimeError for each. Its
# weights are checked all at once without replacement or for one sample, else row by row,
# weight by weight, then the row's sum.
_MULTINOMIAL = {
  "nan": lambda d: torch.multinomial(_p(d, 0.2, _NAN, 0.3), 1),
  "negative": lambda d: torch.multinomial(_p(d, 0.2, -1.0), 1, True),
  "inf": lambda d: torch.multinomial(_p(d, [0.2, 0.3], [1.0, _INF]), 2),
  "zero_row": lambda d: torch.multinomial(_p(d, [0.2, 0.3], [0.0, 0.0]), 1),
  "zero_row_then_nan": lambda d: torch.multinomial(_p(d, [0.0, 0.0], [_NAN, 1.0]), 2),
  "rows_nan": lambda d: torch.multinomial(_p(d, [0.2, 0.3], [_NAN, 1.0]), 2, True),
  "rows_inf": lambda d: torch.multinomial(_p(d, [0.2, 0.3], [1.0, _INF]), 2, True),
  "rows_zero_then_nan": lambda d: torch.multinomial(_p(d, [0.0, 0.0], [_NAN, 1.0]), 2, True),
  "rows_negative_then_zero": lambda d: torch.multinomial(_p(d, [0.5, -0.5], [0.0, 0.0]), 3, True),
  "too_many": lambda d: torch.multinomial(_p(d, 0.2, 0.3), 3),
  "no_samples": lambda d: torch.multinomial(_p(d, 0.2, 0.3), 0, True),
  "no_weights": lambda d: torch.multinomial(_p(d, [], []), 1, True),
}
RAISES.update({f"multinomial_{k}": v for k, v in _MULTINOMIAL.items()})

# What torch computes without raising: the same values (and dtypes) here.
COMPUTES = {
  "pow_negative_tensor_exponent": lambda d: torch.pow(_t(d, 2, 3, -1), _t(d, -1, 1, -3)),
  "pow_scalar_base": lambda d: torch.pow(2, _t(d, -1, 1)),
  "pow_negative_0d_tensor": lambda d: torch.pow(_t(d, 2, 3), torch.tensor(-1, device=d)),
  "pow_negative_float_exponent": lambda d: torch.pow(_t(d, 2, 4), -1.0),
  "pow_positive": lambda d: torch.pow(_t(d, 2, -3), 3),
  "true_divide_by_zero": lambda d: torch.div(_t(d, 2, -3, 0), _t(d, 0, 0, 0)),
  "float_floor_divide_by_zero": lambda d: torch.floor_divide(
    _t(d, 2.0, -3.0, dtype=torch.float32), 0.0
  ),
  "float_remainder_by_zero": lambda d: torch.remainder(_t(d, 2.0, dtype=torch.float32), 0),
  "float_fmod_by_zero": lambda d: torch.fmod(
    _t(d, 2.0, dtype=torch.float64), _t(d, 0.0, dtype=torch.float64)
  ),
  "int_by_float_zero": lambda d: torch.remainder(_t(d, 2, 3), 0.0),
  "remainder_nonzero": lambda d: torch.remainder(_t(d, -7, 7), _t(d, 3, -3)),
  "floor_divide_nonzero": lambda d: torch.floor_divide(_t(d, -7, 7), 2),
}


@pytest.mark.parametrize("name", list(RAISES))
def test_raises_torchs_error(name):
  with pytest.raises(RuntimeError) as expected:
    RAISES[name]("cpu")
  with pytest.raises(RuntimeError) as info:
    RAISES[name]("jax")
  assert str(info.value) == str(expected.value)


@pytest.mark.parametrize("name", list(COMPUTES))
def test_computes_what_torch_computes(name):
  expected = COMPUTES[name]("cpu")
  torch.testing.assert_close(COMPUTES[name]("jax").cpu(), expected, equal_nan=True)


# --- signed zeros ---------------------------------------------------------------------------
#
# Where torch's CPU kernels give one sign of zero whatever the size and layout, the `jax`
# device gives the same. torch defines it (checked over sizes 1..4097, contiguous and strided):
# relu, hardtanh and clamp with Scalar bounds keep the input; fmin/fmax return the first
# argument on a tie (float16/32/64); max/min along a dim, cummax/cummin and max_pool return the
# element at the index they report. maximum/minimum (and clamp with tensor bounds) return the
# first argument on a tie below 16 elements (torch's scalar loop, which a 0-d or small tensor
# takes) but the second in its 16-wide vector loop: the `jax` device follows the scalar loop.
# The full reductions max()/min()/amax/amin pick either zero depending on the vector layout:
# not followed (XLA orders -0 < +0).

_A = (-0.0, 0.0, -0.0, 0.0, 1.0, -2.0, float("nan"))
_B = (0.0, -0.0, -0.0, 0.0, 1.0, 3.0, 0.0)
_Z = (-0.0, 0.0, 0.0, -0.0, -0.0)


def _f(dev, values, dtype=torch.float32):
  return torch.tensor(values, device=dev, dtype=dtype)


SIGNS = {
  "maximum": lambda d: torch.maximum(_f(d, _A), _f(d, _B)),
  "minimum": lambda d: torch.minimum(_f(d, _A), _f(d, _B)),
  "maximum_0d": lambda d: torch.maximum(torch.tensor(-0.0, device=d), torch.tensor(0.0, device=d)),
  "minimum_0d": lambda d: torch.minimum(torch.tensor(0.0, device=d), torch.tensor(-0.0, device=d)),
  "max_binary": lambda d: torch.max(_f(d, _A), _f(d, _B)),
  "maximum_float64": lambda d: torch.maximum(_f(d, _A, torch.float64), _f(d, _B, torch.float64)),
  "minimum_bfloat16": lambda d: torch.minimum(_f(d, _A, torch.bfloat16), _f(d, _B, torch.bfloat16)),
  "fmax": lambda d: torch.fmax(_f(d, _A), _f(d, _B)),
  "fmin_float16": lambda d: torch.fmin(_f(d, _A, torch.float16), _f(d, _B, torch.float16)),
  "clamp_scalar": lambda d: torch.clamp(_f(d, _A), min=0.0, max=0.0),
  "clamp_scalar_negative_zero": lambda d: torch.clamp(_f(d, _A), min=-0.0),
  "clamp_tensor": lambda d: torch.clamp(_f(d, _A), min=_f(d, _B)),
  "clamp_max_tensor": lambda d: torch.clamp(_f(d, _A), max=_f(d, _B)),
  "relu": lambda d: torch.relu(_f(d, _A)),
  "relu_float64": lambda d: F.relu(_f(d, _Z, torch.float64)),
  "hardtanh": lambda d: F.hardtanh(_f(d, _A), -0.0, 0.0),
  "max_dim": lambda d: torch.max(_f(d, _Z).reshape(1, 5), 1).values,
  "min_dim": lambda d: torch.min(_f(d, _Z[1:]).reshape(2, 2), 0).values,
  "cummax": lambda d: torch.cummax(_f(d, _Z), 0).values,
  "cummin": lambda d: torch.cummin(_f(d, _Z), 0).values,
  "cummax_2d": lambda d: torch.cummax(_f(d, _Z[:4]).reshape(2, 2), 1).values,
  "max_pool1d": lambda d: F.max_pool1d(_f(d, _Z[:4]).reshape(1, 1, 4), 2),
}


@pytest.mark.parametrize("name", list(SIGNS))
def test_sign_of_zero_is_torchs(name):
  expected = SIGNS[name]("cpu")
  got = SIGNS[name]("jax").cpu()
  torch.testing.assert_close(got, expected, equal_nan=True)
  assert torch.equal(torch.signbit(got), torch.signbit(expected)), (got, expected)


def test_maximum_derivative_is_split_on_a_tie():
  a = torch.tensor([-0.0, 1.0, 2.0], device="jax", requires_grad=True)
  b = torch.tensor([0.0, 1.0, 3.0], device="jax", requires_grad=True)
  torch.maximum(a, b).sum().backward()
  torch.testing.assert_close(a.grad.cpu(), torch.tensor([0.5, 0.5, 0.0]))
  torch.testing.assert_close(b.grad.cpu(), torch.tensor([0.5, 0.5, 1.0]))


@pytest.mark.parametrize(
  "put",
  [
    lambda x, i: x.index_put((i,), torch.tensor(1000, device=x.device)),
    lambda x, i: x.index_put_((i,), torch.tensor(5.0, device=x.device), accumulate=True),
    lambda x, i: x.__setitem__(i, torch.tensor(5.0, device=x.device)),
  ],
  ids=["index_put_long", "index_put__float_accumulate", "setitem_float_tensor"],
)
def test_index_put_of_another_dtype_raises_torchs_error(put):
  # (the lowering cast the values: int8[i] = tensor(1000) wrote -24)
  errors = []
  for device in ("cpu", "jax"):
    with pytest.raises(RuntimeError) as info:
      put(torch.zeros(4, dtype=torch.int8, device=device), torch.tensor([1], device=device))
    errors.append(str(info.value))
  assert errors[0] == errors[1] and "dtypes match" in errors[0], errors
