"""``rla doctor`` names an LM head whose logits dtype is not the engine row's ``lm_head`` (rla.diagnosis.lm_head).

The models are tiny Qwen3s built from a config; the fp32 head is what TRL 1.16's
``cast_lm_head_to_fp32`` leaves (an fp32 weight, a forward that casts the hidden state to fp32;
tests/integrations/test_integration_trl_lm_head.py runs TRL's own trainer for it).
"""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

import rla
from rla.diagnosis.doctor import doctor
from rla.diagnosis.lm_head import head_computes

BF16 = torch.bfloat16
FP32_ROW = rla.profiles.get("sglang").replace(name="sglang-0.5.23+fp32-lm-head", lm_head="fp32")


def _model(dtype=BF16):
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, tie_word_embeddings=False)
    return Qwen3ForCausalLM(cfg).to(dtype).eval()


def _fp32_head(model):
    head = model.lm_head.float()
    head.forward = lambda h: torch.nn.functional.linear(h.to(torch.float32), head.weight.to(torch.float32))
    return model


def _head_hazards(model, profile=None):
    return [h for h in doctor(model, profile=profile) if h.name == "LM head dtype"]


def test_bf16_head_against_an_fp32_engine_head():
    m = _model()
    assert head_computes(m) == "lp"
    assert _head_hazards(m) == [] and _head_hazards(m, "sglang") == []
    (hazard,) = _head_hazards(m, FP32_ROW)
    assert hazard.severity == "error" and "sglang-0.5.23+fp32-lm-head" in hazard.detail
    rla.align(m, FP32_ROW)  # the aligned head computes the row's fp32 logits
    assert head_computes(m) == "fp32" and _head_hazards(m, FP32_ROW) == []
    rla.unalign(m)
    assert len(_head_hazards(m, FP32_ROW)) == 1


def test_fp32_head_against_the_engines_bf16_head():
    m = _fp32_head(_model())
    assert head_computes(m) == "fp32"
    (warning,) = _head_hazards(m)  # no row named: every built-in row's head is bf16
    assert warning.severity == "warning" and "--enable-fp32-lm-head" in warning.fix
    (error,) = _head_hazards(m, "vllm")
    assert error.severity == "error" and "cast_lm_head_to_fp32" in error.detail
    assert _head_hazards(m, FP32_ROW) == []
    rla.align(m, "vllm")  # the aligned head computes the engine's bf16 logits
    assert head_computes(m) == "lp" and _head_hazards(m, "vllm") == []
    rla.unalign(m)
    assert head_computes(m) == "fp32"


def test_no_claim_for_a_plain_fp32_model():
    """fp32 weights without a cast: the head is lp under bf16 autocast, fp32 without; doctor says nothing."""
    m = _model(torch.float32)
    assert head_computes(m) is None
    assert _head_hazards(m, "vllm") == [] and _head_hazards(m, FP32_ROW) == []


def test_no_engine_skips_the_check():
    m = _fp32_head(_model())
    assert [h for h in doctor(m, profile="vllm", external_engine=False) if h.name == "LM head dtype"] == []


def test_cli_doctor_lm_head(capsys):
    from rla.cli import main

    assert main(["doctor", "--profile", "sglang"]) == 0
    assert main(["doctor", "--profile", "sglang", "--lm-head", "fp32"]) == 1
    assert "LM head dtype" in capsys.readouterr().out
