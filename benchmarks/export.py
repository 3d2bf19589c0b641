"""`bridge.export` figures (issue 27): export time and artifact size of the GPT-2 config of the
module rows, a loaded artifact's call against `bridge.compile` of the same module (one
interleaved run), and the cold start of a fresh process that loads and runs the artifact
without torch against one that imports torch and bridge.

    python -m benchmarks.export [--quick]

Prints one table; nothing is written to RESULTS.md (these rows have no peer to compare with).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # (before torch: see benchmarks/README.md)

_WITHOUT_TORCH = """
import sys, time
start = time.perf_counter()
sys.modules["torch"] = None
import json, jax, numpy as np
from safetensors.numpy import load_file
path = {path!r}
manifest = json.load(open(f"{{path}}/manifest.json"))
program = jax.export.deserialize(bytearray(open(f"{{path}}/program.jaxexport", "rb").read()))
arrays = load_file(f"{{path}}/weights.safetensors")
weights = [arrays[w["name"]] for w in manifest["weights"]]
with jax.enable_x64(True):
    out = program.call(*weights, np.zeros((1, 64), np.int64))
    np.asarray(out[0])
print(time.perf_counter() - start)
"""

_WITH_TORCH = """
import time
start = time.perf_counter()
import numpy as np, torch, bridge
out = bridge.load({path!r})(torch.zeros((1, 64), dtype=torch.int64))
print(time.perf_counter() - start)
"""


def _fresh(code: str) -> float:
  """Wall time of a fresh interpreter running `code`, interpreter start included."""
  start = time.perf_counter()
  subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
  return time.perf_counter() - start


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="fewer rounds")
  quick = parser.parse_args().quick

  import jax
  import torch

  import bridge

  from . import models

  module, x = models.gpt2(64)
  model = module.model if hasattr(module, "model") else module
  start = time.perf_counter()
  exported = bridge.export(model, x)
  export_s = time.perf_counter() - start
  path = os.path.join(tempfile.mkdtemp(), "gpt2")
  exported.save(path)
  sizes = {name: os.path.getsize(os.path.join(path, name)) for name in sorted(os.listdir(path))}
  loaded = bridge.load(path)

  compiled = bridge.compile(model)
  with torch.no_grad():
    ref = model(x).logits
    torch.testing.assert_close(loaded(x)["logits"], ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(compiled(x).logits, ref, rtol=1e-4, atol=1e-4)
    compiled.wait_optimized()
    with jax.enable_x64(True):  # (int64 ids stay int64)
      xj = jax.numpy.asarray(x.numpy())
    apply = jax.jit(loaded.apply)
    calls = {
      "loaded artifact, torch tensors": lambda: loaded(x)["logits"],
      "loaded artifact, jax.jit(apply), JAX arrays": lambda: apply(loaded.weights, xj)[
        "logits"
      ].block_until_ready(),
      "bridge.compile, torch tensors": lambda: compiled(x).logits,
    }
    for fn in calls.values():
      for _ in range(3):
        fn()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(5 if quick else 20):  # interleaved blocks
      for name, fn in calls.items():
        start = time.perf_counter()
        for _ in range(5):
          fn()
        samples[name].append((time.perf_counter() - start) / 5 * 1e6)

  cold: dict[str, list[float]] = {"without torch": [], "torch + bridge": []}
  for _ in range(2 if quick else 5):  # alternating fresh processes
    cold["without torch"].append(_fresh(textwrap.dedent(_WITHOUT_TORCH.format(path=path))))
    cold["torch + bridge"].append(_fresh(textwrap.dedent(_WITH_TORCH.format(path=path))))

  print(f"GPT-2 config {models.HF_GPT2}, input (1, 64) int64")
  print(
    f"export: {export_s:.2f} s; artifact: " + ", ".join(f"{k} {v:,} B" for k, v in sizes.items())
  )
  base = statistics.median(samples["bridge.compile, torch tensors"])
  for name, values in samples.items():
    m = statistics.median(values)
    print(f"{name:46s} median {m:9.0f} us  min {min(values):9.0f}  ratio {m / base:.2f}")
  for name, values in cold.items():
    print(f"cold start, {name:15s} median {statistics.median(values):.2f} s  ({values})")
  ratio = statistics.median(cold["without torch"]) / statistics.median(cold["torch + bridge"])
  print(f"cold start ratio (without torch / torch + bridge): {ratio:.2f}")


if __name__ == "__main__":
  main()
