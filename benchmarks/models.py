"""The models of the module workloads (issue 4), their inputs, and the shared JAX training step.

Every system builds its copy of a model from the same constructor and seed, so
all of them start from identical weights and get identical inputs.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

LINEAR_IN, LINEAR_BATCH = 16, 8
MLP_SIZES, MLP_BATCH = (784, 256, 256, 10), 64
TRANSFORMER = dict(d_model=128, nhead=4, dim_feedforward=256, batch_first=True, dropout=0.0)
TRANSFORMER_INPUT = (4, 32, 128)
LR = 0.01  # plain SGD, no momentum
# Hugging Face models of issue 7, built offline from configs with random weights.
# GPT-2-small-shaped layers (768 wide, 12 heads) but 2 of them and an 8192-token
# vocabulary (GPT-2 has 12 layers and 50257 tokens), to keep runs short on small CPUs.
HF_GPT2 = dict(
  n_embd=768,
  n_head=12,
  n_layer=2,
  vocab_size=8192,
  n_positions=1024,
  bos_token_id=0,
  eos_token_id=0,
)
# BERT-small-shaped: 4 layers, hidden 512, 8 heads, intermediate 2048 (BERT's vocabulary).
HF_BERT = dict(
  hidden_size=512,
  num_attention_heads=8,
  num_hidden_layers=4,
  intermediate_size=2048,
  vocab_size=30522,
)
HF_BATCH = 1
# The call_torch (trace mode) workloads: f(x) = x*2+1 on (16, 16), and a 2-layer tanh MLP of
# 256x256 weights on a (64, 256) batch (the vmap row maps it over the 64 examples).
CALL_TORCH_SMALL = (16, 16)
CALL_TORCH_WIDTH, CALL_TORCH_BATCH = 256, 64
# The sharded (data parallel) workloads: a wider MLP whose batch of 256 splits into 8 shards of 32.
DP_SIZES, DP_BATCH = (512, 1024, 1024, 10), 256


def _gen(seed: int) -> torch.Generator:
  return torch.Generator().manual_seed(seed)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
  """Seed torch's global generator (which nn.Module initializers use) inside, restore it after."""
  with torch.random.fork_rng(devices=[]):
    torch.manual_seed(seed)
    yield


def linear() -> tuple[torch.nn.Module, torch.Tensor]:
  """`nn.Linear(16, 16)` and an (8, 16) float32 input."""
  with seeded(10):
    module = torch.nn.Linear(LINEAR_IN, LINEAR_IN)
  return module, torch.randn(LINEAR_BATCH, LINEAR_IN, generator=_gen(11))


def _relu_mlp(
  sizes: tuple[int, ...], batch: int, seed: int
) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
  """`nn.Sequential` of Linear layers of `sizes` with ReLU between, a float32 batch and int64 labels."""
  layers: list[torch.nn.Module] = []
  with seeded(seed):
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
      layers += [torch.nn.Linear(n_in, n_out)] + ([torch.nn.ReLU()] if i < len(sizes) - 2 else [])
  g = _gen(seed + 1)
  x = torch.randn(batch, sizes[0], generator=g)
  y = torch.randint(0, sizes[-1], (batch,), generator=g)
  return torch.nn.Sequential(*layers), x, y


def mlp() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
  """784-256-256-10 ReLU MLP, a (64, 784) float32 batch and int64 labels."""
  return _relu_mlp(MLP_SIZES, MLP_BATCH, 20)


def dp_mlp() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
  """512-1024-1024-10 ReLU MLP, a (256, 512) float32 batch and int64 labels (the sharded workloads)."""
  return _relu_mlp(DP_SIZES, DP_BATCH, 70)


# The conv nets of issue 28: torchvision's resnet18 and mobilenet_v3_small, written out here
# layer for layer (torchvision's wheel for this torch does not load its C ops on this machine),
# 1000 classes; forwards on 1x3x224x224 and 8x3x64x64, training steps on 8x3x64x64.
CONV_SHAPES = {"224": (1, 3, 224, 224), "64x8": (8, 3, 64, 64)}
CONV_CLASSES = 1000


class _BasicBlock(torch.nn.Module):
  def __init__(self, c_in: int, c_out: int, stride: int):
    super().__init__()
    nn = torch.nn
    self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
    self.bn1 = nn.BatchNorm2d(c_out)
    self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
    self.bn2 = nn.BatchNorm2d(c_out)
    self.downsample = (
      nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
      if stride != 1 or c_in != c_out
      else None
    )

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    y = torch.relu(self.bn1(self.conv1(x)))
    y = self.bn2(self.conv2(y))
    return torch.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet18(torch.nn.Module):
  """torchvision's `resnet18()`: the same layers, shapes and initialization scheme."""

  def __init__(self, classes: int = CONV_CLASSES):
    super().__init__()
    nn = torch.nn
    self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
    self.bn1 = nn.BatchNorm2d(64)
    self.maxpool = nn.MaxPool2d(3, 2, 1)
    blocks, c_in = [], 64
    for c_out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
      blocks += [_BasicBlock(c_in, c_out, stride), _BasicBlock(c_out, c_out, 1)]
      c_in = c_out
    self.layers = nn.Sequential(*blocks)
    self.fc = nn.Linear(512, classes)
    for m in self.modules():
      if isinstance(m, nn.Conv2d):
        nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
    x = torch.nn.functional.adaptive_avg_pool2d(self.layers(x), 1)
    return self.fc(torch.flatten(x, 1))


def _divisible(v: float, divisor: int = 8) -> int:
  new = max(divisor, int(v + divisor / 2) // divisor * divisor)
  return new + divisor if new < 0.9 * v else new


class _SqueezeExcite(torch.nn.Module):
  def __init__(self, channels: int):
    super().__init__()
    squeeze = _divisible(channels // 4)
    self.fc1 = torch.nn.Conv2d(channels, squeeze, 1)
    self.fc2 = torch.nn.Conv2d(squeeze, channels, 1)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    s = torch.nn.functional.adaptive_avg_pool2d(x, 1)
    s = torch.nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))
    return x * s


def _conv_bn(c_in: int, c_out: int, k: int, stride: int, groups: int, act: Any) -> list:
  nn = torch.nn
  layers = [
    nn.Conv2d(c_in, c_out, k, stride, (k - 1) // 2, groups=groups, bias=False),
    nn.BatchNorm2d(c_out, eps=0.001, momentum=0.01),
  ]
  return layers + ([act()] if act is not None else [])


class _InvertedResidual(torch.nn.Module):
  def __init__(self, c_in: int, k: int, expanded: int, c_out: int, se: bool, act: Any, stride: int):
    super().__init__()
    layers: list = []
    if expanded != c_in:
      layers += _conv_bn(c_in, expanded, 1, 1, 1, act)
    layers += _conv_bn(expanded, expanded, k, stride, expanded, act)
    if se:
      layers.append(_SqueezeExcite(expanded))
    layers += _conv_bn(expanded, c_out, 1, 1, 1, None)
    self.block = torch.nn.Sequential(*layers)
    self.residual = stride == 1 and c_in == c_out

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    y = self.block(x)
    return x + y if self.residual else y


class MobileNetV3Small(torch.nn.Module):
  """torchvision's `mobilenet_v3_small()` (its configuration table; dropout 0 here, so that
  every system's training step can be checked against torch's)."""

  def __init__(self, classes: int = CONV_CLASSES):
    super().__init__()
    nn = torch.nn
    re, hs = nn.ReLU, nn.Hardswish
    table = [  # c_in, kernel, expanded, c_out, squeeze-excite, activation, stride
      (16, 3, 16, 16, True, re, 2),
      (16, 3, 72, 24, False, re, 2),
      (24, 3, 88, 24, False, re, 1),
      (24, 5, 96, 40, True, hs, 2),
      (40, 5, 240, 40, True, hs, 1),
      (40, 5, 240, 40, True, hs, 1),
      (40, 5, 120, 48, True, hs, 1),
      (48, 5, 144, 48, True, hs, 1),
      (48, 5, 288, 96, True, hs, 2),
      (96, 5, 576, 96, True, hs, 1),
      (96, 5, 576, 96, True, hs, 1),
    ]
    layers = _conv_bn(3, 16, 3, 2, 1, hs) + [_InvertedResidual(*row) for row in table]
    self.features = nn.Sequential(*layers, *_conv_bn(96, 576, 1, 1, 1, hs))
    self.classifier = nn.Sequential(nn.Linear(576, 1024), hs(), nn.Linear(1024, classes))
    for m in self.modules():
      if isinstance(m, nn.Conv2d):
        nn.init.kaiming_normal_(m.weight, mode="fan_out")
        if m.bias is not None:
          nn.init.zeros_(m.bias)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = torch.nn.functional.adaptive_avg_pool2d(self.features(x), 1)
    return self.classifier(torch.flatten(x, 1))


CONV_NETS = {"resnet18": (ResNet18, 80), "mobilenet_v3_small": (MobileNetV3Small, 90)}


def conv_net(name: str, shape: str) -> tuple[torch.nn.Module, torch.Tensor]:
  """One of `CONV_NETS` in eval mode and an input of `CONV_SHAPES[shape]`."""
  build, seed = CONV_NETS[name]
  with seeded(seed):
    net = build().eval()
  return net, torch.randn(*CONV_SHAPES[shape], generator=_gen(seed + 1))


def conv_net_train(name: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
  """`conv_net(name, "64x8")` for a fine-tuning step: BatchNorm in eval mode (frozen running
  statistics, so that every system's step is checked against torch's on parameters alone)."""
  net, x = conv_net(name, "64x8")
  return (
    net,
    x,
    torch.randint(0, CONV_CLASSES, (x.shape[0],), generator=_gen(CONV_NETS[name][1] + 2)),
  )


def transformer() -> tuple[torch.nn.Module, torch.Tensor]:
  """`nn.TransformerEncoderLayer(128, 4, 256, batch_first, dropout=0)` in eval mode, (4, 32, 128) input."""
  with seeded(30):
    layer = torch.nn.TransformerEncoderLayer(**TRANSFORMER).eval()
  return layer, torch.randn(*TRANSFORMER_INPUT, generator=_gen(31))


class Flat(torch.nn.Module):
  """`module`'s (batch, seq, features) output as (batch * seq, features) logits, so that the
  shared cross-entropy training step applies unchanged."""

  def __init__(self, module: torch.nn.Module):
    super().__init__()
    self.module = module

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.module(x).flatten(0, 1)


def transformer_train() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
  """`transformer()`'s layer in train mode (dropout 0: no fast path) and a label per token."""
  layer, x = transformer()
  batch, seq, features = x.shape
  y = torch.randint(0, features, (batch * seq,), generator=_gen(32))
  return Flat(layer.train()), x, y


def _transformers():
  """Import transformers offline (nothing is downloaded: configs only, random weights)."""
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  import transformers

  transformers.logging.set_verbosity_error()
  return transformers


class HFOutput(torch.nn.Module):
  """A Hugging Face model called on ``input_ids`` alone, returning one output field as a tensor.

  The field (``logits`` for GPT-2, ``last_hidden_state`` for BERT) is flattened
  to ``(batch * seq, features)``, so that every system's forward returns one
  tensor and the shared cross-entropy training step applies unchanged.
  """

  def __init__(self, model: torch.nn.Module, field: str):
    super().__init__()
    self.model, self.field = model, field

  def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
    return getattr(self.model(input_ids=input_ids), self.field).flatten(0, 1)


def _ids(seq: int, vocab: int, seed: int) -> torch.Tensor:
  return torch.randint(0, vocab, (HF_BATCH, seq), generator=_gen(seed))


def gpt2(seq: int) -> tuple[torch.nn.Module, torch.Tensor]:
  """`GPT2LMHeadModel(HF_GPT2)`, eval, no dropout, logits of a (1, seq) int64 input."""
  tf = _transformers()
  config = tf.GPT2Config(
    **HF_GPT2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False
  )
  with seeded(40):
    model = tf.GPT2LMHeadModel(config).eval()
  return HFOutput(model, "logits").eval(), _ids(seq, HF_GPT2["vocab_size"], 41)


def gpt2_train(seq: int) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
  """`gpt2(seq)` and (seq,) int64 next-token labels (the input shifted by one)."""
  module, x = gpt2(seq)
  y = torch.cat([x[0, 1:], torch.randint(0, HF_GPT2["vocab_size"], (1,), generator=_gen(42))])
  return module, x, y


def bert(seq: int) -> tuple[torch.nn.Module, torch.Tensor]:
  """`BertModel(HF_BERT)`, eval, no dropout, last_hidden_state of a (1, seq) int64 input."""
  tf = _transformers()
  config = tf.BertConfig(**HF_BERT, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  with seeded(50):
    model = tf.BertModel(config, add_pooling_layer=False).eval()
  return HFOutput(model, "last_hidden_state").eval(), _ids(seq, HF_BERT["vocab_size"], 51)


@dataclasses.dataclass(frozen=True, eq=False, repr=False)  # compared and hashed by identity
class TorchFn:
  """A torch function of the call_torch workloads: ``apply(weights, x)``, written in torch ops.

  Calling it runs ``apply(self.weights, x)``: the weights (CPU torch tensors) are
  closed over, not arguments, as in a user's function. A system that needs its
  weights elsewhere (torchax: on its jax device) binds `apply` to its own copy;
  plain_jax writes the same math in JAX, by `name`.
  """

  name: str  # "small" or "mlp"
  apply: Callable[[dict, Any], Any]
  weights: dict[str, torch.Tensor]

  def __call__(self, x):
    return self.apply(self.weights, x)

  def __repr__(self) -> str:
    # Short: torch.func.vmap names a callable without __name__ by its repr on every call
    # (torch/_functorch/vmap.py, _get_name); the dataclass repr would format the weight
    # tensors, ~3 ms per call here.
    return f"TorchFn({self.name!r})"


def _times_two_plus_one(weights: dict, x):
  return x * 2 + 1


def _tanh_mlp(w: dict, x):
  """Two layers, ``tanh(x @ w1 + b1) @ w2 + b2``: on a batch (n, 256) or one example (256,)."""
  return torch.tanh(x @ w["w1"] + w["b1"]) @ w["w2"] + w["b2"]


def call_torch_small() -> tuple[TorchFn, torch.Tensor]:
  """f(x) = x*2+1 (no weights) and a (16, 16) float32 input."""
  return TorchFn("small", _times_two_plus_one, {}), torch.randn(
    *CALL_TORCH_SMALL, generator=_gen(60)
  )


def call_torch_mlp() -> tuple[TorchFn, torch.Tensor]:
  """The 256-256-256 tanh MLP (weights ~ N(0, 1/256), biases ~ N(0, 0.01)) and a (64, 256) batch."""
  g, n = _gen(61), CALL_TORCH_WIDTH
  weights = {
    "w1": torch.randn(n, n, generator=g) / n**0.5,
    "b1": torch.randn(n, generator=g) / 10,
    "w2": torch.randn(n, n, generator=g) / n**0.5,
    "b2": torch.randn(n, generator=g) / 10,
  }
  return TorchFn("mlp", _tanh_mlp, weights), torch.randn(CALL_TORCH_BATCH, n, generator=_gen(62))


@contextlib.contextmanager
def mha_fastpath(enabled: bool) -> Iterator[None]:
  """Allow or forbid torch's fused inference kernel for the attention layers, then restore."""
  before = torch.backends.mha.get_fastpath_enabled()
  torch.backends.mha.set_fastpath_enabled(enabled)
  try:
    yield
  finally:
    torch.backends.mha.set_fastpath_enabled(before)


def torch_sgd_reference(
  module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
) -> tuple[float, dict]:
  """One torch eager SGD step on a copy of `module`: (loss, updated state dict as numpy)."""
  m = copy.deepcopy(module)
  loss = torch.nn.functional.cross_entropy(m(x), y)
  loss.backward()
  with torch.no_grad():
    for p in m.parameters():
      p -= LR * p.grad
  return loss.item(), {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}


def jax_train_step(
  forward: Callable[[Any, Any], Any],
  params: Any,
  x: torch.Tensor,
  y: torch.Tensor,
  module: torch.nn.Module | None = None,
) -> tuple[Callable[[], Any], Callable[[Any], tuple[float, dict]]]:
  """A `train_step` capability built on a pure JAX `forward(params, x) -> logits`.

  The step is ``jax.jit(jax.value_and_grad(loss))`` followed by the SGD update,
  all in one jitted function; `params` (a dict by state-dict name) is carried
  from call to call. run() returns ``(loss, params)`` as JAX arrays. With `module`, only
  its parameters are differentiated and updated (its buffers, such as BatchNorm's running
  statistics, stay as they are, as in torch's SGD step); otherwise every entry is.
  """
  import jax
  import jax.numpy as jnp

  names = set(params) if module is None else {n for n, _ in module.named_parameters()}

  def loss_fn(train, rest, xs, ys):
    logp = jax.nn.log_softmax(forward({**rest, **train}, xs))
    return -jnp.mean(jnp.take_along_axis(logp, ys[:, None], axis=1))

  @jax.jit
  def step(p, xs, ys):
    train = {k: v for k, v in p.items() if k in names}
    rest = {k: v for k, v in p.items() if k not in names}
    loss, grads = jax.value_and_grad(loss_fn)(train, rest, xs, ys)
    return loss, {**rest, **jax.tree_util.tree_map(lambda w, g: w - LR * g, train, grads)}

  # (on JAX's default device: the GPU in the CUDA workloads' worker)
  xs, ys = jnp.asarray(x.cpu().numpy()), jnp.asarray(y.cpu().numpy().astype("int32"))
  state = {"params": params}

  def run():
    loss, state["params"] = step(state["params"], xs, ys)
    return loss, state["params"]

  def read(out):
    loss, p = out
    return float(loss), {k: jax.device_get(v) for k, v in p.items()}

  return run, read


def jax_sharded_train_step(
  forward: Callable[[Any, Any], Any],
  params: Any,
  x: torch.Tensor,
  y: torch.Tensor,
  batch_sharding: Any,
) -> tuple[Callable[[], Any], Callable[[Any], tuple], Any]:
  """A `sharded_train_step` capability built on a pure JAX `forward(params, x) -> logits`.

  `params` (a dict by state-dict name) come placed by the system (replicated over the
  mesh, or on one device); x and int32 labels y are placed with `batch_sharding`. The
  step is one ``jax.jit`` of ``jax.value_and_grad`` of the cross-entropy and an
  ``optax.sgd(LR)`` update; JAX's SPMD partitioner derives the data-parallel program
  (per-device forward and backward on its rows, gradients all-reduced) from the
  argument shardings. Parameters and optimizer state are carried from call to call.
  Returns (run, read, compiled): run() -> (loss, params, opt_state) as JAX arrays;
  read(out) -> (loss, {name: ndarray}, {name: sharding}); compiled is the step lowered
  and compiled for these arguments (for its `memory_analysis()`).
  """
  import jax
  import optax

  opt = optax.sgd(LR)

  def loss_fn(p, xs, ys):
    return optax.softmax_cross_entropy_with_integer_labels(forward(p, xs), ys).mean()

  @jax.jit
  def step(p, s, xs, ys):
    loss, grads = jax.value_and_grad(loss_fn)(p, xs, ys)
    updates, s = opt.update(grads, s, p)
    return loss, optax.apply_updates(p, updates), s

  xs = jax.device_put(x.numpy(), batch_sharding)
  ys = jax.device_put(y.numpy().astype("int32"), batch_sharding)
  state = {"params": params, "opt": opt.init(params)}
  compiled = step.lower(state["params"], state["opt"], xs, ys).compile()

  def run():
    loss, state["params"], state["opt"] = step(state["params"], state["opt"], xs, ys)
    return loss, state["params"], state["opt"]

  def read(out):
    loss, p, _ = out
    return (
      float(loss),
      {k: jax.device_get(v) for k, v in p.items()},
      {k: v.sharding for k, v in p.items()},
    )

  return run, read, compiled
