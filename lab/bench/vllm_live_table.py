"""The live-engine results table, rendered from the compare JSONs of a results folder.

``python lab/bench/vllm_live_table.py results/benchmarks/vllm026_live_h200_2026-12-01`` prints the
table; ``--write`` puts it into that folder's README between ``<!-- live-table -->`` and
``<!-- /live-table -->``; the test (``tests/lab/test_vllm_live_table.py``) checks that the committed
block equals a fresh render, so a number in the table can only come from the data.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BEGIN, END = "<!-- live-table -->", "<!-- /live-table -->"
SEARCH_BEGIN, SEARCH_END = "<!-- search-table -->", "<!-- /search-table -->"
FILES = ("compare_l4.json", "compare_l4_qwen3.json", "compare_l28.json")
SIDES = ("hf", "vllm-0.33", "vllm-0.33-eager")


def entries(folder: Path, key: str) -> list[dict]:
    """``key`` (``rows`` or ``search``) of every compare file of ``folder``, in :data:`FILES` order."""
    out = []
    for name in FILES:
        path = folder / name
        if path.is_file():
            out += json.loads(path.read_text())[key]
    return out


def removed(base: float, k3: float) -> str:
    return f"{1 - k3 / base:.0%}"


def render(folder: Path) -> str:
    by = {(r["model"], r["mode"], r["side"]): r for r in entries(folder, "rows")}
    cases = sorted({(m, mode) for m, mode, _ in by}, key=lambda c: (int(c[0].rsplit("-L", 1)[1]), c[0], c[1]))
    head = ("| model | engine mode | side | prefill bit-equal | prefill k3 | k3 removed | max abs dlogp "
            "| decode k3 | decode k3 removed |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for model, mode in cases:
        hf = by[(model, mode, "hf")]
        for side in SIDES:
            r = by.get((model, mode, side))
            if r is None:
                continue
            p, d = r["prefill"], r["decode"]
            lines.append(
                f"| {model} | {mode} | {side} | {p['equal']:.3%} | {p['k3']:.2e} | "
                f"{'-' if side == 'hf' else removed(hf['prefill']['k3'], p['k3'])} | {p['max_abs']:.3f} | "
                f"{d['k3']:.2e} | {'-' if side == 'hf' else removed(hf['decode']['k3'], d['k3'])} |")
    return "\n".join(lines)


def render_search(folder: Path) -> str:
    """Per searched model and mode: the row the search started from, the points where the best
    row differs from it, and each point's flip (the best row with that point alone changed)."""
    from rla.profiles import POINTS

    searches = sorted(entries(folder, "search"), key=lambda s: (s["model"], s["mode"]))
    points = [p for p in POINTS if all(p in s["flips"] for s in searches)]  # the points there were when they ran
    lines = ["| model | engine mode | start row | best row differs in | best k3 | start k3 | "
             + " | ".join(f"flip {p}" for p in points) + " |",
             "|---|---|---|---|---|---|" + "---|" * len(points)]
    for s in searches:
        start = s["tried"][0]
        diff = [f"{k}={v}" for k, v in s["best"].items() if start["points"][k] != v] or ["nothing"]
        flips = []
        for p in points:
            f = s["flips"][p]
            flips.append("refused" if "error" in f else
                         f"{f['other']}: {f['prefill_k3']:.2e}" if f["decided"] else f"{f['other']}: tie")
        lines.append(f"| {s['model']} | {s['mode']} | {s['start']} | {', '.join(diff)} | {s['score']['prefill']['k3']:.2e} | "
                     f"{start['prefill']['k3']:.2e} | " + " | ".join(flips) + " |")
    return "\n".join(lines)


def _span(text: str, begin: str, end: str) -> tuple[int, int]:
    return text.index(begin) + len(begin), text.index(end)


def block(text: str, begin: str = BEGIN, end: str = END) -> str:
    a, b = _span(text, begin, end)
    return text[a:b].strip("\n")


def _put(text: str, begin: str, end: str, body: str) -> str:
    a, b = _span(text, begin, end)
    return text[:a] + "\n" + body + "\n" + text[b:]


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    table, search = render(folder), render_search(folder)
    if "--write" in argv:
        readme = folder / "README.md"
        text = _put(readme.read_text(), BEGIN, END, table)
        readme.write_text(_put(text, SEARCH_BEGIN, SEARCH_END, search))
    else:
        print(table + "\n\n" + search)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
