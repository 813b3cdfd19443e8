"""The table of ``results/benchmarks/vllm026_rows_h200_2026-12-02``, rendered from its data.

Each run is one live vLLM 0.26 engine run (``rla verify --live``, the training side attending with
vLLM's own kernel) and its re-scoring with the model's own attention (``--engine-outputs``): their
``report.json`` under ``runs/<model>-<mode>/``. The Qwen3 4-layer runs' report folders did not come
back from the device (a call returns a limited number of files); their numbers are the per-side
lines ``rla verify --live`` logs (``[rla verify --live ...] <side> prefill eq X% k3 Y max Z |
decode eq A% k3 B``), from ``logs/qwen3-h2048-L4-<mode>.rescore-<attention>.log``, which print the
same values to four significant digits.

The engine-backed side (``rla verify --live --engine-forward``) has its own table, from
``runs-engine-forward/<model>-<mode>/report.json``.

``python lab/bench/vllm026_rows_table.py FOLDER [--write]`` prints the tables; ``--write`` puts them
into the README between ``<!-- rows-table -->`` and ``<!-- /rows-table -->``, and
``<!-- engine-forward-table -->`` and ``<!-- /engine-forward-table -->``;
``tests/lab/test_vllm026_rows_table.py`` checks that the committed table is the render.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

BEGIN, END = "<!-- rows-table -->", "<!-- /rows-table -->"
ATTENTIONS = (("engine-attention", "engine"), ("rescored-model-attention", "model"))
_LINE = re.compile(r"\] (\S+)\s+prefill eq ([0-9.]+)% k3 ([0-9.e+-]+) max \S+ \| decode eq ([0-9.]+)% k3 ([0-9.e+-]+)")


def _from_report(path: Path) -> dict[str, dict]:
    rep = json.loads(path.read_text())
    return {r["side"]: {"eq": r["prefill"]["equal"], "k3": r["prefill"]["k3"], "dk3": r["decode"]["k3"]}
            for r in rep["rows"]}


def _from_log(path: Path) -> dict[str, dict]:
    sides = {}
    for m in _LINE.finditer(path.read_text()):
        sides[m.group(1)] = {"eq": float(m.group(2)) / 100, "k3": float(m.group(3)), "dk3": float(m.group(5))}
    return sides


def runs(folder: Path) -> list[tuple[str, str, str, dict, str]]:
    """``(model, mode, attention, sides, source)`` for every run, model then mode then attention."""
    out = []
    names = {p.name for p in (folder / "runs").iterdir()} | {
        p.name.split(".")[0] for p in (folder / "logs").glob("qwen3-h2048-L4-*.rescore-*.log")}
    for name in sorted(names, key=lambda n: (n.split("-L")[0], int(n.split("-L")[1].split("-")[0]), n)):
        model, mode = name.rsplit("-", 1)
        for sub, attention in ATTENTIONS:
            rep = folder / "runs" / name / sub / "report.json"
            log = folder / "logs" / f"{name}.rescore-{attention}.log"
            if rep.is_file():
                out.append((model, mode, attention, _from_report(rep), "report.json"))
            elif log.is_file():
                out.append((model, mode, attention, _from_log(log), "log"))
    return out


def _cell(side: dict | None) -> str:
    return "-" if side is None else f"{side['eq']:.3%} / {side['k3']:.2e}"


def render(folder: Path) -> str:
    lines = ["| model | mode | training attention | hf: bit-equal / k3 | op row (`-op`) | live row | the other mode's "
             "row | k3 removed by the live row | decode k3: hf, live row |", "|---|---|---|---|---|---|---|---|---|"]
    for model, mode, attention, sides, source in runs(folder):
        tail = "-eager" if mode == "eager" else ""
        # the other mode's row: 0.33's in the runs made before the 0.26 rows shipped, 0.26's after
        # (the same nine points, docs/rounding.md); whichever the report shows
        others = ("vllm-0.33", "vllm-0.26") if mode == "eager" else ("vllm-0.33-eager", "vllm-0.26-eager")
        other = next((o for o in others if o in sides), others[0])
        live, hf = sides.get(f"vllm-0.26{tail}"), sides["hf"]
        removed = "-" if live is None else f"{1 - live['k3'] / hf['k3']:.0%}"
        lines.append(f"| {model}{' (log)' if source == 'log' else ''} | {mode} | {attention} | {_cell(hf)} | "
                     f"{_cell(sides.get(f'vllm-0.26{tail}-op'))} | {_cell(live)} | {_cell(sides.get(other))} | {removed} | "
                     f"{hf['dk3']:.2e}, {'-' if live is None else format(live['dk3'], '.2e')} |")
    return "\n".join(lines)


def render_engine_forward(folder: Path) -> str:
    """The engine-backed side beside the rows: one line per side of each ``runs-engine-forward/<model>-<mode>/``
    report (``rla verify --live --engine-forward``), its own numbers, "removed" against its ``hf``."""
    lines = ["| model | mode | side | prefill bit-equal | prefill k3 | k3 removed | decode bit-equal | decode k3 | "
             "decode k3 removed |", "|---|---|---|---|---|---|---|---|---|"]
    for run in sorted((folder / "runs-engine-forward").iterdir()):
        rep = json.loads((run / "report.json").read_text())
        model, mode = run.name.rsplit("-", 1)
        hf = next(r for r in rep["rows"] if r["side"] == "hf")
        for r in rep["rows"]:
            pre, dec = r["prefill"], r["decode"]
            gone = lambda a, b: "-" if r is hf else f"{1 - a / b:.0%}"  # noqa: E731
            lines.append(f"| {model} | {mode} | {r['side']} | {pre['equal']:.3%} | {pre['k3']:.2e} | "
                         f"{gone(pre['k3'], hf['prefill']['k3'])} | {dec['equal']:.3%} | {dec['k3']:.2e} | "
                         f"{gone(dec['k3'], hf['decode']['k3'])} |")
    return "\n".join(lines)


BLOCKS = {(BEGIN, END): render, ("<!-- engine-forward-table -->", "<!-- /engine-forward-table -->"): render_engine_forward}


def block(text: str, begin: str = BEGIN, end: str = END) -> str:
    return text[text.index(begin) + len(begin):text.index(end)].strip("\n")


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    readme = folder / "README.md"
    text = readme.read_text()
    for (begin, end), make in BLOCKS.items():
        table = make(folder)
        if "--write" in argv:
            text = text[:text.index(begin) + len(begin)] + "\n" + table + "\n" + text[text.index(end):]
        else:
            print(table + "\n")
    if "--write" in argv:
        readme.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
