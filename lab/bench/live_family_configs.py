"""Random-init checkpoints of issue #33's MoE families at realistic widths, for the live vLLM 0.26 engine.

Each is a real family's layer at a width its released models use (hidden >= 2048), four layers, a
32000-token vocabulary (the other live checkpoints' size; the vocabulary does not change where the
regions round), and fewer experts than the released models (the experts' count changes the GEMMs'
cost, not the points):

- ``gptoss-h2880``: GPT-OSS 20B's layer: hidden 2880, 64 query heads of 64 and 8 KV heads, attention
  sinks, a 128-token sliding window on every other layer, YaRN (theta 150k, x32 from 4096), clamped
  SwiGLU experts 2880 wide (8 experts, top 4; the 20B has 32).
- ``glm4moe-h2048``: GLM-4.5's layer shape at 2048: 16 query heads of 128 and 4 KV heads with bias,
  q/k norms, partial RoPE (half of each head), a dense first layer (5632) and MoE layers of 16
  experts of 1024 (top 4) with a shared expert, the sigmoid router with its correction bias.
- ``deepseekv3-h2048``: DeepSeek-V3's layer at 2048: MLA (q LoRA 768, KV LoRA 512, nope 128 + rope
  64, v 128), a dense first layer, then 16 experts of 1024 (top 4, 4 groups, top 2 groups) with a
  shared expert and the sigmoid grouped router (routed scaling 2.5). Default RoPE: rla does not
  align MLA's attention or its RoPE (docs/families.md), so its scaling would not be what is measured.
  The config names ``scoring_func='sigmoid'`` and ``topk_method='noaux_tc'``, as DeepSeek-V3's released
  ``config.json`` does: HF's ``DeepseekV3TopkRouter`` always routes that way and its config does not
  write them, while vLLM's ``DeepseekV2MoE`` (``models/deepseek_v2.py``) reads both, defaulting to a
  softmax router without the correction bias. Without them the engine refused the checkpoint on the
  H200 (``KeyError: 'layers.1.mlp.gate.e_score_correction_bias'``, 2026-12-02); with only the bias it
  would have routed by softmax, a plumbing difference that reads as numerics.

- ``qwen35-h2048``: Qwen3.5 dense at 2048 as the released checkpoints are saved, the multimodal
  ``Qwen3_5ForConditionalGeneration`` (vLLM 0.26 registers only that class: its text class
  ``Qwen3_5ForCausalLM`` is neither registered nor marked hybrid), with a one-block vision tower (its
  weights are in the checkpoint; the engine runs with ``language_model_only`` and does not build it):
  16 query heads of 256 with the output gate, 2 KV heads, q/k norms, partial mRoPE (a quarter of each
  head), three Gated DeltaNet layers then one full-attention layer. The training side loads its text
  model through ``AutoModelForCausalLM`` (``rla.hf.causal_lm_config``), as a text RL trainer does.
- ``qwen35moe-h2048``: Qwen3.5 MoE at 2048 (the released 35B-A3B's width), saved as its checkpoints are, the multimodal
  ``Qwen3_5MoeForConditionalGeneration`` with a one-block vision tower: ``qwen35-h2048``'s attention and linear
  attention, every MLP a sparse block of 16 experts of 512 (top 4; the release has 256, top 8) and a shared expert of
  512 with its sigmoid gate.
- ``gemma4-h2560``: Gemma 4 E4B's text layer (``Gemma4ForCausalLM``, which vLLM 0.26 registers): hidden 2560,
  8 query heads and 2 KV heads of 256, sliding layers (theta 10k, a 512-token window) and a full layer
  (``proportional`` RoPE, a quarter of the angles, theta 1M), GeGLU 10240 wide, per-layer inputs of 256, three
  sliding layers then one full. **The full layer's heads are 256, not E4B's 512** (``per_layer_config={}``):
  from transformers 5.17 on, ``Gemma4TextConfig`` keeps a ``global_head_dim`` as a per-layer ``head_dim``
  (``per_layer_config``) and reading ``head_dim`` from the whole config raises, which vLLM 0.26's
  ``Gemma4ModelArchConfigConvertor.get_head_size`` (``transformers_utils/model_arch_config_convertor.py``) does:
  vLLM 0.26 refused the E4B-shaped checkpoint under 5.24 on the H200 (2026-12-03,
  ``AmbiguousGlobalPerLayerAttributeError``), and rla reads Gemma 4 from 5.24. One head size keeps every rounding
  point of the family (the two RoPE tables, the per-layer inputs, the sandwich norms, the layer scalar). No K/V sharing, keys not reused as values, no MoE block,
  no final logit softcap (the live path scores uncapped logprobs: ``rla.commands._live.check_model``). The layer
  scalars are random (``vllm_live_h200.build_checkpoint``): HF initialises them to 1, where the multiply is exact.
"""

from __future__ import annotations

import transformers

__all__ = ["CONFIGS", "ATTENTION"]


def gpt_oss(layers: int):
    return transformers.GptOssConfig(
        vocab_size=32000, hidden_size=2880, intermediate_size=2880, num_hidden_layers=layers,
        num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=8, num_experts_per_tok=4,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        sliding_window=128, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False},
        tie_word_embeddings=False)


def glm4_moe(layers: int):
    return transformers.Glm4MoeConfig(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1024,
        num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=4, head_dim=128, attention_bias=True,
        use_qk_norm=True, n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1, first_k_dense_replace=1,
        norm_topk_prob=True, routed_scaling_factor=1.0, n_group=1, topk_group=1, max_position_embeddings=40960,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
        tie_word_embeddings=False)


def deepseek_v3(layers: int):
    return transformers.DeepseekV3Config(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1024,
        num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=16, q_lora_rank=768,
        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=16,
        num_experts_per_tok=4, n_group=4, topk_group=2, n_shared_experts=1, first_k_dense_replace=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
        scoring_func="sigmoid", topk_method="noaux_tc")


def qwen3_5(layers: int):
    text = dict(vocab_size=32000, hidden_size=2048, intermediate_size=6144, num_hidden_layers=layers,
                num_attention_heads=16, num_key_value_heads=2, head_dim=256, max_position_embeddings=40960,
                rms_norm_eps=1e-6, layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                                                for i in range(layers)],
                linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
                linear_conv_kernel_dim=4, tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                 "mrope_section": [11, 11, 10], "mrope_interleaved": True})
    vision = dict(depth=1, hidden_size=256, intermediate_size=512, num_heads=4, out_hidden_size=2048)
    return transformers.Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)


def qwen3_5_moe(layers: int):
    dense = qwen3_5(layers)
    text = {k: v for k, v in dense.text_config.to_dict().items()
            if k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "head_dim", "max_position_embeddings", "rms_norm_eps", "layer_types", "linear_num_key_heads",
                     "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
                     "tie_word_embeddings", "rope_parameters")}
    text.update(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=512, shared_expert_intermediate_size=512)
    vision = dict(depth=1, hidden_size=256, intermediate_size=512, num_heads=4, out_hidden_size=2048)
    return transformers.Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)


def gemma4(layers: int, **overrides):
    """``overrides``: config keywords replacing these (a CPU smoke run's smaller widths)."""
    if layers < 2:
        raise ValueError(f"gemma4-h2560 needs >= 2 layers (sliding and full), got {layers}")
    kw = dict(
        vocab_size=32000, hidden_size=2560, intermediate_size=10240, num_hidden_layers=layers,
        num_attention_heads=8, num_key_value_heads=2, head_dim=256, sliding_window=512,
        layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"], hidden_size_per_layer_input=256,
        per_layer_config={},  # one head size: vLLM 0.26 cannot read a per-layer head_dim (docstring)
        vocab_size_per_layer_input=32000, num_kv_shared_layers=0, attention_k_eq_v=False, enable_moe_block=False,
        final_logit_softcapping=None, max_position_embeddings=131072, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1e6}})
    return transformers.Gemma4TextConfig(**{**kw, **overrides})


#: checkpoint name -> config builder (layers -> config)
CONFIGS = {"gptoss-h2880": gpt_oss, "glm4moe-h2048": glm4_moe, "deepseekv3-h2048": deepseek_v3,
           "qwen35-h2048": qwen3_5, "qwen35moe-h2048": qwen3_5_moe, "gemma4-h2560": gemma4}

#: checkpoints saved as another class than AutoModelForCausalLM builds (the released layout)
MODEL_CLASS = {"qwen35-h2048": "Qwen3_5ForConditionalGeneration",
               "qwen35moe-h2048": "Qwen3_5MoeForConditionalGeneration"}

#: HF attention the checkpoint is built with where SDPA is not offered (GPT-OSS: eager or flash only)
ATTENTION = {"gptoss-h2880": "eager"}
