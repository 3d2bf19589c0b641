"""torch's errors for failed factorizations and refused arguments of the linear-algebra ops,
on the `jax` device and in compiled programs, against torch on CPU.

torch checks LAPACK's `info` (a matrix that is not positive-definite, a zero pivot) in
`cholesky`, `cholesky_inverse`, the `*_ex` ops with `check_errors=True` and the composites
that call `_linalg_check_errors` (`linalg.inv`, `linalg.ldl_factor`...): the bridge raises the
same exception with the same message (`_linalg.check_info`), eagerly, and inside a compiled
program with `bridge.config(check_indices=True)`. `renorm` refuses a negative `maxnorm`.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from tests.ops.harness import assert_raises_like_cpu, error_message

nan = float("nan")

# torch warns that `torch.cholesky` and `torch.triangular_solve` are deprecated
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _npd(d):
  """Symmetric, not positive-definite (its leading minor of order 2 is -3)."""
  return torch.tensor([[1.0, 2.0], [2.0, 1.0]], device=d)


def _singular(d):
  return torch.zeros(2, 2, device=d)


def _batch(d, *matrices):
  """A batch of 2 x 2 (x 2 x 2) matrices: the identity, then `matrices`."""
  eye = torch.eye(2, device=d)
  return torch.stack([eye, *matrices])


def _spd(d, dtype=torch.float64):
  g = torch.Generator().manual_seed(0)
  b = torch.randn(3, 4, 4, generator=g, dtype=dtype)
  return (b @ b.mT + 4 * torch.eye(4, dtype=dtype)).to(d)


def _square(d, dtype=torch.float64):
  g = torch.Generator().manual_seed(1)
  return torch.randn(3, 4, 4, generator=g, dtype=dtype).to(d)


# name -> op on device `d`; torch on CPU raises for each (its type and message here too).
RAISES = {
  # the legacy `cholesky` checks its factorization itself
  "cholesky": lambda d: torch.cholesky(_npd(d)),
  "cholesky_upper": lambda d: torch.cholesky(_npd(d), upper=True),
  "cholesky_batch": lambda d: torch.cholesky(_batch(d, _npd(d))),
  "cholesky_batch_2d": lambda d: torch.cholesky(
    torch.stack([_batch(d, torch.eye(2, device=d)), _batch(d, _npd(d))])
  ),
  "cholesky_float64": lambda d: torch.cholesky(_npd(d).double()),
  # `*_ex` with check_errors=True
  "cholesky_ex": lambda d: torch.linalg.cholesky_ex(_npd(d), check_errors=True),
  "cholesky_ex_upper": lambda d: torch.linalg.cholesky_ex(_npd(d), upper=True, check_errors=True),
  "cholesky_ex_batch": lambda d: torch.linalg.cholesky_ex(_batch(d, _npd(d)), check_errors=True),
  "inv_ex": lambda d: torch.linalg.inv_ex(_singular(d), check_errors=True),
  "inv_ex_batch": lambda d: torch.linalg.inv_ex(_batch(d, _singular(d)), check_errors=True),
  "lu_factor_ex": lambda d: torch.linalg.lu_factor_ex(_singular(d), check_errors=True),
  "lu_factor_ex_batch": lambda d: torch.linalg.lu_factor_ex(
    _batch(d, torch.diag(torch.tensor([1.0, 0.0], device=d))), check_errors=True
  ),
  "solve_ex": lambda d: torch.linalg.solve_ex(
    _singular(d), torch.ones(2, device=d), check_errors=True
  ),
  "solve_ex_right": lambda d: torch.linalg.solve_ex(
    _batch(d, _singular(d)), torch.ones(2, 3, 2, device=d), left=False, check_errors=True
  ),
  "ldl_factor_ex": lambda d: torch.linalg.ldl_factor_ex(_singular(d), check_errors=True),
  "ldl_factor_ex_nan": lambda d: torch.linalg.ldl_factor_ex(
    torch.tensor([[nan, 0.0], [0.0, 1.0]], device=d), check_errors=True
  ),
  # (torch's check has no words for `ldl`: an internal assert, "Unknown error code")
  "ldl_factor": lambda d: torch.linalg.ldl_factor(_singular(d)),
  "ldl_factor_batch": lambda d: torch.linalg.ldl_factor(_batch(d, _singular(d))),
  # `cholesky_inverse`: a zero on the factor's diagonal
  "cholesky_inverse": lambda d: torch.cholesky_inverse(_singular(d)),
  "cholesky_inverse_upper": lambda d: torch.cholesky_inverse(_singular(d), upper=True),
  "cholesky_inverse_batch": lambda d: torch.cholesky_inverse(
    _batch(d, torch.diag(torch.tensor([1.0, 0.0], device=d)))
  ),
  "cholesky_inverse_complex": lambda d: torch.cholesky_inverse(
    torch.tensor([[1.0, 0.0], [2.0, 0.0]], dtype=torch.complex64, device=d)
  ),
  # `renorm` refuses a negative (or NaN) maxnorm, printed as C++ prints a double
  "renorm_negative_maxnorm": lambda d: torch.renorm(torch.ones(2, 3, device=d), 2.0, 0, -1.0),
  "renorm_negative_fraction": lambda d: torch.renorm(torch.ones(2, 3, device=d), 1.0, 1, -0.25),
  "renorm_negative_int": lambda d: torch.renorm(torch.ones(2, 3, device=d), 2, 0, -3),
  "renorm_large_negative": lambda d: torch.renorm(
    torch.ones(2, 3, device=d), float("inf"), 0, -123456789.0
  ),
  "renorm_nan_maxnorm": lambda d: torch.renorm(torch.ones(2, 3, device=d), 2.0, 0, nan),
  "renorm_negative_half": lambda d: torch.renorm(
    torch.ones(2, 3, dtype=torch.float16, device=d), 2.0, 0, -1.0
  ),
}

# Controls: the composites that already raised torch's error on the `jax` device through
# `_linalg_check_errors` (they pass on the old code too; they now share the checks above).
CONTROLS = {
  "linalg_cholesky": lambda d: torch.linalg.cholesky(_npd(d)),
  "linalg_inv": lambda d: torch.linalg.inv(_batch(d, _singular(d))),
  "linalg_solve": lambda d: torch.linalg.solve(_singular(d), torch.ones(2, device=d)),
  "linalg_lu_factor": lambda d: torch.linalg.lu_factor(_singular(d)),
}


@pytest.mark.parametrize("name", list(RAISES))
def test_raises_torchs_error(name):
  assert_raises_like_cpu(RAISES[name])


@pytest.mark.parametrize("name", list(CONTROLS))
def test_control_composites_raise_torchs_error(name):
  assert_raises_like_cpu(CONTROLS[name])


# name -> op on device `d` that torch computes (valid inputs): the `jax` device gives its
# values, with the checks in place. (Controls: they pass on the old code too.)
COMPUTES = {
  "cholesky": lambda d: torch.cholesky(_spd(d)),
  "cholesky_upper": lambda d: torch.cholesky(_spd(d), upper=True),
  "cholesky_ex_checked": lambda d: torch.linalg.cholesky_ex(_spd(d), check_errors=True),
  "cholesky_ex_unchecked_npd_info": lambda d: torch.linalg.cholesky_ex(_npd(d))[1],
  "inv_ex_checked": lambda d: torch.linalg.inv_ex(_square(d), check_errors=True),
  "inv_ex_unchecked_singular_info": lambda d: torch.linalg.inv_ex(_singular(d))[1],
  "lu_factor_ex_checked": lambda d: torch.linalg.lu_factor_ex(_square(d), check_errors=True),
  "solve_ex_checked": lambda d: torch.linalg.solve_ex(
    _square(d), torch.ones(3, 4, 2, dtype=torch.float64, device=d), check_errors=True
  ),
  "ldl_factor_ex_checked": lambda d: torch.linalg.ldl_factor_ex(
    _spd(d) - 6 * torch.eye(4, dtype=torch.float64, device=d), check_errors=True
  ),
  "ldl_factor_ex_unchecked_singular_info": lambda d: torch.linalg.ldl_factor_ex(_singular(d))[2],
  "cholesky_inverse": lambda d: torch.cholesky_inverse(torch.linalg.cholesky(_spd(d))),
  "cholesky_inverse_upper": lambda d: torch.cholesky_inverse(
    torch.linalg.cholesky(_spd(d)).mH, upper=True
  ),
  "renorm": lambda d: torch.renorm(_square(d), 2.0, 1, 1.5),
  "renorm_inf": lambda d: torch.renorm(_square(d), float("inf"), 0, 0.5),
  "renorm_zero_maxnorm": lambda d: torch.renorm(_square(d), 1.0, 2, 0.0),
  "renorm_int_maxnorm": lambda d: torch.renorm(_square(d), 3.0, 0, 2),
}


@pytest.mark.parametrize("name", list(COMPUTES))
def test_valid_inputs_compute_what_torch_computes(name):
  want = COMPUTES[name]("cpu")
  got = COMPUTES[name]("jax")
  want = want if isinstance(want, tuple) else (want,)
  got = got if isinstance(got, tuple) else (got,)
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert g.dtype == w.dtype
    torch.testing.assert_close(g.cpu(), w, rtol=1e-10, atol=1e-10)


# --- compiled programs ----------------------------------------------------------------------

# name -> (function of CPU tensors, its arguments); torch raises for each.
COMPILED = {
  "cholesky": (torch.cholesky, (_npd("cpu"),)),
  "cholesky_ex": (
    lambda a: torch.linalg.cholesky_ex(a, check_errors=True)[0],
    (_batch("cpu", _npd("cpu")),),
  ),
  "linalg_cholesky": (torch.linalg.cholesky, (_npd("cpu"),)),
  "inv": (torch.linalg.inv, (_batch("cpu", _singular("cpu")),)),
  "inv_ex": (lambda a: torch.linalg.inv_ex(a, check_errors=True)[0], (_singular("cpu"),)),
  "solve_ex": (
    lambda a, b: torch.linalg.solve_ex(a, b, check_errors=True)[0],
    (_singular("cpu"), torch.ones(2)),
  ),
  "lu_factor_ex": (
    lambda a: torch.linalg.lu_factor_ex(a, check_errors=True)[0],
    (_singular("cpu"),),
  ),
  "ldl_factor": (lambda a: torch.linalg.ldl_factor(a)[0], (_singular("cpu"),)),
  "cholesky_inverse": (torch.cholesky_inverse, (_singular("cpu"),)),
}


@pytest.mark.parametrize("name", list(COMPILED))
def test_bridge_compile_with_check_indices_raises_torchs_error(name):
  fn, args = COMPILED[name]
  with pytest.raises(Exception) as expected:
    fn(*args)
  want = type(expected.value)
  with bridge.config(check_indices=True):
    # (torch's type, or wrapped in JAX's error from inside the program)
    with pytest.raises((jax.errors.JaxRuntimeError, want)) as info:
      bridge.compile(fn)(*args)
  got = str(info.value)
  assert "check_indices" in got
  assert error_message(expected.value) in got
  assert isinstance(info.value, want) or want.__name__ in got or "TorchRuntimeError" in got


def test_bridge_compile_without_check_indices_leaves_the_factor_unchecked():
  # (the documented default inside a program: unchecked, like CUDA's asynchronous asserts)
  out = bridge.compile(torch.cholesky)(_npd("cpu"))
  assert torch.isnan(out).any()
  with pytest.raises(torch.linalg.LinAlgError):
    torch.cholesky(_npd("jax"))  # eager: checked


def test_call_torch_in_jit_with_check_indices_raises_torchs_error():
  with pytest.raises(torch.linalg.LinAlgError) as expected:
    torch.cholesky_inverse(_batch("cpu", _singular("cpu")))
  f = jax.jit(lambda a: bridge.call_torch(torch.cholesky_inverse, a))
  a = jnp.stack([jnp.eye(2), jnp.zeros((2, 2))])
  with bridge.config(check_indices=True):
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
      jax.block_until_ready(f(a))
  assert f"aten.cholesky_inverse.default: {expected.value}" in str(info.value)


@pytest.mark.parametrize("maxnorm", [-1.0, -0.5, nan])
def test_bridge_compile_renorm_refuses_negative_maxnorm(maxnorm):
  # a Python scalar argument: checked while the program is traced, check_indices or not
  fn = lambda x: torch.renorm(x, 2.0, 0, maxnorm)
  x = torch.ones(2, 3)
  with pytest.raises(RuntimeError) as expected:
    fn(x)
  with pytest.raises(RuntimeError) as got:
    bridge.compile(fn)(x)
  assert error_message(got.value) == error_message(expected.value)


def test_bridge_compile_renorm_values_for_two_maxnorms():
  # (a control: passes on the old code too) (maxnorm is a static argument: each value its own program, each torch's values)
  x = _square("cpu", torch.float32)
  for maxnorm in (0.5, 2.0):
    fn = lambda x, m=maxnorm: torch.renorm(x, 2.0, 1, m)
    np.testing.assert_allclose(bridge.compile(fn)(x).numpy(), fn(x).numpy(), rtol=1e-6)


def test_check_errors_false_never_raises():
  # (a control: passes on the old code too)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # (and says nothing)
    out = torch.linalg.cholesky_ex(_batch("jax", _npd("jax")))
    inv = torch.linalg.inv_ex(_singular("jax"))
    ldl = torch.linalg.ldl_factor_ex(_singular("jax"))
    lu = torch.linalg.lu_factor_ex(_singular("jax"))
  assert out.info.tolist() == [0, 2]
  assert inv.info.item() == 1 and ldl.info.item() == 1 and lu.info.item() == 1
