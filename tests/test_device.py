"""The `jax` torch device as PyTorch users know devices: factories, moves, module, RNG, save/load."""

from __future__ import annotations

import copy
import io
import os
import pickle
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from tests import xla

JAX0 = torch.device("jax", 0)


def _on_jax(t: torch.Tensor) -> bool:
  return isinstance(t, bridge.Tensor) and t.device == JAX0


FACTORIES = {
  "zeros": (lambda d: torch.zeros(2, 3, device=d), True),
  "ones": (lambda d: torch.ones(2, 3, dtype=torch.float64, device=d), True),
  "empty": (lambda d: torch.empty(4, device=d).fill_(2.5), True),
  "full": (lambda d: torch.full((2, 2), 7, device=d), True),
  "full_float": (lambda d: torch.full((3,), 1.5, device=d), True),
  "arange": (lambda d: torch.arange(5, device=d), True),
  "arange_float": (lambda d: torch.arange(0, 1, 0.25, device=d), True),
  "linspace": (lambda d: torch.linspace(-1, 1, 5, device=d), True),
  "eye": (lambda d: torch.eye(3, device=d), True),
  "tensor": (lambda d: torch.tensor([[1, 2], [3, 4]], device=d), True),
  "tensor_bool": (lambda d: torch.tensor([True, False], device=d), True),
  "as_tensor": (lambda d: torch.as_tensor(np.arange(4.0), device=d), True),
  "zeros_like": (lambda d: torch.zeros_like(torch.ones(2, device=d)), True),
  "randn": (lambda d: torch.randn(3, 4, device=d), False),
  "rand": (lambda d: torch.rand(5, device=d), False),
  "randint": (lambda d: torch.randint(0, 10, (6,), device=d), False),
}


@pytest.mark.parametrize("name", list(FACTORIES))
def test_factories(name):
  make, deterministic = FACTORIES[name]
  t = make("jax")
  ref = make("cpu")
  assert _on_jax(t)
  assert t.shape == ref.shape and t.dtype is ref.dtype
  if deterministic:
    torch.testing.assert_close(t.cpu(), ref)


def test_random_factories_have_the_right_distribution():
  torch.manual_seed(0)
  x = torch.randn(20000, device="jax").cpu()
  u = torch.rand(20000, device="jax").cpu()
  r = torch.randint(3, 7, (20000,), device="jax").cpu()
  assert abs(x.mean().item()) < 0.05 and abs(x.std().item() - 1) < 0.05
  assert 0 <= u.min().item() and u.max().item() < 1 and abs(u.mean().item() - 0.5) < 0.02
  assert r.dtype is torch.int64 and set(r.unique().tolist()) == {3, 4, 5, 6}


def test_factory_keeps_requires_grad():
  t = torch.zeros(3, device="jax", requires_grad=True)
  assert t.requires_grad and t.is_leaf and _on_jax(t)


def test_moves_and_conversions_round_trip():
  cpu = torch.arange(12, dtype=torch.float32).reshape(3, 4)
  for t in (cpu.to("jax"), cpu.jax(), cpu.to(device="jax", dtype=torch.float64)):
    assert _on_jax(t) and t.is_jax
    assert t.cpu().dtype is t.dtype
    torch.testing.assert_close(t.to("cpu"), cpu.to(t.dtype))
  t = cpu.to("jax")
  assert t.to(torch.int32).dtype is torch.int32 and _on_jax(t.to(torch.int32))
  np.testing.assert_array_equal(t.numpy(), cpu.numpy())
  assert t.tolist() == cpu.tolist()
  assert t[1, 2].item() == 6.0 and isinstance(t[1, 2].item(), float)
  assert torch.tensor(3, device="jax").item() == 3
  assert not cpu.is_jax


@pytest.mark.parametrize(
  "dtype",
  [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
  ],
)
def test_dtypes_round_trip_exactly(dtype):
  cpu = (torch.randn(5, 3) * 100).to(dtype)
  t = cpu.to("jax")
  assert t.dtype is dtype
  back = t.cpu()
  assert back.dtype is dtype and torch.equal(back, cpu)


def test_repr_shows_values_and_device():
  t = torch.tensor([1.5, 2.0], device="jax")
  assert repr(t) == "tensor([1.5000, 2.0000], device='jax:0')"
  r = torch.ones(2, device="jax", requires_grad=True)
  assert repr(r) == "tensor([1., 1.], device='jax:0', requires_grad=True)"
  assert "grad_fn=<MulBackward0>" in repr(r * 2)


def test_views_of_views_cancel_and_share():
  a = jax.numpy.arange(4.0)
  t = bridge.torch_view(a)
  assert bridge.jax_view(t) is a
  t2 = torch.ones(3, device="jax")
  assert bridge.jax_view(bridge.torch_view(bridge.jax_view(t2))) is bridge.jax_view(t2)
  with pytest.raises(bridge.BridgeTypeError, match=r"torch tensor on cpu.*bridge.to_jax"):
    bridge.jax_view({"w": torch.ones(1)})


def test_module_to_jax_keeps_parameters_and_moves_buffers():
  model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
  model.to("jax")
  for name, p in model.named_parameters():
    assert isinstance(p, torch.nn.Parameter) and _on_jax(p) and p.requires_grad, name
  for name, b in model.named_buffers():
    assert _on_jax(b), name
  model.jax()  # the generated method works too
  out = model(torch.randn(5, 3, device="jax"))
  assert _on_jax(out) and out.shape == (5, 4)


def test_empty_and_moves_compile_nothing_and_are_zero_filled():
  """`torch.empty` (and so every `.to("jax")`, which is empty + copy) allocates host zeros:
  no XLA compile per new shape (tens of milliseconds each, ~0.4 s for a GPT-2's weights)."""
  with xla.counting_compiles() as compiles:
    small = torch.empty(7, 13, dtype=torch.float64, device="jax")  # shapes no test used before
    large = torch.empty(517, 1031, dtype=torch.bfloat16, device="jax")  # a mapped buffer
    none = torch.empty(0, 11, dtype=torch.int64, device="jax")
    model = torch.nn.Linear(519, 1033)
    expected = model.weight.detach().clone()
    model.to("jax")
  assert compiles == []
  for t, dtype, shape in (
    (small, torch.float64, (7, 13)),
    (large, torch.bfloat16, (517, 1031)),
    (none, torch.int64, (0, 11)),
  ):
    assert t.dtype == dtype and t.shape == shape
    torch.testing.assert_close(t.cpu(), torch.zeros(shape, dtype=dtype), rtol=0, atol=0)
  torch.testing.assert_close(model.weight.cpu(), expected, rtol=0, atol=0)
  large.add_(1)  # the buffer is the tensor's own: other empties stay zero
  assert bool((large == 1).all())
  assert not bool(torch.empty(517, 1031, dtype=torch.bfloat16, device="jax").any())


def test_setting_data_moves_the_storage_too():
  """`t.data = new` (and `module.to(dtype)`, which assigns `param.data`) changes what a `jax`
  tensor holds, not only its metadata."""
  torch.manual_seed(0)
  ref = torch.nn.Linear(4, 3)
  model = copy.deepcopy(ref).to("jax")
  weight = model.weight
  model.to(torch.bfloat16)
  ref.to(torch.bfloat16)
  assert model.weight is weight and weight.dtype == torch.bfloat16
  x = torch.randn(2, 4, dtype=torch.bfloat16)
  torch.testing.assert_close(model(x.to("jax")).cpu(), ref(x))
  model.double()
  with jax.enable_x64(True):  # (a 64-bit view needs JAX's 64-bit types)
    assert bridge.jax_view(model.bias.detach()).dtype == jnp.float64
  with torch.no_grad():
    weight.data = torch.full((5, 5), 2.0, device="jax", dtype=torch.float64)
  assert weight.shape == (5, 5) and torch.equal(
    weight.cpu(), torch.full((5, 5), 2.0, dtype=torch.float64)
  )
  with pytest.raises(bridge.BridgeTypeError, match=r"Move it first: `t.data = new.to\('jax:0'\)`"):
    weight.data = torch.ones(2)


def test_set_default_device():
  torch.set_default_device("jax")
  try:
    t = torch.ones(2)
    assert _on_jax(t)
    assert _on_jax(torch.arange(3)) and _on_jax(torch.randn(2))
  finally:
    torch.set_default_device(None)
  assert torch.ones(1).device.type == "cpu"


def test_device_module():
  assert torch.jax.is_available()
  assert torch.jax.device_count() == len(jax.local_devices()) >= 1
  assert torch.jax.current_device() == 0
  torch.jax.synchronize()
  torch.jax.manual_seed(1)
  a = torch.randn(4, device="jax").cpu()
  torch.jax.manual_seed(1)
  assert torch.equal(a, torch.randn(4, device="jax").cpu())


def test_rng_is_reproducible_and_advances():
  torch.manual_seed(123)
  a, b = torch.rand(8, device="jax").cpu(), torch.rand(8, device="jax").cpu()
  torch.manual_seed(123)
  a2, b2 = torch.rand(8, device="jax").cpu(), torch.rand(8, device="jax").cpu()
  assert torch.equal(a, a2) and torch.equal(b, b2)
  assert not torch.equal(a, b)
  torch.manual_seed(124)
  assert not torch.equal(torch.rand(8, device="jax").cpu(), a)


def test_fork_rng_restores_the_jax_generator():
  torch.manual_seed(5)
  with torch.random.fork_rng(device_type="jax"):
    torch.rand(3, device="jax")
  after = torch.rand(3, device="jax").cpu()
  torch.manual_seed(5)
  assert torch.equal(after, torch.rand(3, device="jax").cpu())


def test_scalars_and_zero_dim_cpu_tensors_mix_like_cuda():
  t = torch.arange(3.0, device="jax")
  torch.testing.assert_close((t * 2 + torch.tensor(1.0)).cpu(), torch.tensor([1.0, 3.0, 5.0]))
  torch.testing.assert_close((torch.tensor(2.0) * t).cpu(), torch.tensor([0.0, 2.0, 4.0]))


def test_non_scalar_cpu_tensor_is_a_device_mismatch():
  t = torch.ones(3, device="jax")
  with pytest.raises(RuntimeError) as info:
    t + torch.ones(3)
  assert isinstance(info.value, bridge.DeviceMismatchError)
  assert "jax:0" in str(info.value) and "cpu" in str(info.value)


def test_save_and_load_round_trip():
  model = torch.nn.Linear(3, 2).to("jax")
  state = model.state_dict()
  buf = io.BytesIO()
  torch.save({"state": state, "t": torch.arange(4, device="jax")}, buf)
  buf.seek(0)
  loaded = torch.load(buf)
  assert loaded["t"].device.type == "cpu" and loaded["t"].tolist() == [0, 1, 2, 3]
  torch.testing.assert_close(loaded["state"]["weight"], model.weight.detach().cpu())
  buf.seek(0)
  on_jax = torch.load(buf, map_location="jax")
  assert _on_jax(on_jax["t"]) and _on_jax(on_jax["state"]["bias"])
  fresh = torch.nn.Linear(3, 2)
  fresh.load_state_dict(loaded["state"])
  torch.testing.assert_close(fresh.weight, model.weight.detach().cpu())
  again = pickle.loads(pickle.dumps(torch.ones(2, device="jax")))
  assert again.tolist() == [1.0, 1.0]


def test_saved_file_loads_without_bridge(tmp_path):
  path = tmp_path / "t.pt"
  torch.save({"w": torch.arange(3.0, device="jax")}, path)
  code = f"import torch, sys; d = torch.load({str(path)!r}); print(d['w'].device, d['w'].tolist(), 'bridge' in sys.modules)"
  env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == "cpu [0.0, 1.0, 2.0] False"


def _python(code: str, autoload: bool) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
  if not autoload:
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
  return subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
  )


def test_autoload_makes_the_device_available_after_import_torch():
  # it registers the device only (about 2 ms), without importing JAX or bridge: the first
  # `jax` tensor (or `torch.jax`) loads them
  code = (
    "import sys, torch\n"
    "print('jax' in sys.modules, 'bridge' in sys.modules, torch.device('jax'), repr(torch.jax))\n"
    "t = torch.arange(3.0).to('jax') * 2\n"
    "print('bridge' in sys.modules, t.device, type(t).__name__, t.cpu().tolist())\n"
  )
  out = _python(code, autoload=True)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.splitlines() == [
    "False False jax <module 'torch.jax' (bridge's jax device)>",
    "True jax:0 Tensor [0.0, 2.0, 4.0]",
  ]
  off = _python("import torch; torch.randn(2, device='jax')", autoload=False)
  assert off.returncode != 0 and "jax" in off.stderr


def test_bad_device_index():
  n = torch.jax.device_count()
  with pytest.raises(bridge.TransferError, match=rf"jax:{n} does not exist.*{n} JAX device"):
    torch.zeros(2, device=f"jax:{n}")


@pytest.mark.parametrize(
  "make, match",
  [
    (lambda: torch.zeros(2, dtype=torch.complex32), "complex32"),
    (lambda: torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8), "quantized"),
  ],
)
def test_unsupported_dtypes_are_refused(make, match):
  with pytest.raises(TypeError, match=match):
    make().to("jax")


def test_debug_print_each_op(capsys):
  x = torch.ones(2, 3, device="jax")
  with bridge.config(debug_print_each_op=True):
    (x * 2).sum()
  err = capsys.readouterr().err
  assert "[bridge] aten.mul.Tensor(float32[2, 3], 2)" in err
  assert "aten.sum" in err
  x * 3
  assert "aten.mul" not in capsys.readouterr().err


def test_config_stack_restores():
  assert bridge.get_config().debug_print_each_op is False
  with bridge.config(debug_print_each_op=True):
    with bridge.config(decompose_missing_ops=False):
      c = bridge.get_config()
      assert c.debug_print_each_op and not c.decompose_missing_ops
    assert bridge.get_config().decompose_missing_ops
  assert bridge.get_config() == bridge._src.config.Config()
  with pytest.raises(bridge.BridgeTypeError, match="unknown setting.*debug_print_each_op"):
    bridge.config(debug_print=True)


def test_an_op_failing_in_backward_raises_instead_of_aborting():
  # Torch's Python device guard cannot exchange streams; an error unwinding through the
  # autograd engine's stream guard used to abort the process. Run it in a subprocess.
  import subprocess
  import sys

  code = (
    "import torch, bridge\n"
    "from bridge._src import tensor as T\n"
    "x = torch.ones(3, device='jax', requires_grad=True)\n"
    "y = x.sin().sum()\n"
    "def boom(args, kwargs): raise ValueError('boom in backward')\n"
    "T._PLANS[torch.ops.aten.cos.default] = boom\n"
    "try:\n"
    "  y.backward()\n"
    "except ValueError as e:\n"
    "  print('raised:', e)\n"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == "raised: boom in backward"


@pytest.mark.parametrize("requires_grad", [False, True])
def test_linear_and_matmul_run_whole_unless_autograd_records_them(requires_grad):
  torch.manual_seed(0)
  x = torch.randn(5, 4, 6).transpose(0, 1)  # non-contiguous 3-D: torch's matmul would expand
  w, b = torch.randn(3, 6, requires_grad=requires_grad), torch.randn(3)
  m = torch.randn(6, 2)
  xj, wj, bj, mj = (t.detach().to("jax").requires_grad_(t.requires_grad) for t in (x, w, b, m))
  out = torch.nn.functional.linear(xj, wj, bj)
  torch.testing.assert_close(out.cpu(), torch.nn.functional.linear(x, w, b))
  torch.testing.assert_close(torch.matmul(xj, mj).cpu(), torch.matmul(x, m))
  torch.testing.assert_close((xj @ mj[:, 0]).cpu(), x @ m[:, 0])
  assert out.requires_grad == requires_grad
  if requires_grad:
    out.sum().backward()
    torch.nn.functional.linear(x, w, b).sum().backward()
    torch.testing.assert_close(wj.grad.cpu(), w.grad)
  with pytest.raises(RuntimeError, match="dtype"):
    torch.nn.functional.linear(xj, wj.detach().double())


def test_ops_returning_python_values_return_them():
  a = torch.arange(4.0, device="jax")
  assert torch.equal(a, a) is True and torch.equal(a, a + 1) is False
  assert torch.allclose(a, a + 1e-9) is True and torch.allclose(a, a + 1) is False


# What `import bridge` does in a process where torch can use a CUDA GPU (simulated: the CPU
# build cannot): torch's PrivateUse1 backend stays unnamed, so that torch keeps CUDA for its
# accelerator and CUDA backward passes work (pytorch/pytorch#161129); everything bridge builds
# on the backend still works; `bridge.register_jax_device()` names it, with a warning.
_CUDA_PROCESS = """
import warnings
import torch
torch.cuda.is_available = lambda: True  # as on a CUDA machine (the CPU build cannot use it)
import jax, jax.numpy as jnp, numpy as np
import bridge
assert torch.accelerator.current_accelerator() is None, torch.accelerator.current_accelerator()

def f(x, w):
  return torch.tanh(x @ w).sum()
x, w = np.ones((3, 4), np.float32), np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)
val, grads = jax.jit(jax.value_and_grad(lambda a, b: bridge.call_torch(f, a, b), argnums=(0, 1)))(x, w)
tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
want = f(tx, tw); want.backward()
np.testing.assert_allclose(float(val), float(want), rtol=1e-6)
np.testing.assert_allclose(np.asarray(grads[1]), tw.grad.numpy(), rtol=1e-5)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.0), torch.nn.GELU(), torch.nn.Linear(8, 2))
compiled = bridge.compile(model)
xi = torch.randn(5, 4, requires_grad=True)
out = compiled(xi)
torch.testing.assert_close(out, model(xi))
out.sum().backward()
g = xi.grad.clone(); xi.grad = None
model(xi).sum().backward()
torch.testing.assert_close(g, xi.grad)

params, fn = bridge.extract_jax(model)
np.testing.assert_allclose(np.asarray(fn(params, jnp.asarray(xi.detach().numpy()))), model(xi).detach().numpy(), rtol=1e-5, atol=1e-6)

t = bridge.torch_view(jnp.arange(3.0))
assert t.device.type == "privateuseone", t.device
assert (t * 2).device == t.device
assert torch.accelerator.current_accelerator() is None
try:
  torch.ones(2, device="jax")
except RuntimeError as e:
  assert "jax" in str(e)
else:
  raise AssertionError("the jax device string worked unnamed")
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter("always")
  bridge.register_jax_device()
assert [type(c.message) for c in caught] == [bridge.CudaAutogradWarning], caught
assert torch.accelerator.current_accelerator().type == "jax"
assert t.device.type == "jax" and torch.ones(2, device="jax").device == t.device
print("ok")
"""


def test_where_torch_can_use_cuda_the_backend_stays_unnamed_until_asked():
  env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
  out = subprocess.run(
    [sys.executable, "-W", "ignore::UserWarning", "-c", _CUDA_PROCESS],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_forward_mode_ad_on_the_jax_device_matches_cpu():
  # make_dual asked `_has_same_storage_numel` through the callback fallback (a
  # FallbackWarning), which answered for contiguous CPU copies; a primal that is a view at an
  # offset then needed `_efficientzerotensor`, which the device did not have.
  import torch.autograd.forward_ad as fwAD

  for make in (lambda d: torch.ones(3, device=d), lambda d: torch.arange(5.0, device=d)[1:4]):
    got, want = [], []
    for device, out in (("jax", got), ("cpu", want)):
      with warnings.catch_warnings():
        warnings.simplefilter("error", bridge.FallbackWarning)
        with fwAD.dual_level():
          d = fwAD.make_dual(make(device), torch.arange(3.0, device=device))
          out.extend(fwAD.unpack_dual(f).tangent for f in (d * 2, d.sin(), d[1:].exp()))
    for g, w in zip(got, want):
      assert g.device.type == "jax"
      torch.testing.assert_close(g.cpu(), w)
