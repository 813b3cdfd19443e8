"""Rendering a :class:`~rla.diagnosis.core.Diagnosis`: terminal table, JSON, Markdown, PNG plots."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from rla.diagnosis.core import Diagnosis

__all__ = ["rich_tables", "to_markdown", "write_report", "explain"]

# (header, metric, format): d = log pi - log mu per token; "seq std" is the std of its per-sequence sum
COLUMNS = [
    ("k3", "mismatch/k3", "{:.2e}"),
    ("mean|d|", "mismatch/abs/mean", "{:.2e}"),
    ("p99|d|", "mismatch/abs/p99", "{:.2e}"),
    ("max|d|", "mismatch/abs/max", "{:.3f}"),
    ("clip.2", "mismatch/clip_leak/0.2", "{:.2%}"),
    ("seq std", "mismatch/seq/log_ratio/std", "{:.2e}"),
    ("d==0", "mismatch/bitwise/equal", "{:.0%}"),
]


def _fmt(metrics: dict, key: str, fmt: str) -> str:
    v = metrics.get(key)
    return "n/a" if v is None else fmt.format(v)


def rich_tables(d: Diagnosis):
    """The subset table and the attribution table as rich renderables."""
    from rich.table import Table

    t = Table(title=f"Training forward vs rollouts ({d.profile}): {d.n_sequences} sequences, {d.n_tokens} tokens")
    t.add_column("aligned regions")
    for name, _, _ in COLUMNS:
        t.add_column(name, justify="right")
    for label, m in d.metrics.items():
        t.add_row(label, *(_fmt(m, key, fmt) for _, key, fmt in COLUMNS))
    a = Table(title="Shapley attribution: mismatch removed by aligning each region")
    a.add_column("region")
    a.add_column("k3 removed", justify="right")
    a.add_column("share of k3", justify="right")
    a.add_column("mean |d| removed", justify="right")
    none_k3 = d.metrics[next(iter(d.metrics))]["mismatch/k3"]
    for region, phi in d.ranked_regions():
        a.add_row(
            region,
            f"{phi:.3e}",
            f"{phi / none_k3:.1%}" if none_k3 > 0 else "n/a",
            f"{d.attribution['mismatch/abs/mean'][region]:.3e}",
        )
    a.add_row(
        "[dim]left unexplained[/]",
        f"{d.unexplained['mismatch/k3'] * none_k3:.3e}",
        f"{d.unexplained['mismatch/k3']:.1%}",
        "",
    )
    return t, a


def explain(d: Diagnosis) -> str:
    """A short paragraph saying what the numbers mean."""
    ranked = d.ranked_regions()
    none = d.metrics[next(iter(d.metrics))]
    full = d.metrics["all"] if "all" in d.metrics else list(d.metrics.values())[-1]
    top, share = ranked[0][0], ranked[0][1] / none["mismatch/k3"] if none["mismatch/k3"] > 0 else float("nan")
    lines = [
        f"Without alignment, the training forward disagrees with the {d.profile} rollouts by "
        f"k3 = {none['mismatch/k3']:.2e} (mean |log pi - log mu| = {none['mismatch/abs/mean']:.2e}); "
        f"{none['mismatch/clip_leak/0.2']:.2%} of tokens already fall outside PPO's clip range "
        "before any update.",
        f"Aligning all regions to {d.profile} brings k3 to {full['mismatch/k3']:.2e}, "
        f"{1 - d.unexplained['mismatch/k3']:.0%} less. {top} accounts for the largest part "
        f"({share:.0%} of k3 by Shapley value).",
        f"The remaining {d.unexplained['mismatch/k3']:.0%} comes from what no rounding profile covers: "
        "GEMM and attention kernels and the decode-vs-prefill structure of the rollout stack.",
    ]
    if d.detection is not None:
        lines.append(f"Profile detection: {d.detection.note}")
    return " ".join(lines)


def to_markdown(d: Diagnosis) -> str:
    head = "| aligned regions | " + " | ".join(n for n, _, _ in COLUMNS) + " |"
    rows = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for label, m in d.metrics.items():
        rows.append(f"| {label} | " + " | ".join(_fmt(m, k, f) for _, k, f in COLUMNS) + " |")
    none_k3 = d.metrics[next(iter(d.metrics))]["mismatch/k3"]
    attr = ["| region | k3 removed | share of k3 | mean abs delta removed |", "|---|---|---|---|"]
    for region, phi in d.ranked_regions():
        attr.append(
            f"| {region} | {phi:.3e} | {phi / none_k3:.1%} | {d.attribution['mismatch/abs/mean'][region]:.3e} |"
        )
    attr.append(f"| left unexplained | {d.unexplained['mismatch/k3'] * none_k3:.3e} | {d.unexplained['mismatch/k3']:.1%} | |")
    parts = [
        f"# rla diagnosis against `{d.profile}`",
        f"{d.n_sequences} sequences, {d.n_tokens} response tokens.",
        "## Mismatch per aligned subset",
        "\n".join(rows),
        "## Attribution (exact Shapley values)",
        "\n".join(attr),
    ]
    if d.detection is not None:
        det = ["| profile | k3 with all regions aligned |", "|---|---|"]
        det += [f"| {name} | {k3:.3e} |" for name, k3 in d.detection.ranking]
        parts += ["## Profile detection", "\n".join(det), d.detection.note]
    parts += ["## What it means", explain(d), "## Plots", "![per-position](per_position.png)",
              "![ratio histogram](ratio_hist.png)", "![attribution](attribution.png)"]
    return "\n\n".join(parts) + "\n"


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plots(d: Diagnosis, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(7, 4))
    first, last = next(iter(d.per_position)), list(d.per_position)[-1]
    for label, curve in d.per_position.items():
        if curve and (label in (first, last) or "+" not in label):  # none, each region alone, all
            x, y = zip(*curve)
            ax.plot(x, y, marker=".", label=label)
    ax.set(xlabel="response position", ylabel="mean |log pi - log mu|", title="Mismatch along the response")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "per_position.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    first, last = next(iter(d.deltas)), list(d.deltas)[-1]
    for label in (first, last):
        rho = np.exp(np.clip(d.deltas[label], -50, 50))
        ax.hist(rho, bins=np.linspace(0.8, 1.2, 81), alpha=0.6, label=label, log=True)
    ax.axvline(0.8, color="k", lw=0.5)
    ax.axvline(1.2, color="k", lw=0.5)
    ax.set(xlabel="importance ratio pi/mu at step 0", ylabel="tokens", title="Ratio histogram")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out / "ratio_hist.png"))

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ranked = d.ranked_regions()
    none_k3 = d.metrics[first]["mismatch/k3"]
    names = [r for r, _ in ranked] + ["unexplained"]
    vals = [v / none_k3 for _, v in ranked] + [d.unexplained["mismatch/k3"]]
    ax.barh(names[::-1], vals[::-1], color=["#999"] + ["#3b7"] * len(ranked))
    ax.set(xlabel="share of step-0 k3", title=f"Attribution to regions ({d.profile})")
    paths.append(_save(fig, out / "attribution.png"))
    return paths


def write_report(d: Diagnosis, out_dir: str | os.PathLike) -> list[Path]:
    """Write report.json, report.md and the PNG plots into ``out_dir`` (created if needed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in (("report.json", json.dumps(d.to_dict(), indent=2)), ("report.md", to_markdown(d))):
        tmp = out / (name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, out / name)
        written.append(out / name)
    written += _plots(d, out)
    return written
