"""The shape and dtype rules that stand in for torch's Python meta kernels of hot ops
(`bridge._src.dispatch.meta._PLAIN_RULES`): where a rule answers, torch's meta kernel gives
the same shape and dtype and accepts the arguments; where torch refuses them, the rule
does not answer (torch's kernel decides, and raises its own error)."""

from __future__ import annotations

import itertools
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from bridge._src import dtypes
from bridge._src.dispatch import meta

aten = torch.ops.aten

_DTYPES = [
  torch.float32,
  torch.float64,
  torch.float16,
  torch.bfloat16,
  torch.int64,
  torch.complex64,
]


def _array(shape: tuple, dtype: torch.dtype) -> np.ndarray:
  return np.zeros(shape, dtypes.TORCH_TO_JAX[dtype])


def _torch_meta(func, shapes_dtypes, kwargs):
  args = [torch.empty(s, dtype=d, device="meta") for s, d in shapes_dtypes]
  try:
    out = func(*args, **kwargs)
  except (RuntimeError, IndexError, ValueError, TypeError):
    return None
  return tuple(out.shape), out.dtype


def _cases():
  matrices = [(2, 3), (3, 4), (4,), (2, 3, 4), (1, 3), (3, 1)]
  for func, arity in ((aten.mm.default, 2), (aten.linear.default, 2), (aten.linear.default, 3)):
    for shapes in itertools.product(matrices + [(0, 3), (4, 3)], repeat=arity):
      for ds in [(d,) * arity for d in _DTYPES] + [(torch.float32, torch.float64, torch.float32)]:
        yield func, list(zip(shapes, ds[:arity])), {}
  for shapes in itertools.product([(2, 3, 4), (2, 4, 5), (3, 4, 5), (2, 3)], repeat=2):
    for d in (torch.float32, torch.bfloat16, torch.int64):
      yield aten.bmm.default, [(s, d) for s in shapes], {}
  for bias in [(2, 4), (4,), (1,), (), (1, 4), (2, 1), (3,), (2, 4, 1), (4, 2)]:
    for d, bd in [(torch.float32,) * 2, (torch.float16,) * 2, (torch.float32, torch.float64)]:
      for scale in ({}, {"beta": 0.5, "alpha": 2}, {"beta": 0}):
        yield aten.addmm.default, [(bias, bd), ((2, 3), d), ((3, 4), d)], scale
  for name in meta._SAME_AS_INPUT:
    for shape, d in itertools.product([(), (3,), (2, 0, 5)], _DTYPES):
      yield getattr(aten, name).default, [(shape, d)], {}


_CASES = list(_cases())


def test_each_rule_agrees_with_torchs_meta_kernel():
  answered = 0
  for func, shapes_dtypes, kwargs in _CASES:
    rule = meta._PLAIN_RULES[func]
    found = rule(*[_array(s, d) for s, d in shapes_dtypes], **kwargs)
    if found is None:
      continue
    answered += 1
    expected = _torch_meta(func, shapes_dtypes, kwargs)
    got = (tuple(found[0]), dtypes.JAX_TO_TORCH[found[1]])
    assert got == expected, (func, shapes_dtypes, kwargs)
  assert answered > 200  # (the rules are not idle)


def test_the_rules_leave_traced_scalars_and_python_numbers_to_torch():
  a, b = _array((2, 3), torch.float32), _array((3, 4), torch.float32)
  assert meta._addmm(_array((4,), torch.float32), a, b, beta=jnp.float32(1), alpha=1) is None
  assert meta._same(jnp.asarray(1.0)) is None  # a weak scalar: a Python number's stand-in
  assert meta._same(2.0) is None


@pytest.mark.parametrize(
  "op, shapes",
  [
    (torch.mm, [(2, 3), (4, 5)]),
    (torch.nn.functional.linear, [(2, 3), (4, 5)]),
    (torch.bmm, [(2, 3, 4), (3, 4, 5)]),
    (lambda b, x, y: torch.addmm(b, x, y), [(5,), (2, 3), (3, 4)]),
  ],
  ids=["mm", "linear", "bmm", "addmm"],
)
def test_mistakes_still_raise_torchs_error(op, shapes):
  cpu = [torch.randn(s) for s in shapes]
  with pytest.raises(RuntimeError) as expected:
    op(*cpu)
  with pytest.raises(RuntimeError) as got:
    op(*[t.to("jax") for t in cpu])
  assert str(got.value) == str(expected.value)
  with pytest.raises(RuntimeError) as got:
    bridge.compile(op)(*cpu)
  assert str(expected.value) in str(got.value)


def test_mixed_dtypes_keep_torchs_refusal():
  a, b = torch.randn(2, 3), torch.randn(3, 4, dtype=torch.float64)
  with pytest.raises(RuntimeError) as expected:
    torch.mm(a, b)
  with pytest.raises(RuntimeError) as got:
    torch.mm(a.to("jax"), b.to("jax"))
  assert str(got.value) == str(expected.value)


def test_matrix_products_and_activations_match_torch_in_every_floating_dtype():
  g = torch.Generator().manual_seed(0)
  for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
    x, w, b = (torch.randn(s, generator=g).to(dtype) for s in [(5, 3), (4, 3), (4,)])
    for f in (
      lambda x, w, b: torch.tanh(torch.nn.functional.linear(x, w, b)),
      lambda x, w, b: torch.sigmoid(torch.addmm(b, x, w.T, beta=0.5, alpha=2)),
      lambda x, w, b: torch.relu(torch.mm(x, w.T)) + b,
      lambda x, w, b: torch.bmm(x[None], w.T[None]).exp(),
    ):
      expected = f(x, w, b)
      got = bridge.compile(f)(x, w, b)
      assert got.dtype == expected.dtype and got.shape == expected.shape
      tol = {"rtol": 2e-2, "atol": 2e-2} if dtype in (torch.bfloat16, torch.float16) else {}
      torch.testing.assert_close(got, expected, **tol)


def test_a_first_trace_of_an_mlp_leaves_dynamo_unloaded():
  """The first `bridge.compile` call of a small MLP in a fresh process: torch's Python meta
  kernels of `linear` (addmm's decomposition) and `tanh` import torch._dynamo when first
  called (about 1 s); the rules answer for them instead."""
  code = (
    "import sys, torch, bridge\n"
    "m = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))\n"
    "bridge.compile(m)(torch.randn(8, 4))\n"
    "print('torch._dynamo' in sys.modules)\n"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
  )
  assert out.stdout.strip() == "False"


def test_the_rules_dtype_table_covers_what_they_admit():
  for d in meta._FLOATING:
    assert np.dtype(d) in dtypes.JAX_TO_TORCH
