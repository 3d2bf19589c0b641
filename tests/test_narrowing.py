"""Torch's 64-bit values inside a JAX program built with 64-bit types OFF (JAX's default):
exact, or refused with the bridge's error; never a 32-bit result in disguise.

Such a program cannot hold int64/float64 values. The bridge holds torch's int64 tensors
as int32 arrays only where it proves, while tracing, that every value fits (an index is
below its tensor's size, a sum below its bound...); an op it cannot prove is refused, and
a float64 value is always refused. Each case here computed a wrong number (int32
overflow, float32 rounding) with only a once-per-process warning before.
"""

from __future__ import annotations

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from bridge import NarrowingError
from bridge._src import dtypes
from bridge._src import narrowing

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


def test_the_checks_of_new_traces_of_the_same_op_keep_memory_flat():
  # Each run-time check's error is kept by its id for as long as a program may fail it. A new
  # function traced each time (a fresh `jax.jit` of the same model) reuses its ops' entries
  # instead of adding two per trace for as long as the process lives.
  from bridge._src import ffi

  bn = torch.nn.BatchNorm1d(3)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    params, fn = bridge.extract_jax(bn)
    jax.jit(lambda p, x: fn(p, x))(params, jnp.ones((4, 3)))
    before = len(ffi._CHECKS)
    for _ in range(20):
      jax.jit(lambda p, x: fn(p, x))(params, jnp.ones((4, 3)))
  assert len(ffi._CHECKS) == before


def test_checks_share_an_entry_only_where_their_errors_are_the_same():
  from bridge._src import ffi

  def message(n):
    return lambda value, position: f"index {value} is out of bounds for size {n}"

  assert ffi.check_name("index", "op", message(4)) == ffi.check_name("index", "op", message(4))
  assert ffi.check_name("index", "op", message(4)) != ffi.check_name("index", "op", message(5))
  assert ffi.check_name("index", "op", "text") != ffi.check_name("index", "other op", "text")
  # values that cannot be hashed: by the function's identity
  one, other = (lambda v, p, c=[1]: c), (lambda v, p, c=[1]: c)
  assert ffi.check_name(one) == ffi.check_name(one) != ffi.check_name(other)


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


# --- what is said: only what the caller can see ----------------------------------------------
# Nothing above can give a wrong number, so none of it warns; an int64 tensor the torch code
# returns does reach the caller as int32, which is said once per function (or module class).


def _argmax(x):
  return {"i": x.argmax(), "x": x}


@pytest.mark.parametrize(
  "api, view",
  [
    ("bridge.call_torch", lambda: bridge.jax_view(_argmax)),
    ("bridge.jax_view", lambda: bridge.jax_view(_argmax, mode="callback")),
  ],
  ids=["trace", "callback"],
)
def test_an_int64_output_held_as_int32_is_said_once_per_function(monkeypatch, api, view):
  monkeypatch.setattr(narrowing, "_told", set())
  with pytest.warns(UserWarning) as record:
    out = jax.jit(view())(jnp.array([0.0, 3.0, 1.0]))
  assert out["i"].dtype == jnp.int32 and int(out["i"]) == 1
  (w,) = [r for r in record if "int32" in str(r.message)]
  message = str(w.message)
  assert f"`{api}`: `_argmax` returns an int64 tensor" in message
  assert "output ['i'] (shape (), int64 -> int32)" in message
  assert "jax_enable_x64" in message and ".int()" in message  # the two fixes
  assert "out = jax.jit(view())(" in message  # the user's line, where the warning points too
  assert w.filename == __file__
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    jax.jit(view())(jnp.ones(5))  # another trace of the same function: said already
    jax.jit(lambda a: bridge.call_torch(_argmax, a))(jnp.ones(2))


class _Pick(torch.nn.Module):
  def forward(self, x):
    return x.argmax(-1)


def test_an_int64_output_of_a_module_is_said_once_per_class(monkeypatch):
  monkeypatch.setattr(narrowing, "_told", set())
  with pytest.warns(UserWarning, match=r"`bridge.extract_jax`: `_Pick.forward` returns"):
    params, fn = bridge.extract_jax(_Pick())
    jax.jit(fn)(params, jnp.ones((2, 3)))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    params, fn = bridge.extract_jax(_Pick())  # another instance
    out = jax.jit(fn)(params, jnp.ones((4, 3)))
  assert out.dtype == jnp.int32


def test_batchnorm_training_does_not_warn():
  # Its int64 counter is checked to fit each run, and comes back as new state: internal.
  torch.manual_seed(0)
  bn, ref = torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
  x = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    params, fn = bridge.extract_jax(bn.train(), return_state=True)
    step = jax.jit(fn)
    out, state = step(params, x)
    out, state = step(state, x)
  for _ in range(2):
    expected = ref(torch.from_numpy(x)).detach().numpy()
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(state["running_mean"], ref.running_mean.numpy(), rtol=1e-6)
  np.testing.assert_allclose(state["running_var"], ref.running_var.numpy(), rtol=1e-6)
  assert int(state["num_batches_tracked"]) == 2


@pytest.mark.parametrize("model", ["bert", "gpt2"])
def test_hugging_face_models_do_not_warn(model):
  # Their int64 `position_ids` and `token_type_ids` are positions from `arange`: proven.
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  transformers = pytest.importorskip("transformers")
  transformers.logging.set_verbosity_error()
  torch.manual_seed(0)
  if model == "bert":
    config = transformers.BertConfig(
      vocab_size=100,
      hidden_size=32,
      num_hidden_layers=1,
      num_attention_heads=2,
      intermediate_size=64,
    )
    net = transformers.BertModel(config).eval()
  else:
    config = transformers.GPT2Config(
      n_layer=1, n_head=2, n_embd=32, vocab_size=100, use_cache=False
    )
    net = transformers.GPT2LMHeadModel(config).eval()
  ids = np.random.default_rng(0).integers(0, 100, (2, 5)).astype(np.int32)
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    params, fn = bridge.extract_jax(net)
    out = jax.jit(fn)(params, ids)
  said = [str(w.message) for w in record if "bridge" in str(w.message)]
  assert not said, said
  ref = net(torch.from_numpy(ids).long())
  np.testing.assert_allclose(out[0], ref[0].detach().numpy(), rtol=1e-4, atol=1e-5)
