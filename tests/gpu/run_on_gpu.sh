#!/usr/bin/env bash
# The whole GPU check, in one run on a machine with a CUDA GPU, torch and JAX for CUDA already
# installed and no package registry (tests/gpu/README.md). From the repository root:
#
#     tests/gpu/run_on_gpu.sh            # logs and figures under $OUT (default: ./gpu-out)
#
# Installs the project without touching torch or JAX, prints the versions and the GPU, runs
# `pytest -m gpu` (tests/gpu), the figures of tests/gpu/measure.py and the CUDA rows of
# `python -m benchmarks --workloads gpu`, each under its own time limit so that the whole run
# stays under 8 minutes. On a CPU machine it runs the same steps: the tests skip and the
# benchmark says why.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export OMP_WAIT_POLICY=PASSIVE
export BRIDGE_TEST_XLA_DEFAULTS=1  # XLA's own flags: the suite's CPU flag is not for this XLA
PYTEST_ARGS=${GPU_PYTEST_ARGS:--x}
T0=$(date +%s)
elapsed() { echo "[run_on_gpu] $1 after $(( $(date +%s) - T0 )) s"; }

# 1. install: editable, no dependencies, no build isolation (no registry), with the pip of the
#    python that runs everything (a bare `pip` may belong to another environment); the source
#    trees go first on PYTHONPATH (the folder ./bridge_ops would otherwise shadow the plugin
#    package as a namespace package); if the plugin's entry point is still not visible, it is
#    written by hand
python -m pip install --no-deps --no-build-isolation -e . -e ./bridge_ops > "$OUT/install.log" 2>&1 \
  || echo "[run_on_gpu] pip install failed (see install.log)"
export PYTHONPATH="$PWD:$PWD/bridge_ops/src${PYTHONPATH:+:$PYTHONPATH}"
ENTRY_CHECK='from importlib import metadata; assert any(e.name == "aten" for e in metadata.entry_points(group="bridge.lowerings"))'
if ! python -c "$ENTRY_CHECK" 2>/dev/null; then
  echo "[run_on_gpu] the plugin's entry point is not visible; writing it by hand"
  META=$(mktemp -d)
  mkdir -p "$META/bridge_ops-0.0.2.dist-info"
  printf 'Metadata-Version: 2.1\nName: bridge-ops\nVersion: 0.0.2\n' > "$META/bridge_ops-0.0.2.dist-info/METADATA"
  printf '[bridge.lowerings]\naten = bridge_ops.plugin\n' > "$META/bridge_ops-0.0.2.dist-info/entry_points.txt"
  export PYTHONPATH="$PYTHONPATH:$META"
fi
elapsed "installed"

# 2. versions and the GPU
python - > "$OUT/versions.txt" 2>&1 <<'PY'
import platform, torch, jax, jaxlib
print("python", platform.python_version())
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
print("jax", jax.__version__, "jaxlib", jaxlib.__version__, "devices", jax.devices())
import bridge, bridge_ops
from bridge._src import ffi
print("bridge", bridge.__version__, bridge.__file__, "bridge_ops", bridge_ops.__version__, bridge_ops.__file__)
from bridge._src import registry
print("host calls route", ffi.route(), "| torch accelerator", torch.accelerator.current_accelerator())
PY
cat "$OUT/versions.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/nvidia-smi.txt" 2>&1 || true
elapsed "versions"

# 3. the GPU tests (PYTEST_S=0 skips them); PROBE_S=N first runs tests/gpu/probe.py (where a
#    GPU call's fixed cost goes) for at most N seconds
if [ "${PROBE_S:-0}" != 0 ]; then
  timeout "$PROBE_S" python tests/gpu/probe.py "$OUT" > "$OUT/probe.log" 2>&1
  echo "[run_on_gpu] probe rc=$?"
  tail -n 5 "$OUT/probe.log"
  elapsed "probe"
fi
[ "${PYTEST_S:-240}" = 0 ] || {
timeout "${PYTEST_S:-240}" python -m pytest tests/gpu -m gpu $PYTEST_ARGS -v -p no:cacheprovider \
  -o addopts="" -rfEs --timeout 150 > "$OUT/pytest.log" 2>&1
echo "[run_on_gpu] pytest rc=$?"
# the outcome of each test, then the failures' summary and the last lines
echo "[run_on_gpu] $(grep -cE '^tests/gpu/.* PASSED' "$OUT/pytest.log") tests passed; the others:"
grep -E "^tests/gpu/.* (FAILED|ERROR|SKIPPED|XFAIL|XPASS)" "$OUT/pytest.log" | head -n 30
tail -n 25 "$OUT/pytest.log"
elapsed "tests"
}

# 4. the figures benchmarks/ has no rows for (MEASURE_S=0 skips them)
if [ "${MEASURE_S:-90}" != 0 ]; then
  timeout "${MEASURE_S:-90}" python tests/gpu/measure.py "$OUT/gpu_figures.md" > "$OUT/measure.log" 2>&1
  echo "[run_on_gpu] measure rc=$?"
  tail -n 25 "$OUT/measure.log"
  elapsed "figures"
fi

# 5. the CUDA rows of the benchmarks (the peers are not installed here: their rows say so;
#    BENCH_S=0 skips them)
if [ "${BENCH_S:-150}" != 0 ]; then
  timeout "${BENCH_S:-150}" python -m benchmarks --workloads gpu --quick \
    --only "${BENCH_SYSTEMS:-bridge,dlpack_manual,plain_jax,torch_eager,torch_compile}" \
    --out "$OUT/bench" > "$OUT/bench.log" 2>&1
  echo "[run_on_gpu] benchmarks rc=$?"
  tail -n 15 "$OUT/bench.log"
  [ -f "$OUT/bench/RESULTS.md" ] && sed -n '/## CUDA GPU/,/^## [^C]/p' "$OUT/bench/RESULTS.md" | head -n 40
fi
elapsed "done"

# 6. what comes back: the device tool returns a few files only, so everything but the test log
#    and the figures goes into one archive (PACK=0 keeps the files as they are)
if [ "${PACK:-1}" = 1 ]; then
  PACKED=$(mktemp -d)
  (cd "$OUT" && tar -czf "$PACKED/gpu-out.tgz" --exclude=pytest.log --exclude=gpu_figures.md \
    --exclude=probe.txt . \
    && find . -mindepth 1 ! -name pytest.log ! -name gpu_figures.md ! -name probe.txt -delete \
    && mv "$PACKED/gpu-out.tgz" .)
  ls "$OUT"
fi
