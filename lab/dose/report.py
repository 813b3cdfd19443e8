"""The dose-response report (issue #19): collapse and final reward against step-0 k3, with a threshold.

Written by ``python -m lab.dose.experiment GRID --out DIR`` (and ``--summarize-only``) when the grid has dose
arms (``train_dose_bits``), beside the usual summary: ``DIR/dose_report.md``,
``DIR/dose_report.json`` and ``DIR/plots/dose_response.png``.

**Cells.** Every model of the grid is one cell (a model size at a response length: the grid's
``models`` entries); arms and seeds are its runs. Each run is one point: x = log10 of its own
step-0 k3 (the first line of its log), y = collapsed or not.

**Collapse criterion** (per run; ``criterion=``):

- ``reward`` (default): the run's final reward -- the mean reward over its last
  ``collapse_window`` steps -- is below ``fraction`` (0.5) x its starting reward, the mean over its
  first ``collapse_window`` steps. This counts the smooth collapse (reward to ~0 with k3 barely
  moving) as well as the sudden one, and does not count a spike the run recovered from.
- ``signal``: docs/metrics.md's collapse signal (k3 > 10x its step-0 value or grad norm > 10x its
  running median, together with falling reward; or a non-finite k3 / grad norm) fired at least once.
- ``either``: one or the other.

Both counts are reported whatever the criterion. A run with fewer than ``2 x collapse_window``
logged steps is not scored (its start and end windows would overlap).

**The threshold.** P(collapse | x) = sigmoid(b (x - t)) with b >= 0 (per decade of k3): t is the
log10 k3 at which half the runs collapse. It is fitted by maximum likelihood over the cell's dose
arms and the aligned arm (the zero dose: ``train_dose_bits: 7`` computes exactly what the aligned
arm computes); other arms (bf16, ...) are placed on the same axes and compared with the curve but
do not enter the fit, since their mismatch has another origin. The interval is the 95% profile
likelihood interval of t: every t with 2 (l(t_hat) - max_b l(t, b)) <= 3.841 (chi-square, 1 dof),
found on a grid of t 0.002 decades apart. The profile handles what a Wald interval cannot:

- *separated* data (every collapsed run has a larger k3 than every surviving one, likely with 3
  seeds and a steep response): the maximum likelihood is reached for any t in the gap, with
  b -> infinity. The report says so, gives the gap as the maximum-likelihood set and the midpoint
  (in log k3) as the point, and the profile interval, which is finite.
- *no collapse* (or *all collapse*): no threshold is reported, only a one-sided profile bound
  (t above the bound, or below it); the plain statement is "no run collapsed up to k3 = X".
- fewer than ``MIN_RUNS`` scored runs or fewer than 2 distinct doses: not fitted.

**k3 = 0 exactly** (the training forward equals the rollout's logprobs bit for bit, as the aligned
arm can): the run is scored; on the log axis it lies at -infinity, where any curve with b > 0 gives
P(collapse) = 0. In the fit it stands at :data:`EXACT_DECADES` decades below the cell's smallest
positive k3 (P < 1e-12 there for any b >= 0.5 per decade; b = 0 gives 0.5 wherever it stands); the
plot draws it at the left edge, marked as exact.

numpy only (scipy is not a dependency): the inner maximisation over b for fixed t is concave
(logistic regression through the origin in x - t), solved by a safeguarded Newton iteration.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CRITERIA", "run_outcome", "fit_threshold", "dose_report", "is_dose_arm", "is_dose_grid", "CHI2_95",
           "MIN_RUNS"]

CRITERIA = ("reward", "signal", "either")
#: chi-square(1) 95% quantile: the profile-likelihood interval's cut
CHI2_95 = 3.841458820694124
#: fewest scored runs a threshold is fitted on
MIN_RUNS = 4
#: bound on the slope b (per decade of k3) standing in for "infinitely steep" under separation
B_MAX = 1.0e3
#: where a run with k3 = 0 (exact) stands in the fit: this many decades below the smallest positive k3
EXACT_DECADES = 60.0
#: the reference magnitude of public BF16 reports (docs/metrics.md): k3 ~ 1e-3 at step 0
PUBLIC_BF16_K3 = 1e-3


# ----------------------------------------------------------------------------------------- outcome


def run_outcome(summary: dict[str, Any], window: int, criterion: str = "reward",
                fraction: float = 0.5) -> dict[str, Any]:
    """One run's collapse under ``criterion`` from ``rla.rl.runlog.summarize``'s output.

    Returns ``{"scored", "collapsed", "reward_collapse", "signal", "exact", "why"}``; ``scored`` is
    False (and ``collapsed`` None) for a run too short to judge or without a finite step-0 k3 >= 0;
    ``exact``: its step-0 k3 is 0 (training logprobs equal to the rollout's bit for bit).
    """
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    steps = summary.get("steps", 0)
    k3 = (summary.get("step0") or {}).get("k3")
    signal = bool(summary.get("collapse_events"))
    exact = isinstance(k3, (int, float)) and k3 == 0
    out = {"scored": False, "collapsed": None, "reward_collapse": None, "signal": signal, "exact": exact, "why": ""}
    if steps < 2 * window:
        out["why"] = f"{steps} steps < 2 x window {window}"
        return out
    if not isinstance(k3, (int, float)) or not math.isfinite(k3) or k3 < 0:
        out["why"] = f"step-0 k3 is {k3!r} (not a finite number >= 0: no place on the axis)"
        return out
    first, final = summary.get("reward_first"), summary.get("final_reward")
    if first is None or final is None:
        out["why"] = "no reward"
        return out
    reward_collapse = bool(final < fraction * first)
    collapsed = {"reward": reward_collapse, "signal": signal, "either": reward_collapse or signal}[criterion]
    out.update(scored=True, collapsed=collapsed, reward_collapse=reward_collapse)
    return out


# ----------------------------------------------------------------------------------------- the fit


def _loglik(x: np.ndarray, y: np.ndarray, t: np.ndarray, b: np.ndarray) -> np.ndarray:
    """l(t, b) = sum_i y log p + (1 - y) log(1 - p), p = sigmoid(b (x - t)); vectorised over t, b."""
    z = b[:, None] * (x[None, :] - t[:, None])
    # log sigmoid(z) = -log1p(exp(-z)), stably
    log_p = -np.logaddexp(0.0, -z)
    log_q = -np.logaddexp(0.0, z)
    return (y[None, :] * log_p + (1 - y[None, :]) * log_q).sum(axis=1)


def _profile(x: np.ndarray, y: np.ndarray, t: np.ndarray, iters: int = 80) -> tuple[np.ndarray, np.ndarray]:
    """max over 0 <= b <= B_MAX of l(t, b) for each t: (profile log-likelihood, argmax b).

    For fixed t, l is concave in b (a logistic regression through the origin in u = x - t): its
    derivative g(b) = sum_i (y_i - sigmoid(b u_i)) u_i decreases in b, so the maximum is b = 0 when
    g(0) <= 0, B_MAX when g(B_MAX) >= 0, and otherwise the root of g, found by bisection (80 halvings
    of [0, B_MAX]: exact to ~1e-21).
    """
    u = x[None, :] - t[:, None]

    def g(b):
        z = np.clip(b[:, None] * u, -700.0, 700.0)
        return ((y[None, :] - 1.0 / (1.0 + np.exp(-z))) * u).sum(axis=1)

    lo, hi = np.zeros_like(t), np.full_like(t, B_MAX)
    g0, g1 = g(lo), g(hi)
    for _ in range(iters):
        mid = (lo + hi) / 2
        up = g(mid) > 0
        lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
    b = np.where(g0 <= 0, 0.0, np.where(g1 >= 0, B_MAX, (lo + hi) / 2))
    return _loglik(x, y, t, b), b


def fit_threshold(k3: list[float] | np.ndarray, collapsed: list[bool] | np.ndarray, *, grid_step: float = 0.002,
                  margin: float = 2.0) -> dict[str, Any]:
    """Logistic threshold of collapse against log10 k3, with its 95% profile-likelihood interval.

    Returns a dict with ``status`` (``fit``, ``separated``, ``no_collapse``, ``all_collapse``,
    ``too_few``), ``n``, ``collapses``, ``threshold_k3`` (None unless fit/separated),
    ``interval_k3`` ([low, high]; an end is None where the profile does not come back down to the
    cut inside the searched range, i.e. the data bound t on one side only), ``slope_per_decade``
    (None when separated: infinitely steep), ``ml_set_k3`` (the range of maximum-likelihood
    thresholds when separated), ``searched_k3`` and a plain-words ``statement``.
    """
    k3 = np.asarray(k3, dtype=np.float64)
    y = np.asarray(collapsed, dtype=np.float64)
    if k3.shape != y.shape or k3.ndim != 1:
        raise ValueError("k3 and collapsed must be 1-D and of one length")
    if (k3 < 0).any() or not np.isfinite(k3).all():
        raise ValueError("every k3 must be a finite number >= 0")
    positive = k3 > 0
    n, c = int(y.size), int(y.sum())
    out: dict[str, Any] = {"n": n, "collapses": c, "exact": int((~positive).sum()), "threshold_k3": None,
                           "interval_k3": [None, None], "slope_per_decade": None, "ml_set_k3": None,
                           "searched_k3": None}
    distinct = np.unique(k3).size
    if n < MIN_RUNS or distinct < 2 or not positive.any():
        out.update(status="too_few", statement=f"not fitted: {n} scored run(s) at {distinct} distinct k3 "
                                               f"(needs >= {MIN_RUNS} runs at >= 2, one of them > 0)")
        return out
    x = np.log10(np.where(positive, k3, 1.0))
    x_min, x_max = x[positive].min(), x[positive].max()
    x = np.where(positive, x, x_min - EXACT_DECADES)  # k3 = 0: log10 is -inf; see EXACT_DECADES
    lo, hi = x_min - margin, x_max + margin
    t = np.arange(lo, hi + grid_step / 2, grid_step)
    out["searched_k3"] = [float(10**lo), float(10**hi)]
    prof, bs = _profile(x, y, t)
    best = int(np.argmax(prof))
    inside = prof >= prof[best] - CHI2_95 / 2
    idx = np.flatnonzero(inside)
    # the interval is the connected run of grid points around the maximum (the profile is unimodal
    # here; take the outermost points in case of flat stretches)
    i_lo, i_hi = int(idx.min()), int(idx.max())
    low = None if i_lo == 0 else float(10 ** t[i_lo])
    high = None if i_hi == t.size - 1 else float(10 ** t[i_hi])
    out["interval_k3"] = [low, high]
    zero_max = x[y == 0].max() if (y == 0).any() else None
    one_min = x[y == 1].min() if (y == 1).any() else None
    fmt = lambda v: "0" if v < 10 ** (x_min - EXACT_DECADES / 2) else f"{v:.2g}"  # noqa: E731
    if c == 0:
        out.update(status="no_collapse",
                   statement=f"no run of {n} collapsed (k3 up to {fmt(10 ** x_max)}): no threshold; "
                             + (f"at 95% (profile likelihood) it lies above k3 = {fmt(low)}" if low else
                                "the data bound it on neither side"))
        return out
    if c == n:
        out.update(status="all_collapse",
                   statement=f"all {n} runs collapsed (k3 from {fmt(10 ** x.min())}): no threshold; "
                             + (f"at 95% (profile likelihood) it lies below k3 = {fmt(high)}" if high else
                                "the data bound it on neither side"))
        return out
    if zero_max < one_min:  # complete separation: any t in the gap reaches the supremum (b -> inf)
        # (when every surviving run is exact, the gap reaches down to k3 = 0: its upper end stands for it)
        mid = (zero_max + one_min) / 2 if zero_max >= x_min else one_min
        out.update(status="separated", threshold_k3=float(10**mid), ml_set_k3=[float(10**zero_max), float(10**one_min)],
                   statement=f"separated: every collapsed run has a larger k3 than every other; the threshold lies "
                             f"between k3 = {fmt(10 ** zero_max)} and {fmt(10 ** one_min)} (midpoint {fmt(10 ** mid)}), "
                             f"95% profile-likelihood interval [{fmt(low) if low else '-'}, {fmt(high) if high else '-'}]")
        return out
    if zero_max == one_min:  # quasi-complete: mixed outcomes at one k3 only, clean on either side of it
        out.update(status="separated", threshold_k3=float(10**zero_max), ml_set_k3=[float(10**zero_max)] * 2,
                   statement=f"separated except at k3 = {fmt(10 ** zero_max)}, where outcomes are mixed: the maximum "
                             f"likelihood threshold is that k3 with an infinitely steep curve; 95% profile-likelihood "
                             f"interval [{fmt(low) if low else '-'}, {fmt(high) if high else '-'}]")
        return out
    # overlapping outcomes: a finite maximum-likelihood estimate; refine around the grid maximum
    t_hat, b_hat = _refine(x, y, t[max(best - 2, 0)], t[min(best + 2, t.size - 1)])
    out.update(status="fit", threshold_k3=float(10**t_hat), slope_per_decade=float(b_hat),
               statement=f"threshold k3 = {fmt(10 ** t_hat)} (half the runs collapse), 95% profile-likelihood interval "
                         f"[{fmt(low) if low else '-'}, {fmt(high) if high else '-'}], slope {b_hat:.2g} per decade")
    if b_hat >= B_MAX * 0.99:
        out["slope_per_decade"] = None
    return out


def _refine(x, y, a: float, b: float) -> tuple[float, float]:
    """Golden-section maximum of the profile between grid points a < b -> (t, b at t)."""
    g = (math.sqrt(5) - 1) / 2
    f = lambda tt: float(_profile(x, y, np.array([tt]))[0][0])  # noqa: E731
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(60):
        if fc > fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    tt = (a + b) / 2
    return tt, float(_profile(x, y, np.array([tt]))[1][0])


def curve(threshold_k3: float, slope: float | None, k3: np.ndarray) -> np.ndarray:
    """Fitted P(collapse) at ``k3`` (a step at the threshold when the slope is infinite)."""
    x = np.log10(np.asarray(k3, dtype=np.float64)) - math.log10(threshold_k3)
    if slope is None:
        return (x > 0).astype(float) + 0.5 * (x == 0)
    return 1.0 / (1.0 + np.exp(-slope * x))


# ----------------------------------------------------------------------------------------- report


def is_dose_arm(over: dict) -> bool:
    """True when an arm's overrides set ``train_dose_bits`` (a dose arm)."""
    return over.get("train_dose_bits") is not None


def is_dose_grid(grid) -> bool:
    """True when some arm sets ``train_dose_bits`` (the grid is a dose-response experiment)."""
    return any(is_dose_arm(over) for over in grid.arms.values())


def _role(over: dict) -> str:
    if is_dose_arm(over):
        return "dose"
    if over.get("train_precision") == "aligned" and not over.get("align_regions"):
        return "aligned"
    return "other"


def dose_report(out: str | Path, grid, summary: dict, *, criterion: str = "reward", fraction: float = 0.5,
                plots: bool = True) -> dict:
    """``dose_report.json`` / ``.md`` and ``plots/dose_response.png`` from a grid summary
    (``rla.rl.experiment_summary.summarize_grid``'s, which holds every run's log summary); ``plots=False``:
    no figure (``report["plot"]`` None)."""
    from rla.rl.experiment_summary import stats

    from rla.rl.runlog import read_log

    out = Path(out)
    specs = {s.name: s for s in grid.runs(out)}
    runs = []
    for r in summary["runs"]:
        spec = specs[r["name"]]
        lens = [rec["response/length/mean"] for rec in read_log(Path(spec.config.out_dir) / "log.jsonl")
                if isinstance(rec.get("response/length/mean"), (int, float))]
        window = spec.config.collapse_window
        oc = run_outcome(r, window, criterion, fraction)
        over = grid.arms[r["arm"]]
        runs.append({"name": r["name"], "model": r["model"], "arm": r["arm"], "seed": r["seed"], "role": _role(over),
                     "dose_bits": over.get("train_dose_bits"), "dose_scale": over.get("train_dose_scale", 1.0),
                     "steps": r.get("steps", 0), "planned_steps": r.get("planned_steps"),
                     "step0_k3": (r.get("step0") or {}).get("k3"), "reward_first": r.get("reward_first"),
                     "final_reward": r.get("final_reward"), "best_reward": r.get("best_reward"),
                     "first_collapse_step": r.get("first_collapse_step"),
                     "response_length": float(np.mean(lens)) if lens else None, **oc})
    cells = []
    for model in grid.models:
        rs = [r for r in runs if r["model"] == model]
        fit_runs = [r for r in rs if r["scored"] and r["role"] in ("dose", "aligned")]
        fit = fit_threshold([r["step0_k3"] for r in fit_runs], [r["collapsed"] for r in fit_runs])
        lengths = [r["response_length"] for r in rs if r["response_length"] is not None]
        arms = []
        for arm, over in grid.arms.items():
            ar = [r for r in rs if r["arm"] == arm]
            sc = [r for r in ar if r["scored"]]
            k3 = [r["step0_k3"] for r in ar if isinstance(r["step0_k3"], (int, float)) and r["step0_k3"] > 0]
            row = {"arm": arm, "role": _role(over), "overrides": over, "runs": len(ar), "scored": len(sc),
                   "exact": sum(bool(r["exact"]) for r in ar),
                   "collapsed": sum(bool(r["collapsed"]) for r in sc),
                   "reward_collapse": sum(bool(r["reward_collapse"]) for r in sc),
                   "signal": sum(r["signal"] for r in ar if r["steps"]),
                   "step0_k3": stats(k3), "step0_k3_geomean": float(np.exp(np.mean(np.log(k3)))) if k3 else None,
                   "final_reward": stats([r["final_reward"] for r in ar]),
                   "reward_first": stats([r["reward_first"] for r in ar]),
                   "steps": stats([r["steps"] for r in ar])}
            if fit["threshold_k3"] is not None and row["step0_k3_geomean"]:
                row["fitted_p"] = float(curve(fit["threshold_k3"], fit["slope_per_decade"],
                                              np.array([row["step0_k3_geomean"]]))[0])
            arms.append(row)
        at_public = None
        if fit["threshold_k3"] is not None:
            at_public = float(curve(fit["threshold_k3"], fit["slope_per_decade"], np.array([PUBLIC_BF16_K3]))[0])
        cells.append({"model": model, "overrides": grid.models[model], "fit": fit, "arms": arms,
                      "parameters": _parameters(next((s for s in specs.values() if s.model == model), None)),
                      "response_length": stats(lengths), "p_collapse_at_1e-3": at_public,
                      "public_1e-3_vs_interval": _where(PUBLIC_BF16_K3, fit)})
    report = {"criterion": criterion, "fraction": fraction, "cells": cells, "runs": runs,
              "bf16_k3_by_cell": _bf16_trend(cells), "environment": summary.get("environment")}
    plot = _plot(report, out / "plots" / "dose_response.png") if plots else None
    report["plot"] = str(plot) if plot else None
    (out / "dose_report.json").write_text(json.dumps(report, indent=1, default=str, allow_nan=True))
    (out / "dose_report.md").write_text(_markdown(report, out))
    return report


def _parameters(spec) -> int | None:
    """Parameters of a cell's model: the bundled one, its warm-start folder's config, or arch/size."""
    if spec is None:
        return None
    from rla import models

    c = spec.config
    try:
        if c.init == "bundled":
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(str(models.bundled_path()), local_files_only=True)
        elif (Path(c.init) / "config.json").is_file():
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(c.init, local_files_only=True)
        else:
            config = models.tiny_config(c.arch, c.size)
        return int(models.param_count(config))
    except (OSError, ValueError):
        return None


def _where(k3: float, fit: dict) -> str:
    """Where ``k3`` lies against the fitted threshold's interval, in words."""
    lo, hi = fit["interval_k3"]
    if fit["status"] == "no_collapse":
        return "no run collapsed; " + (f"1e-3 is below the 95% lower bound {lo:.2g}" if lo and k3 < lo else
                                       "1e-3 is not excluded as a threshold")
    if fit["status"] == "all_collapse":
        return "every run collapsed; " + (f"1e-3 is above the 95% upper bound {hi:.2g}" if hi and k3 > hi else
                                          "1e-3 is not excluded as a threshold")
    if fit["status"] == "too_few":
        return "not fitted"
    if hi is not None and k3 > hi:
        return "above the threshold's 95% interval: the curve predicts collapse there"
    if lo is not None and k3 < lo:
        return "below the threshold's 95% interval: the curve predicts no collapse there"
    return "inside the threshold's 95% interval: undecided at this sample size"


def _bf16_trend(cells: list[dict]) -> list[dict]:
    """The bf16 arm's step-0 k3 per cell with the cell's mean response length (measured)."""
    out = []
    for c in cells:
        for a in c["arms"]:
            if a["overrides"].get("train_precision") == "bf16" and not a["overrides"].get("train_inv_freq") \
                    and a["step0_k3_geomean"]:
                out.append({"model": c["model"], "arm": a["arm"], "step0_k3_geomean": a["step0_k3_geomean"],
                            "step0_k3": a["step0_k3"], "response_length": c["response_length"]["mean"],
                            "parameters": c["parameters"]})
    return out


def _fmt(v, f=".2e") -> str:
    return "-" if v is None else format(v, f)


def _markdown(report: dict, out: Path) -> str:
    crit = {"reward": f"final reward (mean of the last collapse_window steps) < {report['fraction']:g} x the "
                      "starting reward (mean of the first collapse_window steps)",
            "signal": "docs/metrics.md's collapse signal fired at least once",
            "either": f"the collapse signal fired, or the final reward < {report['fraction']:g} x the starting reward"}
    env = report.get("environment") or {}
    lines = ["# Dose-response: where mismatch becomes collapse", "",
             f"Runs: GPU {env.get('gpu', '?')} · torch {env.get('torch', '?')} · transformers "
             f"{env.get('transformers', '?')}; summarised {env.get('date', '?')}: `{env.get('command', '?')}`", "",
             f"**Collapse** (criterion `{report['criterion']}`): {crit[report['criterion']]}. Columns give both this and "
             "the collapse signal of docs/metrics.md (spike + falling reward, or non-finite). A run needs "
             "2 x collapse_window logged steps to be scored.", "",
             "**Threshold**: P(collapse) = sigmoid(b (log10 k3 - log10 k3_50)), b >= 0, fitted by maximum likelihood "
             "over the dose arms and the aligned arm (the zero dose), each run at its own step-0 k3; the interval is "
             "the 95% profile-likelihood interval of k3_50. Other arms (bf16) are placed on the curve, not fitted.", ""]
    if report.get("plot"):
        lines += [f"![dose response]({Path(report['plot']).relative_to(out)})", ""]
    lines += ["## Thresholds", "", "| cell | response tokens | scored runs | collapses | result | k3_50 | 95% interval "
              "| P(collapse) at k3 = 1e-3 | 1e-3 vs the interval |", "|---|---|---|---|---|---|---|---|---|"]
    for c in report["cells"]:
        f = c["fit"]
        lo, hi = f["interval_k3"]
        iv = "-" if f["status"] == "too_few" else f"[{_fmt(lo, '.2g')}, {_fmt(hi, '.2g')}]"
        lines.append(f"| {c['model']} | {_fmt(c['response_length']['mean'], '.0f')} | {f['n']} | {f['collapses']} | "
                     f"{f['status']} | {_fmt(f['threshold_k3'], '.2g')} | {iv} | {_fmt(c['p_collapse_at_1e-3'], '.2f')} | "
                     f"{c['public_1e-3_vs_interval']} |")
    lines += [""] + [f"- **{c['model']}**: {c['fit']['statement']}" for c in report["cells"]] + [""]
    lines += ["An interval end shown as `-` is not bounded by the data inside the searched range "
              "(two decades beyond the tested k3).", ""]
    for c in report["cells"]:
        lines += [f"## {c['model']}", "", "| arm | role | step-0 k3 (geomean; range) | runs (scored) | collapsed | "
                  "collapse signal | reward start -> final (mean ± std) | steps | fitted P(collapse) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for a in c["arms"]:
            k = a["step0_k3"]
            rng = "-" if k["mean"] is None else f"{_fmt(a['step0_k3_geomean'])}; {k['min']:.1e}-{k['max']:.1e}"
            if a.get("exact"):  # k3 = 0: training logprobs equal to the rollout's bit for bit
                rng = (f"0 (exact) in {a['exact']} of {a['runs']}" if k["mean"] is None else
                       f"{rng} (positive runs); 0 (exact) in {a['exact']}")
            fs, rf = a["final_reward"], a["reward_first"]
            rew = "-" if fs["mean"] is None else (f"{rf['mean']:.3f} -> {fs['mean']:.3f}"
                                                  + (f" ± {fs['std']:.3f}" if fs.get("std") is not None else ""))
            lines.append(f"| {a['arm']} | {a['role']} | {rng} | {a['runs']} ({a['scored']}) | {a['collapsed']}/{a['scored']} | "
                         f"{a['signal']}/{a['runs']} | {rew} | {_fmt(a['steps']['mean'], '.0f')} | "
                         f"{_fmt(a.get('fitted_p'), '.2f')} |")
        lines.append("")
    trend = report["bf16_k3_by_cell"]
    if trend:
        lines += ["## The bf16 arm's step-0 k3 by cell", "",
                  "Measured per cell; no trend is fitted or extrapolated (two lengths and two sizes are two points per "
                  "line, and the long cells use another task).", "",
                  "| cell | parameters | mean response tokens | bf16 step-0 k3 (geomean) | per-seed range |", "|---|---|---|---|---|"]
        lines += [f"| {t['model']} | {_fmt(t['parameters'], ',d')} | {_fmt(t['response_length'], '.0f')} | "
                  f"{_fmt(t['step0_k3_geomean'])} | {t['step0_k3']['min']:.1e}-{t['step0_k3']['max']:.1e} |" for t in trend]
        lines.append("")
    lines += ["## Runs", "", "| run | steps | step-0 k3 | reward start | final | collapsed | signal | first signal step | "
              "not scored because |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        lines.append(f"| {r['name']} | {r['steps']}/{r['planned_steps']} | {_fmt(r['step0_k3'])} | {_fmt(r['reward_first'], '.3f')} | "
                     f"{_fmt(r['final_reward'], '.3f')} | {'-' if r['collapsed'] is None else r['collapsed']} | {r['signal']} | "
                     f"{'-' if r['first_collapse_step'] is None else r['first_collapse_step']} | {r['why'] or '-'} |")
    lines.append("")
    return "\n".join(lines)


def _plot(report: dict, path: Path) -> Path | None:
    """Top row: collapse (0/1 per run) vs step-0 k3 with the fitted curve and the threshold's
    interval; bottom row: final reward vs step-0 k3. One column per cell, shared log x axis."""
    cells = [c for c in report["cells"] if any(r["model"] == c["model"] and r["scored"] for r in report["runs"])]
    if not cells:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(cells), figsize=(5.2 * len(cells), 7.5), squeeze=False, sharex=True,
                             constrained_layout=True)
    xs = [r["step0_k3"] for r in report["runs"] if r["scored"] and r["step0_k3"] > 0]
    if not xs:
        return None
    xlo, xhi = min(xs) / 2.5, max(xs) * 2.5
    if any(r["scored"] and r["exact"] for r in report["runs"]):
        xlo /= 4  # room at the left edge for the runs with k3 = 0 (exact)
    style = {"dose": ("o", "tab:red"), "aligned": ("s", "tab:green"), "other": ("D", "tab:blue")}
    # dose arms light to dark red by their k3 (geometric mean over the grid's runs), named in the legend
    dose_k3: dict[str, list[float]] = {}
    for r in report["runs"]:
        if r["role"] == "dose" and r["scored"]:
            dose_k3.setdefault(r["arm"], []).append(math.log(r["step0_k3"]))
    ranked = sorted(dose_k3, key=lambda a: np.mean(dose_k3[a]))
    reds = plt.get_cmap("Reds")
    dose_color = {a: reds(0.35 + 0.6 * i / max(1, len(ranked) - 1)) for i, a in enumerate(ranked)}
    other_colors = ["tab:blue", "tab:purple", "tab:orange", "tab:brown", "tab:olive", "tab:cyan"]
    other_arms = sorted({r["arm"] for r in report["runs"] if r["role"] == "other"})
    rng = np.random.default_rng(0)
    for j, c in enumerate(cells):
        top, bottom = axes[0, j], axes[1, j]
        f = c["fit"]
        grid = np.logspace(math.log10(xlo), math.log10(xhi), 300)
        lo, hi = f["interval_k3"]
        if f["status"] in ("fit", "separated", "no_collapse", "all_collapse"):
            top.axvspan(lo or xlo, hi or xhi, color="0.85", zorder=0,
                        label="95% interval of k3_50" if f["status"] in ("fit", "separated") else "95% bound of k3_50")
        if f["threshold_k3"] is not None:
            top.plot(grid, curve(f["threshold_k3"], f["slope_per_decade"], grid), color="k", lw=1.5,
                     label=f"fit: k3_50 = {f['threshold_k3']:.2g}")
        for ax in (top, bottom):
            ax.axvline(PUBLIC_BF16_K3, color="0.4", ls=":", lw=1)
        top.text(PUBLIC_BF16_K3, 1.13, " public bf16 reports ~1e-3", fontsize=7, color="0.3", va="bottom")
        seen = set()
        for r in report["runs"]:
            if r["model"] != c["model"] or not r["scored"]:
                continue
            marker, color = style[r["role"]]
            if r["role"] == "dose":
                color = dose_color[r["arm"]]
            elif r["role"] == "other":
                color = other_colors[other_arms.index(r["arm"]) % len(other_colors)]
            label = r["arm"]
            lab = label if label not in seen else None
            seen.add(label)
            jitter = rng.uniform(-0.04, 0.04)
            # k3 = 0 has no place on a log axis: drawn hollow at the left edge, named in the legend
            x, face = (xlo * 1.15, "none") if r["exact"] else (r["step0_k3"], color)
            if r["exact"] and lab:
                lab = f"{lab} (k3 = 0 exactly: at the left edge)"
            top.scatter(x, float(r["collapsed"]) + jitter, marker=marker, facecolors=face, edgecolors=color, s=28,
                        alpha=0.8, label=lab, zorder=3)
            bottom.scatter(x, r["final_reward"], marker=marker, facecolors=face, edgecolors=color, s=28, alpha=0.8,
                           zorder=3)
        top.set_xscale("log")
        top.set_xlim(xlo, xhi)
        top.set_ylim(-0.12, 1.25)
        top.set_yticks([0, 0.5, 1])
        top.set_yticklabels(["survived", "0.5", "collapsed"])
        top.set_title(f"{c['model']} (~{_fmt(c['response_length']['mean'], '.0f')} tokens): {f['status']}", fontsize=10)
        top.grid(alpha=0.3)
        handles, labels = top.get_legend_handles_labels()
        order = sorted(range(len(labels)), key=lambda i: (not labels[i].startswith("aligned"), labels[i] in ranked,
                                                          ranked.index(labels[i]) if labels[i] in ranked else 0))
        top.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=7, loc="center left")
        bottom.set_xlabel("step-0 k3 of the run (log)")
        bottom.set_ylabel("final reward (mean of last window)")
        bottom.set_ylim(-0.03, 1.0)
        bottom.grid(alpha=0.3)
    fig.suptitle(f"GRPO collapse vs train/rollout mismatch (criterion: {report['criterion']})", fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
