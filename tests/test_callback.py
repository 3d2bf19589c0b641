"""`call_torch(fn, ..., mode="callback")` / `jax_view(fn, mode="callback")`: torch run for real.

In callback mode the torch function is not traced: it runs in eager torch from inside the
JAX program (an XLA FFI host call on CPU). Every case compares with torch eager on the CPU:
forward values, exact dtypes and shapes, and gradients against torch autograd.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

import bridge
from tests.xla import counting_compiles

RNG = np.random.default_rng(0)
S = jax.ShapeDtypeStruct


def cb(fn, *args, **kwargs):
  return bridge.call_torch(fn, *args, mode="callback", **kwargs)


def _np(shape, dtype=np.float32):
  return RNG.standard_normal(shape).astype(dtype)


def _t(a):
  """A torch CPU tensor with the value (and dtype) of a JAX or NumPy array."""
  return torch.from_numpy(np.array(a))


def _assert_close(actual, expected, **kw):
  """`actual` (JAX array) against `expected` (torch tensor): value, dtype and shape."""
  assert isinstance(actual, jax.Array), type(actual)
  torch.testing.assert_close(_t(actual), expected, **kw)


def _is_fake(t):
  return isinstance(t, FakeTensor)


# --- forward parity ---------------------------------------------------------------------------


def _elementwise(x):
  return torch.sin(x) * torch.exp(-x) + x.abs().sqrt()


def _matmul(x, w):
  return torch.tanh(x @ w) @ w.t()


def _tuple_out(x, w):
  y = x @ w
  return y.relu(), y.softmax(dim=-1), (y.sum(), [y.t()])


def _dict_out(x, w):
  y = x @ w
  return {"logits": y, "probs": torch.sigmoid(y), "nested": {"norm": y.norm(dim=-1)}}


FORWARD = {
  "elementwise": (_elementwise, [(3, 4)]),
  "matmul": (_matmul, [(5, 4), (4, 6)]),
  "tuple": (_tuple_out, [(2, 3), (3, 4)]),
  "dict": (_dict_out, [(2, 3), (3, 4)]),
}


def _tree_close(actual, expected):
  a_leaves, a_def = jax.tree_util.tree_flatten(actual)
  e_leaves, e_def = jax.tree_util.tree_flatten(expected)
  assert a_def == e_def
  for a, e in zip(a_leaves, e_leaves):
    _assert_close(a, e)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", sorted(FORWARD))
def test_forward_parity(name, jit):
  fn, shapes = FORWARD[name]
  args = [_np(s) for s in shapes]
  expected = fn(*[torch.from_numpy(a) for a in args])
  call = lambda *a: cb(fn, *a)
  if jit:
    call = jax.jit(call)
  _tree_close(call(*[jnp.asarray(a) for a in args]), expected)


def test_non_contiguous_outputs_and_views_of_inputs():
  x = _np((3, 4))
  fn = lambda t: (t.t(), t[:, ::2], t)  # a transpose, a strided view, the input itself
  expected = fn(torch.from_numpy(x))
  for call in (lambda a: cb(fn, a), jax.jit(lambda a: cb(fn, a))):
    out = call(jnp.asarray(x))
    assert [o.shape for o in out] == [(4, 3), (3, 2), (3, 4)]
    _tree_close(out, expected)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_torch_return_types(jit):
  x = _np((4, 5))
  call = lambda a: cb(lambda t: torch.max(t, dim=0), a)
  if jit:
    call = jax.jit(call)
  with jax.enable_x64(True):
    out = call(jnp.asarray(x))
    values, indices = torch.max(torch.from_numpy(x), dim=0)
    assert type(out) is tuple and len(out) == 2
    _assert_close(out[0], values)
    assert out[1].dtype == jnp.int64
    _assert_close(out[1], indices)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_int64_bool_float64_outputs_with_x64(jit):
  def fn(t):
    return (
      t.sin(),
      (t * 10).long(),
      t > 0.5,
      t.sum(dtype=torch.float64),
      t.to(torch.int32),
      torch.arange(3) * 2**40,
    )

  x = RNG.uniform(size=(5,))
  with jax.enable_x64(True):
    call = lambda a: cb(fn, a)
    if jit:
      call = jax.jit(call)
    out = call(jnp.asarray(x, dtype=jnp.float64))
    assert [o.dtype for o in out] == [
      jnp.float64,
      jnp.int64,
      jnp.bool_,
      jnp.float64,
      jnp.int32,
      jnp.int64,
    ]
    _tree_close(out, fn(torch.from_numpy(x)))


def test_int64_inputs_with_x64_keep_exact_values():
  i = np.array([1, 2**40 + 3, -7], dtype=np.int64)
  fn = lambda t: (t * 3, t // 2)
  with jax.enable_x64(True):
    for call in (lambda a: cb(fn, a), jax.jit(lambda a: cb(fn, a))):
      out = call(jnp.asarray(i))
      _tree_close(out, fn(torch.from_numpy(i)))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_dtypes(dtype):
  x = jnp.linspace(-1.0, 1.0, 7).astype(dtype)
  out = jax.jit(lambda a: cb(torch.sin, a))(x)
  assert out.dtype == dtype
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(jnp.sin(x), np.float32))
  g = jax.grad(lambda a: cb(torch.sin, a).astype(jnp.float32).sum())(x)
  assert g.dtype == dtype
  np.testing.assert_allclose(
    np.asarray(g, np.float32), np.cos(np.asarray(x, np.float32)), rtol=1e-2, atol=1e-2
  )


def test_bool_and_mixed_inputs():
  x, m = _np((6,)), np.array([True, False, True, True, False, False])
  fn = lambda t, mask: torch.where(mask, t, -t)
  expected = fn(torch.from_numpy(x), torch.from_numpy(m))
  for call in (lambda a, b: cb(fn, a, b), jax.jit(lambda a, b: cb(fn, a, b))):
    _assert_close(call(jnp.asarray(x), jnp.asarray(m)), expected)


def _static_fn(x, n, alpha, how, *, k=1, beta=0.5, op="add"):
  assert isinstance(n, int) and isinstance(alpha, float) and isinstance(how, str)
  assert not isinstance(k, torch.Tensor) and isinstance(op, str)
  y = (x * alpha + n).pow(k)
  y = y + beta if op == "add" else y - beta
  return y.flip(0) if how == "flip" else y


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_static_arguments_positional_and_keyword(jit):
  x = _np((4,))
  t = torch.from_numpy(x)
  cases = [
    ((2, 1.5, "flip"), dict(k=2, beta=0.25, op="sub")),
    ((3, -0.5, "keep"), dict(k=3)),
    ((0, 2.0, "flip"), dict()),
  ]
  for args, kwargs in cases:
    call = lambda a, args=args, kwargs=kwargs: cb(_static_fn, a, *args, **kwargs)
    if jit:
      call = jax.jit(call)
    _assert_close(call(jnp.asarray(x)), _static_fn(t, *args, **kwargs))


def test_non_array_outputs_pass_through():
  x = jnp.asarray(_np((3,)))
  out = cb(lambda t: (t * 2, 3, "s", None), x)
  assert out[1:] == (3, "s", None)
  _assert_close(out[0], _t(x) * 2)


def test_tensor_keyword_arguments_and_nested_inputs():
  x, w = _np((3, 4)), _np((4, 2))
  fn = lambda d, *, w: {"y": d["a"] @ w + d["b"][0].sum()}
  expected = fn({"a": torch.from_numpy(x), "b": (torch.from_numpy(x),)}, w=torch.from_numpy(w))
  for call in (
    lambda a, b: cb(fn, {"a": a, "b": (a,)}, w=b),
    jax.jit(lambda a, b: cb(fn, {"a": a, "b": (a,)}, w=b)),
  ):
    _tree_close(call(jnp.asarray(x), jnp.asarray(w)), expected)
  gw = jax.grad(lambda a, b: cb(fn, {"a": a, "b": (a,)}, w=b)["y"].sum(), argnums=(0, 1))(
    jnp.asarray(x), jnp.asarray(w)
  )
  tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
  fn({"a": tx, "b": (tx,)}, w=tw)["y"].sum().backward()
  _assert_close(gw[0], tx.grad)
  _assert_close(gw[1], tw.grad)


def test_numpy_array_inputs():
  x32 = _np((2, 3))
  w = jnp.asarray(_np((3, 2)))
  out = cb(lambda a, b: a @ b, x32, w)
  _assert_close(out, torch.from_numpy(x32) @ _t(w))
  x64 = RNG.standard_normal((3,))  # float64 NumPy input: its dtype is kept exactly
  out = cb(lambda a: a * 2, x64)
  assert out.dtype == np.float64
  np.testing.assert_array_equal(np.asarray(out), x64 * 2)
  with jax.enable_x64(True):
    out = jax.jit(lambda a: cb(lambda s, t: s + t, a, x64))(jnp.ones(3, jnp.float64))
    assert out.dtype == jnp.float64
    np.testing.assert_array_equal(np.asarray(out), x64 + 1)


# --- the torch function really runs, eagerly --------------------------------------------------


def test_runs_for_real_fake_run_once_per_shape():
  seen = []

  def fn(t):
    seen.append(
      (_is_fake(t), type(t) is torch.Tensor or _is_fake(t), t.device.type, tuple(t.shape))
    )
    return t * 2 + 1

  jitted = jax.jit(lambda a: cb(fn, a))
  x = jnp.arange(3.0)
  _assert_close(jitted(x), _t(x) * 2 + 1)
  # tracing: one run on fake tensors, then one real run per execution, on plain CPU tensors
  assert seen == [(True, True, "cpu", (3,)), (False, True, "cpu", (3,))]
  _assert_close(jitted(x + 1), _t(x + 1) * 2 + 1)
  assert seen[2:] == [(False, True, "cpu", (3,))]
  # a new jitted function with the same shapes: the fake run is cached, not repeated
  jitted2 = jax.jit(lambda a: cb(fn, a) - 1)
  _assert_close(jitted2(x), _t(x) * 2)
  assert seen[3:] == [(False, True, "cpu", (3,))]
  # a new shape: one new fake run
  jitted(jnp.ones((2, 2)))
  assert seen[4:] == [(True, True, "cpu", (2, 2)), (False, True, "cpu", (2, 2))]
  for _ in range(3):
    jitted(x)
  assert [s[0] for s in seen[6:]] == [False] * 3


def test_runs_non_traceable_python_on_real_data():
  # .numpy() and Python control flow on values: impossible to trace, fine when run for real
  def fn(t):
    a = t.numpy()
    scale = 2.0 if float(a.sum()) > 0 else -3.0
    return torch.from_numpy(np.cumsum(a) * scale)

  spec = S((5,), jnp.float32)
  for x in (np.arange(5.0, dtype=np.float32), -np.arange(5.0, dtype=np.float32) - 1):
    expected = fn(torch.from_numpy(x.copy()))
    _assert_close(cb(fn, jnp.asarray(x), result_shape_dtypes=spec), expected)
    _assert_close(jax.jit(lambda a: cb(fn, a, result_shape_dtypes=spec))(jnp.asarray(x)), expected)


def test_item_and_data_dependent_shapes_work_with_result_shape_dtypes():
  x = jnp.array([1.0, -2.0, 3.0, -4.0])
  out = jax.jit(
    lambda a: cb(lambda t: t * t.sum().item(), a, result_shape_dtypes=S((4,), jnp.float32))
  )(x)
  _assert_close(out, _t(x) * -2.0)
  out = jax.jit(lambda a: cb(lambda t: t[t > 0], a, result_shape_dtypes=S((2,), jnp.float32)))(x)
  _assert_close(out, torch.tensor([1.0, 3.0]))
  out = cb(
    lambda t: (t[t < 0], t.sum()), x, result_shape_dtypes=(S((2,), jnp.float32), S((), jnp.float32))
  )
  _tree_close(out, (torch.tensor([-2.0, -4.0]), torch.tensor(-2.0)))


def test_module_runs_with_live_parameters():
  torch.manual_seed(0)
  lin = torch.nn.Linear(3, 2)
  x = _np((4, 3))
  call = jax.jit(lambda a: cb(lin, a))
  _assert_close(call(jnp.asarray(x)), lin(torch.from_numpy(x)).detach())
  g = jax.grad(lambda a: jnp.tanh(cb(lin, a)).sum())(jnp.asarray(x))
  tx = torch.from_numpy(x).requires_grad_()
  torch.tanh(lin(tx)).sum().backward()
  _assert_close(g, tx.grad)


# --- gradients --------------------------------------------------------------------------------


def _gather_loss(x, idx, w, k):
  return ((x[idx] * w).sin() + x[k] ** 2).sum()


def test_grad_several_inputs_with_integer_indices():
  x, w = _np((6,)), _np((3,))
  idx, k = np.array([0, 2, 2], np.int32), np.array([5], np.int32)
  tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
  ref = _gather_loss(tx, torch.from_numpy(idx).long(), tw, torch.from_numpy(k).long())
  ref.backward()
  f = lambda a, b: cb(_gather_loss, a, jnp.asarray(idx), b, jnp.asarray(k))
  for grad in (jax.grad(f, argnums=(0, 1)), jax.jit(jax.grad(f, argnums=(0, 1)))):
    gx, gw = grad(jnp.asarray(x), jnp.asarray(w))
    _assert_close(gx, tx.grad)
    _assert_close(gw, tw.grad)
  value, (gx, gw) = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(jnp.asarray(x), jnp.asarray(w))
  _assert_close(value, ref.detach())
  _assert_close(gx, tx.grad)
  _assert_close(gw, tw.grad)


@pytest.mark.filterwarnings("ignore:bridge. torch code is being traced:UserWarning")
def test_grad_multiple_outputs_and_int_outputs():
  x = _np((4, 5))

  def fn(t):
    values, indices = torch.max(t, dim=0)
    return values, indices, (t * t).mean(dim=1)

  def loss(a):
    v, i, m = cb(fn, a)
    assert jnp.issubdtype(i.dtype, jnp.integer)
    return (v * jnp.arange(5.0)).sum() + (m**2).sum()

  tx = torch.from_numpy(x).requires_grad_()
  v, _, m = fn(tx)
  ((v * torch.arange(5.0)).sum() + (m**2).sum()).backward()
  for grad in (jax.grad(loss), jax.jit(jax.grad(loss))):
    _assert_close(grad(jnp.asarray(x)), tx.grad)


def test_vjp_with_cotangents_for_every_output():
  x, w = _np((3, 4)), _np((4, 2))
  out, vjp = jax.vjp(lambda a, b: cb(_tuple_out, a, b), jnp.asarray(x), jnp.asarray(w))
  cts = jax.tree_util.tree_map(lambda o: jnp.asarray(_np(o.shape)), out)
  gx, gw = jax.jit(vjp)(cts)
  tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
  touts = jax.tree_util.tree_leaves(_tuple_out(tx, tw))
  torch.autograd.backward(touts, [_t(c) for c in jax.tree_util.tree_leaves(cts)])
  _assert_close(gx, tx.grad)
  _assert_close(gw, tw.grad)


def test_backward_differentiates_only_the_inputs_jax_differentiates():
  seen = []

  def fn(a, w):
    seen.append((_is_fake(a), a.requires_grad, w.requires_grad))
    return (a * w).sum()

  x, w = jnp.asarray(_np((3,))), jnp.asarray(_np((3,)))
  _assert_close(jax.grad(lambda a: cb(fn, a, w))(x), _t(w))
  assert [s[1:] for s in seen if not s[0]] == [(False, False), (True, False)]
  seen.clear()
  _assert_close(jax.grad(lambda a, b: cb(fn, a, b), argnums=1)(x, w), _t(x))
  assert [s[1:] for s in seen if not s[0]] == [(False, False), (False, True)]


def test_grad_of_unused_inputs_and_constant_outputs_is_zero():
  fn = lambda a, b: (a * 2, torch.ones(3), b.detach() * 0 + 1)
  x, w = jnp.asarray(_np((3,))), jnp.asarray(_np((3,)))
  loss = lambda a, b: sum(o.sum() for o in cb(fn, a, b))
  for grad in (jax.grad(loss, argnums=(0, 1)), jax.jit(jax.grad(loss, argnums=(0, 1)))):
    gx, gw = grad(x, w)
    np.testing.assert_array_equal(np.asarray(gx), np.full(3, 2.0, np.float32))
    np.testing.assert_array_equal(np.asarray(gw), np.zeros(3, np.float32))
    assert gw.dtype == jnp.float32


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_grad_through_a_function_with_only_bool_outputs(jit):
  x = jnp.array([1.0, -2.0, 3.0])
  f = lambda a: (cb(lambda t: t > 0, a) * a).sum()
  grad = jax.jit(jax.grad(f)) if jit else jax.grad(f)
  np.testing.assert_array_equal(np.asarray(grad(x)), np.array([1.0, 0.0, 1.0], np.float32))


def test_grad_float64_with_x64():
  x = RNG.standard_normal((5,))
  fn = lambda t: (t.sin() * t**2).sum()
  tx = torch.from_numpy(x).requires_grad_()
  fn(tx).backward()
  with jax.enable_x64(True):
    for grad in (jax.grad(lambda a: cb(fn, a)), jax.jit(jax.grad(lambda a: cb(fn, a)))):
      g = grad(jnp.asarray(x))
      assert g.dtype == jnp.float64
      _assert_close(g, tx.grad)


def _complex_to_real(z, w):
  return ((z * w).abs() ** 2 + (z.conj() * z.sin()).real * 3).sum()


def test_grad_complex_inputs_matches_trace_mode_and_jax():
  z = (_np((4,)) + 1j * _np((4,))).astype(np.complex64)
  w = (_np((4,)) + 1j * _np((4,))).astype(np.complex64)
  args = (jnp.asarray(z), jnp.asarray(w))
  argnums = (0, 1)
  got = jax.grad(lambda a, b: cb(_complex_to_real, a, b), argnums=argnums)(*args)
  got_jit = jax.jit(jax.grad(lambda a, b: cb(_complex_to_real, a, b), argnums=argnums))(*args)
  trace = jax.grad(lambda a, b: bridge.call_torch(_complex_to_real, a, b), argnums=argnums)(*args)
  pure = jax.grad(
    lambda a, b: (jnp.abs(a * b) ** 2 + (jnp.conj(a) * jnp.sin(a)).real * 3).sum(), argnums=argnums
  )(*args)
  for g in (got, got_jit):
    for a, t, p in zip(g, trace, pure):
      assert a.dtype == jnp.complex64
      np.testing.assert_allclose(np.asarray(a), np.asarray(p), rtol=1e-5, atol=1e-5)
      np.testing.assert_allclose(np.asarray(a), np.asarray(t), rtol=1e-5, atol=1e-5)
  # torch's convention is the conjugate of JAX's
  tz = torch.from_numpy(z).requires_grad_()
  _complex_to_real(tz, torch.from_numpy(w)).backward()
  np.testing.assert_allclose(
    np.asarray(got[0]), tz.grad.conj().resolve_conj().numpy(), rtol=1e-5, atol=1e-5
  )


def test_vjp_complex_to_complex_matches_jax():
  z = jnp.asarray((_np((3,)) + 1j * _np((3,))).astype(np.complex64))
  ct = jnp.asarray((_np((3,)) + 1j * _np((3,))).astype(np.complex64))
  out, vjp = jax.vjp(lambda a: cb(lambda t: torch.sin(t) * t * 2, a), z)
  out_ref, vjp_ref = jax.vjp(lambda a: jnp.sin(a) * a * 2, z)
  np.testing.assert_allclose(np.asarray(out), np.asarray(out_ref), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(
    np.asarray(vjp(ct)[0]), np.asarray(vjp_ref(ct)[0]), rtol=1e-5, atol=1e-5
  )


def test_complex128_with_x64():
  with jax.enable_x64(True):
    z = jnp.asarray(RNG.standard_normal(3) + 1j * RNG.standard_normal(3))
    f = lambda a: (jnp.abs(cb(torch.exp, a)) ** 2).sum()
    g = jax.jit(jax.grad(f))(z)
    assert g.dtype == jnp.complex128
    ref = jax.grad(lambda a: (jnp.abs(jnp.exp(a)) ** 2).sum())(z)
    np.testing.assert_allclose(np.asarray(g), np.asarray(ref), rtol=1e-12)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_second_derivatives(jit):
  def wrap(f):
    return jax.jit(f) if jit else f

  x = 0.7
  d2sin = wrap(jax.grad(jax.grad(lambda a: cb(torch.sin, a))))(x)
  np.testing.assert_allclose(d2sin, -np.sin(x), rtol=1e-6)
  cube = lambda a: cb(lambda t: t**3, a)
  np.testing.assert_allclose(wrap(jax.grad(jax.grad(cube)))(2.0), 12.0, rtol=1e-6)
  np.testing.assert_allclose(wrap(jax.grad(jax.grad(jax.grad(cube))))(2.0), 6.0, rtol=1e-6)
  # a Hessian by reverse over reverse (jax.hessian is forward over reverse: refused)
  xs = jnp.asarray(_np((3,)))
  hess = wrap(jax.jacrev(jax.grad(lambda a: cb(lambda t: (t.sin() * t.sum()).sum(), a))))(xs)
  th = torch.autograd.functional.hessian(lambda t: (t.sin() * t.sum()).sum(), _t(xs))
  _assert_close(hess, th)


def test_forward_mode_is_refused():
  f = lambda a: cb(torch.sin, a)
  with pytest.raises(TypeError, match="forward-mode"):
    jax.jacfwd(f)(jnp.ones(3))
  with pytest.raises(TypeError, match="forward-mode"):
    jax.jvp(f, (jnp.ones(3),), (jnp.ones(3),))


# --- vmap -------------------------------------------------------------------------------------


def _per_example_loss(w, x):  # (3,), (3,) -> (); batched: (B, 3), (B, 3) -> (B,)
  return (x * w).sum(-1).tanh() ** 2 + (w**2).sum(-1) * 0.1


def _per_example_reference(w, xs):
  grads, values = [], []
  for x in xs:
    tw = torch.from_numpy(w.copy()).requires_grad_()
    y = _per_example_loss(tw, torch.from_numpy(x))
    y.backward()
    grads.append(tw.grad)
    values.append(y.detach())
  return torch.stack(values), torch.stack(grads)


@pytest.mark.parametrize("vmap_method", ["sequential", "broadcast_all"])
def test_vmap_of_grad_per_example(vmap_method):
  w, xs = _np((3,)), _np((4, 3))
  calls = []

  def fn(a, b):
    calls.append((_is_fake(a), tuple(a.shape), tuple(b.shape)))
    return _per_example_loss(a, b)

  vals_ref, grads_ref = _per_example_reference(w, xs)
  f = jax.vmap(
    jax.value_and_grad(lambda a, b: cb(fn, a, b, vmap_method=vmap_method)), in_axes=(None, 0)
  )
  vals, grads = jax.jit(f)(jnp.asarray(w), jnp.asarray(xs))
  _assert_close(vals, vals_ref)
  _assert_close(grads, grads_ref)
  real = [c for c in calls if not c[0]]
  if vmap_method == "sequential":  # forward and backward: one torch call per example each
    assert real == [(False, (3,), (3,))] * 8
  else:  # one call on the whole batch each (the unbatched w broadcast to the batch)
    assert real == [(False, (4, 3), (4, 3))] * 2
  calls.clear()
  grads = jax.vmap(jax.grad(lambda a, b: cb(fn, a, b, vmap_method=vmap_method)), in_axes=(None, 0))(
    jnp.asarray(w), jnp.asarray(xs)
  )
  _assert_close(grads, grads_ref)


@pytest.mark.parametrize("vmap_method", ["sequential", "broadcast_all", "expand_dims"])
def test_vmap_forward_call_counts(vmap_method):
  calls = []

  def fn(t):
    calls.append((_is_fake(t), tuple(t.shape)))
    return t.cumsum(-1) * 2

  xs = _np((5, 3))
  out = jax.jit(jax.vmap(lambda a: cb(fn, a, vmap_method=vmap_method)))(jnp.asarray(xs))
  _assert_close(out, torch.from_numpy(xs).cumsum(-1) * 2)
  real = [c for c in calls if not c[0]]
  assert [c for c in calls if c[0]] == [(True, (3,))]  # shapes from the unbatched fake run
  if vmap_method == "sequential":
    assert real == [(False, (3,))] * 5
  else:
    assert real == [(False, (5, 3))]


def test_vmap_of_grad_expand_dims():
  xs = _np((4, 3))
  f = lambda t: (t**2).sum(-1)
  g = jax.vmap(jax.grad(lambda a: cb(f, a, vmap_method="expand_dims")))(jnp.asarray(xs))
  _assert_close(g, torch.from_numpy(xs) * 2)


_METHODS = ["sequential", "sequential_unrolled", "broadcast_all", "expand_dims"]


@pytest.mark.parametrize("vmap_method", _METHODS)
def test_vmap_without_jit_runs_now_and_compiles_nothing(vmap_method):
  """`jax.vmap` without jit runs the host calls on the batch as it is: no program per function
  (one used to be compiled for each, and under "sequential" a scan for every call)."""
  xs = _np((4, 3))
  calls = []

  def make(k):
    def fn(t):
      calls.append(tuple(t.shape))
      return t * 2 + k

    return fn

  jax.vmap(lambda a: cb(make(0.0), a, vmap_method=vmap_method))(jnp.asarray(xs))  # warm
  calls.clear()
  with counting_compiles() as compiles:
    for k in range(1, 4):
      out = jax.vmap(lambda a: cb(make(float(k)), a, vmap_method=vmap_method))(jnp.asarray(xs))
      _assert_close(out, torch.from_numpy(xs) * 2 + k)
      assert out.dtype == jnp.float32 and out.shape == (4, 3)
  assert compiles == []
  real = [c for c in calls if c != (3,) or vmap_method.startswith("sequential")]
  per_call = [(3,)] * 4 if vmap_method.startswith("sequential") else [(4, 3)]
  assert real[-len(per_call) :] == per_call


def test_vmap_without_jit_in_order_with_axes_and_unbatched_arguments():
  xs, w = _np((3, 5)), _np((3,))  # batched along axis 1 of xs; w unbatched
  seen = []

  def fn(a, b):
    seen.append(a.clone())
    return (a * b).sum(), a + b

  total, plus = jax.vmap(lambda a, b: cb(fn, a, b), in_axes=(1, None))(
    jnp.asarray(xs), jnp.asarray(w)
  )
  ref = torch.from_numpy(xs).T
  _assert_close(total, (ref * torch.from_numpy(w)).sum(-1))
  _assert_close(plus, ref + torch.from_numpy(w))
  real = [t for t in seen if not _is_fake(t)]
  assert len(real) == 5
  for i, t in enumerate(real):  # one call per element, in the batch's order
    torch.testing.assert_close(t, ref[i])


def test_vmap_of_vmap_without_jit():
  xs = _np((2, 3, 4))
  fn = lambda t: t.cumsum(-1) * 3
  g = jax.vmap(jax.vmap(lambda a: cb(fn, a)))
  _assert_close(g(jnp.asarray(xs)), torch.from_numpy(xs).cumsum(-1) * 3)
  with counting_compiles() as compiles:
    out = jax.vmap(jax.vmap(lambda a: cb(lambda t: t.cumsum(-1) * 3, a)))(jnp.asarray(xs))
  _assert_close(out, torch.from_numpy(xs).cumsum(-1) * 3)
  assert compiles == []


@pytest.mark.parametrize("vmap_method", _METHODS)
def test_vmap_without_jit_raises_torchs_own_error(vmap_method):
  def fn(t):
    if not _is_fake(t):
      raise ValueError("bad row from torch")
    return t

  with pytest.raises(ValueError, match="bad row from torch"):
    jax.vmap(lambda a: cb(fn, a, vmap_method=vmap_method))(jnp.ones((2, 3)))


def test_vmap_without_jit_gives_torchs_dtypes_as_an_eager_call_does():
  """Outside jit the results keep torch's dtypes (int64 here, with JAX's 64-bit types off),
  batched or not; inside jit they leave as the program's (int32, checked to fit)."""
  fn = lambda t: t.to(torch.int64) + 2**40
  x = jnp.ones((2, 3))
  eager = cb(fn, x)
  batched = jax.vmap(lambda a: cb(fn, a))(x)
  assert eager.dtype == batched.dtype == jnp.int64
  np.testing.assert_array_equal(np.asarray(batched), np.full((2, 3), 2**40 + 1))
  with pytest.warns(UserWarning, match="int64 tensor"):
    with pytest.raises(Exception, match="int32 cannot hold"):
      jax.jit(jax.vmap(lambda a: cb(fn, a)))(x)


# --- custom ops -------------------------------------------------------------------------------


@torch.library.custom_op("bridge_test_cb::scaled_sin", mutates_args=())
def scaled_sin(x: torch.Tensor, scale: float) -> torch.Tensor:
  # NumPy inside: a real kernel that no tracer could see through
  return torch.from_numpy(np.sin(x.detach().numpy()) * scale)


@scaled_sin.register_fake
def _(x, scale):
  return torch.empty_like(x)


def _scaled_sin_setup(ctx, inputs, output):
  ctx.save_for_backward(inputs[0])
  ctx.scale = inputs[1]


def _scaled_sin_backward(ctx, grad):
  (x,) = ctx.saved_tensors
  return grad * ctx.scale * torch.cos(x), None


scaled_sin.register_autograd(_scaled_sin_backward, setup_context=_scaled_sin_setup)


@torch.library.custom_op("bridge_test_cb::no_fake_cos", mutates_args=())
def no_fake_cos(x: torch.Tensor) -> torch.Tensor:
  return torch.from_numpy(np.cos(x.numpy()))


_OLD_STYLE_LIB = torch.library.Library("bridge_test_cb_old", "DEF")  # noqa: TOR901
_OLD_STYLE_LIB.define("no_meta_cos(Tensor x) -> Tensor")
_OLD_STYLE_LIB.impl("no_meta_cos", lambda x: x.cos(), "CPU")


def _uses_custom_op(x, w):
  return scaled_sin(x @ w, 3.0).sum(dim=-1) * 2


def test_custom_op_forward_and_grad():
  x, w = _np((3, 4)), _np((4, 2))
  tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
  ref = _uses_custom_op(tx, tw)
  ref.pow(2).sum().backward()
  for call in (
    lambda a, b: cb(_uses_custom_op, a, b),
    jax.jit(lambda a, b: cb(_uses_custom_op, a, b)),
  ):
    _assert_close(call(jnp.asarray(x), jnp.asarray(w)), ref.detach())
  loss = lambda a, b: (cb(_uses_custom_op, a, b) ** 2).sum()
  for grad in (jax.grad(loss, argnums=(0, 1)), jax.jit(jax.grad(loss, argnums=(0, 1)))):
    gx, gw = grad(jnp.asarray(x), jnp.asarray(w))
    _assert_close(gx, tx.grad)
    _assert_close(gw, tw.grad)


def test_custom_op_without_fake_works_with_result_shape_dtypes():
  x = _np((5,))
  spec = S((5,), jnp.float32)
  expected = torch.from_numpy(np.cos(x))
  _assert_close(cb(no_fake_cos, jnp.asarray(x), result_shape_dtypes=spec), expected)
  _assert_close(
    jax.jit(lambda a: cb(no_fake_cos, a, result_shape_dtypes=spec))(jnp.asarray(x)), expected
  )
  op = torch.ops.bridge_test_cb_old.no_meta_cos
  _assert_close(jax.jit(lambda a: cb(op, a, result_shape_dtypes=spec))(jnp.asarray(x)), expected)


def test_old_style_op_without_meta_kernel_gives_bridge_error():
  op = torch.ops.bridge_test_cb_old.no_meta_cos
  with pytest.raises(bridge.BridgeError, match="register_fake") as info:
    cb(op, jnp.ones(3))
  assert "result_shape_dtypes" in str(info.value)
  assert "no_meta_cos" in str(info.value)


def test_custom_op_without_fake_gives_bridge_error():
  with pytest.raises(bridge.BridgeError) as info:
    cb(no_fake_cos, jnp.ones(3))
  assert "register_fake" in str(info.value)
  assert "result_shape_dtypes" in str(info.value)


# --- mutation isolation -----------------------------------------------------------------------


def _add_one_in_place(x):
  x.add_(1)
  return x * 2


def test_in_place_mutation_does_not_change_callers_array():
  x0 = _np((4,))
  x = jnp.asarray(x0)
  expected = (torch.from_numpy(x0) + 1) * 2
  _assert_close(cb(_add_one_in_place, x), expected)
  np.testing.assert_array_equal(np.asarray(x), x0)
  _assert_close(jax.jit(lambda a: cb(_add_one_in_place, a))(x), expected)
  np.testing.assert_array_equal(np.asarray(x), x0)
  # the program still sees the unmutated input after the call
  both = jax.jit(lambda a: (cb(_add_one_in_place, a), a * 1))(x)
  _assert_close(both[0], expected)
  np.testing.assert_array_equal(np.asarray(both[1]), x0)
  # a closed-over array (a constant of the program)
  _assert_close(jax.jit(lambda: cb(_add_one_in_place, x))(), expected)
  np.testing.assert_array_equal(np.asarray(x), x0)
  # the gradient (the backward recomputes on a copy too)
  np.testing.assert_array_equal(
    np.asarray(jax.grad(lambda a: cb(_add_one_in_place, a).sum())(x)), np.full(4, 2.0, np.float32)
  )
  np.testing.assert_array_equal(np.asarray(x), x0)
  # NumPy input
  a = x0.copy()
  _assert_close(cb(_add_one_in_place, a), expected)
  np.testing.assert_array_equal(a, x0)


def test_in_place_through_a_view_and_with_result_shape_dtypes():
  x0 = np.arange(4.0, dtype=np.float32)
  x = jnp.asarray(x0)

  def fn(t):
    t[1:].mul_(10)
    return t.sum(0, keepdim=True)

  _assert_close(jax.jit(lambda a: cb(fn, a))(x), torch.tensor([60.0]))
  np.testing.assert_array_equal(np.asarray(x), x0)
  _assert_close(
    cb(_add_one_in_place, x, result_shape_dtypes=S((4,), jnp.float32)),
    (torch.from_numpy(x0) + 1) * 2,
  )
  np.testing.assert_array_equal(np.asarray(x), x0)


# --- randomness -------------------------------------------------------------------------------


def _dropout(x):
  return F.dropout(x, 0.5, training=True)


def test_dropout_reproducible_with_torch_seed():
  x = jnp.ones((64,))
  torch.manual_seed(0)
  a1, a2 = cb(_dropout, x), cb(_dropout, x)
  torch.manual_seed(0)
  b1 = cb(_dropout, x)
  np.testing.assert_array_equal(np.asarray(a1), np.asarray(b1))
  assert not np.array_equal(np.asarray(a1), np.asarray(a2))  # a fresh seed per call
  assert set(np.unique(np.asarray(a1))) <= {0.0, 2.0}
  assert 0 < int((np.asarray(a1) == 0).sum()) < 64
  jitted = jax.jit(lambda a: cb(_dropout, a))
  torch.manual_seed(0)
  c1, c2 = jitted(x), jitted(x)
  torch.manual_seed(0)
  d1 = jitted(x)
  np.testing.assert_array_equal(np.asarray(c1), np.asarray(d1))
  assert not np.array_equal(np.asarray(c1), np.asarray(c2))


def test_dropout_grad_is_a_scaled_mask():
  # the gradient of sum(dropout(x)) at ones is 2 where kept, 0 where dropped
  x = jnp.ones((64,))
  torch.manual_seed(1)
  value, g = jax.jit(jax.value_and_grad(lambda a: cb(_dropout, a).sum()))(x)
  assert set(np.unique(np.asarray(g))) <= {0.0, 2.0}
  assert 0 < int((np.asarray(g) == 0).sum()) < 64


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_dropout_grad_matches_forward_mask(jit):
  weights = 2.0 ** -jnp.arange(24.0)  # so the value alone also reveals the mask

  def loss(a):
    y = cb(_dropout, a)
    return (y * weights).sum(), y

  f = jax.value_and_grad(loss, has_aux=True)
  if jit:
    f = jax.jit(f)
  torch.manual_seed(0)
  (value, out), g = f(jnp.ones((24,)))
  mask = np.asarray(out) != 0
  np.testing.assert_array_equal(np.asarray(g), np.where(mask, 2.0, 0.0) * np.asarray(weights))
  np.testing.assert_allclose(float(value), float((np.asarray(out) * np.asarray(weights)).sum()))


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize(
  "fn,fragment",
  [
    (lambda t: t[t > 0], "depends on the data"),
    (torch.nonzero, "aten.nonzero"),
    (lambda t: t * t.sum().item(), ".item()"),
    (lambda t: t if t.sum() > 0 else -t, ".item()"),
  ],
  ids=["bool_mask", "nonzero", "item", "if_tensor"],
)
def test_data_dependent_shapes_raise_traced_value_error(fn, fragment, jit):
  call = lambda a: cb(fn, a)
  if jit:
    call = jax.jit(call)
  with pytest.raises(bridge.TracedValueError) as info:
    call(jnp.array([1.0, -2.0, 3.0]))
  message = str(info.value)
  assert "result_shape_dtypes" in message
  assert fragment in message
  assert isinstance(info.value, bridge.BridgeError) and isinstance(info.value, RuntimeError)


class _Positive(torch.nn.Module):
  def forward(self, t):
    return t[t > 0]


@pytest.mark.parametrize(
  "api, advice",
  [
    ("call_torch", "bridge.call_torch(fn, ..., mode='callback', result_shape_dtypes="),
    ("jax_view", "bridge.jax_view(fn, mode='callback', result_shape_dtypes="),
    ("extract_jax", "bridge.extract_jax(module, mode='callback', result_shape_dtypes="),
  ],
)
def test_traced_value_error_names_the_api_called_and_its_keyword(api, advice):
  x = jnp.array([1.0, -2.0, 3.0])
  with pytest.raises(bridge.TracedValueError) as info:
    if api == "call_torch":
      jax.jit(lambda a: bridge.call_torch(_Positive(), a, mode="callback"))(x)
    elif api == "jax_view":
      jax.jit(bridge.jax_view(_Positive(), mode="callback"))(x)
    else:
      params, fn = bridge.extract_jax(_Positive(), mode="callback")
      jax.jit(fn)(params, x)
  message = str(info.value)
  assert message.startswith(
    f"`bridge.{api}(..., mode='callback')`: the shapes of `_Positive.forward`'s outputs"
  )
  assert f"`{advice}jax.ShapeDtypeStruct(shape, dtype))`" in message
  assert [name for name in ("call_torch", "jax_view", "extract_jax") if name in message] == [api]
  if api == "extract_jax":  # the advice works
    params, fn = bridge.extract_jax(
      _Positive(), mode="callback", result_shape_dtypes=S((2,), x.dtype)
    )
    np.testing.assert_array_equal(jax.jit(fn)(params, x), [1.0, 3.0])


class _Boom(ValueError):
  pass


def _explode_on_real_data(t):
  if not _is_fake(t):  # the fake run (shapes) succeeds; the real run raises
    raise _Boom(f"boom: bad value in tensor of shape {tuple(t.shape)}")
  return t * 2


def test_exception_in_torch_eager_is_reraised_as_is():
  with pytest.raises(_Boom, match=r"^boom: bad value in tensor of shape \(3,\)$") as info:
    cb(_explode_on_real_data, jnp.ones(3))
  assert type(info.value) is _Boom
  # and the process is fine afterwards
  _assert_close(cb(torch.cos, jnp.zeros(2)), torch.ones(2))


def test_exception_in_torch_under_jit_is_a_jax_runtime_error():
  with pytest.raises(jax.errors.JaxRuntimeError) as info:
    jax.jit(lambda a: cb(_explode_on_real_data, a))(jnp.ones(3))
  message = str(info.value)
  assert "_Boom" in message
  assert "boom: bad value in tensor of shape (3,)" in message
  assert "_explode_on_real_data" in message  # the function's name, and its frame
  assert "Traceback" in message and "test_callback.py" in message
  _assert_close(jax.jit(lambda a: cb(torch.cos, a))(jnp.zeros(2)), torch.ones(2))


def test_exception_in_fake_run_is_the_original_with_a_note():
  def always(t):
    raise KeyError("no such key")

  for call in (lambda a: cb(always, a), jax.jit(lambda a: cb(always, a))):
    with pytest.raises(KeyError, match="no such key") as info:
      call(jnp.ones(3))
    assert any("result_shape_dtypes" in n for n in getattr(info.value, "__notes__", []))


def test_exception_in_torch_backward():
  class Bad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
      return x * 2

    @staticmethod
    def backward(ctx, g):
      raise ZeroDivisionError("bad backward")

  f = lambda a: cb(Bad.apply, a).sum()
  with pytest.raises(jax.errors.JaxRuntimeError) as info:
    jax.jit(jax.grad(f))(jnp.ones(3))
  assert "the backward of" in str(info.value)
  assert "ZeroDivisionError: bad backward" in str(info.value)
  with pytest.raises((ZeroDivisionError, jax.errors.JaxRuntimeError), match="bad backward"):
    jax.grad(f)(jnp.ones(3))


def test_wrong_result_shape_dtypes():
  x = jnp.ones(3)
  with pytest.raises(jax.errors.JaxRuntimeError) as info:
    jax.jit(lambda a: cb(torch.sin, a, result_shape_dtypes=S((4,), jnp.float32)))(x)
  message = str(info.value)
  assert "float32[3]" in message and "float32[4]" in message
  assert "result_shape_dtypes" in message
  with pytest.raises(bridge.BridgeError, match=r"float32\[3\].*int32\[3\]"):
    cb(torch.sin, x, result_shape_dtypes=S((3,), jnp.int32))
  with pytest.raises(bridge.BridgeError, match="returned 1 output leaves, but 2 were expected"):
    cb(torch.sin, x, result_shape_dtypes=(S((3,), jnp.float32), S((3,), jnp.float32)))
  # right ones, as a pytree
  out = cb(torch.sin, x, result_shape_dtypes=[S((3,), jnp.float32)])
  assert isinstance(out, list) and len(out) == 1
  _assert_close(out[0], torch.sin(torch.ones(3)))


def test_invalid_mode_and_trace_mode_options():
  x = jnp.ones(3)
  for bad in ("Callback", None, "eager"):
    with pytest.raises(bridge.BridgeTypeError, match="is not one of 'trace', 'callback'"):
      bridge.call_torch(torch.sin, x, mode=bad)
    with pytest.raises(bridge.BridgeTypeError, match="is not one of 'trace', 'callback'"):
      bridge.jax_view(torch.sin, mode=bad)
  options = [dict(vmap_method="sequential"), dict(result_shape_dtypes=S((3,), jnp.float32))]
  for kw in options:
    with pytest.raises(bridge.BridgeTypeError, match="options of mode='callback'"):
      bridge.call_torch(torch.sin, x, **kw)
    with pytest.raises(bridge.BridgeTypeError, match="options of mode='callback'"):
      bridge.call_torch(torch.sin, x, mode="trace", **kw)
    with pytest.raises(bridge.BridgeTypeError, match="options of mode='callback'"):
      bridge.jax_view(torch.sin, **kw)
  with pytest.raises(bridge.BridgeTypeError, match="vmap_method='bogus' is not one of"):
    cb(torch.sin, x, vmap_method="bogus")
  assert issubclass(bridge.BridgeTypeError, TypeError)


def test_exception_in_torch_eager_after_a_successful_call():
  state = {"fail": False}

  def fn(t):
    if state["fail"] and not _is_fake(t):
      raise _Boom("boom later")
    return t * 2

  x = jnp.ones(3)
  _assert_close(cb(fn, x), torch.full((3,), 2.0))
  state["fail"] = True
  with pytest.raises(_Boom, match="boom later"):
    cb(fn, x)


def test_exception_under_jit_after_a_successful_call_keeps_the_message():
  state = {"fail": False}

  def fn(t):
    if state["fail"] and not _is_fake(t):
      raise _Boom("boom later")
    return t * 2

  jitted = jax.jit(lambda a: cb(fn, a))
  _assert_close(jitted(jnp.ones(3)), torch.full((3,), 2.0))
  state["fail"] = True
  # JAX's own fast path raises runtime errors of a cached program as ValueError
  with pytest.raises((jax.errors.JaxRuntimeError, ValueError)) as info:
    jitted(jnp.ones(3))
  assert "_Boom: boom later" in str(info.value)


# --- caching bugs -----------------------------------------------------------------------------


def test_static_arguments_of_equal_hash_but_different_type():
  i = jnp.arange(3, dtype=jnp.int32)
  add = lambda t, s: t + s
  out_int = cb(add, i, 1)
  assert out_int.dtype == jnp.int32
  out_float = cb(add, i, 1.0)
  assert out_float.dtype == jnp.float32  # torch: int32 tensor + 1.0 -> float32
  _assert_close(out_float, torch.arange(3, dtype=torch.int32) + 1.0)


def test_result_shape_dtypes_are_not_cached_by_identity():
  masks = {2: jnp.array([True, False, True, False]), 1: jnp.array([False, False, True, False])}
  first_true = lambda t: torch.nonzero(t).reshape(-1).to(torch.int32)
  for step in range(6):
    n = 2 if step % 2 == 0 else 1
    out = cb(first_true, masks[n], result_shape_dtypes=S((n,), jnp.int32))
    _assert_close(out, torch.nonzero(_t(masks[n])).reshape(-1).to(torch.int32))


@pytest.mark.parametrize("how", ["grad", "jit_grad", "jit_value_and_grad"])
def test_module_buffers_updated_once_under_grad(how):
  # the backward recomputes the forward: BatchNorm's running statistics (which it writes
  # without bumping their version counter) must still be updated once, as in torch
  torch.manual_seed(0)
  bn = torch.nn.BatchNorm1d(3)
  x = _np((8, 3))
  loss = lambda a: (cb(bn, a) ** 2 * jnp.arange(3.0)).sum()
  f = {
    "grad": jax.grad(loss),
    "jit_grad": jax.jit(jax.grad(loss)),
    "jit_value_and_grad": lambda a: jax.jit(jax.value_and_grad(loss))(a)[1],
  }[how]
  g = f(jnp.asarray(x))
  got = (bn.running_mean.clone(), bn.running_var.clone(), int(bn.num_batches_tracked))
  bn.reset_running_stats()
  tx = torch.from_numpy(x).requires_grad_()
  (bn(tx) ** 2 * torch.arange(3.0)).sum().backward()  # torch: one forward, one update
  assert got[2] == int(bn.num_batches_tracked) == 1
  torch.testing.assert_close(got[0], bn.running_mean)
  torch.testing.assert_close(got[1], bn.running_var)
  _assert_close(g, tx.grad)


# --- nesting, views, scan ---------------------------------------------------------------------


def test_call_jax_inside_callback():
  seen = []

  def fn(t):
    u = bridge.call_jax(jnp.sin, t)
    seen.append((_is_fake(t), type(u) is torch.Tensor or _is_fake(u), u.device.type))
    return u * 2 + t

  x = jnp.asarray(_np((4,)))
  expected = torch.sin(_t(x)) * 2 + _t(x)
  _assert_close(cb(fn, x), expected)
  _assert_close(jax.jit(lambda a: cb(fn, a))(x), expected)
  assert (False, True, "cpu") in seen and (True, True, "cpu") in seen
  grad_ref = 2 * torch.cos(_t(x)) + 1
  _assert_close(jax.grad(lambda a: cb(fn, a).sum())(x), grad_ref)
  _assert_close(jax.jit(jax.grad(lambda a: cb(fn, a).sum()))(x), grad_ref)


def test_jax_view_callback_mode():
  calls = []

  def fn(t, s):
    calls.append(_is_fake(t))
    return torch.sin(t) * s

  view = bridge.jax_view(fn, mode="callback")
  assert view.__wrapped__ is fn and view.__name__ == "fn"
  x = jnp.asarray(_np((3,)))
  _assert_close(view(x, 3.0), torch.sin(_t(x)) * 3.0)
  _assert_close(jax.jit(view, static_argnums=1)(x, 2.0), torch.sin(_t(x)) * 2.0)
  assert calls.count(False) == 2 and calls[0] is True
  _assert_close(jax.grad(lambda a: view(a, 2.0).sum())(x), torch.cos(_t(x)) * 2.0)
  # a .numpy() body runs for real, so it is not traced
  spec_view = bridge.jax_view(
    lambda t: torch.from_numpy(t.numpy() * 2),
    mode="callback",
    result_shape_dtypes=S((3,), jnp.float32),
  )
  _assert_close(jax.jit(spec_view)(x), _t(x) * 2)


def test_jax_view_callback_decorator():
  @bridge.jax_view(mode="callback")
  def scaled_exp(t, *, scale=2.0):
    """Doc."""
    return t.exp() * scale

  @bridge.jax_view(mode="callback", vmap_method="broadcast_all")
  def rowsum(t):
    rowsum.calls.append(tuple(t.shape))
    return t.sum(-1)

  rowsum.calls = []

  x = jnp.asarray(_np((4,)))
  assert scaled_exp.__name__ == "scaled_exp" and scaled_exp.__doc__ == "Doc."
  _assert_close(scaled_exp(x), _t(x).exp() * 2.0)
  _assert_close(jax.jit(lambda a: scaled_exp(a, scale=3.0))(x), _t(x).exp() * 3.0)
  xs = jnp.asarray(_np((5, 3)))
  _assert_close(jax.vmap(rowsum)(xs), _t(xs).sum(-1))
  assert rowsum.calls[-1] == (5, 3)
  module_view = bridge.jax_view(torch.nn.Tanh(), mode="callback")
  _assert_close(jax.jit(module_view)(x), torch.tanh(_t(x)))


def _scan_step(c, xi):
  return c * 0.5 + xi.sin()


def test_scan_over_callback_body():
  calls = []

  def body_torch(c, xi):
    calls.append(_is_fake(c))
    return _scan_step(c, xi)

  def body(c, xi):
    nc = cb(body_torch, c, xi)
    return nc, nc.sum()

  xs = _np((5, 2))
  c0 = _np((2,))
  carry, ys = jax.jit(lambda c, a: jax.lax.scan(body, c, a))(jnp.asarray(c0), jnp.asarray(xs))
  tc, tys = torch.from_numpy(c0), []
  for xi in torch.from_numpy(xs):
    tc = _scan_step(tc, xi)
    tys.append(tc.sum())
  _assert_close(carry, tc)
  _assert_close(ys, torch.stack(tys))
  assert calls.count(False) == 5  # one real torch call per step
  # gradient through the scan, against torch autograd of the loop
  loss = lambda c, a: jax.lax.scan(body, c, a)[0].sum()
  gc, gx = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.asarray(c0), jnp.asarray(xs))
  tc0 = torch.from_numpy(c0).requires_grad_()
  txs = torch.from_numpy(xs).requires_grad_()
  tc = tc0
  for k in range(5):
    tc = _scan_step(tc, txs[k])
  tc.sum().backward()
  _assert_close(gc, tc0.grad)
  _assert_close(gx, txs.grad)
