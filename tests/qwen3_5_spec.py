"""The test oracle for ``rla.align`` on Qwen3.5, dense and MoE: its decoder written from docs/families.md.

Nothing here calls ``rla.ops`` or ``rla.align``. It reuses the model's weights, HF's own
linear-attention modules (left as they are) and its eager attention function, and writes the regions
with explicit ``.to(lp)``: the zero-centred norms, partial RoPE (the tables computed here), SwiGLU,
the attention output gate (the ``attn_gate`` point, in the swiglu region), the adds. Under the
``hf`` points it equals the unaligned model bit for bit (tests/alignment/test_align_qwen3_5.py,
test_align_qwen3_5_moe.py).

The MoE block (:func:`spec_moe`): without router points, HF's own router (the model's ``gate``)
and the eager experts loop's weighted sum, every expert's gated product and the shared expert's
written here; with router points, the routes and the weighted sum from their definitions
(``router_spec``); the shared expert's sigmoid gate and its add as HF computes them (left as is).

A helper module, not a test file (``from qwen3_5_spec import ...``).
"""

from __future__ import annotations

import functools
import sys

import torch
import torch.nn.functional as F
import transformers

import router_spec
from align_spec import BF16, Row, at_head_size, experts_points, head_size_of, moe_sum_fp32, rn, spec_rope, spec_swiglu
from gemma_spec import gemma_points  # the zero_centred_norm kind's table: Qwen3.5's norms
from gemma_spec import spec_norm

__all__ = ["ATTENTION", "qwen3_5_points", "tiny_qwen3_5", "tiny_qwen3_5_moe", "spec_moe", "spec_forward"]

# docs/families.md, "Qwen3.5 dense", copied as data (checked against rla.profiles by
# tests/alignment/test_align_qwen3_5.py): the rows' qwen3_5 variant beyond the zero_centred_norm kind, the
# points of Qwen3.5's gated attention. They hold at every head size: SGLang 0.5.23's fused q/k norm + RoPE
# kernel reads the fp32 cache whatever the head size (its head-size rule is another kernel's); vLLM 0.26's
# and 0.33's (fused_qk_rmsnorm_rope_gate) rounds the norm before the rotation in both modes, where the
# default rows' fp32 is Qwen3's compiled graph (the eager rows already say round). And the output gate
# attn * sigmoid(gate) (``attn_gate``, every row): HF's two PyTorch ops (per_op), which vLLM's eager mode runs too;
# one rounding in SGLang's fused_sigmoid_mul and in vLLM's compiled graph (Inductor fuses the two ops).
ATTENTION = {"hf": {"attn_gate": "per_op"}, "rla": {"attn_gate": "fused"},
             "sglang-0.5.23": {"rope_cos_sin": "fp32", "rope_apply": "fused", "qk_norm_out": "round",
                               "attn_gate": "fused"},
             "vllm-0.26": {"qk_norm_out": "round", "attn_gate": "fused"},
             "vllm-0.33": {"qk_norm_out": "round", "attn_gate": "fused"},
             "vllm-0.26-eager": {"attn_gate": "per_op"}, "vllm-0.33-eager": {"attn_gate": "per_op"}}
ATTENTION["sglang"] = ATTENTION["sglang-0.5.23"]
ATTENTION["vllm"], ATTENTION["vllm-eager"] = ATTENTION["vllm-0.33"], ATTENTION["vllm-0.33-eager"]


def qwen3_5_points(profile: str, regions=("rope", "swiglu", "rmsnorm")) -> dict:
    """The points that hold for a Qwen3.5 model aligned to ``profile`` in ``regions``: Gemma 3's
    (the zero_centred_norm kind), with :data:`ATTENTION`'s in ``.attention`` (the rope region's; the
    output gate's with the swiglu region, else HF's ``per_op``), which :func:`spec_forward` applies
    after the row's head-size rule."""
    pts = gemma_points(profile, regions)
    row = ATTENTION.get(profile, {})
    own = {p: v for p, v in row.items() if p != "attn_gate"} if "rope" in regions else {}
    if not {"rope", "rmsnorm"} <= set(regions):
        own.pop("qk_norm_out", None)  # the q/k-norm -> RoPE chain needs both regions
    own["attn_gate"] = row.get("attn_gate", "per_op") if "swiglu" in regions else "per_op"
    pts.attention = own
    return pts


_TEXT = dict(vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
             linear_value_head_dim=16, max_position_embeddings=256,
             layer_types=["linear_attention", "full_attention", "linear_attention"],
             rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                              "mrope_section": [2, 1, 1], "mrope_interleaved": True})


def _randomise(model, seed: int, dtype, gate_scale: float = 0.0):
    """Random zero-centred norm weights (HF initialises them to 0, where per_op and fused coincide), MoE
    router weights scaled to ``gate_scale`` (sharp routing: the choice depends on the logits' last bits)."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("q_norm.weight") or name.endswith("k_norm.weight") \
                    or name == "model.norm.weight":
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif gate_scale and (name.endswith("mlp.gate.weight") or name.endswith("shared_expert_gate.weight")):
                p.copy_(gate_scale * torch.randn(p.shape, generator=g))
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


def tiny_qwen3_5(seed: int = 0, dtype=BF16, **overrides):
    """A tiny Qwen3.5 text model: a linear-attention layer, a full-attention layer, a linear one;
    head_dim 32 with partial rotary 0.25 (8 rotated dims), random zero-centred norm weights;
    ``overrides``: config fields (e.g. a wider ``hidden_size``)."""
    cfg = transformers.Qwen3_5TextConfig(**{**_TEXT, "intermediate_size": 96, **overrides}, attn_implementation="eager")
    torch.manual_seed(seed)
    return _randomise(transformers.Qwen3_5ForCausalLM(cfg).eval(), seed, dtype)


def text_config_moe(**overrides):
    """The tiny MoE text config: the dense one's layers, every MLP a block of top-3 of 8 experts (so
    the three combine orders differ) and a shared expert."""
    return transformers.Qwen3_5MoeTextConfig(**{**_TEXT, "num_experts": 8, "num_experts_per_tok": 3,
                                                "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
                                                **overrides})


def tiny_qwen3_5_moe(seed: int = 0, dtype=BF16, experts: str = "eager"):
    """A tiny Qwen3.5 MoE text model (``qwen3_5_moe_text``): the dense model's three layers (both kinds)
    with sparse MoE blocks, sharp routers, HF's ``experts`` implementation as given."""
    cfg = text_config_moe(attn_implementation="eager", experts_implementation=experts)
    torch.manual_seed(seed)
    return _randomise(transformers.Qwen3_5MoeForCausalLM(cfg).eval(), seed, dtype, gate_scale=0.5)


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


def _attention(attn, h, cos, sin, pts, lp, gate_once=False, norm=spec_norm):
    modeling = sys.modules[type(attn).__module__]
    B, S, _ = h.shape
    q, gate = torch.chunk(F.linear(h, attn.q_proj.weight).view(B, S, -1, attn.head_dim * 2), 2, dim=-1)
    gate = gate.reshape(B, S, -1)
    k = F.linear(h, attn.k_proj.weight).view(B, S, -1, attn.head_dim)
    v = F.linear(h, attn.v_proj.weight).view(B, S, -1, attn.head_dim).transpose(1, 2)
    out = torch.float32 if pts["qk_norm_out"] == "fp32" else None
    q = norm(q.float(), attn.q_norm.weight, attn.q_norm.eps, pts, lp, out).transpose(1, 2)
    k = norm(k.float(), attn.k_norm.weight, attn.k_norm.eps, pts, lp, out).transpose(1, 2)
    q, k = _partial_rope(q, cos, sin, pts, lp), _partial_rope(k, cos, sin, pts, lp)
    i, j = torch.arange(S, device=h.device)[:, None], torch.arange(S, device=h.device)[None, :]
    mask = torch.where(j <= i, 0.0, torch.finfo(lp).min).to(lp)[None, None]
    o, _ = modeling.eager_attention_forward(attn, q, k, v, mask, dropout=0.0, scaling=attn.scaling)
    o = o.reshape(B, S, -1).contiguous()
    if gate_once or pts.get("attn_gate") == "fused":  # attn * sigmoid(gate) in fp32, rounded once
        o = (o.float() * torch.sigmoid(gate.float())).to(lp)
    else:
        o = o * torch.sigmoid(gate)  # HF's output gate (per_op): RN(attn * RN(sigmoid(gate)))
    return F.linear(o, attn.o_proj.weight)


def spec_moe(block, h, pts, router=None) -> torch.Tensor:
    """One sparse MoE block on lp ``h`` [B, S, H]: the experts' and the shared expert's gated products
    under ``pts``; the routes and their weighted sum HF's (the block's own gate, the eager loop: each
    expert's weighted term rounded, added into an lp zero in ascending expert id) or, with
    ``router`` (:class:`rla.profiles.RouterPoints`), the points' definitions (``router_spec``);
    then routed + RN(RN(sigmoid(RN(h W_s))) * shared), HF's."""
    b, s, hid = h.shape
    x = h.reshape(-1, hid)
    act = lambda g, u: spec_swiglu(g, u, pts)  # noqa: E731  (the shared expert's)
    routed_pts = experts_points(pts)
    routed_act = lambda g, u: spec_swiglu(g, u, routed_pts)  # noqa: E731
    if router is not None:
        ids, weights = router_spec.route(block, x, router, "softmax")
        return router_spec.block_output(block, x, ids, weights, router, "softmax", "shared_expert", routed_act,
                                        shared_act=act, fp32_out=moe_sum_fp32(pts)).reshape(b, s, hid)
    _, weights, ids = block.gate(x)  # HF's router: not aligned without the router region
    ex, routed = block.experts, torch.zeros_like(x)
    for e in range(ex.num_experts):
        pos, tok = torch.where(ids.t() == e)  # slot, then token: the eager loop's rows
        if tok.numel():
            g, u = F.linear(x[tok], ex.gate_up_proj[e]).chunk(2, dim=-1)
            term = F.linear(routed_act(g, u), ex.down_proj[e]) * weights[tok, pos, None]
            routed.index_add_(0, tok, term)
    sh = block.shared_expert
    shared = F.linear(act(F.linear(x, sh.gate_proj.weight), F.linear(x, sh.up_proj.weight)), sh.down_proj.weight)
    gated = torch.sigmoid(F.linear(x, block.shared_expert_gate.weight)) * shared
    out = routed.float() + gated.float() if moe_sum_fp32(pts) else routed + gated  # the add's fp32 read, or RN
    return out.reshape(b, s, hid)


def _norm(v, weight, eps, pts, lp, out=None, after_add=False, mean_square=None):
    """``gemma_spec.spec_norm``, or with ``mean_square`` (``v -> mean(v * v, -1)``) the same formula (the row's
    ``norm_weight='fused'``) on that mean of squares."""
    if mean_square is None:
        return spec_norm(v, weight, eps, pts, lp, out, after_add)
    if pts["norm_weight"] != "fused":
        raise ValueError("mean_square is for norm_weight='fused' rows")
    return ((v * torch.rsqrt(mean_square(v) + eps)) * (1.0 + rn(weight.float(), lp))).to(out or lp)


def spec_forward(model, input_ids, pts, router=None, *, positions=None, streams=None, gate_once=False,
                 mean_square=None) -> torch.Tensor:
    """The logits of ``model`` (dense or MoE) under ``pts``; ``router``: the MoE blocks' router points
    (None: HF's router and weighted sum). ``positions`` [B, S] (default 0..S-1); ``streams``: a list that
    receives each layer's output rounded to the model's dtype; ``gate_once``: the full-attention layers'
    output gate ``attn * sigmoid(gate)`` in fp32 rounded once (``attn_gate='fused'``, what vLLM's compiled graph
    computes, tests/engines/test_vllm_twin_qwen3_5.py) whatever ``pts`` says; ``mean_square``: every norm's mean
    of squares as that function sums it (``v -> mean(v * v, -1, keepdim=True)``; default PyTorch's eager one),
    e.g. Inductor's order (the rows' ``norm_reduction='unpinned'``)."""
    norm = functools.partial(_norm, mean_square=mean_square)
    body, cfg = model.model, model.config
    # the row's head-size rule (align_spec.Row), then the attention's own points (qwen3_5_points)
    at = at_head_size(pts, head_size_of(cfg))
    pts = Row({**at, **getattr(pts, "attention", {})}, None, at.experts_swiglu, at.moe_out)
    lp = body.embed_tokens.weight.dtype
    device = input_ids.device
    where = device if pts["rope_inv_freq"] == "device" else torch.device("cpu")
    if positions is None:
        positions = torch.arange(input_ids.shape[1], device=device)[None].expand(input_ids.shape[0], -1)
    cos, sin = _tables(cfg, positions, where)
    fp32_sum = pts["norm_residual"] == "fp32_sum"
    carry = pts["residual_stream"] == "fp32_carry"
    s = body.embed_tokens(input_ids).float()
    for i, layer in enumerate(body.layers):
        r = rn(s, lp)
        n = layer.input_layernorm
        h = norm(s if fp32_sum else r, n.weight, n.eps, pts, lp, after_add=i > 0)
        if layer.block_type == "linear_attention":
            a = layer.linear_attn(hidden_states=h, cache=None, attention_mask=None)  # HF's own (left as is)
        else:
            a = _attention(layer.self_attn, h, cos, sin, pts, lp, gate_once, norm)
        s1 = a.float() + r
        r1 = rn(s1, lp)
        n = layer.post_attention_layernorm
        h = norm(s1 if fp32_sum else r1, n.weight, n.eps, pts, lp, after_add=True)
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            m = spec_moe(mlp, h, pts, router)
        else:
            m = F.linear(spec_swiglu(F.linear(h, mlp.gate_proj.weight), F.linear(h, mlp.up_proj.weight), pts),
                         mlp.down_proj.weight)
        s = (s1 if carry else r1) + m.float()
        if not fp32_sum:
            s = rn(s, lp)
        if streams is not None:
            streams.append(rn(s, lp))
    h = norm(s if fp32_sum else rn(s, lp), body.norm.weight, body.norm.eps, pts, lp, after_add=True)
    return F.linear(h, model.lm_head.weight)
