"""`bridge.call_jax` and transfers keep their word: exact cache keys, a cache that lets dead
functions go, no silent narrowing of NumPy inputs, no abort on `jax.Array.delete()`, one
device per call."""

from __future__ import annotations

import ctypes
import gc
import math
import subprocess
import sys
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from bridge._src import call_jax as call_jax_lib


@pytest.fixture(autouse=True)
def _fresh_cache():
  call_jax_lib.clear_cache()
  yield
  call_jax_lib.clear_cache()


# --- static arguments are keyed exactly ---------------------------------------


def _sign(x, s):
  return jnp.copysign(x, s)


def _imag_sign(x, z):
  return jnp.copysign(x, jnp.imag(jnp.asarray(z)))


# (function, a static value, another that compares equal to it but gives another result)
_EQUAL_BUT_DISTINCT = {
  "float -0.0": (_sign, 0.0, -0.0),
  "float nan sign": (_sign, math.nan, -math.nan),
  "complex -0.0 imag": (_imag_sign, complex(1.0, 0.0), complex(1.0, -0.0)),
  "numpy float32 -0.0": (_sign, np.float32(0.0), np.float32(-0.0)),
  "numpy complex64 -0.0 imag": (_imag_sign, np.complex64(1.0), np.complex64(complex(1.0, -0.0))),
}


@pytest.mark.parametrize("name", list(_EQUAL_BUT_DISTINCT))
def test_equal_but_distinguishable_statics_get_their_own_entries(name):
  fn, a, b = _EQUAL_BUT_DISTINCT[name]
  x = torch.ones(2)
  for s in (a, b, a, b):  # in both orders, and again from the cache
    want = torch.tensor(np.asarray(fn(jnp.ones(2), s)))
    assert torch.equal(bridge.call_jax(fn, x, s), want), (s, want)
  assert len(call_jax_lib._cache) == 2


def test_bool_int_and_float_statics_keep_their_types():
  with jax.enable_x64(False):
    outs = [bridge.call_jax(jnp.asarray, s) for s in (True, 1, 1.0, True)]
  assert [o.dtype for o in outs] == [torch.bool, torch.int32, torch.float32, torch.bool]
  assert len(call_jax_lib._cache) == 3


@pytest.mark.parametrize(
  "make_nan",
  [lambda: float("nan"), lambda: np.float32("nan"), lambda: complex(float("nan"), 0.0)],
  ids=["float", "numpy float32", "complex"],
)
def test_a_nan_static_finds_its_entry_again(make_nan):
  traces = []

  def f(x, s):
    traces.append(1)
    return x + jnp.real(s)

  for _ in range(3):  # a new NaN object each time (nan != nan)
    assert torch.isnan(bridge.call_jax(f, torch.ones(2), make_nan())).all()
  assert len(traces) == 1 and len(call_jax_lib._cache) == 1


# --- the cache lets dead functions go -----------------------------------------


def test_a_dead_functions_entries_and_programs_are_dropped():
  x = torch.randn(3, requires_grad=True)

  def keep(x):
    return x * 2

  fn = lambda x: jnp.sin(x)  # (a fresh function, as in a loop)
  bridge.call_jax(fn, x).sum().backward()
  bridge.call_jax(fn, x.detach())
  bridge.call_jax(keep, x.detach())
  assert len(call_jax_lib._cache) == 2
  entry = weakref.ref(next(e for e in call_jax_lib._cache._entries.values() if e.fn is fn))
  fn_alive = weakref.ref(fn)
  del fn
  gc.collect()
  assert fn_alive() is None, "the cache kept the function alive"
  bridge.call_jax(keep, x.detach())  # the next call drops the dead entries first
  assert len(call_jax_lib._cache) == 1
  gc.collect()
  assert entry() is None, "the dead function's entry (and its programs) stayed alive"


def test_bound_methods_share_an_entry_and_go_with_their_object():
  class Scale:
    def __init__(self, k):
      self.k = k

    def __call__(self, x):
      return x * self.k

    def apply(self, x):
      return x * self.k

  a, b = Scale(2.0), Scale(3.0)
  x = torch.ones(2)
  for _ in range(2):  # a new bound method object on each attribute access
    assert bridge.call_jax(a.apply, x).tolist() == [2.0, 2.0]
    assert bridge.call_jax(b.apply, x).tolist() == [3.0, 3.0]
    assert bridge.call_jax(a, x).tolist() == [2.0, 2.0]
  assert len(call_jax_lib._cache) == 3
  a_alive = weakref.ref(a)
  del a
  gc.collect()
  assert a_alive() is None
  bridge.call_jax(b.apply, x)
  assert len(call_jax_lib._cache) == 1


def test_derivatives_of_any_order_after_the_function_died():
  x = torch.randn(3, requires_grad=True)
  y = bridge.call_jax(lambda x: jnp.sum(jnp.sin(x)), x)  # the lambda dies here
  gc.collect()
  (g,) = torch.autograd.grad(y, x, create_graph=True)
  del y
  gc.collect()
  (h,) = torch.autograd.grad(g.sum(), x, create_graph=True)
  del g
  gc.collect()
  (t,) = torch.autograd.grad(h.sum(), x)
  torch.testing.assert_close(t, -torch.cos(x.detach()))


def _rss_bytes() -> int:
  gc.collect()
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed memory back, so RSS shows leaks only
  except (OSError, AttributeError):
    pass
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * 4096


def _fresh_functions(n: int, x: torch.Tensor, *, big: np.ndarray | None = None) -> None:
  for k in range(n):
    if big is None:
      fn = lambda x, k=k: jnp.sin(x) * k
    else:
      fn = lambda x, k=k: x * k + jnp.sum(big)  # (the constant is in the program)
    y = bridge.call_jax(fn, x)
    if x.requires_grad:
      y.sum().backward()


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "backward"])
def test_fresh_functions_with_large_constants_do_not_pile_up(grad):
  x = torch.randn(16, requires_grad=grad)
  big = np.ones(2**21, np.float32)  # 8 MiB, closed over by each function
  _fresh_functions(3, x, big=big)
  before = _rss_bytes()
  _fresh_functions(20, x, big=big)
  growth = _rss_bytes() - before
  assert len(call_jax_lib._cache) <= 2
  assert growth < 50 * 2**20, f"RSS grew by {growth / 2**20:.0f} MiB over 20 functions"


@pytest.mark.slow
def test_fresh_lambdas_keep_memory_flat():
  # A fresh function is a fresh compilation (tens of ms), so this is 240 of them, not
  # 1000; the old cache kept ~1.4 MiB per forward-only call and ~3 MiB per call with
  # backward (over 500 MiB here).
  x = torch.randn(16)
  xg = torch.randn(16, requires_grad=True)
  _fresh_functions(20, x)
  _fresh_functions(10, xg)
  before = _rss_bytes()
  _fresh_functions(160, x)
  _fresh_functions(80, xg)
  growth = _rss_bytes() - before
  assert len(call_jax_lib._cache) <= 2
  assert growth < 50 * 2**20, f"RSS grew by {growth / 2**20:.0f} MiB over 240 fresh functions"


# --- NumPy inputs follow the tensors' 64-bit rule -----------------------------


_NUMPY_64 = {
  "float64 array": (np.ones(3), torch.float64, "astype(np.float32)"),
  "int64 array": (np.arange(3), torch.int64, "astype(np.int32)"),
  "complex128 array": (np.ones(3, np.complex128), torch.complex128, "astype(np.complex64)"),
  "float64 scalar": (np.float64(1.5), torch.float64, "np.float32(x)"),
  "int64 scalar": (np.int64(7), torch.int64, "np.int32(x)"),
  "uint64 scalar": (np.uint64(7), torch.uint64, "np.uint32(x)"),
}


@pytest.mark.parametrize("name", list(_NUMPY_64))
def test_64_bit_numpy_inputs_need_x64_and_say_so(name):
  value, dtype, fix = _NUMPY_64[name]
  with jax.enable_x64(False):
    with pytest.raises(bridge.BridgeTypeError) as info:
      bridge.call_jax(lambda x, s: s["v"] + 0, torch.ones(1), {"v": value})
  msg = str(info.value)
  assert "`bridge.call_jax`" in msg and "argument args[1]['v']" in msg
  assert "jax.enable_x64(True)" in msg and "jax_enable_x64" in msg and fix in msg
  with jax.enable_x64(True):
    out = bridge.call_jax(lambda x, s: s["v"] + 0, torch.ones(1), {"v": value})
  assert out.dtype is dtype
  assert out.tolist() == np.asarray(value).tolist()


def test_32_bit_numpy_inputs_pass_without_x64():
  with jax.enable_x64(False):
    out = bridge.call_jax(lambda a, s: a * s, np.ones(3, np.float32), np.float32(2.0))
  assert out.dtype is torch.float32 and out.tolist() == [2.0] * 3


# --- deleting a JAX array never aborts ----------------------------------------


_DELETE_SCRIPT = r"""
import gc, sys, torch, jax, jax.numpy as jnp, bridge

def check(name, make):
  a = jnp.arange(4096.0) + 1
  want = torch.arange(4096.0) + 1
  t = make(a)
  print(name, flush=True)
  try:
    a.delete()
  except Exception as e:  # refusing is allowed, aborting is not
    print(name, "refused:", type(e).__name__, e, flush=True)
  junk = [jnp.full(4096, -1.0) for _ in range(8)]  # memory that would reuse a freed buffer
  gc.collect()
  if getattr(t, "is_jax", False):  # a view of the array: an error, never a crash
    try:
      t.sum().item()
    except Exception as e:
      print(name, "view error:", type(e).__name__, flush=True)
  else:
    assert torch.equal(t, want), (name, t[:4])
  del t, junk
  gc.collect()

x = torch.ones(4096, requires_grad=True)
check("to_torch", lambda a: bridge.to_torch(a))
check("to_torch tree", lambda a: bridge.to_torch({"a": [a]})["a"][0])
check("to_torch copy=False", lambda a: bridge.to_torch(a, copy=False))
check("call_jax identity", lambda a: bridge.call_jax(lambda a: a, a))
check("call_jax closure", lambda a: bridge.call_jax(lambda x: (x, a), x.detach())[1])
check("call_jax grad", lambda a: bridge.call_jax(lambda x, a: x * 0 + a, x, a).detach())
check("torch_view", lambda a: bridge.torch_view(a))
print("done")
"""


def test_deleting_an_array_that_torch_shares_does_not_abort():
  out = subprocess.run(
    [sys.executable, "-c", _DELETE_SCRIPT], capture_output=True, text=True, timeout=300
  )
  assert out.returncode == 0, f"{out.stdout}\n{out.stderr[-3000:]}"
  assert out.stdout.strip().endswith("done"), out.stdout


# --- one device per call ------------------------------------------------------


@pytest.mark.parametrize("cpu_first", [True, False], ids=["cpu, jax", "jax, cpu"])
def test_cpu_and_jax_tensors_in_one_call_name_both(cpu_first):
  cpu, dev = torch.ones(3), torch.ones(3, device="jax")
  args = (cpu, {"b": dev}) if cpu_first else (dev, {"b": cpu})
  with pytest.raises(bridge.TransferError) as info:
    bridge.call_jax(lambda a, b: a + b["b"], *args)
  msg = str(info.value)
  first, second = ("cpu", "jax:0") if cpu_first else ("jax:0", "cpu")
  assert f"argument args[0] is on {first}" in msg, msg
  assert f"argument args[1]['b'] is on {second}" in msg, msg
  assert "`bridge.call_jax`" in msg and ".to(" in msg


@pytest.mark.parametrize("device", ["cpu", "jax"])
def test_tensors_on_one_device_are_fine(device):
  a = torch.ones(3, device=device)
  b = torch.full((3,), 2.0, device=device, requires_grad=True)
  out = bridge.call_jax(lambda a, b: a * b, a, b=b)
  assert out.device == a.device and out.cpu().tolist() == [2.0] * 3
  out.sum().backward()
  assert b.grad.device == b.device


# --- forward-mode AD ------------------------------------------------------------------------


def _f_torch(x, y):
  return torch.sin(x) * y, (x * y).sum().reshape(1), torch.argmax(x).reshape(1)


def _f_jax(x, y):
  return jnp.sin(x) * y, (x * y).sum().reshape(1), jnp.argmax(x).reshape(1)


@pytest.mark.parametrize("device", ["cpu", "jax"])
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_forward_mode_tangents_go_through_call_jax(device, grad):
  # A dual tensor's tangent was dropped: the output came back without one (torch raises for a
  # custom Function that cannot propagate it). Now it is JAX's JVP, alongside the reverse mode.
  import torch.autograd.forward_ad as fwAD

  torch.manual_seed(0)
  x, y, tx = torch.randn(3), torch.randn(3), torch.randn(3)
  with torch.set_grad_enabled(grad), fwAD.dual_level():
    want = [fwAD.unpack_dual(o).tangent for o in _f_torch(fwAD.make_dual(x, tx), y)]
    xd = fwAD.make_dual(x.to(device).requires_grad_(grad), tx.to(device))
    outs = bridge.call_jax(_f_jax, xd, y.to(device))
    got = [fwAD.unpack_dual(o).tangent for o in outs]
    assert got[2] is None and want[2] is None  # (argmax: no tangent)
    for g, w in zip(got[:2], want[:2]):
      assert g.device.type == device
      torch.testing.assert_close(g.cpu(), w)
    only_y = fwAD.unpack_dual(bridge.call_jax(_f_jax, x, fwAD.make_dual(y, tx))[0]).tangent
    torch.testing.assert_close(only_y, torch.sin(x) * tx)
  if grad:  # the reverse mode of the same call still works
    leaf = x.to(device).requires_grad_(True)
    bridge.call_jax(_f_jax, leaf, y.to(device))[0].sum().backward()
    torch.testing.assert_close(leaf.grad.cpu(), torch.cos(x) * y)


def test_forward_mode_tangents_of_a_non_holomorphic_complex_function():
  import torch.autograd.forward_ad as fwAD

  torch.manual_seed(0)
  z, tz = torch.randn(3, dtype=torch.complex64), torch.randn(3, dtype=torch.complex64)
  with fwAD.dual_level():
    d = fwAD.make_dual(z, tz)
    want = fwAD.unpack_dual(torch.exp(d) * d.conj()).tangent
    got = fwAD.unpack_dual(bridge.call_jax(lambda a: jnp.exp(a) * a.conj(), d)).tangent
  torch.testing.assert_close(got, want)


@pytest.mark.parametrize("transform", ["grad", "vmap", "jvp"])
def test_torch_func_transforms_are_refused_with_what_to_use(transform):
  x = torch.randn(3)
  f = lambda v: bridge.call_jax(jnp.sin, v)
  run = {
    "grad": lambda: torch.func.grad(lambda v: f(v).sum())(x),
    "vmap": lambda: torch.func.vmap(f)(x),
    "jvp": lambda: torch.func.jvp(f, (x,), (x,)),
  }[transform]
  with pytest.raises(bridge.BridgeTypeError, match=r"torch\.func` transform .*forward_ad"):
    run()
