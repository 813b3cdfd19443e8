"""Shared machinery of the README checkers: parse a Markdown table, read the numbers written in a
cell, format a recomputed value the way the written one is written, and compare.

A *table check* names a README, the table (by the start of its header row), how many leading
columns identify a row, the files and the statistic, and a function that recomputes, for each row
key, one entry per remaining column: ``None`` (a text column, not checked), a number, or a list of
numbers. A cell's written numbers are every number in it (``0.60 ± 0.02`` -> two, ``1/3 (seed 1,
step 13)`` -> four, ``**2.5e-2**`` -> one), each compared as a string after formatting the
recomputed value with the written one's precision (``2.3e-4`` -> one mantissa decimal, ``1,239``
-> thousands separators). A README row without a recomputed row is a mismatch, never skipped.

Prose claims use ``check_results.Check`` (one regex whose groups are the written numbers) with the
README's path as its ``where``; ``prose_texts`` gives the whitespace-normalised texts.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent


def check_results_module():
    """``lab/checks/check_results.py`` as a module (its Check, run_check, table and formatting)."""
    if "check_results" not in sys.modules:
        spec = importlib.util.spec_from_file_location("check_results", HERE / "check_results.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["check_results"] = mod  # dataclasses look their module up by name
        spec.loader.exec_module(mod)
    return sys.modules["check_results"]


# ---------------------------------------------------------------- numbers in text

# a number starts where no letter, digit or dot precedes it; a minus counts only there, so a range
# dash ("0.20-0.60") leaves the second end positive
NUM = r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?"
# a name that starts with a letter is read whole and dropped ("bf16", "qwen3-10m", "k3", "B4")
TOKEN = re.compile(rf"[A-Za-z_][\w.-]*|{NUM}")


def numbers(cell: str) -> list[str]:
    return [t for t in TOKEN.findall(cell) if not (t[0].isalpha() or t[0] == "_")]


def like(value: float, written: str) -> str:
    """``value`` formatted as ``written`` is (``check_results.like``)."""
    return check_results_module().like(value, written)


def shown(value, written: str) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return like(value, written)
    return str(value)


# ---------------------------------------------------------------- Markdown tables

def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _plain(cell: str) -> str:
    return cell.replace("**", "").replace("`", "").strip()


def find_table(text: str, header_start: str) -> tuple[list[str], list[list[str]]]:
    """The header and body rows of the one table whose header row starts with ``header_start`` (is
    ``header_start``, when that ends with ``|``)."""
    lines = text.splitlines()
    whole = header_start.endswith("|")  # a complete header row: matched exactly
    found = [i for i, l in enumerate(lines) if (l.strip() == header_start if whole else l.strip().startswith(header_start))]
    if len(found) != 1:
        raise LookupError(f"{len(found)} tables whose header starts with {header_start!r}")
    i = found[0]
    header = _cells(lines[i])
    rows = []
    for line in lines[i + 2:]:
        if not line.strip().startswith("|"):
            break
        rows.append(_cells(line))
    return header, rows


@dataclass
class TableCheck:
    name: str
    readme: str                  # path relative to the repository root
    header: str                  # the start of the table's header row
    files: str
    statistic: str
    compute: Callable[[Path], dict]   # row key (tuple of the key cells, plain text) -> values per other column
    key_cols: int = 1


def run_table(check: TableCheck, root: Path, text: str | None = None) -> list[dict]:
    """One result row per README table row, in ``check_results.run_check``'s shape."""
    base = {"where": check.readme, "file": check.files, "statistic": check.statistic}
    text = (root / check.readme).read_text() if text is None else text
    try:
        header, rows = find_table(text, check.header)
    except LookupError as e:
        return [{**base, "claim": check.name, "written": "-", "recomputed": "-",
                 "status": f"MISMATCH: {e} (the table changed?)"}]
    try:
        expected = check.compute(root)
    except Exception as e:  # a missing or changed file is a failure of the claim, not of the checker
        return [{**base, "claim": check.name, "written": "-", "recomputed": "-",
                 "status": f"MISMATCH: could not recompute ({type(e).__name__}: {e})"}]
    out, above = [], [""] * check.key_cols
    for cells in rows:
        key = tuple(_plain(c) or above[j] for j, c in enumerate(cells[:check.key_cols]))
        above = list(key)
        row = {**base, "claim": f"{check.name}: {' / '.join(key)}"}
        if key not in expected:
            out.append({**row, "written": " | ".join(cells[check.key_cols:]), "recomputed": "-",
                        "status": "MISMATCH: no recomputed row for this key"})
            continue
        values = expected[key]
        written_all, shown_all, same = [], [], len(values) == len(cells) - check.key_cols
        for cell, value in zip(cells[check.key_cols:], values):
            if value is None:
                continue
            if isinstance(value, str):  # a word (yes / no, a profile name): compared as written
                same = same and _plain(cell) == value
                written_all.append(_plain(cell))
                shown_all.append(value)
                continue
            written = numbers(cell)
            vals = value if isinstance(value, (list, tuple)) else [value]
            got = [shown(v, w) for v, w in zip(vals, written)]
            same = same and len(vals) == len(written) and got == written
            written_all.append(" ".join(written))
            shown_all.append(" ".join(got) if len(vals) == len(written) else " ".join(map(str, vals)))
        out.append({**row, "written": ", ".join(written_all), "recomputed": ", ".join(shown_all),
                    "status": "ok" if same else "MISMATCH"})
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
    ap.add_argument("--root", default=str(HERE.parent), help="repository root")
    args = ap.parse_args(argv)
    rows = run_all(table_checks, prose_checks, Path(args.root))
    print(check_results_module().table(rows))
    return 1 if any(r["status"].startswith("MISMATCH") for r in rows) else 0
