"""`*_like` and `new_*` ops on `jax` tensors given `device=` (and `dtype=`, `layout=`,
`pin_memory=`, `memory_format=`, `requires_grad=`): the result is where torch puts it for a CPU
input (or, for the device's own behaviour, a CUDA one), with torch's dtype, layout, strides,
values and errors; eagerly, inside `bridge.compile`, and on another `jax` device index."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from typing import Any, Callable

import pytest
import torch

import bridge
from tests import xla

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")

# name -> (op, whether its values are defined: `empty` ones are not)
OPS: dict[str, tuple[Callable[..., torch.Tensor], bool]] = {
  "zeros_like": (lambda t, **k: torch.zeros_like(t, **k), True),
  "ones_like": (lambda t, **k: torch.ones_like(t, **k), True),
  "empty_like": (lambda t, **k: torch.empty_like(t, **k), False),
  "full_like": (lambda t, **k: torch.full_like(t, 2, **k), True),
  "new_zeros": (lambda t, **k: t.new_zeros((2, 5), **k), True),
  "new_ones": (lambda t, **k: t.new_ones((2, 5), **k), True),
  "new_empty": (lambda t, **k: t.new_empty((2, 5), **k), False),
  "new_full": (lambda t, **k: t.new_full((2, 5), 7, **k), True),
  "new_empty_strided": (lambda t, **k: t.new_empty_strided((2, 5), (1, 2), **k), False),
}
RANDOM: dict[str, Callable[..., torch.Tensor]] = {
  "rand_like": lambda t, **k: torch.rand_like(t, **k),
  "randn_like": lambda t, **k: torch.randn_like(t, **k),
  "randint_like": lambda t, **k: torch.randint_like(t, 9, **k),
  "randint_like_low": lambda t, **k: torch.randint_like(t, 3, 9, **k),
}


def _input(device: str) -> torch.Tensor:
  # a permuted view with a dimension of size 1: `preserve_format` keeps its strides
  return torch.arange(24.0).reshape(2, 3, 4, 1).to(device).permute(0, 2, 3, 1)


def _outcome(fn: Callable[[], torch.Tensor], values: bool = True) -> Any:
  """What torch makes: the exception (type, message), or the tensor's placement and layout,
  and its values where they are defined."""
  try:
    r = fn()
  except Exception as e:  # noqa: BLE001 - compared as torch's
    return type(e), str(e)
  strides = r.stride() if r.layout == torch.strided else None
  data = None
  if values and r.device.type == "cpu":
    data = (r.to_dense() if r.layout != torch.strided else r).tolist()
  return r.device, r.dtype, r.layout, tuple(r.shape), strides, r.requires_grad, r.is_leaf, data


def _same(fn: Callable[[torch.Tensor], torch.Tensor], values: bool = True) -> None:
  want = _outcome(lambda: fn(_input("cpu")), values)
  got = _outcome(lambda: fn(_input("jax")), values)
  assert got == want


# --- device="cpu" / "meta": what a CPU input gives ---------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("name", list(OPS))
def test_an_explicit_device_is_where_the_result_is(name, device):
  op, values = OPS[name]
  _same(lambda t: op(t, device=device), values)
  r = op(_input("jax"), device=device)
  assert r.device == torch.device(device) and type(r) is torch.Tensor


_EXTRAS = {
  "int32": {"dtype": torch.int32},
  "float64-requires_grad": {"dtype": torch.float64, "requires_grad": True},
  "channels_last": {"memory_format": torch.channels_last},
  "contiguous_format": {"memory_format": torch.contiguous_format},
  "sparse_coo": {"layout": torch.sparse_coo},
  "strided": {"layout": torch.strided},
  "sparse_coo-memory_format": {
    "layout": torch.sparse_coo,
    "memory_format": torch.contiguous_format,
  },
  "sparse_csr": {"layout": torch.sparse_csr},
  "pin_memory": {"pin_memory": True},  # torch's answer for a CPU tensor in this process
}
# Controls: torch raises the same error for these before the op reaches the jax device's code
# (torch's argument checks, a sparse tensor's missing kernels), with and without the fix.
_CONTROLS = {
  ("zeros_like", "sparse_coo-memory_format"),
  ("ones_like", "sparse_csr"),
  ("empty_like", "sparse_csr"),
  ("full_like", "sparse_csr"),
  ("new_zeros", "sparse_coo-memory_format"),
  ("new_ones", "sparse_coo"),
  ("new_ones", "sparse_coo-memory_format"),
  ("new_empty", "sparse_coo-memory_format"),
  ("new_full", "sparse_coo"),
  ("new_full", "sparse_coo-memory_format"),
  ("new_empty_strided", "sparse_coo-memory_format"),
}


def _option_cases() -> list:
  cases = []
  for name in OPS:
    for device in ("cpu", "meta"):
      for extra, kwargs in _EXTRAS.items():
        if name.startswith("new_") and extra in ("channels_last", "contiguous_format"):
          continue  # (no `memory_format` argument: Python's TypeError)
        control = (name, extra) in _CONTROLS and (device == "cpu" or "memory_format" in extra)
        label = f"{'control-' if control else ''}{name}-{device}-{extra}"
        cases.append(pytest.param(name, device, kwargs, id=label))
  return cases


@pytest.mark.parametrize(("name", "device", "extra"), _option_cases())
def test_the_other_options_are_torchs_on_that_device(name, device, extra):
  op, values = OPS[name]
  _same(lambda t: op(t, device=device, **extra), values)


@pytest.mark.parametrize("name", list(RANDOM))
def test_random_results_on_the_cpu_draw_from_torchs_cpu_generator(name):
  op = RANDOM[name]
  x = torch.ones(3, 4, device="jax", dtype=torch.float64)
  for extra in ({}, {"dtype": torch.float32}):
    torch.manual_seed(11)
    got = op(x, device="cpu", **extra)
    torch.manual_seed(11)
    want = op(x.cpu(), **extra)
    assert got.device == torch.device("cpu") and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)
  _same(lambda t: op(t, device="meta"), values=False)


def test_full_like_on_the_cpu_and_its_overflow_error():
  x = torch.ones(2, 3, device="jax", dtype=torch.int16)
  got = torch.full_like(x, 2, device="cpu")
  torch.testing.assert_close(got, torch.full_like(x.cpu(), 2), rtol=0, atol=0)
  assert got.device == torch.device("cpu") and got.dtype == torch.int16
  _same(lambda t: torch.full_like(t, 300, dtype=torch.uint8, device="cpu"))  # control


def test_new_empty_strided_on_the_cpu_has_the_strides_asked():
  x = torch.ones(3, device="jax")
  r = x.new_empty_strided((2, 3), (1, 2), device="cpu", dtype=torch.float16)
  assert (r.device, r.dtype, tuple(r.shape), r.stride()) == (
    torch.device("cpu"),
    torch.float16,
    (2, 3),
    (1, 2),
  )


def test_meta_shells_of_jax_weights_are_meta():
  model = torch.nn.Linear(4, 3).to("jax")
  shells = {k: torch.empty_like(v, device="meta") for k, v in model.state_dict().items()}
  assert all(s.is_meta and s.shape == model.state_dict()[k].shape for k, s in shells.items())
  grad = torch.zeros_like(model.weight, device="cpu", requires_grad=True)
  assert grad.device == torch.device("cpu") and grad.is_leaf and grad.requires_grad
  assert grad.grad_fn is None


# --- the input's own device ----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(OPS) + list(RANDOM))
def test_control_no_device_or_the_inputs_own_stays_on_the_jax_device(name):
  op = OPS[name][0] if name in OPS else RANDOM[name]
  x = torch.ones(3, 4, device="jax")
  for extra in ({}, {"device": x.device}, {"device": "jax"}, {"layout": torch.strided}):
    r = op(x, **extra)
    assert type(r) is bridge.Tensor and r.device == torch.device("jax", 0), extra


@pytest.mark.parametrize("name", list(OPS))
def test_another_layout_on_the_jax_device_raises_as_its_factories(name):
  # (CUDA makes a sparse CUDA tensor; the jax device has no sparse tensors: its factory's
  # error, not a dense tensor)
  op = OPS[name][0]
  x = torch.ones(2, 5, device="jax")
  with pytest.raises(Exception) as factory:
    torch.zeros(2, 5, layout=torch.sparse_coo, device="jax")
  want = _outcome(lambda: op(torch.ones(2, 5), layout=torch.sparse_coo, device="jax"))
  got = _outcome(lambda: op(x, layout=torch.sparse_coo))
  assert got == want
  assert got[0] in (type(factory.value), RuntimeError)  # (new_*: torch's own check first)


@pytest.mark.parametrize("name", list(OPS) + list(RANDOM))
def test_pinned_memory_on_the_jax_device_is_cudas_error(name):
  # CUDA's `empty_cuda`: RuntimeError("Only dense CPU tensors can be pinned")
  op = OPS[name][0] if name in OPS else RANDOM[name]
  x = torch.ones(2, 5, device="jax")
  for extra in ({}, {"device": "jax"}):
    with pytest.raises(RuntimeError) as e:
      op(x, pin_memory=True, **extra)
    assert str(e.value) == "Only dense CPU tensors can be pinned"


# --- inside bridge.compile: as `torch.zeros(n, device="cpu")` there -------------------------------


def test_inside_compile_a_cpu_result_is_a_cpu_tensor_as_a_factorys():
  seen: dict[str, Any] = {}

  def f(t):
    z = torch.zeros_like(t, device="cpu")
    seen["like"] = (z.device, type(z), z.dtype, tuple(z.shape))
    f0 = torch.zeros(t.shape, device="cpu", dtype=t.dtype)
    seen["factory"] = (f0.device, type(f0), f0.dtype, tuple(f0.shape))
    m = t.new_empty((5,), device="meta")
    seen["meta"] = m.device
    return t * 2 + torch.ones_like(t, device="cpu") + z

  x = torch.arange(6.0, device="jax").reshape(2, 3)
  out = bridge.compile(f)(x)
  assert seen["like"] == seen["factory"] == (torch.device("cpu"), torch.Tensor, x.dtype, (2, 3))
  assert seen["meta"] == torch.device("meta")
  assert out.device == x.device
  torch.testing.assert_close(out.cpu(), f(x.cpu()))


def _compiled_warnings(fn: Callable, x: torch.Tensor) -> list[str]:
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    bridge.compile(fn)(x)
  return [str(w.message) for w in caught if "drew random numbers" in str(w.message)]


def test_inside_compile_a_random_cpu_result_is_drawn_as_a_factorys():
  x = torch.ones(2, 3, device="jax")
  like = _compiled_warnings(lambda t: t + torch.rand_like(t, device="cpu"), x)
  factory = _compiled_warnings(lambda t: t + torch.rand(t.shape, device="cpu"), x)
  assert like == factory and len(like) == 1


# --- another jax device index: the result is there, and so is its array -------------------------

_TWO_DEVICES = r"""
import torch, bridge

def where(t):
  return str(t.device), sorted(d.id for d in t._storage.array.devices())

x0 = torch.ones(2, 3, device="jax:0")
x1 = torch.ones(2, 3, device="jax:1")
assert where(x1) == ("jax:1", [1]), where(x1)
cases = {
  "zeros_like to 1": torch.zeros_like(x0, device="jax:1"),
  "full_like to 1": torch.full_like(x0, 4.0, device="jax:1"),
  "rand_like to 1": torch.rand_like(x0, device="jax:1"),
  "new_ones to 1": x0.new_ones((3,), device="jax:1"),
  "new_full to 0": x1.new_full((3,), 5.0, device="jax:0"),
  "zeros_like of 1": torch.zeros_like(x1),
  "new_zeros of 1": x1.new_zeros((3,)),
  "full_like of 1": torch.full_like(x1, 3.0),
  "zero_ of 1": x1.clone().zero_(),
  "fill_ of 1": x1.clone().fill_(2.0),
  "zeros on 1": torch.zeros(3, device="jax:1"),
}
for name, t in cases.items():
  want = ("jax:0", [0]) if name.endswith("to 0") else ("jax:1", [1])
  assert where(t) == want, (name, where(t))
torch.testing.assert_close(cases["full_like to 1"].cpu(), torch.full((2, 3), 4.0))
torch.testing.assert_close(cases["fill_ of 1"].cpu(), torch.full((2, 3), 2.0))
print("ok")
"""


def test_another_jax_device_index_holds_the_result():
  env = dict(os.environ, XLA_FLAGS=xla.with_flags("--xla_force_host_platform_device_count=2"))
  out = subprocess.run(
    [sys.executable, "-c", _TWO_DEVICES], capture_output=True, text=True, timeout=300, env=env
  )
  assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
