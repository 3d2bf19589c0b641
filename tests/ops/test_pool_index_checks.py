"""torch's errors for pooling, interpolation, index_add, masked_select and lstsq arguments torch
refuses, on the `jax` device and in `bridge.compile`, against torch on CPU; and torch's values
where it accepts them.

- `max_unpool{1,2,3}d` with an index outside the output: torch's RuntimeError (a value check:
  eager, and in a compiled program with `bridge.config(check_indices=True)`), not a dropped
  write;
- `upsample_*` (linear, bilinear, bicubic, trilinear) with an empty input or output size, and
  every mode with empty channels: torch's error, not an empty tensor or JAX's error;
- `adaptive_avg_pool{1,2,3}d` of an input with an empty non-batch dim: torch's error;
- `index_add` out of range on a 1-d (or 0-d) tensor: torch's IndexError "index out of range
  in self" (its 1-d loop), a RuntimeError naming the dim for the others;
- `masked_select` with a mask that does not broadcast: torch's broadcast error;
- `linalg.lstsq`: torch's checks of rank, dtype, rows, driver and batch, and its shapes.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import bridge
from tests.ops.harness import (
  assert_checked_program_raises,
  assert_raises_like_cpu,
  error_message,
)

aten = torch.ops.aten
Z, ONES = torch.zeros, torch.ones


def _t(d, *values, **kwargs):
  return torch.tensor(values, device=d, **kwargs)


def _r(*shape, seed=0, dtype=torch.float64):
  x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
  return (x * 4).to(dtype)


def _lstsq(a_shape, b_shape, a_dtype=torch.float64, b_dtype=torch.float64, **kwargs):
  a, b = _r(*a_shape, dtype=a_dtype), _r(*b_shape, seed=1, dtype=b_dtype)
  return lambda d: torch.linalg.lstsq(a.to(d), b.to(d), **kwargs)


# name -> op on device `d`; torch on CPU raises for each, and the `jax` device did not (it
# returned a value or raised another error) before these checks.
RAISES = {
  # max_unpool: an index outside the output (1-d is unpooled as an (L, 1) plane)
  "max_unpool1d": lambda d: F.max_unpool1d(ONES(1, 1, 2, device=d), _t(d, [[0, 9]]), 2),
  "max_unpool1d_negative": lambda d: F.max_unpool1d(ONES(1, 1, 2, device=d), _t(d, [[0, -1]]), 2),
  "max_unpool1d_unbatched": lambda d: F.max_unpool1d(ONES(1, 2, device=d), _t(d, [4, 1]), 2),
  "max_unpool2d": lambda d: F.max_unpool2d(ONES(1, 1, 1, 2, device=d), _t(d, [[[0, 9]]]), 2),
  "max_unpool2d_unbatched": lambda d: F.max_unpool2d(ONES(1, 1, 2, device=d), _t(d, [[0, 8]]), 2),
  "max_unpool2d_second_plane": lambda d: F.max_unpool2d(
    ONES(2, 1, 1, 2, device=d), _t(d, [[[0, 1]]], [[[-2, 3]]]), 2
  ),
  "max_unpool2d_output_size": lambda d: F.max_unpool2d(
    ONES(1, 1, 2, 2, device=d), _t(d, [[[0, 1], [2, 25]]]), 2, output_size=(5, 5)
  ),
  "max_unpool3d": lambda d: F.max_unpool3d(ONES(1, 1, 1, 1, 2, device=d), _t(d, [[[[0, 99]]]]), 2),
  "max_unpool3d_negative": lambda d: F.max_unpool3d(
    ONES(1, 1, 1, 1, 2, device=d), _t(d, [[[[-3, 1]]]]), 2
  ),
  "max_unpool3d_unbatched": lambda d: F.max_unpool3d(
    ONES(1, 1, 1, 2, device=d), _t(d, [[[16, 0]]]), 2
  ),
  # upsample: every spatial size, in and out, > 0 (the nearest modes were already refused)
  "upsample_bilinear2d_output_0": lambda d: aten.upsample_bilinear2d(
    Z(1, 1, 4, 4, device=d), [0, 2], False
  ),
  "upsample_bilinear2d_input_0": lambda d: aten.upsample_bilinear2d(
    Z(1, 1, 0, 4, device=d), [2, 2], False
  ),
  "upsample_bilinear2d_channels_0": lambda d: aten.upsample_bilinear2d(
    Z(1, 0, 4, 4, device=d), [2, 2], False
  ),
  "upsample_bicubic2d_output_0": lambda d: aten.upsample_bicubic2d(
    Z(1, 1, 4, 4, device=d), [2, 0], True
  ),
  "upsample_bicubic2d_channels_0": lambda d: aten.upsample_bicubic2d(
    Z(1, 0, 4, 4, device=d), [2, 2], False
  ),
  "upsample_linear1d_output_0": lambda d: aten.upsample_linear1d(Z(1, 1, 4, device=d), [0], False),
  "upsample_linear1d_input_0": lambda d: aten.upsample_linear1d(Z(1, 1, 0, device=d), [2], False),
  "upsample_linear1d_channels_0": lambda d: aten.upsample_linear1d(
    Z(1, 0, 4, device=d), [2], False
  ),
  "upsample_trilinear3d_output_0": lambda d: aten.upsample_trilinear3d(
    Z(1, 1, 4, 4, 4, device=d), [0, 2, 2], False
  ),
  "upsample_trilinear3d_input_0": lambda d: aten.upsample_trilinear3d(
    Z(1, 1, 0, 4, 4, device=d), [2, 2, 2], False
  ),
  "upsample_trilinear3d_channels_0": lambda d: aten.upsample_trilinear3d(
    Z(1, 0, 4, 4, 4, device=d), [2, 2, 2], False
  ),
  "upsample_nearest2d_channels_0": lambda d: aten.upsample_nearest2d(
    Z(1, 0, 4, 4, device=d), [2, 2]
  ),
  "interpolate_bilinear_scale_to_0": lambda d: F.interpolate(
    Z(1, 1, 4, 4, device=d), scale_factor=0.1, mode="bilinear"
  ),
  "interpolate_linear_scale_to_0": lambda d: F.interpolate(
    Z(1, 1, 4, device=d), scale_factor=0.1, mode="linear"
  ),
  "interpolate_trilinear_scale_to_0": lambda d: F.interpolate(
    Z(1, 1, 4, 4, 4, device=d), scale_factor=0.2, mode="trilinear"
  ),
  "interpolate_bicubic_size_0": lambda d: F.interpolate(
    Z(1, 1, 4, 4, device=d), size=(0, 3), mode="bicubic"
  ),
  "upsample_bilinear2d_vec_scale_to_0": lambda d: aten.upsample_bilinear2d.vec(
    Z(1, 1, 4, 4, device=d), None, False, [0.1, 1.0]
  ),
  # adaptive_avg_pool: no empty non-batch dim (2-d: the spatial dims; 3-d: all but the batch)
  "adaptive_avg_pool2d_empty_height": lambda d: F.adaptive_avg_pool2d(Z(1, 1, 0, 4, device=d), 2),
  "adaptive_avg_pool2d_empty_width": lambda d: F.adaptive_avg_pool2d(Z(1, 1, 4, 0, device=d), 2),
  "adaptive_avg_pool2d_unbatched": lambda d: F.adaptive_avg_pool2d(Z(1, 0, 4, device=d), 2),
  "adaptive_avg_pool2d_both_empty": lambda d: F.adaptive_avg_pool2d(Z(1, 0, 0, 4, device=d), 2),
  "adaptive_avg_pool2d_empty_batch_too": lambda d: F.adaptive_avg_pool2d(
    Z(0, 1, 0, 4, device=d), 2
  ),
  "adaptive_avg_pool1d_empty_length": lambda d: F.adaptive_avg_pool1d(Z(1, 1, 0, device=d), 2),
  "adaptive_avg_pool1d_unbatched": lambda d: F.adaptive_avg_pool1d(Z(4, 0, device=d), 2),
  "adaptive_avg_pool3d_empty_height": lambda d: F.adaptive_avg_pool3d(
    Z(1, 1, 2, 0, 4, device=d), 2
  ),
  "adaptive_avg_pool3d_empty_channels": lambda d: F.adaptive_avg_pool3d(
    Z(1, 0, 2, 4, 4, device=d), 2
  ),
  "adaptive_avg_pool3d_unbatched": lambda d: F.adaptive_avg_pool3d(Z(2, 0, 2, 2, device=d), 2),
  "adaptive_avg_pool3d_float16": lambda d: F.adaptive_avg_pool3d(
    Z(1, 1, 2, 0, 4, dtype=torch.float16, device=d), 2
  ),
  # index_add out of range: a 1-d (or 0-d) tensor's error is an IndexError
  "index_add_1d": lambda d: Z(3, device=d).index_add(0, _t(d, 5), ONES(1, device=d)),
  "index_add_1d_negative": lambda d: Z(3, device=d).index_add(0, _t(d, -1), ONES(1, device=d)),
  "index_add_1d_in_place_alpha": lambda d: Z(3, device=d).index_add_(
    0, _t(d, 1, 3), ONES(2, device=d), alpha=2
  ),
  "index_add_1d_int32_index": lambda d: Z(3, device=d).index_add(
    0, _t(d, 7, dtype=torch.int32), ONES(1, device=d)
  ),
  "index_add_1d_long": lambda d: Z(3, dtype=torch.int64, device=d).index_add(
    0, _t(d, 3), ONES(1, dtype=torch.int64, device=d)
  ),
  "index_add_0d": lambda d: torch.tensor(1.0, device=d).index_add(
    0, _t(d, 1), torch.tensor(1.0, device=d)
  ),
  # masked_select: the mask and the tensor broadcast (torch's `infer_size` error)
  "masked_select_short_mask": lambda d: Z(3, device=d).masked_select(_t(d, True, False)),
  "masked_select_last_dim": lambda d: Z(3, 2, device=d).masked_select(_t(d, True, False, True)),
  "masked_select_long_mask": lambda d: Z(2, 3, device=d).masked_select(
    ONES(4, 3, 1, dtype=torch.bool, device=d)
  ),
  # linalg.lstsq's argument checks, in torch's order
  "lstsq_rows": _lstsq((3, 2), (4, 1)),
  "lstsq_rows_vector": _lstsq((3, 2), (4,)),
  "lstsq_rows_batched": _lstsq((2, 3, 2), (2, 4, 1)),
  "lstsq_rows_one_dim_fewer": _lstsq((2, 3, 2), (1, 3)),
  "lstsq_input_1d": _lstsq((3,), (3,)),
  "lstsq_other_more_dims": _lstsq((3, 2), (2, 3, 1)),
  "lstsq_other_two_dims_fewer": _lstsq((2, 3, 2), (3,)),
  "lstsq_dtypes": _lstsq((3, 2), (3, 1), torch.float32, torch.float64),
  "lstsq_driver": _lstsq((3, 2), (3, 1), driver="foo"),
  "lstsq_driver_empty": _lstsq((3, 2), (3, 1), driver=""),
  "lstsq_driver_before_batch": _lstsq((2, 3, 2), (3, 3, 1), driver="gelsd_"),
  "lstsq_batch": _lstsq((2, 3, 2), (3, 3, 1)),
  "lstsq_batch_with_rows": _lstsq((2, 3, 2), (3, 1)),
  "lstsq_batch_two_dims": _lstsq((2, 1, 4, 2), (3, 4, 1)),
  "lstsq_batch_copy": _lstsq((1, 1, 4, 2), (2, 4, 1)),
  "lstsq_batch_output": _lstsq((1, 1, 1, 2), (3, 1, 1)),
}

# Controls: torch's errors the `jax` device raised already (its meta kernels, or the checks of
# the ops' other paths); they pass before and after these changes.
CONTROLS = {
  "upsample_nearest2d_output_0": lambda d: aten.upsample_nearest2d(Z(1, 1, 4, 4, device=d), [0, 2]),
  "upsample_nearest1d_output_0": lambda d: aten.upsample_nearest1d(Z(1, 1, 4, device=d), [0]),
  "upsample_nearest3d_output_0": lambda d: aten.upsample_nearest3d(
    Z(1, 1, 4, 4, 4, device=d), [2, 0, 2]
  ),
  "upsample_nearest_exact2d_output_0": lambda d: aten._upsample_nearest_exact2d(
    Z(1, 1, 4, 4, device=d), [0, 2]
  ),
  "upsample_bilinear2d_aa_output_0": lambda d: aten._upsample_bilinear2d_aa(
    Z(1, 1, 4, 4, device=d), [0, 2], False
  ),
  "upsample_bicubic2d_aa_input_0": lambda d: aten._upsample_bicubic2d_aa(
    Z(1, 1, 4, 0, device=d), [2, 2], False
  ),
  "upsample_bilinear2d_aa_channels_0": lambda d: aten._upsample_bilinear2d_aa(
    Z(1, 0, 4, 4, device=d), [2, 2], False
  ),
  "adaptive_max_pool2d_empty_height": lambda d: F.adaptive_max_pool2d(Z(1, 1, 0, 4, device=d), 2),
  "adaptive_max_pool1d_empty_length": lambda d: F.adaptive_max_pool1d(Z(1, 1, 0, device=d), 2),
  "adaptive_max_pool3d_empty_height": lambda d: F.adaptive_max_pool3d(
    Z(1, 1, 2, 0, 4, device=d), 2
  ),
  "index_add_2d": lambda d: Z(3, 4, device=d).index_add(0, _t(d, 5), ONES(1, 4, device=d)),
  "index_add_2d_dim1_negative": lambda d: Z(3, 4, device=d).index_add(
    1, _t(d, -1), ONES(3, 1, device=d)
  ),
  "index_copy_1d": lambda d: Z(3, device=d).index_copy(0, _t(d, 5), ONES(1, device=d)),
  "index_fill_1d": lambda d: Z(3, device=d).index_fill(0, _t(d, -4), 1.0),
  "index_put_1d": lambda d: Z(3, device=d).index_put((_t(d, 5),), torch.tensor(1.0, device=d)),
  "put_1d": lambda d: Z(3, device=d).put(_t(d, 5), _t(d, 1.0)),
  "index_reduce_1d": lambda d: Z(3, device=d).index_reduce(0, _t(d, 5), ONES(1, device=d), "prod"),
  "masked_fill_short_mask": lambda d: Z(3, device=d).masked_fill(_t(d, True, False), 1.0),
  "upsample_linear1d_negative": lambda d: aten.upsample_linear1d(Z(1, 1, 4, device=d), [-1], False),
  "upsample_bilinear2d_backward_output_0": lambda d: aten.upsample_bilinear2d_backward(
    Z(1, 1, 0, 2, device=d), [0, 2], [1, 1, 4, 4], False
  ),
  "lstsq_dtypes_complex": _lstsq((3, 2), (3, 1), torch.float64, torch.complex128),
  "lstsq_integers": _lstsq((3, 2), (3, 1), torch.int64, torch.int64),
}


@pytest.mark.parametrize("name", list(RAISES))
def test_raises_torchs_error(name):
  assert_raises_like_cpu(RAISES[name])


@pytest.mark.parametrize("name", list(CONTROLS))
def test_control_raised_torchs_error_already(name):
  assert_raises_like_cpu(CONTROLS[name])


def test_max_unpool_reports_the_last_bad_index_as_torch_on_one_thread():
  # torch's CPU kernel keeps the last bad index it meets (several threads race for it)
  def unpool(d):
    idx = _t(d, [[[9, 7]], [[0, 1]], [[1, -5]]])
    return F.max_unpool2d(ONES(1, 3, 1, 2, device=d), idx, 2)

  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  try:
    with pytest.raises(RuntimeError) as expected:
      unpool("cpu")
  finally:
    torch.set_num_threads(threads)
  with pytest.raises(RuntimeError) as got:
    unpool("jax")
  assert (
    str(got.value)
    == str(expected.value)
    == ("Found an invalid max index: -5 (output volumes are of size 2x4)")
  )


# name -> op on device `d` that torch accepts: the same values (and shapes) as torch's.
GOOD = {
  "adaptive_max_pool2d_output_0": lambda d: F.adaptive_max_pool2d(
    torch.arange(16.0, device=d).reshape(1, 1, 4, 4), (0, 2), return_indices=True
  ),
  "adaptive_max_pool2d_output_0_width": lambda d: F.adaptive_max_pool2d(
    torch.arange(16.0, device=d).reshape(1, 1, 4, 4), (2, 0)
  ),
  "adaptive_max_pool1d_output_0": lambda d: F.adaptive_max_pool1d(
    torch.arange(4.0, device=d).reshape(1, 1, 4), 0, return_indices=True
  ),
  "adaptive_max_pool3d_output_0": lambda d: F.adaptive_max_pool3d(
    ONES(1, 1, 4, 4, 4, device=d), (2, 0, 2), return_indices=True
  ),
  "lstsq_rank_of_inputs_batch": _lstsq((1, 4, 2), (2, 4, 3), driver="gelsd"),
  "lstsq_rank_of_inputs_batch_gelsy": _lstsq((1, 3, 2), (2, 3, 1)),
  "lstsq_batch_of_rows": _lstsq((1, 3, 2), (3, 1)),
  "lstsq_batch_of_rows_gelsd": _lstsq((1, 4, 2), (4, 3), driver="gelsd"),
  "lstsq_batch_of_rows_4d": _lstsq((2, 1, 4, 2), (1, 4, 1), driver="gelss"),
}

# Controls: valid inputs whose values the changes keep (they pass before and after).
GOOD_CONTROLS = {
  "max_unpool1d": lambda d: F.max_unpool1d(_t(d, [[1.0, 2.0]]), _t(d, [[0, 3]]), 2),
  "max_unpool2d": lambda d: F.max_unpool2d(
    torch.arange(1.0, 9.0, device=d).reshape(2, 1, 2, 2),
    _t(d, [[[0, 3], [12, 15]]], [[[5, 6], [9, 10]]]),
    2,
  ),
  "max_unpool2d_of_max_pool": lambda d: F.max_unpool2d(
    *F.max_pool2d(torch.arange(36.0, device=d).reshape(1, 1, 6, 6), 2, return_indices=True), 2
  ),
  "max_unpool3d": lambda d: F.max_unpool3d(
    *F.max_pool3d(torch.arange(64.0, device=d).reshape(1, 1, 4, 4, 4), 2, return_indices=True),
    2,
  ),
  "max_unpool2d_empty_batch": lambda d: F.max_unpool2d(
    ONES(0, 1, 1, 2, device=d), torch.zeros(0, 1, 1, 2, dtype=torch.int64, device=d), 2
  ),
  "upsample_bilinear2d": lambda d: F.interpolate(
    _r(1, 2, 3, 4).to(d), size=(5, 7), mode="bilinear"
  ),
  "upsample_bilinear2d_empty_batch": lambda d: aten.upsample_bilinear2d(
    Z(0, 1, 4, 4, device=d), [2, 2], False
  ),
  "upsample_bicubic2d": lambda d: F.interpolate(
    _r(1, 2, 3, 4).to(d), scale_factor=1.5, mode="bicubic", align_corners=True
  ),
  "upsample_linear1d": lambda d: F.interpolate(_r(1, 2, 5).to(d), size=3, mode="linear"),
  "upsample_trilinear3d": lambda d: F.interpolate(
    _r(1, 1, 2, 3, 4).to(d), scale_factor=2, mode="trilinear"
  ),
  "upsample_bilinear2d_aa": lambda d: F.interpolate(
    _r(1, 1, 8, 8).to(d), size=(3, 5), mode="bilinear", antialias=True
  ),
  "upsample_nearest2d": lambda d: F.interpolate(_r(1, 1, 3, 3).to(d), size=(5, 4)),
  "adaptive_avg_pool2d": lambda d: F.adaptive_avg_pool2d(_r(2, 3, 5, 7).to(d), (2, 3)),
  "adaptive_avg_pool2d_empty_channels": lambda d: F.adaptive_avg_pool2d(Z(1, 0, 4, 4, device=d), 2),
  "adaptive_avg_pool2d_empty_batch": lambda d: F.adaptive_avg_pool2d(Z(0, 1, 4, 4, device=d), 2),
  "adaptive_avg_pool2d_output_0": lambda d: F.adaptive_avg_pool2d(Z(1, 1, 4, 4, device=d), (0, 2)),
  "adaptive_avg_pool1d": lambda d: F.adaptive_avg_pool1d(_r(2, 3, 7).to(d), 3),
  "adaptive_avg_pool3d": lambda d: F.adaptive_avg_pool3d(_r(1, 2, 3, 4, 5).to(d), 2),
  "adaptive_avg_pool3d_empty_batch": lambda d: F.adaptive_avg_pool3d(Z(0, 2, 2, 2, device=d), 1),
  "adaptive_avg_pool3d_float16": lambda d: F.adaptive_avg_pool3d(
    _r(1, 2, 3, 4, 5).to(torch.float16).to(d), 2
  ),
  "adaptive_max_pool2d": lambda d: F.adaptive_max_pool2d(
    _r(2, 3, 5, 7).to(d), (2, 3), return_indices=True
  ),
  "index_add_1d": lambda d: Z(3, device=d).index_add(0, _t(d, 2, 0, 2), _t(d, 1.0, 2.0, 3.0)),
  "index_add_1d_alpha": lambda d: Z(3, device=d).index_add(0, _t(d, 1), _t(d, 5.0), alpha=2),
  "index_add_0d": lambda d: torch.tensor(1.0, device=d).index_add(
    0, _t(d, 0), torch.tensor(2.0, device=d)
  ),
  "index_add_2d": lambda d: Z(3, 4, device=d).index_add(1, _t(d, 3, 0), ONES(3, 2, device=d)),
  "masked_select": lambda d: (
    torch.arange(6.0, device=d).reshape(2, 3).masked_select(_t(d, True, False, True))
  ),
  "masked_select_broadcast_self": lambda d: torch.arange(3.0, device=d).masked_select(
    _t(d, [True, False, True], [False, True, True])
  ),
  "lstsq": _lstsq((4, 2), (4, 3)),
  "lstsq_gelsd": _lstsq((4, 2), (4, 3), driver="gelsd"),
  "lstsq_gels": _lstsq((4, 2), (4, 1), driver="gels"),
  "lstsq_batched": _lstsq((2, 4, 2), (2, 4, 3), driver="gelss"),
  "lstsq_broadcast_other": _lstsq((2, 4, 2), (1, 4, 3), driver="gelsd"),
  "lstsq_batch_of_vectors": _lstsq((2, 3, 2), (2, 3)),
  "lstsq_same_rows_one_dim_fewer": _lstsq((3, 3, 2), (3, 1)),
  "lstsq_vector": _lstsq((3, 2), (3,)),
  "lstsq_wide": _lstsq((2, 4), (2, 2), driver="gelsd"),
  "lstsq_float32": _lstsq((4, 3), (4, 2), torch.float32, torch.float32),
}


def _assert_same(got, expected):
  if isinstance(expected, (tuple, list)):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
      _assert_same(g, e)
    return
  got = got.cpu()
  assert got.shape == expected.shape, (got.shape, expected.shape)
  assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
  torch.testing.assert_close(got, expected, equal_nan=True)


@pytest.mark.parametrize("name", list(GOOD))
def test_valid_arguments_give_torchs_values(name):
  _assert_same(GOOD[name]("jax"), GOOD[name]("cpu"))


@pytest.mark.parametrize("name", list(GOOD_CONTROLS))
def test_control_valid_arguments_keep_torchs_values(name):
  _assert_same(GOOD_CONTROLS[name]("jax"), GOOD_CONTROLS[name]("cpu"))


# --- bridge.compile -------------------------------------------------------------------------

# Arguments torch refuses by their shapes: refused while the program is traced, with torch's
# exception and message, whatever `check_indices` says.
COMPILE_RAISES = {
  "upsample_bilinear2d": (
    lambda x: aten.upsample_bilinear2d(x, [0, 2], False),
    (Z(1, 1, 4, 4),),
  ),
  "interpolate_trilinear": (
    lambda x: F.interpolate(x, scale_factor=0.2, mode="trilinear"),
    (Z(1, 1, 4, 4, 4),),
  ),
  "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, 2), (Z(1, 1, 0, 4),)),
  "adaptive_avg_pool3d": (lambda x: F.adaptive_avg_pool3d(x, 2), (Z(1, 0, 2, 4, 4),)),
  "lstsq_rows": (lambda a, b: torch.linalg.lstsq(a, b).solution, (Z(3, 2), Z(4, 1))),
  "lstsq_batch": (lambda a, b: torch.linalg.lstsq(a, b).solution, (Z(2, 3, 2), Z(3, 1))),
  "lstsq_dtypes": (
    lambda a, b: torch.linalg.lstsq(a, b).solution,
    (Z(3, 2), Z(3, 1, dtype=torch.float64)),
  ),
}


@pytest.mark.parametrize("checked", [False, True], ids=["unchecked", "check_indices"])
@pytest.mark.parametrize("name", list(COMPILE_RAISES))
def test_bridge_compile_raises_torchs_error_for_shapes(name, checked):
  fn, args = COMPILE_RAISES[name]
  with pytest.raises(Exception) as expected:
    fn(*args)
  with bridge.config(check_indices=checked):
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value))) as got:
      bridge.compile(fn)(*args)
  assert error_message(got.value) == error_message(expected.value)


# Values torch refuses (an index out of range): in a compiled program, checked only with
# `bridge.config(check_indices=True)`; the error names the op (torch's exception, or JAX's
# runtime error wrapping it).
COMPILE_VALUES = {
  "max_unpool1d": (
    lambda x, i: F.max_unpool1d(x, i, 2),
    (ONES(1, 1, 2), torch.tensor([[[0, 9]]])),
    "aten.max_unpool2d.default",
  ),
  "max_unpool2d": (
    lambda x, i: F.max_unpool2d(x, i, 2),
    (ONES(1, 1, 1, 2), torch.tensor([[[[-1, 3]]]])),
    "aten.max_unpool2d.default",
  ),
  "max_unpool3d": (
    lambda x, i: F.max_unpool3d(x, i, 2),
    (ONES(1, 1, 1, 1, 2), torch.tensor([[[[[0, 99]]]]])),
    "aten.max_unpool3d.default",
  ),
  "index_add_1d": (
    lambda x, i: x.index_add(0, i, torch.ones(1)),
    (Z(3), torch.tensor([5])),
    "aten.index_add.default",
  ),
}


@pytest.mark.parametrize("name", list(COMPILE_VALUES))
def test_bridge_compile_with_check_indices_raises_torchs_error(name):
  fn, args, op = COMPILE_VALUES[name]
  with pytest.raises(Exception) as expected:
    fn(*args)
  assert_checked_program_raises(fn, args, op, expected.value)


def test_control_bridge_compile_unchecked_drops_the_bad_unpool_index():
  # (the documented default inside a program: unchecked, like CUDA's asynchronous asserts)
  fn, args, _ = COMPILE_VALUES["max_unpool1d"]
  torch.testing.assert_close(bridge.compile(fn)(*args), torch.tensor([[[1.0, 0.0, 0.0, 0.0]]]))


def test_control_bridge_compile_with_check_indices_keeps_valid_unpool_values():
  def fn(x):
    return F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2)

  x = torch.arange(36.0).reshape(1, 1, 6, 6)
  with bridge.config(check_indices=True):
    compiled = bridge.compile(fn)
    torch.testing.assert_close(compiled(x), fn(x))


def test_lstsq_eager_and_compiled_agree_on_shapes():
  a, b = _r(1, 3, 2), _r(3, 1, seed=1)

  def fn(a, b):
    return torch.linalg.lstsq(a, b).solution

  expected = fn(a, b)
  assert expected.shape == (3, 2, 1)
  torch.testing.assert_close(bridge.compile(fn)(a, b), expected)
