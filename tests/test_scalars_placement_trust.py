"""torch's checks of an op's arguments on the `jax` device, against torch on CPU: a Python
scalar its kernel converts to a tensor's dtype that cannot hold it, a generator of another
device, a uint16/32/64 tensor its CPU kernels lack; and CPU scalars and indices beside a
tensor sharded over a mesh (in a subprocess with 4 simulated devices).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bridge
from tests import xla

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
  """("raise", (type, message)) or ("value", (dtype, values)) of `fn()`."""
  try:
    out = fn()
  except Exception as e:  # noqa: BLE001 - compared with torch's outcome
    # (a `check` of a lowering raises a bridge subclass of torch's type)
    kind = next(t for t in type(e).__mro__ if t.__module__ == "builtins")
    return "raise", (kind.__name__, str(e))
  return "value", (out.dtype, repr(out.cpu().tolist()))  # (repr: NaN equals NaN)


def _jitted(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
  """`fn(x)` staged into a JAX program: `call_torch` under `jax.jit`."""
  out = jax.jit(lambda a: bridge.call_torch(fn, a))(bridge.to_jax(x.clone()))
  return bridge.to_torch(out)


def _same_as_cpu(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
  want = _outcome(lambda: fn(x))
  assert _outcome(lambda: fn(x.to("jax"))) == want, "eager"
  if want[0] == "raise":
    assert _outcome(lambda: _jitted(fn, x)) == want, "jax.jit"
  else:
    kind, (dtype, values) = _outcome(lambda: _jitted(fn, x))
    assert (kind, values) == ("value", want[1][1]), "jax.jit"


def _mask(x: torch.Tensor) -> torch.Tensor:
  return torch.arange(x.numel(), device=x.device) % 2 == 0


def _setitem(x: torch.Tensor, value: Any) -> torch.Tensor:
  x = x.clone()
  x[0] = value
  return x


# --- Python scalars converted to a tensor's dtype -------------------------------------------------

# (dtype of x, fn): torch's CPU kernel converts the scalar to x's dtype (`checked_convert`), and
# refuses one it cannot hold with "value cannot be converted to type <C type> without overflow"
OVERFLOWS = {
  "clamp_int16": (torch.int16, lambda x: x.clone().clamp_(min=-100000)),
  "clamp_max_float16": (torch.float16, lambda x: x.clamp(max=1e6)),
  "fill_uint8": (torch.uint8, lambda x: x.clone().fill_(300)),
  "fill_uint8_below_minus_max": (torch.uint8, lambda x: x.clone().fill_(-256)),
  "fill_int8_float": (torch.int8, lambda x: x.clone().fill_(1500.0)),
  "fill_int32": (torch.int32, lambda x: x.clone().fill_(2**40)),
  "fill_int32_nan": (torch.int32, lambda x: x.clone().fill_(float("nan"))),
  "fill_float16": (torch.float16, lambda x: x.clone().fill_(1e6)),
  "fill_bfloat16": (torch.bfloat16, lambda x: x.clone().fill_(1e39)),
  "fill_float32": (torch.float32, lambda x: x.clone().fill_(1e39)),
  "fill_float32_complex": (torch.float32, lambda x: x.clone().fill_(1 + 2j)),
  "setitem_uint8": (torch.uint8, lambda x: _setitem(x, 300)),
  "masked_fill_uint8": (torch.uint8, lambda x: x.masked_fill(_mask(x), 300)),
  "masked_fill_float16": (torch.float16, lambda x: x.masked_fill(_mask(x), 1e6)),
  "full_uint8": (torch.uint8, lambda x: torch.full((2,), 300, dtype=torch.uint8, device=x.device)),
  "full_like_uint8": (torch.uint8, lambda x: torch.full_like(x, 300)),
  "index_fill_int8": (
    torch.int8,
    lambda x: x.index_fill(0, torch.tensor([0], device=x.device), 1000),
  ),
  "where_int32": (torch.int32, lambda x: torch.where(_mask(x), x, 2**40)),
  "add_alpha_int32": (torch.int32, lambda x: x.add(x, alpha=2**40)),
  "add__alpha_int32": (torch.int32, lambda x: x.clone().add_(x, alpha=2**40)),
  "addcmul_value_int8": (torch.int8, lambda x: torch.addcmul(x, x, x, value=1000)),
  "pow_int8": (torch.int8, lambda x: x.pow(1000)),
  "threshold_int8": (torch.int8, lambda x: torch.nn.functional.threshold(x, 1000, 2000)),
  "hardtanh_int16": (torch.int16, lambda x: torch.nn.functional.hardtanh(x, -100000, 100000)),
  "scatter_int8": (
    torch.int8,
    lambda x: x.scatter(0, torch.tensor([0], device=x.device), 1000),
  ),
}

# The same scalars where torch promotes with them (or holds them): no error, torch's values
FITS = {
  "add_int8_wraps": (torch.int8, lambda x: x + 1000),
  "add__int8_wraps": (torch.int8, lambda x: x.clone().add_(1000)),
  "mul_int8_wraps": (torch.int8, lambda x: x * 1000),
  "add_int16_wraps": (torch.int16, lambda x: x + 100000),
  "rsub_int8": (torch.int8, lambda x: torch.rsub(x, 1000)),
  "remainder_int8": (torch.int8, lambda x: x % 1000),
  "eq_int8": (torch.int8, lambda x: x == 1000),
  "lt_uint8_negative": (torch.uint8, lambda x: x < -1),
  "add_float16_to_inf": (torch.float16, lambda x: x + 1e6),
  "lerp_float16_to_inf": (torch.float16, lambda x: torch.lerp(x, x * 0, 1e6)),
  "fill_uint8_minus_one_wraps": (torch.uint8, lambda x: x.clone().fill_(-1)),
  "fill_float16_inf": (torch.float16, lambda x: x.clone().fill_(float("inf"))),
  "fill_float16_nan": (torch.float16, lambda x: x.clone().fill_(float("nan"))),
  "fill_bool": (torch.bool, lambda x: x.clone().fill_(5)),
  "fill_int16_in_range": (torch.int16, lambda x: x.clone().fill_(-300)),
  "arange_uint8": (
    torch.uint8,
    lambda x: torch.arange(0, 300, 100, dtype=torch.uint8, device=x.device),
  ),
}


@pytest.mark.parametrize("name", sorted(OVERFLOWS))
def test_a_scalar_torch_cannot_convert_raises_its_error(name):
  dtype, fn = OVERFLOWS[name]
  x = torch.ones(4, dtype=dtype)
  kind, (error, message) = _outcome(lambda: fn(x))
  assert kind == "raise" and error == "RuntimeError", (kind, error, message)
  assert message.startswith("value cannot be converted to type "), message
  _same_as_cpu(fn, x)


@pytest.mark.parametrize("name", sorted(FITS))
def test_a_scalar_torch_promotes_with_computes_as_torch(name):
  dtype, fn = FITS[name]
  _same_as_cpu(fn, torch.ones(4, dtype=dtype))


def test_the_c_type_names_are_torchs():
  for dtype, name in (
    (torch.uint8, "uint8_t"),
    (torch.int8, "int8_t"),
    (torch.int16, "int16_t"),
    (torch.int32, "int"),
    (torch.float16, "c10::Half"),
    (torch.bfloat16, "c10::BFloat16"),
    (torch.float32, "float"),
  ):
    with pytest.raises(RuntimeError) as info:
      torch.ones(2, dtype=dtype, device="jax").fill_(1e300)
    assert str(info.value) == f"value cannot be converted to type {name} without overflow"


# --- generators -----------------------------------------------------------------------------------

GENERATOR_OPS = {
  "randn": lambda g, t: torch.randn(3, device=t.device, generator=g),
  "rand": lambda g, t: torch.rand(3, device=t.device, generator=g),
  "randint": lambda g, t: torch.randint(0, 5, (3,), device=t.device, generator=g),
  "randperm": lambda g, t: torch.randperm(5, device=t.device, generator=g),
  "normal_": lambda g, t: t.clone().normal_(generator=g),
  "uniform_": lambda g, t: t.clone().uniform_(generator=g),
  "exponential_": lambda g, t: t.clone().exponential_(generator=g),
  "random_": lambda g, t: t.clone().random_(0, 5, generator=g),
  "bernoulli": lambda g, t: torch.bernoulli(t * 0.5, generator=g),
  "bernoulli_p": lambda g, t: t.clone().bernoulli_(0.5, generator=g),
  "multinomial": lambda g, t: torch.multinomial(t, 2, generator=g),
  "normal": lambda g, t: torch.normal(t, 1.0, generator=g),
  "init_normal_": lambda g, t: torch.nn.init.normal_(t.clone(), generator=g),
  "init_uniform_": lambda g, t: torch.nn.init.uniform_(t.clone(), generator=g),
}

GENERATOR_ERROR = "Expected a 'jax' device type for generator but found 'cpu'"


@pytest.mark.parametrize("name", sorted(GENERATOR_OPS))
def test_a_cpu_generator_is_refused_as_cuda_refuses_it(name):
  # (CUDA torch: "Expected a 'cuda' device type for generator but found 'cpu'")
  fn = GENERATOR_OPS[name]
  t = torch.ones(4, device="jax")
  with pytest.raises(RuntimeError) as info:
    fn(torch.Generator().manual_seed(0), t)
  assert str(info.value) == GENERATOR_ERROR
  fn(None, t)  # without one: the device's generator


def test_a_cpu_generator_is_refused_in_a_jax_program():
  def fn(x):
    return x + torch.randn(4, device=x.device, generator=torch.Generator().manual_seed(0))

  with pytest.raises(RuntimeError, match=GENERATOR_ERROR):
    jax.jit(lambda a: bridge.call_torch(fn, a))(jnp.ones(4))


# --- uint16/32/64: the few ops torch's CPU kernels implement --------------------------------------


def _idx(t: torch.Tensor) -> torch.Tensor:
  return torch.tensor([0, 1], device=t.device)


UNSIGNED_OPS = {
  # refused by torch: NotImplementedError ("add_stub" not implemented for 'UInt32') or
  # its promotion error
  "add": lambda a, b: a + b,
  "add_scalar": lambda a, b: a + 1,
  "sub": lambda a, b: a - b,
  "neg": lambda a, b: -a,
  "abs": lambda a, b: a.abs(),
  "floor_divide": lambda a, b: a // b,
  "remainder": lambda a, b: a % b,
  "lt": lambda a, b: a < b,
  "maximum": lambda a, b: torch.maximum(a, b),
  "max": lambda a, b: a.max(),
  "clamp": lambda a, b: a.clamp(0, 2),
  "bitwise_not": lambda a, b: ~a,
  "lshift": lambda a, b: a << 1,
  "pow_2": lambda a, b: a**2,
  "pow_tensor": lambda a, b: a**b,
  "pow_base_2": lambda a, b: torch.pow(2, a),
  "arange": lambda a, b: torch.arange(3, dtype=a.dtype, device=a.device),
  "flip": lambda a, b: a.flip(0),
  "gather": lambda a, b: a.gather(0, _idx(a)),
  "topk": lambda a, b: a.topk(1).values,
  "masked_fill": lambda a, b: a.masked_fill(a == 2, 0),
  "add_int64": lambda a, b: a + b.long(),
  # computed by torch
  "mul": lambda a, b: a * b,
  "div": lambda a, b: a / b,
  "eq": lambda a, b: a == b,
  "ne_scalar": lambda a, b: a != 1,
  "bitwise_and": lambda a, b: a & b,
  "bitwise_or": lambda a, b: a | b,
  "bitwise_xor": lambda a, b: a ^ b,
  "to_float": lambda a, b: a.float(),
  "to_uint8": lambda a, b: a.to(torch.uint8),
  "clone": lambda a, b: a.clone(),
  "copy_": lambda a, b: a.clone().copy_(b),
  "fill_": lambda a, b: a.clone().fill_(3),
  "full": lambda a, b: torch.full((2,), 3, dtype=a.dtype, device=a.device),
  "zeros_like": lambda a, b: torch.zeros_like(a),
  "cat": lambda a, b: torch.cat([a, b]),
  "sum": lambda a, b: a.sum(),
  "prod": lambda a, b: a.prod(),
  "cumsum": lambda a, b: a.cumsum(0),
  "sort": lambda a, b: a.sort().values,
  "argsort": lambda a, b: a.argsort(),
  "index": lambda a, b: a[_idx(a)],
  "setitem": lambda a, b: _setitem(a, 7),
  "roll": lambda a, b: a.roll(1),
  "sqrt": lambda a, b: a.sqrt(),
  "pow_0": lambda a, b: a**0,
  "pow_1": lambda a, b: a**1,
  "pow_half": lambda a, b: a**0.5,
  "pow_base_1": lambda a, b: torch.pow(1, a),
  "mul_float": lambda a, b: a * 1.5,
  "view_uint8": lambda a, b: a.view(torch.uint8),
  "any": lambda a, b: a.any(),
}


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64], ids=str)
@pytest.mark.parametrize("name", sorted(UNSIGNED_OPS))
def test_unsigned_ops_as_torchs_cpu_kernels(name, dtype):
  fn = UNSIGNED_OPS[name]
  a, b = torch.tensor([3, 1, 2], dtype=dtype), torch.tensor([1, 2, 2], dtype=dtype)
  want = _outcome(lambda: fn(a, b))
  assert _outcome(lambda: fn(a.to("jax"), b.to("jax"))) == want


def test_unsigned_refusals_name_torchs_kernels():
  a = torch.tensor([3, 1, 2], dtype=torch.uint32, device="jax")
  for fn, message in (
    (lambda: a + a, "\"add_stub\" not implemented for 'UInt32'"),
    (lambda: -a, "\"neg_cpu\" not implemented for 'UInt32'"),
    (lambda: a.abs(), "\"abs_cpu\" not implemented for 'UInt32'"),
    (lambda: a // a, "\"div_floor_cpu\" not implemented for 'UInt32'"),
  ):
    with pytest.raises(NotImplementedError) as info:
      fn()
    assert str(info.value) == message


def test_unsigned_refusals_in_a_jax_program():
  x = jnp.asarray(np.array([3, 1, 2], np.uint32))
  with pytest.raises(NotImplementedError, match="\"add_stub\" not implemented for 'UInt32'"):
    jax.jit(lambda a: bridge.call_torch(lambda t: t + t, a))(x)
  out = jax.jit(lambda a: bridge.call_torch(lambda t: (t * t) & t, a))(x)
  np.testing.assert_array_equal(np.asarray(out), np.array([9 & 3, 1, 4 & 2], np.uint32))


# --- CPU scalars and indices beside a sharded tensor (4 simulated devices) ------------------------

_SHARDED_SCRIPT = textwrap.dedent(
  """
  import json
  import jax, numpy as np, torch, bridge
  import torch.nn.functional as F
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  mesh = Mesh(np.array(jax.devices()), ("data",))
  torch.manual_seed(0)
  x, w = torch.randn(8, 4), torch.randn(8, 4)
  s = bridge.shard(x, NamedSharding(mesh, P("data")))
  r = bridge.shard(w, NamedSharding(mesh, P()))
  report = {}

  def case(name, fn, want):
    try:
      got = fn()
      array = got if isinstance(got, jax.Array) else got._storage.array
      devices = sorted(d.id for d in array.sharding.device_set)
      torch.testing.assert_close(torch.from_numpy(np.asarray(array)), want)
      report[name] = ["ok", devices]
    except Exception as e:
      report[name] = [type(e).__name__, str(e)]

  def setitem(t, index, value):
    t = t.clone()
    t[index] = value
    return t

  case("mul_cpu_scalar", lambda: s * torch.tensor(2.0), x * 2)
  case("rmul_cpu_scalar", lambda: torch.tensor(2.0) * s, x * 2)
  case("where_cpu_scalar", lambda: torch.where(s > 0, s, torch.tensor(0.0)), x.clamp(min=0))
  case("index_list", lambda: s[[0, 2]], x[[0, 2]])
  case("index_cpu_tensor", lambda: s[torch.tensor([1, 3])], x[[1, 3]])
  case("index_second_dim", lambda: s[:, torch.tensor([1, 3])], x[:, [1, 3]])
  case("setitem_list", lambda: setitem(s, [0, 2], 1.0), setitem(x, [0, 2], 1.0))
  case("embedding_cpu_ids", lambda: F.embedding(torch.tensor([1, 2]), r), w[[1, 2]])

  def in_call_torch():
    f = lambda t: t * torch.tensor(2.0) + t[torch.tensor([0, 1, 2, 3, 4, 5, 6, 7])]
    return bridge.call_torch(f, s._storage.array)

  case("call_torch_eager", in_call_torch, x * 3)

  # a `jax` tensor on one device beside a mesh: an error listing every argument
  case("embedding_jax_ids", lambda: F.embedding(torch.tensor([1, 2]).to("jax"), r), None)
  case("add_jax_scalar", lambda: s + torch.tensor(1.0).to("jax"), None)
  print("REPORT" + json.dumps(report))
  """
)


@pytest.fixture(scope="module")
def sharded_report() -> dict:
  env = dict(
    os.environ,
    XLA_FLAGS=xla.with_flags("--xla_force_host_platform_device_count=4"),
    OMP_WAIT_POLICY="PASSIVE",
  )
  out = subprocess.run(
    [sys.executable, "-c", _SHARDED_SCRIPT],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  line = next((ln for ln in out.stdout.splitlines() if ln.startswith("REPORT")), None)
  assert out.returncode == 0 and line, (out.stdout + out.stderr)[-4000:]
  return json.loads(line[len("REPORT") :])


@pytest.mark.parametrize(
  "name",
  [
    "mul_cpu_scalar",
    "rmul_cpu_scalar",
    "where_cpu_scalar",
    "index_list",
    "index_cpu_tensor",
    "index_second_dim",
    "setitem_list",
    "embedding_cpu_ids",
    "call_torch_eager",
  ],
)
def test_cpu_scalars_and_indices_go_to_the_mesh_of_a_sharded_tensor(sharded_report, name):
  assert sharded_report[name] == ["ok", [0, 1, 2, 3]], sharded_report[name]


@pytest.mark.parametrize(
  ("name", "weight", "other"),
  [
    (
      "embedding_jax_ids",
      "argument 0: shape (8, 4), NamedSharding(mesh {data=4}, spec P()), devices [0, 1, 2, 3]",
      "argument 1: shape (2,), SingleDeviceSharding over devices [0], devices [0]",
    ),
    (
      "add_jax_scalar",
      "argument 0: shape (8, 4), NamedSharding(mesh {data=4}, spec P('data',)), devices [0, 1, "
      "2, 3]",
      "argument 1: shape (), SingleDeviceSharding over devices [0], devices [0]",
    ),
  ],
)
def test_a_one_device_tensor_beside_a_mesh_names_every_argument(
  sharded_report, name, weight, other
):
  kind, message = sharded_report[name]
  assert kind == "DeviceMismatchError", sharded_report[name]
  assert weight in message and other in message, message
