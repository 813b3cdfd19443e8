"""The test oracle for ``rla.align`` on GLM-4 MoE: the Llama-shaped decoder of tests/align_spec.py
with GLM's partial rotary (the first half of each head rotated, the rest passed through), its
optional q/k norms and its MoE (routed experts plus an always-on shared expert, HF's router).
Nothing here calls ``rla.ops`` or ``rla.align``; under the ``hf`` points it equals the unaligned
model bit for bit (tests/alignment/test_align_glm4_moe.py).

A helper module, not a test file (``from glm4_moe_spec import ...``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import transformers

from align_spec import (BF16, _dense_mlp, _experts, _linear, _repeat_kv, at_head_size, head_size_of, rn, spec_norm,
                        spec_rope)
from align_spec import moe_sum_fp32 as row_moe_sum_fp32

__all__ = ["tiny_glm4_moe", "spec_forward"]


def tiny_glm4_moe(seed: int = 0, dtype=BF16, qk_norm: bool = True, dense_layers: int = 1):
    """Two layers: ``dense_layers`` dense MLPs first (first_k_dense_replace), then MoE layers of 4
    routed experts (top 2) and a shared expert; head_dim 32, partial rotary 0.5; random norm weights
    around 1."""
    cfg = transformers.Glm4MoeConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        n_shared_experts=1, first_k_dense_replace=dense_layers, n_group=1, topk_group=1, use_qk_norm=qk_norm,
        max_position_embeddings=256, attention_bias=True, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
        attn_implementation="eager", experts_implementation="eager",
    )
    torch.manual_seed(seed)
    model = transformers.Glm4MoeForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("e_score_correction_bias") or name.endswith("gate.weight"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


def _attention(attn, h, cos, sin, mask, pts, lp, eps):
    b, s, _ = h.shape
    d = attn.head_dim
    q = _linear(attn.q_proj, h).view(b, s, -1, d)
    k = _linear(attn.k_proj, h).view(b, s, -1, d)
    v = _linear(attn.v_proj, h).view(b, s, -1, d).transpose(1, 2)
    if getattr(attn, "q_norm", None) is not None:
        out = torch.float32 if pts["qk_norm_out"] == "fp32" else lp
        q = spec_norm(q.float(), attn.q_norm.weight, eps, pts, lp, out)
        k = spec_norm(k.float(), attn.k_norm.weight, eps, pts, lp, out)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    r = cos.shape[-1]
    q = torch.cat([spec_rope(q[..., :r], cos, sin, pts, lp), q[..., r:].to(lp)], dim=-1)
    k = torch.cat([spec_rope(k[..., :r], cos, sin, pts, lp), k[..., r:].to(lp)], dim=-1)
    n_rep = q.shape[1] // k.shape[1]
    k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
    w = torch.matmul(q, k.transpose(2, 3)) * attn.scaling + mask
    w = F.softmax(w, dim=-1, dtype=torch.float32).to(lp)
    o = torch.matmul(w, v).transpose(1, 2).contiguous().reshape(b, s, -1)
    return _linear(attn.o_proj, o)


def _mlp(mlp, h, pts, expert_pts=None, moe_sum_fp32=False):
    """The layer's MLP output, fp32 (a dense MLP's or the MoE sum rounded, unless ``moe_sum_fp32``)."""
    if hasattr(mlp, "gate_proj"):
        return _dense_mlp(mlp, h, pts).float()
    b, s, hid = h.shape
    h2 = h.reshape(-1, hid)
    _, weights, idx = mlp.gate(h2)  # HF's router (the MoE issue's, not a rounding region here)
    out = _experts(mlp.experts, h2, idx, weights, expert_pts or pts).view(b, s, hid)
    shared = _dense_mlp(mlp.shared_experts, h, pts)
    return out.float() + shared.float() if moe_sum_fp32 else (out + shared).float()


def spec_forward(model, input_ids, pts, positions=None, expert_pts=None, moe_sum_fp32: bool | None = None,
                 streams=None) -> torch.Tensor:
    """Logits under the points ``pts`` at ``positions`` (default 0..S-1). ``expert_pts``: the points of
    the routed experts' activation when they differ from the dense MLPs' (the engine twin's default
    mode on a CPU runs the routed experts' activation eagerly: ``per_op``); ``moe_sum_fp32``: the sum
    of the routed and shared experts is not rounded before the residual add reads it (what vLLM's
    compiled graph does with ``MoERunner``'s ``shared_output + fused_output`` on the CPU twin; None:
    the row's, ``align_spec.MOE_OUT``). ``streams``: a list that receives the rounded residual stream after
    each layer."""
    body, cfg = model.model, model.config
    if moe_sum_fp32 is None:
        moe_sum_fp32 = row_moe_sum_fp32(pts)
    pts = at_head_size(pts, head_size_of(cfg))  # the row's head-size rule (align_spec.Row)
    lp = body.embed_tokens.weight.dtype
    eps = cfg.rms_norm_eps
    b, s = input_ids.shape
    rp = cfg.rope_parameters
    dim = int(cfg.head_dim * rp["partial_rotary_factor"])
    device = input_ids.device
    where = device if pts["rope_inv_freq"] == "device" else torch.device("cpu")
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(device=where, dtype=torch.float) / dim
    inv_freq = (1.0 / (rp["rope_theta"] ** exponent)).to(device)
    if positions is None:
        positions = torch.arange(s, device=device)[None].expand(b, s)
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    future = torch.arange(s, device=device)[None, :] > torch.arange(s, device=device)[:, None]
    mask = torch.zeros(s, s, dtype=lp, device=device).masked_fill(future, torch.finfo(lp).min)[None, None]
    fp32_sum = pts["norm_residual"] == "fp32_sum"
    carry = pts["residual_stream"] == "fp32_carry"
    residual = F.embedding(input_ids, body.embed_tokens.weight)
    read = residual.float()
    for i, layer in enumerate(body.layers):
        h = spec_norm(read, layer.input_layernorm.weight, eps, pts, lp, after_add=i > 0)
        x = _attention(layer.self_attn, h, cos, sin, mask, pts, lp, eps)
        total = x.float() + residual.float()
        residual = rn(total, lp).to(lp)
        read = total if fp32_sum else residual.float()
        h = spec_norm(read, layer.post_attention_layernorm.weight, eps, pts, lp, after_add=True)
        x = _mlp(layer.mlp, h, pts, expert_pts, moe_sum_fp32)
        total = x + (total if carry else residual.float())
        residual = total.to(lp)
        read = total if fp32_sum else residual.float()
        if streams is not None:
            streams.append(residual)
    h = spec_norm(read, body.norm.weight, eps, pts, lp, after_add=True)
    return F.linear(h, model.lm_head.weight)
