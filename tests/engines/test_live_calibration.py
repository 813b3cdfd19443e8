"""The model-level search (rla.engines.live_calibration) against a stand-in engine whose row is
known: a small Qwen2 aligned under a calibrated row produces the "engine" logprobs, and the search
must find a row that reproduces them bit for bit, deciding every point the model exercises as that
row has it. Norm weights are drawn around 1 (HF initialises them to 1, where per_op and fused
norms coincide and the norm points could not be decided)."""

import pytest
import torch

from rla import profiles
from rla.alignment import aligned
from rla.engines import live_calibration as L
from rla.models import build_model, tiny_config
from rla.rollout.rollouts import RolloutRecord


@pytest.fixture(scope="module")
def model():
    # the micro size (hidden 64, two layers): the search scores the model ~140 times, and each scoring's GEMMs
    # at the tiny size's hidden 256 are most of its time; every point asserted decided below is decided at 64 too
    m = build_model(tiny_config("qwen2", "micro"), torch.bfloat16, seed=0).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
    return m


def _engine(model, row, prompt, response):
    with aligned(model, row):
        pre = [L.train_logprobs(model, prompt).tolist()]
        full = L.train_logprobs(model, prompt[:24] + response)[23:].tolist()
    rec = RolloutRecord(prompt_ids=prompt[:24], response_ids=response, logprobs=full, temperature=1.0,
                        top_p=1.0, top_k=-1, engine="vllm")
    return pre, [rec]


def test_the_search_finds_the_row_that_made_the_engine_logprobs(model):
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (64,), generator=g).tolist()
    response = torch.randint(0, model.config.vocab_size, (8,), generator=g).tolist()
    truth = profiles.get("vllm-0.33-eager")
    pre, records = _engine(model, truth, prompt, response)
    start = profiles.get("vllm-0.33")
    assert L.score(model, start, [prompt], pre, records)["prefill"]["equal"] < 0.5  # the start is wrong
    best, s, tried, flips = L.search(model, start, [prompt], pre, records, log=lambda m: None)
    assert s["prefill"]["equal"] == 1.0 and s["prefill"]["k3"] == 0.0
    # a point the prefill leaves tied may still differ on the decode record: not asserted equal
    decided = {p for p, f in flips.items() if f.get("decided")}
    assert {"rope_apply", "swiglu", "norm_weight", "norm_residual", "residual_stream"} <= decided
    assert all(getattr(best, p) == getattr(truth, p) for p in decided)
    assert not flips["qk_norm_out"]["decided"]  # Qwen2 has no q/k norms: the point ties
    assert len(tried) > len(profiles.POINTS)


def test_stats_count_bit_equality_and_k3_in_fp64():
    t = [torch.tensor([-1.0, -2.0, -3.0], dtype=torch.float64)]
    e = [torch.tensor([-1.0, -2.5, -3.0], dtype=torch.float64)]
    s = L.stats(t, e, [0])
    assert s["equal"] == pytest.approx(2 / 3) and s["max_abs"] == 0.5
    d = torch.tensor(0.5, dtype=torch.float64)
    assert s["k3"] == pytest.approx(float(torch.exp(d) - 1 - d) / 3, rel=1e-15)
    assert list(s["by_position"]) == ["0-1024"]


def test_variant_points_are_offered_to_the_families_that_have_them():
    from types import SimpleNamespace

    def of(model_type):
        return L.variant_points(SimpleNamespace(config=SimpleNamespace(model_type=model_type)))

    assert of("gemma3_text") == ("zero_centred_norm", {"post_norm_out": ("round", "fp32")})
    assert of("gemma4_text") == ("gemma4", {"post_norm_out": ("round", "fp32"), "ple_inputs": ("per_op", "fused"),
                                            "ple_add": ("stream", "rounded"), "stream_variance": ("normalised", "fp32"),
                                            "embed_variance": ("normalised", "fp32")})
    assert of("qwen3_5_text") == of("qwen3_5_moe_text") == ("qwen3_5", {"attn_gate": ("per_op", "fused")})
    for model_type, kind in (("qwen2", None), ("gpt_oss", "gpt_oss"), ("nope", None)):
        assert of(model_type) == (kind, {}), model_type


def test_the_search_decides_gemmas_post_norm_out_and_the_row_carries_it():
    """A tiny Gemma 3 aligned under vllm-0.33 (post_norm_out='fp32') is the engine; the search starts
    from the row with the post-norms rounded and finds fp32 in the zero_centred_norm variant, decided
    by its flip; the written row has it there with live evidence and keeps the start's other variants."""
    from gemma_spec import tiny_gemma3
    from rla.engines.live_profile import live_row, settle

    model = tiny_gemma3()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (40,), generator=g).tolist()
    response = torch.randint(0, model.config.vocab_size, (6,), generator=g).tolist()
    truth = profiles.get("vllm-0.33")
    pre, records = _engine(model, truth, prompt, response)
    start = truth.replace_variant("zero_centred_norm", name="start", post_norm_out="round")
    best, s, tried, flips = L.search(model, start, [prompt], pre, records, log=lambda m: None)
    assert s["prefill"]["equal"] == 1.0
    assert best.variant("zero_centred_norm").post_norm_out == "fp32"
    assert flips["post_norm_out"]["kind"] == "zero_centred_norm" and flips["post_norm_out"]["decided"]
    assert all("post_norm_out" in t["points"] for t in tried)
    best, s = settle(model, start, best, s, flips, [prompt], pre, records)
    row = live_row({"name": "vllm", "version": "0.33.0", "mode": "default"}, start, tried[0], best, s, flips,
                   {"family": "gemma3_text"}, date="d", gpu="cpu", torch="t", command="c", name="vllm-0.33-test")
    assert row.variants["zero_centred_norm"]["post_norm_out"] == "fp32"
    assert row.variant_evidence["zero_centred_norm"]["post_norm_out"].evidence == "live"
    assert row.variants["gpt_oss"] == truth.variants["gpt_oss"]  # the start's other variants, with their evidence
    assert profiles.from_dict(profiles.to_dict(row)).variant("zero_centred_norm").post_norm_out == "fp32"
    from rla.commands.calibrate_live import summary

    assert "| post_norm_out (zero_centred_norm) | round | fp32 | live |" in summary(row, start)


def test_a_row_point_the_family_variant_sets_is_searched_and_written_in_the_variant():
    """Qwen3.5's q/k norm output is the ``qwen3_5`` variant's (vLLM's fused q/k norm + RoPE kernel
    rounds it), whatever the row's own ``qk_norm_out``. A tiny Qwen3.5 aligned under vllm-0.33 (the
    variant's ``round``) is the engine; the start row's variant says ``fp32``. The search must read and
    flip the variant's value (a flip of the row's own value changes nothing this model computes: its k3
    would be the row's), and the written row holds ``round`` in the variant, the row's own value kept."""
    from qwen3_5_spec import tiny_qwen3_5
    from rla.commands.calibrate_live import summary
    from rla.engines.live_points import runs, set_in
    from rla.engines.live_profile import live_row, settle

    model = tiny_qwen3_5()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (40,), generator=g).tolist()
    response = torch.randint(0, model.config.vocab_size, (6,), generator=g).tolist()
    truth = profiles.get("vllm-0.33")
    assert truth.variants["qwen3_5"]["qk_norm_out"] == "round" and truth.qk_norm_out == "fp32"
    pre, records = _engine(model, truth, prompt, response)
    start = truth.replace_variant("qwen3_5", name="start", qk_norm_out="fp32")
    assert L.points_of(start, "qwen3_5")["qk_norm_out"] == "fp32" and set_in(start, "qwen3_5")["qk_norm_out"] == "qwen3_5"
    # the bug: the row's own point is no point of this model's (the variant overrides it)
    assert runs(model, start.replace(qk_norm_out="round")) == runs(model, start)
    assert L.score(model, start, [prompt], pre, records)["prefill"]["equal"] < 1.0
    best, s, tried, flips = L.search(model, start, [prompt], pre, records, log=lambda m: None)
    assert s["prefill"]["equal"] == 1.0 and s["prefill"]["k3"] == 0.0
    assert best.variant("qwen3_5").qk_norm_out == "round" and best.qk_norm_out == "fp32"
    f = flips["qk_norm_out"]
    assert f["kind"] == "qwen3_5" and f["other"] == "fp32" and f["decided"] and f["prefill_k3"] != s["prefill"]["k3"]
    assert "applies" not in f and all(t["points"]["qk_norm_out"] in ("round", "fp32") for t in tried)
    assert "kind" not in flips["rope_apply"]  # the variant does not set it: the row's own point
    best, s = settle(model, start, best, s, flips, [prompt], pre, records)
    row = live_row({"name": "vllm", "version": "0.33.0", "mode": "default"}, start, tried[0], best, s, flips,
                   {"family": "qwen3_5_text"}, date="d", gpu="cpu", torch="t", command="c", name="vllm-0.33-test")
    assert row.variants["qwen3_5"]["qk_norm_out"] == "round" and row.qk_norm_out == start.qk_norm_out == "fp32"
    assert row.variant_evidence["qwen3_5"]["qk_norm_out"].evidence == "live"
    assert "in the qwen3_5 variant: flipped to fp32" in row.variant_evidence["qwen3_5"]["qk_norm_out"].note
    own = row.calibration.points["qk_norm_out"]
    assert own.evidence != "live" and "this model computes the qwen3_5 variant's value (round)" in own.note
    back = profiles.from_dict(profiles.to_dict(row))
    assert back.variant("qwen3_5").qk_norm_out == "round" and back.variant("zero_centred_norm").qk_norm_out == "fp32"
    table = summary(row, start)
    assert "| qk_norm_out | fp32 (qwen3_5 variant) | round (qwen3_5 variant) | live |" in table
    assert "the row's own value (other families): fp32" in table


def test_a_flip_that_changes_nothing_the_model_runs_is_said_not_to_apply():
    """SGLang's row sets its RoPE points by head size (a condition, which ``rla.align`` applies first):
    at a tiny Qwen2's head size 16 (not one of 64/128/256/512) the condition's values hold, so
    flipping the row's own ``rope_cos_sin`` changes nothing the model computes. The flip says so
    (``applies: False``, scores equal, not decided), and the written row says it does not apply
    rather than that its flip ties; a flip that changes what the model runs (``swiglu``) applies."""
    from rla.engines.live_points import runs
    from rla.engines.live_profile import live_row

    row = profiles.get("sglang-0.5.23")
    assert row.conditions and row.at_head_size(16).rope_cos_sin == "round" and row.rope_cos_sin == "fp32"
    model = build_model(tiny_config("qwen2", num_hidden_layers=1, num_attention_heads=16, num_key_value_heads=4),
                        torch.bfloat16, seed=0).eval()
    assert model.config.hidden_size // model.config.num_attention_heads == 16
    assert runs(model, row.replace(rope_cos_sin="round")) == runs(model, row)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (32,), generator=g).tolist()
    pre, records = _engine(model, profiles.get("vllm-0.33-eager"), prompt, prompt[24:28])
    s = L.score(model, row, [prompt], pre, records)
    flips = {p: L.flip(model, row, s, p, c, None, [prompt], pre, records) for p, c in profiles.POINTS.items()}
    f = flips["rope_cos_sin"]
    assert f["applies"] is False and not f["decided"] and f["prefill_k3"] == s["prefill"]["k3"]
    assert "applies" not in flips["swiglu"] and flips["swiglu"]["decided"]
    out = live_row({"name": "sglang", "version": "0.5.23", "mode": "default"}, row, s, row, s, flips,
                   {"family": "qwen2"}, date="d", gpu="cpu", torch="t", command="c", name="sglang-test")
    assert "does not apply to this model" in out.calibration.points["rope_cos_sin"].note
    assert "its flip ties" not in out.calibration.points["rope_cos_sin"].note


def test_the_points_a_family_variant_sets_and_the_routed_experts_values_are_named():
    """Every row's family variants that set a row point (data/*.json) are where the search reads it;
    on an MoE model a flip names the value the routed experts' ``moe_experts`` variant keeps."""
    from types import SimpleNamespace

    from rla.engines.live_points import points_of, second_values, set_in, with_points

    row = profiles.get("vllm-0.33")
    assert set_in(row, "qwen3_5") == {"qk_norm_out": "qwen3_5"} and set_in(row, "gpt_oss") == {"rope_cos_sin": "gpt_oss"}
    assert set_in(row, None) == {} and points_of(row, None) == row.points()
    eager = profiles.get("vllm-0.26-eager")  # its zero_centred_norm sets two norm points, which qwen3_5 extends
    assert set_in(eager, "qwen3_5") == {"norm_residual": "zero_centred_norm", "norm_reduction": "zero_centred_norm"}
    moved = with_points(eager, {"norm_residual": "rounded_sum", "swiglu": "per_op"}, "qwen3_5")
    assert moved.norm_residual == eager.norm_residual and moved.variants["qwen3_5"]["norm_residual"] == "rounded_sum"
    assert moved.swiglu == "per_op" and "swiglu" not in moved.variants["qwen3_5"]
    assert moved.variant("zero_centred_norm").norm_residual == eager.variant("zero_centred_norm").norm_residual
    moe = SimpleNamespace(config=SimpleNamespace(model_type="qwen3_5_moe_text"))
    assert row.swiglu == "fused" and second_values(moe, row, "swiglu") == {"moe_experts": "per_op"}
    assert second_values(moe, row.replace(swiglu="per_op"), "swiglu") == {}
    dense = SimpleNamespace(config=SimpleNamespace(model_type="qwen3_5_text"))
    assert second_values(dense, row, "swiglu") == {}


def _oracle_engine(model, pts, prompt, response):
    """Engine outputs from the GLM-4 MoE oracle (tests/glm4_moe_spec.py: no rla.align, no row) under
    the points ``pts``: log_softmax(bf16 logits, fp32) of each next token, as vLLM computes them."""
    from glm4_moe_spec import spec_forward

    def logprobs(ids):
        x = torch.tensor(ids)[None]
        with torch.no_grad():
            logits = spec_forward(model, x, pts)
        return logits[0, :-1].log_softmax(-1, dtype=torch.float32).gather(-1, x[0, 1:, None])[:, 0].double()

    full = logprobs(prompt[:24] + response)[23:].tolist()
    rec = RolloutRecord(prompt_ids=prompt[:24], response_ids=response, logprobs=full, temperature=1.0,
                        top_p=1.0, top_k=-1, engine="vllm")
    return [logprobs(prompt).tolist()], [rec]


@pytest.mark.parametrize("engine_row, experts_swiglu, moe_out", [("vllm-0.26", "per_op", "fp32"),
                                                                  ("vllm-0.26-eager", None, "round")])
def test_the_search_finds_the_moe_sum_and_writes_it_in_the_moe_experts_variant(engine_row, experts_swiglu, moe_out):
    """GLM-4 MoE's residual add after an MoE block reads the shared + routed sum as the engine forms
    it: fp32 in vLLM's compiled graph, rounded in eager mode (the rows' ``moe_experts`` variant point
    ``moe_out``, a point only those modules have). The "engine" is the oracle with the row's points
    copied as data (align_spec.SPEC), the routed experts' own SwiGLU and the sum's value given
    explicitly; the search starts from the row with the other ``moe_out`` in its ``moe_experts``
    variant. It must search ``moe_out`` (and the routed experts' ``swiglu`` where the variant sets it)
    as those modules compute it, find the engine's value, and write it into the ``moe_experts``
    variant with live evidence, the row's own points left as they were; the report labels it by kind."""
    from align_spec import SPEC, Row
    from glm4_moe_spec import tiny_glm4_moe
    from rla.commands.calibrate_live import summary
    from rla.engines.live_profile import live_row, settle

    model = tiny_glm4_moe()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (40,), generator=g).tolist()
    response = torch.randint(0, model.config.vocab_size, (6,), generator=g).tolist()
    pre, records = _oracle_engine(model, Row(SPEC[engine_row], None, experts_swiglu, moe_out), prompt, response)
    other = "round" if moe_out == "fp32" else "fp32"
    start = profiles.get(engine_row).replace_variant("moe_experts", name="start", moe_out=other)
    assert L.score(model, start, [prompt], pre, records)["prefill"]["equal"] < 0.5  # the start is wrong
    best, s, tried, flips = L.search(model, start, [prompt], pre, records, log=lambda m: None)
    assert s["prefill"]["equal"] == 1.0 and s["prefill"]["k3"] == 0.0
    assert {t["points"]["moe_experts.moe_out"] for t in tried} == {"round", "fp32"}
    assert best.variants["moe_experts"]["moe_out"] == moe_out and best.points() == start.points()
    f = flips["moe_experts.moe_out"]
    assert (f["kind"], f["point"], f["other"], f["decided"]) == ("moe_experts", "moe_out", other, True)
    if experts_swiglu:  # the variant sets the routed experts' own swiglu: searched and flipped apart from the row's
        e = flips["moe_experts.swiglu"]
        assert best.variants["moe_experts"]["swiglu"] == experts_swiglu != best.swiglu
        assert (e["kind"], e["other"], e["decided"]) == ("moe_experts", best.swiglu, True)
    else:  # computed alike in every module: one point, as before
        assert "moe_experts.swiglu" not in flips and "swiglu" not in best.variants["moe_experts"]
    best, s = settle(model, start, best, s, flips, [prompt], pre, records)
    row = live_row({"name": "vllm", "version": "0.26.0", "mode": "default"}, start, tried[0], best, s, flips,
                   {"family": "glm4_moe"}, date="d", gpu="cpu", torch="t", command="c", name="vllm-0.26-test")
    assert row.variants["moe_experts"]["moe_out"] == moe_out and row.moe_out == start.moe_out
    ev = row.variant_evidence["moe_experts"]["moe_out"]
    assert ev.evidence == "live" and ev.note.startswith(f"in the moe_experts variant: flipped to {other}")
    back = profiles.from_dict(profiles.to_dict(row))
    assert back.variant_on("moe_experts", back).moe_out == moe_out
    table = summary(row, start, flips)
    assert f"| moe_out (moe_experts) | {other} | {moe_out} | live | in the moe_experts variant" in table
    assert (f"| swiglu (moe_experts) | {experts_swiglu} | {experts_swiglu} | live |" in table) == bool(experts_swiglu)


def test_a_second_kinds_point_this_model_does_not_compute_is_said_not_to_apply():
    """Qwen3-MoE's blocks have no shared experts (HF's module has none), so ``moe_out`` changes
    nothing it computes: vllm-0.26's ``moe_experts`` variant sets it, its flip says it does not
    apply, and the written row keeps the start's value with a note saying so; the routed experts'
    ``swiglu``, which they do compute, is flipped and decided."""
    from moe_models import model as moe_model
    from rla.commands.calibrate_live import summary
    from rla.engines.live_points import runs, second_points, with_points
    from rla.engines.live_profile import live_row

    model = moe_model("qwen3_moe")
    assert not any(hasattr(m, "shared_expert") or hasattr(m, "shared_experts") for m in model.modules())
    row = profiles.get("vllm-0.26")
    assert set(second_points(model, row)) == {"moe_experts.swiglu", "moe_experts.moe_out"}
    assert runs(model, with_points(row, {"moe_experts.moe_out": "round"}, None)) == runs(model, row)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (32,), generator=g).tolist()
    pre, records = _engine(model, row, prompt, prompt[24:28])
    s = L.score(model, row, [prompt], pre, records)
    flips = {p: L.flip(model, row, s, p, c, None, [prompt], pre, records)
             for p, c in {**profiles.POINTS, **second_points(model, row)}.items()}
    f = flips["moe_experts.moe_out"]
    assert f["applies"] is False and not f["decided"] and f["prefill_k3"] == s["prefill"]["k3"]
    assert "applies" not in flips["moe_experts.swiglu"] and flips["moe_experts.swiglu"]["decided"]
    out = live_row({"name": "vllm", "version": "0.26.0", "mode": "default"}, row, s, row, s, flips,
                   {"family": "qwen3_moe"}, date="d", gpu="cpu", torch="t", command="c", name="vllm-0.26-test")
    ev = out.variant_evidence["moe_experts"]["moe_out"]
    assert out.variants["moe_experts"]["moe_out"] == "fp32" and ev.evidence == row.variant_evidence[
        "moe_experts"]["moe_out"].evidence
    assert "does not apply to this model" in ev.note and "kept from vllm-0.26" in ev.note
    assert out.variant_evidence["moe_experts"]["swiglu"].evidence == "live"
    assert "| moe_out (moe_experts) | fp32 | fp32 | native_compiled | not decided" in summary(out, row, flips)


def test_the_second_kinds_points_each_family_computes_are_named():
    """Which second kinds' points a model's modules compute (rla.alignment: the routed experts follow
    ``moe_experts`` unless clamped like GPT-OSS's, which follow ``gpt_oss``; ``moe_out`` needs shared
    experts; Gemma 4's gate needs per-layer inputs), and which are searched apart: those the row's
    second-kind variant sets, and ``moe_out``; a point no such variant sets stays the row's one point."""
    from types import SimpleNamespace

    from rla.engines.live_points import computes, runs, second_points, second_value, with_points

    def of(model_type, **config):
        return SimpleNamespace(config=SimpleNamespace(model_type=model_type, **config))

    assert computes(of("glm4_moe")) == computes(of("qwen2_moe")) == {"moe_experts": ("swiglu", "moe_out")}
    assert computes(of("qwen3_moe")) == {"moe_experts": ("swiglu",)}
    assert computes(of("gpt_oss")) == {"moe_experts": ()}
    assert computes(of("gemma4_text", hidden_size_per_layer_input=256)) == {"gemma4_ple": ("swiglu",)}
    no_ple = of("gemma4_text", hidden_size_per_layer_input=0, head_dim=16)
    assert computes(no_ple) == {"gemma4_ple": ()}
    assert computes(of("qwen2")) == computes(of("qwen3_5_text")) == {}
    vllm, eager, sglang = profiles.get("vllm-0.26"), profiles.get("vllm-0.26-eager"), profiles.get("sglang-0.5.23")
    assert list(second_points(of("glm4_moe"), vllm)) == ["moe_experts.swiglu", "moe_experts.moe_out"]
    assert list(second_points(of("glm4_moe"), eager)) == ["moe_experts.moe_out"]
    assert list(second_points(of("gemma4_text", hidden_size_per_layer_input=256), sglang)) == ["gemma4_ple.swiglu"]
    assert second_points(of("gemma4_text", hidden_size_per_layer_input=256), vllm) == {}
    assert second_points(of("qwen2"), vllm) == {}
    assert (vllm.swiglu, second_value(vllm, None, "moe_experts.swiglu")) == ("fused", "per_op")
    assert second_value(vllm, None, "moe_experts.moe_out") == "fp32"
    assert second_value(eager, None, "moe_experts.moe_out") == eager.variant_on("moe_experts", eager).moe_out == "round"
    assert (sglang.swiglu, second_value(sglang, "gemma4", "gemma4_ple.swiglu")) == ("fused", "per_op")
    assert list(second_points(no_ple, sglang)) == ["gemma4_ple.swiglu"]  # flipped, and said not to apply
    assert runs(no_ple, with_points(sglang, {"gemma4_ple.swiglu": "fused"}, "gemma4")) == runs(no_ple, sglang)


def test_gemma4s_per_layer_input_gate_is_flipped_in_its_own_variant():
    """SGLang's row sets the swiglu point of Gemma 4's per-layer-input gate in its ``gemma4_ple``
    variant (two eager ops: per_op) apart from its MLPs' (fused). A tiny Gemma 4 aligned under that
    row is the engine; the gate's point is flipped as the gate computes it (``gemma4_ple.swiglu``) and
    decides, the row's own ``swiglu`` flip leaves the gate per_op, and the written row has the gate's
    value in the variant with live evidence. (Without per-layer inputs the gate's flip does not apply:
    test_the_second_kinds_points_each_family_computes_are_named; HF's Gemma4TextModel.forward without
    them fails on its own before any row.)"""
    from gemma4_spec import tiny_gemma4
    from rla.engines.live_points import second_points
    from rla.engines.live_profile import live_row

    model = tiny_gemma4()
    row = profiles.get("sglang-0.5.23")
    assert row.swiglu == "fused" and row.variants["gemma4_ple"] == {"swiglu": "per_op"}
    second = second_points(model, row)
    assert list(second) == ["gemma4_ple.swiglu"]
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (32,), generator=g).tolist()
    pre, records = _engine(model, row, prompt, prompt[24:28])
    s = L.score(model, row, [prompt], pre, records)
    assert s["prefill"]["equal"] == 1.0
    kind, extra = L.variant_points(model)
    flips = {p: L.flip(model, row, s, p, c, kind, [prompt], pre, records)
             for p, c in {**profiles.POINTS, **extra, **second}.items()}
    f = flips["gemma4_ple.swiglu"]
    assert (f["kind"], f["point"], f["other"]) == ("gemma4_ple", "swiglu", "fused")
    assert "applies" not in f and f["decided"] and f["prefill_k3"] != s["prefill"]["k3"]
    assert flips["swiglu"]["second"] == {"gemma4_ple": "per_op"}
    out = live_row({"name": "sglang", "version": "0.5.23", "mode": "default"}, row, s, row, s, flips,
                   {"family": "gemma4_text"}, date="d", gpu="cpu", torch="t", command="c", name="sglang-test")
    ev = out.variant_evidence["gemma4_ple"]["swiglu"]
    assert out.variants["gemma4_ple"]["swiglu"] == "per_op" and out.swiglu == "fused"
    assert ev.evidence == "live" and ev.note.startswith("in the gemma4_ple variant: flipped to fused")
    # Gemma 4's model-body points, which sglang's row leaves at HF's: unset where the flip did not decide them
    # (ple_add changes nothing under residual_stream='rounded'), live where it did
    body = ("ple_inputs", "ple_add", "stream_variance", "embed_variance")
    assert not flips["ple_add"]["decided"] and "ple_add" not in out.variants.get("gemma4", {})
    for p in body:
        assert (p in out.variants.get("gemma4", {})) == bool(flips[p].get("decided")), p


def test_gemma4s_model_body_points_are_searched_in_a_group_of_their_own(monkeypatch):
    """The four model-body points (rla.profiles.variant_points.BODY_POINTS) go through every combination
    with norm_residual and residual_stream, never with the rmsnorm group's norm_weight, norm_reduction or
    post_norm_out (1,024 combinations in one group otherwise). The scores are stubbed (every row ties), so
    the search makes one sweep and the tried rows are the groups' combinations."""
    from gemma4_spec import tiny_gemma4
    from rla.profiles.variant_points import BODY_POINTS

    tie = {"prefill": {"k3": 1.0, "equal": 0.0, "tokens": 1}, "decode": {"k3": 1.0, "equal": 0.0, "tokens": 1}}
    monkeypatch.setattr(L, "score", lambda *a, **k: tie)
    model = tiny_gemma4(layers=2, kv_shared=0)
    start = profiles.get("vllm-0.33")
    _, _, tried, flips = L.search(model, start, [[1, 2, 3]], [[0.0, 0.0]], [], log=lambda m: None)
    first = tried[0]["points"]
    moved = [{p for p, v in t["points"].items() if v != first[p]} for t in tried[1:]]
    body = [m for m in moved if m & set(BODY_POINTS)]
    assert len({frozenset(m & set(BODY_POINTS)) for m in body}) == 2 ** len(BODY_POINTS) - 1  # every combination
    assert all(m <= set(BODY_POINTS) | set(L.BODY_WITH) for m in body)
    assert any(m & {"norm_residual", "residual_stream"} for m in body)
    assert set(BODY_POINTS) <= set(flips) and all(flips[p]["kind"] == "gemma4" for p in BODY_POINTS)
