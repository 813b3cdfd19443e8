"""Recomputations for the dose-response folders (issue #19), for ``lab/checks/check_experiments.py``.

``results/experiments/dose_response_h200_2026-11-30``: the report is recomputed from the runs' logs by rla's
own summariser (``lab.dose.experiment.summarize``, the code behind ``python -m lab.dose.experiment
GRID --out DIR --summarize-only``), in a temporary copy of the folder so the check writes nothing into the
repository. ``results/experiments/dose_calibration_cpu_2026-11-30``: step-0 k3 per arm from ``probe.json``.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

DOSE = "results/experiments/dose_response_h200_2026-11-30"
DOSE_LONG = f"{DOSE}/long_cell_seed0"
DOSE_CAL = "results/experiments/dose_calibration_cpu_2026-11-30"
_CACHE: dict = {}


def _report(root: Path, folder: str = DOSE) -> dict:
    key = (str(root), folder)
    if key not in _CACHE:
        for path in (str(root / "src"), str(root)):  # rla, and the lab package
            if path not in sys.path:
                sys.path.insert(0, path)
        from lab.dose.experiment import summarize
        from lab.dose.grid import load_dose_grid

        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "dose"
            shutil.copytree(root / folder, copy,
                            ignore=shutil.ignore_patterns("dose_report.*", "summary.*", "plots", "long_cell_seed0"))
            _CACHE[key] = summarize(copy, load_dose_grid(copy / "grid.yaml"), plots=False)["dose_report"]
    return _CACHE[key]


def _cell(root: Path, model: str, folder: str = DOSE) -> dict:
    (cell,) = [c for c in _report(root, folder)["cells"] if c["model"] == model]
    return cell


def dose_table(root: Path, model: str = "qwen2-tiny", folder: str = DOSE) -> dict:
    """arm -> step-0 k3 geometric mean; collapsed / scored; signal / runs; reward start mean,
    final mean, final sample std (``rla.rl.experiment_summary.stats``)."""
    cell = _cell(root, model, folder)
    return {(a["arm"],): [a["step0_k3_geomean"], [a["collapsed"], a["scored"]], [a["signal"], a["runs"]],
                          [a["reward_first"]["mean"], a["final_reward"]["mean"], a["final_reward"]["std"]]]
            for a in cell["arms"]}


def dose_threshold(root: Path) -> list:
    """the fit's threshold k3, its 95% interval, slope per decade; fitted runs and collapses."""
    fit = _cell(root, "qwen2-tiny")["fit"]
    return [fit["threshold_k3"], *fit["interval_k3"], fit["slope_per_decade"], fit["n"], fit["collapses"]]


def dose_calibration_table(root: Path, folder: str = DOSE_CAL) -> dict:
    """arm -> (bits, scale: not checked), geometric mean of the seeds' step-0 k3, per seed in seed order."""
    runs = json.loads((root / folder / "probe.json").read_text())["runs"]
    out: dict = {}
    for arm in dict.fromkeys(r["arm"] for r in runs):
        k3 = [r["k3"] for r in sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"])]
        out[(arm,)] = [None, None, math.exp(sum(map(math.log, k3)) / len(k3)), k3]
    return out


def dose_long_table(root: Path) -> dict:
    """arm -> step-0 k3 of the long cell's seed-0 run; the short cell's geometric mean over seeds."""
    long = {r["arm"]: r["step0_k3"] for r in _report(root, DOSE_LONG)["runs"] if r["model"] == "qwen2-tiny-long" and r["steps"]}
    short = {a["arm"]: a["step0_k3_geomean"] for a in _cell(root, "qwen2-tiny")["arms"]}
    return {(arm,): [long[arm], short[arm]] for arm in long}


# ---------------------------------------------------------------- the 52M cell (qwen2-50m)

M50 = "qwen2-50m"
ARMS = ("aligned", "bf16", "b4x0.5", "b4", "b3x0.7", "b3", "b2x0.7")


def _runs(root: Path, model: str = M50) -> dict:
    """run name -> the dose report's run row (steps, step-0 k3, rewards, outcome)."""
    return {r["name"]: r for r in _report(root)["runs"] if r["model"] == model}


def _log(root: Path, name: str, folder: str = DOSE) -> list[dict]:
    if str(root / "src") not in sys.path:
        sys.path.insert(0, str(root / "src"))
    from rla.rl.runlog import read_log

    return read_log(root / folder / "runs" / name / "log.jsonl")


def dose50_table(root: Path) -> dict:
    """as ``dose_table`` for the 52M cell, plus the logged steps of seeds 0, 1, 2."""
    runs = _runs(root)
    out = dose_table(root, M50)
    for (arm,), vals in out.items():
        vals.append([runs[f"{M50}__{arm}__s{s}"]["steps"] for s in range(3)])
    return out


def dose_k3_by_cell(root: Path) -> dict:
    """arm -> step-0 k3 geometric mean of the 4M cell, of the 52M cell, and their ratio."""
    tiny = {a["arm"]: a["step0_k3_geomean"] for a in _cell(root, "qwen2-tiny")["arms"]}
    big = {a["arm"]: a["step0_k3_geomean"] for a in _cell(root, M50)["arms"]}
    return {(arm,): [tiny[arm], big[arm], tiny[arm] / big[arm]] for arm in tiny}


def dose50_warm_start(root: Path) -> list:
    """the warm start's sft.json: steps done, wall seconds, last evaluation's greedy and sampled accuracy."""
    h = json.loads((root / DOSE / "init" / M50 / "sft.json").read_text())["history"]
    return [h["steps_done"], h["wall_time_s"], h["evals"][-1]["greedy_acc"], h["evals"][-1]["sample_acc"]]


def _call_log(root: Path, call: int) -> str:
    return (root / DOSE / "logs" / f"{M50}_call{call}_experiment.log").read_text()


def _oom_runs(text: str) -> list[str]:
    """runs the experiment log reports as failed, each with a CUDA out-of-memory error."""
    import re

    blocks = re.split(r"\n(?=\S+ failed \(exit)", text)
    return [b.split()[0] for b in blocks if re.match(r"\S+ failed \(exit", b) and "OutOfMemoryError" in b]


def dose50_calls(root: Path) -> list:
    """the two calls' wall time (min, s) from the commands log's UTC stamps; the GPU's highest memory
    in use (MiB, call 1's nvidia-smi samples); runs failed out of memory in call 1; the logged steps
    of the run that failed in call 2."""
    import re
    from datetime import datetime

    stamps = [datetime.fromisoformat(t.replace("Z", "+00:00")) for t in
              re.findall(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)", (root / DOSE / "logs" / f"{M50}_commands.log").read_text())]
    walls = [int((stamps[i + 1] - stamps[i]).total_seconds()) for i in (0, 2)]
    rows = (root / DOSE / "logs" / f"{M50}_call1_gpu_util.csv").read_text().splitlines()[1:]
    peak = max(int(r.split(",")[3].split()[0]) for r in rows)
    (late,) = _oom_runs(_call_log(root, 2))
    return [walls[0] // 60, walls[0] % 60, walls[1] // 60, walls[1] % 60, peak, len(_oom_runs(_call_log(root, 1))),
            _runs(root)[late]["steps"]]


def dose50_steps(root: Path) -> list:
    """runs with all 100 steps; of the others (but the one with fewest steps): how many, fewest and most steps."""
    steps = sorted(r["steps"] for r in _runs(root).values())
    short = [s for s in steps if s < 100][1:]
    return [sum(s == 100 for s in steps), len(short), min(short), max(short)]


def dose50_no_collapse(root: Path) -> list:
    """the fit's status line: scored runs, the largest step-0 k3 among them, the 95% lower bound."""
    fit = _cell(root, M50)["fit"]
    assert fit["status"] == "no_collapse", fit["status"]
    k3 = [r["step0_k3"] for r in _runs(root).values() if r["scored"] and r["role"] in ("dose", "aligned")]
    return [fit["n"], max(k3), fit["interval_k3"][0]]


def dose50_rewards(root: Path) -> list:
    """min-max over arms of the mean starting reward and of the mean final reward (52M)."""
    arms = _cell(root, M50)["arms"]
    first = [a["reward_first"]["mean"] for a in arms]
    final = [a["final_reward"]["mean"] for a in arms]
    return [min(first), max(first), min(final), max(final)]


def dose50_near_1e3(root: Path) -> list:
    """step-0 k3 of b2x0.7 seed 0, b3 seed 1, b3x0.7 seed 1 (the 52M runs nearest 1e-3)."""
    runs = _runs(root)
    return [runs[f"{M50}__{n}"]["step0_k3"] for n in ("b2x0.7__s0", "b3__s1", "b3x0.7__s1")]


def dose_bf16_move(root: Path) -> list:
    """bf16 and aligned step-0 k3 (geometric means) at 4M and 52M; 4M / 52M for bf16; bf16 / aligned per cell."""
    k = dose_k3_by_cell(root)
    b4, b52, _ = k[("bf16",)]
    a4, a52, _ = k[("aligned",)]
    return [b4, b52, b4 / b52, a4, a52, b4 / a4, b52 / a52]


def _step0_mean(root: Path, model: str, arm: str, key: str, folder: str = DOSE) -> float:
    return sum(_log(root, f"{model}__{arm}__s{s}", folder)[0][key] for s in range(3)) / 3


def dose_delta_entropy(root: Path) -> list:
    """bf16's step-0 mismatch/abs/mean, mean over seeds, 4M / 52M and both; the aligned arm's step-0
    train/entropy (nats per token), mean over seeds, 52M then 4M."""
    d4, d52 = (_step0_mean(root, m, "bf16", "mismatch/abs/mean") for m in ("qwen2-tiny", M50))
    ent = [_step0_mean(root, m, "aligned", "train/entropy") for m in (M50, "qwen2-tiny")]
    return [d4 / d52, d4, d52, *ent]


def _window(root: Path, name: str, lo: int, hi: int) -> float | None:
    w = [r["reward/mean"] for r in _log(root, name) if lo <= r["step"] <= hi]
    return sum(w) / len(w) if len(w) == hi - lo + 1 else None


def dose50_late_gap(root: Path, lo: int = 90, hi: int = 94) -> list:
    """mean reward over steps lo-hi, arm minus the aligned run of the same seed: b2x0.7's in seeds
    0, 1, 2 (made positive: aligned - b2x0.7); then the largest |difference| of every other arm's runs
    that reached step hi."""
    gap = {}
    for arm in ARMS[1:]:
        for s in range(3):
            w, a = _window(root, f"{M50}__{arm}__s{s}", lo, hi), _window(root, f"{M50}__aligned__s{s}", lo, hi)
            if w is not None:
                gap[arm, s] = w - a
    return [-gap["b2x0.7", s] for s in range(3)] + [max(abs(v) for (arm, _), v in gap.items() if arm != "b2x0.7")]


def dose50_signal(root: Path) -> list:
    """52M runs whose collapse signal fired; the step at which most seed-2 runs fired, and how many."""
    from collections import Counter

    runs = _runs(root)
    fired = sum(r["signal"] for r in runs.values())
    at = Counter(rec["step"] for arm in ARMS for rec in _log(root, f"{M50}__{arm}__s2") if rec.get("collapse/fired"))
    step, n = at.most_common(1)[0]
    kinds = {k for arm in ARMS for s in range(3) for rec in _log(root, f"{M50}__{arm}__s{s}")
             if rec.get("collapse/fired") for k in rec["collapse/kinds"]}
    assert kinds == {"k3_spike", "reward_falling"}, kinds
    return [fired, step, n]


def dose50_warm_start_before(root: Path) -> list:
    """the evaluation before the warm start's last: its step and sampled accuracy."""
    ev = json.loads((root / DOSE / "init" / M50 / "sft.json").read_text())["history"]["evals"][-2]
    return [ev["step"], ev["sample_acc"]]


def dose50_process_memory(root: Path) -> list:
    """the most GPU memory one process held in the out-of-memory reports of both calls (GiB)."""
    import re

    text = " ".join(" ".join(_call_log(root, c).split()) for c in (1, 2))
    return [max(float(x) for x in re.findall(r"has ([\d.]+) GiB memory in use", text))]


def dose50_ratio_range(root: Path) -> list:
    """min-max over the five dose arms of step-0 k3 (geomean) 4M / 52M; the 52M model's parameters / 1e6;
    the min-max again (the README writes it twice); bf16's ratio."""
    k = dose_k3_by_cell(root)
    ratios = [k[(arm,)][2] for arm in ARMS[2:]]
    lo, hi = min(ratios), max(ratios)
    return [lo, hi, _cell(root, M50)["parameters"] / 1e6, lo, hi, k[("bf16",)][2]]


# ---------------------------------------------------------------- the 52M high-dose cell

DOSE_HIGH = "results/experiments/dose_response_50m_high_h200_2026-11-30"


def _high(root: Path) -> dict:
    return _cell(root, M50, DOSE_HIGH)


def _high_arms(root: Path) -> dict:
    return {a["arm"]: a for a in _high(root)["arms"]}


def _gain(a: dict) -> float:
    return a["final_reward"]["mean"] - a["reward_first"]["mean"]


def dose_high_probe_table(root: Path) -> dict:
    """arm -> (bits, scale: not checked), geometric mean over seeds of the probe's step-0 k3, per seed."""
    return dose_calibration_table(root, DOSE_HIGH)


def dose_high_table(root: Path) -> dict:
    """as ``dose_table`` for the high-dose cell, plus the gain: mean final - mean starting reward."""
    arms = _high_arms(root)
    return {key: [*vals, _gain(arms[key[0]])] for key, vals in dose_table(root, M50, DOSE_HIGH).items()}


def dose_high_calls(root: Path) -> list:
    """seconds each call's commands ran (commands.log: call start to exit), the probe's seconds, runs
    finished after call 1 (its experiment log)."""
    import re
    from datetime import datetime

    text = (root / DOSE_HIGH / "logs" / "commands.log").read_text()
    stamp = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
    starts = re.findall(r"== (call\d) rla .* (\S+Z)$", text, re.M)
    ends = dict(re.findall(r"== (call\d) exit \d+ (\S+Z)$", text, re.M))
    first = {}
    for call, t in starts:
        first.setdefault(call, t)
    secs = [(stamp(ends[c]) - stamp(first[c])).total_seconds() for c in ("call1", "call2")]
    probe = int(re.search(r"probe exit 0 after (\d+) s", text).group(1))
    done = int(re.search(r"(\d+)/21 runs finished", (root / DOSE_HIGH / "logs" / "call1_experiment.log").read_text()).group(1))
    return [secs[0], probe, done, 21 - done, secs[1]]


def dose_high_prediction(root: Path) -> list:
    """the probe's geomean of b2, b1, b1x2, b1x4; min-max of their ratio to the predictions 1e-3, 4e-3, 1.6e-2, 6e-2."""
    k3 = {a["arm"]: a["k3_geomean"] for a in json.loads((root / DOSE_HIGH / "probe.json").read_text())["arms"]}
    got = [k3[a] for a in ("b2", "b1", "b1x2", "b1x4")]
    ratios = [g / p for g, p in zip(got, (1e-3, 4e-3, 1.6e-2, 6e-2))]
    return [*got, min(ratios), max(ratios)]


def dose_high_warm_starts(root: Path) -> list:
    """SFT stop step and last sampled accuracy, this cell then the first 52M cell."""
    out = []
    for folder in (DOSE_HIGH, DOSE):
        h = json.loads((root / folder / "init" / M50 / "sft.json").read_text())["history"]
        out += [h["steps_done"], h["evals"][-1]["sample_acc"]]
    return out


def dose_high_vs_first(root: Path) -> list:
    """b2x0.7 and bf16 step-0 k3 geomeans: ratio high / first cell, high, first; the aligned arm's step-0
    entropy (mean over seeds), high then first."""
    high, first = _high_arms(root), {a["arm"]: a for a in _cell(root, M50)["arms"]}
    out = []
    for arm in ("b2x0.7", "bf16"):
        h, f = high[arm]["step0_k3_geomean"], first[arm]["step0_k3_geomean"]
        out += [h / f, h, f]
    ent = []
    for folder in (DOSE_HIGH, DOSE):
        vals = [_log(root, f"{M50}__aligned__s{s}", folder)[0]["train/entropy"] for s in range(3)]
        ent.append(sum(vals) / 3)
    return out + ent


def dose_high_scale2(root: Path) -> list:
    """probe geomean b1x2 / b1."""
    k3 = {a["arm"]: a["k3_geomean"] for a in json.loads((root / DOSE_HIGH / "probe.json").read_text())["arms"]}
    return [k3["b1x2"] / k3["b1"]]


def dose_high_run_vs_probe(root: Path) -> list:
    """b2x0.7: the runs' step-0 k3 geomean (dose report), the probe's."""
    k3 = {a["arm"]: a["k3_geomean"] for a in json.loads((root / DOSE_HIGH / "probe.json").read_text())["arms"]}
    return [_high_arms(root)["b2x0.7"]["step0_k3_geomean"], k3["b2x0.7"]]


def dose_high_no_collapse(root: Path) -> list:
    """scored dose+aligned runs, their largest step-0 k3, the 95% lower bound; the 4M fit's k3_50, upper end;
    collapses at 4M of b2x0.7 and its k3; the lower bound / the 4M upper end."""
    fit = _high(root)["fit"]
    assert fit["status"] == "no_collapse", fit["status"]
    runs = [r for r in _report(root, DOSE_HIGH)["runs"] if r["scored"] and r["role"] in ("dose", "aligned")]
    tiny = _cell(root, "qwen2-tiny")
    b2 = {a["arm"]: a for a in tiny["arms"]}["b2x0.7"]
    lo, hi4 = fit["interval_k3"][0], tiny["fit"]["interval_k3"][1]
    return [fit["n"], max(r["step0_k3"] for r in runs), lo, tiny["fit"]["threshold_k3"], tiny["fit"]["interval_k3"][0],
            hi4, b2["collapsed"], b2["scored"], b2["step0_k3_geomean"], lo / hi4]


def dose_high_gains(root: Path) -> list:
    """gain (mean final - mean start) of aligned, b2x0.7 (and its k3), b2 (and its k3), then b1x0.7's k3 and
    the gains of b1x0.7, b1, b1x1.4; the 4M gains of b3x0.7, b3, b2x0.7 with their k3."""
    a = _high_arms(root)
    t = {x["arm"]: x for x in _cell(root, "qwen2-tiny")["arms"]}
    return [_gain(a["aligned"]), _gain(a["b2x0.7"]), a["b2x0.7"]["step0_k3_geomean"], _gain(a["b2"]),
            a["b2"]["step0_k3_geomean"], a["b1x0.7"]["step0_k3_geomean"], _gain(a["b1x0.7"]), _gain(a["b1"]),
            _gain(a["b1x1.4"]),
            _gain(t["b3x0.7"]), t["b3x0.7"]["step0_k3_geomean"], _gain(t["b3"]), t["b3"]["step0_k3_geomean"],
            _gain(t["b2x0.7"]), t["b2x0.7"]["step0_k3_geomean"]]


def dose_high_bf16(root: Path) -> list:
    """bf16's k3; b2x0.7 / bf16; b2x0.7's k3; aligned gain - b2x0.7 gain; bf16 and aligned gains; their final
    reward mean ± std."""
    a = _high_arms(root)
    bf, al, d = a["bf16"], a["aligned"], a["b2x0.7"]
    return [bf["step0_k3_geomean"], d["step0_k3_geomean"] / bf["step0_k3_geomean"], d["step0_k3_geomean"],
            _gain(al) - _gain(d), _gain(bf), _gain(al), bf["final_reward"]["mean"], bf["final_reward"]["std"],
            al["final_reward"]["mean"], al["final_reward"]["std"]]


def dose_high_signal(root: Path) -> list:
    """runs whose collapse signal fired, of all runs; whether all are dose arms (1/0)."""
    runs = _report(root, DOSE_HIGH)["runs"]
    fired = [r for r in runs if r["signal"]]
    return [len(fired), len(runs)]
