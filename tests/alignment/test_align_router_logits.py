"""``output_router_logits=True`` under the router region: HF's output capture hooks the MoE block's gate,
which the aligned block calls as a module (its forward the aligned router), so HF records the logits the
aligned forward routed by and its ``load_balancing_loss_func`` gives the aux loss of the routes taken.

Per family: the recorded logits equal the gate GEMM written from the router points' definition
(``router_spec``'s expression) on each block's input; ``aux_loss`` equals HF's own
``load_balancing_loss_func`` on those logits; under HF's points it equals the unaligned model's aux loss
bit for bit; the aux loss's gradient reaches the gate's weight; a route capture on an unaligned model
leaves no patch behind."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from packaging.version import Version

import rla
from rla.alignment import compat
from rla.alignment.patch import patch_of
from rla.alignment.router import state_of
from align_spec import single_thread  # noqa: F401  (fixture)
import moe_models
from qwen3_5_spec import tiny_qwen3_5_moe

pytestmark = pytest.mark.skipif(compat.TRANSFORMERS_VERSION < Version("5.24"),
                                reason="the router region is checked on transformers >= 5.24")

ALL = ("rope", "swiglu", "rmsnorm", "router")
AUX_FAMILIES = ("qwen2_moe", "qwen3_moe", "mixtral", "qwen3_5_moe")


def _model(family):
    return tiny_qwen3_5_moe() if family == "qwen3_5_moe" else moe_models.model(family)


def _blocks(model):
    return [layer.mlp for layer in model.model.layers if hasattr(layer.mlp, "gate") and hasattr(layer.mlp, "experts")]


def _run(model, ids, labels=True):
    """(output, [each MoE block's input as the gate reads it, [T, H]])."""
    inputs, handles = [], []
    for block in _blocks(model):
        handles.append(block.register_forward_pre_hook(lambda m, a: inputs.append(a[0].reshape(-1, a[0].shape[-1]))))
    try:
        out = model(ids, labels=ids if labels else None, output_router_logits=True)
    finally:
        for h in handles:
            h.remove()
    return out, inputs


def _logits(block, x, points):
    """The gate GEMM from the ``logits`` point's definition (docs/rounding.md, router points)."""
    w = block.gate.weight
    return F.linear(x, w.to(x.dtype)) if points.logits == "lp" else F.linear(x.float(), w.float())


def _hf_aux(model, logits):
    modeling = sys.modules[type(model).__module__]
    return modeling.load_balancing_loss_func(tuple(logits), model.num_experts, model.num_experts_per_tok, None)


@pytest.mark.parametrize("profile", ["hf", "vllm-0.33", "sglang-0.5.23"])
@pytest.mark.parametrize("family", AUX_FAMILIES)
def test_aux_loss_is_hfs_on_the_aligned_routers_logits(family, profile):
    model = _model(family)
    ids = moe_models.tokens(seed=3)
    with torch.no_grad():
        plain, _ = _run(model, ids)
    rla.align(model, profile, regions=ALL)
    try:
        with torch.no_grad():
            out, inputs = _run(model, ids)
        blocks = _blocks(model)
        points = [state_of(b).points for b in blocks]
    finally:
        rla.unalign(model)
    assert len(out.router_logits) == len(blocks) > 0
    want = [_logits(b, x, p) for b, x, p in zip(blocks, inputs, points)]
    for got, w in zip(out.router_logits, want):
        assert got.dtype == w.dtype and torch.equal(got, w)
    assert torch.equal(out.aux_loss, _hf_aux(model, want))
    lm = out.loss - model.router_aux_loss_coef * out.aux_loss
    assert torch.isfinite(lm) and out.aux_loss > 0
    if profile == "hf":  # HF's own points: HF's own values, the unaligned model's aux loss
        assert torch.equal(out.aux_loss, plain.aux_loss) and torch.equal(out.loss, plain.loss)
        assert all(torch.equal(a, b) for a, b in zip(out.router_logits, plain.router_logits))


def test_aux_loss_gradient_reaches_the_gate():
    model = moe_models.model("qwen3_moe")
    rla.align(model, "vllm-0.33", regions=ALL)
    try:
        out = model(moe_models.tokens(seed=3), output_router_logits=True)
        out.aux_loss.backward()
    finally:
        rla.unalign(model)
    for block in _blocks(model):
        assert block.gate.weight.grad is not None and block.gate.weight.grad.abs().sum() > 0


def test_deepseek_v3_router_logits_are_the_aligned_routers():
    """DeepSeek-V3 has no aux loss in HF; its recorded router logits are the aligned fp32 gate GEMM."""
    model = moe_models.model("deepseek_v3")
    ids = moe_models.tokens(seed=3)
    rla.align(model, "vllm-0.33", regions=ALL)
    try:
        with torch.no_grad():
            out, inputs = _run(model, ids, labels=False)
        blocks = _blocks(model)
        want = [_logits(b, x, state_of(b).points) for b, x in zip(blocks, inputs)]
    finally:
        rla.unalign(model)
    assert len(out.router_logits) == len(blocks) > 0
    assert all(torch.equal(g, w) for g, w in zip(out.router_logits, want))


def test_hooks_on_the_gate_fire_and_nothing_is_left_patched():
    model = moe_models.model("mixtral")
    seen = []
    handle = _blocks(model)[0].gate.register_forward_hook(lambda m, a, o: seen.append(o[2]))
    try:
        with rla.alignment.capture_routes(model) as cap, torch.no_grad():
            model(moe_models.tokens(seed=3))
    finally:
        handle.remove()
    assert len(seen) == 1 and torch.equal(seen[0].cpu(), cap.ids()[0])  # the forward's routes, no probe's
    assert not any(patch_of(m) is not None for m in model.modules())
