"""Interleaved timing (`python -m benchmarks`'s default): the systems take turns.

Run one after another, the systems are timed minutes apart, and on a shared
machine a whole run can be 40% slower than the next; a ratio of two systems
then says as much about the minutes as about the systems. Interleaved (unless
`--sequential`), every system's worker starts at once and the coordinator (`run.py`) steps them
through the workloads together over a pair of pipes:

- a worker announces each workload (``begin W``) and waits for ``setup``; only
  the workers on the same workload set up, at the same time;
- `time_calls` warms up, says ``ready`` and then times calls in blocks of about
  1/40 of the time budget, one block per ``go``, answering ``more`` or ``full``
  (the repetition cap or the time budget reached); the coordinator sends ``go``
  to each ready worker in turn, so the systems' blocks alternate, until each is
  full, then ``stop``;
- ``end W`` closes the workload.

While one worker times a block, every other one waits on its pipe, idle. The
first-call workloads (fresh processes) alternate between systems in the same
way, one process at a time (`run.py`); the sharded and CUDA workloads keep
their own workers, one system after another.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any, TextIO

ENV = "BENCH_INTERLEAVE"  # "READ_FD,WRITE_FD" of the worker's end of the two pipes
ROUNDS = 40  # blocks per time budget
MIN_BLOCK_S = 0.005


class Channel:
  """One end of a worker's two pipes: lines in, lines out."""

  def __init__(self, read: TextIO, write: TextIO):
    self.read, self.write = read, write

  def send(self, message: str) -> None:
    try:
      self.write.write(message + "\n")
      self.write.flush()
    except BrokenPipeError:  # the other end died; its recv() will say so
      pass

  def recv(self) -> str | None:
    """The next line, or None once the other end is closed."""
    line = self.read.readline()
    return line.rstrip("\n") if line else None


_channel: list[Channel | None] = []


def channel() -> Channel | None:
  """This worker's channel to the coordinator, or None when it runs on its own."""
  if not _channel:
    fds = os.environ.get(ENV)
    if not fds:
      _channel.append(None)
    else:
      r, w = (int(fd) for fd in fds.split(","))
      _channel.append(Channel(os.fdopen(r, "r"), os.fdopen(w, "w")))
  return _channel[0]


def begin(workload: str) -> None:
  """Announce `workload` and wait until the coordinator lets this worker set it up."""
  ch = channel()
  if ch is None:
    return
  ch.send(f"begin {workload}")
  if ch.recv() != "setup":
    raise SystemExit(f"benchmarks worker: the coordinator did not start {workload}")


def end(workload: str) -> None:
  ch = channel()
  if ch is not None:
    ch.send(f"end {workload}")


def timed_blocks(
  ch: Channel,
  fn: Callable[[], Any],
  min_reps: int,
  max_reps: int,
  budget_s: float,
  rounds: list[float] | None = None,
) -> list[float]:
  """The worker's side of one interleaved timing: per-call seconds. `rounds`, if given,
  receives each block's median (one per round, for the per-round ratios of the report)."""
  samples: list[float] = []
  clock = time.perf_counter
  block_s = max(budget_s / ROUNDS, MIN_BLOCK_S)
  spent = 0.0
  ch.send("ready")
  while True:
    command = ch.recv()
    if command != "go":  # "stop", or the coordinator is gone
      return samples
    start = clock()
    block_end = start + block_s
    first = len(samples)
    while len(samples) < max_reps:
      t0 = clock()
      fn()
      t1 = clock()
      samples.append(t1 - t0)
      if t1 > block_end:
        break
    spent += clock() - start
    if rounds is not None and len(samples) > first:
      rounds.append(statistics.median(samples[first:]))
    full = len(samples) >= max_reps or (len(samples) >= min_reps and spent >= budget_s)
    ch.send("full" if full else "more")


def coordinate(channels: dict[str, Channel], order: list[str], log: Callable[[str], None]) -> None:
  """Step the workers (by system name, in `order`) through their workloads together.

  Each worker lists its workloads in the same order; a worker whose next workload is
  another one waits (blocked on its `begin`) until that one's turn. Returns when every
  worker has closed its pipe (finished, or died: its report says why).
  """
  upcoming: dict[str, str] = {}  # system -> the workload it announced and waits to set up
  alive = [name for name in order if name in channels]

  def next_message(name: str) -> str | None:
    message = channels[name].recv()
    if message is None and name in alive:
      alive.remove(name)
    return message

  while True:
    for name in list(alive):
      if name not in upcoming:
        message = next_message(name)
        if message is not None and message.startswith("begin "):
          upcoming[name] = message[len("begin ") :]
    if not upcoming:
      return
    workload = upcoming[next(n for n in order if n in upcoming)]
    group = [n for n in order if upcoming.get(n) == workload]
    for name in group:
      del upcoming[name]
      channels[name].send("setup")
    log(f"{workload}: {', '.join(group)}")
    _run_workload(group, next_message, channels, workload)


def _run_workload(
  group: list[str],
  next_message: Callable[[str], str | None],
  channels: dict[str, Channel],
  workload: str,
) -> None:
  """Wait for each worker of `group` to be ready or done; alternate blocks; repeat (a
  workload may time several things) until each has ended `workload`."""
  waiting = list(group)
  while waiting:
    ready = []
    for name in waiting:
      message = next_message(name)
      if message == "ready":
        ready.append(name)
      # "end <workload>" or a closed pipe: this worker is done with the workload
    active = list(ready)
    while active:
      for name in list(active):
        channels[name].send("go")
        answer = next_message(name)
        if answer != "more":
          active.remove(name)
          if answer == "full":  # (None: the worker died)
            channels[name].send("stop")
    waiting = ready
