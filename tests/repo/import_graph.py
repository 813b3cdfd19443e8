"""The import graph of a source tree, read with ``ast``, and the rules of ``ARCHITECTURE.md`` on it.

Nothing is imported: every ``import`` / ``from ... import`` in a module -- at the top or deferred
inside a function, both are dependencies -- becomes an edge, and so does a string literal naming
one of the tree's modules in a module that calls ``import_module`` (the lazy names of ``rla``'s
``__init__``, the CLI's subcommand table, the engine registry). The checkers take a
:class:`Tree`, so a test can feed them a synthetic one with planted violations
(``tests/repo/test_imports.py``).

- :func:`cycle`: a circle among the tree's modules (an edge to a package is an edge to its
  ``__init__``; the implicit import of a module's own parent packages is not an edge);
- :func:`upward`: an import of a module on a higher floor than the importer's;
- :func:`lab_imports`: an import of the ``lab`` tree (the library never imports it);
- :func:`private_imports`: a private module (a name part starting with ``_``) imported from outside
  its own package, or a private name imported from a module of another package.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Tree:
    """``modules``: dotted name -> file; ``graph``: module -> [(imported module, imported name or
    None, line)] for the tree's own modules; ``foreign``: module -> [(imported top-level name, line)]
    for everything else it imports."""

    root: Path
    modules: dict[str, Path]
    graph: dict[str, list[tuple[str, str | None, int]]]
    foreign: dict[str, list[tuple[str, int]]]

    def where(self, module: str, line: int) -> str:
        return f"{self.modules[module].relative_to(self.root)}:{line}"

    def package(self, module: str) -> str:
        """The package a module lives in (a package's ``__init__`` lives in the package itself)."""
        return module if self.modules[module].name == "__init__.py" else module.rsplit(".", 1)[0]


def _module_names(root: Path, package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_docstring(node: ast.AST, parents: dict) -> bool:
    parent = parents.get(node)
    return isinstance(parent, ast.Expr) and isinstance(parents.get(parent), (ast.Module, ast.FunctionDef, ast.ClassDef))


def scan(root: Path, package: str) -> Tree:
    """The import graph of ``root / package`` (``root`` is the folder on ``sys.path``)."""
    modules = _module_names(root, package)
    tree = Tree(root, modules, {}, {})
    for module, path in modules.items():
        syntax = ast.parse(path.read_text(), filename=str(path))
        edges, foreign = [], []
        for node in ast.walk(syntax):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        edges.append((alias.name, None, node.lineno))
                    elif alias.name.split(".")[0] != package:
                        foreign.append((alias.name.split(".")[0], node.lineno))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import: resolve against the importer's package
                    pkg = tree.package(module).split(".")
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
                if base not in modules:
                    if base.split(".")[0] != package:
                        foreign.append((base.split(".")[0], node.lineno))
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    edges.append((sub, None, node.lineno) if sub in modules else (base, alias.name, node.lineno))
        if "import_module" in path.read_text():
            parents = {child: node for node in ast.walk(syntax) for child in ast.iter_child_nodes(node)}
            for node in ast.walk(syntax):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and not _is_docstring(node, parents):
                    if node.value in modules and node.value != module:
                        edges.append((node.value, None, node.lineno))
                    elif node.value.split(".")[0] == "lab":
                        foreign.append(("lab", node.lineno))
        tree.graph[module], tree.foreign[module] = edges, foreign
    return tree


def edges(tree: Tree) -> dict[str, set[str]]:
    """module -> the modules it imports, without its own parent packages."""
    out = {m: set() for m in tree.modules}
    for m, imports in tree.graph.items():
        for target, _, _ in imports:
            if target != m and not m.startswith(target + "."):
                out[m].add(target)
    return out


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle in ``graph`` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def floor_of(module: str, floors: list[tuple[str, tuple[str, ...]]]) -> int | None:
    """The index of the floor whose rooms hold ``module`` (the longest matching room wins; a room
    ``x`` holds ``x`` and ``x.*``), or None when no room does."""
    best, found = -1, None
    for i, (_, rooms) in enumerate(floors):
        for room in rooms:
            if (module == room or module.startswith(room + ".")) and len(room) > best:
                best, found = len(room), i
    return found


def unplaced(tree: Tree, floors) -> list[str]:
    """Modules of the tree that no floor holds."""
    return [m for m in tree.modules if floor_of(m, floors) is None]


def upward(tree: Tree, floors) -> list[str]:
    """Imports from a module to a module on a higher floor. An import of a parent package counts
    only when it takes a name from it (``from rla import align``); the implicit import of the
    parents every submodule has does not."""
    bad = []
    for m, imports in tree.graph.items():
        mine = floor_of(m, floors)
        for target, name, line in imports:
            if target == m or (m.startswith(target + ".") and name is None):
                continue
            theirs = floor_of(target, floors)
            if mine is not None and theirs is not None and theirs > mine:
                bad.append(f"{tree.where(m, line)}: {m} (floor {floors[mine][0]}) imports {target}"
                           f"{'.' + name if name else ''} (floor {floors[theirs][0]}, above it)")
    return bad


def lab_imports(tree: Tree) -> list[str]:
    """Imports of the ``lab`` tree from the library."""
    return [f"{tree.where(m, line)}: {m} imports the lab ({top})"
            for m, names in tree.foreign.items() for top, line in names if top == "lab"]


def _private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


def private_imports(tree: Tree) -> list[str]:
    """Private modules imported from outside their package, private names from another package."""
    bad = []
    for m, imports in tree.graph.items():
        for target, name, line in imports:
            if _private(target) and tree.package(m) != tree.package(target):
                bad.append(f"{tree.where(m, line)} imports private module {target}")
            if name and name.startswith("_") and tree.package(m) != tree.package(target):
                bad.append(f"{tree.where(m, line)} imports private name {target}.{name}")
    return bad


def imports_of_test_files(tests: Path) -> list[str]:
    """Imports of a ``test_*`` module by a file under ``tests`` (shared code belongs in a helper
    module or a conftest fixture, so a test file can be run, moved or deleted alone)."""
    test_names = {p.stem for p in tests.rglob("test_*.py")}
    bad = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module.split(".")[0]]
            bad += [f"{path.relative_to(tests)}:{node.lineno} imports test file {n}" for n in names if n in test_names]
    return bad
