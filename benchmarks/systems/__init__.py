"""Benchmarked systems. Each module here has ``make() -> common.System``.

Modules are loaded by name only inside a worker process, so that one system's
imports (and import shims) never leak into another's measurements.
"""

# Report order; `bridge` is the baseline that ratios are computed against. New systems go
# last: plot colours follow this order.
ALL = (
  "bridge",
  "bridge_jax",
  "dlpack_manual",
  "plain_jax",
  "torch_eager",
  "torch_compile",
  "torchax",
  "torch_jax_interop",
  "jax2torch",
  "wrap_torch2jax",
  "pure_callback",
  "torch_compile_jax",
  "bridge_autograd",
  "torch_compile_eager",
)
BASELINE = "bridge"
# Systems whose workers load the bridge (torch's device-backend autoload is off for the rest).
BRIDGE = frozenset(
  {"bridge", "bridge_jax", "torch_compile_jax", "bridge_autograd", "torch_compile_eager"}
)

# Peer libraries live in the peers venv (benchmarks/setup_peers.sh).
PEERS = frozenset({"torchax", "torch_jax_interop", "jax2torch", "wrap_torch2jax"})

# Distributions whose versions are reported (also when the system fails to load).
PACKAGES = {
  "bridge": ("bridge",),
  "bridge_jax": ("bridge",),
  "torch_compile_jax": ("bridge",),
  "bridge_autograd": ("bridge",),
  "torchax": ("torchax",),
  "torch_jax_interop": ("torch-jax-interop", "chex"),
  "jax2torch": ("jax2torch",),
  "wrap_torch2jax": ("wrap-torch2jax",),
}
