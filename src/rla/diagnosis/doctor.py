"""``rla doctor``: static precision hazards of a model, each with its fix (docs/rounding.md, hazards).

These are problems no rounding profile fixes because they sit outside the rounding points:
a RoPE ``inv_freq`` buffer rounded by ``model.to(torch.bfloat16)`` (phase drift that grows with
position), TF32 matmuls that touch the angles, fp32 norm weights facing a bf16 engine, FSDP2
casting the fp32 tensors that alignment passes between modules, and unmerged LoRA adapters
trained against an engine that serves merged weights (a different computation, which no
alignment makes equal).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Hazard", "doctor", "inv_freq_angle_error"]


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


def _unmerged_lora(model) -> list[tuple[str, torch.nn.Module]]:
    """PEFT LoRA layers whose adapters are not merged into the base weight (PEFT's ``LoraLayer``:
    ``lora_A`` holds the adapters, ``merged`` says whether they are in the base weight now)."""
    return [(n, m) for n, m in model.named_modules()
            if isinstance(getattr(m, "lora_A", None), torch.nn.ModuleDict) and len(m.lora_A) > 0
            and not getattr(m, "merged", False)]


def doctor(model: torch.nn.Module, *, engine_dtype: torch.dtype = torch.bfloat16,
           external_engine: bool = True) -> list[Hazard]:
    """Hazards found in ``model`` as it is now (an empty list is a clean bill of health).

    ``external_engine``: rollouts come from an inference engine (vLLM, SGLang) that is given this
    model's weights, the setup rla is for; False when the training model samples itself."""
    hazards: list[Hazard] = []
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
    fp32_norms = [
        n for n, m in model.named_modules()
        if type(m).__name__.endswith("RMSNorm") and getattr(m, "weight", None) is not None
        and m.weight.dtype == torch.float32
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

    return alignment_of(model) is not None


def _fsdp_mp_policy(module):
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is None:
        return None
    try:
        state = get_state()
        return state._mp_policy
    except Exception:  # not the root of an FSDP2 unit, or a torch without FSDP2 internals
        return None
