"""Activations (relu, gelu, silu, hardtanh, leaky_relu, elu, softplus, hardswish, mish,
threshold...) and their aten backward ops, each with torch's backward formula.

The bounds of `threshold`/`hardtanh` are cast to the (opmath) dtype of `self`: truncated for
integer tensors. `relu` keeps an input equal to its bound (`relu(-0.0)` is -0.0).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from bridge_ops._lowering import aten, lowering, promote, with_derivative
from bridge_ops._elementwise import _as, _clamp, _isnan, _sigmoid

__all__: list[str] = []


_SQRT1_2 = 0.70710678118654752440
_SQRT2 = 1.41421356237309504880
_2_SQRTPI = 1.12837916709551257390


# ----------------------------------------------------------------------------- activations


@lowering(aten.relu.default)
def relu(self):
  # As torch: relu(nan) = nan; the derivative is 0 where x <= 0 (at exactly 0 too: that of a
  # bare `maximum(x, 0)` there is 0.5) and 1 elsewhere, NaN included (torch's
  # threshold_backward passes the gradient where the result is not <= 0). An input of 0
  # stays itself (relu(-0.0) is -0.0, torch's clamp_min).
  zeroed = jnp.where(self < 0, jnp.zeros((), self.dtype), self)
  return jnp.where(self <= 0, jax.lax.stop_gradient(zeroed), self)


@lowering(aten.gelu.default)
@promote("self")
def gelu(self, *, approximate="none"):
  if approximate == "tanh":
    inner = (_SQRT2 * _2_SQRTPI * 0.5) * (self + 0.044715 * (self * self * self))
    return 0.5 * self * (1 + jnp.tanh(inner))
  return self * 0.5 * (1 + lax.erf(self * _SQRT1_2))


@lowering(aten.silu.default)
@promote("self")
def silu(self):
  return _silu(self)


def _silu_grad(grad_output, self):
  s = _sigmoid(self)
  return grad_output * s * (1 + self * (1 - s))


# (torch's backward formula: finite where exp(-x) overflows)
_silu = with_derivative(lambda x: x / (1 + jnp.exp(-x)), lambda out, x, t: _silu_grad(t[0], x[0]))


@lowering(aten.hardtanh.default)
@promote("self")
def hardtanh(self, min_val=-1, max_val=1):
  # Bounds in self's (opmath) dtype: truncated for an integer tensor, like torch. Unlike
  # clamp's, torch's hardtanh_backward passes no gradient at the bounds themselves (and
  # passes it at a nan input): the clamped value, with the gradient only strictly inside.
  lo, hi = _as(min_val, self.dtype), _as(max_val, self.dtype)
  inside = ((self > lo) & (self < hi)) | _isnan(self)
  return jnp.where(inside, self, jax.lax.stop_gradient(_clamp(self, lo, hi)))


@lowering(aten.leaky_relu.default)
@promote("self")
def leaky_relu(self, negative_slope=0.01):
  return jnp.where(self > 0, self, self * _as(negative_slope, self.dtype))


@lowering(aten.elu.default)
@promote("self")
def elu(self, alpha=1, scale=1, input_scale=1):
  negcoef = _as(alpha, self.dtype) * _as(scale, self.dtype)
  # The branch not taken sees 0: expm1 of a large positive input is inf, and its derivative
  # times the zero cotangent of the unused branch would be nan.
  neg_in = jnp.where(self <= 0, self, jnp.zeros((), self.dtype))
  neg = jnp.expm1(neg_in * _as(input_scale, self.dtype)) * negcoef
  return jnp.where(self <= 0, neg, self * _as(scale, self.dtype))


@lowering(aten.celu.default, static_argnames=("alpha",))
@promote("self")
def celu(self, alpha=1.0):
  """torch computes celu as elu(x, alpha, 1, 1 / alpha); torch's decomposition (a `where`
  over expm1) would give a nan gradient for a large input. `alpha` is static: torch refuses
  0 before it computes (here at once, also while torch code is traced into a program)."""
  if alpha == 0:
    raise RuntimeError("ZeroDivisionError: alpha cannot be 0 for CELU")
  return elu(self, alpha, 1, 1 / alpha)  # (1 / alpha in double, as torch's Scalar)


@lowering(aten.softplus.default)
@promote("self")
def softplus(self, beta=1, threshold=20):
  beta = _as(beta, self.dtype)
  scaled = self * beta
  linear = scaled > _as(threshold, self.dtype)
  # (the branch not taken sees 0: see `elu`)
  safe = jnp.where(linear, jnp.zeros((), scaled.dtype), scaled)
  return jnp.where(linear, self, jnp.log1p(jnp.exp(safe)) / beta)


# Their derivatives are torch's backward formulas (`hardsigmoid_backward`,
# `hardswish_backward` below): 0 at x = -3 and 3 for hardsigmoid, where clip's rule gives 1/12.
_hardsigmoid = with_derivative(
  lambda x: jnp.minimum(jnp.maximum(x + 3, 0), 6) / 6,
  lambda out, x, t: _hardsigmoid_grad(t[0], x[0]),
)
_hardswish = with_derivative(
  lambda x: x * jnp.minimum(jnp.maximum(x + 3, 0), 6) / 6,
  lambda out, x, t: _hardswish_grad(t[0], x[0]),
)


@lowering(aten.hardsigmoid.default)
@promote("self")
def hardsigmoid(self):
  return _hardsigmoid(self)


@lowering(aten.hardswish.default)
@promote("self")
def hardswish(self):
  return _hardswish(self)


@lowering(aten.mish.default)
@promote("self")
def mish(self):
  return _mish(self)


# (torch's backward formula: finite where exp(x) overflows)
_mish = with_derivative(
  lambda x: x * jnp.tanh(jnp.log1p(jnp.exp(x))), lambda out, x, t: _mish_grad(t[0], x[0])
)


@lowering(aten.threshold.default)
@promote("self")
def threshold(self, threshold, value):
  # threshold/value in self's (opmath) dtype: truncated for an integer tensor, like torch.
  return jnp.where(self <= _as(threshold, self.dtype), _as(value, self.dtype), self)


# ----------------------------------------------------------------------------- backward ops


@lowering(aten.threshold_backward.default)
@promote("grad_output", "self")
def threshold_backward(grad_output, self, threshold):
  return jnp.where(
    self <= _as(threshold, self.dtype), jnp.zeros((), grad_output.dtype), grad_output
  )


@lowering(aten.gelu_backward.default)
@promote("grad_output", "self")
def gelu_backward(grad_output, self, *, approximate="none"):
  if approximate == "tanh":
    beta = _SQRT2 * _2_SQRTPI * 0.5
    kappa = 0.044715
    x_sq = self * self
    tanh_inner = jnp.tanh(beta * (self + kappa * (x_sq * self)))
    left = 0.5 * self
    right = 1 + tanh_inner
    right_derivative = left * (1 - tanh_inner * tanh_inner) * (beta * (1 + 3 * kappa * x_sq))
    return grad_output * (0.5 * right + right_derivative)
  cdf = 0.5 * (1 + lax.erf(self * _SQRT1_2))
  pdf = (_2_SQRTPI * _SQRT1_2 * 0.5) * jnp.exp(self * self * -0.5)
  return grad_output * (cdf + self * pdf)


@lowering(aten.silu_backward.default)
@promote("grad_output", "self")
def silu_backward(grad_output, self):
  return _silu_grad(grad_output, self)


@lowering(aten.sigmoid_backward.default)
@promote("grad_output", "output")
def sigmoid_backward(grad_output, output):
  return grad_output * (1 - output) * output


@lowering(aten.tanh_backward.default)
@promote("grad_output", "output")
def tanh_backward(grad_output, output):
  return grad_output * (1 - output * output)


@lowering(aten.hardtanh_backward.default)
@promote("grad_output", "self")
def hardtanh_backward(grad_output, self, min_val, max_val):
  # Where torch's own scalar and vectorized CPU paths differ (a nan input), follow the
  # vectorized one, which runs on all but a tensor's tail: here nan -> 0.
  inside = (self > _as(min_val, self.dtype)) & (self < _as(max_val, self.dtype))
  return jnp.where(inside, grad_output, jnp.zeros((), grad_output.dtype))


@lowering(aten.leaky_relu_backward.default)
@promote("grad_output", "self")
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
  return jnp.where(self > 0, grad_output, grad_output * _as(negative_slope, grad_output.dtype))


@lowering(aten.elu_backward.default)
@promote("grad_output", "self_or_result")
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
  dt = grad_output.dtype
  negcoef = _as(alpha, dt) * _as(scale, dt)
  negiptcoef = _as(input_scale, dt)
  if is_result:
    neg = grad_output * negiptcoef * (self_or_result + negcoef)
  else:
    neg = grad_output * negiptcoef * negcoef * jnp.exp(self_or_result * negiptcoef)
  # nan input -> nan, like torch's vectorized path (its scalar path gives the positive side).
  return jnp.where(self_or_result > 0, grad_output * _as(scale, dt), neg)


@lowering(aten.softplus_backward.default)
@promote("grad_output", "self")
def softplus_backward(grad_output, self, beta, threshold):
  scaled = self * _as(beta, self.dtype)
  z = jnp.exp(scaled)
  return jnp.where(scaled > _as(threshold, self.dtype), grad_output, grad_output * z / (z + 1))


def _hardsigmoid_grad(grad_output, self):
  return jnp.where((self > -3) & (self < 3), grad_output / 6, jnp.zeros((), grad_output.dtype))


def _hardswish_grad(grad_output, self):
  # nan input -> nan, like torch's vectorized path (its scalar path and the decomposition
  # give grad_output).
  return jnp.where(
    self <= -3,
    jnp.zeros((), grad_output.dtype),
    jnp.where(self >= 3, grad_output, grad_output * (self / 3 + 0.5)),
  )


@lowering(aten.hardsigmoid_backward.default)
@promote("grad_output", "self")
def hardsigmoid_backward(grad_output, self):
  return _hardsigmoid_grad(grad_output, self)


@lowering(aten.hardswish_backward.default)
@promote("grad_output", "self")
def hardswish_backward(grad_output, self):
  return _hardswish_grad(grad_output, self)


@lowering(aten.mish_backward.default)
@promote("grad_output", "self")
def mish_backward(grad_output, self):
  return _mish_grad(grad_output, self)


def _mish_grad(grad_output, self):
  tanh_sp = jnp.tanh(jnp.log1p(jnp.exp(self)))
  out = self * _sigmoid(self) * (1 - tanh_sp * tanh_sp)
  return grad_output * (tanh_sp + out)
