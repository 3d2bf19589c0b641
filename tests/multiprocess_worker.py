"""One process of the data-parallel training runs of tests/test_multiprocess.py (not a test).

  python tests/multiprocess_worker.py --process-id I --num-processes N --port P --out DIR

With N > 1 it joins JAX's multi-controller runtime (`jax.distributed.initialize` with the
coordinator on 127.0.0.1:P; JAX's CPU client then runs cross-process collectives over
gloo, on loopback TCP), builds a mesh over every process's CPU devices, and trains a small
torch MLP through `bridge.extract_jax` data-parallel: each process feeds only its own rows
of the batch, the parameters are replicated, and the gradient of the mean loss over the
global batch is reduced across processes by the jitted step. With N == 1 it runs the same
training alone on the whole batch: the reference. It writes DIR/process_I.npz: the final
parameters (by state-dict name), the same parameters loaded back into the torch module,
the loss per step, and what JAX saw (process count, global and local device counts).

The bridge invents no distribution: the mesh, the sharded batch and the all-reduce are
JAX's; the bridge turns the torch forward into a JAX function and places the parameters.
"""

from __future__ import annotations

import argparse
import copy
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
  p.add_argument(
    "--local-devices", type=int, default=1, help="CPU devices of this process (jax_num_cpu_devices)"
  )
  return p.parse_args(argv)


def data() -> tuple[np.ndarray, np.ndarray]:
  """The global batch, the same in every process."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((GLOBAL_BATCH, IN_FEATURES)).astype(np.float32)
  y = (np.sin(2 * x[:, :1]) + x[:, 1:2] * x[:, 2:3]).astype(np.float32)
  return x, y


def local_rows(sharding, shape: tuple[int, ...]) -> slice:
  """The rows of a row-sharded global array that this process's devices hold (contiguous)."""
  slices = sorted(
    {
      (idx[0].start or 0, idx[0].stop or shape[0])
      for idx in sharding.addressable_devices_indices_map(shape).values()
    }
  )
  for (_, stop), (start, _) in zip(slices, slices[1:]):
    assert stop == start, f"this process's rows are not contiguous: {slices}"
  return slice(slices[0][0], slices[-1][1])


def gloo_on_loopback() -> str:
  """Make gloo listen on 127.0.0.1, not on the address the host name resolves to.

  JAX's CPU client creates its gloo collectives with no host name, so gloo binds to
  whatever `hostname` resolves to, which can be a public interface. JAX offers no setting
  for it, only `make_cpu_client(collectives=...)` (private API): if that is gone, keep
  JAX's default (the run still works, on that address). Returns the address used.
  """
  try:
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax

    def cpu_client():
      return xla_bridge.make_cpu_client(
        collectives=_jax.make_gloo_tcp_collectives(
          distributed_client=distributed.global_state.client, hostname="127.0.0.1"
        )
      )

    xla_bridge.register_backend_factory("cpu", cpu_client, priority=0, fail_quietly=False)
    return "127.0.0.1"
  except (ImportError, AttributeError, TypeError) as e:
    print(f"gloo: keeping JAX's default address ({type(e).__name__}: {e})", file=sys.stderr)
    return "default"


def main(argv: list[str]) -> None:
  args = parse_args(argv)
  import jax

  # Before any JAX backend exists: this process's CPU devices and, for several processes,
  # the coordination service through which the CPU client learns the other processes'
  # devices and sets up collectives with them (gloo, JAX's default on CPU).
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", args.local_devices)
  gloo_host = "default"
  if args.num_processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
      coordinator_address=f"127.0.0.1:{args.port}",
      coordinator_bind_address=f"127.0.0.1:{args.port}",  # loopback only
      num_processes=args.num_processes,
      process_id=args.process_id,
      initialization_timeout=60,
    )
    gloo_host = gloo_on_loopback()

  import jax.numpy as jnp
  import torch
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  import bridge

  torch.manual_seed(0)
  model = torch.nn.Sequential(
    torch.nn.Linear(IN_FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
  )
  trained = copy.deepcopy(model)  # a CPU module to load the trained values back into
  init = {f"init/{k}": v.detach().numpy().copy() for k, v in model.state_dict().items()}
  params, fn = bridge.extract_jax(model)

  mesh = Mesh(np.array(jax.devices()), ("data",))  # every process's devices
  replicated = NamedSharding(mesh, P())
  by_rows = NamedSharding(mesh, P("data"))

  # The parameters: the same values in every process, replicated over the global mesh.
  params = bridge.shard(params, replicated)

  # The batch: each process contributes only the rows its devices hold.
  x, y = data()
  mine = local_rows(by_rows, x.shape)
  gx = jax.make_array_from_process_local_data(by_rows, x[mine], x.shape)
  gy = jax.make_array_from_process_local_data(by_rows, y[mine], y.shape)

  def loss_fn(p, x, y):
    return jnp.mean((fn(p, x) - y) ** 2)  # the mean over the global batch

  def step(p, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
    return jax.tree.map(lambda w, g: w - LR * g, p, grads), loss

  step = jax.jit(step, out_shardings=(replicated, replicated))
  losses = []
  for _ in range(STEPS):
    params, loss = step(params, gx, gy)
    losses.append(loss)

  def host(a: jax.Array) -> np.ndarray:
    assert a.sharding.is_fully_replicated, a.sharding
    return np.asarray(a.addressable_data(0))  # replicated: any local shard is all of it

  trained.load_state_dict(bridge.torch_view(params))
  out = {f"param/{k}": host(v) for k, v in params.items()}
  out.update({f"torch/{k}": v.detach().numpy() for k, v in trained.state_dict().items()})
  out.update(init)
  out["losses"] = np.array([host(v) for v in losses])
  out["process_count"] = np.array(jax.process_count())
  out["global_devices"] = np.array(len(jax.devices()))
  out["local_devices"] = np.array(len(jax.local_devices()))
  out["gloo_host"] = np.array(gloo_host)
  out["local_rows"] = np.array([mine.start, mine.stop])
  os.makedirs(args.out, exist_ok=True)
  tmp = os.path.join(args.out, f"process_{args.process_id}.tmp.npz")
  np.savez(tmp, **out)
  os.replace(tmp, os.path.join(args.out, f"process_{args.process_id}.npz"))
  if args.num_processes > 1:
    jax.distributed.shutdown()  # waits for the other processes: none leaves one stranded
  print(f"process {args.process_id}: done, losses {out['losses'].tolist()}", file=sys.stderr)


if __name__ == "__main__":
  main(sys.argv[1:])
