"""Shared machinery of the folder-README checkers: table claims, prose claims, one result table.

Every cited number of a folder README stands between render markers (``lab/checks/render.py``).
A *table check* names a README table (``name``) and a function that recomputes, from the folder's
files, for each row key (the tuple of the row's key cells, as plain text) one entry per remaining
column: ``None`` (a column that cites nothing), a number, a list of numbers (``0.60 ± 0.02``: two)
or a word. The row's values, in column order, are the claim ``<table slug>/<key slug>``; each marker
of that claim is rendered from them in its own shape and compared with what it holds. A marked row
the data do not produce is a mismatch, never skipped; rows may be reworded, reordered or left out.

Prose claims use ``check_results.Check`` with the README's path as its ``where``; ``prose_texts``
gives the whitespace-normalised texts.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from render import format_like, markers, slug  # noqa: E402


def check_results_module():
    """``lab/checks/check_results.py`` as a module (its Check, run_check, table and formatting)."""
    if "check_results" not in sys.modules:
        spec = importlib.util.spec_from_file_location("check_results", HERE / "check_results.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["check_results"] = mod  # dataclasses look their module up by name
        spec.loader.exec_module(mod)
    return sys.modules["check_results"]


@dataclass
class TableCheck:
    name: str
    readme: str                  # path relative to the repository root
    files: str
    statistic: str
    compute: Callable[[Path], dict]   # row key (tuple of the key cells, plain text) -> values per other column

    @property
    def prefix(self) -> str:
        return slug(self.name) + "/"

    def claim(self, key: tuple[str, ...]) -> str:
        """The marker name of a row."""
        return self.prefix + slug(" / ".join(key))


def _flat(values) -> list:
    out = []
    for v in values:
        if v is None:
            continue
        out += list(v) if isinstance(v, (list, tuple)) else [v]
    return out


def table_values(check: TableCheck, root: Path) -> dict[str, list]:
    """Every row's values by its marker name (what ``render.py`` renders)."""
    return {check.claim(key): _flat(vals) for key, vals in check.compute(root).items()}


def run_table(check: TableCheck, root: Path, text: str | None = None) -> list[dict]:
    """One result row per marked README table row, in ``check_results.run_check``'s shape."""
    base = {"where": check.readme, "file": check.files, "statistic": check.statistic}
    text = (root / check.readme).read_text() if text is None else text
    cited: dict[str, dict[int, list]] = {}
    for mk in markers(text):
        for claim, i in mk["names"]:
            if claim.startswith(check.prefix):
                cited.setdefault(claim, {}).setdefault(i, []).append((mk["written"], mk["shape"]))
    if not cited:
        return [{**base, "claim": check.name, "written": "-", "recomputed": "-",
                 "status": f"MISMATCH: no marker of table {check.prefix!r} in {check.readme} (not cited)"}]
    try:
        expected = {check.claim(k): (k, _flat(v)) for k, v in check.compute(root).items()}
    except Exception as e:  # a missing or changed file is a failure of the claim, not of the checker
        return [{**base, "claim": check.name, "written": "-", "recomputed": "-",
                 "status": f"MISMATCH: could not recompute ({type(e).__name__}: {e})"}]
    out = []
    for claim, marks in cited.items():
        key = expected[claim][0] if claim in expected else (claim[len(check.prefix):],)
        row = {**base, "claim": f"{check.name}: {' / '.join(key)}"}
        written = [marks[i][0] for i in sorted(marks)]
        row["written"] = ", ".join(w for w, _ in written)
        if claim not in expected:
            out.append({**row, "recomputed": "-", "status": "MISMATCH: no recomputed row for this key"})
            continue
        if sorted(marks) != list(range(1, len(marks) + 1)) or any(len(m) > 1 for m in marks.values()):
            out.append({**row, "recomputed": "-", "status": f"MISMATCH: markers {sorted(marks)} of the row are not 1..n once each"})
            continue
        values = expected[claim][1]
        shown = [format_like(v, shape) for v, (_, shape) in zip(values, written)]
        same = len(values) == len(written) and all(s == w for s, (w, _) in zip(shown, written))
        out.append({**row, "recomputed": ", ".join(shown), "status": "ok" if same else "MISMATCH"})
    return out


def prose_texts(root: Path, readmes: list[str]) -> dict[str, str]:
    return {r: " ".join((root / r).read_text().split()) for r in readmes}


def run_all(table_checks: list[TableCheck], prose_checks: list, root: Path,
            texts: dict[str, str] | None = None) -> list[dict]:
    """Every table row and prose claim; ``texts`` (README path -> raw text) replaces the files' text."""
    cr = check_results_module()
    readmes = sorted({c.readme for c in table_checks} | {c.where for c in prose_checks})
    raw = {r: (texts or {}).get(r) or (root / r).read_text() for r in readmes}
    norm = {r: " ".join(t.split()) for r, t in raw.items()}
    rows = []
    for c in table_checks:
        rows += run_table(c, root, raw[c.readme])
    rows += [cr.run_check(c, root, norm) for c in prose_checks]
    return rows


def main(table_checks, prose_checks, doc: str, argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--root", default=str(HERE.parent.parent), help="repository root")
    args = ap.parse_args(argv)
    rows = run_all(table_checks, prose_checks, Path(args.root))
    print(check_results_module().table(rows))
    return 1 if any(r["status"].startswith("MISMATCH") for r in rows) else 0
