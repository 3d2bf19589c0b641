"""`bridge.call_jax` / `bridge.torch_view`: parity, caching, autograd, errors, threads, memory."""

from __future__ import annotations

import dataclasses
import functools
import gc
import threading

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


# --- forward ------------------------------------------------------------------


def test_forward_matches_torch_and_keeps_structure():
  def f(x, params, *, scale):
    return {"y": jnp.tanh(x @ params["w"] + params["b"]) * scale, "n": jnp.sum(x > 0)}

  x, w, b = torch.randn(4, 3), torch.randn(3, 2), torch.randn(2)
  out = bridge.call_jax(f, x, {"w": w, "b": b}, scale=2.0)
  assert set(out) == {"y", "n"}
  torch.testing.assert_close(out["y"], torch.tanh(x @ w + b) * 2.0)
  assert out["n"].dtype is torch.int32 and int(out["n"]) == int((x > 0).sum())


def test_outputs_are_torch_tensors_on_the_input_device():
  out = bridge.call_jax(lambda x: (x, [x * 2], None), torch.ones(2))
  assert isinstance(out, tuple) and out[2] is None
  assert isinstance(out[0], torch.Tensor) and out[0].device.type == "cpu"
  assert isinstance(out[1], list) and isinstance(out[1][0], torch.Tensor)


def test_jitted_function_and_static_arguments():
  @functools.partial(jax.jit, static_argnames="axis")
  def norm(x, axis):
    return x / jnp.linalg.norm(x, axis=axis, keepdims=True)

  x = torch.randn(3, 4)
  torch.testing.assert_close(bridge.call_jax(norm, x, axis=1), x / x.norm(dim=1, keepdim=True))
  torch.testing.assert_close(bridge.call_jax(norm, x, axis=0), x / x.norm(dim=0, keepdim=True))


def test_static_string_and_dataclass_arguments():
  @dataclasses.dataclass
  class Batch:
    x: torch.Tensor
    mode: str

  def f(batch):
    return batch.x * (2.0 if batch.mode == "double" else 1.0)

  x = torch.randn(3)
  torch.testing.assert_close(bridge.call_jax(f, Batch(x, "double")), x * 2)
  torch.testing.assert_close(bridge.call_jax(f, Batch(x, "same")), x)


def test_jax_and_numpy_arrays_are_accepted_as_inputs():
  out = bridge.call_jax(
    lambda a, b, c: a + b + c, torch.ones(2), jnp.ones(2), np.ones(2, np.float32)
  )
  torch.testing.assert_close(out, torch.full((2,), 3.0))


def test_torch_view_decorator():
  @bridge.torch_view
  def gelu(x):
    """Docs."""
    return jax.nn.gelu(x, approximate=False)

  x = torch.randn(5)
  torch.testing.assert_close(gelu(x), torch.nn.functional.gelu(x))
  assert gelu.__name__ == "gelu" and gelu.__doc__ == "Docs." and gelu.__wrapped__ is not None
  assert bridge.torch_view(gelu) is gelu


def test_torch_view_of_arrays_is_a_jax_device_tensor_and_views_cancel():
  a = jnp.arange(3.0)
  t = bridge.torch_view({"a": a})["a"]
  assert isinstance(t, bridge.Tensor) and t.device == torch.device("jax", 0)
  assert bridge.jax_view(t) is a


@pytest.mark.parametrize(
  "dtype", [torch.bfloat16, torch.float16, torch.uint8, torch.bool, torch.complex64, torch.int16]
)
def test_dtypes_are_preserved(dtype):
  x = torch.ones(3, dtype=dtype)
  out = bridge.call_jax(lambda x: x, x)
  assert out.dtype is dtype
  torch.testing.assert_close(out, x)


def test_64_bit_inputs_need_x64_and_say_so():
  idx = torch.tensor([2, 0])
  with jax.enable_x64(False):
    with pytest.raises(bridge.BridgeTypeError) as info:
      bridge.call_jax(jnp.take, torch.arange(3.0), idx)
  msg = str(info.value)
  assert "`bridge.call_jax`" in msg and "argument args[1]" in msg and "int64" in msg
  assert "jax.enable_x64(True)" in msg and "torch.int32" in msg
  with jax.enable_x64(True):
    out = bridge.call_jax(lambda x, i: (jnp.take(x, i), i * 2**40), torch.arange(3.0), idx)
  torch.testing.assert_close(out[0], torch.tensor([2.0, 0.0]))
  assert out[1].dtype is torch.int64 and out[1].tolist() == [2 * 2**40, 0]


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64, torch.complex128])
def test_64_bit_jax_device_inputs_need_x64_as_cpu_ones_do(dtype):
  # A `jax` tensor's array went to the function as it was: int64 [2**40 + 1] came back as
  # int32 [2] (JAX narrows a 64-bit array at its first op while its 64-bit types are off).
  x = torch.tensor([2**40 + 1], device="jax").to(dtype)
  with jax.enable_x64(False):
    with pytest.raises(bridge.BridgeTypeError, match=r"args\[0\].*device jax:0\) is "):
      bridge.call_jax(lambda v: v + 1, x)
  with jax.enable_x64(True):
    out = bridge.call_jax(lambda v: v + 1, x)
  assert out.dtype is dtype and out.cpu().tolist() == (x.cpu() + 1).tolist()


def test_non_contiguous_and_unaligned_inputs():
  base = torch.randn(65)
  x = base[1:].reshape(8, 8).t()[:, ::2]
  torch.testing.assert_close(bridge.call_jax(lambda x: x * 3, x), x * 3)


def test_compiled_once_per_signature():
  traces = []

  def f(x, k):
    traces.append(x.shape)
    return x * k

  for _ in range(5):
    bridge.call_jax(f, torch.ones(3), 2)
  assert len(traces) == 1
  bridge.call_jax(f, torch.ones(4), 2)  # new shape: JAX retraces
  bridge.call_jax(f, torch.ones(4), 3)  # new static value: a new entry
  bridge.call_jax(f, torch.ones(4), 3.0)  # 3 == 3.0 but another type: a new entry
  assert len(traces) == 4
  assert len(call_jax_lib._cache) == 3


def test_cache_is_bounded(monkeypatch):
  monkeypatch.setattr(call_jax_lib._cache, "size", 4)

  def f(x, k):
    return x + k

  for k in range(10):
    bridge.call_jax(f, torch.ones(1), k)
  assert len(call_jax_lib._cache) == 4


# --- autograd -----------------------------------------------------------------


def test_gradcheck_float64():
  def f(x, y):
    return jnp.sin(x) * jnp.exp(y[None, :]) + jnp.sum(x**2, axis=1, keepdims=True)

  x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
  y = torch.randn(4, dtype=torch.float64, requires_grad=True)
  with jax.enable_x64(True):
    assert torch.autograd.gradcheck(lambda x, y: bridge.call_jax(f, x, y), (x, y))


def test_gradcheck_complex():
  def f(z, w):
    return (z * jnp.conj(w) + jnp.sin(z), jnp.abs(z) ** 2)

  z = torch.randn(3, dtype=torch.complex128, requires_grad=True)
  w = torch.randn(3, dtype=torch.complex128, requires_grad=True)
  with jax.enable_x64(True):
    assert torch.autograd.gradcheck(lambda z, w: bridge.call_jax(f, z, w), (z, w))


def test_gradients_match_torch_autograd():
  x = torch.randn(5, 3, requires_grad=True)
  w = torch.randn(3, 2, requires_grad=True)
  loss = bridge.call_jax(lambda x, w: jnp.mean(jax.nn.softplus(x @ w) ** 2), x, w)
  loss.backward()
  x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
  torch.mean(torch.nn.functional.softplus(x2 @ w2) ** 2).backward()
  torch.testing.assert_close(x.grad, x2.grad)
  torch.testing.assert_close(w.grad, w2.grad)


def test_gradient_flows_through_surrounding_torch_graph():
  lin = torch.nn.Linear(4, 4)
  x = torch.randn(2, 4)
  y = bridge.call_jax(jnp.tanh, lin(x)).pow(2).sum()
  y.backward()
  lin2 = torch.nn.Linear(4, 4)
  lin2.load_state_dict(lin.state_dict())
  torch.tanh(lin2(x)).pow(2).sum().backward()
  torch.testing.assert_close(lin.weight.grad, lin2.weight.grad)


def test_only_inputs_that_require_grad_get_gradients():
  x = torch.randn(3, requires_grad=True)
  c = torch.randn(3)
  out = bridge.call_jax(lambda x, c: jnp.sum(x * c), x, c)
  out.backward()
  torch.testing.assert_close(x.grad, c)
  assert c.grad is None


def test_integer_inputs_and_outputs_are_non_differentiable():
  x = torch.randn(4, requires_grad=True)
  idx = torch.tensor([3, 1], dtype=torch.int32)
  vals, arg = bridge.call_jax(lambda x, i: (x[i] * 2, jnp.argmax(x)), x, idx)
  assert vals.requires_grad and not arg.requires_grad
  assert arg.dtype is torch.int32
  vals.sum().backward()
  torch.testing.assert_close(x.grad, torch.tensor([0.0, 2.0, 0.0, 2.0]))


def test_unused_and_stride0_output_gradients():
  x = torch.randn(3, 4, requires_grad=True)
  a, b = bridge.call_jax(lambda x: (x * 2, jnp.sin(x)), x)
  a.sum().backward()  # the gradient of `a` is a stride-0 expand; `b` gets none
  torch.testing.assert_close(x.grad, torch.full((3, 4), 2.0))
  x.grad = None
  a, b = bridge.call_jax(lambda x: (x * 2, jnp.sin(x)), x)
  torch.autograd.backward([b], [torch.ones(4).expand(3, 4)])
  torch.testing.assert_close(x.grad, torch.cos(x.detach()))


def test_backward_in_another_x64_setting_than_forward():
  x = torch.randn(3, dtype=torch.float64, requires_grad=True)
  with jax.enable_x64(True):
    y = bridge.call_jax(lambda x: jnp.sum(x**3), x)
  y.backward()  # outside the x64 scope; the backward re-enters it
  assert x.grad.dtype is torch.float64
  torch.testing.assert_close(x.grad, 3 * x.detach() ** 2)


def test_no_grad_and_inference_mode_build_no_vjp():
  x = torch.randn(3, requires_grad=True)

  def f(x):
    return jnp.exp(x)

  with torch.no_grad():
    y = bridge.call_jax(f, x)
  with torch.inference_mode():
    z = bridge.call_jax(f, x)
  assert not y.requires_grad and not z.requires_grad
  entries = list(call_jax_lib._cache._entries.values())
  assert len(entries) == 1 and not entries[0].vjp._forwards


def _loop(x):
  # while_loop has no reverse-mode derivative
  return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2.0), (0, x))[1]


def test_function_without_derivative_runs_forward_and_fails_on_backward():
  x = torch.ones(3, requires_grad=True)
  y = bridge.call_jax(_loop, x)
  torch.testing.assert_close(y, torch.full((3,), 8.0))
  assert y.requires_grad
  with pytest.raises(bridge.BridgeError, match=r"cannot differentiate it.*jax.custom_vjp"):
    y.sum().backward()
  y2 = bridge.call_jax(_loop, x)  # the decision is cached; still an error, never silent
  assert y2.requires_grad
  with pytest.raises(bridge.BridgeError):
    y2.sum().backward()


def test_second_backward_with_retain_graph():
  x = torch.randn(3, requires_grad=True)
  y = bridge.call_jax(lambda x: jnp.sum(x**2), x)
  y.backward(retain_graph=True)
  y.backward()
  torch.testing.assert_close(x.grad, 4 * x.detach())


def test_bfloat16_gradients():
  x = torch.randn(8, dtype=torch.bfloat16, requires_grad=True)
  bridge.call_jax(lambda x: jnp.sum(x * x), x).backward()
  assert x.grad.dtype is torch.bfloat16
  torch.testing.assert_close(x.grad, 2 * x.detach())


# --- bad input ----------------------------------------------------------------


def test_tensors_on_two_devices():
  with pytest.raises(bridge.TransferError) as info:
    bridge.call_jax(lambda a, b: a + b, torch.ones(2), {"b": torch.ones(2, device="meta")})
  msg = str(info.value)
  assert "args[0] is on cpu" in msg and "args[1]['b'] is on meta" in msg
  assert "`bridge.call_jax`" in msg


def test_unhashable_static_argument():
  with pytest.raises(bridge.BridgeTypeError) as info:
    bridge.call_jax(lambda x, s: x, torch.ones(1), {"s": {1, 2}})
  msg = str(info.value)
  assert "argument args[1]['s'] is a set" in msg and "hashable" in msg and "partial" in msg


def test_non_array_output():
  with pytest.raises(bridge.BridgeTypeError) as info:
    bridge.call_jax(lambda x: {"y": x, "tag": "hello"}, torch.ones(1))
  msg = str(info.value)
  assert "returned a str at output['tag']" in msg and "pytree of arrays" in msg


def test_unsupported_dtype_argument():
  with pytest.raises(bridge.BridgeTypeError, match=r"argument kwargs\['z'\].*complex32"):
    bridge.call_jax(lambda z: z, z=torch.zeros(1, dtype=torch.complex32))


def test_errors_inside_fn_propagate_unchanged():
  def bad(x):
    raise ValueError("boom")

  with pytest.raises(ValueError, match="boom"):
    bridge.call_jax(bad, torch.ones(1))
  with pytest.raises(ValueError, match="boom"):
    bridge.call_jax(bad, torch.ones(1, requires_grad=True))


# --- threads and memory -------------------------------------------------------


def test_threads_calling_at_once_get_their_own_results():
  def f(x, w):
    return jnp.tanh(x @ w)

  w = torch.randn(8, 8)
  errors = []

  def worker(seed):
    try:
      g = torch.Generator().manual_seed(seed)
      for _ in range(50):
        x = torch.randn(4, 8, generator=g).requires_grad_()
        y = bridge.call_jax(f, x, w)
        torch.testing.assert_close(y, torch.tanh(x.detach() @ w))
        y.sum().backward()
        torch.testing.assert_close(x.grad, (1 - torch.tanh(x.detach() @ w) ** 2) @ w.t())
    except Exception as e:  # noqa: BLE001 - collected and re-raised by the test
      errors.append(e)

  threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors, errors


def _rss_bytes() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * 4096


@pytest.mark.slow
def test_no_memory_growth_over_10000_calls():
  x = torch.randn(64, 64, requires_grad=True)

  def f(x):
    return jnp.sum(jnp.sin(x) ** 2)

  for _ in range(500):
    bridge.call_jax(f, x).backward()
  gc.collect()
  before = _rss_bytes()
  for _ in range(10_000):
    bridge.call_jax(f, x).backward()
    bridge.call_jax(f, x.detach())
  gc.collect()
  growth = _rss_bytes() - before
  assert growth < 16 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over 10,000 calls"
  assert len(call_jax_lib._cache) == 1


def test_function_without_tensor_inputs():
  out = bridge.call_jax(lambda n: jnp.arange(n) * 2, 3)
  assert isinstance(out, torch.Tensor) and out.tolist() == [0, 2, 4]


def test_input_that_does_not_reach_the_output_gets_a_zero_gradient():
  x = torch.randn(3, requires_grad=True)
  y = torch.randn(3, requires_grad=True)
  bridge.call_jax(lambda x, y: jnp.sum(x * 2), x, y).backward()
  torch.testing.assert_close(y.grad, torch.zeros(3))
  torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


_ZERO_COPY_SCRIPT = r"""
import resource, torch, jax.numpy as jnp, bridge
t = torch.ones(2**28)  # 1 GiB, resident
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = bridge.call_jax(lambda x: x[::2**20] + 1, t)
assert out.tolist() == [2.0] * 256, out
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base  # KiB
print(grown // 1024)
"""


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_call_jax_does_not_copy_a_large_input(layout):
  import subprocess
  import sys

  script = _ZERO_COPY_SCRIPT
  if layout == "transposed":
    script = script.replace("t = torch.ones(2**28)", "t = torch.ones(2**28).view(2**14, 2**14).t()")
    script = script.replace("x[::2**20]", "x[0, ::2**6]")
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert int(out.stdout.strip()) < 256, f"peak memory grew by {out.stdout.strip()} MiB"


def test_a_torch_view_called_from_traced_jax_code_is_the_jax_function():
  @bridge.torch_view
  def f(x):
    return jnp.sin(x) * 2

  x = jnp.arange(3.0)
  np.testing.assert_allclose(np.asarray(jax.jit(f)(x)), np.sin(np.arange(3.0)) * 2, rtol=1e-6)
  np.testing.assert_allclose(
    np.asarray(jax.grad(lambda a: f(a).sum())(x)), 2 * np.cos(np.arange(3.0)), rtol=1e-6
  )
  out = f(torch.arange(3.0))  # from torch: torch
  assert isinstance(out, torch.Tensor)


def test_a_repeated_one_tensor_call_takes_the_short_route_with_the_same_results(monkeypatch):
  # `call_jax(f, x)` again with one plain CPU tensor goes straight to f's jitted function;
  # whatever that route cannot take (a gradient to record, a 64-bit tensor with JAX's 64-bit
  # types off, a transposed tensor, another output structure) gets the general path's result.
  sorted_calls = []
  real = call_jax_lib._leaves

  def counting(args, kwargs):
    sorted_calls.append(len(args))
    return real(args, kwargs)

  monkeypatch.setattr(call_jax_lib, "_leaves", counting)

  def double(x):
    return x * 2

  def parts(x):
    return {"sum": x.sum(), "rows": [x[0], x[1]]}

  x = torch.randn(3, 4)
  jitted = jax.jit(lambda x: x + 1)
  for _ in range(3):
    torch.testing.assert_close(bridge.call_jax(double, x), x * 2)
    out = bridge.call_jax(parts, x)
    torch.testing.assert_close(out["sum"], x.sum())
    torch.testing.assert_close(out["rows"][1], x[1])
    torch.testing.assert_close(bridge.call_jax(jitted, x), x + 1)
  assert sorted_calls == [1, 1, 1]  # each function's first call only
  torch.testing.assert_close(bridge.call_jax(double, x.t()), x.t() * 2)  # transposed: general
  w = x.clone().requires_grad_(True)
  y = bridge.call_jax(double, w)  # a gradient to record: general, with a backward
  y.sum().backward()
  torch.testing.assert_close(w.grad, torch.full((3, 4), 2.0))
  with torch.no_grad():
    assert not bridge.call_jax(double, w).requires_grad
  n = torch.arange(4)
  with jax.enable_x64(True):
    assert bridge.call_jax(double, n).dtype is torch.int64
  with jax.enable_x64(False), pytest.raises(bridge.BridgeTypeError, match="int64"):
    bridge.call_jax(double, n)
