"""rla.metrics.vocab_kl against an fp64 oracle: the KL written over the whole vocabulary (exact
where the engine's list is complete), and, for top-k lists, the KL of the two distributions with
the unlisted tokens merged (the lower bound it states), which it must never exceed."""

import math

import numpy as np
import pytest

from rla.metrics import MetricsInputError, vocab_kl

V, K = 11, 3


def _dists(seed, n=20):
    g = np.random.default_rng(seed)
    q = g.dirichlet(np.full(V, 0.3), size=n)  # engine
    p = 0.7 * q + 0.3 * g.dirichlet(np.full(V, 0.3), size=n)  # trainer, nearby
    return q, p


def _listed(q, p, k):
    top = np.argsort(-q, axis=1)[:, :k]
    eng = [np.log(q[t, top[t]]) for t in range(len(q))]
    tr = [np.log(p[t, top[t]]) for t in range(len(q))]
    rest = [np.setdiff1d(np.arange(V), top[t]) for t in range(len(q))]
    tail = [math.log(p[t, r].sum()) if len(r) else -math.inf for t, r in enumerate(rest)]
    return top, eng, tr, tail, rest


def test_complete_lists_give_the_kl_exactly():
    q, p = _dists(0)
    _, eng, tr, tail, _ = _listed(q, p, V)
    got = vocab_kl(eng, tr, tail, [True] * len(q))
    oracle = (q * (np.log(q) - np.log(p))).sum(1)
    assert got["vocab_kl/kind"] == "exact"
    assert np.allclose(got["vocab_kl/per_token"], oracle, rtol=1e-12, atol=0)


def test_top_k_lists_give_the_merged_kl_a_lower_bound_tight_when_the_tails_are_proportional():
    q, p = _dists(1)
    top, eng, tr, tail, rest = _listed(q, p, K)
    got = np.array(vocab_kl(eng, tr, tail, [False] * len(q))["vocab_kl/per_token"])
    exact = (q * (np.log(q) - np.log(p))).sum(1)
    rq = np.array([q[t, r].sum() for t, r in enumerate(rest)])
    rp = np.array([p[t, r].sum() for t, r in enumerate(rest)])
    merged = np.array([(q[t, top[t]] * np.log(q[t, top[t]] / p[t, top[t]])).sum() for t in range(len(q))]) + rq * np.log(rq / rp)
    assert np.allclose(got, merged, rtol=1e-10, atol=1e-15)
    assert (got <= exact + 1e-15).all() and (got < exact - 1e-6).any()  # a bound, and not the KL itself
    # the engine's tail proportional to the trainer's: the bound is the KL
    q2 = q.copy()
    for t, r in enumerate(rest):
        q2[t, r] = rq[t] * p[t, r] / rp[t]
    _, eng2, tr2, tail2, _ = _listed(q2, p, K)
    tight = vocab_kl(eng2, tr2, tail2, [False] * len(q))
    assert tight["vocab_kl/kind"] == "lower_bound"
    assert np.allclose(tight["vocab_kl/per_token"], (q2 * np.log(q2 / p)).sum(1), rtol=1e-10, atol=1e-15)


def test_mass_the_trainer_gives_no_probability_is_infinite_and_bad_input_is_named():
    got = vocab_kl([[math.log(0.5), math.log(0.5)]], [[math.log(1.0), -math.inf]], [-math.inf], [True])
    assert got["vocab_kl/max"] == math.inf
    with pytest.raises(MetricsInputError, match="one entry per token"):
        vocab_kl([[0.0]], [[0.0]], [0.0, 0.0], [True])
    with pytest.raises(MetricsInputError, match="token 0"):
        vocab_kl([[0.0, -1.0]], [[0.0]], [0.0], [True])
