"""``rla doctor`` on the zero-centred families: 1 + w formed in bf16, per-layer-type RoPE buffers
rounded by a cast, fp32 zero-centred weights; a clean tiny Gemma 3 has none of them. And GPT-OSS's
MXFP4 checkpoint, which an engine runs with kernels no row describes; a DeepSeek-V3 config that does not
name its router as vLLM reads it, or whose MLA the engines build as another function; a Qwen3.5 MoE config
the engines read as a router without renormalisation."""

from __future__ import annotations

import types

import torch

import rla
from gemma_spec import tiny_gemma3

NEW = {"1 + w in bf16", "low-precision inv_freq", "fp32 zero-centred norm weights"}


class OldGemmaRMSNorm(torch.nn.Module):
    """transformers' Gemma norm before PR 29402: the normalised value rounded, then * (1 + w) in bf16."""

    def forward(self, x):
        n = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return n.type_as(x) * (1 + self.weight)


def _names(model):
    return {h.name for h in rla.doctor(model)}


def test_clean_gemma_has_none_of_them():
    assert not _names(tiny_gemma3(layers=2)) & NEW


def test_one_plus_w_in_bf16_is_found_by_a_probe_and_aligning_fixes_it():
    model = tiny_gemma3(layers=2)
    norm = model.model.layers[1].pre_feedforward_layernorm
    norm.forward = types.MethodType(OldGemmaRMSNorm.forward, norm)  # remote code of that age, on one norm
    hazard = next(h for h in rla.doctor(model) if h.name == "1 + w in bf16")
    assert "1 zero-centred RMSNorms (e.g. model.layers.1.pre_feedforward_layernorm)" in hazard.detail
    rla.align(model, "vllm")
    assert "1 + w in bf16" not in _names(model)
    rla.unalign(model)
    assert "1 + w in bf16" in _names(model)


def test_cast_rounds_the_per_layer_type_rope_buffers():
    model = tiny_gemma3(layers=2, dtype=torch.float32).to(torch.bfloat16)
    hazard = next(h for h in rla.doctor(model) if h.name == "low-precision inv_freq")
    assert "per-layer-type RoPE buffers are torch.bfloat16" in hazard.detail
    rla.align(model, "vllm")  # the aligned rotary computes each layer type's frequencies in fp32
    assert "low-precision inv_freq" not in _names(model)
    rla.unalign(model)
    assert "low-precision inv_freq" in _names(model)


def test_fp32_master_weights_face_the_engines_bf16_copy():
    model = tiny_gemma3(layers=2, dtype=torch.float32)
    hazard = next(h for h in rla.doctor(model) if h.name == "fp32 zero-centred norm weights")
    assert "1 + RN(w)" in hazard.detail
    assert "fp32 norm weights" not in _names(model)  # the Llama-shaped text would be wrong here


def test_gpt_oss_mxfp4_checkpoint_is_named():
    from gpt_oss_spec import tiny_gpt_oss

    model = tiny_gpt_oss()
    assert "MXFP4 experts" not in _names(model)
    model.config.quantization_config = {"quant_method": "mxfp4"}
    try:
        hazard = next(h for h in rla.doctor(model) if h.name == "MXFP4 experts")
        assert "quantized MoE kernels" in hazard.detail
        assert not any(h.name == "MXFP4 experts" for h in rla.doctor(model, external_engine=False))
    finally:
        del model.config.quantization_config


def test_deepseek_v3_router_config_as_vllm_reads_it():
    import moe_models

    model = moe_models.model("deepseek_v3")  # a config made with transformers: neither key written
    hazard = next(h for h in rla.doctor(model) if h.name == "DeepSeek-V3 router config")
    assert hazard.severity == "error"
    assert "scoring_func absent (vLLM: 'softmax'), topk_method absent (vLLM: None)" in hazard.detail
    assert not any(h.name == "DeepSeek-V3 router config" for h in rla.doctor(model, external_engine=False))
    model.config.scoring_func, model.config.topk_method = "sigmoid", "noaux_tc"  # as the released config.json
    assert "DeepSeek-V3 router config" not in _names(model)
    model.config.scoring_func = "softmax"
    assert "scoring_func='softmax'" in next(h.detail for h in rla.doctor(model) if h.name == "DeepSeek-V3 router config")
    qwen = tiny_gemma3(layers=2)  # another family: never
    assert "DeepSeek-V3 router config" not in _names(qwen)


def test_qwen3_5_moe_config_without_renormalisation_is_named():
    import pytest

    if not hasattr(__import__("transformers"), "Qwen3_5MoeTextConfig"):
        pytest.skip("this transformers has no Qwen3.5 MoE")
    from qwen3_5_spec import tiny_qwen3_5_moe

    model = tiny_qwen3_5_moe()
    assert "Qwen3.5 MoE router config" not in _names(model)  # the key absent: every stack renormalises
    model.config.norm_topk_prob = False
    try:
        hazard = next(h for h in rla.doctor(model) if h.name == "Qwen3.5 MoE router config")
        assert hazard.severity == "error" and "renormalises the top-k routing weights" in hazard.detail
        assert not any(h.name == "Qwen3.5 MoE router config" for h in rla.doctor(model, external_engine=False))
        model.config.norm_topk_prob = True
        assert "Qwen3.5 MoE router config" not in _names(model)
    finally:
        del model.config.norm_topk_prob


def test_gemma4_scale_constants_are_named_and_the_engines_ones_clear_them():
    import pytest
    from packaging.version import Version

    from rla.alignment import compat

    if compat.TRANSFORMERS_VERSION < Version("5.24"):
        pytest.skip("Gemma 4 is read from transformers 5.24")
    from gemma4_spec import tiny_gemma4

    model = tiny_gemma4(layers=3, kv_shared=0)  # hidden 64: hidden**-0.5 and sqrt(hidden) are bf16 numbers
    hazard = next(h for h in rla.doctor(model) if h.name == "Gemma 4 scale constants")
    assert hazard.severity == "warning"
    assert "per_layer_input_scale 0.70710678 (engines: 0.70703125)" in hazard.detail
    assert "per_layer_model_projection_scale" not in hazard.detail and "embeddings" not in hazard.detail
    assert not any(h.name == "Gemma 4 scale constants" for h in rla.doctor(model, external_engine=False))
    assert not _names(model) & NEW  # a clean Gemma 4: its norms are not zero-centred, its RoPE buffers fp32
    model.model.per_layer_input_scale = float(torch.tensor(2 ** -0.5, dtype=torch.bfloat16))  # the fix
    assert "Gemma 4 scale constants" not in _names(model)
    moe = tiny_gemma4(layers=2, kv_shared=0, ple=False, moe=True, hidden_size=48)
    detail = next(h.detail for h in rla.doctor(moe) if h.name == "Gemma 4 scale constants")
    assert "sqrt(hidden) = 6.9282032 as a Python float" in detail and "MoE router" in detail
    assert "per-layer" not in detail
    cast = tiny_gemma4(layers=2, kv_shared=0, dtype=torch.float32).to(torch.bfloat16)
    assert "per-layer-type RoPE buffers are torch.bfloat16" in next(
        h.detail for h in rla.doctor(cast) if h.name == "low-precision inv_freq")
    assert "Gemma 4 scale constants" not in _names(tiny_gemma3(layers=2))


def test_deepseek_v3_attention_as_the_engines_build_it():
    """Three places where DeepSeek-V3's MLA is another function in the engines (vLLM's and SGLang's
    deepseek_v2.py) than in HF: each named, none on a config laid out as the released one."""
    from deepseek_v3_spec import RELEASED_YARN, tiny_deepseek_v3

    names = {"DeepSeek-V3 rope layout", "DeepSeek-V3 softmax scale", "DeepSeek-V3 latent norm eps"}
    model = tiny_deepseek_v3("yarn_released")
    assert not names & _names(model)  # the released rope parameters, rope_interleave, rms_norm_eps 1e-6
    model.config.rope_interleave = False
    hazard = next(h for h in rla.doctor(model) if h.name == "DeepSeek-V3 rope layout")
    assert "is_neox_style=False whatever the config says" in hazard.detail and hazard.severity == "error"
    assert not names & {h.name for h in rla.doctor(model, external_engine=False)}
    model.config.rope_interleave = True
    model.config.rope_parameters = {**RELEASED_YARN, "attention_factor": 1.0}
    hazard = next(h for h in rla.doctor(model) if h.name == "DeepSeek-V3 softmax scale")
    assert "attention_factor=1.0 (vLLM 0.33: 'deepseek_llama_scaling')" in hazard.detail
    assert "mscale(factor, mscale_all_dim)**2 = 1.874" in hazard.detail  # (0.1 ln 40 + 1)**2
    model.config.rope_parameters = {**RELEASED_YARN, "apply_yarn_scaling": False, "mscale_all_dim": 0}
    assert "DeepSeek-V3 softmax scale" not in _names(model)  # no mscale_all_dim: HF does not scale either
    model.config.rope_parameters = dict(RELEASED_YARN)
    model.config.rms_norm_eps = 1e-5
    hazard = next(h for h in rla.doctor(model) if h.name == "DeepSeek-V3 latent norm eps")
    assert "4 MLA latent norms (e.g. model.layers.0.self_attn.q_a_layernorm) use eps 1e-06" in hazard.detail
    assert "DeepSeek-V3 rope layout" not in _names(tiny_gemma3(layers=2))
