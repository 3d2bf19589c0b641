"""The workloads: each checks a system's output against a reference, then times it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .common import (
    FULL,
    FULL_BIG,
    MiB,
    QUICK,
    QUICK_MAX_BYTES,
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


def _check(actual, expected, what: str) -> None:
    try:
        np.testing.assert_allclose(_as_numpy(actual), _as_numpy(expected), rtol=1e-6, atol=0)
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

        return jnp.asarray(t.detach().numpy())
    return t


def _need(system: System, attr: str, workload: str):
    impl = getattr(system, attr)
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
    nbytes = SIZES[size]
    src = _big_tensor(nbytes)
    if direction == "to_torch":
        import jax.numpy as jnp

        src = jnp.array(src.numpy(), copy=True)  # a JAX-owned buffer, not a view of torch memory
    out = convert(src)
    _check_equal(out, src, "converted array")
    if _data_pointer(out) != _data_pointer(src):
        system.notes.append(f"{system.name}: {direction}_{size} copies (output does not alias the input).")
    timed = blocking(lambda: convert(src), out)
    del out
    settings = QUICK if quick else (FULL_BIG if nbytes > MiB else FULL)
    return time_calls(timed, settings)


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
            table[f"{direction}_{size}"] = (
                lambda system, q, s=size, d=direction: _transfer(system, q, s, d)
            )
    return table
