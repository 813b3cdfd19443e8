"""The sampler records the routes its engine copy took: one entry per prompt token (the prefill)
and per response token but the last (the decode step that fed it), in the rows' own order.

Checked against an independent forward: the engine copy run once over each record's whole
sequence (no cache, no batch, no padding) under ``capture_routes``. The decode steps see other
shapes than that forward, so a few tokens may route differently in the last bits; a row, a
position or a layer taken from the wrong place agrees by chance only (a set of 3 of 8 experts:
1 in 56), hence the 90% floor. Sharp routers (``moe_models``' default) make exact agreement the
rule.
"""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version

from rla.alignment import capture_routes, compat
from rla.alignment.core import ROUTER_MIN_TRANSFORMERS
from rla.profiles import REGIONS
from rla.rollout.sampler import Sampler, SamplingParams

import moe_models as M

from align_spec import single_thread  # noqa: F401

pytestmark = pytest.mark.skipif(compat.TRANSFORMERS_VERSION < Version(ROUTER_MIN_TRANSFORMERS),
                                reason=f"the router region is refused below transformers {ROUTER_MIN_TRANSFORMERS}")


def test_records_carry_the_engine_copys_routes_row_by_row():
    model = M.model("qwen3_moe", dtype=torch.float32)
    sampler = Sampler(model, profile="vllm-0.33", cache="dynamic", regions=(*REGIONS, "router"), record_routes=True)
    prompts = [[1, 5, 9, 17, 3], [1, 40], [1, 7, 100]]  # left padding differs per row
    records = sampler.generate(prompts, SamplingParams(max_new_tokens=6, seed=3, ignore_eos=True))
    layers, k = len(M.blocks(model)), model.config.num_experts_per_tok
    for rec in records:
        tokens = rec.prompt_ids + rec.response_ids
        experts = torch.tensor(rec.routes["experts"])
        weights = torch.tensor(rec.routes["weights"])
        assert rec.routes["version"] == 1
        assert experts.shape == weights.shape == (len(tokens) - 1, layers, k)
        with torch.no_grad(), capture_routes(sampler.model) as cap:
            sampler.model(torch.tensor([tokens]))
        ref = cap.ids()[:, :-1].permute(1, 0, 2)  # [tokens - 1, layers, k]
        same = (ref.sort(-1).values == experts.sort(-1).values).all(-1).float().mean(0)
        assert (same >= 0.9).all(), same
        assert torch.allclose(weights.sum(-1), torch.ones(()), atol=1e-5)  # norm_topk_prob: renormalised, fp32


def test_record_routes_needs_the_dynamic_cache_and_an_moe_model():
    with pytest.raises(ValueError, match="needs cache='dynamic'"):
        Sampler(M.model("qwen3_moe"), cache="static", record_routes=True)
    from rla import models

    dense = models.build_model(models.tiny_config("qwen3", "micro"), seed=0)
    with pytest.raises(ValueError, match="has no MoE block"):
        Sampler(dense, cache="dynamic", record_routes=True)
