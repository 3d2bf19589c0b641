"""torch and JAX on one CUDA GPU: transfers and their stream order, Pallas (Triton) kernels called
from torch, torch called from JAX (traced and in callback mode), the `jax` device and
`bridge.compile` on a GPU-backed JAX, and the two sharing the GPU's memory.

Skipped without a CUDA GPU in both torch and JAX (tests/gpu/conftest.py); run on a GPU machine
by `tests/gpu/run_on_gpu.sh`.
"""

from __future__ import annotations

import copy

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge

CUDA = torch.device("cuda", 0)
# GPUs sum in other orders than the CPU, and may use TF32 in matmuls: compare to ~1e-3.
TOL = dict(rtol=2e-3, atol=2e-3)


def _on_gpu(a: jax.Array) -> bool:
  return all(d.platform == "gpu" for d in a.devices())


def _spin(ms: float = 50.0) -> None:
  """Keep torch's current stream busy for about `ms` milliseconds (a GPU-side sleep)."""
  torch.cuda._sleep(int(ms * 1e-3 * 1.5e9))  # (cycles; ~1.5 GHz)


def _cuda_backward() -> None:
  w = torch.randn(16, 16, device=CUDA, requires_grad=True)
  (torch.tanh(w @ w) * 2).sum().backward()
  assert w.grad is not None and w.grad.device.type == "cuda"


def test_importing_bridge_leaves_cuda_torchs_accelerator():
  # a named PrivateUse1 backend would take its place, and break every CUDA backward
  # (pytorch/pytorch#161129): bridge leaves its backend unnamed here (bridge._src.device)
  assert torch.accelerator.current_accelerator().type == "cuda"
  assert not hasattr(torch, "jax")
  _cuda_backward()


# --- transfers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 1000, 1 << 18, 1 << 24])
def test_torch_cuda_to_jax_is_zero_copy_and_aliased(n):
  t = torch.arange(n, device=CUDA, dtype=torch.float32)
  a = bridge.to_jax(t)
  assert _on_gpu(a) and a.shape == (n,) and a.dtype == jnp.float32
  assert a.unsafe_buffer_pointer() == t.data_ptr()
  t[0] = 42.0  # the same memory: JAX reads torch's write
  torch.cuda.synchronize()
  assert float(a[0]) == 42.0
  np.testing.assert_array_equal(np.asarray(a[1:5]), np.arange(1, min(n, 5), dtype=np.float32))


@pytest.mark.parametrize("n", [1, 1000, 1 << 18, 1 << 24])
def test_jax_gpu_to_torch_is_zero_copy_and_aliased(n):
  a = jnp.arange(n, dtype=jnp.float32)
  assert _on_gpu(a)
  t = bridge.to_torch(a)
  assert t.device.type == "cuda" and t.dtype == torch.float32 and t.shape == (n,)
  assert t.data_ptr() == a.unsafe_buffer_pointer()
  torch.testing.assert_close(t, torch.arange(n, device=t.device, dtype=torch.float32))


def test_transfers_take_the_direct_dlpack_import_on_cuda():
  from bridge._src import transfer

  assert transfer._cuda_target(0) is not None  # JAX's device, its stream, torch's handle on it
  t = torch.zeros(1 << 22, device=CUDA)  # on torch's default stream: JAX's reads wait for it
  _spin()
  t.fill_(5.0)
  a = bridge.to_jax(t)
  assert a.unsafe_buffer_pointer() == t.data_ptr()
  assert float(jnp.sum(a)) == 5.0 * (1 << 22)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8])
def test_an_offset_view_crosses_with_the_right_values(dtype):
  """A view starting a few bytes into its storage: XLA on a GPU takes such a pointer and then
  fails every program reading it, so it is copied (or refused with copy=False); a view at a
  16-byte offset is shared."""
  base = torch.arange(1040, device=CUDA).to(dtype)
  t = base[1:]
  a = bridge.to_jax(t)
  assert a.unsafe_buffer_pointer() != t.data_ptr()
  np.testing.assert_array_equal(np.asarray(a * 2), 2 * np.arange(1, 1040).astype(a.dtype))
  with pytest.raises(bridge.TransferError, match="not 16-byte aligned"):
    bridge.to_jax(t, copy=False)
  step = 16 // base.element_size()
  shared = bridge.to_jax(base[step:], copy=False)
  assert shared.unsafe_buffer_pointer() == base[step:].data_ptr()
  np.testing.assert_array_equal(np.asarray(shared * 2), 2 * np.arange(step, 1040).astype(a.dtype))


def test_copies_both_ways_are_copies():
  t = torch.arange(1000, device=CUDA, dtype=torch.float32)
  a = bridge.to_jax(t, copy=True)
  assert _on_gpu(a) and a.unsafe_buffer_pointer() != t.data_ptr()
  t.zero_()
  torch.cuda.synchronize()
  np.testing.assert_array_equal(np.asarray(a), np.arange(1000, dtype=np.float32))
  b = jnp.arange(1000, dtype=jnp.float32)
  back = bridge.to_torch(b, copy=True)
  assert back.device.type == "cuda" and back.data_ptr() != b.unsafe_buffer_pointer()
  torch.testing.assert_close(back, torch.arange(1000, device=CUDA, dtype=torch.float32))


def test_bfloat16_and_int8_cross_both_ways():
  for dtype in (torch.bfloat16, torch.int8, torch.bool, torch.complex64):
    t = torch.ones(7, 3, device=CUDA).to(dtype)
    a = bridge.to_jax(t)
    assert _on_gpu(a) and a.dtype == bridge.to_jax(t.cpu()).dtype
    back = bridge.to_torch(a)
    assert back.device.type == "cuda" and back.dtype == dtype
    torch.testing.assert_close(back, t)


def test_torch_write_on_a_side_stream_is_seen_by_jax_without_a_synchronize():
  side = torch.cuda.Stream()
  n = 1 << 22
  with torch.cuda.stream(side):
    t = torch.zeros(n, device=CUDA)
    _spin()  # the write below runs only after this long kernel
    t.fill_(3.0)
    a = bridge.to_jax(t)  # JAX's reads must wait for the side stream
  assert float(jnp.sum(a)) == 3.0 * n
  torch.cuda.synchronize()


def test_threads_writing_on_their_own_streams_are_each_waited_for():
  # each import waits on an event recorded on its own thread's stream: one thread's record may
  # not stand in for another's (a slow write on one stream, a fast one on the other)
  import threading

  n, rounds = 1 << 20, 6
  errors: list[BaseException] = []
  barrier = threading.Barrier(2)

  def work(slow: bool, value: float) -> None:
    try:
      side = torch.cuda.Stream()
      for _ in range(rounds):
        with torch.cuda.stream(side):
          t = torch.zeros(n, device=CUDA)
          barrier.wait()
          if slow:
            _spin(20)
          t.fill_(value)
          a = bridge.to_jax(t)
        assert float(jnp.sum(a)) == value * n
        torch.cuda.synchronize()
    except BaseException as e:  # noqa: BLE001 - reported by the main thread
      errors.append(e)
      barrier.abort()

  threads = [threading.Thread(target=work, args=(i == 0, 2.0 + i)) for i in range(2)]
  for th in threads:
    th.start()
  for th in threads:
    th.join(60)
  assert not errors, errors


def test_jax_result_read_by_torch_on_a_side_stream_without_a_synchronize():
  x = jnp.full((2048, 2048), 1.0 / 2048, jnp.float32)
  y = x
  for _ in range(20):  # tens of milliseconds of queued GPU work
    y = jnp.tanh(y @ x) + 1.0
  want = np.asarray(y)  # (the same program again, below, still queued)
  y = x
  for _ in range(20):
    y = jnp.tanh(y @ x) + 1.0
  side = torch.cuda.Stream()
  with torch.cuda.stream(side):
    t = bridge.to_torch(y)
    got = (t * 2).cpu()
  np.testing.assert_allclose(got.numpy(), 2 * want, rtol=1e-6)


def test_call_jax_inputs_written_on_a_side_stream_and_outputs_read_there():
  side = torch.cuda.Stream()
  with torch.cuda.stream(side):
    x = torch.zeros(1 << 20, device=CUDA)
    _spin()
    x.fill_(2.0)
    y = bridge.call_jax(lambda a: a * 3 + 1, x)
    assert y.device.type == "cuda"
    total = y.sum()
  torch.cuda.synchronize()
  assert float(total) == 7.0 * (1 << 20)


# --- Pallas on Triton, called from torch ----------------------------------------------------------


def _softmax_kernel(x_ref, o_ref):
  x = x_ref[...]
  e = jnp.exp(x - x.max(axis=-1, keepdims=True))
  o_ref[...] = e / e.sum(axis=-1, keepdims=True)


def _pallas_softmax(x):
  from jax.experimental import pallas as pl

  rows, cols = x.shape
  block = (16, cols)
  return pl.pallas_call(
    _softmax_kernel,
    out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    grid=(rows // 16,),
    in_specs=[pl.BlockSpec(block, lambda i: (i, 0))],
    out_specs=pl.BlockSpec(block, lambda i: (i, 0)),
    interpret=False,
  )(x)


@jax.custom_vjp
def softmax(x):
  return _pallas_softmax(x)


def _softmax_fwd(x):
  y = _pallas_softmax(x)
  return y, y


def _softmax_bwd(y, g):
  return (y * (g - jnp.sum(g * y, axis=-1, keepdims=True)),)


softmax.defvjp(_softmax_fwd, _softmax_bwd)


def test_pallas_kernel_with_custom_vjp_in_a_torch_training_step():
  torch.manual_seed(0)
  lin = torch.nn.Linear(128, 128).to(CUDA)
  ref = torch.nn.Linear(128, 128).to(CUDA)
  ref.load_state_dict(lin.state_dict())
  x = torch.randn(64, 128, device=CUDA)
  target = torch.softmax(torch.randn(64, 128, device=CUDA), -1)
  opt = torch.optim.SGD(lin.parameters(), lr=0.5)
  opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5)
  for _ in range(3):
    for model, o, sm in (
      (lin, opt, lambda h: bridge.call_jax(softmax, h)),
      (ref, opt_ref, lambda h: torch.softmax(h, -1)),
    ):
      o.zero_grad()
      out = sm(model(x))
      assert out.device.type == "cuda"
      loss = ((out - target) ** 2).sum()
      loss.backward()
      o.step()
    torch.testing.assert_close(lin.weight.grad, ref.weight.grad, **TOL)
  torch.testing.assert_close(lin.weight, ref.weight, **TOL)


def test_pallas_kernel_is_compiled_for_the_gpu_not_interpreted():
  x = jnp.ones((64, 128), jnp.float32)
  text = jax.jit(_pallas_softmax).lower(x).as_text()
  assert "triton" in text.lower() or "__gpu$xla.gpu.triton" in text


# --- torch called from JAX -------------------------------------------------------------------------


def _mlp(x, w1, w2):
  return torch.tanh(x @ w1) @ w2


def test_call_torch_under_jit_and_grad_on_gpu_arrays():
  rng = np.random.default_rng(0)
  x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((16, 32), (32, 64), (64, 8)))
  xs = [jnp.asarray(v) for v in (x, w1, w2)]
  assert all(_on_gpu(v) for v in xs)
  f = jax.jit(lambda *a: bridge.call_torch(_mlp, *a))
  out = f(*xs)
  assert _on_gpu(out)
  ts = [torch.tensor(v, device=CUDA, requires_grad=True) for v in (x, w1, w2)]
  want = _mlp(*ts)
  np.testing.assert_allclose(np.asarray(out), want.detach().cpu().numpy(), **TOL)
  grads = jax.jit(jax.grad(lambda *a: bridge.call_torch(_mlp, *a).sum(), argnums=(0, 1, 2)))(*xs)
  want.sum().backward()
  for g, t in zip(grads, ts):
    assert _on_gpu(g)
    np.testing.assert_allclose(np.asarray(g), t.grad.cpu().numpy(), **TOL)


def test_callback_mode_runs_torch_on_the_gpu_on_xlas_stream_with_gradients():
  seen = []

  def f(x, w):
    seen.append((x.device.type, torch.cuda.current_stream(x.device).cuda_stream))
    return torch.sin(x @ w) * 2

  rng = np.random.default_rng(1)
  x, w = (rng.standard_normal(s).astype(np.float32) for s in ((8, 16), (16, 4)))
  loss = jax.jit(
    jax.value_and_grad(
      lambda a, b: bridge.call_torch(f, a, b, mode="callback").sum(), argnums=(0, 1)
    )
  )
  value, (gx, gw) = loss(jnp.asarray(x), jnp.asarray(w))
  tx, tw = (torch.tensor(v, device=CUDA, requires_grad=True) for v in (x, w))
  want = (torch.sin(tx @ tw) * 2).sum()
  want.backward()
  np.testing.assert_allclose(float(value), float(want), **TOL)
  np.testing.assert_allclose(np.asarray(gx), tx.grad.cpu().numpy(), **TOL)
  np.testing.assert_allclose(np.asarray(gw), tw.grad.cpu().numpy(), **TOL)
  assert seen and all(device == "cuda" for device, _ in seen), seen
  # torch ran on XLA's stream, not on torch's default stream
  default = torch.cuda.default_stream(CUDA).cuda_stream
  assert all(stream != default for _, stream in seen[1:]), (seen, default)


def test_callback_mode_module_on_the_gpu_updates_its_buffers():
  bn = torch.nn.BatchNorm1d(6).to(CUDA)
  x = np.random.default_rng(2).standard_normal((32, 6)).astype(np.float32)
  out = jax.jit(lambda a: bridge.call_torch(bn, a, mode="callback"))(jnp.asarray(x))
  assert _on_gpu(out)
  ref = torch.nn.BatchNorm1d(6).to(CUDA)
  want = ref(torch.tensor(x, device=CUDA))
  np.testing.assert_allclose(np.asarray(out), want.detach().cpu().numpy(), **TOL)
  torch.testing.assert_close(bn.running_mean, ref.running_mean, **TOL)
  assert bn.num_batches_tracked.item() == 1


def test_callback_mode_under_vmap_without_jit_runs_torch_on_the_gpu_now():
  """An eager `jax.vmap` runs the host function now, on CUDA tensors of the GPU arrays, with
  no program compiled per function; the results are GPU arrays."""
  seen = []

  def make(k):
    def f(t):
      seen.append((t.device.type, tuple(t.shape)))
      return torch.cumsum(t, -1) * k

    return f

  x = np.random.default_rng(3).standard_normal((5, 7)).astype(np.float32)
  for method in ("sequential", "expand_dims"):
    for k in (2.0, 3.0):
      call = lambda a, f=make(k), m=method: bridge.call_torch(f, a, mode="callback", vmap_method=m)
      out = jax.vmap(call)(jnp.asarray(x))
      assert _on_gpu(out) and out.shape == (5, 7) and out.dtype == jnp.float32
      np.testing.assert_allclose(np.asarray(out), np.cumsum(x, -1) * k, **TOL)
  assert ("cuda", (7,)) in seen and ("cuda", (5, 7)) in seen, seen
  assert all(device == "cuda" for device, _ in seen), seen


def test_callback_mode_torch_exception_is_reraised():
  def bad(t):
    raise KeyError("no such feature")

  spec = jax.ShapeDtypeStruct((3,), jnp.float32)
  with pytest.raises(jax.errors.JaxRuntimeError, match="KeyError: 'no such feature'"):
    jax.jit(lambda a: bridge.call_torch(bad, a, mode="callback", result_shape_dtypes=spec))(
      jnp.ones(3)
    ).block_until_ready()


def test_extract_jax_of_a_cuda_module_trains_in_jax_on_the_gpu():
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
  model = model.to(CUDA)
  params, fn = bridge.extract_jax(model)
  assert all(_on_gpu(p) for p in params.values())
  x = np.random.default_rng(3).standard_normal((10, 8)).astype(np.float32)
  loss = lambda p, a: jnp.mean(fn(p, a) ** 2)
  grads = jax.jit(jax.grad(loss))(params, jnp.asarray(x))
  tx = torch.tensor(x, device=CUDA)
  (model(tx) ** 2).mean().backward()
  for name, p in model.named_parameters():
    np.testing.assert_allclose(np.asarray(grads[name]), p.grad.cpu().numpy(), **TOL)


# --- the jax device and bridge.compile on a GPU-backed JAX ------------------------------------------


_JAX_DEVICE_LOOP = """
import warnings
import torch
import bridge
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter("always")
  bridge.register_jax_device()  # named on a CUDA machine only when asked, with a warning
assert [type(w.message) for w in caught] == [bridge.CudaAutogradWarning], caught
assert torch.accelerator.current_accelerator().type == "jax"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
ref.load_state_dict(model.state_dict())
model = model.to("jax")
assert all(d.platform == "gpu" for p in model.parameters() for d in bridge.jax_view(p).devices())
x, y = torch.randn(32, 8), torch.randn(32, 1)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-2)
for _ in range(5):
  for m, o, xx, yy in ((model, opt, x.to("jax"), y.to("jax")), (ref, opt_ref, x, y)):
    o.zero_grad()
    loss = ((m(xx) - yy) ** 2).mean()
    loss.backward()
    o.step()
for p, q in zip(model.parameters(), ref.parameters()):
  torch.testing.assert_close(p.cpu(), q, rtol=2e-3, atol=2e-3)
# a 0-dim CPU tensor beside jax tensors (torch allows it): placed with them
torch.testing.assert_close((x.to("jax") * torch.tensor(2.0)).cpu(), x * 2)
print("ok")
"""


def test_jax_device_optimizer_loop_on_the_gpu():
  # (in a process of its own: naming the device there breaks CUDA backward passes)
  out = subprocess.run(
    [sys.executable, "-c", _JAX_DEVICE_LOOP], capture_output=True, text=True, timeout=300
  )
  assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-4000:]


def test_bridge_compile_with_cuda_tensors_in_and_out():
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
  model = model.to(CUDA)
  x = torch.randn(5, 8, device=CUDA, requires_grad=True)
  compiled = bridge.compile(model)
  out = compiled(x)
  assert out.device.type == "cuda"
  want = model(x)
  torch.testing.assert_close(out, want, **TOL)
  out.sum().backward()
  gx = x.grad.clone()
  x.grad = None
  want.sum().backward()
  torch.testing.assert_close(gx, x.grad, **TOL)


def test_bridge_compile_shortcut_on_cuda_tensors_follows_new_inputs_and_parameters():
  # the second plain call records the shortcut (CUDA tensors straight to the executable);
  # new values, parameters changed in place, views and other shapes stay right
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
  model = model.to(CUDA)
  compiled = bridge.compile(model)
  two = bridge.compile(lambda a, b: (a @ b, (a * 2).sum(0)))
  side = torch.cuda.Stream()
  with torch.no_grad():
    for step in range(4):
      x = torch.randn(5, 8, device=CUDA)
      torch.testing.assert_close(compiled(x), model(x), **TOL)
      if step == 1:
        assert compiled._fast is not None  # the shortcut is what runs from here on
      model[0].weight.mul_(0.5)  # in place: the next call must see it
      with torch.cuda.stream(side):  # written on another stream, then read by the program
        y = torch.zeros(5, 8, device=CUDA)
        _spin(20)
        y.add_(x)
        got = compiled(y)
      side.synchronize()
      torch.testing.assert_close(got, model(x), **TOL)
    strided = torch.randn(5, 7, 8, device=CUDA)[:, 3]  # the recorded shape, not dense
    torch.testing.assert_close(compiled(strided), model(strided), **TOL)
    unaligned = torch.randn(41, device=CUDA)[1:].view(5, 8)  # 4 bytes past an alignment
    torch.testing.assert_close(compiled(unaligned), model(unaligned), **TOL)
    torch.testing.assert_close(compiled(x[:3]), model(x[:3]), **TOL)
    a, b = torch.randn(4, 8, device=CUDA), torch.randn(8, 3, device=CUDA)
    for _ in range(3):
      got_mm, got_sum = two(a, b)
      torch.testing.assert_close(got_mm, a @ b, **TOL)
      torch.testing.assert_close(got_sum, (a * 2).sum(0), **TOL)
      a.add_(1.0)


def test_torch_compile_backend_jax_with_cuda_tensors():
  from torch._dynamo import list_backends

  if "jax" not in list_backends():
    pytest.skip("torch.compile(backend='jax') is not registered yet")
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
  model = model.to(CUDA)
  eager = copy.deepcopy(model)
  x = torch.randn(3, 8, device=CUDA)
  compiled = torch.compile(model, backend="jax")
  out = compiled(x)
  assert out.device.type == "cuda"
  torch.testing.assert_close(out, eager(x), **TOL)
  out.pow(2).sum().backward()  # the backward graph, on the GPU too
  eager(x).pow(2).sum().backward()
  for p, q in zip(model.parameters(), eager.parameters()):
    assert p.grad.device.type == "cuda"
    torch.testing.assert_close(p.grad, q.grad, **TOL)


def test_torch_compile_backend_jax_random_ops_draw_from_the_cuda_generator():
  # dropout on CUDA inputs keys its program from the CUDA generator's seed and offset
  # (`rng.from_torch_generator`): torch.cuda.set_rng_state replays it, each call moves it
  def f(x):
    return torch.nn.functional.dropout(x, 0.5, training=True) + torch.rand_like(x)

  g = torch.compile(f, backend="jax")
  x = torch.randn(1000, device=CUDA)
  torch.cuda.manual_seed(0)
  g(x)
  state = torch.cuda.get_rng_state()
  a = g(x)
  assert a.device.type == "cuda"
  assert not torch.equal(torch.cuda.get_rng_state(), state)
  assert not torch.equal(g(x), a)
  torch.cuda.set_rng_state(state)
  torch.testing.assert_close(g(x), a)


def test_bridge_compile_reads_an_unaligned_cuda_parameter_after_a_write_through_data():
  # a CUDA view at an odd offset is imported as a copy (XLA on a GPU needs 16-byte alignment);
  # that copy was kept while the version counter stood still, which `.data` writes leave
  # still: it is now imported on every call
  base = torch.randn(17, device=CUDA)
  lin = torch.nn.Linear(4, 4, bias=False).to(CUDA)
  lin.weight = torch.nn.Parameter(base[1:].view(4, 4))
  assert lin.weight.data_ptr() % 16
  x = torch.randn(2, 4, device=CUDA)
  compiled = bridge.compile(lin)
  with torch.no_grad():
    torch.testing.assert_close(compiled(x), lin(x), **TOL)
    lin.weight.data.mul_(0.5)
    torch.testing.assert_close(compiled(x), lin(x), **TOL)
    base.add_(1.0)  # through the buffer the view shares
    torch.testing.assert_close(compiled(x), lin(x), **TOL)


def test_torch_compile_backend_jax_runs_torch_cond_and_flex_attention_on_cuda():
  """Higher-order operators with CUDA tensors: `torch.cond` (both directions of the gradient)
  and `flex_attention` forward and backward (torch allows its backward on CUDA only)."""
  from torch.nn.attention.flex_attention import flex_attention

  def gate(x, w):
    return torch.cond(x.sum() > 0, lambda t: (t @ w).tanh(), lambda t: t * 0.5, (x,))

  w = torch.randn(4, 4, device=CUDA)
  for sign in (1.0, -1.0):
    x = (torch.rand(3, 4, device=CUDA) * sign).requires_grad_()
    got = torch.compile(gate, backend="jax")(x, w)
    assert got.device.type == "cuda"
    (gx,) = torch.autograd.grad(got.sum(), x)
    want = gate(x, w)
    (wx,) = torch.autograd.grad(want.sum(), x)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(gx, wx, **TOL)

  def attend(q, k, v):
    return flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s + (qi - ki) * 0.01)

  q, k, v = (torch.randn(2, 2, 64, 16, device=CUDA, requires_grad=True) for _ in range(3))
  got = torch.compile(attend, backend="jax")(q, k, v)
  grads = torch.autograd.grad(got.pow(2).sum(), (q, k, v))
  want = torch.compile(attend, backend="eager")(q, k, v)
  wants = torch.autograd.grad(want.pow(2).sum(), (q, k, v))
  torch.testing.assert_close(got, want, **TOL)
  for g, w_ in zip(grads, wants):
    torch.testing.assert_close(g, w_, **TOL)


# --- memory -----------------------------------------------------------------------------------------


_PROBE = """
import os, sys
import torch
import bridge, jax, jax.numpy as jnp
x = jnp.ones((1024, 1024)); x.block_until_ready()
free, total = torch.cuda.mem_get_info()
print(os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"), free / total)
"""


def _probe(**env: str) -> tuple[str, float]:
  run_env = {k: v for k, v in os.environ.items() if k != "XLA_PYTHON_CLIENT_PREALLOCATE"}
  run_env.update(env)
  out = subprocess.run(
    [sys.executable, "-c", _PROBE], env=run_env, capture_output=True, text=True, timeout=300
  )
  assert out.returncode == 0, out.stderr[-3000:]
  setting, free = out.stdout.split()
  return setting, float(free)


def test_jax_does_not_take_most_of_the_gpu_unless_the_user_asks():
  setting, free = _probe()
  assert setting == "false"
  assert free > 0.5, f"JAX left only {free:.0%} of the GPU's memory free"
  setting, free = _probe(XLA_PYTHON_CLIENT_PREALLOCATE="true")  # the user's choice is kept
  assert setting == "true"
  assert free < 0.5, f"{free:.0%} free: the user's preallocation was not kept"


def test_zz_cuda_backward_still_works_after_everything_above():
  assert torch.accelerator.current_accelerator().type == "cuda"
  _cuda_backward()
