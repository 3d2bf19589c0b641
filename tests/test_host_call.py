"""Callback mode's second host-call path: JAX's own Python callbacks, used where no FFI handler is
registered (GPU for now). Run here on the CPU by making the bridge believe the platform is a GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from bridge._src import ffi
from bridge._src import scope


@pytest.fixture(autouse=True)
def through_python_callbacks(monkeypatch):
  monkeypatch.setattr(ffi, "platform", lambda: "gpu")


X = np.linspace(-1.5, 2.0, 12, dtype=np.float32).reshape(3, 4)


def f(t):
  return torch.sin(t) * t


def test_forward_and_jit_match_torch():
  want = f(torch.tensor(X)).numpy()
  np.testing.assert_allclose(np.asarray(bridge.call_torch(f, jnp.asarray(X), mode="callback")),
                             want, rtol=1e-6)
  got = jax.jit(lambda a: bridge.call_torch(f, a, mode="callback"))(jnp.asarray(X))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


def test_grad_and_per_example_grad_match_torch_autograd():
  t = torch.tensor(X, requires_grad=True)
  f(t).sum().backward()
  grad = jax.jit(jax.grad(lambda a: bridge.call_torch(f, a, mode="callback").sum()))
  np.testing.assert_allclose(np.asarray(grad(jnp.asarray(X))), t.grad.numpy(), rtol=1e-5)
  per_row = jax.vmap(jax.grad(lambda a: bridge.call_torch(f, a, mode="callback").sum()))
  np.testing.assert_allclose(np.asarray(per_row(jnp.asarray(X))), t.grad.numpy(), rtol=1e-5)


def test_bfloat16_and_narrowed_outputs(monkeypatch):
  monkeypatch.setattr(scope, "_warned_narrow", [False])  # (said once per process)
  out = bridge.call_torch(lambda t: t.to(torch.bfloat16) * 3, jnp.asarray(X), mode="callback")
  assert out.dtype == jnp.bfloat16
  want = (torch.tensor(X).to(torch.bfloat16) * 3).float().numpy()
  np.testing.assert_array_equal(np.asarray(out, np.float32), want)
  # inside a program built with 64-bit types off, an int64 result is computed as int32
  with pytest.warns(UserWarning, match="64-bit types disabled"):
    counts = jax.jit(lambda a: bridge.call_torch(lambda t: (t > 0).sum(-1), a,
                                                 mode="callback"))(jnp.asarray(X))
  assert counts.dtype == jnp.int32
  np.testing.assert_array_equal(np.asarray(counts), (X > 0).sum(-1))


def test_module_buffers_update_once_per_call_and_step():
  bn = torch.nn.BatchNorm1d(4)
  jax.jit(lambda a: bridge.call_torch(bn, a, mode="callback"))(jnp.asarray(X)).block_until_ready()
  assert bn.num_batches_tracked.item() == 1
  jax.jit(jax.grad(lambda a: bridge.call_torch(bn, a, mode="callback").sum()))(jnp.asarray(X))
  assert bn.num_batches_tracked.item() == 2


def test_torch_exception_is_raised_as_itself_in_an_eager_call():
  def bad(t):
    raise KeyError("no such feature")
  spec = jax.ShapeDtypeStruct((3, 4), jnp.float32)
  with pytest.raises(KeyError, match="no such feature"):
    bridge.call_torch(bad, jnp.asarray(X), mode="callback", result_shape_dtypes=spec)
  with pytest.raises(jax.errors.JaxRuntimeError, match="KeyError: 'no such feature'"):
    jax.jit(lambda a: bridge.call_torch(bad, a, mode="callback", result_shape_dtypes=spec))(
        jnp.asarray(X)).block_until_ready()
