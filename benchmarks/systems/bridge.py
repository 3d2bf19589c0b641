"""bridge (this project): call_jax, to_jax, to_torch; compile and extract_jax on CPU modules."""

from .. import models
from ..common import System, torch_fwd_bwd


def _eager(x, y):
    xj, yj = x.to("jax"), y.to("jax")  # bridge.Tensors on the jax torch device
    return (lambda: xj + yj), (lambda out: out.cpu())


def _forward(module, x):
    import bridge

    compiled = bridge.compile(module)  # CPU tensors in, CPU tensors out
    return (lambda: compiled(x)), (lambda out: out)


def _train_step(module, x, y):
    import bridge

    params, fn = bridge.extract_jax(module)
    return models.jax_train_step(fn, params, x, y)


def make() -> System:
    import bridge

    def call(f):
        # bridge jits and caches internally; the same function object is passed every call.
        return lambda x: bridge.call_jax(f, x)

    return System(
        name="bridge",
        packages=("bridge",),
        call=call,
        fwd_bwd=lambda f: torch_fwd_bwd(call(f)),
        to_jax=bridge.to_jax,
        to_torch=bridge.to_torch,
        eager=_eager,
        forward=_forward,
        train_step=_train_step,
        notes=["bridge: bridge.call_jax(f, x) with the unjitted f; bridge.to_jax / bridge.to_torch; "
               "eager_add: x + y on tensors of the jax torch device.",
               "bridge: module workloads: bridge.compile(module)(x) on CPU module and tensors "
               "(CPU tensors out; see bridge_jax for the jax device); mlp_train_step: "
               "params, fn = bridge.extract_jax(mlp), then jax.jit of jax.value_and_grad of "
               "the cross-entropy of fn(params, x) plus the SGD update (benchmarks/models.py); "
               "gpt2_train_step_s64 likewise (the tied lm_head/wte weight is one parameter)."],
    )
