"""The `jax` device where torch code trusts the tensor API to act as CPU/CUDA tensors do:
`copy.copy` shares the storage, `data_ptr()` tells storages apart, DLPack exports the array,
`untyped_storage()` answers what safetensors and transformers ask (so `save_file`,
`save_model` and `save_pretrained` work), `is_set_to`, `set_` between devices and copies out of
meta tensors raise torch's errors. Each case compares with torch on the CPU."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import warnings

import pytest
import torch

import bridge

# (the `cpu` cases are the reference, controls that pass with or without the bridge's fixes)
DEVICES = ["cpu", "jax"]


def _python(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
  """`code` in a fresh interpreter (a NULL DLPack capsule could crash the consumer)."""
  env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
  return subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
  )


def _error(fn):
  try:
    fn()
  except Exception as e:  # noqa: BLE001 - the error itself is compared
    return type(e), str(e)
  return None


# --- copy.copy: a new tensor over the same storage ---------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_copy_copy_shares_the_storage(device):
  x = torch.arange(6.0, device=device)
  c = copy.copy(x)
  assert c is not x and type(c) is type(x) and c.device == x.device
  c.add_(1)  # (a write through the copy shows in the original)
  torch.testing.assert_close(x.cpu(), torch.arange(6.0) + 1)
  v = copy.copy(x.view(2, 3).t()[1:])
  assert (v.shape, v.stride(), v.storage_offset()) == ((2, 2), (1, 3), 1)
  v.mul_(0)
  torch.testing.assert_close(x.cpu(), torch.tensor([1.0, 0.0, 0.0, 4.0, 0.0, 0.0]))


@pytest.mark.parametrize("device", DEVICES)
def test_copy_copy_gives_a_leaf_that_requires_grad_as_torch(device):
  x = torch.ones(3, device=device, requires_grad=True)
  x.grad = torch.ones(3, device=device)
  x.note = ["shared"]
  c = copy.copy(x)
  assert c.device == x.device
  assert c.requires_grad and c.is_leaf and c.grad_fn is None and c.grad is None
  assert c.note is x.note  # (Python attributes: the same objects)
  y = copy.copy(x * 2)  # a non-leaf: a leaf copy, as torch's
  assert y.device == x.device and y.requires_grad and y.is_leaf and y.grad_fn is None
  torch.testing.assert_close(y.detach().cpu(), torch.full((3,), 2.0))
  ints = copy.copy(torch.arange(3, device=device))
  assert not ints.requires_grad and ints.dtype == torch.int64 and ints.device.type == device


@pytest.mark.parametrize("device", DEVICES)
def test_copy_copy_keeps_the_conjugate_bit_and_warns_about_hooks(device):
  z = torch.tensor([1 + 2j, 3 - 1j], device=device).conj()
  c = copy.copy(z)
  assert c.is_conj() and c.device == z.device
  torch.testing.assert_close(c.cpu(), torch.tensor([1 - 2j, 3 + 1j]))
  t = torch.ones(2, device=device, requires_grad=True)
  t.register_hook(lambda g: g)
  with pytest.warns(UserWarning, match="will not be serialized"):
    h = copy.copy(t)
  assert h.device == t.device and not h._backward_hooks


@pytest.mark.parametrize("device", DEVICES)
def test_control_copy_copy_of_a_parameter_stays_a_shared_parameter(device):
  # (control: passed before too, through `__reduce_ex__`'s Parameter branch)
  p = torch.nn.Parameter(torch.zeros(2, device=device), requires_grad=False)
  c = copy.copy(p)
  assert isinstance(c, torch.nn.Parameter) and c.device == p.device and not c.requires_grad
  with torch.no_grad():
    c.add_(5)
  torch.testing.assert_close(p.detach().cpu(), torch.full((2,), 5.0))


# --- data_ptr(): one per storage, consistent across views -----------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_data_ptr_tells_storages_apart_and_agrees_across_views(device):
  a = torch.ones(3, device=device)
  b = torch.zeros(5, device=device)
  assert a.data_ptr() != b.data_ptr()
  assert a.data_ptr() != 0
  assert a[1:].data_ptr() == a.data_ptr() + a.element_size()
  assert a.view(3).data_ptr() == a.data_ptr()
  assert a.view(torch.int16)[3:].data_ptr() == a.data_ptr() + 3 * 2
  assert a.untyped_storage().data_ptr() == a.data_ptr()
  assert a[1:].untyped_storage().data_ptr() == a.data_ptr()
  before = a.data_ptr()
  a.add_(1)  # (an in-place op keeps the memory)
  assert a.data_ptr() == before
  assert a[3:].data_ptr() == 0  # (an empty tensor's, as torch's)
  # ranges of different storages do not overlap
  spans = sorted(
    (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
    for t in (a, b, torch.ones(7, device=device))
  )
  assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))


@pytest.mark.parametrize("device", DEVICES)
def test_data_ptr_dedup_counts_each_parameter_once(device):
  model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).to(device)
  params = list(model.parameters())
  assert len({p.data_ptr() for p in params}) == len(params)
  model[1].weight = torch.nn.Parameter(torch.zeros(2, 4, device=device))
  model[1].bias = model[0].bias  # tied
  assert len({p.data_ptr() for p in model.parameters()}) == 3


# --- DLPack: the JAX array's buffer ----------------------------------------------------------


def test_dlpack_consumers_share_the_jax_array():
  code = """
import jax, numpy as np, torch, bridge
x = torch.arange(4.0, device="jax")
array = bridge.jax_view(x)
assert x.__dlpack_device__() == array.__dlpack_device__(), x.__dlpack_device__()
t = torch.from_dlpack(x)
assert t.device.type == "cpu" and t.dtype == torch.float32, t
assert t.data_ptr() == array.unsafe_buffer_pointer()  # zero-copy
torch.testing.assert_close(t, torch.arange(4.0))
n = np.from_dlpack(x)
assert n.ctypes.data == array.unsafe_buffer_pointer()
np.testing.assert_array_equal(n, np.arange(4.0, dtype=np.float32))
j = jax.dlpack.from_dlpack(x)
np.testing.assert_array_equal(np.asarray(j), np.arange(4.0, dtype=np.float32))
# the protocol's arguments, as JAX's own `__dlpack__` takes them
for kwargs in [{}, {"max_version": (1, 0)}, {"stream": None, "copy": True},
               {"dl_device": array.__dlpack_device__()}]:
  capsule = x.__dlpack__(**kwargs)
  assert repr(capsule).startswith('<capsule object "dltensor'), capsule
  torch.testing.assert_close(torch.from_dlpack(capsule), torch.arange(4.0))
copied = torch.from_dlpack(x.__dlpack__(copy=True))
assert copied.data_ptr() != array.unsafe_buffer_pointer()
# a strided view: its values (a copy), never another tensor's
v = torch.arange(6.0, device="jax")[1::2]
torch.testing.assert_close(torch.from_dlpack(v), torch.tensor([1.0, 3.0, 5.0]))
np.testing.assert_array_equal(np.from_dlpack(v), np.array([1.0, 3.0, 5.0], np.float32))
print("ok")
"""
  out = _python(code)
  assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


@pytest.mark.parametrize("device", DEVICES)
def test_control_dlpack_refuses_what_torch_refuses(device):
  # (control: torch's own checks ran before too)
  t = torch.ones(2, device=device, requires_grad=True)
  with pytest.raises(BufferError) as e:
    t.__dlpack__()
  assert str(e.value) == "Can't export tensors that require gradient, use tensor.detach()"
  z = torch.tensor([1 + 1j], device=device).conj()
  with pytest.raises(BufferError) as e:
    z.__dlpack__()
  assert str(e.value) == "Can't export tensors with the conjugate bit set"


def test_dlpack_of_a_strided_view_with_copy_false_is_refused():
  v = torch.arange(6.0, device="jax")[1::2]
  with pytest.raises(BufferError, match="cannot be exported without a copy"):
    v.__dlpack__(copy=False)
  # the whole tensor, without a copy, is fine
  torch.testing.assert_close(
    torch.from_dlpack(torch.arange(3.0, device="jax").__dlpack__(copy=False)),
    torch.arange(3.0),
  )


# --- untyped_storage(): what safetensors and transformers ask -------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_untyped_storage_answers_the_questions_of_storage_users(device):
  x = torch.arange(6.0, device=device)
  s = x[2:].untyped_storage()
  assert s.nbytes() == 24 and s.size() == 24 and len(s) == 24 and s.element_size() == 1
  assert s.device == x.device and s.data_ptr() == x.data_ptr()
  assert x.untyped_storage() is x[1:].untyped_storage()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # (TypedStorage is deprecated)
    typed = x.view(torch.int32).storage()
  assert (typed.size(), len(typed), typed.element_size(), typed.dtype) == (
    6,
    6,
    4,
    torch.int32,
  )
  assert typed.nbytes() == 24 and typed.data_ptr() == x.data_ptr()


def test_the_storage_stand_in_refuses_anything_else():
  # (the clear error of before, now raised by what the stand-in does not answer)
  s = torch.ones(2, device="jax").untyped_storage()
  for f in (lambda: s.tolist(), lambda: s._cdata, lambda: copy.deepcopy(s)):
    with pytest.raises(bridge.BridgeError, match="not in a torch storage"):
      f()


@pytest.mark.parametrize("device", DEVICES)
def test_set_to_a_storage_shares_it(device):
  x = torch.arange(3.0, device=device)
  y = torch.empty(0, device=device)
  y.set_(x.untyped_storage())
  assert y.is_set_to(x) and y.device == x.device
  y.add_(1)
  torch.testing.assert_close(x.cpu(), torch.arange(3.0) + 1)


def _state(device):
  torch.manual_seed(0)
  w = torch.randn(3, 2, device=device)
  return {"w": w, "b": torch.arange(3, device=device), "s": torch.tensor(2.5, device=device)}


@pytest.mark.parametrize("device", DEVICES)
def test_safetensors_save_file_and_save_model(device, tmp_path):
  st = pytest.importorskip("safetensors.torch")
  state = _state(device)
  st.save_file(state, tmp_path / "s.safetensors")
  back = st.load_file(tmp_path / "s.safetensors")
  for k, v in state.items():
    torch.testing.assert_close(back[k], v.cpu())
  shared = _error(lambda: st.save_file({"a": state["w"], "b": state["w"]}, tmp_path / "x"))
  assert shared is not None and shared[0] is RuntimeError and "share memory" in shared[1]
  assert "{'a', 'b'}" in shared[1] or "{'b', 'a'}" in shared[1]
  torch.manual_seed(1)
  model = torch.nn.Linear(2, 3).to(device)
  st.save_model(model, tmp_path / "m.safetensors")
  back = st.load_file(tmp_path / "m.safetensors")
  assert set(back) == {"weight", "bias"}
  torch.testing.assert_close(back["weight"], model.weight.detach().cpu())
  torch.testing.assert_close(back["bias"], model.bias.detach().cpu())


def test_save_pretrained_of_a_jax_model_with_tied_weights(tmp_path):
  transformers = pytest.importorskip("transformers")
  st = pytest.importorskip("safetensors.torch")
  config = transformers.GPT2Config(
    n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16, eos_token_id=0, bos_token_id=0
  )
  saved = {}
  for device in DEVICES:
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).to(device).eval()
    model.tie_weights()  # (`to("jax")` unties: docs/sharp_edges.md)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    model.save_pretrained(tmp_path / device)
    saved[device] = st.load_file(tmp_path / device / "model.safetensors")
    expected = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    for k, v in saved[device].items():
      torch.testing.assert_close(v, expected[k])
  assert set(saved["jax"]) == set(saved["cpu"])
  loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "jax")
  ids = torch.tensor([[1, 2, 3]])
  with torch.no_grad():
    torch.testing.assert_close(loaded(ids).logits, model(ids.to("jax")).logits.cpu())


# --- is_set_to --------------------------------------------------------------------------------


def _is_set_to_cases(device):
  x = torch.arange(6.0, device=device)
  m = x.view(2, 3)
  return [
    x.is_set_to(x),
    x.is_set_to(x[:]),
    x[1:].is_set_to(x),
    x.is_set_to(x.clone()),
    x.is_set_to(x.view(torch.int32)),
    m.t().is_set_to(m),
    m.t().is_set_to(m.t()),
    m.is_set_to(x.view(2, 3)),
  ]


def test_is_set_to_as_torch():
  assert _is_set_to_cases("jax") == _is_set_to_cases("cpu")
  assert _is_set_to_cases("cpu") == [True, True, False, False, True, False, True, True]
  x = torch.ones(2, device="jax")
  assert not torch.ones(2).is_set_to(x) and not x.is_set_to(x.cpu())


# --- set_/resize_as_ between devices, copies out of meta ------------------------------------


def test_set_of_a_cpu_tensor_to_a_jax_source_raises_torchs_error():
  with pytest.raises(RuntimeError) as e:
    torch.tensor([]).set_(torch.ones(2, device="jax"))
  assert str(e.value) == (
    'Attempted to set the storage of a tensor on device "cpu" to a storage on different device '
    '"jax:0".  This is no longer allowed; the devices must match.'
  )
  # torch's message for the same mistake between the CPU and meta
  cpu = _error(lambda: torch.tensor([]).set_(torch.ones(2, device="meta")))
  assert cpu == (RuntimeError, str(e.value).replace('"jax:0"', '"meta"'))
  # dtypes are checked first, as torch does
  with pytest.raises(RuntimeError) as e:
    torch.tensor([]).set_(torch.ones(2, device="jax", dtype=torch.int64))
  expected = _error(lambda: torch.tensor([]).set_(torch.ones(2, device="meta", dtype=torch.int64)))
  assert (RuntimeError, str(e.value)) == expected


def test_resize_as_of_a_cpu_tensor_to_a_jax_template():
  t = torch.zeros(2)
  out = t.resize_as_(torch.ones(3, 2, device="jax"))
  assert out is t and t.device.type == "cpu" and t.shape == (3, 2)
  assert torch.zeros(2).resize_as_(torch.ones(3, 2, device="meta")).shape == t.shape


@pytest.mark.parametrize(
  "fn",
  [
    lambda d: torch.empty(2, device="meta").to(d),
    lambda d: torch.empty(2, device="meta").to(d, torch.float64),
    lambda d: torch.zeros(2, device=d).copy_(torch.empty(2, device="meta")),
  ],
)
def test_copying_out_of_a_meta_tensor_raises_torchs_error(fn):
  expected = _error(lambda: fn("cpu"))
  assert expected == (NotImplementedError, "Cannot copy out of meta tensor; no data!")
  got = _error(lambda: fn("jax"))
  assert got is not None and issubclass(got[0], NotImplementedError) and got[1] == expected[1]
