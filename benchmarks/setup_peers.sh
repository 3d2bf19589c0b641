#!/usr/bin/env bash
# Create the peers venv (.venvs/peers) and install the peer libraries into it.
#
# The venv sees the system site-packages (torch, jax, the editable `bridge`),
# and every package is installed with --no-deps so that pip never replaces the
# system torch. Safe to run repeatedly.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venvs/peers"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "creating $VENV"
  "$PY" -m venv --system-site-packages "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

# Peers under test, plus what they import but do not (all) declare:
# torch-jax-interop imports chex; chex needs absl-py and toolz (numpy, jax,
# jaxlib and typing_extensions come from the system site-packages).
# wrap-torch2jax (torch called from JAX) builds a C++ extension into
# ~/.cache/torch2jax on first use (~40 s; the benchmark does it before timing).
PACKAGES=(
  torchax==0.0.13
  torch-jax-interop==0.0.8
  jax2torch==0.0.7
  wrap-torch2jax==0.9.0
  chex==0.1.92
  absl-py==2.5.1
  toolz==1.2.0
)
SYSTEM_TORCH="$("$PY" -c 'import torch; print(torch.__version__)')"
"${PIP[@]}" install --no-deps "${PACKAGES[@]}"

# Sanity: the venv must still use the system torch, and every peer must import
# (torchax needs the import shim in benchmarks/systems/torchax.py, so only its
# presence is checked here).
VENV_TORCH="$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
if [ "$VENV_TORCH" != "$SYSTEM_TORCH" ]; then
  echo "error: peers venv torch is $VENV_TORCH, system torch is $SYSTEM_TORCH" >&2
  exit 1
fi
"$VENV/bin/python" -c 'import chex, torch_jax_interop, jax2torch, wrap_torch2jax, importlib.util as u; assert u.find_spec("torchax")'
echo "peers venv ok: $VENV (torch $VENV_TORCH)"
