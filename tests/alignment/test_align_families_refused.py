"""Families rla.align does not align yet are refused before anything changes, with a message that
names them and where their needs are written down (docs/families.md): a new user is never left
believing an unaligned region aligned."""

import pytest
import torch
import transformers
from packaging.version import Version

import rla

_TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16)


def _deepseek_v3():
    return transformers.DeepseekV3Config(**_TINY, n_routed_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                                         first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                                         qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1)


def _qwen3_next():
    return transformers.Qwen3NextConfig(**_TINY, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                                        shared_expert_intermediate_size=16, layer_types=["full_attention"])


@pytest.mark.skipif(not hasattr(transformers, "Qwen3NextConfig"), reason="this transformers has no Qwen3-Next")
@pytest.mark.parametrize("make, refusal", [
    (_qwen3_next, r"model_type='qwen3_next'.*docs/families.md"),
], ids=["qwen3_next"])
def test_not_yet_aligned_families_are_refused_by_name(make, refusal):
    """Qwen3-Next is not aligned at all (DeepSeek-V3 and Qwen3.5 MoE, refused here until they were aligned,
    are tests/alignment/test_align_deepseek_v3.py's and test_align_qwen3_5_moe.py's now)."""
    cfg = make()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    before = {id(m): dict(m.__dict__) for m in model.modules()}
    with pytest.raises(NotImplementedError, match=refusal):
        rla.align(model, "vllm")
    assert all(m.__dict__.keys() == before[id(m)].keys() for m in model.modules())


def test_a_region_a_family_does_not_support_is_refused_naming_the_ones_it_does():
    """GPT-OSS's router is left as is: asking for it is refused before anything changes, naming the
    regions GPT-OSS supports."""
    from gpt_oss_spec import tiny_gpt_oss
    from rla.alignment import compat

    if compat.TRANSFORMERS_VERSION < Version("5.24"):
        pytest.skip("GPT-OSS is refused by version below 5.24 (the test below)")
    model = tiny_gpt_oss()
    before = {id(m): dict(m.__dict__) for m in model.modules()}
    with pytest.raises(NotImplementedError, match=r"gpt_oss supports the regions \('rope', 'swiglu', 'rmsnorm'\), "
                       r"not \('router',\).*docs/families.md.*pass regions=\('rope', 'swiglu', 'rmsnorm'\)"):
        rla.align(model, "vllm", regions=("rope", "swiglu", "rmsnorm", "router"))
    assert all(m.__dict__.keys() == before[id(m)].keys() for m in model.modules())


@pytest.mark.parametrize("family", ["gpt_oss", "deepseek_v3", "qwen3_5_moe_text"])
def test_families_read_from_a_newer_layout_are_refused_on_older_transformers(monkeypatch, family):
    """GPT-OSS, DeepSeek-V3 (5.5.3's experts are a DeepseekV3NaiveMoe) and Qwen3.5 MoE were read from
    5.24's layout."""
    from gpt_oss_spec import tiny_gpt_oss
    from rla.alignment import compat

    if family == "qwen3_5_moe_text" and not hasattr(transformers, "Qwen3_5MoeTextConfig"):
        pytest.skip("this transformers has no Qwen3.5 MoE")
    if family == "gpt_oss":
        model = tiny_gpt_oss()
    elif family == "deepseek_v3":
        model = transformers.AutoModelForCausalLM.from_config(_deepseek_v3())
    else:
        from qwen3_5_spec import tiny_qwen3_5_moe
        model = tiny_qwen3_5_moe()
    monkeypatch.setattr(compat, "TRANSFORMERS_VERSION", Version("5.5.3"))
    with pytest.raises(NotImplementedError, match=rf"{family} is aligned on transformers >= 5.24.*5.5.3 lays it out"):
        rla.align(model, "vllm")
    assert model.model.__dict__.get("_rla_alignment") is None and not any(
        "_rla_patch" in m.__dict__ for m in model.modules())


def test_the_router_region_is_refused_on_older_transformers(monkeypatch):
    """Below the version the router region was checked on, ``regions=(..., "router")`` is refused
    naming both versions, before anything changes (the three regions stay available)."""
    from packaging.version import Version

    import moe_models
    from rla.alignment import compat
    from rla.alignment.core import ROUTER_MIN_TRANSFORMERS

    monkeypatch.setattr(compat, "TRANSFORMERS_VERSION", Version("5.5.3"))
    model = moe_models.model("qwen2_moe")
    before = {id(m): dict(m.__dict__) for m in model.modules()}
    with pytest.raises(NotImplementedError, match=rf"router region is checked on transformers >= "
                       rf"{ROUTER_MIN_TRANSFORMERS}; transformers 5.5.3"):
        rla.align(model, "vllm", regions=("rope", "swiglu", "rmsnorm", "router"))
    assert all(m.__dict__.keys() == before[id(m)].keys() for m in model.modules())


@pytest.mark.skipif(not hasattr(transformers, "Gemma4Config"), reason="this transformers has no Gemma 4")
def test_gemma4_multimodal_wrapper_is_refused_by_name():
    """Gemma 4's text model is aligned (``gemma4_text``); the multimodal ``Gemma4ForConditionalGeneration``
    (``model_type='gemma4'``) holds the same text model but is refused by name: nothing tests its
    vision and audio towers' way into the decoder."""
    text = dict(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, global_head_dim=16, hidden_size_per_layer_input=0,
                layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    model = transformers.Gemma4ForConditionalGeneration(
        transformers.Gemma4Config(text_config=text, vision_config=None, audio_config=None))
    before = {id(m): dict(m.__dict__) for m in model.modules()}
    with pytest.raises(NotImplementedError, match=r"Gemma4ForConditionalGeneration \(config.model_type='gemma4'\).*"
                       r"docs/families.md"):
        rla.align(model, "vllm")
    assert all(m.__dict__.keys() == before[id(m)].keys() for m in model.modules())


@pytest.mark.skipif(not hasattr(transformers, "Gemma4TextConfig"), reason="this transformers has no Gemma 4")
def test_gemma4_is_refused_below_the_transformers_it_was_read_from(monkeypatch):
    from packaging.version import Version

    from gemma4_spec import tiny_gemma4
    from rla.alignment import compat

    model = tiny_gemma4(layers=2, kv_shared=0)
    monkeypatch.setattr(compat, "TRANSFORMERS_VERSION", Version("5.17.0"))
    with pytest.raises(NotImplementedError, match=r"gemma4_text is aligned on transformers >= 5.24.*5.17.0 lays it out"):
        rla.align(model, "vllm")
    assert not any("_rla_patch" in m.__dict__ for m in model.modules())
