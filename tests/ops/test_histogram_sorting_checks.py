"""torch's errors for the arguments and values that bincount, histc, histogram(dd),
searchsorted, bucketize, gcd/lcm and mvlgamma refuse, on the `jax` device and in compiled
programs, against torch on CPU; and the values of valid calls, which the checks leave as
torch computes them.

A Python number (`minlength`, histc's `min`/`max`, histogram's `range`) is checked when the op
runs, inside a compiled program too; the data's range (histc, histogram) and a searchsorted
`sorter`'s values are value checks, inside a JAX program only with
`bridge.config(check_indices=True)`.
"""

from __future__ import annotations

import jax
import pytest
import torch

import bridge

nan, inf = float("nan"), float("inf")


def _t(d, values, dtype=None):
  return torch.tensor(values, dtype=dtype, device=d)


def _ones(d, *shape):
  return torch.ones(*shape, device=d)


# name -> call on device `d`; torch on CPU raises for each, its type and message here too.
ERRORS = {
  # bincount
  "bincount_negative_minlength": lambda d: torch.bincount(_t(d, [1, 1]), minlength=-1),
  "bincount_negative_minlength_empty": lambda d: torch.bincount(
    _t(d, [], torch.long), minlength=-1
  ),
  "bincount_float": lambda d: torch.bincount(_t(d, [1.0])),
  "bincount_double": lambda d: torch.bincount(_t(d, [1.0], torch.float64)),
  "bincount_float_before_minlength": lambda d: torch.bincount(_t(d, [1.0]), minlength=-1),
  "bincount_weights_longer": lambda d: torch.bincount(_t(d, [1, 1]), weights=_ones(d, 3)),
  "bincount_weights_2d": lambda d: torch.bincount(_t(d, [1, 1]), weights=_ones(d, 2, 1)),
  # histc: its arguments' range
  "histc_max_below_min": lambda d: torch.histc(_t(d, [1.0, 2.0]), bins=3, min=2, max=1),
  "histc_infinite_max": lambda d: torch.histc(_t(d, [1.0]), min=0, max=inf),
  "histc_nan_min": lambda d: torch.histc(_t(d, [1.0]), min=nan, max=1),
  "histc_empty_input_infinite_range": lambda d: torch.histc(
    _t(d, [], torch.float32), min=inf, max=inf
  ),
  # histc: the data's range
  "histc_nan": lambda d: torch.histc(_t(d, [nan])),
  "histc_nan_float64": lambda d: torch.histc(_t(d, [nan], torch.float64)),
  "histc_nan_among_numbers": lambda d: torch.histc(_t(d, [1.0, nan, 3.0])),
  "histc_nan_float16": lambda d: torch.histc(_t(d, [1.0, nan], torch.float16)),
  "histc_nan_bfloat16": lambda d: torch.histc(_t(d, [1.0, nan], torch.bfloat16)),
  "histc_inf": lambda d: torch.histc(_t(d, [1.0, inf])),
  "histc_minus_inf": lambda d: torch.histc(_t(d, [-inf, 1.0])),
  "histc_only_inf": lambda d: torch.histc(_t(d, [inf, inf])),
  "histc_only_minus_inf_float64": lambda d: torch.histc(_t(d, [-inf], torch.float64)),
  # histogram with a number of bins
  "histogram_negative_bins": lambda d: torch.histogram(_t(d, [1.0]), bins=-1),
  "histogram_zero_bins": lambda d: torch.histogram(_t(d, [1.0]), bins=0),
  "histogram_range_reversed": lambda d: torch.histogram(_t(d, [1.0]), bins=3, range=(2.0, 1.0)),
  "histogram_range_infinite": lambda d: torch.histogram(_t(d, [1.0]), bins=3, range=(0.0, inf)),
  "histogram_nan": lambda d: torch.histogram(_t(d, [nan]), bins=3),
  "histogram_first_nan_negative": lambda d: torch.histogram(_t(d, [1.0, -nan, nan]), bins=3),
  "histogram_inf": lambda d: torch.histogram(_t(d, [inf]), bins=3),
  "histogram_weight_length": lambda d: torch.histogram(
    _t(d, [1.0, 2.0]), bins=3, weight=_ones(d, 3)
  ),
  # histogram with bin edges
  "histogram_edges_2d": lambda d: torch.histogram(_t(d, [1.0]), bins=_ones(d, 2, 2)),
  "histogram_edges_empty": lambda d: torch.histogram(_t(d, [1.0]), bins=_ones(d, 0)),
  "histogram_one_edge": lambda d: torch.histogram(_t(d, [1.0]), bins=_t(d, [2.0])),
  "histogram_edges_weight_length": lambda d: torch.histogram(
    _ones(d, 3), bins=_ones(d, 3), weight=_ones(d, 2)
  ),
  # histogramdd
  "histogramdd_negative_bins": lambda d: torch.histogramdd(_ones(d, 3, 2), bins=[-1, 2]),
  "histogramdd_very_negative_bins": lambda d: torch.histogramdd(_ones(d, 3, 2), bins=[-2, 2]),
  "histogramdd_zero_bins": lambda d: torch.histogramdd(_ones(d, 3, 2), bins=[2, 0]),
  "histogramdd_bins_per_dim": lambda d: torch.histogramdd(_ones(d, 3, 2), bins=[2, 2, 2]),
  "histogramdd_range_length": lambda d: torch.histogramdd(
    _ones(d, 3, 2), bins=[2, 2], range=[0.0, 1.0]
  ),
  "histogramdd_range_reversed": lambda d: torch.histogramdd(
    _ones(d, 3, 2), bins=[2, 2], range=[0.0, 1.0, 3.0, 2.0]
  ),
  "histogramdd_nan_in_dim_1": lambda d: torch.histogramdd(
    _t(d, [[1.0, -nan], [2.0, nan]]), bins=[2, 2]
  ),
  "histogramdd_weight_shape": lambda d: torch.histogramdd(
    _ones(d, 3, 2), bins=[2, 2], weight=_ones(d, 2)
  ),
  "histogramdd_edges_2d": lambda d: torch.histogramdd(
    _ones(d, 3, 2), bins=[_ones(d, 2, 2), _ones(d, 2)]
  ),
  # searchsorted / bucketize
  "searchsorted_sorter_past_end": lambda d: torch.searchsorted(
    _t(d, [1.0, 2.0, 3.0]), _t(d, [2.0]), sorter=_t(d, [0, 1, 5])
  ),
  "searchsorted_sorter_negative": lambda d: torch.searchsorted(
    _t(d, [1.0, 2.0, 3.0]), _t(d, [2.0]), sorter=_t(d, [0, 1, -1])
  ),
  "searchsorted_sorter_equal_to_size": lambda d: torch.searchsorted(
    _t(d, [1.0, 2.0, 3.0]), _t(d, [2.0]), sorter=_t(d, [0, 1, 3])
  ),
  "searchsorted_sorter_2d": lambda d: torch.searchsorted(
    _t(d, [[1.0, 2.0, 3.0]]), _t(d, [[2.0]]), sorter=_t(d, [[0, 1, 5]])
  ),
  "searchsorted_scalar_sorter": lambda d: torch.searchsorted(
    _t(d, [1.0, 2.0, 3.0]), 2.0, sorter=_t(d, [0, 1, 5])
  ),
  "searchsorted_float_sorter": lambda d: torch.searchsorted(
    _t(d, [1.0, 2.0, 3.0]), _t(d, [2.0]), sorter=_t(d, [0.0, 1.0, 2.0])
  ),
  "searchsorted_side": lambda d: torch.searchsorted(
    _t(d, [1.0, 2.0, 3.0]), _t(d, [2.0]), side="middle"
  ),
  "searchsorted_0d_boundaries": lambda d: torch.searchsorted(_t(d, 1.0), _t(d, [2.0])),
  "bucketize_2d_boundaries": lambda d: torch.bucketize(_t(d, [2.0]), _t(d, [[1.0, 2.0]])),
  "bucketize_0d_boundaries": lambda d: torch.bucketize(_t(d, [2.0]), _t(d, 1.0)),
  "bucketize_scalar_2d_boundaries": lambda d: torch.bucketize(2.0, _t(d, [[1.0, 2.0]])),
  # gcd / lcm of floats
  "gcd_float": lambda d: torch.gcd(_t(d, [4.0]), _t(d, [6.0])),
  "gcd_double": lambda d: torch.gcd(_t(d, [4.0], torch.float64), _t(d, [6.0], torch.float64)),
  "lcm_float": lambda d: torch.lcm(_t(d, [4.0]), _t(d, [6.0])),
  "lcm_double": lambda d: torch.lcm(_t(d, [4.0], torch.float64), _t(d, [6.0], torch.float64)),
  # mvlgamma
  "mvlgamma_p_0": lambda d: torch.mvlgamma(_t(d, [1.0]), 0),
  "mvlgamma_inplace_p_0": lambda d: _t(d, [1.0]).mvlgamma_(0),
}


def _error(fn, *args):
  with pytest.raises(Exception) as info:
    fn(*args)
  return info.value


def _text(e):
  return "\n".join(line for line in str(e).splitlines() if not line.startswith("Exception raised"))


@pytest.mark.parametrize("name", list(ERRORS))
def test_raises_torchs_error(name):
  expected = _error(ERRORS[name], "cpu")
  got = _error(ERRORS[name], "jax")
  assert isinstance(got, type(expected)), (type(got), got)
  assert _text(got) == _text(expected)


# name -> call on device `d` that torch computes; the checks leave its values alone.
VALUES = {
  "bincount_weights_minlength": lambda d: torch.bincount(
    _t(d, [0, 3, 3, 1]), weights=_t(d, [0.5, 1.0, 2.0, 4.0]), minlength=6
  ),
  "bincount_int32": lambda d: torch.bincount(_t(d, [2, 0, 2], torch.int32)),
  "histc_data_range": lambda d: torch.histc(_t(d, [0.3, 1.7, 2.2, 2.2, 9.0]), bins=4),
  "histc_given_range": lambda d: torch.histc(_t(d, [0.3, 1.7, 2.2, 9.0]), bins=3, min=0, max=3),
  "histc_constant_data": lambda d: torch.histc(_t(d, [2.0, 2.0]), bins=4),
  "histc_empty": lambda d: torch.histc(_t(d, [], torch.float32), bins=5),
  "histogram_range_weight": lambda d: torch.histogram(
    _t(d, [0.3, 1.7, 2.2]), bins=3, range=(0.0, 3.0), weight=_t(d, [1.0, 2.0, 3.0])
  )[0],
  "histogram_edges": lambda d: torch.histogram(_t(d, [0.3, 1.7, 2.2]), bins=_t(d, [0.0, 1.0, 2.5]))[
    0
  ],
  "histogramdd": lambda d: (
    torch.histogramdd(_t(d, [[0.0, 1.0], [2.0, 0.5], [1.0, 1.0]]), bins=[2, 3]).hist
  ),
  "searchsorted_sorter": lambda d: torch.searchsorted(
    _t(d, [3.0, 1.0, 2.0]), _t(d, [0.5, 2.0, 2.5, 4.0]), sorter=_t(d, [1, 2, 0]), right=True
  ),
  "searchsorted_2d": lambda d: torch.searchsorted(
    _t(d, [[1.0, 2.0], [0.0, 5.0]]), _t(d, [[1.5], [6.0]])
  ),
  "bucketize": lambda d: torch.bucketize(_t(d, [0.5, 2.0, 7.0]), _t(d, [1.0, 2.0, 3.0])),
  "gcd_int": lambda d: torch.gcd(_t(d, [4, -6, 0]), _t(d, [6, 9, 0])),
  "lcm_int": lambda d: torch.lcm(_t(d, [4, -6, 0]), _t(d, [6, 9, 5])),
  "mvlgamma_p_3": lambda d: torch.mvlgamma(_t(d, [2.5, 4.0]), 3),
}

# valid calls whose values the old lowerings got wrong (the rest are controls)
VALUES_FIXED = {
  # torch returns at once for an empty input: int64 zeros, whatever the weights
  "bincount_empty_with_weights": lambda d: torch.bincount(
    _t(d, [], torch.long), weights=_ones(d, 0), minlength=2
  ),
  # torch widens a float32 [x, x] by a step of float32 where that is more than 1
  "histc_large_constant_float32": lambda d: torch.histc(_t(d, [1e10, 1e10]), bins=4),
  "histc_large_equal_min_max": lambda d: torch.histc(_t(d, [3e7]), bins=4, min=3e7, max=3e7),
}


@pytest.mark.parametrize("name", list(VALUES))
def test_control_valid_calls_keep_torchs_values(name):
  expected, got = VALUES[name]("cpu"), VALUES[name]("jax").cpu()
  assert got.dtype == expected.dtype
  torch.testing.assert_close(got, expected)  # (exact but for lgamma's last bits in mvlgamma)


@pytest.mark.parametrize("name", list(VALUES_FIXED))
def test_valid_calls_give_torchs_values(name):
  expected, got = VALUES_FIXED[name]("cpu"), VALUES_FIXED[name]("jax").cpu()
  assert got.dtype == expected.dtype
  torch.testing.assert_close(got, expected, rtol=0, atol=0)


# --- bridge.compile ---------------------------------------------------------------------------

# name -> (function of CPU tensors, its arguments): torch refuses a Python number or a dtype,
# which the compiled program refuses as it is traced, check_indices or not
COMPILED_ARGUMENTS = {
  "histc_max_below_min": (lambda x: torch.histc(x, bins=3, min=2, max=1), ([1.0, 2.0],)),
  "histc_infinite_max": (lambda x: torch.histc(x, min=0, max=inf), ([1.0],)),
  "histogram_range_reversed": (
    lambda x: torch.histogram(x, bins=3, range=(2.0, 1.0))[0],
    ([1.0],),
  ),
  "bucketize_2d_boundaries": (lambda x, b: torch.bucketize(x, b), ([2.0], [[1.0, 2.0]])),
  "gcd_float": (torch.gcd, ([4.0], [6.0])),
  "lcm_double": (lambda a, b: torch.lcm(a.double(), b.double()), ([4.0], [6.0])),
  "mvlgamma_p_0": (lambda x: torch.mvlgamma(x, 0), ([1.0],)),
}


@pytest.mark.parametrize("name", list(COMPILED_ARGUMENTS))
def test_bridge_compile_raises_torchs_error_for_arguments(name):
  fn, args = COMPILED_ARGUMENTS[name]
  args = [torch.tensor(a) for a in args]
  expected = _error(fn, *args)
  got = _error(bridge.compile(fn), *args)
  assert isinstance(got, type(expected)), (type(got), got)
  assert _text(got) == _text(expected)


def test_bridge_compile_bincount_negative_minlength():
  x = torch.tensor([1, 1])
  expected = _error(lambda: torch.bincount(x, minlength=-1))
  got = _error(lambda: bridge.compile(lambda t: torch.bincount(t, minlength=-1))(x))
  assert isinstance(got, type(expected)), (type(got), got)
  assert _text(got) == _text(expected)


# name -> (function of CPU tensors, its arguments, the op): torch refuses the values, which a
# compiled program checks with `bridge.config(check_indices=True)`
COMPILED_VALUES = {
  "histc_nan": (lambda x: torch.histc(x, bins=4), ([1.0, nan, 2.0],), "aten.histc.default"),
  "histc_inf": (lambda x: torch.histc(x, bins=4), ([1.0, inf],), "aten.histc.default"),
  "searchsorted_sorter": (
    lambda s, v, i: torch.searchsorted(s, v, sorter=i),
    ([1.0, 2.0, 3.0], [2.0], [0, 1, 5]),
    "aten.searchsorted.Tensor",
  ),
}


@pytest.mark.parametrize("name", list(COMPILED_VALUES))
def test_bridge_compile_with_check_indices_checks_values(name):
  fn, args, op = COMPILED_VALUES[name]
  args = [torch.tensor(a) for a in args]
  expected = _error(fn, *args)
  with bridge.config(check_indices=True):
    compiled = bridge.compile(fn)
    # (torch's error, or JAX's wrapping it, as the program's run reports it)
    with pytest.raises((jax.errors.JaxRuntimeError, type(expected))) as info:
      compiled(*args)
  assert f"{op}: {_text(expected)}" in str(info.value)
