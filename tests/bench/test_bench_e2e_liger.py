"""The e2e bench's Liger arms build on CPU (their timing is a GPU run: ``rla bench e2e --variants
liger-flce rla-vllm+liger-flce``). Liger's kernels cannot run on this CPU, which shows where they are."""

from __future__ import annotations

import pytest
import torch

import rla
from align_spec import tiny_model, tokens
from rla.bench import e2e

pytest.importorskip("liger_kernel")


def test_rla_over_liger_flce_arm_keeps_liger_loss_and_replaces_its_regions():
    ids = tokens()
    plain = tiny_model("qwen2")
    rla.align(plain, "vllm")
    model = tiny_model("qwen2").train()
    undo, how = e2e._align(model, "rla-vllm+liger-flce")
    try:
        assert "fused_linear_cross_entropy" in how and "rla.align" in how
        with torch.no_grad():
            # training mode with labels: the loss is Liger's fused linear cross-entropy (a Triton kernel)
            with pytest.raises(RuntimeError, match="driver"):
                model(input_ids=ids, labels=ids)
            # without labels Liger's forward computes logits; the regions are rla's, bit for bit
            assert torch.equal(model(input_ids=ids).logits, plain(ids).logits)
    finally:
        undo()
    assert rla.alignment_of(model) is None
