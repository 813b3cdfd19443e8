"""The ``moe_out`` variant point (the rows' ``moe_experts`` kind): under ``fp32`` an MoE block with shared
experts hands the residual add after it the fp32 sum of its shared and routed outputs, as vLLM's compiled
graph does (docs/families.md, "The engine twin of GLM-4 MoE"; the twin's own check is
tests/engines/test_vllm_twin_families.py). Checked here against independent expressions: the oracle of
tests/glm4_moe_spec.py with the sum unrounded, HF's own MoE blocks (the fp32 sum rounded is HF's output,
its gradient HF's), and autograd through the oracle for the gradients downstream of the last block."""

from __future__ import annotations

import pytest
import torch

import rla
from rla import profiles
from rla.alignment import compat
from align_spec import SPEC, single_thread  # noqa: F401  (fixture)
import align_spec
import glm4_moe_spec
from moe_cases import DEFAULT_ROWS, LAYOUTS, first_moe_block, ids as _ids, tiny

pytestmark = LAYOUTS


def _rounded(name):
    """The row with its moe_experts variant's moe_out rounded (as the rows were before the point)."""
    return profiles.get(name).replace_variant("moe_experts", name=f"{name}-moe-out-round", moe_out="round")


@pytest.mark.parametrize("profile", DEFAULT_ROWS)
@pytest.mark.parametrize("qk_norm", [True, False], ids=["qk_norm", "no_qk_norm"])
@pytest.mark.parametrize("dense_layers", [0, 1], ids=["moe", "dense_then_moe"])
def test_glm4_moe_aligned_to_the_default_rows_is_the_oracle_with_the_fp32_sum(profile, qk_norm, dense_layers):
    model, ids = glm4_moe_spec.tiny_glm4_moe(qk_norm=qk_norm, dense_layers=dense_layers), _ids()
    with torch.no_grad():
        before = model(ids).logits
        report = rla.align(model, profile)
        got = model(ids).logits
        rla.unalign(model)
        rla.align(model, _rounded(profile))
        got_round = model(ids).logits
        rla.unalign(model)
        after = model(ids).logits
        want = glm4_moe_spec.spec_forward(model, ids, SPEC[profile], moe_sum_fp32=True)
        want_round = glm4_moe_spec.spec_forward(model, ids, SPEC[profile], moe_sum_fp32=False)
    assert torch.equal(got, want)
    assert torch.equal(got_round, want_round)  # the point is data: the same row with it rounded is the other oracle
    assert not torch.equal(want, want_round)  # the inputs tell the two apart
    assert torch.equal(after, before)  # rla.unalign restores HF's modules
    assert report.moe_out == "fp32" and report.counts["rmsnorm"]["MoE blocks (fp32 shared + routed)"] == 2 - dense_layers
    assert "MoE shared + routed fp32 (moe_out)" in str(report) and "moe_out='fp32'" in str(report)
    assert report.to_dict()["moe_out"] == "fp32"


@pytest.mark.parametrize("profile", ["vllm-0.33-eager", "vllm-0.26-eager", "sglang-0.5.23", "hf"])
def test_rows_that_round_the_sum_leave_the_blocks_as_hf_has_them(profile):
    model = glm4_moe_spec.tiny_glm4_moe()
    report = rla.align(model, profile)
    try:
        block = model.model.layers[1].mlp
        assert "_rla_patch" not in block.__dict__ and report.moe_out == ""
        assert "moe_out" not in str(report)
    finally:
        rla.unalign(model)


@pytest.mark.parametrize("family", ["glm4_moe", "qwen2_moe", "deepseek_v3", "qwen3_5_moe"])  # shared experts
def test_the_fp32_block_is_hfs_block_with_its_last_add_unrounded_forward_and_backward(family):
    """The aligned block (rmsnorm region, vllm-0.33) returns fp32 whose rounding is HF's block output
    bit for bit, and which differs from it (the sum is not an lp number everywhere); given an fp32
    upstream gradient g, its input's and parameters' gradients are HF's block's given RN(g), bit for bit
    (each lp output receives the sum's gradient rounded once, as an lp add hands it on)."""
    model = tiny(family)
    block = first_moe_block(model)
    hidden = model.config.hidden_size
    x = torch.randn(2, 6, hidden, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    g = torch.randn(2, 6, hidden, generator=torch.Generator().manual_seed(8))

    def run(upstream):
        model.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        out = block(xi)
        out.backward(upstream(out))
        grads = {n: p.grad.clone() for n, p in block.named_parameters() if p.grad is not None}
        return out.detach(), xi.grad, grads

    hf_out, hf_dx, hf_grads = run(lambda out: g.to(out.dtype))
    report = rla.align(model, "vllm-0.33", regions=("rmsnorm",))
    try:
        out, dx, grads = run(lambda out: g)
    finally:
        rla.unalign(model)
    assert report.moe_out == "fp32"
    assert out.dtype == torch.float32 and hf_out.dtype == torch.bfloat16
    assert torch.equal(out.to(torch.bfloat16), hf_out)
    assert not torch.equal(out, hf_out.float())
    assert torch.equal(dx, hf_dx)
    assert grads.keys() == hf_grads.keys() and len(grads) >= 4
    for name in grads:
        assert torch.equal(grads[name], hf_grads[name]), name
    assert torch.equal(block(x), hf_out)  # unaligned: HF's block again


def test_gradients_downstream_of_the_last_block_are_autograd_of_the_oracle():
    """Backward through the fp32 sum and the add that reads it: the last MoE block's down projections
    and router, the final norm and the head get the gradients autograd gives through the oracle with
    the unrounded sum, bit for bit, and not those of the oracle with the sum rounded. (Upstream of the
    last layer's norms the gradients pass rla's own norm and SwiGLU backward formulas, which autograd
    of the oracle's expressions does not reproduce bit for bit.)"""
    model, ids = glm4_moe_spec.tiny_glm4_moe(dense_layers=0), _ids()
    weights = torch.linspace(-1, 1, model.config.vocab_size)
    last = f"model.layers.{model.config.num_hidden_layers - 1}.mlp."
    names = [last + "experts.down_proj", last + "shared_experts.down_proj.weight", last + "gate.weight",
             "model.norm.weight", "lm_head.weight"]

    def grads(forward):
        model.zero_grad(set_to_none=True)
        (forward().float() * weights).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if n in names}

    rla.align(model, "vllm-0.33")
    try:
        got = grads(lambda: model(ids).logits)
    finally:
        rla.unalign(model)
    want = grads(lambda: glm4_moe_spec.spec_forward(model, ids, SPEC["vllm-0.33"], moe_sum_fp32=True))
    rounded = grads(lambda: glm4_moe_spec.spec_forward(model, ids, SPEC["vllm-0.33"], moe_sum_fp32=False))
    assert got.keys() == set(names)
    for name in names:
        assert got[name].abs().sum() > 0 and torch.equal(got[name], want[name]), name
    for name in names[:2]:
        assert not torch.equal(got[name], rounded[name]), name


def test_gradient_checkpointing_recomputes_the_fp32_sum():
    """The checkpointed layer recomputes the block's fp32 sum in backward: the same gradients."""
    ids = _ids()
    results = []
    for checkpointing in (False, True):
        model = glm4_moe_spec.tiny_glm4_moe()
        if checkpointing:
            model.gradient_checkpointing_enable()
        rla.align(model, "vllm-0.33")
        model.train()
        model(ids, labels=ids).loss.backward()
        results.append({n: p.grad for n, p in model.named_parameters()})
    for name, g in results[0].items():
        assert g is not None and torch.equal(g, results[1][name]), name


def test_route_replay_keeps_the_fp32_sum():
    """Route capture and replay swap the fp32-sum block for the routed forward (HF's router values) with
    the same sum, and put it back after: the logits stay the oracle's, inside the contexts and after."""
    from rla.alignment import replay

    model, ids = tiny("qwen2_moe"), _ids()
    rla.align(model, "vllm-0.33")
    try:
        with torch.no_grad():
            aligned = model(ids).logits
            with replay.capture_routes(model) as cap:
                captured = model(ids).logits
            experts = cap.ids().permute(1, 0, 2).reshape(*ids.shape, -1, cap.ids().shape[-1])
            with replay.replay_routes(model, experts):
                replayed = model(ids).logits
            again = model(ids).logits
        block = first_moe_block(model)
        assert block.__dict__["_rla_patch"].role == "moe_out"  # put back
    finally:
        rla.unalign(model)
    with torch.no_grad():
        want = align_spec.spec_forward(model, ids, SPEC["vllm-0.33"])  # the Qwen2-MoE oracle, the sum unrounded
    for got in (aligned, captured, replayed, again):
        assert torch.equal(got, want)


@pytest.mark.parametrize("family", ["qwen2_moe", "deepseek_v3"])
def test_under_the_router_region_the_block_forms_the_fp32_sum_of_the_rows_definition(family):
    """With the router region (and the rmsnorm region, whose add reads the sum) the routed block hands
    the add ``routed + shared`` in fp32: the points' own definition (tests/router_spec.py) with the sum
    unrounded, and DeepSeek-V3's ``routed_scale='output'`` (vLLM's runner scaling the op's lp output,
    in the same compiled graph) times its 2.5 in fp32 too, bit for bit; the definition with the sum
    rounded differs."""
    import moe_models
    import router_spec
    from rla.alignment.families import FAMILIES

    fam, points = FAMILIES[family], profiles.get("vllm-0.33").router
    model = moe_models.model(family)
    block = moe_models.blocks(model)[0]
    x = torch.randn(24, block.gate.weight.shape[1], generator=torch.Generator().manual_seed(0)).bfloat16()
    report = rla.align(model, "vllm-0.33", regions=("rmsnorm", "router"))
    try:
        with torch.no_grad():
            got = block(x[None])[0]
        assert block.__dict__["_rla_router"].fp32_out and report.moe_out == "fp32"
    finally:
        rla.unalign(model)
    ids, weights = router_spec.route(block, x, points, fam.router)
    with torch.no_grad():
        want = router_spec.block_output(block, x, ids, weights, points, fam.router, fam.shared_expert, fp32_out=True)
        rounded = router_spec.block_output(block, x, ids, weights, points, fam.router, fam.shared_expert)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert not torch.equal(want, rounded.float())
    if family == "deepseek_v3":
        assert block.gate.routed_scaling_factor == 2.5 and points.routed_scale == "output"


def test_below_the_layout_it_was_written_from_the_blocks_stay_hfs_and_the_report_says_so(monkeypatch):
    """Qwen2-MoE is aligned on older transformers too, whose MoE blocks are laid out otherwise: there the
    point is not realised (the blocks stay HF's, the sum rounded) and a note says so."""
    from packaging.version import Version

    model, ids = tiny("qwen2_moe"), _ids()
    monkeypatch.setattr(compat, "TRANSFORMERS_VERSION", Version("5.5.3"))
    report = rla.align(model, "vllm-0.33")
    try:
        block = first_moe_block(model)
        assert "_rla_patch" not in block.__dict__ and report.moe_out == ""
        assert any(n.startswith("not realised: the row's moe_out='fp32'") for n in report.notes)
    finally:
        rla.unalign(model)
