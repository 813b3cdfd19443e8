"""The test oracle for ``rla.align`` on Gemma 3: its decoder written from docs/families.md.

Nothing here calls ``rla.ops`` or ``rla.align``. It reuses the model's weights, its scaled
embedding and HF's own eager attention function (attention is outside the regions), and writes
every region with explicit ``.to(lp)``: the zero-centred norm ``x * rstd * (1 + w)``, the
sandwich layer with its two adds, the GeGLU product, RoPE from frequencies computed here.
Under the ``hf`` points it must equal the unaligned HF model bit for bit
(``tests/alignment/test_align_gemma.py``), which is what makes it an oracle for the other rows.

A helper module, not a test file (``from gemma_spec import ...``).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import transformers

from align_spec import BF16, SPEC, Row, at_head_size, head_size_of, rn, spec_rope
from spec import vllm_mean_square

# docs/families.md, "the zero_centred_norm variant", copied as data (checked against rla.profiles
# by tests/alignment/test_align_gemma.py): the points that differ for Gemma's norms and layers.
# ``post_norm_out`` (a point only these layers have): what the add after the post-attention /
# post-feed-forward norm reads, RN(norm) or the norm's fp32 output (vLLM's compiled graph).
VARIANT = {
    "hf": {"norm_weight": "fused", "post_norm_out": "round"},
    "rla": {"post_norm_out": "round"},
    "sglang-0.5.23": {"post_norm_out": "round"},
    "vllm-0.26": {"post_norm_out": "fp32"},
    "vllm-0.33": {"post_norm_out": "fp32"},
    "vllm-0.26-eager": {"norm_residual": "fp32_sum", "norm_reduction": "unpinned", "post_norm_out": "round"},
    "vllm-0.33-eager": {"norm_residual": "fp32_sum", "norm_reduction": "unpinned", "post_norm_out": "round"},
}
VARIANT["vllm"], VARIANT["vllm-eager"], VARIANT["sglang"] = VARIANT["vllm-0.33"], VARIANT["vllm-0.33-eager"], \
    VARIANT["sglang-0.5.23"]


def gemma_points(profile: str, regions=("rope", "swiglu", "rmsnorm")) -> dict:
    """The points that hold for a Gemma 3 model aligned to ``profile`` in ``regions``; HF's own
    Gemma points elsewhere (HF's Gemma norm rounds once: the hf variant)."""
    hf = {**SPEC["hf"], **VARIANT["hf"]}
    row = {**SPEC[profile], **VARIANT.get(profile, {})}
    groups = {"rope": ("rope_cos_sin", "rope_apply", "rope_inv_freq", "qk_norm_out"), "swiglu": ("swiglu",),
              "rmsnorm": ("norm_weight", "norm_residual", "residual_stream", "norm_reduction", "post_norm_out")}
    out = Row(hf, SPEC[profile].fused_head_sizes if "rope" in regions else None,
              SPEC[profile].experts_swiglu if "swiglu" in regions else None,  # Qwen3.5 MoE's routed experts
              SPEC[profile].moe_out if "rmsnorm" in regions else None)  # and its MoE sum (the add's)
    for region in regions:
        for point in groups[region]:
            out[point] = row[point]
    if not {"rope", "rmsnorm"} <= set(regions):
        out["qk_norm_out"] = "round"
    return out


def tiny_gemma3(seed: int = 0, layers: int = 3, dtype=BF16, hidden_size: int = 64):
    """A random tiny Gemma 3 text model: sliding and full layers (theta 10k default, theta 1M
    linear x8), head_dim 16, every norm weight random around 0 (HF initialises them to 0, where
    ``1 + w`` is exact and a test would prove little). Parameters cast one by one, so the rotary
    buffers stay fp32 (as ``from_pretrained(dtype=)`` leaves them)."""
    types = ["sliding_attention"] * (layers - 1) + ["full_attention"]
    cfg = transformers.Gemma3TextConfig(
        vocab_size=128, hidden_size=hidden_size, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, sliding_window=8,
        query_pre_attn_scalar=16, layer_types=types, final_logit_softcapping=None, tie_word_embeddings=False,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}},
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


def spec_inv_freq(cfg, layer_type: str, where="cpu") -> torch.Tensor:
    """fp32 frequencies evaluated on ``where`` (the CPU for ``rope_inv_freq='host'``)."""
    rp = cfg.rope_parameters[layer_type]
    d = cfg.head_dim
    exponent = torch.arange(0, d, 2, dtype=torch.int64).to(device=where, dtype=torch.float) / d
    inv_freq = 1.0 / (rp["rope_theta"] ** exponent)
    return inv_freq / rp["factor"] if rp["rope_type"] == "linear" else inv_freq


def spec_norm(v, weight, eps, pts, lp, out=None, after_add=False):
    """Zero-centred RMSNorm of the fp32 value ``v``: (v * rstd) * (1 + RN(w)), 1 + w in fp32."""
    if pts["norm_reduction"] == "vllm_block":
        mean_square = vllm_mean_square(v, v.numel() // v.shape[-1], after_add)
    else:
        mean_square = (v * v).mean(-1, keepdim=True)
    rstd = torch.rsqrt(mean_square + eps)
    w = 1.0 + rn(weight.float(), lp)
    if pts["norm_weight"] == "per_op":
        return (w * rn(v * rstd, lp)).to(out or lp)
    return ((v * rstd) * w).to(out or lp)


def spec_geglu(g, u, pts):
    lp = g.dtype
    a = F.gelu(g.float(), approximate="tanh")
    if pts["swiglu"] == "per_op":
        a = rn(a, lp)
    return (a * u.float()).to(lp)


def _mask(seq: int, window: int | None, lp, device="cpu") -> torch.Tensor:
    i = torch.arange(seq, device=device)[:, None]
    j = torch.arange(seq, device=device)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= (i - j) < window
    return torch.where(allowed, 0.0, torch.finfo(lp).min).to(lp)[None, None]


def _attention(attn, h, cos, sin, pts, lp):
    modeling = sys.modules[type(attn).__module__]
    B, S, _ = h.shape
    shape = (B, S, -1, attn.head_dim)
    q = F.linear(h, attn.q_proj.weight).view(shape).transpose(1, 2)
    k = F.linear(h, attn.k_proj.weight).view(shape).transpose(1, 2)
    v = F.linear(h, attn.v_proj.weight).view(shape).transpose(1, 2)
    qk_out = torch.float32 if pts["qk_norm_out"] == "fp32" else None
    q = spec_norm(q.float(), attn.q_norm.weight, attn.q_norm.eps, pts, lp, qk_out)
    k = spec_norm(k.float(), attn.k_norm.weight, attn.k_norm.eps, pts, lp, qk_out)
    q, k = spec_rope(q, cos, sin, pts, lp), spec_rope(k, cos, sin, pts, lp)
    out, _ = modeling.eager_attention_forward(attn, q, k, v, _mask(S, attn.sliding_window, lp, h.device), dropout=0.0,
                                              scaling=attn.scaling, sliding_window=attn.sliding_window)
    return F.linear(out.reshape(B, S, -1).contiguous(), attn.o_proj.weight)


def spec_forward(model, input_ids, pts, positions=None, post_norm_fp32: bool | None = None, streams=None,
                 embed_fp32: bool = False) -> torch.Tensor:
    """Logits of ``model`` (a Gemma3ForCausalLM) computed under the points ``pts`` at ``positions``
    (default 0..S-1). ``post_norm_fp32``: the post-attention and post-feed-forward norms hand the add
    after them their unrounded output (the chain vLLM's default-mode graph compiles on the CPU:
    tests/engines/test_vllm_twin_families.py); None: as ``pts['post_norm_out']`` says (``round``
    where ``pts`` does not say). ``streams``: a list that receives the
    residual stream after each layer, rounded (as the engine twin records it). ``embed_fp32``: the
    first norm reads the embedding times its bf16 scale unrounded (a chain vLLM's compiled first
    piece can keep; the residual is the rounded product either way); sqrt(hidden) = 8 at the tiny
    models' width, where the product is exact and the option changes nothing."""
    body, cfg = model.model, model.config
    pts = at_head_size(pts, head_size_of(cfg))  # the row's head-size rule (align_spec.Row)
    lp = body.embed_tokens.weight.dtype
    device = input_ids.device
    where = device if pts["rope_inv_freq"] == "device" else torch.device("cpu")
    if positions is None:
        positions = torch.arange(input_ids.shape[1], device=device)[None].expand(input_ids.shape[0], -1)
    if post_norm_fp32 is None:
        post_norm_fp32 = pts.get("post_norm_out", "round") == "fp32"
    post_out = torch.float32 if post_norm_fp32 else None
    tables = {}
    for t in set(cfg.layer_types):
        freqs = positions[..., None].float() * spec_inv_freq(cfg, t, where).to(device)
        emb = torch.cat((freqs, freqs), dim=-1)
        tables[t] = (emb.cos(), emb.sin())
    fp32_sum = pts["norm_residual"] == "fp32_sum"
    carry = pts["residual_stream"] == "fp32_carry"
    x = body.embed_tokens(input_ids)  # HF's scaled embedding (left as is)
    s = x.float()  # what the next norm reads: the fp32 sum (or the embeddings)
    if embed_fp32:  # the product F.embedding(ids, w) * RN(scale), before its rounding
        scale = body.embed_tokens.embed_scale.to(lp).float()
        s = F.embedding(input_ids, body.embed_tokens.weight).float() * scale
    for i, layer in enumerate(body.layers):
        r = rn(s, lp)  # the residual stream
        read = s if fp32_sum or (i == 0 and embed_fp32) else r
        h = spec_norm(read, layer.input_layernorm.weight, layer.input_layernorm.eps, pts, lp, after_add=i > 0)
        a = _attention(layer.self_attn, h, *tables[cfg.layer_types[i]], pts, lp)
        a = spec_norm(a.float(), layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps, pts, lp,
                      out=post_out)
        s1 = a.float() + r
        r1 = rn(s1, lp)
        ff = layer.pre_feedforward_layernorm
        h = spec_norm(s1 if fp32_sum else r1, ff.weight, ff.eps, pts, lp, after_add=True)
        mlp = layer.mlp
        y = spec_geglu(F.linear(h, mlp.gate_proj.weight), F.linear(h, mlp.up_proj.weight), pts)
        m = F.linear(y, mlp.down_proj.weight)
        m = spec_norm(m.float(), layer.post_feedforward_layernorm.weight, layer.post_feedforward_layernorm.eps, pts, lp,
                      out=post_out)
        s = (s1 if carry else r1) + m.float()
        if not fp32_sum:
            s = rn(s, lp)
        if streams is not None:
            streams.append(rn(s, lp))
    h = spec_norm(s if fp32_sum else rn(s, lp), body.norm.weight, body.norm.eps, pts, lp, after_add=True)
    return F.linear(h, model.lm_head.weight)
