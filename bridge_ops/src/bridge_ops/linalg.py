"""Matrix products: mm, bmm, mv, dot, vdot and the fused add* forms (addmm, addmv, addbmm,
baddbmm, addr).

* Products run at `Precision.HIGHEST` (no TF32 / bf16 passes on accelerators) so float32
  matches torch on CPU; float16/bfloat16 accumulate in float32 and round once, as torch's CPU
  kernels do.
* add*: `beta * self + alpha * product`, where `beta == 0` ignores `self` (NaN/inf in it do
  not propagate) and, where torch's CPU kernels call BLAS, `alpha == 0` ignores the product.
  torch's `addr` (elementwise) and its small-`baddbmm` loop (k*m*n < 400) do multiply by
  `alpha`, so NaN propagates there. `beta` and `alpha` may be traced, so these are `where`s,
  not Python branches.
* `matmul`, `linear`, `outer`, `ger` are composite in torch (they decompose into the ops
  here before reaching the device), and the `.dtype` (`out_dtype`) overloads are CUDA-only in
  torch, so none of them is registered.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from bridge_ops._lowering import aten, lowering

_HIGHEST = lax.Precision.HIGHEST
_LOW_FLOATS = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))


def _acc(dtype):
  return jnp.dtype(jnp.float32) if np.dtype(dtype) in _LOW_FLOATS else jnp.dtype(dtype)


def _same_dtype(a, b):
  # torch's matrix products refuse mixed dtypes (its meta kernels do not check this)
  if a.dtype != b.dtype:
    raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: "
                       f"{_torch_name(a.dtype)} != {_torch_name(b.dtype)}")


def _torch_name(dtype):
  return {"float32": "float", "float64": "double", "float16": "c10::Half",
          "bfloat16": "c10::BFloat16", "int64": "long int", "int32": "int"}.get(
              np.dtype(dtype).name, np.dtype(dtype).name)


def _product(subscripts, a, b):
  """einsum at full precision, in the accumulation dtype (float32 for 16-bit floats)."""
  _same_dtype(a, b)
  return jnp.einsum(subscripts, a, b, precision=_HIGHEST, preferred_element_type=_acc(a.dtype))


def _add_scaled(self, product, beta, alpha, out_dtype, zero_alpha_ignores_product=True):
  """beta * self + alpha * product, with torch's semantics for beta == 0 and alpha == 0."""
  if out_dtype == jnp.bool_:  # torch: for bool tensors beta/alpha act as logical and
    return (jnp.logical_and(beta, self) | jnp.logical_and(alpha, product)).astype(jnp.bool_)
  bias = self.astype(product.dtype)
  bias = jnp.where(beta == 0, jnp.zeros_like(bias), beta * bias)
  scaled = alpha * product
  if zero_alpha_ignores_product:
    scaled = jnp.where(alpha == 0, jnp.zeros_like(product), scaled)
  return (bias + scaled).astype(out_dtype)


@lowering(aten.mm.default)
def mm(self, mat2):
  return _product("ij,jk->ik", self, mat2).astype(self.dtype)


@lowering(aten.bmm.default)
def bmm(self, mat2):
  return _product("bij,bjk->bik", self, mat2).astype(self.dtype)


@lowering(aten.linear.default)
def linear(input, weight, bias=None):
  # torch decomposes `linear` (`t` + `addmm`, or an expanded `bmm` for a non-contiguous 3-D
  # input); the core runs this instead when autograd is not recording.
  _same_dtype(input, weight)
  out = jnp.matmul(input, weight.T, precision=_HIGHEST, preferred_element_type=_acc(input.dtype))
  return (out if bias is None else out + bias).astype(input.dtype)


@lowering(aten.matmul.default)
def matmul(self, other):
  # torch's `matmul` broadcasts by expanding to `bmm`; XLA contracts the batch dims directly.
  _same_dtype(self, other)
  return jnp.matmul(self, other, precision=_HIGHEST,
                    preferred_element_type=_acc(self.dtype)).astype(self.dtype)


@lowering(aten.mv.default)
def mv(self, vec):
  return _product("ij,j->i", self, vec).astype(self.dtype)


@lowering(aten.dot.default)
def dot(self, tensor):
  return _product("i,i->", self, tensor).astype(self.dtype)


@lowering(aten.vdot.default)
def vdot(self, other):
  return _product("i,i->", jnp.conj(self), other).astype(self.dtype)


@lowering(aten.addmm.default)
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
  return _add_scaled(self, _product("ij,jk->ik", mat1, mat2), beta, alpha, mat1.dtype)


@lowering(aten.addmv.default)
def addmv(self, mat, vec, *, beta=1, alpha=1):
  return _add_scaled(self, _product("ij,j->i", mat, vec), beta, alpha, mat.dtype)


@lowering(aten.baddbmm.default)
def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
  blas = batch1.shape[1] * batch1.shape[2] * batch2.shape[2] >= 400  # torch's own loop below
  return _add_scaled(self, _product("bij,bjk->bik", batch1, batch2), beta, alpha, batch1.dtype,
                     zero_alpha_ignores_product=blas)


@lowering(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
  return _add_scaled(self, _product("bij,bjk->ik", batch1, batch2), beta, alpha, batch1.dtype)


@lowering(aten.addr.default)
def addr(self, vec1, vec2, *, beta=1, alpha=1):
  if vec1.dtype == jnp.bool_:
    return _add_scaled(self, vec1[:, None] & vec2[None, :], beta, alpha, jnp.bool_)
  outer = vec1.astype(_acc(vec1.dtype))[:, None] * vec2.astype(_acc(vec2.dtype))[None, :]
  return _add_scaled(self, outer, beta, alpha, vec1.dtype, zero_alpha_ignores_product=False)
