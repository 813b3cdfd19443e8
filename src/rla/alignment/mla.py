"""DeepSeek-V3's multi-head latent attention (MLA): what ``rla.align`` aligns in it, and what it leaves.

HF 5.24's ``DeepseekV3Attention.forward`` (``models/deepseek_v3/modeling_deepseek_v3.py``; docs/families.md
sets the engines' code beside it)::

    q = q_b_proj(q_a_layernorm(q_a_proj(h)))              # q_proj(h) where q_lora_rank is None
    q_pass, q_rot = split(q, [qk_nope_head_dim, qk_rope_head_dim])
    kv_nope, k_rot = split(kv_a_proj_with_mqa(h), [kv_lora_rank, qk_rope_head_dim])
    kv_nope = kv_a_layernorm(kv_nope)
    q_rot, k_rot = apply_rotary_pos_emb_interleave(...)   # apply_rotary_pos_emb without rope_interleave
    k_nope, v = split(kv_b_proj(kv_nope)); attention(cat(q_pass, q_rot), cat(k_nope, k_rot), v)

Aligned, with the rows' points as they stand (no MLA point exists):

- ``rmsnorm``: ``q_a_layernorm`` and ``kv_a_layernorm`` are plain norms (no residual add before
  them; a GEMM or the attention reads their output, rounded, in every stack), through
  ``rla.ops.rms_norm`` like the layers' norms: vLLM's and SGLang's MLA use the same ``RMSNorm``
  class and kernel for them as for the layers' norms. The layers' norms and adds are the Llama
  shape's (``rla.alignment.rmsnorm``).
- ``rope``: ``config.head_dim`` is ``qk_rope_head_dim``, so the aligned rotary's fp32 tables come from
  HF's own init function for the rope half (YaRN's included: its ``attention_factor``, from ``mscale``
  and ``mscale_all_dim``, scales the fp32 tables, as HF and the engines do); both HF apply functions
  are replaced (``rla.alignment.rope.make_apply_interleaved_rotary`` for the interleaved layout).

Left as HF computes it, and named in the report (:func:`notes`): the attention itself and its softmax
scale, the latent projections.
"""

from __future__ import annotations

__all__ = ["LATENT_NORMS", "LEFT_AS_IS", "notes"]

#: The RMSNorms inside an MLA attention module (``q_a_layernorm`` is None without a q LoRA).
LATENT_NORMS = ("q_a_layernorm", "kv_a_layernorm")

#: What the alignment of an MLA model leaves to HF's code, and why (printed in the report).
LEFT_AS_IS = [
    "left as is: MLA's attention kernel and its softmax scale (qk_head_dim**-0.5 * mscale(factor, "
    "mscale_all_dim)**2: HF's yarn_apply_mscale, the engines' same expression of the same Python floats), "
    "and the latent projections q_a/q_b, kv_a/kv_b, o_proj (GEMMs; the engines fuse q_a with kv_a into one "
    "GEMM and absorb kv_b into the query and the output in decode: matmul order, not a rounding point)",
]


def notes(config, regions) -> list[str]:
    """The report's notes for an MLA model with ``config`` aligned in ``regions``."""
    out = list(LEFT_AS_IS)
    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if "rope" in regions and rope_type != "default":
        out.append(
            f"not in the rows: vLLM's DeepSeek {rope_type} rotary (DeepseekScalingRotaryEmbedding) under "
            "enforce_eager keeps an fp32 cos/sin cache for FlashInfer's kernel where FlashInfer is usable and the "
            "rope head is 64/128/256/512, else runs its PyTorch ops on a bf16 cache (each product rounded); the "
            "eager rows' RoPE points, measured on vLLM's plain rotary kernel, are applied as they stand "
            "(docs/families.md, DeepSeek-V3)"
        )
    if "rope" in regions and getattr(config, "rope_interleave", True) is False:
        out.append(
            "rope_interleave=False: the rope half is rotated by halves, as HF and SGLang do; vLLM 0.26 and 0.33 "
            "rotate interleaved pairs whatever the config says (is_neox_style=False): another function of the "
            "same weights, not a rounding (rla doctor: 'DeepSeek-V3 rope layout')"
        )
    return out
