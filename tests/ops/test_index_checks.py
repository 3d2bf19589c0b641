"""Out-of-range indices on the `jax` device: torch's exception (type and message) in eager mode,
valid negative indices still valid, and inside `jax.jit` / `bridge.compile` JAX's clamped
reads unless `bridge.config(check_indices=True)` asks for the check there too (and for the other
values torch checks: integer division by zero, `multinomial`'s weights)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bridge

ONES = torch.ones


def _t(dev, *values, **kwargs):
  return torch.tensor(values, device=dev, **kwargs)


def _x(dev):
  return torch.arange(9.0, device=dev)


def _x2(dev):
  return torch.arange(12.0, device=dev).reshape(3, 4)


def _set(x, key, value):
  x[key] = value
  return x


def _bag(inp, mode="sum", offsets=(0,), **kwargs):
  def run(dev):
    w = torch.arange(18.0, device=dev).reshape(9, 2)
    moved = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return F.embedding_bag(
      torch.tensor(inp, device=dev), w, torch.tensor(offsets, device=dev), mode=mode, **moved
    )

  return run


# name -> op on device `dev`; torch on CPU raises for every one of them.
BAD = {
  # advanced indexing (aten.index.Tensor): [-size, size)
  "getitem": lambda d: _x(d)[_t(d, 20)],
  "getitem_negative": lambda d: _x(d)[_t(d, -10)],
  "getitem_many": lambda d: _x(d)[_t(d, 1, 70, -90)],
  "getitem_second_dim": lambda d: _x2(d)[:, _t(d, 4)],
  "getitem_two_indices": lambda d: _x2(d)[_t(d, 1), _t(d, 5)],
  "getitem_first_element_first": lambda d: _x2(d)[_t(d, 0, 5), _t(d, 7, 0)],
  "getitem_mask_and_index": lambda d: _x2(d)[_t(d, True, False, True), _t(d, 5)],
  "getitem_empty_dim": lambda d: ONES(3, 0, device=d)[:, _t(d, 0)],
  "getitem_cpu_index": lambda d: _x(d)[torch.tensor([20])],
  "getitem_int32": lambda d: _x(d)[_t(d, 9, dtype=torch.int32)],
  # index_put / setitem
  "setitem": lambda d: _x(d).__setitem__(_t(d, 20), 1.0),
  "index_put": lambda d: _x(d).index_put_((_t(d, 20),), _t(d, 1.0)),
  "index_put_accumulate": lambda d: _x(d).index_put_((_t(d, 20),), _t(d, 1.0), accumulate=True),
  "index_put_two": lambda d: _x2(d).index_put_((_t(d, 1), _t(d, 6)), torch.tensor(1.0, device=d)),
  "setitem_slice_first": lambda d: _x2(d).__setitem__((slice(None), _t(d, 6)), 1.0),
  # index_select: [0, size); torch's message depends on the dim
  "index_select_dim0": lambda d: torch.index_select(_x2(d), 0, _t(d, 4)),
  "index_select_dim1": lambda d: torch.index_select(_x2(d), 1, _t(d, 4)),
  "index_select_dim_minus1": lambda d: torch.index_select(_x2(d), -1, _t(d, 1, 7, 9)),
  "index_select_3d_last": lambda d: torch.index_select(ONES(2, 3, 4, device=d), 2, _t(d, 4)),
  "index_select_1d": lambda d: torch.index_select(_x(d), 0, _t(d, 9)),
  "index_select_negative": lambda d: torch.index_select(_x(d), 0, _t(d, -1)),
  "index_select_0d": lambda d: torch.index_select(torch.tensor(1.0, device=d), 0, _t(d, 1)),
  # gather / scatter: [0, size)
  "gather": lambda d: torch.gather(_x2(d), 1, _t(d, [4])),
  "gather_negative": lambda d: torch.gather(_x2(d), 1, _t(d, [-1])),
  "gather_3d": lambda d: torch.gather(
    ONES(2, 3, 4, device=d), -1, torch.full((2, 2, 2), 5, device=d)
  ),
  "gather_0d": lambda d: torch.gather(torch.tensor(1.0, device=d), 0, torch.tensor(1, device=d)),
  "scatter_value": lambda d: _x2(d).scatter_(1, _t(d, [4]), 1.0),
  "scatter_src": lambda d: _x2(d).scatter_(1, _t(d, [4]), ONES(1, 1, device=d)),
  "scatter_negative": lambda d: _x2(d).scatter_(1, _t(d, [-1]), 1.0),
  "scatter_add": lambda d: _x2(d).scatter_add_(1, _t(d, [4]), ONES(1, 1, device=d)),
  "scatter_reduce": lambda d: _x2(d).scatter_reduce_(1, _t(d, [4]), ONES(1, 1, device=d), "sum"),
  "scatter_reduce_amax": lambda d: _x2(d).scatter_reduce(
    1, _t(d, [9]), ONES(1, 1, device=d), "amax"
  ),
  "scatter_0d": lambda d: torch.tensor(1.0, device=d).scatter_(0, torch.tensor(1, device=d), 2.0),
  # index_add / index_copy / index_fill / index_reduce
  "index_add": lambda d: _x2(d).index_add_(1, _t(d, 4), ONES(3, 1, device=d)),
  "index_add_negative": lambda d: _x2(d).index_add_(1, _t(d, -1), ONES(3, 1, device=d)),
  "index_add_out_of_place": lambda d: torch.index_add(_x2(d), 1, _t(d, 1, 7), ONES(3, 2, device=d)),
  "index_copy": lambda d: _x2(d).index_copy_(1, _t(d, 4), ONES(3, 1, device=d)),
  "index_copy_negative": lambda d: _x2(d).index_copy_(1, _t(d, -1), ONES(3, 1, device=d)),
  "index_copy_out_of_place": lambda d: torch.index_copy(_x2(d), 1, _t(d, 9), ONES(3, 1, device=d)),
  "index_copy_0d": lambda d: torch.tensor(1.0, device=d).index_copy_(0, _t(d, 1), _t(d, 1.0)),
  "index_fill": lambda d: _x2(d).index_fill_(1, _t(d, 4), 1.0),
  "index_fill_too_negative": lambda d: _x2(d).index_fill_(1, _t(d, -5), 1.0),
  "index_fill_tensor_value": lambda d: torch.index_fill(
    _x2(d), 1, _t(d, 9), torch.tensor(2.0, device=d)
  ),
  "index_fill_0d": lambda d: torch.tensor(1.0, device=d).index_fill_(0, _t(d, -2), 1.0),
  "index_reduce": lambda d: _x2(d).index_reduce_(1, _t(d, 4), ONES(3, 1, device=d), "prod"),
  "index_reduce_negative": lambda d: _x2(d).index_reduce(
    1, _t(d, -1), ONES(3, 1, device=d), "amax"
  ),
  # take / put: [-numel, numel)
  "take": lambda d: torch.take(_x2(d), _t(d, 12)),
  "take_negative": lambda d: torch.take(_x2(d), _t(d, -13)),
  "take_many": lambda d: torch.take(_x2(d), _t(d, 3, 100, -100)),
  "put": lambda d: _x2(d).put_(_t(d, 12), _t(d, 1.0)),
  "put_negative": lambda d: _x2(d).put_(_t(d, -13), _t(d, 1.0)),
  "put_accumulate": lambda d: _x2(d).put_(_t(d, 12), _t(d, 1.0), accumulate=True),
  # embedding: [0, num_embeddings)
  "embedding": lambda d: F.embedding(_t(d, 9), torch.randn(9, 2, device=d)),
  "embedding_negative": lambda d: F.embedding(_t(d, -1), torch.randn(9, 2, device=d)),
  "embedding_2d": lambda d: F.embedding(_t(d, [1, 70], [9, 0]), torch.randn(9, 2, device=d)),
  "embedding_padding_idx": lambda d: F.embedding(
    _t(d, 9), torch.randn(9, 2, device=d), padding_idx=0
  ),
  "embedding_module": lambda d: torch.nn.Embedding(9, 2).to(d)(_t(d, 3, 9)),
  # embedding_bag: [0, num_embeddings)
  "embedding_bag_sum": _bag([9]),
  "embedding_bag_mean_second": _bag([1, 9], mode="mean"),
  "embedding_bag_negative": _bag([-1]),
  "embedding_bag_max": _bag([1, 2, 70, 9], mode="max", offsets=(0, 2)),
  "embedding_bag_padding": _bag([1, 9], padding_idx=0),
  "embedding_bag_per_sample_weights": _bag([1, 9], per_sample_weights=torch.ones(2)),
  # nll_loss / cross_entropy: targets in [0, C) unless ignore_index
  "nll_loss": lambda d: F.nll_loss(torch.randn(2, 3, device=d), _t(d, 0, 5)),
  "nll_loss_negative": lambda d: F.nll_loss(torch.randn(2, 3, device=d), _t(d, 0, -1)),
  "nll_loss_none": lambda d: F.nll_loss(torch.randn(2, 3, device=d), _t(d, 0, 5), reduction="none"),
  "nll_loss_0d": lambda d: F.nll_loss(torch.randn(3, device=d), torch.tensor(5, device=d)),
  "nll_loss2d": lambda d: F.nll_loss(
    torch.randn(1, 3, 2, 2, device=d), torch.full((1, 2, 2), 5, device=d)
  ),
  "cross_entropy": lambda d: F.cross_entropy(torch.randn(2, 3, device=d), _t(d, 0, 3)),
  # reads from a size-0 dim (JAX cannot build the gather): torch's error, known from the shapes
  "index_select_from_empty_dim": lambda d: ONES(2, 0, device=d).index_select(1, _t(d, 0)),
  "index_select_from_empty_dim0": lambda d: ONES(0, 2, device=d).index_select(0, _t(d, 3)),
  "index_select_from_empty_1d": lambda d: ONES(0, device=d).index_select(0, _t(d, 0)),
  "embedding_of_empty_weight": lambda d: F.embedding(_t(d, 1), ONES(0, 3, device=d)),
  "gather_from_empty_dim": lambda d: ONES(2, 0, device=d).gather(1, _t(d, [3], [0])),
  "gather_from_empty_dim0": lambda d: ONES(0, 2, device=d).gather(0, _t(d, [2, 0])),
  # boolean masks of another shape than the dims they index
  "getitem_mask_too_short": lambda d: _x(d)[_t(d, True, False)],
  "getitem_mask_second_dim": lambda d: _x2(d)[:, _t(d, True, False)],
  "getitem_2d_mask": lambda d: _x2(d)[ONES(3, 5, dtype=torch.bool, device=d)],
  "getitem_uint8_mask": lambda d: _x(d)[ONES(2, dtype=torch.uint8, device=d)],
  "getitem_mask_after_index": lambda d: ONES(3, 4, 2, device=d)[
    _t(d, True, False, True), _t(d, 0), _t(d, True, False, True)
  ],
  "setitem_mask_too_short": lambda d: _set(_x(d), _t(d, True, False), 1.0),
  "setitem_mask_second_dim": lambda d: _set(
    _x2(d), (slice(None), _t(d, True)), ONES(3, 1, device=d)
  ),
  "index_put_mask_accumulate": lambda d: _x(d).index_put(
    (_t(d, True, False),), _t(d, 1.0), accumulate=True
  ),
  # a mask selecting another number of places than there are values (they were dropped, or
  # the last place written twice)
  "setitem_mask_more_values": lambda d: _set(
    _x2(d), _t(d, True, False, True), ONES(3, 4, device=d)
  ),
  "setitem_mask_fewer_values": lambda d: _set(
    _x2(d), _t(d, True, True, True), ONES(2, 4, device=d)
  ),
  "setitem_mask_second_dim_values": lambda d: _set(
    _x2(d), (slice(None), _t(d, True, False, False, True)), ONES(3, 3, device=d)
  ),
  "index_put_mask_more_values": lambda d: _x(d).index_put(
    ((torch.arange(9, device=d) % 2 == 0),), ONES(4, device=d), accumulate=True
  ),
}

# torch's CPU kernels word some errors by their own fast paths (FBGEMM's embedding_bag reports
# a bad index in a later bag as "Expected i < index_size to be true"); the `jax` device gives
# the same type with the message of torch's general path:
BAD_WORDED_OTHERWISE = {
  "embedding_bag_second_bag": (
    _bag([1, 2, 9], offsets=(0, 2)),
    RuntimeError,
    "Index 2 of input takes value 9 which is not in the valid range [0, 9)",
  ),
}

# Valid indices torch accepts, negative ones included: the same values as on CPU.
GOOD = {
  "getitem_negative": lambda d: _x(d)[_t(d, -9, -1, 0, 8)],
  "getitem_two": lambda d: _x2(d)[_t(d, -3, 2), _t(d, -4, 3)],
  "setitem_negative": lambda d: _x(d).index_put_((_t(d, -9, -1),), _t(d, 1.0, 2.0)),
  "take_negative": lambda d: torch.take(_x2(d), _t(d, -12, 11)),
  "put_negative": lambda d: _x2(d).put_(_t(d, -12, 11), _t(d, 1.0, 2.0)),
  "index_fill_negative": lambda d: _x2(d).index_fill_(1, _t(d, -1, -4), 5.0),
  "index_fill_0d": lambda d: torch.tensor(1.0, device=d).index_fill_(0, _t(d, -1), 3.0),
  "gather_edges": lambda d: torch.gather(_x2(d), 1, _t(d, [0, 3], [3, 0], [1, 2])),
  "embedding_edges": lambda d: F.embedding(_t(d, 0, 8), torch.arange(18.0, device=d).reshape(9, 2)),
  "embedding_bag_edges": _bag([0, 8, 3], mode="max", offsets=(0, 1)),
  "nll_loss_ignore_index": lambda d: F.nll_loss(
    torch.arange(6.0, device=d).reshape(2, 3), _t(d, 2, -100)
  ),
  "nll_loss_ignore_out_of_range": lambda d: F.nll_loss(
    torch.arange(6.0, device=d).reshape(2, 3), _t(d, 2, 7), ignore_index=7
  ),
  "index_select_empty_index": lambda d: torch.index_select(_x2(d), 1, _t(d, dtype=torch.int64)),
  "index_select_empty_from_empty_dim": lambda d: ONES(2, 0, device=d).index_select(
    1, _t(d, dtype=torch.int64)
  ),
  "gather_empty_from_empty_dim": lambda d: ONES(2, 0, device=d).gather(
    1, torch.zeros(2, 0, dtype=torch.int64, device=d)
  ),
  "embedding_empty_of_empty_weight": lambda d: F.embedding(
    _t(d, dtype=torch.int64), ONES(0, 3, device=d)
  ),
  "setitem_empty_index": lambda d: _set(_x2(d), (slice(None), _t(d, dtype=torch.int64)), 1.0),
}


# Index (and mask) dtypes: what torch accepts, it computes the same; what it refuses, it refuses
# with its own exception (its meta kernel takes int8 for a mask, and refuses uint8).
INDEX_DTYPES = [
  torch.int8,
  torch.int16,
  torch.int32,
  torch.int64,
  torch.uint8,
  torch.uint16,
  torch.bool,
  torch.float32,
]


def _index(dev, dtype):
  if dtype == torch.bool:
    return torch.tensor([True, False, True], device=dev)
  return torch.tensor([0, 2, 1], device=dev).to(dtype)


WITH_INDEX = {
  "getitem": lambda d, i: _x(d)[i],
  "getitem_second_dim": lambda d, i: _x2(d)[:, i[:3] if i.dtype == torch.bool else i],
  "setitem": lambda d, i: _set(_x(d), i, _t(d, 7.0)),
  "index_put_accumulate": lambda d, i: _x(d).index_put((i,), _t(d, 1.0), accumulate=True),
  "unsafe_index": lambda d, i: torch.ops.aten._unsafe_index(_x(d), [i]),
  "index_select": lambda d, i: _x(d).index_select(0, i),
  "index_add": lambda d, i: ONES(3, device=d).index_add(0, i, ONES(3, device=d)),
  "index_copy": lambda d, i: ONES(3, device=d).index_copy(0, i, _t(d, 4.0, 5.0, 6.0)),
  "index_fill": lambda d, i: ONES(3, device=d).index_fill(0, i, 2.0),
  "index_reduce": lambda d, i: ONES(3, device=d).index_reduce(0, i, _x(d)[:3], "amax"),
  "put": lambda d, i: ONES(3, device=d).put(i, _t(d, 4.0, 5.0, 6.0)),
  "take": lambda d, i: _x(d).take(i),
  "gather": lambda d, i: _x(d).gather(0, i),
  "masked_select": lambda d, i: _x(d)[:3].masked_select(i),
  "masked_scatter": lambda d, i: ONES(3, device=d).masked_scatter(i, _x(d)[:3]),
  "masked_fill": lambda d, i: ONES(3, device=d).masked_fill(i, 2.0),
}


@pytest.mark.parametrize("dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(WITH_INDEX))
def test_index_dtypes_follow_torch(name, dtype):
  try:
    expected = WITH_INDEX[name]("cpu", _index("cpu", dtype))
  except (IndexError, RuntimeError) as e:
    with pytest.raises(type(e)) as info:
      WITH_INDEX[name]("jax", _index("jax", dtype))
    assert str(info.value) == str(e)
    return
  got = WITH_INDEX[name]("jax", _index("jax", dtype))
  torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)


def _error(fn, dev):
  with pytest.raises(Exception) as info:
    fn(dev)
  return info.value


@pytest.mark.parametrize("name", list(BAD))
def test_out_of_range_index_raises_torchs_error(name):
  expected = _error(BAD[name], "cpu")
  with pytest.raises(type(expected)) as info:
    BAD[name]("jax")
  assert str(info.value) == str(expected)


@pytest.mark.parametrize("name", list(BAD_WORDED_OTHERWISE))
def test_out_of_range_index_raises_torchs_error_type(name):
  fn, error, message = BAD_WORDED_OTHERWISE[name]
  assert isinstance(_error(fn, "cpu"), error)
  with pytest.raises(error) as info:
    fn("jax")
  assert str(info.value) == message


@pytest.mark.parametrize("name", list(GOOD))
def test_valid_indices_keep_their_values(name):
  out = GOOD[name]("jax")
  torch.testing.assert_close(out.cpu() if isinstance(out, torch.Tensor) else out, GOOD[name]("cpu"))


def test_index_checks_raise_inside_eager_decompositions():
  # take_along_dim wraps its indices like torch; multi_margin_loss (which ran torch's
  # decomposition, whose gather met the out-of-range target) checks its targets as torch does
  x = torch.arange(12.0).reshape(3, 4)
  i = torch.tensor([[4]])
  torch.testing.assert_close(
    torch.take_along_dim(x.to("jax"), i.to("jax"), 1).cpu(), torch.take_along_dim(x, i, 1)
  )
  with pytest.raises(RuntimeError, match="^target out of range$"):
    F.multi_margin_loss(torch.randn(2, 3, device="jax"), _t("jax", 0, 5))


def test_a_tensor_left_unchanged_when_an_in_place_write_raises():
  x = _x("jax")
  with pytest.raises(IndexError):
    x[_t("jax", 20)] = 5.0
  torch.testing.assert_close(x.cpu(), _x("cpu"))


def test_call_torch_on_concrete_arrays_raises_torchs_error():
  with pytest.raises(IndexError, match="index 20 is out of bounds for dimension 0 with size 9"):
    bridge.call_torch(lambda x, i: x[i], jnp.arange(9.0), jnp.array([20]))


def test_under_jax_grad_without_jit_raises_torchs_error():
  f = bridge.jax_view(lambda x, i: torch.index_select(x, 0, i).sum())
  with pytest.raises(IndexError, match="index out of range in self"):
    jax.grad(f)(jnp.arange(9.0), jnp.array([9]))
  np.testing.assert_allclose(jax.grad(f)(jnp.arange(3.0), jnp.array([2, 2])), [0, 0, 2])


# --- inside jax.jit / bridge.compile --------------------------------------------------------


def _getitem(x, i):
  return x[i]


def test_jit_without_check_indices_clamps_reads_and_drops_writes():
  x, i = jnp.arange(9.0), jnp.array([20])
  np.testing.assert_array_equal(jax.jit(bridge.jax_view(_getitem))(x, i), [8.0])  # clamped

  def write(x, i):
    x = x.clone()
    x[i] = 100.0
    return x

  np.testing.assert_array_equal(jax.jit(bridge.jax_view(write))(x, i), np.arange(9.0))  # dropped


CHECKED = {
  "getitem": (
    _getitem,
    (jnp.arange(9.0), jnp.array([3, 20])),
    "aten.index.Tensor: index 20 is out of bounds for dimension 0 with size 9",
  ),
  "index_select": (
    lambda x, i: torch.index_select(x, 0, i),
    (jnp.arange(9.0), jnp.array([-1])),
    "aten.index_select.default: index out of range in self",
  ),
  "embedding": (
    lambda w, i: F.embedding(i, w),
    (jnp.ones((9, 2)), jnp.array([[1, 9]])),
    "aten.embedding.default: index out of range in self",
  ),
  "scatter_add": (
    lambda x, i: x.scatter_add(0, i, torch.ones_like(x)),
    (jnp.ones(4), jnp.array([0, 1, 2, 4])),
    "aten.scatter_add.default: index 4 is out of bounds for dimension 0 with size 4",
  ),
}


@pytest.mark.parametrize("name", list(CHECKED))
def test_jit_with_check_indices_raises_naming_the_op_and_index(name):
  fn, args, message = CHECKED[name]
  f = jax.jit(bridge.jax_view(fn))
  with bridge.config(check_indices=True):
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
      jax.block_until_ready(f(*args))
  assert message in str(info.value)
  assert "check_indices" in str(info.value)


# The other value checks, staged the same way: name -> (fn, its arguments, the op named).
VALUE_CHECKED = {
  "floor_divide": (lambda a, b: a // b, ([-7, 3], [0, 1]), "aten.floor_divide.default"),
  "remainder": (lambda a, b: a % b, ([-7, 3], [1, 0]), "aten.remainder.Tensor"),
  "div_trunc": (
    lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    ([-7, 3], [0, 1]),
    "aten.div.Tensor_mode",
  ),
  "multinomial_nan": (
    lambda p: torch.multinomial(p, 1).int(),
    ([0.2, np.nan],),
    "aten.multinomial.default",
  ),
  "multinomial_negative_rows": (
    lambda p: torch.multinomial(p, 2, True).int(),
    ([[0.2, 0.1], [1.0, -1.0]],),
    "aten.multinomial.default",
  ),
}


@pytest.mark.parametrize("name", list(VALUE_CHECKED))
def test_jit_with_check_indices_checks_values_as_torch(name):
  fn, args, op = VALUE_CHECKED[name]
  with pytest.raises(RuntimeError) as expected:
    fn(*(torch.tensor(a) for a in args))

  def program(key, *arrays):
    with bridge.rng_key(key):  # (multinomial draws)
      return bridge.jax_view(fn)(*arrays)

  arrays = [jnp.asarray(a) for a in args]
  key = jax.random.key(0)
  jax.block_until_ready(jax.jit(program)(key, *arrays))  # unchecked by default
  with bridge.config(check_indices=True):
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
      jax.block_until_ready(jax.jit(lambda *a: program(*a))(key, *arrays))
  assert f"{op}: {expected.value}" in str(info.value)


def test_check_indices_passes_valid_indices_under_jit_grad_and_vmap():
  f = bridge.jax_view(lambda x, i: (x[i] * x[i]).sum())
  x = jnp.arange(9.0)
  with bridge.config(check_indices=True):
    np.testing.assert_allclose(jax.jit(f)(x, jnp.array([-1, 2])), 68.0)
    np.testing.assert_allclose(jax.jit(jax.grad(f))(x, jnp.array([2])), np.eye(9)[2] * 4)
    np.testing.assert_allclose(
      jax.jit(jax.vmap(f, (None, 0)))(x, jnp.array([[1], [2]])), [1.0, 4.0]
    )
    with pytest.raises(jax.errors.JaxRuntimeError, match="index 9 is out of bounds"):
      jax.block_until_ready(jax.jit(jax.vmap(f, (None, 0)))(x, jnp.array([[1], [9]])))


def test_check_indices_is_read_when_the_program_is_traced():
  # The same op met first without the setting, then with it: the check is not left out of
  # the second program (nor kept in a third one traced without it).
  f = bridge.jax_view(_getitem)
  x, bad = jnp.arange(5.0), jnp.array([7])
  np.testing.assert_array_equal(jax.jit(f)(x, bad), [4.0])
  with bridge.config(check_indices=True):
    with pytest.raises(jax.errors.JaxRuntimeError, match="index 7 is out of bounds"):
      jax.block_until_ready(jax.jit(lambda x, i: f(x, i) + 0)(x, bad))
  np.testing.assert_array_equal(jax.jit(lambda x, i: f(x, i) * 1)(x, bad), [4.0])


def test_bridge_compile_with_check_indices():
  class Lookup(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.emb = torch.nn.Embedding(9, 2)

    def forward(self, i):
      return self.emb(i).sum()

  ok, bad = torch.tensor([1, 8]), torch.tensor([1, 9])
  with bridge.config(check_indices=True):
    compiled = bridge.compile(Lookup())
    # torch's error type (it came as a JaxRuntimeError), on the general path, on the shortcut
    # recorded by the calls before, and through the autograd node
    for _ in range(3):
      compiled(ok)
      with pytest.raises(IndexError, match="aten.embedding.default: index out of range in self"):
        compiled(bad)
    with pytest.raises(IndexError, match="aten.embedding.default: index out of range in self"):
      bridge.compile(torch.nn.Embedding(9, 2))(bad)


def test_jit_with_check_indices_checks_how_many_places_a_mask_selects():
  def put(x, mask):
    return bridge.call_torch(
      lambda t, m: t.index_put((m,), torch.ones(3, 2, device=t.device)), x, mask
    )

  x = jnp.zeros((4, 2))
  good = jnp.array([True, False, True, True])
  np.testing.assert_array_equal(jax.jit(put)(x, good), [[1, 1], [0, 0], [1, 1], [1, 1]])
  with bridge.config(check_indices=True):  # (a new jit: the setting is read as it traces)
    checked = jax.jit(lambda a, m: put(a, m))
    np.testing.assert_array_equal(checked(x, good), [[1, 1], [0, 0], [1, 1], [1, 1]])
    with pytest.raises(
      Exception,
      match=r"value tensor of shape \[3, 2\] cannot be broadcast to "
      r"indexing result of shape \[2, 2\]",
    ):
      checked(x, jnp.array([True, False, True, False]))
