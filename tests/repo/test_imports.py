"""The floors of ``ARCHITECTURE.md``, enforced: imports run down, never into the lab, never circle.

:data:`FLOORS` is the floor plan (lowest first; each floor's rooms are packages or modules of
``rla``). The graph is read from the source with ``ast`` (``import_graph.py``; nothing is
imported, so this runs in a second). The tests fail on

- a module that no floor holds (a new room must be placed);
- an import of a module on a higher floor;
- an import of the ``lab`` tree from the library;
- a circle among ``rla``'s modules;
- a private module or name imported across packages;
- a test file importing another test file (shared code lives in helper modules or fixtures).

Each checker is also run on a synthetic tree with one planted violation of each kind, so a
checker that stopped seeing violations fails here instead of passing quietly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import import_graph as G
from repo_root import ROOT

#: The floors, lowest first: (name, rooms). ARCHITECTURE.md has one paragraph per floor.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("rla.atomic", "rla.errors", "rla.strict_json", "rla.console", "rla.progress", "rla.hf", "rla.models")),
    ("profiles", ("rla.profiles",)),
    ("ops", ("rla.ops", "rla.environment")),
    ("alignment", ("rla.alignment",)),
    ("rollout", ("rla.rollout", "rla.metrics")),
    ("engines", ("rla.engines",)),
    ("diagnosis", ("rla.diagnosis",)),
    ("harnesses", ("rla.rl", "rla.bench", "rla.integrations")),
    ("entry", ("rla", "rla.cli", "rla.commands", "rla.demo")),
]

TREE = G.scan(ROOT / "src", "rla")


def test_the_scan_sees_the_package():
    # guards the tests below against passing on an empty or misread tree
    assert {"rla", "rla.ops", "rla.ops.fused", "rla.rollout.sampler", "rla.alignment.core"} <= set(TREE.modules)
    assert ("rla.ops.reference", None) in {(m, n) for m, n, _ in TREE.graph["rla.ops.fused"]}
    assert ("rla.alignment", "align") in {(m, n) for m, n, _ in TREE.graph["rla.rollout.sampler"]}
    # lazy imports by name are edges too: rla.align, the CLI's subcommands
    assert "rla.alignment" in G.edges(TREE)["rla"]
    assert "rla.commands.demo" in G.edges(TREE)["rla.cli"]


def test_every_module_has_a_floor():
    assert not G.unplaced(TREE, FLOORS), "place these in FLOORS and ARCHITECTURE.md: " + ", ".join(G.unplaced(TREE, FLOORS))


def test_imports_run_down_the_floors():
    bad = G.upward(TREE, FLOORS)
    assert not bad, "\n".join(bad)


def test_the_library_never_imports_the_lab():
    bad = G.lab_imports(TREE)
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    found = G.cycle(G.edges(TREE))
    assert found is None, "import cycle: " + " -> ".join(found)


def test_no_private_module_or_name_across_packages():
    bad = G.private_imports(TREE)
    assert not bad, "\n".join(bad)


def test_no_test_file_imports_another():
    bad = G.imports_of_test_files(ROOT / "tests")
    assert not bad, "\n".join(bad)


# -- the checkers see what they are for ------------------------------------------------------

PLANTED = {
    "pkg/__init__.py": "",
    "pkg/low/__init__.py": "",
    "pkg/low/_impl.py": "SECRET = 1\n",
    "pkg/low/base.py": "def _helper():\n    pass\n\ndef good():\n    return 1\n",
    "pkg/low/up.py": "def later():\n    from pkg.high.top import run  # upward, deferred\n    return run\n",
    "pkg/low/lazy.py": "import importlib\nNAMES = {'x': 'pkg.high.top'}\nimportlib.import_module(NAMES['x'])\n",
    "pkg/mid/__init__.py": "",
    "pkg/mid/user.py": "from pkg.low.base import good, _helper\nfrom pkg.low import _impl\n",
    "pkg/mid/study.py": "import lab.dose\n",
    "pkg/mid/a.py": "from pkg.mid import b\n",
    "pkg/mid/b.py": "from pkg.mid import a\n",
    "pkg/high/__init__.py": "",
    "pkg/high/top.py": "from pkg.low.base import good\n\ndef run():\n    from lab import grid\n",
    "pkg/stray.py": "",
}
PLANTED_FLOORS = [("low", ("pkg.low",)), ("mid", ("pkg.mid",)), ("high", ("pkg", "pkg.high"))]


@pytest.fixture
def planted(tmp_path: Path) -> G.Tree:
    for rel, text in PLANTED.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return G.scan(tmp_path, "pkg")


def test_the_checkers_find_planted_violations(planted):
    up = G.upward(planted, PLANTED_FLOORS)
    assert any("pkg/low/up.py:2: pkg.low.up (floor low) imports pkg.high.top.run (floor high" in b for b in up), up
    assert any(b.startswith("pkg/low/lazy.py:2: pkg.low.lazy (floor low) imports pkg.high.top") for b in up), up
    assert len(up) == 2, up  # mid -> low and high -> low are downward
    assert sorted(G.lab_imports(planted)) == ["pkg/high/top.py:4: pkg.high.top imports the lab (lab)",
                                              "pkg/mid/study.py:1: pkg.mid.study imports the lab (lab)"]
    assert sorted(G.private_imports(planted)) == ["pkg/mid/user.py:1 imports private name pkg.low.base._helper",
                                                  "pkg/mid/user.py:2 imports private module pkg.low._impl"]
    assert G.cycle(G.edges(planted)) == ["pkg.mid.a", "pkg.mid.b", "pkg.mid.a"]
    # "pkg" is a room of its own floor, so pkg.stray belongs to it; take that room away and it is unplaced
    assert G.unplaced(planted, PLANTED_FLOORS) == []
    assert "pkg.stray" in G.unplaced(planted, [("low", ("pkg.low",)), ("mid", ("pkg.mid",)), ("high", ("pkg.high",))])


def test_the_cycle_finder_finds_cycles():
    assert G.cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert G.cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_test_file_check_finds_one(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "test_a.py").write_text("def test_a():\n    pass\n")
    (tmp_path / "x" / "test_b.py").write_text("from test_a import test_a\n")
    (tmp_path / "x" / "helper.py").write_text("X = 1\n")
    (tmp_path / "x" / "test_c.py").write_text("from helper import X\n")
    assert G.imports_of_test_files(tmp_path) == ["x/test_b.py:1 imports test file test_a"]
