"""Reference point: the same math done by torch itself, eagerly, with torch autograd."""

from ..common import System, torch_fwd_bwd


def make() -> System:
    return System(
        name="torch_eager",
        call=lambda f: f,  # f uses plain operators, so it runs as torch ops on torch tensors
        fwd_bwd=lambda f: torch_fwd_bwd(f),
        eager=lambda x, y: ((lambda: x + y), (lambda out: out)),
        notes=["torch_eager: the math runs as torch ops; no JAX involved."],
        unsupported={
            "to_jax": "not applicable (no JAX side)",
            "to_torch": "not applicable (no JAX side)",
        },
    )
