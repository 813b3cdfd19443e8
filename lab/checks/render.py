"""Numbers in prose, rendered from the results' data: one marker per cited number.

A number that a README cites from a results file is written between two HTML comments (invisible
when the Markdown is shown)::

    aligning cuts k3 <!--n:grpo-step-0-k3-ratio#1:0.0-->18.8<!--/n-->x at step 0

``grpo-step-0-k3-ratio#1`` names the first value of a claim; a claim is a function of the repository
root that reads the results' JSON / CSV / logs and returns its values: the README's and the
results index's in ``check_results.CHECKS``, the folder READMEs' prose in ``check_experiments.PROSE``
and their table rows (``<table>/<row key>``) in ``check_experiments.TABLES`` /
``check_bench_readmes.TABLES``; the per-study recomputations (``experiment_numbers``,
``dose_numbers``, ``dose_long_numbers``, ``dose_long52_numbers``) are those functions.
``0.0`` is the number's shape: how it is written (its decimals, a thousands separator, scientific
form and exponent width: ``0,000``, ``0.00e-00``); ``s`` writes the value as it is (a word). One
number may stand for several claims (``a#1,b#3``); every one must render the same.

*Rendering* a text replaces what stands between the markers by the claims' values in their shapes.
The check (this script, and the three checkers' per-claim tables; ``tests/lab/test_check_*.py``)
is that the committed text equals a fresh render: a wrong number fails; rewording the prose around the markers never does; a
claim whose markers are gone is reported as not cited. After new data, ``python
lab/checks/render.py --write`` renders the files in place.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

__all__ = ["MARKER", "shape_of", "format_like", "markers", "render", "slug", "claim_values", "marked_files", "main"]

#: ``<!--n:NAMES:SHAPE-->VALUE<!--/n-->``
MARKER = re.compile(r"<!--n:([^:>]+):([^>]+?)-->(.*?)<!--/n-->", re.S)


def slug(name: str) -> str:
    """A claim's name as a marker name: lower case, runs of other characters as ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def shape_of(written: str) -> str:
    """The shape of a written number (digits as ``0``), or ``s`` for a word."""
    if not re.fullmatch(r"[+-]?[\d,]*\.?\d+(?:[eE][+-]?\d+)?", written):
        return "s"
    return re.sub(r"\d", "0", written)


def _decimals(written: str) -> int:
    w = written.replace(",", "")
    return len(w.split(".")[1]) if "." in w else 0


def format_like(value, shape: str) -> str:
    """``value`` in ``shape``: its decimals, thousands separators, scientific form and exponent width."""
    if shape == "s" or isinstance(value, str) or isinstance(value, bool):
        return str(value)
    if "e" in shape.lower():
        mant, exp = re.split("[eE]", shape)
        m2, e2 = f"{value:.{_decimals(mant)}e}".split("e")
        e = int(e2)
        sign = "-" if e < 0 else ("+" if exp.startswith("+") else "")
        return f"{m2}e{sign}{abs(e):0{len(exp.lstrip('+-'))}d}"
    d = _decimals(shape)
    return f"{value:,.{d}f}" if "," in shape else f"{value:.{d}f}"


def markers(text: str) -> list[dict]:
    """Every marker of ``text``: its names (``(claim, index)`` pairs), shape, written value and span."""
    out = []
    for m in MARKER.finditer(text):
        names = []
        for part in m.group(1).split(","):
            claim, _, index = part.strip().rpartition("#")
            if not claim or not index.isdigit():
                raise ValueError(f"marker {m.group(0)[:60]!r}: a name is CLAIM#INDEX, got {part!r}")
            names.append((claim, int(index)))
        out.append({"names": names, "shape": m.group(2), "written": m.group(3), "span": m.span(3)})
    return out


def render(text: str, values: dict[str, list]) -> tuple[str, list[str]]:
    """``text`` with every marker's value rendered from ``values`` (claim -> its values), and the
    problems: a claim that is unknown or has no such index, names of one marker that disagree."""
    problems, pieces, last = [], [], 0
    for mk in markers(text):
        shown = set()
        for claim, i in mk["names"]:
            if claim not in values:
                problems.append(f"{claim}#{i}: no such claim")
                continue
            vals = values[claim]
            if not 1 <= i <= len(vals):
                problems.append(f"{claim}#{i}: the claim has {len(vals)} value(s)")
                continue
            shown.add(format_like(vals[i - 1], mk["shape"]))
        if len(shown) > 1:
            problems.append(f"{', '.join(f'{c}#{i}' for c, i in mk['names'])}: the claims disagree ({sorted(shown)})")
        a, b = mk["span"]
        pieces += [text[last:a], shown.pop() if len(shown) == 1 else mk["written"]]
        last = b
    return "".join(pieces) + text[last:], problems


def claim_values(root: Path) -> dict[str, list | Exception]:
    """Every claim of the three checkers (``check_results``: the README and the results index;
    ``check_experiments`` / ``check_bench_readmes``: the folder READMEs' prose and table rows) by
    its marker name: its values, or the exception computing them raised."""
    import check_bench_readmes
    import check_experiments
    import check_results
    from readme_tables import table_values

    out: dict[str, list | Exception] = dict(check_results.claim_values(root))
    for c in check_experiments.PROSE + check_bench_readmes.PROSE:
        try:
            out[slug(c.name)] = c.compute(root)
        except Exception as e:  # reported, never skipped
            out[slug(c.name)] = e
    for t in check_experiments.TABLES + check_bench_readmes.TABLES:
        try:
            out.update(table_values(t, root))
        except Exception as e:
            out[t.prefix] = e
    return out


def marked_files(root: Path) -> list[Path]:
    """The README and every Markdown file under ``results/`` that holds a marker."""
    files = [root / "README.md", *sorted((root / "results").rglob("*.md"))]
    return [f for f in files if "<!--n:" in f.read_text()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[2]), help="repository root")
    ap.add_argument("--write", action="store_true", help="render the files in place (after new data)")
    args = ap.parse_args(argv)
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    root = Path(args.root)
    values = claim_values(root)
    good = {k: v for k, v in values.items() if not isinstance(v, Exception)}
    bad = 0
    for name, v in values.items():
        if isinstance(v, Exception):
            print(f"{name}: could not recompute ({type(v).__name__}: {v})")
            bad += 1
    for path in marked_files(root):
        rel = path.relative_to(root)
        text = path.read_text()
        fresh, problems = render(text, good)
        for p in problems:
            print(f"{rel}: {p}")
        bad += len(problems)
        if fresh != text:
            if args.write:
                path.write_text(fresh)
                print(f"{rel}: rendered")
            else:
                bad += 1
                print(f"{rel}: differs from a fresh render (python lab/checks/render.py --write)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
