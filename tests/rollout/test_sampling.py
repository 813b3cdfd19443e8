"""process_logits against an independent NumPy expression of the engines' convention."""

import numpy as np
import pytest
import torch

from rla.rollout.train_logprobs import micro_batches
from rla.rollout.sampling import process_logits


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
