"""MoE experts under transformers' grouped/batched implementations go through the aligned gate."""

from __future__ import annotations

import pytest
import torch

import rla

from align_spec import SPEC, single_thread, spec_forward, tiny_model, tokens  # noqa: F401


def _bf16_routing(model) -> bool:
    """Whether the first MoE block hands the experts bf16 routing weights. transformers 5.24 does
    for Qwen3-MoE; 5.5-5.10 keep them fp32 (the router's ``.to(router_logits.dtype)`` reads the
    already-softmaxed fp32 tensor), and then grouped/batched experts accumulate the weighted
    expert outputs in fp32 where the eager loop rounds each one: a difference of HF's routing
    code, outside the three regions, that no alignment touches."""
    block = next(m for m in model.modules() if hasattr(m, "gate") and hasattr(m, "experts"))
    h = torch.zeros(2, model.config.hidden_size, dtype=torch.bfloat16)
    return block.gate(h)[1].dtype == torch.bfloat16


@pytest.mark.parametrize("impl", ["grouped_mm", "batched_mm"])
def test_registered_experts_implementations(impl):
    ids = tokens()
    for family in ("qwen3_moe", "mixtral"):
        model = tiny_model(family, experts=impl)
        assert model.config._experts_implementation == impl
        with torch.no_grad():
            plain = model(ids).logits
            rla.align(model, "hf")
            assert torch.equal(model(ids).logits, plain), family
            rla.align(model, "vllm")
            aligned = model(ids).logits
        assert not torch.equal(aligned, plain), family
        if family == "qwen3_moe" and _bf16_routing(model):
            # Qwen3-MoE's bf16 routing makes every implementation agree with the eager loop, so
            # here the grouped/batched path can be held to the oracle itself.
            assert torch.equal(aligned, spec_forward(model, ids, SPEC["vllm"]))
        rla.unalign(model)
        with torch.no_grad():
            assert torch.equal(model(ids).logits, plain)


def test_implementation_switched_after_align_still_uses_the_aligned_gate():
    ids = tokens()
    model = tiny_model("qwen3_moe")
    rla.align(model, "sglang")
    calls = []
    experts = model.model.layers[0].mlp.experts
    gate = experts._apply_gate

    def spy(x):
        calls.append(x.shape)
        return gate(x)

    experts._apply_gate = spy
    with torch.no_grad():
        eager = model(ids).logits
        n_eager = len(calls)
        model.set_experts_implementation("grouped_mm")
        grouped = model(ids).logits
        if _bf16_routing(model):  # else fp32 routing sums differently per implementation (above)
            assert torch.equal(grouped, eager)
    assert n_eager > 0 and len(calls) == n_eager + 1  # one grouped call for all experts
    experts._apply_gate = gate
    rla.unalign(model)


def test_fused_activation_kernels_are_refused():
    model = tiny_model("mixtral")
    model.config._experts_implementation = "sonicmoe"  # fuses silu*up inside its kernel
    with pytest.raises(NotImplementedError, match="sonicmoe"):
        rla.align(model, "vllm")
    rla.align(model, "vllm", regions=("rope", "rmsnorm"))  # the other regions are fine
    rla.unalign(model)
