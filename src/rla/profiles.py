"""Rounding profiles: where a stack rounds fp32 intermediates to its low-precision dtype.

A profile is data. It answers five questions (the *rounding points* of ``docs/rounding.md``) about
three regions of a transformer block: RoPE, SwiGLU and residual-add + RMSNorm. Everything else in
``rla`` -- the ops, the model patch, the sampler, the diagnosis -- reads a profile and never asks
which engine it came from. A new engine, or a new version of one, is a new row in ``BUILTIN``, not
a new code path.

Notation used in the field docs: ``lp`` is the stack's low-precision dtype (bf16 or fp16) and
``RN(v)`` rounds an fp32 value to ``lp`` (round-to-nearest-even, as ``tensor.to(lp)`` does).
Everything written without ``RN`` is one fp32 operation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["RoundingProfile", "BUILTIN", "get", "names", "resolve", "REGIONS"]

#: The three regions a profile describes, in the order reports list them.
REGIONS: tuple[str, ...] = ("rope", "swiglu", "rmsnorm")

_CHOICES = {
    "rope_cos_sin": ("round", "fp32"),
    "rope_apply": ("per_op", "fused"),
    "swiglu": ("per_op", "fused"),
    "norm_weight": ("per_op", "fused"),
    "norm_residual": ("rounded_sum", "fp32_sum"),
}


@dataclass(frozen=True)
class RoundingProfile:
    """Where one stack rounds in RoPE, SwiGLU and residual-add + RMSNorm.

    Make a custom profile from a built-in with ``dataclasses.replace(get("vllm"), name=..., ...)``;
    values are checked on construction.
    """

    name: str
    """Short identifier, e.g. ``"vllm"``; what reports and rollout records print."""

    rope_cos_sin: Literal["round", "fp32"]
    """``round``: RoPE uses c = RN(cos), s = RN(sin) (an engine whose cos/sin cache is stored in
    ``lp``, like HF eager and vLLM); ``fp32``: cos and sin stay fp32 (SGLang's fp32 cache)."""

    rope_apply: Literal["per_op", "fused"]
    """``per_op``: out = RN(RN(x*c) + RN(rot(x)*s)), every product rounded like eager PyTorch on
    ``lp`` tensors; ``fused``: out = RN(x*c + rot(x)*s), one rounding at the store."""

    swiglu: Literal["per_op", "fused"]
    """``per_op``: out = RN(RN(silu(g)) * u), the activation rounded before the product (HF's
    ``act_fn(gate) * up``, vLLM's ``silu_and_mul`` CUDA kernel); ``fused``: out = RN(silu(g) * u)."""

    norm_weight: Literal["per_op", "fused"]
    """``per_op``: out = RN(w * RN(x*rstd)), the normalised value rounded before the weight (HF's
    ``weight * hidden.to(input_dtype)``); ``fused``: out = RN((x*rstd) * w), one rounding."""

    norm_residual: Literal["rounded_sum", "fp32_sum"]
    """What the norm after a residual add reads. ``rounded_sum``: s = RN(x + r), the bf16 residual
    stream; ``fp32_sum``: the fp32 sum x + r, kept in registers by a fused add+norm kernel. The
    residual passed on is RN(x + r) in both cases."""

    description: str = field(default="", compare=False)
    """One line on which stack this profile describes and why."""

    def __post_init__(self) -> None:
        for point, allowed in _CHOICES.items():
            value = getattr(self, point)
            if value not in allowed:
                raise ValueError(
                    f"RoundingProfile {self.name!r}: {point}={value!r} is not one of {allowed}"
                )
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("RoundingProfile.name must be a non-empty string")

    def points(self) -> dict[str, str]:
        """The five rounding points as a plain dict (for tables and JSON)."""
        return {point: getattr(self, point) for point in _CHOICES}

    def same_rounding(self, other: "RoundingProfile") -> bool:
        """True when both profiles round at the same places (names may differ)."""
        return self.points() == other.points()

    def differs_from(self, other: "RoundingProfile") -> tuple[str, ...]:
        """Regions whose rounding differs between the two profiles."""
        regions = []
        if (self.rope_cos_sin, self.rope_apply) != (other.rope_cos_sin, other.rope_apply):
            regions.append("rope")
        if self.swiglu != other.swiglu:
            regions.append("swiglu")
        if (self.norm_weight, self.norm_residual) != (other.norm_weight, other.norm_residual):
            regions.append("rmsnorm")
        return tuple(regions)

    def replace(self, **changes) -> "RoundingProfile":
        """``dataclasses.replace`` spelled as a method."""
        return dataclasses.replace(self, **changes)


def _p(name, cos_sin, rope, swiglu, weight, residual, description):
    return RoundingProfile(name, cos_sin, rope, swiglu, weight, residual, description)


#: The built-in profiles of ``docs/rounding.md``. Evidence for each row is cited there.
BUILTIN: dict[str, RoundingProfile] = {
    p.name: p
    for p in (
        _p("hf", "round", "per_op", "per_op", "per_op", "rounded_sum",
           "HF transformers eager (and Liger's default kernels): the usual training stack"),
        _p("vllm", "round", "fused", "fused", "fused", "fp32_sum",
           "vLLM V1 default: forward_native compiled by Inductor, one rounding per fused chain"),
        _p("vllm-eager", "round", "fused", "per_op", "per_op", "rounded_sum",
           "vLLM with enforce_eager: its CUDA custom kernels (rotary_embedding, silu_and_mul, "
           "fused_add_rms_norm)"),
        _p("sglang", "fp32", "fused", "fused", "fused", "fp32_sum",
           "SGLang default CUDA path: fp32 cos/sin cache, fp32 registers, one rounding"),
        _p("rla", "fp32", "fused", "fused", "fused", "fp32_sum",
           "the paper's recipe: keep fp32 until each region's output"),
    )
}


def names() -> list[str]:
    """Names of the built-in profiles, in table order."""
    return list(BUILTIN)


def get(name: str) -> RoundingProfile:
    """The built-in profile called ``name``; an unknown name lists the known ones."""
    try:
        return BUILTIN[name]
    except (KeyError, TypeError):
        raise KeyError(
            f"unknown rounding profile {name!r}; known profiles: {', '.join(BUILTIN)}. "
            "Make a custom one with dataclasses.replace(rla.profiles.get('vllm'), name=..., ...)."
        ) from None


def resolve(profile: str | RoundingProfile) -> RoundingProfile:
    """Accept a profile name or a ``RoundingProfile``; anything else is a ``TypeError``."""
    if isinstance(profile, RoundingProfile):
        return profile
    if isinstance(profile, str):
        return get(profile)
    raise TypeError(
        f"profile must be a name ({', '.join(BUILTIN)}) or a RoundingProfile, got {type(profile).__name__}"
    )
