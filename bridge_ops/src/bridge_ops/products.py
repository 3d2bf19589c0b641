"""Matrix products: mm, bmm, mv, dot, vdot, the fused add* forms, `_grouped_mm`,
`_trilinear` (bilinear's kernel) and the cross product.

* Products run at `Precision.HIGHEST` (no TF32 / bf16 passes on accelerators) so float32
  matches torch on CPU; float16/bfloat16 accumulate in float32 and round once, as torch's CPU
  kernels do.
* add*: `beta * self + alpha * product`, where `beta == 0` ignores `self` (NaN/inf in it do
  not propagate) and, where torch's CPU kernels call BLAS, `alpha == 0` ignores the product.
  torch's `addr` (elementwise) and its small-`baddbmm` loop (k*m*n < 400) do multiply by
  `alpha`, so NaN propagates there. `beta` and `alpha` may be traced, so these are `where`s,
  not Python branches; for integer tensors they truncate to integers first, as torch's do.
* `matmul`, `linear`, `outer`, `ger` are composite in torch (they decompose into the ops
  here before reaching the device), and the `.dtype` (`out_dtype`) overloads are CUDA-only in
  torch, so none of them is registered.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from bridge_ops._lowering import (
  aten,
  fori_loop,
  jax_dtype,
  literal,
  lowering,
  opmath,
  scan,
  torch_dtype,
)
from bridge_ops._linalg import _HIGHEST


def _one_dtype(op, tensors: int):
  """torch's matrix products refuse tensors of different dtypes, each kernel with its own
  message (`self and mat2 must have the same dtype, but got Long and Float`, `dot : expected
  both vectors to have same dtype...`), and their meta kernels do not check. So where the
  first `tensors` arguments (None skipped) differ in dtype, `op`'s CPU kernel on zeros of
  their shapes and dtypes (it refuses them before computing) raises torch's own error."""

  def decorate(fn):
    @functools.wraps(fn)
    def checked(*args, **kwargs):
      given = args[:tensors]
      if len({np.dtype(t.dtype) for t in given if t is not None}) > 1:
        op(*(None if t is None else _zeros(t) for t in given))
      return fn(*args, **kwargs)

    return checked

  return decorate


def _zeros(x):
  """CPU zeros of `x`'s shape (a symbolic dim as 1) and dtype, in one element's memory."""
  shape = [d if isinstance(d, int) else 1 for d in x.shape]
  return torch.zeros((), dtype=torch_dtype(x.dtype)).expand(shape)


def _same_dtype(a, b):
  # `_grouped_mm`'s operands (see `_one_dtype` for the others)
  if a.dtype != b.dtype:
    raise RuntimeError(
      f"expected m1 and m2 to have the same dtype, but got: "
      f"{_torch_name(a.dtype)} != {_torch_name(b.dtype)}"
    )


def _torch_name(dtype):
  return {
    "float32": "float",
    "float64": "double",
    "float16": "c10::Half",
    "bfloat16": "c10::BFloat16",
    "int64": "long int",
    "int32": "int",
  }.get(np.dtype(dtype).name, np.dtype(dtype).name)


# The products' contractions as `lax.dot_general` dimension numbers: ((contracting), (batch)).
# (jnp.einsum plans its contraction in Python each time it meets new shapes: ~0.8 ms more per
# op when torch code is traced.)
_CONTRACTIONS = {
  "ij,jk->ik": (((1,), (0,)), ((), ())),
  "bij,bjk->bik": (((2,), (1,)), ((0,), (0,))),
  "ij,j->i": (((1,), (0,)), ((), ())),
  "i,i->": (((0,), (0,)), ((), ())),
}


def _product(subscripts, a, b):
  """A matrix product at full precision, in the accumulation dtype (float32 for 16-bit
  floats); `_one_dtype` has checked the dtypes."""
  return lax.dot_general(
    a, b, _CONTRACTIONS[subscripts], precision=_HIGHEST, preferred_element_type=opmath(a.dtype)
  )


def _scalar(x, dtype):
  """torch's `Scalar.to<scalar_t>()` for integer tensors: a float beta/alpha truncates."""
  if jnp.issubdtype(dtype, jnp.integer):
    return jnp.asarray(x).astype(dtype)
  return x


def _add_scaled(self, product, beta, alpha, out_dtype, zero_alpha_ignores_product=True):
  """beta * self + alpha * product, with torch's semantics for beta == 0 and alpha == 0."""
  if out_dtype == jnp.bool_:  # torch: for bool tensors beta/alpha act as logical and
    return (jnp.logical_and(beta, self) | jnp.logical_and(alpha, product)).astype(jnp.bool_)
  bias = self.astype(product.dtype)
  if literal(beta) and beta in (0, 1):  # (the defaults: nothing to scale or select)
    bias = jnp.zeros_like(bias) if beta == 0 else bias
  else:
    beta = _scalar(beta, out_dtype)
    bias = jnp.where(beta == 0, jnp.zeros_like(bias), beta * bias)
  if literal(alpha) and alpha == 1:
    scaled = product
  else:
    alpha = _scalar(alpha, out_dtype)
    scaled = alpha * product
    if zero_alpha_ignores_product:
      scaled = jnp.where(alpha == 0, jnp.zeros_like(product), scaled)
  return (bias + scaled).astype(out_dtype)


@lowering(aten.mm.default)
@_one_dtype(aten.mm.default, 2)
def mm(self, mat2):
  return _product("ij,jk->ik", self, mat2).astype(self.dtype)


@lowering(aten.bmm.default)
@_one_dtype(aten.bmm.default, 2)
def bmm(self, mat2):
  return _product("bij,bjk->bik", self, mat2).astype(self.dtype)


@lowering(aten.linear.default)
@_one_dtype(aten.linear.default, 3)
def linear(input, weight, bias=None):
  # torch decomposes `linear` (`t` + `addmm`, or an expanded `bmm` for a non-contiguous 3-D
  # input); the core runs this instead when autograd is not recording.
  out = lax.dot_general(
    input,
    weight,
    (((input.ndim - 1,), (weight.ndim - 1,)), ((), ())),
    precision=_HIGHEST,
    preferred_element_type=opmath(input.dtype),
  )
  return (out if bias is None else out + bias).astype(input.dtype)


@lowering(aten.matmul.default)
@_one_dtype(aten.matmul.default, 2)
def matmul(self, other):
  # torch's `matmul` broadcasts by expanding to `bmm`; XLA contracts the batch dims directly.
  return jnp.matmul(
    self, other, precision=_HIGHEST, preferred_element_type=opmath(self.dtype)
  ).astype(self.dtype)


@lowering(aten.mv.default)
@_one_dtype(aten.mv.default, 2)
def mv(self, vec):
  return _product("ij,j->i", self, vec).astype(self.dtype)


@lowering(aten.dot.default)
@_one_dtype(aten.dot.default, 2)
def dot(self, tensor):
  return _product("i,i->", self, tensor).astype(self.dtype)


@lowering(aten.vdot.default)
@_one_dtype(aten.vdot.default, 2)
def vdot(self, other):
  return _product("i,i->", jnp.conj(self), other).astype(self.dtype)


@lowering(aten.addmm.default)
@_one_dtype(aten.addmm.default, 3)
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
  return _add_scaled(self, _product("ij,jk->ik", mat1, mat2), beta, alpha, mat1.dtype)


@lowering(aten.addmv.default)
@_one_dtype(aten.addmv.default, 3)
def addmv(self, mat, vec, *, beta=1, alpha=1):
  return _add_scaled(self, _product("ij,j->i", mat, vec), beta, alpha, mat.dtype)


@lowering(aten._grouped_mm.default)
def _grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
  """torch's grouped GEMM (`F.grouped_mm`, what Hugging Face's mixture-of-experts layers call
  on a non-CPU device). `offs` holds the int32 end offsets of the groups along the ragged
  dimension:

  * 2-D x 3-D: (M, K) rows in groups, group g times `mat2[g]` -> (M, N); rows past the last
    offset are 0 (torch's CPU kernel leaves them unset);
  * 3-D x 2-D: (N) columns in groups, `self[g]` times group g's columns -> (M, N);
  * 2-D x 2-D: K in groups, one product per group -> (G, M, N);
  * 3-D x 3-D (no `offs`): a batched product.

  The offsets may be traced values (a router's counts): every shape is static.
  """
  allowed = (np.dtype(jnp.float32), np.dtype(jnp.bfloat16), np.dtype(jnp.float16))
  for name, m in (("mat_a", self), ("mat_b", mat2)):
    if np.dtype(m.dtype) not in allowed:
      kind = torch.empty(0, dtype=torch_dtype(m.dtype)).type().rpartition(".")[2]
      raise RuntimeError(
        f"Expected {name} to be Float32, BFloat16 or Float16 matrix, got "
        f"{kind.removesuffix('Tensor')}"
      )
  _same_dtype(self, mat2)
  if bias is not None:
    raise RuntimeError("Bias not supported yet")
  if out_dtype is not None and np.dtype(jax_dtype(out_dtype)) != np.dtype(self.dtype):
    raise RuntimeError("Grouped gemm output dtype must match `mat_a` dtype")
  if (offs is None) != (self.ndim == 3 and mat2.ndim == 3):
    raise RuntimeError(
      "Offsets must be passed (only) when mat_a or mat_b is 2-D: "
      f"got {self.ndim}-D and {mat2.ndim}-D with offs "
      f"{'missing' if offs is None else 'given'}"
    )
  if offs is not None and np.dtype(offs.dtype) != np.dtype(jnp.int32):
    raise RuntimeError("Offsets have to be int32")
  acc = opmath(self.dtype)
  if offs is None:
    out = lax.dot_general(
      self, mat2, (((2,), (1,)), ((0,), (0,))), precision=_HIGHEST, preferred_element_type=acc
    )
    return out.astype(self.dtype)
  groups = offs.shape[0]
  if self.ndim == 2 and mat2.ndim == 3:
    sizes = jnp.diff(offs, prepend=jnp.zeros((1,), offs.dtype))
    out = lax.ragged_dot(self, mat2, sizes, precision=_HIGHEST, preferred_element_type=acc)
    return out.astype(self.dtype)
  ragged = mat2.shape[1] if self.ndim == 3 else self.shape[1]  # N (3-D x 2-D) or K (2-D x 2-D)
  # the group of each column of mat2 / each k; past the last offset: `groups`, in none
  group = jnp.searchsorted(offs, jnp.arange(ragged, dtype=offs.dtype), side="right")
  member = (group[None, :] == jnp.arange(groups)[:, None]).astype(acc)  # (G, ragged)
  if self.ndim == 3:  # (G, M, K) x (K, N): column n uses self[group of n]
    full = lax.dot_general(
      self, mat2, (((2,), (0,)), ((), ())), precision=_HIGHEST, preferred_element_type=acc
    )  # (G, M, N)
    return (full * member[:, None, :]).sum(0).astype(self.dtype)
  # (M, K) x (K, N) with K in groups -> (G, M, N)
  masked = self.astype(acc)[None, :, :] * member[:, None, :]  # (G, M, K)
  out = lax.dot_general(
    masked,
    mat2.astype(acc),
    (((2,), (0,)), ((), ())),
    precision=_HIGHEST,
    preferred_element_type=acc,
  )
  return out.astype(self.dtype)


@lowering(aten.baddbmm.default)
@_one_dtype(aten.baddbmm.default, 3)
def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
  if batch1.shape[1] * batch1.shape[2] * batch2.shape[2] >= 400:  # BLAS
    return _add_scaled(self, _product("bij,bjk->bik", batch1, batch2), beta, alpha, batch1.dtype)
  # torch's own loop for small products: each dot product summed in order over k (in the
  # accumulation dtype), then `self * beta + alpha * acc`; alpha multiplies, so NaN propagates.
  acc_dtype = opmath(batch1.dtype)
  a, b = batch1.astype(acc_dtype), batch2.astype(acc_dtype)

  def step(k, acc):
    return acc + (
      lax.dynamic_index_in_dim(a, k, axis=2, keepdims=False)[:, :, None]
      * lax.dynamic_index_in_dim(b, k, axis=1, keepdims=False)[:, None, :]
    )

  acc = fori_loop(0, a.shape[2], step, jnp.zeros(a.shape[:2] + b.shape[2:], acc_dtype))
  return _add_scaled(self, acc, beta, alpha, batch1.dtype, zero_alpha_ignores_product=False)


@lowering(aten.addbmm.default)
@_one_dtype(aten.addbmm.default, 3)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
  # torch: `addmm_` once per batch entry, in order (beta for the first, 1 after), so the sum
  # over the batch is rounded to the dtype at each step.
  out = jnp.broadcast_to(self, (batch1.shape[1], batch2.shape[2])).astype(batch1.dtype)
  if not batch1.shape[0]:
    return _add_scaled(out, jnp.zeros(out.shape, opmath(out.dtype)), beta, 0, out.dtype)
  out = _add_scaled(out, _product("ij,jk->ik", batch1[0], batch2[0]), beta, alpha, out.dtype)

  def step(out, mats):
    return _add_scaled(out, _product("ij,jk->ik", *mats), 1, alpha, out.dtype), None

  return scan(step, out, (batch1[1:], batch2[1:]))[0]


@lowering(aten.addr.default)
def addr(self, vec1, vec2, *, beta=1, alpha=1):
  if vec1.dtype == jnp.bool_:
    return _add_scaled(self, vec1[:, None] & vec2[None, :], beta, alpha, jnp.bool_)
  # torch's elementwise kernel: `self * beta + alpha * vec1 * vec2` in the dtype itself, each
  # operation rounded (beta == 0: `alpha * vec1 * vec2`)
  dtype = vec1.dtype
  beta, alpha = _scalar(beta, dtype), _scalar(alpha, dtype)

  def rnd(x):
    return x.astype(dtype)

  outer = rnd(rnd(alpha * vec1[:, None]) * vec2[None, :])
  return rnd(jnp.where(beta == 0, outer, rnd(rnd(self * beta) + outer)))


@lowering(aten._trilinear.default)
def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
  """sum over `sumdim` of i1 * i2 * i3, each first unsqueezed at its `expand` dims (the
  kernel of `bilinear`). As torch: i1 and i2 are contracted first over the summed dims that i3
  lacks, the result rounded to the dtype, then contracted with i3 (16-bit floats accumulate
  in float32 in each step)."""
  ndim = i1.ndim + len(expand1)
  letters = "abcdefghijklmnopqrstuvwxyz"[:ndim]
  summed = {d % ndim for d in sumdim}
  dims = [
    [d for d in range(ndim) if d not in {e % ndim for e in expand}]
    for expand in (expand1, expand2, expand3)
  ]
  first = [
    d
    for d in range(ndim)
    if (d in dims[0] or d in dims[1]) and not (d in summed and d not in dims[2])
  ]
  keep = [d for d in range(ndim) if d not in summed]
  second = [d for d in keep if d in first or d in dims[2]]

  def sub(ds):
    return "".join(letters[d] for d in ds)

  def contract(spec, *xs):
    return jnp.einsum(
      spec, *xs, precision=_HIGHEST, preferred_element_type=opmath(i1.dtype)
    ).astype(i1.dtype)

  buf = contract(f"{sub(dims[0])},{sub(dims[1])}->{sub(first)}", i1, i2)
  out = contract(f"{sub(first)},{sub(dims[2])}->{sub(second)}", buf, i3)
  return jnp.expand_dims(out, [k for k, d in enumerate(keep) if d not in second])


# ----------------------------------------------------------------------------- cross product

_MANTISSA = {np.dtype(jnp.float16): (5, 10), np.dtype(jnp.bfloat16): (8, 7)}


def _rounded(x):
  """`x` rounded to its 16-bit dtype now: XLA would otherwise keep a fused chain of 16-bit
  ops in float32, where torch rounds after every op."""
  bits = _MANTISSA.get(np.dtype(x.dtype))
  return lax.reduce_precision(x, *bits) if bits else x


@lowering(aten.linalg_cross.default)
@_one_dtype(aten.linalg_cross.default, 2)
def linalg_cross(self, other, dim=-1):
  """torch's `a[i+1] b[i+2] - a[i+2] b[i+1]`, each product rounded in 16-bit dtypes."""
  a, b = jnp.broadcast_arrays(self, other)
  a1, a2 = jnp.roll(a, -1, axis=dim), jnp.roll(a, -2, axis=dim)
  b1, b2 = jnp.roll(b, -1, axis=dim), jnp.roll(b, -2, axis=dim)
  return _rounded(_rounded(a1 * b2) - _rounded(a2 * b1))
