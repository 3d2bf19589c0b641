"""Indexing-family lowerings against torch on CPU (table-driven)."""

from __future__ import annotations

import pytest
import torch

from tests.ops.harness import check, random_tensors

aten = torch.ops.aten
_gen = torch.Generator().manual_seed(0)
r = random_tensors(_gen)


def i(*values):
  return torch.tensor(values, dtype=torch.int64)


def ri(high, *shape):
  return torch.randint(0, high, shape, generator=_gen)


def m(*shape):
  return torch.rand(*shape, generator=_gen) > 0.5


def perm_index(n, *shape):
  """An index (along its last dim... flattened) with no duplicates: safe for scatter/set."""
  return torch.randperm(n, generator=_gen)[: int(torch.tensor(shape).prod())].reshape(shape)


X = r(4, 5)
X3 = r(3, 4, 5)
MASK45 = m(4, 5)
MASK4 = m(4)

CASES = [
  # (op, args, kwargs)
  # advanced indexing
  (aten.index.Tensor, (X, [i(0, 2, -1)]), {}),
  (aten.index.Tensor, (X, [None, i(1, -2)]), {}),
  (aten.index.Tensor, (X, [i(0, 1), i(2, 3)]), {}),
  (aten.index.Tensor, (X, [i(0, 1)[:, None], i(2, 3, 4)]), {}),  # broadcast
  (aten.index.Tensor, (X3, [i(0, 2), None, i(1, 3)]), {}),  # non-adjacent: dims first
  (aten.index.Tensor, (X3, [None, i(0, 2), i(1, 3)]), {}),  # adjacent: in place
  (aten.index.Tensor, (X, [MASK45]), {}),
  (aten.index.Tensor, (X, [MASK4]), {}),
  (aten.index.Tensor, (X3, [None, m(4)]), {}),
  (aten.index.Tensor, (X, [MASK45.to(torch.uint8)]), {}),
  (aten.index.Tensor, (X3, [m(3), None, i(1)]), {}),  # mask and int, not adjacent
  (aten.index.Tensor_hacked_twin, (X, [i(3, 0)]), {}),
  # index_put
  (aten.index_put.default, (X, [i(0, 2)], r(2, 5)), {}),
  (aten.index_put.default, (X, [i(0, 2)], torch.tensor(7.0)), {}),
  (aten.index_put.default, (X, [i(0, 0, 2), i(1, 1, 3)], r(3)), {"accumulate": True}),
  (aten.index_put.default, (X, [None, i(1, 1, -1)], r(4, 3), True), {}),
  (aten.index_put.default, (X3, [i(0, 2), None, i(1, 3)], r(2, 4)), {}),
  (aten.index_put.default, (X, [MASK45], torch.tensor(0.0)), {}),
  (aten.index_put.default, (X, [MASK45], torch.tensor(1.5), True), {}),
  (aten.index_put.default, (X, [MASK45], r(int(MASK45.sum()))), {}),
  (aten.index_put.default, (X, [MASK4], r(int(MASK4.sum()), 5)), {}),
  (aten.index_put.default, (X, [MASK4], r(5)), {}),
  (aten.index_put.default, (X, [MASK4], r(1, 5), True), {}),
  (aten.index_put.default, (X3, [None, m(4)], r(1)), {}),
  (aten.index_put.default, (X, [MASK4, i(2)], r(1)), {}),
  (aten.index_put.default, (r(4, 5, dtype=torch.int64), [MASK45], torch.tensor(3)), {}),
  (aten.index_put.default, (X, [MASK45.to(torch.uint8)], r(int(MASK45.sum()))), {}),
  (aten.index_put.hacked_twin, (X, [i(1, 2)], r(2, 5)), {}),
  # in-place forms mutate the CPU input while `check` runs, so only idempotent cases here
  (aten._index_put_impl_.default, (X.clone(), [i(1, 3)], r(2, 5)), {}),
  (aten._index_put_impl_.default, (X.clone(), [MASK45], torch.tensor(2.0)), {}),
  (aten._index_put_impl.default, (X, [i(1, 1)], r(2, 5), True), {}),
  (aten._unsafe_index.Tensor, (X, [None, i(1, -2)]), {}),
  (aten._unsafe_index_put.default, (X, [i(0, 0, 2), i(1, 1, 3)], r(3), True), {}),
  (aten._unsafe_masked_index.default, (X, m(3), [i(0, 9, 2), i(1, 1, -7)], -1.0), {}),
  (
    aten._unsafe_masked_index_put_accumulate.default,
    (X, m(3), [i(0, 9, 2), i(1, 1, -7)], r(3)),
    {},
  ),
  # reads from a size-0 dim (an empty slice's `src` in `slice_scatter`): all `fill`
  (aten._unsafe_masked_index.default, (r(4, 0), m(1, 3), [None, i(0, 1, 2)], 7.0), {}),
  # index_* along a dim
  (aten.index_select.default, (X, 1, i(4, 0, 0)), {}),
  (aten.index_select.default, (X3, -1, i(2)), {}),
  (aten.index_select.default, (X, 0, torch.tensor(2)), {}),
  (aten.index_select.default, (torch.tensor(3.0), 0, i(0)), {}),
  (aten.index_add.default, (X, 0, i(0, 0, 3), r(3, 5)), {}),
  (aten.index_add.default, (X, 1, i(4, 1), r(4, 2)), {"alpha": 2.5}),
  (
    aten.index_add.default,
    (r(4, 5, dtype=torch.int32), 1, i(4, 4), r(4, 2, dtype=torch.int32)),
    {"alpha": 3},
  ),
  (aten.index_copy.default, (X, 0, i(3, 1), r(2, 5)), {}),
  (aten.index_copy.default, (X3, -1, i(0, 4), r(3, 4, 2)), {}),
  (aten.index_fill.int_Scalar, (X, 1, i(0, 3), -2.0), {}),
  (aten.index_fill.int_Scalar, (r(4, 5, dtype=torch.int64), 0, i(1), 7), {}),
  (aten.index_fill.int_Tensor, (X, 0, i(2, 3), torch.tensor(9.0)), {}),
  (aten.take.default, (X, i(0, 19, -1, 7)), {}),
  (aten.take.default, (X3, ri(60, 2, 3)), {}),
  (aten.embedding.default, (r(10, 3), ri(10, 2, 4)), {}),
  (aten.embedding.default, (r(10, 3), ri(10, 5), 2), {}),
  # gather / scatter
  (aten.gather.default, (X, 1, ri(5, 4, 3)), {}),
  (aten.gather.default, (X, 0, ri(4, 2, 5)), {}),
  (aten.gather.default, (X3, -1, ri(5, 2, 3, 7)), {}),  # index smaller in other dims
  (aten.gather.default, (torch.tensor(2.0), 0, torch.tensor(0)), {}),
  (aten.scatter.src, (X, 1, perm_index(5, 1, 5).expand(4, 5).contiguous(), r(4, 5)), {}),
  (aten.scatter.src, (X, 0, perm_index(4, 2, 1), r(3, 6)), {}),  # src larger than index
  (aten.scatter.value, (X, 1, ri(5, 4, 2), 3.5), {}),
  (aten.scatter.value, (r(4, 5, dtype=torch.int64), 0, ri(4, 1, 5), -1), {}),
  (aten.scatter.reduce, (X, 1, ri(5, 4, 6), r(4, 6)), {"reduce": "add"}),
  (aten.scatter.reduce, (X, 0, ri(4, 6, 5), r(6, 5)), {"reduce": "multiply"}),
  (aten.scatter.value_reduce, (X, 1, ri(5, 4, 3), 2.0), {"reduce": "multiply"}),
  (aten.scatter.value_reduce, (X, 1, ri(5, 4, 3), 2.0), {"reduce": "add"}),
  (aten.scatter_add.default, (X, 1, ri(5, 4, 8), r(4, 8)), {}),
  (aten.scatter_add.default, (X3, 0, ri(3, 5, 2, 3), r(5, 3, 4)), {}),
  (aten.scatter.src, (torch.tensor(1.0), 0, torch.tensor(0), torch.tensor(5.0)), {}),
  # bool: torch adds with logical or and multiplies with logical and
  (aten.scatter_add.default, (m(4, 5), 1, ri(5, 4, 8), m(4, 8)), {}),
  (aten.scatter.reduce, (m(4, 5), 0, ri(4, 6, 5), m(6, 5)), {"reduce": "multiply"}),
  (aten.scatter.value_reduce, (m(4, 5), 1, ri(5, 4, 3), True), {"reduce": "add"}),
  (aten.index_add.default, (m(4, 5), 0, i(0, 0, 3), m(3, 5)), {}),
  (aten.index_put.default, (m(4, 5), [i(0, 0, 2), i(1, 1, 3)], m(3)), {"accumulate": True}),
  (aten.put.default, (X, i(0, 19, -1, 7), r(4)), {}),
  (aten.put.default, (X3, ri(60, 2, 3), r(2, 3), True), {}),
  (aten.put.default, (m(4, 5), i(0, 0, 3), m(3), True), {}),
  # masks
  (aten.masked_scatter.default, (X, MASK45, r(20)), {}),
  (aten.masked_scatter.default, (X, MASK4[:, None], r(30)), {}),
  (aten.masked_scatter.default, (r(5), m(3, 5), r(3, 5)), {}),  # mask broadcasts self
  (aten.masked_select.default, (X, MASK45), {}),
  (aten.masked_select.default, (X, MASK4[:, None]), {}),
  (aten.masked_select.default, (r(5), m(3, 5)), {}),
  (aten.nonzero.default, (MASK45,), {}),
  (aten.nonzero.default, (torch.tensor([0.0, 1.5, 0.0, -2.0]),), {}),
  (aten.nonzero.default, (ri(3, 2, 3, 4),), {}),
  (aten.nonzero.default, (torch.tensor(3.0),), {}),
  (aten.nonzero.default, (torch.tensor(0),), {}),
  (aten.nonzero.default, (torch.zeros(3, 0),), {}),
  (aten.nonzero_static.default, (MASK45,), {"size": 30}),
  (aten.nonzero_static.default, (MASK45,), {"size": 3, "fill_value": -7}),
  # searches
  (aten.searchsorted.Tensor, (i(1, 3, 3, 5, 9), r(6) * 5), {}),
  (aten.searchsorted.Tensor, (i(1, 3, 3, 5, 9), i(3, 0, 9, 10)), {"right": True}),
  (aten.searchsorted.Tensor, (i(1, 3, 3, 5, 9), i(3, 0, 9, 10)), {"side": "right"}),
  (aten.searchsorted.Tensor, (i(1, 3, 3, 5, 9), i(3, 0, 9, 10)), {"out_int32": True}),
  (aten.searchsorted.Tensor, (torch.sort(r(3, 6)).values, r(3, 4)), {}),
  (aten.searchsorted.Tensor, (torch.sort(r(2, 3, 6)).values, r(2, 3, 2)), {"side": "right"}),
  (aten.searchsorted.Tensor, (torch.tensor([5.0, 1.0, 3.0]), r(4) * 3), {"sorter": i(1, 2, 0)}),
  # NaN compares false in torch's search (JAX's sort order would put it last)
  (
    aten.searchsorted.Tensor,
    (torch.tensor([1.0, 2.0, float("nan")]), torch.tensor([float("nan"), 1.5, 3.0, 2.0])),
    {},
  ),
  (
    aten.searchsorted.Tensor,
    (torch.tensor([1.0, 2.0, float("nan")]), torch.tensor([float("nan"), 1.5, 3.0, 2.0])),
    {"right": True},
  ),
  (
    aten.searchsorted.Tensor,
    (
      torch.tensor([[1.0, 2.0, 3.0], [0.0, float("nan"), float("nan")]]),
      torch.tensor([[2.0, 9.0], [0.0, 1.0]]),
    ),
    {},
  ),
  (aten.searchsorted.Tensor, (torch.tensor([1.0, 2.0, 3.0]), torch.tensor(2.5)), {}),
  (aten.searchsorted.Tensor, (torch.empty(0), r(3)), {}),
  (aten.searchsorted.Tensor, (torch.sort(r(1000)).values, r(50) * 3), {}),
  (aten.searchsorted.Tensor, (torch.ones(7), torch.tensor([0.0, 1.0, 2.0])), {"right": True}),
  (aten.searchsorted.Scalar, (i(1, 3, 3, 5, 9), 3), {}),
  (aten.searchsorted.Scalar, (i(1, 3, 3, 5, 9), 3), {"right": True}),
  (aten.bucketize.Tensor, (r(3, 4) * 3, torch.tensor([-1.0, 0.0, 2.0])), {}),
  (aten.bucketize.Tensor, (i(0, 2, 5, 7), i(0, 2, 5)), {"right": True, "out_int32": True}),
  (aten.bucketize.Scalar, (2, i(0, 2, 5)), {}),
  (aten.bucketize.Scalar, (2.5, torch.tensor([0.0, 2.5, 5.0])), {"right": True}),
]


def _index_with_nan_max():
  x = torch.tensor([[1.0, float("nan"), 3.0], [4.0, 5.0, 6.0]])
  return x


SCATTER_REDUCE = [
  # (self, dim, index, src)
  (r(6), 0, i(0, 0, 2, 2, 2, 5), r(6)),
  (r(4, 5), 1, ri(5, 4, 7), r(4, 7)),
  (r(4, 5), 0, ri(4, 3, 5), r(3, 5)),
  (r(6, dtype=torch.int64), 0, i(0, 0, 1, 3, 3, 3), torch.tensor([-4, 1, 6, -7, 2, 3])),
  (_index_with_nan_max(), 1, i(0, 0, 2)[None].expand(2, 3).contiguous(), r(2, 3)),
]


def _id(case):
  return str(case[0]).replace("aten.", "")


@pytest.mark.parametrize("op,args,kwargs", CASES, ids=[_id(c) for c in CASES])
def test_indexing_op(op, args, kwargs):
  check(op, *args, **kwargs)


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("case", range(len(SCATTER_REDUCE)))
def test_scatter_reduce(case, reduce, include_self):
  self, dim, index, src = SCATTER_REDUCE[case]
  check(aten.scatter_reduce.two, self, dim, index, src, reduce, include_self=include_self)


@pytest.mark.parametrize("scale_grad_by_freq", [False, True])
@pytest.mark.parametrize("padding_idx", [-1, 2])
def test_embedding_dense_backward(padding_idx, scale_grad_by_freq):
  indices = torch.tensor([[0, 2, 2], [5, 2, 0]])
  grad = r(2, 3, 4)
  check(aten.embedding_dense_backward.default, grad, indices, 7, padding_idx, scale_grad_by_freq)


@pytest.mark.parametrize("scale_grad_by_freq", [False, True])
@pytest.mark.parametrize("padding_idx", [None, 2, -5])
def test_embedding_derivatives_follow_torch(padding_idx, scale_grad_by_freq):
  """JAX's own derivatives of the `aten.embedding` lowering (what `jax.grad` / `jax.jvp` of
  `call_torch` and a compiled module's backward use) give torch's gradient: none for the
  `padding_idx` row, rows scaled by 1 / their count with `scale_grad_by_freq`."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  import bridge

  indices = torch.tensor([[0, 2, 2], [5, 2, 0]])
  weight = r(7, 4)
  cotangent = r(2, 3, 4)
  w = weight.clone().requires_grad_()
  out = torch.nn.functional.embedding(
    indices, w, padding_idx, scale_grad_by_freq=scale_grad_by_freq
  )
  (out * cotangent).sum().backward()

  f = bridge.jax_view(
    lambda t: (
      torch.nn.functional.embedding(
        torch.from_numpy(indices.numpy()), t, padding_idx, scale_grad_by_freq=scale_grad_by_freq
      )
      * cotangent
    ).sum()
  )
  wj = jnp.asarray(weight.numpy())
  grad = np.asarray(jax.jit(jax.grad(f))(wj))
  torch.testing.assert_close(torch.from_numpy(grad.copy()), w.grad)
  if padding_idx is not None:
    assert not grad[padding_idx % 7].any()  # the padding row's gradient is exactly zero
  tangent = r(7, 4)
  _, jvp = jax.jvp(f, (wj,), (jnp.asarray(tangent.numpy()),))
  torch.testing.assert_close(
    torch.tensor(float(jvp)), (w.grad * tangent).sum(), rtol=1e-5, atol=1e-5
  )


INDEX_REDUCE = [
  # (self, dim, index, source)
  (r(5, 3), 0, i(0, 4, 0, 2), r(4, 3)),
  (r(3, 5), -1, i(1, 1, 1), r(3, 3)),
  (r(5, dtype=torch.int64), 0, i(0, 0, 3), torch.tensor([-3, 4, 9])),
]


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("case", range(len(INDEX_REDUCE)))
def test_index_reduce(case, reduce, include_self):
  self, dim, index, source = INDEX_REDUCE[case]
  check(aten.index_reduce.default, self, dim, index, source, reduce, include_self=include_self)


def _scatter_prod_grads(self, index, src, include_self):
  """(bridge's, torch's) gradients of scatter_reduce "prod" along dim 0, repeated indices."""
  import bridge
  import jax

  ins = [self.clone().requires_grad_(), src.clone().requires_grad_()]
  out = torch.scatter_reduce(ins[0], 0, index, ins[1], "prod", include_self=include_self)
  cot = torch.randn(out.shape, generator=_gen, dtype=out.dtype)
  expected = torch.autograd.grad(out, ins, cot)

  def loss(a, b):
    fn = lambda x, y: torch.scatter_reduce(x, 0, index, y, "prod", include_self=include_self)
    return (bridge.call_torch(fn, a, b) * bridge.to_jax(cot)).sum()

  with jax.enable_x64(True):
    got = jax.grad(loss, argnums=(0, 1))(bridge.to_jax(self), bridge.to_jax(src))
  return [bridge.to_torch(g) for g in got], expected


@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_prod_grad_with_repeats_and_zeros(include_self):
  self = torch.tensor([2.0, 0.0, 3.0, 1.5], dtype=torch.float64)
  index = torch.tensor([0, 0, 1, 1, 2, 2, 2])
  src = torch.tensor([1.5, -2.0, 0.0, 4.0, 0.0, 0.0, 2.0], dtype=torch.float64)
  got, expected = _scatter_prod_grads(self, index, src, include_self)
  for g, e in zip(got, expected):
    torch.testing.assert_close(g, e)


# torch's decompositions of these read the empty `src` through `_unsafe_masked_index`
EMPTY_SCATTERS = [
  (aten.slice_scatter.default, (X3, r(3, 0, 5), 1, 4)),
  (aten.slice_scatter.default, (X3, r(3, 0, 5), 1, 1, 1)),
  (aten.slice_scatter.default, (X3, r(3, 4, 0), 2, 5, 9, 2)),
  (aten.slice_backward.default, (r(3, 0, 5), [3, 4, 5], 1, 4, 4, 1)),
]


@pytest.mark.parametrize("op,args", EMPTY_SCATTERS, ids=[_id(c) for c in EMPTY_SCATTERS])
def test_scatter_of_an_empty_slice_on_the_device(op, args):
  on_device = [a.to("jax") if isinstance(a, torch.Tensor) else a for a in args]
  torch.testing.assert_close(op(*on_device).cpu(), op(*args), rtol=0, atol=0)


EMPTY_VIEWS = {
  "slice": lambda g: g[:, 3:],
  "slice_step": lambda g: g[:, 1:3:2, 4:],
  "narrow": lambda g: g.narrow(1, 3, 0),
  "index_select": lambda g: g.index_select(1, torch.zeros(0, dtype=torch.int64, device=g.device)),
  "of_empty": lambda g: g[:, :0][:, 0:0],
}


@pytest.mark.parametrize("name", list(EMPTY_VIEWS))
def test_backward_through_an_empty_view_gives_zeros(name):
  grads = {}
  for dev in ("cpu", "jax"):
    g = torch.arange(24.0).reshape(2, 3, 4).to(dev).requires_grad_()
    torch.sin(EMPTY_VIEWS[name](g)).sum().backward()
    grads[dev] = g.grad
  torch.testing.assert_close(grads["jax"].cpu(), grads["cpu"], rtol=0, atol=0)
