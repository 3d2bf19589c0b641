"""Every notebook in `recipes/` runs top to bottom without error (outputs are not stored)."""

from __future__ import annotations

import json
import pathlib

import pytest

RECIPES = sorted((pathlib.Path(__file__).parent.parent / "recipes").glob("*.ipynb"))


def test_there_are_recipes():
  assert RECIPES


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_runs(path):
  nb = json.loads(path.read_text())
  assert nb["nbformat"] == 4
  namespace: dict = {"__name__": "__main__"}
  for i, cell in enumerate(nb["cells"]):
    if cell["cell_type"] != "code":
      continue
    assert not cell.get("outputs"), f"{path.name}: cell {i} is stored with outputs; clear them"
    source = "".join(cell["source"])
    exec(compile(source, f"{path.name}[cell {i}]", "exec"), namespace)
