"""Storages on the `jax` device as torch's: `resize_`, `resize_as_`, `out=` resizing and `set_`
keep (or grow) the storage their tensor shares with its views; and the errors of the public
functions for wrong arguments."""

import gc
import re
import warnings

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.autograd.forward_ad as fwAD

import bridge
from bridge._src.dispatch import mutation


def _cpu(x):
  return x.cpu() if isinstance(x, torch.Tensor) else x


# Each case runs on the CPU and on the jax device: the results (tensors read back, shapes,
# strides, offsets) must be the same. None reads uninitialized memory.
def _shrink_then_write(dev):
  x = torch.arange(6.0, device=dev)
  v = x[2:]
  x.resize_(4)
  x[2] = -1
  return v, x


def _view_resized_then_added(dev):
  x = torch.arange(8.0, device=dev)
  y = x.view(8)
  y.resize_(4)
  y.add_(100)
  return x, y


def _same_numel_views_before_and_after(dev):
  x = torch.arange(4.0, device=dev)
  before = x.view(2, 2)
  x.resize_(2, 2)
  x[0, 0] = -5
  after = x.view(2, 2)
  after[1, 1] = -6
  return before, after, x, x.stride()


def _out_resized(dev):
  x4 = torch.zeros(4, device=dev)
  v = x4[:2]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.add(torch.ones(2, 2, device=dev), 1, out=x4)
  return v, x4, x4.stride()


def _resize_as_then_fill(dev):
  x = torch.arange(6.0, device=dev)
  v = x[:2]
  x.resize_as_(torch.zeros(3, device=dev))
  x.fill_(0)
  return v, x


def _grow_keeps_views(dev):
  x = torch.arange(6.0, device=dev)
  v = x[2:]
  x.resize_(10)
  x[2] = -1
  return v, x[:6], x.shape


def _grow_keeps_whole_aliases(dev):
  x = torch.arange(6.0, device=dev)
  a = x.detach()
  x.resize_(10)
  x[0] = -1
  a[1] = -2
  return a, x[:6]


def _shrink_then_grow_within_storage(dev):
  x = torch.arange(6.0, device=dev)
  x.resize_(2)
  x.resize_(6)
  return (x,)


def _resize_a_view_with_offset(dev):
  x = torch.arange(6.0, device=dev)[1:]
  x.resize_(3)
  return x, x.storage_offset()


def _resize_same_shape_keeps_strides(dev):
  x = torch.arange(6.0, device=dev).view(2, 3).t()
  x.resize_(3, 2)
  return x, x.stride()


def _set_shares_storage(dev):
  x = torch.zeros(4, device=dev)
  y = torch.tensor([0.0, 10, 20, 30], device=dev)
  x.set_(y)
  y[0] = -7
  x[1] = -8
  return x, y


def _set_other_size(dev):
  x = torch.zeros(4, device=dev)
  y = torch.arange(6.0, device=dev)
  x.set_(y)
  x.add_(1)
  return x, y, x.shape


def _set_geometry(dev):
  x = torch.zeros(3, device=dev)
  y = torch.arange(4.0, device=dev)
  x.set_(y, 1, (2, 2))
  x[1, 1] = 5
  x.fill_(9)
  return x[:1], y, x.stride()


def _set_strided_keeps_old_views(dev):
  x = torch.zeros(3, device=dev)
  old = x[1:]
  y = torch.arange(4.0, device=dev)
  x.set_(y, 2, (2,), (2,))
  x[0] = -1
  return x[:1], y, old


def _set_transposed_source(dev):
  x = torch.zeros(3, device=dev)
  y = torch.arange(6.0, device=dev).view(2, 3).t()
  x.set_(y)
  x[0, 1] = -1
  return x, y, x.stride(), x.is_contiguous()


def _set_keywords(dev):
  x = torch.zeros(3, device=dev)
  y = torch.arange(4.0, device=dev)
  x.set_(source=y, storage_offset=1, size=(3,))
  x[0] = -1
  return x, y


def _set_grows_source_storage(dev):
  x = torch.zeros(2, device=dev)
  y = torch.arange(4.0, device=dev)
  x.set_(y, 1, (5,))
  x[0] = -1
  return y, x[:3]


def _set_empty(dev):
  x = torch.arange(3.0, device=dev)
  x.set_()
  return x.shape, x.stride(), x.storage_offset(), x + 1


CASES = {
  f.__name__.lstrip("_"): f
  for f in [
    _shrink_then_write,
    _view_resized_then_added,
    _same_numel_views_before_and_after,
    _out_resized,
    _resize_as_then_fill,
    _grow_keeps_views,
    _grow_keeps_whole_aliases,
    _shrink_then_grow_within_storage,
    _resize_a_view_with_offset,
    _resize_same_shape_keeps_strides,
    _set_shares_storage,
    _set_other_size,
    _set_geometry,
    _set_strided_keeps_old_views,
    _set_transposed_source,
    _set_keywords,
    _set_grows_source_storage,
    _set_empty,
  ]
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_storage_semantics_match_cpu(case):
  want = CASES[case]("cpu")
  with warnings.catch_warnings():
    warnings.simplefilter("error", bridge.FallbackWarning)
    got = CASES[case]("jax")
  assert len(got) == len(want)
  for g, w in zip(got, want):
    if isinstance(w, torch.Tensor):
      assert g.device.type == "jax"
      torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)
      assert (g.shape, g.stride(), g.storage_offset()) == (w.shape, w.stride(), w.storage_offset())
    else:
      assert g == w


ERRORS = {
  "set_dtype": lambda d: torch.zeros(3, device=d).set_(
    torch.zeros(3, dtype=torch.float64, device=d)
  ),
  "set_offset": lambda d: torch.zeros(3, device=d).set_(torch.zeros(3, device=d), -1, (2,)),
  "set_strides": lambda d: torch.zeros(3, device=d).set_(torch.zeros(4, device=d), 0, (2, 2), (1,)),
  "resize_preserve": lambda d: torch.zeros(3, device=d).resize_(
    2, memory_format=torch.preserve_format
  ),
  "resize_channels_last": lambda d: torch.zeros(3, device=d).resize_(
    2, 3, memory_format=torch.channels_last
  ),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_storage_errors_are_torchs(case):
  with pytest.raises(RuntimeError) as cpu:
    ERRORS[case]("cpu")
  with pytest.raises(RuntimeError) as jax_device:
    ERRORS[case]("jax")
  assert str(jax_device.value) == str(cpu.value)


def test_set_from_another_device_raises_torchs_error():
  with pytest.raises(RuntimeError) as e:
    torch.zeros(3, device="jax").set_(torch.zeros(3))
  assert str(e.value) == (
    'Attempted to set the storage of a tensor on device "jax:0" to a storage on different '
    'device "cpu".  This is no longer allowed; the devices must match.'
  )


def test_out_resize_warns_as_torch():
  with pytest.warns(
    UserWarning, match=r"had shape \[4\], which does not match the required output shape \[2, 2\]"
  ):
    torch.add(torch.ones(2, 2, device="jax"), 1, out=torch.zeros(4, device="jax"))


def test_growing_a_lone_storage_walks_no_referrers(monkeypatch):
  def refuse(*args):
    raise AssertionError("walked the referrers of a storage one tensor holds")

  walk = gc.get_referrers
  x = torch.arange(6.0, device="jax")
  monkeypatch.setattr(mutation.gc, "get_referrers", refuse)
  x.resize_(10)  # (one holder: `_ONE_HOLDER` is not too low ...)
  torch.testing.assert_close(x[:6].cpu(), torch.arange(6.0))
  calls = []
  monkeypatch.setattr(mutation.gc, "get_referrers", lambda s: calls.append(s) or walk(s))
  y = torch.arange(6.0, device="jax")
  alias = y.detach()
  y.resize_(10)  # (... nor too high: a second holder is found)
  assert len(calls) == 1 and not alias._whole


def test_share_memory_is_a_no_op_as_for_cuda():
  x = torch.arange(3.0, device="jax")
  assert x.share_memory_() is x
  assert x.is_shared()
  torch.testing.assert_close(x.cpu(), torch.arange(3.0))


def test_forward_ad_tangent_survives_the_fast_path():
  f = lambda a: jnp.sin(a)
  with fwAD.dual_level():
    x = fwAD.make_dual(torch.ones(3), torch.ones(3))
    for _ in range(3):
      tangent = fwAD.unpack_dual(bridge.call_jax(f, x)).tangent
      torch.testing.assert_close(tangent, torch.cos(torch.ones(3)))


X64 = "but JAX's 64-bit types are disabled, so JAX would silently turn it into"


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64])
def test_jax_view_refuses_64_bit_tensors_with_x64_off(dtype):
  t = torch.tensor([2**40], dtype=dtype, device="jax")
  with pytest.raises(bridge.BridgeTypeError, match=f"`bridge.jax_view`: leaf <root> .*{X64}"):
    bridge.jax_view(t)
  with jax.enable_x64(True):
    assert bridge.jax_view(t).dtype == {torch.int64: jnp.int64, torch.float64: jnp.float64}[dtype]


NOT_CALLABLE = "`fn` must be a"


@pytest.mark.parametrize(
  "call, api",
  [
    (lambda: bridge.call_jax(None, torch.ones(2)), "bridge.call_jax"),
    (lambda: bridge.call_jax(3, torch.ones(2)), "bridge.call_jax"),
    (lambda: bridge.call_torch(3, jnp.ones(2)), "bridge.call_torch"),
    (lambda: bridge.fallback_ops(3, jnp.ones(2)), "bridge.fallback_ops"),
  ],
)
def test_not_callable_fn_is_refused(call, api):
  with pytest.raises(bridge.BridgeTypeError, match=f"`{api}`: {NOT_CALLABLE}"):
    call()


@pytest.mark.parametrize("key", [0, "key", jnp.zeros(2), jnp.zeros(3, jnp.uint32)])
def test_rng_key_refuses_what_is_not_a_key(key):
  with pytest.raises(
    bridge.BridgeTypeError, match="`bridge.rng_key`: `key` must be a JAX PRNG key"
  ):
    bridge.rng_key(key)


def test_rng_key_takes_keys():
  for key in [jax.random.key(0), jax.random.PRNGKey(0), jax.random.split(jax.random.PRNGKey(0), 2)]:
    bridge.rng_key(key)


@pytest.fixture(scope="module")
def exported():
  return bridge.export(torch.nn.Linear(3, 2), torch.ones(1, 3))


def test_exported_apply_refuses_unknown_weight_names(exported):
  weights = {**exported.weights, "extra": jnp.ones(2)}
  with pytest.raises(bridge.BridgeTypeError, match=r"does not take: \['extra'\]"):
    exported.apply(weights, jnp.ones((1, 3)))


def test_exported_says_inputs_are_positional(exported):
  with pytest.raises(
    bridge.BridgeTypeError, match=r"keyword input\(s\) \['input'\] given.*pass them by position"
  ):
    exported(input=torch.ones(1, 3))


def test_tied_weights_load_back_with_strict_false():
  # (docs/call_torch.md: a tied parameter is in `params` once)
  layer = torch.nn.Linear(2, 2)
  net = torch.nn.Sequential(layer, layer)
  params, _ = bridge.extract_jax(net)
  params = {k: v + 1 for k, v in params.items()}
  with pytest.raises(RuntimeError, match="Missing key"):
    net.load_state_dict(bridge.torch_view(params))
  result = net.load_state_dict(bridge.torch_view(params), strict=False)
  assert result.unexpected_keys == []
  torch.testing.assert_close(
    net[1].weight.detach(), torch.from_numpy(jax.device_get(params["0.weight"]))
  )


@pytest.mark.parametrize(
  "make",
  [
    lambda d: torch.empty((-1,), device=d),
    lambda d: torch.full((2, -3), 1.0, device=d),
    lambda d: torch.empty_strided((-1,), (1,), device=d),
  ],
)
def test_a_negative_size_raises_torchs_error(make):
  with pytest.raises(RuntimeError) as cpu:
    make("cpu")
  with pytest.raises(RuntimeError, match=re.escape(str(cpu.value))):
    make("jax")
