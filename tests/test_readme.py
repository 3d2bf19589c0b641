"""The README's set-up commands, its tour (each snippet alone, in a fresh interpreter) and the
demo stay true."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

from tests.test_docs import run_blocks

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


TOUR = README.split("## 30-second tour")[1].split("\n## ")[0]
SNIPPETS = re.findall(r"```python\n(.*?)```", TOUR, flags=re.S)

# What each snippet must have computed, checked after it ran (keyed by a name it defines).
CHECKS = {
  "rms_norm": """
ref_x, ref_s = x.detach().requires_grad_(), torch.ones(8, requires_grad=True)
(ref_x * torch.rsqrt(ref_x.pow(2).mean(-1, keepdim=True) + 1e-6) * ref_s).pow(2).sum().backward()
torch.testing.assert_close(scale.grad, ref_s.grad)
torch.testing.assert_close(x.grad, ref_x.grad)
""",
  "softplus_sum": """
expected = jax.grad(lambda a: jnp.sum(jax.nn.softplus(a)))(a)
assert float(jnp.max(jnp.abs(g - expected))) < 1e-6
assert set(grads) == {"0.weight", "0.bias", "2.weight", "2.bias"}
torch.testing.assert_close(net[0].weight, torch.from_numpy(np.asarray(params["0.weight"])))
""",
  "swish": """
assert float(jnp.max(jnp.abs(sw - jax.nn.silu(a)))) < 1e-6
expected_dy = jax.grad(lambda a: jnp.sum(jax.nn.silu(a)))(a)
assert float(jnp.max(jnp.abs(dsw - expected_dy))) < 1e-6
rows = jnp.arange(6.0).reshape(2, 3)
assert float(jnp.max(jnp.abs(batched(rows) - jax.nn.softmax(rows, -1)))) < 1e-6
""",
  "fast": """
assert net[0].weight.grad.shape == (32, 8) and bool(net[0].weight.grad.abs().sum() > 0)
x = torch.randn(3, 8)
torch.testing.assert_close(fast(x), net(x))
""",
  "step_model": """
assert all(p.grad is not None for p in model.parameters())
import bridge
assert bridge.compile_stats().programs >= 2  # a forward and a backward program
""",
  "exported": """
x = torch.randn(5, 8)
torch.testing.assert_close(loaded(x), model(x), rtol=1e-5, atol=1e-6)
assert grads["0.weight"].shape == (32, 8)
""",
  "opt.step()\nprint(loss.item(), model[0].weight.device)": """
assert str(model[0].weight.device) == "jax:0" and arr.shape == (32, 8)
assert loss.item() > 0
""",
}


def _check_for(snippet: str) -> str:
  found = [check for key, check in CHECKS.items() if key in snippet]
  assert len(found) == 1, f"no single check for the tour snippet:\n{snippet[:300]}"
  return "import numpy as np, torch, jax, jax.numpy as jnp\n" + found[0]


def test_every_tour_snippet_has_its_check():
  assert len(SNIPPETS) == len(CHECKS)
  for snippet in SNIPPETS:
    _check_for(snippet)


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_tour_snippet_runs_alone_in_a_fresh_interpreter(index):
  snippet = SNIPPETS[index]
  done = run_blocks([snippet, _check_for(snippet)], f"README.md[tour snippet {index}]")
  assert done.returncode == 0, done.stderr[-5000:]


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
