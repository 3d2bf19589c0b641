"""The code checks that run with the tests: ruff's lint and format check and the type checker
(mypy), configured in pyproject.toml, on a clean checkout."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _run(*cmd: str) -> subprocess.CompletedProcess:
  """`cmd` in the repository's root (where pyproject.toml configures the tools). The test
  extras install both tools: a missing one fails here ("No module named ..."), not skips."""
  return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_lint_is_clean():
  done = _run(
    sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."
  )
  assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_clean():
  done = _run(sys.executable, "-m", "ruff", "format", "--no-cache", "--check", ".")
  assert done.returncode == 0, done.stdout + done.stderr + "\n(`ruff format .` formats them)"


@pytest.mark.slow
def test_mypy_is_clean():
  done = _run(sys.executable, "-m", "mypy", "--no-incremental")
  assert done.returncode == 0, done.stdout + done.stderr
