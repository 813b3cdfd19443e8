"""The chunked-prefill decision is made at the sizes a record runs with (issue 37, item 3).

A planted model whose attention rounds differently only beyond 2,600 query positions (as a kernel
that picks its blocks by the length may): the short probe (2,085 tokens) finds chunked prefill
bit-identical, a 3,100-token record chunked is not, and ``rla.logprobs`` must see that, run the
record in one call and keep every bit. (On the CPUs measured, an Intel AVX-512 Xeon and an AMD
EPYC, the bundled model's short probe is bit-identical, so rla chunked such a record on its word
before; what the test asserts holds whatever this CPU's probe says.)
"""

import copy
import functools
import warnings

import pytest
import torch

from rla.models import load_bundled_model
from rla.rollout import prefill
from rla.rollout.rollouts import RolloutRecord
from rla.rollout.train_logprobs import logprobs

NAME = "rla_test_rounds_differently_beyond"
BEYOND = 2600  # query positions: longer than the short probe and than any prefill chunk below


def _attention(module, query, key, value, attention_mask, **kw):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, w = sdpa_attention_forward(module, query, key, value, attention_mask, **kw)
    if query.shape[-2] > BEYOND:  # a rounding-sized change of the output: one to two bf16 ulps
        out = (out.float() * (1 + 2**-7)).to(out.dtype)
    return out, w


@functools.cache
def _register():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


@pytest.fixture(scope="module")
def planted():
    _register()
    # the bundled model's first two decoder layers: the plant acts in every layer's attention,
    # and the second layer reads a cache built from the first's chunked output
    model = load_bundled_model()
    model.model.layers = model.model.layers[:2]
    model.config.num_hidden_layers = 2
    model.config.layer_types = model.config.layer_types[:2]
    base = copy.deepcopy(model)
    model.config._attn_implementation = NAME
    return base, model


def _record(n, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 64, (n,), generator=g).tolist()
    return RolloutRecord(ids[:100], ids[100:], [-1.0] * (n - 100), 0.8, 1.0, -1, "test")


def test_a_short_probe_that_passes_does_not_decide_for_a_longer_record(planted):
    base, model = planted
    short = prefill.check(model)
    # the plant is invisible to the short probe: its verdict is the unplanted model's
    assert short.tokens < BEYOND and short.to_dict() == {**prefill.check(base).to_dict(), "attention": NAME}
    rec = _record(3100, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one_call = logprobs(model, [rec], max_tokens=1024, prefill_mode="never")[0]
        forced = logprobs(model, [rec], max_tokens=1024, prefill_mode="always")[0]
        base_one = logprobs(base, [rec], max_tokens=1024, prefill_mode="never")[0]
    assert not torch.equal(forced, one_call)  # the control: chunking this record changes its bits
    assert torch.equal(forced, logprobs(base, [rec], max_tokens=1024, prefill_mode="always")[0])  # chunks: unplanted
    assert not torch.equal(one_call, base_one)  # the plant acts on the one-call forward only
    info = {}
    with pytest.warns(RuntimeWarning, match="1 record.* run in one forward.*chunked prefill changes bits.*"
                                            "probe of 3100 tokens, chunks of 1024"):
        auto = logprobs(model, [rec], max_tokens=1024, info=info)[0]
    assert torch.equal(auto, one_call)  # every bit kept
    assert info["records_one_call"] == 1 and info["records_chunked"] == 0
    c = info["check"]
    assert not c["exact"] and (c["rows"], c["tokens"], c["chunks"]) == (1, 3100, [1024]) and c["equal"] < 1
    assert info["checks"] == [c]


def test_a_cached_inexact_check_refuses_a_one_call_forward_that_cannot_fit(planted, monkeypatch):
    _, model = planted
    rec = _record(3100, 1)
    assert not prefill.check(model, length=3100, step=1024).exact  # made while memory sufficed
    monkeypatch.setattr(prefill, "available_bytes", lambda device: 1 << 20)
    steps = []
    with pytest.raises(MemoryError, match=r"would run in one forward, estimated .* available.*prefill_mode='always'"):
        logprobs(model, [rec], max_tokens=1024, progress=lambda done, total: steps.append(done))
    assert steps == []


def test_a_geometry_is_refused_clearly():
    model = load_bundled_model()
    for kw, match in ((dict(length=3000, step=700), "multiple of 512"), (dict(length=0, step=512), "length"),
                      (dict(rows=0, length=3000, step=512), "rows"), (dict(step=512), "give length"),
                      (dict(length=3000), "step")):
        with pytest.raises(ValueError, match=match):
            prefill.check(model, **kw)
