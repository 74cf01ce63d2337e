"""The direction of imports (DESIGN.md, "Layout"): no circle among the modules of attention_jax,
experiments, scripts, configs and examples, the library imports none of the others, and no test
imports another test.

The graph is read from the source with ast, so it includes the imports inside functions (a
circle closed only when a function runs is still a circle) and needs nothing installed.
"""

import ast
import os

import pytest
from scipy import sparse
from scipy.sparse import csgraph

pytestmark = pytest.mark.quick

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PACKAGES = ("attention_jax", "experiments", "scripts", "configs", "examples")


def modules(root: str = ROOT) -> dict[str, str]:
  """{dotted module name: path} of every Python file under PACKAGES."""
  found = {}
  for package in PACKAGES:
    for folder, _, files in os.walk(os.path.join(root, package)):
      for name in files:
        if name.endswith(".py"):
          path = os.path.join(folder, name)
          dotted = os.path.relpath(path, root)[:-len(".py")].replace(os.sep, ".")
          found[dotted.removesuffix(".__init__")] = path
  return found


def imported(tree: ast.AST, module: str, known) -> set[str]:
  """The modules of ``known`` that ``tree`` (the source of ``module``) imports, anywhere in it:
  ``from a import b`` names a.b when that is a module, else a."""
  package = module if module in PACKAGES else module.rpartition(".")[0]
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative: from the package, one level up per dot past the first
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                        + ([base] if base else []))
      names.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                   for alias in node.names)
  return {name for name in names if name in known and name != module}


def graph(root: str = ROOT) -> dict[str, set[str]]:
  """{module: the modules it imports} over PACKAGES."""
  known = modules(root)
  edges = {}
  for module, path in known.items():
    with open(path) as f:
      edges[module] = imported(ast.parse(f.read(), path), module, known)
  return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (each a circle of imports)."""
  names = sorted(edges)
  index = {name: i for i, name in enumerate(names)}
  pairs = [(index[a], index[b]) for a in names for b in edges[a]]
  adjacency = sparse.coo_matrix(([1] * len(pairs), ([a for a, _ in pairs], [b for _, b in pairs])),
                                shape=(len(names), len(names)))
  count, labels = csgraph.connected_components(adjacency, directed=True, connection="strong")
  groups = [[name for name in names if labels[index[name]] == label] for label in range(count)]
  return [group for group in groups if len(group) > 1]


def test_no_module_imports_itself_round_a_circle():
  assert circles(graph()) == []


def test_the_library_imports_none_of_the_others():
  outward = {module: sorted(other for other in imports if not other.startswith("attention_jax"))
             for module, imports in graph().items() if module.startswith("attention_jax")}
  assert {module: others for module, others in outward.items() if others} == {}


def test_the_scan_sees_a_circle_closed_inside_a_function(tmp_path):
  for package in PACKAGES:
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
  (tmp_path / "experiments" / "a.py").write_text("from experiments import b\n")
  (tmp_path / "experiments" / "b.py").write_text("def main():\n  from . import a\n")
  (tmp_path / "attention_jax" / "c.py").write_text("import scripts\n")
  edges = graph(str(tmp_path))
  assert circles(edges) == [["experiments.a", "experiments.b"]]
  assert edges["attention_jax.c"] == {"scripts"}


def test_no_test_imports_another_test_module():
  """DESIGN.md: what tests share lives in conftest.py or a helpers module."""
  tests = os.path.join(ROOT, "tests")
  found = {}
  for name in sorted(os.listdir(tests)):
    if name.endswith(".py"):
      with open(os.path.join(tests, name)) as f:
        tree = ast.parse(f.read(), name)
      found[name] = sorted(
          {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
           for alias in node.names if alias.name.split(".")[-1].startswith("test_")}
          | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and (node.module or "").split(".")[-1].startswith("test_")})
  assert {name: modules for name, modules in found.items() if modules} == {}
