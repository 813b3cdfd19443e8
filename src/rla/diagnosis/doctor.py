"""``rla doctor``: static precision hazards of a model, each with its fix (docs/rounding.md, hazards).

These are problems no rounding profile fixes because they sit outside the rounding points:
a RoPE ``inv_freq`` buffer rounded by ``model.to(torch.bfloat16)`` (phase drift that grows with
position), TF32 matmuls that touch the angles, fp32 norm weights facing a bf16 engine, FSDP2
casting the fp32 tensors that alignment passes between modules, and unmerged LoRA adapters
trained against an engine that serves merged weights (a different computation, which no
alignment makes equal). For the zero-centred norms of Gemma 3 and Qwen3.5 (``x * rstd * (1 + w)``):
a norm whose ``1 + w`` is formed or applied in bf16 (transformers' own Gemma norm before PR 29402,
remote code copied from it), found by running each such norm on a probe, and the per-layer-type
RoPE buffers (``sliding_attention_inv_freq``, ...) that ``model.to(bf16)`` rounds. For GPT-OSS: an
MXFP4 checkpoint, which an engine runs with quantized MoE kernels the rows do not describe. For
DeepSeek-V3: a config that does not name its router as HF computes it (``scoring_func='sigmoid'``,
``topk_method='noaux_tc'``), which vLLM reads and otherwise takes to be a softmax router without the
correction bias; and three places where its MLA attention is another function in the engines than in
HF: ``rope_interleave=False`` (vLLM rotates interleaved pairs whatever the config says), a YaRN config
whose keys make an engine drop the softmax scale's ``mscale**2`` that HF applies, latent norms whose
eps is not ``config.rms_norm_eps`` (HF builds them with 1e-6, the engines with the config's). For Gemma 4: the scale constants HF holds as Python floats and the engines in bf16
(or the other way round), which no rounding point covers (``rla.diagnosis.gemma4_constants``). For
Qwen3.5 MoE: a config with ``norm_topk_prob=False``, which the engines read and HF does not (its router
always renormalises). For every model with an LM head: a head whose logits dtype is not the engine
row's ``lm_head`` (TRL's ``cast_lm_head_to_fp32`` against a bf16 engine head, or a bf16 head against
vLLM's ``head_dtype=float32`` / SGLang's ``--enable-fp32-lm-head``; ``rla.diagnosis.lm_head``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rla.diagnosis.gemma4_constants import gemma4_constants
from rla.diagnosis.lm_head import head_hazard

__all__ = ["Hazard", "doctor", "inv_freq_angle_error", "ZERO_CENTRED_FAMILIES"]


@dataclass(frozen=True)
class Hazard:
    name: str
    severity: str  # "error": changes numbers now; "warning": will, under a common setup
    detail: str
    fix: str


def _rotary_modules(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor)]


def inv_freq_angle_error(module, max_position: int) -> float:
    """Max |angle error| in radians at ``max_position`` caused by the module's inv_freq buffer.

    The reference is the fp32 inv_freq that the module's own init computes from its config;
    the error is evaluated in fp64: max_j |p * (inv_freq[j] - inv_freq_fp32[j])|.
    """
    from rla.alignment.rope import angle_error, fp32_inv_freq

    return angle_error(module.inv_freq, fp32_inv_freq(module), max_position)


#: config.model_type of the families whose RMSNorm is zero-centred, x * rstd * (1 + w).
ZERO_CENTRED_FAMILIES = ("gemma3", "gemma3_text", "gemma2", "gemma", "qwen3_next", "qwen3_5", "qwen3_5_text",
                         "qwen3_5_moe", "qwen3_5_moe_text")


def _zero_centred_norms(model) -> list[tuple[str, torch.nn.Module]]:
    cfg = getattr(model, "config", None)
    types = {getattr(cfg, "model_type", None), getattr(getattr(cfg, "text_config", None), "model_type", None)}
    if not types & set(ZERO_CENTRED_FAMILIES):
        return []
    return [(n, m) for n, m in model.named_modules()
            if type(m).__name__.endswith("RMSNorm") and isinstance(getattr(m, "weight", None), torch.Tensor)
            and m.weight.ndim == 1]


def _one_plus_w_low(norm: torch.nn.Module) -> bool | None:
    """Run ``norm`` on a fixed probe in its weight's low-precision dtype: True when its output is
    RN(RN(x*rstd) * RN(1 + w)) (1 + w formed and applied in bf16) and not what every engine
    computes, RN((x*rstd) * (1 + w)) with 1 + w in fp32; None when the norm is fp32 or ran
    otherwise (no claim)."""
    w = norm.weight.detach()
    if w.dtype not in (torch.bfloat16, torch.float16) or w.is_meta:
        return None
    eps = float(getattr(norm, "eps", getattr(norm, "variance_epsilon", 1e-6)))
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, w.shape[0], generator=g) * 2).to(w.dtype).to(w.device)
    with torch.no_grad():
        try:
            out = norm(x)
        except Exception:  # a norm that takes other inputs (gated norms): no claim
            return None
        v = x.float()
        n = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
        engines = (n * (1.0 + w.float())).to(w.dtype)
        low = n.to(w.dtype) * (1.0 + w)  # bf16 tensors: 1 + w and the product rounded
    if torch.equal(out, engines):
        return False
    return True if torch.equal(out, low) else None


def _rounded_layer_type_rope(model) -> list[tuple[str, str, torch.dtype]]:
    """Per-layer-type RoPE buffers (Gemma 3's ``<type>_inv_freq``) that are not fp32; a module with a
    plain ``inv_freq`` (and its ``original_inv_freq``) is the check above's."""
    return [(n, b, m._buffers[b].dtype) for n, m in model.named_modules()
            if "inv_freq" not in m._buffers and "_rla_rotary" not in m.__dict__  # aligned: fp32 from the config
            for b in m._buffers
            if b.endswith("_inv_freq") and m._buffers[b] is not None and m._buffers[b].dtype != torch.float32]


def _unmerged_lora(model) -> list[tuple[str, torch.nn.Module]]:
    """PEFT LoRA layers whose adapters are not merged into the base weight (PEFT's ``LoraLayer``:
    ``lora_A`` holds the adapters, ``merged`` says whether they are in the base weight now)."""
    return [(n, m) for n, m in model.named_modules()
            if isinstance(getattr(m, "lora_A", None), torch.nn.ModuleDict) and len(m.lora_A) > 0
            and not getattr(m, "merged", False)]


#: DeepSeek-V3's router as HF computes it, in the config keys vLLM's DeepseekV2MoE reads
#: (``vllm/model_executor/models/deepseek_v2.py``, 0.26 and 0.33), with vLLM's defaults for absent keys.
DEEPSEEK_ROUTER = {"scoring_func": ("sigmoid", "softmax"), "topk_method": ("noaux_tc", None)}


def _engine_router_mismatch(cfg) -> str | None:
    """For a DeepSeek-V3 config: the router keys whose value (or vLLM's default for an absent key) is not
    HF's router, as ``"scoring_func absent (vLLM: 'softmax'), ..."``; None otherwise."""
    if getattr(cfg, "model_type", None) != "deepseek_v3":
        return None
    bad = []
    for key, (hf, default) in DEEPSEEK_ROUTER.items():
        value = getattr(cfg, key, None)
        if value is None and default != hf:
            bad.append(f"{key} absent (vLLM: {default!r})")
        elif value is not None and value != hf:
            bad.append(f"{key}={value!r}")
    return ", ".join(bad) or None


def _qwen3_5_moe_no_renorm(cfg) -> bool:
    """A Qwen3.5 MoE config (text or multimodal) with ``norm_topk_prob`` false: HF 5.24's
    ``Qwen3_5MoeTopKRouter.forward`` renormalises the top-k weights whatever the config says; vLLM 0.26 /
    0.33 (``models/qwen3_next.py`` ``Qwen3NextSparseMoeBlock.__init__``: ``renormalize=getattr(config,
    "norm_topk_prob", True)``) and SGLang 0.5.23 (``srt/models/qwen2_moe.py`` ``Qwen2MoeSparseMoeBlock``:
    ``TopK(renormalize=config.norm_topk_prob)``) read the key."""
    text = getattr(cfg, "text_config", None) or cfg
    return getattr(text, "model_type", None) == "qwen3_5_moe_text" and getattr(text, "norm_topk_prob", True) is False


def _deepseek_attention(model, cfg) -> list[Hazard]:
    """DeepSeek-V3's MLA as the engines build it from the config (vLLM 0.26 / 0.33
    ``models/deepseek_v2.py`` ``DeepseekV2MLAAttention.__init__``, SGLang 0.5.23
    ``srt/models/deepseek_v2.py``), where it is another function than HF 5.24's ``DeepseekV3Attention``."""
    if getattr(cfg, "model_type", None) != "deepseek_v3":
        return []
    hazards = []
    if getattr(cfg, "rope_interleave", True) is False:
        hazards.append(Hazard(
            "DeepSeek-V3 rope layout", "error",
            "this DeepSeek-V3 config has rope_interleave=False: HF (apply_rotary_pos_emb) and SGLang "
            "(is_neox_style = not rope_interleave) rotate the rope half by halves, (x[i], x[i + d/2]), while vLLM "
            "0.26 and 0.33 build the rotary with is_neox_style=False whatever the config says and rotate "
            "interleaved pairs, (x[2i], x[2i+1]): another function of the same weights, not a rounding.",
            "keep rope_interleave=True (the default; DeepSeek's released weights are laid out for interleaved "
            "pairs), or roll out with an engine that reads the key; docs/families.md, DeepSeek-V3."))
    rp = getattr(cfg, "rope_parameters", None) or {}
    mscale_all_dim, factor = rp.get("mscale_all_dim"), rp.get("factor") or 1.0
    if rp.get("rope_type", "default") != "default" and mscale_all_dim and factor > 1:
        drops = [what for what, hit in (
            ("attention_factor=1.0 (vLLM 0.33: 'deepseek_llama_scaling')", rp.get("attention_factor") == 1.0),
            ("apply_yarn_scaling=False (vLLM 0.26, SGLang)", rp.get("apply_yarn_scaling", True) is False),
            ("apply_scale=False (SGLang)", rp.get("apply_scale", True) is False)) if hit]
        if drops:
            import math

            m2 = (0.1 * float(mscale_all_dim) * math.log(factor) + 1.0) ** 2
            hazards.append(Hazard(
                "DeepSeek-V3 softmax scale", "error",
                f"this DeepSeek-V3 config's rope parameters have {', '.join(drops)}: HF's yarn_apply_mscale "
                f"multiplies the softmax scale by mscale(factor, mscale_all_dim)**2 = {m2:.4g} whatever those keys "
                "say, while that engine then leaves it at qk_head_dim**-0.5: attention logits scaled differently, "
                "not a rounding.",
                "remove the key from the config.json the engine loads (DeepSeek-V3's released config has none of "
                "them); docs/families.md, DeepSeek-V3."))
    eps = getattr(cfg, "rms_norm_eps", None)
    latent = [f"{n}.{k}" for n, m in model.named_modules() if type(m).__name__.endswith("Attention")
              for k in ("q_a_layernorm", "kv_a_layernorm")
              if getattr(getattr(m, k, None), "variance_epsilon", eps) != eps]
    if latent:
        got = getattr(model.get_submodule(latent[0]), "variance_epsilon")
        hazards.append(Hazard(
            "DeepSeek-V3 latent norm eps", "error",
            f"{len(latent)} MLA latent norms (e.g. {latent[0]}) use eps {got:g} while config.rms_norm_eps is {eps:g}: "
            "HF 5.24 builds q_a_layernorm and kv_a_layernorm as DeepseekV3RMSNorm(rank) with its default eps "
            "1e-6, vLLM and SGLang with config.rms_norm_eps: another rstd in every token, not a rounding.",
            "set rms_norm_eps=1e-6 (DeepSeek-V3's released value), or the latent norms' variance_epsilon to "
            "config.rms_norm_eps; docs/families.md, DeepSeek-V3."))
    return hazards


def doctor(model: torch.nn.Module, *, engine_dtype: torch.dtype = torch.bfloat16,
           external_engine: bool = True, profile=None) -> list[Hazard]:
    """Hazards found in ``model`` as it is now (an empty list is a clean bill of health).

    ``external_engine``: rollouts come from an inference engine (vLLM, SGLang) that is given this
    model's weights, the setup rla is for; False when the training model samples itself.
    ``profile``: the engine's row (a name, an alias or a ``RoundingProfile``, e.g.
    ``get("sglang").replace(lm_head="fp32")`` for a run with ``--enable-fp32-lm-head``), for the
    checks that compare the model with it (the LM head's logits dtype); None: the built-in rows'
    defaults."""
    hazards: list[Hazard] = []
    if external_engine:
        hazards.extend(head_hazard(model, profile, engine_dtype, Hazard))
    lora = _unmerged_lora(model)
    if lora and external_engine:
        ranks = sorted({int(r) for _, m in lora for r in getattr(m, "r", {}).values()})
        hazards.append(
            Hazard(
                "unmerged LoRA vs merged engine weights",
                "warning",
                f"{len(lora)} PEFT LoRA layers (e.g. {lora[0][0]}, r={ranks}) train unmerged: W x + s B (A x), each "
                "product rounded to bf16. An engine given the trained model serves merged bf16 weights "
                "RN(W + s B A) (TRL 1.16's vLLM sync merges the adapters before sending weights): another "
                "computation, not "
                "another rounding location. At step 0 (B = 0) the two agree; after the first update the mismatch "
                "grows (k3 from ~1e-11 to 1.8e-6 in issue #35's run) and rla.align cannot remove it.",
                "measure it (rla.metrics.mismatch every step: mismatch/k3 rising after step 1 is this), correct for it "
                "(importance-sampling correction: verl rollout_corr, OpenRLHF is_correction, TRL "
                "vllm_importance_sampling_correction), or train without LoRA; docs/integrations/lora.md.",
            )
        )
    cfg = getattr(model, "config", None)
    max_pos = int(getattr(cfg, "max_position_embeddings", 0) or 32768)
    for name, m in _rotary_modules(model):
        if m.inv_freq.dtype != torch.float32:
            err = inv_freq_angle_error(m, max_pos)
            hazards.append(
                Hazard(
                    "low-precision inv_freq",
                    "error",
                    f"{name or 'model'}.inv_freq is {m.inv_freq.dtype} (model.to({m.inv_freq.dtype}) rounds this "
                    f"non-persistent buffer); RoPE angles are off by up to {err:.3g} rad at position {max_pos}, "
                    "growing linearly with position, while engines compute inv_freq in fp32.",
                    "load with from_pretrained(..., dtype=torch.bfloat16) instead of model.to(bfloat16), or call "
                    "rla.align(model, ...), which recomputes an fp32 inv_freq from the config.",
                )
            )
    rounded = _rounded_layer_type_rope(model)
    if rounded:
        name, buffer, dtype = rounded[0]
        hazards.append(
            Hazard(
                "low-precision inv_freq",
                "error",
                f"{len(rounded)} per-layer-type RoPE buffers are {dtype} (e.g. {name or 'model'}.{buffer}; "
                "model.to(bf16) rounds these non-persistent buffers): every layer type's angles drift with "
                "position, while engines compute its frequencies in fp32.",
                "load with from_pretrained(..., dtype=torch.bfloat16) instead of model.to(bfloat16), or call "
                "rla.align(model, ...), which recomputes each layer type's frequencies in fp32 from the config.",
            )
        )
    zc = _zero_centred_norms(model)
    low = [n for n, m in zc if _one_plus_w_low(m)]
    if low:
        hazards.append(
            Hazard(
                "1 + w in bf16",
                "error",
                f"{len(low)} zero-centred RMSNorms (e.g. {low[0]}) compute RN(RN(x*rstd) * RN(1 + w)): 1 + w "
                "formed and applied in bf16 (transformers' Gemma norm before PR 29402, or code copied from it). "
                "HF's current Gemma 3 / Qwen3.5 norms, vLLM and SGLang all form 1 + w in fp32 and round once: "
                "RN((x*rstd) * (1 + w)); 1 + w in bf16 loses the low bits of every weight near 0.",
                "use transformers' own modeling code (no trust_remote_code copy of an old Gemma norm), or "
                "rla.align(model, ...), whose zero-centred norms form 1 + w in fp32 (docs/families.md).",
            )
        )
    fp32_zc = [n for n, m in zc if m.weight.dtype == torch.float32]
    if fp32_zc and engine_dtype != torch.float32 and not _is_aligned(model):
        hazards.append(
            Hazard(
                "fp32 zero-centred norm weights",
                "warning",
                f"{len(fp32_zc)} zero-centred RMSNorm weights are fp32 (e.g. {fp32_zc[0]}): HF forms 1 + w32 from "
                "the master weight, the engine 1 + RN(w) from its bf16 copy, so the norms scale by different "
                "numbers (by up to half a bf16 ulp of w).",
                "rla.align(model, profile=...): aligned zero-centred norms use 1 + RN(w), as the engine does.",
            )
        )
    quant = getattr(cfg, "quantization_config", None)
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    if getattr(cfg, "model_type", None) == "gpt_oss" and str(method).lower().endswith("mxfp4") and external_engine:
        hazards.append(
            Hazard(
                "MXFP4 experts",
                "warning",
                "this GPT-OSS checkpoint's experts are MXFP4: an engine that loads the checkpoint runs its quantized "
                "MoE kernels, whose clamped SwiGLU is fused into the GEMM (not the bf16 swigluoai_and_mul kernel the "
                "rows describe), while training computes with the weights dequantized to bf16: another computation, "
                "which no rounding profile makes equal.",
                "send the engine the bf16 weights the trainer holds (a weight sync does), or measure the mismatch "
                "(rla.metrics.mismatch); docs/families.md, GPT-OSS.",
            )
        )
    constants = gemma4_constants(model)
    if constants and external_engine:
        hazards.append(
            Hazard(
                "Gemma 4 scale constants",
                "warning",
                "; ".join(constants) + ". Other numbers in the same place, not another rounding location: rla.align "
                "leaves them as HF has them.",
                "for vLLM or SGLang, set the per-layer-input scales to the engine's (model.model."
                "per_layer_model_projection_scale and .per_layer_input_scale = float(torch.tensor(v, "
                "dtype=torch.bfloat16))): HF then multiplies by the engine's number. Measure the rest "
                "(rla.metrics.mismatch); docs/families.md, Gemma 4.",
            )
        )
    router = _engine_router_mismatch(cfg)
    if router and external_engine:
        hazards.append(
            Hazard(
                "DeepSeek-V3 router config",
                "error",
                f"this DeepSeek-V3 config has {router}: HF's DeepseekV3TopkRouter always routes by sigmoid scores "
                "with the correction bias (e_score_correction_bias), while vLLM's DeepseekV2MoE reads scoring_func "
                "(default 'softmax') and topk_method (the bias only under 'noaux_tc'): the engine routes other "
                "tokens to other experts, or refuses the checkpoint's bias. A plumbing difference, not rounding.",
                "write scoring_func='sigmoid' and topk_method='noaux_tc' into the config.json the engine loads, as "
                "DeepSeek-V3's released config does; docs/families.md, DeepSeek-V3.",
            )
        )
    if external_engine and _qwen3_5_moe_no_renorm(cfg):
        hazards.append(
            Hazard(
                "Qwen3.5 MoE router config",
                "error",
                "this Qwen3.5 MoE config has norm_topk_prob=False: HF's Qwen3_5MoeTopKRouter renormalises the top-k "
                "routing weights whatever the config says, while vLLM's Qwen3NextSparseMoeBlock and SGLang's "
                "Qwen2MoeSparseMoeBlock read the key and do not: every token's experts are weighted differently "
                "(rla.align's router region computes HF's renormalised weights). A plumbing difference, not rounding.",
                "remove norm_topk_prob from the config.json the engine loads (or set it true), as the released "
                "Qwen3.5 MoE configs do; docs/families.md, Qwen3.5 MoE.",
            )
        )
    if external_engine:
        hazards.extend(_deepseek_attention(model, cfg))
    if torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest":
        hazards.append(
            Hazard(
                "TF32 matmul precision",
                "warning",
                f"float32 matmul precision is '{torch.get_float32_matmul_precision()}' "
                f"(allow_tf32={torch.backends.cuda.matmul.allow_tf32}): fp32 matmuls run with a 10-bit mantissa on "
                "GPUs, which corrupts RoPE angles computed as inv_freq @ position_ids at large positions.",
                "torch.set_float32_matmul_precision('highest') around the rotary computation, or rla.align "
                "(its RoPE computes angles elementwise, which TF32 never touches).",
            )
        )
    aligned = _is_aligned(model)
    zc_ids = {id(m) for _, m in zc}
    fp32_norms = [
        n for n, m in model.named_modules()
        if type(m).__name__.endswith("RMSNorm") and getattr(m, "weight", None) is not None
        and m.weight.dtype == torch.float32 and id(m) not in zc_ids
    ]
    if fp32_norms and engine_dtype != torch.float32 and not aligned:
        hazards.append(
            Hazard(
                "fp32 norm weights",
                "warning",
                f"{len(fp32_norms)} RMSNorm weights are fp32 (e.g. {fp32_norms[0]}). Under autocast, HF computes "
                "RN(w32 * RN(x*rstd)) with the fp32 weight, while the engine multiplies by its bf16 copy RN(w).",
                "rla.align(model, profile=...): aligned norms round an fp32 master weight to bf16 before use.",
            )
        )
    for name, m in model.named_modules():
        policy = _fsdp_mp_policy(m)
        if policy is not None and policy.cast_forward_inputs and policy.param_dtype not in (None, torch.float32):
            hazards.append(
                Hazard(
                    "FSDP2 casts forward inputs",
                    "error" if aligned else "warning",
                    f"{name or 'model'} is FSDP2-sharded with MixedPrecisionPolicy(param_dtype={policy.param_dtype}, "
                    "cast_forward_inputs=True): fp32 cos/sin and fp32 residual sums passed into it are rounded.",
                    "fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
                    "reduce_dtype=torch.float32, cast_forward_inputs=False)).",
                )
            )
            break
    return hazards


def _is_aligned(model) -> bool:
    from rla.alignment import alignment_of

    try:
        return alignment_of(model) is not None
    except NotImplementedError:  # a family rla.align refuses (or refuses on this transformers): not aligned
        return False


def _fsdp_mp_policy(module):
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is None:
        return None
    try:
        state = get_state()
        return state._mp_policy
    except Exception:  # not the root of an FSDP2 unit, or a torch without FSDP2 internals
        return None
