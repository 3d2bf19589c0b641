"""The per-op callback fallback: ops with no lowering and no decomposition run in eager torch."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bridge
from bridge._src.dispatch import fallback as fallback_lib
from bridge._src import ffi
from bridge._src import tensor as tensor_lib
from bridge._src.registry import REGISTRY


# A custom op that exists only in torch: no lowering, no decomposition.
@torch.library.custom_op("bridge_test_fb::cubic", mutates_args=())
def cubic(x: torch.Tensor, scale: float) -> torch.Tensor:
  if (x < -100).any():
    raise ValueError("cubic: inputs below -100 are not allowed")
  return scale * x.pow(3) - x


@cubic.register_fake
def _(x, scale):
  return torch.empty_like(x)


def _cubic_setup(ctx, inputs, output):
  ctx.save_for_backward(inputs[0])
  ctx.scale = inputs[1]


def _cubic_backward(ctx, grad):
  (x,) = ctx.saved_tensors
  return grad * (3 * ctx.scale * x * x - 1), None


cubic.register_autograd(_cubic_backward, setup_context=_cubic_setup)

CUBIC = "bridge_test_fb::cubic.default"


def f(x):
  return torch.sin(cubic(x, 0.5)) * 2 + x


X = np.array([[0.3, -1.2, 2.0], [0.7, 1.5, -0.4]], np.float32)


def _torch_reference(x):
  t = torch.tensor(x, requires_grad=True)
  y = f(t)
  y.sum().backward()
  return y.detach().numpy(), t.grad.numpy()


def test_custom_op_falls_back_eagerly_on_the_jax_device_with_torch_numbers():
  want, _ = _torch_reference(X)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    out = f(torch.tensor(X, device="jax"))
  assert out.device.type == "jax" and out.dtype == torch.float32
  torch.testing.assert_close(out.cpu(), torch.tensor(want))


@pytest.mark.parametrize("jit", [False, True])
def test_call_torch_with_a_fallen_back_op_forward_and_grad_match_torch(jit):
  want, want_grad = _torch_reference(X)
  call = lambda x: bridge.call_torch(f, x)
  grad = jax.grad(lambda x: call(x).sum())
  if jit:
    call, grad = jax.jit(call), jax.jit(grad)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    out = call(jnp.asarray(X))
    g = grad(jnp.asarray(X))
  assert out.dtype == jnp.float32 and out.shape == X.shape
  np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(g), want_grad, rtol=1e-5, atol=1e-6)


def test_vmap_of_a_function_with_a_fallen_back_op():
  want = np.stack([_torch_reference(row)[1] for row in X])
  per_row = jax.vmap(jax.grad(lambda x: bridge.call_torch(f, x).sum()))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    got = per_row(jnp.asarray(X))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_fallback_warns_once_per_op_naming_it(monkeypatch):
  monkeypatch.setattr(fallback_lib, "_warned", set())
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    bridge.call_torch(f, jnp.asarray(X))
    bridge.call_torch(f, jnp.asarray(X[:1]))
    jax.jit(lambda x: bridge.call_torch(f, x))(jnp.asarray(X))
  ours = [w for w in caught if issubclass(w.category, bridge.FallbackWarning)]
  assert len(ours) == 1
  message = str(ours[0].message)
  assert CUBIC in message
  assert "register_lowering(torch.ops.bridge_test_fb.cubic.default)" in message
  assert "fallback='error'" in message


def test_fallback_ops_lists_the_ops_that_fell_back():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    assert bridge.fallback_ops(f, jnp.asarray(X)) == [CUBIC]
    assert bridge.fallback_ops(f, jax.ShapeDtypeStruct((5,), jnp.float32)) == [CUBIC]
  assert bridge.fallback_ops(lambda x: torch.sin(x) * 2, jnp.asarray(X)) == []
  model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.GELU())
  assert bridge.fallback_ops(model, jnp.asarray(X)) == []


def test_fallback_error_policy_raises_operator_not_found():
  with bridge.config(fallback="error"):
    with pytest.raises(bridge.OperatorNotFound) as info:
      bridge.call_torch(lambda x: cubic(x, 2.0), jnp.asarray(X))
  message = str(info.value)
  assert "bridge_test_fb.cubic.default" in message
  assert "fallback='error'" in message
  assert "@bridge.register_lowering(torch.ops.bridge_test_fb.cubic.default)" in message
  # and the default policy works again afterwards
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    out = bridge.call_torch(lambda x: cubic(x, 2.0), jnp.asarray(X))
  np.testing.assert_allclose(np.asarray(out), 2 * X**3 - X, rtol=1e-6)


def test_platform_without_host_callbacks_turns_the_fallback_into_the_error(monkeypatch):
  monkeypatch.setattr(ffi, "platform", lambda: "tpu")
  with pytest.raises(bridge.OperatorNotFound, match="cannot call back into Python"):
    bridge.call_torch(lambda x: cubic(x, 3.0), jnp.asarray(X))
  with pytest.raises(bridge.BridgeError, match="cannot call back into Python"):
    bridge.call_torch(torch.sin, jnp.asarray(X), mode="callback")


def test_config_refuses_an_unknown_fallback_policy():
  with pytest.raises(bridge.BridgeTypeError, match="fallback='warn' is not one of"):
    bridge.config(fallback="warn")


def test_torch_exception_inside_a_fallen_back_op_surfaces_as_itself():
  bad = np.array([-200.0, 1.0], np.float32)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    with pytest.raises(ValueError, match="inputs below -100 are not allowed"):
      cubic(torch.tensor(bad, device="jax"), 1.0)
    with pytest.raises(
      jax.errors.JaxRuntimeError, match="(?s)ValueError: cubic: inputs below -100.*torch traceback"
    ):
      jax.jit(lambda x: bridge.call_torch(lambda t: cubic(t, 1.0), x))(
        jnp.asarray(bad)
      ).block_until_ready()


@pytest.fixture
def atan_unregistered(monkeypatch):
  """aten.atan with its lowering taken away (and decompositions off): a deliberately missing op."""
  op = torch.ops.aten.atan.default
  REGISTRY.require_plugins()
  assert REGISTRY.lookup(op) is not None
  monkeypatch.delitem(REGISTRY._table, op)
  tensor_lib._PLANS.pop(op, None)
  monkeypatch.setattr(fallback_lib, "_warned", set())
  yield op
  tensor_lib._PLANS.pop(op, None)  # the next use builds its plan from the lowering again


def test_deliberately_unregistered_aten_op_falls_back_with_gradients(atan_unregistered):
  x = np.array([0.5, -2.0, 3.0], np.float64)
  with (
    bridge.config(decompose_missing_ops=False),
    jax.enable_x64(True),
    warnings.catch_warnings(record=True) as caught,
  ):
    warnings.simplefilter("always")
    g = lambda t: (torch.atan(t) * t).sum()
    value, grad = jax.value_and_grad(lambda a: bridge.call_torch(g, a))(jnp.asarray(x))
    listed = bridge.fallback_ops(g, jnp.asarray(x))
  t = torch.tensor(x, requires_grad=True)
  want = g(t)
  want.backward()
  assert value.dtype == jnp.float64
  np.testing.assert_allclose(float(value), want.item(), rtol=1e-12)
  np.testing.assert_allclose(np.asarray(grad), t.grad.numpy(), rtol=1e-12)
  assert listed == ["aten::atan.default"]
  assert [
    str(w.message).split(" ")[1] for w in caught if issubclass(w.category, bridge.FallbackWarning)
  ] == ["aten::atan.default"]


@torch.library.custom_op("bridge_test_fb::twice_no_fake", mutates_args=())
def twice_no_fake(x: torch.Tensor) -> torch.Tensor:
  return x * 2


def test_a_fallen_back_op_without_a_fake_names_the_fallback_and_advises_a_lowering():
  """The user called `call_torch` in trace mode, not callback mode: the message speaks as the
  bridge's per-op fallback, and its advice is a fake or a lowering, not `result_shape_dtypes=`
  (which only callback mode's own callers can pass)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    with pytest.raises(bridge.BridgeError) as info:
      jax.jit(lambda a: bridge.call_torch(lambda t: twice_no_fake(t) + 1, a))(jnp.ones(3))
  message = str(info.value)
  assert message.startswith(
    "bridge: the fallback of bridge_test_fb::twice_no_fake.default calls an op with no fake "
    "implementation"
  ), message
  assert "`torch.library.register_fake`" in message
  assert "`bridge.register_lowering`" in message
  assert "mode='callback'" not in message and "result_shape_dtypes" not in message


# A custom op that writes its argument in place (declared with `mutates_args`), and returns a
# new tensor too: no functional twin, no lowering, no decomposition.
@torch.library.custom_op("bridge_test_fb::scale_and_norm_", mutates_args=("x",))
def scale_and_norm_(x: torch.Tensor, s: float) -> torch.Tensor:
  x.mul_(s)
  return x.norm().reshape(1)


@scale_and_norm_.register_fake
def _(x, s):
  return x.new_empty(1)


def _writes(x):
  y = x.detach() + 1  # (the op has no derivative)
  norm = scale_and_norm_(y, 3.0)
  return y * 2 + x, norm


def test_an_op_that_writes_its_argument_falls_back_on_a_copy_everywhere():
  """Eagerly on the `jax` device, in `bridge.compile`, in `call_torch` under jit, and in a
  `backend="jax"` graph with and without gradients (where aot_autograd writes the op as
  `auto_functionalized`): torch writes a copy in a host call, the new value is stored."""
  x = torch.randn(5)
  before = x.clone()
  want = _writes(x)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    on_device = _writes(x.to("jax"))
    torch.testing.assert_close([t.cpu() for t in on_device], list(want))
    torch.testing.assert_close(list(bridge.compile(_writes)(x)), list(want))
    got = jax.jit(bridge.jax_view(_writes))(jnp.asarray(x.numpy()))
    torch.testing.assert_close([torch.tensor(np.asarray(g)) for g in got], list(want))
    for grad in (False, True):
      torch._dynamo.reset()
      leaf = x.clone().requires_grad_(grad)
      out = torch.compile(_writes, backend="jax")(leaf)
      torch.testing.assert_close(list(out), list(want))
      if grad:
        (g,) = torch.autograd.grad(out[0].sum(), leaf)
        torch.testing.assert_close(g, torch.ones(5))
  torch.testing.assert_close(x, before, rtol=0, atol=0)  # (the caller's tensor: unwritten)


# (a custom op that draws random numbers says so with torch's tag: nothing else can tell)
@torch.library.custom_op(
  "bridge_test_fb::jitter", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,)
)
def jitter(x: torch.Tensor) -> torch.Tensor:
  return x + torch.rand_like(x)


@jitter.register_fake
def _(x):
  return torch.empty_like(x)


@pytest.mark.timeout(300)
def test_a_random_op_that_falls_back_on_known_inputs_draws_on_every_call():
  """Its inputs known while the program is built (a tensor made in the traced code), the
  fallback used to run it at once: its numbers were constants of the program. Staged, its
  host function must not take the `jax` generator's lock, which a running compiled program
  that draws holds (it did, through `torch.manual_seed`: a deadlock)."""

  def f(x):
    return F.dropout(x, 0.5) * 0 + jitter(torch.zeros(2000, device=x.device))

  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    for compiled in (bridge.compile(f), torch.compile(f, backend="jax")):
      a, b = compiled(torch.ones(2000)), compiled(torch.ones(2000))
      assert not torch.equal(a, b)
      assert 0.45 < a.mean().item() < 0.55 and 0.0 <= a.min().item() and a.max().item() <= 1.0


# A custom op that writes its argument and returns a tensor whose shape depends on the data:
# its fake run cannot find the output's shape.
@torch.library.custom_op("bridge_test_fb::clip_and_keep_", mutates_args=("x",))
def clip_and_keep_(x: torch.Tensor) -> torch.Tensor:
  x.clamp_(min=0.0)
  return x[x > 0.5].clone()


@clip_and_keep_.register_fake
def _(x):
  return x.new_empty(torch.library.get_ctx().new_dynamic_size())


_SHAPED_BY_DATA = {
  "repeat_interleave": lambda d: torch.tensor([1.0, 2.0, 3.0], device=d).repeat_interleave(
    torch.tensor([1, 0, 2], device=d)
  ),
  "repeat_interleave_dim": lambda d: (
    torch.arange(6.0, device=d)
    .reshape(2, 3)
    .repeat_interleave(torch.tensor([2, 1], device=d), dim=0)
  ),
  "repeat_interleave_repeats_only": lambda d: torch.repeat_interleave(
    torch.tensor([3, 0, 1], device=d)
  ),
  "writes_its_argument": lambda d: (lambda x: (clip_and_keep_(x), x))(
    torch.tensor([-1.0, 2.0, 0.25, 3.0], device=d)
  ),
}


@pytest.mark.parametrize("name", list(_SHAPED_BY_DATA))
def test_an_op_whose_shapes_depend_on_the_data_falls_back_eagerly(name):
  """Eagerly on the `jax` device no program is built, so no output's shape is needed before
  the op runs: torch runs it at once, as on CPU (a second call reuses the verdict)."""
  want = _SHAPED_BY_DATA[name]("cpu")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    for _ in range(2):
      got = _SHAPED_BY_DATA[name]("jax")
      torch.testing.assert_close(jax.tree.map(lambda t: t.cpu(), got), want, rtol=0, atol=0)


def test_an_op_whose_shapes_depend_on_the_data_keeps_torchs_gradient_eagerly():
  def f(x):
    return (x.repeat_interleave(torch.tensor([1, 0, 2], device=x.device)) ** 2).sum()

  x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
  f(x).backward()
  on_device = x.detach().to("jax").requires_grad_()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    f(on_device).backward()
  torch.testing.assert_close(on_device.grad.cpu(), x.grad)


def test_an_op_whose_shapes_depend_on_the_data_is_still_refused_inside_a_program():
  fn = bridge.jax_view(lambda x, r: x.repeat_interleave(r))
  x, r = jnp.array([1.0, 2.0, 3.0]), jnp.array([1, 0, 2])
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    fn(x, r)  # (eagerly first: the verdict cached for these shapes must not leak into jit)
    with pytest.raises(bridge.TracedValueError, match="outputs cannot be found before it runs"):
      jax.jit(fn)(x, r)


@pytest.mark.parametrize("method", ["to_sparse", "to_sparse_csr"])
def test_a_fallback_whose_output_is_sparse_names_the_op(method):
  # (the error named `bridge.call_torch` and "output 0", which the user never called)
  x = torch.randn(3, 3, device="jax")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", bridge.FallbackWarning)
    with pytest.raises(bridge.BridgeTypeError) as info:
      getattr(x, method)()
  msg = str(info.value)
  assert f"aten::_{method}.default" in msg and "sparse tensor" in msg, msg
  assert "call_torch" not in msg, msg
