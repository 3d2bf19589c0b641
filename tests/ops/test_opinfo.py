"""Every OpInfo entry of torch's `op_db`, eager on the `jax` device, under `jax.jit` and
under `jax.grad` (through `call_torch`), against torch on CPU.

One test per OpInfo entry runs each dtype torch supports for it (among
`bridge_ops.testing.coverage.DTYPES`) in each mode, and compares the outcome of every
(op, mode, dtype) with `tests/ops/opinfo_known.py`: a pair not listed there must
pass, and a listed pair must fail as listed. So a new failure fails the test, and
so does a fix that leaves its entry in the list (the lists only shrink).
"""

from __future__ import annotations

import pytest

pytest.importorskip("expecttest")  # torch's OpInfo module needs it (a test extra)

import bridge  # noqa: F401 - registers the `jax` device
from bridge_ops.testing import coverage

from tests.ops import opinfo_known

_INFOS = coverage.op_db()
_EXPECTED = opinfo_known.expected()


@pytest.mark.parametrize("info", _INFOS, ids=coverage.full_name)
def test_opinfo(info):
  name = coverage.full_name(info)
  problems = []
  for _, dtype, mode in coverage.jobs([info]):
    got = coverage.check(info, dtype, mode)
    if got.status == "skip":
      continue
    short = coverage.DTYPES[dtype]
    want = _EXPECTED.get((name, mode, short))
    if want is None and got.status != "pass":
      problems.append(f"{mode} {short}: {got.status} ({got.detail}), and it is not a known failure")
    elif want is not None and got.status == "pass":
      problems.append(
        f"{mode} {short}: now passes; remove it from tests/ops/opinfo_known.py "
        f"({want[0]}: {want[1]})"
      )
    elif want is not None and got.status != want[0]:
      problems.append(f"{mode} {short}: {got.status} ({got.detail}), listed as {want[0]}")
  assert not problems, f"{name}:\n  " + "\n  ".join(problems)


def test_known_failures_name_real_ops():
  names = {coverage.full_name(i) for i in _INFOS}
  unknown = sorted({op for op, _, _ in _EXPECTED} - names)
  assert not unknown, f"tests/ops/opinfo_known.py lists ops that op_db does not have: {unknown}"
