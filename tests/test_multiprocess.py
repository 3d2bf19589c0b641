"""Data-parallel training through the bridge across two processes (JAX multi-controller, CPU).

Two processes on this machine join JAX's multi-controller runtime
(`jax.distributed.initialize`, coordinator and gloo collectives on 127.0.0.1), build one
mesh over both processes' CPU devices and train a small torch MLP through
`bridge.extract_jax`: each process feeds only its half of the batch, the parameters are
replicated, and the jitted step all-reduces the gradient across processes. Both
processes must end with the same parameters, and those must be the parameters of the
same training run by one process on the whole batch. The bridge adds no distribution of
its own; this checks that its functions and placements work inside JAX's.

The workers are tests/multiprocess_worker.py. This test starts them, waits with a
deadline, and always ends them (their whole process groups), whatever happens.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "multiprocess_worker.py"
DEADLINE_S = 120  # for one run of the workers; a normal run takes a few seconds
GRACE_S = 5  # after a worker fails (its peers would wait for it in a collective) or at the end

# The two-process run reduces the gradient in a different order from the one-process run
# (per-process partial sums, then gloo's all-reduce), so they agree to float32 rounding:
# measured differences are ~3e-8 on parameters of magnitude ~0.1-0.5 after 4 steps. The
# training moves the parameters by more than 1e-3, far above these tolerances.
RTOL, ATOL = 1e-5, 1e-6


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _tail(path: Path, lines: int = 25) -> str:
  try:
    text = path.read_text(errors="replace")
  except OSError:
    return "(no output)"
  kept = [ln for ln in text.splitlines() if ln.strip()]
  return "\n".join(kept[-lines:]) or "(no output)"


def _status(p: subprocess.Popen) -> int | None:
  """The worker's exit code (negative: killed by that signal), or None while it runs.

  Does not reap it: until it is reaped its id, which is also its process group's id,
  cannot be reused, so signalling that group cannot reach anything else.
  """
  if p.returncode is not None:
    return p.returncode
  info = os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
  if info is None:
    return None
  return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _signal_group(p: subprocess.Popen, sig: int) -> bool:
  """Send `sig` to the worker's process group; whether the group had any member left."""
  try:
    os.killpg(p.pid, sig)  # its own session (start_new_session): the worker and any child
    return True
  except (ProcessLookupError, PermissionError):
    return False


def _end(procs: list[subprocess.Popen]) -> None:
  """End what is left of every worker's process group (SIGTERM, then SIGKILL), then reap.

  Every group is signalled, also a finished worker's (it may have left a child behind);
  the workers are reaped only afterwards, so their group ids cannot have been reused.
  """
  for sig in (signal.SIGTERM, signal.SIGKILL):
    if not any([_signal_group(p, sig) for p in procs]):  # a list: signal every group
      break
    end = time.monotonic() + GRACE_S
    while time.monotonic() < end and any(_status(p) is None for p in procs):
      time.sleep(0.05)
  for p in procs:
    p.wait()


def _worker_env() -> dict[str, str]:
  # Idle OpenMP threads sleep instead of spinning: two or three processes share few cores.
  return dict(os.environ, OMP_WAIT_POLICY="PASSIVE", PYTHONUNBUFFERED="1")


def run_workers(out: Path, num_processes: int, *extra: str) -> list[dict[str, np.ndarray]]:
  """Run `num_processes` workers to the end; their results, or an assertion with their logs."""
  out.mkdir(parents=True, exist_ok=True)
  port = _free_port()
  procs: list[subprocess.Popen] = []
  logs = [out / f"worker_{i}.log" for i in range(num_processes)]
  try:
    for i in range(num_processes):
      with open(logs[i], "wb") as log:
        procs.append(
          subprocess.Popen(
            [
              sys.executable,
              str(WORKER),
              "--process-id",
              str(i),
              "--num-processes",
              str(num_processes),
              "--port",
              str(port),
              "--out",
              str(out),
              *extra,
            ],
            cwd=ROOT,
            env=_worker_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
          )
        )
    deadline = time.monotonic() + DEADLINE_S
    stopped = f"ended at the {DEADLINE_S} s deadline"
    while time.monotonic() < deadline:
      codes = [_status(p) for p in procs]
      if all(c is not None for c in codes):
        break
      if any(c not in (None, 0) for c in codes) and not stopped.startswith("ended after"):
        # The others would wait for it in a collective: give them a moment, then end them.
        deadline = min(deadline, time.monotonic() + GRACE_S)
        stopped = "ended after another worker failed"
      time.sleep(0.05)
    running = [_status(p) is None for p in procs]
  finally:
    _end(procs)
  codes = [p.returncode for p in procs]
  report = "\n".join(
    f"--- worker {i} (exit code {c}{', ' + stopped if was_running else ''}):\n{_tail(log)}"
    for i, (c, log, was_running) in enumerate(zip(codes, logs, running))
  )
  assert codes == [0] * num_processes, f"workers failed, exit codes {codes}\n{report}"
  results = []
  for i in range(num_processes):
    with np.load(out / f"process_{i}.npz") as f:
      results.append({k: f[k] for k in f.files})
  return results


def _params(result: dict[str, np.ndarray], prefix: str = "param/") -> dict[str, np.ndarray]:
  return {k[len(prefix) :]: v for k, v in result.items() if k.startswith(prefix)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, np.ndarray]:
  """The same training in one process, on the whole batch, from the torch module directly."""
  (result,) = run_workers(tmp_path_factory.mktemp("single"), 1)
  assert int(result["process_count"]) == 1
  return result


def _check_matches(
  results: list[dict[str, np.ndarray]], reference: dict[str, np.ndarray], local_devices: int
) -> None:
  ref = _params(reference)
  moved = max(float(np.abs(ref[k] - v).max()) for k, v in _params(reference, "init/").items())
  assert moved > 1e-3, f"the reference training barely moved the parameters ({moved})"
  for i, r in enumerate(results):
    # Really two processes, each holding only its own rows of the batch.
    assert int(r["process_count"]) == 2
    assert int(r["local_devices"]) == local_devices
    assert int(r["global_devices"]) == 2 * local_devices
    assert r["local_rows"].tolist() == [8 * i, 8 * i + 8], r["local_rows"]
    got = _params(r)
    assert sorted(got) == sorted(ref)
    for k in ref:
      np.testing.assert_allclose(
        got[k],
        ref[k],
        rtol=RTOL,
        atol=ATOL,
        err_msg=f"process {i}, {k}: not the one-process result",
      )
      # The values loaded back into the torch module are the trained ones.
      np.testing.assert_array_equal(r[f"torch/{k}"], got[k], err_msg=f"process {i}, {k}")
    np.testing.assert_allclose(
      r["losses"], reference["losses"], rtol=RTOL, atol=ATOL, err_msg=f"process {i}: losses"
    )
  # Replicated values: both processes hold the very same (all-reduced) numbers.
  first, second = (_params(r) for r in results)
  for k in first:
    np.testing.assert_array_equal(first[k], second[k], err_msg=f"{k} differs between processes")
  np.testing.assert_array_equal(results[0]["losses"], results[1]["losses"])


@pytest.mark.slow
@pytest.mark.parametrize("local_devices", [1, 2])
def test_two_processes_train_like_one(tmp_path, reference, local_devices):
  """A mesh of 2 processes x `local_devices` CPU devices: `extract_jax` of the CPU module in
  each process, its params replicated with `bridge.shard`, the batch split across processes."""
  results = run_workers(tmp_path, 2, "--local-devices", str(local_devices))
  _check_matches(results, reference, local_devices)
