"""A row's variants: read from and written to JSON, applied by ``variant``, and every malformed
variant refused with a message naming it."""

import copy

import pytest

from rla import profiles


def test_round_trip_and_variant():
    row = profiles.get("vllm-0.33-eager")
    again = profiles.from_dict(profiles.to_dict(row))
    assert again.variants == row.variants
    assert {k: {p: e.note for p, e in v.items()} for k, v in again.variant_evidence.items()} == \
        {k: {p: e.note for p, e in v.items()} for k, v in row.variant_evidence.items()}
    v = row.variant("zero_centred_norm")
    assert v.name == "vllm-0.33-eager/zero_centred_norm" and v.norm_residual == "fp32_sum"
    assert v.calibration is None  # the row's calibration measured other modules
    assert profiles.get("rla").variant("gpt_oss") is profiles.get("rla")  # nothing differs: the row itself
    with pytest.raises(ValueError, match="unknown variant 'llama'"):
        row.variant("llama")


def test_hand_made_variant_writes_its_evidence():
    p = profiles.get("hf").replace(name="mine", variants={"gpt_oss": {"swiglu": "fused"}}, variant_evidence={})
    d = profiles.to_dict(p)
    assert d["variants"]["gpt_oss"]["evidence"]["swiglu"]["note"].startswith("set by hand")
    assert profiles.from_dict(d).variant("gpt_oss").swiglu == "fused"


@pytest.mark.parametrize("change, message", [
    (lambda v: v.update({"llama": v.pop("zero_centred_norm")}), "variant 'llama': unknown kind"),
    (lambda v: v["zero_centred_norm"].pop("evidence"), "exactly 'points' and 'evidence'"),
    (lambda v: v["zero_centred_norm"]["evidence"].pop("norm_residual"), "every point needs its evidence"),
    (lambda v: v["zero_centred_norm"]["points"].update(norm_residual="fp16_sum"), "norm_residual='fp16_sum'"),
    (lambda v: v["zero_centred_norm"]["evidence"]["norm_residual"].update(evidence="hearsay"), "evidence 'hearsay'"),
])
def test_malformed_variants_are_refused_by_name(change, message):
    d = copy.deepcopy(profiles.to_dict(profiles.get("vllm-0.33-eager")))
    change(d["variants"])
    with pytest.raises(ValueError, match=message):
        profiles.from_dict(d, "my.json")


def test_a_kind_that_extends_another_applies_that_kinds_points_first():
    """``qwen3_5`` extends ``zero_centred_norm`` (Qwen3.5's norms are zero-centred norms): its variant
    is the base kind's points, then its own, a point both set taking the narrower kind's value."""
    assert profiles.VARIANT_EXTENDS == {"qwen3_5": "zero_centred_norm"}
    row = profiles.get("vllm-0.33-eager")
    p = row.replace(name="mine", variant_evidence={}, variants={
        "zero_centred_norm": {"norm_residual": "fp32_sum", "norm_weight": "per_op"},
        "qwen3_5": {"norm_weight": "fused", "rope_cos_sin": "fp32"}})
    v = p.variant("qwen3_5")
    assert v.name == "mine/qwen3_5"
    assert (v.norm_residual, v.norm_weight, v.rope_cos_sin) == ("fp32_sum", "fused", "fp32")
    assert p.variant("zero_centred_norm").rope_cos_sin == row.rope_cos_sin == "round"  # the base sees only its own
    # a row with only the base kind's points gives them to the narrower kind
    assert row.variant("qwen3_5").points() == row.variant("zero_centred_norm").points()
