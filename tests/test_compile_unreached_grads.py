"""`bridge.compile`: a parameter (or argument) that torch autograd's graph would not reach gets
no gradient (`.grad` stays None), as in eager torch, not a gradient of zeros.

An input is unreached when its cotangent in JAX's VJP does not depend on the output gradients:
unused, used through `.detach()` or under `torch.no_grad()`, or only through integer-valued
ops (argmax). Optimizers skip a parameter whose `.grad` is None: with zeros, AdamW's weight
decay would still shrink it. `call_jax` keeps `jax.grad`'s convention (zeros).
"""

from __future__ import annotations

import copy

import jax.numpy as jnp
import torch

import bridge


class _Unused(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.a = torch.nn.Linear(2, 2)
    self.unused = torch.nn.Linear(2, 2)

  def forward(self, x):
    return self.a(x)


class _Detached(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.a = torch.nn.Linear(2, 2)
    self.scale = torch.nn.Parameter(torch.tensor([1.5, -0.5]))

  def forward(self, x):
    return self.a(x) * self.scale.detach()


class _NoGrad(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.a = torch.nn.Linear(2, 2)
    self.b = torch.nn.Linear(2, 2)

  def forward(self, x):
    with torch.no_grad():
      shift = self.b(x)
    return self.a(x) + shift


class _Argmax(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.a = torch.nn.Linear(2, 2)
    self.pick = torch.nn.Parameter(torch.tensor([0.1, 0.9]))

  def forward(self, x):
    i = self.pick.argmax()
    return self.a(x).index_select(1, i.reshape(1)) * (i + 1)


def _grads(module: torch.nn.Module, *args: torch.Tensor) -> dict:
  for p in module.parameters():
    p.grad = None
  module(*args).pow(2).sum().backward()
  return {name: p.grad for name, p in module.named_parameters()}


def _check_like_eager(module: torch.nn.Module, unreached: set[str]) -> None:
  torch.manual_seed(0)
  x = torch.randn(3, 2)
  eager = _grads(module, x)
  compiled_module = copy.deepcopy(module)
  compiled = _grads_of_compiled(compiled_module, x)
  assert {name for name, g in eager.items() if g is None} == unreached
  for name, g in eager.items():
    if g is None:
      assert compiled[name] is None, (
        f"{name}: eager torch gives no gradient, compiled {compiled[name]}"
      )
    else:
      torch.testing.assert_close(compiled[name], g)


def _grads_of_compiled(module: torch.nn.Module, x: torch.Tensor) -> dict:
  c = bridge.compile(module)
  for p in module.parameters():
    p.grad = None
  c(x).pow(2).sum().backward()
  return {name: p.grad for name, p in module.named_parameters()}


def test_unused_submodule_gets_no_gradient():
  _check_like_eager(_Unused(), {"unused.weight", "unused.bias"})


def test_parameter_used_through_detach_gets_no_gradient():
  _check_like_eager(_Detached(), {"scale"})


def test_parameter_used_under_no_grad_gets_no_gradient():
  _check_like_eager(_NoGrad(), {"b.weight", "b.bias"})


def test_parameter_used_only_through_argmax_gets_no_gradient():
  _check_like_eager(_Argmax(), {"pick"})


def test_unused_argument_that_requires_grad_gets_no_gradient():
  m = _Unused()
  c = bridge.compile(lambda x, y: m(x))
  x = torch.randn(3, 2, requires_grad=True)
  y = torch.randn(3, 2, requires_grad=True)
  c(x, y).sum().backward()
  assert y.grad is None
  assert x.grad is not None and m.unused.weight.grad is None


def test_adamw_leaves_an_unused_parameter_as_eager_torch_does():
  torch.manual_seed(0)
  eager = _Unused()
  mine = copy.deepcopy(eager)
  before = copy.deepcopy(eager.unused.state_dict())
  c = bridge.compile(mine)
  opt_eager = torch.optim.AdamW(eager.parameters(), lr=0.1, weight_decay=0.5)
  opt_mine = torch.optim.AdamW(mine.parameters(), lr=0.1, weight_decay=0.5)
  for _ in range(5):
    x = torch.randn(4, 2)
    for module, opt in ((eager, opt_eager), (mine, opt_mine)):
      opt.zero_grad()
      (c if module is mine else eager)(x).pow(2).mean().backward()
      opt.step()
  for name, value in before.items():
    assert torch.equal(eager.unused.state_dict()[name], value)  # (eager: untouched)
    assert torch.equal(mine.unused.state_dict()[name], value), name
  for (name, p), q in zip(eager.named_parameters(), mine.parameters()):
    torch.testing.assert_close(q, p, msg=name)


def test_create_graph_gradient_penalty_and_no_gradient_for_the_unused():
  torch.manual_seed(0)
  eager = _Unused()
  mine = copy.deepcopy(eager)
  c = bridge.compile(mine)
  x = torch.randn(3, 2)
  results = []
  for module, f in ((eager, eager), (mine, c)):
    params = list(module.parameters())
    loss = f(x).pow(2).sum()
    grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
    assert [g is None for g in grads] == [False, False, True, True]
    penalty = sum(g.pow(2).sum() for g in grads if g is not None)
    second = torch.autograd.grad(penalty, params, allow_unused=True)
    results.append((grads, second))
  (g_eager, s_eager), (g_mine, s_mine) = results
  for a, b in zip(g_eager, g_mine):
    if a is not None:
      torch.testing.assert_close(b, a)
  assert [s is None for s in s_mine] == [s is None for s in s_eager]
  for a, b in zip(s_eager, s_mine):
    if a is not None:
      torch.testing.assert_close(b, a)


def test_call_jax_keeps_zeros_for_an_unused_input():
  x = torch.randn(3, requires_grad=True)
  y = torch.randn(3, requires_grad=True)
  bridge.call_jax(lambda a, b: jnp.sin(a), x, y).sum().backward()
  torch.testing.assert_close(x.grad, torch.cos(x.detach()))
  assert y.grad is not None and torch.equal(y.grad, torch.zeros(3))
