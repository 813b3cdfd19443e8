"""Tiny MoE models of the four router families, for the router, metrics and replay tests.

Top-3 of 8 experts, so the three ``combine`` orders differ (with top-2 they coincide); the
gate weights are scaled up so the routing weights are far from uniform and the choice depends on
the last bits of the logits. DeepSeek-V3: 2 groups of 4 experts, 1 group chosen, a random
correction bias, ``routed_scaling_factor`` 2.5 (its default).
"""

from __future__ import annotations

import torch
import transformers

FAMILIES = ("qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v3")

_COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)


def config(family: str, **overrides):
    kw = dict(_COMMON)
    if family in ("qwen2_moe", "qwen3_moe"):
        kw.update(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32)
    if family == "qwen2_moe":
        kw.update(shared_expert_intermediate_size=48, norm_topk_prob=False)
    if family == "qwen3_moe":
        kw.update(norm_topk_prob=True, head_dim=16)
    if family == "mixtral":
        kw.update(num_local_experts=8, num_experts_per_tok=3)
    if family == "deepseek_v3":
        kw.update(n_routed_experts=8, num_experts_per_tok=3, n_group=2, topk_group=1, moe_intermediate_size=32,
                  n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=32,
                  qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, num_key_value_heads=4)
    kw.update(overrides)
    return {
        "qwen2_moe": transformers.Qwen2MoeConfig,
        "qwen3_moe": transformers.Qwen3MoeConfig,
        "mixtral": transformers.MixtralConfig,
        "deepseek_v3": transformers.DeepseekV3Config,
    }[family](**kw)


def model(family: str, seed: int = 0, experts: str = "eager", dtype=torch.bfloat16, gate_scale: float = 0.5,
          **overrides):
    """A random tiny ``family`` model in ``dtype``; ``gate_scale`` sets how sharp its routers are
    (0.5: sharp, the module docstring; small: near-uniform probabilities, where two stacks
    disagree on the experts often); ``overrides``: config fields (e.g. ``mlp_only_layers``)."""
    torch.manual_seed(seed)
    m = transformers.AutoModelForCausalLM.from_config(config(family, **overrides), dtype=dtype, attn_implementation="eager",
                                                      experts_implementation=experts)
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * gate_scale)
        for name, b in m.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.05)
    return m.eval()


def blocks(m):
    """The MoE blocks of a model, in layer order."""
    return [layer.mlp for layer in m.model.layers if hasattr(layer.mlp, "gate") and hasattr(layer.mlp, "experts")]


def tokens(batch=2, seq=16, seed=0, vocab=128):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))
