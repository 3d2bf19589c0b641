"""Creation family: full/zeros/ones and their `_like`/`new_` forms, ranges, eye, fill.

`layout`, `device`, `pin_memory` and `memory_format` arguments are accepted and
ignored: the core places the result (on the `jax` device a `_like`/`new_` op reaches its
lowering only for a strided result, unpinned, on its input's device; torch's own kernel
makes any other). `empty*` results are zero-filled.
When `dtype` is None the dtype follows torch: the fill value's kind (bool ->
bool, int -> int64, float -> the default float dtype, complex -> the matching
complex dtype) for `full`/`scalar_tensor`-like ops, the input's dtype for `_like`
and `new_` ops.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from bridge_ops._lowering import aten, default_float, jax_dtype, lowering, opmath


def _kind(value) -> str:
  """numpy kind letter of a Scalar argument (a Python number or a 0-d JAX value)."""
  if isinstance(value, bool):
    return "b"
  if isinstance(value, int):
    return "i"
  if isinstance(value, float):
    return "f"
  if isinstance(value, complex):
    return "c"
  return np.dtype(value.dtype).kind


def _default_complex():
  return jnp.complex128 if np.dtype(default_float()) == np.float64 else jnp.complex64


def _scalar_dtype(value):
  """torch's dtype for a tensor made from a Python scalar."""
  return {
    "b": jnp.bool_,
    "i": jnp.int64,
    "u": jnp.int64,
    "f": default_float(),
    "c": _default_complex(),
  }[_kind(value)]


def _filled(shape, value, dtype):
  return jnp.full(tuple(shape), jnp.asarray(value).astype(dtype), dtype)


# --- full / zeros / ones ----------------------------------------------------------------------


@lowering(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
  return _filled(size, fill_value, jax_dtype(dtype, _scalar_dtype(fill_value)))


@lowering(aten.zeros.default)
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
  return jnp.zeros(tuple(size), jax_dtype(dtype, default_float()))


@lowering(aten._efficientzerotensor.default)
def efficientzerotensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
  """torch's zero tensor without memory (forward AD's zero tangents): plain zeros here."""
  return zeros(size, dtype=dtype)


@lowering(aten.ones.default)
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
  return jnp.ones(tuple(size), jax_dtype(dtype, default_float()))


@lowering(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
  # torch.scalar_tensor uses the default float dtype whatever the scalar's kind
  # (complex scalars give the default complex dtype).
  default = _default_complex() if _kind(s) == "c" else default_float()
  return jnp.asarray(s).astype(jax_dtype(dtype, default))


@lowering(aten.zeros_like.default)
def zeros_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
  return jnp.zeros(self.shape, jax_dtype(dtype, self.dtype))


@lowering(aten.ones_like.default)
def ones_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
  return jnp.ones(self.shape, jax_dtype(dtype, self.dtype))


@lowering(aten.empty_like.default)
def empty_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
  return jnp.zeros(self.shape, jax_dtype(dtype, self.dtype))


@lowering(aten.full_like.default)
def full_like(
  self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
):
  return _filled(self.shape, fill_value, jax_dtype(dtype, self.dtype))


@lowering(aten.new_zeros.default)
def new_zeros(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
  return jnp.zeros(tuple(size), jax_dtype(dtype, self.dtype))


@lowering(aten.new_ones.default)
def new_ones(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
  return jnp.ones(tuple(size), jax_dtype(dtype, self.dtype))


@lowering(aten.new_empty.default)
def new_empty(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
  return jnp.zeros(tuple(size), jax_dtype(dtype, self.dtype))


@lowering(aten.new_empty_strided.default)
def new_empty_strided(self, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
  return jnp.zeros(tuple(size), jax_dtype(dtype, self.dtype))


@lowering(aten.new_full.default)
def new_full(self, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
  return _filled(size, fill_value, jax_dtype(dtype, self.dtype))


@lowering(aten.fill.Scalar)
def fill_Scalar(self, value):
  return _filled(self.shape, value, self.dtype)


@lowering(aten.fill.Tensor)
def fill_Tensor(self, value):
  return _filled(self.shape, value, self.dtype)


@lowering(aten.copy.default)
def copy(self, src, non_blocking=False):
  """The functional `copy_` (an optimizer step compiled by torch.compile writes through it):
  `src`'s values, broadcast to `self`'s shape, in `self`'s dtype."""
  return jnp.broadcast_to(src.astype(self.dtype), self.shape)


@lowering(aten.zero.default)
def zero(self):
  return jnp.zeros(self.shape, self.dtype)


# --- ranges -----------------------------------------------------------------------------------


def _is_integral(dtype) -> bool:
  return np.dtype(dtype).kind in "iub"


def _arange(start, end, step, dtype):
  """torch's arange (static Python bounds): the length and values follow its CPU kernel."""
  if any(jax.export.is_symbolic_dim(v) for v in (start, end, step)):
    return _symbolic_arange(start, end, step, dtype)
  if dtype is None:
    ints = all(isinstance(v, int) for v in (start, end, step))  # bools count as ints
    out = jnp.int64 if ints else default_float()
  else:
    out = jax_dtype(dtype)
  if _is_integral(out):
    # The values use the bounds converted to int64 (truncated); the length uses them
    # as doubles, except for int64 results, where it is computed in int64.
    istart, iend, istep = int(start), int(end), int(step)
    if np.dtype(out) == np.int64:
      sgn = (istep > 0) - (istep < 0)
      num = iend - istart + istep - sgn
      n = abs(num) // abs(istep) * (1 if (num >= 0) == (istep > 0) else -1)  # C++ division
    else:
      n = math.ceil((float(end) - float(start)) / float(step))
    values = istart + istep * np.arange(max(n, 0), dtype=np.int64)
    return jnp.asarray(values).astype(out)
  n = max(math.ceil((float(end) - float(start)) / float(step)), 0)
  # torch accumulates in double on CPU: start + step * i, then rounds to the dtype.
  values = jnp.float64(start) + jnp.float64(step) * jnp.arange(n, dtype=jnp.float64)
  return values.astype(out)


def _symbolic_arange(start, end, step, dtype):
  """arange with a symbolic bound (a JAX symbolic dimension, in `bridge.export`): integer
  bounds and step, as torch.export's sizes are."""
  if not all(isinstance(v, int) or jax.export.is_symbolic_dim(v) for v in (start, step)):
    raise TypeError(
      f"arange with a symbolic bound needs integer start and step, got {start}, {step}"
    )
  if not isinstance(step, int) or step == 0:
    raise TypeError(f"arange with a symbolic bound needs a constant nonzero step, got {step}")
  n = (end - start + step - 1) // step if step > 0 else (start - end - step - 1) // -step
  out = jnp.int64 if dtype is None else jax_dtype(dtype)
  i = jax.lax.broadcasted_iota(jnp.int64, (n,), 0)
  return (start + step * i).astype(out)


@lowering(aten.arange.default, static_argnames=("end",))
def arange(end, *, dtype=None, layout=None, device=None, pin_memory=None):
  return _arange(0, end, 1, dtype)


@lowering(aten.arange.start, static_argnames=("start", "end"))
def arange_start(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
  return _arange(start, end, 1, dtype)


@lowering(aten.arange.start_step, static_argnames=("start", "end", "step"))
def arange_start_step(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
  return _arange(start, end, step, dtype)


def _space_dtype(start, end, dtype):
  if dtype is not None:
    return jax_dtype(dtype)
  if "c" in (_kind(start), _kind(end)):
    return _default_complex()
  return default_float()


def _linear(start, end, steps, dtype, compute):
  """torch's linspace kernel: start + step*i for the first half, end - step*(steps-1-i) after.

  The bounds are first converted to the output `dtype` (truncating for integers),
  then the arithmetic runs in `compute`.
  """
  start = jnp.asarray(start).astype(dtype).astype(compute)
  end = jnp.asarray(end).astype(dtype).astype(compute)
  if steps == 1:
    return jnp.reshape(start, (1,))
  step = (end - start) / (steps - 1)
  i = jnp.arange(steps, dtype=jnp.int64)
  lo = start + step * i.astype(compute)
  hi = end - step * (steps - 1 - i).astype(compute)
  return jnp.where(i < steps // 2, lo, hi)


def _linspace_compute(dtype):
  """The kernel's arithmetic type: the dtype itself for floats (half types via float32),
  double for integers."""
  if _is_integral(dtype):
    return jnp.float64
  return opmath(dtype)


@lowering(
  aten.linspace.default,
  aten.linspace.Tensor_Tensor,
  aten.linspace.Tensor_Scalar,
  aten.linspace.Scalar_Tensor,
)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
  out = _space_dtype(start, end, dtype)
  return _linear(start, end, steps, out, _linspace_compute(out)).astype(out)


@lowering(
  aten.logspace.default,
  aten.logspace.Tensor_Tensor,
  aten.logspace.Tensor_Scalar,
  aten.logspace.Scalar_Tensor,
)
def logspace(
  start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None
):
  """base ** linspace(start, end), the power taken in double (complex128 for complex)."""
  out = _space_dtype(start, end, dtype)
  compute = jnp.complex128 if np.dtype(out).kind == "c" else jnp.float64
  exponent = _linear(start, end, steps, out, compute)
  return jnp.power(jnp.asarray(base, compute), exponent).astype(out)


@lowering(aten.eye.default)
def eye(n, *, dtype=None, layout=None, device=None, pin_memory=None):
  return jnp.eye(n, dtype=jax_dtype(dtype, default_float()))


@lowering(aten.eye.m)
def eye_m(n, m, *, dtype=None, layout=None, device=None, pin_memory=None):
  return jnp.eye(n, m, dtype=jax_dtype(dtype, default_float()))


def _tri_indices(row, col, offset, dtype, lower):
  r, c = np.meshgrid(np.arange(row), np.arange(col), indexing="ij")
  keep = (c - r <= offset) if lower else (c - r >= offset)
  out = np.stack([r[keep], c[keep]]).astype(np.int64)
  return jnp.asarray(out).astype(jax_dtype(dtype, jnp.int64))


@lowering(aten.tril_indices.default)
def tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
  return _tri_indices(row, col, offset, dtype, lower=True)


@lowering(aten.triu_indices.default)
def triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
  return _tri_indices(row, col, offset, dtype, lower=False)
