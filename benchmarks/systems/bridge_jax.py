"""bridge with the module and its input on the `jax` torch device: `bridge.compile(module.to("jax"))`.

Only the module workloads; the bridge system covers the rest (its eager_add
already runs on the jax device).
"""

import jax

from ..common import CONV_WORKLOADS, NON_MODULE_CAPABILITIES, System

NOT_HERE = "bridge_jax runs only the module workloads (see bridge)"


def _forward(module, x):
  import bridge
  from bridge._src import tensor as tensor_lib

  compiled = bridge.compile(module.to("jax"))
  xj = x.to("jax")

  def run():
    out = compiled(xj)
    # Wait for the output's JAX array. bridge.to_jax would also hand it over,
    # but costs ~50 us on a jax-device tensor (2 CPUs, 2026-11), which would
    # swamp a small call.
    jax.block_until_ready(tensor_lib.value(out))
    return out

  run.settle = compiled.wait_optimized  # steady state: after the background compile
  return run, (lambda out: out.cpu())


def make() -> System:
  import bridge  # noqa: F401  (registers the jax device)

  return System(
    name="bridge_jax",
    packages=("bridge",),
    forward=_forward,
    notes=[
      "bridge_jax: bridge.compile(module.to('jax'))(x.to('jax')): module and input "
      "on the jax torch device, output a jax-device tensor whose JAX array is "
      "waited for (read with bridge._src.tensor.value) inside the timed call."
    ],
    unsupported={
      **dict.fromkeys(NON_MODULE_CAPABILITIES, NOT_HERE),
      **dict.fromkeys(
        ("mlp_train_step", "gpt2_train_step_s64", *(w for w in CONV_WORKLOADS if "train" in w)),
        "same as bridge: bridge.extract_jax returns JAX arrays wherever the module lives",
      ),
    },
  )
