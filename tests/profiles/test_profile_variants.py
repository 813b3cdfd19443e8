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


# -- variant points (points only some kinds of modules have) ---------------------------------------


def test_every_row_states_post_norm_out_for_the_kinds_that_have_it_with_evidence():
    assert profiles.VARIANT_POINTS == {"post_norm_out": ("round", "fp32"), "moe_out": ("round", "fp32"),
                                       "attn_gate": ("per_op", "fused"), "oai_glu": ("sigmoid", "quotient"),
                                       **GEMMA4_POINTS}
    assert profiles.VARIANT_POINT_KINDS == {"post_norm_out": ("zero_centred_norm", "gemma4"),
                                            "moe_out": ("moe_experts",), "attn_gate": ("qwen3_5",),
                                            "oai_glu": ("gpt_oss",), **{p: ("gemma4",) for p in GEMMA4_POINTS}}
    want = {"vllm-0.33": "fp32", "vllm-0.26": "fp32"}  # the compiled graph (docs/families.md); every other rounds
    for name in profiles.names():
        row = profiles.get(name)
        for kind in ("zero_centred_norm", "gemma4"):
            assert row.variants[kind]["post_norm_out"] == want.get(name, "round"), (name, kind)
            assert row.variant_evidence[kind]["post_norm_out"].note, (name, kind)
            assert row.variant(kind).post_norm_out == want.get(name, "round")
        assert row.post_norm_out == "round"  # a row's own value: the point is not one of its points
        assert "post_norm_out" not in row.points()
    assert profiles.get("vllm-0.33").variant_evidence["zero_centred_norm"]["post_norm_out"].evidence == "native_compiled"
    assert profiles.get("vllm-0.33").variant_evidence["gemma4"]["post_norm_out"].evidence == "native_compiled"
    assert profiles.get("vllm-0.26").variant_evidence["gemma4"]["post_norm_out"].evidence == "source"  # by analogy


def test_every_vllm_row_states_the_clamped_swiglus_quotient_with_evidence():
    """GPT-OSS's fused clamped SwiGLU: vLLM's swigluoai_and_mul kernel forms the product, then one division
    (its SASS, 0.26.0 and 0.33.0 alike, both modes: the fused MoE is opaque to Inductor); every other row
    keeps HF's order (hf and sglang-0.5.23 state nothing; rla is a recipe)."""
    for name in profiles.names():
        row = profiles.get(name)
        want = "quotient" if row.calibration is not None and row.calibration.engine == "vllm" else "sigmoid"
        assert row.variant("gpt_oss").oai_glu == want, name
        assert row.oai_glu == "sigmoid" and "oai_glu" not in row.points(), name  # a variant point only
        if want == "quotient":
            assert row.variant("gpt_oss").swiglu == "fused", name
            ev = row.variant_evidence["gpt_oss"]["oai_glu"]
            assert "swigluoai_and_mul" in ev.note and "gptoss_quotient_h200_2026-12-04" in ev.note, name
            assert (ev.evidence, ev.matched) == (("kernel", 1.0) if row.calibration.version.startswith("0.33")
                                                 else ("source", None)), name  # 0.26: its SASS, the same instructions
    with pytest.raises(ValueError, match="variant 'qwen3_5' sets 'oai_glu', a point only the kinds"):
        profiles.get("vllm-0.33").replace_variant("qwen3_5", oai_glu="quotient")


#: Gemma 4's model-body points (rla.profiles.variant_points), HF eager's value first.
GEMMA4_POINTS = {"ple_inputs": ("per_op", "fused"), "ple_add": ("stream", "rounded"),
                 "stream_variance": ("normalised", "fp32"), "embed_variance": ("normalised", "fp32")}


def test_the_default_rows_state_gemma4s_four_chains_with_the_twin_as_evidence():
    """vLLM's compiled Gemma 4 graph (the default rows' gemma4 variant) takes the second value of each
    of the four points, measured by the CPU engine twin (its test named in the note) with the GPU run's
    folder; every other row keeps HF's (unstated: the field's default), and no other kind may set them."""
    for name in profiles.names():
        row = profiles.get(name)
        v = row.variant("gemma4")
        for point, (hf, compiled) in GEMMA4_POINTS.items():
            assert getattr(row, point) == hf and point not in row.points(), (name, point)
            if name in ("vllm-0.33", "vllm-0.26"):
                assert getattr(v, point) == compiled, (name, point)
                ev = row.variant_evidence["gemma4"][point]
                assert ev.evidence == "native_compiled", (name, point)
                assert "test_gemma4_default_twin_is_the_row_with_four_chains" in ev.note, (name, point)
                assert "results/benchmarks/twin_gemma4_h200_2026-12-03/" in ev.note, (name, point)
            else:
                assert getattr(v, point) == hf and point not in row.variants.get("gemma4", {}), (name, point)
    assert profiles.get("vllm-0.33").variant_evidence["gemma4"]["ple_inputs"].matched == 1.0
    row = profiles.get("vllm-0.33-eager")
    with pytest.raises(ValueError, match=r"sets 'stream_variance', a point only the kinds \['gemma4'\] have"):
        row.replace(variants={"zero_centred_norm": {"stream_variance": "fp32"}}, variant_evidence={})
    with pytest.raises(ValueError, match="sets ple_add='fp32'"):
        row.replace(variants={"gemma4": {"ple_add": "fp32"}}, variant_evidence={})


def test_every_engine_row_states_moe_out_for_moe_blocks_with_evidence():
    """The MoE block's shared + routed sum: unrounded into the residual add in vLLM's compiled graph
    (the default rows), rounded by vLLM's eager mode and SGLang (docs/families.md, GLM-4 MoE); hf and
    rla state nothing (HF's block rounds it: the default)."""
    want = {"vllm-0.33": "fp32", "vllm-0.26": "fp32", "vllm-0.33-eager": "round", "vllm-0.26-eager": "round",
            "sglang-0.5.23": "round"}
    for name in profiles.names():
        row = profiles.get(name)
        assert row.moe_out == "round" and "moe_out" not in row.points(), name  # not one of the row's points
        assert row.variant("moe_experts").moe_out == want.get(name, "round"), name
        if name in want:
            ev = row.variant_evidence["moe_experts"]["moe_out"]
            assert row.variants["moe_experts"]["moe_out"] == want[name], name
            read = "MoERunner.forward" if name.startswith("vllm") else "Glm4MoeSparseMoeBlock.forward_normal"
            assert read in ev.note, name
        else:
            assert "moe_out" not in row.variants.get("moe_experts", {}), name
    ev = profiles.get("vllm-0.33").variant_evidence["moe_experts"]["moe_out"]
    assert ev.evidence == "native_compiled" and ev.matched == 1.0 and "test_glm4_moe_default_twin" in ev.note
    assert profiles.get("vllm-0.26").variant_evidence["moe_experts"]["moe_out"].evidence == "native_compiled"
    # a kind without the point may not set it; the point has only its two choices
    with pytest.raises(ValueError, match="variant 'gpt_oss' sets 'moe_out', a point only the kinds"):
        profiles.get("vllm-0.33").replace_variant("gpt_oss", moe_out="fp32")
    with pytest.raises(ValueError, match="moe_out='fp16'"):
        profiles.get("vllm-0.33").replace_variant("moe_experts", moe_out="fp16")
    again = profiles.from_dict(profiles.to_dict(profiles.get("vllm-0.33")))
    assert again.variant("moe_experts").moe_out == "fp32"


def test_every_row_states_attn_gate_for_qwen3_5_with_evidence():
    """Qwen3.5's output gate: HF's two roundings where the engine runs its two PyTorch ops eagerly, one rounding
    where a kernel or a compiled graph fuses them (docs/families.md); a row's own value stays per_op."""
    want = {"vllm-0.33": "fused", "vllm-0.26": "fused", "sglang-0.5.23": "fused", "rla": "fused"}
    for name in profiles.names():
        row = profiles.get(name)
        assert row.variants["qwen3_5"]["attn_gate"] == want.get(name, "per_op"), name
        assert row.variant_evidence["qwen3_5"]["attn_gate"].note, name
        assert row.variant("qwen3_5").attn_gate == want.get(name, "per_op")
        assert row.attn_gate == "per_op" and "attn_gate" not in row.points()
        for kind in ("zero_centred_norm", "gemma4", "gpt_oss"):  # no other kind has the point
            assert row.variant(kind).attn_gate == "per_op" and "attn_gate" not in row.variant(kind).kind_points(kind)
    ev = {n: profiles.get(n).variant_evidence["qwen3_5"]["attn_gate"] for n in ("vllm-0.33", "vllm-0.33-eager")}
    assert (ev["vllm-0.33"].evidence, ev["vllm-0.33"].matched) == ("native_compiled", 1.0)
    assert (ev["vllm-0.33-eager"].evidence, ev["vllm-0.33-eager"].matched) == ("native_eager", 1.0)
    assert "test_default_twin_with_the_kernel_is_the_row" in ev["vllm-0.33"].note
    with pytest.raises(ValueError, match=r"variant 'gemma4' sets 'attn_gate', a point only the kinds \['qwen3_5'\]"):
        profiles.get("hf").replace_variant("gemma4", attn_gate="fused")
    with pytest.raises(ValueError, match=r"attn_gate='once'"):
        profiles.get("hf").replace_variant("qwen3_5", attn_gate="once")


def test_a_kind_without_the_point_does_not_take_it():
    """Qwen3.5's norms are zero-centred (qwen3_5 extends zero_centred_norm) but its layers have no
    norm after a sub-block: its variant does not take post_norm_out, and no row may set it for it."""
    row = profiles.get("vllm-0.33")
    assert row.variant("zero_centred_norm").post_norm_out == "fp32"
    assert row.variant("qwen3_5").post_norm_out == "round"  # its own points (qk_norm_out) only
    assert row.variant("qwen3_5").points() == {**row.variant("zero_centred_norm").points(), "qk_norm_out": "round"}
    assert row.variant("qwen3_5").kind_points("qwen3_5") == {"attn_gate": "fused"}  # its own variant point
    assert row.variant("zero_centred_norm").kind_points("zero_centred_norm") == {"post_norm_out": "fp32"}
    assert row.kind_points("qwen3_5") == {"attn_gate": "per_op"} and row.kind_points("gpt_oss") == {"oai_glu": "sigmoid"}
    assert row.variant("gpt_oss").kind_points("gpt_oss") == {"oai_glu": "quotient"}
    for kind in ("qwen3_5", "gpt_oss", "gemma4_ple"):
        with pytest.raises(ValueError, match=rf"variant '{kind}' sets 'post_norm_out', a point only the kinds"):
            row.replace_variant(kind, post_norm_out="fp32")


@pytest.mark.parametrize("change, message", [
    (lambda d: d["points"].update(post_norm_out="fp32"), r"points must be exactly .*unknown \['post_norm_out'\]"),
    (lambda d: d["variants"]["zero_centred_norm"]["points"].update(post_norm_out="fp16"), "post_norm_out='fp16'"),
    (lambda d: d["variants"]["zero_centred_norm"]["evidence"].pop("post_norm_out"), "every point needs its evidence"),
    (lambda d: d["variants"]["gpt_oss"].update(points={**d["variants"]["gpt_oss"]["points"], "post_norm_out": "round"},
                                               evidence={**d["variants"]["gpt_oss"]["evidence"],
                                                         "post_norm_out": {"evidence": "source"}}),
     "variant 'gpt_oss' sets 'post_norm_out'"),
])
def test_malformed_variant_points_are_refused_by_name(change, message):
    d = copy.deepcopy(profiles.to_dict(profiles.get("vllm-0.33")))
    change(d)
    with pytest.raises(ValueError, match=message):
        profiles.from_dict(d, "my.json")


def test_replace_variant_drops_the_changed_points_evidence_and_round_trips():
    row = profiles.get("vllm-0.33")
    p = row.replace_variant("zero_centred_norm", name="mine", post_norm_out="round")
    assert p.name == "mine" and p.variant("zero_centred_norm").post_norm_out == "round"
    assert "post_norm_out" not in p.variant_evidence["zero_centred_norm"]
    assert p.variant_evidence["gemma4"] == row.variant_evidence["gemma4"]  # other kinds keep theirs
    d = profiles.to_dict(p)
    assert d["variants"]["zero_centred_norm"]["evidence"]["post_norm_out"]["note"].startswith("set by hand")
    assert profiles.from_dict(d).variant("zero_centred_norm").post_norm_out == "round"
    assert profiles.from_dict(profiles.to_dict(row)).variant("gemma4").post_norm_out == "fp32"
    with pytest.raises(ValueError, match="unknown variant 'llama'"):
        row.replace_variant("llama", post_norm_out="fp32")
