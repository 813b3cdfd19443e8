"""Recomputations for the dose-response folders (issue #19), for ``scripts/check_experiments.py``.

``experiments/dose_response_h200_2026-11-30``: the report is recomputed from the runs' logs by rla's
own summariser (``rla.rl.experiment.summarize``, the code behind ``rla experiment GRID --out DIR
--summarize-only``), in a temporary copy of the folder so the check writes nothing into the
repository. ``experiments/dose_calibration_cpu_2026-11-30``: step-0 k3 per arm from ``probe.json``.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

DOSE = "experiments/dose_response_h200_2026-11-30"
DOSE_LONG = f"{DOSE}/long_cell_seed0"
DOSE_CAL = "experiments/dose_calibration_cpu_2026-11-30"
_CACHE: dict = {}


def _report(root: Path, folder: str = DOSE) -> dict:
    key = (str(root), folder)
    if key not in _CACHE:
        if str(root / "src") not in sys.path:
            sys.path.insert(0, str(root / "src"))
        from rla.rl.experiment import summarize

        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "dose"
            shutil.copytree(root / folder, copy,
                            ignore=shutil.ignore_patterns("dose_report.*", "summary.*", "plots", "long_cell_seed0"))
            _CACHE[key] = summarize(copy)["dose_report"]
    return _CACHE[key]


def _cell(root: Path, model: str, folder: str = DOSE) -> dict:
    (cell,) = [c for c in _report(root, folder)["cells"] if c["model"] == model]
    return cell


def dose_table(root: Path, model: str = "qwen2-tiny") -> dict:
    """arm -> step-0 k3 geometric mean; collapsed / scored; signal / runs; reward start mean,
    final mean, final sample std (``rla.rl.experiment_summary.stats``)."""
    cell = _cell(root, model)
    return {(a["arm"],): [a["step0_k3_geomean"], [a["collapsed"], a["scored"]], [a["signal"], a["runs"]],
                          [a["reward_first"]["mean"], a["final_reward"]["mean"], a["final_reward"]["std"]]]
            for a in cell["arms"]}


def dose_threshold(root: Path) -> list:
    """the fit's threshold k3, its 95% interval, slope per decade; fitted runs and collapses."""
    fit = _cell(root, "qwen2-tiny")["fit"]
    return [fit["threshold_k3"], *fit["interval_k3"], fit["slope_per_decade"], fit["n"], fit["collapses"]]


def dose_calibration_table(root: Path) -> dict:
    """arm -> (bits, scale: not checked), geometric mean of the seeds' step-0 k3, per seed in seed order."""
    runs = json.loads((root / DOSE_CAL / "probe.json").read_text())["runs"]
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
