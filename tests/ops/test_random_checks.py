"""torch's checks of the random ops' arguments, on the `jax` device and in compiled programs,
against torch on CPU.

torch's CPU kernels refuse a distribution's invalid parameters before they draw: a negative
std, a p outside [0, 1] (`native_dropout` checks its 1 - p so), an empty or unbounded
`uniform_` range, a non-positive rate or scale, a negative Poisson rate. A Scalar argument's
check raises wherever the op runs, also while torch code is traced into a program; a tensor
argument's values (a tensor std, p or rate) are checked eagerly, and inside a program only with
`bridge.config(check_indices=True)`. Valid arguments draw as before (the controls below, which
pass with and without the checks).
"""

from __future__ import annotations

import jax
import pytest
import torch

import bridge
from tests.ops.harness import (
  assert_checked_program_raises,
  assert_raises_like_cpu,
  error_message,
)

aten = torch.ops.aten
F16, BF16, F64 = torch.float16, torch.bfloat16, torch.float64
nan, inf = float("nan"), float("inf")


def _z(d, dtype=torch.float32, n=3):
  return torch.zeros(n, dtype=dtype, device=d)


def _full(d, value, dtype=torch.float32, n=3):
  return torch.full((n,), value, dtype=dtype, device=d)


# name -> op on device `d`; torch on CPU raises for each (its type and message here too).
RAISES = {
  # normal: a Scalar std (normal_, its functional form, Tensor_float, float_float)
  "normal_negative_std": lambda d: _z(d).normal_(0, -1),
  "normal_nan_std": lambda d: _z(d).normal_(0, nan),
  "normal_negative_nan_std": lambda d: _z(d).normal_(0, -nan),
  "normal_minus_inf_std": lambda d: _z(d).normal_(0, -inf),
  "normal_float64": lambda d: _z(d, F64).normal_(0, -1.5),
  "normal_float16": lambda d: _z(d, F16).normal_(0, -1),
  "normal_bfloat16": lambda d: _z(d, BF16).normal_(1.0, -0.25),
  "normal_complex64": lambda d: _z(d, torch.complex64).normal_(0, -1),
  "normal_empty": lambda d: _z(d, n=0).normal_(0, -1),
  "normal_functional": lambda d: aten.normal_functional(_z(d), 0.0, -1.0),
  "normal_Tensor_float": lambda d: torch.normal(_z(d), -1.0),
  "normal_Tensor_float_nan": lambda d: torch.normal(_z(d), nan),
  "normal_float_float": lambda d: torch.normal(0.0, -1.0, (3,), device=d),
  "normal_float_float_nan": lambda d: torch.normal(0.0, nan, (3,), device=d),
  "normal_float_float_float64": lambda d: torch.normal(0.0, -2.0, (3,), dtype=F64, device=d),
  "init_normal": lambda d: torch.nn.init.normal_(_z(d), std=-1.0),
  # normal: a tensor std
  "normal_Tensor_Tensor": lambda d: torch.normal(_z(d), -torch.ones(3, device=d)),
  "normal_Tensor_Tensor_nan": lambda d: torch.normal(_z(d), _full(d, nan)),
  "normal_Tensor_Tensor_0d_std": lambda d: torch.normal(_z(d), torch.tensor(-1.0, device=d)),
  "normal_Tensor_Tensor_float64": lambda d: torch.normal(_z(d, F64), _full(d, -1.0, F64)),
  "normal_float_Tensor": lambda d: torch.normal(0.0, -torch.ones(3, device=d)),
  "normal_float_Tensor_nan": lambda d: torch.normal(0.0, torch.tensor([1.0, nan], device=d)),
  # uniform_: both bounds within the dtype, then from <= to, then to - from within it
  "uniform_from_above_to": lambda d: _z(d).uniform_(2, 1),
  "uniform_to_inf": lambda d: _z(d).uniform_(0, inf),
  "uniform_from_nan": lambda d: _z(d).uniform_(nan, 1),
  "uniform_to_nan": lambda d: _z(d).uniform_(0, nan),
  "uniform_both_out_of_bounds": lambda d: _z(d).uniform_(1e39, -1e39),
  "uniform_above_and_out_of_bounds": lambda d: _z(d).uniform_(5, 1e39),
  "uniform_range_exceeds_float": lambda d: _z(d).uniform_(-3.4e38, 3.4e38),
  "uniform_range_exceeds_half": lambda d: _z(d, F16).uniform_(-40000, 40000),
  "uniform_half_out_of_bounds": lambda d: _z(d, F16).uniform_(0, 70000),
  "uniform_half_from_out_of_bounds": lambda d: _z(d, F16).uniform_(-70000, 0),
  "uniform_bfloat16_out_of_bounds": lambda d: _z(d, BF16).uniform_(0, 3.4e38),
  "uniform_range_exceeds_double": lambda d: _z(d, F64).uniform_(-1.7e308, 1.7e308),
  "uniform_double_inf": lambda d: _z(d, F64).uniform_(0, inf),
  "uniform_complex64": lambda d: _z(d, torch.complex64).uniform_(2, 1),
  "uniform_complex64_range": lambda d: _z(d, torch.complex64).uniform_(-3e38, 3e38),
  "uniform_complex128_inf": lambda d: _z(d, torch.complex128).uniform_(0, inf),
  "uniform_empty": lambda d: _z(d, n=0).uniform_(2, 1),
  "uniform_functional": lambda d: aten.uniform(_z(d), 2.0, 1.0),
  "init_uniform": lambda d: torch.nn.init.uniform_(_z(d), 2, 1),
  # bernoulli: a Scalar p
  "bernoulli_p_above_one": lambda d: torch.bernoulli(_z(d), 1.5),
  "bernoulli__negative_p": lambda d: _z(d).bernoulli_(-0.5),
  "bernoulli__nan_p": lambda d: _z(d).bernoulli_(nan),
  "bernoulli__negative_nan_p": lambda d: _z(d).bernoulli_(-nan),
  "bernoulli__long": lambda d: _z(d, torch.int64).bernoulli_(1.5),
  "bernoulli__empty": lambda d: _z(d, n=0).bernoulli_(1.5),
  "bernoulli_p_functional": lambda d: aten.bernoulli.p(_z(d), 1.5),
  # bernoulli: a tensor p
  "bernoulli_tensor_above_one": lambda d: torch.bernoulli(_full(d, 1.5)),
  "bernoulli_tensor_negative": lambda d: torch.bernoulli(_full(d, -0.5)),
  "bernoulli_tensor_nan": lambda d: torch.bernoulli(_full(d, nan)),
  "bernoulli_tensor_float64": lambda d: torch.bernoulli(_full(d, 1.5, F64)),
  "bernoulli__tensor_p": lambda d: _z(d).bernoulli_(_full(d, 1.5)),
  "bernoulli__tensor_p_float64": lambda d: _z(d).bernoulli_(_full(d, 1.5, F64)),
  "bernoulli__tensor_p_broadcast": lambda d: torch.zeros(2, 3, device=d).bernoulli_(
    torch.tensor([0.5, 1.5, 0.5], device=d)
  ),
  "bernoulli__tensor_p_long": lambda d: _z(d, torch.int64).bernoulli_(_full(d, 1.5)),
  "bernoulli_Tensor_functional": lambda d: aten.bernoulli.Tensor(_z(d), _full(d, 1.5)),
  # exponential_, geometric_, log_normal_, cauchy_
  "exponential_zero": lambda d: _z(d).exponential_(0),
  "exponential_negative": lambda d: _z(d).exponential_(-1),
  "exponential_nan": lambda d: _z(d).exponential_(nan),
  "exponential_tiny_negative": lambda d: _z(d).exponential_(-1e-7),
  "exponential_half": lambda d: _z(d, F16).exponential_(-1),
  "exponential_functional": lambda d: aten.exponential(_z(d), 0.0),
  "geometric_zero": lambda d: _z(d).geometric_(0),
  "geometric_one": lambda d: _z(d).geometric_(1),
  "geometric_above_one": lambda d: _z(d).geometric_(1.5),
  "geometric_nan": lambda d: _z(d).geometric_(nan),
  "geometric_just_above_one": lambda d: _z(d).geometric_(1.0000001),
  "geometric_bfloat16": lambda d: _z(d, BF16).geometric_(1.5),
  "geometric_long": lambda d: _z(d, torch.int64).geometric_(0),
  "log_normal_zero_std": lambda d: _z(d).log_normal_(0, 0),
  "log_normal_negative_std": lambda d: _z(d).log_normal_(0, -1),
  "log_normal_nan_std": lambda d: _z(d).log_normal_(0, nan),
  "cauchy_zero_sigma": lambda d: _z(d).cauchy_(0, 0),
  "cauchy_negative_sigma": lambda d: _z(d).cauchy_(0, -1),
  "cauchy_nan_sigma": lambda d: _z(d).cauchy_(0, nan),
  # poisson: a tensor of rates
  "poisson_negative_rate": lambda d: torch.poisson(torch.tensor([-1.0, 1.0], device=d)),
  "poisson_nan_rate": lambda d: torch.poisson(torch.tensor([nan, 1.0], device=d)),
  "poisson_float64": lambda d: torch.poisson(torch.tensor([2.0, -1.0], dtype=F64, device=d)),
  # native_dropout: torch draws its mask with bernoulli_(1 - p)
  "native_dropout_p_above_one": lambda d: torch.native_dropout(torch.ones(3, device=d), 1.5, True),
  "native_dropout_negative_p": lambda d: torch.native_dropout(torch.ones(3, device=d), -0.5, True),
  "native_dropout_nan_p": lambda d: torch.native_dropout(torch.ones(3, device=d), nan, True),
  "native_dropout_train_none": lambda d: torch.native_dropout(torch.ones(3, device=d), 1.5, None),
  "native_dropout_half": lambda d: torch.native_dropout(
    torch.ones(3, dtype=F16, device=d), 2, True
  ),
  # rrelu_with_noise training: a slope drawn from U(lower, upper) for each x <= 0
  "rrelu_with_noise_crossed_bounds": lambda d: aten.rrelu_with_noise(
    torch.tensor([1.0, -1.0], device=d), torch.zeros(2, device=d), 0.5, 0.1, True
  ),
}


@pytest.mark.parametrize("name", list(RAISES))
def test_raises_torchs_error(name):
  assert_raises_like_cpu(RAISES[name])


# Controls (pass with and without the checks): valid arguments at the edges of what torch
# takes give torch's values; none of them raises.
VALID = {
  "normal_zero_std": lambda d: _z(d).normal_(2.0, 0.0),
  "normal_tensor_zero_std": lambda d: torch.normal(_full(d, 3.0), _z(d)),
  "normal_empty_negative_tensor_std": lambda d: torch.normal(_z(d, n=0), -torch.ones(0, device=d)),
  "uniform_empty_range": lambda d: _z(d).uniform_(1.5, 1.5),
  "uniform_half_max_range": lambda d: _z(d, F16).uniform_(-30000, 30000).abs() <= 30000,
  "exponential_inf": lambda d: _z(d).exponential_(inf),
  "bernoulli_p_zero": lambda d: _z(d).bernoulli_(0.0),
  "bernoulli_p_one": lambda d: torch.bernoulli(_z(d), 1.0),
  "bernoulli_tensor_zeros_and_ones": lambda d: torch.bernoulli(
    torch.tensor([0.0, 1.0, 1.0, 0.0], device=d)
  ),
  "bernoulli_empty_tensor_p_above_one": lambda d: torch.bernoulli(_full(d, 1.5, n=0)),
  "poisson_zero_rate": lambda d: torch.poisson(_z(d)),
  "poisson_empty": lambda d: torch.poisson(_z(d, n=0)),
  "native_dropout_p_zero": lambda d: torch.native_dropout(torch.arange(4.0, device=d), 0.0, True),
  "native_dropout_p_one": lambda d: torch.native_dropout(torch.arange(4.0, device=d), 1.0, True),
  "native_dropout_eval_p_above_one": lambda d: torch.native_dropout(
    torch.arange(4.0, device=d), 1.5, False
  ),
  # (torch's CPU kernel returns an empty input's mask as float: the output alone)
  "native_dropout_empty_p_above_one": lambda d: torch.native_dropout(_z(d, n=0), 1.5, True)[0],
  "rrelu_crossed_bounds_no_negative_input": lambda d: aten.rrelu_with_noise(
    torch.tensor([1.0, nan], device=d), torch.zeros(2, device=d), 0.5, 0.1, True
  ),
}


@pytest.mark.parametrize("name", list(VALID))
def test_valid_arguments_give_torchs_values(name):
  """Control."""
  expected, got = VALID[name]("cpu"), VALID[name]("jax")
  for e, g in zip(*((x,) if isinstance(x, torch.Tensor) else x for x in (expected, got))):
    g = g.cpu()
    assert g.dtype == e.dtype and g.shape == e.shape
    torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True)


# A checked op draws what its unchecked relative draws from the same key, and moves the
# generator as it does: the draws after it are unchanged.
SAME_DRAWS = {
  "uniform_": (lambda x: x.uniform_(0.0, 1.0), torch.rand_like),
  "normal_": (lambda x: x.normal_(0.0, 1.0), torch.randn_like),
  "normal_Tensor_float": (lambda x: torch.normal(x, 1.0), torch.randn_like),
}


@pytest.mark.parametrize("name", list(SAME_DRAWS))
def test_checked_ops_draw_as_before(name):
  """Control."""
  checked, relative = SAME_DRAWS[name]
  draws = []
  for fn in (checked, relative):
    torch.manual_seed(7)
    first = fn(torch.zeros(64, device="jax")).cpu()
    draws.append((first, torch.randn(5, device="jax").cpu()))
  torch.testing.assert_close(draws[0][0], draws[1][0], rtol=0, atol=0)
  torch.testing.assert_close(draws[0][1], draws[1][1], rtol=0, atol=0)


# Scalar arguments in a compiled program: Python numbers there, checked while it is traced
# (with or without check_indices); function of CPU tensors -> its arguments. The "control_"
# ones torch's meta kernels already refused there (they pass without the lowerings' checks).
COMPILED_RAISES = {
  "uniform_": lambda x: x.clone().uniform_(2.0, 1.0),
  "uniform_out_of_bounds": lambda x: x.clone().uniform_(0.0, inf),
  "bernoulli_p": lambda x: torch.bernoulli(x, 1.5),
  "bernoulli_": lambda x: x.clone().bernoulli_(nan),
  "native_dropout": lambda x: torch.native_dropout(x, 1.5, True)[0],
  "native_dropout_negative_p": lambda x: torch.native_dropout(x * 2, -0.25, True)[0] + 1,
  "control_normal_": lambda x: x.clone().normal_(0.0, -1.0),
  "control_normal_Tensor_float": lambda x: torch.normal(x, -1.0),
  "control_exponential_": lambda x: x.clone().exponential_(0.0),
  "control_geometric_": lambda x: x.clone().geometric_(1.5),
  "control_log_normal_": lambda x: x.clone().log_normal_(0.0, 0.0),
  "control_cauchy_": lambda x: x.clone().cauchy_(0.0, -1.0),
}


@pytest.mark.parametrize("check_indices", [False, True])
@pytest.mark.parametrize("name", list(COMPILED_RAISES))
def test_bridge_compile_raises_torchs_error_for_scalar_arguments(name, check_indices):
  fn, x = COMPILED_RAISES[name], torch.ones(3)
  with pytest.raises(Exception) as expected:
    fn(x)
  with bridge.config(check_indices=check_indices):
    with pytest.raises(Exception) as got:
      bridge.compile(fn)(x)
  assert isinstance(got.value, type(expected.value)), (type(got.value), type(expected.value))
  assert error_message(got.value) == error_message(expected.value)


# Tensor arguments' values in a compiled program: unknown while it is traced, so checked only
# with check_indices (a host call that fails the run with torch's error naming the op).
# name -> (function of CPU tensors, its invalid arguments, the op named)
COMPILED_VALUES = {
  "normal_Tensor_Tensor": (
    lambda m, s: torch.normal(m, s),
    (torch.zeros(3), torch.tensor([1.0, -1.0, 1.0])),
    "aten.normal.Tensor_Tensor",
  ),
  "normal_float_Tensor": (
    lambda s: torch.normal(0.0, s),
    (torch.tensor([nan, 1.0]),),
    "aten.normal.float_Tensor",
  ),
  "bernoulli": (
    lambda p: torch.bernoulli(p),
    (torch.tensor([0.5, 1.5]),),
    "aten.bernoulli.default",
  ),
  "bernoulli_tensor_p": (
    lambda x, p: x.clone().bernoulli_(p),
    (torch.zeros(2), torch.tensor([-0.5, 0.5])),
    "aten.bernoulli.Tensor",
  ),
  # (not `poisson`: a failed host check in a program with its sampling loop leaves JAX's
  # runtime token failed, so every later `jax.effects_barrier()` of the process raises it)
}


@pytest.mark.parametrize("name", list(COMPILED_VALUES))
def test_eager_and_bridge_compile_check_tensor_arguments(name):
  fn, args, op = COMPILED_VALUES[name]
  with pytest.raises(RuntimeError) as expected:
    fn(*args)
  with pytest.raises(RuntimeError) as eager:
    fn(*(a.to("jax") for a in args))
  assert error_message(eager.value) == error_message(expected.value)
  jax.block_until_ready(bridge.compile(fn)(*args))  # unchecked by default (documented)
  assert_checked_program_raises(fn, args, op, expected.value)
