"""process_logits against an independent NumPy expression of the engines' convention;
sample_token against torch.multinomial itself."""

import numpy as np
import pytest
import torch

from rla.rollout.train_logprobs import micro_batches
from rla.rollout.sampling import process_logits, sample_token

try:
    from hypothesis import given, settings, strategies as st
except ImportError:  # a test extra (pyproject [test]); the fixed-case test below still runs
    given = None


def numpy_processed(logits, t, top_k, top_p):
    x = logits.astype(np.float64) / t
    out = np.empty_like(x)
    for i, row in enumerate(x):
        keep = np.ones_like(row, dtype=bool)
        if top_k > 0:
            kth = np.sort(row)[::-1][top_k - 1]
            keep &= row >= kth
        if top_p < 1:
            order = np.argsort(-np.where(keep, row, -np.inf), kind="stable")
            p = np.exp(row[order] - row[order].max()) * keep[order]
            p /= p.sum()
            before = np.cumsum(p) - p
            k2 = np.zeros_like(keep)
            k2[order] = before < top_p
            keep &= k2
        z = np.where(keep, row, -np.inf)
        out[i] = z - (np.log(np.exp(z[keep] - z[keep].max()).sum()) + z[keep].max())
    return out


@pytest.mark.parametrize("t,top_k,top_p", [(1.0, -1, 1.0), (0.7, -1, 1.0), (1.0, 5, 1.0), (1.3, -1, 0.9), (0.8, 20, 0.5)])
def test_process_logits_matches_numpy(t, top_k, top_p):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(6, 101, generator=g) * 3).bfloat16()
    got = process_logits(logits, t, top_k, top_p).double().numpy()
    want = numpy_processed(logits.float().numpy(), t, top_k, top_p)
    assert np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    assert np.abs(got[finite] - want[finite]).max() < 1e-5
    # a filtered distribution is renormalised over what is left
    assert np.allclose(np.exp(got).sum(-1), 1.0, atol=1e-5)
    if top_k > 0:
        assert (np.isfinite(got).sum(-1) <= top_k).all()


def test_top_k_one_is_greedy_with_logprob_zero():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(7))
    lp = process_logits(logits, 1.0, top_k=1)
    assert torch.equal(lp.argmax(-1), logits.argmax(-1))
    assert (lp.max(-1).values == 0).all()


def test_micro_batches_respect_budget_and_cover_everything():
    lengths = [5, 100, 30, 30, 7, 64, 1, 99]
    groups = micro_batches(lengths, max_tokens=128)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        assert len(g) == 1 or max(lengths[i] for i in g) * len(g) <= 128


# ------------------------------------------------------------------ sample_token vs torch.multinomial
def _same_draw(probs: torch.Tensor, seed: int) -> torch.Tensor:
    """Assert sample_token == torch.multinomial(probs, 1) from identically seeded generators, that
    both leave their generator in the same state, and that the draws after them match too."""
    g_ref = torch.Generator().manual_seed(seed)
    g_new = torch.Generator().manual_seed(seed)
    want = torch.multinomial(probs, 1, generator=g_ref)
    got = sample_token(probs, g_new)
    assert got.dtype == want.dtype == torch.long and got.shape == want.shape
    assert torch.equal(got, want)
    assert torch.equal(g_new.get_state(), g_ref.get_state())
    assert torch.equal(sample_token(probs, g_new), torch.multinomial(probs, 1, generator=g_ref))
    return got


def _probs(seed, batch, vocab, temperature, top_k, top_p, peak):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(batch, vocab, generator=g) * 3).bfloat16()
    logits[:, 0] += peak  # peak 40: near one-hot rows (every other probability below ~1e-15)
    return process_logits(logits, temperature, top_k, top_p).exp()


@pytest.mark.parametrize("batch,vocab", [(1, 2), (3, 64), (64, 64), (7, 1000), (2, 50000)])
@pytest.mark.parametrize("temperature,top_k,top_p,peak", [
    (1.0, -1, 1.0, 0.0), (0.6, 5, 1.0, 0.0), (1.3, -1, 0.8, 0.0), (1.0, 1, 1.0, 0.0), (1.0, -1, 1.0, 40.0),
    (0.7, 20, 0.5, 6.0),
])
def test_sample_token_is_multinomial_bit_for_bit(batch, vocab, temperature, top_k, top_p, peak):
    probs = [_probs(s, batch, vocab, temperature, top_k, top_p, peak) for s in range(12)]
    tokens = torch.cat([_same_draw(p, 1000 + s) for s, p in enumerate(probs)])
    top = torch.cat([p.argmax(-1, keepdim=True) for p in probs])
    if top_k == 1 or peak == 40.0:
        assert (tokens == top).float().mean() > 0.9  # the kept or peaked token, (nearly) always
    elif peak == 0.0:
        assert (tokens != top).any()  # a real draw, not an argmax


def test_sample_token_never_draws_a_filtered_token_and_takes_1d():
    probs = _probs(0, 32, 64, 1.0, 3, 1.0, 0.0)
    for s in range(20):
        tok = _same_draw(probs, s)
        assert (probs.gather(-1, tok) > 0).all()
    _same_draw(probs[0], 5)  # [V] -> [1], as multinomial


def test_sample_token_rejects_bad_input():
    with pytest.raises(TypeError, match="floating-point"):
        sample_token(torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[V\] or \[B, V\]"):
        sample_token(torch.ones(2, 3, 4))


if given is not None:

    @settings(max_examples=150, deadline=None)
    @given(
        seed=st.integers(0, 2**62),
        batch=st.integers(1, 9),
        vocab=st.integers(2, 300),
        temperature=st.floats(0.05, 3.0),
        top_k=st.sampled_from([-1, 1, 2, 7, 50]),
        top_p=st.sampled_from([1.0, 0.95, 0.5, 0.1]),
        peak=st.sampled_from([0.0, 10.0, 60.0]),
        dtype=st.sampled_from([torch.float32, torch.float64]),
    )
    def test_sample_token_matches_multinomial_property(seed, batch, vocab, temperature, top_k, top_p, peak, dtype):
        probs = _probs(seed % 10_000, batch, vocab, temperature, top_k, top_p, peak).to(dtype)
        _same_draw(probs, seed)
