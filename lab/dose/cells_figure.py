"""Issue #19's four cells on one figure: model size (rows) x response length (columns), each run's final
reward relative to its start against its step-0 k3, with each cell's fitted threshold or bound.

    python lab/dose/cells_figure.py          # -> results/experiments/dose_response_cells.png

Reads only the cells' committed ``dose_report.json`` (written by ``python -m lab.dose.experiment --summarize-only``); the
numbers behind every point are those reports' runs. A run collapsed (criterion ``reward``) when its final
reward fell below half its start: below the dashed line.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

#: (row: size, column: length) -> [(report folder, model in it, label)]; the 52M short cell has two warm starts
CELLS = {
    ("4M", "~123 tokens (addition), 100 steps"): [("dose_response_h200_2026-11-30", "qwen2-tiny", None)],
    ("4M", "~1,027 tokens (counting), 40 steps"): [("dose_response_long_h200_2026-12-01", "qwen2-tiny-long", None)],
    ("52M", "~123 tokens (addition), 100 steps"): [("dose_response_h200_2026-11-30", "qwen2-50m", "first warm start"),
                                                  ("dose_response_50m_high_h200_2026-11-30", "qwen2-50m", None)],
    ("52M", "~1,027 tokens (counting), 40 steps"): [("dose_response_long52_h200_2026-12-01", "qwen2-50m-long", None)],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[2]))
    ap.add_argument("--out", default="results/experiments/dose_response_cells.png")
    args = ap.parse_args(argv)
    root = Path(args.root)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = {}
    for key, sources in CELLS.items():
        runs, fits = [], []
        for folder, model, label in sources:
            report = json.loads((root / "results" / "experiments" / folder / "dose_report.json").read_text())
            runs += [{**r, "source": label} for r in report["runs"] if r["model"] == model and r["scored"]]
            fits += [c["fit"] for c in report["cells"] if c["model"] == model]
        cells[key] = (runs, fits)
    positive = [r["step0_k3"] for runs, _ in cells.values() for r in runs if r["step0_k3"] > 0]
    xlo, xhi = min(positive) / 10, max(positive) * 3
    sizes, lengths = ["4M", "52M"], [k[1] for k in CELLS if k[0] == "4M"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True, sharey=True, constrained_layout=True)
    for (size, length), (runs, fits) in cells.items():
        ax = axes[sizes.index(size), lengths.index(length)]
        # the tightest statement of the cell: a fitted threshold's interval, else the largest lower bound
        fitted = [f for f in fits if f["status"] in ("fit", "separated")]
        if fitted:
            lo, hi = fitted[0]["interval_k3"]
            ax.axvspan(lo or xlo, hi or xhi, color="0.85", zorder=0, label="95% interval of the threshold")
            ax.axvline(fitted[0]["threshold_k3"], color="k", lw=1.2,
                       label=f"threshold k3_50 = {fitted[0]['threshold_k3']:.2g}")
        else:
            bound = max(f["interval_k3"][0] for f in fits if f["interval_k3"][0])
            ax.axvspan(bound, xhi, color="0.85", zorder=0, label=f"threshold above {bound:.2g} (95%)")
        ax.axhline(0.5, color="tab:red", ls="--", lw=1, label="collapse: final < 0.5 x start")
        ax.axvline(1e-3, color="0.4", ls=":", lw=1)
        seen = set()
        for r in runs:
            kind = "aligned" if r["role"] == "aligned" else ("dose" if r["role"] == "dose" else r["arm"])
            color = {"aligned": "tab:green", "dose": "tab:red", "bf16": "tab:blue"}.get(kind, "tab:purple")
            marker = {"aligned": "s", "dose": "o", "bf16": "D"}.get(kind, "^")
            exact = r.get("exact") or r["step0_k3"] == 0
            x = xlo * 1.3 if exact else r["step0_k3"]
            label = kind + (" (k3 = 0 exactly: left edge)" if exact else "") + (f", {r['source']}" if r["source"] else "")
            face = "none" if exact or r["source"] else color
            ax.scatter(x, r["final_reward"] / r["reward_first"], marker=marker, facecolors=face, edgecolors=color,
                       s=26, alpha=0.85, zorder=3, label=None if label in seen else label)
            seen.add(label)
        ax.set_xscale("log")
        ax.set_xlim(xlo, xhi)
        ax.set_ylim(0, 1.8)
        ax.grid(alpha=0.3)
        ax.set_title(f"{size}, {length}: {len(runs)} runs", fontsize=9)
        ax.legend(fontsize=6.5, loc="lower left")
    for ax in axes[1]:
        ax.set_xlabel("step-0 k3 of the run (log; dotted: 1e-3, public bf16 reports)")
    for ax in axes[:, 0]:
        ax.set_ylabel("final reward / starting reward")
    fig.suptitle("GRPO under a dosed train/rollout mismatch: where runs collapse, by model size and response length "
                 "(H200, 2026-11-30 / 12-01)", fontsize=10)
    out = root / args.out
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    for (size, length), (runs, fits) in cells.items():
        collapsed = sum(bool(r["collapsed"]) for r in runs)
        print(f"{size}, {length}: {collapsed}/{len(runs)} runs collapsed; "
              + "; ".join(f["statement"] for f in fits))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
