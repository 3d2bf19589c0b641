"""Known failures of the OpInfo test (`tests/ops/test_opinfo.py`), in named lists, one reason each.

Each list maps an OpInfo name (`name.variant_test_name`) to a spec of the
(mode, dtype) pairs that fail: `"*"` for every pair the op runs, or
`"eager jit: f16 bf16; grad: *"` (modes, a colon, dtypes or `*`; `;` between groups).
`ERRORS`, `WRONG_DTYPE` and `SILENTLY_WRONG` add the reason after the spec.

The lists only shrink: the test fails when a listed pair starts passing.
`SILENTLY_WRONG` is the list the project holds at zero: a wrong number is worse
than an error, so a lowering that cannot match torch there must raise instead.
"""

from __future__ import annotations

from typing import Any


def _expand(name: str, spec: str, jobs: dict[str, list[tuple[str, str]]]) -> list[tuple[str, str]]:
  pairs = jobs.get(name, [])
  if spec.strip() == "*":
    return list(pairs)
  out = []
  for group in spec.split(";"):
    modes, _, dtypes = group.partition(":")
    modes_ = modes.split()
    dtypes_ = dtypes.split() or ["*"]
    out.extend((m, d) for m, d in pairs if m in modes_ and (dtypes_ == ["*"] or d in dtypes_))
  return out


def expected() -> dict[tuple[str, str, str], tuple[str, str]]:
  """(op, mode, dtype) -> (status, reason) for every listed pair."""
  from bridge_ops.testing import coverage

  jobs: dict[str, list[tuple[str, str]]] = {}
  for info, dtype, mode in coverage.jobs(coverage.op_db()):
    jobs.setdefault(coverage.full_name(info), []).append((mode, coverage.DTYPES[dtype]))
  out: dict[tuple[str, str, str], tuple[str, str]] = {}
  lists: list[tuple[str, dict[str, Any]]] = [
    ("error", {k: (v, "no lowering yet") for k, v in NO_LOWERING.items()}),
    ("error", ERRORS),
    ("dtype", WRONG_DTYPE),
    ("wrong", SILENTLY_WRONG),
  ]
  for status, table in lists:
    for name, entry in table.items():
      specs = entry if isinstance(entry, list) else [entry]
      for spec, reason in specs:
        for mode, dtype in _expand(name, spec, jobs):
          out[(name, mode, dtype)] = (status, reason)
  return out


# No lowering yet: the op (the aten overload in the comment) raises OperatorNotFound.
NO_LOWERING: dict = {
  "to_sparse": "*",  # aten._to_sparse.default
}

# The bridge raises another error: the reason is the error.
ERRORS: dict = {
  "allclose": (
    "jit: *",
    "torch-only semantics under jax.jit: needs a traced value (data-dependent shape or Python value): TracedValueError",
  ),
  "argwhere": (
    "jit: *",
    "torch-only semantics under jax.jit: needs a traced value (data-dependent shape or Python value): TracedValueError",
  ),
  "bincount": (
    "jit: *",
    "torch-only semantics under jax.jit: needs a traced value (data-dependent shape or Python value): TracedValueError",
  ),
  "chalf": ("*", "complex32 (chalf): JAX has no complex32 (a clear error)"),
  "complex": ("eager jit: f16", "complex32 (chalf): JAX has no complex32 (a clear error)"),
  "equal": (
    "jit: *",
    "torch-only semantics under jax.jit: needs a traced value (data-dependent shape or Python value): TracedValueError",
  ),
  "item": (
    "jit: *",
    "torch-only semantics under jax.jit: needs a traced value (data-dependent shape or Python value): TracedValueError",
  ),
  "masked_select": (
    "jit grad: *",
    "torch-only semantics under jax.jit: needs a traced value (data-dependent shape or Python value): TracedValueError",
  ),
  "narrow": (
    "grad: *",
    "torch-only semantics under jax.jit: needs a traced value (data-dependent shape or Python value): TracedValueError",
  ),
  "nn.functional.gaussian_nll_loss": (
    "jit grad: *",
    "torch-only semantics under jax.jit: needs a traced value (data-dependent shape or Python value): TracedValueError",
  ),
  "nn.functional.one_hot": (
    "jit: *",
    "torch-only semantics under jax.jit: needs a traced value (data-dependent shape or Python value): TracedValueError",
  ),
  "nonzero": (
    "jit: *",
    "torch-only semantics under jax.jit: needs a traced value (data-dependent shape or Python value): TracedValueError",
  ),
  "sparse.mm.reduce": [
    ("eager: f32", "TypeError: Cannot interpret 'torch.float32' as a data type"),
    ("eager: f64", "TypeError: Cannot interpret 'torch.float64' as a data type"),
    ("eager: bf16", "TypeError: Cannot interpret 'torch.bfloat16' as a data type"),
    ("eager: f16", "TypeError: Cannot interpret 'torch.float16' as a data type"),
    ("jit grad: *", "sparse layouts: JAX has only dense arrays (BridgeTypeError)"),
  ],
  "sparse.sampled_addmm": [
    ("eager: f32", "TypeError: Cannot interpret 'torch.float32' as a data type"),
    ("eager: f64", "TypeError: Cannot interpret 'torch.float64' as a data type"),
    ("eager: c64", "TypeError: Cannot interpret 'torch.complex64' as a data type"),
    ("jit grad: *", "sparse layouts: JAX has only dense arrays (BridgeTypeError)"),
  ],
  "to": (
    "jit grad: *",
    "torch-only semantics under jax.jit: needs a traced value (data-dependent shape or Python value): TracedValueError",
  ),
  "unique": (
    "jit: *",
    "torch-only semantics under jax.jit: needs a traced value (data-dependent shape or Python value): TracedValueError",
  ),
  "unique_consecutive": (
    "jit: *",
    "torch-only semantics under jax.jit: needs a traced value (data-dependent shape or Python value): TracedValueError",
  ),
  "view_as_complex": ("eager jit: f16", "complex32 (chalf): JAX has no complex32 (a clear error)"),
}

# Right values, wrong dtype.
WRONG_DTYPE: dict = {}

# Wrong values: to be fixed or made to raise (the project's target is zero).
SILENTLY_WRONG: dict = {}
