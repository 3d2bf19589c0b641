"""Reductions and order statistics that gave a number torch does not, against torch on CPU:
a `dim` out of range (torch's IndexError, also where its meta kernel does not check), the
16-bit `prod` (torch rounds every product), float32 `var`/`std` whose squares overflow
float32, reductions over `dim=()`, and `nanmedian`/`mode`/`topk` on NaN and 0-d inputs."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

import bridge

nan = math.nan


def _x(dev):
  return torch.arange(6.0, device=dev).reshape(2, 3)


def _s(dev):
  return torch.tensor(3.0, device=dev)


# name -> op on device `dev`; torch on CPU raises IndexError naming the range.
OUT_OF_RANGE = {
  "softmax": (lambda d: _x(d).softmax(2), "[-2, 1], but got 2"),
  "softmax_negative": (lambda d: _x(d).softmax(-3), "[-2, 1], but got -3"),
  "softmax_dtype": (lambda d: _x(d).softmax(2, dtype=torch.float64), "[-2, 1], but got 2"),
  "softmin": (lambda d: F.softmin(_x(d), 2), "[-2, 1], but got 2"),
  "gumbel_softmax": (lambda d: F.gumbel_softmax(_x(d), dim=2), "[-2, 1], but got 2"),
  "log_softmax": (lambda d: _x(d).log_softmax(2), "[-2, 1], but got 2"),
  "sort": (lambda d: _x(d).sort(-3), "[-2, 1], but got -3"),
  "sort_stable": (lambda d: torch.sort(_x(d), dim=2, stable=True), "[-2, 1], but got 2"),
  "argsort": (lambda d: _x(d).argsort(2), "[-2, 1], but got 2"),
  "argsort_stable": (lambda d: torch.argsort(_x(d), dim=2, stable=True), "[-2, 1], but got 2"),
  "softmax_0d": (lambda d: _s(d).softmax(1), "[-1, 0], but got 1"),
  "softmax_0d_negative": (lambda d: _s(d).softmax(-2), "[-1, 0], but got -2"),
  "sort_0d": (lambda d: _s(d).sort(1), "[-1, 0], but got 1"),
  "topk_0d": (lambda d: _s(d).topk(1, 1), "[-1, 0], but got 1"),
  "unique_consecutive": (lambda d: torch.unique_consecutive(_x(d), dim=2), "[-2, 1], but got 2"),
}


def _range_error(tail):
  return f"Dimension out of range (expected to be in range of {tail})"


@pytest.mark.parametrize("name", list(OUT_OF_RANGE))
def test_dim_out_of_range_raises_torchs_index_error(name):
  fn, tail = OUT_OF_RANGE[name]
  with pytest.raises(IndexError, match=re.escape(_range_error(tail))):
    fn("cpu")
  with pytest.raises(IndexError, match=re.escape(_range_error(tail))):
    fn("jax")


@pytest.mark.parametrize("dim", [-1, 0])
def test_dim_in_range_of_0d_still_accepted(dim):
  s = _s("jax")
  torch.testing.assert_close(s.softmax(dim).cpu(), _s("cpu").softmax(dim))
  torch.testing.assert_close(s.sort(dim)[1].cpu(), _s("cpu").sort(dim)[1])


class _Module(torch.nn.Module):
  def __init__(self, fn):
    super().__init__()
    self.fn = fn

  def forward(self, x):
    return self.fn(x)


COMPILED = {
  "softmax": (lambda x: x.softmax(2), "[-2, 1], but got 2"),
  "sort": (lambda x: x.sort(-3)[0], "[-2, 1], but got -3"),
  "softmin": (lambda x: F.softmin(x, 2), "[-2, 1], but got 2"),
}


@pytest.mark.parametrize("name", list(COMPILED))
def test_dim_out_of_range_under_bridge_compile(name):
  fn, tail = COMPILED[name]
  with pytest.raises(IndexError, match=re.escape(_range_error(tail))):
    bridge.compile(_Module(fn))(_x("cpu"))


@pytest.mark.parametrize("name", ["softmax", "sort"])
def test_dim_out_of_range_under_torch_compile(name):
  fn, tail = COMPILED[name]
  with pytest.raises(IndexError, match=re.escape(_range_error(tail))):
    torch.compile(fn, backend="jax")(_x("cpu"))


def test_dim_out_of_range_under_call_torch_in_jit():
  import jax
  import jax.numpy as jnp

  f = jax.jit(lambda a: bridge.call_torch(lambda t: t.softmax(2), a))
  with pytest.raises(IndexError, match=re.escape(_range_error("[-2, 1], but got 2"))):
    f(jnp.arange(6.0).reshape(2, 3))


# --- prod of float16 / bfloat16: every product rounded, in torch's kernel's order -----------


def _near_one(shape, dtype, seed, spread=0.01):
  g = torch.Generator().manual_seed(seed)
  return (1 + spread * torch.randn(shape, generator=g)).to(dtype)


PROD_CASES = [
  # (shape, dim, keepdim): rows shorter and longer than torch's 64-element vector blocks,
  # along the contiguous dim, another dim, every dim, and a dim followed by size-1 dims
  ((3,), None, False),
  ((40,), 0, True),
  ((127,), 0, False),
  ((129,), None, False),
  ((1000,), None, False),
  ((2, 200), 1, True),
  ((2, 200), 0, False),
  ((200, 3), 0, False),
  ((200, 3), None, False),
  ((3, 130, 2), 1, False),
  ((3, 130, 1), 1, True),
  ((300, 1), 0, False),
  ((5, 300), -1, False),
  ((2, 0), 1, False),
  ((), None, False),
  ((40000,), None, False),  # one result: split among torch's threads
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,dim,keepdim", PROD_CASES)
def test_half_prod_matches_torch_bit_for_bit(dtype, shape, dim, keepdim):
  x = _near_one(shape, dtype, seed=len(shape) + sum(shape))
  expected = x.prod() if dim is None else x.prod(dim, keepdim=keepdim)
  j = x.to("jax")
  got = (j.prod() if dim is None else j.prod(dim, keepdim=keepdim)).cpu()
  torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(
  "make",
  [
    lambda d: torch.tensor([300.0, 300.0, 0.001], dtype=torch.float16, device=d).prod(),
    lambda d: torch.full((2, 40), 1.5, dtype=torch.bfloat16, device=d).prod(1),
    lambda d: torch.tensor([300.0, 300.0, 0.001], device=d).prod(dtype=torch.float16),
    lambda d: torch.tensor([1e-4, 1e-3, 1000.0], dtype=torch.float16, device=d).prod(),
  ],
)
def test_half_prod_rounds_each_product(make):
  torch.testing.assert_close(make("jax").cpu(), make("cpu"), rtol=0, atol=0)


def test_half_prod_under_bridge_compile():
  x = _near_one((4, 130), torch.bfloat16, seed=3)
  got = bridge.compile(_Module(lambda t: t.prod(1)))(x)
  torch.testing.assert_close(got.cpu(), x.prod(1), rtol=0, atol=0)


# --- float32 var/std: the squares of large deviations ---------------------------------------

BIG = [[1e20, -1e20, 1e20], [1.0, 2.0, 3.0]]

VAR_STD = {
  "std": lambda x: x[0].std(),
  "var": lambda x: x[0].var(),  # 1.33e40: inf in float32, as torch's
  "std_dim": lambda x: x.std(1),
  "std_keepdim": lambda x: x.std(1, keepdim=True),
  "std_mean": lambda x: torch.std_mean(x, 1),
  "var_mean": lambda x: torch.var_mean(x[0], 0, correction=0),
  "std_large": lambda x: torch.tensor([3e38, -3e38, 0.0], device=x.device).std(),
  "std_ordinary": lambda x: torch.linspace(-3, 5, 17, device=x.device).std(),
  "std_float64": lambda x: (x.double() * 1e180).std(1),  # torch overflows here too
}


@pytest.mark.parametrize("name", list(VAR_STD))
def test_float32_var_std_of_large_values(name):
  x = torch.tensor(BIG)
  expected = VAR_STD[name](x)
  got = VAR_STD[name](x.to("jax"))
  if isinstance(expected, tuple):
    for e, g in zip(expected, got):
      torch.testing.assert_close(g.cpu(), e, equal_nan=True)
  else:
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True)


def test_float32_std_of_large_values_under_bridge_compile():
  x = torch.tensor(BIG)
  got = bridge.compile(_Module(lambda t: t.std(1)))(x)
  torch.testing.assert_close(got.cpu(), x.std(1))


def test_float32_std_of_large_values_under_torch_compile():
  x = torch.tensor(BIG)
  got = torch.compile(lambda t: t.std(1), backend="jax")(x)
  torch.testing.assert_close(got.cpu(), x.std(1))


# --- dim=() ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3,), (2, 3), (2, 3, 4), (1, 1)])
def test_logsumexp_over_no_dims_raises_torchs_error(shape):
  ones = ", ".join(["1"] * len(shape))
  message = f"output with shape [] doesn't match the broadcast shape [{ones}]"
  for dev in ("cpu", "jax"):
    with pytest.raises(RuntimeError, match=re.escape(message)):
      torch.ones(shape, device=dev).logsumexp(dim=())


@pytest.mark.parametrize("shape", [(2, 3), (0, 2), ()])
def test_logsumexp_over_no_dims_where_torch_computes(shape):
  x = torch.ones(shape)
  torch.testing.assert_close(
    x.to("jax").logsumexp(dim=(), keepdim=True).cpu(), x.logsumexp(dim=(), keepdim=True)
  )
  if not x.ndim or not x.numel():
    torch.testing.assert_close(x.to("jax").logsumexp(dim=()).cpu(), x.logsumexp(dim=()))


def test_nansum_over_no_dims_says_what_it_cannot_match():
  # torch's CPU kernel sums every element; its meta kernel (whose shapes the `jax` device
  # follows) keeps the input's: a clear refusal, not an internal "bug in the lowering" error
  x = torch.ones(1, 2, device="jax")
  with pytest.raises(NotImplementedError, match=re.escape("Pass `dim=None`")):
    x.nansum(dim=())
  torch.testing.assert_close(x.nansum().cpu(), torch.ones(1, 2).nansum(dim=()))
  y = torch.tensor(2.0)  # 0-d: meta and CPU agree
  torch.testing.assert_close(y.to("jax").nansum(dim=()).cpu(), y.nansum(dim=()))


@pytest.mark.parametrize(
  "op", ["sum", "mean", "amax", "amin", "var", "std", "count_nonzero", "norm", "all", "any"]
)
def test_other_reductions_over_no_dims(op):
  x = torch.tensor([[1.0, 2.0], [0.0, 4.0]])
  torch.testing.assert_close(getattr(x.to("jax"), op)(dim=()).cpu(), getattr(x, op)(dim=()))


# --- nanmedian, mode, topk ------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 16, 17, 40, 101])
def test_nanmedian_index_of_an_all_nan_slice(n):
  x = torch.full((2, n), nan)
  x[1, : n // 2] = torch.arange(float(n // 2))  # a second row with some numbers
  for dim, t in ((1, x), (0, x.t().contiguous())):
    expected = t.nanmedian(dim)
    got = t.to("jax").nanmedian(dim)
    torch.testing.assert_close(got.values.cpu(), expected.values, equal_nan=True)
    torch.testing.assert_close(got.indices.cpu(), expected.indices)


def test_nanmedian_all_nan_keepdim_and_compiled():
  x = torch.full((3, 5), nan)
  expected = x.nanmedian(1, keepdim=True)
  got = bridge.compile(_Module(lambda t: t.nanmedian(1, keepdim=True)))(x)
  torch.testing.assert_close(got[0].cpu(), expected.values, equal_nan=True)
  torch.testing.assert_close(got[1].cpu(), expected.indices)


MODE = {
  "nan_first": [nan, 1.0],
  "nan_between_runs": [3.0, 3.0, nan, 1.0, 1.0],
  "nans_only": [nan, nan, nan],
  "nan_and_ties": [2.0, nan, 2.0, 1.0, nan, 1.0, 0.0],
  "long_with_nan": [float(i % 5) if i % 7 else nan for i in range(40)],
  "long_ties": [float((i * 7) % 4) for i in range(37)],  # torch's unstable sort picks the index
}


@pytest.mark.parametrize("name", list(MODE))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mode_with_nan_and_ties(name, dtype):
  x = torch.tensor(MODE[name], dtype=dtype)
  expected = x.mode()
  got = x.to("jax").mode()
  torch.testing.assert_close(got.values.cpu(), expected.values, equal_nan=True)
  torch.testing.assert_close(got.indices.cpu(), expected.indices)


def test_mode_of_integer_rows_longer_than_16():
  g = torch.Generator().manual_seed(0)
  x = torch.randint(0, 3, (4, 50), generator=g)
  expected = x.mode(1)
  got = x.to("jax").mode(1)
  torch.testing.assert_close(got.values.cpu(), expected.values)
  torch.testing.assert_close(got.indices.cpu(), expected.indices)


def test_mode_with_nan_along_a_dim_and_compiled():
  x = torch.tensor([[nan, 1.0, 1.0], [3.0, 3.0, nan], [nan, nan, 2.0]])
  expected = x.mode(0)
  got = bridge.compile(_Module(lambda t: t.mode(0)))(x)
  torch.testing.assert_close(got[0].cpu(), expected.values, equal_nan=True)
  torch.testing.assert_close(got[1].cpu(), expected.indices)


@pytest.mark.parametrize("k,largest", [(0, True), (0, False), (1, True)])
def test_topk_of_a_0d_tensor(k, largest):
  x = torch.tensor(2.5)
  expected = x.topk(k, largest=largest)
  got = x.to("jax").topk(k, largest=largest)
  torch.testing.assert_close(got.values.cpu(), expected.values)
  torch.testing.assert_close(got.indices.cpu(), expected.indices)
