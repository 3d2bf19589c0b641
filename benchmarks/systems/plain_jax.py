"""Lower bound: the jitted JAX function called directly on JAX arrays (no torch at all)."""

import jax
import jax.numpy as jnp

from ..common import System


def _call(f):
    return jax.jit(f)


def _fwd_bwd(f):
    """Jitted equivalent of ``y = f(x); y.sum().backward()``: returns (y, grad)."""

    def step(x):
        y, vjp = jax.vjp(f, x)
        (grad,) = vjp(jnp.ones_like(y))
        return y, grad

    return jax.jit(step)


def _eager(x, y):
    xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
    return (lambda: jnp.add(xj, yj)), (lambda out: out)


def make() -> System:
    return System(
        name="plain_jax",
        array_in="jax",
        call=_call,
        fwd_bwd=_fwd_bwd,
        eager=_eager,
        notes=["plain_jax: JAX arrays in and out, no framework boundary (lower bound); "
               "eager_add: jnp.add, eager (not jitted)."],
        unsupported={
            "to_jax": "not applicable (no torch side)",
            "to_torch": "not applicable (no torch side)",
        },
    )
