"""Views read and write through slice/transpose/broadcast where they can, and stay exact.

`bridge._src.strided.gather` / `scatter` turn a torch view (size, stride, storage offset
over a contiguous storage array) into JAX ops. Each case below builds a view with real torch
view ops on a CPU tensor; the lowering must give torch's values, and a view that is a strided
slice, permutation or broadcast of the storage must lower without a gather or a scatter.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge  # (registers the jax device)
from bridge._src import strided as bt
from tests import xla

# name: (base shape, view of the base, lowers without gather/scatter)
CASES = {
  "whole": ((3, 4), lambda x: x, True),
  "t": ((3, 4), lambda x: x.t(), True),
  "t_of_1d_view": ((12,), lambda x: x.view(3, 4).t(), True),
  "permute": ((2, 3, 4), lambda x: x.permute(2, 0, 1), True),
  "permute_reverse": ((2, 3, 4, 5), lambda x: x.permute(3, 2, 1, 0), True),
  "transpose": ((2, 3, 4), lambda x: x.transpose(0, 2), True),
  "select_row": ((3, 4), lambda x: x[1], True),
  "select_col": ((3, 4), lambda x: x[:, 2], True),
  "select_middle": ((2, 3, 4), lambda x: x.select(1, 2), True),
  "select_scalar": ((3, 4), lambda x: x[2, 3], True),
  "narrow_dim0": ((5, 4), lambda x: x.narrow(0, 1, 3), True),
  "narrow_dim1": ((5, 4), lambda x: x.narrow(1, 1, 2), True),
  "step_slices": ((6, 7), lambda x: x[::2, 1::3], True),
  "step_slice_1d": ((10,), lambda x: x[1::3], True),
  "step_slice_uneven_1d": ((11,), lambda x: x[2::4], True),
  "slice_then_t": ((4, 6), lambda x: x[1:, ::2].t(), True),
  "expand": ((3, 1), lambda x: x.expand(3, 4), True),
  "expand_new_dim": ((4,), lambda x: x.expand(2, 3, 4), True),
  "expand_of_select": ((3, 4), lambda x: x[1:2].expand(5, 4), True),
  "unsqueeze": ((3, 4), lambda x: x.unsqueeze(1), True),
  "unsqueeze_of_t": ((3, 4), lambda x: x.t().unsqueeze(0), True),
  "view": ((3, 4), lambda x: x.view(2, 6), True),
  "reshape_flat_slice": ((3, 4), lambda x: x.reshape(-1)[3:9], True),
  "view_then_slice": ((3, 4), lambda x: x.view(2, 6)[:, 2:4], True),
  "flatten_then_view": ((2, 3, 4), lambda x: x.flatten()[4:16].view(3, 4), True),
  "diagonal": ((3, 4), lambda x: x.diagonal(), True),
  "diagonal_offset": ((4, 4), lambda x: x.diagonal(1), True),
  "diagonal_3d": ((3, 3, 2), lambda x: x.diagonal(dim1=0, dim2=1), False),
  "unbind_middle": ((3, 4), lambda x: x.unbind(0)[1], True),
  "split_part": ((3, 4), lambda x: x.split(2, dim=1)[1], True),
  "chunk_t": ((6, 4), lambda x: x.chunk(3, dim=0)[2].t(), True),
  "as_strided_transpose": ((3, 4), lambda x: x.as_strided((2, 2), (1, 4)), True),
  "as_strided_overlap": ((3, 4), lambda x: x.as_strided((3, 3), (1, 1)), False),
  "as_strided_overlap_2d": ((4, 5), lambda x: x.as_strided((3, 4), (5, 2), 1), False),
  "unfold": ((10,), lambda x: x.unfold(0, 4, 2), False),
  "chain": ((4, 6, 5), lambda x: x[1:, ::2].permute(2, 0, 1)[1:4, :, 1:].transpose(0, 2), True),
  "chain_select_expand": ((4, 6), lambda x: x.t()[2].unsqueeze(0).expand(3, 4), True),
  "size_one_dims": ((1, 4, 1), lambda x: x.permute(2, 1, 0)[:, 1:3], True),
  "split_heads": (
    (2, 3, 12),
    lambda x: x.split(4, dim=2)[1].view(2, 3, 2, 2).transpose(1, 2),
    True,
  ),
  "window_of_1d": ((10,), lambda x: x[1:].view(3, 3)[:2, :2], True),
  "zero_dim_base": ((), lambda x: x, True),
  "zero_dim_base_unsqueezed": ((), lambda x: x.view(1, 1), True),
  "empty_view": ((3, 4), lambda x: x[:, 2:2], True),
}

_GATHER_OR_SCATTER = re.compile(r"stablehlo\.\w*(gather|scatter)")


def _view(name):
  shape, fn, structured = CASES[name]
  base = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape) - 5
  return base, fn(base), structured


def _meta(v):
  return tuple(v.shape), tuple(v.stride()), v.storage_offset()


def _writable(size, stride, offset):
  """No two elements of the view share an address (torch rejects writes to such views)."""
  index = bt._flat_index(size, stride, offset).reshape(-1)
  return np.unique(index).size == index.size


@pytest.mark.parametrize("name", list(CASES))
def test_gather_matches_torch(name):
  base, v, _ = _view(name)
  got = bt.gather(jnp.asarray(base.numpy()), *_meta(v))
  np.testing.assert_array_equal(np.asarray(got), v.numpy())


@pytest.mark.parametrize("name", list(CASES))
def test_scatter_matches_torch(name):
  base, v, _ = _view(name)
  size, stride, offset = _meta(v)
  if not _writable(size, stride, offset):
    pytest.skip("several elements share an address; torch rejects writes through such a view")
  new = torch.arange(math.prod(size), dtype=torch.float32).reshape(size) * 10 + 1000
  want = base.clone()
  want.as_strided(size, stride, offset).copy_(new)
  got = bt.scatter(jnp.asarray(base.numpy()), jnp.asarray(new.numpy()), size, stride, offset)
  np.testing.assert_array_equal(np.asarray(got), want.numpy())


@pytest.mark.parametrize("name", [n for n, (_, _, structured) in CASES.items() if structured])
def test_structured_views_lower_without_gather_or_scatter(name):
  base, v, _ = _view(name)
  size, stride, offset = _meta(v)
  b = jnp.asarray(base.numpy())
  hlo = jax.jit(bt.gather, static_argnums=(1, 2, 3)).lower(b, size, stride, offset).as_text()
  assert not _GATHER_OR_SCATTER.search(hlo), hlo
  if _writable(size, stride, offset):
    new = jnp.ones(size, b.dtype)
    hlo = (
      jax.jit(bt.scatter, static_argnums=(2, 3, 4)).lower(b, new, size, stride, offset).as_text()
    )
    assert not _GATHER_OR_SCATTER.search(hlo), hlo


@pytest.mark.parametrize("name", [n for n, (_, _, structured) in CASES.items() if not structured])
def test_other_views_take_the_flat_index_fallback(name):
  base, v, _ = _view(name)
  assert bt._plan(tuple(base.shape), *_meta(v)) is None


def test_step_one_slice_writes_with_dynamic_update_slice():
  b = jnp.zeros((4, 6))
  hlo = (
    jax.jit(bt.scatter, static_argnums=(2, 3, 4))
    .lower(b, jnp.ones((2, 3)), (2, 3), (6, 1), 8)
    .as_text()
  )  # x[1:3, 2:5]
  assert "stablehlo.dynamic_update_slice" in hlo and not _GATHER_OR_SCATTER.search(hlo)


def _random_view(rng):
  """A random as_strided view (maybe overlapping, maybe broadcast) that fits its base."""
  shape = tuple(int(n) for n in rng.integers(1, 6, size=rng.integers(1, 4)))
  numel = math.prod(shape)
  ndim = int(rng.integers(0, 4))
  size = tuple(int(n) for n in rng.integers(1, 5, size=ndim))
  stride = tuple(int(s) for s in rng.integers(0, max(numel // 2, 1) + 1, size=ndim))
  span = sum((n - 1) * s for n, s in zip(size, stride))
  if span >= numel:
    return None
  return shape, size, stride, int(rng.integers(0, numel - span))


@pytest.mark.parametrize("seed", range(8))
def test_random_as_strided_views(seed):
  rng = np.random.default_rng(seed)
  done = 0
  while done < 25:
    case = _random_view(rng)
    if case is None:
      continue
    shape, size, stride, offset = case
    base = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    b = jnp.asarray(base.numpy())
    want = base.as_strided(size, stride, offset)
    got = bt.gather(b, size, stride, offset)
    np.testing.assert_array_equal(np.asarray(got), want.numpy(), err_msg=str(case))
    if _writable(size, stride, offset):
      new = -torch.arange(math.prod(size), dtype=torch.float32).reshape(size) - 1
      expect = base.clone()
      expect.as_strided(size, stride, offset).copy_(new)
      got = bt.scatter(b, jnp.asarray(new.numpy()), size, stride, offset)
      np.testing.assert_array_equal(np.asarray(got), expect.numpy(), err_msg=str(case))
    done += 1


def test_scatter_broadcasts_and_casts_new():
  base = jnp.zeros((3, 4), jnp.int32)
  got = bt.scatter(base, jnp.array([1.0, 2.0, 3.0]), (4, 3), (1, 4), 0)  # x.t() = row
  want = torch.zeros(3, 4, dtype=torch.int32)
  want.t().copy_(torch.tensor([1, 2, 3]))
  np.testing.assert_array_equal(np.asarray(got), want.numpy())
  assert got.dtype == jnp.int32


@pytest.mark.parametrize("name", ["t", "step_slices", "chain", "diagonal", "as_strided_overlap"])
def test_gather_and_scatter_under_vmap_and_grad(name):
  base, v, _ = _view(name)
  size, stride, offset = _meta(v)
  b = jnp.asarray(base.numpy())
  batch = jnp.stack([b, b * 2, -b])
  got = jax.vmap(lambda x: bt.gather(x, size, stride, offset))(batch)
  np.testing.assert_array_equal(np.asarray(got[1]), v.numpy() * 2)
  # d/d(base) of sum(view * w) adds w into every address the view reads.
  w = jnp.arange(math.prod(size), dtype=b.dtype).reshape(size) + 1
  grad = jax.grad(lambda x: jnp.sum(bt.gather(x, size, stride, offset) * w))(b)
  want = torch.zeros(base.numel()).index_add_(
    0,
    torch.from_numpy(bt._flat_index(size, stride, offset).reshape(-1)),
    torch.from_numpy(np.array(w).reshape(-1)),
  )
  np.testing.assert_array_equal(np.asarray(grad).reshape(-1), want.numpy())
  if _writable(size, stride, offset):
    news = jnp.stack([w, -w, 2 * w])
    got = jax.vmap(lambda x, n: bt.scatter(x, n, size, stride, offset))(batch, news)
    np.testing.assert_array_equal(
      np.asarray(got[0]), np.asarray(bt.scatter(b, w, size, stride, offset))
    )


DEVICE_VIEWS = {
  "t": lambda x: x.t(),
  "slice_step": lambda x: x[1:, ::2],
  "select_t": lambda x: x.t()[3],
  "permute_unsqueeze": lambda x: x.unsqueeze(0).permute(2, 0, 1),
  "expand": lambda x: x[:1].expand(3, 6),
  "view": lambda x: x.view(3, 8)[:, 1::3],
  "diagonal": lambda x: x.diagonal(2),
}


@pytest.mark.parametrize("name", list(DEVICE_VIEWS))
def test_views_on_the_jax_device(name):
  cpu = torch.randn(4, 6)
  fn = DEVICE_VIEWS[name]
  torch.testing.assert_close(fn(cpu.to("jax")).cpu(), fn(cpu), rtol=0, atol=0)


DEVICE_WRITES = {
  "t_select_add_": lambda x: x.t()[1].add_(1),
  "slice_step_mul_": lambda x: x[1:, ::2].mul_(3),
  "permute_fill_": lambda x: x.view(2, 2, 6).permute(2, 0, 1)[1:3].fill_(9),
  "diagonal_zero_": lambda x: x.diagonal(1).zero_(),
}


@pytest.mark.parametrize("name", list(DEVICE_WRITES))
def test_writes_through_views_on_the_jax_device(name):
  cpu = torch.randn(4, 6)
  x = cpu.to("jax")
  DEVICE_WRITES[name](x)
  DEVICE_WRITES[name](cpu)
  torch.testing.assert_close(x.cpu(), cpu, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool])
def test_rows_at_every_offset_share_one_program(dtype):
  """Reading and writing `x[i]`, `x[:, j]` and other views at each position compiles one
  program for all positions, the position traced: it compiled one per row or column (25-35 ms
  each)."""
  cpu = (torch.arange(8 * 5) % 7).reshape(8, 5).to(dtype)
  x = cpu.clone().to("jax")
  x[0].cpu(), x.narrow(0, 1, 3).cpu(), x[:, 0].cpu(), x[1:, 0:2].cpu(), x[::2, 1].cpu()
  x[0] = cpu[0].to("jax")  # (each view shape's program compiled once)
  x[:, 0] = cpu[:, 0].to("jax")
  x[1::2, 0] = cpu[1::2, 0].to("jax")
  with xla.counting_compiles() as compiles:
    rows = [x[i].cpu() for i in range(8)]
    blocks = [x.narrow(0, i, 3).cpu() for i in range(6)]
    columns = [x[:, j].cpu() for j in range(5)]
    panes = [x[1:, j : j + 2].cpu() for j in range(4)]
    steps = [x[::2, j].cpu() for j in range(5)]
    for i in range(8):
      x[i] = cpu[(i + 3) % 8].to("jax")
    rows_written = x.cpu()
    for j in range(5):
      x[:, j] = cpu[:, 4 - j].to("jax")
      x[1::2, j] = cpu[1::2, j].to("jax")
    written = x.cpu()
  assert compiles == []
  for i in range(8):
    torch.testing.assert_close(rows[i], cpu[i], rtol=0, atol=0)
  for i in range(6):
    torch.testing.assert_close(blocks[i], cpu.narrow(0, i, 3), rtol=0, atol=0)
  for j in range(5):
    torch.testing.assert_close(columns[j], cpu[:, j], rtol=0, atol=0)
    torch.testing.assert_close(steps[j], cpu[::2, j], rtol=0, atol=0)
  for j in range(4):
    torch.testing.assert_close(panes[j], cpu[1:, j : j + 2], rtol=0, atol=0)
  shuffled = cpu[[(i + 3) % 8 for i in range(8)]]
  torch.testing.assert_close(rows_written, shuffled, rtol=0, atol=0)
  want = shuffled.clone()
  for j in range(5):
    want[:, j] = cpu[:, 4 - j]
    want[1::2, j] = cpu[1::2, j]
  torch.testing.assert_close(written, want, rtol=0, atol=0)


def test_contiguous_views_of_a_large_flat_storage_take_their_offset_exactly():
  base = torch.arange(3 * 70_000, dtype=torch.float32)
  x = base.to("jax")
  for start in (0, 1, 65_537, 139_999):
    torch.testing.assert_close(x[start : start + 70_001].cpu(), base[start : start + 70_001])
  hlo = bt._gather_at.lower(jnp.zeros(10), 3, (4,)).as_text()
  assert "dynamic_slice" in hlo and not _GATHER_OR_SCATTER.search(hlo), hlo


def test_linear_weight_reads_as_a_transpose_under_jit():
  lin = torch.nn.Linear(6, 3).to("jax")
  x = torch.randn(2, 6, device="jax")
  w = bridge.jax_view(lin.weight.detach())
  size, stride = (6, 3), (1, 6)
  assert tuple(lin.weight.t().stride()) == stride
  hlo = jax.jit(bt.gather, static_argnums=(1, 2, 3)).lower(w, size, stride, 0).as_text()
  assert "stablehlo.transpose" in hlo and not _GATHER_OR_SCATTER.search(hlo)
  torch.testing.assert_close(
    lin(x).cpu(),
    torch.nn.functional.linear(x.cpu(), lin.weight.detach().cpu(), lin.bias.detach().cpu()),
  )


# Inside a decomposition (torch code running below autograd on the device), the "maybe
# view" ops reach the device as themselves: `reshape` of a layout no view can express
# must copy, and `to(device="cpu")` is a copy, not a view.
MAYBE_VIEWS = {
  "pixel_shuffle": lambda x: torch.nn.functional.pixel_shuffle(x, 2),
  "pixel_unshuffle": lambda x: torch.nn.functional.pixel_unshuffle(x, 2),
  "channel_shuffle": lambda x: torch.nn.functional.channel_shuffle(x, 2),
}


@pytest.mark.parametrize("name", sorted(MAYBE_VIEWS))
def test_maybe_view_ops_copy_inside_decompositions(name):
  x = torch.randn(2, 4, 4, 4)
  fn = MAYBE_VIEWS[name]
  torch.testing.assert_close(fn(x.to("jax")).cpu(), fn(x), rtol=0, atol=0)
  got = jax.jit(lambda a: bridge.call_torch(fn, a))(jnp.asarray(x.numpy()))
  torch.testing.assert_close(torch.from_numpy(np.asarray(got)), fn(x), rtol=0, atol=0)


def test_running_stats_on_the_cpu_update_in_an_eager_call_and_refuse_under_jit():
  mean, var = torch.zeros(3), torch.ones(3)
  x = torch.randn(4, 3)
  fn = lambda t: torch.nn.functional.batch_norm(t, mean, var, training=True)
  out = bridge.call_torch(fn, jnp.asarray(x.numpy()))
  want_mean, want_var = torch.zeros(3), torch.ones(3)
  want = torch.nn.functional.batch_norm(x, want_mean, want_var, training=True)
  torch.testing.assert_close(torch.from_numpy(np.asarray(out)), want)
  torch.testing.assert_close(mean, want_mean)
  torch.testing.assert_close(var, want_var)
  with pytest.raises(bridge.TracedValueError, match="a copy to cpu"):
    jax.jit(lambda a: bridge.call_torch(fn, a))(jnp.asarray(x.numpy()))


_LIB = torch.library.Library("bridge_test_declines", "DEF")
_LIB.define("twice(Tensor x) -> Tensor")
_LIB.impl("twice", lambda x: x * 2, "CPU")
_LIB.impl("twice", lambda x: torch.empty_like(x), "Meta")


def test_a_decomposition_that_declines_its_arguments_falls_back(monkeypatch):
  # torch's decompositions return NotImplemented for arguments they do not cover (e.g.
  # adaptive_max_pool2d when the input size is not a multiple of the output size).
  from torch._decomp import decomposition_table

  op = torch.ops.bridge_test_declines.twice.default
  monkeypatch.setitem(decomposition_table, op, lambda x: NotImplemented)
  x = torch.randn(5)
  with pytest.warns(bridge.FallbackWarning, match="twice"):
    torch.testing.assert_close(op(x.to("jax")).cpu(), x * 2)
  with bridge.config(fallback="error"), pytest.raises(bridge.OperatorNotFound, match="twice"):
    op(torch.randn(6).to("jax"))  # (another shape: a new trace, which sees the policy)
