"""The documentation site builds offline in strict mode, and its examples run.

The strict build fails on a broken link or reference, on a docstring that disagrees with its
signature, and (through `docs/hooks.py`) on a public name missing from the API reference or
without a docstring. Each page's Python blocks run in order in a fresh interpreter, as a reader
would paste them; a block after a `<!-- no-run: why -->` line is shown, not run.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(p.name for p in DOCS.glob("*.md"))


def python_blocks(text: str) -> list[str]:
  """The ```python blocks of a markdown text that are meant to run, in order."""
  blocks = []
  for m in re.finditer(r"(<!-- no-run[^>]*-->\s*\n)?```python\n(.*?)```", text, flags=re.S):
    if not m.group(1):
      blocks.append(m.group(2))
  return blocks


def run_blocks(blocks: list[str], name: str, timeout: int = 600) -> subprocess.CompletedProcess:
  """Runs `blocks` in order in one fresh interpreter, each compiled under its own name."""
  script = (
    "import sys\n"
    "blocks = sys.argv[1:]\n"
    "namespace = {'__name__': '__main__'}\n"
    "for i, code in enumerate(blocks):\n"
    f"  exec(compile(code, f'{name}[python block {{i}}]', 'exec'), namespace)\n"
  )
  env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE")
  return subprocess.run(
    [sys.executable, "-c", script, *blocks],
    capture_output=True,
    text=True,
    timeout=timeout,
    cwd=ROOT,
    env=env,
  )


def test_site_builds_offline_in_strict_mode(tmp_path):
  done = subprocess.run(
    [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
    capture_output=True,
    text=True,
    timeout=600,
    cwd=ROOT,
  )
  assert done.returncode == 0, done.stderr[-5000:]
  site = tmp_path / "site"
  api = (site / "api" / "index.html").read_text()
  for name in ("bridge.call_jax", "bridge.export", "bridge.BridgeError"):
    assert f'id="{name}"' in api, name
  assert (site / "recipes" / "quickstart" / "index.html").exists()
  assert "Layers" in (site / "architecture" / "index.html").read_text()


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks((DOCS / p).read_text())])
def test_page_examples_run(page):
  done = run_blocks(python_blocks((DOCS / page).read_text()), f"docs/{page}")
  assert done.returncode == 0, done.stderr[-5000:]
