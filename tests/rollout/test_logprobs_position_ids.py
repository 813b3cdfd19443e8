"""rla.logprobs(..., position_ids=...): a record scored at other position ids, as HF's own forward
scores it (the triage's padding and position readings, rla.diagnosis.positions, rest on it)."""

import pytest
import torch

from rla.rollout.rollouts import RolloutRecord
from rla.rollout.train_logprobs import logprobs

from rollout_oracles import tiny_model


def _rec(prompt, response):
    return RolloutRecord(prompt, response, [-1.0] * len(response), 1.0, 1.0, -1, "test")


def test_position_ids_are_those_of_hfs_own_forward():
    model = tiny_model()
    recs = [_rec([3, 4, 5, 6], [7, 8, 9]), _rec([10, 11], [12, 13, 14, 15])]
    arange = [list(range(7)), list(range(6))]
    assert all(torch.equal(a, b) for a, b in zip(logprobs(model, recs), logprobs(model, recs, position_ids=arange)))
    restart = [[0, 1, 2, 3, 0, 1, 2], [0, 1, 0, 1, 2, 3]]
    got = logprobs(model, recs, position_ids=restart)
    for r, pos, lp in zip(recs, restart, got):  # HF's training-style forward of the record alone (no cache,
        ids = torch.tensor([r.prompt_ids + r.response_ids])  # no mask: a restart begins a packed sequence)
        with torch.no_grad():
            logits = model(input_ids=ids, position_ids=torch.tensor([pos]), use_cache=False).logits[0].float()
        p = len(r.prompt_ids)
        want = logits[p - 1:-1].log_softmax(-1).gather(-1, ids[0, p:, None])[:, 0]
        assert torch.allclose(lp, want, rtol=0, atol=0.05)  # batched vs alone: rounding only
        assert not torch.allclose(lp, logprobs(model, [r])[0], rtol=0, atol=1e-3)  # the positions matter
    with pytest.raises(ValueError, match="record 1: position_ids must be 6"):
        logprobs(model, recs, position_ids=[arange[0], arange[1][:-1]])
    with pytest.raises(ValueError, match="2 records"):
        logprobs(model, recs, position_ids=[arange[0]])
