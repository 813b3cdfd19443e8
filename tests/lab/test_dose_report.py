"""The dose-response report (``lab.dose.report``): outcomes, the threshold fit, and the report
written from synthetic run logs, checked against direct computations done here.

The direct computations share nothing with the module: an ordinary two-parameter logistic
regression by Newton's method (intercept + slope) for the maximum-likelihood threshold -a/b, and a
brute-force profile likelihood over a dense (t, b) grid for the intervals.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from lab.dose.report import CHI2_95, fit_threshold, run_outcome
from lab.dose.experiment import summarize
from lab.dose.grid import load_dose_grid as load_grid


def newton_logistic(x, y, iters=100):
    """MLE of logit p = a + b x by plain Newton (data must not be separated)."""
    X = np.stack([np.ones_like(x), x], axis=1)
    w = np.zeros(2)
    for _ in range(iters):
        p = 1 / (1 + np.exp(-X @ w))
        g = X.T @ (y - p)
        H = -(X.T * (p * (1 - p))) @ X
        w = w - np.linalg.solve(H, g)
    return w


def brute_profile(x, y, ts, bs):
    """max over the b grid of the log-likelihood, for every t of the grid (broadcast: t x b x run)."""
    z = bs[None, :, None] * (x[None, None, :] - ts[:, None, None])
    ll = (y * -np.logaddexp(0, -z) + (1 - y) * -np.logaddexp(0, z)).sum(axis=2)
    return ll.max(axis=1)


def brute_interval(x, y, lo, hi, step=0.005):
    ts = np.arange(lo, hi + step / 2, step)
    bs = np.concatenate([[0.0], np.geomspace(1e-3, 1e3, 600)])
    prof = brute_profile(x, y, ts, bs)
    inside = ts[prof >= prof.max() - CHI2_95 / 2]
    return ts[int(np.argmax(prof))], inside.min(), inside.max(), ts


# overlapping outcomes: 0/3 at 1e-4, 1/3 at ~3e-4, 2/3 at ~1e-3, 3/3 at 1e-2 (doses jittered per seed)
K3 = np.array([1.1e-4, 0.9e-4, 1.0e-4, 3.3e-4, 2.8e-4, 3.0e-4, 1.2e-3, 0.8e-3, 1.0e-3, 1.1e-2, 0.9e-2, 1.0e-2])
Y = np.array([0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1])


def test_overlapping_outcomes_match_newton_logistic_regression_and_a_brute_force_profile():
    fit = fit_threshold(K3, Y)
    assert fit["status"] == "fit" and fit["n"] == 12 and fit["collapses"] == 6
    x = np.log10(K3)
    a, b = newton_logistic(x, Y.astype(float))
    assert b > 0
    assert math.log10(fit["threshold_k3"]) == pytest.approx(-a / b, abs=2e-3)
    assert fit["slope_per_decade"] == pytest.approx(b, rel=2e-3)
    _, lo, hi, _ = brute_interval(x, Y, x.min() - 2, x.max() + 2)
    got_lo, got_hi = (math.log10(v) for v in fit["interval_k3"])
    assert got_lo == pytest.approx(lo, abs=0.01) and got_hi == pytest.approx(hi, abs=0.01)
    assert got_lo < -a / b < got_hi


def test_separated_outcomes_give_the_gap_and_a_finite_profile_interval():
    k3 = np.array([1e-4, 1.2e-4, 0.9e-4, 1e-3, 1.1e-3, 0.95e-3, 1e-2, 1.2e-2, 0.9e-2])
    y = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1])
    fit = fit_threshold(k3, y)
    assert fit["status"] == "separated" and fit["slope_per_decade"] is None
    assert fit["ml_set_k3"] == pytest.approx([1.1e-3, 0.9e-2])
    assert fit["threshold_k3"] == pytest.approx(math.sqrt(1.1e-3 * 0.9e-2))
    x = np.log10(k3)
    _, lo, hi, _ = brute_interval(x, y, x.min() - 2, x.max() + 2)
    got_lo, got_hi = (math.log10(v) for v in fit["interval_k3"])
    assert got_lo == pytest.approx(lo, abs=0.01) and got_hi == pytest.approx(hi, abs=0.01)
    assert got_lo <= math.log10(1.1e-3) + 1e-9 and got_hi >= math.log10(0.9e-2) - 1e-9
    assert "separated" in fit["statement"] and "0.0011" in fit["statement"]


@pytest.mark.parametrize("outcome", [0, 1])
def test_no_collapse_and_all_collapse_report_no_threshold_only_a_one_sided_bound(outcome):
    k3 = np.array([1e-4, 1.2e-4, 1e-3, 1.1e-3, 1e-2, 1.2e-2])
    y = np.full(6, outcome)
    fit = fit_threshold(k3, y)
    assert fit["threshold_k3"] is None and fit["slope_per_decade"] is None
    x = np.log10(k3)
    _, lo, hi, ts = brute_interval(x, y, x.min() - 2, x.max() + 2)
    if outcome == 0:
        assert fit["status"] == "no_collapse" and fit["interval_k3"][1] is None
        assert math.log10(fit["interval_k3"][0]) == pytest.approx(lo, abs=0.01)
        assert hi == pytest.approx(ts.max())  # the brute force is unbounded above too
        assert "no run of 6 collapsed" in fit["statement"] and "above" in fit["statement"]
    else:
        assert fit["status"] == "all_collapse" and fit["interval_k3"][0] is None
        assert math.log10(fit["interval_k3"][1]) == pytest.approx(hi, abs=0.01)
        assert lo == pytest.approx(ts.min())
        assert "all 6 runs collapsed" in fit["statement"] and "below" in fit["statement"]


def test_too_few_runs_or_one_dose_is_not_fitted():
    assert fit_threshold([1e-3, 1e-2, 1e-3], [0, 1, 0])["status"] == "too_few"
    one_dose = fit_threshold([1e-3] * 6, [0, 1, 0, 1, 0, 1])
    assert one_dose["status"] == "too_few" and one_dose["threshold_k3"] is None
    with pytest.raises(ValueError, match="finite number >= 0"):
        fit_threshold([-1e-3, 1e-3, 1e-2, 1e-1], [0, 0, 1, 1])
    assert fit_threshold([0.0, 0.0, 0.0, 0.0], [0, 0, 1, 1])["status"] == "too_few"  # no positive k3


def test_exact_runs_sit_at_minus_infinity():
    """k3 = 0 (bit-for-bit equal logprobs): a surviving exact run is what every curve with b > 0
    already predicts there, so it leaves the fit as it was; a collapsed one is evidence against any
    steep curve, and the fit must feel it."""
    base = fit_threshold(K3, Y)
    with_exact = fit_threshold(np.concatenate([K3, [0.0, 0.0, 0.0]]), np.concatenate([Y, [0, 0, 0]]))
    assert with_exact["status"] == "fit" and with_exact["exact"] == 3 and with_exact["n"] == 15
    assert with_exact["threshold_k3"] == pytest.approx(base["threshold_k3"], rel=1e-6)
    assert with_exact["slope_per_decade"] == pytest.approx(base["slope_per_decade"], rel=1e-6)
    for a, b in zip(with_exact["interval_k3"], base["interval_k3"]):
        assert a == pytest.approx(b, rel=0.01)  # the same grid point, or its neighbour
    collapsed_exact = fit_threshold(np.concatenate([K3, [0.0, 0.0]]), np.concatenate([Y, [1, 1]]))
    assert collapsed_exact["slope_per_decade"] < 0.5 * base["slope_per_decade"]  # flatter: collapse without mismatch
    none = fit_threshold([0.0, 0.0, 0.0, 1e-3, 1e-2, 1e-1], [0] * 6)
    assert none["status"] == "no_collapse" and "k3 up to 0.1" in none["statement"]
    # separated with every survivor exact: the maximum-likelihood set reaches down to k3 = 0
    sep = fit_threshold([0.0, 0.0, 0.0, 1e-3, 1e-2, 1e-1], [0, 0, 0, 1, 1, 1])
    assert sep["status"] == "separated" and sep["threshold_k3"] == pytest.approx(1e-3)
    assert "between k3 = 0 and 0.001" in sep["statement"]


def _summary(steps, k3=1e-3, first=0.5, final=0.6, events=()):
    return {"steps": steps, "step0": {"k3": k3}, "reward_first": first, "final_reward": final,
            "collapse_events": list(events)}


def test_run_outcome_criteria():
    collapsed = _summary(50, final=0.1)  # 0.1 < 0.5 x 0.5
    spike = _summary(50, final=0.55, events=[{"step": 30}])  # the signal fired, the reward recovered
    fine = _summary(50, final=0.3)  # 0.3 >= 0.25: not collapsed
    assert run_outcome(collapsed, 5)["collapsed"] is True
    assert run_outcome(fine, 5)["collapsed"] is False
    assert run_outcome(spike, 5)["collapsed"] is False and run_outcome(spike, 5)["signal"] is True
    assert run_outcome(spike, 5, "signal")["collapsed"] is True
    assert run_outcome(spike, 5, "either")["collapsed"] and run_outcome(collapsed, 5, "either")["collapsed"]
    assert run_outcome(collapsed, 5, "signal")["collapsed"] is False
    short = run_outcome(_summary(9), 5)
    assert short["scored"] is False and short["collapsed"] is None and "9 steps" in short["why"]
    exact = run_outcome(_summary(50, k3=0.0), 5)  # bit-for-bit equal logprobs: scored, marked exact
    assert exact["scored"] is True and exact["exact"] is True and exact["collapsed"] is False
    assert run_outcome(_summary(50, k3=-1e-9), 5)["scored"] is False  # not a k3 at all
    assert run_outcome(_summary(50, k3=float("nan")), 5)["scored"] is False
    with pytest.raises(ValueError):
        run_outcome(fine, 5, "vibes")


# ----------------------------------------------------------------------- the report from run logs

ARMS = {"bf16": {"train_precision": "bf16"}, "aligned": {"train_precision": "aligned"},
        "b4": {"train_precision": "aligned", "train_dose_bits": 4},
        "b3": {"train_precision": "aligned", "train_dose_bits": 3},
        "b2": {"train_precision": "aligned", "train_dose_bits": 2}}


def _write_grid(tmp: Path) -> Path:
    import yaml

    grid = {"base": {"init": "bundled", "task": "addition", "difficulty": 12, "steps": 20, "device": "cpu"},
            "models": {"tiny": {}}, "arms": ARMS, "seeds": [0, 1, 2]}
    path = tmp / "grid.yaml"
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    return path


def _write_log(run_dir: Path, k3: float, collapse: bool, steps: int = 20) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for t in range(steps):
        reward = 0.5 + 0.005 * t if not collapse else max(0.0, 0.5 - 0.05 * t)
        lines.append(json.dumps({"step": t, "reward/mean": reward, "mismatch/k3": k3 * (1 + 0.01 * t),
                                 "mismatch/abs/mean": math.sqrt(k3), "train/grad_norm": 1.0,
                                 "response/length/mean": 123.0, "collapse/fired": False,
                                 "time/elapsed_s": float(t), "memory/peak_mb": 10.0}))
    (run_dir / "log.jsonl").write_text("\n".join(lines) + "\n")


BASE_K3 = {"bf16": 2e-4, "aligned": 2e-5, "b4": 2e-3, "b3": 1.5e-2, "b2": 1e-1}


@pytest.mark.parametrize("pattern", ["mixed", "none", "all"])
def test_report_from_synthetic_run_logs_matches_a_direct_fit(tmp_path, pattern):
    grid_path = _write_grid(tmp_path)
    out = tmp_path / "exp"
    rng = np.random.default_rng(7)
    truth = {}
    for arm, k3 in BASE_K3.items():
        for seed in range(3):
            run_k3 = k3 * float(rng.uniform(0.8, 1.25))
            collapse = {"none": False, "all": True,
                        "mixed": arm == "b2" or (arm == "b3" and seed != 1)}[pattern]
            _write_log(out / "runs" / f"tiny__{arm}__s{seed}", run_k3, collapse)
            truth[(arm, seed)] = (run_k3, collapse)
    summary = summarize(out, load_grid(grid_path))
    rep = json.loads((out / "dose_report.json").read_text())
    assert rep == json.loads(json.dumps(summary["dose_report"], default=str))
    (cell,) = rep["cells"]
    fit_rows = [v for (arm, _), v in truth.items() if arm != "bf16"]  # dose arms + aligned, not bf16
    direct = fit_threshold([k for k, _ in fit_rows], [c for _, c in fit_rows])
    assert cell["fit"]["status"] == direct["status"] == {"mixed": "fit", "none": "no_collapse", "all": "all_collapse"}[pattern]
    assert cell["fit"]["threshold_k3"] == direct["threshold_k3"]
    assert cell["fit"]["interval_k3"] == direct["interval_k3"]
    assert cell["fit"]["n"] == 12
    arms = {a["arm"]: a for a in cell["arms"]}
    assert arms["bf16"]["role"] == "other" and arms["aligned"]["role"] == "aligned" and arms["b3"]["role"] == "dose"
    for arm in ARMS:
        want = sum(truth[(arm, s)][1] for s in range(3))
        assert arms[arm]["collapsed"] == want and arms[arm]["scored"] == 3
        gm = math.exp(np.mean([math.log(truth[(arm, s)][0]) for s in range(3)]))
        assert arms[arm]["step0_k3_geomean"] == pytest.approx(gm, rel=1e-12)
    md = (out / "dose_report.md").read_text()
    assert cell["fit"]["statement"] in md and "| tiny |" in md
    assert (out / "plots" / "dose_response.png").stat().st_size > 10_000
    if pattern == "mixed":
        assert 1.5e-3 < cell["fit"]["threshold_k3"] < 1.5e-1
        assert arms["bf16"]["fitted_p"] < 0.5
        assert cell["p_collapse_at_1e-3"] is not None
    else:
        assert cell["p_collapse_at_1e-3"] is None
        assert ("above" if pattern == "none" else "below") in cell["fit"]["statement"]


def test_report_with_an_exact_aligned_arm(tmp_path):
    """The aligned arm at k3 = 0 in every run (as the 52M long cell measured on an H200): scored,
    said to be exact in the tables, drawn at the plot's left edge, and fitted at -infinity."""
    grid_path = _write_grid(tmp_path)
    out = tmp_path / "exp"
    k3s, ys = [], []
    for arm, k3 in {**BASE_K3, "aligned": 0.0}.items():
        for seed in range(3):
            collapse = arm == "b2" or (arm == "b3" and seed != 1)
            _write_log(out / "runs" / f"tiny__{arm}__s{seed}", k3, collapse)
            if arm != "bf16":
                k3s.append(k3), ys.append(collapse)
    summarize(out, load_grid(grid_path))
    rep = json.loads((out / "dose_report.json").read_text())
    (cell,) = rep["cells"]
    arms = {a["arm"]: a for a in cell["arms"]}
    assert arms["aligned"]["scored"] == 3 and arms["aligned"]["exact"] == 3 and arms["aligned"]["collapsed"] == 0
    assert cell["fit"]["n"] == 12 and cell["fit"]["exact"] == 3
    direct = fit_threshold(k3s, ys)
    assert cell["fit"]["threshold_k3"] == direct["threshold_k3"] and cell["fit"]["status"] == direct["status"]
    md = (out / "dose_report.md").read_text()
    assert "0 (exact) in 3 of 3" in md and "not a finite number" not in md
    assert (out / "plots" / "dose_response.png").stat().st_size > 10_000
