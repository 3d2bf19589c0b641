"""Training utilities on the `jax` device, as probed against CPU torch: foreach ops taking one
value per tensor from a CPU tensor (`_foreach_addcmul_(..., scalars)`, as torch's kernels read
them), and a backward pass whose op fails (a sparse embedding gradient) raising that op's own
error, with nothing kept behind."""

from __future__ import annotations

import warnings

import pytest
import torch

import bridge
from bridge._src import tensor as tensor_lib


def _foreach_steps(device: str) -> torch.Tensor:
  g = torch.Generator().manual_seed(0)
  a, b, c, d = (torch.randn(n, generator=g) for n in (5, 5, 5, 3))
  on = lambda t: t.clone().to(device)
  x = [on(a), on(d)]
  torch._foreach_addcmul_(x, [on(b), on(d)], [on(c), on(d)], torch.tensor([0.5, -2.0]))
  y = [on(a)]
  torch._foreach_addcdiv_(y, [on(b)], [on(c)], torch.tensor([0.25]))
  z = list(torch._foreach_addcmul([on(a)], [on(b)], [on(c)], torch.tensor([3.0])))
  w = list(torch._foreach_addcdiv([on(a)], [on(b)], [on(c)], torch.tensor([3.0], device=device)))
  return torch.cat([t.cpu() for t in x + y + z + w])


def test_foreach_ops_take_their_scalars_from_a_cpu_tensor():
  torch.testing.assert_close(_foreach_steps("jax"), _foreach_steps("cpu"), rtol=0, atol=0)


def test_a_sparse_embedding_gradient_raises_torchs_error_for_the_backend_and_keeps_nothing():
  emb = torch.nn.Embedding(20, 8, sparse=True).to("jax")
  idx = torch.tensor([[1, 2, 3], [4, 5, 1]], device="jax")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    for _ in range(3):
      with pytest.raises(NotImplementedError, match="_sparse_coo_tensor_with_dims_and_tensors"):
        emb(idx).sum().backward()
  assert not tensor_lib._deferred  # (each failed pass kept its error and traceback)
  # the dense embedding trains
  dense = torch.nn.Embedding(20, 8).to("jax")
  dense(idx).sum().backward()
  expected = torch.zeros(20, 8)
  expected[[1, 2, 3, 4, 5]] = 1.0
  expected[1] = 2.0
  torch.testing.assert_close(dense.weight.grad.cpu(), expected)
