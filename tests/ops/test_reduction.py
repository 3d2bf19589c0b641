"""Reduction, sorting and histogram lowerings (bridge_ops.reduction, .sorting, .histogram)
against torch on CPU, table by table."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
import torch

from tests.ops.harness import check, lowering_of

aten = torch.ops.aten
nan, inf = math.nan, math.inf

F32, F64, BF16, I64, I32, BOOL, C64 = (
  torch.float32,
  torch.float64,
  torch.bfloat16,
  torch.int64,
  torch.int32,
  torch.bool,
  torch.complex64,
)
FLOATS = (F32, F64, BF16)
NUMERIC = FLOATS + (I64,)
ALL = NUMERIC + (BOOL,)


def make(shape, dtype, seed=0, low=-5, high=5):
  """Deterministic sample: normal floats, integers in [low, high), random bools."""
  g = torch.Generator().manual_seed(seed)
  if dtype is BOOL:
    return torch.randint(0, 2, shape, generator=g).bool()
  if dtype.is_floating_point or dtype.is_complex:
    return torch.randn(shape, generator=g, dtype=dtype if dtype is not BF16 else F32).to(dtype)
  if not dtype.is_signed:
    low = max(low, 0)
  return torch.randint(low, high, shape, generator=g, dtype=dtype)


def distinct(shape, dtype=F32, seed=0):
  """A permutation of 0..n-1 (no ties, so index results are unambiguous)."""
  g = torch.Generator().manual_seed(seed)
  return torch.randperm(math.prod(shape), generator=g).reshape(shape).to(dtype)


def cases(table):
  """(op, dtype) pairs of a {op: dtypes} table, with readable ids."""
  return [pytest.param(op, dt, id=f"{op}-{str(dt)[6:]}") for op, dts in table.items() for dt in dts]


SHAPE = (3, 4, 5)

# ----------------------------------------------------------------------------- whole-tensor

WHOLE = {
  aten.sum.default: ALL + (I32,),
  aten.mean.default: FLOATS + (C64,),
  aten.prod.default: FLOATS + (I64, BOOL),
  aten.max.default: ALL,
  aten.min.default: ALL,
  aten.argmax.default: NUMERIC,
  aten.argmin.default: NUMERIC,
  aten.nansum.default: NUMERIC,
  aten.all.default: ALL + (torch.uint8,),
  aten.any.default: ALL + (torch.uint8,),
  aten.count_nonzero.default: ALL,
  aten.median.default: NUMERIC,
  aten.nanmedian.default: NUMERIC,
  aten.norm.Scalar: FLOATS + (C64,),
  aten.linalg_vector_norm.default: FLOATS + (C64,),
  aten.var.correction: FLOATS + (C64,),
  aten.std.correction: FLOATS,
  aten.var_mean.correction: FLOATS,
  aten.std_mean.correction: FLOATS,
  aten.aminmax.default: NUMERIC,
  aten.trace.default: NUMERIC + (I32,),
}


@pytest.mark.parametrize("op,dtype", cases(WHOLE))
def test_whole_tensor(op, dtype):
  # median/argmax need unambiguous ties; prod needs values that do not overflow.
  if (
    op in (aten.median.default, aten.nanmedian.default, aten.argmax.default, aten.argmin.default)
    and dtype is not BOOL
  ):
    x = distinct((4, 5), dtype)
  elif op is aten.prod.default and dtype.is_floating_point:
    x = 1 + 0.1 * make((4, 5), dtype)
  else:
    x = make((4, 5), dtype, low=-2, high=3)
  check(op, x)


# ----------------------------------------------------------------------------- dim lists

DIM_LIST = {
  aten.sum.dim_IntList: ALL + (I32,),
  aten.mean.dim: FLOATS,
  aten.nansum.default: NUMERIC,
  aten.amax.default: ALL,
  aten.amin.default: ALL,
  aten.logsumexp.default: FLOATS + (I64,),
  aten.all.dims: ALL,
  aten.any.dims: ALL,
  aten.norm.ScalarOpt_dim: (F32, F64),
}
# (dim, keepdim): one dim, several (in any order), the last, [] and None (both: every dim,
# except for all.dims/any.dims, where [] reduces nothing).
DIM_KEEPDIM = [
  ([1], False),
  ([0, 2], True),
  ([-1], True),
  ([2, 0, 1], False),
  ([], True),
  ([], False),
  (None, False),
  (None, True),
]


def _dim_list_valid(op, dim):
  if op is aten.logsumexp.default:
    return bool(dim)  # torch's logsumexp needs explicit dims
  if op is aten.nansum.default:
    return dim != []  # torch disagrees with itself: its CPU kernel reduces every dim, its meta none
  return dim is not None or op not in (
    aten.norm.ScalarOpt_dim,
    aten.amax.default,
    aten.amin.default,
  )  # int[1] dim, not optional


@pytest.mark.parametrize(
  "op,dtype,dim,keepdim",
  [
    pytest.param(*c.values, d, k, id=f"{c.id}-{d}-{k}")
    for c in cases(DIM_LIST)
    for d, k in DIM_KEEPDIM
    if _dim_list_valid(c.values[0], d)
  ],
)
def test_dim_list(op, dtype, dim, keepdim):
  x = make(SHAPE, dtype)
  # torch's nansum accumulates bfloat16 in bfloat16 (its sum uses float32, as this lowering does).
  tol = dict(atol=0.05, rtol=0.05) if op is aten.nansum.default and dtype is BF16 else {}
  if op is aten.norm.ScalarOpt_dim:
    check(op, x, 3, dim, keepdim, **tol)
  else:
    check(op, x, dim, keepdim, **tol)


@pytest.mark.parametrize(
  "op,dim",
  [
    (aten.count_nonzero.dim_IntList, [1]),
    (aten.count_nonzero.dim_IntList, [0, 2]),
    (aten.count_nonzero.dim_IntList, []),
    (aten.count_nonzero.default, None),
    (aten.count_nonzero.default, 0),
    (aten.count_nonzero.default, -1),
  ],
  ids=str,
)
def test_count_nonzero(op, dim):
  x = make(SHAPE, F32) * make(SHAPE, BOOL, seed=1)
  x[0, 0, 0] = nan  # NaN is nonzero
  check(op, x, dim)


# ----------------------------------------------------------------------------- one dim

ONE_DIM = {
  aten.max.dim: ALL,
  aten.min.dim: ALL,
  aten.argmax.default: NUMERIC,
  aten.argmin.default: NUMERIC,
  aten.prod.dim_int: FLOATS + (I64,),
  aten.median.dim: NUMERIC,
  aten.nanmedian.dim: (F32, F64),
  aten.mode.default: (F32, I64),
  aten.all.dim: ALL,
  aten.any.dim: ALL,
  aten.aminmax.default: NUMERIC,
}


@pytest.mark.parametrize("op,dtype", cases(ONE_DIM))
@pytest.mark.parametrize("dim,keepdim", [(0, False), (1, True), (-1, False)], ids=str)
def test_one_dim(op, dtype, dim, keepdim):
  # Few distinct integers: plenty of ties, which max/min/argmax (first occurrence), median (stable
  # order) and mode (last occurrence; dims <= 16 so torch's own sort keeps ties in order) settle
  # as torch does.
  x = make(SHAPE, dtype, low=0, high=3) if dtype is not BOOL else make(SHAPE, BOOL)
  if op is aten.prod.dim_int and dtype.is_floating_point:
    x = 1 + 0.1 * make(SHAPE, dtype)
  if op is aten.aminmax.default:
    check(op, x, dim=dim, keepdim=keepdim)
  else:
    check(op, x, dim, keepdim)


@pytest.mark.parametrize("op", [aten.median.dim, aten.nanmedian.dim])
def test_median_ties_long_rows(op):
  # torch breaks median ties by index, so its index is the stable order's, even for long rows.
  check(op, make((6, 201), F32).round(), 1)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_kthvalue(k, keepdim):
  check(aten.kthvalue.default, distinct(SHAPE), k, -1, keepdim)  # torch's tie order is its own


# ----------------------------------------------------------------------------- NaN and inf

SPECIAL = [
  (aten.max.dim, [1.0, nan, 3.0, nan, 0.0], (0,)),
  (aten.min.dim, [1.0, nan, -3.0, nan, 0.0], (0,)),
  (aten.argmax.default, [1.0, nan, 3.0, nan], ()),
  (aten.argmin.default, [1.0, nan, -3.0, nan], ()),
  (aten.amax.default, [1.0, nan, 3.0], ()),
  (aten.max.default, [1.0, inf, nan], ()),
  (aten.median.dim, [3.0, nan, 1.0, nan, 2.0], (0,)),
  (aten.median.default, [3.0, nan, 1.0, 2.0], ()),
  (aten.nanmedian.dim, [3.0, nan, 1.0, nan, 2.0], (0,)),
  (aten.nanmedian.dim, [nan, nan, nan], (0,)),
  (aten.nanmedian.default, [3.0, nan, 1.0, 2.0], ()),
  (aten.nansum.default, [1.0, nan, 2.0], ()),
  (aten.sum.default, [1.0, nan, 2.0], ()),
  (aten.logsumexp.default, [[-inf, -inf], [inf, 1.0], [inf, -inf], [nan, 1.0]], ([1],)),
  (aten.logcumsumexp.default, [-inf, -inf, 1.0, inf, 2.0, nan, 1.0], (0,)),
  (aten.cummax.default, [1.0, 1.0, 0.0, 1.0, nan, 2.0, nan, 3.0], (0,)),
  (aten.cummin.default, [1.0, 1.0, 2.0, 1.0, nan, 0.0, nan, -1.0], (0,)),
  (aten.sort.default, [2.0, nan, -inf, 1.0, nan, inf, 0.0, -0.0, 0.0], ()),
  (aten.sort.default, [2.0, nan, -inf, 1.0, nan, inf, 0.0, -0.0, 0.0], (0, True)),
  (aten.topk.default, [1.0, nan, 3.0, 2.0, -inf], (3,)),
  (aten.topk.default, [1.0, nan, 3.0, 2.0, -inf], (3, 0, False)),
  (aten.linalg_vector_norm.default, [0.0, -3.0, 4.0, nan], (2,)),
  (aten.var.correction, [1.0, inf, 2.0], ()),
  (aten._softmax.default, [[-inf, -inf], [0.0, -inf]], (1, False)),
  (aten._log_softmax.default, [[0.0, -inf], [1.0, 2.0]], (1, False)),
]


@pytest.mark.parametrize(
  "op,values,args", SPECIAL, ids=[f"{c[0]}-{i}" for i, c in enumerate(SPECIAL)]
)
def test_nan_and_inf(op, values, args):
  check(op, torch.tensor(values), *args)


# ----------------------------------------------------------------------------- 0-d and empty

ZERO_D = [
  (aten.sum.dim_IntList, ([0], True)),
  (aten.mean.dim, ([-1],)),
  (aten.amax.default, ([0],)),
  (aten.max.dim, (0, True)),
  (aten.argmax.default, (0, True)),
  (aten.argmin.default, ()),
  (aten.prod.dim_int, (0,)),
  (aten.cumsum.default, (0,)),
  (aten.cummax.default, (0,)),
  (aten.logcumsumexp.default, (0,)),
  (aten.sort.default, (0,)),
  (aten.topk.default, (1, 0)),
  (aten.median.dim, (0,)),
  (aten.mode.default, (0,)),
  (aten.kthvalue.default, (1, 0)),
  (aten._softmax.default, (0, False)),
  (aten._log_softmax.default, (0, False)),
  (aten.logsumexp.default, ([0],)),
  (aten.count_nonzero.default, (0,)),
  (aten.all.dim, (0,)),
  (aten.linalg_vector_norm.default, (2, [0])),
]


@pytest.mark.parametrize("op,args", ZERO_D, ids=[str(c[0]) for c in ZERO_D])
def test_zero_dim(op, args):
  check(op, torch.tensor(2.5), *args)


EMPTY = [
  (aten.sum.dim_IntList, (0, 3), ([0],)),
  (aten.mean.dim, (0, 3), ([0],)),
  (aten.prod.dim_int, (0, 3), (0,)),
  (aten.max.dim, (0, 3), (1,)),
  (aten.amax.default, (0, 3), ([1],)),
  (aten.var.correction, (0, 3), ([0],)),
  (aten.median.default, (0,), ()),
  (aten.logsumexp.default, (0, 3), ([0],)),
  (aten.all.default, (0,), ()),
  (aten.any.default, (0,), ()),
  (aten.cumsum.default, (0, 3), (0,)),
  (aten.sort.default, (0, 3), (0,)),
  # softmax over an empty dim is empty (its shift, a max, has no identity: -inf)
  (aten._softmax.default, (0, 3), (0, False)),
  (aten._softmax.default, (3, 0), (-1, False)),
  (aten._log_softmax.default, (0, 3), (0, False)),
  (aten._safe_softmax.default, (3, 0), (-1,)),
  (aten.kthvalue.default, (3, 0), (1, 0)),
  (aten.max.dim, (3, 0), (0,)),
]


@pytest.mark.parametrize("op,shape,args", EMPTY, ids=[str(c[0]) for c in EMPTY])
def test_empty(op, shape, args):
  check(op, torch.zeros(shape), *args)


@pytest.mark.parametrize("fn", [torch.softmax, torch.log_softmax], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dim", [((0, 4), 0), ((4, 0), -1)], ids=str)
def test_softmax_over_an_empty_dim_in_a_program_with_its_gradient(fn, shape, dim):
  import bridge

  def loss(t):
    out = fn(t, dim)
    return out, (out * 2).sum()

  x = torch.zeros(shape, requires_grad=True)
  want, want_sum = loss(x)
  want_sum.backward()
  with jax.enable_x64(True):
    a = jax.numpy.zeros(shape, jax.numpy.float32)
    got = jax.jit(lambda a: bridge.call_torch(loss, a)[0])(a)
    grad = jax.jit(jax.grad(lambda a: bridge.call_torch(loss, a)[1]))(a)
  torch.testing.assert_close(bridge.to_torch(got), want.detach())
  torch.testing.assert_close(bridge.to_torch(grad), x.grad)


# ----------------------------------------------------------------------------- dtype= arguments

DTYPE_ARG = [
  (aten.sum.default, I64, F32, ()),
  (aten.sum.default, F32, F64, ()),
  (aten.sum.default, F32, BF16, ()),
  (aten.sum.dim_IntList, BOOL, I32, ([1], True)),
  (aten.sum.dim_IntList, I32, F64, ([0, 2],)),
  (aten.mean.default, I64, F32, ()),
  (aten.mean.dim, F32, F64, ([1],)),
  (aten.prod.default, I32, F64, ()),
  (aten.prod.dim_int, I64, I32, (1,)),
  (aten.nansum.default, F32, F64, ([1],)),
  (aten.cumsum.default, I64, F32, (1,)),
  (aten.cumsum.default, F32, F64, (-1,)),
  (aten.cumprod.default, I32, F64, (1,)),
  (aten.linalg_vector_norm.default, F32, F64, (2, [1])),
  (aten.linalg_vector_norm.default, C64, torch.complex128, (1,)),
  (aten.norm.ScalarOpt_dtype, F32, F64, (2,)),
  (aten.norm.ScalarOpt_dim_dtype, F32, F64, (2, [1], True)),
]


@pytest.mark.parametrize(
  "op,src,dtype,args", DTYPE_ARG, ids=[f"{c[0]}-{str(c[1])[6:]}-{str(c[2])[6:]}" for c in DTYPE_ARG]
)
def test_dtype_argument(op, src, dtype, args):
  x = make(SHAPE, src, low=-2, high=3)
  if op in (aten.prod.default, aten.prod.dim_int, aten.cumprod.default):
    x = x.clamp(-1, 1) if not src.is_floating_point else 1 + 0.1 * x
  check(op, x, *args, dtype=dtype)


# ----------------------------------------------------------------------------- var / std

VAR_OPS = (
  aten.var.correction,
  aten.std.correction,
  aten.var_mean.correction,
  aten.std_mean.correction,
)


@pytest.mark.parametrize(
  "op,dtype",
  [(op, dt) for op in VAR_OPS for dt in (F32, F64, BF16)] + [(aten.var.correction, C64)],
  ids=str,
)
@pytest.mark.parametrize(
  "dim,correction,keepdim",
  [
    (None, None, False),
    ([1], 0, True),
    ([0, 2], 2.5, False),
    ([], 1, True),
    ([-1], 100, False),  # correction > N: torch divides by max(0, N - correction) -> inf
  ],
  ids=str,
)
def test_var_std(op, dtype, dim, correction, keepdim):
  # torch updates a running (Welford) mean and variance, this lowering sums twice: both are
  # accurate to a few float32 ulps, not bit-identical.
  tol = dict(atol=1e-5, rtol=1e-5) if dtype in (F32, C64) else {}
  check(op, make(SHAPE, dtype), dim, correction=correction, keepdim=keepdim, **tol)


# ----------------------------------------------------------------------------- vector norms


@pytest.mark.parametrize("ord", [2, 1, 0, 3, 0.5, -1, inf, -inf], ids=str)
@pytest.mark.parametrize("dim,keepdim", [(None, False), ([1], True), ([0, 2], False)], ids=str)
@pytest.mark.parametrize("dtype", [F32, F64, BF16, C64])
def test_linalg_vector_norm(ord, dim, keepdim, dtype):
  x = make(SHAPE, dtype)
  x[0, 0] = 0  # zeros matter for ord 0 and negative ords
  check(aten.linalg_vector_norm.default, x, ord, dim, keepdim)


@pytest.mark.parametrize("p", [None, 1, 2, inf, 3], ids=str)
def test_norm_p(p):
  x = make(SHAPE, F32)
  check(aten.norm.ScalarOpt_dim, x, p, [2])
  if p is not None:
    check(aten.norm.Scalar, x, p)


# ----------------------------------------------------------------------------- scans

SCANS = {
  aten.cumsum.default: FLOATS + (I64, I32, BOOL),
  aten.cumprod.default: FLOATS + (I64, BOOL),
  aten.logcumsumexp.default: FLOATS,
  aten.cummax.default: ALL,
  aten.cummin.default: ALL,
}


@pytest.mark.parametrize("op,dtype", cases(SCANS))
@pytest.mark.parametrize("dim", [0, -1])
def test_scan(op, dtype, dim):
  x = make(SHAPE, dtype, low=-2, high=3)
  if op is aten.cumprod.default and dtype.is_floating_point:
    x = 1 + 0.1 * x
  if op in (aten.cummax.default, aten.cummin.default) and dtype is not BOOL:
    x = make(SHAPE, I64, low=0, high=3).to(dtype)  # ties: torch keeps the last one
  # Scans accumulate in a different order than torch's sequential loop (float32 ulps apart).
  check(op, x, dim, atol=1e-5, rtol=1e-5)


def test_cumsum_long_bfloat16():
  # bfloat16 accumulates in float32 and rounds each output once, as torch does.
  check(aten.cumsum.default, torch.full((300,), 0.1, dtype=BF16), 0)


# ----------------------------------------------------------------------------- sort, topk


@pytest.mark.parametrize("op", [aten.sort.default, aten.sort.stable])
@pytest.mark.parametrize("dtype", [F32, F64, BF16, I64, BOOL])
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort(op, dtype, dim, descending):
  if op is aten.sort.stable:
    x = make((7, 33), dtype, low=0, high=4)  # many ties: the order of equal values is checked
    check(op, x, stable=True, dim=dim, descending=descending)
  else:
    # torch's unstable sort orders ties its own way (and not always stably).
    x = distinct((7, 33), dtype) if dtype is not BOOL else make((7, 1), BOOL)
    check(op, x, dim, descending)


@pytest.mark.parametrize("dtype", [F32, BF16, I64])
@pytest.mark.parametrize("k", [0, 1, 4])
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("largest", [True, False])
def test_topk(dtype, k, dim, largest):
  # No ties: torch's order among equal values depends on its selection algorithm.
  check(aten.topk.default, distinct((6, 7), dtype), k, dim, largest, True)


# ----------------------------------------------------------------------------- softmax


@pytest.mark.parametrize("op", [aten._softmax.default, aten._log_softmax.default])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax(op, dtype, dim):
  # torch's bfloat16 kernels round an intermediate to bfloat16 (1 ulp off the exact result).
  tol = dict(atol=2**-7, rtol=0.016) if dtype is BF16 else {}
  check(op, 3 * make(SHAPE, dtype), dim, False, **tol)


@pytest.mark.parametrize("dtype", [None, F64])
@pytest.mark.parametrize("src", FLOATS)
def test_safe_softmax(src, dtype):
  x = 3 * make(SHAPE, src)
  x[0, 1] = -inf  # a fully masked row: zeros, not NaN
  x[1, 2, :3] = -inf
  x[1, 0, 2] = math.nan  # a NaN row stays NaN
  x[0, 0, 1] = inf  # so does a row with +inf
  x[0, 2] = torch.finfo(x.dtype).min  # the lowest finite value is not a mask: uniform weights
  x[0, 2, :2] = -inf
  tol = dict(atol=2**-7, rtol=0.016) if src is BF16 and dtype is None else {}
  check(aten._safe_softmax.default, x, -1, dtype, **tol)


def test_safe_softmax_gradient_is_torchs_with_masked_rows():
  """jax.grad through the lowering (call_torch) against torch autograd: a fully masked row has
  gradient 0, not NaN, and partly masked rows (down to one element) the plain softmax one."""
  import bridge

  x = 3 * make(SHAPE, F32)
  x[0, 1] = -inf
  x[1, 2, :3] = -inf
  x[1, 1, 1:] = -inf  # one element left: its sum of exps is exactly 1
  w = make(SHAPE, F32, seed=1)
  loss = lambda t: (torch.ops.aten._safe_softmax(t, -1) * w).sum()
  xr = x.clone().requires_grad_(True)
  loss(xr).backward()
  got = jax.grad(lambda a: bridge.call_torch(loss, a))(jax.numpy.asarray(x.numpy()))
  torch.testing.assert_close(torch.from_numpy(np.asarray(got).copy()), xr.grad)
  assert not torch.isnan(xr.grad).any()


@pytest.mark.parametrize(
  "forward,backward",
  [
    (aten._softmax.default, aten._softmax_backward_data.default),
    (aten._log_softmax.default, aten._log_softmax_backward_data.default),
  ],
)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [0, -1])
def test_softmax_backward(forward, backward, dtype, dim):
  out = forward(make(SHAPE, dtype), dim, False)
  check(backward, make(SHAPE, dtype, seed=1), out, dim, dtype)


# ----------------------------------------------------------------------------- traced Scalars


def test_traced_scalar_correction():
  """The core passes Scalars as weakly typed 0-d tracers: correction must work traced."""
  x = make(SHAPE, F32)
  fn = lowering_of(aten.var.correction).fn
  for correction in (0, 1, 2.5):
    with jax.enable_x64(True):
      got = jax.jit(lambda a, c: fn(a, [1], correction=c, keepdim=False))(x.numpy(), correction)
    assert got.dtype == jax.numpy.float32
    torch.testing.assert_close(
      torch.from_numpy(jax.device_get(got).copy()),
      aten.var.correction(x, [1], correction=correction),
    )


# ----------------------------------------------------------------------------- order of ties

# torch's CPU kernels pick among equal values with libstdc++'s std::sort (sort, stable=False, for
# dtypes x86-simd-sort does not take), nth_element / partial_sort (topk) and a quickselect
# (kthvalue); the lowerings replay those algorithms, so indices match exactly.


@pytest.mark.parametrize("dtype", [BF16, torch.int16, BOOL])
@pytest.mark.parametrize("n", [16, 17, 40, 300])
@pytest.mark.parametrize("descending", [False, True])
def test_unstable_sort_ties(dtype, n, descending):
  check(aten.sort.default, make((3, n), dtype, low=0, high=3), -1, descending)


@pytest.mark.parametrize("n,k", [(10, 3), (10, 10), (40, 5), (200, 2)])
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("sorted_", [True, False])
def test_topk_ties(n, k, largest, sorted_):
  x = make((3, n), F32, low=0, high=3).round()
  x[0, ::7] = nan
  check(aten.topk.default, x, k, -1, largest, sorted_)


@pytest.mark.parametrize("n", [2, 5, 9, 40])
@pytest.mark.parametrize("dtype", [I64, F32])
def test_kthvalue_ties(n, dtype):
  x = make((4, n), I64, low=0, high=3).to(dtype)
  for k in sorted({1, (n + 1) // 2, n}):
    check(aten.kthvalue.default, x, k, -1)


# ----------------------------------------------------------------------------- complex logsumexp


def test_logsumexp_complex():
  x = make((5, 5), C64) * 1000
  check(aten.logsumexp.default, x, [1], False)


def test_logcumsumexp_complex():
  x = make((5, 6), C64)
  x[0] = complex(10000, 0)
  x[1, 2] = complex(-inf, 0)
  check(aten.logcumsumexp.default, x, 1)


# ----------------------------------------------------------------------------- histograms, counts


@pytest.mark.parametrize("bins,lo,hi", [(5, 0, 0), (4, -1, 1), (1, 0, 0), (7, 0.5, 0.5)])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_histc(bins, lo, hi, dtype):
  check(aten.histc.default, make((30,), dtype), bins, lo, hi)


@pytest.mark.parametrize("density", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_histogram(density, weighted):
  x = make((4, 5), F32)
  w = make((4, 5), F32, seed=1).abs() if weighted else None
  check(aten.histogram.bin_ct, x, 6, weight=w, density=density)
  check(aten.histogram.bin_ct, x, 3, range=[-1.0, 1.0], weight=w, density=density)
  check(
    aten.histogram.bins_tensor, x, torch.tensor([-2.0, -0.5, 0.0, 3.0]), weight=w, density=density
  )


def test_histogramdd():
  x = make((6, 2), F64)
  check(aten._histogramdd_from_bin_cts.default, x, [3, 2])
  check(
    aten._histogramdd_from_bin_tensors.default,
    x,
    [torch.tensor([-1.0, 0.0, 1.0], dtype=F64), torch.tensor([-3.0, 3.0], dtype=F64)],
  )


@pytest.mark.parametrize("weights", [None, F32, I64])
@pytest.mark.parametrize("minlength", [0, 9])
def test_bincount(weights, minlength):
  x = make((12,), I64, low=0, high=6)
  w = None if weights is None else make((12,), weights, seed=1)
  check(aten.bincount.default, x, w, minlength)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.0])
def test_segment_reduce(reduce, initial):
  x = make((6, 3), F32)
  lengths = torch.tensor([2, 0, 3, 1])
  check(aten.segment_reduce.default, x, reduce, lengths=lengths, initial=initial)
  check(
    aten.segment_reduce.default, x, reduce, offsets=torch.tensor([0, 2, 2, 5, 6]), initial=initial
  )


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("counts", [False, True])
def test_unique(inverse, counts):
  x = make((4, 5), F32, low=0, high=3).round()
  x[0, 0] = nan  # NaNs stay distinct (the order torch gives several NaNs varies with its path)
  check(aten._unique2.default, x, True, inverse, counts)
  check(aten.unique_consecutive.default, x, inverse, counts)
  check(aten.unique_consecutive.default, make((5, 2), I64, low=0, high=2), inverse, counts, 0)


@pytest.mark.parametrize(
  "kwargs",
  [
    {},
    {"correction": 0},
    {"fweights": True},
    {"aweights": True},
    {"fweights": True, "aweights": True},
  ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.complex64])
def test_cov_under_jit_matches_torch(kwargs, dtype):
  # torch's `cov` reads values (weight checks) in its composite code; under jax.jit it runs
  # whole through its lowering, in torch's dtypes.
  import bridge

  gen = torch.Generator().manual_seed(0)
  x = (torch.randn(3, 6, generator=gen) * 5).to(dtype)
  weights = {
    "fweights": torch.randint(1, 4, (6,), generator=gen),
    "aweights": torch.rand(6, generator=gen, dtype=torch.float64),
  }
  kw = {k: weights[k] if v is True else v for k, v in kwargs.items()}
  tensors = {k: v for k, v in kw.items() if isinstance(v, torch.Tensor)}
  statics = {k: v for k, v in kw.items() if not isinstance(v, torch.Tensor)}
  fn = lambda a, ts: torch.cov(a, **ts, **statics)
  with jax.enable_x64(True):
    got = jax.jit(lambda a, ts: bridge.call_torch(fn, a, ts))(
      bridge.to_jax(x), {k: bridge.to_jax(v) for k, v in tensors.items()}
    )
  torch.testing.assert_close(bridge.to_torch(got), fn(x, tensors))


def test_cov_under_jit_gives_nan_for_weights_torch_refuses():
  import jax.numpy as jnp
  import bridge

  x = jnp.ones((2, 4)) * jnp.arange(4.0)
  fn = lambda a, w: torch.cov(a, fweights=w)
  got = jax.jit(lambda a, w: bridge.call_torch(fn, a, w))(x, jnp.asarray([1, -1, 1, 1]))
  assert bool(jnp.isnan(got).all())
  with pytest.raises(RuntimeError, match="fweights cannot be negative"):
    fn(bridge.torch_view(x), torch.tensor([1, -1, 1, 1], device="jax"))
