"""What torch code returns (Hugging Face `ModelOutput`s, dataclasses of tensors) leaves
`jax.jit` through `extract_jax` and `call_torch` as JAX pytrees, with key, index and attribute
access, and passes through `jax.grad(has_aux=True)` and `jax.tree_util`."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge


def _transformers():
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  transformers = pytest.importorskip("transformers")
  transformers.logging.set_verbosity_error()
  return transformers


def _ids(shape, vocab=100):
  return np.random.default_rng(0).integers(0, vocab, shape).astype(np.int32)


def test_bert_output_leaves_jit_and_grad_with_aux():
  transformers = _transformers()
  config = transformers.BertConfig(
    vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
  )
  torch.manual_seed(0)
  model = transformers.BertModel(config).eval()
  params, fn = bridge.extract_jax(model)
  ids = _ids((2, 5))
  out = jax.jit(fn)(params, ids)
  assert type(out).__name__ == "BaseModelOutputWithPoolingAndCrossAttentions"
  assert list(out.keys()) == ["last_hidden_state", "pooler_output"]
  ref = model(torch.from_numpy(ids).long())
  np.testing.assert_allclose(
    np.asarray(out.last_hidden_state), ref.last_hidden_state.detach().numpy(), rtol=1e-4, atol=1e-5
  )
  assert out["pooler_output"].shape == (2, 32) and out[0].shape == (2, 5, 32)
  leaves = jax.tree_util.tree_leaves(out)
  assert len(leaves) == 2

  def loss(p):
    o = fn(p, ids)
    return o.pooler_output.sum(), o

  grads, aux = jax.jit(jax.grad(loss, has_aux=True))(params)
  assert type(aux).__name__ == "BaseModelOutputWithPoolingAndCrossAttentions"
  ref.pooler_output.sum().backward()
  np.testing.assert_allclose(
    np.asarray(grads["pooler.dense.weight"]),
    model.pooler.dense.weight.grad.numpy(),
    rtol=1e-4,
    atol=1e-5,
  )
  # eager jax.grad (no jit) too: the embedding's int64 indices under 32-bit types
  grads_eager, _ = jax.grad(loss, has_aux=True)(params)
  np.testing.assert_allclose(
    np.asarray(grads_eager["pooler.dense.weight"]),
    np.asarray(grads["pooler.dense.weight"]),
    rtol=1e-5,
    atol=1e-6,
  )


def test_gpt2_and_t5_outputs():
  transformers = _transformers()
  torch.manual_seed(0)
  gpt2 = transformers.GPT2LMHeadModel(
    transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=100, use_cache=False)
  ).eval()
  params, fn = bridge.extract_jax(gpt2)
  out = jax.jit(fn)(params, _ids((1, 6)))
  assert type(out).__name__ == "CausalLMOutputWithCrossAttentions"
  assert out.logits.shape == (1, 6, 100)

  t5 = transformers.T5Model(
    transformers.T5Config(
      vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2, use_cache=False
    )
  ).eval()
  params, fn = bridge.extract_jax(t5)
  ids = _ids((1, 4)).astype(np.int64)
  with jax.enable_x64(True):  # (T5's relative position buckets are int64 arithmetic)
    out = jax.jit(fn)(params, input_ids=ids, decoder_input_ids=ids)
  assert type(out).__name__ == "Seq2SeqModelOutput"
  ref = t5(input_ids=torch.from_numpy(ids), decoder_input_ids=torch.from_numpy(ids))
  np.testing.assert_allclose(
    np.asarray(out.last_hidden_state), ref.last_hidden_state.detach().numpy(), rtol=1e-4, atol=1e-5
  )
  assert out.encoder_last_hidden_state.shape == (1, 4, 32)


@dataclasses.dataclass
class Parts:
  total: torch.Tensor
  scaled: torch.Tensor
  note: None = None


def test_a_dataclass_of_tensors_from_call_torch():
  def f(x):
    return Parts(total=x.sum(), scaled=x * 2)

  x = jnp.arange(4.0)
  out = jax.jit(lambda a: bridge.call_torch(f, a))(x)
  assert isinstance(out, Parts)
  assert float(out.total) == 6.0
  np.testing.assert_array_equal(np.asarray(out.scaled), np.arange(4.0) * 2)
  g = jax.grad(lambda a: bridge.call_torch(f, a).total)(x)
  np.testing.assert_array_equal(np.asarray(g), np.ones(4))
  assert len(jax.tree_util.tree_leaves(out)) == 2
