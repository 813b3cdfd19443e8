"""The test oracle for ``rla.align`` on GPT-OSS: its decoder written from docs/families.md.

Nothing here calls ``rla.ops`` or ``rla.align``. It reuses the model's weights, its router and
HF's own eager attention function (sinks included: attention is outside the regions), and writes
the regions with explicit ``.to(lp)``: the norm, the clamped SwiGLU of the experts (HF's op
sequence under ``per_op``, one rounding under ``fused``), RoPE from YaRN frequencies. Under the
``hf`` points it must equal the unaligned model bit for bit (tests/alignment/test_align_gpt_oss.py).

A helper module, not a test file (``from gpt_oss_spec import ...``).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from align_spec import BF16, SPEC, Row, at_head_size, head_size_of, rn, spec_norm, spec_rope

# docs/families.md, "the gpt_oss variant", copied as data (checked against rla.profiles).
# oai_glu: vLLM's swigluoai_and_mul kernel's order, the product then one division (its SASS; both versions, both modes)
VARIANT = {"hf": {"norm_weight": "fused"}, "vllm-0.26-eager": {"swiglu": "fused", "oai_glu": "quotient"},
           "vllm-0.33-eager": {"swiglu": "fused", "oai_glu": "quotient"},
           # the live vLLM 0.26 default mode on GPT-OSS (results/benchmarks/vllm026_qwen35_gptoss_h200_2026-12-02/)
           "vllm-0.26": {"rope_cos_sin": "fp32", "residual_stream": "rounded", "norm_reduction": "vllm_block",
                         "oai_glu": "quotient"},
           # vLLM 0.33's default-mode twin (tests/engines/test_vllm_twin_families.py): the fp32 YaRN cache
           "vllm-0.33": {"rope_cos_sin": "fp32", "oai_glu": "quotient"}}
VARIANT["vllm"], VARIANT["vllm-eager"] = VARIANT["vllm-0.33"], VARIANT["vllm-0.33-eager"]


def gpt_oss_points(profile: str, regions=("rope", "swiglu", "rmsnorm")) -> dict:
    hf = {**SPEC["hf"], **VARIANT["hf"]}
    row = {**SPEC[profile], **VARIANT.get(profile, {})}
    groups = {"rope": ("rope_cos_sin", "rope_apply", "rope_inv_freq"), "swiglu": ("swiglu", "oai_glu"),
              "rmsnorm": ("norm_weight", "norm_residual", "residual_stream", "norm_reduction")}
    out = Row({**hf, "oai_glu": "sigmoid"}, SPEC[profile].fused_head_sizes if "rope" in regions else None)
    for region in regions:
        for point in groups[region]:
            out[point] = row.get(point, "sigmoid") if point == "oai_glu" else row[point]
    return out


def tiny_gpt_oss(seed: int = 0, dtype=BF16):
    """A random tiny GPT-OSS: a sliding and a full layer, 4 experts (top 2) with biases, YaRN
    (factor 4), random norms, biases and sinks (HF initialises some to 0 or 1, where a rounding
    difference can hide)."""
    cfg = transformers.GptOssConfig(
        vocab_size=128, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"], sliding_window=8, max_position_embeddings=256,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False},
        tie_word_embeddings=False, attn_implementation="eager", experts_implementation="eager",
    )
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif "bias" in name or "sinks" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


def spec_clamped_swiglu(gate, up, alpha, limit, pts):
    lp = gate.dtype
    g = gate.float().clamp(max=limit)
    u = up.float().clamp(min=-limit, max=limit)
    if pts["swiglu"] == "per_op":
        return (rn(u + 1.0, lp) * rn(g * rn(torch.sigmoid(rn(g * alpha, lp)), lp), lp)).to(lp)
    if pts["oai_glu"] == "quotient":  # (u + 1) * g first, then one division by 1 + exp(-(g * alpha))
        return (torch.mul(u + 1.0, g) / torch.exp(-alpha * g).add(1.0)).to(lp)
    return ((u + 1.0) * (g * torch.sigmoid(g * alpha))).to(lp)


def _mask(seq, window, lp, device="cpu"):
    i, j = torch.arange(seq, device=device)[:, None], torch.arange(seq, device=device)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= (i - j) < window
    return torch.where(allowed, 0.0, torch.finfo(lp).min).to(lp)[None, None]


def _attention(attn, h, cos, sin, pts, lp):
    modeling = sys.modules[type(attn).__module__]
    B, S, _ = h.shape
    shape = (B, S, -1, attn.head_dim)
    q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias).view(shape).transpose(1, 2)
    k = F.linear(h, attn.k_proj.weight, attn.k_proj.bias).view(shape).transpose(1, 2)
    v = F.linear(h, attn.v_proj.weight, attn.v_proj.bias).view(shape).transpose(1, 2)
    q, k = spec_rope(q, cos, sin, pts, lp), spec_rope(k, cos, sin, pts, lp)
    out, _ = modeling.eager_attention_forward(attn, q, k, v, _mask(S, attn.sliding_window, lp, h.device), dropout=0.0,
                                              scaling=attn.scaling, sliding_window=attn.sliding_window,
                                              s_aux=attn.sinks)
    return F.linear(out.reshape(B, S, -1).contiguous(), attn.o_proj.weight, attn.o_proj.bias)


def _experts(mlp, h, pts):
    B, S, H = h.shape
    x = h.reshape(-1, H)
    _, scores, index = mlp.router(x)  # HF's router (outside the regions)
    ex = mlp.experts
    out = torch.zeros_like(x)
    for e in range(ex.num_experts):
        token, slot = torch.where(index == e)
        if token.numel() == 0:
            continue
        gu = x[token] @ ex.gate_up_proj[e] + ex.gate_up_proj_bias[e]
        y = spec_clamped_swiglu(gu[..., ::2], gu[..., 1::2], ex.alpha, ex.limit, pts)
        o = (y @ ex.down_proj[e] + ex.down_proj_bias[e]) * scores[token, slot, None]
        out.index_add_(0, token, o.to(out.dtype))
    return out.reshape(B, S, H)


def spec_forward(model, input_ids, pts) -> torch.Tensor:
    body, cfg = model.model, model.config
    pts = at_head_size(pts, head_size_of(cfg))  # the row's head-size rule (align_spec.Row)
    lp = body.embed_tokens.weight.dtype
    device = input_ids.device
    where = device if pts["rope_inv_freq"] == "device" else torch.device("cpu")
    inv_freq, scale = ROPE_INIT_FUNCTIONS["yarn"](cfg, device=where)  # the model's own definition of its frequencies
    positions = torch.arange(input_ids.shape[1], device=device)[None].expand(input_ids.shape[0], -1)
    freqs = positions[..., None].float() * inv_freq.float().to(device)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * scale, emb.sin() * scale
    fp32_sum = pts["norm_residual"] == "fp32_sum"
    carry = pts["residual_stream"] == "fp32_carry"
    s = body.embed_tokens(input_ids).float()
    for i, layer in enumerate(body.layers):
        r = rn(s, lp)
        n = layer.input_layernorm
        h = spec_norm(s if fp32_sum else r, n.weight, n.variance_epsilon, pts, lp, after_add=i > 0)
        a = _attention(layer.self_attn, h, cos, sin, pts, lp)
        s1 = a.float() + r
        r1 = rn(s1, lp)
        n = layer.post_attention_layernorm
        h = spec_norm(s1 if fp32_sum else r1, n.weight, n.variance_epsilon, pts, lp, after_add=True)
        m = _experts(layer.mlp, h, pts)
        s = (s1 if carry else r1) + m.float()
        if not fp32_sum:
            s = rn(s, lp)
    n = body.norm
    h = spec_norm(s if fp32_sum else rn(s, lp), n.weight, n.variance_epsilon, pts, lp, after_add=True)
    return F.linear(h, model.lm_head.weight)
