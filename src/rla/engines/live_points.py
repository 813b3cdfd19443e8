"""The points a live calibration searches, as the model computes them: a row's *effective* values for
the model's family kind and for the second kinds its modules run, and where a change to each must be
written.

``rla.align`` runs a family with a kind (``Family.variant``: Qwen3.5's ``qwen3_5``, Gemma's
``zero_centred_norm`` / ``gemma4``, GPT-OSS's ``gpt_oss``) under the row's variant for that kind
(:meth:`rla.profiles.RoundingProfile.variant`). Where the variant (or the kind it extends,
:data:`rla.profiles.VARIANT_EXTENDS`) sets a row point -- the vLLM rows' ``qwen3_5`` variant sets
``qk_norm_out='round'``, ``gpt_oss`` sets ``rope_cos_sin`` -- the row's own value of that point is
not what the model computes, so the search reads the variant's value (:func:`points_of`) and a
change to it goes into that kind's variant (:func:`with_points`, as the variant points
``post_norm_out`` / ``attn_gate`` always do); :func:`set_in` names those points.

Some modules run a *second kind* (:data:`SECOND_KINDS`): an MoE block's routed experts and its
shared + routed sum ``moe_experts``, applied over the family's kind
(:meth:`~rla.profiles.RoundingProfile.variant_on`), and Gemma 4's per-layer-input gate
``gemma4_ple``, applied over the row. :func:`computes` says which points those modules compute in a
model (the routed experts' ``swiglu`` where they follow ``moe_experts``, ``moe_out`` where the blocks
have shared experts; the gate's ``swiglu`` where the model has per-layer inputs). A point a second
kind's variant sets, or one only that kind has (``moe_out``), is its own search point, keyed
``<kind>.<point>`` (:func:`key`, :func:`split`; ``moe_experts.swiglu``, ``moe_experts.moe_out``): its
value is what those modules compute (:func:`second_value`), and a change to it goes into that kind's
variant, never the row's own point. A point no second kind's variant sets is computed alike in every
module kind and stays one point (a flip of the row's ``swiglu`` moves the routed experts too).

A row's head-size conditions (``RoundingProfile.conditions``: SGLang's RoPE points at head sizes
outside 64/128/256/512) are not searched: :func:`runs` gives every profile the model's modules run
under, so a flip that leaves them all as they were is known to change nothing this model computes,
and :func:`second_values` names the value a second kind keeps for a row point.
"""

from __future__ import annotations

from rla.alignment.core import head_size
from rla.alignment.families import FAMILIES
from rla.profiles import POINTS, VARIANT_EXTENDS, VARIANT_POINT_KINDS, VARIANT_POINTS

__all__ = ["family_kind", "variant_points", "set_in", "points_of", "with_points", "runs", "second_values",
           "SECOND_KINDS", "computes", "key", "split", "second_points", "second_value", "values"]

#: The second kind of an MoE block's routed experts (``rla.alignment.routed_experts.EXPERTS_KIND``).
EXPERTS_KIND = "moe_experts"
#: The second kind of Gemma 4's per-layer-input gate (``rla.alignment.gemma4.PLE_VARIANT``).
PLE_KIND = "gemma4_ple"
#: The second kinds, each with whether its variant applies over the family's kind (``variant_on``,
#: as ``rla.alignment.routed_experts`` does) or over the row (``variant``, as ``rla.alignment.gemma4``).
SECOND_KINDS: dict[str, bool] = {EXPERTS_KIND: True, PLE_KIND: False}


def _family(model):
    model_type = model if isinstance(model, str) else getattr(getattr(model, "config", None), "model_type", None)
    return FAMILIES.get(model_type)


def family_kind(model) -> str | None:
    """The kind whose variant ``rla.align`` runs the model's family under (None: the row itself);
    ``model``: the model, or its ``model_type``."""
    family = _family(model)
    return family.variant if family is not None else None


#: Variant points a live search does not take: decided at the kernel, where they are bit-exact, and below what a
#: model-level score can tell apart (``oai_glu``: the clamped SwiGLU's two fp32 orders part in about 4 of a million
#: bf16 outputs; searching it would double GPT-OSS's group for that). The row's value stays as the start row has it.
NOT_SEARCHED: tuple[str, ...] = ("oai_glu",)


def variant_points(model) -> tuple[str | None, dict[str, tuple[str, ...]]]:
    """``(the kind of the model's family, {variant point: choices})``: the variant points the
    family's modules have (:data:`rla.profiles.VARIANT_POINT_KINDS`) that a live search takes (not
    :data:`NOT_SEARCHED`), none for a family without a kind or whose kind has none searched (GPT-OSS's
    ``gpt_oss``: its ``oai_glu`` is a kernel fact)."""
    kind = family_kind(model)
    return kind, {p: VARIANT_POINTS[p] for p, kinds in VARIANT_POINT_KINDS.items()
                  if kind in kinds and p not in NOT_SEARCHED}


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


def key(kind: str, point: str) -> str:
    """The search key of ``point`` as the modules of the second kind ``kind`` compute it."""
    return f"{kind}.{point}"


def split(name: str) -> tuple[str | None, str]:
    """``(second kind, point)`` of a search key (:func:`key`); ``(None, point)`` for a point of the
    family's modules."""
    kind, _, point = name.rpartition(".")
    return (kind, point) if kind in SECOND_KINDS else (None, name)


def computes(model) -> dict[str, tuple[str, ...]]:
    """``{second kind the model has: the points its modules compute}`` (module docstring): an MoE
    family has ``moe_experts`` (its routed experts' ``swiglu`` where they run ``silu(g) * u`` under it,
    not GPT-OSS's clamped experts, which follow ``gpt_oss``; ``moe_out`` where its blocks have shared
    experts), Gemma 4 ``gemma4_ple`` (the gate's ``swiglu`` where the config has per-layer inputs).
    ``model``: the model, or its ``model_type`` (then Gemma 4's gate is taken to be there)."""
    family = _family(model)
    if family is None:
        return {}
    out = {}
    if family.moe:
        out[EXPERTS_KIND] = (("swiglu",) if family.experts_gate == "swiglu" else ()) + (
            ("moe_out",) if family.shared_expert else ())
    if family.variant == "gemma4":
        config = getattr(model, "config", None)
        out[PLE_KIND] = ("swiglu",) if config is None or getattr(config, "hidden_size_per_layer_input", 0) else ()
    return out


def second_points(model, row) -> dict[str, tuple[str, ...]]:
    """``{key: choices}``: for each second kind the model has (:func:`computes`), the points ``row``'s
    variant for it sets and the variant points only that kind has (``moe_out``), whether or not this
    model's modules compute them (a flip of one they do not compute is said not to apply)."""
    out = {}
    for kind in computes(model):
        own = [p for p, kinds in VARIANT_POINT_KINDS.items() if kinds == (kind,)]
        for p in (*[p for p in POINTS if p in row.variants.get(kind, {})], *own):
            out[key(kind, p)] = POINTS.get(p) or VARIANT_POINTS[p]
    return out


def _second_profile(row, kind: str | None, second: str):
    first = row.variant(kind) if kind else row
    return row.variant_on(second, first) if SECOND_KINDS[second] else row.variant(second)


def second_value(row, kind: str | None, name: str) -> str:
    """The value of the search key ``name`` (``moe_experts.moe_out``) that the second kind's modules
    compute under ``row``, the family's kind being ``kind``."""
    second, point = split(name)
    return getattr(_second_profile(row, kind, second), point)


def values(model, row) -> dict[str, str]:
    """Every search point's value as the model computes it under ``row``: :func:`points_of` for the
    family's modules, then the second kinds' points (:func:`second_points`)."""
    kind = family_kind(model)
    return {**points_of(row, kind), **{k: second_value(row, kind, k) for k in second_points(model, row)}}


def with_points(row, change: dict, kind: str | None):
    """``row`` with ``change`` applied where the model reads it: a row point on the row, unless
    ``kind``'s variant sets it (:func:`set_in`); that one, and every variant point, in ``kind``'s
    variant; a second kind's key (:func:`key`) in that kind's variant."""
    inside = set_in(row, kind)
    second: dict[str, dict] = {}
    for name, v in change.items():
        k, p = split(name)
        if k:
            second.setdefault(k, {})[p] = v
    change = {p: v for p, v in change.items() if split(p)[0] is None}
    own = {p: v for p, v in change.items() if p in POINTS and p not in inside}
    rest = {p: v for p, v in change.items() if p not in own}
    out = row.replace(**own) if own else row
    out = out.replace_variant(kind, **rest).replace(calibration=None) if rest else out
    for k, c in second.items():
        out = out.replace_variant(k, **c).replace(calibration=None)
    return out


def runs(model, row) -> dict[str, dict[str, str]]:
    """Every profile the model's modules run under ``row``, as points: the row at the model's head
    size (its conditions, as ``rla.align`` applies them first), then the family's kind's variant, and
    for each second kind the model has the points its modules compute (:func:`computes`)."""
    kind = family_kind(model)
    if row.conditions:
        row = row.at_head_size(head_size(model.config))
    out = {kind or "row": points_of(row, kind)}
    for second, points in computes(model).items():
        prof = _second_profile(row, kind, second)
        out[second] = {p: getattr(prof, p) for p in points}
    return out


def second_values(model, row, point: str) -> dict[str, str]:
    """``{second kind: its value of point}`` where the model's second kinds (:func:`runs`) compute
    the row point ``point`` otherwise than the family's modules do under ``row``."""
    every = runs(model, row)
    first = every.pop(family_kind(model) or "row")
    return {k: pts[point] for k, pts in every.items() if point in pts and pts[point] != first.get(point)}
