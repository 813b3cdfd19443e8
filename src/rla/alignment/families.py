"""The model families ``rla.align`` supports, and the little that differs between them.

All eight share one skeleton (transformers 5.x): ``<Prefix>Model`` holds ``embed_tokens``,
``layers`` of ``<Prefix>DecoderLayer`` (``input_layernorm`` -> ``self_attn`` -> add ->
``post_attention_layernorm`` -> ``mlp`` -> add), a final ``norm`` and one ``rotary_emb``; the
attention calls the module-global ``apply_rotary_pos_emb``; norms are ``<Prefix>RMSNorm`` with
``variance_epsilon``. What differs is the class-name prefix, whether attention has ``q_norm`` /
``k_norm`` (Qwen3), and whether ``mlp`` is a dense SwiGLU MLP or a sparse MoE block whose
``experts`` hold a 3-D ``gate_up_proj`` (plus, for Qwen2-MoE, a dense ``shared_expert``; for
DeepSeek-V3, ``shared_experts``, whose MLA attention is outside what ``rla.align`` aligns: only its
MoE regions are).

Modules are recognised by class name anywhere in their MRO, so FSDP2's ``FSDP<Class>`` subclasses
and PEFT-wrapped models are found too. A new family of the same skeleton is one row here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Family", "FAMILIES", "get_family", "class_named"]


@dataclass(frozen=True)
class Family:
    """What ``rla.align`` needs to know about one ``config.model_type``."""

    model_type: str
    """``config.model_type`` as transformers writes it."""

    prefix: str
    """Class-name prefix: ``Qwen2Moe`` for ``Qwen2MoeDecoderLayer``, ``Qwen2MoeAttention``, ..."""

    qk_norm: bool = False
    """Attention normalises q and k per head (``self_attn.q_norm`` / ``k_norm``) before RoPE."""

    moe: bool = False
    """Some decoder layers' ``mlp`` is ``<Prefix>SparseMoeBlock`` with ``experts`` (3-D weights)."""

    shared_expert: str | None = None
    """Attribute of the MoE block holding a dense SwiGLU MLP that every token goes through."""

    moe_block: str = "SparseMoeBlock"
    """Class-name suffix of the MoE block (``DeepseekV3MoE``: ``MoE``)."""

    router: str = "softmax"
    """The router's kind: ``softmax`` top-k (``gate.weight``, ``top_k``, ``norm_topk_prob``) or
    ``sigmoid_grouped`` (DeepSeek-V3: sigmoid scores, ``e_score_correction_bias``, grouped top-k,
    ``routed_scaling_factor``)."""

    regions: tuple[str, ...] | None = None
    """The regions ``rla.align`` supports for this family (None: all). DeepSeek-V3's attention (MLA,
    with its own RoPE and q/kv norms) is not aligned, so only its MoE regions are."""

    def cls(self, role: str) -> str:
        """Class name of a role: ``rotary`` -> ``Qwen2RotaryEmbedding`` and so on."""
        return self.prefix + (self.moe_block if role == "moe" else _ROLE_SUFFIX[role])


_ROLE_SUFFIX = {
    "rotary": "RotaryEmbedding",
    "layer": "DecoderLayer",
    "attention": "Attention",
    "norm": "RMSNorm",
    "mlp": "MLP",
    "moe": "SparseMoeBlock",
    "experts": "Experts",
}

FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("llama", "Llama"),
        Family("mistral", "Mistral"),
        Family("qwen2", "Qwen2"),
        Family("qwen3", "Qwen3", qk_norm=True),
        Family("qwen2_moe", "Qwen2Moe", moe=True, shared_expert="shared_expert"),
        Family("qwen3_moe", "Qwen3Moe", qk_norm=True, moe=True),
        Family("mixtral", "Mixtral", moe=True),
        Family("deepseek_v3", "DeepseekV3", moe=True, shared_expert="shared_experts", moe_block="MoE",
               router="sigmoid_grouped", regions=("swiglu", "router")),
    )
}


def get_family(model_type: str | None, what: str = "this model") -> Family:
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise NotImplementedError(
            f"rla.align does not support {what} (config.model_type={model_type!r}). Supported "
            f"families: {', '.join(FAMILIES)} (Llama, Mistral, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE, "
            "Mixtral; DeepSeek-V3's MoE regions). rla.ops has the aligned RoPE, SwiGLU and RMSNorm for other models."
        ) from None


def class_named(module: torch.nn.Module, name: str) -> type | None:
    """The class called ``name`` in ``module``'s MRO (sees through FSDP2's ``FSDP<Class>``)."""
    for klass in type(module).__mro__:
        if klass.__name__ == name:
            return klass
    return None
