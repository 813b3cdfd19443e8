"""An alignment that can round nothing says so (fp32 weights, autocast off), and only then."""

from __future__ import annotations

import torch

import rla

from align_spec import tiny_model, tokens


def test_fp32_model_without_autocast_is_reported_inert_and_really_is():
    model = tiny_model("qwen2", dtype=torch.float32)
    ids = tokens(seed=3)
    with torch.no_grad():
        before = model(ids).logits
    report = rla.align(model, "vllm")
    assert len(report.notes) == 1 and "nothing to round" in report.notes[0]
    assert "note: nothing to round: the weights are float32" in str(report)
    with torch.no_grad():
        after = model(ids).logits
    # The note's claim, checked: in fp32 every rounding point is the identity. What remains is
    # fp32 reassociation between HF's code and the aligned ops (elementwise RoPE angles, fused
    # residual add order), a few ulps of the logits' scale, far below any bf16 rounding (2^-8).
    assert (after - before).abs().max().item() < 1e-5 * before.abs().max().item()


def test_bf16_weights_or_autocast_give_no_note():
    report = rla.align(tiny_model("qwen2"), "vllm")  # bf16 weights
    assert report.notes == [] and "note:" not in str(report)
    model = tiny_model("qwen2", dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert rla.align(model, "vllm").notes == []
