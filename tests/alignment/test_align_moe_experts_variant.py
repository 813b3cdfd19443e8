"""The routed experts' own swiglu (the rows' ``moe_experts`` variant): vLLM runs them inside its
fused-MoE op with the CUDA ``silu_and_mul`` in both modes, so under the default rows (``swiglu=fused``
for dense MLPs) an aligned MoE model's routed experts round per_op while its shared experts and dense
MLPs stay fused. Each MoE family aligned to the default rows equals the oracle with the experts' value
and differs from the oracle that gives the experts the dense value; the report names the variant; the
variant is data with its evidence, applied after a family's own kind."""

from __future__ import annotations

import pytest
import torch

import rla
from rla import profiles
from align_spec import Row, single_thread  # noqa: F401  (fixture)
from moe_cases import DEFAULT_ROWS, FAMILIES, LAYOUTS, family as _family, ids as _ids, tiny

pytestmark = LAYOUTS


def _dense_value(pts):
    """The same points with the routed experts taking the row's dense value (no experts' rule)."""
    out = Row(pts, pts.fused_head_sizes, None)
    for k, v in vars(pts).items():
        if k not in ("fused_head_sizes", "experts_swiglu"):
            setattr(out, k, v)  # qwen3_5_points' attention points
    return out


@pytest.mark.parametrize("profile", DEFAULT_ROWS)
@pytest.mark.parametrize("family", FAMILIES)
def test_routed_experts_take_the_variant_not_the_dense_value(family, profile):
    model, pts_of, oracle = _family(family)
    pts = pts_of(profile)
    assert pts["swiglu"] == "fused" and pts.experts_swiglu == "per_op"
    ids = _ids()
    with torch.no_grad():
        report = rla.align(model, profile)
        try:
            got = model(ids).logits
        finally:
            rla.unalign(model)
        want = oracle(model, ids, pts)
        dense = oracle(model, ids, _dense_value(pts))
    assert torch.equal(got, want), f"{family} {profile}: {(got == want).float().mean():.4f} of logits equal"
    assert not torch.equal(got, dense), f"{family} {profile}: the routed experts took the dense row's swiglu"
    assert report.experts_variant == "moe_experts"
    assert report.ran_experts().swiglu == "per_op" and report.ran().swiglu == "fused"
    assert f"routed experts per_op (moe_experts)" in str(report)
    assert report.to_dict()["experts_points"]["swiglu"] == "per_op"
    assert any(f"'{report.ran().name}/moe_experts'" in n for n in report.notes)


def test_shared_experts_and_dense_mlps_keep_the_row():
    """Qwen2-MoE under vllm-0.33: the routed experts' product is RN(RN(silu(g)) * u), the shared
    expert's RN(silu(g) * u), each on the module's own inputs."""
    model = tiny("qwen2_moe")
    block = model.model.layers[0].mlp
    rla.align(model, "vllm-0.33")
    try:
        g = torch.randn(5, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16) * 4
        u = torch.randn(5, 32, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16) * 4
        with torch.no_grad():
            routed = block.experts._apply_gate(torch.cat([g, u], dim=-1))
            x = torch.randn(3, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
            sh = block.shared_expert
            shared = sh(x)
            gs, us = sh.gate_proj(x), sh.up_proj(x)
    finally:
        rla.unalign(model)
    per_op = (torch.nn.functional.silu(g.float()).to(torch.bfloat16).float() * u.float()).to(torch.bfloat16)
    fused = (torch.nn.functional.silu(g.float()) * u.float()).to(torch.bfloat16)
    assert not torch.equal(per_op, fused)  # the inputs tell the two apart
    assert torch.equal(routed, per_op)
    want_shared = sh.down_proj((torch.nn.functional.silu(gs.float()) * us.float()).to(torch.bfloat16))
    assert torch.equal(shared, want_shared)


def test_the_variant_is_data_with_evidence():
    for name in DEFAULT_ROWS:
        row = profiles.get(name)
        assert row.variants["moe_experts"] == {"swiglu": "per_op", "moe_out": "fp32"}  # moe_out: test_align_moe_out.py
        ev = row.variant_evidence["moe_experts"]["swiglu"]
        assert ev.evidence == "source" and "apply_moe_activation" in ev.note and "silu_and_mul" in ev.note
        v = row.variant("moe_experts")
        assert v.name == f"{name}/moe_experts" and v.swiglu == "per_op" and v.calibration is None
        again = profiles.from_dict(profiles.to_dict(row))
        assert again.variants["moe_experts"] == {"swiglu": "per_op", "moe_out": "fp32"}
    # rows whose routed experts already round as their dense MLPs: the row itself
    for name in ("vllm-0.33-eager", "vllm-0.26-eager", "sglang-0.5.23", "hf", "rla"):
        row = profiles.get(name)
        assert row.variant_on("moe_experts", row) is row, name


def test_variant_on_applies_the_kind_after_the_familys():
    row = profiles.get("vllm-0.33")
    fam = row.variant("qwen3_5")
    pe = row.variant_on("moe_experts", fam)
    assert pe.name == f"{fam.name}/moe_experts"
    assert pe.points() == {**fam.points(), "swiglu": "per_op"} and pe.moe_out == "fp32"  # and its variant point
    # a kind whose values the family's variant already holds changes nothing
    same = fam.replace(name="per_op_everywhere", swiglu="per_op", moe_out="fp32")
    assert row.variant_on("moe_experts", same) is same
    with pytest.raises(ValueError, match="unknown variant 'experts'"):
        row.variant_on("experts", fam)


def test_gpt_oss_clamped_experts_are_not_this_kind():
    """GPT-OSS's experts run swigluoai_and_mul (the gpt_oss kind, fused): moe_experts does not reach them."""
    from gpt_oss_spec import tiny_gpt_oss

    model = tiny_gpt_oss()
    report = rla.align(model, "vllm-0.33")
    rla.unalign(model)
    assert report.experts_variant == "" and report.ran().swiglu == "fused"
