"""The points an MoE block's routed experts take: the row's ``moe_experts`` variant (docs/families.md,
"Routed experts"). An engine may run its routed experts inside its fused-MoE op, with other code than
its dense MLPs (vLLM: the CUDA ``silu_and_mul`` in both modes, evidence in ``rla.engines.vllm_moe``), so
the experts' gated product can round where the row's dense MLPs do not; shared experts and dense MLPs
keep the row's (or the family's variant's) points."""

from __future__ import annotations

from rla.profiles import RoundingProfile

__all__ = ["EXPERTS_KIND", "experts_profile"]

#: The rows' variant kind (``rla.profiles.VARIANTS``) for routed experts' ``silu(gate) * up``.
EXPERTS_KIND = "moe_experts"


def experts_profile(row: RoundingProfile, p: RoundingProfile, report) -> RoundingProfile:
    """The points the routed experts' gated product runs under: ``p`` (``row``, or ``row``'s variant
    for the model's family) with ``row``'s ``moe_experts`` variant applied (an engine runs its routed
    experts inside its fused-MoE op, with other code than its dense MLPs: vLLM's CUDA ``silu_and_mul``
    in both modes). When it changes a point, ``report`` names the variant (``experts_variant``) and
    says so in a note. The shared experts and dense MLPs keep ``p`` (docs/families.md)."""
    pe = row.variant_on(EXPERTS_KIND, p)
    if pe is not p:
        changed = {k: v for k, v in pe.points().items() if getattr(p, k) != v}
        report.experts_variant = EXPERTS_KIND
        report.notes.append(f"the routed experts follow {pe.name!r}: {changed}, the row's variant for them (the "
                            "engine runs them inside its fused-MoE op; shared experts and dense MLPs keep "
                            f"{p.name!r}; docs/families.md)")
    return pe
