"""The settings that choose how an op with no lowering runs (`decompose_missing_ops`, `fallback`)
are each caller's own: the first setting an op was seen under decided for every later call,
in every thread (a strict `fallback="error"` computed a value; a decomposition became a host
call in another thread's programs)."""

from __future__ import annotations

import threading
import warnings

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F

import bridge
from bridge._src.registry import REGISTRY


def _in_thread(fn):
  out: list = []

  def run():
    try:
      out.append(fn())
    except Exception as e:  # noqa: BLE001 - handed to the test
      out.append(e)

  t = threading.Thread(target=run)
  t.start()
  t.join()
  return out[0]


def test_glu_has_no_lowering():  # (what the tests below rely on)
  assert REGISTRY.lookup(torch.ops.aten.glu.default) is None


def test_a_strict_setting_holds_after_another_thread_decomposed_the_op():
  x = torch.randn(4, 6, device="jax")
  assert _in_thread(lambda: F.glu(x)).shape == (4, 3)  # default: torch's decomposition

  def strict():
    with bridge.config(decompose_missing_ops=False, fallback="error"):
      return F.glu(x)

  assert isinstance(_in_thread(strict), bridge.OperatorNotFound)
  torch.testing.assert_close(_in_thread(lambda: F.glu(x)).cpu(), F.glu(x.cpu()))


def _host_call_in_program(decompose: bool, scale: float) -> bool:
  def f(v):
    return bridge.call_torch(lambda t: F.glu(t).sum() * scale, v)

  with warnings.catch_warnings(), bridge.config(decompose_missing_ops=decompose):
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    return "custom_call" in jax.jit(f).lower(jnp.ones((4, 6))).as_text()


@pytest.mark.parametrize("first", [False, True])
def test_each_thread_traces_with_its_own_setting(first):
  assert _in_thread(lambda: _host_call_in_program(first, 1.0)) is (not first)
  assert _in_thread(lambda: _host_call_in_program(not first, 2.0)) is first
