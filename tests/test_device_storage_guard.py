"""The `jax` device's edges with torch's own machinery: storages asked for on the device (an
error, never a crash), the device's RNG state functions, pinned memory, `record_stream`,
`F.one_hot`'s checks. Each case is what torch does on the CPU, or, where the case exists only
on an accelerator, what it does on CUDA."""

import io
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bridge
from bridge._src.errors import TransferError


def _python(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
  """`code` in a fresh interpreter with torch's backend autoload on (bridge installed, not
  imported): what may crash the process runs there."""
  env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
  return subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
  )


# --- a torch storage on the jax device: bridge's error, not a crash (SIGSEGV) ----------------

_CPU_CHECKPOINT = (
  "buf = io.BytesIO(); torch.save({'w': torch.ones(2)}, buf); buf.seek(0)\n"
  "torch.load(buf, map_location=lambda s, loc: s.to(device='jax'))"
)

STORAGE_ON_THE_DEVICE = {
  "UntypedStorage": "torch.UntypedStorage(4, device='jax')",
  "UntypedStorage_device": "torch.UntypedStorage(4, device=torch.device('jax', 0))",
  "UntypedStorage_index": "torch.UntypedStorage(4, device=0)",  # (the accelerator's index)
  "UntypedStorage_sequence": "torch.UntypedStorage([1, 2], device='jax')",
  "UntypedStorage_empty": "torch.UntypedStorage(device='jax')",
  "TypedStorage": "torch.TypedStorage(4, device='jax')",
  "UntypedStorage.to": "torch.UntypedStorage(4).to(device='jax')",
  "TypedStorage.to": "torch.ones(2).storage().to(device='jax')",
  "FloatStorage.to": "torch.FloatStorage(4).to(device='jax')",
  "untyped_storage.to": "torch.ones(2).untyped_storage().to(device='jax')",
  "_new_shared": "torch.UntypedStorage._new_shared(4, device='jax')",
  "TypedStorage._new_shared": "torch.ones(2).storage()._new_shared(4, device='jax')",
  "torch.load_map_location_callable": _CPU_CHECKPOINT,
}


@pytest.mark.parametrize(
  "code", list(STORAGE_ON_THE_DEVICE.values()), ids=list(STORAGE_ON_THE_DEVICE)
)
def test_a_storage_on_the_jax_device_raises_bridges_error_instead_of_crashing(code):
  out = _python(
    "import io, warnings\n"
    "warnings.simplefilter('ignore')\n"
    "import torch\n"
    "try:\n" + "".join(f"  {line}\n" for line in code.splitlines()) + "except TypeError as e:\n"
    "  print(type(e).__name__, type(e).__module__)\n"
    "  print(e)\n"
  )
  assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
  kind, message = out.stdout.strip().split("\n", 1)
  assert kind == "BridgeTypeError bridge._src.errors"
  assert message.startswith(
    "bridge: a torch storage cannot live on the `jax` device (a `jax` tensor keeps its data in "
    "a JAX array, not in a torch storage)"
  )
  assert "t.to('jax')" in message


def test_storages_elsewhere_are_torchs():
  """Controls (pass before and after): the guard leaves every other device's storages and
  torch's own errors alone."""
  s = torch.UntypedStorage(4)
  assert (s.device, s.nbytes()) == (torch.device("cpu"), 4)
  s = torch.UntypedStorage(4, device="cpu")
  assert (s.device, s.nbytes()) == (torch.device("cpu"), 4)
  s = torch.UntypedStorage(4, device="meta")
  assert (s.device, s.nbytes()) == (torch.device("meta"), 4)
  assert torch.UntypedStorage([1, 2]).tolist() == [1, 2]
  with pytest.raises(RuntimeError, match="^Expected one of cpu, cuda"):
    torch.UntypedStorage(4, device="nodevice")
  # what loads onto the device: tensors (a checkpoint saved from jax tensors)
  buf = io.BytesIO()
  torch.save({"w": torch.arange(3.0, device="jax")}, buf)
  buf.seek(0)
  w = torch.load(buf, map_location="jax")["w"]
  assert w.device == torch.device("jax", 0)
  torch.testing.assert_close(w.cpu(), torch.arange(3.0))


# --- torch.jax.get_rng_state / set_rng_state ----------------------------------------------


def _raises_as(expected: BaseException, fn) -> None:
  with pytest.raises(type(expected)) as info:
    fn()
  assert str(info.value) == str(expected)


def _error(fn) -> BaseException:
  try:
    fn()
  except Exception as e:  # noqa: BLE001 - torch's error, whatever it is
    return e
  raise AssertionError("no error")


@pytest.mark.parametrize(
  "state",
  [
    torch.zeros(8),
    torch.zeros(2),
    torch.zeros(8, dtype=torch.int64),
    torch.zeros(8, dtype=torch.int8),
  ],
  ids=["float32", "float32_2", "int64", "int8"],
)
def test_set_rng_state_refuses_a_tensor_that_is_not_a_byte_tensor(state):
  # the CPU's (and CUDA's: its generator runs the same check) TypeError, and no reseeding
  expected = _error(lambda: torch.set_rng_state(state))
  assert type(expected) is TypeError and str(expected) == "RNG state must be a torch.ByteTensor"
  before = torch.jax.get_rng_state()
  _raises_as(expected, lambda: torch.jax.set_rng_state(state))
  assert torch.equal(torch.jax.get_rng_state(), before)


def test_set_rng_state_refuses_a_byte_tensor_on_the_device():
  # CUDA's generator takes only a CPU ByteTensor (`torch.cuda.set_rng_state` of a CUDA one
  # raises "RNG state must be a torch.ByteTensor")
  state = torch.jax.get_rng_state().to("jax")
  _raises_as(
    TypeError("RNG state must be a torch.ByteTensor"), lambda: torch.jax.set_rng_state(state)
  )


def test_set_rng_state_refuses_what_is_not_a_tensor():
  expected = _error(lambda: torch.set_rng_state([0] * 8))
  assert (
    type(expected) is TypeError and str(expected) == "expected a torch.ByteTensor, but got list"
  )
  _raises_as(expected, lambda: torch.jax.set_rng_state([0] * 8))


@pytest.mark.parametrize("n", [0, 3, 16])
def test_set_rng_state_refuses_a_state_of_the_wrong_size(n):
  # CUDA's message (its generator's state has its own size, as the jax device's: 8 bytes)
  before = torch.jax.get_rng_state()
  _raises_as(
    RuntimeError("RNG state is wrong size"),
    lambda: torch.jax.set_rng_state(torch.zeros(n, dtype=torch.uint8)),
  )
  assert torch.equal(torch.jax.get_rng_state(), before)


def test_rng_state_round_trips():
  """Control (passes before and after): a saved state replays the same numbers."""
  state = torch.jax.get_rng_state()
  assert (state.dtype, state.device, state.shape) == (torch.uint8, torch.device("cpu"), (8,))
  a = torch.rand(4, device="jax").cpu()
  torch.jax.set_rng_state(state)
  torch.testing.assert_close(torch.rand(4, device="jax").cpu(), a)
  torch.jax.set_rng_state(state, 0)
  torch.testing.assert_close(torch.rand(4, device="jax").cpu(), a)


@pytest.mark.parametrize("form", ["int", "str", "device"])
def test_rng_state_of_a_device_that_does_not_exist_raises_set_devices_error(form):
  n = torch.jax.device_count()
  device = {"int": n, "str": f"jax:{n}", "device": torch.device("jax", n)}[form]
  expected = _error(lambda: torch.jax.set_device(n))
  assert type(expected) is TransferError
  assert str(expected).startswith(f"bridge: device jax:{n} does not exist")
  _raises_as(expected, lambda: torch.jax.get_rng_state(device))
  state = torch.jax.get_rng_state()
  _raises_as(expected, lambda: torch.jax.set_rng_state(state, device))


# --- pinned memory ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_pin_memory_of_a_jax_tensor_raises_torchs_error(dtype):
  # CUDA: "cannot pin 'torch.cuda.FloatTensor' only dense CPU tensors can be pinned"
  x = torch.ones(2, dtype=dtype, device="jax")
  expected = RuntimeError(f"cannot pin '{x.type()}' only dense CPU tensors can be pinned")
  assert x.type().startswith("torch.jax.")
  _raises_as(expected, lambda: x.pin_memory())
  assert not x.is_pinned()


@pytest.mark.parametrize(
  "factory",
  [
    lambda: torch.zeros(2, pin_memory=True, device="jax"),
    lambda: torch.empty(2, pin_memory=True, device="jax"),
    lambda: torch.ones(2, 3, pin_memory=True, device="jax"),
    lambda: torch.empty_strided((2,), (1,), pin_memory=True, device="jax"),
  ],
  ids=["zeros", "empty", "ones", "empty_strided"],
)
def test_a_factory_on_the_device_refuses_pin_memory(factory):
  # CUDA's `empty_cuda`: RuntimeError "Only dense CPU tensors can be pinned"
  _raises_as(RuntimeError("Only dense CPU tensors can be pinned"), factory)


# --- record_stream ------------------------------------------------------------------------


def test_record_stream_is_a_no_op():
  # JAX keeps a buffer alive while a computation uses it: nothing to record (as for a device
  # without a stream-ordered allocator)
  x = torch.arange(3.0, device="jax")
  for stream in (torch.Stream(device="jax"), torch.Stream()):
    assert x.record_stream(stream) is None
  assert x.device == torch.device("jax", 0)
  torch.testing.assert_close(x.cpu(), torch.arange(3.0))


# --- F.one_hot ----------------------------------------------------------------------------

ONE_HOT_ERRORS = [
  ([0, 5], 3),  # a class too large
  ([-1], 3),  # a negative class
  ([[0, 1], [2, -4]], 5),
  ([[0, 1], [2, 7]], 5),
  ([0], -2),  # num_classes below -1
  ([0], 0),
  ([], -1),  # an empty tensor: the number of classes cannot be inferred
  ([], 0),
  ([], -3),
]


@pytest.mark.parametrize(("values", "num_classes"), ONE_HOT_ERRORS)
def test_one_hot_raises_the_cpus_errors(values, num_classes):
  expected = _error(lambda: F.one_hot(torch.tensor(values, dtype=torch.long), num_classes))
  assert type(expected) is RuntimeError
  x = torch.tensor(values, dtype=torch.long, device="jax")
  _raises_as(expected, lambda: F.one_hot(x, num_classes))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.uint8])
def test_one_hot_refuses_a_tensor_that_is_not_int64(dtype):
  expected = _error(lambda: F.one_hot(torch.tensor([1, 0], dtype=dtype), 3))
  assert str(expected) == "one_hot is only applicable to index tensor of type LongTensor."
  _raises_as(expected, lambda: F.one_hot(torch.tensor([1, 0], dtype=dtype, device="jax"), 3))


ONE_HOT_VALID = [
  ([0, 2], 3),
  ([[0, 2], [1, 1]], -1),
  ([3], -1),
  ([], 3),
  ([[], []], 2),
]


@pytest.mark.parametrize(("values", "num_classes"), ONE_HOT_VALID)
def test_one_hot_values_are_the_cpus(values, num_classes):
  """Controls (pass before and after): valid calls give the CPU's result."""
  expected = F.one_hot(torch.tensor(values, dtype=torch.long), num_classes)
  got = F.one_hot(torch.tensor(values, dtype=torch.long, device="jax"), num_classes)
  assert (got.device, got.dtype, got.shape) == (torch.device("jax", 0), torch.int64, expected.shape)
  torch.testing.assert_close(got.cpu(), expected)


def test_one_hot_of_a_view_checks_the_views_values():
  base = torch.tensor([7, 0, 1, 2], device="jax")
  torch.testing.assert_close(F.one_hot(base[1:], 3).cpu(), F.one_hot(torch.tensor([0, 1, 2]), 3))
  _raises_as(
    RuntimeError("Class values must be smaller than num_classes."), lambda: F.one_hot(base[:2], 3)
  )


def test_one_hot_in_a_jax_program_checks_with_check_indices():
  def program():  # (a new function each time: JAX caches a program by its function)
    return jax.jit(lambda a: bridge.call_torch(lambda t: F.one_hot(t, 3), a))

  with jax.enable_x64(True):
    np.testing.assert_array_equal(program()(np.array([0, 2])), [[1, 0, 0], [0, 0, 1]])
    with bridge.config(check_indices=True):
      np.testing.assert_array_equal(program()(np.array([0, 2])), [[1, 0, 0], [0, 0, 1]])
      with pytest.raises(Exception, match="Class values must be smaller than num_classes"):
        jax.block_until_ready(program()(np.array([0, 5])))
      with pytest.raises(Exception, match="Class values must be non-negative"):
        jax.block_until_ready(program()(np.array([-1, 0])))
