"""Callback mode and module state, held to torch's behaviour: an inline program's function
lives while the program runs, torch's own exceptions, `torch.inference_mode()`, concurrent
calls of one module, dataclass outputs with static fields, and state that keeps its dtypes
(a `lax.scan` carry)."""

from __future__ import annotations

import copy
import dataclasses
import gc
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import bridge
from bridge._src import modules


def cb(fn, *args, **kwargs):
  return bridge.call_torch(fn, *args, mode="callback", **kwargs)


# --- an inline program keeps its function until it has run -----------------------------------


def test_an_inline_jitted_program_keeps_its_function_while_it_runs():
  # (the host function was held by the Python executable, which a collected inline jit frees
  # while its program is still queued: "callback mode's torch function no longer exists")
  x = jnp.ones((1500, 1500))
  for _ in range(2):  # (slow enough inputs that the program is still running at `gc.collect`)
    out = jax.jit(lambda a: bridge.call_torch(lambda t: t * 2, (a @ a @ a) / 3e6, mode="callback"))(
      x
    )
    gc.collect()
    np.testing.assert_allclose(np.asarray(out)[0, :3], [1.5, 1.5, 1.5], rtol=1e-5)


# --- torch's own exceptions, not a fake (meta) kernel's ----------------------------------------


def _cross_entropy_float_target(t):
  return torch.nn.functional.cross_entropy(t, torch.zeros(2))


# functions whose fake run raises a meta kernel's message, where torch has its own
_TORCH_ERRORS = [
  pytest.param(lambda t: t @ t, id="matmul"),
  pytest.param(lambda t: t + torch.ones(4), id="broadcast"),
  pytest.param(_cross_entropy_float_target, id="cross_entropy_float_target"),
  pytest.param(lambda t: t.long().add_(1.5), id="inplace_cast"),
]


def _torch_error(fn, *tensors):
  with pytest.raises(Exception) as info:
    fn(*tensors)
  return type(info.value), str(info.value)


@pytest.mark.parametrize("fn", _TORCH_ERRORS)
def test_callback_raises_torchs_own_exception(fn):
  kind, message = _torch_error(fn, torch.ones(2, 3))
  x = jnp.ones((2, 3))
  for call in (lambda a: cb(fn, a), jax.jit(lambda a: cb(fn, a))):
    with pytest.raises(kind) as info:
      call(x)
    assert type(info.value) is kind
    assert str(info.value) == message


def test_a_modules_shape_error_is_torchs_and_leaves_its_state_and_generator_alone():
  torch.manual_seed(0)
  model = torch.nn.Sequential(
    torch.nn.BatchNorm1d(3), torch.nn.Dropout(0.5), torch.nn.Linear(4, 2)
  ).train()
  before = copy.deepcopy(model.state_dict())
  kind, message = _torch_error(copy.deepcopy(model), torch.ones(5, 3))
  assert "mat1 and mat2 shapes cannot be multiplied" in message
  rng = torch.get_rng_state()
  for call in (lambda a: cb(model, a), jax.jit(lambda a: cb(model, a))):
    with pytest.raises(kind) as info:
      call(jnp.ones((5, 3)))
    assert str(info.value) == message
  for name, value in model.state_dict().items():  # the runs that raised changed nothing
    torch.testing.assert_close(value, before[name], rtol=0, atol=0)
  assert torch.equal(torch.get_rng_state(), rng)


def test_a_failure_of_the_fake_run_only_stays_with_its_note():
  def fake_only(t):
    if isinstance(t, FakeTensor):
      raise ValueError("only fake tensors fail")
    return t * 2

  for call in (lambda a: cb(fake_only, a), jax.jit(lambda a: cb(fake_only, a))):
    with pytest.raises(ValueError, match="only fake tensors fail") as info:
      call(jnp.ones(3))
    assert any("result_shape_dtypes" in n for n in getattr(info.value, "__notes__", []))


def test_under_jit_only_an_exception_of_the_same_type_comes_from_the_run_on_zeros():
  """On zeros, an exception of another type may come from the zeros (a singular matrix), not
  from the mistake the fake run found; on the arguments' values (an eager call) it is torch's."""

  def f(t):
    if isinstance(t, FakeTensor):
      raise RuntimeError("the fake run's")
    raise IndexError("the real run's")

  with pytest.raises(RuntimeError, match="the fake run's"):
    jax.jit(lambda a: cb(f, a))(jnp.ones(3))
  with pytest.raises(IndexError, match="the real run's"):
    cb(f, jnp.ones(3))


@torch.library.custom_op("bridge_test_trust::plus", mutates_args=())
def _plus(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
  return a + b


@_plus.register_fake
def _(a, b):  # a fake kernel with a message of its own
  if a.shape != b.shape:
    raise RuntimeError("fake kernel: the shapes differ")
  return torch.empty_like(a)


def test_torchs_exception_from_the_per_op_fallback():
  kind, message = _torch_error(_plus, torch.ones(2, 3), torch.ones(4))
  assert "must match the size of tensor b (4)" in message
  f = lambda a, b: bridge.call_torch(lambda t, u: _plus(t, u) * 2, a, b)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    for call in (f, jax.jit(f)):
      with pytest.raises(kind) as info:
        call(jnp.ones((2, 3)), jnp.ones(4))
      assert str(info.value) == message


# --- torch.inference_mode() -------------------------------------------------------------------


def test_callback_mode_under_inference_mode():
  x = jnp.arange(3.0)
  with torch.inference_mode():
    np.testing.assert_allclose(cb(lambda t: t * 2, x), [0.0, 2.0, 4.0])
    np.testing.assert_allclose(jax.jit(lambda a: cb(lambda t: t * 3, a))(x), [0.0, 3.0, 6.0])

    def writes(t):  # in place: on a copy, the caller's array stays as it is
      t.mul_(2)
      return t + 1

    np.testing.assert_allclose(cb(writes, x), [1.0, 3.0, 5.0])
    np.testing.assert_allclose(jax.jit(lambda a: cb(writes, a))(x), [1.0, 3.0, 5.0])
  np.testing.assert_allclose(x, [0.0, 1.0, 2.0])


def test_a_jax_device_model_with_batchnorm_under_inference_mode():
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).eval()
  x = torch.randn(2, 3, 8, 8)
  with torch.inference_mode():
    expected = model(x)
    on_jax = copy.deepcopy(model).to("jax")
    got = on_jax(x.to("jax")).cpu()
  torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_a_module_in_callback_mode_under_inference_mode():
  bn = torch.nn.BatchNorm1d(4).train()
  ref = copy.deepcopy(bn)
  x = np.random.RandomState(0).randn(6, 4).astype(np.float32)
  with torch.inference_mode():
    out = cb(bn, jnp.asarray(x))
    expected = ref(torch.from_numpy(x.copy()))
  np.testing.assert_allclose(np.asarray(out), expected.numpy(), rtol=1e-5, atol=1e-6)
  torch.testing.assert_close(bn.running_mean, ref.running_mean)
  assert int(bn.num_batches_tracked) == 1


# --- concurrent calls of one module -----------------------------------------------------------


def _threads(work, n=8):
  threads = [threading.Thread(target=work) for _ in range(n)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()


def test_concurrent_calls_of_a_module_count_every_update():
  bn = torch.nn.BatchNorm1d(4)
  ref = copy.deepcopy(bn)
  x = np.random.RandomState(0).randn(6, 4).astype(np.float32)

  def work():
    for _ in range(25):
      bridge.call_torch(bn, jnp.asarray(x))

  _threads(work)
  for _ in range(200):  # torch, the same updates
    ref(torch.from_numpy(x.copy()))
  assert int(bn.num_batches_tracked) == 200
  torch.testing.assert_close(bn.running_mean, ref.running_mean, rtol=1e-5, atol=1e-6)
  torch.testing.assert_close(bn.running_var, ref.running_var, rtol=1e-5, atol=1e-6)


def test_concurrent_calls_of_a_module_and_of_its_submodule():
  model = torch.nn.Sequential(torch.nn.BatchNorm1d(4), torch.nn.ReLU())
  x = jnp.ones((6, 4))

  def whole():
    for _ in range(20):
      bridge.call_torch(model, x)

  def part():
    for _ in range(20):
      bridge.call_torch(model[0], x)

  threads = [threading.Thread(target=w) for w in (whole, part, whole, part)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert int(model[0].num_batches_tracked) == 80


def test_a_held_module_neither_blocks_its_own_thread_nor_tracing(monkeypatch):
  monkeypatch.setattr(modules, "_warned", set())  # (said once per process: an earlier test may)
  bn = torch.nn.BatchNorm1d(4)
  x = jnp.ones((6, 4))
  with modules.state_held(bn):
    bridge.call_torch(bn, x)  # the same thread: the lock is reentrant
  assert int(bn.num_batches_tracked) == 1

  held, release = threading.Event(), threading.Event()

  def holder():
    with modules.state_held(bn):
      held.set()
      release.wait(30)

  thread = threading.Thread(target=holder)
  thread.start()
  held.wait(30)
  try:
    with pytest.warns(UserWarning, match="not written back"):
      out = jax.jit(lambda a: bridge.call_torch(bn, a))(x * 2)  # staged: takes no lock
    assert out.shape == (6, 4)
  finally:
    release.set()
    thread.join()


# --- dataclass outputs: fields that hold no tensor are static --------------------------------


@dataclasses.dataclass
class _Named:
  value: torch.Tensor
  name: str = "x"


@dataclasses.dataclass(frozen=True)
class _Frozen:
  value: torch.Tensor
  scale: float = 2.0
  extra: torch.Tensor | None = None


@dataclasses.dataclass
class _Outer:
  inner: _Named
  count: int


def test_a_dataclass_with_a_static_field_leaves_jit():
  x = jnp.ones(2)
  out = jax.jit(lambda a: bridge.call_torch(lambda t: _Named(t * 2, "doubled"), a))(x)
  assert isinstance(out, _Named) and out.name == "doubled"
  np.testing.assert_array_equal(out.value, [2.0, 2.0])
  assert jax.tree_util.tree_leaves(out) == [out.value]
  out = jax.jit(lambda a: cb(lambda t: _Named(t * 3), a))(x)  # callback mode too
  assert out.name == "x"
  np.testing.assert_array_equal(out.value, [3.0, 3.0])
  # and back in, as an input
  total = jax.jit(lambda o: bridge.call_torch(lambda o: o.value.sum() * len(o.name), o))(out)
  assert float(total) == 6.0


def test_a_dataclass_field_holding_a_tensor_in_one_call_and_none_in_another():
  def f(t, with_extra):
    return _Frozen(t + 1, 3.0, t * 2 if with_extra else None)

  for with_extra in (False, True, False):
    out = jax.jit(lambda a: bridge.call_torch(f, a, with_extra))(jnp.arange(3.0))
    assert isinstance(out, _Frozen) and type(out.scale) is float and out.scale == 3.0
    np.testing.assert_array_equal(out.value, [1.0, 2.0, 3.0])
    if with_extra:
      np.testing.assert_array_equal(out.extra, [0.0, 2.0, 4.0])
    else:
      assert out.extra is None
    # a tree of other leaves keeps the structure (`in_axes`, `tree.map` of two trees)
    zeros = jax.tree.map(jnp.zeros_like, out)
    assert jax.tree.structure(zeros) == jax.tree.structure(out)
    assert jax.tree.structure(jax.tree.map(lambda a: 0, out)) == jax.tree.structure(out)
    jax.tree.map(lambda a, b: a + b, out, zeros)


def test_a_nested_dataclass_output():
  out = jax.jit(lambda a: bridge.call_torch(lambda t: _Outer(_Named(t, "in"), 4), a))(jnp.ones(2))
  assert isinstance(out.inner, _Named) and out.inner.name == "in" and out.count == 4
  assert len(jax.tree_util.tree_leaves(out)) == 1


# --- extract_jax's state keeps its dtypes ----------------------------------------------------


@pytest.mark.parametrize("mode", ["trace", "callback"])
def test_state_in_a_scan_trains_like_torch(mode):
  assert not jax.config.jax_enable_x64  # (the case: a 32-bit program, int64 state)
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
  ref = copy.deepcopy(model)
  params, fn = bridge.extract_jax(model, return_state=True, mode=mode)
  assert params["1.num_batches_tracked"].dtype == jnp.int64
  trainable = {n for n, _ in model.named_parameters()}
  train = {k: v for k, v in params.items() if k in trainable}
  state = {k: v for k, v in params.items() if k not in trainable}
  xs = np.random.RandomState(0).randn(5, 8, 4).astype(np.float32)

  def loss(train, state, x):
    out, new = fn({**train, **state}, x)
    return (out**2).mean() + out[:, 0].sum(), {k: new[k] for k in state}

  def step(carry, x):
    train, state = carry
    grads, state = jax.grad(loss, has_aux=True)(train, state, x)
    return (jax.tree.map(lambda p, g: p - 0.1 * g, train, grads), state), None

  (train, state), _ = jax.jit(lambda c, xs: jax.lax.scan(step, c, xs))(
    (train, state), jnp.asarray(xs)
  )
  assert {k: v.dtype for k, v in state.items()} == {k: params[k].dtype for k in state}
  # and as a fori_loop carry
  jax.jit(
    lambda s: jax.lax.fori_loop(0, 2, lambda i, s: fn({**train, **s}, jnp.asarray(xs[0]))[1], s)
  )({**train, **state})

  opt = torch.optim.SGD(ref.parameters(), lr=0.1)
  for x in xs:
    opt.zero_grad()
    out = ref(torch.from_numpy(x.copy()))
    ((out**2).mean() + out[:, 0].sum()).backward()
    opt.step()
  for name, expected in ref.state_dict().items():
    got = {**train, **state}[name]
    np.testing.assert_allclose(np.asarray(got), expected.numpy(), rtol=1e-5, atol=1e-5)
