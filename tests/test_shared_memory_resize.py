"""A CPU tensor whose memory a JAX array shares (`bridge.to_jax`, zero-copy) cannot be resized,
as after `t.numpy()`: torch's `resize_` freed the memory the array read (garbage, or a crash)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge

NOT_RESIZABLE = "Trying to resize storage that is not resizable"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool, torch.int32])
def test_a_shared_tensor_refuses_resize_as_torch_does_after_numpy(dtype):
  t = torch.ones(1 << 12, dtype=dtype)
  a = bridge.to_jax(t)
  with pytest.raises(RuntimeError, match=NOT_RESIZABLE):
    t.resize_(1 << 20)
  with pytest.raises(RuntimeError, match=NOT_RESIZABLE):
    t.untyped_storage().resize_(1 << 20)
  assert int(jnp.sum(a.astype(jnp.int32))) == 1 << 12


def test_a_view_shares_and_refuses_too():
  base = torch.arange(64.0)
  a = bridge.to_jax(base[16:32])  # 64-byte aligned: shared
  with pytest.raises(RuntimeError, match=NOT_RESIZABLE):
    base.resize_(1 << 20)
  np.testing.assert_array_equal(np.asarray(a), np.arange(16.0, 32.0))


def test_copies_leave_the_tensor_resizable():  # (a control)
  t = torch.ones(8)
  bridge.to_jax(t, copy=True)
  t.resize_(1 << 10)  # a copy shares nothing
  odd = torch.ones(9)
  bridge.to_jax(odd[1:])  # unaligned: copied
  odd.resize_(1 << 10)
  assert t.untyped_storage().resizable() and odd.untyped_storage().resizable()


def test_resizing_after_to_jax_no_longer_crashes_the_process():
  code = textwrap.dedent(
    """
    import torch, jax.numpy as jnp, bridge
    t = torch.full((1 << 22,), 3.0)
    a = bridge.to_jax(t)
    try:
      t.resize_(1 << 24)
    except RuntimeError as e:
      print("refused:", e)
    print(float(jnp.sum(a)))
    """
  )
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
  assert done.stdout.splitlines() == [f"refused: {NOT_RESIZABLE}", str(3.0 * (1 << 22))]
