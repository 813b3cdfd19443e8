"""Rendering a :class:`~rla.diagnosis.core.Diagnosis`: terminal table, JSON, Markdown, PNG plots.

The verdict comes first everywhere. When it is not ``attributed`` (the mismatch is beyond
rounding, or the profile increases it) the report says what is likely wrong and shows no
attribution: Shapley shares of a mismatch that is not rounding would explain bad input as
rounding. When it is ``rounding_weights_unverified`` the attribution is shown under the verdict
that says it holds only if the records' unnamed weights are the checkpoint's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from rla.diagnosis.core import Diagnosis, group_label
from rla.diagnosis.output import staged
from rla.diagnosis.vocab import vocab_line

__all__ = ["rich_tables", "to_markdown", "write_report", "write_report_files", "explain", "ratio_tails",
           "RATIO_RANGE", "long_inputs_text"]

RATIO_RANGE = (0.8, 1.2)
"""The range ratio_hist.png resolves: PPO's clip range at epsilon 0.2. Tokens outside it are counted
into the two edge bins and stated on the plot and in report.md."""

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


def _ok(d: Diagnosis) -> bool:
    """The attribution may be shown: the verdict is rounding, verified or not."""
    return d.verdict is None or d.verdict.attributed


def _conditional(d: Diagnosis) -> bool:
    """The attribution holds only if the weights the records do not name are the checkpoint's."""
    return d.verdict is not None and d.verdict.attributed and not d.verdict.ok


VERDICT_LABELS = {"rounding": "OK: ", "rounding_weights_unverified": "ROUNDING-SIZED, WEIGHTS UNVERIFIED: ",
                  "beyond_rounding": "NOT ROUNDING: ", "profile_increases": "WRONG PROFILE: "}
"""report.md's label of each verdict kind."""


CONDITION = "holds only if these weights sampled the records, which the records do not say (see the verdict)"


MIN_ATTRIBUTION_SEQUENCES = 2
"""Fewer sequences get no attribution: one sequence's shares cannot be told from its own chance."""


def too_few_for_attribution(d: Diagnosis) -> str | None:
    """Why the attribution is not shown for ``d``'s few sequences, or None when it is."""
    if d.n_sequences >= MIN_ATTRIBUTION_SEQUENCES:
        return None
    return (f"No attribution: it needs at least {MIN_ATTRIBUTION_SEQUENCES} distinct sequences, got {d.n_sequences}; "
            "one sequence's shares carry no measure of their own uncertainty. Diagnose more rollouts.")


def _attributed(d: Diagnosis) -> bool:
    return _ok(d) and too_few_for_attribution(d) is None


def rich_tables(d: Diagnosis):
    """The subset table and the attribution table (or, when the verdict is not ok, the verdict)."""
    from rich.table import Table
    from rich.text import Text

    if not d.metrics:  # a verdict before any forward (stale_weights): no table to show
        return (Text(f"No attribution. {d.verdict.message}", style="bold red"),)
    t = Table(title=f"Training forward vs rollouts ({d.profile}): {d.n_sequences} sequences, {d.n_tokens} tokens")
    t.add_column("aligned regions")
    for name, _, _ in COLUMNS:
        t.add_column(name, justify="right")
    for label, m in d.metrics.items():
        t.add_row(label, *(_fmt(m, key, fmt) for _, key, fmt in COLUMNS))
    if not _ok(d):
        return t, Text(f"No attribution. {d.verdict.message}", style="bold red")
    if not _attributed(d):
        return t, Text(too_few_for_attribution(d), style="bold yellow")
    a = Table(title="Shapley attribution: mismatch removed by aligning each region",
              caption=f"[bold yellow]{CONDITION}[/]" if _conditional(d) else None)
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
    """A short paragraph saying what the numbers mean (the verdict, when it is not rounding)."""
    notes = " ".join(d.input_notes)
    detection = f" Profile detection: {d.detection.note}" if d.detection is not None else ""
    if not _ok(d):
        return " ".join(x for x in (d.verdict.message, notes) if x) + detection
    if not _attributed(d):
        return " ".join(x for x in (d.verdict.message if _conditional(d) else "", too_few_for_attribution(d), notes)
                        if x) + detection
    ranked = d.ranked_regions()
    none = d.metrics[next(iter(d.metrics))]
    full = d.metrics["all"] if "all" in d.metrics else list(d.metrics.values())[-1]
    top, share = ranked[0][0], ranked[0][1] / none["mismatch/k3"] if none["mismatch/k3"] > 0 else float("nan")
    lines = [d.verdict.message] if _conditional(d) else []
    lines += [
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
    if notes:
        lines.append(notes)
    return " ".join(lines) + detection


def ratio_tails(d: Diagnosis) -> dict[str, dict[str, float]]:
    """Per plotted subset: tokens with pi/mu below and above :data:`RATIO_RANGE`, and the extremes."""
    lo, hi = RATIO_RANGE
    out = {}
    for label in _hist_labels(d):
        delta = d.deltas[label]
        with np.errstate(over="ignore"):
            rho = np.exp(delta)
        out[label] = {
            "below": int((rho < lo).sum()), "above": int((rho > hi).sum()), "tokens": int(rho.size),
            "min": float(rho.min()) if rho.size else float("nan"), "max": float(rho.max()) if rho.size else float("nan"),
        }
    return out


def _hist_labels(d: Diagnosis) -> list[str]:
    labels = list(d.deltas)
    return [labels[0], labels[-1]] if len(labels) > 1 else labels


def _tails_text(d: Diagnosis) -> str:
    lo, hi = RATIO_RANGE
    parts = []
    for label, t in ratio_tails(d).items():
        n = t["below"] + t["above"]
        parts.append(
            f"{label}: {n} of {t['tokens']} tokens ({n / max(t['tokens'], 1):.2%}) outside [{lo}, {hi}] "
            f"({t['below']} below, {t['above']} above; ratios from {t['min']:.3g} to {t['max']:.3g})"
        )
    return "; ".join(parts)


def long_inputs_text(d: Diagnosis) -> str | None:
    """What was done with records longer than one forward step, and whether it kept the bits."""
    li = d.long_inputs
    if not li:
        return None
    checks = li["checks"]
    parts = []
    if li["records_chunked"]:
        exact = [c for c in checks.values() if c["exact"]]
        parts.append(
            f"{li['records_chunked']} record(s) longer than max_tokens = {li['max_tokens']} ran as a chunked prefill "
            f"({li['prefill_step']} positions per step through a KV cache), in every pass where a check at the "
            f"records' own sizes showed it bit-identical to the one-call forward ({len(exact)} of {len(checks)} passes; "
            f"checked up to {max(c['tokens'] for c in checks.values())} tokens). Chunking did not change the logprobs.")
    if li["records_one_call"]:
        bad = {k: c for k, c in checks.items() if not c["exact"]}
        said = "; ".join(f"{k}: {c['equal']:.2%} of hidden-state elements equal, max |difference| {c['max_abs']:.3g}"
                         for k, c in bad.items())
        parts.append(
            f"{li['records_one_call']} record(s) longer than max_tokens = {li['max_tokens']} ran in one forward, "
            f"memory growing with their length, because chunked prefill changes bits here ({said or 'not probed'}).")
    return " ".join(parts)


def _unmeasured(d: Diagnosis) -> str:
    """report.md of a verdict given before any forward (``stale_weights``): nothing was measured."""
    used = f"{d.n_sequences} sequences" + (f" ({d.duplicates} exact duplicates of {d.n_input} records dropped)"
                                            if d.duplicates else "")
    return "\n\n".join([f"# rla diagnosis against `{d.profile}`", f"{used}, {d.n_tokens} response tokens.", "## Verdict",
                         "NOT ROUNDING: " + d.verdict.message,
                         "No forward was run: the verdict comes from the records' `policy` field, before any "
                         "measurement (report.json `policy_check`)."]) + "\n"


def to_markdown(d: Diagnosis) -> str:
    if not d.metrics:
        return _unmeasured(d)
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
    used = f"{d.n_sequences} sequences" + (f" ({d.duplicates} exact duplicates of {d.n_input} records dropped)"
                                            if d.duplicates else "")
    verdict = [] if d.verdict is None else ["## Verdict", VERDICT_LABELS[d.verdict.kind] + d.verdict.message]
    if d.policy is not None and d.policy.carried < d.policy.n_records and not _conditional(d):
        verdict.append(
            f"Weights: {d.policy.n_records - d.policy.carried} of {d.policy.n_records} records carry no `policy` fingerprint, "
            "so that this checkpoint sampled them is not checked for those (docs/diagnosis.md, known limits).")
    if d.vocab is not None:
        verdict.append(vocab_line(d.vocab))
    parts = [f"# rla diagnosis against `{d.profile}`", f"{used}, {d.n_tokens} response tokens.", *verdict,
             "## Mismatch per aligned subset", "\n".join(rows)]
    if _attributed(d):
        parts += ["## Attribution (exact Shapley values)", *([f"It {CONDITION}."] if _conditional(d) else []),
                  "\n".join(attr)]
    elif _ok(d):
        parts += ["## Attribution", too_few_for_attribution(d)]
    if d.scale is not None:
        sc = ["| profile | k3 of its bf16 forward against fp32 |", "|---|---|"]
        sc += [f"| {name} | {k3:.3e} |" for name, k3 in d.scale.per_profile.items()]
        parts += ["## Rounding scale", "\n".join(sc)]
    if d.detection is not None:
        det = ["| profile | k3 with all regions aligned |", "|---|---|"]
        det += [f"| {group_label(g)} | {k3:.3e} |" for g, k3 in d.detection.ranking]
        parts += ["## Profile detection", "\n".join(det), d.detection.note]
    if long_inputs_text(d):
        parts += ["## Long records", long_inputs_text(d)]
    parts += ["## What it means", explain(d), "## Plots", "![per-position](per_position.png)",
              "![ratio histogram](ratio_hist.png)", f"Ratio histogram tails (drawn in the edge bins): {_tails_text(d)}."]
    if _attributed(d):
        parts.append("![attribution](attribution.png)")
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
    if not d.per_position:  # a verdict before any forward (stale_weights): nothing to plot
        return paths
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

    fig, ax = plt.subplots(figsize=(7, 4.4))
    lo, hi = RATIO_RANGE
    step = (hi - lo) / 80
    edges = np.concatenate([[lo - 2 * step], np.linspace(lo, hi, 81), [hi + 2 * step]])
    for label in _hist_labels(d):
        rho = np.exp(np.clip(d.deltas[label], -50, 50))
        ax.hist(np.clip(rho, lo - step, hi + step), bins=edges, alpha=0.6, label=label, log=True)
    ax.axvline(lo, color="k", lw=0.5)
    ax.axvline(hi, color="k", lw=0.5)
    ax.set_xticks([lo - step, lo, 0.9, 1.0, 1.1, hi, hi + step], [f"<{lo}", str(lo), "0.9", "1.0", "1.1", str(hi), f">{hi}"])
    ax.set(xlabel="importance ratio pi/mu at step 0 (edge bins: every token outside the clip range)", ylabel="tokens",
           title="Ratio histogram")
    ax.legend(fontsize=8)
    tails = ratio_tails(d)
    ax.text(0.01, 0.99, "\n".join(f"{k}: {t['below']} below {lo} (min {t['min']:.3g}), {t['above']} above {hi} "
                                  f"(max {t['max']:.3g})" for k, t in tails.items()),
            transform=ax.transAxes, va="top", fontsize=7)
    paths.append(_save(fig, out / "ratio_hist.png"))
    if not _attributed(d):
        return paths

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ranked = d.ranked_regions()
    none_k3 = d.metrics[next(iter(d.metrics))]["mismatch/k3"]
    names = [r for r, _ in ranked] + ["unexplained"]
    vals = [v / none_k3 for _, v in ranked] + [d.unexplained["mismatch/k3"]]
    ax.barh(names[::-1], vals[::-1], color=["#999"] + ["#3b7"] * len(ranked))
    ax.set(xlabel="share of step-0 k3", title=f"Attribution to regions ({d.profile})"
           + ("\nif these weights sampled the records (not recorded)" if _conditional(d) else ""))
    paths.append(_save(fig, out / "attribution.png"))
    return paths


def write_report_files(d: Diagnosis, folder: str | os.PathLike, inputs: dict | None = None) -> list[Path]:
    """Write report.json (with ``inputs``), report.md and the plots into an existing ``folder``."""
    out = Path(folder)
    from rla.environment import environment

    data = {"environment": environment(), "inputs": inputs, **d.to_dict()}
    written = []
    for name, text in (("report.json", json.dumps(data, indent=2)), ("report.md", to_markdown(d))):
        (out / name).write_text(text)
        written.append(out / name)
    return written + _plots(d, out)


def write_report(d: Diagnosis, out_dir: str | os.PathLike, *, inputs: dict | None = None,
                 overwrite: bool = False) -> list[Path]:
    """Write the report into ``out_dir`` through a staged folder (:func:`rla.diagnosis.output.staged`).

    A non-empty ``out_dir`` is refused unless ``overwrite`` (and then only a folder rla wrote); a
    kill leaves the old folder or the new one. ``inputs`` (see
    :func:`rla.diagnosis.provenance.inputs_record`) goes into report.json, and an ``out_dir`` that
    is or holds one of its paths (model, rollouts) is refused.
    """
    paths = [(inputs or {}).get(k, {}).get("path") for k in ("model", "rollouts")] if isinstance(inputs, dict) else []
    with staged(out_dir, overwrite=overwrite, inputs=[p for p in paths if p]) as tmp:
        names = [p.name for p in write_report_files(d, tmp, inputs)]
    return [Path(out_dir) / n for n in names]
