"""The test oracle for ``rla.align`` on DeepSeek-V3: the Llama-shaped decoder of tests/align_spec.py
with DeepSeek's multi-head latent attention (MLA) written out from HF 5.24's ``DeepseekV3Attention``:
q through ``q_a_proj`` -> ``q_a_layernorm`` -> ``q_b_proj`` (or ``q_proj``), the latent kv through
``kv_a_proj_with_mqa`` -> ``kv_a_layernorm`` on its first ``kv_lora_rank`` dims, RoPE on the last
``qk_rope_head_dim`` dims of q and on the one shared k, interleaved pairs or halves as
``config.rope_interleave`` says, YaRN's frequencies and attention factor from the config. The MoE
block is HF's router (not a region here) with the routed and shared experts.

The interleaved rotation is written per pair, as DeepSeek defines it and HF's
``apply_rotary_pos_emb_interleave`` computes it: pair j = (x[2j], x[2j+1]) rotated by frequency j,
the output in HF's layout, the rotated evens then the rotated odds. Nothing here calls ``rla.ops``
or ``rla.align``; under the ``hf`` points it equals the unaligned model bit for bit
(tests/alignment/test_align_deepseek_v3.py).

A helper module, not a test file (``from deepseek_v3_spec import ...``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from align_spec import BF16, _dense_mlp, _experts, _linear, at_head_size, head_size_of, moe_sum_fp32, rn, spec_cos_sin, spec_norm, \
    spec_rope, spec_rope_params

__all__ = ["CONFIGS", "tiny_deepseek_v3", "spec_forward", "spec_rope_interleaved"]

#: The released DeepSeek-V3 config's rope parameters (its config.json's ``rope_scaling``).
RELEASED_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                 "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}

#: name -> config overrides: both rotary layouts, with and without a q LoRA, default RoPE and YaRN
#: (the released parameters at the released rope head 64; and an mscale that differs from
#: mscale_all_dim, whose attention factor scales the tables).
CONFIGS = {
    "interleaved": dict(rope_interleave=True),
    "halves_no_q_lora": dict(rope_interleave=False, q_lora_rank=None),
    "yarn_released": dict(rope_interleave=True, qk_rope_head_dim=64, rope_parameters=dict(RELEASED_YARN),
                          max_position_embeddings=163840),
    "yarn_attention_factor_halves": dict(rope_interleave=False, max_position_embeddings=163840,
                                         rope_parameters={**RELEASED_YARN, "mscale_all_dim": 0.707}),
}


def tiny_deepseek_v3(name: str = "interleaved", seed: int = 0, dtype=BF16, **overrides):
    """Two layers: a dense MLP (first_k_dense_replace=1), then 8 routed experts in 2 groups (top 3)
    and a shared expert; MLA with q LoRA 32, KV LoRA 32, nope 16 + rope 16 (or 64), v 16; random
    norm weights around 1 and a random router with a correction bias. ``overrides`` go to the config."""
    kw = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=3, n_group=2, topk_group=1,
              moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=32,
              qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=256,
              tie_word_embeddings=False)
    kw.update(CONFIGS[name], **overrides)
    cfg = transformers.DeepseekV3Config(**kw, attn_implementation="eager", experts_implementation="eager")
    torch.manual_seed(seed)
    model = transformers.DeepseekV3ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif n.endswith("gate.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=g))
    for p in model.parameters():
        p.data = p.data.to(dtype)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    return model


def spec_rope_interleaved(x, cos, sin, pts, lp):
    """DeepSeek's interleaved rotary of ``x`` [B, H, S, D]: pair j = (x[..., 2j], x[..., 2j+1])
    rotated by frequency j, returned as cat(rotated evens, rotated odds) (HF's layout). ``cos``/``sin``
    [B, S, D] are HF's cat(freqs, freqs) tables; pair j reads entry j."""
    half = cos.shape[-1] // 2
    c, s = cos[:, None, :, :half], sin[:, None, :, :half]
    if pts["rope_cos_sin"] == "round":
        c, s = rn(c, lp), rn(s, lp)
    even, odd = x[..., 0::2].float(), x[..., 1::2].float()
    if pts["rope_apply"] == "per_op":
        first, second = rn(even * c, lp) - rn(odd * s, lp), rn(odd * c, lp) + rn(even * s, lp)
    else:
        first, second = even * c - odd * s, odd * c + even * s
    return torch.cat([first, second], dim=-1).to(lp)


def _attention(attn, h, cos, sin, mask, pts, lp, interleave, cache=None, idx=0):
    b, s, _ = h.shape
    nope, rope, vdim, rank = attn.qk_nope_head_dim, attn.qk_rope_head_dim, attn.v_head_dim, attn.kv_lora_rank
    if attn.q_lora_rank is None:
        q = _linear(attn.q_proj, h)
    else:
        qa = attn.q_a_layernorm
        q = _linear(attn.q_b_proj, spec_norm(_linear(attn.q_a_proj, h).float(), qa.weight, qa.variance_epsilon, pts, lp))
    q = q.view(b, s, -1, nope + rope).transpose(1, 2)
    q_pass, q_rot = q[..., :nope], q[..., nope:]
    latent = _linear(attn.kv_a_proj_with_mqa, h)
    kva = attn.kv_a_layernorm
    kv_nope = spec_norm(latent[..., :rank].float(), kva.weight, kva.variance_epsilon, pts, lp)
    k_rot = latent[..., rank:].reshape(b, 1, s, rope)
    rotate = spec_rope_interleaved if interleave else spec_rope
    q_rot, k_rot = rotate(q_rot, cos, sin, pts, lp), rotate(k_rot, cos, sin, pts, lp)
    kv_nope = kv_nope.reshape(b, 1, s, rank)
    if cache is not None:  # HF's cache holds the latents: the normed kv_nope and the rotated k_rot
        if idx in cache:
            kv_nope, k_rot = torch.cat([cache[idx][0], kv_nope], dim=2), torch.cat([cache[idx][1], k_rot], dim=2)
        cache[idx] = (kv_nope, k_rot)
    kv_nope = kv_nope[:, 0]
    kv = _linear(attn.kv_b_proj, kv_nope).view(b, kv_nope.shape[1], -1, nope + vdim).transpose(1, 2)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    query = torch.cat([q_pass, q_rot], dim=-1)
    key = torch.cat([k_nope, k_rot.expand(-1, k_nope.shape[1], -1, -1)], dim=-1)
    w = torch.matmul(query, key.transpose(2, 3)) * attn.scaling + mask
    w = F.softmax(w, dim=-1, dtype=torch.float32).to(lp)
    o = torch.matmul(w, v).transpose(1, 2).contiguous().reshape(b, s, -1)
    return _linear(attn.o_proj, o)


def _mlp(mlp, h, pts):
    if hasattr(mlp, "gate_proj"):
        return _dense_mlp(mlp, h, pts)
    b, s, hid = h.shape
    h2 = h.reshape(-1, hid)
    _, weights, idx = mlp.gate(h2)  # HF's router (the router region's, not aligned here)
    out = _experts(mlp.experts, h2, idx, weights, pts).view(b, s, hid)
    shared = _dense_mlp(mlp.shared_experts, h, pts)
    return out.float() + shared.float() if moe_sum_fp32(pts) else out + shared  # the add's fp32 read, or RN


def _rope_params(cfg, where: torch.device):
    """fp32 frequencies of the rope half and the attention factor, evaluated on ``where``: the default
    formula written out, a scaled type's from transformers' own definition (align_spec.spec_rope_params,
    with the device)."""
    if where.type == "cpu":
        return spec_rope_params(cfg)
    rp = cfg.rope_parameters
    if rp["rope_type"] == "default":
        exponent = torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).to(device=where, dtype=torch.float) / cfg.head_dim
        return 1.0 / (rp["rope_theta"] ** exponent), 1.0
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rp["rope_type"]](cfg, device=where)
    return inv_freq.float(), float(scale)


def spec_forward(model, input_ids, pts, cache: dict | None = None) -> torch.Tensor:
    """Logits of the DeepSeek-V3 ``model`` under the rounding points ``pts`` (docs/rounding.md);
    ``cache`` (a dict, empty at the prefill): each layer's latents, the tokens continuing after them."""
    body, cfg = model.model, model.config
    pts = at_head_size(pts, head_size_of(cfg))  # config.head_dim is the rope head (align_spec.Row)
    lp = body.embed_tokens.weight.dtype
    eps = cfg.rms_norm_eps
    b, s = input_ids.shape
    device = input_ids.device
    where = device if pts["rope_inv_freq"] == "device" else torch.device("cpu")
    inv_freq, scale = _rope_params(cfg, where)  # YaRN: HF's own definition, and its attention factor
    past = 0 if not cache else cache[0][0].shape[2]
    cos, sin = spec_cos_sin(inv_freq.to(device), torch.arange(past, past + s, device=device)[None].expand(b, s))
    if scale != 1.0:  # the fp32 tables scaled, then rounded where the points say
        cos, sin = cos * scale, sin * scale
    future = torch.arange(past + s, device=device)[None, :] > torch.arange(past, past + s, device=device)[:, None]
    mask = torch.zeros(s, past + s, dtype=lp, device=device).masked_fill(future, torch.finfo(lp).min)[None, None]
    fp32_sum = pts["norm_residual"] == "fp32_sum"
    carry = pts["residual_stream"] == "fp32_carry"
    residual = F.embedding(input_ids, body.embed_tokens.weight)
    read = residual.float()
    for i, layer in enumerate(body.layers):
        h = spec_norm(read, layer.input_layernorm.weight, eps, pts, lp, after_add=i > 0)
        x = _attention(layer.self_attn, h, cos, sin, mask, pts, lp, cfg.rope_interleave, cache, i)
        total = x.float() + residual.float()
        residual = rn(total, lp).to(lp)
        read = total if fp32_sum else residual.float()
        h = spec_norm(read, layer.post_attention_layernorm.weight, eps, pts, lp, after_add=True)
        x = _mlp(layer.mlp, h, pts)
        total = x.float() + (total if carry else residual.float())
        residual = total.to(lp)
        read = total if fp32_sum else residual.float()
    h = spec_norm(read, body.norm.weight, eps, pts, lp, after_add=True)
    return F.linear(h, model.lm_head.weight)
