"""MkDocs hooks of the documentation site (`mkdocs.yml` names this file).

Pages made at build time from files kept elsewhere, so that they cannot drift apart: the
recipes (rendered from `recipes/*.ipynb`, which the test suite executes), `ARCHITECTURE.md`,
the benchmark tables with their plots and the op coverage table. And the strict build's check that the API
reference is complete: every public name of `bridge` is on `api.md` and has a docstring, as
has every public method and property of a public class.
"""

from __future__ import annotations

import ast
import inspect
import json
import pathlib
import re
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = pathlib.Path(__file__).resolve().parent.parent

# (generated page, file it comes from)
_COPIED = {
  "architecture.md": "ARCHITECTURE.md",
  "results.md": "benchmarks/RESULTS.md",
  "coverage.md": "bridge_ops/COVERAGE.md",
}


def on_config(config: Any) -> Any:
  """The recipes' pages join the navigation under "Recipes", in file order."""
  for entry in config["nav"]:
    if isinstance(entry, dict) and "Recipes" in entry:
      pages = [f"recipes/{p.stem}.md" for p in sorted((ROOT / "recipes").glob("*.ipynb"))]
      entry["Recipes"] = ["recipes/index.md", *pages]
  return config


def on_files(files: Files, config: Any) -> Files:
  for page, source in _COPIED.items():
    text = (ROOT / source).read_text()
    files.append(File.generated(config, page, content=_unlink(text)))
  for plot in sorted((ROOT / "benchmarks" / "plots").glob("*.png")):
    files.append(File.generated(config, f"plots/{plot.name}", abs_src_path=str(plot)))
  recipes = sorted((ROOT / "recipes").glob("*.ipynb"))
  listing = ["# Recipes", "", "Notebooks in `recipes/`, each executed by the test suite:", ""]
  for path in recipes:
    title, markdown = _render_notebook(path)
    files.append(File.generated(config, f"recipes/{path.stem}.md", content=markdown))
    listing.append(f"- [{title}]({path.stem}.md) (`recipes/{path.name}`)")
  files.append(File.generated(config, "recipes/index.md", content="\n".join(listing) + "\n"))
  return files


def on_nav(nav: Any, config: Any, files: Files) -> Any:
  _check_api_reference(files)
  return nav


def _unlink(text: str) -> str:
  """Relative links of a repository file point outside the site: keep their text only."""
  text = re.sub(r"!\[[^\]]*\]\((?!https?:)[^)]*\)", "", text)  # (plots live in benchmarks/)
  return re.sub(r"\[([^\]]+)\]\((?!https?:|#)[^)]*\)", r"\1", text)


def _render_notebook(path: pathlib.Path) -> tuple[str, str]:
  """A notebook as a page: its markdown cells as they are, its code cells as Python blocks."""
  cells = json.loads(path.read_text())["cells"]
  parts = []
  for cell in cells:
    source = "".join(cell["source"]).rstrip()
    if not source:
      continue
    if cell["cell_type"] == "markdown":
      parts.append(_unlink(source))
    elif cell["cell_type"] == "code":
      parts.append(f"```python\n{source}\n```")
  text = "\n\n".join(parts) + "\n"
  heading = re.search(r"^# (.+)$", text, flags=re.M)
  title = heading.group(1).strip() if heading else path.stem.replace("_", " ")
  if not heading:
    text = f"# {title}\n\n{text}"
  note = f"*Rendered from `recipes/{path.name}`; the test suite runs it.*\n\n"
  first_break = text.index("\n") + 1
  return title, text[:first_break] + "\n" + note + text[first_break:]


def _public_names() -> list[str]:
  tree = ast.parse((ROOT / "bridge" / "__init__.py").read_text())
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(
      isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
    ):
      return [n for n in ast.literal_eval(node.value) if not n.startswith("__")]
  raise PluginError("bridge/__init__.py has no __all__")


def _check_api_reference(files: Files) -> None:
  api = files.get_file_from_path("api.md")
  if api is None:
    raise PluginError("docs/api.md is missing")
  documented = set(re.findall(r"^::: bridge\.(\w+)", api.content_string, flags=re.M))
  names = _public_names()
  missing = [n for n in names if n not in documented]
  if missing:
    raise PluginError(f"docs/api.md does not document the public names {missing}")
  import bridge  # (the objects themselves, for their docstrings)

  undocumented = []
  for name in names:
    obj = getattr(bridge, name)
    if not inspect.getdoc(obj):
      undocumented.append(f"bridge.{name}")
    if inspect.isclass(obj) and not issubclass(obj, BaseException):
      for attr, member in vars(obj).items():
        if attr.startswith("_") and attr != "__call__":
          continue
        target = member.fget if isinstance(member, property) else member
        if isinstance(target, (staticmethod, classmethod)):
          target = target.__func__
        if callable(target) and not (target.__doc__ or "").strip():
          undocumented.append(f"bridge.{name}.{attr}")
  if undocumented:
    raise PluginError(f"public names without a docstring: {undocumented}")
