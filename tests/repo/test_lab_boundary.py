"""The library never imports the lab: no module of ``src/rla`` imports ``lab`` (read with ``ast``,
deferred imports inside functions included), and every lab module imports ``rla`` through it
(never by reaching into ``src/``)."""

from __future__ import annotations

import ast
from pathlib import Path

from repo_root import ROOT


def imported_roots(path: Path) -> set[str]:
    """The top-level package names ``path`` imports (absolute imports only)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def library_imports_of_the_lab(src: Path) -> list[str]:
    return sorted(str(p.relative_to(src)) for p in src.rglob("*.py") if "lab" in imported_roots(p))


def test_the_library_never_imports_the_lab():
    modules = list((ROOT / "src" / "rla").rglob("*.py"))
    assert len(modules) > 50, "the scan sees (almost) no library modules"
    bad = library_imports_of_the_lab(ROOT / "src")
    assert not bad, "rla imports the lab (move the code into rla, or plug it in from the lab):\n" + "\n".join(bad)


def test_the_lab_imports_the_library():
    lab = [p for p in (ROOT / "lab").rglob("*.py")]
    assert lab and any("rla" in imported_roots(p) for p in lab)
    assert not [p for p in lab if "src" in imported_roots(p)]


def test_a_planted_lab_import_is_found(tmp_path):
    pkg = tmp_path / "rla" / "rl"
    pkg.mkdir(parents=True)
    (pkg / "ok.py").write_text("from rla.ops import rope\nimport labels\n")
    (pkg / "bad.py").write_text("def f():\n    from lab.dose.knob import DoseOps\n    return DoseOps\n")
    assert library_imports_of_the_lab(tmp_path) == [str(Path("rla/rl/bad.py"))]
