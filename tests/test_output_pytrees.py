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
  # and back in, as a dataclass of tensors
  both = jax.jit(lambda p: bridge.call_torch(lambda p: p.total + p.scaled.sum(), p))(out)
  assert float(both) == 18.0


# ----------------------------------------------------------------------------- caches


def _gpt2(transformers, n_layer=2):
  torch.manual_seed(0)
  config = transformers.GPT2Config(n_layer=n_layer, n_head=2, n_embd=32, vocab_size=100)
  return transformers.GPT2LMHeadModel(config).eval()


def _kv(cache):
  """A torch cache's key and value tensors, layer by layer, as NumPy arrays."""
  return [t.detach().numpy() for layer in cache.layers for t in (layer.keys, layer.values)]


def _close(actual, expected):
  np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=1e-4, atol=1e-5)


def test_gpt2_cache_leaves_jit_and_feeds_the_next_step():
  transformers = _transformers()
  gpt2 = _gpt2(transformers)
  params, fn = bridge.extract_jax(gpt2)
  step = jax.jit(fn, static_argnames="use_cache")  # (`if use_cache:` in GPT-2's forward)
  ids, next_id = _ids((1, 6)), _ids((1, 1)) + 1

  out = step(params, ids, use_cache=True)
  ref = gpt2(torch.from_numpy(ids).long(), use_cache=True)
  _close(out.logits, ref.logits.detach())
  cache = out.cache
  assert type(cache) is transformers.DynamicCache and out["cache"] is cache
  assert [type(layer) for layer in cache.layers] == [transformers.DynamicLayer] * 2
  leaves = jax.tree_util.tree_leaves(out.past_key_values)  # (the deprecated name, too)
  assert [a.shape for a in leaves] == [(1, 2, 6, 16)] * 4
  assert all(isinstance(a, jax.Array) for a in leaves)
  for a, b in zip(leaves, _kv(ref.cache)):
    _close(a, b)
  # key paths name the attributes; a tree rebuilt from the leaves is a cache again, with its
  # static attributes (the torch methods are for torch: the cache comes back in for them)
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(cache)[0]]
  assert paths[:2] == [".layers[0].keys", ".layers[0].values"]
  rebuilt = jax.tree_util.tree_map(lambda a: a, cache)
  assert type(rebuilt) is transformers.DynamicCache and len(rebuilt) == 2
  assert rebuilt.layers[1].is_initialized and rebuilt.layers[1].values is leaves[3]
  assert rebuilt.layers is not cache.layers and rebuilt.offloading is False
  # a tree of another leaf type (in_axes, shardings) keeps the cache's structure
  axes = jax.tree_util.tree_map(lambda _: 0, cache)
  assert jax.tree_util.tree_structure(axes) == jax.tree_util.tree_structure(cache)

  # the cache back in: the second token as torch decodes it with its own cache
  out2 = jax.jit(fn)(params, next_id, cache=cache)
  ref2 = gpt2(torch.from_numpy(next_id).long(), cache=ref.cache)
  assert out2.logits.shape == (1, 1, 100)
  _close(out2.logits, ref2.logits.detach())
  leaves2 = jax.tree_util.tree_leaves(out2.cache)
  assert [a.shape for a in leaves2] == [(1, 2, 7, 16)] * 4
  for a, b in zip(leaves2, _kv(ref2.cache)):
    _close(a, b)
  # the input cache is a value: the second step did not grow it
  assert [a.shape for a in jax.tree_util.tree_leaves(cache)] == [(1, 2, 6, 16)] * 4
  # eagerly (no jit) too
  _close(fn(params, next_id, cache=cache).logits, ref2.logits.detach())

  # an empty cache made on the JAX side (its layers not yet filled: no leaves, all static) goes
  # in too, and a second one of the same structure reuses the compiled program
  traces = []

  def fill(p, i, c):
    traces.append(None)
    return fn(p, i, cache=c, use_cache=True)

  fill = jax.jit(fill)
  empty = transformers.DynamicCache(config=gpt2.config)
  assert jax.tree_util.tree_leaves(empty) == [] and len(empty.layers) == 2
  filled = fill(params, ids, empty)
  _close(filled.logits, ref.logits.detach())
  _close(filled.cache.layers[1].values, jax.tree_util.tree_leaves(cache)[3])
  assert empty.layers[0].keys is None  # (the model filled its own copy)
  fill(params, ids, transformers.DynamicCache(config=gpt2.config))
  assert len(traces) == 1


def test_gpt2_cache_as_aux_and_differentiated():
  transformers = _transformers()
  gpt2 = _gpt2(transformers, n_layer=1)
  params, fn = bridge.extract_jax(gpt2)
  ids, next_id = _ids((1, 5)), _ids((1, 1)) + 1
  name = "transformer.h.0.attn.c_attn.weight"

  def loss(p):
    o = fn(p, ids, use_cache=True)
    return o.logits.sum(), o

  grads, aux = jax.jit(jax.grad(loss, has_aux=True))(params)
  assert type(aux.cache) is transformers.DynamicCache
  ref = gpt2(torch.from_numpy(ids).long(), use_cache=True)
  ref.logits.sum().backward()
  _close(grads[name], gpt2.get_parameter(name).grad)
  for a, b in zip(jax.tree_util.tree_leaves(aux.cache), _kv(ref.cache)):
    _close(a, b)

  # the gradient with respect to a cache is a cache, as torch's autograd gives it
  cache = aux.cache
  g = jax.jit(jax.grad(lambda c: fn(params, next_id, cache=c).logits.sum()))(cache)
  assert type(g) is transformers.DynamicCache
  layer = ref.cache.layers[0]
  k, v = layer.keys.detach().requires_grad_(), layer.values.detach().requires_grad_()
  layer.keys, layer.values = k, v
  gpt2(torch.from_numpy(next_id).long(), cache=ref.cache).logits.sum().backward()
  gk, gv = jax.tree_util.tree_leaves(g)
  _close(gk, k.grad)
  _close(gv, v.grad)


def test_callback_mode_outputs_are_pytrees_too():
  # the torch code runs for real (`mode="callback"`); its ModelOutput and cache come back as
  # JAX nodes built from the fake run's outputs
  transformers = _transformers()
  gpt2 = _gpt2(transformers, n_layer=1)
  params, fn = bridge.extract_jax(gpt2, mode="callback")
  ids = _ids((1, 6))
  out = jax.jit(lambda p, i: fn(p, i, use_cache=True))(params, ids)
  assert type(out) is transformers.modeling_outputs.CausalLMOutputWithCrossAttentions
  assert type(out.cache) is transformers.DynamicCache
  ref = gpt2(torch.from_numpy(ids).long(), use_cache=True)
  _close(out.logits, ref.logits.detach())
  leaves = jax.tree_util.tree_leaves(out.cache)
  assert [leaf.shape for leaf in leaves] == [(1, 2, 6, 16)] * 2
  for a, b in zip(leaves, _kv(ref.cache)):
    _close(a, b)


def test_t5_encoder_decoder_cache_round_trip():
  transformers = _transformers()
  torch.manual_seed(0)
  t5 = transformers.T5Model(
    transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2)
  ).eval()
  params, fn = bridge.extract_jax(t5)
  ids, next_id = _ids((1, 4)).astype(np.int64), _ids((1, 1)).astype(np.int64) + 1
  ref = t5(input_ids=torch.from_numpy(ids), decoder_input_ids=torch.from_numpy(ids), use_cache=True)
  ref_kv = [_kv(ref.cache.self_attention_cache), _kv(ref.cache.cross_attention_cache)]
  with jax.enable_x64(True):  # (T5's relative position buckets are int64 arithmetic)
    out = jax.jit(fn, static_argnames="use_cache")(
      params, input_ids=ids, decoder_input_ids=ids, use_cache=True
    )
    cache = out.cache
    assert type(cache) is transformers.EncoderDecoderCache
    assert type(cache.self_attention_cache) is transformers.DynamicCache
    assert cache.is_updated == {0: True}  # static: kept as it was, a dict of bools
    assert [a.shape for a in jax.tree_util.tree_leaves(cache)] == [(1, 2, 4, 8)] * 4
    for sub, expected in zip((cache.self_attention_cache, cache.cross_attention_cache), ref_kv):
      _close(sub.layers[0].keys, expected[0])
      _close(sub.layers[0].values, expected[1])
    _close(out.last_hidden_state, ref.last_hidden_state.detach())

    # one more decoder token: the self-attention cache grows, the cross-attention one is reused
    out2 = jax.jit(fn)(
      params,
      encoder_outputs=(out.encoder_last_hidden_state,),
      decoder_input_ids=next_id,
      cache=cache,
    )
  ref2 = t5(
    encoder_outputs=(ref.encoder_last_hidden_state,),
    decoder_input_ids=torch.from_numpy(next_id),
    cache=ref.cache,
  )
  _close(out2.last_hidden_state, ref2.last_hidden_state.detach())
  grown, reused = (
    out2.cache.self_attention_cache.layers[0],
    out2.cache.cross_attention_cache.layers[0],
  )
  assert grown.keys.shape == grown.values.shape == (1, 2, 5, 8)
  _close(grown.values, ref2.cache.self_attention_cache.layers[0].values.detach())
  _close(reused.keys, ref_kv[1][0])
  assert cache.is_updated == {0: True} and len(jax.tree_util.tree_leaves(cache)) == 4


class Window:
  """Not a dataclass: its state is its `__dict__`: an array, a setting, a list."""

  def __init__(self, values, width):
    self.values = values
    self.width = width
    self.log = []

  def last(self):
    return self.values[..., -self.width :]


def test_a_plain_object_of_tensors_both_ways():
  x = jnp.arange(6.0)
  out = jax.jit(lambda a: bridge.call_torch(lambda t: Window(t * 2, width=2), a))(x)
  assert isinstance(out, Window) and out.width == 2
  np.testing.assert_array_equal(np.asarray(out.last()), [8.0, 10.0])
  assert len(jax.tree_util.tree_leaves(out)) == 1

  # back in: torch code sees a `Window` of tensors and can call its methods
  def f(w):
    w.log.append(w.width)  # on its own copy: the JAX value (and jit's cache key) stay as they were
    return w.last().sum() * w.width

  total = jax.jit(lambda w: bridge.call_torch(f, w))
  assert float(total(out)) == 36.0 and out.log == []
  assert float(total(Window(jnp.ones(6), 2))) == 4.0  # (a new object with the same structure)
  g = jax.grad(lambda w: bridge.call_torch(lambda w: w.last().sum(), w))(out)
  assert isinstance(g, Window) and g.width == 2
  np.testing.assert_array_equal(np.asarray(g.values), [0, 0, 0, 0, 1, 1])
