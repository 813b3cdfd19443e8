"""The model families ``rla.align`` supports, and the little that differs between them.

The Llama-shaped ones share one skeleton (transformers 5.x): ``<Prefix>Model`` holds ``embed_tokens``,
``layers`` of ``<Prefix>DecoderLayer`` (``input_layernorm`` -> ``self_attn`` -> add ->
``post_attention_layernorm`` -> ``mlp`` -> add), a final ``norm`` and one ``rotary_emb``; the
attention calls the module-global ``apply_rotary_pos_emb``; norms are ``<Prefix>RMSNorm`` with
``variance_epsilon``. What differs is the class-name prefix, whether attention has ``q_norm`` /
``k_norm`` (Qwen3), and whether ``mlp`` is a dense SwiGLU MLP or a sparse MoE block whose
``experts`` hold a 3-D ``gate_up_proj`` (plus, for Qwen2-MoE, a dense ``shared_expert``; for
DeepSeek-V3, ``shared_experts``). DeepSeek-V3's attention is MLA (``mla``): two more RMSNorms inside
it (``q_a_layernorm``, ``kv_a_layernorm``) and RoPE on the rope half of q/k, interleaved or not
(``rla.alignment.mla``).

Gemma 3's text model (``gemma3_text``; the multimodal ``gemma3`` is not registered) has another layer shape
(``layout='gemma3'``, aligned by ``rla.alignment.gemma``); Gemma 4's (``gemma4_text``; the multimodal
``gemma4`` is not registered) its own (``layout='gemma4'``, ``rla.alignment.gemma4``); Qwen3.5's dense and
MoE text models (``qwen3_5_text``, ``qwen3_5_moe_text``; the multimodal ``qwen3_5``, ``qwen3_5_moe`` are not
registered) theirs (``layout='qwen3_5'``, ``rla.alignment.qwen3_5``).

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

    body: str | None = None
    """Class name of the decoder body when it is not ``<Prefix>Model`` (Gemma 3: ``Gemma3TextModel``)."""

    layout: str = "llama"
    """The decoder layer's shape: ``llama`` (input norm, attention, add, post-attention norm, MLP,
    add) or ``gemma3`` (zero-centred norms before *and* after each sub-block, a GeGLU MLP, one
    rotary module with a table per layer type; ``rla.alignment.gemma``) or ``gemma4`` (Gemma 3's
    sandwich with plain ``x * w`` norms, a value norm, per-layer inputs, a layer scalar;
    ``rla.alignment.gemma4``)."""

    moe_block: str | None = None
    """Class-name suffix of the MoE block when it is not ``SparseMoeBlock`` (GPT-OSS: ``MLP``,
    every layer's MLP being its MoE block; then no dense MLP exists)."""

    experts_gate: str = "swiglu"
    """The experts' gated activation: ``swiglu`` (silu(gate) * up, concatenated 3-D weights) or
    ``clamped_swiglu`` (GPT-OSS: interleaved gate/up with biases, ``alpha`` and ``limit``)."""

    partial_rotary: bool = False
    """RoPE rotates the first ``head_dim * partial_rotary_factor`` dims of each head (GLM-4 MoE)."""

    qk_norm_optional: bool = False
    """The q/k norms exist only when the config says so (GLM-4 MoE's ``use_qk_norm``)."""

    min_transformers: str | None = None
    """The oldest transformers whose layout of this family rla.align was checked on (older ones lay
    it out otherwise: 5.5.3's GPT-OSS RoPE takes position_ids, its Qwen3.5 layers name their mixer
    ``layer_type``, its GLM-4 MoE experts are ``Glm4MoeNaiveMoe``); refused below it."""

    variant: str | None = None
    """The rows' variant (:data:`rla.profiles.VARIANTS`) that holds for this family's modules."""

    router: str = "softmax"
    """The router's kind: ``softmax`` top-k (``gate.weight``, ``top_k``, ``norm_topk_prob``) or
    ``sigmoid_grouped`` (DeepSeek-V3: sigmoid scores, ``e_score_correction_bias``, grouped top-k,
    ``routed_scaling_factor``)."""

    mla: bool = False
    """Attention is DeepSeek's multi-head latent attention (``rla.alignment.mla``): ``q_a_layernorm``
    (absent without a q LoRA) and ``kv_a_layernorm`` RMSNorms inside it, RoPE on the last
    ``qk_rope_head_dim`` dims of q and the shared k, HF's ``apply_rotary_pos_emb_interleave`` when
    ``config.rope_interleave``."""

    regions: tuple[str, ...] | None = None
    """The regions ``rla.align`` supports for this family (None: all)."""

    def unsupported(self, regions) -> tuple[str, ...]:
        """The regions of ``regions`` ``rla.align`` does not support for this family, in their order."""
        return () if self.regions is None else tuple(r for r in regions if r not in self.regions)

    def cls(self, role: str) -> str:
        """Class name of a role: ``rotary`` -> ``Qwen2RotaryEmbedding`` and so on."""
        if role == "body":
            return self.body or self.prefix + "Model"
        if role == "moe" and self.moe_block:
            return self.prefix + self.moe_block
        return self.prefix + _ROLE_SUFFIX[role]

    @property
    def dense_mlp(self) -> bool:
        """Whether a layer's ``mlp`` can be a dense SwiGLU MLP (``<Prefix>MLP``)."""
        return self.moe_block != "MLP"


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
        Family("gpt_oss", "GptOss", moe=True, moe_block="MLP", experts_gate="clamped_swiglu", variant="gpt_oss",
               regions=("rope", "swiglu", "rmsnorm"),
               min_transformers="5.24"),
        Family("glm4_moe", "Glm4Moe", qk_norm=True, qk_norm_optional=True, moe=True, moe_block="MoE",
               shared_expert="shared_experts", partial_rotary=True, min_transformers="5.24",
               regions=("rope", "swiglu", "rmsnorm")),
        Family("gemma3_text", "Gemma3", qk_norm=True, body="Gemma3TextModel", layout="gemma3",
               variant="zero_centred_norm"),
        Family("gemma4_text", "Gemma4Text", qk_norm=True, body="Gemma4TextModel", layout="gemma4", variant="gemma4",
               regions=("rope", "swiglu", "rmsnorm"), min_transformers="5.24"),
        Family("qwen3_5_text", "Qwen3_5", qk_norm=True, body="Qwen3_5TextModel", layout="qwen3_5", variant="qwen3_5",
               min_transformers="5.24"),
        Family("qwen3_5_moe_text", "Qwen3_5Moe", qk_norm=True, moe=True, shared_expert="shared_expert",
               body="Qwen3_5MoeTextModel", layout="qwen3_5", variant="qwen3_5", min_transformers="5.24"),
        Family("deepseek_v3", "DeepseekV3", moe=True, shared_expert="shared_experts", moe_block="MoE",
               router="sigmoid_grouped", mla=True, min_transformers="5.24"),
    )
}


def get_family(model_type: str | None, what: str = "this model") -> Family:
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise NotImplementedError(
            f"rla.align does not support {what} (config.model_type={model_type!r}). Supported "
            f"families: {', '.join(FAMILIES)} (Llama, Mistral, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE, "
            "Mixtral, GPT-OSS, GLM-4 MoE, Gemma 3's, Gemma 4's, Qwen3.5's and Qwen3.5 MoE's text models, DeepSeek-V3). rla.ops has the aligned RoPE, SwiGLU and RMSNorm for other "
            "models; docs/families.md says what each newer family needs."
        ) from None


def class_named(module: torch.nn.Module, name: str) -> type | None:
    """The class called ``name`` in ``module``'s MRO (sees through FSDP2's ``FSDP<Class>``)."""
    for klass in type(module).__mro__:
        if klass.__name__ == name:
            return klass
    return None
