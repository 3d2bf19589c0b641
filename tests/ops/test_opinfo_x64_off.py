"""Every OpInfo entry under `jax.jit` with JAX's 64-bit types OFF (JAX's default), for
float32, int64 and bool: no silently wrong value or dtype.

Such a program cannot hold int64/float64 values. An (op, dtype) passes when its values are
torch's and its dtypes are torch's, except that an int64 result may be the program's int32
with exact values; or when the bridge refuses a 64-bit value it cannot hold exactly
(`bridge.NarrowingError`, while tracing or when the run-time check fails). Any other error
must be one the `jit` mode (64-bit types on) also lists in `tests/ops/opinfo_known.py`.
"""

from __future__ import annotations

import pytest

pytest.importorskip("expecttest")  # torch's OpInfo module needs it (a test extra)

import bridge  # noqa: F401 - registers the `jax` device
from bridge._src import dtypes
from bridge_ops.testing import coverage

from tests.ops import opinfo_known

pytestmark = pytest.mark.skipif(dtypes.x64_enabled(), reason="needs JAX's 64-bit types off")

_INFOS = coverage.op_db()
_EXPECTED = opinfo_known.expected()


@pytest.mark.parametrize("info", _INFOS, ids=coverage.full_name)
def test_opinfo_with_64_bit_types_off(info):
  name = coverage.full_name(info)
  problems = []
  for _, dtype, mode in coverage.jobs([info], (coverage.X64_OFF,)):
    got = coverage.check(info, dtype, mode)
    if got.status in ("pass", "refused", "skip"):
      continue
    known = _EXPECTED.get((name, "jit", coverage.DTYPES[dtype]))
    if got.status == "error" and known is not None and known[0] == "error":
      continue  # fails with 64-bit types on too (listed there)
    problems.append(f"{coverage.DTYPES[dtype]}: {got.status} ({got.detail})")
  assert not problems, f"{name}:\n  " + "\n  ".join(problems)
