"""Real models through the bridge: Hugging Face GPT-2, BERT and a Mixtral mixture of experts, a
CNN with BatchNorm, an LSTM.

For each: the forward under `jax.jit` through `extract_jax`/`call_torch` and through
`bridge.compile` matches torch eager; gradients with respect to every parameter via
`jax.grad` match torch autograd; the `jax` device's eager path gives the same numbers.
Models are built from small configs with random weights (no downloads).
"""

from __future__ import annotations

import copy
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")


def _ids(batch=2, length=10, vocab=100, seed=0):
  return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def _gpt2():
  config = transformers.GPT2Config(
    n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0
  )
  model = transformers.GPT2LMHeadModel(config)
  ids = _ids()
  return model, (ids,), {"labels": ids}, lambda out: out.logits, lambda out: out.loss


def _bert():
  config = transformers.BertConfig(
    num_hidden_layers=2,
    num_attention_heads=2,
    hidden_size=32,
    intermediate_size=64,
    vocab_size=100,
    max_position_embeddings=32,
    num_labels=3,
  )
  model = transformers.BertForSequenceClassification(config)
  mask = torch.ones(2, 10, dtype=torch.long)
  mask[1, 6:] = 0  # padding: the attention mask matters
  labels = torch.tensor([0, 2])
  return (
    model,
    (_ids(),),
    {"attention_mask": mask, "labels": labels},
    lambda out: out.logits,
    lambda out: out.loss,
  )


class _CNN(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.body = torch.nn.Sequential(
      torch.nn.Conv2d(3, 8, 3, padding=1),
      torch.nn.BatchNorm2d(8),
      torch.nn.ReLU(),
      torch.nn.MaxPool2d(2),
      torch.nn.Conv2d(8, 8, 3, padding=1),
      torch.nn.BatchNorm2d(8),
      torch.nn.ReLU(),
      torch.nn.AdaptiveAvgPool2d(1),
      torch.nn.Flatten(),
      torch.nn.Linear(8, 4),
    )

  def forward(self, x, labels):
    logits = self.body(x)
    return logits, torch.nn.functional.cross_entropy(logits, labels)


def _cnn():
  x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
  return _CNN(), (x,), {"labels": torch.tensor([0, 1, 2, 3])}, lambda o: o[0], lambda o: o[1]


class _Tagger(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.emb = torch.nn.Embedding(50, 16)
    self.rnn = torch.nn.LSTM(16, 12, num_layers=2, batch_first=True, bidirectional=True)
    self.head = torch.nn.Linear(24, 5)

  def forward(self, ids, labels):
    h, _ = self.rnn(self.emb(ids))
    logits = self.head(h)
    return logits, torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _lstm():
  ids = _ids(vocab=50, seed=2)
  return _Tagger(), (ids,), {"labels": ids % 5}, lambda o: o[0], lambda o: o[1]


def _mixtral():
  # a mixture of experts: top-2 routing, then Hugging Face's grouped GEMMs (`F.grouped_mm`) over
  # the tokens sorted by expert, with offsets computed from the router's traced choices
  config = transformers.MixtralConfig(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_local_experts=4,
    num_experts_per_tok=2,
    vocab_size=100,
    max_position_embeddings=32,
  )
  model = transformers.MixtralForCausalLM(config)
  ids = _ids()
  return model, (ids,), {"labels": ids}, lambda out: out.logits, lambda out: out.loss


MODELS = {
  "gpt2": _gpt2,
  "bert": _bert,
  "cnn_batchnorm": _cnn,
  "lstm": _lstm,
  "mixtral_moe": _mixtral,
}
# float32 models compared with torch on the CPU: XLA fuses and reorders reductions.
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _build(name, train=False):
  torch.manual_seed(0)
  model, args, kwargs, logits_of, loss_of = MODELS[name]()
  return model.train(train), args, kwargs, logits_of, loss_of


def _to_jax(tree):
  return jax.tree_util.tree_map(lambda t: jnp.asarray(t.numpy()), tree)


def _close(actual, expected, **kw):
  torch.testing.assert_close(torch.from_numpy(np.array(actual)), expected.detach(), **(kw or TOL))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_under_jit_and_compile_matches_torch(name):
  model, args, kwargs, logits_of, _ = _build(name)
  with torch.no_grad():
    expected = logits_of(model(*args, **kwargs))
  params, fn = bridge.extract_jax(model)
  jitted = jax.jit(lambda p, a, k: logits_of(fn(p, *a, **k)))
  with jax.enable_x64(True):  # int64 ids and labels stay int64, as in torch
    _close(jitted(params, _to_jax(args), _to_jax(kwargs)), expected)
    _close(
      jax.jit(lambda a, k: logits_of(bridge.call_torch(model, *a, **k)))(
        _to_jax(args), _to_jax(kwargs)
      ),
      expected,
    )
  with torch.no_grad():
    compiled = bridge.compile(model)
    torch.testing.assert_close(logits_of(compiled(*args, **kwargs)), expected, **TOL)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameter_gradients_via_jax_grad_match_torch_autograd(name):
  # train mode for BatchNorm (batch statistics), eval for dropout-carrying HF models
  model, args, kwargs, _, loss_of = _build(name, train=name == "cnn_batchnorm")
  reference = copy.deepcopy(model)
  loss_of(reference(*args, **kwargs)).backward()
  params, fn = bridge.extract_jax(model)
  trainable = {k: v for k, v in params.items() if np.issubdtype(v.dtype, np.floating)}
  with jax.enable_x64(True):
    grads = jax.jit(jax.grad(lambda p, a, k: loss_of(fn(p, *a, **k))))(
      trainable, _to_jax(args), _to_jax(kwargs)
    )
  named = dict(reference.named_parameters())
  assert set(grads) >= set(named), set(named) - set(grads)
  for key, param in named.items():
    _close(grads[key], param.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_jax_device_eager_matches_torch(name):
  model, args, kwargs, logits_of, loss_of = _build(name)
  with torch.no_grad():
    expected = logits_of(model(*args, **kwargs))
  device_model = copy.deepcopy(model).to("jax")
  on_device = jax.tree_util.tree_map(lambda t: t.to("jax"), (args, kwargs))
  with torch.no_grad():
    out = logits_of(device_model(*on_device[0], **on_device[1]))
  assert out.device.type == "jax"
  torch.testing.assert_close(out.cpu(), expected, **TOL)


def test_transformers_sees_bridge_tracing():
  from transformers.utils import import_utils

  seen = []

  def probe(x):
    seen.append(import_utils.is_tracing(x))
    return x * 2

  bridge.call_torch(probe, jnp.ones(2))  # concrete values: not tracing
  jax.jit(bridge.jax_view(probe))(jnp.ones(2))  # staged: tracing
  assert seen == [False, True]
  assert import_utils.is_tracing(torch.ones(2)) is False  # other tensors: unchanged
