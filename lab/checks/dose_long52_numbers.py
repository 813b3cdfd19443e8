"""Recomputations for ``results/experiments/dose_response_long52_h200_2026-12-01`` (issue #19's 52M long cell) and
``results/benchmarks/h200_2026-12-01_decode_attention.md``.

The report is recomputed from the runs' logs by rla's own summariser (``dose_numbers._report``); the bench from
its JSON; the calls from their commands logs.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from dose_numbers import _cell, _log, _report, dose_table
from dose_long_numbers import LONG, _arms as _long_arms, _probe

LONG52 = "results/experiments/dose_response_long52_h200_2026-12-01"
BIG = "qwen2-50m-long"
BENCH = "results/benchmarks/h200_2026-12-01_decode_attention.json"
FAILED = ("bf16__s0", "aligned__s1", "b1x2__s1", "b1__s2", "b1x2__s0")  # call 2's out-of-memory runs


def _arms(root: Path) -> dict:
    return {a["arm"]: a for a in _cell(root, BIG, LONG52)["arms"]}


def _runs(root: Path) -> dict:
    return {r["name"]: r for r in _report(root, LONG52)["runs"]}


def _gain(a: dict) -> float:
    return a["final_reward"]["mean"] - a["reward_first"]["mean"]


def _logs(root: Path, arm: str = "") -> dict[str, list[dict]]:
    return {r: _log(root, r, LONG52) for r in _runs(root) if f"__{arm}__" in r or not arm}


def _bench(root: Path) -> dict:
    return {r["size"]: r for r in json.loads((root / BENCH).read_text())["rows"]}


def _sft(root: Path, folder: str) -> dict:
    return json.loads((root / folder / "init" / BIG / "sft.json").read_text())["history"]


# ---------------------------------------------------------------- the table

def long52_table(root: Path) -> dict:
    """as ``dose_numbers.dose_table`` (an all-exact arm's k3 written as words), plus the gain and the logged
    steps of seeds 0, 1, 2."""
    arms, runs = _arms(root), _runs(root)
    out = {}
    for key, vals in dose_table(root, BIG, LONG52).items():
        a = arms[key[0]]
        if vals[0] is None and a["exact"] == a["runs"]:
            vals[0] = f"0 (exact, {a['exact']} of {a['runs']})"
        out[key] = [*vals, _gain(a), [runs[f"{BIG}__{key[0]}__s{s}"]["steps"] for s in range(3)]]
    return out


# ---------------------------------------------------------------- prose

def long52_calls(root: Path) -> list:
    """each call's start-to-exit seconds; peak MB of the runs (min, max) / 1000; the 11-30 runs' (min, max) / 1000; the runs call 2 lost; the lost runs' logged steps (min, max) and the planned steps."""
    secs = []
    for i in range(1, 5):
        text = (root / LONG52 / "logs" / f"call{i}_commands.log").read_text()
        secs.append(int(re.findall(r"exit 0 \((\d+) s", text)[-1]))
    peaks = [max(d["memory/peak_mb"] for d in log) for log in _logs(root).values()]
    partial = f"{LONG}/partial_2026-11-30/{BIG}"
    old = [d["memory/peak_mb"] for run in (root / partial / "runs").iterdir() for d in _log(root, run.name, partial)]
    lost = len(re.findall(r"^\S+ failed \(exit 1\)", (root / LONG52 / "logs" / "call2_experiment.log").read_text(), re.M))
    runs = _runs(root)
    steps = [runs[f"{BIG}__{r}"]["steps"] for r in FAILED]
    return [*secs, min(peaks) / 1000, max(peaks) / 1000, min(old) / 1000, max(old) / 1000, lost, min(steps), max(steps),
            runs[f"{BIG}__{FAILED[0]}"]["planned_steps"]]


def long52_warm_start(root: Path) -> list:
    """the warm start's steps, wall seconds, last greedy and sampled accuracy; the probe's last sampled."""
    h, probe = _sft(root, LONG52), _sft(root, LONG)
    return [h["steps_done"], h["wall_time_s"], h["evals"][-1]["greedy_acc"], h["evals"][-1]["sample_acc"],
            probe["evals"][-1]["sample_acc"]]


def long52_no_collapse(root: Path) -> list:
    """largest positive step-0 k3 of the fitted runs; fitted runs; the 95% lower bound; the 4M long cell's bound."""
    fit = _cell(root, BIG, LONG52)["fit"]
    rs = [r for r in _report(root, LONG52)["runs"] if r["scored"] and r["role"] in ("dose", "aligned")]
    return [max(r["step0_k3"] for r in rs), fit["n"], fit["interval_k3"][0],
            _cell(root, "qwen2-tiny-long", LONG)["fit"]["interval_k3"][0]]


def long52_gains(root: Path) -> list:
    """aligned's gain; b1x2's gain and k3 geomean; -b1x4's gain and its k3 geomean; signal runs among b1 and
    above, those runs, b1's k3 geomean."""
    a = _arms(root)
    up = [a[x] for x in ("b1", "b1x1.4", "b1x2", "b1x4")]
    return [_gain(a["aligned"]), _gain(a["b1x2"]), a["b1x2"]["step0_k3_geomean"], -_gain(a["b1x4"]),
            a["b1x4"]["step0_k3_geomean"], sum(x["signal"] for x in up), sum(x["runs"] for x in up),
            a["b1"]["step0_k3_geomean"]]


def long52_bf16(root: Path) -> list:
    """bf16's and aligned's gains; their final reward mean ± sample std."""
    a = _arms(root)
    b, al = a["bf16"], a["aligned"]
    return [_gain(b), _gain(al), b["final_reward"]["mean"], b["final_reward"]["std"], al["final_reward"]["mean"],
            al["final_reward"]["std"]]


def long52_exact(root: Path) -> list:
    """aligned: logged steps with every token bit-equal, runs, their tokens in all; the 4M long cell's aligned step-0
    k3 geomean and its mean step-0 bit-equal share (%); this model's probe geomean."""
    logs = _logs(root, "aligned")
    lines = [d for log in logs.values() for d in log]
    assert all(d["mismatch/bitwise/equal"] == 1.0 and d["mismatch/k3"] == 0.0 for d in lines)
    tokens = int(sum(d["mismatch/n_tokens"] for d in lines))
    equal4 = [_log(root, f"qwen2-tiny-long__aligned__s{s}", LONG)[0]["mismatch/bitwise/equal"] for s in range(3)]
    return [len(lines), len(logs), tokens, _long_arms(root)["aligned"]["step0_k3_geomean"],
            100 * statistics.mean(equal4), _probe(root, BIG)["aligned"]["k3_geomean"]]


def long52_bench(root: Path) -> list:
    """52M grouped and model s/generate and the speedup; the same for 4M; mean common prefix 52M, 4M; new tokens;
    the larger max |logprob difference| over the common prefixes."""
    b = _bench(root)
    big, tiny = b["50m"], b["tiny"]
    new = json.loads((root / BENCH).read_text())["new_tokens"]
    return [big["grouped"]["seconds_per_generate"], big["model"]["seconds_per_generate"], big["speedup"],
            tiny["grouped"]["seconds_per_generate"], tiny["model"]["seconds_per_generate"], tiny["speedup"],
            big["grouped_vs_model"]["mean_common_prefix"], tiny["grouped_vs_model"]["mean_common_prefix"], new,
            max(r["grouped_vs_model"]["max_abs_logprob_diff_on_common_prefix"] for r in b.values())]


def long52_doses_vs_probe(root: Path) -> list:
    """geomean step-0 k3 here / in the probe for b2, b1x4, b1, b1x1.4, b1x2; sampled accuracy here, probe's."""
    a, p = _arms(root), _probe(root, BIG)
    ratio = lambda arm: a[arm]["step0_k3_geomean"] / p[arm]["k3_geomean"]  # noqa: E731
    return [ratio(x) for x in ("b2", "b1x4", "b1", "b1x1.4", "b1x2")] + long52_warm_start(root)[3:]


def long52_prediction(root: Path) -> list:
    """the warm start's steps and seconds; b1x2's gain; bf16's step-0 k3 geomean."""
    a = _arms(root)
    h = _sft(root, LONG52)
    return [h["steps_done"], h["wall_time_s"], _gain(a["b1x2"]), a["bf16"]["step0_k3_geomean"]]


def long52_timing(root: Path) -> list:
    """min and max over the runs that logged every step without being lost in call 2 of their mean time/step_s."""
    means = [statistics.mean(d["time/step_s"] for d in log) for name, log in _logs(root).items()
             if not name.endswith(FAILED)]
    return [min(means), max(means)]


def long52_throughput(root: Path) -> list:
    """per call 2-4, from the last progress bar of its experiment log: steps made (the bar's count minus the
    steps its runs had logged before: call 3's 16 runs had call 2's total), seconds; then steps / seconds."""
    bars = {}
    for c in (2, 3, 4):
        text = (root / LONG52 / "logs" / f"call{c}_experiment.log").read_text()
        n, _, h, m, sec = re.findall(r"experiment steps\D*?(\d+)/(\d+) (\d+):(\d\d):(\d\d)", text)[-1]
        bars[c] = (int(n), 3600 * int(h) + 60 * int(m) + int(sec))
    # call 3 resumed exactly the runs call 2 had advanced; calls 2 and 4 started their runs from step 0
    made = {2: bars[2][0], 3: bars[3][0] - bars[2][0], 4: bars[4][0]}
    return [v for c in (2, 3, 4) for v in (made[c], bars[c][1])] + [made[c] / bars[c][1] for c in (2, 3, 4)]
