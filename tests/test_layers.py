"""The core's import graph, read from the source (`ast`): no cycle among module-level imports,
and the imports written inside functions (which hide a cycle from Python) only shrink.

`LAZY` is the debt, edge by edge: a new in-function import of a `bridge` module fails here
(import it at the top, or move the code it needs below it), and so does an entry that is no
longer in the code (delete it from the list, so that the list only gets shorter).
"""

from __future__ import annotations

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parent.parent / "bridge" / "_src"

# (importer, imported) pairs still imported inside a function
LAZY = frozenset({
    ("dispatch", "mutation"), ("dispatch", "special_ops"),
})


def _imports() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[int]]]:
  """Module-level imports {module: imported modules}, and the in-function ones by edge."""
  modules = {p.stem for p in SRC.glob("*.py")} - {"__init__"}
  top: dict[str, set[str]] = {m: set() for m in modules}
  nested: dict[tuple[str, str], list[int]] = {}
  for name in modules:
    tree = ast.parse((SRC / f"{name}.py").read_text())
    at_top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.module:
        if node.module == "bridge._src":
          targets = [a.name for a in node.names]
        elif node.module.startswith("bridge._src."):
          targets = [node.module.split(".")[2]]
        else:
          continue
      elif isinstance(node, ast.Import):
        targets = [a.name.split(".")[2] for a in node.names if a.name.startswith("bridge._src.")]
      else:
        continue
      for target in (t for t in targets if t in modules):
        if id(node) in at_top:
          top[name].add(target)
        else:
          nested.setdefault((name, target), []).append(node.lineno)
  return top, nested


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle of `graph` as a path, or None."""
  state: dict[str, int] = {}
  path: list[str] = []

  def visit(v: str) -> list[str] | None:
    state[v] = 1
    path.append(v)
    for w in sorted(graph[v]):
      if state.get(w) == 1:
        return path[path.index(w):] + [w]
      if w not in state:
        found = visit(w)
        if found:
          return found
    state[v] = 2
    path.pop()
    return None

  for v in sorted(graph):
    if v not in state:
      found = visit(v)
      if found:
        return found
  return None


def test_module_level_imports_have_no_cycle():
  top, _ = _imports()
  cycle = _cycle(top)
  assert cycle is None, "module-level import cycle: " + " -> ".join(cycle)


def test_imports_inside_functions_only_shrink():
  _, nested = _imports()
  new = {edge: lines for edge, lines in nested.items() if edge not in LAZY}
  assert not new, ("a `bridge` module imported inside a function (import it at the top, or "
                   "move what it needs into a lower module): " + ", ".join(
                       f"{a}.py:{lines} imports {b}" for (a, b), lines in sorted(new.items())))
  gone = sorted(LAZY - set(nested))
  assert not gone, f"no longer imported inside a function: delete {gone} from LAZY"


def test_the_checks_can_fail():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set()}) is None
