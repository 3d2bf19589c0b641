"""Random-family lowerings: shapes and dtypes exactly, distributions statistically.

Every distribution check is applied to torch's own CPU sample as well, so each
expected statistic below is shown to be torch's, not just the lowering's.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from tests.ops.harness import _to_jax, check, device_available, lowering_of, run_direct

aten = torch.ops.aten
N = 200_000


@dataclasses.dataclass
class Stats:
  """What a sample must show: moments (within `tol` standard deviations), support, values."""

  mean: float | None = None
  std: float | None = None
  lo: float | None = None  # inclusive bounds of the support
  hi: float | None = None
  integral: bool = False
  median: float | None = None
  iqr: float | None = None
  values: tuple | None = None  # the exact set of values taken (small supports)
  tol: float = 0.02  # relative to the std (or to the iqr)

  def check(self, t: torch.Tensor, who: str) -> None:
    x = t.detach().cpu().double().numpy().reshape(-1)
    if t.is_complex():
      x = t.detach().cpu().to(torch.complex128).numpy().reshape(-1)
    scale = self.std if self.std else 1.0
    if self.mean is not None:
      assert abs(x.mean() - self.mean) < self.tol * scale + 1e-9, (who, x.mean(), self.mean)
    if self.std is not None:
      assert abs(x.std() - self.std) < self.tol * self.std, (who, x.std(), self.std)
    if self.lo is not None:
      assert x.min() >= self.lo, (who, x.min(), self.lo)
    if self.hi is not None:
      assert x.max() <= self.hi, (who, x.max(), self.hi)
    if self.integral:
      assert np.all(x == np.round(x)), who
    if self.median is not None:
      q1, med, q3 = np.quantile(x, [0.25, 0.5, 0.75])
      assert abs(med - self.median) < self.tol * self.iqr, (who, med, self.median)
      assert abs((q3 - q1) - self.iqr) < 2 * self.tol * self.iqr, (who, q3 - q1, self.iqr)
    if self.values is not None:
      assert set(np.unique(x).tolist()) == set(self.values), (who, np.unique(x)[:10])


def z(dtype=torch.float32, n=N):
  return torch.zeros(n, dtype=dtype)


def full(v, dtype=torch.float32, n=N):
  return torch.full((n,), v, dtype=dtype)


def uniform_std(a, b):
  return (b - a) / math.sqrt(12)


def int_uniform(a, b):
  """Discrete uniform on [a, b]."""
  n = b - a + 1
  return Stats(mean=(a + b) / 2, std=math.sqrt((n * n - 1) / 12), lo=a, hi=b, integral=True)


def lognormal(mu, s):
  mean = math.exp(mu + s * s / 2)
  return Stats(mean=mean, std=math.sqrt((math.exp(s * s) - 1) * math.exp(2 * mu + s * s)), lo=0)


P = 0.3
CASES = [
  # (op, args, kwargs, Stats)
  (aten.normal_.default, (z(), 2.0, 3.0), {}, Stats(2.0, 3.0)),
  (aten.normal_.default, (z(torch.float64),), {}, Stats(0.0, 1.0)),
  (aten.normal_.default, (z(torch.bfloat16), -1.0, 0.5), {}, Stats(-1.0, 0.5)),
  (aten.normal_functional.default, (z(), 2.0, 3.0), {}, Stats(2.0, 3.0)),
  (aten.uniform.default, (z(), -2.0, 5.0), {}, Stats(1.5, uniform_std(-2, 5), -2.0, 5.0)),
  (aten.uniform.default, (z(torch.float16),), {}, Stats(0.5, uniform_std(0, 1), 0.0, 1.0)),
  (aten.uniform.default, (z(torch.float64), 3.0, 4.0), {}, Stats(3.5, uniform_std(3, 4), 3, 4)),
  (aten.exponential.default, (z(), 2.0), {}, Stats(0.5, 0.5, lo=0.0)),
  (aten.exponential.default, (z(torch.float64),), {}, Stats(1.0, 1.0, lo=0.0)),
  (aten.geometric.default, (z(), P), {}, Stats(1 / P, math.sqrt(1 - P) / P, lo=1, integral=True)),
  (
    aten.geometric.default,
    (z(torch.int32), 0.8),
    {},
    Stats(1 / 0.8, math.sqrt(0.2) / 0.8, lo=1, integral=True),
  ),
  (aten.log_normal.default, (z(), 0.5, 0.25), {}, lognormal(0.5, 0.25)),
  (
    aten.log_normal.default,
    (z(torch.float64),),
    {},
    dataclasses.replace(
      lognormal(1.0, 2.0),
      mean=None,
      std=None,
      median=math.e,
      iqr=math.e * (math.exp(2 * 0.6745) - math.exp(-2 * 0.6745)),
    ),
  ),
  (aten.cauchy.default, (z(), 1.0, 2.0), {}, Stats(median=1.0, iqr=4.0)),
  (aten.random.default, (z(),), {}, int_uniform(0, 2**24)),
  (aten.random.default, (z(torch.float16),), {}, int_uniform(0, 2**11)),
  (aten.random.default, (z(torch.bfloat16),), {}, int_uniform(0, 2**8)),
  (aten.random.default, (z(torch.int8),), {}, int_uniform(0, 127)),
  (aten.random.default, (z(torch.uint8),), {}, int_uniform(0, 255)),
  (aten.random.default, (z(torch.int32),), {}, int_uniform(0, 2**31 - 1)),
  (aten.random.default, (z(torch.int64),), {}, int_uniform(0, 2**63 - 1)),
  (aten.random.default, (z(torch.bool),), {}, Stats(0.5, 0.5, values=(0.0, 1.0))),
  (aten.random.to, (z(torch.int64), 10), {}, int_uniform(0, 9)),
  (aten.random.to, (z(), 3), {}, dataclasses.replace(int_uniform(0, 2), values=(0, 1, 2))),
  (getattr(aten.random, "from"), (z(torch.int64), -5, 5), {}, int_uniform(-5, 4)),
  (getattr(aten.random, "from"), (z(torch.int16), -3, None), {}, int_uniform(-3, 32767)),
  (getattr(aten.random, "from"), (z(torch.int64), -10, None), {}, int_uniform(-10, 2**63 - 1)),
  (getattr(aten.random, "from"), (z(), 100, None), {}, int_uniform(100, 2**24)),
  (aten.bernoulli.default, (full(0.3),), {}, Stats(0.3, math.sqrt(0.21), values=(0, 1))),
  (
    aten.bernoulli.default,
    (full(0.9, torch.float64),),
    {},
    Stats(0.9, math.sqrt(0.09), values=(0, 1)),
  ),
  (aten.bernoulli.p, (z(), 0.7), {}, Stats(0.7, math.sqrt(0.21), values=(0, 1))),
  (aten.bernoulli.p, (z(torch.int64), 0.5), {}, Stats(0.5, 0.5, values=(0, 1))),
  (aten.bernoulli.Tensor, (z(), full(0.2)), {}, Stats(0.2, 0.4, values=(0, 1))),
  (aten.bernoulli_.float, (z(), 0.25), {}, Stats(0.25, math.sqrt(0.1875), values=(0, 1))),
  (aten.poisson.default, (full(3.5),), {}, Stats(3.5, math.sqrt(3.5), lo=0, integral=True)),
  (
    aten.poisson.default,
    (full(40.0, torch.float64),),
    {},
    Stats(40.0, math.sqrt(40.0), lo=0, integral=True),
  ),
  (aten.normal.Tensor_float, (full(3.0), 0.5), {}, Stats(3.0, 0.5)),
  (aten.normal.Tensor_float, (full(3.0, torch.float64),), {}, Stats(3.0, 1.0)),
  (aten.normal.float_Tensor, (-1.0, full(2.0)), {}, Stats(-1.0, 2.0)),
  (aten.normal.Tensor_Tensor, (full(1.0), full(2.0)), {}, Stats(1.0, 2.0)),
  (aten.normal.float_float, (1.0, 2.0, [N]), {}, Stats(1.0, 2.0)),
  (aten.normal.float_float, (1.0, 2.0, [N]), {"dtype": torch.float64}, Stats(1.0, 2.0)),
  (aten.rand.default, ([N],), {}, Stats(0.5, uniform_std(0, 1), 0.0, 1.0)),
  (
    aten.rand.default,
    ([N // 100, 100],),
    {"dtype": torch.float64},
    Stats(0.5, uniform_std(0, 1), 0.0, 1.0),
  ),
  (aten.randn.default, ([N],), {}, Stats(0.0, 1.0)),
  (aten.randn.default, ([N],), {"dtype": torch.float16}, Stats(0.0, 1.0)),
  (aten.rand_like.default, (z(torch.float64),), {}, Stats(0.5, uniform_std(0, 1), 0.0, 1.0)),
  (aten.randn_like.default, (z(),), {"dtype": torch.float64}, Stats(0.0, 1.0)),
  (aten.randint.default, (10, [N]), {}, int_uniform(0, 9)),
  (aten.randint.default, (10, [N]), {"dtype": torch.float32}, int_uniform(0, 9)),
  (aten.randint.low, (-3, 3, [N]), {}, int_uniform(-3, 2)),
  (aten.randint.low, (-3, 3, [N]), {"dtype": torch.int8}, int_uniform(-3, 2)),
  (aten.randint_like.default, (z(), 7), {}, int_uniform(0, 6)),
  (aten.randint_like.low_dtype, (z(torch.int32), 2, 5), {}, int_uniform(2, 4)),
  (aten.randint_like.Tensor, (z(torch.int64), torch.tensor(6)), {}, int_uniform(0, 5)),
]


def _id(case):
  return str(case[0]).replace("aten.", "")


def sample(op, *args, seed=0, **kwargs):
  """The lowering's output for PRNG key `seed`, as a NumPy array."""
  fn = lowering_of(op).fn
  with jax.enable_x64(True):
    out = fn(
      *_to_jax(list(args)),
      **{k: _to_jax(v) for k, v in kwargs.items()},
      key=jax.random.PRNGKey(seed),
    )
    return jax.tree_util.tree_map(np.asarray, out)


def _on_device(op, args, kwargs):
  args = [a.to("jax") if isinstance(a, torch.Tensor) else a for a in args]
  if not any(isinstance(a, torch.Tensor) for a in args):
    kwargs = dict(kwargs, device="jax")
  return op(*args, **kwargs)


@pytest.mark.parametrize("op,args,kwargs,stats", CASES, ids=[_id(c) for c in CASES])
def test_distribution(op, args, kwargs, stats):
  torch.manual_seed(0)  # torch's sample and the device's key: a fixed draw, never a flaky test
  out, expected = run_direct(op, *args, **kwargs)
  assert out.shape == expected.shape and out.dtype == expected.dtype
  stats.check(expected, "torch")  # the spec is torch's
  stats.check(out, "lowering")
  if device_available():
    dev = _on_device(op, [a.clone() if isinstance(a, torch.Tensor) else a for a in args], kwargs)
    assert dev.device.type == "jax"
    assert dev.shape == expected.shape and dev.dtype == expected.dtype
    stats.check(dev.cpu(), "device")


@pytest.mark.parametrize("op,args,kwargs,stats", CASES, ids=[_id(c) for c in CASES])
def test_keys_give_different_values(op, args, kwargs, stats):
  small = [a[:64] if isinstance(a, torch.Tensor) and a.ndim else a for a in args]
  small = [[64] if isinstance(a, list) else a for a in small]
  a = sample(op, *small, seed=0, **kwargs)
  b = sample(op, *small, seed=1, **kwargs)
  again = sample(op, *small, seed=0, **kwargs)
  np.testing.assert_array_equal(a, again)  # a key decides the values
  assert not np.array_equal(a, b)


def test_complex_normal_splits_variance_like_torch():
  for t, who in [
    (run_direct(aten.normal_.default, z(torch.complex64), 3.0, 2.0)[0], "lowering"),
    (z(torch.complex64).normal_(3.0, 2.0), "torch"),
  ]:
    for part in (t.real, t.imag):
      Stats(3.0, math.sqrt(2.0)).check(part, who)


def test_complex_uniform_both_parts():
  out, expected = run_direct(aten.uniform.default, z(torch.complex64), -1.0, 1.0)
  assert out.dtype == expected.dtype
  for part in (out.real, out.imag, expected.real, expected.imag):
    Stats(0.0, uniform_std(-1, 1), -1.0, 1.0).check(part, "uniform")


@pytest.mark.parametrize("n,dtype", [(1000, None), (257, torch.int32), (1, None), (0, None)])
def test_randperm(n, dtype):
  kwargs = {} if dtype is None else {"dtype": dtype}
  out, expected = run_direct(aten.randperm.default, n, **kwargs)
  assert out.dtype == expected.dtype and out.shape == expected.shape
  assert torch.equal(torch.sort(out).values, torch.arange(n, dtype=out.dtype))
  if n > 10:
    assert not torch.equal(out, torch.arange(n, dtype=out.dtype))
    assert not np.array_equal(
      sample(aten.randperm.default, n, seed=0), sample(aten.randperm.default, n, seed=1)
    )


WEIGHTS = torch.tensor([0.0, 1.0, 2.0, 7.0])


def test_multinomial_with_replacement_frequencies():
  out, expected = run_direct(aten.multinomial.default, WEIGHTS, N, True)
  assert out.dtype == expected.dtype == torch.int64 and out.shape == expected.shape
  for t in (out, expected):
    freq = torch.bincount(t, minlength=4).double() / N
    torch.testing.assert_close(freq, (WEIGHTS / WEIGHTS.sum()).double(), atol=0.01, rtol=0)


def test_multinomial_batched_without_replacement():
  rows = WEIGHTS.repeat(20_000, 1)
  out, expected = run_direct(aten.multinomial.default, rows, 3)
  assert out.shape == expected.shape == (20_000, 3) and out.dtype == expected.dtype
  for t in (out, expected):
    # no repeats within a row, and the zero-weight category is never drawn
    assert torch.equal(torch.sort(t, dim=1).values, torch.tensor([1, 2, 3]).expand(20_000, 3))
    first = torch.bincount(t[:, 0], minlength=4).double() / 20_000
    torch.testing.assert_close(first, (WEIGHTS / WEIGHTS.sum()).double(), atol=0.015, rtol=0)


def test_multinomial_batched_with_replacement():
  rows = torch.tensor([[1.0, 0.0, 3.0], [0.0, 5.0, 5.0]])
  out, expected = run_direct(aten.multinomial.default, rows, N // 10, True)
  assert out.shape == expected.shape == (2, N // 10)
  freq0 = torch.bincount(out[0], minlength=3).double() / (N // 10)
  freq1 = torch.bincount(out[1], minlength=3).double() / (N // 10)
  torch.testing.assert_close(freq0, torch.tensor([0.25, 0.0, 0.75]).double(), atol=0.015, rtol=0)
  torch.testing.assert_close(freq1, torch.tensor([0.0, 0.5, 0.5]).double(), atol=0.015, rtol=0)


@pytest.mark.parametrize(
  "p,train", [(0.2, True), (0.5, None), (0.0, True), (1.0, True), (0.3, False)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_dropout(p, train, dtype):
  x = torch.randn(N, generator=torch.Generator().manual_seed(0)).to(dtype)
  (out, mask), (e_out, e_mask) = run_direct(aten.native_dropout.default, x, p, train)
  assert mask.dtype == e_mask.dtype == torch.bool and out.dtype == e_out.dtype == dtype
  assert out.shape == mask.shape == x.shape
  if train is False:
    assert torch.equal(out, x) and bool(mask.all())
    return
  keep = 1.0 - p
  for o, mk in ((out, mask), (e_out, e_mask)):
    assert abs(mk.double().mean().item() - keep) < 0.01
    scale = 0.0 if keep == 0 else 1.0 / keep
    expected = (x * mk.to(dtype)).float() * scale
    torch.testing.assert_close(o.float(), expected.to(dtype).float())


@pytest.mark.parametrize(
  "dtype", [torch.float32, torch.float16, torch.float64, torch.int32, torch.bool]
)
@pytest.mark.parametrize("scale", [2.5, 1 / 0.3])
def test_native_dropout_backward(dtype, scale):
  g = torch.Generator().manual_seed(1)
  grad = (torch.randn(5, 7, generator=g) * 4).to(dtype)
  mask = torch.rand(5, 7, generator=g) > 0.4
  check(aten.native_dropout_backward.default, grad, mask, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rrelu_eval_is_leaky_relu(dtype):
  x = torch.randn(200, generator=torch.Generator().manual_seed(2)).to(dtype)
  check(aten.rrelu_with_noise_functional.default, x, torch.zeros_like(x), 0.1, 0.3, False)


def test_rrelu_training_slopes_and_noise():
  x = torch.randn(4000, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
  (out, noise), _ = run_direct(
    aten.rrelu_with_noise_functional.default, x, torch.zeros_like(x), 0.1, 0.3, True
  )
  neg = x <= 0
  assert torch.equal(out[~neg], x[~neg]) and bool((noise[~neg] == 1).all())
  slopes = noise[neg]
  assert bool(((slopes >= 0.1) & (slopes <= 0.3)).all())
  assert abs(slopes.mean().item() - 0.2) < 0.01
  torch.testing.assert_close(out[neg], x[neg] * slopes)


def test_reseeding_inside_a_traced_call_leaves_a_concrete_generator():
  """`torch.manual_seed` / `set_rng_state` in torch code traced under `jax.jit` (OpInfo's
  `freeze_rng_state` does both) set the generator to a concrete key: built in the trace, it
  was a tracer that broke every later draw (`UnexpectedTracerError`)."""

  def reseeds(t):
    torch.manual_seed(3)
    torch.jax.set_rng_state(torch.jax.get_rng_state())
    return t * 2

  torch.testing.assert_close(
    bridge.to_torch(jax.jit(lambda a: bridge.call_torch(reseeds, a))(jnp.ones(3))),
    torch.full((3,), 2.0),
  )
  torch.manual_seed(3)
  expected = torch.rand(4, device="jax").cpu()
  torch.manual_seed(3)
  jax.jit(lambda a: bridge.call_torch(reseeds, a))(jnp.ones(4))  # another trace reseeds to 3
  torch.testing.assert_close(torch.rand(4, device="jax").cpu(), expected)


def test_programs_draw_with_the_bridges_cheap_prng_not_threefry():
  """Random ops in a traced program draw their keys and bits from the bridge's PRNG
  (`rng.IMPL`: a keyed hash to split, Philox for bits), not JAX's threefry, whose unrolled
  rounds XLA:CPU compiled slowly at every dropout of a model."""
  from bridge._src import rng

  model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.Dropout(0.2))
  params, fn = bridge.extract_jax(model.train())

  def step(p, x, key):
    with bridge.rng_key(key):
      return fn(p, x)

  text = jax.jit(step).lower(params, jnp.ones((4, 8)), jax.random.PRNGKey(0)).as_text()
  assert "threefry" not in text
  assert text.count("stablehlo.rng_bit_generator") == 2
  # the same key gives the same masks; another key others; a typed JAX key is taken as its data
  a = jax.jit(step)(params, jnp.ones((4, 8)), jax.random.PRNGKey(0))
  b = jax.jit(step)(params, jnp.ones((4, 8)), jax.random.PRNGKey(1))
  c = jax.jit(step)(params, jnp.ones((4, 8)), jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
  assert not np.array_equal(np.asarray(a), np.asarray(b))
  assert jax.random.key_impl(rng.typed(jax.random.PRNGKey(0))) == rng.IMPL


def test_split_keys_are_distinct_and_balanced():
  from bridge._src import rng

  keys = np.asarray(
    jax.random.key_data(jax.random.split(rng.typed(jnp.array([0, 7], jnp.uint32)), 4096))
  )
  assert len({tuple(k) for k in keys.tolist()}) == 4096
  bits = np.unpackbits(keys.view(np.uint8))
  assert abs(bits.mean() - 0.5) < 0.01  # each output bit set half of the time
  folded = jax.random.key_data(jax.random.fold_in(rng.typed(jnp.array([0, 7], jnp.uint32)), 0))
  assert not any(np.array_equal(np.asarray(folded), k) for k in keys)


def test_exponential_tail_ends_where_torchs_does(monkeypatch):
  """A uniform draw of 0 became the smallest float (1e-38) before the log: an outlier of
  87 / lambda that torch never draws (its float32 tail ends at -log(2**-24) = 16.6)."""
  from bridge_ops import random as random_ops

  monkeypatch.setattr(
    random_ops.jax.random, "uniform", lambda key, shape, dtype, *a: jnp.zeros(shape, dtype)
  )
  out = random_ops.exponential(jnp.zeros(3, jnp.float32), 2.0, key=jax.random.PRNGKey(0))
  np.testing.assert_allclose(np.asarray(out), -np.log(2.0**-24) / 2.0, rtol=1e-6)
