"""`torch.compile(model, backend="jax")`: dynamo's graphs through aot_autograd as `jax.jit`
programs, checked against eager torch (forward, gradients of every parameter, training)."""

from __future__ import annotations

import copy
import math
import os
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import bridge
from bridge._src.dynamo import backend


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _params_close(compiled: torch.nn.Module, eager: torch.nn.Module, **tol) -> None:
  for (name, p), q in zip(compiled.named_parameters(), eager.parameters()):
    if q.grad is None:  # (aot_autograd gives zeros where no gradient flows, as inductor)
      assert p.grad is None or not p.grad.any(), name
      continue
    torch.testing.assert_close(p.grad, q.grad, msg=name, **tol)


def _step_parity(
  model: torch.nn.Module, *inputs, loss=lambda out: out.float().pow(2).mean(), **tol
):
  eager = copy.deepcopy(model)
  compiled = torch.compile(model, backend="jax")
  out = compiled(*inputs)
  ref = eager(*inputs)
  torch.testing.assert_close(out, ref, **tol)
  loss(out).backward()
  loss(ref).backward()
  _params_close(model, eager, **tol)
  return compiled, eager


def test_resolves_by_name_in_a_fresh_interpreter_without_import_bridge():
  code = textwrap.dedent(
    """
    import sys, torch
    f = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2 + 1, backend="jax")
    x = torch.linspace(-2, 2, 7)
    torch.testing.assert_close(f(x), torch.nn.functional.gelu(x) * 2 + 1)
    assert f(x).device.type == "cpu"
    print("OK", "bridge" in sys.modules)
    """
  )
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.split()[-2:] == ["OK", "True"]  # (the entry point loaded it)


def test_torch_logs_turns_on_the_backends_log():
  """`TORCH_LOGS=bridge` shows what the backend did (its graphs, programs and recompiles), as
  `TORCH_LOGS=dynamo` does for dynamo; without it nothing is printed."""
  code = textwrap.dedent(
    """
    import torch
    f = torch.compile(lambda x: x.sin() + 1, backend="jax", dynamic=False)
    f(torch.ones(3)); f(torch.ones(3)); f(torch.ones(4))
    print("OK")
    """
  )

  def run(logs: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("TORCH_LOGS", None)
    if logs is not None:
      env["TORCH_LOGS"] = logs
    return subprocess.run(
      [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )

  out = run("bridge")
  assert out.returncode == 0 and out.stdout.split()[-1] == "OK", out.stderr[-3000:]
  # torch's format: "I1127 14:21:45.975 ... bridge/_src/dynamo.py:237] [0/0] graph 1: ..."
  lines = [line for line in out.stderr.splitlines() if "_src/dynamo.py" in line]
  assert any("graph 1: " in line for line in lines), out.stderr[-3000:]
  assert any("recompile: " in line and "size mismatch" in line for line in lines), lines
  quiet = run(None)
  assert quiet.returncode == 0 and "graph 1: " not in quiet.stderr, quiet.stderr[-3000:]


def test_dynamo_tokenizes_no_source_for_its_debug_logs_while_they_are_off(tmp_path):
  """Dynamo names the function around each traced line only for two debug logs; with the
  backend loaded it does so only while they are on (tokenizing each traced file cost 0.1-0.15
  s of GPT-2's first compile), and their lines still name it."""
  code = textwrap.dedent(
    """
    import io, logging, torch
    from torch._dynamo import funcname_cache
    def model(x):
        return torch.sin(x) + 1
    torch.compile(model, backend="jax")(torch.ones(3))
    print("files", len(funcname_cache.cache))
    torch._logging.set_logs(trace_call=True)
    buf = io.StringIO()
    logging.getLogger("torch._dynamo").addHandler(logging.StreamHandler(buf))
    def other(x):
        return torch.cos(x) * 2
    torch.compile(other, backend="jax")(torch.ones(3))
    print([line for line in buf.getvalue().splitlines() if "TRACE FX call cos" in line])
    """
  )
  script = tmp_path / "traced.py"  # (a file: dynamo names the functions of files it can read)
  script.write_text(code)
  env = {k: v for k, v in os.environ.items() if k != "TORCH_LOGS"}
  out = subprocess.run(
    [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env
  )
  assert out.returncode == 0, out.stderr[-3000:]
  files, logged = out.stdout.splitlines()[-2:]
  assert files == "files 0"
  assert "in other (other)" in logged, logged


def test_mlp_forward_backward_parity():
  torch.manual_seed(0)
  model = torch.nn.Sequential(
    torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.Tanh()
  )
  _step_parity(model, torch.randn(5, 8))
  s = bridge.compile_stats()
  assert (s.graphs, s.programs) == (1, 2)  # one forward program, one backward program


def test_a_plain_function_and_its_gradient():
  def f(x, y):
    return (x.sin() * y).softmax(-1).sum(0)

  g = torch.compile(f, backend="jax")
  x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
  y = torch.randn(4, 5, dtype=torch.float64)
  out = g(x, y)
  assert out.dtype == torch.float64 and out.shape == (5,)
  torch.testing.assert_close(out, f(x, y))
  (gx,) = torch.autograd.grad(out.sum(), x)
  (rx,) = torch.autograd.grad(f(x, y).sum(), x)
  torch.testing.assert_close(gx, rx)


def test_adamw_training_loop_matches_eager():
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
  eager = copy.deepcopy(model)
  compiled = torch.compile(model, backend="jax")
  opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
  ref_opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
  x, y = torch.randn(32, 6), torch.randn(32, 1)
  losses, ref_losses = [], []
  for _ in range(20):
    for m, o, out in ((compiled, opt, losses), (eager, ref_opt, ref_losses)):
      o.zero_grad()
      loss = torch.nn.functional.mse_loss(m(x), y)
      loss.backward()
      o.step()
      out.append(loss.item())
  torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
  assert losses[-1] < losses[0]
  for p, q in zip(model.parameters(), eager.parameters()):
    torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
  s = bridge.compile_stats()
  assert s.programs == 2 and s.cache_hits == 2 * 19  # traced once, then cached


def test_optimizer_step_compiled_too():
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
  eager = copy.deepcopy(model)
  opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
  ref_opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
  compiled = torch.compile(model, backend="jax")

  @torch.compile(backend="jax")
  def step():
    opt.step()

  x, y = torch.randn(8, 6), torch.randn(8, 2)
  with warnings.catch_warnings():
    warnings.simplefilter("error", bridge.FallbackWarning)  # (fma, copy: lowered)
    for _ in range(5):
      opt.zero_grad()
      torch.nn.functional.mse_loss(compiled(x), y).backward()
      step()
      ref_opt.zero_grad()
      torch.nn.functional.mse_loss(eager(x), y).backward()
      ref_opt.step()
  for p, q in zip(model.parameters(), eager.parameters()):
    torch.testing.assert_close(p, q)
  # the model's forward and backward, and the step: three programs for a whole training step
  s = bridge.compile_stats()
  assert s.programs == 3 and not s.recompiles, s


def test_the_functional_copy_on_the_jax_device():
  a = torch.randn(5)
  dst = torch.randn(3, 5, dtype=torch.float64)
  out = torch.ops.aten.copy.default(dst.to("jax"), a.to("jax"))
  ref = torch.ops.aten.copy.default(dst, a)
  assert out.dtype == ref.dtype and out.shape == ref.shape
  torch.testing.assert_close(out.cpu(), ref)


def test_addcmul_and_lerp_in_place_which_dynamo_writes_with_inductors_fma():
  def f(x, a, b):
    y = x.clone()
    y.addcmul_(a, b, value=0.5)
    y.lerp_(a, 0.25)
    return y

  x, a, b = torch.randn(4), torch.randn(4), torch.randn(4)
  with warnings.catch_warnings():
    warnings.simplefilter("error", bridge.FallbackWarning)
    torch.testing.assert_close(torch.compile(f, backend="jax")(x, a, b), f(x, a, b))
  # (whether `prims.fma` has a lowering depends on the order things were imported in: the
  # programs never see it, on either path)
  from bridge._src import dynamo

  fma = torch.ops.prims.fma.default
  assert not [n for g in list(dynamo._graphs) for n in g.gm.graph.nodes if n.target is fma]


class ConvNet(torch.nn.Module):
  def __init__(self, p=0.0):
    super().__init__()
    self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    self.bn = torch.nn.BatchNorm2d(8)
    self.drop = torch.nn.Dropout(p)
    self.fc = torch.nn.Linear(8 * 4 * 4, 5)

  def forward(self, x):
    h = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
    return self.fc(self.drop(h).flatten(1))


def test_cnn_batchnorm_running_statistics_update_in_place():
  torch.manual_seed(0)
  model = ConvNet()
  compiled, eager = _step_parity(model, torch.randn(4, 3, 8, 8))
  for name in ("running_mean", "running_var", "num_batches_tracked"):
    torch.testing.assert_close(getattr(model.bn, name), getattr(eager.bn, name), msg=name)
  assert int(model.bn.num_batches_tracked) == 1
  x = torch.randn(4, 3, 8, 8)
  compiled(x)
  eager(x)
  torch.testing.assert_close(model.bn.running_mean, eager.bn.running_mean)
  model.eval()
  eager.eval()
  with torch.no_grad():  # a forward-only program, with the running statistics
    torch.testing.assert_close(compiled(x), eager(x))


def test_dropout_draws_from_the_generator_seeded_by_torch_manual_seed():
  torch.manual_seed(0)
  model = ConvNet(p=0.5)
  compiled = torch.compile(model, backend="jax")
  x = torch.randn(4, 3, 8, 8)
  torch.manual_seed(123)
  a = compiled(x)
  b = compiled(x)
  torch.manual_seed(123)
  a2 = compiled(x)
  torch.testing.assert_close(a2, a)  # reproducible under torch.manual_seed
  assert not torch.equal(a, b)  # a new mask on each call
  # the backward uses the forward's mask: d(sum)/d(fc input) is fc's weight where kept, else 0
  feats = {}
  model.fc.register_forward_hook(lambda m, i, o: feats.setdefault("x", i[0]))
  torch._dynamo.reset()
  compiled = torch.compile(model, backend="jax")
  compiled(x).sum().backward()
  assert model.conv.weight.grad is not None and model.conv.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize(
  "make",
  [
    lambda x: torch.rand(x.shape),
    lambda x: torch.empty(x.shape).uniform_(),
    lambda x: torch.randn(x.shape).sigmoid(),
    lambda x: torch.distributions.Normal(torch.zeros(x.shape), 1.0).rsample().sigmoid(),
  ],
  ids=["rand", "empty_uniform_", "randn", "Normal_rsample"],
)
@pytest.mark.timeout(300)
def test_random_tensors_made_in_the_graph_are_drawn_on_every_call(make, grad):
  """`torch.rand(n)` makes a CPU tensor: torch's CPU kernel used to run it while the program
  was traced, so every call returned the numbers of that one draw. (`Normal.rsample` fills
  `torch.empty(n)` with `normal_`, whose functional form falls back to torch through a host
  call: run at once on the known input while tracing, it was frozen too; staged, its host
  function reseeded every device and deadlocked on the `jax` generator's lock.)"""

  def f(x):
    return x * 0 + make(x)

  compiled = torch.compile(f, backend="jax")
  x = torch.zeros(4000, requires_grad=grad)
  with torch.set_grad_enabled(grad):
    torch.manual_seed(7)
    a, b = compiled(x), compiled(x)
    torch.manual_seed(7)
    torch.testing.assert_close(compiled(x), a)  # reproducible under torch.manual_seed
  assert not torch.equal(a, b)  # and new numbers on every call
  assert 0.45 < a.mean().item() < 0.55 and 0.0 <= a.min().item() and a.max().item() <= 1.0
  if grad:
    a.sum().backward()
    torch.testing.assert_close(x.grad, torch.zeros(4000))


def test_transformer_encoder_layer_train_and_eval():
  torch.manual_seed(0)
  layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
  x = torch.randn(3, 7, 16)
  compiled, eager = _step_parity(layer, x, rtol=1e-4, atol=1e-5)
  layer.eval()
  eager.eval()
  with torch.inference_mode():
    torch.testing.assert_close(compiled(x), eager(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_with_a_boolean_mask(causal):
  # F.scaled_dot_product_attention takes its math form in the backend's graphs; a boolean
  # mask (True: attend) must become an additive one, with a fully masked row giving zeros
  q, k, v = torch.randn(3, 2, 2, 5, 8, requires_grad=True).unbind(0)
  mask = torch.tril(torch.ones(5, 5, dtype=torch.bool)).expand(2, 1, 5, 5).clone()
  mask[0, 0, 3] = False
  mask[1, 0, 2, 0] = False

  def f(q, k, v, mask):
    if causal:
      return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, mask, scale=0.3)

  out = torch.compile(f, backend="jax")(q, k, v, mask)
  ref = f(q, k, v, mask)
  torch.testing.assert_close(out, ref)
  grads = torch.autograd.grad(out.sum(), (q, k, v))
  torch.testing.assert_close(grads, torch.autograd.grad(ref.sum(), (q, k, v)))


def test_lstm():
  torch.manual_seed(0)
  _step_parity(
    torch.nn.LSTM(4, 8, num_layers=2, batch_first=True),
    torch.randn(2, 5, 4),
    loss=lambda out: out[0].pow(2).mean(),
  )


def test_no_grad_compiles_a_forward_only_program():
  model = torch.nn.Linear(4, 3)
  compiled = torch.compile(model, backend="jax")
  with torch.no_grad():
    out = compiled(torch.ones(2, 4))
  assert not out.requires_grad
  assert bridge.compile_stats().programs == 1
  torch.testing.assert_close(out, model(torch.ones(2, 4)))


def test_graphs_that_record_no_gradient_run_without_aot_autograd():
  # dynamo's own graph becomes the program: its in-place writes (BatchNorm's running
  # statistics in train mode) land in the module as in eager, and each call matches eager
  torch.manual_seed(0)
  model = ConvNet()
  eager = copy.deepcopy(model)
  compiled = torch.compile(model, backend="jax")
  with torch.no_grad():
    for _ in range(3):
      x = torch.randn(4, 3, 8, 8)
      torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-5)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
      torch.testing.assert_close(getattr(model.bn, name), getattr(eager.bn, name), msg=name)
    model.eval(), eager.eval()
    torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-5)
  with torch.inference_mode():
    torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-5)
  # inputs that require no grad, with grad mode on: no gradient to record either
  plain = torch.compile(lambda a, b: torch.tanh(a @ b), backend="jax")
  a, b = torch.randn(3, 4), torch.randn(4, 2)
  torch.testing.assert_close(plain(a, b), torch.tanh(a @ b))
  s = bridge.compile_stats()
  assert s.graphs == s.direct == 4, s  # train, eval, inference mode, the function
  # a graph that records gradients goes through aot_autograd
  model.train()
  compiled(x).sum().backward()
  s = bridge.compile_stats()
  assert (s.graphs, s.direct) == (5, 4), s


def test_moves_to_the_inputs_own_device_in_a_graph_without_aot():
  # dynamo writes `y.to(x.device)` with the device as a constant: inside the program it moves
  # nothing (a move to the CPU would leave the program)
  f = torch.compile(
    lambda x, y: x + y.to(x.device) + y.to(device=x.device, dtype=torch.float64).float(),
    backend="jax",
  )
  x, y = torch.randn(3), torch.randn(3)
  torch.testing.assert_close(f(x, y), x + 2 * y)
  config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32)
  model = transformers.GPT2LMHeadModel(config).eval()
  ids = torch.randint(0, 100, (2, 8))
  with torch.no_grad():
    torch.testing.assert_close(
      torch.compile(model, backend="jax")(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-5
    )
  s = bridge.compile_stats()
  assert s.graphs == s.direct, s


def test_inputs_sharing_memory_are_left_to_aot_autograd():
  # a write through one input is seen through the other, as in eager
  def f(a, b):
    a.add_(1)
    return b * 2

  g = torch.compile(f, backend="jax")
  base, ref = torch.zeros(2, 3), torch.zeros(2, 3)
  with torch.no_grad():
    torch.testing.assert_close(g(base, base[0]), f(ref, ref[0]))
  torch.testing.assert_close(base, ref)
  assert bridge.compile_stats().direct == 0


def test_symbolic_sizes_without_aot_make_one_program_per_shape():
  f = torch.compile(lambda x: torch.tanh(x * 2).sum(-1), backend="jax", dynamic=True)
  with torch.no_grad():
    for n in (3, 4, 5, 4):
      x = torch.randn(2, n)
      torch.testing.assert_close(f(x), torch.tanh(x * 2).sum(-1))
  s = bridge.compile_stats()
  assert (s.graphs, s.direct, s.programs, s.cache_hits) == (1, 1, 3, 1), s


def test_an_output_that_is_a_view_of_an_input_stays_one_as_in_eager():
  # aot_autograd rebuilds such views; the backend leaves those graphs to it
  view = torch.compile(lambda x: x.view(-1)[:3], backend="jax")
  same = torch.compile(lambda x: x.add_(1), backend="jax")
  x, y = torch.arange(6.0).reshape(2, 3), torch.zeros(3)
  with torch.no_grad():
    out = view(x)
    assert out.data_ptr() == x.data_ptr()
    out.mul_(10)  # written through the view, as in eager
    torch.testing.assert_close(x.view(-1)[:3], torch.tensor([0.0, 10.0, 20.0]))
    assert same(y).data_ptr() == y.data_ptr()
  torch.testing.assert_close(y, torch.ones(3))


def test_autocast_region():
  model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
  compiled = torch.compile(model, backend="jax")
  x = torch.randn(3, 8)
  with torch.autocast("cpu", dtype=torch.bfloat16):
    out, ref = compiled(x), model(x)
  assert out.dtype == ref.dtype == torch.bfloat16
  torch.testing.assert_close(out, ref)


def test_second_derivative_raises_torchs_error():
  f = torch.compile(lambda x: (x.sin() ** 2).sum(), backend="jax")
  x = torch.randn(3, requires_grad=True)
  (g,) = torch.autograd.grad(f(x), x, create_graph=True)
  with pytest.raises(RuntimeError, match="does not currently support double backward"):
    g.sum().backward()


def test_graph_breaks_each_piece_runs_through_the_backend(capsys):
  def f(x):
    y = x.sin() * 2
    print("between graphs")
    if y.sum() > 0:  # data-dependent: dynamo breaks here
      return y.cos() + y.item() if y.numel() == 1 else y.cos()
    return -y

  g = torch.compile(f, backend="jax")
  for x in (torch.randn(5).abs(), -torch.randn(5).abs(), torch.tensor([0.5])):
    torch.testing.assert_close(g(x), f(x))
  assert "between graphs" in capsys.readouterr().out
  assert bridge.compile_stats().graphs >= 3


def test_new_shape_recompiles_and_the_stats_say_which_input_changed():
  f = torch.compile(lambda x: x.softmax(-1) * 3, backend="jax")
  for n in (2, 3, 7, 3):
    x = torch.randn(n, 5)
    torch.testing.assert_close(f(x), x.softmax(-1) * 3)
  s = bridge.compile_stats()
  assert s.calls == 4 and s.cache_hits >= 1
  assert s.recompiles and any("shape" in r and "5" in r for r in s.recompiles), s.recompiles


def test_a_recompile_for_another_model_counts_the_new_inputs():
  def run(m, x):
    return m(x)

  f = torch.compile(run, backend="jax")
  small = torch.nn.Sequential(torch.nn.Linear(4, 4))
  deep = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(4)])
  x = torch.randn(2, 4)
  mid = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(2)])
  with torch.no_grad():
    f(small, x)
    torch.testing.assert_close(f(deep, x), deep(x))
    torch.testing.assert_close(f(mid, x), mid(x))
  first, second = bridge.compile_stats().recompiles[-2:]
  assert "6 inputs are new: L_m_modules_1_parameters_weight_, " in first, first
  assert "and 3 more" in first, first
  assert "4 inputs are gone: L_m_modules_2_parameters_weight_, " in second, second


@pytest.mark.parametrize("dynamic", [True, "mark"])
def test_dynamic_shapes(dynamic):
  def f(x, w):
    return (x @ w).relu().sum(1) / x.shape[0]

  g = torch.compile(f, backend="jax", dynamic=True if dynamic is True else None)
  w = torch.randn(6, 4)
  for n in (2, 5, 9):
    x = torch.randn(n, 6)
    if dynamic == "mark":
      torch._dynamo.mark_dynamic(x, 0)
    torch.testing.assert_close(g(x, w), f(x, w))
  assert bridge.compile_stats().graphs == 1  # one graph; a program per shape


def test_a_changing_python_float_is_an_input_not_a_fallback():
  # dynamo passes it as a 0-dim float64 tensor, converted by `prims.convert_element_type`
  def f(x, *, scale=2.0):
    return x * scale + 1

  g = torch.compile(f, backend="jax")
  x = torch.ones(3)
  with warnings.catch_warnings():
    warnings.simplefilter("error", bridge.FallbackWarning)
    for s in (1.0, 2.5, 3.5, 4.5):
      torch.testing.assert_close(g(x, scale=s), f(x, scale=s))
  s = bridge.compile_stats()
  assert (s.graphs, s.programs, s.cache_hits) == (2, 2, 2)  # (dynamo specializes the first)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.bool, torch.bfloat16])
def test_prims_convert_element_type_on_the_jax_device(dtype):
  x = torch.tensor([1.5, -2.7, 0.0])
  out = torch.ops.prims.convert_element_type.default(x.to("jax"), dtype)
  ref = torch.ops.prims.convert_element_type.default(x, dtype)
  assert out.dtype == ref.dtype and out.device.type == "jax"
  assert torch.equal(out.cpu(), ref)


@torch.library.custom_op("bridge_backend_test::twice_sin", mutates_args=())
def _twice_sin(x: torch.Tensor) -> torch.Tensor:
  return 2 * x.sin()


@_twice_sin.register_fake
def _(x):
  return torch.empty_like(x)


def test_an_op_without_lowering_falls_back_inside_the_program():
  g = torch.compile(lambda x: _twice_sin(x * 3) + 1, backend="jax")
  x = torch.randn(4)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = g(x)
    g(x)
  torch.testing.assert_close(out, 2 * (x * 3).sin() + 1)
  fallback = [w for w in caught if issubclass(w.category, bridge.FallbackWarning)]
  assert len(fallback) == 1 and "bridge_backend_test::twice_sin" in str(fallback[0].message)
  assert bridge.compile_stats().graphs == 1  # the graph stayed whole


@torch.library.custom_op("bridge_backend_test::checked_log", mutates_args=())
def _checked_log(x: torch.Tensor) -> torch.Tensor:
  if (x <= 0).any():
    raise ValueError("checked_log: every value must be positive")
  return x.log()


@_checked_log.register_fake
def _(x):
  return torch.empty_like(x)


def test_an_exception_of_a_fallback_op_is_raised_as_torch_raised_it():
  g = torch.compile(lambda x: _checked_log(x + 1) * 2, backend="jax")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    torch.testing.assert_close(g(torch.ones(3)), torch.full((3,), 2 * torch.log(torch.tensor(2.0))))
    with pytest.raises(ValueError, match="every value must be positive"):
      g(-torch.ones(3) * 2)


def test_an_op_that_neither_lowers_nor_falls_back_names_the_op_and_the_users_line():
  def model(x):
    y = x * 3
    return _twice_sin(y) + 1  # the line the error names

  g = torch.compile(model, backend="jax", options={"fallback": "error"})
  with pytest.raises(bridge.OperatorNotFound) as info:
    g(torch.randn(4))
  message = str(info.value)
  assert "bridge_backend_test.twice_sin" in message
  assert "test_torch_compile_backend.py" in message and "return _twice_sin(y) + 1" in message


def test_check_indices_option_raises_torchs_index_error():
  def f(x, i):
    return x[i] * 2

  x = torch.randn(5)
  unchecked = torch.compile(f, backend="jax")
  torch.testing.assert_close(unchecked(x, torch.tensor([3])), f(x, torch.tensor([3])))
  torch._dynamo.reset()
  checked = torch.compile(f, backend="jax", options={"check_indices": True})
  torch.testing.assert_close(checked(x, torch.tensor([3])), f(x, torch.tensor([3])))
  with pytest.raises(IndexError, match="index 7 is out of bounds for dimension 0 with size 5"):
    checked(x, torch.tensor([7]))


# name -> (function, its arguments): eager torch raises RuntimeError on values a program
# checks only with `options={"check_indices": True}`
_VALUE_ERRORS = {
  "floor_divide": (lambda a, z: a // z, (torch.tensor([-7, 3, 7]), torch.tensor([1, 0, 1]))),
  "remainder": (lambda a, z: a % z, (torch.tensor([-7, 3]), torch.tensor([0, 1]))),
  "div_trunc": (
    lambda a, z: torch.div(a, z, rounding_mode="trunc"),
    (torch.tensor([-7, 3]), torch.tensor([0, 1])),
  ),
  "multinomial_nan": (lambda p: torch.multinomial(p, 1), (torch.tensor([0.2, math.nan, 0.3]),)),
  "multinomial_negative": (lambda p: torch.multinomial(p, 1), (torch.tensor([0.2, -1.0, 0.3]),)),
}


@pytest.mark.parametrize("name", list(_VALUE_ERRORS))
def test_check_indices_option_checks_values_too(name):
  fn, args = _VALUE_ERRORS[name]
  with pytest.raises(RuntimeError) as expected:
    fn(*args)
  torch._dynamo.reset()
  checked = torch.compile(fn, backend="jax", options={"check_indices": True})
  with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
    checked(*args)


@pytest.mark.parametrize(
  "fn",
  [lambda t: t.softmax(0), lambda t: t.log_softmax(0), lambda t: t.t().softmax(-1)],
  ids=["softmax", "log_softmax", "softmax_last_dim"],
)
def test_softmax_over_an_empty_dim_with_its_gradient(fn):
  x = torch.zeros(0, 4, requires_grad=True)
  want = fn(x)
  (want * 2).sum().backward()
  torch._dynamo.reset()
  y = x.detach().clone().requires_grad_(True)
  got = torch.compile(fn, backend="jax")(y)
  (got * 2).sum().backward()
  torch.testing.assert_close(got, want)
  torch.testing.assert_close(y.grad, x.grad)


@pytest.mark.parametrize(
  "fn", [lambda t: t.max(), lambda t: t.min(), lambda t: t.max(0)], ids=["max", "min", "max_dim"]
)
def test_reducing_nothing_raises_torchs_error(fn):
  x = torch.zeros(0, 4)
  with pytest.raises((RuntimeError, IndexError)) as expected:
    fn(x)
  torch._dynamo.reset()
  with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
    torch.compile(fn, backend="jax")(x)


def test_options_and_mode_are_checked():
  with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
    torch.compile(lambda x: x + 1, backend="jax", options={"fallbak": "error"})(torch.ones(2))
  inner = info.value.inner_exception
  assert isinstance(inner, bridge.BridgeTypeError)
  assert "no option 'fallbak'" in str(inner) and "fallback" in str(inner)
  torch._dynamo.reset()
  with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
    torch.compile(lambda x: x + 2, backend="jax", options={"fallback": "never"})(torch.ones(2))
  assert isinstance(info.value.inner_exception, bridge.BridgeTypeError)
  torch._dynamo.reset()
  with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
    torch.compile(lambda x: x + 3, backend="jax", mode="max-autotune")(torch.ones(2))
  assert "has no mode 'max-autotune'" in str(info.value.inner_exception)
  torch._dynamo.reset()
  f = torch.compile(lambda x: x * 4, backend="jax", options={"tiered_compile": False})
  torch.testing.assert_close(f(torch.ones(2)), torch.full((2,), 4.0))


def test_sparse_input_is_refused_or_run_by_torch():
  def f(x):
    return x * 2

  x = torch.eye(3).to_sparse()
  # dynamo refuses sparse tensors itself, before any backend; without fullgraph it runs
  # the frame in eager torch
  with pytest.raises(torch._dynamo.exc.Unsupported, match="sparse"):
    torch.compile(f, backend="jax", fullgraph=True)(x)
  torch._dynamo.reset()
  torch.testing.assert_close(torch.compile(f, backend="jax")(x).to_dense(), 2 * torch.eye(3))
  # a graph that reaches the backend with one (a caller other than dynamo) gets its error
  gm = torch.fx.symbolic_trace(f)
  with pytest.raises(bridge.BridgeTypeError, match="graph input 0 is a sparse tensor"):
    backend(gm, [x])


def test_jax_device_inputs_give_jax_device_outputs():
  def f(x, y):
    return (x @ y).relu() + 1

  g = torch.compile(f, backend="jax")
  x, y = torch.randn(3, 4), torch.randn(4, 5)
  out = g(x.to("jax"), y.to("jax"))
  assert out.device.type == "jax"
  torch.testing.assert_close(out.cpu(), f(x, y))


def test_other_backends_run_jax_device_ops_without_tracing_the_bridge():
  # dynamo would otherwise trace the dispatcher's own frames as user code (and break them)
  g = torch.compile(lambda x: (x + 1).sin(), backend="eager")
  x = torch.randn(3)
  torch.testing.assert_close(g(x.to("jax")).cpu(), (x + 1).sin())


transformers = pytest.importorskip("transformers")


def _three(build):
  """A model built under seed 0, an eager copy, and the model compiled by the backend."""
  torch.manual_seed(0)
  model = build()
  return model, copy.deepcopy(model), torch.compile(model, backend="jax")


def test_gpt2_training_step():
  config = transformers.GPT2Config(
    n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32,
    attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
  )  # fmt: skip
  model, eager, compiled = _three(lambda: transformers.GPT2LMHeadModel(config))
  ids = torch.randint(0, 100, (2, 8))
  out = compiled(ids, labels=ids)
  ref = eager(ids, labels=ids)
  torch.testing.assert_close(out.logits, ref.logits, rtol=1e-4, atol=1e-5)
  out.loss.backward()
  ref.loss.backward()
  _params_close(model, eager, rtol=1e-4, atol=1e-5)
  s = bridge.compile_stats()
  # dynamo breaks GPT-2's forward once when it computes the loss (at transformers'
  # `logger.warning_once`): two graphs, each a forward and a backward program
  assert (s.graphs, s.programs) == (2, 4), s
  model.zero_grad()
  compiled(ids, labels=ids).loss.backward()  # the next step: cached, no recompile
  s = bridge.compile_stats()
  assert (s.graphs, s.programs, s.recompiles) == (2, 4, []), s
  assert s.cache_hits == 4


def test_transformers_imported_after_bridge_is_taught_when_it_loads():
  # (so that dynamo's guards see the taught function from the start: no recompile)
  code = textwrap.dedent(
    """
    import sys
    import bridge
    assert "torch._dynamo" not in sys.modules  # (about 1.3 s: loaded by torch.compile only)
    import transformers.utils.import_utils as iu
    from bridge._src import compat
    assert compat._NAME in compat._patched
    assert iu.is_jax_jitting(1) is False
    import inspect
    assert "def is_tracing" in inspect.getsource(iu)  # its loader still serves its source
    print("OK")
    """
  )
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
  )
  assert out.returncode == 0 and out.stdout.split()[-1] == "OK", out.stderr[-3000:]


def test_gpt2_step_with_the_loss_outside_is_one_graph():
  config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=100, n_positions=32)
  model = transformers.GPT2LMHeadModel(config)
  compiled = torch.compile(model, backend="jax")
  ids = torch.randint(0, 100, (2, 8))
  for _ in range(2):
    logits = compiled(ids).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
  s = bridge.compile_stats()
  # one forward and one backward program, one execution each per step
  assert (s.graphs, s.programs, s.calls, s.cache_hits, s.recompiles) == (1, 2, 4, 2, []), s


def test_bert_forward_backward_with_padding_mask():
  config = transformers.BertConfig(
    num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
    vocab_size=100, max_position_embeddings=32, hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
  )  # fmt: skip
  model, eager, compiled = _three(lambda: transformers.BertModel(config))
  ids = torch.randint(0, 100, (2, 8))
  mask = torch.ones(2, 8, dtype=torch.long)
  mask[1, 5:] = 0
  out = compiled(ids, attention_mask=mask).last_hidden_state
  ref = eager(ids, attention_mask=mask).last_hidden_state
  torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
  out.sum().backward()
  ref.sum().backward()
  _params_close(model, eager, rtol=1e-4, atol=1e-5)
  assert bridge.compile_stats().graphs == 1  # whole: transformers' tracing checks trace
