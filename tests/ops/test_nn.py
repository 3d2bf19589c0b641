"""NN family: convolution, pooling and normalization lowerings against torch on CPU."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tests.ops.harness import check, device_available, lowering_of, run_direct

aten = torch.ops.aten

DTYPES = [torch.float32, torch.float64]


def _gen(seed: int = 0) -> torch.Generator:
  return torch.Generator().manual_seed(seed)


def _randn(shape, dtype, g):
  return torch.randn(shape, dtype=dtype, generator=g)


def _check_some(op, keep, *args):
  """Like `check`, but compares only the outputs `keep` with CPU; where CPU's other outputs differ
  from torch's meta kernel (which the core checks against), those are checked for shape there."""
  to_jax = lambda a: jnp.asarray(a.numpy()) if isinstance(a, torch.Tensor) else a
  with jax.enable_x64(True):
    out = lowering_of(op).fn(*[to_jax(a) for a in args])
    out = [None if o is None else torch.from_numpy(np.array(o)) for o in out]
  expected = op(*args)
  torch.testing.assert_close([out[i] for i in keep], [expected[i] for i in keep])
  meta = op(*[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args])
  shapes = lambda outs: [None if o is None else o.shape for o in outs]
  assert shapes(out) == shapes(meta)
  if device_available():
    dev = op(*[a.to("jax") if isinstance(a, torch.Tensor) else a for a in args])
    torch.testing.assert_close([dev[i].cpu() for i in keep], [expected[i] for i in keep])
  return out


# ------------------------------------------------------------------------------ convolution

# (id, input shape, weight shape, bias, stride, padding, dilation, transposed, output_padding,
#  groups)
CONV = [
  ("1d_groups_dil", (2, 4, 10), (6, 2, 3), True, [2], [1], [2], False, [0], 2),
  ("2d_nobias", (2, 4, 9, 10), (6, 4, 3, 3), False, [2, 1], [1, 0], [1, 1], False, [0, 0], 1),
  ("2d_dil_groups", (2, 6, 11, 11), (6, 2, 3, 2), True, [1, 2], [2, 1], [2, 3], False, [0, 0], 3),
  ("2d_depthwise", (1, 4, 8, 8), (8, 1, 3, 3), True, [1, 1], [1, 1], [1, 1], False, [0, 0], 4),
  ("2d_one_elem_lists", (2, 3, 8, 8), (4, 3, 3, 3), True, [2], [1], [1], False, [0], 1),
  ("2d_1x1", (2, 5, 4, 4), (3, 5, 1, 1), True, [1, 1], [0, 0], [1, 1], False, [0, 0], 1),
  # the kernel larger than the unpadded input (padded before the convolution, see below)
  (
    "2d_kernel_over_input",
    (2, 4, 2, 2),
    (5, 4, 3, 3),
    True,
    [1, 1],
    [1, 1],
    [1, 1],
    False,
    [0, 0],
    1,
  ),
  (
    "2d_kernel_over_input_dil",
    (1, 4, 3, 5),
    (4, 2, 3, 2),
    False,
    [2, 1],
    [2, 1],
    [2, 1],
    False,
    [0, 0],
    2,
  ),
  (
    "3d",
    (1, 2, 5, 6, 7),
    (4, 2, 3, 2, 3),
    True,
    [1, 2, 1],
    [1, 0, 1],
    [1, 1, 2],
    False,
    [0, 0, 0],
    1,
  ),
  ("t1d", (2, 4, 7), (4, 3, 3), True, [2], [1], [1], True, [1], 1),
  ("t2d", (2, 4, 5, 6), (4, 3, 3, 3), True, [2, 2], [1, 0], [1, 1], True, [1, 0], 1),
  ("t2d_groups_dil", (2, 4, 5, 5), (4, 2, 3, 3), False, [2, 3], [0, 1], [2, 1], True, [1, 2], 2),
  # padding > dilation * (k - 1): the equivalent JAX padding is negative (crops)
  ("t2d_big_padding", (1, 2, 6, 6), (2, 2, 2, 2), True, [1, 1], [2, 2], [1, 1], True, [0, 0], 1),
  (
    "t3d",
    (1, 2, 3, 4, 3),
    (2, 3, 2, 2, 3),
    True,
    [2, 1, 2],
    [0, 1, 1],
    [1, 1, 1],
    True,
    [1, 0, 0],
    1,
  ),
]


def _conv_args(cfg, dtype, g):
  _, xs, ws, has_bias, stride, padding, dilation, transposed, out_pad, groups = cfg
  x, w = _randn(xs, dtype, g), _randn(ws, dtype, g)
  c_out = ws[1] * groups if transposed else ws[0]
  b = _randn((c_out,), dtype, g) if has_bias else None
  return x, w, b, [stride, padding, dilation, transposed, out_pad, groups]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONV, ids=[c[0] for c in CONV])
def test_convolution(cfg, dtype):
  x, w, b, rest = _conv_args(cfg, dtype, _gen())
  check(aten.convolution.default, x, w, b, *rest)


@pytest.mark.parametrize(
  "xs,ws,padding,dilation,padded",
  [
    ((8, 16, 2, 2), (16, 16, 3, 3), [1, 1], [1, 1], True),  # ResNet's last stage, at 64x64
    ((1, 4, 2, 9), (4, 4, 2, 2), [1, 1], [2, 1], True),  # dilated: the extent is 3 rows
    ((1, 2, 5), (2, 2, 7), [3], [1], True),
    ((8, 16, 4, 4), (16, 16, 3, 3), [1, 1], [1, 1], False),  # the kernel fits: left to XLA
    ((8, 16, 2, 2), (16, 16, 3, 3), [0, 0], [1, 1], False),  # nothing to pad (empty output)
  ],
)
def test_convolution_pads_first_where_the_kernel_exceeds_the_input(
  xs, ws, padding, dilation, padded
):
  """XLA:CPU convolves with a naive loop (60x slower than torch on ResNet's 3x3 convolutions of
  2x2 maps) when the kernel is larger than the unpadded input: the lowering then pads the
  input itself and convolves without padding."""
  fn = lowering_of(aten.convolution.default).fn
  nd = len(xs) - 2
  hlo = (
    jax.jit(lambda x, w: fn(x, w, None, [1] * nd, padding, dilation, False, [0] * nd, 1))
    .lower(jnp.zeros(xs), jnp.zeros(ws))
    .as_text()
  )
  conv = next(line for line in hlo.splitlines() if "stablehlo.convolution" in line)
  zero_pad = "pad = [" + ", ".join(["[0, 0]"] * nd) + "]"
  assert ("stablehlo.pad" in hlo) is padded
  assert (zero_pad in conv or "pad" not in conv) is (padded or not any(padding)), conv


# Every configuration with all gradients (a bias gradient needs a bias, i.e. bias_sizes); the
# output masks on one plain and one transposed configuration.
MASKS = [[True, False, False], [False, True, False], [False, False, True], [True, False, True]]
CONV_BACKWARD = [pytest.param(cfg, [True, True, cfg[3]], id=cfg[0]) for cfg in CONV] + [
  pytest.param(cfg, mask, id=f"{cfg[0]}-{''.join('x' if v else '_' for v in mask)}")
  for cfg in CONV
  if cfg[0] in ("2d_dil_groups", "t2d")  # both have a bias
  for mask in MASKS
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg,mask", CONV_BACKWARD)
def test_convolution_backward(cfg, mask, dtype):
  g = _gen(1)
  x, w, b, rest = _conv_args(cfg, dtype, g)
  y = aten.convolution.default(x, w, b, *rest)
  grad = _randn(y.shape, dtype, g)
  args = (grad, x, w, None if b is None else list(b.shape), *rest, mask)
  if mask[2] and not mask[1]:
    # CPU then also returns a weight gradient nobody asked for; meta (and the lowering) None.
    _check_some(aten.convolution_backward.default, [i for i in range(3) if mask[i]], *args)
  else:
    check(aten.convolution_backward.default, *args)


# --------------------------------------------------------------------------------- pooling

# (id, input shape, kernel_size, stride, padding, dilation, ceil_mode)
MAX_POOL = [
  ("default_stride", (2, 3, 8, 8), [2, 2], [], [0, 0], [1, 1], False),
  ("ceil_pad", (2, 3, 9, 7), [3, 2], [2, 1], [1, 1], [1, 1], True),
  ("unbatched_dil", (3, 9, 9), [3, 3], [2, 2], [1, 1], [2, 2], False),
  ("ceil_dil", (1, 2, 10, 11), [2, 3], [3, 2], [1, 1], [2, 1], True),
  ("one_elem_lists", (2, 2, 7, 7), [3], [2], [1], [1], True),
]


def _pool_input(shape, dtype, values, g):
  if values == "ties":  # many equal maxima: torch keeps the first
    return torch.randint(0, 3, shape, generator=g).to(dtype)
  x = _randn(shape, dtype, g)
  if values == "nan_inf":  # NaN wins (torch keeps the last NaN); -inf windows
    flat = x.view(-1)
    flat[torch.randperm(flat.numel(), generator=g)[: flat.numel() // 8]] = float("nan")
    flat[torch.randperm(flat.numel(), generator=g)[: flat.numel() // 2]] = float("-inf")
  return x


@pytest.mark.parametrize("values", ["randn", "ties", "nan_inf"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", MAX_POOL, ids=[c[0] for c in MAX_POOL])
def test_max_pool2d_with_indices(cfg, dtype, values):
  _, shape, *rest = cfg
  check(aten.max_pool2d_with_indices.default, _pool_input(shape, dtype, values, _gen()), *rest)


def test_max_pool2d_with_indices_int():
  x = torch.randint(-5, 5, (2, 3, 7, 6), generator=_gen())
  check(aten.max_pool2d_with_indices.default, x, [3, 2], [2, 2], [1, 1], [1, 1], True)


# (id, input shape, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
AVG_POOL = [
  ("default_stride", (2, 3, 8, 8), [2, 2], [], [0, 0], False, True, None),
  ("pad_include", (2, 3, 9, 7), [3, 3], [2, 2], [1, 1], False, True, None),
  ("pad_exclude", (2, 3, 9, 7), [3, 3], [2, 2], [1, 1], False, False, None),
  ("ceil_include", (1, 2, 10, 11), [3, 2], [2, 3], [1, 1], True, True, None),
  ("ceil_exclude", (1, 2, 10, 11), [3, 2], [2, 3], [1, 1], True, False, None),
  ("divisor", (2, 2, 6, 6), [3, 3], [1, 2], [1, 0], True, False, 5),
  ("unbatched", (3, 8, 9), [2, 4], [2, 1], [0, 2], False, True, None),
  ("one_elem_lists", (2, 2, 7, 7), [3], [2], [1], True, True, None),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", AVG_POOL, ids=[c[0] for c in AVG_POOL])
def test_avg_pool2d(cfg, dtype):
  _, shape, *rest = cfg
  check(aten.avg_pool2d.default, _randn(shape, dtype, _gen()), *rest)


def test_avg_pool2d_int_truncates():
  x = torch.randint(-50, 50, (2, 3, 7, 6), generator=_gen())
  check(aten.avg_pool2d.default, x, [3, 2], [2, 2], [1, 1], True, False, None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", AVG_POOL, ids=[c[0] for c in AVG_POOL])
def test_avg_pool2d_backward(cfg, dtype):
  _, shape, kernel, stride, *rest = cfg
  g = _gen(1)
  x = _randn(shape, dtype, g)
  y = aten.avg_pool2d.default(x, kernel, stride, *rest)
  check(aten.avg_pool2d_backward.default, _randn(y.shape, dtype, g), x, kernel, stride, *rest)


# (input shape, output_size): shrinking, uneven, identity, growing (overlapping windows)
ADAPTIVE = [
  ((2, 3, 8, 8), [3, 3]),
  ((2, 3, 7, 10), [3, 4]),
  ((3, 5, 5), [5, 5]),
  ((1, 2, 4, 6), [6, 8]),
  ((2, 2, 9, 9), [2, 1]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,size", ADAPTIVE)
def test_adaptive_avg_pool2d(shape, size, dtype):
  check(aten._adaptive_avg_pool2d.default, _randn(shape, dtype, _gen()), size)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,size", ADAPTIVE)
def test_adaptive_avg_pool2d_backward(shape, size, dtype):
  g = _gen(1)
  x = _randn(shape, dtype, g)
  grad = _randn(aten._adaptive_avg_pool2d.default(x, size).shape, dtype, g)
  check(aten._adaptive_avg_pool2d_backward.default, grad, x)


# --------------------------------------------------------------------------- normalization

# (input shape, affine)
BATCH_NORM = [((2, 3, 4, 4), True), ((4, 3), True), ((2, 3, 5), False), ((2, 3, 2, 3, 2), True)]


def _bn_args(shape, affine, dtype, g):
  c = shape[1]
  x = _randn(shape, dtype, g) * 2 + 0.5
  w, b = (_randn((c,), dtype, g), _randn((c,), dtype, g)) if affine else (None, None)
  rm = _randn((c,), dtype, g)
  rv = torch.rand((c,), dtype=dtype, generator=g) + 0.5
  return x, w, b, rm, rv


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,affine", BATCH_NORM)
def test_native_batch_norm_legit_functional_training(shape, affine, dtype):
  x, w, b, rm, rv = _bn_args(shape, affine, dtype, _gen())
  check(aten._native_batch_norm_legit_functional.default, x, w, b, rm, rv, True, 0.1, 1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,affine", BATCH_NORM)
def test_native_batch_norm_legit_no_stats(shape, affine, dtype):
  x, w, b, _, _ = _bn_args(shape, affine, dtype, _gen())
  check(aten._native_batch_norm_legit.no_stats, x, w, b, True, 0.3, 1e-3)


EVAL_BN_OPS = [
  # op, extra args after the tensors, indices of the outputs CPU computes like the device
  (aten._native_batch_norm_legit_functional.default, (False, 0.1, 1e-5), [0, 3, 4]),
  (aten._native_batch_norm_legit_no_training.default, (0.1, 1e-5), [0]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,affine", BATCH_NORM)
@pytest.mark.parametrize("op,extra,keep", EVAL_BN_OPS, ids=["functional", "no_training"])
def test_native_batch_norm_eval(op, extra, keep, shape, affine, dtype):
  x, w, b, rm, rv = _bn_args(shape, affine, dtype, _gen())
  # CPU returns empty saved stats in eval mode; meta and CUDA return running_mean and invstd.
  out = _check_some(op, keep, x, w, b, rm, rv, *extra)
  torch.testing.assert_close(out[1:3], (rm, 1 / torch.sqrt(rv + 1e-5)))


# (input shape, normalized_shape, weight, bias)
LAYER_NORM = [
  ((2, 3, 8), [8], True, True),
  ((2, 3, 4, 5), [4, 5], True, False),
  ((6,), [6], False, False),
  ((3, 4, 5), [3, 4, 5], False, True),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,normalized,has_w,has_b", LAYER_NORM)
def test_native_layer_norm(shape, normalized, has_w, has_b, dtype):
  g = _gen()
  x = _randn(shape, dtype, g) * 3 + 1
  w = _randn(normalized, dtype, g) if has_w else None
  b = _randn(normalized, dtype, g) if has_b else None
  check(aten.native_layer_norm.default, x, normalized, w, b, 1e-5)


# (input shape, groups, affine)
GROUP_NORM = [
  ((2, 4, 5, 5), 2, True),
  ((3, 6), 3, True),
  ((2, 6, 3, 4, 2), 1, False),
  ((2, 4, 7), 4, True),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,groups,affine", GROUP_NORM)
def test_native_group_norm(shape, groups, affine, dtype):
  g = _gen()
  n, c = shape[:2]
  hxw = 1
  for s in shape[2:]:
    hxw *= s
  x = _randn(shape, dtype, g) * 2 - 1
  w, b = (_randn((c,), dtype, g), _randn((c,), dtype, g)) if affine else (None, None)
  # With few elements per group the variance is ill-conditioned: torch's Welford-style moments
  # and JAX's two-pass ones differ by a few ulps, which rstd amplifies.
  tol = dict(atol=1e-4, rtol=1e-5) if dtype == torch.float32 else {}
  check(aten.native_group_norm.default, x, w, b, n, c, hxw, groups, 1e-5, **tol)


# ------------------------------------------------------------------- more pooling (pooling.py)

# (op, input shape, arguments): 3-D average pools, adaptive pools with uneven windows,
# fractional pools (their random samples are an input), unpooling.
POOLING = [
  (
    "avg3d_pad",
    aten.avg_pool3d.default,
    (2, 2, 5, 6, 5),
    ([3, 2, 3], [2, 1, 2], [1, 1, 1], False, True, None),
  ),
  (
    "avg3d_ceil_exclude",
    aten.avg_pool3d.default,
    (1, 2, 5, 7, 6),
    ([3, 2, 3], [2, 3, 2], [1, 1, 1], True, False, None),
  ),
  (
    "avg3d_divisor",
    aten.avg_pool3d.default,
    (2, 1, 4, 4, 4),
    ([2, 2, 2], [], [0, 0, 0], True, True, 3),
  ),
  ("adaptive_avg3d", aten._adaptive_avg_pool3d.default, (2, 3, 5, 7, 6), ([3, 4, 4],)),
  ("adaptive_max2d", aten.adaptive_max_pool2d.default, (2, 3, 7, 9), ([3, 4],)),
  ("adaptive_max2d_grow", aten.adaptive_max_pool2d.default, (3, 4, 5), ([6, 7],)),
  ("adaptive_max3d", aten.adaptive_max_pool3d.default, (1, 2, 5, 7, 6), ([2, 3, 4],)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", POOLING, ids=[c[0] for c in POOLING])
def test_pooling(cfg, dtype):
  _, op, shape, args = cfg
  x = _randn(shape, dtype, _gen())
  if "max" in cfg[0]:
    x.view(-1)[::7] = float("nan")  # NaN wins the window
  check(op, x, *args)


@pytest.mark.parametrize(
  "nd,kernel,size", [(2, [2, 3], [4, 5]), (2, [2, 2], [6, 1]), (3, [2, 3, 2], [3, 4, 3])]
)
def test_fractional_max_pool(nd, kernel, size):
  g = _gen()
  x = _randn((2, 3, 7, 9, 6)[: 2 + nd], torch.float64, g)
  samples = torch.rand(2, 3, nd, generator=g, dtype=torch.float64)
  op = aten.fractional_max_pool2d.default if nd == 2 else aten.fractional_max_pool3d.default
  check(op, x, kernel, size, samples)


def test_max_unpool():
  g = _gen()
  x = _randn((2, 3, 8, 8), torch.float64, g)
  values, indices = torch.nn.functional.max_pool2d(x, 2, return_indices=True)
  check(aten.max_unpool2d.default, values, indices, [8, 8])
  x = _randn((2, 3, 4, 6, 4), torch.float64, g)
  values, indices = torch.nn.functional.max_pool3d(x, 2, return_indices=True)
  check(aten.max_unpool3d.default, values, indices, [4, 6, 4], [2, 2, 2], [0, 0, 0])


# --------------------------------------------------------------- interpolation (interpolation.py)

# (op, input shape, arguments after the input): sizes that shrink, grow, keep; given scales.
UPSAMPLE = [
  ("nearest1d", aten.upsample_nearest1d.default, (2, 3, 5), ([7], None)),
  ("nearest2d_scale", aten.upsample_nearest2d.default, (2, 3, 4, 5), ([8, 9], 2.1, 1.9)),
  ("nearest2d_large", aten.upsample_nearest2d.default, (1, 2, 50, 61), ([70, 90], None, None)),
  ("nearest3d", aten.upsample_nearest3d.default, (1, 2, 3, 4, 5), ([5, 3, 7], None, None, None)),
  ("nearest_exact2d", aten._upsample_nearest_exact2d.default, (2, 3, 6, 5), ([4, 9], None, 1.7)),
  ("linear1d_corners", aten.upsample_linear1d.default, (2, 3, 5), ([9], True, None)),
  ("bilinear2d", aten.upsample_bilinear2d.default, (2, 3, 5, 6), ([3, 10], False, None, None)),
  (
    "bilinear2d_large",
    aten.upsample_bilinear2d.default,
    (1, 2, 50, 61),
    ([70, 90], False, None, None),
  ),
  (
    "trilinear3d",
    aten.upsample_trilinear3d.default,
    (1, 2, 3, 4, 5),
    ([5, 3, 7], False, 1.5, None, None),
  ),
  ("bicubic2d_corners", aten.upsample_bicubic2d.default, (2, 3, 5, 6), ([7, 4], True, None, None)),
  (
    "bilinear_aa",
    aten._upsample_bilinear2d_aa.default,
    (2, 3, 9, 10),
    ([4, 13], False, None, None),
  ),
  ("bicubic_aa", aten._upsample_bicubic2d_aa.default, (2, 3, 9, 10), ([5, 3], False, None, None)),
  ("bilinear2d_vec", aten.upsample_bilinear2d.vec, (2, 3, 5, 6), (None, False, [1.5, 0.7])),
  (
    "nearest2d_backward",
    aten.upsample_nearest2d_backward.default,
    (2, 3, 8, 13),
    ([8, 13], [2, 3, 5, 6], None, None),
  ),
  (
    "bicubic2d_backward",
    aten.upsample_bicubic2d_backward.default,
    (2, 3, 8, 13),
    ([8, 13], [2, 3, 5, 6], False, None, None),
  ),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cfg", UPSAMPLE, ids=[c[0] for c in UPSAMPLE])
def test_upsample(cfg, dtype):
  name, op, shape, args = cfg
  if dtype in (torch.float16, torch.bfloat16) and ("aa" in name or "backward" in name):
    pytest.skip("torch's CPU kernel has no 16-bit version")
  check(op, _randn(shape, dtype, _gen()), *args)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", [0, 1, 2])  # bilinear, nearest, bicubic
@pytest.mark.parametrize("padding", [0, 1, 2])  # zeros, border, reflection
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sampler_2d(mode, padding, align_corners, dtype):
  g = _gen()
  x = _randn((2, 3, 5, 6), dtype, g)
  grid = torch.rand((2, 4, 7, 2), generator=g, dtype=dtype) * 2.6 - 1.3
  check(aten.grid_sampler_2d.default, x, grid, mode, padding, align_corners)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("padding", [0, 1, 2])
def test_grid_sampler_3d(mode, padding, dtype):
  # 16-bit: torch's scalar 3-D kernel rounds after every operation; so does the lowering
  g = _gen()
  x = _randn((2, 3, 5, 6, 4), dtype, g)
  grid = torch.rand((2, 4, 7, 3, 3), generator=g, dtype=dtype) * 2.6 - 1.3
  check(aten.grid_sampler_3d.default, x, grid, mode, padding, False)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("padding", [0, 1, 2])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sampler_2d_16_bit_rounds_as_torch(mode, padding, align_corners, dtype):
  # torch's vectorized 2-D kernel rounds every operation to 16 bits
  g = _gen()
  x = _randn((2, 3, 5, 6), dtype, g)
  grid = torch.rand((2, 4, 7, 2), generator=g, dtype=dtype) * 2.6 - 1.3
  check(aten.grid_sampler_2d.default, x, grid, mode, padding, align_corners)


# ------------------------------------------------------------------------------ embedding bag

# (mode, include_last_offset, padding_idx, per_sample_weights)
EMBEDDING_BAG = [
  (0, False, -1, False),
  (1, False, 2, False),
  (2, False, -1, False),
  (0, True, -1, True),
  (1, True, 3, False),
]


@pytest.mark.parametrize("mode,last,padding_idx,weighted", EMBEDDING_BAG)
def test_embedding_bag(mode, last, padding_idx, weighted):
  g = _gen()
  weight = _randn((10, 4), torch.float64, g)
  indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 2, 2])
  offsets = torch.tensor([0, 3, 3, 7] + ([10] if last else []))
  psw = _randn((10,), torch.float64, g) if weighted else None
  out, expected = run_direct(
    aten._embedding_bag_forward_only.default,
    weight,
    indices,
    offsets,
    False,
    mode,
    False,
    psw,
    last,
    padding_idx,
  )
  torch.testing.assert_close(out[0], expected[0])  # the other outputs follow the meta layout
  if mode == 2:
    torch.testing.assert_close(out[3], expected[3])


def _bag_grad(device, weight, indices, offsets, **kwargs):
  """(output, weight gradient) of `F.embedding_bag` on `device`, for a fixed output gradient."""
  w = weight.clone().to(device).requires_grad_()
  psw = kwargs.pop("per_sample_weights", None)
  if psw is not None:
    kwargs["per_sample_weights"] = psw.to(device)
  out = torch.nn.functional.embedding_bag(indices.to(device), w, offsets.to(device), **kwargs)
  grad = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape) / 7
  (out * grad.to(device)).sum().backward()
  return out.cpu(), w.grad.cpu()


@pytest.mark.parametrize("mode,last,padding_idx,weighted", EMBEDDING_BAG)
@pytest.mark.parametrize("scale_grad_by_freq", [False, True])
def test_embedding_bag_backward_on_the_jax_device(
  mode, last, padding_idx, weighted, scale_grad_by_freq
):
  """torch autograd on the `jax` device runs the `_embedding_bag_backward` lowering (not a
  host callback) and gets torch's gradient; with `scale_grad_by_freq` it is the documented
  one (each row's gradient divided by its count in `indices`), which torch 2.13's CPU kernel
  gets wrong for a once-seen index sorting after a repeated one (pytorch/pytorch#190063)."""
  if mode == 2 and scale_grad_by_freq:
    pytest.skip("torch: max mode does not support scale_grad_by_freq")
  assert lowering_of(aten._embedding_bag_backward.default) is not None
  g = _gen()
  weight = _randn((10, 4), torch.float32, g)
  indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 2, 2])
  offsets = torch.tensor([0, 3, 3, 7] + ([10] if last else []))
  kwargs = dict(
    mode=("sum", "mean", "max")[mode],
    include_last_offset=last,
    padding_idx=None if padding_idx < 0 else padding_idx,
  )
  if weighted:
    kwargs["per_sample_weights"] = _randn((10,), torch.float32, g)
  out, grad = _bag_grad(
    "jax", weight, indices, offsets, scale_grad_by_freq=scale_grad_by_freq, **kwargs
  )
  expected_out, expected = _bag_grad("cpu", weight, indices, offsets, **kwargs)
  if scale_grad_by_freq:
    expected = expected / torch.bincount(indices, minlength=10).clamp(min=1)[:, None]
  torch.testing.assert_close(out, expected_out)
  torch.testing.assert_close(grad, expected)


def test_embedding_bag_backward_leaves_out_trailing_indices():
  """With `include_last_offset`, indices after the last offset belong to no bag: no gradient
  (torch 2.13's CPU kernel returns uninitialized values for them)."""
  g = _gen()
  weight = _randn((10, 4), torch.float32, g)
  indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 7])
  for mode in ("sum", "mean", "max"):
    out, grad = _bag_grad(
      "jax", weight, indices, torch.tensor([0, 4, 8]), mode=mode, include_last_offset=True
    )
    expected_out, expected = _bag_grad(
      "cpu", weight, indices[:8], torch.tensor([0, 4, 8]), mode=mode, include_last_offset=True
    )
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(grad, expected)
    assert not grad[7].any()


_EMPTY_BATCH_POOLS = {
  "adaptive_max_pool1d": lambda x: torch.nn.functional.adaptive_max_pool1d(x, 4),
  "adaptive_max_pool2d": lambda x: torch.nn.functional.adaptive_max_pool2d(x.unsqueeze(-1), (4, 1)),
  "adaptive_avg_pool1d": lambda x: torch.nn.functional.adaptive_avg_pool1d(x, 4),
  "fractional_max_pool2d": lambda x: torch.nn.functional.fractional_max_pool2d(
    x.unsqueeze(-1).expand(0, 3, 8, 8), 2, output_size=4, _random_samples=x.new_zeros(0, 3, 2)
  ),
  "max_pool1d": lambda x: torch.nn.functional.max_pool1d(x, 2),
}


@pytest.mark.parametrize("name", list(_EMPTY_BATCH_POOLS))
def test_pooling_a_batch_of_none(name):
  # `reshape(lead + (-1,))` with a 0 in `lead` cannot infer the last size: the adaptive and
  # fractional max pools and unpooling raised ZeroDivisionError on a zero-size batch.
  fn = _EMPTY_BATCH_POOLS[name]
  want = fn(torch.zeros(0, 3, 8))
  x = torch.zeros(0, 3, 8, device="jax", requires_grad=True)
  got = fn(x)
  assert got.shape == want.shape and got.dtype == want.dtype
  got.sum().backward()
  assert x.grad.shape == (0, 3, 8)


_NONE = {
  "searchsorted_empty_batch": lambda d: torch.searchsorted(
    torch.zeros(0, 4, device=d), torch.zeros(0, 3, device=d)
  ),
  "searchsorted_empty_rows": lambda d: torch.searchsorted(
    torch.zeros(2, 0, device=d), torch.ones(2, 3, device=d)
  ),
  "unique_consecutive_dim_of_none": lambda d: torch.unique_consecutive(
    torch.zeros(0, 3, device=d), dim=0
  ),
  "unique_consecutive_other_dim_empty": lambda d: torch.unique_consecutive(
    torch.zeros(2, 0, device=d), dim=0
  ),
  "embedding_bag_max_of_nothing": lambda d: torch.nn.functional.embedding_bag(
    torch.zeros(0, dtype=torch.long, device=d),
    torch.ones(4, 3, device=d),
    torch.zeros(2, dtype=torch.long, device=d),
    mode="max",
  ),
}


@pytest.mark.parametrize("name", list(_NONE))
def test_ops_on_inputs_of_none_as_cpu(name):
  # each raised ZeroDivisionError (reshape with -1 and a 0 beside it) or a JAX gather error
  # (embedding_bag's max gathered from no rows), or computed where torch refuses
  fn = _NONE[name]
  try:
    want = fn("cpu")
  except RuntimeError as e:
    with pytest.raises(RuntimeError, match=re.escape(str(e))):
      fn("jax")
    return
  got = fn("jax")
  assert got.shape == want.shape and got.dtype == want.dtype
  torch.testing.assert_close(got.cpu(), want)
