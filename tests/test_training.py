"""A plain torch training loop on the `jax` device gives the CPU run's losses and weights."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import bridge  # noqa: F401 - registers the jax device


def _mlp() -> torch.nn.Module:
  return torch.nn.Sequential(
    torch.nn.Linear(8, 32),
    torch.nn.ReLU(),
    torch.nn.Linear(32, 32),
    torch.nn.GELU(),
    torch.nn.Linear(32, 3),
  )


def _cnn() -> torch.nn.Module:
  return torch.nn.Sequential(
    # no bias before BatchNorm: its true gradient is 0, and Adam would amplify float noise
    torch.nn.Conv2d(1, 4, 3, padding=1, bias=False),
    torch.nn.BatchNorm2d(4),
    torch.nn.ReLU(),
    torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(4, 8, 3, groups=2, padding=1),
    torch.nn.GroupNorm(2, 8),
    torch.nn.SiLU(),
    torch.nn.AdaptiveAvgPool2d(1),
    torch.nn.Flatten(),
    torch.nn.Linear(8, 3),
  )


class _Block(torch.nn.Module):
  """A small transformer block: embedding, attention (sdpa), layer norm, MLP."""

  def __init__(self) -> None:
    super().__init__()
    self.emb = torch.nn.Embedding(11, 16)
    # no bias: the key bias has a true gradient of 0 (softmax ignores a constant shift of
    # the scores), which Adam would amplify from float noise into full-size steps
    self.qkv = torch.nn.Linear(16, 48, bias=False)
    self.norm1, self.norm2 = torch.nn.LayerNorm(16), torch.nn.LayerNorm(16)
    self.mlp = torch.nn.Sequential(
      torch.nn.Linear(16, 32), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(32, 16)
    )
    self.head = torch.nn.Linear(16, 11)

  def forward(self, tokens: torch.Tensor) -> torch.Tensor:
    h = self.emb(tokens)
    q, k, v = self.qkv(self.norm1(h)).view(*tokens.shape, 3, 2, 8).permute(2, 0, 3, 1, 4)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    h = h + a.transpose(1, 2).reshape(*tokens.shape, 16)
    h = h + self.mlp(self.norm2(h))
    return self.head(h)


def _data(kind: str, device: str):
  g = torch.Generator().manual_seed(1)
  if kind == "mlp":
    x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
  elif kind == "cnn":
    x, y = torch.randn(4, 1, 8, 8, generator=g), torch.randint(0, 3, (4,), generator=g)
  else:
    x = torch.randint(0, 11, (2, 6), generator=g)
    y = torch.randint(0, 11, (2, 6), generator=g)
  return x.to(device), y.to(device)


MODELS = {"mlp": _mlp, "cnn": _cnn, "transformer": _Block}
OPTIMIZERS = {
  "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
  "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
  "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
}


def _train(model: torch.nn.Module, opt_name: str, kind: str, device: str, steps: int):
  model = model.to(device)
  opt = OPTIMIZERS[opt_name](model.parameters())
  x, y = _data(kind, device)
  losses = []
  for _ in range(steps):
    opt.zero_grad()
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    opt.step()
    losses.append(loss.item())
  return losses, model


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_training_matches_cpu(kind, opt_name):
  torch.manual_seed(0)
  model = MODELS[kind]()
  jax_model = copy.deepcopy(model)
  steps = 5
  cpu_losses, cpu_model = _train(model, opt_name, kind, "cpu", steps)
  jax_losses, jax_model = _train(jax_model, opt_name, kind, "jax", steps)
  torch.testing.assert_close(jax_losses, cpu_losses, rtol=1e-4, atol=1e-5)
  assert jax_losses[-1] < jax_losses[0]
  for (name, p_cpu), (_, p_jax) in zip(cpu_model.named_parameters(), jax_model.named_parameters()):
    assert isinstance(p_jax, torch.nn.Parameter) and p_jax.device.type == "jax", name
    torch.testing.assert_close(
      p_jax.detach().cpu(), p_cpu.detach(), rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}"
    )
  for (name, b_cpu), (_, b_jax) in zip(cpu_model.named_buffers(), jax_model.named_buffers()):
    torch.testing.assert_close(b_jax.cpu(), b_cpu, rtol=1e-4, atol=1e-5)


def test_gradients_equal_cpu_for_every_parameter():
  torch.manual_seed(0)
  model = _Block()
  jax_model = copy.deepcopy(model).to("jax")
  x, y = _data("transformer", "cpu")
  for m, xx, yy in ((model, x, y), (jax_model, x.to("jax"), y.to("jax"))):
    F.cross_entropy(m(xx).reshape(-1, 11), yy.reshape(-1)).backward()
  for (name, p), (_, q) in zip(model.named_parameters(), jax_model.named_parameters()):
    torch.testing.assert_close(
      q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}"
    )
