"""`bridge.compile` notices when its module changes in what a trace read, and traces again.

One table: each row changes a compiled module after it has been called (so the call is
recorded on a shortcut) and checks that the next compiled calls give what the module now
computes eagerly, through the shortcut and the general path, on the CPU and the `jax` device.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.modules.module as module_lib
import torch.nn.utils.parametrize as parametrize
from torch import nn
from torch.utils.hooks import RemovableHandle

import bridge


class Scaled(nn.Module):
  """Reads a plain Python attribute."""

  def __init__(self):
    super().__init__()
    self.scale = 2.0

  def forward(self, x):
    return x * self.scale


class Gated(nn.Module):
  """Takes an optional submodule and an optional parameter."""

  def __init__(self):
    super().__init__()
    self.extra = None
    self.shift = nn.Parameter(torch.full((8,), 0.25))

  def forward(self, x):
    if self.extra is not None:
      x = self.extra(x)
    return x if self.shift is None else x + self.shift


class Counting(nn.Module):
  """Its forward bumps a counter: not a change of the module between calls."""

  def __init__(self):
    super().__init__()
    self.calls = 0

  def forward(self, x):
    self.calls += 1
    return x


class Upper(nn.Module):
  def forward(self, w):
    return w.triu()


def _net():
  torch.manual_seed(0)
  # (changes are made after the LayerNorm, which would hide a scaling before it)
  return nn.Sequential(
    nn.Linear(8, 8),
    nn.ReLU(),
    nn.LayerNorm(8),
    Scaled(),
    nn.Dropout(0.0),
    Gated(),
    Counting(),
    nn.Linear(8, 4),
  ).eval()


def _double(module, args, out):
  return out * 2


def _triple(module, args, out):
  return out * 3


def _hook(net, device):
  net[3].register_forward_hook(_double)


def _remove_hook(net, device):  # registered before compiling (`setup`)
  net.handle.remove()


def _replace_hook(net, device):  # as many hooks as before: only which one changed
  net.handle.remove()
  net[3].register_forward_hook(_triple)


def _global_hook(net, device):
  return module_lib.register_module_forward_hook(
    lambda m, args, out: out + 1 if isinstance(m, nn.LayerNorm) else None
  )


def _global_pre_hook(net, device):
  return module_lib.register_module_forward_pre_hook(
    lambda m, args: (args[0] + 1,) if isinstance(m, Scaled) else None
  )


def _dropout_p(net, device):
  net.train()
  net[4].p = 1.0  # everything dropped: zeros, whatever the random mask


def _parameter_shape(net, device):
  net[7].weight = nn.Parameter(torch.randn(2, 8, device=device))
  net[7].bias = nn.Parameter(torch.randn(2, device=device))


def _parametrization(net, device):
  parametrize.register_parametrization(net[0], "weight", Upper())


def _setup_hook(net):
  net.handle = net[3].register_forward_hook(_double)


def _setup_train(net):
  net.train()  # (dropout p=0: the same numbers as eval)


# (id, changes the module after its first calls [may return a hook's handle], setup)
CASES = [
  ("submodule replaced", lambda n, d: n.__setitem__(1, nn.Tanh()), None),
  ("submodule added", lambda n, d: n.append(nn.Tanh()), None),
  ("submodule removed", lambda n, d: n.__delitem__(1), None),
  ("optional submodule set", lambda n, d: setattr(n[5], "extra", nn.Sigmoid()), None),
  ("parameter set to None", lambda n, d: setattr(n[5], "shift", None), None),
  ("plain attribute", lambda n, d: setattr(n[3], "scale", 3.0), None),
  ("layer norm eps", lambda n, d: setattr(n[2], "eps", 10.0), None),
  ("dropout p", _dropout_p, _setup_train),
  ("forward hook", _hook, None),
  (
    "forward pre-hook",
    lambda n, d: n[7].register_forward_pre_hook(lambda m, args: (args[0] + 1,)),
    None,
  ),
  (
    "forward hook with kwargs",
    lambda n, d: n[2].register_forward_hook(lambda m, args, kwargs, out: -out, with_kwargs=True),
    None,
  ),
  ("forward hook removed", _remove_hook, _setup_hook),
  ("forward hook replaced", _replace_hook, _setup_hook),
  ("global forward hook", _global_hook, None),
  ("global forward pre-hook", _global_pre_hook, None),
  ("parametrization", _parametrization, None),
  ("eval to train", lambda n, d: n.train(), None),
  (
    "parameter replaced",
    lambda n, d: setattr(n[0], "weight", nn.Parameter(torch.randn(8, 8, device=d))),
    None,
  ),
  ("parameter of another shape", _parameter_shape, None),
]


@pytest.mark.parametrize("device", ["cpu", "jax"])
@pytest.mark.parametrize("change,setup", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_changed_module_is_traced_again(change, setup, device):
  net = _net()
  if setup is not None:
    setup(net)
  net.to(device)
  compiled = bridge.compile(net)
  x = torch.randn(5, 8, device=device)
  with torch.no_grad():
    for _ in range(2):  # the second call records the shortcut
      torch.testing.assert_close(compiled(x).cpu(), net(x).cpu())
    assert compiled._fast is not None
    handle = change(net, device)
  try:
    with torch.no_grad():
      want = net(x).cpu()
      for _ in range(2):  # the general path, then the shortcut it records
        torch.testing.assert_close(compiled(x).cpu(), want)
    # with grad: the call torch autograd records
    xg = x.detach().clone().requires_grad_(True)
    out = compiled(xg)
    torch.testing.assert_close(out.detach().cpu(), want)
    out.sum().backward()
    xe = x.detach().clone().requires_grad_(True)
    net(xe).sum().backward()
    torch.testing.assert_close(xg.grad.cpu(), xe.grad.cpu())
  finally:
    if isinstance(handle, RemovableHandle):
      handle.remove()


def test_a_counter_the_forward_bumps_is_not_a_change():
  """Attributes the traced forward wrote itself are not guarded: eager calls in between do not
  make the compiled module trace again."""
  net = _net()
  compiled = bridge.compile(net)
  x = torch.randn(5, 8)
  with torch.no_grad():
    compiled(x)
    assert net[6].calls == 1
    for _ in range(3):
      net(x)
      compiled(x)
    assert net[6].calls == 4  # one trace, three eager calls


@pytest.mark.parametrize(
  "register",
  [
    lambda n: n[7].register_full_backward_hook(lambda m, gi, go: (gi[0] * 3,)),
    lambda n: n[7].register_full_backward_pre_hook(lambda m, go: (go[0] * 3,)),
    lambda n: module_lib.register_module_full_backward_hook(lambda m, gi, go: None),
  ],
  ids=["backward hook", "backward pre-hook", "global backward hook"],
)
def test_backward_hooks_are_refused_where_they_would_be_skipped(register):
  """The compiled backward is JAX's VJP of the traced forward, which cannot run torch's module
  backward hooks: a call that autograd records says so instead of skipping them."""
  net = _net()
  compiled = bridge.compile(net)
  x = torch.randn(5, 8, requires_grad=True)
  compiled(x).sum().backward()
  handle = register(net)
  try:
    with pytest.raises(bridge.BridgeError, match="backward hook"):
      compiled(x)
    with torch.no_grad():  # no backward: the hook is not needed
      torch.testing.assert_close(compiled(x), net(x))
  finally:
    handle.remove()
  compiled(x).sum().backward()
