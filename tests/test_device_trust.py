"""The `jax` device where torch code trusts it to act as CPU/CUDA tensors do: checkpoint's RNG
replay, `torch.save` of parameters, `torch.tensor` of 0-d tensors, `format`, `numpy()`, and
torch's CPU code (`DataLoader`, `torch.manual_seed`) with the device merely installed."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import bridge

DEVICES = ["cpu", "jax"]


def _roundtrip(obj: Any, **load: Any) -> Any:
  buf = io.BytesIO()
  torch.save(obj, buf)
  buf.seek(0)
  return torch.load(buf, **load)


def _python(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
  """`code` in a fresh interpreter with torch's backend autoload on (bridge installed, not
  imported)."""
  env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
  return subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
  )


# --- torch.utils.checkpoint replays the forward's dropout mask ---------------------------


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_checkpoint_recomputes_with_the_forwards_dropout_mask(device, use_reentrant):
  def f(x):
    return F.dropout(x, 0.5) * 2

  x = torch.ones(64, device=device, requires_grad=True)
  torch.manual_seed(5)
  y = checkpoint(f, x, use_reentrant=use_reentrant)
  y.sum().backward()
  # d(sum(dropout(x) * 2))/dx is the forward's output here (x is ones): 4 where kept, 0 not
  torch.testing.assert_close(x.grad.cpu(), y.detach().cpu())
  assert 0 < int((y != 0).sum()) < 64


def test_the_device_module_lets_torch_save_and_restore_its_generator():
  from torch.utils.checkpoint import get_device_states, set_device_states

  assert torch.jax._initialized is True  # (torch saves a device's RNG state only then)
  x = torch.ones(2, device="jax")
  devices, states = get_device_states(x)
  first = torch.rand(4, device="jax").cpu()
  set_device_states(devices, states, device_type="jax")
  torch.testing.assert_close(torch.rand(4, device="jax").cpu(), first)
  with torch.random.fork_rng(devices=[0], device_type="jax"):
    inside = torch.rand(4, device="jax").cpu()
  torch.testing.assert_close(torch.rand(4, device="jax").cpu(), inside)


# --- torch.save: what torch keeps of a tensor --------------------------------------------


def _param(device: str) -> torch.nn.Parameter:
  p = torch.nn.Parameter(torch.arange(3.0, device=device), requires_grad=False)
  p.note = {"lr_scale": 0.5}
  return p


def _tensor(device: str) -> torch.Tensor:
  t = torch.arange(3.0, device=device).requires_grad_()
  t.note = "kept"
  return t


SAVED = {
  "parameter": _param,
  "tensor_with_attributes": _tensor,
  "plain_parameter": lambda d: torch.nn.Parameter(torch.ones(2, device=d)),
}
LOADS = {
  "default": {},
  "weights_only": {"weights_only": True},
  "map_location_cpu": {"map_location": "cpu"},
  "map_location_jax": {"map_location": "jax"},
}


@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("saved", SAVED)
def test_save_keeps_what_torch_keeps(saved, load):
  kwargs = LOADS[load]
  on_cpu = _roundtrip(SAVED[saved]("cpu"), **{**kwargs, "map_location": "cpu"})
  got = _roundtrip(SAVED[saved]("jax"), **kwargs)
  assert isinstance(got, torch.nn.Parameter) == isinstance(on_cpu, torch.nn.Parameter)
  assert got.requires_grad == on_cpu.requires_grad and got.is_leaf
  assert getattr(got, "note", None) == getattr(on_cpu, "note", None)
  assert got.device.type == ("jax" if load == "map_location_jax" else "cpu")
  torch.testing.assert_close(got.detach().cpu(), on_cpu.detach())
  if got.requires_grad:  # a leaf that accumulates its gradient
    (got * 2).sum().backward()
    torch.testing.assert_close(got.grad.cpu(), torch.full_like(on_cpu, 2.0).detach())


@pytest.mark.parametrize("map_location", [None, "jax"])
def test_a_saved_module_loads_with_parameters_and_moves_again(map_location):
  model = torch.nn.Linear(2, 2).to("jax")
  loaded = _roundtrip(model, weights_only=False, map_location=map_location)
  assert all(isinstance(p, torch.nn.Parameter) for p in loaded.parameters())
  loaded.to("jax")
  assert all(isinstance(p, torch.nn.Parameter) for p in loaded.parameters())
  torch.testing.assert_close(loaded.weight.detach().cpu(), model.weight.detach().cpu())
  loaded(torch.ones(1, 2, device="jax")).sum().backward()
  assert loaded.weight.grad is not None


def test_weights_only_loads_state_dicts_and_parameter_lists():
  model = torch.nn.Linear(2, 3).to("jax")
  state = _roundtrip(model.state_dict(), weights_only=True, map_location="jax")
  assert {k: v.device.type for k, v in state.items()} == {"weight": "jax", "bias": "jax"}
  params = _roundtrip(list(model.parameters()), weights_only=True)
  assert [type(p) for p in params] == [torch.nn.Parameter] * 2


def test_backward_hooks_are_not_saved_with_torchs_warning():
  for device in DEVICES:
    t = torch.ones(2, device=device, requires_grad=True)
    t.register_hook(lambda g: g)
    with pytest.warns(UserWarning, match="backward hook .* will not be serialized"):
      loaded = _roundtrip(t)
    assert not loaded._backward_hooks


def test_callable_map_location_raises_torchs_error_for_storageless_devices():
  # (documented: torch's rule for XLA-like devices; `map_location="cpu"` loads the same)
  with pytest.raises(RuntimeError, match="Callable map_location not supported"):
    _roundtrip(torch.ones(2, device="jax"), map_location=lambda storage, loc: storage)


def test_a_saved_parameter_loads_as_a_parameter_without_bridge(tmp_path):
  path = tmp_path / "p.pt"
  torch.save({"p": _param("jax")}, path)
  code = (
    "import sys, torch\n"
    f"p = torch.load({str(path)!r}, weights_only=True)['p']\n"
    "print(type(p).__name__, p.requires_grad, p.note, p.tolist(), 'bridge' in sys.modules)\n"
  )
  env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == "Parameter False {'lr_scale': 0.5} [0.0, 1.0, 2.0] False"


# --- torch.tensor / torch.as_tensor of 0-d tensors ----------------------------------------

ELEMENT_DTYPES = [
  torch.float32,
  torch.float64,
  torch.float16,
  torch.bfloat16,
  torch.int64,
  torch.int32,
  torch.uint8,
  torch.bool,
  torch.complex64,
]
CONSTRUCTORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
  "tensor": lambda s: torch.tensor([s, s]),
  "nested_with_python_numbers": lambda s: torch.tensor([[s, 2], [3, s]]),
  "as_tensor": lambda s: torch.as_tensor([s, 1]),
  "dtype_given": lambda s: torch.tensor([s, s], dtype=torch.float64),
  "onto_jax": lambda s: torch.tensor([s, s], device="jax"),
}


@pytest.mark.parametrize("make", CONSTRUCTORS)
@pytest.mark.parametrize("dtype", ELEMENT_DTYPES, ids=str)
def test_tensor_of_0d_tensors_matches_cpu(make, dtype):
  scalar = torch.tensor(3, dtype=dtype)
  expected = CONSTRUCTORS[make](scalar)
  got = CONSTRUCTORS[make](scalar.to("jax"))
  assert got.dtype == expected.dtype
  assert got.device.type == ("jax" if make == "onto_jax" else "cpu")
  torch.testing.assert_close(got.cpu(), expected.cpu(), rtol=0, atol=0)


def test_tensor_of_traced_0d_tensors_raises_traced_value_error():
  def f(x):
    return torch.tensor([x.sum(), x.sum()])

  with pytest.raises(bridge.TracedValueError, match=r"\.item\(\)"):
    jax.jit(lambda a: bridge.call_torch(f, a))(jnp.ones(3))


# --- format --------------------------------------------------------------------------------

FORMATS = [
  (lambda d: torch.tensor(0.123456, device=d), ".4f"),
  (lambda d: torch.tensor(0.123456, device=d), ""),
  (lambda d: torch.tensor(1234.5, device=d), ">12.2e"),
  (lambda d: torch.tensor(7, device=d), "05d"),
  (lambda d: torch.tensor(True, device=d), ""),
  (lambda d: torch.tensor(0.5, device=d, requires_grad=True) * 3, ".3f"),
  (lambda d: torch.ones(2, device=d), ""),
]


@pytest.mark.parametrize("make, spec", FORMATS)
def test_format_matches_cpu(make, spec):
  expected = format(make("cpu"), spec)
  got = format(make("jax"), spec)
  if make("cpu").dim() == 0:
    assert got == expected
  else:  # (the text of a non-0-d tensor names its device)
    assert got == repr(make("jax"))


def test_format_of_a_traced_0d_tensor_shows_it_or_needs_its_value():
  def f(x):
    loss = x.sum()
    assert f"{loss}".startswith("bridge.Tensor(<traced")
    with pytest.raises(bridge.TracedValueError):
      f"{loss:.4f}"
    return loss

  jax.jit(lambda a: bridge.call_torch(f, a))(jnp.ones(3))


def test_format_spec_on_a_tensor_of_several_elements_raises_torchs_type_error():
  for device in DEVICES:
    with pytest.raises(TypeError, match="unsupported format string passed to Tensor.__format__"):
      format(torch.ones(2, device=device), ".2f")


# --- numpy() -------------------------------------------------------------------------------

REFUSED = {
  "requires_grad": (
    lambda d: torch.ones(2, device=d, requires_grad=True),
    "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.",
  ),
  "conj": (
    lambda d: torch.tensor([1 + 2j], device=d).conj(),
    "Can't call numpy() on Tensor that has conjugate bit set. "
    "Use tensor.resolve_conj().numpy() instead.",
  ),
  "neg": (
    lambda d: torch.tensor([1 + 2j], device=d).conj().imag,
    "Can't call numpy() on Tensor that has negative bit set. "
    "Use tensor.resolve_neg().numpy() instead.",
  ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_numpy_refuses_what_torch_refuses_unless_forced(case):
  make, message = REFUSED[case]
  for device in DEVICES:
    with pytest.raises(RuntimeError) as error:
      make(device).numpy()
    assert str(error.value) == message
  forced = make("jax").numpy(force=True)
  np.testing.assert_array_equal(forced, make("cpu").numpy(force=True))
  assert forced.flags.writeable


def test_numpy_is_a_read_only_copy_and_force_or_np_array_a_writable_one():
  t = torch.arange(3.0, device="jax")
  a = t.numpy()
  np.testing.assert_array_equal(a, torch.arange(3.0).numpy())
  assert a.dtype == np.float32
  with pytest.raises(ValueError, match="read-only"):
    a[0] = 5  # (a write could not reach the tensor: it raises instead of being lost)
  writable = np.array(t)
  writable[0] = 5
  assert t.tolist() == [0.0, 1.0, 2.0] and t.numpy(force=True).flags.writeable


def test_numpy_of_a_dtype_numpy_lacks_raises_torchs_type_error():
  for device in DEVICES:
    with pytest.raises(TypeError, match="Got unsupported ScalarType BFloat16"):
      torch.ones(2, dtype=torch.bfloat16, device=device).numpy()


# --- torch's CPU code with bridge merely installed -----------------------------------------


def test_pin_memory_gives_an_unpinned_copy_while_jax_is_the_accelerator():
  t = torch.arange(6.0).reshape(2, 3).t()
  pinned = t.pin_memory()
  assert not pinned.is_pinned() and pinned.data_ptr() != t.data_ptr()
  torch.testing.assert_close(pinned, t)
  assert pinned.stride() == t.stride()


_DATALOADER = """
import faulthandler, sys, torch
faulthandler.dump_traceback_later(240, exit=True)
if sys.argv[1] == "started":
  import bridge
  torch.ones(2, device="jax").sum().item()  # JAX's runtime runs before the workers fork
ds = torch.utils.data.TensorDataset(torch.arange(8.0).reshape(4, 2))
for workers in (0, 2):
  loader = torch.utils.data.DataLoader(ds, batch_size=2, pin_memory=True, num_workers=workers)
  print(workers, [b.tolist() for (b,) in loader], "bridge" in sys.modules)
"""


@pytest.mark.parametrize("state", ["untouched", "started"])
def test_dataloader_pin_memory_on_cpu_tensors(state):
  out = _python(_DATALOADER.replace("sys.argv[1]", repr(state)))
  assert out.returncode == 0, out.stderr[-3000:]
  batches = "[[[0.0, 1.0], [2.0, 3.0]], [[4.0, 5.0], [6.0, 7.0]]]"
  loaded = state == "started"  # (the workers left bridge alone: no JAX in a bad fork)
  assert out.stdout.splitlines() == [f"0 {batches} {loaded}", f"2 {batches} {loaded}"]


def test_manual_seed_before_bridge_loads_seeds_the_device_without_loading_it():
  code = (
    "import sys, torch\n"
    "torch.manual_seed(7)\n"
    "print('bridge' in sys.modules)\n"
    "a = torch.rand(3, device='jax').tolist()\n"
    "torch.jax.manual_seed_all(3)\n"  # (bridge loaded: the device alone)
    "b = torch.rand(3, device='jax').tolist()\n"
    "torch.manual_seed(7)\n"
    "print(a == torch.rand(3, device='jax').tolist())\n"
    "torch.jax.manual_seed(3)\n"
    "print(b == torch.rand(3, device='jax').tolist())\n"
  )
  out = _python(code)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.split() == ["False", "True", "True"]


def test_a_device_seed_given_before_bridge_loads_is_applied_when_it_loads():
  code = (
    "import sys, torch\n"
    "torch.manual_seed(0)\n"
    "torch.jax.manual_seed_all(3)\n"  # (the device's own seed, not the CPU generator's)
    "print('bridge' in sys.modules)\n"
    "a = torch.rand(3, device='jax').tolist()\n"
    "torch.jax.manual_seed(3)\n"
    "print(a == torch.rand(3, device='jax').tolist())\n"
  )
  out = _python(code)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.split() == ["False", "True"]


def test_cpu_checkpoint_leaves_bridge_unloaded():
  code = (
    "import sys, torch\n"
    "from torch.utils.checkpoint import checkpoint\n"
    "x = torch.ones(8, requires_grad=True)\n"
    "torch.manual_seed(1)\n"
    "y = checkpoint(lambda v: torch.nn.functional.dropout(v, 0.5), x, use_reentrant=False)\n"
    "y.sum().backward()\n"
    "print(torch.equal(x.grad, (y != 0).float() * 2), 'bridge' in sys.modules)\n"
  )
  out = _python(code)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.split() == ["True", "False"]
