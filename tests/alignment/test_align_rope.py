"""RoPE alignment: fp32 cos/sin half tables from an fp32 inv_freq, the bf16-buffer hazard, scaled RoPE types."""

from __future__ import annotations

import pytest
import torch

import rla
from rla.alignment import compat

from align_spec import (  # noqa: F401
    SPEC, single_thread, spec_cos_sin, spec_forward, spec_inv_freq, tiny_config, tiny_model, tokens,
)


def _cast_model(family="qwen2", **overrides):
    """fp32 model then ``model.to(bfloat16)``: the cast rounds the inv_freq buffer too."""
    model = tiny_model(family, dtype=torch.float32, **overrides).to(torch.bfloat16)
    assert model.model.rotary_emb.inv_freq.dtype == torch.bfloat16
    return model


def test_bf16_inv_freq_is_recomputed_exact_to_32k_and_reported():
    model = _cast_model(rope_theta=1e6, max_position_embeddings=32768)
    rotary = model.model.rotary_emb
    rounded = rotary.inv_freq
    positions = torch.arange(32768)[None]
    x = torch.zeros(1, dtype=torch.bfloat16)
    exact_cos, exact_sin = spec_cos_sin(spec_inv_freq(model.config), positions)

    report = rla.align(model, "vllm")
    cos, sin = rotary(x, positions)
    assert cos.dtype == torch.float32 and sin.dtype == torch.float32
    half = exact_cos.shape[-1] // 2  # half tables: HF's table is cat(freqs, freqs)
    assert cos.shape == (1, 32768, half) and sin.shape == cos.shape
    assert torch.equal(cos, exact_cos[..., :half]) and torch.equal(sin, exact_sin[..., :half])

    (hazard,) = [h for h in report.hazards if h.name == "bf16 inv_freq"]
    expected = (rounded.double() - spec_inv_freq(model.config).double()).abs().max().item() * 32768
    assert f"{expected:.3g} rad at position 32768" in hazard.detail and expected > 0.1
    assert "bf16 inv_freq" in str(report)

    rla.unalign(model)
    assert rotary.inv_freq is rounded  # the original (rounded) buffer is back
    hf_cos, _ = rotary(x, positions)
    assert not torch.equal(hf_cos.float(), exact_cos.to(torch.bfloat16).float())  # the hazard is real


def test_cast_model_logits_equal_the_spec():
    model = _cast_model("qwen3")
    ids = tokens()
    with torch.no_grad():
        for profile in ("vllm", "sglang"):
            rla.align(model, profile)
            assert torch.equal(model(ids).logits, spec_forward(model, ids, SPEC[profile]))
    rla.unalign(model)


def test_casting_after_align_keeps_fp32_frequencies_and_says_so():
    """TRL (continuous batching with bf16) and verl cast the model after it was built: the aligned
    rotary keeps the fp32 frequencies the engine uses, and the report names the cast."""
    model = tiny_model("llama", dtype=torch.float32)
    reference = tiny_model("llama", dtype=torch.bfloat16)  # born bf16, with model's weights rounded:
    reference.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    # (not the same seed alone: torch releases draw bf16 random init differently)
    report = rla.align(model, "vllm")
    model.to(torch.bfloat16)
    assert model.model.rotary_emb.inv_freq.dtype == torch.bfloat16  # what the cast did
    with pytest.warns(UserWarning, match="cast to bfloat16 after rla.align"):
        got = model(tokens()).logits
    rla.align(reference, "vllm")
    assert torch.equal(got, reference(tokens()).logits)
    assert [h.name for h in report.hazards] == ["cast after align"]
    model(tokens())  # reported once
    assert len(report.hazards) == 1
    rla.unalign(model)
    # unalign puts back the buffers the module had when it was aligned (fp32, as from_pretrained keeps it)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32


def test_cos_sin_stay_fp32_and_exact_under_autocast():
    model = tiny_model("qwen2", dtype=torch.float32)
    rla.align(model, "sglang")
    positions = torch.arange(4096)[None]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cos, sin = model.model.rotary_emb(torch.zeros(1), positions)
    exact = spec_cos_sin(spec_inv_freq(model.config), positions)
    half = exact[0].shape[-1] // 2
    assert torch.equal(cos, exact[0][..., :half]) and torch.equal(sin, exact[1][..., :half])
    rla.unalign(model)


LLAMA_ROPE = {
    "llama3": dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=16),
    "linear": dict(rope_type="linear", rope_theta=10000.0, factor=2.0),
    "dynamic": dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0),
}


@pytest.mark.parametrize("rope", list(LLAMA_ROPE))
@pytest.mark.parametrize("cast", [False, True], ids=["bf16", "cast"])
def test_llama_scaled_rope_types(rope, cast):
    # max_position_embeddings=16 < sequence 24: dynamic NTK grows its frequencies in the forward
    cfg = tiny_config("llama", max_position_embeddings=16, rope_parameters=dict(LLAMA_ROPE[rope]))
    if cast:
        model = tiny_model("llama", dtype=torch.float32, config=cfg).to(torch.bfloat16)
    else:
        model = tiny_model("llama", config=cfg)
    long_ids, short_ids = tokens(seq=24), tokens(seq=8, seed=3)
    with torch.no_grad():
        plain_long = None if cast else model(long_ids).logits
        report = rla.align(model, "vllm")
        assert [h.name for h in report.hazards if h.name == "bf16 inv_freq"] == (["bf16 inv_freq"] if cast else [])
        for ids in (long_ids, short_ids, long_ids):  # dynamic: grow, reset, grow again
            assert torch.equal(model(ids).logits, spec_forward(model, ids, SPEC["vllm"]))
        rla.align(model, "hf")
        if not cast:
            assert torch.equal(model(long_ids).logits, plain_long)
    rla.unalign(model)


#: Rope types with an attention factor (cos/sin scaled by it): YaRN, and longrope, whose short and
#: long factors switch at original_max_position_embeddings (16 here, sequences of 8 and 24).
SCALED_ROPE = {
    "yarn": dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16),
    "longrope": dict(rope_type="longrope", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16,
                     short_factor=[1.0 + 0.1 * i for i in range(8)], long_factor=[1.0 + 0.5 * i for i in range(8)]),
}


@pytest.mark.parametrize("rope", list(SCALED_ROPE))
@pytest.mark.parametrize("cast", [False, True], ids=["bf16", "cast"])
def test_rope_types_with_an_attention_factor(rope, cast):
    cfg = tiny_config("llama", max_position_embeddings=64, rope_parameters=dict(SCALED_ROPE[rope]))
    model = tiny_model("llama", dtype=torch.float32 if cast else torch.bfloat16, config=cfg)
    if cast:
        model = model.to(torch.bfloat16)
    scaling = model.model.rotary_emb.attention_scaling
    assert scaling > 1.1  # the factor is far from 1: dropping it moves every cos/sin entry
    long_ids, short_ids = tokens(seq=24), tokens(seq=8, seed=3)
    with torch.no_grad():
        plain = None if cast else model(long_ids).logits
        rla.align(model, "vllm")
        assert model.model.rotary_emb.attention_scaling == scaling
        for ids in (long_ids, short_ids, long_ids):  # longrope: long factors, short, long again
            assert torch.equal(model(ids).logits, spec_forward(model, ids, SPEC["vllm"]))
        rla.align(model, "hf")
        if not cast:
            assert torch.equal(model(long_ids).logits, plain)
    rla.unalign(model)


def test_tf32_hazard_is_reported_where_hf_uses_a_matmul():
    model = tiny_model("qwen2")
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        report = rla.align(model, "vllm")
    finally:
        torch.set_float32_matmul_precision(before)
        rla.unalign(model)
    assert any(h.name == "TF32 RoPE angles" for h in report.hazards) == compat.HF_ROTARY_USES_MATMUL


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_default_rope_formula_is_the_models_own_init(family):
    """compat evaluates the default frequencies itself where the model's init cannot be told the
    device (5.24): on the CPU it must equal that init bit for bit."""
    from rla.alignment import compat

    rotary = tiny_model(family).model.rotary_emb
    own, _ = rotary.compute_default_rope_parameters(rotary.config)
    assert torch.equal(compat._default_rope_on(rotary.config, torch.device("cpu")), own.float())
