"""Recomputations for ``results/experiments/dose_response_long_h200_2026-12-01`` (issue #19's long-response cells).

The report is recomputed from the runs' logs by rla's own summariser (``dose_numbers._report``); the
probes from their ``probe.json``; timings from the calls' commands logs and the runs' logs.
"""

from __future__ import annotations

import json
import sys
import re
import statistics
from pathlib import Path

from dose_numbers import DOSE, DOSE_HIGH, M50, _cell, _log, _report, _step0_mean, _window, dose_table

LONG = "results/experiments/dose_response_long_h200_2026-12-01"
TINY = "qwen2-tiny-long"
BIG = "qwen2-50m-long"


def _probe(root: Path, model: str) -> dict:
    return {a["arm"]: a for a in json.loads((root / LONG / "probe" / model / "probe.json").read_text())["arms"]}


def _arms(root: Path, folder: str = LONG, model: str = TINY) -> dict:
    return {a["arm"]: a for a in _cell(root, model, folder)["arms"]}


def _gain(a: dict) -> float:
    return a["final_reward"]["mean"] - a["reward_first"]["mean"]


def _runs(root: Path) -> dict:
    return {r["name"]: r for r in _report(root, LONG)["runs"]}


def _sft(root: Path, model: str) -> dict:
    return json.loads((root / LONG / "init" / model / "sft.json").read_text())["history"]


def _stamps(root: Path, name: str) -> list[tuple[int, str]]:
    """(seconds since the call's start, text) of each line of ``logs/<name>``."""
    return [(int(s), line) for line in (root / LONG / "logs" / name).read_text().splitlines()
            for s in re.findall(r"\((\d+) s, \d{4}-", line)]


# ---------------------------------------------------------------- tables

def long_probe_table(root: Path) -> dict:
    """arm -> the probe's step-0 k3 geomean over 3 seeds, 4M long then 52M long."""
    tiny, big = _probe(root, TINY), _probe(root, BIG)
    return {(arm,): [tiny[arm]["k3_geomean"], big[arm]["k3_geomean"]] for arm in tiny}


def long_table(root: Path) -> dict:
    """as ``dose_numbers.dose_table`` for the 4M long cell, plus the gain (mean final - mean start)."""
    arms = _arms(root)
    return {key: [*vals, _gain(arms[key[0]])] for key, vals in dose_table(root, TINY, LONG).items()}


def long_bf16_cells(root: Path) -> dict:
    """cell -> bf16 and aligned step-0 k3 geomeans (the dose reports; the 52M long cell: its probe)."""
    short, high, long_ = _arms(root, DOSE, "qwen2-tiny"), _arms(root, DOSE_HIGH, M50), _arms(root)
    first = _arms(root, DOSE, M50)
    big = _probe(root, BIG)
    pick = lambda d: [None, d["bf16"]["step0_k3_geomean"], d["aligned"]["step0_k3_geomean"], None]  # noqa: E731
    return {("4M, short",): pick(short), ("52M, short (first warm start)",): pick(first),
            ("52M, short (second warm start)",): pick(high), ("4M, long",): pick(long_),
            ("52M, long",): [None, big["bf16"]["k3_geomean"], big["aligned"]["k3_geomean"], None]}


def _step_times(root: Path, mode: str) -> dict:
    base = root / LONG / "run_group_bench" / mode / "runs"
    return {p.name: [r["time/step_s"] for r in _read(p / "log.jsonl")] for p in sorted(base.iterdir())}


def _read(path: Path) -> list[dict]:
    from rla.rl.runlog import read_log

    return read_log(path)


def _bench(root: Path) -> dict:
    """alone: median step 0 of the thread layout (run serially); proc/group: mean step time of steps 1-2;
    wall: seconds between the commands log's stamps."""
    group, proc = _step_times(root, "group"), _step_times(root, "proc")
    steady = lambda t: statistics.mean(s for v in t.values() for s in v[1:3])  # noqa: E731
    text = (root / LONG / "logs" / "call1_commands.log").read_text()
    starts = [int(s) for s in re.findall(r"== bench \w+: .*?\((\d+) s", text)]
    ends = [int(s) for s in re.findall(r"== bench \w+ exit 0 \((\d+) s", text)]
    return {"alone": statistics.median(v[0] for v in group.values()), "proc": steady(proc), "group": steady(group),
            "n": len(proc), "wall": [e - s for s, e in zip(starts, ends)]}


def long_bench_table(root: Path) -> dict:
    """layout -> steady step time of each run, GPU-time per run-step (/ 7), the command's wall seconds."""
    b = _bench(root)
    return {("one run alone (each run's step 0 in the thread layout, run serially)",): [b["alone"], b["alone"], None],
            ("7 processes (--parallel 7)",): [b["proc"], b["proc"] / b["n"], b["wall"][0]],
            ("7 threads of one process (--runs-per-process 7)",): [b["group"], b["group"] / b["n"], b["wall"][1]]}


# ---------------------------------------------------------------- prose

def long_warm_starts(root: Path) -> list:
    """per model (4M, 52M): SFT steps done, wall seconds, last evaluation's greedy and sampled accuracy."""
    out = []
    for m in (TINY, BIG):
        h = _sft(root, m)
        out += [h["steps_done"], h["wall_time_s"], h["evals"][-1]["greedy_acc"], h["evals"][-1]["sample_acc"]]
    return out


def long_sizes(root: Path) -> list:
    """the 4M model's parameters (the dose report); the 52M model's hidden size and layers (its config)."""
    cfg = json.loads((root / LONG / "init" / BIG / "config.json").read_text())
    return [_cell(root, TINY, LONG)["parameters"], cfg["hidden_size"], cfg["num_hidden_layers"]]


def long_calls(root: Path) -> list:
    """seconds to each call's last stamp (calls 1, 3, 4); call 3's steps logged and planned, runs finished,
    stopped, fewest and most steps of those; call 4's runs finished."""
    last = lambda name: _stamps(root, name)[-1][0]  # noqa: E731
    runs = _runs(root)
    call3 = [r for n, r in runs.items() if not any(a in n for a in ("b1x2", "b1x4"))]
    call4 = [r for n, r in runs.items() if any(a in n for a in ("b1x2", "b1x4"))]
    stopped = [r["steps"] for r in call3 if r["steps"] < 40]
    return [last("call1_commands.log"), last("call3_commands.log"), sum(r["steps"] for r in call3), 40 * len(call3),
            len(call3) - len(stopped), len(stopped), min(stopped), max(stopped), last("call4_commands.log"),
            sum(r["steps"] == 40 for r in call4)]


def _dose_grid_loader(root: Path):
    """``lab.dose.grid.load_dose_grid`` (a dose grid's arms carry the study's keys, which rla refuses)."""
    for path in (str(root / "src"), str(root)):
        if path not in sys.path:
            sys.path.insert(0, path)
    from lab.dose.grid import load_dose_grid

    return load_dose_grid


def long_picks(root: Path) -> list:
    """the dose arms of the two models' picked grids (the probes' picks), once if they are the same."""
    load_grid = _dose_grid_loader(root)
    got = [tuple(a for a in load_grid(root / LONG / "probe" / m / "picked_grid.yaml").arms if a not in ("bf16", "aligned"))
           for m in (TINY, BIG)]
    return [", ".join(got[0]) if got[0] == got[1] else f"{got[0]} vs {got[1]}"]


def long_no_collapse(root: Path) -> list:
    """fitted runs, the 95% lower bound, lower bound / the short 4M k3_50, that k3_50; b1x4's probe mean |delta|."""
    fit = _cell(root, TINY, LONG)["fit"]
    assert fit["status"] == "no_collapse", fit["status"]
    k50 = _cell(root, "qwen2-tiny")["fit"]["threshold_k3"]
    lo = fit["interval_k3"][0]
    return [fit["n"], lo, lo / k50, k50, _probe(root, TINY)["b1x4"]["abs_mean"]["mean"]]


def long_max_k3(root: Path) -> list:
    """the largest step-0 k3 of the fitted (dose and aligned) runs."""
    return [max(r["step0_k3"] for r in _report(root, LONG)["runs"] if r["scored"] and r["role"] in ("dose", "aligned"))]


def _collapsed_at(root: Path, arm: str, lo: int = 35, hi: int = 39, window: int = 5) -> int:
    """short 4M cell: seeds whose mean reward over steps lo-hi is below half that of the first ``window`` steps."""
    return sum(_window(root, f"qwen2-tiny__{arm}__s{s}", lo, hi) < 0.5 * _window(root, f"qwen2-tiny__{arm}__s{s}", 0, window - 1)
               for s in range(3))


def long_vs_short_at_40(root: Path) -> list:
    """short 4M cell at step 40: b3 collapsed seeds and k3, b2x0.7 collapsed seeds and k3; here: fitted runs, largest k3."""
    short = _arms(root, DOSE, "qwen2-tiny")
    return [_collapsed_at(root, "b3"), short["b3"]["step0_k3_geomean"], _collapsed_at(root, "b2x0.7"),
            short["b2x0.7"]["step0_k3_geomean"], _cell(root, TINY, LONG)["fit"]["n"], *long_max_k3(root)]


def long_gains(root: Path) -> list:
    """gains: aligned; b2x0.7 (k3); b1 (k3); b1x1.4 (k3); then b1x2's k3 and the gains of b1x2, b1x2.8, b1x4."""
    a = _arms(root)
    k = lambda arm: a[arm]["step0_k3_geomean"]  # noqa: E731
    return [_gain(a["aligned"]), _gain(a["b2x0.7"]), k("b2x0.7"), _gain(a["b1"]), k("b1"), _gain(a["b1x1.4"]), k("b1x1.4"),
            k("b1x2"), _gain(a["b1x2"]), _gain(a["b1x2.8"]), _gain(a["b1x4"])]


def long_at_1e3(root: Path) -> list:
    a = _arms(root)
    return [a["b2x0.7"]["step0_k3_geomean"], _gain(a["b2x0.7"]), a["b2"]["step0_k3_geomean"], _gain(a["b2"])]


def long_bf16(root: Path) -> list:
    """bf16 k3; bf16 / aligned; smallest dose / bf16; smallest dose k3; gains bf16, aligned; final reward mean ± std."""
    a = _arms(root)
    bf, al, d = a["bf16"], a["aligned"], a["b2x0.7"]
    k = lambda x: x["step0_k3_geomean"]  # noqa: E731
    return [k(bf), k(bf) / k(al), k(d) / k(bf), k(d), _gain(bf), _gain(al), bf["final_reward"]["mean"],
            bf["final_reward"]["std"], al["final_reward"]["mean"], al["final_reward"]["std"]]


def long_signal(root: Path) -> list:
    runs = _report(root, LONG)["runs"]
    assert not any(r["collapsed"] for r in runs)
    return [sum(r["signal"] for r in runs), len(runs)]


def long_entropy_grad(root: Path) -> list:
    """aligned runs' step-0 train/entropy and train/grad_norm (mean over seeds): long then short 4M."""
    out = []
    for key in ("train/entropy", "train/grad_norm"):
        out += [_step0_mean(root, TINY, "aligned", key, LONG), _step0_mean(root, "qwen2-tiny", "aligned", key)]
    return out


def long_decades(root: Path) -> list:
    return [_cell(root, "qwen2-tiny")["fit"]["threshold_k3"], _cell(root, TINY, LONG)["fit"]["interval_k3"][0]]


def long_prediction(root: Path) -> list:
    """final reward means of b1x2, b1x2.8, b1x4; where the gain turns negative (b1x2's k3), b1x4's final and k3;
    call 4's mean step time and 40 x it."""
    a = _arms(root)
    steps = [r["time/step_s"] for arm in ("b1x2", "b1x2.8", "b1x4") for s in range(3)
             for r in _log(root, f"{TINY}__{arm}__s{s}", LONG)]
    t = statistics.mean(steps)
    return [a["b1x2"]["final_reward"]["mean"], a["b1x2.8"]["final_reward"]["mean"], a["b1x4"]["final_reward"]["mean"],
            a["b1x2"]["step0_k3_geomean"], a["b1x4"]["final_reward"]["mean"], a["b1x4"]["step0_k3_geomean"], t, 40 * t]


def long_call4_start(root: Path) -> list:
    """call 4's experiment start (UTC hh:mm:ss) from its commands log."""
    text = (root / LONG / "logs" / "call4_commands.log").read_text()
    return [re.search(r"== rla experiment .*?T(\d\d:\d\d:\d\d)Z", text).group(1)]


def long_bf16_trend(root: Path) -> list:
    """bf16 k3: 4M short / 4M long; 4M long / 52M long; 4M short / 52M short, second then first warm start."""
    c = long_bf16_cells(root)
    b = {k[0]: v[1] for k, v in c.items()}
    return [b["4M, short"] / b["4M, long"], b["4M, long"] / b["52M, long"],
            b["4M, short"] / b["52M, short (second warm start)"], b["4M, short"] / b["52M, short (first warm start)"]]


def long_52m_prediction(root: Path) -> list:
    """52M long bf16 probe k3; the warm starts' last greedy accuracy, 52M then 4M; the 52M SFT's wall seconds."""
    return [_probe(root, BIG)["bf16"]["k3_geomean"], _sft(root, BIG)["evals"][-1]["greedy_acc"],
            _sft(root, TINY)["evals"][-1]["greedy_acc"], _sft(root, BIG)["wall_time_s"]]


def _partial_logs(root: Path, model: str) -> list[list[dict]]:
    base = root / LONG / "partial_2026-11-30" / model / "runs"
    return [_read(p / "log.jsonl") for p in sorted(base.iterdir())]


def _partial(root: Path, model: str) -> list[int]:
    return [len(log) for log in _partial_logs(root, model)]


def long_call2(root: Path) -> list:
    """call 2: 52M runs' fewest and most steps, their planned steps, mean step seconds; 4M runs' fewest and most."""
    load_grid = _dose_grid_loader(root)
    logs = _partial_logs(root, BIG)
    big, tiny = [len(log) for log in logs], _partial(root, TINY)
    times = [r["time/step_s"] for log in logs for r in log]
    planned = load_grid(root / LONG / "partial_2026-11-30" / BIG / "grid.yaml").models[BIG]["steps"]
    return [min(big), max(big), planned, statistics.mean(times), min(tiny), max(tiny)]


def long_52m_cost(root: Path) -> list:
    """call 2's steps per GPU (4M, 52M) in its 500 s time limit; call 3's GPU-seconds per 4M step (2 x 530 s over
    its steps), its steps and time limit; what is left per 52M step; 21 x 40 of those."""
    tiny, big = sum(_partial(root, TINY)), sum(_partial(root, BIG))
    call3 = long_calls(root)[2]
    per4 = 2 * 530 / call3
    per52 = (500 - tiny / 2 * per4) / (big / 2)
    return [tiny / 2, big / 2, 500, per4, call3, 530, per52, 21 * 40 * per52]


def long_bench(root: Path) -> list:
    """threads / processes (steady step time); the prediction's 2x over what threads gave (processes / threads);
    one run alone / processes per run-step."""
    b = _bench(root)
    return [b["group"] / b["proc"], 2 * b["group"] / b["proc"], b["alone"] / (b["proc"] / b["n"])]


def long_repro(root: Path) -> list:
    """step-0 k3, call 2 then call 3: b1 seed 0; aligned seed 1 (call 3 / call 2, call 2, call 3)."""
    def k3(folder: str, name: str) -> float:
        return _read(root / LONG / folder / "runs" / name / "log.jsonl")[0]["mismatch/k3"]
    p = f"partial_2026-11-30/{TINY}"
    b2, b3 = k3(p, f"{TINY}__b1__s0"), k3(".", f"{TINY}__b1__s0")
    a2, a3 = k3(p, f"{TINY}__aligned__s1"), k3(".", f"{TINY}__aligned__s1")
    return [b2, b3, a3 / a2, a2, a3]


def long_decode_loop(root: Path) -> list:
    """the 4M graph loop's speedup; 7 threads' per-token tok/s (the threads JSON); one thread's (the main JSON)."""
    res = root / "results" / "benchmarks"
    main = {r["size"]: r for r in json.loads((res / "h200_2026-12-01_decode_loop.json").read_text())["rows"]}
    threads = {r["size"]: r for r in json.loads((res / "h200_2026-12-01_decode_loop_threads7.json").read_text())["rows"]}
    return [main["tiny"]["speedup"], threads["tiny"]["threads_7"]["per_token_tok_per_s"], main["tiny"]["per_token"]["tok_per_s"]]
