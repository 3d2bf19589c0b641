"""`call_torch` / `jax_view(torch_fn)`: torch code traced into JAX programs, checked against torch.

Every case compares with torch eager on the CPU: forward values, and gradients
(first and second order) against torch autograd.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bridge

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _fresh_rng():
  """Each test draws the same inputs whichever tests ran before it in its xdist worker (a
  float32 gradient compared at 2e-5 once failed on the inputs of another test order)."""
  global RNG
  RNG = np.random.default_rng(0)


def _np(shape, dtype=np.float32):
  return RNG.standard_normal(shape).astype(dtype)


def _assert_close(actual, expected, **kw):
  torch.testing.assert_close(torch.from_numpy(np.array(actual)), expected, **kw)


# --- functions: value and gradients under every transformation ------------------------------


def _mlp_fn(x, w1, w2):
  return (torch.tanh(x @ w1) @ w2).pow(2).sum()


def _softmax_attention(x, w1, w2):
  q = x @ w1
  a = torch.softmax(q @ q.transpose(-1, -2) / 4.0, dim=-1)
  return F.layer_norm(a @ x @ w2, (w2.shape[-1],)).sin().mean()


def _views_and_inplace(x, w1, w2):
  y = x.clone()
  y[:, 0].mul_(2.0)  # in-place through a view
  y.t()[1:].add_(1.0)
  z = torch.zeros_like(y)  # a factory on the jax device
  z += y * w1[: y.shape[0], : y.shape[1]]
  return (z @ w2[: z.shape[1]]).exp().sum() + torch.arange(3.0).sum()  # a CPU constant


FUNCTIONS = {"mlp": _mlp_fn, "attention": _softmax_attention, "views_inplace": _views_and_inplace}
SHAPES = ((4, 8), (8, 8), (8, 3))


def _inputs():
  return [_np(s) for s in SHAPES]


def _torch_grads(fn, arrays, create_graph=False):
  ts = [torch.tensor(a, requires_grad=True) for a in arrays]
  out = fn(*ts)
  grads = torch.autograd.grad(out, ts, create_graph=create_graph)
  return out, ts, grads


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@pytest.mark.parametrize(
  "transform",
  ["eager", "jit", "grad", "jit_grad", "value_and_grad", "jacrev", "jacfwd", "checkpoint"],
)
def test_function_matches_torch(name, transform):
  fn = FUNCTIONS[name]
  arrays = _inputs()
  out, ts, grads = _torch_grads(fn, arrays)
  f = bridge.jax_view(fn)
  argnums = (0, 1, 2)
  if transform == "eager":
    _assert_close(f(*arrays), out.detach())
  elif transform == "jit":
    _assert_close(jax.jit(f)(*arrays), out.detach())
  elif transform in ("grad", "jit_grad", "jacrev", "jacfwd", "checkpoint"):
    g = {
      "grad": jax.grad(f, argnums),
      "jit_grad": jax.jit(jax.grad(f, argnums)),
      "jacrev": jax.jacrev(f, argnums),
      "jacfwd": jax.jacfwd(f, argnums),
      "checkpoint": jax.grad(jax.checkpoint(f), argnums),
    }[transform](*arrays)
    for a, b in zip(g, grads):
      _assert_close(a, b, rtol=2e-5, atol=2e-5)
  elif transform == "value_and_grad":
    v, g = jax.value_and_grad(f, argnums)(*arrays)
    _assert_close(v, out.detach())
    for a, b in zip(g, grads):
      _assert_close(a, b, rtol=2e-5, atol=2e-5)


def test_second_order_matches_torch():
  x = _np((5,)).astype(np.float64)
  f = lambda t: (t.sin() * t.exp()).sum() + (t**3).prod()
  with jax.enable_x64(True):
    h = jax.jit(jax.hessian(bridge.jax_view(f)))(x)
  expected = torch.autograd.functional.hessian(f, torch.tensor(x))
  _assert_close(h, expected)
  assert h.dtype == np.float64


def test_per_example_gradients_with_vmap():
  w = _np((6, 3))
  xs = _np((10, 6))
  loss = lambda w, x: torch.log1p((x @ w).pow(2)).sum()
  per_example = jax.jit(jax.vmap(jax.grad(bridge.jax_view(loss)), in_axes=(None, 0)))(w, xs)
  assert per_example.shape == (10, 6, 3)
  for i in (0, 7):
    wt = torch.tensor(w, requires_grad=True)
    loss(wt, torch.tensor(xs[i])).backward()
    _assert_close(per_example[i], wt.grad)


def test_vmap_sees_per_example_shapes():
  seen = []

  def f(x):
    seen.append(tuple(x.shape))
    return x.sum(dim=-1) * x.shape[0]

  out = jax.vmap(bridge.jax_view(f))(jnp.ones((5, 3, 4)))
  assert seen == [(3, 4)]
  np.testing.assert_array_equal(out, np.full((5, 3), 12.0))


def test_scan_body():
  w = _np((4, 4)) * 0.3
  step = bridge.jax_view(lambda h, x, w: torch.tanh(h @ w + x))
  xs = _np((7, 2, 4))

  def body(h, x):
    h = step(h, x, w)
    return h, h.sum()

  h, sums = jax.lax.scan(body, jnp.zeros((2, 4)), xs)
  ht = torch.zeros(2, 4)
  for x in xs:
    ht = torch.tanh(ht @ torch.tensor(w) + torch.tensor(x))
  _assert_close(h, ht)
  assert sums.shape == (7,)


def test_jit_static_arguments_and_donation():
  calls = []

  def f(x, power, *, axis):
    calls.append((power, axis))
    return x.pow(power).sum(dim=axis)

  g = jax.jit(bridge.jax_view(f), static_argnums=1, static_argnames="axis", donate_argnums=0)
  x = _np((3, 4))
  _assert_close(g(jnp.asarray(x), 2, axis=1), torch.tensor(x).pow(2).sum(1))
  _assert_close(g(jnp.asarray(x), 3, axis=0), torch.tensor(x).pow(3).sum(0))
  g(jnp.asarray(x), 3, axis=0)
  assert calls == [(2, 1), (3, 0)]  # traced once per static value


def test_retraces_only_when_shapes_change():
  traces = []

  def f(x):
    traces.append(tuple(x.shape))
    return torch.relu(x) * 2

  g = jax.jit(bridge.jax_view(f))
  for shape in [(2, 3), (2, 3), (2, 3), (4, 3), (2, 3), (4, 3)]:
    g(jnp.ones(shape))
  assert traces == [(2, 3), (4, 3)]


# --- inside fn: autograd, no_grad, factories --------------------------------------------------


def test_torch_autograd_inside_traced_function():
  def f(x):
    x = x.detach().requires_grad_()
    y = (x.sin() * x).sum()
    (g,) = torch.autograd.grad(y, x, create_graph=True)
    return g

  x = _np((5,))
  xt = torch.tensor(x, requires_grad=True)
  expected = torch.autograd.grad((xt.sin() * xt).sum(), xt)[0]
  _assert_close(jax.jit(bridge.jax_view(f))(x), expected)


def test_backward_inside_traced_function():
  def f(x, w):
    w = w.detach().requires_grad_()
    ((x @ w) ** 2).sum().backward()
    return w.grad

  x, w = _np((3, 4)), _np((4, 2))
  wt = torch.tensor(w, requires_grad=True)
  ((torch.tensor(x) @ wt) ** 2).sum().backward()
  _assert_close(jax.jit(bridge.jax_view(f))(x, w), wt.grad)


def test_no_grad_and_factories_become_constants():
  def f(x):
    with torch.no_grad():
      mask = torch.ones(x.shape, dtype=torch.bool).tril()
    eye = torch.eye(x.shape[0])
    return torch.where(mask, x, 0.0) + eye + torch.randn(0).sum()

  x = _np((3, 3))
  expected = torch.tensor(x).tril() + torch.eye(3)
  _assert_close(jax.jit(bridge.jax_view(f))(x), expected)


def _no_grad_functional(w):
  with torch.no_grad():
    s = w * 2
  return (w * s).sum()


def _no_grad_view(w):
  with torch.no_grad():
    v = w[1:]
  return (w[1:] * v).sum() + w.sum()


def _no_grad_in_place(w):
  h = w * 1.0
  with torch.no_grad():
    h.mul_(2)
  return (h * h).sum()


def _no_grad_in_place_on_input(w):
  with torch.no_grad():
    w.mul_(2)
  return (w * w).sum()


def _detached_alias_written(w):
  w.detach().clamp_(max=2.0)  # as F.embedding(max_norm=...) renormalizes its weight
  return (w * w).sum()


@pytest.mark.parametrize(
  "fn",
  [
    lambda w: (w * w.detach()).sum(),
    lambda w: (w * w.data).sum(),
    lambda w: (w * w.detach()[None][0]).sum(),
    lambda w: (w + (w.round() - w).detach()).pow(2).sum(),  # the straight-through estimator
    _no_grad_functional,
    _no_grad_view,
    _no_grad_in_place,
    _no_grad_in_place_on_input,
    _detached_alias_written,
  ],
  ids=[
    "detach",
    "data",
    "view_of_detached",
    "straight_through",
    "no_grad",
    "no_grad_view",
    "no_grad_in_place",
    "no_grad_in_place_on_input",
    "detached_alias_written",
  ],
)
def test_detach_and_no_grad_are_constants_for_jax_derivatives(fn):
  """torch gives no gradient through `detach()` and `no_grad()` blocks, and an unrecorded
  in-place update leaves a tensor its own gradient: `jax.grad` (eager and jitted) agrees."""
  w0 = [1.0, 3.0, -0.5]
  wt = torch.tensor(w0, requires_grad=True)
  fn(wt).backward()
  for grad in (jax.grad(bridge.jax_view(fn)), jax.jit(jax.grad(bridge.jax_view(fn)))):
    _assert_close(grad(jnp.asarray(w0)), wt.grad)


class _Square(torch.autograd.Function):
  @staticmethod
  def forward(ctx, x):
    ctx.save_for_backward(x)
    return x * x

  @staticmethod
  def backward(ctx, g):
    (x,) = ctx.saved_tensors
    return 2 * x * g


@pytest.mark.parametrize(
  "fn",
  [
    lambda w: _Square.apply(w).sum(),
    lambda w: torch.utils.checkpoint.checkpoint(lambda t: (t * t).sum(), w, use_reentrant=True),
  ],
  ids=["autograd_function", "reentrant_checkpoint"],
)
def test_a_custom_functions_forward_is_not_a_no_grad_block(fn):
  """torch runs an `autograd.Function`'s forward with grad mode off (a reentrant checkpoint
  is one): that is not a `no_grad()` block, and JAX differentiates the traced forward."""
  import warnings

  w0 = [1.0, 3.0]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the checkpoint's "none of the inputs require grad"
    for grad in (jax.grad(bridge.jax_view(fn)), jax.jit(jax.grad(bridge.jax_view(fn)))):
      _assert_close(grad(jnp.asarray(w0)), torch.tensor([2.0, 6.0]))
  model = torch.nn.Linear(2, 2)
  wrapped = torch.nn.Sequential(model, _SquareModule())
  ref = copy.deepcopy(wrapped)
  x = torch.randn(3, 2)
  bridge.compile(wrapped)(x).sum().backward()
  ref(x).sum().backward()
  torch.testing.assert_close(wrapped[0].weight.grad, ref[0].weight.grad)


class _SquareModule(torch.nn.Module):
  def forward(self, x):
    return _Square.apply(x)


def test_jax_grad_ignores_an_outer_no_grad():
  """The torch grad mode a traced function is called under is not a `no_grad()` block of its
  own: JAX still differentiates it (only blocks inside the function cut gradients)."""
  f = bridge.jax_view(lambda w: (w * w).sum())
  with torch.no_grad():
    g = jax.grad(f)(jnp.asarray([1.0, 3.0]))
  np.testing.assert_allclose(np.asarray(g), [2.0, 6.0])


# --- outputs --------------------------------------------------------------------------------


@dataclasses.dataclass
class Out:
  loss: torch.Tensor
  extra: dict


def test_output_pytrees_come_back_as_arrays():
  def f(x):
    return Out(loss=x.sum(), extra={"max": torch.max(x, dim=0), "n": 3, "none": None})

  out = jax.jit(lambda x: bridge.call_torch(f, x).extra["max"][1])(jnp.arange(6.0).reshape(2, 3))
  np.testing.assert_array_equal(out, [1, 1, 1])
  out = bridge.call_torch(f, jnp.ones((2, 3)))
  assert isinstance(out, Out) and isinstance(out.loss, jax.Array)
  values, indices = out.extra["max"]
  assert isinstance(values, jax.Array) and out.extra["n"] == 3 and out.extra["none"] is None


@dataclasses.dataclass
class MappingOut(dict):
  """Like transformers' `ModelOutput`: a dataclass that is also a dict of its fields."""

  logits: torch.Tensor = None

  def __post_init__(self):
    self["logits"] = self.logits


def test_mapping_dataclass_outputs_agree():
  out = bridge.call_torch(lambda x: MappingOut(logits=x * 2), jnp.ones(2))
  assert isinstance(out, MappingOut) and isinstance(out.logits, jax.Array)
  assert out["logits"] is out.logits


def test_model_output_mapping():
  transformers = pytest.importorskip("transformers")
  ModelOutput = transformers.utils.ModelOutput

  @dataclasses.dataclass
  class MyOutput(ModelOutput):
    logits: torch.Tensor = None
    hidden: torch.Tensor = None

  out = bridge.call_torch(lambda x: MyOutput(logits=x * 2, hidden=x), jnp.ones(2))
  assert isinstance(out.logits, jax.Array)
  assert isinstance(out["logits"], jax.Array)  # the mapping view agrees with the attributes
  np.testing.assert_array_equal(out["logits"], [2.0, 2.0])


def test_dtypes_are_kept_with_x64():
  def f(x, i):
    return x.double() * 2, i + 1, (i * 1.5), x.to(torch.bfloat16)

  with jax.enable_x64(True):
    outs = jax.jit(bridge.jax_view(f))(jnp.ones(2, jnp.float32), jnp.arange(2, dtype=jnp.int64))
  assert [str(o.dtype) for o in outs] == ["float64", "int64", "float32", "bfloat16"]


def test_32_bit_programs_hold_int64_as_proven_int32():
  # JAX's x64 is off here: a jitted program cannot hold 64-bit values. torch's int64 values
  # are held as int32 where the bridge proves they fit, else refused; a value proven exact
  # (positions from `arange` of a known length) is no cause for a warning.
  f = lambda x: x + torch.arange(3)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    out = jax.jit(bridge.jax_view(f))(jnp.ones(3, jnp.float32))
  np.testing.assert_array_equal(out, [1.0, 2.0, 3.0])
  # Outside `jax.jit`, 64-bit values stay 64-bit even with x64 off.
  i = bridge.call_torch(lambda x: x.argmax().reshape(1) + 0, jnp.ones(3))
  assert i.dtype == np.int64


# --- modules --------------------------------------------------------------------------------


class Net(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.fc1 = torch.nn.Linear(4, 8)
    self.fc2 = torch.nn.Linear(8, 2)

  def forward(self, x, *, scale=1.0):
    return self.fc2(F.gelu(self.fc1(x))) * scale

  def embed(self, x):
    return self.fc1(x)


def test_module_and_bound_method():
  torch.manual_seed(0)
  net = Net()
  x = _np((3, 4))
  _assert_close(jax.jit(bridge.jax_view(net))(x), net(torch.tensor(x)).detach())
  _assert_close(bridge.call_torch(net, x, scale=2.0), net(torch.tensor(x), scale=2.0).detach())
  _assert_close(jax.jit(bridge.jax_view(net.embed))(x), net.embed(torch.tensor(x)).detach())


def test_module_on_jax_device():
  torch.manual_seed(0)
  net = Net()
  x = _np((3, 4))
  expected = net(torch.tensor(x)).detach()
  net.to("jax")
  _assert_close(jax.jit(bridge.jax_view(net))(x), expected)


def test_extract_jax_gradients_match_torch():
  torch.manual_seed(0)
  net = Net()
  params, fn = bridge.extract_jax(net)
  assert sorted(params) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
  x = _np((5, 4))
  loss = lambda p, x: (fn(p, x) ** 2).mean()
  grads = jax.jit(jax.grad(loss))(params, x)
  (net(torch.tensor(x)) ** 2).mean().backward()
  for name, p in net.named_parameters():
    _assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-6)


def test_extract_jax_subset_of_params_and_tied_weights():
  class Tied(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.emb = torch.nn.Embedding(5, 3)
      self.out = torch.nn.Linear(3, 5, bias=False)
      self.out.weight = self.emb.weight

    def forward(self, i):
      return self.out(self.emb(i))

  torch.manual_seed(0)
  m = Tied()
  params, fn = bridge.extract_jax(m)
  assert sorted(params) == ["emb.weight"]  # tied: once
  i = np.array([0, 3, 4], dtype=np.int32)
  g = jax.grad(lambda p: fn(p, i).sum())(params)
  m(torch.tensor(i, dtype=torch.long)).sum().backward()
  _assert_close(g["emb.weight"], m.emb.weight.grad)
  with pytest.raises(bridge.BridgeError, match="no parameter or buffer named 'emb.wieght'"):
    fn({"emb.wieght": params["emb.weight"]}, i)
  trained = {"emb.weight": params["emb.weight"] + 1.0}
  m.load_state_dict(bridge.torch_view(trained), strict=False)  # a tied module: strict=False
  _assert_close(trained["emb.weight"], m.out.weight.detach())


def test_batchnorm_state():
  torch.manual_seed(0)
  bn = torch.nn.BatchNorm1d(3)
  x = _np((6, 3))
  params, fn = bridge.extract_jax(bn, return_state=True)
  floats = {k: v for k, v in params.items() if k != "num_batches_tracked"}
  out, new = jax.jit(fn)(floats, x)
  ref = torch.nn.BatchNorm1d(3)
  expected = ref(torch.tensor(x))
  _assert_close(out, expected.detach())
  _assert_close(new["running_mean"], ref.running_mean)
  _assert_close(new["running_var"], ref.running_var)
  # Eager call_torch writes buffer updates back into the module, as torch does.
  bn2 = torch.nn.BatchNorm1d(3)
  bridge.call_torch(bn2, x)
  torch.testing.assert_close(bn2.running_mean, ref.running_mean)
  assert int(bn2.num_batches_tracked) == 1
  # Under jit they cannot be written back: a warning says so.
  with pytest.warns(UserWarning, match="not written back"):
    jax.jit(bridge.jax_view(torch.nn.BatchNorm1d(3)))(x)


# --- nesting with call_jax ------------------------------------------------------------------


def test_call_jax_inside_call_torch():
  def torch_fn(x):
    y = bridge.call_jax(jnp.sin, x * 2)  # x is a jax-device tensor holding a tracer
    return (y * x).sum()

  x = _np((4,))
  g = jax.jit(jax.grad(bridge.jax_view(torch_fn)))(x)
  xt = torch.tensor(x)
  _assert_close(g, 2 * torch.cos(2 * xt) * xt + torch.sin(2 * xt))


def test_call_torch_inside_call_jax():
  def jax_fn(x):
    return jnp.sum(bridge.call_torch(lambda t: torch.sigmoid(t) * t, x) ** 2)

  xt = torch.randn(5, requires_grad=True)
  out = bridge.call_jax(jax_fn, xt)
  out.backward()
  x2 = xt.detach().clone().requires_grad_()
  ((torch.sigmoid(x2) * x2) ** 2).sum().backward()
  torch.testing.assert_close(out, ((torch.sigmoid(x2) * x2) ** 2).sum().detach())
  torch.testing.assert_close(xt.grad, x2.grad)


# --- errors in torch terms ------------------------------------------------------------------


def _branchy(x):
  if x.sum() > 0:  # data-dependent Python control flow
    return x
  return -x


@pytest.mark.parametrize(
  "what,fn",
  [
    ("if", _branchy),
    ("item", lambda x: x * x.max().item()),
    ("tolist", lambda x: torch.tensor(x.tolist())),
    ("bool", lambda x: x * bool(x[0])),
  ],
)
def test_data_dependent_control_flow_names_the_torch_line(what, fn):
  with pytest.raises(bridge.TracedValueError) as info:
    jax.jit(bridge.jax_view(fn))(jnp.ones(3))
  message = str(info.value)
  assert "test_call_torch.py" in message and "torch.where" in message and "static" in message
  # Outside a staged program (eager, or an eager jax.grad) the value is known.
  bridge.call_torch(fn, jnp.ones(3))
  jax.grad(lambda x: bridge.call_torch(fn, x).sum())(jnp.ones(3))


def test_data_dependent_control_flow_line_is_the_if():
  with pytest.raises(bridge.TracedValueError, match=r"if x\.sum\(\) > 0"):
    jax.jit(bridge.jax_view(_branchy))(jnp.ones(3))


@pytest.mark.parametrize(
  "fn",
  [
    lambda x: torch.nonzero(x),
    lambda x: torch.masked_select(x, x > 0),  # a lowering run on concrete values only
    lambda x: x[x > 0],
    lambda x: torch.unique(x),
  ],
  ids=["nonzero", "masked_select", "mask_index", "unique"],
)
def test_value_dependent_shape_is_explained(fn):
  with pytest.raises(bridge.TracedValueError, match="result's shape depends on tensor values"):
    jax.jit(bridge.jax_view(fn))(jnp.ones(3))


def test_module_leaking_a_traced_tensor():
  class Leaky(torch.nn.Module):
    def forward(self, x):
      self.last = x * 2
      return x + 1

  with pytest.raises(bridge.LeakedTracerError, match="`last`"):
    jax.jit(bridge.jax_view(Leaky()))(jnp.ones(3))


def test_leaked_tracer_used_later():
  kept = []

  def f(x):
    kept.append(x * 2)
    return x

  jax.jit(bridge.jax_view(f))(jnp.ones(3))
  with pytest.raises(bridge.LeakedTracerError, match="kept and used after"):
    kept[0] + 1


def test_random_ops_need_a_key_under_jit():
  drop = lambda x: F.dropout(x, 0.5)
  with pytest.raises(bridge.BridgeError, match="bridge.rng_key"):
    jax.jit(bridge.jax_view(drop))(jnp.ones(8))

  @jax.jit
  def f(x, key):
    with bridge.rng_key(key):
      return bridge.call_torch(drop, x)

  a, b, c = (f(jnp.ones(64), jax.random.key(k)) for k in (0, 1, 0))
  assert not np.array_equal(a, b) and np.array_equal(a, c)
  assert set(np.unique(np.asarray(a)).tolist()) <= {0.0, 2.0}
  # Eagerly, the jax device's generator is used: fresh numbers each call.
  d, e = bridge.call_torch(drop, jnp.ones(64)), bridge.call_torch(drop, jnp.ones(64))
  assert not np.array_equal(d, e)


def test_random_numbers_drawn_on_the_cpu_while_traced_are_said_to_be_constants():
  """`torch.rand(n)` makes a CPU tensor: drawn by torch's CPU kernel as the program is traced,
  the same numbers come back from every call. Said, with what to write instead."""
  said = "drew random numbers from torch's own generator .* constants of the program"

  @jax.jit
  def frozen(x):
    return bridge.call_torch(lambda t: t + torch.rand(t.shape), x)

  with pytest.warns(UserWarning, match=said) as caught:
    a = frozen(jnp.zeros(4))
  assert caught[0].filename == __file__  # the user's line
  np.testing.assert_array_equal(frozen(jnp.zeros(4)), a)  # (what was said)

  class Noisy(torch.nn.Module):
    def forward(self, x):
      return x + torch.rand(x.shape, device=x.device)  # drawn in the program

  compiled = bridge.compile(Noisy())
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    b, c = compiled(torch.zeros(8)), compiled(torch.zeros(8))
  assert not torch.equal(b, c)
  with pytest.warns(UserWarning, match=f"`bridge.compile`: the traced torch code {said}"):
    bridge.compile(lambda x: x * torch.randn(x.shape))(torch.ones(3))

  def reseeds(t):  # a reseed draws nothing; a CPU constant drawn from nothing random
    torch.manual_seed(5)
    return t + torch.arange(3.0)

  with warnings.catch_warnings():
    warnings.simplefilter("error")
    np.testing.assert_array_equal(jax.jit(bridge.jax_view(reseeds))(jnp.zeros(3)), [0, 1, 2])


def test_torch_cond_in_traced_code_is_refused_with_what_to_do():
  """torch runs `torch.cond` by compiling its branches with dynamo, which cannot read traced
  tensors (torch's own error blamed the predicate); `backend="jax"` runs it as `lax.cond`."""

  def gate(t):
    return torch.cond(t.sum() > 0, lambda a: a * 2, lambda a: a - 1, (t,))

  with pytest.raises(bridge.BridgeTypeError, match=r"torch\.where.*backend=\"jax\"") as e:
    jax.jit(bridge.jax_view(gate))(jnp.ones(3))
  assert "test_call_torch.py" in str(e.value)  # the user's line
  with pytest.raises(bridge.BridgeTypeError, match="`bridge.compile`: torch's control-flow"):
    bridge.compile(gate)(torch.ones(3))
  compiled = torch.compile(gate, backend="jax")
  torch.testing.assert_close(compiled(torch.ones(3)), torch.full((3,), 2.0))
  torch.testing.assert_close(compiled(-torch.ones(3)), torch.full((3,), -2.0))


def test_views_cancel():
  f = lambda x: x * 2
  assert bridge.torch_view(bridge.jax_view(f)) is f
  g = jnp.sin
  assert bridge.jax_view(bridge.torch_view(g)) is g


def test_functools_partial_and_kwargs():
  f = functools.partial(lambda x, k: x * k, k=3.0)
  np.testing.assert_array_equal(bridge.call_torch(f, jnp.ones(2)), [3.0, 3.0])


def test_module_per_example_gradients_and_scan():
  torch.manual_seed(0)
  net = Net()
  params, fn = bridge.extract_jax(net)
  xs = _np((6, 4))
  per_example = jax.jit(jax.vmap(jax.grad(lambda p, x: fn(p, x[None]).sum()), in_axes=(None, 0)))(
    params, xs
  )
  for i in (0, 5):
    net.zero_grad()
    net(torch.tensor(xs[i : i + 1])).sum().backward()
    _assert_close(per_example["fc1.weight"][i], net.fc1.weight.grad, rtol=1e-5, atol=1e-6)

  class Cell(torch.nn.Module):  # an Elman cell (torch's fused GRU/LSTM cells: tests/ops)
    def __init__(self):
      super().__init__()
      self.ih, self.hh = torch.nn.Linear(4, 3), torch.nn.Linear(3, 3, bias=False)

    def forward(self, x, h):
      return torch.tanh(self.ih(x) + self.hh(h))

  cell = Cell()
  cell_params, cell_fn = bridge.extract_jax(cell)
  seq = _np((5, 2, 4))

  def run(p):
    h, _ = jax.lax.scan(
      lambda h, x: (jax.checkpoint(cell_fn)(p, x, h), None), jnp.zeros((2, 3)), seq
    )
    return h.sum()

  value, grads = jax.jit(jax.value_and_grad(run))(cell_params)
  h = torch.zeros(2, 3)
  for x in seq:
    h = cell(torch.tensor(x), h)
  h.sum().backward()
  _assert_close(value, h.sum().detach(), rtol=1e-5, atol=1e-6)
  _assert_close(grads["hh.weight"], cell.hh.weight.grad, rtol=1e-4, atol=1e-5)


def test_relu_gradient_at_exactly_zero_is_torchs():
  """torch's relu passes no gradient at x == 0 (a bare maximum(x, 0) would pass half)."""
  x = np.array([-1.0, 0.0, 0.0, 2.0, np.nan], np.float32)
  g = jax.grad(lambda a: bridge.call_torch(lambda t: torch.relu(t).sum(), a))(jnp.asarray(x))
  t = torch.tensor(x, requires_grad=True)
  torch.relu(t).sum().backward()
  np.testing.assert_array_equal(np.asarray(g), t.grad.numpy())
  out = bridge.call_torch(torch.relu, jnp.asarray(x))
  assert np.isnan(np.asarray(out)[-1])


@pytest.mark.parametrize(
  "fn",
  [
    lambda t: torch.clamp(t, 0.0, 1.0),
    lambda t: torch.clamp(t, min=0.0),
    lambda t: torch.clamp(t, max=1.0),
    lambda t: torch.nn.functional.hardtanh(t, 0.0, 1.0),
    lambda t: torch.nn.functional.relu6(t * 6),
    lambda t: torch.relu(t),
  ],
  ids=["clamp", "clamp_min", "clamp_max", "hardtanh", "relu6", "relu"],
)
def test_clipping_gradients_at_the_bounds_and_at_nan_are_torchs(fn):
  """At exactly a bound torch's clamp passes the gradient and hardtanh does not; at a nan
  input clamp passes none and hardtanh does. The values are torch's too."""
  x = np.array([-1.0, 0.0, 0.5, 1.0, 2.0, np.nan], np.float32)
  weights = np.arange(1.0, 7.0, dtype=np.float32)
  value, pullback = jax.vjp(lambda a: bridge.call_torch(fn, a), jnp.asarray(x))
  (grad,) = pullback(jnp.asarray(weights))
  t = torch.tensor(x, requires_grad=True)
  want = fn(t)
  want.backward(torch.tensor(weights))
  np.testing.assert_array_equal(np.asarray(value), want.detach().numpy())  # nan where nan
  np.testing.assert_array_equal(np.asarray(grad), t.grad.numpy())


def test_values_that_do_not_depend_on_the_inputs_are_known_while_tracing():
  """Ops on values made inside the traced code (positions from `torch.arange`, what is computed
  from them) run on torch's CPU kernels while the program is built, so Python can read them as
  in eager torch (Hugging Face's "no packed sequences" check); the rest stays traced."""

  def f(x):
    pos = torch.arange(x.shape[-1], device=x.device)
    steps = pos[1:] - pos[:-1]
    assert not isinstance(bridge._src.tensor.value(steps), jax.core.Tracer)
    if (steps == 1).all():  # a Python branch on a known value
      x = x * 2
    big = torch.arange(100_000, device=x.device) * 2  # too large for torch to fold it
    mask = torch.ones(5, 5, device=x.device).tril()  # `empty` + `fill_` + `tril`: known
    assert not isinstance(bridge._src.tensor.value(mask), jax.core.Tracer)
    mask[0, 1] = x[0, 0]  # a traced value written into a known tensor
    return x + pos * int(pos.sum().item()) + mask.sum(0), big[:3]

  x = jnp.ones((2, 5), jnp.float32)
  out, head = jax.jit(lambda a: bridge.call_torch(f, a))(x)
  np.testing.assert_allclose(
    np.asarray(out), np.broadcast_to(2 + np.arange(5) * 10 + [5, 6, 3, 2, 1], (2, 5))
  )  # mask[0, 1] = 2 * x[0, 0]
  assert np.asarray(head).tolist() == [0, 2, 4]
  got = jax.grad(lambda a: bridge.call_torch(f, a)[0].sum())(x)
  np.testing.assert_allclose(np.asarray(got), np.full((2, 5), 2.0) + [[4, 0, 0, 0, 0], [0] * 5])
