"""``rla.diagnose(..., regions=(..., "router"))``: routing as its own region of the attribution.

Records from an engine stand-in (the same tiny Qwen3-MoE with all four regions aligned to
``vllm-0.33``: rla's reference of vLLM's points, not vLLM); the training model is HF's. Aligning
all four regions reproduces the stand-in exactly, so the full coalition's k3 is 0 and the four
Shapley shares add up to HF's k3 (Shapley's efficiency), with the router one of them.
"""

from __future__ import annotations

import copy

import pytest
import torch

import rla
from rla.rollout import rollouts

import moe_models as M

from align_spec import single_thread  # noqa: F401

ALL = ("rope", "swiglu", "rmsnorm", "router")


def test_routing_is_a_region_of_the_attribution():
    train = M.model("qwen3_moe", seed=0, gate_scale=0.02)
    engine = copy.deepcopy(train)
    rla.align(engine, "vllm-0.33", regions=ALL)
    ids = M.tokens(batch=4, seq=16, seed=3)
    with torch.no_grad():
        lp = engine(ids).logits.float().log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    records = [rollouts.RolloutRecord(prompt_ids=ids[i, :8].tolist(), response_ids=ids[i, 8:].tolist(),
                                      logprobs=lp[i, 7:].double().clamp(max=0).tolist(), temperature=1.0,
                                      top_p=1.0, top_k=-1, engine="vllm", engine_version="0.33.0")
               for i in range(4)]
    d = rla.diagnose(train, records, "vllm-0.33", regions=ALL, detect=False)
    assert len(d.metrics) == 16 and d.metrics["all"]["mismatch/k3"] == 0.0
    shares = d.attribution["mismatch/k3"]
    assert set(shares) == set(ALL)
    assert sum(shares.values()) == pytest.approx(d.metrics["none"]["mismatch/k3"], rel=1e-9)
    assert shares["router"] != 0.0
    assert d.metrics["router"]["mismatch/k3"] != d.metrics["none"]["mismatch/k3"]
    with pytest.raises(ValueError, match="no MoE block"):
        from align_spec import tiny_model
        dense = tiny_model("qwen2")
        rla.diagnose(dense, [rollouts.RolloutRecord(prompt_ids=[1, 2], response_ids=[3], logprobs=[-1.0],
                                                    temperature=1.0, top_p=1.0, top_k=-1, engine="vllm")],
                     "vllm-0.33", regions=ALL, detect=False)
