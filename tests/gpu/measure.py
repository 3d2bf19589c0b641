"""The GPU figures that `python -m benchmarks` has no rows for, side by side with their baselines
from the same process: transfers up to 1 GiB (zero-copy: flat in size), a Pallas softmax called
from torch against plain JAX and `torch.softmax`, and callback mode on the GPU (torch on XLA's
buffers and stream) against the host path and against calling torch directly.

    python tests/gpu/measure.py OUT.md

Prints a Markdown table and writes it to OUT.md; without a CUDA GPU it says why and exits 0.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import torch


DRY = os.environ.get("MEASURE_DRY_RUN") == "1"  # the same steps on the CPU, to test the script
DEV = "cpu" if DRY else "cuda"


def samples(fn, *, reps: int = 50, warmup: int = 5, after_warmup=None) -> list[float]:
  """The seconds of `reps` calls of `fn`, one by one, after `warmup` untimed ones (2 and 1 in a
  dry run); `after_warmup()` runs between the two."""
  if DRY:
    reps, warmup = 2, 1
  for _ in range(warmup):
    fn()
  if after_warmup is not None:
    after_warmup()
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return times


def _median_us(fn, *, reps: int = 50, warmup: int = 5) -> float:
  return statistics.median(samples(fn, reps=reps, warmup=warmup)) * 1e6


def profile_text(fn, calls: int = 200) -> str:
  """Where `calls` calls of `fn` spend their host time: cProfile, by own and cumulative time."""
  import cProfile
  import io
  import pstats

  profiler = cProfile.Profile()
  profiler.enable()
  for _ in range(calls):
    fn()
  profiler.disable()
  text = io.StringIO()
  pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
  pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
  return f"{calls} calls\n" + text.getvalue()


def _profile(fn, path: str, calls: int = 200) -> None:
  with open(path, "w") as fh:
    fh.write(profile_text(fn, calls))


def _plus_one(x):
  return x + 1


_KEPT: list = []


def _keep(a):
  """`a`, also held until the row's timing ends (so that its deletion is not timed)."""
  _KEPT.append(a)
  return a


def main(out_path: str) -> int:
  if not torch.cuda.is_available() and not DRY:
    print("measure.py: no CUDA GPU in torch (torch.cuda.is_available() is False); nothing timed")
    return 0
  import jax
  import jax.numpy as jnp

  import bridge

  def _transfer_rows(label: str, nbytes: int) -> list[tuple[str, str, str]]:
    """to_jax and to_torch of `nbytes` on the GPU: the time of one, and whether it aliased."""
    t = torch.ones(nbytes // 4, device=DEV)
    a = bridge.to_jax(t)
    same = a.unsafe_buffer_pointer() == t.data_ptr()
    us = _median_us(lambda: bridge.to_jax(t))
    theirs = _median_us(lambda: jax.dlpack.from_dlpack(t))
    rows = [
      (
        f"to_jax {label}",
        f"{us:.1f} us",
        f"{'zero-copy' if same else 'COPIED'}; jax.dlpack.from_dlpack {theirs:.1f} us",
      )
    ]
    b = jnp.ones(nbytes // 4, jnp.float32)
    back = bridge.to_torch(b)
    same = back.data_ptr() == b.unsafe_buffer_pointer()
    us = _median_us(lambda: bridge.to_torch(b))
    theirs = _median_us(lambda: torch.from_dlpack(b))
    rows.append(
      (
        f"to_torch {label}",
        f"{us:.1f} us",
        f"{'zero-copy' if same else 'COPIED'}; torch.from_dlpack {theirs:.1f} us",
      )
    )
    return rows

  from bridge._src import ffi

  if jax.devices()[0].platform != "gpu" and not DRY:
    print(f"measure.py: JAX's default device is {jax.devices()[0]}, not a GPU; nothing timed")
    return 0
  sync = (lambda: None) if DRY else torch.cuda.synchronize
  rows: list[tuple[str, str, str]] = []  # (what, figure, baseline / note)

  # transfers: one conversion; zero-copy when the pointers agree
  sizes = (("1 MiB", 1 << 20), ("64 MiB", 64 << 20), ("1 GiB", 1 << 30))
  for label, nbytes in sizes[:1] if DRY else sizes:
    rows.extend(_transfer_rows(label, nbytes))  # (each size's buffers freed before the next)
    sync()

  # a Pallas softmax (Triton), from torch and from JAX; torch.softmax
  from benchmarks.gpu import pallas_softmax

  x_t = torch.randn(*((64, 128) if DRY else (4096, 1024)), device=DEV)
  x_j = bridge.to_jax(x_t.clone())
  jitted = jax.jit(pallas_softmax)
  torch.testing.assert_close(
    bridge.call_jax(pallas_softmax, x_t), torch.softmax(x_t, -1), rtol=1e-4, atol=1e-5
  )
  plain = _median_us(lambda: jitted(x_j).block_until_ready())
  from_torch = _median_us(lambda: (bridge.call_jax(pallas_softmax, x_t), sync()))
  eager = _median_us(lambda: (torch.softmax(x_t, -1), sync()))
  rows.append(
    (
      "Pallas softmax (4096x1024) via call_jax",
      f"{from_torch:.1f} us",
      f"plain JAX {plain:.1f} us ({from_torch / plain:.2f}x); torch.softmax {eager:.1f} us",
    )
  )
  out_j = jitted(x_j)
  plus_one = jax.jit(_plus_one)
  small = torch.randn(16, 16, device=DEV)
  small_j = bridge.to_jax(small.clone())
  manual = _median_us(lambda: (torch.from_dlpack(jitted(jax.dlpack.from_dlpack(x_t))), sync()))
  rows.append(("  the same by hand (jax.dlpack / torch.from_dlpack)", f"{manual:.1f} us", ""))
  for what, fn in (
    ("  its parts: bridge.to_jax(x)", lambda: bridge.to_jax(x_t)),
    ("  its parts: jitted(x) dispatched, not waited for", lambda: jitted(x_j)),
    ("  its parts: bridge.to_torch(out)", lambda: bridge.to_torch(out_j)),
    ("  its parts: torch.cuda.synchronize() alone", sync),
    (
      "  call_jax of x + 1 (the fixed cost)",
      lambda: (bridge.call_jax(_plus_one, x_t), sync()),
    ),
    ("  jitted(to_jax(x)) dispatched, not waited for", lambda: jitted(bridge.to_jax(x_t))),
    (
      "  the same, the imported array kept alive (does its deletion wait for the GPU?)",
      lambda: jitted(_keep(bridge.to_jax(x_t))),
    ),
    (
      "  jitted(to_jax(x)), waited for by JAX",
      lambda: jitted(bridge.to_jax(x_t)).block_until_ready(),
    ),
    (
      "  jitted(x) on JAX's array, to_torch, synchronize",
      lambda: (bridge.to_torch(jitted(x_j)), sync()),
    ),
    ("  x + 1 in plain JAX, on JAX's array", lambda: plus_one(x_j).block_until_ready()),
    ("  call_jax of x + 1 on a 16x16 tensor", lambda: (bridge.call_jax(_plus_one, small), sync())),
    ("  x + 1 in plain JAX on a 16x16 array", lambda: plus_one(small_j).block_until_ready()),
  ):
    rows.append((what, f"{_median_us(fn):.1f} us", ""))
    _KEPT.clear()
  stem = out_path.replace(".md", "")
  _profile(lambda: (bridge.call_jax(pallas_softmax, x_t), sync()), stem + "_call_jax_profile.txt")

  # bridge.compile of the transformer block with CUDA tensors: the call, against the same
  # program on JAX arrays and against torch
  from benchmarks import models

  layer, x_cpu = models.transformer()
  layer, x_c = layer.to(DEV), x_cpu.to(DEV)
  compiled = bridge.compile(layer)
  params, fn = bridge.extract_jax(layer)
  program = jax.jit(fn)
  x_cj = bridge.to_jax(x_c.clone())
  with torch.no_grad():
    torch.testing.assert_close(compiled(x_c), layer(x_c), rtol=2e-3, atol=2e-3)
    ours = _median_us(lambda: (compiled(x_c), sync()))
    eager = _median_us(lambda: (layer(x_c), sync()))
    pure = _median_us(lambda: program(params, x_cj).block_until_ready())
    rows.append(
      (
        "bridge.compile(TransformerEncoderLayer) on CUDA tensors (4x32x128)",
        f"{ours:.1f} us",
        f"its program on JAX arrays {pure:.1f} us; torch eager {eager:.1f} us",
      )
    )
    _profile(lambda: (compiled(x_c), sync()), stem + "_compile_profile.txt")

  # callback mode on the GPU: buffers (XLA's stream) vs host memory vs torch directly
  from jax.experimental.buffer_callback import buffer_callback

  def _nothing(ctx, outs, a):
    pass

  nothing = jax.jit(lambda a: buffer_callback(_nothing, jax.ShapeDtypeStruct(a.shape, a.dtype))(a))
  for n in (256, 512) if DRY else (256, 2048):
    w = torch.randn(n, n, device=DEV) / n**0.5

    inside: list[float] = []
    threads: set[int] = set()

    def f(x, w=w):
      start = time.perf_counter()
      out = torch.nn.functional.gelu(x @ w)
      inside.append(time.perf_counter() - start)
      threads.add(threading.get_ident())
      return out

    def f_host(x, w=w):  # the host path hands over CPU tensors: to the GPU and back
      return torch.nn.functional.gelu(x.to(DEV) @ w).cpu()

    x_t = torch.randn(n, n, device=DEV)
    x_j = bridge.to_jax(x_t.clone())
    on_device = jax.jit(lambda a: bridge.call_torch(f, a, mode="callback"))
    torch.testing.assert_close(bridge.to_torch(on_device(x_j)), f(x_t), rtol=2e-3, atol=2e-3)
    direct = _median_us(lambda: (f(x_t), sync()))
    inside.clear()
    device_us = _median_us(lambda: on_device(x_j).block_until_ready())
    in_f = statistics.median(inside) * 1e6
    thread = "the caller's thread" if threads == {threading.get_ident()} else f"threads {threads}"
    if n == 256:
      _profile(lambda: on_device(x_j).block_until_ready(), stem + "_callback_profile.txt")
    route = ffi.route
    ffi.route = lambda platform_name=None: "host"
    try:
      through_host = jax.jit(lambda a: bridge.call_torch(f_host, a, mode="callback"))
      through_host(x_j).block_until_ready()
      host_us = _median_us(lambda: through_host(x_j).block_until_ready(), reps=20)
    finally:
      ffi.route = route
    rows.append(
      (
        f"callback mode gelu(x @ w), {n}x{n}",
        f"{device_us:.1f} us",
        f"torch directly {direct:.1f} us ({device_us / direct:.2f}x); host path "
        f"{host_us:.1f} us ({host_us / direct:.2f}x)",
      )
    )
    rows.append((f"  of which inside the torch function ({thread})", f"{in_f:.1f} us", ""))
    if n == 256:  # JAX's own floor: a program of one buffer callback that does nothing
      rows.append(
        (
          "  a program of one no-op JAX buffer callback (JAX's fixed cost)",
          f"{_median_us(lambda: nothing(x_j).block_until_ready()):.1f} us",
          "",
        )
      )

  gpu = "the CPU (dry run)" if DRY else torch.cuda.get_device_name(0)
  lines = [
    f"GPU figures on {gpu} (torch {torch.__version__}, CUDA {torch.version.cuda}; JAX "
    f"{jax.__version__}); medians of 50 calls (host path: 20) after warm-up "
    f"(tests/gpu/measure.py, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, one "
    "process; the tables above come from the same run of tests/gpu/run_on_gpu.sh on the "
    "same machine, in worker processes). A row whose label starts with spaces takes the row "
    "above it apart.",
    "",
    "| what | bridge | baseline (same run) |",
    "|---|---|---|",
  ]
  lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
  text = "\n".join(lines) + "\n"
  print(text)
  with open(out_path, "w") as fh:
    fh.write(text)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "gpu_figures.md"))
