"""The points a live calibration searches, as the model computes them: a row's *effective* values for
the model's family kind, and where a change to each must be written.

``rla.align`` runs a family with a kind (``Family.variant``: Qwen3.5's ``qwen3_5``, Gemma's
``zero_centred_norm`` / ``gemma4``, GPT-OSS's ``gpt_oss``) under the row's variant for that kind
(:meth:`rla.profiles.RoundingProfile.variant`). Where the variant (or the kind it extends,
:data:`rla.profiles.VARIANT_EXTENDS`) sets a row point -- the vLLM rows' ``qwen3_5`` variant sets
``qk_norm_out='round'``, ``gpt_oss`` sets ``rope_cos_sin`` -- the row's own value of that point is
not what the model computes, so the search reads the variant's value (:func:`points_of`) and a
change to it goes into that kind's variant (:func:`with_points`, as the variant points
``post_norm_out`` / ``attn_gate`` always do); :func:`set_in` names those points.

An MoE family's routed experts run a second kind over the first (``moe_experts``,
:meth:`~rla.profiles.RoundingProfile.variant_on`), Gemma 4's per-layer-input gate its own
(``gemma4_ple``). Their values are not searched, nor are a row's head-size conditions
(``RoundingProfile.conditions``: SGLang's RoPE points at head sizes outside 64/128/256/512): :func:`runs`
gives every profile the model's modules run under, so a flip that leaves them all as they were is
known to change nothing this model computes, and :func:`second_values` names the value a second kind
keeps for a point.
"""

from __future__ import annotations

from rla.alignment.core import head_size
from rla.alignment.families import FAMILIES
from rla.profiles import POINTS, VARIANT_EXTENDS, VARIANT_POINT_KINDS, VARIANT_POINTS

__all__ = ["family_kind", "variant_points", "set_in", "points_of", "with_points", "runs", "second_values"]

#: The second kind of an MoE block's routed experts (``rla.alignment.routed_experts.EXPERTS_KIND``).
EXPERTS_KIND = "moe_experts"
#: The second kind of Gemma 4's per-layer-input gate (``rla.alignment.gemma4.PLE_VARIANT``).
PLE_KIND = "gemma4_ple"


def _family(model):
    model_type = model if isinstance(model, str) else getattr(getattr(model, "config", None), "model_type", None)
    return FAMILIES.get(model_type)


def family_kind(model) -> str | None:
    """The kind whose variant ``rla.align`` runs the model's family under (None: the row itself);
    ``model``: the model, or its ``model_type``."""
    family = _family(model)
    return family.variant if family is not None else None


def variant_points(model) -> tuple[str | None, dict[str, tuple[str, ...]]]:
    """``(the kind of the model's family, {variant point: choices})``: the variant points the
    family's modules have (:data:`rla.profiles.VARIANT_POINT_KINDS`), none for a family without a
    kind or whose kind has none (GPT-OSS's ``gpt_oss``)."""
    kind = family_kind(model)
    return kind, {p: VARIANT_POINTS[p] for p, kinds in VARIANT_POINT_KINDS.items() if kind in kinds}


def set_in(row, kind: str | None) -> dict[str, str]:
    """``{row point: the kind whose variant sets it}``: the row points (:data:`rla.profiles.POINTS`)
    ``kind``'s variant sets, or the kind it extends does (``qwen3_5`` over ``zero_centred_norm``);
    for the family's modules the variant's value holds, not the row's."""
    if not kind:
        return {}
    base = VARIANT_EXTENDS.get(kind, "")
    wanted = {**{p: base for p in row.variants.get(base, {})}, **{p: kind for p in row.variants.get(kind, {})}}
    return {p: k for p, k in wanted.items() if p in POINTS}


def points_of(row, kind: str | None) -> dict[str, str]:
    """The values the family's modules compute under ``row``: its points with ``kind``'s variant
    applied (:meth:`~rla.profiles.RoundingProfile.variant`), and that kind's variant points."""
    if not kind:
        return row.points()
    v = row.variant(kind)
    return {**v.points(), **v.kind_points(kind)}


def with_points(row, change: dict, kind: str | None):
    """``row`` with ``change`` applied where the family's modules read it: a row point on the row,
    unless ``kind``'s variant sets it (:func:`set_in`); that one, and every variant point, in
    ``kind``'s variant."""
    inside = set_in(row, kind)
    own = {p: v for p, v in change.items() if p in POINTS and p not in inside}
    rest = {p: v for p, v in change.items() if p not in own}
    out = row.replace(**own) if own else row
    return out.replace_variant(kind, **rest).replace(calibration=None) if rest else out


def runs(model, row) -> dict[str, dict[str, str]]:
    """Every profile the model's modules run under ``row``, as points: the row at the model's head
    size (its conditions, as ``rla.align`` applies them first), then the family's kind's variant, and
    where the family has them the routed experts' (``moe_experts`` over the first) and Gemma 4's
    per-layer-input gate's (``gemma4_ple``)."""
    family, kind = _family(model), family_kind(model)
    if row.conditions:
        row = row.at_head_size(head_size(model.config))
    first = row.variant(kind) if kind else row
    out = {kind or "row": points_of(row, kind)}
    if family is not None and family.moe:
        e = row.variant_on(EXPERTS_KIND, first)
        out[EXPERTS_KIND] = {**e.points(), **e.kind_points(EXPERTS_KIND)}
    if kind == "gemma4":
        out[PLE_KIND] = row.variant(PLE_KIND).points()
    return out


def second_values(model, row, point: str) -> dict[str, str]:
    """``{second kind: its value of point}`` where the model's second kinds (:func:`runs`) compute
    ``point`` otherwise than the family's modules do under ``row``."""
    every = runs(model, row)
    first = every.pop(family_kind(model) or "row")
    return {k: pts[point] for k, pts in every.items() if point in pts and pts[point] != first.get(point)}
