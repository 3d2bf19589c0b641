"""The code checks that run with the tests: ruff's lint and format check and the type checker
(mypy), configured in pyproject.toml, on a clean checkout."""

from __future__ import annotations

import ast
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


def _message_start(node: ast.expr) -> str | None:
  """The literal text a message starts with; None when an f-string starts with a value (the
  user's function's name, a speaker); "" when the message is no literal at all (a variable),
  which this check cannot read and so reports."""
  while isinstance(node, ast.BinOp):  # "..." + "..."
    node = node.left
  if isinstance(node, ast.Constant) and isinstance(node.value, str):
    return node.value
  if isinstance(node, ast.JoinedStr) and node.values:
    first = node.values[0]
    return first.value if isinstance(first, ast.Constant) else None
  return ""


def test_bridge_errors_share_one_message_style():
  """Each bridge error message starts with who speaks (errors.py's docstring): the user's
  call in backticks, torch.compile's backend, a name, or "bridge: "."""
  import bridge._src.errors as errors_lib

  bridge_errors = {
    name
    for name, value in vars(errors_lib).items()
    if isinstance(value, type) and issubclass(value, errors_lib.BridgeError)
  }
  odd = []
  for path in sorted((ROOT / "bridge").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args):
        continue
      func = node.exc.func
      name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
      if name not in bridge_errors:
        continue
      start = _message_start(node.exc.args[0])
      if start is None or start.startswith(("`", "bridge: ", "torch.compile(backend=")):
        continue
      odd.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}({start[:40]!r}...)")
  assert not odd, "messages that do not say who speaks:\n" + "\n".join(odd)
