"""Where the fixed cost of a GPU call goes: each step of `to_jax` of a CUDA tensor timed on its
own, with the alternatives side by side; whether deleting an imported array waits for the GPU;
cProfiles of `call_jax`, `bridge.compile` and callback mode on CUDA tensors.

    python tests/gpu/probe.py OUT_DIR

Writes OUT_DIR/probe.txt (the timings) and OUT_DIR/profiles.txt. `MEASURE_DRY_RUN=1` runs the
steps that apply on the CPU (to test the script); without a CUDA GPU it says so and exits 0.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch

DRY = os.environ.get("MEASURE_DRY_RUN") == "1"
# PROBE_SECTIONS=compile,callback skips the transfer and call_jax sections
SECTIONS = os.environ.get("PROBE_SECTIONS", "transfers,compile,callback").split(",")


def want(section: str) -> bool:
  return section in SECTIONS


DEV = "cpu" if DRY else "cuda"
LINES: list[str] = []


def say(line: str) -> None:
  print(line, flush=True)
  LINES.append(line)


def timed(what: str, fn, *, reps: int = 200, after=None) -> float:
  from measure import samples  # (tests/gpu/measure.py, beside this file)

  times = samples(fn, reps=reps, after_warmup=after)
  if after:
    after()
  us = statistics.median(times) * 1e6
  say(f"{what:<72} {us:9.1f} us  (min {min(times) * 1e6:.1f})")
  return us


def inner(what: str, fn, *, reps: int = 200) -> None:
  """`fn` returns the seconds of the part it times itself."""
  reps = 3 if DRY else reps
  for _ in range(5):
    fn()
  times = [fn() for _ in range(reps)]
  say(f"{what:<72} {statistics.median(times) * 1e6:9.1f} us  (min {min(times) * 1e6:.1f})")


def _deleted(make, program, kept: list):
  """A call timing `del a` for a fresh `a = make()` (read by a pending `program(a)` if given)."""

  def one() -> float:
    a = make()
    y = program(a) if program is not None else None
    start = time.perf_counter()
    del a
    took = time.perf_counter() - start
    kept.append(y)
    return took

  return one


def _dispatched(make, program, kept: list):
  """A call timing the dispatch of `program(a)` alone, for a fresh `a = make()` (kept)."""

  def one() -> float:
    a = make()
    start = time.perf_counter()
    y = program(a)
    took = time.perf_counter() - start
    kept.append((a, y))
    return took

  return one


def _handed_back(make, to_torch):
  """A call timing `to_torch(o)` alone, for a fresh (just dispatched) `o = make()`."""

  def one() -> float:
    o = make()
    start = time.perf_counter()
    to_torch(o)
    return time.perf_counter() - start

  return one


PROFILES: list[str] = []


def profile(what: str, fn, calls: int = 300) -> None:
  from measure import profile_text  # (tests/gpu/measure.py, beside this file)

  calls = 3 if DRY else calls
  fn()
  PROFILES.append(f"===== {what}: {profile_text(fn, calls)}")


def main(out_dir: str) -> int:
  os.makedirs(out_dir, exist_ok=True)
  if not torch.cuda.is_available() and not DRY:
    print("probe.py: no CUDA GPU")
    return 0
  import jax

  import bridge
  from bridge._src import transfer

  sync = (lambda: None) if DRY else torch.cuda.synchronize
  say(f"torch {torch.__version__} jax {jax.__version__} devices {jax.devices()}")
  x = torch.randn(*((64, 128) if DRY else (4096, 1024)), device=DEV)
  small = torch.randn(16, 16, device=DEV)
  jitted = jax.jit(lambda a: a + 1)
  x_j = bridge.to_jax(x.clone())
  jitted(x_j).block_until_ready()
  kept: list = []
  clear = lambda: (sync(), kept.clear(), sync())

  if want("transfers"):
    say("--- to_jax of a CUDA tensor, step by step")
    timed("bridge.to_jax(x)", lambda: bridge.to_jax(x))
    timed("bridge.to_jax(x), kept alive", lambda: kept.append(bridge.to_jax(x)), after=clear)
    timed("jax.dlpack.from_dlpack(x)", lambda: jax.dlpack.from_dlpack(x))
    timed("transfer.tensor_to_jax(x)", lambda: transfer.tensor_to_jax(x))
    timed("torch._C._to_dlpack(x) (capsule dropped)", lambda: torch._C._to_dlpack(x))
    timed("x.detach()", lambda: x.detach())
    timed("transfer.check_tensor(x)", lambda: transfer.check_tensor(x, api="a", where=lambda: "b"))
    timed("is_dense + data_ptr check", lambda: transfer._not_zero_copy_reason(x, 16, "w"))
    if not DRY:
      target = transfer._cuda_target(0)
      device, stream, jstream = target
      kdl = transfer._KDL_CUDA
      to_buffer = transfer._dlpack_to_buffer
      timed(
        "transfer._cuda_tensor_to_jax(x, target)", lambda: transfer._cuda_tensor_to_jax(x, target)
      )
      for label, on in (
        ("its import: _to_dlpack + dlpack_to_buffer(stream)", stream),
        ("the import with no stream (None)", None),
      ):
        imp = lambda on=on: to_buffer(torch._C._to_dlpack(x), device, on, False, kdl)
        timed(f"  {label}", imp)
        timed(f"  {label}, kept alive", lambda imp=imp: kept.append(imp()), after=clear)
      timed("  _cuda_getCurrentRawStream(0)", lambda: torch._C._cuda_getCurrentRawStream(0))
      timed("  current_cuda_stream(0)", lambda: transfer.current_cuda_stream(0))
      cur = transfer.current_cuda_stream(0)

      def new_event():
        e = torch.cuda.Event()
        e.record(transfer.current_cuda_stream(0))
        jstream.wait_event(e)

      timed("  new Event, record on current, JAX stream waits", new_event)
      ev = torch.cuda.Event()

      def cached_event():
        ev.record(cur)
        jstream.wait_event(ev)

      timed("  one cached Event and stream object: record + wait", cached_event)
      timed("  cached Event record only", lambda: ev.record(cur))
      timed("  jstream.wait_event(ev) only", lambda: jstream.wait_event(ev))
      raw_record = getattr(torch._C._CudaEventBase, "record", None)
      say(f"  (torch._C._CudaEventBase.record: {raw_record})")
      timed("  torch.cuda.Event() alone", lambda: torch.cuda.Event())

      say("--- deleting an imported array: does it wait for the GPU?")
      imported = lambda: bridge.to_jax(x)
      no_stream = lambda: to_buffer(torch._C._to_dlpack(x), device, None, False, kdl)
      for what, make, busy in (
        ("del of an idle imported array", imported, False),
        ("del of an imported array a pending program reads", imported, True),
        ("the same, imported with no stream", no_stream, True),
        ("del of a JAX-made array a pending program reads", lambda: jitted(x_j), True),
      ):
        inner(what, _deleted(make, jitted if busy else None, kept))
        clear()
      for what, make in (
        ("jitted(a) dispatch alone, a imported (kept)", imported),
        ("jitted(a) dispatch alone, a imported with no stream (kept)", no_stream),
        ("jitted(x_j) dispatch alone, JAX's array", lambda: x_j),
      ):
        inner(what, _dispatched(make, jitted, kept))
        clear()
      timed("jitted(to_jax(x)), all dropped", lambda: jitted(bridge.to_jax(x)))
      timed(
        "jitted(to_jax(x)), input kept", lambda: kept.append(jitted(bridge.to_jax(x))), after=clear
      )

      small_j = bridge.to_jax(small.clone())
      for what, a in (
        ("gpu_array_to_torch of a just-dispatched output", x_j),
        ("the same, 16x16", small_j),
      ):
        inner(what, _handed_back(lambda a=a: jitted(a), transfer.gpu_array_to_torch))
        sync()
      timed(
        "chain by hand: tensor_to_jax, jitted, gpu_array_to_torch (16x16)",
        lambda: transfer.gpu_array_to_torch(jitted(transfer.tensor_to_jax(small))),
      )
      timed(
        "the same chain, synchronize",
        lambda: (transfer.gpu_array_to_torch(jitted(transfer.tensor_to_jax(small))), sync()),
      )
      out = jitted(x_j)
      timed("bridge.to_torch(out)", lambda: bridge.to_torch(out))
      timed("transfer.gpu_array_to_torch(out)", lambda: transfer.gpu_array_to_torch(out))
      timed("out.block_until_ready() of a ready array", lambda: out.block_until_ready())
      timed("jitted(x_j).block_until_ready()", lambda: jitted(x_j).block_until_ready())
      timed("jitted(x_j); torch.cuda.synchronize()", lambda: (jitted(x_j), sync()))

    say("--- call_jax")
    timed(
      "call_jax(x + 1) on (4096, 1024), synchronize",
      lambda: (bridge.call_jax(_plus_one, x), sync()),
    )
    timed(
      "call_jax(x + 1) on (16, 16), synchronize",
      lambda: (bridge.call_jax(_plus_one, small), sync()),
    )
    timed("call_jax(x + 1) on (16, 16), no synchronize", lambda: bridge.call_jax(_plus_one, small))
    profile(
      "call_jax(x + 1) on (16, 16), synchronize",
      lambda: (bridge.call_jax(_plus_one, small), sync()),
    )

  say("--- bridge.compile on CUDA tensors")
  from benchmarks import models

  layer, x_cpu = models.transformer()
  layer, x_c = layer.to(DEV), x_cpu.to(DEV)
  compiled = bridge.compile(layer)
  with torch.no_grad():
    compiled(x_c)
    timed("compiled(TransformerEncoderLayer)(x), synchronize", lambda: (compiled(x_c), sync()))
    timed("compiled(...)(x), no synchronize", lambda: compiled(x_c))
    profile("compiled(TransformerEncoderLayer)(x), synchronize", lambda: (compiled(x_c), sync()))
    try:
      gpt, ids = models.gpt2(256)
      gpt, ids = gpt.to(DEV), ids.to(DEV)
      cg = bridge.compile(gpt)
      cg(ids)
      timed("compiled(GPT-2 s256)(ids), synchronize", lambda: (cg(ids), sync()), reps=50)
      params, fn = bridge.extract_jax(gpt)
      prog = jax.jit(fn)
      with jax.enable_x64(True):  # the ids are int64
        ids_j = bridge.to_jax(ids.clone())
        prog(params, ids_j).block_until_ready()
        timed(
          "its program on JAX arrays, block_until_ready",
          lambda: prog(params, ids_j).block_until_ready(),
          reps=50,
        )
        timed(
          "its program on JAX arrays, torch synchronize",
          lambda: (prog(params, ids_j), sync()),
          reps=50,
        )
      timed("torch eager GPT-2, synchronize", lambda: (gpt(ids), sync()), reps=50)
      program = next(iter(cg._programs.values()))
      say(
        f"  GPT-2: shortcut recorded {cg._fast is not None}, lean {program.lean is not None}, "
        f"tiers {program.tiers is not None}, {len(cg._imported)} state arrays"
      )
      if program.lean is not None:
        with jax.enable_x64(True):
          state = [h[2] for h in cg._imported]
          ids_a = bridge.to_jax(ids.clone())
          timed(
            "  its lean executable called directly, torch synchronize",
            lambda: (program.lean(*state, ids_a), sync()),
            reps=50,
          )
      profile("compiled(GPT-2 s256)(ids), synchronize", lambda: (cg(ids), sync()), calls=50)
    except Exception as e:  # noqa: BLE001 - a probe: report and go on
      say(f"GPT-2 rows failed: {type(e).__name__}: {e}")

  say("--- callback mode, 256x256")
  w = torch.randn(256, 256, device=DEV) / 16

  def f(a):
    return torch.nn.functional.gelu(a @ w)

  xs = torch.randn(256, 256, device=DEV)
  xs_j = bridge.to_jax(xs.clone())
  on_device = jax.jit(lambda a: bridge.call_torch(f, a, mode="callback"))
  on_device(xs_j).block_until_ready()
  timed("callback gelu(x @ w), block_until_ready", lambda: on_device(xs_j).block_until_ready())
  timed("torch directly, synchronize", lambda: (f(xs), sync()))
  timed("torch directly, no synchronize", lambda: f(xs))
  from jax.experimental.buffer_callback import buffer_callback

  def nothing(ctx, outs, a):
    pass

  spec = jax.ShapeDtypeStruct(xs_j.shape, xs_j.dtype)
  floor = jax.jit(lambda a: buffer_callback(nothing, spec)(a))
  floor(xs_j).block_until_ready()
  timed(
    "a program of one no-op JAX buffer callback, block_until_ready",
    lambda: floor(xs_j).block_until_ready(),
  )
  if not DRY:  # torch's host time on XLA's stream, outside and inside a callback
    from bridge._src import ffi

    ptrs: list = []

    def grab(ctx, outs, a):
      ptrs.append(ctx.stream)

    jax.jit(lambda a: buffer_callback(grab, spec)(a))(xs_j).block_until_ready()
    on_xla_stream = ffi._OnStream(ffi._external_stream(ptrs[0], 0), 0)

    def on_xla():
      with on_xla_stream:
        f(xs)

    timed("torch f on XLA's stream, outside a callback, no synchronize", on_xla)
    timed("  x @ w alone, torch's stream", lambda: xs @ w)
    parts: list = []

    def parted(ctx, outs, a):
      with ffi._OnStream(ffi._external_stream(ctx.stream, 0), 0):
        s0 = time.perf_counter()
        t = ffi._buffer_tensor(a)
        s1 = time.perf_counter()
        y = t @ w
        s2 = time.perf_counter()
        z = torch.nn.functional.gelu(y)
        s3 = time.perf_counter()
        ffi._buffer_tensor(outs[0]).copy_(z)  # (outs: the list of result buffers)
        s4 = time.perf_counter()
      parts.append((s1 - s0, s2 - s1, s3 - s2, s4 - s3))

    split = jax.jit(lambda a: buffer_callback(parted, [spec])(a)[0])
    try:
      timed(
        "callback with its parts timed, block_until_ready",
        lambda: split(xs_j).block_until_ready(),
      )
      for i, what in enumerate(("wrap the buffer", "x @ w", "gelu", "copy into XLA's buffer")):
        say(f"  inside: {what:<40} {statistics.median(p[i] for p in parts) * 1e6:9.1f} us")
    except Exception as e:  # noqa: BLE001 - a probe: report and go on
      say(f"the timed callback failed: {type(e).__name__}: {str(e)[:300]}")
  noop = jax.jit(lambda a: a * 2)
  timed(
    "a jitted a * 2 on the same array, block_until_ready", lambda: noop(xs_j).block_until_ready()
  )
  profile("callback gelu(x @ w)", lambda: on_device(xs_j).block_until_ready())

  if want("transfers"):
    say("--- again, at the end (drift)")
    timed("bridge.to_jax(x)", lambda: bridge.to_jax(x))
    timed("transfer.tensor_to_jax(x)", lambda: transfer.tensor_to_jax(x))
    timed(
      "call_jax(x + 1) on (16, 16), synchronize",
      lambda: (bridge.call_jax(_plus_one, small), sync()),
    )
  with open(os.path.join(out_dir, "probe.txt"), "w") as fh:
    fh.write("\n".join(LINES) + "\n")
  with open(os.path.join(out_dir, "profiles.txt"), "w") as fh:
    fh.write("\n".join(PROFILES))
  return 0


def _plus_one(a):
  return a + 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "probe-out"))
