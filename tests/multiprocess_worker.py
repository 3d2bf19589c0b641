"""One process of the data-parallel training run of tests/test_multiprocess.py (not a test).

Run as `python tests/multiprocess_worker.py --process-id I --num-processes N --port P --out DIR`.
With N > 1 it joins JAX's multi-controller runtime (`jax.distributed.initialize` on
127.0.0.1:P, CPU collectives over gloo), builds a mesh over every process's CPU devices,
and trains a small torch MLP through `bridge.extract_jax` on its own slice of the batch;
with N == 1 it runs the same training on the whole batch alone (the reference). Either
way it writes DIR/process_I.npz: the final parameters (by state-dict name), the loss
per step, and what JAX saw (process count, global and local device counts).

The bridge invents no distribution: the mesh, the sharded batch and the gradient
all-reduce are JAX's; the bridge only turns the torch forward into a JAX function.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

STEPS = 4
LR = 0.1
GLOBAL_BATCH = 16
IN_FEATURES = 8


def parse_args(argv: list[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser()
  p.add_argument("--process-id", type=int, required=True)
  p.add_argument("--num-processes", type=int, default=2)
  p.add_argument("--port", type=int, default=0)
  p.add_argument("--out", required=True)
  p.add_argument("--local-devices", type=int, default=1,
                 help="CPU devices per process (jax_num_cpu_devices)")
  return p.parse_args(argv)


def data() -> tuple[np.ndarray, np.ndarray]:
  """The global batch, the same in every process."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((GLOBAL_BATCH, IN_FEATURES)).astype(np.float32)
  y = (np.sin(2 * x[:, :1]) + x[:, 1:2] * x[:, 2:3]).astype(np.float32)
  return x, y


def probe_bridge_shard(bridge, model, params, sharding) -> dict[str, str]:
  """Whether `bridge.shard` places each kind of value with a sharding spanning processes.

  "ok", or the error (type and first line). Every process runs the same probes in the
  same order, so any collective one of them makes is matched in the other process.
  """
  import copy

  import torch

  def attempt(what, x):
    try:
      placed = bridge.shard(x, sharding)
    except Exception as e:  # noqa: BLE001 - recorded for the test to report
      return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    arrays = ([bridge.to_jax(t) for t in placed.state_dict().values()]
              if isinstance(placed, torch.nn.Module)
              else [placed] if not isinstance(placed, dict)
              else list(placed.values()))
    for a in arrays:
      a = a if not isinstance(a, torch.Tensor) else bridge.to_jax(a)
      if a.sharding != sharding:
        return f"{what}: placed with {a.sharding}, not {sharding}"
    return "ok"

  return {
      "params": attempt("params", dict(params)),  # JAX arrays, from extract_jax
      "tensor": attempt("tensor", torch.ones(4, 3)),  # a CPU torch tensor
      "module": attempt("module", copy.deepcopy(model)),  # a module's state, in place
  }


def main(argv: list[str]) -> None:
  args = parse_args(argv)
  import jax

  # Before any JAX backend exists: the number of CPU devices of this process, and
  # (for several processes) the coordination service that lets the CPU client see the
  # other processes' devices and run collectives with them over gloo (TCP, loopback).
  jax.config.update("jax_num_cpu_devices", args.local_devices)
  jax.config.update("jax_platforms", "cpu")
  if args.num_processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{args.port}",
        num_processes=args.num_processes,
        process_id=args.process_id,
        initialization_timeout=60)

  # Imported after `jax.distributed.initialize`, although importing it first works too
  # (importing the bridge creates no JAX backend).
  import jax.numpy as jnp
  import torch
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  import bridge

  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(IN_FEATURES, 16), torch.nn.Tanh(),
                              torch.nn.Linear(16, 1))
  params, fn = bridge.extract_jax(model)

  mesh = Mesh(np.array(jax.devices()), ("data",))  # every process's devices
  replicated = NamedSharding(mesh, P())
  by_rows = NamedSharding(mesh, P("data"))

  probes = probe_bridge_shard(bridge, model, params, replicated) if args.num_processes > 1 else {}

  # Parameters: the same values in every process, replicated over the global mesh.
  if probes.get("params", "ok") == "ok":
    params = bridge.shard(params, replicated)
    placement = "bridge.shard"
  else:
    # `params` are committed to this process's device, and JAX reads `device_put` of a
    # committed array to a sharding spanning other processes as a cross-host transfer,
    # which the CPU client does not support. A host (numpy) value is taken as the same
    # global value in every process instead (JAX checks that it is) and each process
    # places its own shards.
    params = {k: jax.device_put(np.asarray(v), replicated) for k, v in params.items()}
    placement = "numpy"

  # The batch: each process contributes only its own rows.
  x, y = data()
  rows = GLOBAL_BATCH // jax.process_count()
  mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
  gx = jax.make_array_from_process_local_data(by_rows, x[mine], x.shape)
  gy = jax.make_array_from_process_local_data(by_rows, y[mine], y.shape)

  def loss_fn(p, x, y):
    return jnp.mean((fn(p, x) - y) ** 2)

  def step(p, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(p, x, y)  # mean over the global batch
    return jax.tree.map(lambda w, g: w - LR * g, p, grads), loss

  step = jax.jit(step, out_shardings=(replicated, replicated))
  losses = []
  for _ in range(STEPS):
    params, loss = step(params, gx, gy)
    losses.append(loss)

  def host(a: jax.Array) -> np.ndarray:
    assert a.sharding.is_fully_replicated, a.sharding
    return np.asarray(a.addressable_data(0))  # a replicated array: any local shard is all of it

  out = {f"param/{k}": host(v) for k, v in params.items()}
  out["losses"] = np.array([host(v) for v in losses])
  out["placement"] = np.array(placement)
  for what, result in probes.items():
    out[f"probe/{what}"] = np.array(result)
  out["process_count"] = np.array(jax.process_count())
  out["global_devices"] = np.array(len(jax.devices()))
  out["local_devices"] = np.array(len(jax.local_devices()))
  os.makedirs(args.out, exist_ok=True)
  tmp = os.path.join(args.out, f"process_{args.process_id}.tmp.npz")
  np.savez(tmp, **out)
  os.replace(tmp, os.path.join(args.out, f"process_{args.process_id}.npz"))
  if args.num_processes > 1:
    jax.distributed.shutdown()  # a barrier: neither process leaves while the other still needs it
  print(f"process {args.process_id}: done, losses {out['losses'].tolist()}", file=sys.stderr)


if __name__ == "__main__":
  main(sys.argv[1:])
