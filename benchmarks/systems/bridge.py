"""bridge (this project): bridge.call_jax, bridge.to_jax, bridge.to_torch."""

from ..common import System, torch_fwd_bwd


def _eager(x, y):
    xj, yj = x.to("jax"), y.to("jax")  # bridge.Tensors on the jax torch device
    return (lambda: xj + yj), (lambda out: out.cpu())


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
        notes=["bridge: bridge.call_jax(f, x) with the unjitted f; bridge.to_jax / bridge.to_torch; "
               "eager_add: x + y on tensors of the jax torch device."],
    )
