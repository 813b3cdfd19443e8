"""The package's imports run one way and through public names (docs/README.md, ARCHITECTURE).

Read from the source with ``ast`` (nothing is imported, so this runs in a second): every import
inside ``src/rla`` -- at the top of a module or deferred inside a function, both are
dependencies -- becomes an edge between modules. The tests fail on

- a cycle among ``rla``'s modules (an edge to a package is an edge to its ``__init__``; the implicit
  import of a module's own parent packages is not counted, as every submodule has it);
- a private module (a name part starting with ``_``) imported from outside its own package, or a
  private name imported from a module of another package.
"""

from __future__ import annotations

import ast
from pathlib import Path

from repo_root import ROOT

SRC = ROOT / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "rla").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _package(module: str) -> str:
    """The package a module lives in (a package's ``__init__`` lives in the package itself)."""
    return module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """(imported rla module, imported name or None, line) for every import in ``module``."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    out.append((alias.name, None, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import: resolve against the importer's package
                pkg = _package(module).split(".")
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            if base not in MODULES:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((sub, None, node.lineno) if sub in MODULES else (base, alias.name, node.lineno))
    return out


GRAPH = {m: _imports(m) for m in MODULES}


def _private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


def test_the_scan_sees_the_package():
    # guards the tests below against passing on an empty or misread tree
    assert {"rla", "rla.ops", "rla.ops.fused", "rla.rollout.sampler", "rla.alignment.core"} <= set(MODULES)
    assert ("rla.ops.reference", None) in {(m, n) for m, n, _ in GRAPH["rla.ops.fused"]}
    assert ("rla.alignment", "align") in {(m, n) for m, n, _ in GRAPH["rla.rollout.sampler"]}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
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


def _edges() -> dict[str, set[str]]:
    edges = {m: set() for m in MODULES}
    for m, imports in GRAPH.items():
        for target, _, _ in imports:
            if target != m and not m.startswith(target + "."):  # a module's own parent packages
                edges[m].add(target)
    return edges


def test_no_import_cycle():
    cycle = _cycle(_edges())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_private_module_or_name_across_packages():
    bad = []
    for m, imports in GRAPH.items():
        for target, name, line in imports:
            owner = _package(target)
            if _private(target) and _package(m) != owner:
                bad.append(f"{MODULES[m].relative_to(SRC)}:{line} imports private module {target}")
            if name and name.startswith("_") and _package(m) != _package(target):
                bad.append(f"{MODULES[m].relative_to(SRC)}:{line} imports private name {target}.{name}")
    assert not bad, "\n".join(bad)
