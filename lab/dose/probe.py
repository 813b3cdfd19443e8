"""Step-0 mismatch of every arm of a grid, without training: ``python -m lab.dose.experiment GRID --probe``.

A run's first log line holds its step-0 mismatch: the training forward of the initial weights
against the engine's rollouts of step 0. That number needs one rollout batch and one forward, not
a run, so this module measures it for every (model, arm, seed) of a grid in one process: the
rollouts of step 0 are sampled once per (model, seed, rollout settings) exactly as the trainer
samples them (same prompts, same sampling seed, same engine copy), and every arm's training forward
(``rla.rl.precision.Policy``, the trainer's own) scores them. The k3 it reports is the number the
run's ``log.jsonl`` would record at step 0 on the same machine (``tests/lab/test_dose_experiment.py`` checks that
against a 1-step run).

Used to calibrate the dose knob (``train_dose_bits``, ``lab.dose.knob``) before spending GPU time:
``probe.json`` / ``probe.md`` in the output folder list the step-0 k3 of every arm.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rla.rl.grid import Grid, RunSpec, matches_only

from lab.dose.grid import DoseGrid
from lab.dose.report import is_dose_arm

__all__ = ["probe_step0", "probe_markdown", "pick_doses", "check_pick"]

#: Config fields that decide the step-0 rollouts (arms that agree on them share one batch).
_ROLLOUT_FIELDS = ("init", "arch", "size", "task", "difficulty", "task_args", "rollout_profile", "rollout_cache",
                   "rollout_decode_attention",
                   "temperature", "top_p", "top_k", "max_new_tokens", "prompts_per_step", "group_size", "seed",
                   "device", "init_seed")


def _rollout_key(spec: RunSpec) -> str:
    cfg = spec.config
    return json.dumps({**{f: getattr(cfg, f) for f in _ROLLOUT_FIELDS}, "dtype": str(cfg.rollout_torch_dtype())},
                      sort_keys=True, default=str)


@torch.no_grad()
def _score(trainer, spec: RunSpec, ro, ops=None) -> dict[str, Any]:
    """Step-0 mismatch metrics of ``spec``'s training forward (with the ``ops=`` plug ``ops``: the
    arm's dose) on the rollouts ``ro``."""
    from rla.metrics import mismatch
    from rla.rl.forward import make_micro_batch
    from rla.rl.precision import Policy
    from rla.rl.runlog import padded
    from rla.rollout.train_logprobs import micro_batches

    cfg = spec.config
    master = copy.deepcopy(trainer.policy.master)
    policy = Policy(master, precision=cfg.train_precision, rollout_profile=cfg.rollout_profile,
                    align_regions=cfg.align_regions, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                    chunk=cfg.logprob_chunk, dist=trainer.dist, inv_freq=cfg.train_inv_freq, ops=ops)
    n = len(ro.responses)
    lengths = [len(ro.prompts[i]) + len(ro.responses[i]) for i in range(n)]
    before: list[np.ndarray | None] = [None] * n
    for group in micro_batches(lengths, cfg.max_tokens):
        mb = make_micro_batch([ro.prompts[i] for i in group], [ro.responses[i] for i in group], group)
        lp, _ = policy.forward(mb.to(trainer.device))
        for j, piece in zip(group, lp.cpu().split([len(ro.responses[i]) for i in group])):
            before[j] = piece.numpy()
    mu = [t.numpy() for t in ro.rollout_lp]
    keep = [i for i, b in enumerate(before) if np.isfinite(b).all()]
    train_lp, roll_lp, mask, lens = padded([before[i] for i in keep], [mu[i] for i in keep])
    m = mismatch(train_lp, roll_lp, mask, response_lengths=lens)
    return {"k3": m["mismatch/k3"], "abs_mean": m["mismatch/abs/mean"], "clip_leak_0.2": m["mismatch/clip_leak/0.2"],
            "n_tokens": int(m["mismatch/n_tokens"]), "n_seqs": n, "nonfinite_seqs": n - len(keep)}


def probe_step0(grid: DoseGrid, out: str | Path, *, only: str | None = None, seeds: list[int] | None = None,
                say=print) -> dict[str, Any]:
    """Step-0 mismatch of every run of ``grid`` (optionally ``only`` those ``rla.rl.grid.matches_only`` admits,
    and ``seeds`` instead of the grid's), written to ``out/probe.json`` and ``out/probe.md``."""
    from rla.environment import environment
    from rla.rl.trainer import Trainer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    g = dataclasses.replace(grid, seeds=list(seeds) if seeds else grid.seeds)
    specs = [s for s in g.runs(out) if matches_only(s.name, only)]
    groups: dict[str, list[RunSpec]] = {}
    for s in specs:
        groups.setdefault(_rollout_key(s), []).append(s)
    rows, skipped = [], []
    for key, members in groups.items():
        first = members[0].config
        if first.init not in ("bundled", "random") and not Path(first.init).exists():
            skipped += [s.name for s in members]
            say(f"[yellow]{members[0].model}: no initial weights at {first.init} (make the warm start first); "
                f"{len(members)} run(s) not probed[/]")
            continue
        with tempfile.TemporaryDirectory(prefix="rla-probe-") as tmp:
            t0 = time.perf_counter()
            trainer = Trainer(first.replace(out_dir=tmp, progress=False), log=None)
            try:
                ro = trainer._rollout(0)
                t_roll = time.perf_counter() - t0
                for s in members:
                    t1 = time.perf_counter()
                    res = _score(trainer, s, ro, grid.ops_for(s.arm))
                    row = {"name": s.name, "model": s.model, "arm": s.arm, "seed": s.seed,
                           "overrides": grid.arms[s.arm], **res,
                           "reward_mean": float(ro.rewards.mean()),
                           "response_length_mean": float(np.mean([len(r) for r in ro.responses])),
                           "rollout_s": t_roll, "score_s": time.perf_counter() - t1}
                    rows.append(row)
                    say(f"{s.name}: step-0 k3 {row['k3']:.3e}  mean |delta| {row['abs_mean']:.3e}")
            finally:
                trainer.close()
    result = {"environment": environment(), "grid": {"base": g.base, "models": g.models, "arms": g.arms,
                                                      "seeds": g.seeds},
              "only": only, "runs": rows, "not_probed": skipped, "arms": _by_arm(rows, g)}
    (out / "probe.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "probe.md").write_text(probe_markdown(result))
    return result


def _by_arm(rows: list[dict], grid: Grid) -> list[dict]:
    from rla.rl.experiment_summary import stats

    out = []
    for model in grid.models:
        for arm in grid.arms:
            rs = [r for r in rows if r["model"] == model and r["arm"] == arm]
            if not rs:
                continue
            k3 = [r["k3"] for r in rs]
            pos = [v for v in k3 if v > 0]
            out.append({"model": model, "arm": arm, "overrides": grid.arms[arm], "seeds": [r["seed"] for r in rs],
                        "k3": stats(k3), "k3_geomean": float(math.exp(np.mean(np.log(pos)))) if len(pos) == len(k3) else None,
                        "abs_mean": stats([r["abs_mean"] for r in rs]),
                        "clip_leak_0.2": stats([r["clip_leak_0.2"] for r in rs]),
                        "response_length_mean": stats([r["response_length_mean"] for r in rs])})
    return out


def probe_markdown(result: dict) -> str:
    env = result["environment"]
    lines = ["# Step-0 mismatch per arm (python -m lab.dose.experiment --probe)", "",
             f"{env.get('date')} · `{env.get('command')}` · GPU: {env.get('gpu') or 'none (CPU)'} · torch "
             f"{env.get('torch')} · transformers {env.get('transformers')}", "",
             "k3 of the training forward of the initial weights against the engine's step-0 rollouts, per seed "
             "(the rollouts of seed s are the run's own); mean and sample std (ddof=1) over seeds, and the "
             "geometric mean.", "",
             "| model | arm | overrides | seeds | step-0 k3 (mean ± std) | geomean | per seed | mean abs delta | "
             "clip leak 0.2 | response tokens |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for a in result["arms"]:
        per = [r["k3"] for r in result["runs"] if r["model"] == a["model"] and r["arm"] == a["arm"]]
        k3, am = a["k3"], a["abs_mean"]
        sd = f" ± {k3['std']:.2e}" if k3.get("std") is not None else ""
        gm = "-" if a["k3_geomean"] is None else f"{a['k3_geomean']:.2e}"
        lines.append(f"| {a['model']} | {a['arm']} | `{json.dumps(a['overrides'])}` | {len(a['seeds'])} | "
                     f"{k3['mean']:.2e}{sd} | {gm} | {', '.join(f'{v:.2e}' for v in per)} | {am['mean']:.2e} | "
                     f"{a['clip_leak_0.2']['mean']:.4f} | {a['response_length_mean']['mean']:.0f} |")
    if result.get("not_probed"):
        lines += ["", f"Not probed (no initial weights): {', '.join(result['not_probed'])}"]
    return "\n".join(lines) + "\n"


def check_pick(grid: Grid, targets: list[float], only: str | None = None) -> None:
    """Refuse a ``--pick-doses`` that cannot be met, before any probing: targets must be positive and
    finite, the probed runs one model's, and the grid must have at least as many dose arms as targets."""
    if not targets or not all(math.isfinite(t) and t > 0 for t in targets):
        raise ValueError(f"--pick-doses: step-0 k3 targets must be positive numbers, got {targets}")
    if len(set(targets)) != len(targets):
        raise ValueError(f"--pick-doses: the targets repeat ({targets})")
    models = sorted({s.model for s in grid.runs(Path(".")) if matches_only(s.name, only)})
    if len(models) != 1:
        raise ValueError(f"--pick-doses picks arms for one model; the probed runs are of {models or 'none'} "
                         "(select one with --only MODEL__)")
    doses = [a for a, over in grid.arms.items() if is_dose_arm(over)]
    if len(doses) < len(targets):
        raise ValueError(f"--pick-doses: {len(targets)} target(s) but only {len(doses)} dose arm(s) "
                         f"(arms with train_dose_bits) in the grid: {doses}")


def pick_doses(result: dict[str, Any], grid: Grid, targets: list[float]) -> tuple[dict, list[dict]]:
    """The grid's arms for a run: every non-dose arm, and for each step-0 k3 target a dose arm, each
    arm used once, in order: the smallest target gets the smallest picked k3, and so on.

    Among all such order-preserving assignments of targets to the probed dose arms (by geometric-mean
    k3) it takes the one with the least total distance in decades (dynamic programming), so a target
    with no arm near it takes the arm next in line rather than one from the far end. Returns the arms
    mapping (non-dose arms first, then the picked doses by increasing k3) and one row per target
    (target, arm, probed geomean k3, signed distance in decades)."""
    probed = {a["arm"]: a["k3_geomean"] for a in result["arms"]
              if is_dose_arm(grid.arms.get(a["arm"], {})) and a["k3_geomean"]}
    if len(probed) < len(targets):
        raise ValueError(f"--pick-doses: {len(targets)} target(s) but {len(probed)} dose arm(s) with a probed, "
                         f"positive k3 ({sorted(probed)})")
    order = sorted(range(len(targets)), key=lambda i: targets[i])
    names = sorted(probed, key=probed.get)
    n, m = len(order), len(names)
    dist = [[abs(math.log10(probed[a]) - math.log10(targets[i])) for a in names] for i in order]
    inf = float("inf")
    # best[i][j]: least total distance placing the i smallest targets on arms among the j smallest
    best = [[0.0] * (m + 1)] + [[inf] * (m + 1) for _ in range(n)]
    for i in range(1, n + 1):
        for j in range(i, m + 1):
            best[i][j] = min(best[i][j - 1], best[i - 1][j - 1] + dist[i - 1][j - 1])
    chosen: dict[int, str] = {}
    i, j = n, m
    while i > 0:
        if j > i and best[i][j] == best[i][j - 1]:
            j -= 1
            continue
        chosen[order[i - 1]] = names[j - 1]
        i, j = i - 1, j - 1
    rows = [{"target": t, "arm": chosen[i], "k3_geomean": probed[chosen[i]],
             "decades_off": math.log10(probed[chosen[i]]) - math.log10(t)} for i, t in enumerate(targets)]
    arms = {a: over for a, over in grid.arms.items() if not is_dose_arm(over)}
    for row in sorted(rows, key=lambda r: r["k3_geomean"]):
        arms[row["arm"]] = grid.arms[row["arm"]]
    return arms, rows
