"""Shape, dtype and rank mistakes raise torch's own exception (type and message, as CPU torch
raises them) on the `jax` device, in torch code traced by `call_torch` under `jax.jit`, through
`extract_jax`, and through `bridge.compile`; never JAX's wording, never a silent result."""

from __future__ import annotations

import jax
import pytest
import torch
import torch.nn.functional as F

import bridge

L = torch.long
B = torch.bool
D = torch.float64

# name -> (function of tensors, its inputs as (shape, dtype)); CPU torch raises for each.
MISTAKES = {
  "add_broadcast": (lambda a, b: a + b, [((2, 3), None), ((3, 2), None)]),
  "sub_broadcast": (lambda a, b: torch.sub(a, b), [((4,), None), ((3,), None)]),
  "mul_3d": (lambda a, b: a * b, [((2, 3, 4), None), ((2, 5, 4), None)]),
  "mm": (lambda a, b: torch.mm(a, b), [((2, 3), None), ((4, 2), None)]),
  "matmul_operator": (lambda a, b: a @ b, [((2, 3), None), ((4, 2), None)]),
  "matmul_vectors": (lambda a, b: torch.matmul(a, b), [((3,), None), ((4,), None)]),
  "bmm": (lambda a, b: torch.bmm(a, b), [((2, 2, 3), None), ((3, 3, 2), None)]),
  "linear": (lambda x, w: F.linear(x, w), [((2, 3), None), ((5, 4), None)]),
  "cat": (lambda a, b: torch.cat([a, b]), [((2, 3), None), ((2, 4), None)]),
  "stack": (lambda a, b: torch.stack([a, b]), [((2,), None), ((3,), None)]),
  "view": (lambda a: a.view(5, 3), [((12,), None)]),
  "reshape": (lambda a: a.reshape(4, 2), [((2, 3), None)]),
  "expand": (lambda a: a.expand(4, 3, 2), [((2, 3), None)]),
  "permute_repeated_dim": (lambda a: a.permute(0, 0), [((2, 3), None)]),
  "transpose_dim": (lambda a: a.transpose(0, 2), [((2, 3), None)]),
  "sum_dim": (lambda a: a.sum(dim=3), [((2, 3), None)]),
  "squeeze_dim": (lambda a: a.squeeze(4), [((2, 3), None)]),
  "unsqueeze_dim": (lambda a: a.unsqueeze(5), [((2, 3), None)]),
  "flatten_dim": (lambda a: a.flatten(3), [((2, 3), None)]),
  "split_sizes": (lambda a: a.split([1, 1], dim=1), [((2, 3), None)]),
  "narrow": (lambda a: a.narrow(1, 2, 4), [((2, 3), None)]),
  "repeat_too_few": (lambda a: a.repeat(2), [((2, 3), None)]),
  "where_broadcast": (
    lambda c, a, b: torch.where(c, a, b),
    [((2,), B), ((3,), None), ((2,), None)],
  ),
  "masked_fill_mask": (lambda a, m: a.masked_fill(m, 1.0), [((2, 3), None), ((3, 2), B)]),
  "conv2d_channels": (
    lambda x, w: F.conv2d(x, w),
    [((1, 3, 8, 8), None), ((4, 2, 3, 3), None)],
  ),
  "layer_norm_shape": (lambda x: F.layer_norm(x, (4,)), [((2, 3), None)]),
  "embedding_weight_rank": (lambda i, w: F.embedding(i, w), [((2,), L), ((2,), None)]),
  "index_select_index_rank": (lambda a, i: a.index_select(0, i), [((2, 3), None), ((2, 2), L)]),
  "gather_rank": (lambda a, i: a.gather(0, i), [((2, 3), None), ((2, 3, 1), L)]),
  "cross_entropy_batch": (lambda x, y: F.cross_entropy(x, y), [((2, 3), None), ((3,), L)]),
  "add_in_place_grows_self": (lambda a, b: a.clone().add_(b), [((2, 3), None), ((4, 2, 3), None)]),
  "add_in_place_float_into_long": (lambda a, b: a.clone().add_(b), [((2, 3), L), ((2, 3), None)]),
  "mul_in_place_complex_into_float": (
    lambda a, b: a.clone().mul_(b),
    [((2, 3), None), ((2, 3), torch.complex64)],
  ),
  "div_in_place_long": (lambda a, b: a.clone().div_(b), [((2, 3), L), ((2, 3), L)]),
  # matrix products of mixed dtypes: torch's CPU kernels refuse them, each in its own words
  "addmm_long_bias": (
    lambda b, x, y: torch.addmm(b, x, y),
    [((2, 2), L), ((2, 2), None), ((2, 2), None)],
  ),
  "addmm_long_matrices": (
    lambda b, x, y: torch.addmm(b, x, y),
    [((2,), None), ((2, 2), L), ((2, 2), L)],
  ),
  "addmm_double_mat2": (
    lambda b, x, y: torch.addmm(b, x, y),
    [((2, 2), None), ((2, 2), None), ((2, 2), D)],
  ),
  "addmv_long_vec": (
    lambda b, m, v: torch.addmv(b, m, v),
    [((2,), None), ((2, 2), None), ((2,), L)],
  ),
  "addbmm_long_bias": (
    lambda b, x, y: torch.addbmm(b, x, y),
    [((2, 2), L), ((3, 2, 2), None), ((3, 2, 2), None)],
  ),
  "baddbmm_double_bias": (
    lambda b, x, y: torch.baddbmm(b, x, y),
    [((3, 2, 2), D), ((3, 2, 2), None), ((3, 2, 2), None)],
  ),
  "baddbmm_double_batch2": (
    lambda b, x, y: torch.baddbmm(b, x, y),
    [((3, 2, 2), None), ((3, 2, 2), None), ((3, 2, 2), D)],
  ),
  "bmm_mixed": (lambda a, b: torch.bmm(a, b), [((3, 2, 2), None), ((3, 2, 2), D)]),
  "mv_mixed": (lambda a, b: torch.mv(a, b), [((2, 2), None), ((2,), L)]),
  "dot_mixed": (lambda a, b: torch.dot(a, b), [((2,), D), ((2,), None)]),
  "vdot_mixed": (lambda a, b: torch.vdot(a, b), [((2,), None), ((2,), L)]),
  "einsum_mixed": (lambda a, b: torch.einsum("ij,jk->ik", a, b), [((2, 2), None), ((2, 2), D)]),
  "linear_long_bias": (
    lambda x, w, b: F.linear(x, w, b),
    [((2, 2), None), ((2, 2), None), ((2,), L)],
  ),
  "cross_mixed": (lambda a, b: torch.linalg.cross(a, b), [((3,), None), ((3,), L)]),
  # reductions with no identity over nothing
  "max_of_nothing": (lambda a: a.max(), [((0, 4), None)]),
  "min_of_nothing": (lambda a: a.min(), [((4, 0), None)]),
  "max_over_an_empty_dim": (lambda a: a.max(0), [((0, 4), None)]),
  "min_over_an_empty_dim": (lambda a: a.min(-1, keepdim=True), [((4, 0), None)]),
  "amax_over_an_empty_dim": (lambda a: a.amax(-1), [((4, 0), None)]),
  "amin_of_nothing": (lambda a: a.amin(), [((0, 4), None)]),
  "aminmax_of_nothing": (lambda a: torch.aminmax(a), [((0, 4), None)]),
  "aminmax_over_an_empty_dim": (lambda a: torch.aminmax(a, dim=-1), [((4, 0), None)]),
  "argmax_of_nothing": (lambda a: a.argmax(), [((0, 4), None)]),
  "argmin_over_an_empty_dim": (lambda a: a.argmin(0), [((0, 4), None)]),
  "kthvalue_over_an_empty_dim": (lambda a: a.kthvalue(1, 0), [((0, 4), None)]),
  "median_over_an_empty_dim": (lambda a: a.median(-1), [((4, 0), None)]),
  "nanmedian_over_an_empty_dim": (lambda a: a.nanmedian(0), [((0, 4), None)]),
  "mode_over_an_empty_dim": (lambda a: a.mode(), [((4, 0), None)]),
  "topk_of_an_empty_dim": (lambda a: a.topk(1), [((0,), None)]),
}


def _inputs(spec: list) -> list[torch.Tensor]:
  g = torch.Generator().manual_seed(0)
  out = []
  for shape, dtype in spec:
    if dtype is L:
      out.append(torch.zeros(shape, dtype=L))
    elif dtype is B:
      out.append(torch.ones(shape, dtype=B))
    else:
      out.append(torch.rand(shape, generator=g, dtype=dtype or torch.float32) + 1)
  return out


def _cpu_error(name: str) -> BaseException:
  fn, spec = MISTAKES[name]
  with pytest.raises(Exception) as info:
    fn(*_inputs(spec))
  return info.value


def _check(got: BaseException, want: BaseException) -> None:
  assert isinstance(got, type(want)), (type(got), got)
  assert str(got) == str(want)


@pytest.mark.parametrize("name", list(MISTAKES))
def test_on_the_jax_device(name):
  want = _cpu_error(name)
  fn, spec = MISTAKES[name]
  with pytest.raises(type(want)) as info:
    fn(*[t.to("jax") for t in _inputs(spec)])
  _check(info.value, want)


@pytest.mark.parametrize("name", list(MISTAKES))
def test_call_torch_under_jit(name):
  want = _cpu_error(name)
  fn, spec = MISTAKES[name]
  with jax.enable_x64(True):
    arrays = [bridge.to_jax(t) for t in _inputs(spec)]
    with pytest.raises(type(want)) as info:
      jax.jit(lambda *a: bridge.call_torch(fn, *a))(*arrays)
  _check(info.value, want)


@pytest.mark.parametrize("name", list(MISTAKES))
def test_bridge_compile(name):
  want = _cpu_error(name)
  fn, spec = MISTAKES[name]
  with pytest.raises(type(want)) as info:
    bridge.compile(fn)(*_inputs(spec))
  _check(info.value, want)


class _Module(torch.nn.Module):
  def __init__(self, fn):
    super().__init__()
    self.fn = fn

  def forward(self, *args):
    return self.fn(*args)


@pytest.mark.parametrize("name", ["mm", "add_broadcast", "layer_norm_shape", "sum_dim"])
def test_extract_jax(name):
  want = _cpu_error(name)
  fn, spec = MISTAKES[name]
  params, apply = bridge.extract_jax(_Module(fn))
  arrays = [bridge.to_jax(t) for t in _inputs(spec)]
  with pytest.raises(type(want)) as info:
    jax.jit(apply)(params, *arrays)
  _check(info.value, want)


def test_the_users_line_is_in_the_traceback():
  def f(a, b):
    return torch.mm(a, b)  # the user's line

  with pytest.raises(RuntimeError) as info:
    bridge.compile(f)(torch.ones(2, 3), torch.ones(4, 2))
  assert any(
    entry.name == "f" and "torch.mm(a, b)" in str(entry.statement) for entry in info.traceback
  )


def test_callback_mode_shape_inference_is_quiet():
  # torch's FakeTensor logs a meta kernel's failure (about 20 lines) before raising it; the
  # bridge's fake run drops that log: the exception reaches the user once
  import logging

  import jax.numpy as jnp

  records = []

  class Keep(logging.Handler):
    def emit(self, record):
      records.append(record)

  def f(a, b):
    return torch.mm(a, b)

  logger = logging.getLogger("torch._subclasses.fake_tensor")  # (torch's loggers do not
  handler = Keep()  # propagate to the root, so caplog would see nothing either way)
  logger.addHandler(handler)
  try:
    # (torch's own message: the function runs on zeros once its fake run fails)
    with pytest.raises(
      RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(2x3 and 4x2\)"
    ):
      jax.jit(lambda a, b: bridge.call_torch(f, a, b, mode="callback"))(
        jnp.ones((2, 3)), jnp.ones((4, 2))
      )
  finally:
    logger.removeHandler(handler)
  assert not [r for r in records if "failed while attempting to run meta" in r.getMessage()]


def test_a_params_entry_of_another_shape_is_named():
  import jax.numpy as jnp

  params, fn = bridge.extract_jax(torch.nn.Linear(3, 2))
  params = dict(params, weight=jnp.ones((3, 2)))
  with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied") as info:
    jax.jit(fn)(params, jnp.ones((4, 3)))
  assert "'weight' is (3, 2) where Linear has (2, 3)" in "\n".join(info.value.__notes__)
