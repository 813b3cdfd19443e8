"""rla.diagnosis.health: each framework's dashboard number as that framework computes it, written
out independently here from the framework's code (NeMo-RL's ClippedPGLossFn, TRL's sequence_mask
ratio), with the thresholds the frameworks publish. verl's own ``compute_offpolicy_metrics`` is
compared in ``tests/integrations/test_integration_verl_dump.py`` (it needs verl)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rla.diagnosis.health import THRESHOLDS, health
from rla.metrics import mismatch, names_as, pad_rows


def _rows(seed, scale):
    g = np.random.default_rng(seed)
    mu = [-g.random(n) * 2 for n in (5, 9, 3)]
    return [m + scale * g.standard_normal(m.size) for m in mu], mu


def test_the_readings_are_the_frameworks_formulas():
    pi, mu = _rows(0, 0.05)
    pi = [np.minimum(p, 0.0) for p in pi]
    got = {(r.framework, r.key): r for r in health(pi, mu)}
    d = np.concatenate([p - m for p, m in zip(pi, mu)])
    # NeMo-RL: masked_mean(exp(|generation - prev|)); calculate_kl k3 of (generation, prev)
    assert got["nemo-rl", "token_mult_prob_error"].value == pytest.approx(np.mean(np.exp(np.abs(d))), rel=1e-12)
    assert got["nemo-rl", "gen_kl_error"].value == pytest.approx(np.mean(np.exp(d) - d - 1), rel=1e-9)
    # TRL sequence_mask: exp(sum over the sequence of old - sampling)
    seq = max(math.exp(math.fsum(p - m)) for p, m in zip(pi, mu))
    assert got["trl", "sequence_ratio_max"].value == pytest.approx(seq, rel=1e-12)
    assert got["rla", "share_outside_0.9_1.1"].value == np.mean((np.exp(d) < 0.9) | (np.exp(d) > 1.1))
    assert got["rla", "raw_ratio/max"].value == pytest.approx(np.exp(d).max(), rel=1e-15)
    assert got["verl", "rollout_corr/kl"].value == pytest.approx(-np.mean(d), rel=1e-12)
    t, mask = pad_rows(pi)
    r, _ = pad_rows(mu)
    assert names_as(mismatch(t, r, mask), "nemo-rl")["gen_kl_error"] == got["nemo-rl", "gen_kl_error"].value


def test_verdicts_follow_the_published_thresholds():
    pi, mu = _rows(1, 1e-3)
    pi = [np.minimum(p, 0.0) for p in pi]
    calm = {(r.framework, r.key): r.verdict for r in health(pi, mu)}
    assert all(calm[k] == "ok" for k in THRESHOLDS), calm
    pi, mu = _rows(2, 0.8)
    pi = [np.minimum(p, 0.0) for p in pi]
    wild = {(r.framework, r.key): r for r in health(pi, mu)}
    assert wild["nemo-rl", "gen_kl_error"].verdict == "over" and "0.01" in wild["nemo-rl", "gen_kl_error"].source
    assert wild["verl", "rollout_corr/k3_kl"].verdict == "over"
    assert wild["verl", "training/rollout_probs_diff_mean"].verdict == "no threshold"
