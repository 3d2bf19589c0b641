"""The workloads: each checks a system's output against a reference, then times it."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import numpy as np
import torch

from . import first_call, models
from .common import (
  CONV_WORKLOADS,
  FULL,
  FULL_BIG,
  FULL_SHARDED,
  FULL_SHORT,
  MiB,
  QUICK,
  QUICK_MAX_BYTES,
  SHARDED_DEVICES,
  SHARDED_XLA_FLAGS,
  SIZES,
  System,
  blocking,
  time_calls,
)


class Skip(Exception):
  """A workload this system cannot run (unsupported, or wrong output)."""


def f(x):
  """The benchmarked math. Plain operators, so it works on torch tensors and JAX arrays."""
  return x * 2 + 1


SMALL_SHAPE = (16, 16)


def _as_numpy(a) -> np.ndarray:
  if isinstance(a, torch.Tensor):
    return a.detach().cpu().numpy()
  return np.asarray(a)


def _check(actual, expected, what: str, rtol: float = 1e-6, atol: float = 0.0) -> None:
  try:
    np.testing.assert_allclose(_as_numpy(actual), _as_numpy(expected), rtol=rtol, atol=atol)
  except AssertionError as err:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    keep = [line for line in lines if line.startswith(("Mismatched", "Max abs"))] or lines[:1]
    raise Skip(f"wrong output ({what}): {'; '.join(keep)}") from None


def _check_equal(actual, expected, what: str) -> None:
  """Exact comparison without assert_allclose's temporaries (cheap at 1GiB)."""
  a, e = _as_numpy(actual), _as_numpy(expected)
  if a.shape != e.shape or a.dtype != e.dtype or not np.array_equal(a, e):
    raise Skip(f"wrong output ({what}): {a.dtype}{a.shape} differs from {e.dtype}{e.shape}")


def _data_pointer(a) -> int | None:
  if isinstance(a, torch.Tensor):
    return a.data_ptr()
  try:
    return a.unsafe_buffer_pointer()
  except Exception:  # not a single-buffer JAX array
    return None


def _input(system: System, t: torch.Tensor):
  if system.array_in == "jax":
    import jax.numpy as jnp

    return jnp.asarray(t.detach().cpu().numpy())
  return t


def _need(system: System, attr: str, workload: str):
  impl = getattr(system, attr)
  if workload in system.unsupported:
    raise Skip(system.unsupported[workload])
  if impl is None:
    raise Skip(system.unsupported.get(workload) or system.unsupported.get(attr) or "not supported")
  return impl


def call_small(system: System, quick: bool) -> dict:
  """Per-call cost of f on a (16, 16) float32 input."""
  x_t = torch.randn(SMALL_SHAPE, generator=torch.Generator().manual_seed(0))
  g = _need(system, "call", "call_small")(f)
  x = _input(system, x_t)
  out = g(x)
  _check(out, f(x_t), "y")
  return time_calls(blocking(lambda: g(x), out), QUICK if quick else FULL)


def fwd_bwd_small(system: System, quick: bool) -> dict:
  """Per-step cost of ``y = f(x); y.sum().backward()`` on a (16, 16) input."""
  x_t = torch.randn(SMALL_SHAPE, generator=torch.Generator().manual_seed(1))
  step = _need(system, "fwd_bwd", "fwd_bwd_small")(f)
  x = _input(system, x_t)
  if isinstance(x, torch.Tensor):
    x.requires_grad_(True)
  y, grad = step(x)
  _check(y, f(x_t), "y")
  _check(grad, torch.full(SMALL_SHAPE, 2.0), "grad")
  return time_calls(blocking(lambda: step(x), (y, grad)), QUICK if quick else FULL)


def eager_add(system: System, quick: bool) -> dict:
  """One eager op, ``x + y`` on (16, 16) float32, on the system's own device."""
  g = torch.Generator().manual_seed(2)
  x, y = torch.randn(SMALL_SHAPE, generator=g), torch.randn(SMALL_SHAPE, generator=g)
  run, to_cpu = _need(system, "eager", "eager_add")(x, y)
  out = run()
  _check(to_cpu(out), x + y, "x + y")
  return time_calls(blocking(run, out), QUICK if quick else FULL)


def _big_tensor(nbytes: int) -> torch.Tensor:
  gen = torch.Generator().manual_seed(nbytes % 1000)
  return torch.rand(nbytes // 4, generator=gen, dtype=torch.float32)


def _transfer(system: System, quick: bool, size: str, direction: str) -> dict:
  """One conversion of a float32 buffer of `size` (the source is built once, untimed)."""
  convert = _need(system, direction, f"{direction}_{size}")
  src = _big_tensor(SIZES[size])
  if direction == "to_torch":
    import jax.numpy as jnp

    src = jnp.array(src.numpy(), copy=True)  # a JAX-owned buffer, not a view of torch memory
  return time_transfer(system, quick, f"{direction}_{size}", convert, src)


def time_transfer(system: System, quick: bool, workload: str, convert: Callable, src) -> dict:
  """Checks `convert(src)` (equal; a copy is noted), then times it."""
  out = convert(src)
  _check_equal(out, src, "converted array")
  if _data_pointer(out) != _data_pointer(src):
    system.notes.append(f"{system.name}: {workload} copies (output does not alias the input).")
  timed = blocking(lambda: convert(src), out)
  del out
  settings = QUICK if quick else (FULL_BIG if src.nbytes > MiB else FULL)
  return time_calls(timed, settings)


# --- module workloads (issue 4); the models are in benchmarks/models.py -------------------

# XLA and torch sum the matmuls in different orders; outputs agree to ~1e-6.
MODEL_RTOL, MODEL_ATOL = 1e-4, 1e-5


def _forward(
  system: System,
  quick: bool,
  workload: str,
  build: Callable,
  fastpath: bool = True,
  place: Callable = lambda *objs: objs,
  tolerance: tuple = (MODEL_RTOL, MODEL_ATOL),
) -> dict:
  """Steady-state cost of one forward call of a wrapped module, under ``torch.no_grad()``.

  The reference is torch on the CPU; `place` moves module and input for the system (the
  CUDA rows), `tolerance` is the output check's (rtol, atol).
  """
  module, x = build()
  with torch.no_grad(), models.mha_fastpath(fastpath):
    expected = module(x)
    impl = _need(system, "forward", workload)
    run, to_cpu = impl(*place(module, x))
    out = run()  # traces and compiles; untimed, like the warm-up calls
    _check(to_cpu(out), expected, "output", *tolerance)
    settle = getattr(run, "settle", None)  # bridge: wait for the optimized program
    if settle is not None:
      settle()
      out = run()
      _check(to_cpu(out), expected, "output (optimized program)", *tolerance)
    return time_calls(blocking(run, out), QUICK if quick else FULL)


def compiled_linear(system: System, quick: bool) -> dict:
  """``nn.Linear(16, 16)`` on an (8, 16) float32 input, no grad."""
  return _forward(system, quick, "compiled_linear", models.linear)


def transformer_block(system: System, quick: bool) -> dict:
  """`models.transformer()` forward with torch's defaults: eval + no_grad take the MHA fast path."""
  return _forward(system, quick, "transformer_block", models.transformer, fastpath=True)


def transformer_block_composite(system: System, quick: bool) -> dict:
  """The same layer with ``torch.backends.mha.set_fastpath_enabled(False)``: op-by-op attention."""
  return _forward(system, quick, "transformer_block_composite", models.transformer, fastpath=False)


def _tied_aliases(module: torch.nn.Module) -> dict[str, str]:
  """State-dict name -> the first name of the same tensor (tied weights, e.g. GPT-2's lm_head)."""
  first: dict[tuple, str] = {}
  aliases = {}
  for name, t in module.state_dict(keep_vars=True).items():
    key = (t.data_ptr(), tuple(t.shape), t.stride())
    if key in first:
      aliases[name] = first[key]
    else:
      first[key] = name
  return aliases


def _train_step(
  system: System,
  quick: bool,
  workload: str,
  build: Callable,
  place: Callable = lambda *objs: objs,
  tolerance: tuple = (MODEL_RTOL, MODEL_ATOL),
) -> dict:
  """One SGD step of cross-entropy on ``module(x)`` and labels y; loss and parameters are checked.

  A tied parameter (one tensor under two state-dict names) may be returned under
  its first name only; it is checked there. The reference is torch's step on the CPU;
  `place` and `tolerance` as in `_forward`.
  """
  module, x, y = build()
  reference = models.torch_sgd_reference(module, x, y)
  run, read = _need(system, "train_step", workload)(*place(module, x, y))
  out = run()
  _check_train_step(module, read(out), reference, tolerance)
  settle = getattr(run, "settle", None)  # wait for optimized programs (torch_compile_jax)
  if settle is not None:
    settle()
  return time_calls(blocking(run, out), QUICK if quick else FULL)


def _check_train_step(
  module: torch.nn.Module,
  step: tuple,
  reference: tuple,
  tolerance: tuple = (MODEL_RTOL, MODEL_ATOL),
) -> None:
  """(loss, {name: updated parameter}) of one step against torch's (`models.torch_sgd_reference`)."""
  (loss, params), (loss_ref, params_ref) = step, reference
  aliases = _tied_aliases(module)
  _check(loss, loss_ref, "loss", *tolerance)
  found = {name: name if name in params else aliases.get(name) for name in params_ref}
  missing = sorted(name for name, got in found.items() if got not in params)
  if missing:
    raise Skip(
      f"wrong output: no {', '.join(missing)} among the updated parameters {sorted(params)}"
    )
  for name, ref in params_ref.items():
    _check(params[found[name]], ref, f"{name} after one step", *tolerance)


def mlp_train_step(system: System, quick: bool) -> dict:
  """One SGD step (forward, backward, update) of the 784-256-256-10 MLP on a batch of 64."""
  return _train_step(system, quick, "mlp_train_step", models.mlp)


def transformer_train_step(system: System, quick: bool) -> dict:
  """One SGD step (forward, backward, update) of `transformer()`'s layer in train mode."""
  return _train_step(system, quick, "transformer_train_step", models.transformer_train)


def _first_call(system: System, quick: bool, workload: str) -> dict:
  """The first call (trace + compile + run) of a model, one fresh process each.

  Each sample is a new ``python -m benchmarks.first_call SYSTEM WORKLOAD`` process
  (JAX's persistent compilation cache off), so no trace, lowering or compilation
  cache of any library is warm; see benchmarks/first_call.py for what is timed.
  """
  _need(system, "forward", workload)
  samples = []
  for _ in range(first_call.PROCESSES[quick]):
    result = first_call.sample(sys.executable, system.name, workload, dict(os.environ))
    if "skip" in result:
      raise Skip(result["skip"])
    samples.append(result)
  row, note = first_call.summary(system.name, workload, samples)
  system.notes.append(note)
  return row


# --- torch called from JAX (callback mode): the torch function runs for real, from jax.jit ---


def torch_from_jax_call(system: System, quick: bool) -> dict:
  """One jitted JAX call of the torch function f on a (16, 16) float32 JAX array."""
  x_t = torch.randn(SMALL_SHAPE, generator=torch.Generator().manual_seed(3))
  run, to_cpu = _need(system, "torch_from_jax", "torch_from_jax_call")(f, x_t)
  out = run()  # traces and compiles (and builds any extension); untimed
  _check(to_cpu(out), f(x_t), "y")
  return time_calls(blocking(run, out), QUICK if quick else FULL)


def torch_from_jax_grad(system: System, quick: bool) -> dict:
  """One ``jax.jit(jax.grad(lambda x: f(x).sum()))`` step through the torch function f."""
  x_t = torch.randn(SMALL_SHAPE, generator=torch.Generator().manual_seed(4))
  run, to_cpu = _need(system, "torch_from_jax_grad", "torch_from_jax_grad")(f, x_t)
  out = run()
  _check(to_cpu(out), torch.full(SMALL_SHAPE, 2.0), "grad")
  return time_calls(blocking(run, out), QUICK if quick else FULL)


# --- torch called from JAX in trace mode: the torch code is traced into the JAX program -----


def _torch_grad(fn: models.TorchFn, x: torch.Tensor) -> torch.Tensor:
  """d fn(x).sum() / dx by torch autograd (the grad rows' reference)."""
  x = x.detach().clone().requires_grad_(True)
  fn(x).sum().backward()
  return x.grad


# capability, reference output (computed by torch eagerly), what is checked
CALL_TORCH_KINDS = {
  "jit": ("call_torch_jit", lambda fn, x: fn(x), "y"),
  "jit_grad": ("call_torch_grad", _torch_grad, "grad"),
  "vmap": ("call_torch_vmap", lambda fn, x: fn(x), "y (fn on the whole batch)"),
}
CALL_TORCH_FNS = {"small": models.call_torch_small, "mlp": models.call_torch_mlp}


def _call_torch(system: System, quick: bool, kind: str, fn_name: str) -> dict:
  """One jitted call (jit, jit(grad) or jit(vmap)) of a torch function traced into JAX.

  The reference is the torch function run eagerly (its gradient by torch autograd;
  for vmap, the function on the whole batch, which it treats as a batch). The MLP
  rows allow the matmuls' summation-order differences (MODEL_RTOL, MODEL_ATOL).
  """
  attr, reference, what = CALL_TORCH_KINDS[kind]
  fn, x = CALL_TORCH_FNS[fn_name]()
  expected = reference(fn, x)
  run, to_cpu = _need(system, attr, f"call_torch_{kind}_{fn_name}")(fn, x)
  out = run()  # traces and compiles; untimed
  tolerance = (MODEL_RTOL, MODEL_ATOL) if fn_name == "mlp" else ()
  _check(to_cpu(out), expected, what, *tolerance)
  return time_calls(blocking(run, out), QUICK if quick else FULL_SHORT)


def call_torch_workloads() -> dict[str, Callable[[System, bool], dict]]:
  """call_torch_{jit,jit_grad}_{small,mlp} and call_torch_vmap_mlp, in report order."""
  pairs = [
    ("jit", "small"),
    ("jit", "mlp"),
    ("jit_grad", "small"),
    ("jit_grad", "mlp"),
    ("vmap", "mlp"),
  ]
  return {
    f"call_torch_{kind}_{name}": (lambda system, q, k=kind, n=name: _call_torch(system, q, k, n))
    for kind, name in pairs
  }


# --- Hugging Face workloads (issue 7); configs with random weights, built offline -----------


def hf_workloads() -> dict[str, Callable[[System, bool], dict]]:
  table: dict[str, Callable[[System, bool], dict]] = {}
  for model, build in (("gpt2", models.gpt2), ("bert", models.bert)):
    for seq in (64, 256):
      name = f"{model}_forward_s{seq}"
      table[name] = lambda system, q, n=name, b=build, s=seq: _forward(system, q, n, lambda: b(s))
  table["gpt2_train_step_s64"] = lambda system, q: _train_step(
    system, q, "gpt2_train_step_s64", lambda: models.gpt2_train(64)
  )
  table["gpt2_first_call_s64"] = lambda system, q: _first_call(system, q, "gpt2_first_call_s64")
  return table


def conv_workloads() -> dict[str, Callable[[System, bool], dict]]:
  """The conv nets (issue 28): eval forwards and fine-tuning steps, `models.CONV_NETS`."""
  table: dict[str, Callable[[System, bool], dict]] = {}
  for name in CONV_WORKLOADS:
    if "_forward_" in name:  # <net>_forward_<shape>
      net, shape = name.split("_forward_")
      build = lambda n=net, s=shape: models.conv_net(n, s)
      table[name] = lambda system, q, w=name, b=build: _forward(system, q, w, b)
    else:  # <net>_train_step_64x8
      build = lambda n=name.removesuffix("_train_step_64x8"): models.conv_net_train(n)
      table[name] = lambda system, q, w=name, b=build: _train_step(system, q, w, b)
  return table


# --- data parallel on simulated CPU devices (their worker runs with SHARDED_XLA_FLAGS) --------

MEMORY_FIELDS = ("argument", "output", "alias", "temp", "generated_code")


def _memory(compiled) -> dict:
  """The compiled step's `memory_analysis()`, in bytes (empty if the backend reports none).

  For a program partitioned over a mesh these are the figures of the SPMD program that
  each device runs, i.e. per device; on CPU they come from XLA's buffer assignment
  (what the program allocates), not from measured allocations.
  """
  stats = compiled.memory_analysis()
  if stats is None:
    return {}
  return {
    f"{field}_bytes": int(getattr(stats, f"{field}_size_in_bytes")) for field in MEMORY_FIELDS
  }


def _device_memory() -> dict | None:
  """`memory_stats()` of device 0 (bytes in use and the peak), None where the backend has none (CPU)."""
  import jax

  stats = jax.devices()[0].memory_stats()
  if not stats:
    return None
  return {k: int(stats[k]) for k in ("bytes_in_use", "peak_bytes_in_use") if k in stats}


def _sharded_train_step(system: System, quick: bool, workload: str, devices: int) -> dict:
  """One SGD step of `models.dp_mlp()`: the batch split over `devices` (a "data" mesh) or on one.

  Loss and updated parameters are checked against torch's step, and the parameters must
  still have the placement they started with (replicated over the mesh, or the one
  device). The result adds ``devices``, ``memory`` (the compiled step's
  `memory_analysis()`, per device) and ``device_memory`` (device 0's `memory_stats()`,
  None on CPU) to the timings.
  """
  import jax
  from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

  impl = _need(system, "sharded_train_step", workload)
  if jax.device_count() < devices:
    raise Skip(
      f"needs {devices} devices, JAX has {jax.device_count()}: run it with "
      f"XLA_FLAGS={SHARDED_XLA_FLAGS} (`python -m benchmarks` sets it for this worker)"
    )
  if devices == 1:
    params_sharding = batch_sharding = SingleDeviceSharding(jax.devices()[0])
  else:
    mesh = Mesh(np.array(jax.devices()[:devices]), ("data",))
    params_sharding = NamedSharding(mesh, PartitionSpec())
    batch_sharding = NamedSharding(mesh, PartitionSpec("data"))
  module, x, y = models.dp_mlp()
  reference = models.torch_sgd_reference(module, x, y)
  run, read, compiled = impl(module, x, y, params_sharding, batch_sharding)
  out = run()
  loss, params, shardings = read(out)
  _check_train_step(module, (loss, params), reference)
  moved = sorted(
    k for k, s in shardings.items() if not s.is_equivalent_to(params_sharding, params[k].ndim)
  )
  if moved:
    raise Skip(f"wrong placement after one step: {', '.join(moved)} not on {params_sharding}")
  result = time_calls(blocking(run, out), QUICK if quick else FULL_SHARDED)
  return dict(result, devices=devices, memory=_memory(compiled), device_memory=_device_memory())


def sharded_workloads() -> dict[str, Callable[[System, bool], dict]]:
  """dp8_train_step (8-device data parallel) and dp1_train_step (the same step on one device)."""
  return {
    "dp8_train_step": lambda system, q: _sharded_train_step(
      system, q, "dp8_train_step", SHARDED_DEVICES
    ),
    "dp1_train_step": lambda system, q: _sharded_train_step(system, q, "dp1_train_step", 1),
  }


def all_workloads(quick: bool) -> dict[str, Callable[[System, bool], dict]]:
  """Workload name -> runner, in report order (quick mode drops the biggest sizes)."""
  table: dict[str, Callable[[System, bool], dict]] = {
    "call_small": call_small,
    "fwd_bwd_small": fwd_bwd_small,
    "eager_add": eager_add,
  }
  for direction in ("to_jax", "to_torch"):
    for size, nbytes in SIZES.items():
      if quick and nbytes > QUICK_MAX_BYTES:
        continue
      table[f"{direction}_{size}"] = lambda system, q, s=size, d=direction: _transfer(
        system, q, s, d
      )
  table.update(
    {
      "compiled_linear": compiled_linear,
      "mlp_train_step": mlp_train_step,
      "transformer_block": transformer_block,
      "transformer_block_composite": transformer_block_composite,
      "transformer_train_step": transformer_train_step,
      "transformer_first_call": lambda system, q: _first_call(system, q, "transformer_first_call"),
      "transformer_first_call_composite": (
        lambda system, q: _first_call(system, q, "transformer_first_call_composite")
      ),
    }
  )
  table.update(hf_workloads())
  table.update(conv_workloads())
  table.update(
    {"torch_from_jax_call": torch_from_jax_call, "torch_from_jax_grad": torch_from_jax_grad}
  )
  table.update(call_torch_workloads())
  table.update(sharded_workloads())
  from . import gpu

  table.update(gpu.workloads(quick))
  return table
