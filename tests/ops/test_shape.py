"""Shape-family lowerings against torch on CPU (table-driven)."""

from __future__ import annotations

import pytest
import torch

from tests.ops.harness import check, random_tensors

aten = torch.ops.aten
_gen = torch.Generator().manual_seed(0)
r = random_tensors(_gen)


def ar(*shape, dtype=torch.float32):
  n = 1
  for s in shape:
    n *= s
  return torch.arange(n).reshape(shape).to(dtype)


CASES = [
  # (op, args, kwargs)
  (aten.cat.default, ([r(2, 3), r(4, 3)],), {}),
  (aten.cat.default, ([r(2, 3), r(2, 1)], 1), {}),
  (aten.cat.default, ([r(2, 3), r(2, 2)], -1), {}),
  (aten.cat.default, ([r(2, 3, dtype=torch.int32), r(1, 3)],), {}),  # promotion
  (aten.cat.default, ([r(2, 3, dtype=torch.int64), r(1, 3, dtype=torch.bool)],), {}),
  (aten.cat.default, ([torch.empty(0, dtype=torch.float64), r(2, 3)],), {}),  # legacy skip
  (aten.cat.default, ([torch.empty(0), torch.empty(0)],), {}),
  (aten.cat.default, ([r(3)],), {}),
  (aten.stack.default, ([r(2, 3), r(2, 3)],), {}),
  (aten.stack.default, ([r(2, 3), r(2, 3), r(2, 3)], -1), {}),
  (aten.stack.default, ([r(2, dtype=torch.int64), r(2)], 1), {}),
  (aten.stack.default, ([r(()), r(())],), {}),
  (aten.clone.default, (r(3, 4),), {}),
  (
    aten.clone.default,
    (r(3, 4, dtype=torch.bfloat16),),
    {"memory_format": torch.contiguous_format},
  ),
  (aten._unsafe_view.default, (r(3, 4), [2, -1]), {}),
  (aten.view_copy.default, (r(3, 4), [12]), {}),
  (aten.view_copy.default, (r(3, 4), [-1, 2, 3]), {}),
  (aten.view_copy.dtype, (r(3, 4), torch.int32), {}),
  (aten.view_copy.dtype, (r(3, 4), torch.float16), {}),
  (aten.view_copy.dtype, (r(3, 4, dtype=torch.float16), torch.float32), {}),
  (aten.view_copy.dtype, (ar(2, 8, dtype=torch.uint8), torch.int64), {}),
  (aten.view_copy.dtype, (r(5, dtype=torch.bool), torch.uint8), {}),
  (aten.expand_copy.default, (r(3, 1), [2, 3, 4]), {}),
  (aten.expand_copy.default, (r(3, 1), [-1, 5]), {}),
  (aten.permute_copy.default, (r(2, 3, 4), [2, 0, 1]), {}),
  (aten.permute_copy.default, (r(2, 3, 4), [-1, 1, 0]), {}),
  (aten.transpose_copy.int, (r(2, 3, 4), 0, -1), {}),
  (aten.t_copy.default, (r(2, 3),), {}),
  (aten.t_copy.default, (r(3),), {}),
  (aten.unsqueeze_copy.default, (r(2, 3), -1), {}),
  (aten.unsqueeze_copy.default, (r(2, 3), 1), {}),
  (aten.squeeze_copy.default, (r(1, 3, 1),), {}),
  (aten.squeeze_copy.dim, (r(1, 3, 1), 1), {}),  # not size 1: unchanged
  (aten.squeeze_copy.dim, (r(1, 3, 1), -1), {}),
  (aten.squeeze_copy.dims, (r(1, 3, 1), [0, 1, 2]), {}),
  (aten.select_copy.int, (r(3, 4), 1, -1), {}),
  (aten.select_copy.int, (r(3, 4), 0, 2), {}),
  (aten.slice_copy.Tensor, (r(6, 4), 0, 1, 5, 2), {}),
  (aten.slice_copy.Tensor, (r(6, 4), 1, -3, None), {}),
  (aten.slice_copy.Tensor, (r(6, 4), 0, None, 100), {}),
  (aten.narrow_copy.default, (r(6, 4), 0, 2, 3), {}),
  (aten.narrow_copy.default, (r(6, 4), -1, -3, 2), {}),
  (aten.diagonal_copy.default, (r(3, 4),), {}),
  (aten.diagonal_copy.default, (r(2, 3, 4), 1, -1, 1), {}),
  (aten.diagonal_copy.default, (r(3, 4), -1), {}),
  (aten.unfold_copy.default, (ar(2, 7), 1, 3, 2), {}),
  (aten.unfold_copy.default, (ar(5, 2), 0, 2, 1), {}),
  (aten.split_with_sizes_copy.default, (r(6, 4), [1, 2, 3]), {}),
  (aten.split_with_sizes_copy.default, (r(6, 4), [3, 1], -1), {}),
  (aten.split_copy.Tensor, (r(7, 4), 3), {}),
  (aten.split_copy.Tensor, (r(7, 4), 2, 1), {}),
  (aten.unbind_copy.int, (r(3, 4),), {}),
  (aten.unbind_copy.int, (r(3, 4), -1), {}),
  (aten.alias_copy.default, (r(2, 2),), {}),
  (aten.detach_copy.default, (r(2, 2),), {}),
  (aten.view_as_real_copy.default, (r(3, dtype=torch.complex64),), {}),
  (aten.view_as_complex_copy.default, (r(3, 2),), {}),
  (aten.repeat.default, (r(2, 3), [2, 1]), {}),
  (aten.repeat.default, (r(2, 3), [2, 1, 3]), {}),
  (aten.repeat.default, (r(()), [4]), {}),
  (aten.flip.default, (ar(2, 3, 4), [0, -1]), {}),
  (aten.flip.default, (ar(2, 3), []), {}),
  (aten.roll.default, (ar(3, 4), [1]), {}),  # flattened
  (aten.roll.default, (ar(3, 4), [1, -2], [0, 1]), {}),
  (aten.roll.default, (ar(3, 4), [5], [-1]), {}),
  (aten.tril.default, (r(4, 5),), {}),
  (aten.tril.default, (r(2, 4, 5), -1), {}),
  (aten.triu.default, (r(4, 5), 2), {}),
  (aten.triu.default, (r(3, 4, 5, dtype=torch.int32),), {}),
  (aten.constant_pad_nd.default, (r(2, 3), [1, 2]), {}),
  (aten.constant_pad_nd.default, (r(2, 3), [1, -1, 2, 0], 1.5), {}),
  (aten.constant_pad_nd.default, (ar(2, 3, dtype=torch.int64), [1, 1], 2.7), {}),
  (aten.constant_pad_nd.default, (r(2, 3, 4), [0, 0, 0, 0, 1, 1], -3), {}),
  (aten.reflection_pad1d.default, (r(2, 3, 5), [2, 3]), {}),
  (aten.reflection_pad1d.default, (r(3, 5), [-1, 2]), {}),
  (aten.diagonal_scatter.default, (r(4, 5), r(4)), {}),
  (aten.diagonal_scatter.default, (r(4, 5), r(3), 2), {}),
  (aten.diagonal_scatter.default, (r(4, 5), r(2), -2), {}),
  (aten.diagonal_scatter.default, (r(3, 4, 5), r(5, 3), 0, 0, 1), {}),
  (aten.diagonal_scatter.default, (r(3, 4, 5), r(4, 2), 1, 2, 0), {}),
  (aten.diagonal_scatter.default, (r(2, 3), r(0), 5), {}),
  (aten.reflection_pad2d.default, (r(2, 4, 5), [1, 2, 3, 0]), {}),
  (aten.reflection_pad3d.default, (r(1, 3, 4, 5), [1, 1, 2, 0, 1, 2]), {}),
  (aten.replication_pad1d.default, (r(2, 3, 5), [2, 3]), {}),
  (aten.replication_pad1d.default, (r(3, 5), [1, -2]), {}),
  (aten.replication_pad2d.default, (r(2, 4, 5), [4, 2, 3, 0]), {}),
  (aten.replication_pad3d.default, (r(1, 3, 4, 5), [1, 1, 2, 0, 1, 2]), {}),
]

PAD_BACKWARD = [
  (aten.reflection_pad1d_backward.default, (2, 3, 5), [2, 3]),
  (aten.reflection_pad2d_backward.default, (2, 4, 5), [1, 2, 3, 0]),
  (aten.reflection_pad3d_backward.default, (1, 3, 4, 5), [1, 1, 2, 0, 1, 2]),
  (aten.replication_pad1d_backward.default, (2, 3, 5), [2, 3]),
  (aten.replication_pad2d_backward.default, (2, 4, 5), [4, 2, 3, 0]),
  (aten.replication_pad3d_backward.default, (1, 3, 4, 5), [1, 1, 2, 0, 1, 2]),
]


def _id(case):
  return str(case[0]).replace("aten.", "")


@pytest.mark.parametrize("op,args,kwargs", CASES, ids=[_id(c) for c in CASES])
def test_shape_op(op, args, kwargs):
  check(op, *args, **kwargs)


@pytest.mark.parametrize("op,shape,padding", PAD_BACKWARD, ids=[_id(c) for c in PAD_BACKWARD])
def test_pad_backward(op, shape, padding):
  self = r(*shape)
  forward = getattr(aten, str(op).split(".")[1].removesuffix("_backward")).default
  grad = r(*forward(self, padding).shape)
  check(op, grad, self, padding)
