"""Torch's 64-bit values inside a JAX program built with 64-bit types OFF (JAX's default):
exact, or refused with the bridge's error; never a 32-bit result in disguise.

Such a program cannot hold int64/float64 values. The bridge holds torch's int64 tensors
as int32 arrays only where it proves, while tracing, that every value fits (an index is
below its tensor's size, a sum below its bound...); an op it cannot prove is refused, and
a float64 value is always refused. Each case here computed a wrong number (int32
overflow, float32 rounding) with only a once-per-process warning before.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from bridge import NarrowingError
from bridge._src import dtypes

pytestmark = pytest.mark.skipif(dtypes.x64_enabled(), reason="needs JAX's 64-bit types off")


def _jit(fn, *args):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return jax.block_until_ready(jax.jit(bridge.jax_view(fn))(*args))


# Refused while tracing (`NarrowingError`), or, for a sum or difference whose bound is not
# proven, by the run-time check that fails the program's run (JAX's runtime error).
REFUSED = (NarrowingError, jax.errors.JaxRuntimeError)
INT64 = r"\(int64\) (cannot be computed exactly here|overflows int32)"


X = jnp.arange(6, dtype=jnp.float32)


@pytest.mark.parametrize(
  "fn, want",
  [
    # int32 arithmetic would wrap where torch's int64 does not: refused, not wrong
    (lambda x: torch.arange(6, device=x.device) * 2**30 + x.long() * 0, None),
    (lambda x: x.argmax() + 2**31 - 1, None),
    (lambda x: (x > 0).long().cumsum(0) * 2**29 * 8, None),
    (lambda x: x.long() + 1, None),  # float -> int64 is unbounded: it may not fit in int32
    (lambda x: torch.ones(3, dtype=torch.long, device=x.device).add_(2**31 - 1), None),
    # positions, not the counts' values: up to 1199 here
    (
      lambda x: (
        torch.repeat_interleave(torch.ones(1200, dtype=torch.long, device=x.device)) * 2**22
      ),
      None,
    ),
    # several values added into one place
    (
      lambda x: torch.zeros(1, dtype=torch.long, device=x.device).scatter_add(
        0,
        torch.zeros(4, dtype=torch.long, device=x.device),
        torch.arange(4, device=x.device) * 2**29,
      ),
      None,
    ),
    # proven: positions, counts, small arithmetic on them
    (lambda x: torch.arange(6, device=x.device) + x.argmax() * 4, [20, 21, 22, 23, 24, 25]),
    (lambda x: (x > 2).sum() * 1000 + (x > 0).long().cumsum(0)[-1], [3005]),
    (lambda x: torch.topk(x, 2).indices * 3, [15, 12]),
    (lambda x: torch.unique(x.long() * 0 + torch.arange(6, device=x.device)), None),
  ],
)
def test_int64_is_exact_or_refused(fn, want):
  if want is None:
    with pytest.raises(REFUSED, match=INT64):
      _jit(fn, X)
  else:
    out = _jit(fn, X)
    np.testing.assert_array_equal(np.ravel(out), want)
    assert out.dtype == jnp.int32  # the program's own dtype: the values are exact


def test_an_in_place_write_widens_the_bound():
  def fn(x):
    p = torch.zeros(3, dtype=torch.long, device=x.device)
    p[1] = 2**30  # the tensor's values may now reach 2**30 ...
    return p.add_(2**30)  # ... so this may not fit

  with pytest.raises(REFUSED, match=r"aten\.add.*overflows int32 at flat position 1"):
    _jit(fn, X)


def test_sums_without_a_proven_bound_are_checked_when_the_program_runs():
  # BatchNorm's counter: an int64 buffer (an input of the program, so its value is unknown)
  # plus one. It fits in int32 unless it is 2**31 - 1: each run checks.
  bn = torch.nn.BatchNorm1d(3)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    params, fn = bridge.extract_jax(bn, return_state=True)
    step = jax.jit(fn)
    _, state = step(params, jnp.ones((4, 3)))
    assert int(state["num_batches_tracked"]) == 1
    _, state = step(state, jnp.ones((4, 3)))
    assert int(state["num_batches_tracked"]) == 2
    with jax.enable_x64(True):
      full = dict(state, num_batches_tracked=jnp.asarray(2**31 - 1, jnp.int64))
      huge = dict(state, num_batches_tracked=jnp.asarray(2**40, jnp.int64))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"aten\.add.*overflows int32"):
      jax.block_until_ready(step(full, jnp.ones((4, 3))))
    with pytest.raises(jax.errors.JaxRuntimeError, match="num_batches_tracked.*int32 cannot hold"):
      jax.block_until_ready(step(huge, jnp.ones((4, 3))))


def test_a_view_of_a_tracked_tensor_keeps_its_bound():
  def fn(x):
    p = torch.arange(10, device=x.device)
    return p[2:] * 2**27  # below 10 * 2**27 < 2**31: proven

  np.testing.assert_array_equal(_jit(fn, X), np.arange(2, 10) * 2**27)
  with pytest.raises(NarrowingError, match="values up to"):
    _jit(lambda x: torch.arange(10, device=x.device)[2:] * 2**30, X)


@pytest.mark.parametrize(
  "fn",
  [
    lambda x: x.double() * 3,
    lambda x: (x.double() / 3).float(),  # a 32-bit result, computed through float64
    lambda x: x + torch.tensor([0.1], dtype=torch.float64),
    lambda x: torch.ones(2, dtype=torch.float64, device=x.device),
  ],
)
def test_float64_is_refused(fn):
  with pytest.raises(NarrowingError, match=r"\(float64\) cannot be computed exactly here"):
    _jit(fn, X)


def test_the_error_names_the_op_the_line_and_the_fixes():
  with pytest.raises(NarrowingError) as info:
    _jit(lambda x: x.argmax() * 2**31, X)
  msg = str(info.value)
  assert "aten.mul" in msg and "test_narrowing.py" in msg
  assert "jax_enable_x64" in msg


def test_int32_inputs_keep_torch_int32_semantics():
  # a true int32 tensor wraps in torch too: 5 * 2**30 mod 2**32
  np.testing.assert_array_equal(_jit(lambda i: i * 2**30, jnp.array([5], jnp.int32)), [2**30])
  # an int64 input (JAX keeps it in the program) converted with `.int()` is torch's int32 too
  with jax.enable_x64(True):
    big = jnp.array([5], jnp.int64)
  np.testing.assert_array_equal(_jit(lambda i: i.int() * 2**30, big), [2**30])


def test_callback_mode_checks_int64_outputs_when_it_runs():
  f = lambda t: (t > 0).sum(-1) * 2**20
  out = jax.jit(lambda a: bridge.call_torch(f, a, mode="callback"))(jnp.ones((2, 3)))
  np.testing.assert_array_equal(out, [3 * 2**20] * 2)
  g = lambda t: (t > 0).sum(-1) * 2**40  # int64 on the host; does not fit in int32
  with pytest.raises(Exception, match="which int32 cannot hold"):
    jax.jit(lambda a: bridge.call_torch(g, a, mode="callback"))(
      jnp.ones((2, 3))
    ).block_until_ready()


def test_callback_mode_refuses_float64_outputs():
  with pytest.raises(NarrowingError, match="float64"):
    jax.jit(lambda a: bridge.call_torch(lambda t: t.double(), a, mode="callback"))(X)


def test_64_bit_types_on_keep_everything_exact():
  with jax.enable_x64(True):
    out = jax.jit(bridge.jax_view(lambda x: torch.arange(6, device=x.device) * 2**40))(X)
    assert out.dtype == jnp.int64
    np.testing.assert_array_equal(out, np.arange(6) * 2**40)
