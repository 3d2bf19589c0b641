"""The exact dtype correspondence between torch and JAX.

A dtype crosses the boundary only if both sides have it bit for bit; everything
else is refused with a `BridgeTypeError` rather than converted. 64-bit dtypes
cross only while JAX's 64-bit types are enabled (see `check_x64`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax._src import config as _jax_config

from bridge._src.errors import BridgeTypeError

# (torch attribute, jax.numpy attribute). Only pairs present in both installed
# versions are kept, so a newer float8 type appears as soon as both sides have it.
_PAIRS = (
  ("bool", "bool_"),
  ("uint8", "uint8"),
  ("uint16", "uint16"),
  ("uint32", "uint32"),
  ("uint64", "uint64"),
  ("int8", "int8"),
  ("int16", "int16"),
  ("int32", "int32"),
  ("int64", "int64"),
  ("float16", "float16"),
  ("bfloat16", "bfloat16"),
  ("float32", "float32"),
  ("float64", "float64"),
  ("complex64", "complex64"),
  ("complex128", "complex128"),
  ("float8_e4m3fn", "float8_e4m3fn"),
  ("float8_e5m2", "float8_e5m2"),
  ("float8_e4m3fnuz", "float8_e4m3fnuz"),
  ("float8_e5m2fnuz", "float8_e5m2fnuz"),
  ("float8_e8m0fnu", "float8_e8m0fnu"),
)

TORCH_TO_JAX: dict[torch.dtype, np.dtype] = {
  getattr(torch, t): np.dtype(getattr(jnp, j))
  for t, j in _PAIRS
  if hasattr(torch, t) and hasattr(jnp, j)
}
JAX_TO_TORCH: dict[np.dtype, torch.dtype] = {j: t for t, j in TORCH_TO_JAX.items()}
# The same, keyed by `id` of the dtype objects JAX arrays carry (hot paths: no dtype hashing).
JAX_TO_TORCH_BY_ID: dict[int, torch.dtype] = {id(j): t for j, t in JAX_TO_TORCH.items()}

# Dtypes that JAX silently narrows to 32 bits while `jax_enable_x64` is off.
TORCH_X64 = frozenset({torch.int64, torch.uint64, torch.float64, torch.complex128})

# ... and what they become (also what the bridge computes them as in a 32-bit program).
NARROWED = {
  torch.int64: torch.int32,
  torch.uint64: torch.uint32,
  torch.float64: torch.float32,
  torch.complex128: torch.complex64,
}


def x64_enabled() -> bool:
  """Whether JAX's 64-bit types are on here (globally or in a `jax.enable_x64` scope)."""
  return bool(_jax_config.enable_x64.value)


def strong(a: Any) -> Any:
  """The JAX value `a` without JAX's weak type (the branches and iterations of control flow
  must agree on their types exactly)."""
  return jax.lax.convert_element_type(a, a.dtype)


def jax_dtype(dtype: torch.dtype, *, api: str, where: str) -> np.dtype:
  """The JAX dtype equal to torch `dtype`, or a `BridgeTypeError` naming `where`."""
  try:
    return TORCH_TO_JAX[dtype]
  except KeyError:
    raise BridgeTypeError(
      f"`{api}`: {where} has dtype {dtype}, which JAX has no exact equivalent for. "
      f"Cast it to a supported dtype first ({_supported(TORCH_TO_JAX)})."
    ) from None


def torch_dtype(dtype: np.dtype, *, api: str, where: str) -> torch.dtype:
  """The torch dtype equal to JAX `dtype`, or a `BridgeTypeError` naming `where`."""
  try:
    return JAX_TO_TORCH[np.dtype(dtype)]
  except (KeyError, TypeError):
    raise BridgeTypeError(
      f"`{api}`: {where} has dtype {dtype}, which torch has no exact equivalent for. "
      f"Cast it with `.astype(...)` to a supported dtype first ({_supported(JAX_TO_TORCH)})."
    ) from None


def check_x64(dtype: torch.dtype, *, api: str, where: str) -> None:
  """Refuse a 64-bit torch dtype while JAX would silently narrow it to 32 bits."""
  if dtype in TORCH_X64 and not x64_enabled():
    short = str(dtype).removeprefix("torch.")
    narrow = str(NARROWED[dtype]).removeprefix("torch.")
    raise BridgeTypeError(
      f"`{api}`: {where} is {short}, but JAX's 64-bit types are disabled, so JAX "
      f"would silently turn it into {narrow}. Either enable them, globally "
      "with `jax.config.update('jax_enable_x64', True)` or for this call with "
      "`with jax.enable_x64(True): ...`, or narrow the tensor yourself, e.g. "
      f"`t.to(torch.{narrow})`."
    )


def scalar_type_name(dtype: torch.dtype) -> str:
  """torch's name of `dtype` as its messages spell it ("Float", "Long", "ComplexDouble")."""
  meta = torch.empty(0, dtype=dtype, device="meta")
  return meta.type().removeprefix("torch.meta.")[: -len("Tensor")]


def _supported(table: dict) -> str:
  return ", ".join(str(k).removeprefix("torch.") for k in table)


__all__ = [
  "TORCH_TO_JAX",
  "JAX_TO_TORCH",
  "TORCH_X64",
  "x64_enabled",
  "jax_dtype",
  "torch_dtype",
  "check_x64",
  "scalar_type_name",
]
