"""Arguments CPU torch refuses raise its exception (type and message) wherever ops are lowered:
on the `jax` device, in `bridge.compile`, in `call_torch` under `jax.jit` and through
`torch.compile(backend="jax")`; never a meaningless value.

Two kinds of refusal: torch's meta kernel refuses the arguments (`add` of integers with a
float alpha), asked on every argument signature; or its CPU kernel lacks their dtypes although
the meta kernel takes them (`softmax` of integers, `sort` of complex numbers), asked on
stand-ins once per signature where a dtype is other than float32/float64
(`Executable.check_kernel`).
"""

from __future__ import annotations

import re

import jax
import pytest
import torch
import torch.nn.functional as F

import bridge
from bridge._src.dispatch import executable

L, I, B, C, H = torch.long, torch.int32, torch.bool, torch.complex64, torch.float16


def _tensor(shape: tuple, dtype: torch.dtype | None, k: int) -> torch.Tensor:
  """A test input: values in range for every case below (class indices 0 and 1, ...)."""
  n = 1
  for s in shape:
    n *= s
  values = torch.arange(n).reshape(shape) % 2 + k
  if dtype is None:
    return values.float() + 0.5
  if dtype is C:
    return torch.complex(values.float(), values.float() - 1)
  return values.to(dtype)


# name -> (function of tensors, its inputs as (shape, dtype or None for float32)); CPU torch
# raises for each
REFUSED = {
  # the meta kernel refuses
  "add_int_alpha_float": (lambda a: torch.add(a, a, alpha=0.5), [((3,), L)]),
  "clamp_without_bounds": (lambda a: a.clamp(), [((3,), None)]),
  "nll_loss_weight_size": (
    lambda x, t, w: F.nll_loss(x, t, weight=w),
    [((2, 3), None), ((2,), L), ((2,), None)],
  ),
  "polar_int": (lambda a, b: torch.polar(a, b), [((3,), L), ((3,), L)]),
  # the CPU kernel lacks the dtypes
  "var_int": (lambda a: a.var(), [((3,), L)]),
  "std_bool": (lambda a: a.std(), [((3,), B)]),
  "softmax_int": (lambda a: a.softmax(0), [((3,), L)]),
  "log_softmax_int": (lambda a: a.log_softmax(-1), [((2, 3), L)]),
  "gelu_int": (lambda a: F.gelu(a), [((3,), L)]),
  "hypot_int": (lambda a, b: torch.hypot(a, b), [((3,), L), ((3,), L)]),
  "frac_int": (lambda a: a.frac(), [((3,), L)]),
  "round_decimals_int": (lambda a: a.round(decimals=1), [((3,), L)]),
  "logcumsumexp_int": (lambda a: a.logcumsumexp(0), [((3,), L)]),
  "argmax_bool": (lambda a: a.argmax(), [((3,), B)]),
  "topk_bool": (lambda a: a.topk(1), [((3,), B)]),
  "relu_bool": (lambda a: torch.relu(a), [((3,), B)]),
  "abs_bool": (lambda a: a.abs(), [((3,), B)]),
  "bool_minus_one": (lambda a: a - 1, [((3,), B)]),
  "bool_matmul": (lambda a, b: a @ b, [((2, 2), B), ((2, 2), B)]),
  "bool_dot": (lambda a, b: torch.dot(a, b), [((3,), B), ((3,), B)]),
  "bool_fmod": (lambda a, b: torch.fmod(a, b), [((3,), B), ((3,), B)]),
  "bool_searchsorted": (lambda a, b: torch.searchsorted(a, b), [((3,), B), ((2,), B)]),
  "complex_sort": (lambda a: a.sort(), [((3,), C)]),
  "complex_max": (lambda a: a.max(), [((3,), C)]),
  "complex_clamp": (lambda a: a.clamp(0, 1), [((3,), C)]),
  "complex_maximum": (lambda a, b: torch.maximum(a, b), [((3,), C), ((3,), C)]),
  "complex_lt": (lambda a, b: a < b, [((3,), C), ((3,), C)]),
  "complex_sign": (lambda a: a.sign(), [((3,), C)]),
  "complex_cummax": (lambda a: a.cummax(0), [((3,), C)]),
  "complex_floor": (lambda a: a.floor(), [((3,), C)]),
  "complex_argmax": (lambda a: a.argmax(), [((3,), C)]),
  "complex_remainder": (lambda a: a % 2, [((3,), C)]),
  "index_add_float_long": (
    lambda s, i, v: s.clone().index_add_(0, i, v),
    [((3,), None), ((2,), L), ((2,), L)],
  ),
  "cross_entropy_int32_target": (lambda x, t: F.cross_entropy(x, t), [((2, 3), None), ((2,), I)]),
  "heaviside_mixed": (lambda a, b: torch.heaviside(a, b), [((3,), None), ((3,), L)]),
  "cdist_float16": (lambda a, b: torch.cdist(a, b), [((2, 3), H), ((2, 3), H)]),
  # large: the CPU kernel is asked on stand-ins of a few elements per dimension
  "softmax_int_large": (lambda a: a.softmax(-1), [((80, 80), L)]),
  "bool_matmul_large": (lambda a, b: a @ b, [((70, 70), B), ((70, 70), B)]),
}


def _inputs(spec: list) -> list[torch.Tensor]:
  return [_tensor(shape, dtype, k) for k, (shape, dtype) in enumerate(spec)]


def _cpu_error(name: str) -> BaseException:
  fn, spec = REFUSED[name]
  with pytest.raises(Exception) as info:
    fn(*_inputs(spec))
  return info.value


def _raises_as_cpu(want: BaseException):
  # (JAX may add a note about its traceback, which `match` reads too)
  return pytest.raises(type(want), match=f"^{re.escape(str(want))}")


def _check(got: BaseException, want: BaseException) -> None:
  assert type(got) is type(want), (type(got), got)
  assert str(got) == str(want)


@pytest.mark.parametrize("name", list(REFUSED))
def test_on_the_jax_device(name):
  want = _cpu_error(name)
  fn, spec = REFUSED[name]
  with _raises_as_cpu(want) as info:
    fn(*[t.to("jax") for t in _inputs(spec)])
  _check(info.value, want)


@pytest.mark.parametrize("name", list(REFUSED))
def test_bridge_compile(name):
  want = _cpu_error(name)
  fn, spec = REFUSED[name]
  with _raises_as_cpu(want) as info:
    bridge.compile(fn)(*_inputs(spec))
  _check(info.value, want)


@pytest.mark.parametrize("name", list(REFUSED))
def test_call_torch_under_jit(name):
  want = _cpu_error(name)
  fn, spec = REFUSED[name]
  with jax.enable_x64(True):
    arrays = [bridge.to_jax(t) for t in _inputs(spec)]
    with _raises_as_cpu(want) as info:
      jax.jit(lambda *a: bridge.call_torch(fn, *a))(*arrays)
  _check(info.value, want)


@pytest.mark.parametrize("name", ["var_int", "softmax_int", "bool_matmul", "complex_sort"])
def test_torch_compile_backend(name):
  want = _cpu_error(name)
  fn, spec = REFUSED[name]
  torch._dynamo.reset()
  with _raises_as_cpu(want) as info:
    torch.compile(fn, backend="jax")(*_inputs(spec))
  # (the backend adds the op's place in the compiled graph to torch's message)
  assert type(info.value) is type(want)


# --- what is not refused ----------------------------------------------------------------------


# Computed by torch: a stand-in that raises for its values (zeros divide by zero; ones index
# past a dimension of size 1; a matrix of zeros is singular) is not taken for a refusal.
ACCEPTED = {
  "floor_divide_int": (lambda a, b: a // b, [((3,), L), ((3,), L)]),
  "index_select_one_row": (
    lambda a, i: a.index_select(0, i),
    [((1, 3), L), ((2,), L)],
  ),
  "inverse_complex": (
    lambda a: torch.linalg.inv(a + 2 * torch.eye(2, device=a.device)),
    [((2, 2), C)],
  ),
  "int_mm": (lambda a, b: a @ b, [((2, 3), L), ((3, 2), L)]),
  "bool_sum": (lambda a: a.sum(), [((3,), B)]),
  "complex_abs": (lambda a: a.abs(), [((3,), C)]),
  "sort_int": (lambda a: a.sort().values, [((3,), L)]),
  "softmax_float16": (lambda a: a.softmax(0), [((3,), H)]),
}


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_computed_where_torch_computes(name):
  fn, spec = ACCEPTED[name]
  if name == "index_select_one_row":
    inputs = [_tensor((1, 3), L, 0), torch.zeros(2, dtype=L)]
  else:
    inputs = _inputs(spec)
  want = fn(*inputs)
  torch.testing.assert_close(fn(*[t.to("jax") for t in inputs]).cpu(), want)
  torch.testing.assert_close(bridge.compile(fn)(*inputs), want)


def test_float_ops_do_not_ask_the_cpu_kernel(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("the CPU kernel was asked about float32/float64 arguments")

  monkeypatch.setattr(executable, "kernel_refusal", refuse)

  def f(x, w):
    y = F.gelu(x @ w).softmax(-1)
    return y.var(0) + y.sort(-1).values.sum() + torch.cdist(y, y).mean()

  x, w = torch.randn(4, 5), torch.randn(5, 6)
  for dtype in (torch.float32, torch.float64):
    a, b = x.to(dtype), w.to(dtype)
    want = f(a, b)
    torch.testing.assert_close(f(a.to("jax"), b.to("jax")).cpu(), want)
    torch.testing.assert_close(bridge.compile(f)(a, b), want)


def test_the_check_leaves_torchs_generator_as_it_was(monkeypatch):
  asked = []
  kernel_refusal = executable.kernel_refusal

  def spy(func, *args):
    asked.append(func)
    return kernel_refusal(func, *args)

  monkeypatch.setattr(executable, "kernel_refusal", spy)
  torch.manual_seed(0)
  state = torch.get_rng_state()
  x = torch.ones(3, dtype=torch.float16, device="jax")
  torch.randint(0, 5, (3,), dtype=torch.int64, device="jax")
  torch.rand_like(x)
  F.dropout(x, 0.5, training=True)
  with pytest.raises(NotImplementedError, match="\"normal_kernel_cpu\" not implemented for 'Long'"):
    torch.randn(3, dtype=torch.int64, device="jax")
  bridge.compile(lambda t: torch.bernoulli(t.half() / 4))(torch.ones(3))
  assert asked  # (the stand-ins ran)
  assert torch.equal(torch.get_rng_state(), state)
