"""The test oracle for ``rla.align`` on Gemma 4: its text decoder written from docs/families.md.

Nothing here calls ``rla.ops`` or ``rla.align``. It reuses the model's weights, its scaled
embeddings and per-layer-input lookup, HF's own eager attention function and, in MoE layers, HF's
router and experts (all outside the regions), and writes every region with explicit ``.to(lp)``:
the norm ``x * rstd * w`` (a weightless one for the values), the sandwich layer with its adds, the
per-layer-input gate and the layer scalar, the GeGLU products, RoPE from frequencies computed here
(default, and proportional: zero frequencies past ``partial_rotary_factor``), the K/V a later layer
shares. Under the ``hf`` points it equals the unaligned HF model bit for bit
(``tests/alignment/test_align_gemma4.py``), which makes it an oracle for the other rows.

A helper module, not a test file (``from gemma4_spec import ...``).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import transformers

from align_spec import BF16, SPEC, Row, at_head_size, rn, spec_rope
from gemma_spec import _mask, spec_geglu
from spec import vllm_mean_square

# docs/families.md, "the gemma4 and gemma4_ple variants", copied as data (checked against rla.profiles by
# tests/alignment/test_align_gemma4.py): the points that differ for Gemma 4's norms and layers, and for its
# per-layer-input gate gelu_tanh(g) * p.
# ``post_norm_out``: what the add after the post-attention, post-feed-forward and post-per-layer-input
# norms reads, RN(norm) or the norm's fp32 output (the vllm default rows, by analogy with Gemma 3).
# ``ple_inputs``, ``ple_add``, ``stream_variance``, ``embed_variance``: under their second value the chains
# ``ple_fp32``, ``ple_add_rounded``, ``stream_variance_fp32``, ``embed_variance_fp32`` (:data:`CHAIN_OF`).
VARIANT = {"hf": {"norm_weight": "fused", "post_norm_out": "round"},
           **{name: {"post_norm_out": "round"} for name in ("rla", "sglang-0.5.23", "vllm-0.26-eager",
                                                            "vllm-0.33-eager")},
           **{name: {"post_norm_out": "fp32", "ple_inputs": "fused", "ple_add": "rounded", "stream_variance": "fp32",
                     "embed_variance": "fp32"} for name in ("vllm-0.26", "vllm-0.33")}}
VARIANT["vllm"], VARIANT["vllm-eager"], VARIANT["sglang"] = VARIANT["vllm-0.33"], VARIANT["vllm-0.33-eager"], \
    VARIANT["sglang-0.5.23"]
PLE_VARIANT = {"sglang-0.5.23": {"swiglu": "per_op"}}

_GROUPS = {"rope": ("rope_cos_sin", "rope_apply", "rope_inv_freq", "qk_norm_out"), "swiglu": ("swiglu",),
           "rmsnorm": ("norm_weight", "norm_residual", "residual_stream", "norm_reduction", "post_norm_out",
                       "ple_inputs", "ple_add", "stream_variance", "embed_variance")}
#: Gemma 4's model-body points -> (the value, HF's, that adds nothing; the chain of :data:`CHAINS` the other
#: value is).
CHAIN_OF = {"ple_inputs": ("per_op", "ple_fp32"), "ple_add": ("stream", "ple_add_rounded"),
            "stream_variance": ("normalised", "stream_variance_fp32"),
            "embed_variance": ("normalised", "embed_variance_fp32")}
_HF_BODY = {p: first for p, (first, _) in CHAIN_OF.items()}


def gemma4_points(profile: str, regions=("rope", "swiglu", "rmsnorm")) -> Row:
    """The points that hold for a Gemma 4 model aligned to ``profile`` in ``regions`` (HF's own
    elsewhere: its norm rounds once), and under ``ple_swiglu`` the per-layer-input gate's."""
    hf = {**SPEC["hf"], **_HF_BODY, **VARIANT["hf"]}
    row = {**SPEC[profile], **_HF_BODY, **VARIANT.get(profile, {})}
    out = Row(hf, SPEC[profile].fused_head_sizes if "rope" in regions else None)
    for region in regions:
        for point in _GROUPS[region]:
            out[point] = row[point]
    if not {"rope", "rmsnorm"} <= set(regions):
        out["qk_norm_out"] = "round"
    ple = {**SPEC[profile], **PLE_VARIANT.get(profile, {})}["swiglu"] if "swiglu" in regions else SPEC["hf"]["swiglu"]
    out["ple_swiglu"] = ple
    return out


def tiny_gemma4(seed: int = 0, layers: int = 5, ple: bool = True, moe: bool = False, kv_shared: int = 2,
                head_dim: int = 16, global_head_dim: int = 32, dtype=BF16, **overrides):
    """A random tiny Gemma 4 text model with both layer types (sliding: theta 10k default; full:
    theta 1M proportional, a quarter of the angles rotated, its own head size), per-layer inputs,
    K/V shared by the last ``kv_shared`` layers, keys as values in full layers, a double-wide MLP in
    the sharing layers; optionally MoE layers. Every norm weight and layer scalar is random (HF
    initialises them to 1, where a product proves little). Parameters and the layer scalars are cast
    one by one, so the rotary buffers stay fp32 (as ``from_pretrained(dtype=)`` leaves them)."""
    types = (["sliding_attention", "sliding_attention", "full_attention"] * layers)[:layers - 1] + ["full_attention"]
    kw = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=head_dim, global_head_dim=global_head_dim, max_position_embeddings=256,
        sliding_window=8, layer_types=types, final_logit_softcapping=30.0, tie_word_embeddings=False,
        hidden_size_per_layer_input=8 if ple else 0, vocab_size_per_layer_input=128, num_kv_shared_layers=kv_shared,
        attention_k_eq_v=True, num_global_key_value_heads=1, use_double_wide_mlp=True, attn_implementation="eager",
    )
    if moe:
        kw.update(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16)
    kw.update(overrides)
    cfg = transformers.Gemma4TextConfig(**kw)
    torch.manual_seed(seed)
    model = transformers.Gemma4ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(("router.scale", "per_expert_scale")):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
        for layer in model.model.layers:
            layer.layer_scalar.copy_(0.5 + torch.rand(1, generator=g))
    for p in model.parameters():
        p.data = p.data.to(dtype)
    for layer in model.model.layers:
        layer.layer_scalar.data = layer.layer_scalar.data.to(dtype)
    return model


def spec_inv_freq(cfg, layer_type: str, where="cpu") -> torch.Tensor:
    """fp32 frequencies of ``layer_type`` evaluated on ``where``: default RoPE over the layer type's
    head size, or proportional (the first ``partial_rotary_factor`` of the angles, zeros after)."""
    rp = cfg.rope_parameters[layer_type]
    d = cfg.per_layer_config[layer_type].head_dim
    angles = int(rp.get("partial_rotary_factor", 1.0) * d // 2) if rp["rope_type"] == "proportional" else d // 2
    exponent = torch.arange(0, 2 * angles, 2, dtype=torch.int64).to(device=where, dtype=torch.float) / d
    inv_freq = 1.0 / (rp["rope_theta"] ** exponent)
    return torch.cat((inv_freq, torch.zeros(d // 2 - angles, device=where)))


def spec_norm(v, weight, eps, pts, lp, out=None, variance_of=None):
    """(v * rstd) * RN(w) of the fp32 value ``v`` in the plain norm's reduction order; ``weight``
    None: v * rstd, rounded once. ``variance_of``: the fp32 value whose mean square gives rstd
    (default ``v``), for a norm whose reduction reads another value than its normalisation does."""
    u = v if variance_of is None else variance_of
    if pts["norm_reduction"] == "vllm_block":
        mean_square = vllm_mean_square(u, u.numel() // u.shape[-1], False)
    else:
        mean_square = (u * u).mean(-1, keepdim=True)
    n = v * torch.rsqrt(mean_square + eps)
    if weight is None:
        return n.to(out or lp)
    w = rn(weight.float(), lp)
    if pts["norm_weight"] == "per_op":
        return (w * rn(n, lp)).to(out or lp)
    return (n * w).to(out or lp)


def _norm(module, v, pts, lp, out=None, variance_of=None):
    return spec_norm(v.float(), module.weight if module.with_scale else None, module.eps, pts, lp, out, variance_of)


def _attention(attn, h, cos, sin, pts, lp, shared: dict):
    modeling = sys.modules[type(attn).__module__]
    B, S, _ = h.shape
    shape = (B, S, -1, attn.head_dim)
    qk_out = torch.float32 if pts["qk_norm_out"] == "fp32" else None
    q = F.linear(h, attn.q_proj.weight).view(shape).transpose(1, 2)
    q = spec_rope(_norm(attn.q_norm, q, pts, lp, qk_out), cos, sin, pts, lp)
    if attn.is_kv_shared_layer:
        k, v = shared[attn.layer_type]
    else:
        k = F.linear(h, attn.k_proj.weight).view(shape).transpose(1, 2)
        v = k if attn.v_proj is None else F.linear(h, attn.v_proj.weight).view(shape).transpose(1, 2)
        k = spec_rope(_norm(attn.k_norm, k, pts, lp, qk_out), cos, sin, pts, lp)
        v = _norm(attn.v_norm, v, pts, lp)
    if attn.store_full_length_kv:
        shared[attn.layer_type] = (k, v)
    out, _ = modeling.eager_attention_forward(attn, q, k, v, _mask(S, attn.sliding_window, lp, h.device), dropout=0.0,
                                              scaling=attn.scaling, sliding_window=attn.sliding_window)
    return F.linear(out.reshape(B, S, -1).contiguous(), attn.o_proj.weight)


def _ple_inputs(body, ids, x, pts, lp, fp32: bool = False):
    """HF's per-layer inputs (its lookup and its scale constants, outside the regions) with the
    projection's norm under the points. ``fp32``: the chain as one fp32 expression rounded once at
    the end, ``(norm(G * ps) + E * es) * s`` with ``G`` the projection GEMM's bf16 output, ``E`` the
    looked-up rows and the scales as the model holds them (what vLLM's compiled first piece computes
    on the CPU: tests/engines/test_vllm_twin_families.py)."""
    cfg = body.config
    shape = (*x.shape[:-1], cfg.num_hidden_layers, cfg.hidden_size_per_layer_input)
    if fp32:
        table = body.embed_tokens_per_layer
        looked_up = F.embedding(ids, table.weight, table.padding_idx).float() * table.embed_scale.to(
            table.weight.dtype).float()
        proj = F.linear(x, body.per_layer_model_projection.weight).float() * _as_float(
            body.per_layer_model_projection_scale)
        proj = _norm(body.per_layer_projection_norm, proj.reshape(shape), pts, lp, torch.float32)
        return ((proj + looked_up.reshape(shape)) * _as_float(body.per_layer_input_scale)).to(lp)
    looked_up = body.get_per_layer_inputs(ids, None)
    proj = F.linear(x, body.per_layer_model_projection.weight) * body.per_layer_model_projection_scale
    proj = proj.reshape(shape)
    proj = _norm(body.per_layer_projection_norm, proj, pts, lp)
    return (proj + looked_up) * body.per_layer_input_scale


def _as_float(scale):
    return scale.float() if isinstance(scale, torch.Tensor) else float(scale)


#: The chains :func:`spec_forward` can add to the points (``chains=``): what vLLM 0.33's compiled Gemma 4
#: graph computes on the CPU (tests/engines/test_vllm_twin_families.py) where the row's points say otherwise.
CHAINS = ("ple_fp32", "ple_add_rounded", "stream_variance_fp32", "embed_fp32", "embed_variance_fp32")


def chains_of(pts) -> tuple[str, ...]:
    """The chains the model-body points of ``pts`` say (:data:`CHAIN_OF`; none where ``pts`` names none)."""
    return tuple(chain for p, (first, chain) in CHAIN_OF.items() if pts.get(p, first) != first)


def spec_forward(model, input_ids, pts, positions=None, streams=None, chains=None) -> torch.Tensor:
    """Logits of ``model`` (a Gemma4ForCausalLM) computed under the points ``pts`` at ``positions``
    (default 0..S-1); under ``pts['post_norm_out'] == 'fp32'`` (``round`` where ``pts`` does not
    say) the post-attention, post-feed-forward and post-per-layer-input norms hand the add after them
    their fp32 output. ``streams``: a list that receives each layer's output, rounded (as the engine
    twin records it). ``chains`` (of :data:`CHAINS`):

    - ``ple_fp32``: the per-layer inputs as one fp32 expression rounded once (:func:`_ple_inputs`);
    - ``ple_add_rounded``: under ``fp32_carry`` the per-layer-input add reads RN(s), the value the
      gate's GEMM reads, not the carried fp32 sum;
    - ``stream_variance_fp32``: under ``fp32_sum`` the norm after a layer (the next input norm, the
      final norm) takes its mean square from the fp32 ``sum * scalar`` and normalises its rounding;
    - ``embed_fp32``: the first input norm reads the embedding times its bf16 scale unrounded;
      ``embed_variance_fp32``: only its mean square does, it normalises the rounded product (the
      residual is the rounded product either way).

    ``chains`` None: those the points say (:func:`chains_of`)."""
    chains = chains_of(pts) if chains is None else chains
    unknown = set(chains) - set(CHAINS)
    if unknown:
        raise ValueError(f"unknown chains {sorted(unknown)}; known: {CHAINS}")
    body, cfg = model.model, model.config
    pts = at_head_size(pts, cfg.per_layer_config[0].head_dim)  # the row's head-size rule (align_spec.Row)
    lp = body.embed_tokens.weight.dtype
    device = input_ids.device
    where = device if pts["rope_inv_freq"] == "device" else torch.device("cpu")
    if positions is None:
        positions = torch.arange(input_ids.shape[1], device=device)[None].expand(input_ids.shape[0], -1)
    tables = {}
    for t in set(cfg.layer_types):
        freqs = positions[..., None].float() * spec_inv_freq(cfg, t, where).to(device)
        emb = torch.cat((freqs, freqs), dim=-1)
        tables[t] = (emb.cos(), emb.sin())
    fp32_sum = pts["norm_residual"] == "fp32_sum"
    carry = pts["residual_stream"] == "fp32_carry"
    post = torch.float32 if pts.get("post_norm_out", "round") == "fp32" else None
    x = body.embed_tokens(input_ids)  # HF's scaled embedding (left as is)
    ple = (_ple_inputs(body, input_ids, x, pts, lp, "ple_fp32" in chains) if cfg.hidden_size_per_layer_input
           else None)
    s, shared = x.float(), {}  # s: what the next norm reads (the fp32 value, or the embeddings)
    split = "stream_variance_fp32" in chains and fp32_sum
    for i, layer in enumerate(body.layers):
        r = rn(s, lp)
        if i == 0 and {"embed_fp32", "embed_variance_fp32"} & set(chains):  # F.embedding(ids, w) * RN(scale)
            table = body.embed_tokens
            unrounded = F.embedding(input_ids, table.weight, table.padding_idx).float() * table.embed_scale.to(lp).float()
            if "embed_fp32" in chains:
                h = _norm(layer.input_layernorm, unrounded, pts, lp)
            else:
                h = _norm(layer.input_layernorm, r, pts, lp, variance_of=unrounded)
        elif i > 0 and split:
            h = _norm(layer.input_layernorm, r, pts, lp, variance_of=s)
        else:
            h = _norm(layer.input_layernorm, s if fp32_sum else r, pts, lp)
        a = _attention(layer.self_attn, h, *tables[cfg.layer_types[i]], pts, lp, shared)
        a = _norm(layer.post_attention_layernorm, a, pts, lp, post)
        s1 = a.float() + r
        r1 = rn(s1, lp).to(lp)
        h = _norm(layer.pre_feedforward_layernorm, s1 if fp32_sum else r1, pts, lp)
        mlp = layer.mlp
        m = F.linear(spec_geglu(F.linear(h, mlp.gate_proj.weight), F.linear(h, mlp.up_proj.weight), pts),
                     mlp.down_proj.weight)
        if layer.enable_moe_block:  # HF's router and experts, reading the rounded sum as in HF
            flat = r1.reshape(-1, r1.shape[-1])
            _, weights, index = layer.router(flat)
            e = _norm(layer.pre_feedforward_layernorm_2, (s1 if fp32_sum else r1).reshape(flat.shape), pts, lp)
            e = layer.experts(e, index, weights).reshape(r1.shape)
            m = _norm(layer.post_feedforward_layernorm_1, m, pts, lp) + _norm(layer.post_feedforward_layernorm_2, e,
                                                                              pts, lp)
        m = _norm(layer.post_feedforward_layernorm, m, pts, lp, post)
        s = (s1 if carry else r1.float()) + m.float()
        if ple is not None:
            rounded = rn(s, lp).to(lp)
            y = spec_geglu(F.linear(rounded, layer.per_layer_input_gate.weight), ple[:, :, i, :],
                           {"swiglu": pts["ple_swiglu"]})
            y = _norm(layer.post_per_layer_input_norm, F.linear(y, layer.per_layer_projection.weight), pts, lp, post)
            s = (s if carry and "ple_add_rounded" not in chains else rounded.float()) + y.float()
        scalar = layer.layer_scalar.float()
        if fp32_sum:
            s = s * scalar
        elif carry:
            s = rn(s * scalar, lp)
        else:
            s = rn(rn(s, lp) * scalar, lp)
        if streams is not None:
            streams.append(rn(s, lp).to(lp))
    if split:
        h = _norm(body.norm, rn(s, lp), pts, lp, variance_of=s)
    else:
        h = _norm(body.norm, s if fp32_sum else rn(s, lp), pts, lp)
    logits = F.linear(h, model.lm_head.weight)
    cap = cfg.final_logit_softcapping  # HF's softcap (left as is)
    return logits if cap is None else torch.tanh(logits / cap) * cap
