"""rla.metrics against an independent fp64 NumPy oracle, hand-computed cases and extreme inputs.

The oracle below writes every docs/metrics.md formula the plain way (``exp(d) - 1 - d``, ``pi - mu``,
per-row Python loops, percentiles by hand), not through any helper of ``rla.metrics``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rla.metrics import (
    CollapseEvent,
    MetricsInputError,
    collapse_signal,
    mismatch,
    mismatch_from_records,
    names_as,
)
from rla.rollout.rollouts import RolloutRecord

LN2 = math.log(2.0)


def _percentile(x: np.ndarray, q: float) -> float:
    s = np.sort(x)
    h = (s.size - 1) * q / 100
    lo = int(math.floor(h))
    hi = min(lo + 1, s.size - 1)
    return float(s[lo] + (h - lo) * (s[hi] - s[lo]))


def oracle(train: np.ndarray, roll: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """docs/metrics.md, written out directly in fp64."""
    out: dict[str, float] = {}
    d = (train - roll)[mask]
    ad = np.abs(d)
    pi, mu = np.exp(train[mask]), np.exp(roll[mask])
    rho = np.exp(d)
    out["mismatch/k1"] = d.mean()
    out["mismatch/abs/mean"] = ad.mean()
    out["mismatch/abs/max"] = ad.max()
    for k, q in (("p50", 50), ("p95", 95), ("p99", 99), ("p999", 99.9)):
        out[f"mismatch/abs/{k}"] = _percentile(ad, q)
    out["mismatch/k2"] = (d**2).mean() / 2
    out["mismatch/k3"] = (rho - 1 - d).mean()
    out["mismatch/prob_abs/mean"] = np.abs(pi - mu).mean()
    out["mismatch/prob_abs/max"] = np.abs(pi - mu).max()
    out["mismatch/prob_pearson"] = np.corrcoef(pi, mu)[0, 1]
    out["mismatch/chi2_token"] = (rho**2).mean() - 1
    out["mismatch/is/ess"] = rho.sum() ** 2 / (d.size * (rho**2).sum())
    for eps in (0.2, 0.1):
        out[f"mismatch/clip_leak/{eps}"] = ((rho < 1 - eps) | (rho > 1 + eps)).mean()
    out["mismatch/bitwise/equal"] = (d == 0).mean()
    out["mismatch/bitwise/diff_gt_1e-6"] = (ad > 1e-6).mean()
    S, L, pos_abs = [], [], {q: [] for q in range(4)}
    for i in range(train.shape[0]):
        cols = np.flatnonzero(mask[i])
        if cols.size == 0:
            continue
        di = train[i, cols] - roll[i, cols]
        S.append(sum(di.tolist()))
        length = cols[-1] - cols[0] + 1
        L.append(length)
        for c, v in zip(cols, di):
            pos_abs[min(3, int(4 * (c - cols[0]) / length))].append(abs(v))
    S, L = np.array(S), np.array(L, dtype=float)
    out["mismatch/seq/log_ratio/mean"] = S.mean()
    out["mismatch/seq/log_ratio/std"] = math.sqrt(((S - S.mean()) ** 2).mean())
    out["mismatch/seq/log_ratio/min"] = S.min()
    out["mismatch/seq/log_ratio/max"] = S.max()
    out["mismatch/seq/chi2"] = np.exp(2 * S).mean() - 1
    if np.unique(L).size > 1:
        out["mismatch/seq/drift_per_1k"] = np.polyfit(L, S, 1)[0] * 1000
    for q in range(4):
        if pos_abs[q]:
            out[f"mismatch/by_position/q{q + 1}"] = float(np.mean(pos_abs[q]))
    buckets = {
        "lt1e-3": mu < 1e-3,
        "1e-3..0.1": (mu >= 1e-3) & (mu < 0.1),
        "0.1..0.9": (mu >= 0.1) & (mu <= 0.9),
        "gt0.9": mu > 0.9,
    }
    for k, sel in buckets.items():
        if sel.any():
            out[f"mismatch/by_prob/{k}"] = ad[sel].mean()
    return {k: float(v) for k, v in out.items()}


def random_batch(seed: int = 0, B: int = 7, T: int = 64, scale: float = 0.05):
    """Ragged response masks (offset by a prompt), one all-masked row, garbage in the padding."""
    rng = np.random.default_rng(seed)
    roll = -rng.exponential(2.0, (B, T))
    train = np.minimum(roll + rng.normal(0, scale, (B, T)), 0.0)
    mask = np.zeros((B, T), dtype=bool)
    for i in range(B):
        start = int(rng.integers(0, 8))
        mask[i, start : start + int(rng.integers(1, T - start))] = True
    mask[3] = False  # an all-masked row
    train[~mask] = np.nan  # padding may hold anything
    roll[~mask] = 5.0
    return train, roll, mask


def assert_matches(got: dict[str, float], want: dict[str, float], rtol: float, atol: float = 0.0):
    missing = set(want) - set(got)
    assert not missing, f"missing keys {sorted(missing)}"
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=rtol, abs=atol), k


def test_random_batch_matches_oracle():
    train, roll, mask = random_batch()
    got = mismatch(train, roll, mask)
    want = oracle(train, roll, mask)
    # Both sides are fp64; they differ only in summation order and in expm1 vs exp(d) - 1, whose
    # cancellation costs ~eps / d^2 ~ 1e-13 relative at |d| ~ 0.05.
    assert_matches(got, want, rtol=1e-10, atol=1e-15)
    assert got["mismatch/n_tokens"] == mask.sum()
    assert got["mismatch/n_seqs"] == mask.any(axis=1).sum() == 6
    assert got["mismatch/k3"] > 1e-4 and got["mismatch/abs/p999"] > 0  # not a degenerate batch


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_torch_low_precision_inputs_are_upcast_exactly(dtype):
    train, roll, mask = random_batch(seed=1)
    t = torch.from_numpy(np.nan_to_num(train)).to(dtype)
    r = torch.from_numpy(roll).to(dtype)
    got = mismatch(t, r, torch.from_numpy(mask).long())
    want = oracle(t.double().numpy(), r.double().numpy(), mask)
    assert_matches(got, want, rtol=1e-10, atol=1e-15)


def test_zero_delta():
    rng = np.random.default_rng(2)
    roll = -rng.exponential(1.0, (3, 20))
    got = mismatch(roll.copy(), roll, np.ones((3, 20)))
    for k in ("k1", "k2", "k3", "chi2_token", "abs/max", "prob_abs/max", "seq/chi2",
              "clip_leak/0.2", "clip_leak/0.1", "bitwise/diff_gt_1e-6", "seq/log_ratio/std"):
        assert got[f"mismatch/{k}"] == 0.0, k
    assert got["mismatch/is/ess"] == 1.0
    assert got["mismatch/bitwise/equal"] == 1.0
    assert got["mismatch/prob_pearson"] == pytest.approx(1.0, abs=1e-15)


def test_hand_computed_k3_and_seq_chi2():
    # Two one-token sequences with rho = 2 and rho = 1/2 (delta = +-ln 2):
    # k3 = ((2 - 1 - ln2) + (1/2 - 1 + ln2)) / 2 = 1/4; chi2_token = seq/chi2 = (4 + 1/4)/2 - 1
    # = 9/8; ess = (5/2)^2 / (2 * 17/4) = 25/34; both tokens leak either clip range.
    roll = np.log(np.array([[0.25], [0.25]]))
    train = np.log(np.array([[0.5], [0.125]]))
    got = mismatch(train, roll, np.ones((2, 1), dtype=bool))
    assert got["mismatch/k1"] == pytest.approx(0.0, abs=1e-16)
    assert got["mismatch/k2"] == pytest.approx(LN2**2 / 2, rel=1e-15)
    assert got["mismatch/k3"] == pytest.approx(0.25, rel=1e-15)
    assert got["mismatch/chi2_token"] == pytest.approx(1.125, rel=1e-15)
    assert got["mismatch/seq/chi2"] == pytest.approx(1.125, rel=1e-15)
    assert got["mismatch/is/ess"] == pytest.approx(25 / 34, rel=1e-15)
    assert got["mismatch/clip_leak/0.2"] == 1.0 and got["mismatch/clip_leak/0.1"] == 1.0
    assert got["mismatch/prob_abs/mean"] == pytest.approx((0.25 + 0.125) / 2, rel=1e-15)
    assert got["mismatch/seq/log_ratio/min"] == pytest.approx(-LN2, rel=1e-15)


def test_k3_keeps_digits_for_tiny_delta():
    # rho - 1 - d = d^2/2 + d^3/6 + ...; exp(d) - 1 - d in fp64 is pure rounding noise at 1e-9.
    d = 1e-9
    roll = np.full((1, 10), -1.0)
    got = mismatch(roll + d, roll, np.ones((1, 10), dtype=bool))
    dd = (roll + d - roll)[0, 0]  # the delta fp64 actually represents
    assert got["mismatch/k3"] == pytest.approx(dd**2 / 2 + dd**3 / 6, rel=1e-12)
    assert got["mismatch/chi2_token"] == pytest.approx(2 * dd + 2 * dd**2, rel=1e-12)


def test_extreme_delta_50_finite_and_exact():
    rng = np.random.default_rng(3)
    B, T = 4, 200
    signs = rng.choice([-1.0, 1.0], (B, T))
    roll = np.where(signs > 0, -60.0, -10.0)
    train = roll + 50.0 * signs
    mask = np.ones((B, T), dtype=bool)
    mask[2] = False
    mask[1, 150:] = False
    got = mismatch(train, roll, mask)
    want = oracle(train, roll, mask)
    want.pop("mismatch/seq/chi2")  # exp(2 S) with S ~ 1e3 overflows the naive oracle
    assert_matches(got, want, rtol=1e-12)
    assert all(math.isfinite(v) for k, v in got.items() if k != "mismatch/seq/chi2")
    assert got["mismatch/abs/max"] == 50.0 and got["mismatch/clip_leak/0.1"] == 1.0


def test_100k_token_sequence_mixed_with_empty_rows():
    mpmath = pytest.importorskip("mpmath")
    rng = np.random.default_rng(4)
    T = 100_000
    roll = -rng.exponential(1.0, (4, T))
    train = np.minimum(roll + rng.normal(0, 0.01, (4, T)), 0.0)
    mask = np.zeros((4, T), dtype=bool)
    mask[0] = True  # 100k tokens
    mask[2, 10:5000] = True  # rows 1 and 3 are all masked out
    got = mismatch(train, roll, mask)
    want = oracle(train, roll, mask)
    assert_matches(got, want, rtol=1e-9, atol=1e-15)  # 1e5-term sums in different orders
    # the sequence statistics use rows 0 and 2 only; check them exactly with mpmath
    S = [mpmath.fsum(mpmath.mpf(float(x)) for x in (train[i] - roll[i])[mask[i]]) for i in (0, 2)]
    chi2 = (mpmath.exp(2 * S[0]) + mpmath.exp(2 * S[1])) / 2 - 1
    assert got["mismatch/n_seqs"] == 2
    assert got["mismatch/seq/log_ratio/max"] == pytest.approx(float(max(S)), rel=1e-15)
    assert got["mismatch/seq/chi2"] == pytest.approx(float(chi2), rel=1e-12)


def test_seq_chi2_overflow_is_inf_with_finite_log_form():
    mpmath = pytest.importorskip("mpmath")
    T = 100_000
    roll = np.full((2, T), -50.0)
    train = np.zeros((2, T))
    train[1, :] = -100.0  # row 0: S = +5e6, row 1: S = -5e6
    got = mismatch(train, roll, np.ones((2, T), dtype=bool))
    assert got["mismatch/seq/chi2"] == math.inf  # exp(1e7) / 2 really exceeds float64
    want = mpmath.log((mpmath.exp(mpmath.mpf(1e7)) + mpmath.exp(mpmath.mpf(-1e7))) / 2)
    assert got["mismatch/seq/log_mean_rho2"] == pytest.approx(float(want), rel=1e-15)
    assert got["mismatch/seq/log_ratio/max"] == 5e6
    assert got["mismatch/is/ess"] == pytest.approx(0.5, rel=1e-12)  # half the weights ~ e^50
    # just below the float64 limit the value is finite and exact, not cut off early
    roll = np.array([[-709.781 / 2]])
    got = mismatch(np.zeros((1, 1)), roll, np.ones((1, 1), dtype=bool))
    want = mpmath.expm1(2 * mpmath.mpf(float(-roll[0, 0])))
    assert got["mismatch/seq/chi2"] == pytest.approx(float(want), rel=1e-12)


def test_by_position_quarters_hand_built():
    T = 12
    roll = np.full((3, T), -1.0)
    train = roll.copy()
    mask = np.zeros((3, T), dtype=bool)
    mask[0, 2:10] = True  # length 8 after a 2-token prompt; |delta| = position index / 100
    train[0, 2:10] -= np.arange(8) / 100
    mask[1, 0:2] = True  # length 2: positions 0, 1 -> quarters q1, q3; |delta| = 1, 3
    train[1, 0:2] -= np.array([0.01, 0.03])
    got = mismatch(train, roll, mask)
    assert got["mismatch/by_position/q1"] == pytest.approx((0.00 + 0.01 + 0.01) / 3, rel=1e-12)
    assert got["mismatch/by_position/q2"] == pytest.approx((0.02 + 0.03) / 2, rel=1e-12)
    assert got["mismatch/by_position/q3"] == pytest.approx((0.04 + 0.05 + 0.03) / 3, rel=1e-12)
    assert got["mismatch/by_position/q4"] == pytest.approx((0.06 + 0.07) / 2, rel=1e-12)


def test_empty_buckets_are_omitted_not_nan():
    roll = np.full((1, 1), math.log(0.95))
    got = mismatch(roll - 0.01, roll, np.ones((1, 1)))
    assert "mismatch/by_position/q1" in got and "mismatch/by_position/q2" not in got
    assert set(k for k in got if k.startswith("mismatch/by_prob/")) == {"mismatch/by_prob/gt0.9"}
    assert "mismatch/prob_pearson" not in got and "mismatch/seq/drift_per_1k" not in got
    assert not any(math.isnan(v) for v in got.values())


def test_by_prob_bucket_edges():
    mu = np.array([[1e-4, 1e-3, 0.05, 0.1, 0.9, 0.95]])
    deltas = np.array([[-0.1, -0.2, -0.3, -0.4, -0.5, -0.6]])
    got = mismatch(np.log(mu) + deltas, np.log(mu), np.ones_like(mu, dtype=bool))
    # mu is exp(log(mu)), which may move an edge value by one ulp; the edges 1e-3, 0.1 and 0.9
    # land in the bucket their exp(log) falls in, which the oracle reproduces.
    assert_matches(got, oracle(np.log(mu) + deltas, np.log(mu), np.ones_like(mu, dtype=bool)),
                   rtol=1e-12)
    assert got["mismatch/by_prob/lt1e-3"] == pytest.approx(0.1, rel=1e-12)
    assert got["mismatch/by_prob/gt0.9"] == pytest.approx(0.6, rel=1e-12)


def test_drift_per_1k_and_response_lengths():
    lengths = [10, 20, 40]
    roll = np.full((3, 40), -2.0)
    mask = np.zeros((3, 40), dtype=bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    got = mismatch(roll + 0.002, roll, mask)  # S_i = 0.002 L_i -> 2 nats per 1k tokens
    assert got["mismatch/seq/drift_per_1k"] == pytest.approx(2.0, rel=1e-9)
    longer = mismatch(roll + 0.002, roll, mask, response_lengths=np.array([20, 40, 80]))
    assert "mismatch/by_position/q3" not in longer  # every token in the first half of L_i
    assert longer["mismatch/seq/drift_per_1k"] == pytest.approx(1.0, rel=1e-9)
    with pytest.raises(MetricsInputError, match=r"response_lengths\[1\] = 19"):
        mismatch(roll + 0.002, roll, mask, response_lengths=np.array([10, 19, 40]))


def test_padding_ignored_including_nan_and_positive():
    train, roll, mask = random_batch(seed=5)
    train2, roll2 = train.copy(), roll.copy()
    train2[~mask], roll2[~mask] = np.inf, 3.0
    assert mismatch(train, roll, mask) == mismatch(train2, roll2, mask)


@pytest.mark.parametrize(
    "setup, pattern",
    [
        (lambda t, r, m: (t, r, np.zeros_like(m)), "mask selects no token"),
        (lambda t, r, m: (t[:, :-1], r, m), "one \\[B, T\\] shape"),
        (lambda t, r, m: (t[0], r[0], m[0]), "one \\[B, T\\] shape"),
        (lambda t, r, m: (t.astype(np.int64), r, m), "train_logprobs must be a floating"),
        (lambda t, r, m: (t, torch.zeros(r.shape, dtype=torch.long), m), "rollout_logprobs must"),
        (lambda t, r, m: (t, r, m * 2), "mask must be bool"),
    ],
)
def test_input_errors(setup, pattern):
    roll = np.full((2, 3), -1.0)
    args = setup(roll.copy(), roll, np.ones((2, 3), dtype=np.int64))
    with pytest.raises(MetricsInputError, match=pattern):
        mismatch(*args)


def test_nonfinite_and_positive_logprobs_on_masked_positions():
    roll = np.full((2, 4), -1.0)
    mask = np.ones((2, 4), dtype=bool)
    for bad in (np.nan, np.inf, -np.inf):
        train = roll.copy()
        train[1, 2] = bad
        with pytest.raises(MetricsInputError, match=r"train_logprobs has 1 non-finite.*\[1, 2\]"):
            mismatch(train, roll, mask)
    r2 = roll.copy()
    r2[0, 1] = r2[1, 3] = 1e-3
    with pytest.raises(MetricsInputError, match="rollout_logprobs has 2 positive"):
        mismatch(roll, r2, mask)
    r2[0, 1] = r2[1, 3] = 5e-7  # engine rounding within the 1e-6 tolerance
    assert math.isfinite(mismatch(roll, r2, mask)["mismatch/k3"])
    assert issubclass(MetricsInputError, ValueError)


def test_mismatch_from_records_pads_and_matches():
    rng = np.random.default_rng(6)
    g = torch.Generator().manual_seed(6)
    recs, train_rows = [], []
    for n in (5, 1, 9):
        lp = (-rng.exponential(1.0, n)).tolist()
        recs.append(RolloutRecord([1, 2], list(range(n)), lp, 1.0, 1.0, -1, "vllm"))
        train_rows.append(torch.tensor(lp, dtype=torch.float64) + 0.01 * torch.randn(n, generator=g).double())
    train_rows = [torch.clamp(t, max=0.0) for t in train_rows]
    train = np.zeros((3, 9))
    roll = np.zeros((3, 9))
    mask = np.zeros((3, 9), dtype=bool)
    for i, (rec, t) in enumerate(zip(recs, train_rows)):
        n = len(rec.logprobs)
        train[i, :n], roll[i, :n], mask[i, :n] = t.numpy(), rec.logprobs, True
    assert_matches(mismatch_from_records(recs, train_rows), oracle(train, roll, mask), rtol=1e-10)
    with pytest.raises(MetricsInputError, match="record 1"):
        mismatch_from_records(recs, [train_rows[0], train_rows[0], train_rows[2]])
    with pytest.raises(MetricsInputError, match="3 records but 2"):
        mismatch_from_records(recs, train_rows[:2])


def test_names_as():
    train, roll, mask = random_batch(seed=7)
    m = mismatch(train, roll, mask)
    verl = names_as(m, "verl")
    assert verl["rollout_corr/kl"] == -m["mismatch/k1"]
    pairs = {
        "rollout_corr/k3_kl": "mismatch/k3",
        "rollout_corr/chi2_token": "mismatch/chi2_token",
        "rollout_corr/chi2_seq": "mismatch/seq/chi2",
        "training/rollout_probs_diff_mean": "mismatch/prob_abs/mean",
        "training/rollout_probs_diff_max": "mismatch/prob_abs/max",
        "training/rollout_actor_probs_pearson_corr": "mismatch/prob_pearson",
        "rollout_corr/rollout_is_eff_sample_size": "mismatch/is/ess",
    }
    for new, old in pairs.items():
        assert verl[new] == m[old] and old not in verl
    assert "mismatch/k1" not in verl and verl["mismatch/k2"] == m["mismatch/k2"]
    assert len(verl) == len(m)
    trl = names_as(m, "trl")
    assert trl["sampling/sampling_logp_difference/mean"] == m["mismatch/abs/mean"]
    assert trl["sampling/sampling_logp_difference/max"] == m["mismatch/abs/max"]
    assert trl["mismatch/k3"] == m["mismatch/k3"] and "mismatch/abs/mean" not in trl
    orl = names_as(m, "openrlhf")
    assert orl["vllm_kl"] == -m["mismatch/k1"] and "mismatch/k1" not in orl  # OpenRLHF's logger adds train/
    assert len(orl) == len(m) and orl["mismatch/k3"] == m["mismatch/k3"]
    with pytest.raises(ValueError, match="known styles: nemo-rl, openrlhf, trl, verl"):
        names_as(m, "slime")


def test_openrlhf_vllm_kl_matches_its_definition():
    """OpenRLHF 0.11.2's ``vllm_kl = masked_mean(rollout_log_probs - old_log_probs, mask)``
    (models/loss.py), written out independently: a token mean over the masked positions."""
    train, roll, mask = random_batch(seed=11)
    expected = float(np.where(mask, roll - train, 0.0).sum() / mask.sum())
    got = names_as(mismatch(train, roll, mask), "openrlhf")["vllm_kl"]
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)  # fp64 sums in another order


def test_nan_policy_mask_drops_nan_tokens_only():
    """TRL marks tokens vLLM could not score with NaN. ``nan_policy="mask"`` equals the oracle on
    the mask without those tokens; by_position keeps the full response geometry."""
    train, roll, mask = random_batch(seed=12)
    rng = np.random.default_rng(12)
    nan_at = mask & (rng.random(mask.shape) < 0.1)
    for i in range(mask.shape[0]):  # every row's first token stays (it anchors the positions) ...
        if mask[i].any():
            nan_at[i, np.argmax(mask[i])] = False
    nan_at[0] = mask[0]  # ... except row 0, which is NaN throughout and leaves the seq metrics
    assert nan_at.sum() >= 10 and (mask & ~nan_at).any(axis=1).sum() >= 4
    t2, r2 = train.copy(), roll.copy()
    t2[nan_at & (rng.random(mask.shape) < 0.5)] = np.nan
    r2[nan_at] = np.nan
    got = mismatch(t2, r2, mask, nan_policy="mask")
    assert got["mismatch/n_nan_masked"] == float(nan_at.sum())
    keep = mask & ~nan_at
    want = oracle(train, roll, keep)
    position_keys = [k for k in want if k.startswith("mismatch/by_position") or "drift" in k]
    assert_matches({k: v for k, v in got.items() if k not in position_keys},
                   {k: v for k, v in want.items() if k not in position_keys}, rtol=1e-10)
    # Positions are measured against the original response span (NaN tokens included).
    lengths = mask.sum(axis=1)
    ref = mismatch(train, roll, keep, response_lengths=lengths)
    for k in position_keys:
        if k in ref:
            assert got[k] == pytest.approx(ref[k], rel=1e-12), k
    with pytest.raises(MetricsInputError, match="train_logprobs has .* non-finite"):
        mismatch(t2, r2, mask)  # the default still refuses NaN


def test_nan_policy_keeps_other_bad_values_errors():
    roll = np.full((2, 4), -1.0)
    mask = np.ones((2, 4), dtype=bool)
    train = roll.copy()
    train[0, 0] = np.nan
    train[1, 2] = np.inf
    with pytest.raises(MetricsInputError, match=r"train_logprobs has 1 non-finite.*\[1, 2\] = inf"):
        mismatch(train, roll, mask, nan_policy="mask")
    train[1, 2] = 1e-3
    with pytest.raises(MetricsInputError, match="1 positive"):
        mismatch(train, roll, mask, nan_policy="mask")
    with pytest.raises(MetricsInputError, match="every one of the 8 masked"):
        mismatch(np.full((2, 4), np.nan), roll, mask, nan_policy="mask")
    with pytest.raises(MetricsInputError, match="nan_policy must be one of"):
        mismatch(roll, roll, mask, nan_policy="omit")


def _healthy(n=60, seed=8):
    rng = np.random.default_rng(seed)
    k3 = 1e-3 * (1 + 0.2 * rng.random(n))
    grad = 1.0 + 0.1 * rng.random(n)
    reward = np.minimum(0.3 + 0.01 * np.arange(n), 0.8) + 0.01 * rng.standard_normal(n)
    return k3, grad, reward


def test_collapse_signal_quiet_on_healthy_run():
    assert collapse_signal(*_healthy()) == []


def test_collapse_signal_fires_on_k3_spike_with_falling_reward():
    k3, grad, reward = _healthy()
    k3[40:] = 0.05  # 50x step 0
    reward[42:] = 0.4  # from ~0.8
    events = collapse_signal(k3, grad, reward)
    # window 5: at step 42 the trailing mean is (4 x 0.8 + 0.4) / 5 = 0.72 < best 0.8 - 0.05
    assert [e.step for e in events] == list(range(42, 60))
    assert events[0].kinds == ("k3_spike", "reward_falling")
    assert isinstance(events[0], CollapseEvent) and "k3" in events[0].message
    assert collapse_signal(k3, grad, _healthy()[2]) == []  # spike alone: not a collapse
    k3b, _, _ = _healthy()
    assert collapse_signal(k3b, grad, reward) == []  # reward dip alone: not a collapse


def test_collapse_signal_grad_spike_and_nonfinite():
    k3, grad, reward = _healthy()
    grad[50] = 30.0
    reward[45:] = 0.5
    events = collapse_signal(k3, grad, reward)
    assert [(e.step, e.kinds) for e in events] == [(50, ("grad_spike", "reward_falling"))]
    grad[55] = np.nan
    k3[57] = np.inf
    events = collapse_signal(k3, grad, _healthy()[2])  # healthy reward: only the non-finite
    assert [(e.step, e.kinds) for e in events] == [(55, ("nonfinite_grad_norm",)),
                                                  (57, ("nonfinite_k3",))]
    assert collapse_signal(k3[:50], None, reward[:50]) == []
    with pytest.raises(MetricsInputError, match="one length"):
        collapse_signal(k3, grad[:-1], reward)
    with pytest.raises(MetricsInputError, match="baseline"):
        collapse_signal([np.nan, 1.0], [1.0, 1.0], [0.0, 0.0])
