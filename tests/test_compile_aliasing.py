"""`bridge.compile` where tensors share memory: arguments and module state that alias one
another and are written in place, outputs that are (views of) inputs or of one another,
arguments written under autograd or given new shapes in place; checked against eager torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bridge


class _BufferWriter(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.register_buffer("b", torch.zeros(3))

  def forward(self, x):
    self.b.add_(1)
    return x * 2


class _ArgWriter(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.w = torch.nn.Parameter(torch.full((3,), 2.0))

  def forward(self, x):
    x.add_(1)
    return x * self.w


class _SharedBuffers(torch.nn.Module):
  def __init__(self):
    super().__init__()
    base = torch.zeros(6)
    self.register_buffer("p", base[:3])
    self.register_buffer("q", base[2:5])

  def forward(self, x):
    self.p.add_(1)
    return x + self.q


class _Shadow(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.w = torch.nn.Parameter(torch.ones(3))
    self.register_buffer("shadow", self.w.detach())

  def forward(self, x):
    self.shadow.mul_(2)
    return x * self.w


def _run(make, call, calls=2):
  """(eager results, compiled results, eager module, compiled module) of `call(module)`
  repeated `calls` times on two fresh modules."""
  eager_m, comp_m = make(), make()
  compiled = bridge.compile(comp_m)
  with torch.no_grad():
    eager = [call(eager_m, eager_m) for _ in range(calls)]
    got = [call(comp_m, compiled) for _ in range(calls)]
  return eager, got, eager_m, comp_m


ALIASED = {
  "buffer_as_argument": (_BufferWriter, lambda m, f: f(m.b).clone()),
  "buffer_view_as_argument": (_BufferWriter, lambda m, f: f(m.b[1:]).clone()),
  "parameter_as_written_argument": (_ArgWriter, lambda m, f: f(m.w.detach()).clone()),
  "buffers_views_of_one_tensor": (_SharedBuffers, lambda m, f: f(torch.zeros(3)).clone()),
  "buffer_aliasing_a_parameter": (_Shadow, lambda m, f: f(torch.ones(3)).clone()),
}


@pytest.mark.parametrize("case", list(ALIASED))
def test_written_tensors_that_share_memory_are_eagers(case):
  # bridge.compile read each tensor as an independent input: a write through one was not
  # seen through the other (c(m.b) gave [0, 0, 0], eager [2, 2, 2])
  make, call = ALIASED[case]
  eager, got, eager_m, comp_m = _run(make, call)
  torch.testing.assert_close(got, eager)
  for (name, a), (_, b) in zip(eager_m.state_dict().items(), comp_m.state_dict().items()):
    torch.testing.assert_close(b, a, msg=name)


def test_arguments_over_one_memory_through_two_storages():
  # two torch.from_numpy of one array: two storages over the same memory. Starting at the
  # same address they are views of one memory (eager's values); otherwise refused
  def f(a, b):
    a.add_(1)
    return b * 2

  array = np.zeros(3, dtype=np.float32)
  a, b = torch.from_numpy(array), torch.from_numpy(array)
  torch.testing.assert_close(bridge.compile(f)(a, b), torch.full((3,), 2.0))
  torch.testing.assert_close(a, torch.ones(3))
  array = np.zeros(4, dtype=np.float32)
  a, b = torch.from_numpy(array[1:]), torch.from_numpy(array)
  with pytest.raises(
    bridge.BridgeError,
    match=r"writes in place into tensor argument 0, which shares memory with tensor argument 1"
    r".*different storages over the same memory",
  ):
    bridge.compile(f)(a, b)
  assert not array.any()  # nothing written


def test_views_of_one_argument_written_are_eagers():
  def f(a, b):
    a.add_(1)
    return b * 2

  base, ref = torch.zeros(2, 3), torch.zeros(2, 3)
  got = bridge.compile(f)(base, base[0])
  torch.testing.assert_close(got, f(ref, ref[0]))
  torch.testing.assert_close(base, ref)


def test_read_only_sharing_keeps_the_shortcut():
  # a flat buffer's views read as parameters: no alias variant, the recorded shortcut stays
  class Flat(torch.nn.Module):
    def __init__(self):
      super().__init__()
      flat = torch.arange(6.0)
      self.a = torch.nn.Parameter(flat[:3])
      self.b = torch.nn.Parameter(flat[3:])

    def forward(self, x):
      return x * self.a + self.b

  m = Flat()
  c = bridge.compile(m)
  with torch.no_grad():
    for _ in range(3):
      torch.testing.assert_close(c(torch.ones(3)), m(torch.ones(3)))
  assert c._fast is not None


def test_a_written_argument_keeps_its_autograd_history():
  class M(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.w = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))

    def forward(self, x):
      x.mul_(self.w)
      return x.sum()

  grads = []
  for compiled in (False, True):
    m = M()
    f = bridge.compile(m) if compiled else m
    x = torch.ones(3)
    out = f(x)
    assert x.requires_grad and x.grad_fn is not None
    (out + (x * x).sum()).backward()
    grads.append(m.w.grad)
  torch.testing.assert_close(grads[1], grads[0])


def test_a_written_non_leaf_that_requires_grad_is_eagers():
  def f(x, w):
    w.add_(1)
    return x * w

  grads = []
  for fn in (f, bridge.compile(f)):
    leaf = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    w = leaf * 2
    out = fn(torch.ones(3), w)
    (out.sum() + (w * w).sum()).backward()
    grads.append((out.detach(), w.detach(), leaf.grad))
  torch.testing.assert_close(grads[1], grads[0])


OUTPUTS = {
  "identity": lambda x: x,
  "view": lambda x: x.view(12),
  "select": lambda x: x[0],
  "tuple": lambda x: (x, x * 2),
  "views_of_one_another": lambda x: (lambda y: (y, y.view(12)))(x * 2),
}


@pytest.mark.parametrize("case", list(OUTPUTS))
def test_outputs_alias_as_in_eager(case):
  fn = OUTPUTS[case]
  results = []
  for f in (fn, bridge.compile(fn)):
    x = torch.arange(12.0).reshape(3, 4)
    with torch.no_grad():
      out = f(x)
      first = out[0] if isinstance(out, tuple) else out
      first.add_(100)
    results.append((x, out))
  torch.testing.assert_close(results[1], results[0])
  (_, out), (_, eout) = results[1], results[0]
  for got, want in zip(
    out if isinstance(out, tuple) else [out], eout if isinstance(eout, tuple) else [eout]
  ):
    assert got.stride() == want.stride()


def test_a_module_returning_its_own_state():
  class M(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.w = torch.nn.Parameter(torch.ones(2))
      self.register_buffer("cnt", torch.zeros(()))

    def forward(self, x):
      self.cnt.add_(1)
      return x * self.w, self.cnt, self.w

  m = M()
  c = bridge.compile(m)
  with torch.no_grad():
    _, cnt, w = c(torch.ones(2))
  assert w is m.w
  cnt.add_(10)
  assert float(m.cnt) == 11.0


SHAPE_CHANGES = {
  "unsqueeze_": (lambda x: x.unsqueeze_(0), (2, 2)),
  "t_": (lambda x: x.t_(), (2, 3)),
  "squeeze_": (lambda x: x.squeeze_(), (1, 4)),
  "swapdims_": (lambda x: x.swapdims_(0, 1), (2, 3)),
  "as_strided_": (lambda x: x.as_strided_((2,), (2,), 1), (4,)),
}


@pytest.mark.parametrize("case", list(SHAPE_CHANGES))
def test_shape_changes_of_an_argument_are_applied(case):
  # the argument kept its shape: unsqueeze_(0) of a (4,) tensor left it (4,), eager (1, 4)
  op, shape = SHAPE_CHANGES[case]

  def g(x):
    op(x)
    return x + 0

  results = []
  for f in (g, bridge.compile(g)):
    a = torch.arange(float(np.prod(shape))).reshape(shape)
    out = f(a)
    results.append((out, a.shape, a.stride(), a.storage_offset()))
  torch.testing.assert_close(results[1][0], results[0][0])
  assert results[1][1:] == results[0][1:]


def test_a_resize_of_an_argument_raises():
  def g(x):
    x.resize_(8)
    return x + 0

  with pytest.raises(bridge.BridgeError, match="resizes its tensor argument 0"):
    bridge.compile(g)(torch.arange(4.0))


@pytest.mark.parametrize("device", ["cpu", "jax"])
def test_the_shortcut_gives_way_to_an_argument_sharing_a_written_buffer(device):
  # calls with independent arguments record the shortcut; one with the buffer itself is eager's
  m, ref = _BufferWriter().to(device), _BufferWriter()
  compiled = bridge.compile(m)
  with torch.no_grad():
    for _ in range(3):
      compiled(torch.ones(3, device=device))
      ref(torch.ones(3))
    assert compiled._fast is not None
    got = compiled(m.b)
    torch.testing.assert_close(got.cpu(), ref(ref.b))
  torch.testing.assert_close(m.b.cpu(), ref.b)
