"""Qwen3.5, dense (``qwen3_5_text``) and MoE (``qwen3_5_moe_text``): its full-attention layers aligned,
its linear-attention layers' mixers left as they are.

The layer shape is Llama's (input norm, token mixer, add, post-attention norm, SwiGLU MLP, add),
with three differences (``docs/families.md``):

- **Zero-centred RMSNorm** ``x * rstd * (1 + w)`` everywhere (``Qwen3_5RMSNorm``: the layers',
  the final one, the q/k norms), under the rows' ``qwen3_5`` variant, which extends
  ``zero_centred_norm`` (Gemma 3's, ``rla.alignment.gemma``; vLLM imports ``GemmaRMSNorm as
  Qwen3_5RMSNorm``) with the points of Qwen3.5's gated attention: SGLang 0.5.23 runs its q/k norms
  and partial RoPE as one Triton kernel reading the fp32 cache at every head size, so the row's
  head-size rule does not hold there; vLLM 0.26 and 0.33 run theirs as one Triton kernel in both
  modes, rounding the norm before the rotation, so the default rows' ``qk_norm_out='fp32'`` does not
  hold there (docs/families.md).
- **Partial rotary**: the rotary tables cover ``head_dim * partial_rotary_factor`` dims; the aligned
  ``apply_rotary_pos_emb`` rotates ``q[..., :rotary_dim]`` with ``rla.ops.rope`` and passes the rest
  through (rounded to the stack dtype where the q/k norm handed it on unrounded). The rotary
  module's mRoPE recomposition (``recomposition_frequencies``, HF's own method) runs on the fp32
  tables; for text every section reads the same positions.
- **Two token mixers**: ``self_attn`` (gated: ``attn * sigmoid(gate)``, in the swiglu region through
  ``rla.ops.attn_gate`` under the variant's ``attn_gate`` point: the forward rebuilt from HF's source,
  ``rla.alignment.attn_gate``) or ``linear_attn`` (Gated DeltaNet with its own gated norm, left as
  is: the engines run FLA's kernels for the mixer). The aligned layer calls the one the layer has,
  with HF's arguments.

The MoE model (``qwen3_5_moe_text``) has the same layers with every ``mlp`` a sparse MoE block of
Qwen2-MoE's shape: a softmax top-k router that always renormalises, 3-D experts, and a dense
``shared_expert`` scaled by ``sigmoid(shared_expert_gate(x))`` and added to the routed sum. The
``swiglu`` region takes the routed experts' and the shared expert's products (``rla.alignment.swiglu``),
the opt-in ``router`` region the routing and weighted sum (``rla.alignment.router``, which calls the
shared expert and its gate as HF does); the shared expert's gate is left as HF computes it
(:data:`MOE_LEFT_AS_IS` says what each engine does there), its add to the routed sum is the rows'
``moe_out`` point (``rla.alignment.moe_out``, with the rmsnorm region).
"""

from __future__ import annotations

import sys
import types

import torch

from rla import ops
from rla.alignment import compat, moe_out
from rla.alignment.attn_gate import gated_forward
from rla.alignment.families import Family, class_named
from rla.alignment.gemma import align_zero_centred_layers, zero_centred_variant
from rla.alignment.patch import install, uninstall, with_globals
from rla.alignment.moe_out import hands_fp32
from rla.alignment.rmsnorm import layer_start, residual_source
from rla.alignment.rope import make_apply_partial_rotary
from rla.alignment.router import align_router_region, moe_blocks
from rla.alignment.routed_experts import experts_profile
from rla.alignment.swiglu import align_experts, align_mlps, check_activation, check_experts
from rla.profiles import RoundingProfile

__all__ = ["align_qwen3_5", "LEFT_AS_IS", "MOE_LEFT_AS_IS", "GATE_LEFT"]

#: What the alignment of a Qwen3.5 model leaves to HF's code, and why (printed in the report).
LEFT_AS_IS = [
    "left as is: the linear-attention (Gated DeltaNet) layers' mixer and its gated RMSNorm (vLLM and SGLang run "
    "FLA kernels; SGLang 0.5.23's gated norm multiplies weight and silu(gate) in fp32 and rounds once, where HF "
    "rounds x * rstd first: not aligned with the mixer left as is)",
]

#: The report's note when the swiglu region, which aligns the attention output gate, is not aligned.
GATE_LEFT = ("left as is: the attention output gate attn * sigmoid(gate), HF's two roundings (the swiglu region "
             "aligns it to the row's attn_gate point: SGLang 0.5.23 and vLLM's compiled graph round it once)")

#: What the alignment of a Qwen3.5 MoE model leaves as it is beyond :data:`LEFT_AS_IS` (docs/families.md).
MOE_LEFT_AS_IS = [
    "left as is: the shared expert's gate, RN(RN(sigmoid(RN(x W_s))) * shared) on bf16 tensors as HF computes it; "
    "vLLM 0.26/0.33 compute the same ops (Qwen2MoeMLP.forward with expert_gate, eager inside its opaque fused-MoE op in "
    "both modes) and add the result to the routed sum outside the op (the rows' moe_out point); SGLang 0.5.23 on CUDA "
    "fuses the gate's fp32 dot product, sigmoid, product and add in one Triton kernel rounded once "
    "(fused_gate_sigmoid_mul_add), which no row expresses",
    "vLLM runs the routed experts' activation inside its fused MoE with the CUDA silu_and_mul kernel in both modes "
    "(per_op): the rows' moe_experts variant, which the aligned routed experts follow",
]


def _expect(module, family: Family, role: str, where: str):
    name = family.prefix + "TextRotaryEmbedding" if role == "rotary" else family.cls(role)
    if module is None or class_named(module, name) is None:
        raise NotImplementedError(
            f"rla.align: expected a {name} at {where}, found {type(module).__name__}. transformers "
            f"{compat.TRANSFORMERS_VERSION} may lay out Qwen3.5 differently from src/rla/alignment/qwen3_5.py."
        )
    return module


def _moe(mlp, family: Family, where: str, found: dict) -> None:
    """An MoE layer's ``mlp``: its experts and its gated shared expert, for the swiglu region."""
    _expect(mlp, family, "moe", where)
    found["experts"].append(_expect(getattr(mlp, "experts", None), family, "experts", f"{where}.experts"))
    found["shared_experts"].append(_expect(getattr(mlp, "shared_expert", None), family, "mlp", f"{where}.shared_expert"))
    gate = getattr(mlp, "shared_expert_gate", None)
    if not isinstance(gate, torch.nn.Linear) or gate.out_features != 1:
        raise NotImplementedError(f"rla.align: expected a Linear(hidden, 1) at {where}.shared_expert_gate, found "
                                  f"{type(gate).__name__}; src/rla/alignment/qwen3_5.py reads 5.24's MoE block")


def _scan(body, family: Family) -> dict:
    rotary = _expect(getattr(body, "rotary_emb", None), family, "rotary", "model.rotary_emb")
    if getattr(rotary, "rope_type", None) != "default":
        raise NotImplementedError(f"rla.align: Qwen3.5 rope type {rotary.rope_type!r}; the aligned rotary computes 'default'")
    found = {"rotary": rotary, "layers": list(body.layers), "attentions": [], "norms": [], "qk_norms": [], "mlps": [],
             "experts": [], "shared_experts": [],
             "final": _expect(getattr(body, "norm", None), family, "norm", "model.norm")}
    if not found["layers"]:
        raise NotImplementedError("rla.align: the model has no decoder layers")
    for i, layer in enumerate(found["layers"]):
        where = f"model.layers[{i}]"
        _expect(layer, family, "layer", where)
        if layer.block_type == "full_attention":
            attn = _expect(getattr(layer, "self_attn", None), family, "attention", f"{where}.self_attn")
            found["attentions"].append(attn)
            for name in ("q_norm", "k_norm"):
                found["qk_norms"].append(_expect(getattr(attn, name, None), family, "norm", f"{where}.self_attn.{name}"))
        elif layer.block_type != "linear_attention":
            raise NotImplementedError(f"rla.align: {where} is a {layer.block_type!r} layer")
        for name in ("input_layernorm", "post_attention_layernorm"):
            found["norms"].append(_expect(getattr(layer, name, None), family, "norm", f"{where}.{name}"))
        if family.moe:  # every layer's mlp is the sparse MoE block
            _moe(getattr(layer, "mlp", None), family, f"{where}.mlp", found)
        else:
            found["mlps"].append(_expect(getattr(layer, "mlp", None), family, "mlp", f"{where}.mlp"))
    return found


def _rotary_forward(self, x, position_ids):
    state = self.__dict__["_rla_rotary"]
    device = x.device
    if device not in state["inv_freq"]:
        if state["evaluate_on"] == "device" and device.type != "cpu":  # HF's init evaluates on the CPU
            inv_freq = compat._default_rope_on(self.config, device)
        else:
            inv_freq = self.compute_default_rope_parameters(self.config, torch.device("cpu"))[0]
        state["inv_freq"][device] = inv_freq.float().to(device)
    position_ids = position_ids.expand(3, -1, -1)
    freqs = position_ids[..., None].to(torch.float32) * state["inv_freq"][device]
    cos, sin = freqs.cos(), freqs.sin()
    if self.attention_scaling != 1.0:
        cos, sin = cos * self.attention_scaling, sin * self.attention_scaling
    cos, sin = self.recomposition_frequencies(cos), self.recomposition_frequencies(sin)  # HF's own layout
    if state["round_tables"]:
        lp = x.dtype
        if lp == torch.float32 and torch.is_autocast_enabled(device.type):
            lp = torch.get_autocast_dtype(device.type)
        cos, sin = cos.to(lp), sin.to(lp)
    return cos, sin


def _attention_forwards(found: dict, family: Family, p: RoundingProfile, regions) -> dict:
    """Each attention class's rebuilt ``forward`` (none when neither region touches it): the rope
    region's partial rotary, the swiglu region's output gate (refused before anything is patched)."""
    if not {"rope", "swiglu"} & set(regions):
        return {}
    rebuilt = {}
    for attn in found["attentions"]:
        klass = class_named(attn, family.cls("attention"))
        if klass not in rebuilt:
            modeling = sys.modules[klass.__module__]
            replacements = ({"apply_rotary_pos_emb": make_apply_partial_rotary(p, half_tables=False)}
                            if "rope" in regions else {})
            rebuilt[klass] = (gated_forward(klass, p, replacements) if "swiglu" in regions
                              else with_globals(klass.forward, modeling.__dict__, replacements))
    return rebuilt


def _layer_forward(profile: RoundingProfile, index: int, names, defaults):
    fp32_sum = profile.norm_residual == "fp32_sum"
    carry = profile.residual_stream == "fp32_carry"
    reads_sum = fp32_sum and index > 0

    def forward(self, hidden_states, *args, **kwargs):
        kwargs, lp, residual, h = layer_start(self, hidden_states, args, kwargs, names, defaults, reads_sum, index,
                                              profile)
        if self.block_type == "linear_attention":  # HF's call: no positions for the recurrent mixer
            kwargs.pop("position_embeddings", None)
            kwargs.pop("position_ids", None)
            attn_out = self.linear_attn(hidden_states=h, **kwargs)
        else:
            attn_out = self.self_attn(hidden_states=h, **kwargs)[0]
        attn_out = attn_out.to(lp)
        norm = self.post_attention_layernorm
        h, rounded = ops.add_rms_norm(attn_out, residual, norm.weight, norm.eps, profile, weight_offset=1.0,
                                      residual_source=residual_source(hidden_states, residual, reads_sum))
        mlp_out = self.mlp(h)
        fp32_moe = hands_fp32(self.mlp)  # moe_out='fp32': the block's fp32 shared + routed, read unrounded
        if not fp32_moe:
            mlp_out = mlp_out.to(lp)
        if carry:
            return ops.carry_add(attn_out, residual, mlp_out, torch.float32 if fp32_sum else lp)
        if fp32_sum:
            return mlp_out.to(torch.float32, copy=True).add_(rounded)
        return (mlp_out + rounded).to(lp)

    return compat.with_layer_checkpointing(forward)


def align_qwen3_5(body, family: Family, profile: RoundingProfile, regions: tuple[str, ...], report) -> None:
    """Align a Qwen3.5 text body (dense or MoE) in ``regions`` under ``profile``'s variant for it
    (``family.variant``, ``qwen3_5``: the zero-centred norms' points and its attention's); refuses before
    patching anything it cannot do."""
    found = _scan(body, family)
    if "swiglu" in regions:
        check_activation(body.config)
        for experts in found["experts"]:
            check_experts(experts)
    p, chain = zero_centred_variant(profile, regions, report, "Qwen3.5's zero-centred norms (x * (1 + w)) and "
                                    "gated attention", kind=family.variant)
    linear = sum(layer.block_type == "linear_attention" for layer in found["layers"])
    rebuilt = _attention_forwards(found, family, p, regions)
    try:
        for attn in found["attentions"] if rebuilt else ():
            klass = class_named(attn, family.cls("attention"))
            install(attn, "attention", {"forward": types.MethodType(rebuilt[klass], attn)})
        if "rope" in regions:
            rotary = found["rotary"]
            state = {"inv_freq": {}, "evaluate_on": p.rope_inv_freq, "round_tables": chain}
            install(rotary, "rotary", {"forward": types.MethodType(_rotary_forward, rotary), "_rla_rotary": state})
            report.counts["rope"] = {"rotary_emb (partial)": 1, "self_attn": len(found["attentions"])}
        if "swiglu" in regions:
            align_mlps(found["mlps"] + found["shared_experts"], p)
            if found["experts"]:
                align_experts(found["experts"], experts_profile(profile, p, report))
            report.counts["swiglu"] = ({"experts": len(found["experts"]), "shared_expert": len(found["shared_experts"])}
                                       if family.moe else {"mlp": len(found["mlps"])})
            report.counts["swiglu"]["attention output gate"] = len(found["attentions"])
        if "rmsnorm" in regions:
            align_zero_centred_layers(found, family, p, chain, _layer_forward, report)
        moe_fp32 = "rmsnorm" in regions and family.moe and moe_out.fp32_sum(profile, p, family)
        if moe_fp32 and "router" not in regions:
            moe_out.align_blocks(moe_blocks(body, family), family, report)
        if "router" in regions:
            align_router_region(moe_blocks(body, family), family, p, report, fp32_out=moe_fp32)
    except BaseException:
        for m in body.modules():
            uninstall(m)
        raise
    report.notes.append(f"{linear} of {len(found['layers'])} layers are linear attention: their norms, MLP and adds "
                        "are aligned, their mixer is not")
    report.notes.extend(LEFT_AS_IS)
    if "swiglu" not in regions:
        report.notes.append(GATE_LEFT)
    if family.moe:
        if "router" not in regions:
            report.notes.append("left as is: the router (softmax top-k, renormalised) and the experts' weighted sum "
                                "are HF's; regions=(..., 'router') aligns them to the row's router points")
        report.notes.extend(MOE_LEFT_AS_IS if "swiglu" in regions else MOE_LEFT_AS_IS[:1])
