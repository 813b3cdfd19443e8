"""The live driver's Gemma 3 checkpoint (``lab/bench/vllm_live_h200.py checkpoint``), checked on CPU
without building its weights: a realistic width, both attention kinds, a family rla aligns and
the live path accepts; and the live path's refusal of a final logit cap it would not score."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from lab.bench import vllm_live_h200 as live
from rla.alignment.families import get_family
from rla.commands._live import check_model


def test_the_gemma3_checkpoint_is_realistic_and_aligned():
    cfg = live.model_configs(4)["gemma3-h2560"]
    assert cfg.hidden_size >= 1536 and cfg.num_hidden_layers == 4 and cfg.head_dim == 256
    assert cfg.layer_types == ["sliding_attention"] * 3 + ["full_attention"] and cfg.sliding_window == 1024
    assert cfg.query_pre_attn_scalar == 256 and cfg.final_logit_softcapping is None
    assert cfg.max_position_embeddings >= 33000 + 64  # the driver's long prompt
    assert get_family(cfg.model_type, "gemma3-h2560").layout == "gemma3"
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    assert type(model).__name__ == "Gemma3ForCausalLM" and cfg.architectures in (None, ["Gemma3ForCausalLM"])
    attn = model.model.layers[0].self_attn
    assert attn.sliding_window == 1024 and attn.scaling == 256 ** -0.5
    assert model.model.layers[3].self_attn.sliding_window is None
    with pytest.raises(ValueError, match="needs >= 2 layers"):
        live.gemma3_config(1)
    with pytest.raises(ValueError, match="no checkpoint 'qwen3_5-h2048'; the families are"):
        live.build_checkpoint("qwen3_5-h2048", 4, Path("/nonexistent"))


def test_a_final_logit_cap_is_refused_before_the_engine(tmp_path):
    cfg = live.gemma3_config(2)
    cfg.final_logit_softcapping = 30.0
    cfg.save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="final_logit_softcapping=30.0: .* not scored live"):
        check_model(str(tmp_path), 64)
    cfg.final_logit_softcapping = None
    cfg.save_pretrained(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors weights"):  # past the cap: the next check
        check_model(str(tmp_path), 64)


def test_the_qwen3_5_checkpoint_is_saved_as_released_and_scores_its_text_model():
    """``qwen35-h2048``: the multimodal class vLLM 0.26 registers, a realistic width, three linear-attention
    layers and one full-attention layer; its text model is a family rla aligns."""
    cfg = live.model_configs(4)["qwen35-h2048"]
    text = cfg.get_text_config()
    assert cfg.model_type == "qwen3_5" and text.model_type == "qwen3_5_text"
    assert text.hidden_size >= 1536 and text.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert text.max_position_embeddings >= 4096 + 64 and get_family(text.model_type, "qwen35").layout == "qwen3_5"
    assert live.live_family_configs.MODEL_CLASS["qwen35-h2048"] == "Qwen3_5ForConditionalGeneration"
    with torch.device("meta"):
        model = getattr(transformers, "Qwen3_5ForConditionalGeneration")._from_config(cfg)
    assert sum(p.numel() for p in model.model.visual.parameters()) < 0.02 * sum(p.numel() for p in model.parameters())
