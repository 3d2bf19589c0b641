"""Sharded torch models on 8 simulated CPU devices, against the same models on torch's CPU.

Not collected by the main test run (JAX there has one device): `tests/test_sharding.py` runs
this file in a subprocess with `XLA_FLAGS=--xla_force_host_platform_device_count=8`. To run it
by hand:

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest -q -p no:randomly \
      tests/sharded_cases.py

Every case compares numbers with the unsharded torch CPU run and checks where the results
actually are (`sharding_of(t)`, the sharding of a `jax` tensor's array).
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import bridge
from bridge._src.sharding import sharding_of

assert len(jax.devices()) == 8, (
  f"these cases need 8 devices, JAX has {len(jax.devices())}: run them with "
  "XLA_FLAGS=--xla_force_host_platform_device_count=8 (tests/test_sharding.py does)"
)

DEVICES = jax.devices()
MESH = Mesh(np.array(DEVICES).reshape(4, 2), ("data", "model"))
REPLICATED = NamedSharding(MESH, P())
BATCH = NamedSharding(MESH, P("data"))
LR, WEIGHT_DECAY, STEPS = 1e-2, 1e-2, 20
TOL = dict(rtol=1e-4, atol=1e-5)
# extract_jax + optax against torch.optim.AdamW: XLA and torch sum in different orders and
# Adam carries the ~1e-7 gap forward (tests/test_extract_jax_training.py measured < 3e-5).
LOSS_RTOL = 2e-4


def _named(mesh: Mesh, specs: dict[str, P]):
  """A `bridge.shard` rule: the spec listed for a state-dict name, replicated otherwise."""
  return lambda name, t: NamedSharding(mesh, specs.get(name, P()))


def _assert_placed(t: torch.Tensor, sharding: NamedSharding, what: str = "") -> None:
  actual = sharding_of(t)
  assert actual is not None and actual.is_equivalent_to(sharding, t.dim()), (
    f"{what}: placed {actual}, expected {sharding}"
  )


def _assert_state_placed(module: torch.nn.Module, rule) -> None:
  for name, t in module.state_dict().items():
    assert t.device.type == "jax", name
    _assert_placed(t, rule(name, t), name)


def _assert_state_close(actual: torch.nn.Module, expected: torch.nn.Module) -> None:
  for (name, a), (_, e) in zip(actual.state_dict().items(), expected.state_dict().items()):
    torch.testing.assert_close(a.cpu(), e.cpu(), **TOL, msg=lambda m: f"{name}: {m}")


# --- models and data -------------------------------------------------------------------------


def _mlp() -> torch.nn.Module:
  return torch.nn.Sequential(
    torch.nn.Linear(8, 32),
    torch.nn.Tanh(),
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
    torch.nn.Flatten(),
    torch.nn.Linear(4 * 4 * 4, 3),
  )


MODELS = {"mlp": _mlp, "cnn": _cnn}


def _data(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
  g = torch.Generator().manual_seed(1)
  x = torch.randn(16, 8, generator=g) if kind == "mlp" else torch.randn(8, 1, 8, 8, generator=g)
  return x, (x.flatten(1)[:, 0] > 0).long() + (x.flatten(1)[:, 1] > 0).long()


def _adamw(params) -> torch.optim.Optimizer:
  return torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY)


def _train(model, call, x, y, steps: int = STEPS) -> tuple[list[float], torch.Tensor]:
  """`steps` of AdamW on cross entropy; `call` runs the forward (the module, or its compiled
  form). Returns the losses and the last output."""
  opt = _adamw(model.parameters())
  losses = []
  for _ in range(steps):
    opt.zero_grad()
    out = call(x)
    loss = F.cross_entropy(out, y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
  return losses, out


def _cpu_run(kind: str) -> tuple[torch.nn.Module, torch.nn.Module, list[float]]:
  """(a fresh copy of the initial model, the CPU-trained model, its losses)."""
  torch.manual_seed(0)
  model = MODELS[kind]()
  initial = copy.deepcopy(model)
  x, y = _data(kind)
  return initial, model, _train(model, model, x, y)[0]


@pytest.fixture(scope="module", params=list(MODELS))
def cpu_run(request):
  return request.param, *_cpu_run(request.param)


# --- 1. data parallel --------------------------------------------------------------------------


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compile"])
def test_data_parallel_adamw_matches_cpu(cpu_run, compiled):
  kind, initial, cpu_model, cpu_losses = cpu_run
  model = copy.deepcopy(initial)  # the fixture's copy is shared by both cases
  assert bridge.shard(model, REPLICATED) is model
  x, y = _data(kind)
  xs, ys = bridge.shard((x, y), BATCH)
  _assert_placed(xs, BATCH, "x")
  call = bridge.compile(model) if compiled else model

  losses, out = _train(model, call, xs, ys)

  _assert_placed(out, BATCH, "output")  # the batch stays split over "data"

  torch.testing.assert_close(losses, cpu_losses, **TOL)
  assert losses[-1] < losses[0]
  _assert_state_close(model, cpu_model)  # BatchNorm's running statistics included
  _assert_state_placed(model, lambda n, t: REPLICATED)  # still replicated after 20 steps
  for name, p in model.named_parameters():
    assert isinstance(p, torch.nn.Parameter), name


@pytest.mark.parametrize("place", ["device_put", "bridge.shard"])
def test_data_parallel_extract_jax_optax_matches_torch_adamw(place):
  model, _, cpu_losses = _cpu_run("mlp")  # the initial weights, and the CPU run's losses
  params, fn = bridge.extract_jax(model)
  if place == "device_put":
    params = jax.device_put(params, REPLICATED)
  else:
    params = bridge.shard(params, lambda path, a: REPLICATED)
  x, y = _data("mlp")
  xj = bridge.shard(bridge.to_jax(x), BATCH)
  yj = jax.device_put(bridge.to_jax(y.int()), BATCH)  # 64-bit types are off: int32 labels
  assert xj.sharding.is_equivalent_to(BATCH, 2) and yj.sharding.is_equivalent_to(BATCH, 1)

  opt = optax.adamw(LR, weight_decay=WEIGHT_DECAY)  # optax's default weight_decay is 1e-4
  opt_state = opt.init(params)

  def loss_fn(p, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(fn(p, x), y).mean()

  @jax.jit
  def step(p, s, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
    updates, s = opt.update(grads, s, p)
    return optax.apply_updates(p, updates), s, loss, grads

  losses = []
  for _ in range(STEPS):
    params, opt_state, loss, grads = step(params, opt_state, xj, yj)
    losses.append(float(loss))

  np.testing.assert_allclose(losses, cpu_losses, rtol=LOSS_RTOL)
  for name in params:
    assert grads[name].sharding.is_equivalent_to(REPLICATED, grads[name].ndim), name
    assert params[name].sharding.is_equivalent_to(REPLICATED, params[name].ndim), name


# --- 2. tensor parallel ------------------------------------------------------------------------


MEGATRON = {"0.weight": P("model", None), "0.bias": P("model"), "2.weight": P(None, "model")}


def _megatron_mlp() -> torch.nn.Module:
  return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))


class _Attention(torch.nn.Module):
  """Causal self-attention with separate q/k/v/out projections; heads split on "model"."""

  def __init__(self, dim: int = 16, heads: int = 4):
    super().__init__()
    self.heads = heads
    self.q, self.k, self.v = (torch.nn.Linear(dim, dim) for _ in range(3))
    self.out = torch.nn.Linear(dim, dim)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    b, t, d = x.shape
    q, k, v = (
      proj(x).view(b, t, self.heads, d // self.heads).transpose(1, 2)
      for proj in (self.q, self.k, self.v)
    )
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.out(a.transpose(1, 2).reshape(b, t, d))


HEADS = {
  **{f"{n}.weight": P("model", None) for n in "qkv"},
  **{f"{n}.bias": P("model") for n in "qkv"},
  "out.weight": P(None, "model"),
}


class _MHA(torch.nn.Module):
  def __init__(self) -> None:
    super().__init__()
    self.attn = torch.nn.MultiheadAttention(16, 4, batch_first=True)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.attn(x, x, x, need_weights=False)[0]


MHA = {
  "attn.in_proj_weight": P("model", None),
  "attn.in_proj_bias": P("model"),
  "attn.out_proj.weight": P(None, "model"),
}

TENSOR_PARALLEL = {  # model, its specs, input shape, whether the output keeps the batch split
  "megatron_mlp": (_megatron_mlp, MEGATRON, (8, 16), True),
  "attention_heads": (_Attention, HEADS, (4, 6, 16), True),
  # MHA folds batch and heads into one dimension ((T, B * heads, d) views): GSPMD then
  # gives a replicated output (still correct, and computed on the mesh)
  "multihead_attention": (_MHA, MHA, (4, 6, 16), False),
}


@pytest.mark.parametrize("name", list(TENSOR_PARALLEL))
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compile"])
def test_tensor_parallel_forward_backward_and_step(name, compiled):
  make, specs, shape, keeps_batch = TENSOR_PARALLEL[name]
  torch.manual_seed(0)
  ref = make()
  model = copy.deepcopy(ref)
  rule = _named(MESH, specs)
  bridge.shard(model, rule)
  _assert_state_placed(model, rule)
  x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
  xs = bridge.shard(x, BATCH)
  call = bridge.compile(model) if compiled else model

  out = call(xs)
  expected = ref(x)
  torch.testing.assert_close(out.cpu(), expected, **TOL)
  _assert_placed(out, BATCH if keeps_batch else REPLICATED, "output")
  out.pow(2).mean().backward()
  expected.pow(2).mean().backward()
  for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
    assert p.grad.device.type == "jax", n
    assert sharding_of(p.grad).device_set == set(DEVICES), n  # computed on the mesh
    torch.testing.assert_close(p.grad.cpu(), q.grad, **TOL, msg=lambda m: f"{n}.grad: {m}")

  # SGD, not Adam: the key bias's true gradient is 0 (softmax ignores a constant shift of the
  # scores), and Adam would amplify float noise into a full-size step
  opt, opt_ref = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, ref))
  for _ in range(2):
    opt.step()
    opt_ref.step()
  _assert_state_placed(model, rule)  # the layout survives the optimizer's in-place updates
  _assert_state_close(model, ref)
  torch.testing.assert_close(call(xs).cpu(), ref(x), **TOL)


def test_extract_jax_of_a_sharded_module_keeps_its_layout_under_jit():
  torch.manual_seed(0)
  ref = _megatron_mlp()
  model = bridge.shard(copy.deepcopy(ref), _named(MESH, MEGATRON))
  params, fn = bridge.extract_jax(model)
  for name, a in params.items():
    assert a.sharding.is_equivalent_to(NamedSharding(MESH, MEGATRON.get(name, P())), a.ndim), name
  x = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
  loss, grads = jax.jit(jax.value_and_grad(lambda p, x: jnp.mean(fn(p, x) ** 2)))(
    params, jax.device_put(bridge.to_jax(x), BATCH)
  )
  expected = ref(x).pow(2).mean()
  expected.backward()
  torch.testing.assert_close(float(loss), expected.item(), **TOL)
  for name, p in ref.named_parameters():
    assert grads[name].sharding.device_set == set(DEVICES), name
    torch.testing.assert_close(
      bridge.to_torch(grads[name]), p.grad, **TOL, msg=lambda m: f"{name}: {m}"
    )


# --- 3. call_torch under jax.jit, bridge.constrain ---------------------------------------------


def test_call_torch_under_jit_with_in_and_out_shardings():
  torch.manual_seed(0)
  mlp = _megatron_mlp()
  hidden = NamedSharding(MESH, P("data", "model"))

  def block(t):
    h = bridge.constrain(mlp[1](mlp[0](t)), hidden)  # the Megatron layout of the hidden layer
    return mlp[2](h)

  x = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
  f = jax.jit(
    lambda a: bridge.call_torch(block, a),
    in_shardings=BATCH,
    out_shardings=NamedSharding(MESH, P("data", "model")),
  )
  xs = jax.device_put(bridge.to_jax(x), BATCH)
  out = f(xs)
  assert out.sharding.is_equivalent_to(NamedSharding(MESH, P("data", "model")), 2)
  torch.testing.assert_close(bridge.to_torch(out), mlp(x), **TOL)
  text = f.lower(xs).as_text()
  assert "sharding_constraint" in text and '[{"data"}, {"model"}]' in text, text


def test_constrain_under_jit_sets_the_output_sharding_and_constrains_the_gradient():
  target = NamedSharding(MESH, P("data", "model"))
  fwd = jax.jit(bridge.jax_view(lambda t: bridge.constrain(torch.sin(t) * 2, target)))
  a = jax.device_put(jnp.linspace(-1, 1, 64, dtype=jnp.float32).reshape(8, 8), BATCH)
  out = fwd(a)
  assert out.sharding.is_equivalent_to(target, 2), out.sharding
  np.testing.assert_allclose(np.asarray(out), np.sin(np.asarray(a)) * 2, rtol=1e-6)

  loss = bridge.jax_view(lambda t: bridge.constrain(torch.sin(t), target).sum())
  grad = jax.jit(jax.grad(loss))
  g = grad(a)
  np.testing.assert_allclose(np.asarray(g), np.cos(np.asarray(a)), rtol=1e-6)
  assert "sharding_constraint" in grad.lower(a).as_text()


def test_constrain_eager_moves_the_data_and_its_gradient():
  target = NamedSharding(MESH, P(None, "model"))
  x = torch.randn(8, 4)
  t = bridge.shard(x, BATCH).requires_grad_(True)
  c = bridge.constrain(t, target)
  _assert_placed(c, target, "constrained")
  _assert_placed(t, BATCH, "input")  # a new tensor: the input keeps its own layout
  (c * c).sum().backward()
  _assert_placed(t.grad, target, "grad")  # the gradient is constrained the same way
  torch.testing.assert_close(t.grad.cpu(), 2 * x)


def test_constrain_inside_bridge_compile():
  class Net(torch.nn.Module):
    def __init__(self) -> None:
      super().__init__()
      self.mlp = _megatron_mlp()

    def forward(self, t):
      h = self.mlp[1](self.mlp[0](t))
      return self.mlp[2](bridge.constrain(h, NamedSharding(MESH, P("data", "model"))))

  torch.manual_seed(0)
  net = Net()
  ref = copy.deepcopy(net.mlp)  # the same layers without the constraint (CPU tensors)
  bridge.shard(net, REPLICATED)
  x = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
  out = bridge.compile(net)(bridge.shard(x, BATCH))
  torch.testing.assert_close(out.cpu(), ref(x), **TOL)
  out.sum().backward()
  ref(x).sum().backward()
  for (n, p), (_, q) in zip(net.named_parameters(), ref.named_parameters()):
    torch.testing.assert_close(p.grad.cpu(), q.grad, **TOL, msg=lambda m: f"{n}.grad: {m}")


# --- 4. checkpoints ---------------------------------------------------------------------------


OTHER_MESHES = {
  "2x4": lambda: Mesh(np.array(DEVICES).reshape(2, 4), ("data", "model")),
  "8x1": lambda: Mesh(np.array(DEVICES).reshape(8, 1), ("data", "model")),
  "reversed_4x2": lambda: Mesh(np.array(DEVICES[::-1]).reshape(4, 2), ("data", "model")),
}


@pytest.mark.parametrize("other", list(OTHER_MESHES))
def test_checkpoint_saved_gathered_restores_onto_another_mesh(tmp_path, other):
  torch.manual_seed(0)
  model = bridge.shard(_megatron_mlp(), _named(MESH, MEGATRON))
  x = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
  expected = model(bridge.shard(x, BATCH)).cpu()

  path = tmp_path / "model.pt"
  gathered = {k: v.cpu() for k, v in model.state_dict().items()}
  assert all(v.device.type == "cpu" for v in gathered.values())
  torch.save(gathered, path)

  restored = _megatron_mlp()
  restored.load_state_dict(torch.load(path, weights_only=True))
  mesh = OTHER_MESHES[other]()
  rule = _named(mesh, MEGATRON)
  bridge.shard(restored, rule)
  _assert_state_placed(restored, rule)
  _assert_state_close(restored, model)
  out = restored(bridge.shard(x, NamedSharding(mesh, P("data"))))
  torch.testing.assert_close(out.cpu(), expected, **TOL)


def test_sharded_state_dict_saves_directly_and_loads_into_a_sharded_module(tmp_path):
  torch.manual_seed(0)
  model = bridge.shard(_mlp(), REPLICATED)
  path = tmp_path / "direct.pt"
  torch.save(model.state_dict(), path)  # `jax` tensors are stored as CPU tensors
  state = torch.load(path, weights_only=True)
  assert all(v.device.type == "cpu" for v in state.values())

  mesh = OTHER_MESHES["2x4"]()
  rule = _named(mesh, {"0.weight": P("model", None), "2.weight": P("model", None)})
  target = bridge.shard(_mlp(), rule)
  target.load_state_dict(state)  # copied in place: the target's layout stays
  _assert_state_placed(target, rule)
  _assert_state_close(target, model)


@pytest.mark.parametrize("other", ["2x4", "reversed_4x2"])
def test_orbax_checkpoint_of_sharded_arrays_restores_onto_another_mesh(tmp_path, other):
  """Each device writes its own shards (no gather); restoring lays them out for the new mesh."""
  ocp = pytest.importorskip("orbax.checkpoint")
  torch.manual_seed(0)
  model = bridge.shard(_megatron_mlp(), _named(MESH, MEGATRON))
  x = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
  expected = model(bridge.shard(x, BATCH)).cpu()

  state = {k: bridge.jax_view(v) for k, v in model.state_dict().items()}  # sharded, no copy
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "ckpt", state)
  checkpointer.wait_until_finished()

  mesh = OTHER_MESHES[other]()
  rule = _named(mesh, MEGATRON)
  target = {
    k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=rule(k, v)) for k, v in state.items()
  }
  loaded = checkpointer.restore(tmp_path / "ckpt", target)
  for k, v in loaded.items():
    assert v.sharding.is_equivalent_to(rule(k, v), v.ndim), k

  restored = _megatron_mlp()
  restored.load_state_dict(bridge.torch_view(loaded), assign=True)  # the arrays as they are
  _assert_state_placed(restored, rule)
  _assert_state_close(restored, model)
  out = restored(bridge.shard(x, NamedSharding(mesh, P("data"))))
  torch.testing.assert_close(out.cpu(), expected, **TOL)


# --- 5. bad input -------------------------------------------------------------------------------


def test_a_shape_the_mesh_does_not_divide_names_the_tensor_and_the_mesh():
  model = torch.nn.Sequential(torch.nn.Linear(8, 6))
  with pytest.raises(bridge.ShardingError) as info:
    bridge.shard(model, _named(MESH, {"0.weight": P("data", None)}))
  message = str(info.value)
  for part in ("Sequential.0.weight", "(6, 8)", "dimension 0", "4 ways", "data=4, model=2"):
    assert part in message, message
  assert all(t.device.type == "cpu" for t in model.state_dict().values())  # nothing moved

  with pytest.raises(bridge.ShardingError, match=r"Linear\.bias.*\(6,\).*4 ways.*data=4, model=2"):
    bridge.shard(torch.nn.Linear(8, 6), lambda name, t: BATCH if name == "bias" else None)
  with pytest.raises(bridge.ShardingError, match=r"\['w'\].*\(5, 2\).*2 ways.*model"):
    bridge.shard({"w": torch.ones(5, 2)}, NamedSharding(MESH, P("model")))
  with pytest.raises(bridge.ShardingError, match=r"8 ways over mesh axis dataxmodel"):
    bridge.shard(torch.ones(4, 3), NamedSharding(MESH, P(("data", "model"))))
  with pytest.raises(bridge.ShardingError, match=r"bridge\.constrain.*\(6, 2\).*4 ways"):
    jax.jit(bridge.jax_view(lambda t: bridge.constrain(t, BATCH)))(jnp.ones((6, 2)))


def test_tensors_on_two_meshes_in_one_op_list_both_placements():
  half = Mesh(np.array(DEVICES[:4]), ("x",))
  a = bridge.shard(torch.randn(8, 4), BATCH)
  b = bridge.shard(torch.randn(4, 3), NamedSharding(half, P()))
  with pytest.raises(bridge.DeviceMismatchError) as info:
    torch.mm(a, b)
  message = str(info.value)
  assert "aten.mm" in message, message
  assert (
    "argument 0: shape (8, 4), NamedSharding(mesh {data=4, model=2}, spec P('data',)), "
    "devices [0, 1, 2, 3, 4, 5, 6, 7]"
  ) in message, message
  assert (
    "argument 1: shape (4, 3), NamedSharding(mesh {x=4}, spec P()), devices [0, 1, 2, 3]"
  ) in message, message

  # the same devices in another mesh shape are one device set: GSPMD reshards
  c = bridge.shard(torch.randn(8, 4), NamedSharding(OTHER_MESHES["2x4"](), P("data")))
  torch.testing.assert_close((a + c).cpu(), a.cpu() + c.cpu())


# --- known gaps --------------------------------------------------------------------------------


def test_like_factories_keep_the_argument_sharding():
  t = bridge.shard(torch.randn(8, 4), BATCH)
  _assert_placed(torch.zeros_like(t), BATCH, "zeros_like")


def test_every_gradient_and_optimizer_state_of_a_replicated_model_is_on_the_mesh():
  lin = bridge.shard(torch.nn.Linear(4, 2), REPLICATED)
  lin(bridge.shard(torch.randn(8, 4), BATCH)).sum().backward()
  opt = _adamw(lin.parameters())
  opt.step()
  for name, p in lin.named_parameters():
    _assert_placed(p.grad, REPLICATED, f"{name}.grad")
    for key in ("exp_avg", "exp_avg_sq"):
      _assert_placed(opt.state[p][key], REPLICATED, f"{name} {key}")


def test_bridge_compile_with_tensors_on_two_meshes_raises_device_mismatch_error():
  model = bridge.shard(_megatron_mlp(), _named(MESH, MEGATRON))
  half = NamedSharding(Mesh(np.array(DEVICES[:4]), ("x",)), P("x"))
  with pytest.raises(bridge.DeviceMismatchError, match=r"0\.weight"):
    bridge.compile(model)(bridge.shard(torch.ones(8, 16), half))


def test_call_jax_of_tensors_on_two_meshes_names_both_arguments():
  # (it was JAX's ValueError naming the bridge's internal `arrays[0]`, `arrays[1]`)
  half = Mesh(np.array(DEVICES[:4]), ("x",))
  a = bridge.shard(torch.randn(8, 4), BATCH)
  b = bridge.shard(torch.randn(8, 4), NamedSharding(half, P("x")))
  with pytest.raises(bridge.DeviceMismatchError) as info:
    bridge.call_jax(lambda x, y: x + y, a, b)
  message = str(info.value)
  assert "`bridge.call_jax`" in message, message
  assert "args[0]: shape (8, 4)" in message and "devices [0, 1, 2, 3, 4, 5, 6, 7]" in message
  assert "args[1]: shape (8, 4), NamedSharding(mesh {x=4}" in message, message


def test_bridge_compile_placement_error_names_the_argument_not_the_key():
  # a replicated module called with a tensor on one device: the argument is what is misplaced
  model = bridge.shard(torch.nn.Linear(4, 4), REPLICATED)
  with pytest.raises(bridge.DeviceMismatchError) as info:
    bridge.compile(model)(torch.ones(2, 4).to("jax"))
  message = str(info.value)
  assert "argument 0: shape (2, 4), SingleDeviceSharding" in message, message
  assert "random key" not in message, message
