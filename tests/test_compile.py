"""`bridge.compile`: a module's forward as one cached `jax.jit` program, checked against torch."""

from __future__ import annotations

import contextlib
import copy
import math

import pytest
import torch
import torch.nn.functional as F

import bridge


class Block(torch.nn.Module):
  """A small transformer-ish block: attention, LayerNorm, GELU MLP."""

  def __init__(self, d=16, heads=2):
    super().__init__()
    self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
    self.norm1 = torch.nn.LayerNorm(d)
    self.norm2 = torch.nn.LayerNorm(d)
    self.mlp = torch.nn.Sequential(
      torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d)
    )

  def forward(self, x):
    h = self.norm1(x)
    x = x + self.attn(h, h, h, need_weights=False)[0]
    return x + self.mlp(self.norm2(x))


def _models():
  return {
    "linear": (lambda: torch.nn.Linear(16, 16), (4, 16)),
    "mlp": (
      lambda: torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3)),
      (5, 8),
    ),
    "cnn": (
      lambda: torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 4 * 4, 2),
      ),
      (2, 3, 8, 8),
    ),
    "block": (Block, (2, 5, 16)),
  }


@pytest.mark.parametrize("name", sorted(_models()))
@pytest.mark.parametrize("device", ["cpu", "jax"])
def test_forward_and_gradients_match_torch(name, device):
  make, shape = _models()[name]
  torch.manual_seed(0)
  model = make().eval()
  ref = copy.deepcopy(model)
  x = torch.randn(shape)
  compiled = bridge.compile(model.to(device))
  out = compiled(x.to(device))
  assert out.device.type == device
  expected = ref(x)
  torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)
  # Trainable with torch autograd: backward is the compiled JAX VJP.
  out.pow(2).sum().backward()
  expected.pow(2).sum().backward()
  for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
    torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5, msg=n)


def test_a_function_without_tensor_arguments():
  """No tensor in or kept: the outputs come back on the CPU (it used to fail reading the device
  of no tensor; torch.compile's graph for `x.repeat_interleave(torch.tensor([...]))` is one)."""
  made = bridge.compile(lambda: torch.arange(4.0) * 2)
  for _ in range(2):  # (the second call takes the recorded shortcut)
    out = made()
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, torch.arange(4.0) * 2)
  f = lambda a: a.repeat_interleave(torch.tensor([1, 2, 0, 1]), dim=0)
  x = torch.randn(4, 6)
  torch.testing.assert_close(torch.compile(f, backend="jax")(x), f(x))


def test_input_gradients():
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Softplus())
  x = torch.randn(3, 4, requires_grad=True)
  x2 = x.detach().clone().requires_grad_()
  bridge.compile(model)(x).sum().backward()
  model(x2).sum().backward()
  torch.testing.assert_close(x.grad, x2.grad)


@pytest.mark.parametrize(
  "kwargs", [{"padding_idx": 0}, {"padding_idx": 3, "scale_grad_by_freq": True}]
)
def test_embedding_backward_keeps_torchs_gradient_rules(kwargs):
  """The compiled backward (JAX's VJP) leaves the padding row alone and scales by frequency as
  torch does; a plain gather's VJP would give the padding row a gradient."""
  torch.manual_seed(0)
  model = torch.nn.Embedding(10, 4, **kwargs)
  ref = copy.deepcopy(model)
  idx = torch.tensor([[0, 3, 9, 3], [3, 3, 0, 1]])
  weights = torch.randn(2, 4, 4)
  (bridge.compile(model)(idx) * weights).sum().backward()
  (ref(idx) * weights).sum().backward()
  torch.testing.assert_close(model.weight.grad, ref.weight.grad)
  assert not model.weight.grad[kwargs["padding_idx"]].any()


def test_backward_through_unrecorded_updates_matches_torch():
  """`F.embedding(max_norm=...)` renormalizes its weight in place through `weight.detach()`
  (torch records nothing; the weight keeps its own gradient), and spectral norm's power
  iteration runs under `torch.no_grad()`: the compiled backward agrees with torch."""
  torch.manual_seed(0)
  emb = torch.nn.Embedding(10, 4, max_norm=1.0)
  torch.nn.init.normal_(emb.weight, std=3.0)
  sn = torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(5, 4))
  for model, x in ((emb, torch.tensor([[1, 2, 2, 5]])), (sn, torch.randn(3, 5))):
    ref = copy.deepcopy(model)
    out = bridge.compile(model)(x)
    expected = ref(x)
    torch.testing.assert_close(out, expected)
    weights = torch.linspace(-1.0, 2.0, out.numel()).reshape(out.shape)
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
      assert p.grad is not None and p.grad.abs().sum() > 0, name
      torch.testing.assert_close(p.grad, q.grad, msg=name)
    # the renormalized weight and the power iteration's vectors, updated as torch updates them
    for (name, b), (_, c) in zip(
      [*model.named_parameters(), *model.named_buffers()],
      [*ref.named_parameters(), *ref.named_buffers()],
    ):
      torch.testing.assert_close(b.detach(), c.detach(), msg=name)


def test_torch_optimizer_trains_the_compiled_module():
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
  ref = copy.deepcopy(model)
  compiled = bridge.compile(model)
  x, y = torch.randn(32, 4), torch.randn(32, 1)
  opt = torch.optim.Adam(model.parameters(), lr=1e-2)
  ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
  losses, ref_losses = [], []
  for _ in range(20):
    for m, o, out in ((compiled, opt, losses), (ref, ref_opt, ref_losses)):
      o.zero_grad()
      loss = F.mse_loss(m(x), y)
      loss.backward()
      o.step()
      out.append(loss.item())
  assert losses[-1] < 0.7 * losses[0]
  torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-6)


def test_batchnorm_running_stats_are_written_back():
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.BatchNorm1d(6))
  ref = copy.deepcopy(model)
  compiled = bridge.compile(model)
  for _ in range(3):
    x = torch.randn(8, 6)
    torch.testing.assert_close(compiled(x), ref(x), rtol=1e-5, atol=1e-5)
  bn, ref_bn = model[1], ref[1]
  torch.testing.assert_close(bn.running_mean, ref_bn.running_mean)
  torch.testing.assert_close(bn.running_var, ref_bn.running_var)
  assert int(bn.num_batches_tracked) == 3 and bn.num_batches_tracked.dtype == torch.int64
  model.eval(), ref.eval()  # eval switches programs: running statistics are used
  x = torch.randn(8, 6)
  torch.testing.assert_close(compiled(x), ref(x), rtol=1e-5, atol=1e-5)


def _writes_its_arguments(x, stats, out):
  stats.mul_(0.9).add_(x.mean(0) * 0.1)  # running statistics passed as an argument
  out[:, 1:].copy_(x[:, :-1])  # through a view of the argument
  return x * 2


@pytest.mark.parametrize("device", ["cpu", "jax"])
def test_arguments_written_in_place_are_written_back(device):
  # as in eager torch, an in-place write into an argument is seen by the caller: on the first
  # call (traced), on later ones (the same program), and under torch.no_grad()
  compiled = bridge.compile(_writes_its_arguments)
  stats, out = torch.zeros(4, device=device), torch.zeros(3, 4, device=device)
  ref_stats, ref_out = torch.zeros(4), torch.zeros(3, 4)
  for i in range(3):
    x = torch.randn(3, 4)
    with torch.no_grad() if i == 2 else contextlib.nullcontext():
      got = compiled(x.to(device), stats, out)
    want = _writes_its_arguments(x, ref_stats, ref_out)
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(stats.cpu(), ref_stats)
    torch.testing.assert_close(out.cpu(), ref_out)
  assert stats.device.type == device and stats.dtype == torch.float32
  # a function that only reads its arguments leaves them alone and keeps its shortcut
  reads = bridge.compile(lambda x, s: x * s)
  s = torch.ones(4, device=device)
  for _ in range(2):
    reads(torch.ones(3, 4, device=device), s)
  assert reads._fast is not None and s._version == 0


@pytest.mark.parametrize("empty", [(), [], {}])
def test_a_forward_that_returns_nothing_but_writes(empty):
  # (an optimizer step: no outputs, only in-place writes)
  def step(x, total):
    total.add_(x.sum())
    return empty

  compiled = bridge.compile(step)
  total = torch.zeros(())
  for _ in range(2):
    assert compiled(torch.ones(3), total) == empty
  assert float(total) == 6.0


def test_a_write_into_an_argument_that_shares_memory_with_another_is_seen_through_it():
  def f(a, b):
    a.add_(1)
    return b * 2

  compiled = bridge.compile(f)
  base, ref = torch.zeros(2, 3), torch.zeros(2, 3)
  # as eager torch: the program reads `b` after the write through `a`
  torch.testing.assert_close(compiled(base, base[0]), f(ref, ref[0]))
  torch.testing.assert_close(base, ref)
  a, b = torch.zeros(2, 3), torch.ones(3)
  torch.testing.assert_close(compiled(a, b), b * 2)  # independent tensors: fine
  torch.testing.assert_close(a, torch.ones(2, 3))
  # a function that only reads may take the same tensor twice
  torch.testing.assert_close(bridge.compile(lambda a, b: a + b)(base, base), base * 2)


def test_in_place_write_into_an_argument_that_requires_grad():
  compiled = bridge.compile(lambda x, w: (w.add_(1), x * w)[1])
  x = torch.randn(2, 3)
  leaf = torch.zeros(3, requires_grad=True)
  with pytest.raises(RuntimeError) as info:
    leaf.add_(1)
  with pytest.raises(RuntimeError, match=str(info.value).replace(".", r"\.")):
    compiled(x, leaf)
  # a non-leaf that requires grad: written with a copy torch records, as eager's add_
  w0 = torch.zeros(3, requires_grad=True)
  w_nonleaf, w_eager = w0 * 1, w0.detach().clone().requires_grad_() * 1
  out = compiled(x, w_nonleaf)
  eager = (lambda x, w: (w.add_(1), x * w)[1])(x, w_eager)
  torch.testing.assert_close(out, eager)
  torch.testing.assert_close(w_nonleaf, w_eager)
  (out.sum() + w_nonleaf.sum()).backward()
  torch.testing.assert_close(w0.grad, x.sum(0) + 1)
  w = torch.zeros(3)
  compiled(x, w)  # no grad asked: written back
  torch.testing.assert_close(w, torch.ones(3))
  # a gradient through the call, the written argument needing none: written back, and the
  # gradient is eager's
  xg = x.clone().requires_grad_()
  out = compiled(xg, w)
  out.sum().backward()
  torch.testing.assert_close(w, torch.full((3,), 2.0))
  torch.testing.assert_close(out, x * 2)
  torch.testing.assert_close(xg.grad, torch.full((2, 3), 2.0))


def test_batchnorm_on_jax_device():
  torch.manual_seed(0)
  model = torch.nn.BatchNorm1d(4)
  ref = copy.deepcopy(model)
  compiled = bridge.compile(model.to("jax"))
  x = torch.randn(5, 4)
  compiled(x.to("jax"))
  ref(x)
  torch.testing.assert_close(model.running_var.cpu(), ref.running_var)


def test_dropout_draws_fresh_and_reproducible_randomness():
  model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Dropout(0.5))
  compiled = bridge.compile(model)
  x = torch.ones(4, 32)
  torch.manual_seed(1)
  a, b = compiled(x), compiled(x)
  assert not torch.equal(a, b)  # fresh numbers each call
  torch.manual_seed(1)
  torch.testing.assert_close(compiled(x), a)  # reproducible after manual_seed
  zero = (a == 0).float().mean().item()
  assert 0.3 < zero < 0.7
  model.eval()
  torch.testing.assert_close(compiled(x), model(x))  # eval: no dropout


class _PlainAttribute(torch.nn.Module):
  """A tensor kept as a plain attribute (not a registered buffer), and CPU tensors made anew
  by each forward: constants of the program."""

  def __init__(self):
    super().__init__()
    self.scale = torch.full((3,), 2.0)
    self.traces = 0

  def forward(self, x):
    self.traces += 1
    return x * self.scale + torch.arange(3.0)


def test_cpu_tensors_baked_into_the_program_changed_in_place_trace_again():
  # A tensor a function closes over, or a module keeps as a plain attribute, is a constant of
  # the program. Changed in place, the program is stale: the next call traces again (as
  # torch.compile reads it on every call), on the shortcut and the general path alike, with
  # and without autograd. A wrong number here is silent.
  w = torch.randn(4, 4)
  x = torch.randn(2, 4)
  f = bridge.compile(lambda x: x @ w)
  with torch.no_grad():
    for _ in range(3):
      torch.testing.assert_close(f(x), x @ w)
      torch.testing.assert_close(f(x), x @ w)  # (recorded: the shortcut)
      w.mul_(2)
  xg = x.clone().requires_grad_(True)
  torch.testing.assert_close(f(xg), x @ w)
  w.add_(1)
  out = f(xg)
  torch.testing.assert_close(out, x @ w)
  out.sum().backward()
  torch.testing.assert_close(xg.grad, w.sum(1).expand(2, 4))
  module = _PlainAttribute()
  compiled = bridge.compile(module)
  with torch.no_grad():
    for _ in range(3):
      torch.testing.assert_close(compiled(torch.ones(3)), module(torch.ones(3)))
  # the forward's own CPU temporaries (arange) change nothing: one trace for three calls
  assert module.traces == 1 + 3
  module.scale.fill_(5.0)
  torch.testing.assert_close(compiled(torch.ones(3)), torch.tensor([5.0, 6.0, 7.0]))
  assert module.traces == 4 + 1


def test_user_changes_to_parameters_are_seen():
  model = torch.nn.Linear(3, 2)
  compiled = bridge.compile(model)
  x = torch.randn(4, 3)
  compiled(x)
  with torch.no_grad():
    model.weight.mul_(3)  # in place
  torch.testing.assert_close(compiled(x), model(x))
  model.bias = torch.nn.Parameter(torch.ones(2))  # a new Parameter object
  torch.testing.assert_close(compiled(x), model(x))
  model.load_state_dict({"weight": torch.zeros(2, 3), "bias": torch.zeros(2)})
  torch.testing.assert_close(compiled(x), torch.zeros(4, 2))
  model.weight.data = torch.ones(2, 3)  # new data, same Parameter object and version
  torch.testing.assert_close(compiled(x), model(x))


class Scaled(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.fc = torch.nn.Linear(3, 3)
    self.traces = 0

  def forward(self, x, scale, *, square=False):
    self.traces += 1  # Python code runs only while tracing
    y = self.fc(x) * scale
    return y * y if square else y


def test_python_numbers_are_static_and_retrace_only_on_change():
  model = Scaled()
  ref = copy.deepcopy(model)
  compiled = bridge.compile(model)
  x = torch.randn(2, 3)
  with torch.no_grad():
    for scale, square in [(2.0, False), (2.0, False), (3.0, False), (2.0, True), (2.0, False)]:
      torch.testing.assert_close(compiled(x, scale, square=square), ref(x, scale, square=square))
  assert model.traces == 3  # (2, False), (3, False), (2, True): one program each
  with torch.no_grad():
    compiled(torch.randn(2, 3), 2.0, square=False)  # same shapes and statics: cached
    assert model.traces == 3
    compiled(torch.randn(5, 3), 2.0, square=False)  # a new shape: one trace
    assert model.traces == 4
    compiled(torch.randn(5, 3, dtype=torch.float64).float(), 2.0, square=False)
    assert model.traces == 4


def test_dynamic_python_numbers():
  model = Scaled()
  compiled = bridge.compile(model, dynamic_argnums=(1,))
  x = torch.randn(2, 3)
  with torch.no_grad():
    for scale in (1.0, 2.0, 3.5):
      torch.testing.assert_close(compiled(x, scale), model.fc(x) * scale)
  assert model.traces == 1


@pytest.mark.parametrize(
  "kw", [{"dynamic_argnums": (1,)}, {"dynamic_argnames": ("scale",)}, {"dynamic_argnames": "scale"}]
)
def test_dynamic_arguments_whichever_way_they_are_passed(kw):
  # as jax.jit: a position also covers the argument passed by name, a name its position
  model = Scaled()
  compiled = bridge.compile(model, **kw)
  x = torch.randn(2, 3)
  with torch.no_grad():
    for scale in (1.0, 2.0, 3.5):
      torch.testing.assert_close(compiled(x, scale), model.fc(x) * scale)
      torch.testing.assert_close(compiled(x, scale=scale + 1), model.fc(x) * (scale + 1))
  assert model.traces == 2  # one per call structure (positional, keyword), none per value


def test_unknown_dynamic_arguments_raise():
  def f(x, alpha=1.0):
    return x * alpha

  with pytest.raises(
    bridge.BridgeTypeError, match=r"'alpah', which is not an argument of .*f\(x, alpha=1.0\)"
  ):
    bridge.compile(f, dynamic_argnames=["alpah"])
  with pytest.raises(
    bridge.BridgeTypeError, match=r"dynamic_argnums has 2, but .*f\(x, alpha=1.0\) takes 2"
  ):
    bridge.compile(f, dynamic_argnums=[2])
  with pytest.raises(bridge.BridgeTypeError, match="positions"):
    bridge.compile(f, dynamic_argnums=[-1])
  bridge.compile(lambda *args, **kwargs: args, dynamic_argnums=[5], dynamic_argnames=["any"])


def test_compiled_function_and_bound_method():
  torch.manual_seed(0)
  f = bridge.compile(lambda x, y: torch.sigmoid(x) @ y)
  x, y = torch.randn(3, 4), torch.randn(4, 2)
  torch.testing.assert_close(f(x, y), torch.sigmoid(x) @ y)

  class WithMethod(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.fc = torch.nn.Linear(4, 4)

    def encode(self, x):
      return self.fc(x).relu()

  m = WithMethod()
  enc = bridge.compile(m.encode)
  torch.testing.assert_close(enc(x), m.encode(x))
  with torch.no_grad():
    m.fc.weight.zero_()
  torch.testing.assert_close(enc(x), m.encode(x))  # a method's module state is threaded too


def test_outputs_keep_their_structure():
  class Multi(torch.nn.Module):
    def forward(self, x):
      return {"sum": x.sum(), "pair": (x * 2, None), "n": 3, "max": x.max(dim=0)}

  out = bridge.compile(Multi())(torch.arange(6.0).reshape(2, 3))
  assert out["n"] == 3 and out["pair"][1] is None
  torch.testing.assert_close(out["pair"][0], torch.arange(6.0).reshape(2, 3) * 2)
  values, indices = out["max"]
  assert indices.dtype == torch.int64  # 64-bit types hold inside compiled programs
  torch.testing.assert_close(indices, torch.tensor([1, 1, 1]))


def test_errors_in_torch_terms():
  class Branchy(torch.nn.Module):
    def forward(self, x):
      if x.sum() > 0:
        return x
      return -x

  with pytest.raises(bridge.TracedValueError, match=r"if x\.sum\(\) > 0"):
    bridge.compile(Branchy())(torch.ones(3))

  class Leaky(torch.nn.Module):
    def forward(self, x):
      self.seen = x + 1
      return x

  with pytest.raises(bridge.LeakedTracerError, match="`seen`"):
    bridge.compile(Leaky())(torch.ones(3))

  with pytest.raises(bridge.BridgeTypeError, match="hashable"):
    bridge.compile(lambda x, opts: x)(torch.ones(2), {1, 2})

  with pytest.raises(bridge.TransferError, match="two devices"):
    bridge.compile(torch.nn.Linear(2, 2))(torch.ones(1, 2, device="jax"))


def test_module_attributes_pass_through():
  model = torch.nn.Linear(2, 2)
  compiled = bridge.compile(model)
  assert compiled.weight is model.weight
  assert list(compiled.parameters()) == list(model.parameters())
  compiled.eval()
  assert not model.training


def test_outputs_are_tensors_without_grad_on_both_devices():
  """Under `torch.no_grad()` (no VJP is built) outputs are still torch tensors on the input's
  device: `jax` tensors for `jax` inputs, CPU tensors for CPU inputs."""
  lin = torch.nn.Linear(4, 3)
  x = torch.randn(2, 4)
  with torch.no_grad():
    want = lin(x)
    cpu_out = bridge.compile(lin)(x)
    jax_lin = copy.deepcopy(lin).to("jax")
    jax_out = bridge.compile(jax_lin)(x.to("jax"))
  assert type(cpu_out) is torch.Tensor and cpu_out.device.type == "cpu"
  assert isinstance(jax_out, bridge.Tensor) and jax_out.device.type == "jax"
  torch.testing.assert_close(cpu_out, want)
  torch.testing.assert_close(jax_out.cpu(), want)


class Counted(torch.nn.Module):
  """Linear -> Dropout -> BatchNorm that counts its traces (Python runs only while tracing)."""

  def __init__(self):
    super().__init__()
    self.fc = torch.nn.Linear(4, 4)
    self.drop = torch.nn.Dropout(0.5)
    self.norm = torch.nn.BatchNorm1d(4)
    self.traces = 0

  def forward(self, x):
    self.traces += 1
    return self.norm(self.drop(self.fc(x)))


@pytest.mark.parametrize("device", ["jax", "cpu"])
def test_repeated_calls_see_every_change(device):
  """Repeated plain calls (all tensors on the `jax` device, or all plain CPU tensors) take a
  shortcut past the cache key; every change that the general path would see must still be
  seen, and the shortcut must not retrace."""
  torch.manual_seed(0)
  model = Counted().eval()
  ref = copy.deepcopy(model)
  model.to(device)
  compiled = bridge.compile(model)
  x = torch.randn(6, 4)
  xj = x.to(device, copy=True)
  with torch.no_grad():
    for _ in range(3):
      torch.testing.assert_close(compiled(xj).cpu(), ref(x))
    assert model.traces == 1 and compiled._fast is not None
    model.fc.weight.mul_(3)  # in place
    ref.fc.weight.mul_(3)
    torch.testing.assert_close(compiled(xj).cpu(), ref(x))
    model.fc.bias = torch.nn.Parameter(torch.ones(4, device=device))  # a new Parameter
    ref.fc.bias = torch.nn.Parameter(torch.ones(4))
    torch.testing.assert_close(compiled(xj).cpu(), ref(x))
    model.fc.weight.data = torch.full((4, 4), 0.5, device=device)  # same Parameter, new data
    ref.fc.weight.data = torch.full((4, 4), 0.5)
    torch.testing.assert_close(compiled(xj).cpu(), ref(x))
    # a view argument (not a whole storage) and another shape: right numbers, one new trace
    torch.testing.assert_close(compiled(xj[::2]).cpu(), ref(x[::2]))
    y = torch.randn(3, 4)
    torch.testing.assert_close(compiled(y.to(device)).cpu(), ref(y))
    assert model.traces == 2
    torch.testing.assert_close(compiled(xj).cpu(), ref(x))
    assert model.traces == 2
    xj.mul_(2)  # the argument changed in place: the shortcut reads it afresh
    torch.testing.assert_close(compiled(xj).cpu(), ref(x * 2))
    xj.div_(2)
    with torch.autocast(device, dtype=torch.bfloat16):  # autocast switches programs
      out = compiled(xj)
    with torch.autocast("cpu", dtype=torch.bfloat16):
      want = ref(x)
    assert out.dtype == want.dtype == torch.bfloat16 and model.traces == 3
    torch.testing.assert_close(out.cpu(), want, rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(compiled(xj).cpu(), ref(x))  # and back
    model.train()  # train mode: fresh dropout masks each call, running statistics updated
    ref.train()
    a, b = compiled(xj), compiled(xj)
    assert not torch.equal(a.cpu(), b.cpu())
    assert int(model.norm.num_batches_tracked.cpu()) == 2
  # grad mode with parameters that require grad: the call is recorded by autograd
  model.eval()
  out = compiled(xj)
  assert out.requires_grad and out.grad_fn is not None
  out.sum().backward()
  assert model.fc.weight.grad is not None
  with torch.no_grad():
    other = "cpu" if device == "jax" else "jax"
    model.fc.to(other)  # state on two devices: the shortcut falls back to the general error
    with pytest.raises(bridge.TransferError, match="two devices"):
      compiled(xj)


class CountedBlock(Block):
  def __init__(self):
    super().__init__()
    self.traces = 0

  def forward(self, x):
    self.traces += 1
    return super().forward(x)


def test_large_programs_compile_in_two_tiers():
  """A large CPU program first runs quickly compiled while the optimized compile runs in the
  background; both give torch's numbers, and neither traces the module again."""
  torch.manual_seed(0)
  model = CountedBlock().eval()
  compiled = bridge.compile(model)
  x = torch.randn(2, 5, 16)
  with torch.no_grad():
    want = model(x)
    model.traces = 0
    torch.testing.assert_close(compiled(x), want, rtol=1e-5, atol=1e-5)
    (program,) = compiled._programs.values()
    quick, optimized = program.tiers
    assert compiled.wait_optimized() is compiled
    assert program.forward is optimized.result() and program.forward is not quick
    torch.testing.assert_close(compiled(x), want, rtol=1e-5, atol=1e-5)
    assert model.traces == 1
    # a parameter of another shape does not fit the compiled program: jax.jit takes over
    model.mlp[2].bias = torch.nn.Parameter(torch.full((1,), 0.5))
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert program.forward is program.jitted


def test_small_programs_and_tiered_compile_off_compile_once():
  with torch.no_grad():
    small = bridge.compile(torch.nn.Linear(4, 4))
    small(torch.randn(2, 4))
    (program,) = small._programs.values()
    # one output, no updates, no randomness: only the lean executable is compiled
    assert program.tiers is None and program.lean is not None
    assert program.jitted._cache_size() == 0
    pair = bridge.compile(lambda x: (x + 1, x * 2))  # two outputs: `jax.jit` compiles it
    pair(torch.randn(3))
    (program,) = pair._programs.values()
    assert program.lean is None and program.forward is program.jitted
    with bridge.config(tiered_compile=False):
      big = bridge.compile(Block().eval())
      big(torch.randn(2, 5, 16))
    (program,) = big._programs.values()
    assert program.tiers is None and program.forward is program.jitted


@pytest.mark.parametrize("device", ["jax", "cpu"])
def test_lean_programs_give_way_to_jax_jit(device):
  """A small program with one output and no updates or randomness runs its own executable
  (no key input, no x64 switch); a repeated call stays on the recorded shortcut, bool
  arguments too, and a parameter of another shape hands the program to `jax.jit`."""

  class Masked(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.fc = torch.nn.Linear(4, 4)
      self.traces = 0

    def forward(self, x, mask):
      self.traces += 1
      return torch.where(mask, self.fc(x), 0.0)

  torch.manual_seed(0)
  model = Masked().to(device)
  compiled = bridge.compile(model)
  x, mask = torch.randn(3, 4), torch.rand(3, 4) > 0.5
  xd, maskd = x.to(device), mask.to(device)
  with torch.no_grad():
    want = torch.where(mask, F.linear(x, model.fc.weight.cpu(), model.fc.bias.cpu()), 0.0)
    torch.testing.assert_close(compiled(xd, maskd).cpu(), want)
    (program,) = compiled._programs.values()
    assert program.lean is not None
    recorded = compiled._fast
    for _ in range(3):
      out = compiled(xd, maskd.clone())  # another bool array (its dtype object may differ)
      assert out.dtype == torch.float32 and out.shape == (3, 4) and out.device.type == device
      torch.testing.assert_close(out.cpu(), want)
    assert compiled._fast is recorded and model.traces == 1
    model.fc.bias = torch.nn.Parameter(torch.full((1,), 0.5, device=device))  # another shape
    want = torch.where(mask, F.linear(x, model.fc.weight.cpu(), model.fc.bias.cpu()), 0.0)
    torch.testing.assert_close(compiled(xd, maskd).cpu(), want)
    torch.testing.assert_close(compiled(xd, maskd).cpu(), want)
    assert program.lean is None and program.forward is program.jitted


@pytest.mark.parametrize(
  "make",
  [
    lambda: torch.randn(3, 4),
    lambda: torch.randn(4, 3).t(),  # not contiguous
    lambda: torch.randn(3, 4, requires_grad=True),  # requires grad, called under no_grad
    lambda: torch.randn(3, 4).to(torch.bfloat16),  # no NumPy dtype
  ],
  ids=["plain", "transposed", "requires_grad", "bfloat16"],
)
def test_cpu_shortcut_keeps_the_lean_program(make):
  """Repeated calls with CPU tensors that NumPy cannot share as they are stay on the recorded
  shortcut and on the lean executable, with torch's numbers."""
  torch.manual_seed(0)
  x = make()
  lin = torch.nn.Linear(4, 2).to(x.dtype)
  compiled = bridge.compile(lin)
  tol = dict(rtol=1.6e-2, atol=1e-2) if x.dtype == torch.bfloat16 else {}
  with torch.no_grad():
    want = lin(x)
    compiled(x.contiguous().detach())  # recorded from a plain call
    (program,) = compiled._programs.values()
    recorded = compiled._fast
    for _ in range(3):
      out = compiled(x)
      assert type(out) is torch.Tensor and out.dtype == x.dtype and out.shape == (3, 2)
      assert not out.requires_grad
      torch.testing.assert_close(out, want, **tol)
    assert compiled._fast is recorded and program.lean is not None


@pytest.mark.parametrize("device", ["jax", "cpu"])
def test_repeated_calls_with_another_dtype_or_shape_take_another_program(device):
  calls = []

  def double(x):
    calls.append(x.dtype)
    return x * 2

  compiled = bridge.compile(double)
  for dtype in (torch.float32, torch.float64, torch.int64, torch.float32):
    for shape in ((2, 3), (3, 2), (2, 3)):
      x = torch.arange(6, dtype=dtype).reshape(shape).to(device)
      for _ in range(2):
        out = compiled(x)
        assert out.dtype == dtype and out.shape == shape and out.device.type == device
        torch.testing.assert_close(out.cpu(), x.cpu() * 2)
  assert calls == [torch.float32] * 2 + [torch.float64] * 2 + [torch.int64] * 2


def test_parameters_as_arguments_take_the_shortcut_and_stay_current():
  # (torch.compile's graphs take a module's parameters as arguments)
  f = bridge.compile(lambda w, x: x @ w.t())
  w = torch.nn.Parameter(torch.randn(3, 4))
  x = torch.randn(2, 4)
  with torch.no_grad():
    torch.testing.assert_close(f(w, x), x @ w.t())
    assert "__call__" in type(f).__dict__  # recorded: the next calls take the shortcut
    w.mul_(2)  # updated in place: the next call reads the new values
    torch.testing.assert_close(f(w, x), x @ w.t())
  out = f(w, x)  # grad mode, a parameter that requires grad: the general path, with a backward
  out.sum().backward()
  torch.testing.assert_close(w.grad, x.sum(0).expand(3, 4))


class _TwoMatrices(torch.nn.Module):
  def __init__(self, a, b):
    super().__init__()
    self.a, self.b = a, b

  def forward(self, x):
    return x @ self.a @ self.b


@pytest.mark.parametrize("how", ["module", "argument"])
def test_a_parameter_changed_in_place_is_imported_again_only_when_its_array_is_a_copy(
  monkeypatch, how
):
  # An optimizer's step changes every parameter in place between two calls. A parameter whose
  # array shares its memory (zero-copy) keeps that array: the update shows through. One whose
  # array is a copy (a view at an unaligned offset) is imported again, or it would be stale.
  from bridge._src import transfer

  imports = []
  real = transfer.tensor_to_jax

  def counting(t, **kwargs):
    imports.append(t.data_ptr())
    return real(t, **kwargs)

  monkeypatch.setattr(transfer, "tensor_to_jax", counting)
  shared = torch.nn.Parameter(torch.randn(4, 4))
  unaligned = torch.nn.Parameter(torch.randn(17)[1:].view(4, 4))  # 4 bytes past the start
  assert unaligned.data_ptr() % 64 and not shared.data_ptr() % 64
  x = torch.randn(2, 4)
  if how == "module":
    model = _TwoMatrices(shared, unaligned)
    compiled = bridge.compile(model)

    def call():
      return compiled(x)

  else:
    compiled = bridge.compile(lambda a, b, x: x @ a @ b)

    def call():
      return compiled(shared, unaligned, x)

  with torch.no_grad():
    call(), call()  # traced, then recorded
    imports.clear()
    for step in range(3):
      shared.mul_(0.5)
      unaligned.add_(1.0)
      torch.testing.assert_close(call(), x @ shared @ unaligned)
  assert imports.count(shared.data_ptr()) == 0
  assert imports.count(unaligned.data_ptr()) == 3
  assert "__call__" in type(compiled).__dict__  # (the shortcut took the calls after the first)


def _unaligned_parameter(*shape: int) -> torch.nn.Parameter:
  """A parameter whose memory is all its own and 4 bytes past a 64-byte boundary, as the
  parameters of a model loaded from safetensors with `assign=True` or by `from_pretrained`."""
  n = math.prod(shape)
  buffer = bytearray(4 * n + 68)
  start = (-torch.frombuffer(buffer, dtype=torch.uint8).data_ptr()) % 64 + 4
  t = torch.frombuffer(buffer, dtype=torch.float32, count=n, offset=start).view(shape)
  p = torch.nn.Parameter(t)
  with torch.no_grad():
    p.copy_(torch.randn(shape))
  assert p.data_ptr() % 64 == 4 and p.untyped_storage().nbytes() == 4 * n
  return p


@pytest.mark.parametrize("write", ["data", "numpy", "in_place"])
def test_writes_the_version_counter_misses_reach_an_unaligned_parameter(write):
  # An unaligned parameter's array was a copy, kept while the version counter stood still: a
  # write through `.data` or NumPy (an EMA update, WGAN's weight clipping) leaves it as it
  # was, and the program ran on the old weights. Such a parameter now moves to aligned memory
  # of its own at the first call (zero-copy from then on); one sharing its memory with
  # another tensor (a view into a flat buffer) is imported again on every call.
  torch.manual_seed(0)
  own = _unaligned_parameter(4, 4)
  flat = torch.randn(17)
  view = torch.nn.Parameter(flat[1:].view(4, 4))
  model = _TwoMatrices(own, view)
  compiled = bridge.compile(model)
  x = torch.randn(2, 4)
  with torch.no_grad():
    torch.testing.assert_close(compiled(x), model(x))
    assert model.a is own and own.data_ptr() % 64 == 0  # moved, the same parameter
    assert view.data_ptr() == flat.data_ptr() + 4  # shared with `flat`: left where it is
    for step in range(3):
      for p in (own, view):
        if write == "data":
          p.data.mul_(0.5)
        elif write == "numpy":
          a = p.detach().numpy()
          a += 1.0
        else:
          p.add_(1.0)
      torch.testing.assert_close(compiled(x), x @ own @ view)
    flat.mul_(2.0)  # through the buffer the view shares
    torch.testing.assert_close(compiled(x), x @ own @ view)


def test_moving_an_unaligned_parameter_keeps_a_pending_backward_and_the_optimizer():
  torch.manual_seed(0)
  w = _unaligned_parameter(4, 4)
  model = _TwoMatrices(w, torch.nn.Parameter(torch.randn(4, 4)))
  opt = torch.optim.SGD(model.parameters(), lr=0.1)
  x = torch.randn(2, 4)
  eager_loss = model(x).square().sum()  # its backward saved `w` before the move
  compiled = bridge.compile(model)
  loss = compiled(x).square().sum()
  assert w.data_ptr() % 64 == 0
  torch.testing.assert_close(loss, eager_loss)
  (g,) = torch.autograd.grad(eager_loss, [w])
  loss.backward()
  torch.testing.assert_close(w.grad, g)
  opt.step()
  with torch.no_grad():
    torch.testing.assert_close(compiled(x), model(x))


def test_torch_save_and_load_of_a_compiled_module():
  import io

  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
  compiled = bridge.compile(model, dynamic_argnums=())
  x = torch.randn(2, 3)
  compiled(x)  # (a recorded call and programs: none of them is pickled)
  buffer = io.BytesIO()
  torch.save(compiled, buffer)
  buffer.seek(0)
  loaded = torch.load(buffer, weights_only=False)
  assert isinstance(loaded, bridge.Compiled) and loaded is not compiled
  torch.testing.assert_close(loaded(x), model(x))
  torch.testing.assert_close(loaded.module[0].weight, model[0].weight)


def test_an_argument_it_cannot_take_is_named_as_the_user_wrote_it():
  import numpy as np

  def f(x, y=None, cfg=None):
    return x

  compiled = bridge.compile(f)
  with pytest.raises(bridge.BridgeTypeError, match=r"argument x is a NumPy array.*from_numpy"):
    compiled(np.ones(3, np.float32))
  with pytest.raises(bridge.BridgeTypeError, match=r"argument y is a NumPy array"):
    compiled(torch.ones(3), y=np.ones(3, np.float32))
  with pytest.raises(bridge.BridgeTypeError, match=r"argument cfg\['a'\]\[1\] is a set"):
    compiled(torch.ones(3), None, {"a": [1, {2}]})
