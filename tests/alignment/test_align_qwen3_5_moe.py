"""rla.align on Qwen3.5 MoE (``qwen3_5_moe_text``): every row, with and without the router region and
one region at a time, equals the oracle written from docs/families.md bit for bit
(tests/qwen3_5_spec.py: the dense oracle with its MoE block, the router points from router_spec);
unalign restores HF's modules; the report says what is left as is; the multimodal checkpoint's text
model is what is aligned, the multimodal class itself is refused by name."""

from __future__ import annotations

import pytest
import torch
import transformers
from packaging.version import Version

import rla
from rla.alignment import compat
from rla.profiles import get
from align_spec import single_thread  # noqa: F401  (fixture)
from qwen3_5_spec import qwen3_5_points, spec_forward, text_config_moe, tiny_qwen3_5_moe
from profile_rows import DISTINCT

pytestmark = pytest.mark.skipif(compat.TRANSFORMERS_VERSION < Version("5.24"),
                                reason="rla.align reads this family's 5.24 layout; older releases are refused "
                                       "(test_align_families_refused.py)")

THREE = ("rope", "swiglu", "rmsnorm")
ALL = (*THREE, "router")


@pytest.fixture(scope="module")
def moe():
    return tiny_qwen3_5_moe()


def _ids(seq=12):
    return torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(4))


def _aligned(model, profile, regions, ids):
    rla.align(model, profile, regions=regions)
    try:
        return model(ids).logits
    finally:
        rla.unalign(model)


def _want(model, profile, regions, ids):
    pts = qwen3_5_points(profile, tuple(r for r in regions if r != "router"))
    router = get(profile).router if "router" in regions else None  # None: HF's router and weighted sum
    return spec_forward(model, ids, pts, router)


def test_oracle_under_hf_points_is_the_unaligned_model(moe):
    with torch.no_grad():
        assert torch.equal(spec_forward(moe, _ids(), qwen3_5_points("hf")), moe(_ids()).logits)


@pytest.mark.parametrize("regions", [THREE, ALL], ids=["three", "with_router"])
@pytest.mark.parametrize("profile", DISTINCT)
def test_aligned_equals_the_row_bit_for_bit_and_unalign_restores(moe, profile, regions):
    ids = _ids()
    with torch.no_grad():
        before = moe(ids).logits
        got = _aligned(moe, profile, regions, ids)
        want = _want(moe, profile, regions, ids)
        after = moe(ids).logits
    assert torch.equal(got, want), f"{profile}: {(got == want).float().mean():.4f} of logits equal"
    assert torch.equal(after, before)
    assert torch.equal(got, before) == (profile == "hf")


@pytest.mark.parametrize("region", ALL)
def test_one_region_at_a_time(moe, region):
    """Each region alone equals the oracle with the row's points in that region only, and moves the logits
    (two rows whose points differ from HF's in every region at this head size, 32)."""
    ids = _ids()
    with torch.no_grad():
        before = moe(ids).logits
        for profile in ("vllm-0.33", "rla"):
            got = _aligned(moe, profile, (region,), ids)
            assert torch.equal(got, _want(moe, profile, (region,), ids)), (region, profile)
            assert not torch.equal(got, before), (region, profile)


def test_report_says_what_is_aligned_and_left_and_backward_reaches_the_experts(moe):
    report = rla.align(moe, "vllm", regions=ALL)
    try:
        moe(_ids(8)).logits.float().logsumexp(-1).mean().backward()
    finally:
        rla.unalign(moe)
    grads = {n: p.grad for n, p in moe.named_parameters() if ".mlp." in n}
    moe.zero_grad(set_to_none=True)
    assert grads and all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads.values())
    assert report.counts["swiglu"] == {"experts": 3, "shared_expert": 3, "attention output gate": 1}
    assert report.counts["router"] == {"MoE blocks": 3}
    assert report.counts["rmsnorm"] == {"decoder layers": 3, "zero-centred RMSNorm": 7, "q_norm/k_norm": 2,
                                        "MoE blocks (fp32 shared + routed)": 3}  # vllm's moe_out='fp32'
    assert report.moe_out == "fp32" and "moe_out='fp32'" in str(report)
    text = str(report)
    assert "2 of 3 layers are linear attention" in text and "fused_gate_sigmoid_mul_add" in text
    assert "silu_and_mul" in text and "left as is: the router" not in text
    three = str(rla.align(moe, "hf"))
    rla.unalign(moe)
    assert "left as is: the router" in three and "fused_gate_sigmoid_mul_add" in three


def test_grouped_experts_under_the_router_region_compute_the_row():
    """HF's default experts implementation (grouped_mm) sums the experts otherwise than the eager
    loop; the router region replaces that sum by the row's, so both give the oracle's logits."""
    model, ids = tiny_qwen3_5_moe(experts="grouped_mm"), _ids()
    assert model.config._experts_implementation == "grouped_mm"
    with torch.no_grad():
        plain = model(ids).logits
        assert torch.equal(_aligned(model, "hf", THREE, ids), plain)
        got = _aligned(model, "vllm-0.33", ALL, ids)
        assert torch.equal(got, _want(model, "vllm-0.33", ALL, ids))
        assert torch.equal(model(ids).logits, plain)


def test_refusals_before_anything_changes(moe):
    """A fused-activation experts kernel and a non-SiLU activation are refused under the swiglu region,
    naming the problem; nothing is patched."""
    before = {id(m): dict(m.__dict__) for m in moe.modules()}
    moe.config.hidden_act = "gelu"
    try:
        with pytest.raises(ValueError, match="hidden_act is 'gelu'"):
            rla.align(moe, "vllm")
    finally:
        moe.config.hidden_act = "silu"
    moe.config._experts_implementation = "sonicmoe"
    try:
        with pytest.raises(NotImplementedError, match="experts_implementation='sonicmoe'.*inside its own kernel"):
            rla.align(moe, "vllm")
    finally:
        moe.config._experts_implementation = "eager"
    assert all(m.__dict__.keys() == before[id(m)].keys() for m in moe.modules())


def _multimodal_config():
    text = text_config_moe().to_dict()
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    return transformers.Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)


def test_the_multimodal_checkpoint_aligns_through_its_text_model(tmp_path):
    """A released Qwen3.5 MoE checkpoint is multimodal (``qwen3_5_moe``): rla.hf.load_model loads its text
    model (``Qwen3_5MoeForCausalLM``, the ``qwen3_5_moe_text`` config) with the checkpoint's weights,
    which rla.align aligns; the multimodal class itself is refused by name before anything changes."""
    from rla.hf import causal_lm_config, load_model

    cfg = _multimodal_config()
    assert causal_lm_config(cfg).model_type == "qwen3_5_moe_text"
    torch.manual_seed(0)
    vlm = transformers.Qwen3_5MoeForConditionalGeneration._from_config(cfg, dtype=torch.bfloat16)
    before = {id(m): dict(m.__dict__) for m in vlm.modules()}
    with pytest.raises(NotImplementedError, match=r"Qwen3_5MoeForConditionalGeneration \(config.model_type="
                                                  r"'qwen3_5_moe'\).*docs/families.md"):
        rla.align(vlm, "vllm")
    assert all(m.__dict__.keys() == before[id(m)].keys() for m in vlm.modules())
    vlm.save_pretrained(str(tmp_path))
    lm = load_model(str(tmp_path))
    assert type(lm).__name__ == "Qwen3_5MoeForCausalLM" and lm.config.model_type == "qwen3_5_moe_text"
    want = {k.replace("model.language_model.", "model."): v for k, v in vlm.state_dict().items()
            if not k.startswith("model.visual.")}
    got = lm.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in got)
    lm.set_experts_implementation("eager")
    lm.config._attn_implementation = "eager"
    ids = _ids(8)
    with torch.no_grad():
        assert torch.equal(_aligned(lm, "vllm-0.33-eager", ALL, ids), _want(lm, "vllm-0.33-eager", ALL, ids))


def test_route_capture_and_replay_run_through_the_moe_blocks(moe):
    """capture_routes / replay_routes (rla.alignment.replay) find the three MoE blocks: a captured forward is
    HF's, bit for bit; replaying its routes gives the same logits, other routes other logits."""
    ids = _ids()
    assert rla.alignment.moe_layers(moe) == 3
    with torch.no_grad():
        plain = moe(ids).logits
        with rla.capture_routes(moe) as cap:
            assert torch.equal(moe(ids).logits, plain)
        experts = cap.ids().permute(1, 0, 2).reshape(2, ids.shape[1], 3, 3)  # [batch, seq, moe_layers, k]
        with rla.replay_routes(moe, experts):
            assert torch.equal(moe(ids).logits, plain)
        with rla.replay_routes(moe, (experts + 1) % 8):  # other experts: other logits
            assert not torch.equal(moe(ids).logits, plain)
    assert cap.ids().shape == (3, 2 * ids.shape[1], 3)
