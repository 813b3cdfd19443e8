"""``summary.json``, ``summary.md`` and plots of an experiment folder, recomputed from its run logs.

Statistics over seeds, named everywhere they are printed: the mean, the **sample** standard
deviation (``ddof=1``; ``None`` for a single seed, where it is undefined) and the per-seed range
(min, max). The environment block names both the machine each run recorded in its own
``summary.json`` (the one that produced the numbers) and the machine that summarised.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rla.environment import environment
from rla.rl.grid import Grid, is_finished, load_grid
from rla.rl.runlog import read_log, summarize

__all__ = ["stats", "summarize_grid"]


def stats(values: list) -> dict[str, float | None]:
    """mean, sample std (ddof=1), min, max and n of the finite numbers in ``values``."""
    import numpy as np

    vals = np.array([v for v in values if isinstance(v, (int, float))], dtype=float)
    vals = vals[np.isfinite(vals)]
    if not vals.size:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    std = float(vals.std(ddof=1)) if vals.size > 1 else None
    return {"mean": float(vals.mean()), "std": std, "min": float(vals.min()),
            "max": float(vals.max()), "n": int(vals.size)}


def summarize_grid(out: str | Path, grid: Grid | None = None, plots: bool = True) -> dict:
    """``summary.json``, ``summary.md`` and ``plots/`` of an experiment folder, from its logs; ``plots=False``:
    no figures drawn (a check that reads the numbers only), ``summary["plots"]`` empty."""
    from rla.rl.plots import ROUTING_PANELS, plot_arms

    out = Path(out)
    if grid is None:
        grid = load_grid(out / "grid.yaml")
    runs, by_model, run_envs = [], {}, []
    for s in grid.runs(out):
        run_dir = Path(s.config.out_dir)
        records = read_log(run_dir / "log.jsonl")
        summ = summarize(records, s.config.collapse_window)
        run_env = _run_environment(run_dir)
        if run_env and run_env not in run_envs:
            run_envs.append(run_env)
        runs.append({"name": s.name, "model": s.model, "arm": s.arm, "seed": s.seed,
                     "finished": is_finished(run_dir, s.config.steps), "planned_steps": s.config.steps, **summ})
        by_model.setdefault(s.model, {}).setdefault(s.arm, []).append(records)
    arms = []
    for model in grid.models:
        for arm in grid.arms:
            rs = [r for r in runs if r["model"] == model and r["arm"] == arm]
            got = [r for r in rs if r["steps"]]
            arms.append({
                "model": model, "arm": arm, "overrides": grid.arms[arm], "seeds": len(rs),
                "seeds_with_logs": len(got), "seeds_finished": sum(r["finished"] for r in rs),
                "step0_k3": stats([r["step0"]["k3"] for r in got]),
                "step0_abs_mean": stats([r["step0"]["abs_mean"] for r in got]),
                "step0_clip_leak_0.2": stats([r["step0"]["clip_leak_0.2"] for r in got]),
                "k3_over_training": stats([r["mismatch_mean"]["k3"] for r in got]),
                "abs_mean_over_training": stats([r["mismatch_mean"]["abs_mean"] for r in got]),
                "final_reward": stats([r["final_reward"] for r in got]),
                "best_reward": stats([r["best_reward"] for r in got]),
                "seeds_with_collapse": sum(bool(r["collapse_events"]) for r in got),
                "collapse_events": sum(len(r["collapse_events"]) for r in got),
                "first_collapse_steps": [r["first_collapse_step"] for r in got if r["first_collapse_step"] is not None],
                "wall_time_s": stats([r["wall_time_s"] for r in got]),
                "peak_memory_mb": stats([r["peak_memory_mb"] for r in got]),
                "seeds_with_reward_collapse": sum(_reward_collapsed(r) for r in got),
                **_routing_columns(got),
            })
    figures, plots = plots, {}
    for model, arm_logs in (by_model.items() if figures else ()):
        if any(rec for logs in arm_logs.values() for rec in logs):
            plots[model] = str(plot_arms(arm_logs, out / "plots" / f"{model}.png",
                                         title=f"{model}: GRPO, rollouts {grid.base.get('rollout_profile', 'vllm')} bf16"))
        if any("routing/set_differs_mean" in r for logs in arm_logs.values() for rec in logs for r in rec):
            plots[f"{model} routing"] = str(plot_arms(
                arm_logs, out / "plots" / f"{model}_routing.png", panels=ROUTING_PANELS,
                title=f"{model}: routing, training forward vs rollouts {grid.base.get('rollout_profile', 'vllm')}"))
    summary = {"environment": _producing_environment(run_envs, environment()), "run_environments": run_envs,
               "grid": {"base": grid.base, "models": grid.models, "arms": grid.arms, "seeds": grid.seeds},
               "arms": arms, "relative": _relative(arms, grid), "runs": runs, "plots": plots}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str, allow_nan=True))
    (out / "summary.md").write_text(_markdown(summary, out))
    return summary


#: The reward criterion of collapse (as the dose study's, lab/dose/report.py): the mean reward of the
#: last collapse_window steps below this fraction of the mean of the first collapse_window.
REWARD_COLLAPSE_FRACTION = 0.5


def _reward_collapsed(run: dict) -> bool:
    first, final = run.get("reward_first"), run.get("final_reward")
    return first is not None and final is not None and final < REWARD_COLLAPSE_FRACTION * first


def _routing_columns(runs: list[dict]) -> dict[str, Any]:
    """An MoE arm's routing over seeds (``rla.rl.routes``' ``routing/*``): step 0 per layer (mean
    over seeds of each layer's fraction), its layer mean and any-layer fraction, and both averaged
    over training. {} for a dense arm (no run logged routing)."""
    per_layer = [r["step0"].get("routing_set_differs") for r in runs]
    per_layer = [p for p in per_layer if isinstance(p, list)]
    if not per_layer:
        return {}
    layers = min(len(p) for p in per_layer)
    return {
        "step0_routing_set_differs_per_layer": [stats([p[i] for p in per_layer])["mean"] for i in range(layers)],
        "step0_routing_set_differs_mean": stats([r["step0"].get("routing_set_differs_mean") for r in runs]),
        "step0_routing_any_layer_set_differs": stats([r["step0"].get("routing_any_layer_set_differs") for r in runs]),
        "routing_set_differs_mean_over_training": stats([r["mismatch_mean"].get("routing_set_differs_mean")
                                                         for r in runs]),
        "routing_any_layer_set_differs_over_training": stats([r["mismatch_mean"].get("routing_any_layer_set_differs")
                                                              for r in runs]),
    }


def _producing_environment(run_envs: list[dict], here: dict) -> dict[str, Any]:
    """The results' stamp: the GPU and versions the runs recorded, dated and commanded here.

    The numbers come from the runs, so ``gpu``/``torch``/... are theirs (several machines are
    joined with " + "); ``date`` and ``command`` are this summary's; ``summarized_on`` is this
    machine. Runs that recorded nothing give ``"unknown: not recorded by the runs"``.
    """
    env: dict[str, Any] = {"date": here.get("date"), "command": here.get("command")}
    for key in _ENV_KEYS:
        vals = [str(e[key]) if e.get(key) is not None else ("none (CPU)" if key == "gpu" else None)
                for e in run_envs]
        vals = list(dict.fromkeys(v for v in vals if v is not None))
        env[key] = " + ".join(vals) if vals else ("unknown: not recorded by the runs" if not run_envs else None)
    env["summarized_on"] = {k: here.get(k) for k in _ENV_KEYS}
    return env


def _relative(arms: list[dict], grid: Grid) -> list[dict]:
    """Each arm against the model's first arm: ratio of the means over seeds, difference of means.

    ``k3 ratio`` = mean over seeds of the first arm / mean over seeds of this arm (how many times
    smaller); ``reward diff`` = mean(this) - mean(first), also in units of the first arm's sample
    std (ddof=1), so "inside the seed noise" is a number, not a word.
    """
    out = []
    for model in grid.models:
        rows = [a for a in arms if a["model"] == model]
        if not rows:
            continue
        base = rows[0]
        for a in rows[1:]:
            def ratio(key):
                b, m = base[key]["mean"], a[key]["mean"]
                return b / m if b is not None and m else None

            fb, fa, sd = base["final_reward"]["mean"], a["final_reward"]["mean"], base["final_reward"]["std"]
            diff = fa - fb if fa is not None and fb is not None else None
            out.append({"model": model, "arm": a["arm"], "baseline": base["arm"],
                        "step0_k3_ratio_of_means": ratio("step0_k3"),
                        "k3_over_training_ratio_of_means": ratio("k3_over_training"),
                        "final_reward_diff_of_means": diff,
                        "final_reward_diff_in_baseline_std": diff / sd if diff is not None and sd else None})
    return out


#: what tells two runs' machines apart (date, command line and launch parameters differ per run)
_ENV_KEYS = ("gpu", "torch", "cuda", "transformers", "triton", "python")


def _run_environment(run_dir: Path) -> dict[str, Any] | None:
    """The GPU and versions a run recorded in its summary.json, if any."""
    try:
        env = json.loads((run_dir / "summary.json").read_text()).get("environment")
    except (OSError, ValueError):
        return None
    return {k: env.get(k) for k in _ENV_KEYS} if env else None


def _env_line(env: dict[str, Any]) -> str:
    line = f"GPU: {env.get('gpu') or 'none (CPU)'} · torch {env['torch']} · transformers {env['transformers']}"
    if env.get("triton"):
        line += f" · triton {env['triton']}"
    return line + f" · python {env['python']}"


def _fmt(st: dict, digits: str = ".2e") -> str:
    if not st or st.get("mean") is None:
        return "-"
    if st["n"] > 1 and st.get("std") is not None:
        return f"{st['mean']:{digits}} ± {st['std']:{digits}}"
    return f"{st['mean']:{digits}}"


def _routing_markdown(summary: dict, model: str, out: Path) -> list[str]:
    """The MoE routing table of ``model`` (no lines for a dense model)."""
    rows = [a for a in summary["arms"] if a["model"] == model and "step0_routing_set_differs_mean" in a]
    if not rows:
        return []
    layers = max(len(a["step0_routing_set_differs_per_layer"]) for a in rows)
    pct = lambda v: "-" if v is None else f"{100 * v:.2f}"  # noqa: E731
    lines = ["", f"### {model}: routing (training forward vs rollout engine, rla.metrics.routing_mismatch)", "",
             "Tokens (prompt and response, each record's routed tokens) whose set of experts differs from the "
             "rollout's, in percent: per layer at step 0 (mean over seeds), their mean over layers and the share "
             "differing in at least one layer (mean ± sample std over seeds), and both over training. Collapse "
             f"(reward): the final reward (mean of the last collapse_window steps) below {REWARD_COLLAPSE_FRACTION} "
             "times the first (mean of the first collapse_window); the signal column above is docs/metrics.md's.", "",
             "| arm | " + " | ".join(f"L{i}" for i in range(layers)) + " | step-0 mean | step-0 any layer "
             "| mean over training | any layer over training | seeds collapsed (reward) |",
             "|---|" + "---|" * layers + "---|---|---|---|---|"]
    for a in rows:
        per = a["step0_routing_set_differs_per_layer"]
        per = [pct(per[i]) if i < len(per) else "-" for i in range(layers)]
        m = lambda key: _fmt({k: (100 * v if isinstance(v, float) and k in ("mean", "std") else v)  # noqa: E731
                              for k, v in a[key].items()}, ".2f")
        lines.append(f"| {a['arm']} | " + " | ".join(per) + f" | {m('step0_routing_set_differs_mean')} | "
                     f"{m('step0_routing_any_layer_set_differs')} | {m('routing_set_differs_mean_over_training')} | "
                     f"{m('routing_any_layer_set_differs_over_training')} | "
                     f"{a['seeds_with_reward_collapse']}/{a['seeds_with_logs']} |")
    key = f"{model} routing"
    if key in summary["plots"]:
        lines += ["", f"![{key}]({Path(summary['plots'][key]).relative_to(out)})"]
    return lines


def _markdown(summary: dict, out: Path) -> str:
    env = summary["environment"]
    runs_on = summary.get("run_environments") or []
    lines = [
        "# GRPO under rollout/training rounding mismatch",
        "",
        *([f"Runs: {_env_line(e)}" for e in runs_on] or ["Runs: environment not recorded in their summary.json"]),
        "",
        f"Summarized {env['date']} on {_env_line(env['summarized_on'])}: `{env['command']}`",
        "",
        "Step-0 metrics: the training forward before the first update of the first step, against the "
        "rollout engine's logprobs, on identical weights. Over training: the same measurement before each "
        "step's first update, averaged over steps. Values are mean ± sample std (ddof=1) over seeds; the per-seed range is in summary.json (min, max) and the runs table. Collapse: docs/metrics.md's "
        "signal (k3 > 10x its step-0 value or grad norm > 10x its running median, with falling reward).",
        "",
    ]
    for model in summary["grid"]["models"]:
        lines += [f"## {model}", "", "| arm | seeds (done) | step-0 k3 | step-0 mean abs delta | step-0 clip leak 0.2 "
                  "| k3 over training | final reward | best reward | seeds with collapse | wall time (s) | peak MB |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for a in summary["arms"]:
            if a["model"] != model:
                continue
            lines.append(
                f"| {a['arm']} | {a['seeds']} ({a['seeds_finished']}) | {_fmt(a['step0_k3'])} | "
                f"{_fmt(a['step0_abs_mean'])} | {_fmt(a['step0_clip_leak_0.2'], '.3f')} | {_fmt(a['k3_over_training'])} | "
                f"{_fmt(a['final_reward'], '.3f')} | {_fmt(a['best_reward'], '.3f')} | "
                f"{a['seeds_with_collapse']}/{a['seeds_with_logs']} | {_fmt(a['wall_time_s'], '.0f')} | "
                f"{_fmt(a['peak_memory_mb'], '.0f')} |")
        if model in summary["plots"]:
            lines += ["", f"![{model}]({Path(summary['plots'][model]).relative_to(out)})"]
        lines += _routing_markdown(summary, model, out)
        lines.append("")
    rel = summary.get("relative") or []
    if rel:
        lines += ["## Against each model's first arm", "",
                  "Ratio of means: mean over seeds of the first arm / mean over seeds of this arm. Reward: "
                  "difference of the means, and that difference in units of the first arm's sample std.", "",
                  "| model | arm | vs | step-0 k3 ratio | k3-over-training ratio | final reward diff | in std |",
                  "|---|---|---|---|---|---|---|"]
        num = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        for r in rel:
            lines.append(f"| {r['model']} | {r['arm']} | {r['baseline']} | {num(r['step0_k3_ratio_of_means'], '.1f')}x | "
                         f"{num(r['k3_over_training_ratio_of_means'], '.1f')}x | {num(r['final_reward_diff_of_means'], '+.3f')} | "
                         f"{num(r['final_reward_diff_in_baseline_std'], '+.1f')} |")
        lines.append("")
    lines += ["## Arms", ""]
    for name, over in summary["grid"]["arms"].items():
        lines.append(f"- **{name}**: `{json.dumps(over)}`")
    lines += ["", "## Runs", "", "| run | steps | finished | step-0 k3 | final reward | collapse at |", "|---|---|---|---|---|---|"]
    for r in summary["runs"]:
        k3 = r.get("step0", {}).get("k3") if r["steps"] else None
        fr = r.get("final_reward") if r["steps"] else None
        lines.append(f"| {r['name']} | {r['steps']}/{r['planned_steps']} | {r['finished']} | "
                     f"{'-' if k3 is None else f'{k3:.2e}'} | {'-' if fr is None else f'{fr:.3f}'} | "
                     f"{r.get('first_collapse_step') if r.get('first_collapse_step') is not None else '-'} |")
    lines += ["", "Raw logs: `runs/<model>__<arm>__s<seed>/log.jsonl` (one line per step).", ""]
    return "\n".join(lines)

