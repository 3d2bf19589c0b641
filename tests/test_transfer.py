"""`bridge.to_jax` / `bridge.to_torch`: exact dtypes, zero-copy, copy semantics, pytrees, errors."""

from __future__ import annotations

import collections
import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from bridge._src import dtypes
from tests import xla

X64 = {torch.int64, torch.uint64, torch.float64, torch.complex128}
ALL_DTYPES = sorted(dtypes.TORCH_TO_JAX, key=str)


def _sample(dtype: torch.dtype, shape=(3, 5)) -> torch.Tensor:
  """Random bits of `dtype`, so that a round trip must preserve every bit pattern."""
  n = int(np.prod(shape))
  itemsize = torch.empty((), dtype=dtype).element_size()
  raw = torch.randint(0, 256, (n * itemsize,), dtype=torch.uint8)
  if dtype is torch.bool:
    return (raw[:n] % 2).bool().reshape(shape)
  return raw.view(dtype).reshape(shape)


def _bits(t: torch.Tensor) -> torch.Tensor:
  return t.contiguous().view(torch.uint8) if t.dtype is not torch.bool else t


def _ptr(a: jax.Array) -> int:
  return a.unsafe_buffer_pointer()


def test_dtype_table_is_exact_and_complete():
  expected = {
    "bool",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
  }
  names = {str(d).removeprefix("torch.") for d in dtypes.TORCH_TO_JAX}
  assert expected <= names
  for t, j in dtypes.TORCH_TO_JAX.items():
    assert torch.empty((), dtype=t).element_size() == j.itemsize, t


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_round_trip_is_bit_exact_and_zero_copy(dtype):
  t = _sample(dtype)
  with jax.enable_x64(dtype in X64):
    a = bridge.to_jax(t)
    assert a.dtype == dtypes.TORCH_TO_JAX[dtype]
    assert a.shape == (3, 5)
    assert _ptr(a) == t.data_ptr()
    back = bridge.to_torch(a)
  assert back.dtype is dtype
  assert back.shape == t.shape
  assert back.data_ptr() == t.data_ptr()
  assert torch.equal(_bits(back), _bits(t))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_jax_to_torch_to_jax_values(dtype):
  with jax.enable_x64(dtype in X64):
    a = jnp.asarray(
      _sample(dtype).numpy()
      if dtype not in (torch.bfloat16,) and "float8" not in str(dtype)
      else bridge.to_jax(_sample(dtype))
    )
    t = bridge.to_torch(a)
    assert t.dtype is dtype
    assert t.data_ptr() == _ptr(a)
    b = bridge.to_jax(t)
    np.testing.assert_array_equal(
      np.asarray(b).view(np.uint8) if dtype is not torch.bool else np.asarray(b),
      np.asarray(a).view(np.uint8) if dtype is not torch.bool else np.asarray(a),
    )


@pytest.mark.parametrize("dtype", sorted(X64, key=str), ids=str)
def test_64_bit_is_never_narrowed_silently(dtype):
  t = torch.zeros(2, dtype=dtype)
  short = str(dtype).removeprefix("torch.")
  with jax.enable_x64(False):
    with pytest.raises(bridge.BridgeTypeError) as info:
      bridge.to_jax({"w": [t]})
  msg = str(info.value)
  assert "`bridge.to_jax`" in msg
  assert "leaf ['w'][0]" in msg
  assert short in msg and "shape (2,)" in msg
  assert "jax.config.update('jax_enable_x64', True)" in msg
  assert "jax.enable_x64(True)" in msg
  assert "t.to(torch." in msg
  with jax.enable_x64(True):
    assert bridge.to_jax(t).dtype == dtypes.TORCH_TO_JAX[dtype]


def test_64_bit_jax_array_keeps_its_dtype_in_torch():
  with jax.enable_x64(True):
    a = jnp.arange(3, dtype=jnp.int64)
  assert bridge.to_torch(a).dtype is torch.int64


def _strided(shape, strides) -> torch.Tensor:
  t = torch.empty_strided(shape, strides)
  return t.copy_(torch.randn(shape))


LAYOUTS = {
  "contiguous": (lambda: torch.randn(4, 6), True),
  "transposed": (lambda: torch.randn(4, 6).t(), True),
  "permuted_3d": (lambda: torch.randn(2, 3, 4).permute(2, 0, 1), True),
  "zero_dim": (lambda: torch.tensor(3.5), True),
  "empty": (lambda: torch.randn(0, 3), True),
  "size_one_odd_stride": (lambda: _strided((4, 1, 6), (6, 100, 1)), True),
  "permuted_size_one": (lambda: torch.randn(6, 4).t().unsqueeze(1), True),
  "expanded_stride0": (lambda: torch.randn(1, 6).expand(4, 6), False),
  "step_sliced": (lambda: torch.randn(4, 12)[:, ::2], False),
  "row_slice_gap": (lambda: torch.randn(8, 6)[:, :3], False),
  "unaligned_offset": (lambda: torch.randn(65)[1:], False),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layouts_transfer_exact_values(name):
  make, zero_copy = LAYOUTS[name]
  t = make()
  a = bridge.to_jax(t)
  np.testing.assert_array_equal(np.asarray(a), t.numpy())
  assert a.shape == tuple(t.shape)
  if t.numel():
    assert (_ptr(a) == t.data_ptr()) == zero_copy


@pytest.mark.parametrize("name", [n for n, (_, zc) in LAYOUTS.items() if not zc])
def test_copy_false_says_why(name):
  t = LAYOUTS[name][0]()
  with pytest.raises(bridge.TransferError) as info:
    bridge.to_jax([t], copy=False)
  msg = str(info.value)
  assert "`bridge.to_jax`" in msg and "leaf [0]" in msg
  assert f"shape {tuple(t.shape)}" in msg and "cannot be moved without a copy" in msg
  assert "copy=None" in msg
  reason = "aligned" if name == "unaligned_offset" else "strided view"
  assert reason in msg
  # the advice that works: `contiguous()` returns a dense view at an unaligned offset as it is
  advice = "`t.clone()`" if name == "unaligned_offset" else "`t.contiguous()`"
  assert f"or pass {advice}." in msg
  if name == "unaligned_offset":
    assert t.contiguous().data_ptr() == t.data_ptr()
    bridge.to_jax(t.clone(), copy=False)


@pytest.mark.parametrize("name", [n for n, (_, zc) in LAYOUTS.items() if zc])
def test_copy_false_accepts_shareable_layouts(name):
  t = LAYOUTS[name][0]()
  a = bridge.to_jax(t, copy=False)
  if t.numel():
    assert _ptr(a) == t.data_ptr()


def test_copy_true_always_copies_both_ways():
  t = torch.randn(16)
  a = bridge.to_jax(t, copy=True)
  assert _ptr(a) != t.data_ptr()
  t.add_(1.0)  # the copy does not see later writes
  np.testing.assert_array_equal(np.asarray(a) + 1.0, t.numpy())
  b = jnp.arange(4.0)
  u = bridge.to_torch(b, copy=True)
  assert u.data_ptr() != _ptr(b)
  u.add_(1.0)
  np.testing.assert_array_equal(np.asarray(b), [0.0, 1.0, 2.0, 3.0])


def test_zero_copy_aliases_memory_as_documented():
  t = torch.zeros(16)
  a = bridge.to_jax(t)
  t[0] = 7.0
  assert float(a[0]) == 7.0
  u = bridge.to_torch(jnp.zeros(16))
  u[1] = 5.0  # writes into JAX's buffer; the array it came from is not used again


def test_requires_grad_tensor_transfers_detached_values():
  t = torch.randn(5, requires_grad=True)
  a = bridge.to_jax(t)
  np.testing.assert_array_equal(np.asarray(a), t.detach().numpy())
  assert _ptr(a) == t.data_ptr()


def test_lazy_conjugate_and_negative_views_are_materialized():
  c = torch.randn(4, dtype=torch.complex64)
  np.testing.assert_array_equal(np.asarray(bridge.to_jax(c.conj())), np.conj(c.numpy()))
  n = torch._neg_view(torch.randn(4))
  np.testing.assert_array_equal(np.asarray(bridge.to_jax(n)), n.resolve_neg().numpy())
  with pytest.raises(bridge.TransferError, match="lazy conjugate"):
    bridge.to_jax(c.conj(), copy=False)


def test_one_gib_tensor_is_zero_copy_both_ways():
  t = torch.empty(2**28, dtype=torch.float32)  # 1 GiB, never touched
  a = bridge.to_jax(t, copy=False)
  assert _ptr(a) == t.data_ptr()
  back = bridge.to_torch(a, copy=False)
  assert back.data_ptr() == t.data_ptr()


@dataclasses.dataclass
class Params:
  w: torch.Tensor
  b: torch.Tensor | None
  name: str = "layer"


@dataclasses.dataclass(frozen=True)
class Frozen:
  x: object


Pair = collections.namedtuple("Pair", "first second")


def test_pytrees_of_every_kind_round_trip():
  tree = {
    "list": [torch.ones(2), 3, "s"],
    "tuple": (torch.zeros(1),),
    "nt": Pair(torch.arange(3, dtype=torch.int32), None),
    "dc": Params(torch.ones(2, 2), torch.zeros(2)),
    "frozen": Frozen({"inner": torch.ones(1)}),
    "scalar": 1.5,
    "np": np.ones(2),
  }
  out = bridge.to_jax(tree)
  assert isinstance(out["list"][0], jax.Array) and out["list"][1:] == [3, "s"]
  assert isinstance(out["tuple"][0], jax.Array)
  assert isinstance(out["nt"], Pair) and out["nt"].first.dtype == jnp.int32
  assert isinstance(out["dc"], Params) and out["dc"].name == "layer"
  assert isinstance(out["dc"].w, jax.Array) and out["dc"].w.shape == (2, 2)
  assert isinstance(out["frozen"], Frozen) and isinstance(out["frozen"].x["inner"], jax.Array)
  assert out["scalar"] == 1.5 and isinstance(out["np"], np.ndarray)
  back = bridge.to_torch(out)
  assert isinstance(back["dc"], Params) and isinstance(back["dc"].w, torch.Tensor)
  torch.testing.assert_close(back["dc"].w, tree["dc"].w)
  assert back["nt"].first.dtype is torch.int32
  assert tree["dc"].w.__class__ is torch.Tensor  # the input is not modified


def test_non_tensor_leaves_pass_through_unchanged():
  marker = object()
  assert bridge.to_jax([marker, None, 2])[0] is marker
  assert bridge.to_torch((marker,))[0] is marker


UNSUPPORTED_TENSORS = {
  "sparse_coo": (lambda: torch.eye(3).to_sparse(), "sparse tensor"),
  "sparse_csr": (lambda: torch.eye(3).to_sparse_csr(), "sparse tensor"),
  "quantized": (
    lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8),
    "quantized tensor",
  ),
  "nested": (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "nested tensor"),
  "nested_jagged": (
    lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged),
    "nested tensor",
  ),
  "meta": (lambda: torch.empty(3, device="meta"), "meta tensor"),
}


@pytest.mark.parametrize("name", list(UNSUPPORTED_TENSORS))
def test_unsupported_tensor_kinds_raise_type_error(name):
  make, kind = UNSUPPORTED_TENSORS[name]
  with pytest.raises(TypeError) as info:
    bridge.to_jax({"x": make()})
  assert isinstance(info.value, bridge.BridgeTypeError)
  msg = str(info.value)
  assert kind in msg and "leaf ['x']" in msg and "`bridge.to_jax`" in msg


def test_dtype_without_jax_equivalent_is_refused():
  with pytest.raises(bridge.BridgeTypeError, match=r"complex32.*no exact equivalent"):
    bridge.to_jax(torch.zeros(2, dtype=torch.complex32))


def test_jax_dtype_without_torch_equivalent_is_refused():
  a = jnp.zeros(4, dtype=jnp.int4)
  with pytest.raises(bridge.BridgeTypeError, match=r"int4.*torch has no exact equivalent"):
    bridge.to_torch({"q": a})


def test_tracer_cannot_go_to_torch():
  def f(x):
    bridge.to_torch(x)
    return x

  with pytest.raises(bridge.BridgeTypeError, match="is a JAX tracer"):
    jax.jit(f)(jnp.ones(2))


def test_deleted_array_is_reported():
  a = jnp.ones(3)
  a.delete()
  with pytest.raises(bridge.TransferError, match="was deleted"):
    bridge.to_torch(a)


@pytest.mark.parametrize("bad", ["yes", 0, 1])
def test_copy_argument_is_checked(bad):
  with pytest.raises(bridge.BridgeTypeError, match=re.escape("`copy` must be None, True or False")):
    bridge.to_jax(torch.ones(1), copy=bad)


_SHARDED_SCRIPT = r"""
import jax, jax.numpy as jnp, numpy as np, torch, bridge
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("d",))
x = jnp.arange(16.0).reshape(8, 2)
split = jax.device_put(x, NamedSharding(mesh, P("d")))
repl = jax.device_put(x, NamedSharding(mesh, P()))
t = bridge.to_torch(split)
assert torch.equal(t, torch.arange(16.0).reshape(8, 2)), t
r = bridge.to_torch(repl, copy=False)
assert r.data_ptr() == repl.addressable_data(0).unsafe_buffer_pointer()
try:
    bridge.to_torch({"p": split}, copy=False)
except bridge.TransferError as e:
    assert "sharded over 4 devices" in str(e) and "leaf ['p']" in str(e), e
else:
    raise SystemExit("copy=False on a sharded array did not raise")
print("ok")
"""


def test_sharded_and_replicated_arrays_to_torch():
  import os
  import subprocess
  import sys

  env = dict(
    os.environ,
    XLA_FLAGS=xla.with_flags("--xla_force_host_platform_device_count=4"),
    JAX_PLATFORMS="cpu",
  )
  out = subprocess.run(
    [sys.executable, "-c", _SHARDED_SCRIPT], capture_output=True, text=True, env=env, timeout=120
  )
  assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
