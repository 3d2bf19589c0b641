"""Creation-family lowerings against torch on CPU (table-driven)."""

from __future__ import annotations

import pytest
import torch

from tests.ops.harness import check, run_direct

aten = torch.ops.aten
_gen = torch.Generator().manual_seed(0)


def r(*shape, dtype=torch.float32):
  return torch.randn(*shape, generator=_gen).to(dtype)


X = r(2, 3)
XI = torch.arange(6, dtype=torch.int32).reshape(2, 3)

CASES = [
  # (op, args, kwargs)
  (aten.full.default, ([2, 3], 1.5), {}),
  (aten.full.default, ([2, 3], 7), {}),  # int -> int64
  (aten.full.default, ([4], True), {}),  # bool -> bool
  (aten.full.default, ([2], 1 + 2j), {}),
  (aten.full.default, ([2, 3], 2.7), {"dtype": torch.int32}),  # truncates
  (aten.full.default, ([2, 3], -2.7), {"dtype": torch.int64}),
  (aten.full.default, ([3], 0.5), {"dtype": torch.bool}),
  (aten.full.default, ([3], 3), {"dtype": torch.float16}),
  (aten.full.default, ([0, 3], 3.0), {}),
  (aten.full.default, ([], 3.0), {"dtype": torch.float64}),
  (aten.zeros.default, ([2, 3],), {}),
  (aten.zeros.default, ([2, 3],), {"dtype": torch.int64}),
  (aten.zeros.default, ([],), {"dtype": torch.bool}),
  (aten.ones.default, ([2, 3],), {"dtype": torch.bfloat16}),
  (aten.ones.default, ([4],), {}),
  (aten.scalar_tensor.default, (3,), {}),
  (aten.scalar_tensor.default, (True,), {}),
  (aten.scalar_tensor.default, (2.5,), {"dtype": torch.int64}),
  (aten.zeros_like.default, (X,), {}),
  (aten.zeros_like.default, (X,), {"dtype": torch.int8}),
  (aten.ones_like.default, (XI,), {}),
  (aten.ones_like.default, (XI,), {"dtype": torch.float64}),
  (aten.empty_like.default, (X,), {}),  # compared only for shape: zero-filled here
  (aten.full_like.default, (X, 3.5), {}),
  (aten.full_like.default, (XI, 3.5), {}),  # truncates to the int dtype
  (aten.full_like.default, (XI, 2), {"dtype": torch.float32}),
  (aten.new_zeros.default, (XI, [3, 1]), {}),
  (aten.new_zeros.default, (XI, [3]), {"dtype": torch.float16}),
  (aten.new_ones.default, (X, [2, 2]), {}),
  (aten.new_full.default, (XI, [2], 9), {}),
  (aten.new_full.default, (X, [2], 9), {"dtype": torch.int64}),
  (aten.new_empty.default, (X, [2, 4]), {}),
  (aten.new_empty_strided.default, (X, [2, 4], [4, 1]), {}),
  (aten.fill.Scalar, (X, 2.5), {}),
  (aten.fill.Scalar, (XI, 2.5), {}),
  (aten.fill.Scalar, (XI.bool(), 0.5), {}),
  (aten.fill.Tensor, (X, torch.tensor(4.0)), {}),
  (aten.fill.Tensor, (XI, torch.tensor(4.9, dtype=torch.float64)), {}),
  (aten.zero.default, (X,), {}),
  (aten.zero.default, (XI,), {}),
  # ranges
  (aten.arange.default, (5,), {}),
  (aten.arange.default, (5.0,), {}),
  (aten.arange.default, (5,), {"dtype": torch.float32}),
  (aten.arange.default, (0,), {}),
  (aten.arange.start, (2, 9), {}),
  (aten.arange.start, (-3, 3), {"dtype": torch.int32}),
  (aten.arange.start, (0.5, 5), {"dtype": torch.int64}),  # bounds truncated
  (aten.arange.start, (0.5, 4.7), {"dtype": torch.int32}),  # length from the doubles
  (aten.arange.start_step, (0, 10, 3), {}),
  (aten.arange.start_step, (10, 0, -3), {}),
  (aten.arange.start_step, (0.0, 1.0, 0.1), {}),
  (aten.arange.start_step, (1.0, -1.0, -0.25), {"dtype": torch.float64}),
  (aten.arange.start_step, (0, 2, 0.3), {"dtype": torch.float16}),
  (aten.arange.start_step, (-1, 1, 0.001), {}),
  (aten.arange.start_step, (5, 5, 1), {}),  # empty
  (aten.linspace.default, (0, 1, 5), {}),
  (aten.linspace.default, (-2.5, 7.25, 11), {}),
  (aten.linspace.default, (-2.5, 7.25, 11), {"dtype": torch.float64}),
  (aten.linspace.default, (3, -3, 1), {}),
  (aten.linspace.default, (3, -3, 0), {}),
  (aten.linspace.default, (-3, 10, 7), {"dtype": torch.int64}),
  (aten.linspace.default, (0.5, 10.7, 5), {"dtype": torch.int32}),
  (aten.linspace.default, (0, 1, 6), {"dtype": torch.bfloat16}),
  (aten.linspace.default, (0, 1 + 2j, 4), {}),
  (aten.linspace.default, (0, 1000, 1001), {}),
  (aten.linspace.Tensor_Tensor, (torch.tensor(1.0), torch.tensor(4.0), 4), {}),
  (aten.linspace.Tensor_Scalar, (torch.tensor(1, dtype=torch.int64), 4, 7), {}),
  (aten.linspace.Scalar_Tensor, (1, torch.tensor(4.0, dtype=torch.float64), 7), {}),
  (aten.logspace.default, (0, 3, 4), {}),
  (aten.logspace.default, (0.5, 3, 4), {"base": 2.5}),
  (aten.logspace.default, (0, 3, 4, 2.5), {"dtype": torch.int64}),
  (aten.logspace.default, (-2, 2, 9), {"dtype": torch.float64}),
  (aten.logspace.default, (0, 1, 3), {"dtype": torch.complex64}),
  (aten.logspace.Tensor_Tensor, (torch.tensor(0.0), torch.tensor(2.0), 3), {}),
  (aten.logspace.Tensor_Scalar, (torch.tensor(0.0), 2, 5), {"base": 3.0}),
  (aten.logspace.Scalar_Tensor, (-1, torch.tensor(2.0), 5), {}),
  (aten.eye.default, (3,), {}),
  (aten.eye.default, (0,), {}),
  (aten.eye.default, (3,), {"dtype": torch.bool}),
  (aten.eye.m, (2, 4), {}),
  (aten.eye.m, (4, 2), {"dtype": torch.int32}),
  (aten.tril_indices.default, (4, 3), {}),
  (aten.tril_indices.default, (4, 5, 1), {}),
  (aten.tril_indices.default, (3, 3, -1), {"dtype": torch.int32}),
  (aten.tril_indices.default, (0, 3), {}),
  (aten.triu_indices.default, (4, 3), {}),
  (aten.triu_indices.default, (4, 5, -2), {}),
  (aten.triu_indices.default, (3, 5, 2), {"dtype": torch.int32}),
]


def _id(case):
  return str(case[0]).replace("aten.", "")


@pytest.mark.parametrize("op,args,kwargs", CASES, ids=[_id(c) for c in CASES])
def test_creation_op(op, args, kwargs):
  if op in (aten.empty_like.default, aten.new_empty.default, aten.new_empty_strided.default):
    out, expected = run_direct(op, *args, **kwargs)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    assert bool((out == 0).all())
    return
  check(op, *args, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_default_dtype_followed(dtype):
  old = torch.get_default_dtype()
  torch.set_default_dtype(dtype)
  try:
    for op, args in [
      (aten.full.default, ([2], 1.5)),
      (aten.zeros.default, ([2],)),
      (aten.arange.default, (3.0,)),
      (aten.linspace.default, (0, 1, 3)),
      (aten.eye.default, (2,)),
      (aten.scalar_tensor.default, (1,)),
    ]:
      out, expected = run_direct(op, *args)
      assert expected.dtype == dtype and out.dtype == dtype
      torch.testing.assert_close(out, expected)
  finally:
    torch.set_default_dtype(old)


@pytest.mark.parametrize(
  "start,end,step",
  [
    (0, 10**6, 7),
    (-5, 5, 1),
    (10**12, 10**12 + 50, 3),
    (0.1, 3.3, 0.1),
    (0.0, 1.0, 1 / 3),
    (-1, 1, 0.1),
  ],
)
def test_arange_lengths_and_values(start, end, step):
  """Lengths agree exactly (they decide shapes); integer values exactly. Float values are
  start + i * step rounded once from double; torch's SIMD kernel rounds twice in some
  lanes (machine-dependent), so they may differ by one ulp."""
  out, expected = run_direct(aten.arange.start_step, start, end, step)
  assert out.shape == expected.shape and out.dtype == expected.dtype
  exact = not expected.dtype.is_floating_point
  torch.testing.assert_close(out, expected, rtol=0 if exact else 2e-7, atol=0 if exact else 1e-7)


FACTORIES = [c for c in CASES if not any(isinstance(a, torch.Tensor) for a in c[1])]


@pytest.mark.parametrize("op,args,kwargs", FACTORIES, ids=[_id(c) for c in FACTORIES])
def test_factory_on_device(op, args, kwargs):
  """Factories have no tensor argument for `check` to move: ask for the device directly."""
  from tests.ops.harness import device_available

  if not device_available():
    pytest.skip("the jax device is not available")
  expected = op(*args, **kwargs)
  out = op(*args, **kwargs, device="jax")
  assert out.device.type == "jax"
  torch.testing.assert_close(out.cpu(), expected)
