"""The diagnosis' and the collapse signal's thresholds, at their edges.

Each test puts an input just inside and just outside a threshold, with the number that decides
computed here from its definition (docs/diagnosis.md, docs/metrics.md), independently of the code:

- profile detection calls a profile when it beats the second by more than two standard errors
  of the per-sequence k3 difference, SE = sample std (n - 1) / sqrt(n);
- a sequence is beyond rounding when its k3 is above FAR = 10 times its own rounding scale
  (or the set's, the larger);
- the collapse signal's grad spike is a grad norm above 10 times the running *median* of the
  earlier grad norms (a mean would be dragged by one earlier spike).
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from rla.diagnosis import verdict as V
from rla.diagnosis.core import MIN_DETECT_SEQUENCES, _detection
from rla.diagnosis.passes import per_sequence_k3
from rla.diagnosis.scale import RoundingScale
from rla.metrics import collapse_signal

N, T = 40, 16


def _k3(x: float) -> float:
    """k3 of one token whose log ratio pi - mu is x: e^x - 1 - x (docs/metrics.md)."""
    return math.expm1(x) - x


MU = -1.0


def _ratio_for(k: float) -> float:
    """The log ratio x > 0 whose k3 is ``k`` (bisection on e^x - 1 - x, increasing for x > 0)."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _k3(mid) < k else (lo, mid)
    return (lo + hi) / 2


def _pair(z_target: float, seed: int = 0):
    """Two candidates' per-token log ratios for N sequences (one value per sequence): B's k3
    exceeds A's by m + s e_i, with e_i of mean 0 and sample std 1, so z = m / (s / sqrt(N))."""
    e = np.random.default_rng(seed).normal(size=N)
    e = (e - e.mean()) / e.std(ddof=1)
    s = 1e-5
    m = z_target * s / math.sqrt(N)
    a = np.array([_ratio_for(1e-4)] * N)
    b = np.array([_ratio_for(1e-4 + m + s * ei) for ei in e])
    return np.repeat(a[:, None], T, axis=1), np.repeat(b[:, None], T, axis=1)


def _z(a, b) -> float:
    """The z of the spec: mean difference over its standard error, from the definitions."""
    d = [statistics.fmean(_k3(x) for x in rb) - statistics.fmean(_k3(x) for x in ra) for ra, rb in zip(a, b)]
    return statistics.fmean(d) / (statistics.stdev(d) / math.sqrt(len(d)))


@pytest.mark.parametrize("z_target, called", [(1.9, False), (2.1, True)])
def test_detection_calls_at_two_standard_errors(z_target, called):
    a, b = _pair(z_target)
    mu, mask = np.full((N, T), MU), np.ones((N, T), dtype=bool)
    assert N >= MIN_DETECT_SEQUENCES
    d = _detection({("a",): MU + a, ("b",): MU + b}, mu, mask)
    assert d.best == ("a",) and d.called is called
    assert d.z == pytest.approx(_z(a, b), rel=1e-9) and d.z == pytest.approx(z_target, abs=1e-6)
    assert ("too close to call" in d.note) is not called


def _judge(ratio: float):
    """judge() on sequences whose k3 is ``ratio`` times their own (and the set's) rounding scale."""
    x = 0.05
    pi, mu, mask = np.full((N, T), MU + x), np.full((N, T), MU), np.ones((N, T), dtype=bool)
    seq = per_sequence_k3(pi, mu, mask)
    scale = RoundingScale(k3=_k3(x) / ratio, per_profile={}, per_sequence=np.full(N, _k3(x) / ratio))
    return V.judge(None, [None] * N, list(range(N)), mu, mask, scale, {"vllm-0.33": pi}, "vllm-0.33", seq, seq,
                   sizes=None, bar=None, temperature=None)


def test_beyond_rounding_starts_at_ten_times_the_scale(monkeypatch):
    inside = _judge(9.5)
    assert (inside.kind, inside.ratio) == ("rounding", pytest.approx(9.5))
    handed = {}

    def beyond(model, records, indices, mu, mask, scale, per_seq, best_k3, ratio, flagged, *rest):
        handed["flagged"] = list(flagged)  # the hypotheses need the model; here: what reaches them
        return V.Verdict("beyond_rounding", None, "", ratio, list(flagged))

    monkeypatch.setattr(V, "_beyond", beyond)
    outside = _judge(10.5)
    assert outside.kind == "beyond_rounding" and handed["flagged"] == list(range(N))
    assert _judge(9.5).kind == "rounding" and len(handed["flagged"]) == N


def test_grad_spike_is_against_the_running_median():
    reward = [1.0] * 5 + [0.5] * 3  # falling from step 5 on (window 1 below)
    k3 = [1.0] * 8
    # one early spike (1000) drags a running mean to ~200; the median of the earlier values stays 1
    grad = [1.0, 1.0, 1000.0, 1.0, 1.0, 10.5, 9.5, 1.0]
    events = collapse_signal(k3, grad, reward, window=1, reward_drop=0.1)
    assert [(e.step, e.kinds) for e in events] == [(5, ("grad_spike", "reward_falling"))]
    assert statistics.median(grad[:5]) == 1.0 and statistics.fmean(grad[:5]) * 10 > 10.5  # a mean rule: no spike
    # 9.5 at step 6: below 10 x median(grad[:6]) = 10 x 1.0, not a spike although reward is falling
