"""Torch's errors for NaN/inf inputs of the SVD family and `linalg.eig`, and for `quantile` q
values outside [0, 1], on the `jax` device (they computed NaN), against torch on CPU; the cases
torch lets through stay let through."""

from __future__ import annotations

import pytest
import torch

import bridge

nan, inf = float("nan"), float("inf")


def _m(v):
  return torch.tensor([[v, 0.0], [0.0, 1.0]])


def _batched(v):
  return torch.stack([torch.eye(2), _m(v)])


SVD_FAMILY = {
  "svd": torch.linalg.svd,
  "svdvals": torch.linalg.svdvals,
  "torch.svd": torch.svd,
  "pinv": torch.linalg.pinv,
  "matrix_rank": torch.linalg.matrix_rank,
  "matrix_norm_2": lambda a: torch.linalg.matrix_norm(a, 2),
  "matrix_norm_nuc": lambda a: torch.linalg.matrix_norm(a, "nuc"),
  "cond": torch.linalg.cond,
}


def _outcome(fn, x):
  try:
    out = fn(x)
  except Exception as e:  # noqa: BLE001 - compared with torch's
    return e
  return out


def _same_error(got, want):
  assert isinstance(want, Exception), f"torch computed {want!r}"
  assert isinstance(got, type(want)), f"{type(got).__name__} is not a {type(want).__name__}"
  assert str(got) == str(want)


@pytest.mark.parametrize("make", [_m, _batched], ids=["matrix", "batch"])
@pytest.mark.parametrize("name", list(SVD_FAMILY))
def test_svd_family_refuses_a_nan_as_torch(name, make):
  fn = SVD_FAMILY[name]
  _same_error(_outcome(fn, make(nan).to("jax")), _outcome(fn, make(nan)))


@pytest.mark.parametrize("name", list(SVD_FAMILY))
def test_control_svd_family_takes_an_infinity_and_finite_values(name):
  fn = SVD_FAMILY[name]
  for x in (_m(inf), torch.tensor([[2.0, 1.0], [0.0, 3.0]])):
    assert not isinstance(_outcome(fn, x), Exception)
    assert not isinstance(_outcome(fn, x.to("jax")), Exception)


def test_control_hermitian_pinv_takes_a_nan_as_torch():
  got = torch.linalg.pinv(_m(nan).to("jax"), hermitian=True)
  torch.testing.assert_close(got.cpu(), torch.linalg.pinv(_m(nan), hermitian=True))


@pytest.mark.parametrize("value", [nan, inf], ids=["nan", "inf"])
def test_eig_refuses_non_finite_input_as_torch(value):
  _same_error(
    _outcome(torch.linalg.eig, _m(value).to("jax")), _outcome(torch.linalg.eig, _m(value))
  )


@pytest.mark.parametrize("value", [nan, inf], ids=["nan", "inf"])
def test_eigvals_computes_where_torch_does_and_refuses_where_torch_does(value):
  # torch's eigvals runs linalg_eig (and its check) only for a tensor that may need a gradient
  assert not isinstance(_outcome(torch.linalg.eigvals, _m(value).to("jax")), Exception)
  grad = lambda a: torch.linalg.eigvals(a.clone().requires_grad_())
  _same_error(_outcome(grad, _m(value).to("jax")), _outcome(grad, _m(value)))


def test_control_eigvals_of_finite_input():
  a = torch.tensor([[2.0, 1.0], [0.0, 3.0]])
  torch.testing.assert_close(torch.linalg.eigvals(a.to("jax")).cpu(), torch.linalg.eigvals(a))


QUANTILE_BAD = {
  "nan": lambda d: torch.quantile(torch.arange(3.0, device=d), torch.tensor([nan], device=d)),
  "negative_nanquantile": lambda d: torch.nanquantile(
    torch.arange(3.0, device=d), torch.tensor([-0.5], device=d)
  ),
  "above_one": lambda d: torch.quantile(torch.zeros(3, device=d), torch.tensor([1.5], device=d)),
  "one_of_several": lambda d: torch.quantile(
    torch.arange(4.0, device=d), torch.tensor([0.5, 1.0001], device=d)
  ),
}


@pytest.mark.parametrize("name", list(QUANTILE_BAD))
def test_quantile_refuses_q_outside_zero_one_as_torch(name):
  make = QUANTILE_BAD[name]
  _same_error(_outcome(make, "jax"), _outcome(make, "cpu"))


def test_control_quantile_values_and_gradients():
  q = torch.tensor([0.0, 0.25, 1.0])
  for interpolation in ("linear", "lower", "higher", "midpoint", "nearest"):
    x = torch.arange(8.0).reshape(2, 4)
    want = torch.quantile(x, q, dim=1, keepdim=True, interpolation=interpolation)
    got = torch.quantile(x.to("jax"), q.to("jax"), dim=1, keepdim=True, interpolation=interpolation)
    torch.testing.assert_close(got.cpu(), want)
  x = torch.arange(4.0, requires_grad=True)
  xj = torch.arange(4.0, device="jax", requires_grad=True)
  torch.quantile(x, q).sum().backward()
  torch.quantile(xj, q.to("jax")).sum().backward()
  torch.testing.assert_close(xj.grad.cpu(), x.grad)


def test_compiled_checks_with_check_indices():
  quantile = bridge.compile(lambda x, q: torch.quantile(x, q))
  svdvals = bridge.compile(torch.linalg.svdvals)
  torch.testing.assert_close(quantile(torch.arange(3.0), torch.tensor([0.5])), torch.tensor([1.0]))
  with bridge.config(check_indices=True):
    with pytest.raises(RuntimeError, match=r"quantile\(\) q values must be in the range \[0, 1\]"):
      bridge.compile(lambda x, q: torch.quantile(x, q))(torch.arange(3.0), torch.tensor([1.5]))
    with pytest.raises(torch.linalg.LinAlgError, match="contained non-finite values"):
      bridge.compile(torch.linalg.svdvals)(_m(nan))
  assert torch.isnan(svdvals(_m(nan))).all()  # (unchecked by default in a program)
