"""Variant points: rounding points only some kinds of modules have (``rla.profiles.VARIANTS``), so a
row sets them in those kinds' variants and never in its own points, which hold for every family.

``post_norm_out`` (kinds ``zero_centred_norm`` and ``gemma4``: Gemma 3's and Gemma 4's sandwich
layers): what the residual add after a post-attention / post-feed-forward norm (on Gemma 4 also the
post-per-layer-input norm) reads. ``round`` = RN(norm(x)), as HF and every kernel that stores the
norm's output; ``fp32`` = the norm's fp32 output, as vLLM's compiled graph (the default-mode engine
twin on Gemma 3, docs/families.md). A kind that extends one of these (``rla.profiles.VARIANT_EXTENDS``)
does not inherit the point: Qwen3.5's norms are zero-centred but its layers have no norm after a
sub-block. ``RoundingProfile.post_norm_out`` holds the value a :meth:`~RoundingProfile.variant` gives.

``moe_out`` (kind ``moe_experts``: an MoE block with shared experts, Qwen2-MoE's, GLM-4 MoE's,
DeepSeek-V3's and Qwen3.5 MoE's): what the residual add after the block reads of ``shared + routed``
(each an lp tensor: the shared experts' output, the routed experts' weighted sum). ``round`` =
RN(shared + routed), as HF's block and every stack that stores the sum; ``fp32`` = the fp32 sum of
the two lp tensors, unrounded, as vLLM's compiled graph (``MoERunner.forward`` adds them outside the
opaque fused-MoE op and Inductor fuses the add into the next residual add: the default-mode engine
twin on GLM-4 MoE, docs/families.md). A block without shared experts hands the add the routed
experts' lp output in every stack, so it has nothing the point could change.

``attn_gate`` (kind ``qwen3_5``: Qwen3.5's gated full attention, ``o_proj(attn * sigmoid(gate))``):
where the output gate rounds. ``per_op`` = RN(attn * RN(sigmoid(gate))), HF's two PyTorch ops on
bf16 tensors (vLLM's eager mode runs the same ops); ``fused`` = RN(attn * sigmoid(gate)), the sigmoid
and the product in fp32 of the bf16 inputs, one rounding at the store (SGLang's ``fused_sigmoid_mul``
Triton kernel; vLLM's compiled graph, where Inductor fuses the two ops). ``rla.ops.attn_gate``
computes it; the swiglu region (the gated products) aligns it (``rla.alignment.attn_gate``).
``RoundingProfile.attn_gate`` holds the value.

``oai_glu`` (kind ``gpt_oss``: GPT-OSS's experts' clamped SwiGLU under ``swiglu='fused'``, with
``g = clamp(gate, max=l)``, ``u = clamp(up, -l, l)``, ``e = exp(-(g * alpha))``): where the fp32 chain
before the one lp store rounds. ``sigmoid`` = RN((u + 1) * (g * (1 / (1 + e)))), the expression as HF
writes it, one fp32 rounding per operation (SGLang's compiled form, not measured); ``quotient`` =
RN((g * (u + 1)) / (1 + e)), the product first and one IEEE division, as the SASS of vLLM 0.33's
``swigluoai_and_mul_kernel`` computes it (sm_90: FMUL of the clamped gate and ``u + 1``, then the
full-precision division by ``1 + e``; results/benchmarks/gptoss_quotient_h200_2026-12-04/).
``RoundingProfile.oai_glu`` holds the value; ``rla.ops.swiglu_oai`` computes it.

Four points of Gemma 4's model body (kind ``gemma4``; its modules have them, no other kind's do;
first choice HF eager's, the second vLLM 0.33's compiled graph, docs/families.md, Gemma 4):

``ple_inputs``: where the per-layer inputs ``(norm(G * ps) + E * es) * s`` round (``G`` the
projection GEMM's lp output, ``E`` the looked-up lp rows, the scales as the model holds them).
``per_op`` = every op rounds (HF's ``project_per_layer_inputs``: RN(G * ps), the norm's RN, RN(E *
es), the add's RN, the scale's RN); ``fused`` = the whole expression in fp32, the norm's output
unrounded, one RN at the end. In ``gemma4``, not ``gemma4_ple``: the chain is the per-layer
projection norm and the adds and scales around it in the model body (the rmsnorm region aligns
it), not the gate ``gelu_tanh(g) * p`` that ``gemma4_ple`` describes under the swiglu point.

``ple_add``: what the per-layer-input add ``s + norm(proj(gate))`` reads of the stream ``s`` (the
MLP add's sum). ``stream`` = what ``residual_stream`` says (RN(s), or under ``fp32_carry`` the
carried fp32 sum); ``rounded`` = RN(s), the tensor the gate's GEMM reads, under either.

``stream_variance``: the norm after a layer (the next input norm, the final norm) under
``norm_residual='fp32_sum'``, which hands it the layer's fp32 output ``s``. ``normalised`` = its
mean square is of the value it normalises (``s``; RN(s) under ``rounded_sum``); ``fp32`` = the mean
square of ``s`` and the normalisation of RN(s) (``rla.ops.rms_norm(..., variance_of=)``). Under
``rounded_sum`` the norm reads an lp stream and the point changes nothing.

``embed_variance``: the first input norm, reading the scaled embedding RN(u), ``u = E * RN(c)``
(lp rows, the lp scale). ``normalised`` = the mean square of RN(u); ``fp32`` = the mean square of
the fp32 product ``u``, normalising RN(u) (the residual is RN(u) either way).

``RoundingProfile`` holds each value (a field of the point's name).
"""

from __future__ import annotations

import dataclasses

__all__ = ["BODY_POINTS", "VARIANTS", "VARIANT_EXTENDS", "VARIANT_POINTS", "VARIANT_POINT_KINDS", "check_variant_point", "has_point", "replace_variant"]

#: Module kinds whose rounding an engine may realise with other code than the row's points were
#: measured on, so a row can say, as data, which points differ for them (``RoundingProfile.variants``;
#: each kind described below, its modules in docs/families.md).
VARIANTS: dict[str, str] = {
    "zero_centred_norm": "RMSNorm computing x * rstd * (1 + w) (Gemma 3, Qwen3.5/Qwen3-Next) and its layers' adds",
    "gpt_oss": "GPT-OSS's RMSNorm (HF: (w * x * rstd) rounded once) and its experts' clamped SwiGLU",
    "gemma4": "Gemma 4's RMSNorm (HF: x * rstd * w rounded once), its layers' adds, the per-layer inputs and the "
              "norms after a layer and after the embedding",
    "gemma4_ple": "Gemma 4's per-layer-input gate gelu_tanh(g) * p, written as two PyTorch ops (the swiglu point)",
    "qwen3_5": "Qwen3.5's zero-centred norms, its gated attention's q/k norms and partial RoPE, its output gate",
    "moe_experts": "MoE blocks: routed experts' silu(gate) * up inside the fused-MoE op (GPT-OSS's: gpt_oss), the "
                   "shared + routed sum (moe_out); applied after the family's own kind (RoundingProfile.variant_on)",
}

#: A kind whose modules are another kind's and more: its variant applies that kind's points first,
#: then its own (a point both set takes the narrower kind's value): Qwen3.5's norms are Gemma 3's.
VARIANT_EXTENDS: dict[str, str] = {"qwen3_5": "zero_centred_norm"}


#: point -> its choices, the first HF eager's.
VARIANT_POINTS: dict[str, tuple[str, str]] = {"post_norm_out": ("round", "fp32"), "moe_out": ("round", "fp32"),
                                              "attn_gate": ("per_op", "fused"), "oai_glu": ("sigmoid", "quotient"),
                                              "ple_inputs": ("per_op", "fused"),
                                              "ple_add": ("stream", "rounded"),
                                              "stream_variance": ("normalised", "fp32"),
                                              "embed_variance": ("normalised", "fp32")}

#: Gemma 4's model-body points (the embedding's and per-layer inputs' chains and the norms after them): a live
#: search takes them in a group of their own (``rla.engines.live_calibration``), not the rmsnorm region's.
BODY_POINTS: tuple[str, ...] = ("ple_inputs", "ple_add", "stream_variance", "embed_variance")

#: point -> the kinds whose modules have it (and whose variants may set it).
VARIANT_POINT_KINDS: dict[str, tuple[str, ...]] = {"post_norm_out": ("zero_centred_norm", "gemma4"),
                                                   "moe_out": ("moe_experts",), "attn_gate": ("qwen3_5",),
                                                   "oai_glu": ("gpt_oss",), **{p: ("gemma4",) for p in BODY_POINTS}}


def has_point(kind: str, point: str) -> bool:
    """Whether modules of ``kind`` have ``point``: every row point, a variant point where listed."""
    return point not in VARIANT_POINTS or kind in VARIANT_POINT_KINDS[point]


def check_variant_point(name: str, kind: str, point: str, value, points: dict) -> None:
    """Refuse, naming the row, a variant ``kind`` of row ``name`` setting ``point`` to ``value``
    where the kind lacks the point or the value is none of its choices (``points``: the row points)."""
    if not has_point(kind, point):
        raise ValueError(f"RoundingProfile {name!r}: variant {kind!r} sets {point!r}, a point only the kinds "
                         f"{list(VARIANT_POINT_KINDS[point])} have")
    if value not in (points.get(point) or VARIANT_POINTS.get(point) or ()):
        raise ValueError(f"RoundingProfile {name!r}: variant {kind!r} sets {point}={value!r}; points and choices "
                         f"are {points}, and for some kinds {VARIANT_POINTS}")


def replace_variant(profile, kind: str, name: str | None = None, **changes):
    """A copy of ``profile`` (named ``name``, default its own) whose ``kind`` variant sets
    ``changes`` (points, or variant points the kind has); their evidence is dropped (no longer
    measured), the rest of the row stays."""
    variants = {**profile.variants, kind: {**profile.variants.get(kind, {}), **changes}}
    evidence = {k: {p: e for p, e in v.items() if k != kind or p not in changes}
                for k, v in profile.variant_evidence.items()}
    return dataclasses.replace(profile, name=name or profile.name, variants=variants, variant_evidence=evidence)
