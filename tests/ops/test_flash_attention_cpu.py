"""The CPU flash-attention kernel and its backward (what aot_autograd makes of
`F.scaled_dot_product_attention` on CPU tensors) against torch's own CPU kernels."""

from __future__ import annotations

import pytest
import torch

import bridge  # noqa: F401 - the `jax` device

FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _jax(t):
  return None if t is None else t.to("jax")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_forward_and_backward_match_torchs_kernels(dtype, is_causal, masked):
  torch.manual_seed(0)
  q = torch.randn(2, 3, 5, 4, dtype=dtype)
  k = torch.randn(2, 3, 6, 4, dtype=dtype)
  v = torch.randn(2, 3, 6, 4, dtype=dtype)
  mask = torch.randn(5, 6, dtype=dtype) if masked else None
  tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}
  out, lse = FORWARD(q, k, v, 0.0, is_causal, attn_mask=mask, scale=0.3)
  out_j, lse_j = FORWARD(_jax(q), _jax(k), _jax(v), 0.0, is_causal, attn_mask=_jax(mask), scale=0.3)
  lse_dtype = torch.float64 if dtype == torch.float64 else torch.float32
  assert (out_j.dtype, lse_j.dtype, tuple(lse_j.shape)) == (dtype, lse_dtype, (2, 3, 5))
  assert lse.dtype == lse_dtype
  torch.testing.assert_close(out_j.cpu(), out, **tol)
  torch.testing.assert_close(lse_j.cpu(), lse, **tol)
  grad = torch.randn_like(out)
  ref = BACKWARD(grad, q, k, v, out, lse, 0.0, is_causal, attn_mask=mask, scale=0.3)
  got = BACKWARD(
    *map(_jax, (grad, q, k, v, out, lse)), 0.0, is_causal, attn_mask=_jax(mask), scale=0.3
  )
  for name, a, b in zip(("query", "key", "value"), got, ref):
    assert a.dtype == b.dtype and a.shape == b.shape, name
    torch.testing.assert_close(a.cpu(), b, msg=name, **tol)


def test_default_scale_is_one_over_sqrt_of_the_head_size():
  q = torch.randn(1, 2, 4, 8)
  out, lse = FORWARD(q, q, q)
  out_j, lse_j = FORWARD(_jax(q), _jax(q), _jax(q))
  torch.testing.assert_close(out_j.cpu(), out)
  torch.testing.assert_close(lse_j.cpu(), lse)
