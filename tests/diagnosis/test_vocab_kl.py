"""rla.diagnosis.vocab on the bundled model: records carrying the engine's whole (or top-k)
distribution, the KL over the vocabulary against an fp64 oracle from HF's own forward; the field
round-trips through the record format and a record without it is unchanged."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from rla.diagnosis.vocab import vocab_kl_of_records
from rla.models import load_bundled_model
from rla.rollout.rollouts import RolloutFormatError, RolloutRecord, load, save

PROMPTS = [[1, 5, 9, 13, 4], [1, 7, 3]]
RESPONSES = [[20, 21, 30, 8], [11, 12, 40, 41, 42]]


def _full_logp(model, prompt, response):
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0].double()
    return logits[len(prompt) - 1:-1].log_softmax(-1)  # fp64 from HF's own forward


def test_vocab_kl_of_the_records_is_the_kl_of_hfs_distributions():
    bf16, fp32 = load_bundled_model(dtype=torch.bfloat16), load_bundled_model(dtype=torch.float32)
    records, oracle_full, oracle_lower = [], [], []
    for prompt, resp, k in zip(PROMPTS, RESPONSES, (None, 5)):
        q = _full_logp(fp32, prompt, resp)  # the "engine": the fp32 forward
        p = _full_logp(bf16, prompt, resp)  # the trainer's bf16 forward
        if k is None:
            lists = [[[i, float(v)] for i, v in enumerate(row)] for row in q]
        else:
            top = q.topk(k, -1).indices
            lists = [[[int(i), float(q[j, i])] for i in top[j]] for j in range(len(resp))]
        lps = [float(q[j, t]) for j, t in enumerate(resp)]
        records.append(RolloutRecord(prompt, resp, lps, 1.0, 1.0, -1, "test",
                                     top_logprobs={"version": 1, "complete": k is None, "response": lists}))
        exact = (q.exp() * (q - p)).sum(-1)
        oracle_full.append(exact)
        if k is not None:  # merged tail: the lower bound written out
            top = q.topk(k, -1).indices
            mask = torch.ones_like(q, dtype=torch.bool).scatter_(1, top, False)
            rq, rp = (q.exp() * mask).sum(-1), (p.exp() * mask).sum(-1)
            head = (q.exp() * (q - p) * ~mask).sum(-1)
            oracle_lower.append(head + rq * (rq.log() - rp.log()))
    got = vocab_kl_of_records(bf16, records)
    per = np.array(got["vocab_kl/per_token"])
    n0 = len(RESPONSES[0])
    assert got["vocab_kl/kind"] == "lower_bound" and got["vocab_kl/records"] == 2 and got["vocab_kl/tokens"] == 9
    assert np.allclose(per[:n0], oracle_full[0].numpy(), rtol=1e-3, atol=1e-8)
    assert np.allclose(per[n0:], oracle_lower[0].numpy(), rtol=1e-3, atol=1e-8)
    assert (per[n0:] <= oracle_full[1].numpy() + 1e-8).all() and per.max() > 1e-6  # not zero: bf16 vs fp32
    exact_only = vocab_kl_of_records(bf16, records[:1])
    assert exact_only["vocab_kl/kind"] == "exact"
    bad = dataclasses.replace(records[1], top_logprobs={**records[1].top_logprobs, "response": [[[64, -0.1]]] * 5})
    with pytest.raises(ValueError, match=r"record 1: top_logprobs lists token 64, outside the model's vocabulary \[0, 64\)"):
        vocab_kl_of_records(bf16, [records[0], bad])
    plain = [dataclasses.replace(r, top_logprobs=None) for r in records]
    assert vocab_kl_of_records(bf16, plain) is None


def test_the_field_round_trips_and_is_checked(tmp_path):
    top = {"version": 1, "complete": False, "response": [[[3, -0.1], [4, -2.5]], [[5, -0.0]]],
           "prompt": [[[2, -1.0]]]}
    rec = RolloutRecord([1, 2], [3, 5], [-0.1, -0.0], 1.0, 1.0, -1, "vllm", top_logprobs=top)
    save(tmp_path / "r.jsonl", [rec, dataclasses.replace(rec, top_logprobs=None)])
    back = load(tmp_path / "r.jsonl", vocab_size=8)
    assert back[0].top_logprobs == top and back[1].top_logprobs is None
    assert "top_logprobs" not in (tmp_path / "r.jsonl").read_text().splitlines()[1]
    for bad, msg in [({**top, "version": 2}, "version 2"), ({**top, "response": top["response"][:1]}, r"per response token \(2\)"),
                     ({**top, "response": [[[3, -0.1], [3, -1.0]], [[5, 0.0]]]}, "twice"),
                     ({**top, "response": [[[3, math.nan]], [[5, 0.0]]]}, "finite"),
                     ({**top, "complete": 1}, "'complete'")]:
        with pytest.raises(RolloutFormatError, match=msg):
            dataclasses.replace(rec, top_logprobs=bad)
    save(tmp_path / "v.jsonl", [dataclasses.replace(rec, top_logprobs={**top, "response": [[[7, -0.1]], [[5, 0.0]]]})])
    with pytest.raises(RolloutFormatError, match=r"field 'top_logprobs': 'response'\[0\] has \[7, -0.1\].*< 6"):
        load(tmp_path / "v.jsonl", vocab_size=6)
