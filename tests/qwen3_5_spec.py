"""The test oracle for ``rla.align`` on Qwen3.5 (dense): its decoder written from docs/families.md.

Nothing here calls ``rla.ops`` or ``rla.align``. It reuses the model's weights, HF's own
linear-attention modules (left as they are), its eager attention function and its output gate
(outside the regions), and writes the regions with explicit ``.to(lp)``: the zero-centred norms,
partial RoPE (the tables computed here), SwiGLU, the adds. Under the ``hf`` points it equals the
unaligned model bit for bit (tests/alignment/test_align_qwen3_5.py).

A helper module, not a test file (``from qwen3_5_spec import ...``).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import transformers

from align_spec import BF16, at_head_size, head_size_of, rn, spec_rope, spec_swiglu
from gemma_spec import gemma_points  # the zero_centred_norm kind's table: Qwen3.5's norms
from gemma_spec import spec_norm

__all__ = ["ATTENTION", "qwen3_5_points", "tiny_qwen3_5", "spec_forward"]

# docs/families.md, "Qwen3.5 dense", copied as data (checked against rla.profiles by
# tests/alignment/test_align_qwen3_5.py): the rows' qwen3_5 variant beyond the zero_centred_norm kind, the
# points of Qwen3.5's gated attention. They hold at every head size: SGLang 0.5.23's fused q/k norm + RoPE
# kernel reads the fp32 cache whatever the head size (its head-size rule is another kernel's).
ATTENTION = {"sglang-0.5.23": {"rope_cos_sin": "fp32", "rope_apply": "fused", "qk_norm_out": "round"}}
ATTENTION["sglang"] = ATTENTION["sglang-0.5.23"]


def qwen3_5_points(profile: str, regions=("rope", "swiglu", "rmsnorm")) -> dict:
    """The points that hold for a Qwen3.5 model aligned to ``profile`` in ``regions``: Gemma 3's
    (the zero_centred_norm kind), with :data:`ATTENTION`'s for the rope region in ``.attention``,
    which :func:`spec_forward` applies after the row's head-size rule."""
    pts = gemma_points(profile, regions)
    own = dict(ATTENTION.get(profile, {})) if "rope" in regions else {}
    if not {"rope", "rmsnorm"} <= set(regions):
        own.pop("qk_norm_out", None)  # the q/k-norm -> RoPE chain needs both regions
    pts.attention = own
    return pts


def tiny_qwen3_5(seed: int = 0, dtype=BF16):
    """A tiny Qwen3.5 text model: a linear-attention layer, a full-attention layer, a linear one;
    head_dim 32 with partial rotary 0.25 (8 rotated dims), random zero-centred norm weights."""
    cfg = transformers.Qwen3_5TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=256,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    model = transformers.Qwen3_5ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("q_norm.weight") or name.endswith("k_norm.weight") \
                    or name == "model.norm.weight":
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


def _tables(cfg, positions, where):
    rp = cfg.rope_parameters
    d = int(cfg.head_dim * rp["partial_rotary_factor"])
    exponent = torch.arange(0, d, 2, dtype=torch.int64).to(device=where, dtype=torch.float) / d
    inv_freq = (1.0 / (rp["rope_theta"] ** exponent)).to(positions.device)
    freqs = positions[..., None].float() * inv_freq  # text: the three mRoPE sections read the same positions
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _partial_rope(x, cos, sin, pts, lp):
    d = cos.shape[-1]
    return torch.cat([spec_rope(x[..., :d], cos, sin, pts, lp), x[..., d:].to(lp)], dim=-1)


def _attention(attn, h, cos, sin, pts, lp):
    modeling = sys.modules[type(attn).__module__]
    B, S, _ = h.shape
    q, gate = torch.chunk(F.linear(h, attn.q_proj.weight).view(B, S, -1, attn.head_dim * 2), 2, dim=-1)
    gate = gate.reshape(B, S, -1)
    k = F.linear(h, attn.k_proj.weight).view(B, S, -1, attn.head_dim)
    v = F.linear(h, attn.v_proj.weight).view(B, S, -1, attn.head_dim).transpose(1, 2)
    out = torch.float32 if pts["qk_norm_out"] == "fp32" else None
    q = spec_norm(q.float(), attn.q_norm.weight, attn.q_norm.eps, pts, lp, out).transpose(1, 2)
    k = spec_norm(k.float(), attn.k_norm.weight, attn.k_norm.eps, pts, lp, out).transpose(1, 2)
    q, k = _partial_rope(q, cos, sin, pts, lp), _partial_rope(k, cos, sin, pts, lp)
    i, j = torch.arange(S, device=h.device)[:, None], torch.arange(S, device=h.device)[None, :]
    mask = torch.where(j <= i, 0.0, torch.finfo(lp).min).to(lp)[None, None]
    o, _ = modeling.eager_attention_forward(attn, q, k, v, mask, dropout=0.0, scaling=attn.scaling)
    o = o.reshape(B, S, -1).contiguous() * torch.sigmoid(gate)  # HF's output gate (left as is)
    return F.linear(o, attn.o_proj.weight)


def spec_forward(model, input_ids, pts) -> torch.Tensor:
    body, cfg = model.model, model.config
    # the row's head-size rule (align_spec.Row), then the attention's own points (qwen3_5_points)
    pts = {**at_head_size(pts, head_size_of(cfg)), **getattr(pts, "attention", {})}
    lp = body.embed_tokens.weight.dtype
    device = input_ids.device
    where = device if pts["rope_inv_freq"] == "device" else torch.device("cpu")
    cos, sin = _tables(cfg, torch.arange(input_ids.shape[1], device=device)[None].expand(input_ids.shape[0], -1), where)
    fp32_sum = pts["norm_residual"] == "fp32_sum"
    carry = pts["residual_stream"] == "fp32_carry"
    s = body.embed_tokens(input_ids).float()
    for i, layer in enumerate(body.layers):
        r = rn(s, lp)
        n = layer.input_layernorm
        h = spec_norm(s if fp32_sum else r, n.weight, n.eps, pts, lp, after_add=i > 0)
        if layer.block_type == "linear_attention":
            a = layer.linear_attn(hidden_states=h, cache=None, attention_mask=None)  # HF's own (left as is)
        else:
            a = _attention(layer.self_attn, h, cos, sin, pts, lp)
        s1 = a.float() + r
        r1 = rn(s1, lp)
        n = layer.post_attention_layernorm
        h = spec_norm(s1 if fp32_sum else r1, n.weight, n.eps, pts, lp, after_add=True)
        mlp = layer.mlp
        m = F.linear(spec_swiglu(F.linear(h, mlp.gate_proj.weight), F.linear(h, mlp.up_proj.weight), pts),
                     mlp.down_proj.weight)
        s = (s1 if carry else r1) + m.float()
        if not fp32_sum:
            s = rn(s, lp)
    h = spec_norm(s if fp32_sum else rn(s, lp), body.norm.weight, body.norm.eps, pts, lp, after_add=True)
    return F.linear(h, model.lm_head.weight)
