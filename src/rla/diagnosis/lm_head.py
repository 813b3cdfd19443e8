"""``rla doctor``'s LM head check: the training head's logits dtype against the engine row's ``lm_head``.

A head that computes fp32 logits (TRL's ``cast_lm_head_to_fp32``: an fp32 weight and a forward that
casts the hidden state to fp32) against an engine that rounds them to bf16 (every engine's default,
``lm_head='lp'``), or a bf16 head against an engine started with its fp32 switch (vLLM's
``head_dtype=float32``, SGLang's ``--enable-fp32-lm-head``: ``lm_head='fp32'``), changes every
logprob by the rounding of its logit: half a bf16 ulp is 2^-8 of the logit's binade, 0.03 nats
at a logit of 16. The check runs the head itself on a small bf16 probe and reads the dtype it
returns (what the head computes now, aligned or not), so it needs no forward of the model.
"""

from __future__ import annotations

import torch

from rla.alignment.lm_head import find_head
from rla.profiles import HEAD_SETTINGS, RoundingProfile, resolve

__all__ = ["head_computes", "head_hazard"]


def head_computes(model: torch.nn.Module, lp: torch.dtype = torch.bfloat16) -> str | None:
    """``"fp32"`` or ``"lp"``: what ``model``'s LM head returns for an ``lp`` hidden state; None when
    it cannot say (no head, weights on the meta device, or a head that takes no ``lp`` input
    outside autocast, e.g. an fp32 ``nn.Linear``, which autocast makes ``lp``)."""
    head = find_head(model, None)
    if head is None or head.weight.is_meta:
        return None
    w = head.weight
    probe = torch.randn(2, w.shape[-1], generator=torch.Generator().manual_seed(0)).to(lp).to(w.device)
    try:
        with torch.no_grad():
            out = head(probe)
    except (RuntimeError, TypeError):  # dtype mismatch of a plain fp32 head, an unusual signature
        return None
    if not isinstance(out, torch.Tensor):
        return None
    return {torch.float32: "fp32", lp: "lp"}.get(out.dtype)


def head_hazard(model: torch.nn.Module, profile: str | RoundingProfile | None, engine_dtype: torch.dtype,
                hazard_type) -> list:
    """The hazard (``hazard_type``: ``rla.diagnosis.doctor.Hazard``) of module docstring, or []."""
    computes = head_computes(model, engine_dtype)
    if computes is None:
        return []
    how = "; ".join(f"{k}: {v}" for k, v in HEAD_SETTINGS.items())
    if profile is None:
        if computes != "fp32":
            return []
        return [hazard_type(
            "LM head dtype", "warning",
            "this model's LM head computes fp32 logits from the bf16 hidden state (TRL's cast_lm_head_to_fp32, or a "
            "head cast to fp32), while every built-in engine row computes bf16 logits (lm_head='lp', the engines' "
            "default): every logprob then differs by the rounding of its logit.",
            f"start the engine with its fp32 head ({how}) and say so with row.replace(lm_head='fp32'), or align the "
            "model to the bf16 row (rla.align); rla doctor --profile ROW checks the pair (docs/rounding.md, LM head).")]
    row = resolve(profile)
    if computes == row.lm_head:
        return []
    if computes == "fp32":
        detail = (f"this model's LM head computes fp32 logits (TRL's cast_lm_head_to_fp32, or a head cast to fp32), "
                  f"while {row.name!r} rounds them to bf16 (lm_head='lp'): every logprob differs by the rounding of its "
                  "logit, up to 0.03 nats at a logit of 16.")
        fix = (f"start the engine with its fp32 head ({how}) and use row.replace(lm_head='fp32'); or rla.align(model, "
               f"{row.name!r}), whose head then computes the engine's bf16 logits (not TRL's fused GRPO head, which "
               "reads the weight itself: there drop cast_lm_head_to_fp32; docs/integrations/trl.md).")
    else:
        detail = (f"{row.name!r} computes fp32 logits (lm_head='fp32': an engine started with its fp32 head), while "
                  "this model's LM head rounds them to bf16: every logprob differs by the rounding of its logit.")
        fix = (f"rla.align(model, row) with that row (its head then computes the fp32 logits), or start the engine "
               f"without its fp32 head ({how}).")
    return [hazard_type("LM head dtype", "error", detail, fix)]
