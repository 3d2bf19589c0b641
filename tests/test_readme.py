"""The README's set-up commands, its tour and the demo stay true."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def _setup_commands() -> list[str]:
  block = README.split("<!-- setup-commands")[1].split("```bash\n")[1].split("```")[0]
  return [line for line in block.splitlines() if line.strip()]


def test_exactly_two_setup_commands_pinning_torch():
  demo, tests = _setup_commands()
  for cmd in (demo, tests):
    assert "torch==2.13.0" in cmd and "-e ./bridge_ops" in cmd
  assert demo.endswith("python -m bridge")
  assert '".[test]"' in tests and tests.endswith("python -m pytest -n auto")


def test_ci_runs_the_readme_test_command():
  ci = (ROOT / ".ci" / "run").read_text()
  assert "sed -n 2p" in ci and "setup-commands" in ci
  extracted = subprocess.run(
    ["bash", "-c", re.search(r"cmd=\$\((.*)\)\n", ci).group(1)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    check=True,
  ).stdout.strip()
  assert extracted == _setup_commands()[1]


def test_tour_snippets_run_in_order():
  snippets = re.findall(r"```python\n(.*?)```", README, flags=re.S)
  assert len(snippets) >= 2
  namespace: dict = {}
  for i, code in enumerate(snippets):
    exec(compile(code, f"README.md[python block {i}]", "exec"), namespace)
  import jax
  import jax.numpy as jnp
  import torch

  a = namespace["a"]
  expected = jax.grad(lambda a: jnp.sum(jax.nn.softplus(a)))(a)
  assert float(jnp.max(jnp.abs(namespace["g"] - expected))) < 1e-6
  assert isinstance(namespace["scale"].grad, torch.Tensor)
  # callback mode: a custom op only torch knows, forward and gradient
  assert float(jnp.max(jnp.abs(namespace["sw"] - jax.nn.silu(a)))) < 1e-6
  expected_dy = jax.grad(lambda a: jnp.sum(jax.nn.silu(a)))(a)
  assert float(jnp.max(jnp.abs(namespace["dsw"] - expected_dy))) < 1e-6
  rows = jnp.arange(6.0).reshape(2, 3)
  assert float(jnp.max(jnp.abs(namespace["batched"](rows) - jax.nn.softmax(rows, -1)))) < 1e-6


def test_demo_runs_and_checks_both_directions():
  out = subprocess.run(
    [sys.executable, "-m", "bridge"], capture_output=True, text=True, timeout=300, cwd=ROOT
  )
  assert out.returncode == 0, out.stderr[-3000:]
  text = out.stdout
  assert "bridge 0.1.0" in text and "torch 2." in text and "jax 0." in text
  assert "lowering plugin: bridge-ops" in text
  assert "JAX devices:" in text
  assert "1. JAX from torch" in text and "2. torch from JAX" in text
  assert text.rstrip().endswith("all good")
