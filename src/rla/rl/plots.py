"""Training curves per arm: reward, k3, mean |delta| and grad norm over steps.

One figure per model, four panels, one line per arm: the mean over seeds, with a band from the
lowest to the highest seed. Steps where the collapse signal fired are marked with an x on the
reward panel. k3, mean |delta| and grad norm use a log scale (they span decades between arms);
exact zeros (a bitwise-aligned arm) cannot be drawn on a log axis and are noted in the legend.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["PANELS", "ROUTING_PANELS", "plot_arms"]

#: (log key, panel title, log scale)
PANELS = (
    ("reward/mean", "reward (mean over the step's rollouts)", False),
    ("mismatch/k3", "k3 = E[rho - 1 - log rho], before each step's first update", True),
    ("mismatch/abs/mean", "mean |log pi_train - log mu|", True),
    ("train/grad_norm", "grad norm (before clipping)", True),
)

#: An MoE experiment's second figure: how often the training forward routes a token elsewhere than
#: the rollout engine did (rla.metrics.routing_mismatch, before each step's first update), beside k3.
ROUTING_PANELS = (
    ("routing/set_differs_mean", "tokens whose expert set differs from the engine's (mean over layers)", True),
    ("routing/any_layer_set_differs", "tokens whose expert set differs in >= 1 layer", True),
    ("mismatch/k3", "k3 = E[rho - 1 - log rho], before each step's first update", True),
    ("reward/mean", "reward (mean over the step's rollouts)", False),
)


def _series(records: list[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    steps = np.array([r["step"] for r in records if isinstance(r.get(key), (int, float))], dtype=float)
    vals = np.array([float(r[key]) for r in records if isinstance(r.get(key), (int, float))], dtype=float)
    return steps, vals


def _smooth(v: np.ndarray, window: int) -> np.ndarray:
    if window <= 1 or v.size == 0:
        return v
    out = np.empty_like(v)
    for i in range(v.size):
        seg = v[max(0, i - window + 1) : i + 1]
        seg = seg[np.isfinite(seg)]
        out[i] = seg.mean() if seg.size else np.nan
    return out


def plot_arms(arms: dict[str, list[list[dict[str, Any]]]], path: str | Path, title: str = "",
              smooth: int = 5, panels=PANELS) -> Path:
    """Draw ``arms`` (arm label -> one log per seed) into ``path`` (PNG) and return it.

    ``smooth``: trailing-window mean applied to the reward panel only. ``panels``: four (log key,
    title, log scale) triples (``PANELS``, or ``ROUTING_PANELS`` for an MoE run's routing).
    """
    if len(panels) != 4:
        raise ValueError(f"plot_arms draws a 2 x 2 figure: give 4 panels, got {len(panels)}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5), constrained_layout=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (key, panel_title, log_scale), ax in zip(panels, axes.flat):
        for n, (arm, logs) in enumerate(arms.items()):
            color = colors[n % len(colors)]
            curves = [_series(rec, key) for rec in logs if rec]
            curves = [(s, _smooth(v, smooth) if key == "reward/mean" else v) for s, v in curves if s.size]
            if not curves:
                continue
            length = min(s.size for s, _ in curves)
            steps = curves[0][0][:length]
            stack = np.stack([v[:length] for _, v in curves])
            label = f"{arm} (n={len(curves)})"
            if log_scale:
                zeros = np.nanmean(stack == 0)
                if zeros > 0:
                    label += f", {zeros:.0%} exact zeros"
                stack = np.where(stack > 0, stack, np.nan)
            with warnings.catch_warnings():  # all-NaN columns (exact zeros on a log axis) stay NaN
                warnings.simplefilter("ignore", RuntimeWarning)
                mean = np.nanmean(stack, axis=0)
                lo, hi = np.nanmin(stack, axis=0), np.nanmax(stack, axis=0)
            ax.plot(steps, mean, color=color, label=label, lw=1.6)
            if len(curves) > 1:
                ax.fill_between(steps, lo, hi, color=color, alpha=0.15, lw=0)
            if key == "reward/mean":
                for rec in logs:
                    ev = [r["step"] for r in rec if r.get("collapse/fired")]
                    yv = [mean[min(int(s) - int(steps[0]), length - 1)] for s in ev if s >= steps[0]]
                    ax.scatter(ev[: len(yv)], yv, marker="x", color=color, s=40, zorder=3)
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel("step")
        if log_scale:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        axes.flat[0].legend(fontsize=8, loc="best")
    for ax in list(axes.flat)[1:]:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title + "   (x: collapse signal fired)" if any(
            r.get("collapse/fired") for logs in arms.values() for rec in logs for r in rec) else title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

