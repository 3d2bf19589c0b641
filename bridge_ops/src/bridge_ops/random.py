"""Random family: sampling ops, registered with `random=True` (each call gets a fresh `key`).

The values come from JAX's generator, not torch's, so they match torch's
distributions, shapes and dtypes but not its bits. Ops that exist only in a
mutating form (`normal_`, `bernoulli_.float`) are registered directly and return
the new value of `self`; the others register their functional overload
(`uniform`, `random`, `exponential`, ...) and the core derives the `_` forms.

Conventions followed from torch's CPU kernels:
* complex `normal`/`uniform` sample the real and imaginary parts independently,
  each with the given mean (or range) and, for `normal`, std / sqrt(2);
* `random` without an upper bound draws integers in [from, M] where M is the
  dtype's largest integer (integer dtypes) or 2**mantissa_digits (float dtypes);
* `native_dropout` with `train=None` trains; its mask is bool.

Arguments are checked as torch's CPU kernels check them, before anything is drawn (see
"torch's checks of the arguments" below).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bridge_ops._lowering import (
  aten,
  check,
  default_float,
  jax_dtype,
  literal,
  lowering,
  opmath,
  real_dtype,
  result_dtypes,
)


def _is_complex(dtype) -> bool:
  return np.dtype(dtype).kind == "c"


def _sample_dtype(dtype):
  """A floating dtype to sample in for an output of `dtype` (integers sample in double)."""
  kind = np.dtype(dtype).kind
  if kind in "iub":
    return jnp.float64
  return real_dtype(dtype)


def _uniform(key, shape, dtype, low=0.0, high=1.0):
  if _is_complex(dtype):
    parts = jax.random.uniform(key, tuple(shape) + (2,), real_dtype(dtype), low, high)
    return jax.lax.complex(parts[..., 0], parts[..., 1])
  f = _sample_dtype(dtype)
  return jax.random.uniform(key, tuple(shape), f, low, high).astype(dtype)


def _normal(key, shape, dtype, mean=0.0, std=1.0):
  if _is_complex(dtype):
    parts = jax.random.normal(key, tuple(shape) + (2,), real_dtype(dtype))
    parts = parts * (std / np.sqrt(2.0)) + mean
    return jax.lax.complex(parts[..., 0], parts[..., 1])
  f = _sample_dtype(dtype)
  return (jax.random.normal(key, tuple(shape), f) * std + mean).astype(dtype)


def _open_uniform(key, shape, f):
  """Uniform on (0, 1), safe under log: the midpoints of `jax.random.uniform`'s grid (steps
  of eps), so the smallest value is eps / 2, as in torch (its tails end at -log(2**-24) in
  float32), not a clamp of 0 to the smallest float (an outlier at -log(1e-38) = 87)."""
  return jax.random.uniform(key, tuple(shape), f) + jnp.asarray(jnp.finfo(f).eps / 2, f)


def _int_max(dtype) -> int:
  """The largest value `random_` draws without an upper bound (inclusive)."""
  dt = np.dtype(dtype)
  if dt.kind == "b":
    return 1
  if dt.kind in "iu":
    return int(np.iinfo(dt).max)
  return 2 ** int(jnp.finfo(dt).nmant + 1)


def _randint_inclusive(key, shape, low: int, high: int, dtype):
  """Integers uniform on [low, high] (Python bounds, any span up to 2**64), as `dtype`."""
  span = high - low + 1
  if span <= 0:  # (torch's `random_`, which `randint` and `randint_like` call, checks this)
    raise RuntimeError(
      f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high + 1}"
    )
  bits = jax.random.bits(key, tuple(shape), jnp.uint64)
  r = bits if span >= 2**64 else bits % jnp.uint64(span)
  # Two's-complement wraparound makes low + r right even when r exceeds int64's range.
  return (r.astype(jnp.int64) + jnp.int64(low)).astype(dtype)


# --- torch's checks of the arguments ------------------------------------------------------------
#
# torch's CPU kernels refuse a negative std, a p outside [0, 1], an empty `uniform_` range...
# before they draw. A Scalar argument is a Python number while torch code is traced into a
# program (`bridge.compile`, `call_torch`), and its check raises here at once. In an eager op's
# program it is a traced value: the check joins the op's `check` flag, and when that is set the
# op runs again on the Python numbers, which raise here. A tensor argument's values (a tensor
# std, p or rate) go through `check`: torch's error at once in eager mode, inside a program only
# with `bridge.config(check_indices=True)`. A check takes no key, so draws stay as they were.


def _number(x) -> str:
  """A double as torch's messages print it (C++'s `<<`: 6 significant digits, "-nan")."""
  x = float(x)
  if math.isnan(x):
    return "-nan" if math.copysign(1.0, x) < 0 else "nan"
  return "%g" % x


def _require(ok, message, *values) -> None:
  """torch's `TORCH_CHECK(ok(*values), message(*values))` on one or two Scalar arguments,
  compared in double precision (in the traced scalars' own float type without 64-bit types)."""
  dtype = jax.dtypes.canonicalize_dtype(np.float64)
  if all(literal(v) for v in values):
    with np.errstate(all="ignore"):
      good = ok(*(np.asarray(v, dtype) for v in values))
    if not good:
      raise RuntimeError(message(*values))
    return
  args = [jnp.asarray(v).astype(dtype) for v in values]
  if len(args) == 1:
    check(~ok(*args), args[0], RuntimeError, lambda value, _: message(value))
  else:  # (`check` hands its message one value: the two travel as one complex number)
    packed = jax.lax.complex(*args)
    check(~ok(*args), packed, RuntimeError, lambda value, _: message(value.real, value.imag))


def _check_std(std) -> None:
  _require(
    lambda s: s >= 0, lambda s: f"normal expects std >= 0.0, but found std {_number(s)}", std
  )


def _check_std_tensor(std) -> None:
  if np.size(std):
    check(~(std >= 0), None, RuntimeError, "normal expects all elements of std >= 0.0")


def _check_p(p) -> None:
  """`bernoulli_`'s check of a Scalar p (also `native_dropout`'s, of 1 - p)."""
  _require(
    lambda p: (p >= 0) & (p <= 1),
    lambda p: f"bernoulli_ expects p to be in [0, 1], but got p={_number(p)}",
    p,
  )


_P_TENSOR = (
  "Expected p_in >= 0 && p_in <= 1 to be true, but got false.  (Could this error message be "
  "improved?  If so, please report an enhancement request to PyTorch.)"
)


def _check_p_tensor(p) -> None:
  if np.size(p):
    check(~((p >= 0) & (p <= 1)), None, RuntimeError, _P_TENSOR)


# torch's names of the float types that `uniform_` checks its range against: C++'s (its bounds'
# messages) and torch's own (its range's)
_UNIFORM_NAMES = {
  np.dtype(np.float32): ("float", "Float"),
  np.dtype(np.float64): ("double", "Double"),
  np.dtype(np.float16): ("c10::Half", "Half"),
  np.dtype(jnp.bfloat16): ("c10::BFloat16", "BFloat16"),
}


def _check_uniform(dtype, from_, to) -> None:
  """`uniform_`'s checks: both bounds within the dtype's range (a complex dtype's parts'), then
  from <= to, then to - from within it too, in that order."""
  names = _UNIFORM_NAMES.get(np.dtype(real_dtype(dtype)))
  if names is None:  # (integers: torch's kernel refuses them before the lowering runs)
    return
  cpp, name = names
  info = jnp.finfo(real_dtype(dtype))
  low, high = float(info.min), float(info.max)
  for value, what in ((from_, "from"), (to, "to")):
    _require(
      lambda v: (v >= low) & (v <= high),
      lambda v, what=what: f"{what} is out of bounds for {cpp}",
      value,
    )
  _require(
    lambda f, t: f <= t,
    lambda f, t: (
      f"uniform_ expects to return a [from, to) range, but found from={_number(f)} > "
      f"to={_number(t)}"
    ),
    from_,
    to,
  )
  _require(
    lambda f, t: t - f <= high,
    lambda f, t: (
      f"uniform_ expects to-from <= std::numeric_limits<{name}>::max(), but found "
      f"to={_number(t)} and from={_number(f)} which result in to-from to exceed the limit"
    ),
    from_,
    to,
  )


# --- in-place-only and functional samplers on `self` ------------------------------------------


@lowering(aten.normal_.default, random=True)
def normal_(self, mean=0.0, std=1.0, *, generator=None, key):
  _check_std(std)
  return _normal(key, self.shape, self.dtype, mean, std)


# (`normal_`'s functional form, which aot_autograd's graphs hold: `Normal(...).rsample()`)
@lowering(aten.normal_functional.default, random=True)
def normal_functional(self, mean=0.0, std=1.0, *, generator=None, key):
  _check_std(std)
  return _normal(key, self.shape, self.dtype, mean, std)


@lowering(aten.uniform.default, random=True)
def uniform(self, from_=0.0, to=1.0, *, generator=None, key, **kwargs):
  from_ = kwargs.pop("from", from_)  # `from` is a Python keyword
  _check_uniform(self.dtype, from_, to)
  return _uniform(key, self.shape, self.dtype, from_, to)


@lowering(aten.exponential.default, random=True)
def exponential(self, lambd=1.0, *, generator=None, key):
  _require(
    lambda v: v > 0,
    lambda v: f"exponential_ expects lambda > 0.0, but found lambda={_number(v)}",
    lambd,
  )
  f = _sample_dtype(self.dtype)
  return (-jnp.log(_open_uniform(key, self.shape, f)) / lambd).astype(self.dtype)


@lowering(aten.geometric.default, random=True)
def geometric(self, p, *, generator=None, key):
  _require(
    lambda p: (p > 0) & (p < 1),
    lambda p: f"geometric_ expects p to be in (0, 1), but got p={_number(p)}",
    p,
  )
  f = _sample_dtype(self.dtype)
  u = _open_uniform(key, self.shape, f)
  return jnp.ceil(jnp.log(u) / jnp.log1p(jnp.asarray(-p, f))).astype(self.dtype)


@lowering(aten.log_normal.default, random=True)
def log_normal(self, mean=1.0, std=2.0, *, generator=None, key):
  _require(
    lambda s: s > 0, lambda s: f"log_normal_ expects std > 0.0, but found std={_number(s)}", std
  )
  f = _sample_dtype(self.dtype)
  return jnp.exp(jax.random.normal(key, self.shape, f) * std + mean).astype(self.dtype)


@lowering(aten.cauchy.default, random=True)
def cauchy(self, median=0.0, sigma=1.0, *, generator=None, key):
  _require(
    lambda s: s > 0,
    lambda s: f"cauchy_ expects sigma > 0.0, but found sigma={_number(s)}",
    sigma,
  )
  f = _sample_dtype(self.dtype)
  u = jax.random.uniform(key, self.shape, f)
  return (median + sigma * jnp.tan(np.pi * (u - 0.5))).astype(self.dtype)


@lowering(aten.random.default, random=True)
def random(self, *, generator=None, key):
  return _randint_inclusive(key, self.shape, 0, _int_max(self.dtype), self.dtype)


@lowering(aten.random.to, random=True)
def random_to(self, to, *, generator=None, key):
  return _randint_inclusive(key, self.shape, 0, to - 1, self.dtype)


@lowering(getattr(aten.random, "from"), random=True)
def random_from(self, from_=None, to=None, *, generator=None, key, **kwargs):
  from_ = kwargs.pop("from", from_)
  high = _int_max(self.dtype) if to is None else to - 1
  return _randint_inclusive(key, self.shape, from_, high, self.dtype)


def _bernoulli(key, p, shape, dtype):
  """1 where a uniform draw falls below `p` (a tensor, or a Python/traced float)."""
  strong64 = (
    hasattr(p, "dtype")
    and not getattr(getattr(p, "aval", p), "weak_type", False)
    and np.dtype(p.dtype) == np.float64
  )
  f = jnp.float64 if strong64 or np.dtype(dtype) == np.float64 else jnp.float32
  u = jax.random.uniform(key, tuple(shape), f)
  return (u < jnp.asarray(p).astype(f)).astype(dtype)


@lowering(aten.bernoulli.default, random=True)
def bernoulli(self, *, generator=None, key):
  _check_p_tensor(self)
  return _bernoulli(key, self, self.shape, self.dtype)


@lowering(aten.bernoulli.p, random=True)
def bernoulli_p(self, p, *, generator=None, key):
  _check_p(p)
  return _bernoulli(key, p, self.shape, self.dtype)


@lowering(aten.bernoulli.Tensor, random=True)
def bernoulli_Tensor(self, p, *, generator=None, key):
  _check_p_tensor(p)
  return _bernoulli(key, jnp.broadcast_to(p, self.shape), self.shape, self.dtype)


@lowering(aten.bernoulli_.float, random=True)
def bernoulli_float(self, p=0.5, *, generator=None, key):
  _check_p(p)
  return _bernoulli(key, p, self.shape, self.dtype)


@lowering(aten.poisson.default, random=True)
def poisson(self, generator=None, *, key):
  """Counts drawn with rates `self` (same shape and dtype)."""
  if np.size(self):
    check(
      ~(self >= 0), None, RuntimeError, "invalid Poisson rate, expected rate to be non-negative"
    )
  rate = self.astype(jnp.float64 if np.dtype(self.dtype) == np.float64 else jnp.float32)
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):  # (JAX samples it with threefry only)
    key = jax.random.wrap_key_data(jax.random.key_data(key), impl="threefry2x32")
  return jax.random.poisson(key, rate, self.shape, jnp.int64).astype(self.dtype)


# --- normal with tensor/float parameters ------------------------------------------------------


@lowering(aten.normal.Tensor_float, random=True)
def normal_Tensor_float(mean, std=1.0, *, generator=None, key):
  _check_std(std)
  return _normal(key, mean.shape, mean.dtype, 0.0, std) + mean


@lowering(aten.normal.float_Tensor, random=True)
def normal_float_Tensor(mean, std, *, generator=None, key):
  _check_std_tensor(std)
  return _normal(key, std.shape, std.dtype) * std + mean


@lowering(aten.normal.Tensor_Tensor, random=True)
def normal_Tensor_Tensor(mean, std, *, generator=None, key):
  _check_std_tensor(std)
  dtype = result_dtypes(mean, std)[1]
  shape = jnp.broadcast_shapes(mean.shape, std.shape)
  return _normal(key, shape, dtype) * std.astype(dtype) + mean.astype(dtype)


@lowering(aten.normal.float_float, random=True)
def normal_float_float(
  mean, std, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key
):
  _check_std(std)
  return _normal(key, size, jax_dtype(dtype, default_float()), mean, std)


# --- factories --------------------------------------------------------------------------------


@lowering(aten.rand.default, aten.rand.generator, random=True)
def rand(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
  return _uniform(key, size, jax_dtype(dtype, default_float()))


@lowering(aten.randn.default, aten.randn.generator, random=True)
def randn(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
  return _normal(key, size, jax_dtype(dtype, default_float()))


@lowering(aten.rand_like.default, aten.rand_like.generator, random=True)
def rand_like(
  self,
  *,
  generator=None,
  dtype=None,
  layout=None,
  device=None,
  pin_memory=None,
  memory_format=None,
  key,
):
  return _uniform(key, self.shape, jax_dtype(dtype, self.dtype))


@lowering(aten.randn_like.default, aten.randn_like.generator, random=True)
def randn_like(
  self,
  *,
  generator=None,
  dtype=None,
  layout=None,
  device=None,
  pin_memory=None,
  memory_format=None,
  key,
):
  return _normal(key, self.shape, jax_dtype(dtype, self.dtype))


@lowering(aten.randint.default, aten.randint.generator, random=True)
def randint(
  high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key
):
  return _randint_inclusive(key, size, 0, high - 1, jax_dtype(dtype, jnp.int64))


@lowering(aten.randint.low, aten.randint.low_generator, random=True)
def randint_low(
  low, high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key
):
  return _randint_inclusive(key, size, low, high - 1, jax_dtype(dtype, jnp.int64))


@lowering(aten.randint_like.default, aten.randint_like.generator, random=True)
def randint_like(
  self,
  high,
  *,
  generator=None,
  dtype=None,
  layout=None,
  device=None,
  pin_memory=None,
  memory_format=None,
  key,
):
  return _randint_inclusive(key, self.shape, 0, high - 1, jax_dtype(dtype, self.dtype))


@lowering(aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype, random=True)
def randint_like_low_dtype(
  self,
  low,
  high,
  *,
  generator=None,
  dtype=None,
  layout=None,
  device=None,
  pin_memory=None,
  memory_format=None,
  key,
):
  return _randint_inclusive(key, self.shape, low, high - 1, jax_dtype(dtype, self.dtype))


@lowering(aten.randint_like.Tensor, aten.randint_like.Tensor_generator, random=True)
def randint_like_Tensor(
  self,
  high,
  *,
  generator=None,
  dtype=None,
  layout=None,
  device=None,
  pin_memory=None,
  memory_format=None,
  key,
):
  out = jax.random.randint(key, self.shape, 0, jnp.asarray(high).astype(jnp.int64), jnp.int64)
  return out.astype(jax_dtype(dtype, self.dtype))


@lowering(aten.randperm.default, aten.randperm.generator, random=True)
def randperm(n, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
  return jax.random.permutation(key, n).astype(jax_dtype(dtype, jnp.int64))


# torch's CPU kernel's messages for invalid weights: one check of the whole tensor without
# replacement or for one sample, else one per element and row (`_check_weights`)
_INVALID = "probability tensor contains either `inf`, `nan` or element < 0"
_NEGATIVE = "invalid multinomial distribution (encountering probability entry < 0)"
_NOT_FINITE = "invalid multinomial distribution (encountering probability entry = infinity or NaN)"
_ZERO_SUM = "invalid multinomial distribution (sum of probabilities <= 0)"
_WEIGHT_ERRORS = {1: _INVALID, 2: _NEGATIVE, 3: _NOT_FINITE, 4: _ZERO_SUM}


def _weight_error(code, position):
  return _WEIGHT_ERRORS[int(code)]


def _check_weights(self, num_samples, replacement):
  """torch's checks of `multinomial`'s arguments: the counts now, the weights' values through
  `check` (a NaN, an inf or a negative weight, a row of zeros), in the order its CPU kernel
  makes them."""
  n = self.shape[-1]
  if num_samples <= 0:
    raise RuntimeError("cannot sample n_sample <= 0 samples")
  if not replacement and num_samples > n:
    raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
  rows = self.reshape(self.shape[0] if self.ndim == 2 else 1, n)
  if not rows.shape[0]:  # nothing to draw
    return
  zero_row = jnp.all(rows == 0, axis=-1)  # (a sum of valid weights is 0 only then)
  if not replacement or num_samples == 1:
    # the whole tensor at once: any invalid weight, then any row of zeros
    if not n:
      raise RuntimeError(
        "aminmax(): cannot compute aminmax over an empty dimension as the operation has no "
        "identity."
      )
    invalid = jnp.any(~(rows >= 0) | (rows == jnp.inf))
    bad = jnp.stack([invalid, jnp.any(zero_row)])
    codes = jnp.array([1, 4])
  else:
    # row by row, each weight in order (< 0 or NaN, then inf), then the row's sum
    each = jnp.where(~(rows >= 0), 2, jnp.where(jnp.isinf(rows), 3, 0))
    codes = jnp.concatenate([each, jnp.where(zero_row, 4, 0)[:, None]], axis=1)
    bad = codes != 0
  check(bad, codes, RuntimeError, _weight_error)


@lowering(aten.multinomial.default, random=True)
def multinomial(self, num_samples, replacement=False, *, generator=None, key):
  """Rows of `self` are unnormalized weights; without replacement: Gumbel top-k."""
  _check_weights(self, num_samples, replacement)
  f = jnp.float64 if np.dtype(self.dtype) == np.float64 else jnp.float32
  logits = jnp.log(self.astype(f))
  if replacement:
    batch = logits.shape[:-1]
    draws = jax.random.categorical(key, logits, axis=-1, shape=(num_samples,) + batch)
    return jnp.moveaxis(draws, 0, -1).astype(jnp.int64)
  perturbed = logits + jax.random.gumbel(key, logits.shape, f)
  return jax.lax.top_k(perturbed, num_samples)[1].astype(jnp.int64)


# (`p` is static: a module's dropout rate is a constant, and torch's check of it then raises
# here, with no check flag to read back after each eager call of this op of every training step)
@lowering(aten.native_dropout.default, random=True, static_argnames=("p",))
def native_dropout(input, p, train, *, key):
  if train is False:
    return jnp.copy(input), jnp.ones(input.shape, jnp.bool_)
  keep_prob = 1.0 - p
  if input.size:  # (torch returns an empty input before it draws its mask with `bernoulli_`)
    _check_p(keep_prob)
  scale = jnp.where(keep_prob == 0, 0.0, 1.0 / jnp.where(keep_prob == 0, 1.0, keep_prob))
  mask = jax.random.bernoulli(key, keep_prob, input.shape)
  # torch: input.mul(mask).mul_(scale), the scalar product in float for half types.
  kept = input * mask.astype(input.dtype)
  compute = opmath(input.dtype)
  return (kept.astype(compute) * scale.astype(compute)).astype(input.dtype), mask


@lowering(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
  """torch's kernel: `grad_output * mask * scale`; the scalar product in float for half types,
  an integer or bool gradient giving the default float dtype (a float `scale` promotes it)."""
  _, out = result_dtypes(grad_output, scale)
  compute = opmath(out)
  kept = jnp.where(mask.astype(jnp.bool_), grad_output, jnp.zeros((), grad_output.dtype))
  return (kept.astype(compute) * scale).astype(out)


@lowering(aten.rrelu_with_noise_functional.default, random=True)
def rrelu_with_noise_functional(
  self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None, *, key
):
  """torch `rrelu`: training, each x <= 0 is scaled by r ~ U(lower, upper) and `noise` records
  r (1 elsewhere); otherwise a leaky relu of slope (lower + upper) / 2 and `noise` unchanged."""
  compute = opmath(self.dtype)
  x = self.astype(compute)
  if not training:
    slope = (lower + upper) / 2
    return jnp.where(x > 0, x, x * slope).astype(self.dtype), jnp.copy(noise)
  _check_rrelu_bounds(x, lower, upper)
  r = jax.random.uniform(key, self.shape, compute) * (upper - lower) + lower
  neg = x <= 0
  out = jnp.where(neg, x * r, x).astype(self.dtype)
  return out, jnp.where(neg, r, jnp.ones((), compute)).astype(noise.dtype)


def _check_rrelu_bounds(x, lower, upper) -> None:
  """torch's CPU kernel draws each x <= 0's slope from U(lower, upper) in `x`'s compute dtype,
  refusing lower > upper there (and only there: with no such x it draws nothing)."""
  crossed: Any
  if literal(lower) and literal(upper):
    if not np.asarray(lower, x.dtype) > np.asarray(upper, x.dtype):
      return
    crossed = True
  else:
    crossed = jnp.asarray(lower).astype(x.dtype) > jnp.asarray(upper).astype(x.dtype)
  if np.size(x):
    check(
      crossed & (x <= 0),
      None,
      RuntimeError,
      "Expected from <= to to be true, but got false.  (Could this error message be improved?  "
      "If so, please report an enhancement request to PyTorch.)",
    )
