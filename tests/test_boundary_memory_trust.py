"""Memory across the torch/JAX boundary, as probed: a JAX array never changes because torch code
in callback mode wrote to its input through a tensor torch does not count as a view (`x.data`,
a tensor `set_` to its storage, the storage itself); an input tensor that outlives an eager
callback-mode call (kept by the function, or by its exception's traceback) keeps the buffer
alive instead of aborting the process when the array is deleted; `bridge.to_jax` of a
`jax`-device tensor is the array it holds, with its device."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from tests import xla

# Writes to the input that torch's version counter and views do not show.
_HIDDEN_WRITES = {
  "data": lambda x: x.data.add_(100),
  "set_storage": lambda x: torch.empty(0, dtype=x.dtype).set_(x.untyped_storage()).add_(100),
  "storage_copy": lambda x: x.untyped_storage().copy_(
    torch.full(x.shape, 7.0, dtype=x.dtype).untyped_storage()
  ),
}


def _writing(write: str):
  """A torch function that writes its input one hidden way, then returns it."""

  def fn(x):
    _HIDDEN_WRITES[write](x)
    return x * 1

  return fn


@pytest.mark.parametrize("write", sorted(_HIDDEN_WRITES))
def test_a_hidden_write_in_callback_mode_leaves_the_array_eagerly(write):
  fn = _writing(write)
  b = jnp.arange(4.0)
  expected = fn(torch.arange(4.0))
  out = bridge.call_torch(fn, b, mode="callback")
  np.testing.assert_array_equal(np.asarray(b), np.arange(4.0))  # the caller's array
  torch.testing.assert_close(bridge.to_torch(out), expected)  # and the write seen inside


@pytest.mark.parametrize("write", sorted(_HIDDEN_WRITES))
def test_a_hidden_write_in_callback_mode_leaves_the_programs_values(write):
  fn = _writing(write)
  a = jnp.arange(4.0)
  out, other = jax.jit(lambda a: (bridge.call_torch(fn, a + 1, mode="callback"), a + 1))(a)
  np.testing.assert_array_equal(np.asarray(other), np.arange(4.0) + 1)  # XLA's own buffer
  torch.testing.assert_close(bridge.to_torch(out), fn(torch.arange(4.0) + 1))


def test_weight_clipping_through_data_in_an_extracted_module_in_callback_mode():
  class Clipped(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.lin = torch.nn.Linear(3, 2)

    def forward(self, x):
      self.lin.weight.data.clamp_(-0.01, 0.01)  # WGAN-style weight clipping
      return self.lin(x)

  torch.manual_seed(0)
  module = Clipped()
  reference = Clipped()
  reference.load_state_dict(module.state_dict())
  params, f = bridge.extract_jax(module, mode="callback")
  before = np.asarray(params["lin.weight"]).copy()
  x = jnp.ones((4, 3))
  with pytest.warns(UserWarning, match="updated 'lin.weight' in place"):
    out = f(params, x)
  np.testing.assert_array_equal(np.asarray(params["lin.weight"]), before)
  with torch.no_grad():
    expected = reference(torch.ones(4, 3))
  torch.testing.assert_close(bridge.to_torch(out), expected)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    jitted = jax.jit(f)(params, x)
  np.testing.assert_array_equal(np.asarray(params["lin.weight"]), before)
  torch.testing.assert_close(bridge.to_torch(jitted), expected)


_KEPT_INPUTS = {
  # the exception's traceback keeps the function's frame, and with it the input tensor (as
  # IPython's `sys.last_value` does)
  "traceback": """
    from torch._subclasses.fake_tensor import is_fake
    def fn(x):
      if not is_fake(x):
        raise ValueError("boom")
      return x * 2
    a = jnp.arange(4.0) + 1
    try:
      bridge.call_torch(fn, a, mode="callback")
    except ValueError as e:
      kept = e
    a.delete()
    print(kept.__traceback__.tb_next.tb_frame.f_locals.get("x") is None)
  """,
  # a forward hook that keeps the module's input
  "hook": """
    m = torch.nn.Linear(4, 4)
    acts = {}
    m.register_forward_hook(lambda mod, inp, out: acts.__setitem__("in", inp[0]))
    params, f = bridge.extract_jax(m, mode="callback")
    x = jnp.full((2, 4), 3.0)
    f(params, x)
    x.delete()
    print(acts["in"].tolist() == [[3.0] * 4] * 2)
  """,
}


@pytest.mark.parametrize("case", sorted(_KEPT_INPUTS))
def test_an_input_kept_past_an_eager_callback_survives_deleting_its_array(case):
  code = "import jax.numpy as jnp, torch, bridge\n" + textwrap.dedent(_KEPT_INPUTS[case])
  run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-2000:]  # (it aborted: rc -6)
  assert run.stdout.split()[-1] in ("True", "False"), run.stdout
  if case == "hook":
    assert run.stdout.split()[-1] == "True"  # the kept tensor still reads its values


def test_callback_mode_refuses_a_module_on_the_jax_device_by_name():
  lin = torch.nn.Linear(4, 4).to("jax")
  with pytest.raises(bridge.BridgeTypeError) as info:
    bridge.call_torch(lin, jnp.ones((2, 4)), mode="callback")
  message = str(info.value)
  assert "Linear's 'weight' is on the `jax:0` device" in message
  assert "extract_jax(module, mode='callback')" in message
  # what it advises works
  params, f = bridge.extract_jax(lin, mode="callback")
  expected = lin.cpu()(torch.ones(2, 4)).detach()
  torch.testing.assert_close(bridge.to_torch(f(params, jnp.ones((2, 4)))), expected)


def test_to_jax_of_a_jax_tensor_is_its_array():
  t = torch.arange(4.0, device="jax")
  assert bridge.to_jax(t) is bridge.jax_view(t)
  assert bridge.to_jax(t, copy=False) is bridge.jax_view(t)
  copied = bridge.to_jax(t, copy=True)
  assert copied is not bridge.jax_view(t)
  assert copied.unsafe_buffer_pointer() != bridge.jax_view(t).unsafe_buffer_pointer()
  np.testing.assert_array_equal(np.asarray(copied), np.arange(4.0))
  tree = bridge.to_jax({"a": t, "b": [t[1:3]]})
  assert tree["a"] is bridge.jax_view(t)
  np.testing.assert_array_equal(np.asarray(tree["b"][0]), [1.0, 2.0])
  conj = bridge.to_jax(torch.tensor([1 + 2j], device="jax").conj())
  np.testing.assert_array_equal(np.asarray(conj), [1 - 2j])


def test_to_jax_of_a_view_of_a_jax_tensor_without_copy_says_why():
  t = torch.arange(4.0, device="jax")
  with pytest.raises(bridge.TransferError, match="a JAX array cannot be a view"):
    bridge.to_jax(t[1:3], copy=False)


def test_to_jax_of_a_jax_tensor_keeps_its_device_and_sharding():
  code = textwrap.dedent(
    """
    import jax, torch, bridge
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    t = torch.arange(8.0, device="jax:3")
    print(bridge.to_jax(t).devices() == {jax.devices()[3]})
    mesh = Mesh(jax.devices(), ("d",))
    s = bridge.shard(torch.arange(8.0), NamedSharding(mesh, P("d")))
    a = bridge.to_jax(s)
    print(a.sharding.is_equivalent_to(NamedSharding(mesh, P("d")), 1), a.tolist() == list(range(8)))
    """
  )
  env = dict(os.environ, XLA_FLAGS=xla.with_flags("--xla_force_host_platform_device_count=4"))
  run = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
  )
  assert run.returncode == 0, run.stderr[-2000:]
  assert run.stdout.split() == ["True", "True", "True"], run.stdout
