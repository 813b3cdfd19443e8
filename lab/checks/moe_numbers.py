"""Recomputations for ``results/experiments/moe_routing_h200_2026-12-02`` (issue #32 item 4: the MoE routing
experiment, 5 arms x 3 seeds, stopped by the time limit at 17-18 of 60 steps).

The runs are read as ``rla experiment GRID --out DIR --summarize-only`` reads them (``experiment_numbers.runs``:
the grid, each run's log, ``rla.rl.runlog.summarize``; statistics over seeds with ``rla.rl.experiment_summary.stats``:
mean and **sample** std, ddof=1); the calls from their logs; the op counts from ``decode_ops.json``
(``lab/grpo/moe/decode_ops.py``).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from experiment_numbers import GRPO, arm, mean, runs, st

MOE = "results/experiments/moe_routing_h200_2026-12-02"
#: the same grid run to its 60 steps in one call (``results/experiments/moe_routing60_h200_2026-12-02``); the
#: table and ratio functions below take either folder
MOE60 = "results/experiments/moe_routing60_h200_2026-12-02"
ARMS = ("bf16", "aligned", "router", "replay", "router-replay")
MODEL = "qwen3moe-36m"
REWARD_COLLAPSE_FRACTION = 0.5  # rla.rl.experiment_summary's reward criterion: final < 0.5 x first


def _arm(root: Path, name: str, folder: str = MOE) -> list[dict]:
    return arm(root, folder, MODEL, name)


def _pct(v: float) -> float:
    return 100 * v


def _collapsed(table: dict) -> int:
    """Runs collapsed by either criterion (signal, reward) over the arms of a ``moe_table``."""
    return sum(table[(a,)][5][0] + table[(a,)][6][0] for a in ARMS)


def _ms(v):
    return [v["mean"], v["std"]]


# ---------------------------------------------------------------- the tables

def moe_table(root: Path, folder: str = MOE) -> dict:
    """per arm: logged steps min-max; step-0 k3 mean ± std; k3 over training (mean); final reward mean ± std;
    best 5-step reward (mean); seeds whose collapse signal fired / seeds; seeds with final < 0.5 x first / seeds."""
    out = {}
    for name in ARMS:
        rs = _arm(root, name, folder)
        steps = [r["steps"] for r in rs]
        out[(name,)] = [[min(steps), max(steps)], _ms(st([r["step0"]["k3"] for r in rs])),
                        mean([r["mismatch_mean"]["k3"] for r in rs]), _ms(st([r["final_reward"] for r in rs])),
                        mean([r["best_reward"] for r in rs]), [sum(bool(r["collapse_events"]) for r in rs), len(rs)],
                        [sum(r["final_reward"] < REWARD_COLLAPSE_FRACTION * r["reward_first"] for r in rs), len(rs)]]
    return out


def moe_routing_table(root: Path, folder: str = MOE) -> dict:
    """per arm, in percent of routed tokens whose expert set differs from the rollout's: step 0 per layer (mean over
    seeds); step-0 layer mean and any-layer share (mean ± std); both over training (mean over seeds of each run's
    mean over steps)."""
    out = {}
    for name in ARMS:
        rs = _arm(root, name, folder)
        per = [r["step0"]["routing_set_differs"] for r in rs]
        layers = [_pct(mean([p[i] for p in per])) for i in range(len(per[0]))]
        m0 = st([r["step0"]["routing_set_differs_mean"] for r in rs])
        a0 = st([r["step0"]["routing_any_layer_set_differs"] for r in rs])
        out[(name,)] = [*layers, [_pct(m0["mean"]), _pct(m0["std"])], [_pct(a0["mean"]), _pct(a0["std"])],
                        _pct(mean([r["mismatch_mean"]["routing_set_differs_mean"] for r in rs])),
                        _pct(mean([r["mismatch_mean"]["routing_any_layer_set_differs"] for r in rs]))]
    return out


def moe_routing_layers_over_training(root: Path, folder: str = MOE) -> dict:
    """per arm and layer, in percent: routing/set_differs averaged over every logged step of a run (step 0
    included, as rla.rl.runlog.summarize averages), then over seeds."""
    out = {}
    for name in ARMS:
        rs = _arm(root, name, folder)
        per_run = [[statistics.fmean(x["routing/set_differs"][i] for x in r["records"]) for i in range(7)] for r in rs]
        out[(name,)] = [_pct(mean([p[i] for p in per_run])) for i in range(7)]
    return out


def moe_first_layer(root: Path) -> list:
    """the largest layer-0 routing/set_differs (%) over every logged step of aligned's and of router's runs; their
    log lines together."""
    recs = {a: [x for r in _arm(root, a) for x in r["records"]] for a in ("aligned", "router")}
    return [_pct(max(x["routing/set_differs"][0] for x in recs[a])) for a in recs] + [sum(map(len, recs.values()))]


def _later_steps(rs: list[dict]) -> list[dict]:
    return [x for r in rs for x in r["records"][1:]]  # step 0 also compiles and warms up


def moe_timing_table(root: Path, folder: str = MOE) -> dict:
    """per arm, medians over the steps after step 0 of its 3 runs: time/rollout_s, time/train_s, time/sync_s,
    time/step_s; ms per decode step = 1000 time/rollout_s / response/length/max."""
    out = {}
    for name in ARMS:
        xs = _later_steps(_arm(root, name, folder))
        med = lambda k: statistics.median(x[k] for x in xs)  # noqa: E731
        out[(name,)] = [med("time/rollout_s"), med("time/train_s"), med("time/sync_s"), med("time/step_s"),
                        statistics.median(1000 * x["time/rollout_s"] / x["response/length/max"] for x in xs)]
    return out


# ---------------------------------------------------------------- prose

def _call_log(root: Path, name: str) -> str:
    return (root / MOE / "logs" / name).read_text()


def _elapsed_s(text: str) -> int:
    h, m, s = map(int, re.findall(r"(\d+):(\d\d):(\d\d)\s*$", text.split("runs finished")[0].strip(), re.M)[-1])
    return 3600 * h + 60 * m + s


def moe_calls(root: Path) -> list:
    """call 1: runs that failed with exit 2, its bar's elapsed seconds, GPU tests skipped; call 2: logged / planned
    steps (the bar), its elapsed seconds, GPU tests passed; steps per run min-max."""
    c1, c2 = _call_log(root, "call1_experiment.log"), _call_log(root, "call2_experiment.log")
    t1, t2 = _call_log(root, "call1_gpu_tests.log"), _call_log(root, "call2_gpu_tests.log")
    done, planned = map(int, re.search(r"(\d+)/(\d+) \d+:\d\d:\d\d", c2).groups())
    steps = [r["steps"] for r in runs(root, MOE)]
    return [c1.count("failed (exit 2)"), _elapsed_s(c1), int(re.search(r"(\d+) skipped", t1).group(1)),
            done, planned, _elapsed_s(c2), int(re.search(r"(\d+) passed", t2).group(1)), min(steps), max(steps)]


def moe_warm_start(root: Path) -> list:
    """call 2's warm start (init/*/sft.json): steps_done, wall_time_s, last greedy and sampled accuracy; call 1's
    (its log's last eval line): step, greedy, sampled."""
    h = json.loads((root / MOE / "init" / MODEL / "sft.json").read_text())["history"]
    ev = h["evals"][-1]
    step, greedy, sampled = re.findall(r"eval step (\d+): greedy ([\d.]+) sampled\(T=1\) ([\d.]+)",
                                       _call_log(root, "call1_warm_start.out"))[-1]
    return [h["steps_done"], h["wall_time_s"], ev["greedy_acc"], ev["sample_acc"], int(step), float(greedy),
            float(sampled)]


def _k3(root, name, kind="step0", folder=MOE):
    return mean([r[kind]["k3"] for r in _arm(root, name, folder)])


def moe_k3_ratios(root: Path, folder: str = MOE) -> list:
    """ratio of means over seeds, bf16 / arm, of step-0 k3: aligned, router, replay, router-replay; then of k3 over
    training, same order."""
    k = lambda a, kind="step0": _k3(root, a, kind, folder)  # noqa: E731
    return [k("bf16") / k(a) for a in ARMS[1:]] + [k("bf16", "mismatch_mean") / k(a, "mismatch_mean") for a in ARMS[1:]]


def _route(root, name, kind="step0", folder=MOE):
    return mean([r[kind]["routing_set_differs_mean"] for r in _arm(root, name, folder)])


def moe_routing_ratios(root: Path, folder: str = MOE) -> list:
    """bf16 / arm of the routing layer mean (ratio of means over seeds): step 0 aligned, router; over training
    aligned, router."""
    r = lambda a, kind="step0": _route(root, a, kind, folder)  # noqa: E731
    return [r("bf16") / r("aligned"), r("bf16") / r("router"),
            r("bf16", "mismatch_mean") / r("aligned", "mismatch_mean"), r("bf16", "mismatch_mean") / r("router", "mismatch_mean")]


def moe_bf16_seeds(root: Path, folder: str = MOE) -> list:
    """bf16's step-0 k3 per seed (0, 1, 2); per seed 100 (1 - replay / bf16) of step-0 k3 (same seed: same
    warm start, same rollout seed); seed 0's step-0 mismatch/abs/max (nats)."""
    b = {r["seed"]: r["step0"]["k3"] for r in _arm(root, "bf16", folder)}
    rp = {r["seed"]: r["step0"]["k3"] for r in _arm(root, "replay", folder)}
    s0 = next(r for r in _arm(root, "bf16", folder) if r["seed"] == 0)["records"][0]["mismatch/abs/max"]
    return [b[s] for s in (0, 1, 2)] + [100 * (1 - rp[s] / b[s]) for s in (0, 1, 2)] + [s0]


def moe_reward(root: Path, folder: str = MOE) -> list:
    """mean over the 15 runs of reward_first and final_reward (5-step means); min and max over the four other arms
    of (arm mean - bf16 mean) final reward / bf16's sample std."""
    rs = runs(root, folder)
    b = st([r["final_reward"] for r in _arm(root, "bf16", folder)])
    z = [(mean([r["final_reward"] for r in _arm(root, a, folder)]) - b["mean"]) / b["std"] for a in ARMS[1:]]
    return [mean([r["reward_first"] for r in rs]), mean([r["final_reward"] for r in rs]), min(z), max(z)]


def _dense_ms_per_decode_step(root: Path) -> float:
    xs = _later_steps([r for r in runs(root, GRPO) if r["model"] == "qwen2-tiny"])
    return statistics.median(1000 * x["time/rollout_s"] / x["response/length/max"] for x in xs)


def moe_decode_ops(root: Path) -> list:
    """decode_ops.json, top-level aten ops per decode step: the MoE sampler at 128 rows, the dense one at 128, their
    ratio, the MoE at 1 and 8 rows; host-blocking ops on CUDA (nonzero, _local_scalar_dense) per decode step, MoE then
    dense; the dense qwen2-tiny's median ms per decode step in the 2026-11-29 GRPO run (its logs, steps 1+), that
    times the op ratio; the MoE runs' median ms per decode step (all arms, steps 1+) and its ratio to the scaled one."""
    rows = {(r["arch"], r["batch"]): r for r in json.loads((root / MOE / "decode_ops.json").read_text())["rows"]}
    moe, dense = rows[("qwen3_moe", 128)], rows[("qwen2", 128)]
    ratio = moe["top_level_aten_ops"] / dense["top_level_aten_ops"]
    dense_ms = _dense_ms_per_decode_step(root)
    xs = _later_steps(runs(root, MOE))
    moe_ms = statistics.median(1000 * x["time/rollout_s"] / x["response/length/max"] for x in xs)
    return [moe["top_level_aten_ops"], dense["top_level_aten_ops"], ratio, rows[("qwen3_moe", 1)]["top_level_aten_ops"],
            rows[("qwen3_moe", 8)]["top_level_aten_ops"], moe["blocking_on_cuda_total"], dense["blocking_on_cuda_total"],
            dense_ms, dense_ms * ratio, moe_ms, moe_ms / (dense_ms * ratio)]


def moe_step_time(root: Path, folder: str = MOE) -> list:
    """over every step after step 0 of the 15 runs: median time/step_s, median time/rollout_s, the rollout's share of
    the summed step time (%), median response/length/max."""
    xs = _later_steps(runs(root, folder))
    return [statistics.median(x["time/step_s"] for x in xs), statistics.median(x["time/rollout_s"] for x in xs),
            100 * sum(x["time/rollout_s"] for x in xs) / sum(x["time/step_s"] for x in xs),
            statistics.median(x["response/length/max"] for x in xs)]


def moe_index(root: Path) -> list:
    """for the README and the results index: steps min-max; routing step-0 layer mean bf16, aligned, router (%);
    step-0 k3 ratio bf16 / router-replay; seeds collapsed by either criterion over all runs; median step seconds."""
    t, calls = moe_table(root), moe_calls(root)
    rt = moe_routing_table(root)
    collapsed = _collapsed(t)
    return [calls[7], calls[8], rt[("bf16",)][7][0], rt[("aligned",)][7][0], rt[("router",)][7][0],
            moe_k3_ratios(root)[3], collapsed, moe_step_time(root)[0]]


def moe_predictions(root: Path) -> list:
    """PREDICTIONS.md's quantities, in its order: (1) bf16 step-0 per-layer min, max, any-layer share (%); (2) bf16 /
    aligned layer mean, aligned per-layer min, max (%); (3) router and aligned layer means, router per-layer max (%);
    (4) the largest per-layer value over every logged step of both replay arms (%), their log lines; (5) step-0 k3
    means bf16, aligned, router, replay, router-replay and bf16 / replay; (6) runs collapsed by either criterion, runs;
    (7) min, max over the four arms of (mean - bf16 mean) final reward / bf16 sample std; cost: the warm start's
    wall_time_s, the median time/step_s."""
    rt, t = moe_routing_table(root), moe_table(root)
    layers = lambda a: rt[(a,)][:7]  # noqa: E731
    replay = [x for a in ("replay", "router-replay") for r in _arm(root, a) for x in r["records"]]
    k3 = [_k3(root, a) for a in ARMS]
    collapsed = _collapsed(t)
    reward = moe_reward(root)
    return [min(layers("bf16")), max(layers("bf16")), rt[("bf16",)][8][0],
            _route(root, "bf16") / _route(root, "aligned"), min(layers("aligned")), max(layers("aligned")),
            rt[("router",)][7][0], rt[("aligned",)][7][0], max(layers("router")),
            _pct(max(v for x in replay for v in x["routing/set_differs"])), len(replay),
            *k3, k3[0] / k3[3], collapsed, len(runs(root, MOE)), reward[2], reward[3],
            moe_warm_start(root)[1], moe_step_time(root)[0]]


# ---------------------------------------------------------------- the 60-step run (MOE60)

def moe60_call(root: Path) -> list:
    """logs/moe_experiment.log: steps logged / planned (the progress bar), its elapsed seconds, runs finished / runs,
    the experiment's exit status; steps per run min-max (the logs)."""
    text = (root / MOE60 / "logs" / "moe_experiment.log").read_text()
    done, planned = map(int, re.search(r"(\d+)/(\d+) \d+:\d\d:\d\d", text).groups())
    fin, total = map(int, re.search(r"(\d+)/(\d+) runs finished", text).groups())
    steps = [r["steps"] for r in runs(root, MOE60)]
    return [done, planned, _elapsed_s(text), fin, total, int(re.search(r"exp rc=(\d+)", text).group(1)),
            min(steps), max(steps)]


def moe60_warm_start(root: Path) -> list:
    """init/*/sft.json: steps_done, wall_time_s, the last evaluation's greedy and sampled accuracy."""
    h = json.loads((root / MOE60 / "init" / MODEL / "sft.json").read_text())["history"]
    ev = h["evals"][-1]
    return [h["steps_done"], h["wall_time_s"], ev["greedy_acc"], ev["sample_acc"]]


def moe60_predictions(root: Path) -> list:
    """PREDICTIONS.md's quantities in its order: (1) the bar's elapsed minutes, the warm start's wall_time_s; (2) runs
    collapsed by either criterion, runs; (3) step-0 k3 means of the five arms; (4) the routing layer mean over
    training of the five arms (%), the largest per-layer value over every logged step of both replay arms (%), their
    log lines; (5) min, max over the four arms of (mean - bf16 mean) final reward / bf16 sample std."""
    t, rt = moe_table(root, MOE60), moe_routing_table(root, MOE60)
    replay = [x for a in ("replay", "router-replay") for r in _arm(root, a, MOE60) for x in r["records"]]
    reward = moe_reward(root, MOE60)
    return [moe60_call(root)[2] / 60, moe60_warm_start(root)[1],
            _collapsed(t), len(runs(root, MOE60)),
            *[_k3(root, a, folder=MOE60) for a in ARMS], *[rt[(a,)][9] for a in ARMS],
            _pct(max(v for x in replay for v in x["routing/set_differs"])), len(replay), reward[2], reward[3]]


def moe60_index(root: Path) -> list:
    """for the README and the results index: steps min-max; routing layer mean % at step 0 and over training, bf16,
    aligned, router; k3 bf16 / arm (ratio of means) at step 0 for router, router-replay and over training for
    router-replay; runs collapsed by either criterion; median step seconds."""
    t, rt = moe_table(root, MOE60), moe_routing_table(root, MOE60)
    k3 = moe_k3_ratios(root, MOE60)
    collapsed = _collapsed(t)
    call = moe60_call(root)
    return [call[6], call[7], *[rt[(a,)][7][0] for a in ARMS[:3]], *[rt[(a,)][9] for a in ARMS[:3]],
            k3[1], k3[3], k3[7], collapsed, moe_step_time(root, MOE60)[0]]
