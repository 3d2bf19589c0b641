"""The core's import graph, read from the source (`ast`): no cycle among module-level imports,
and no `bridge` module imported inside a function (which would hide a cycle from Python).
"""

from __future__ import annotations

import ast
import pathlib
import re

SRC = pathlib.Path(__file__).resolve().parent.parent / "bridge" / "_src"

# The layers, bottom first (ARCHITECTURE.md says what each holds). A module imports, at the
# top of its file, only from its own layer or a layer below.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
  (
    "foundations",
    frozenset({"errors", "tree", "strided", "config", "dtypes", "placement", "plugins"}),
  ),
  (
    "arrays, tensors and host calls",
    frozenset({"tensor", "transfer", "ffi", "registry", "devices", "compat"}),
  ),
  (
    "torch code inside JAX",
    frozenset(
      {"scope", "narrowing", "rng", "arrays", "functions", "tracing", "module_state", "callback"}
    ),
  ),
  (
    "dispatch",
    frozenset(
      {
        "dispatch",
        "dispatch.schema",
        "dispatch.fallback",
        "dispatch.tensors",
        "dispatch.meta",
        "dispatch.checks",
        "dispatch.resolve",
        "dispatch.executable",
        "dispatch.folding",
        "dispatch.functional",
        "dispatch.views",
        "dispatch.mutation",
        "dispatch.special",
        "dispatch.higher_order",
        "dispatch.plans",
      }
    ),
  ),
  ("front doors", frozenset({"vjp", "call_jax", "call_torch", "modules", "compile", "views"})),
  (
    "device backend and tools",
    frozenset({"autocast", "device", "sharding", "loader", "demo", "dynamo", "export"}),
  ),
)


def _modules() -> dict[str, pathlib.Path]:
  """Every module of `bridge/_src` by dotted name below it ("tensor", "dispatch.plans"); a
  package by its own name ("dispatch")."""
  found = {}
  for path in SRC.rglob("*.py"):
    parts = path.relative_to(SRC).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    if parts:
      found[".".join(parts)] = path
  return found


def _targets(node: ast.AST, modules: dict[str, pathlib.Path]) -> list[str]:
  """The `bridge` modules an import statement reaches ("bridge" for the package itself)."""
  if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
    if node.module == "bridge" or node.module.startswith("bridge."):
      base = node.module.split(".")[2:] if node.module.startswith("bridge._src") else None
      if base is None:
        return ["bridge"]
      out = []
      for alias in node.names:  # `from bridge._src.dispatch import plans` names a module
        name = ".".join([*base, alias.name])
        out.append(name if name in modules else ".".join(base))
      return [t for t in out if t]
  if isinstance(node, ast.Import):
    out = []
    for alias in node.names:
      if alias.name.startswith("bridge._src."):
        out.append(".".join(alias.name.split(".")[2:]))
      elif alias.name == "bridge" or alias.name.startswith("bridge."):
        out.append("bridge")
    return out
  return []


def _imports() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[int]]]:
  """Module-level imports {module: imported modules}, and the in-function ones by edge."""
  modules = _modules()
  top: dict[str, set[str]] = {m: set() for m in modules}
  nested: dict[tuple[str, str], list[int]] = {}
  for name, path in modules.items():
    tree = ast.parse(path.read_text())
    at_top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
      for target in _targets(node, modules):
        if id(node) in at_top:
          if target in modules and target != name:
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
        return path[path.index(w) :] + [w]
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


def test_no_bridge_module_is_imported_inside_a_function():
  _, nested = _imports()
  assert not nested, (
    "a `bridge` module imported inside a function (import it at the top, or "
    "move what it needs into a lower module): "
    + ", ".join(f"{a}.py:{lines} imports {b}" for (a, b), lines in sorted(nested.items()))
  )


def _layer_of() -> dict[str, int]:
  return {m: i for i, (_, members) in enumerate(LAYERS) for m in members}


def test_every_module_has_a_layer():
  modules = set(_modules())
  layer = _layer_of()
  assert not modules - set(layer), (
    f"modules in no layer (add them to LAYERS and ARCHITECTURE.md): {sorted(modules - set(layer))}"
  )
  assert not set(layer) - modules, (
    f"LAYERS names modules that do not exist: {sorted(set(layer) - modules)}"
  )


def _upward(top: dict[str, set[str]], layer: dict[str, int]) -> list[str]:
  return [
    f"{a} ({LAYERS[layer[a]][0]}) imports {b} ({LAYERS[layer[b]][0]})"
    for a in sorted(top)
    for b in sorted(top[a])
    if a in layer and b in layer and layer[b] > layer[a]
  ]


def test_no_module_imports_from_a_layer_above():
  top, _ = _imports()
  upward = _upward(top, _layer_of())
  assert not upward, "upward imports: " + "; ".join(upward)


def test_the_checks_can_fail():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set()}) is None
  assert _upward({"errors": {"device"}, "device": set()}, _layer_of()) == [
    "errors (foundations) imports device (device backend and tools)"
  ]


def _architecture_rows() -> dict[str, int]:
  """ARCHITECTURE.md's module tables: module name as written -> the lines it states."""
  text = (SRC.parent.parent / "ARCHITECTURE.md").read_text()
  return {m: int(n) for m, n in re.findall(r"\| `([a-z_/0-9]+)` \| (\d+) \|", text)}


def _close(stated: int, actual: int) -> bool:
  return abs(stated - actual) <= max(25, actual // 10)


def test_architecture_names_every_module_with_its_size():
  """ARCHITECTURE.md stays true: one row per module of the core and of the plugin, its line
  count within 10% (or 25 lines) of `wc -l`."""
  rows = _architecture_rows()
  plugin = SRC.parent.parent / "bridge_ops" / "src" / "bridge_ops"
  files = {
    (name.replace(".", "/") + ("/__init__" if path.name == "__init__.py" else "")): path
    for name, path in _modules().items()
  }
  files.update({p.relative_to(plugin).with_suffix("").as_posix(): p for p in plugin.rglob("*.py")})
  missing = sorted(set(files) - set(rows))
  assert not missing, f"modules with no row in ARCHITECTURE.md: {missing}"
  stale = [
    f"{name}: {rows[name]} stated, {n} now"
    for name, path in sorted(files.items())
    if not _close(rows[name], n := len(path.read_text().splitlines()))
  ]
  assert not stale, f"ARCHITECTURE.md's line counts are out of date: {stale}"
  unknown = sorted(set(rows) - set(files))
  assert not unknown, f"ARCHITECTURE.md rows for modules that do not exist: {unknown}"
