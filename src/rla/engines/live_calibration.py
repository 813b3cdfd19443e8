"""Model-level calibration against a live engine: score a training model's logprobs of the
engine's own tokens under a row, and search the rounding points for the row that reproduces them.

The engine's side is plain data -- prompt logprobs (prefill) and rollout records (decode), e.g.
from :mod:`rla.engines.vllm_live` -- so the same search runs against a real engine on a GPU or,
in the tests, against an aligned model standing in for one. The training side is one forward per
sequence (what a trainer does), the LM head in chunks, ``log_softmax(bf16 logits, dtype=float32)``
as vLLM computes its logprobs.

The search goes group by group (:data:`GROUPS`): every combination of a group's points with the
other points held at the best so far, because points interact and one flip at a time gets stuck;
at most two sweeps. A group is a region (:data:`rla.profiles.REGION_POINTS`) together with the
SwiGLU point: SwiGLU's output is what the MLP's residual add and the next norm read, so a wrong
``swiglu`` can make a wrong norm point look better than the right one, and the two are only
found together (the bundled model aligned under ``vllm-0.33-eager`` and searched from
``vllm-0.33``, region by region, stopped at ``swiglu=fused`` with ``residual_stream=fp32_carry``). The objective is prefill k3 (it
moves with every point, where the bit-equal fraction needs every point right at once), then the
bit-equal fraction. Each point of the best row is then flipped alone, so the result says which
points the model decides: a point no layer exercises (q/k norms in a model without them) ties.

A family whose modules have a variant point (:data:`rla.profiles.VARIANT_POINTS`: Gemma 3's and
Gemma 4's ``post_norm_out``, Qwen3.5's ``attn_gate``) has it searched too, in the rmsnorm group (the
norms' outputs and the adds they feed, with SwiGLU's, the other gated product), and flipped: its
value is set in the row's variant for the family's kind
(:meth:`rla.profiles.RoundingProfile.replace_variant`), where ``rla.align`` reads it. Other
families are not offered it (:func:`variant_points`). Gemma 4's four model-body points
(:data:`rla.profiles.variant_points.BODY_POINTS`) are searched in a group of their own with
:data:`BODY_WITH` (16 more combinations each in the rmsnorm group would make it 1,024: 64 here).

Every point is searched and flipped as the model's modules compute it (:mod:`rla.engines.live_points`):
where the family kind's variant sets a row point (the vLLM rows' ``qwen3_5`` variant's
``qk_norm_out='round'``), the variant's value is the one read, and changed, in that variant; flipping
the row's own value there would change nothing the model computes. The points of a second kind's
modules (an MoE block's ``moe_experts``: the routed experts' ``swiglu`` where the row's variant sets
it, the shared + routed sum's ``moe_out``; Gemma 4's ``gemma4_ple``) are search points of their own,
keyed ``moe_experts.swiglu``, ``moe_experts.moe_out`` (:func:`rla.engines.live_points.second_points`),
searched in a group of their own with :data:`SECOND_WITH` (``moe_out`` is what the layer's residual add
reads, the experts' product feeds it as SwiGLU's does: a group of 32 combinations on GLM-4 MoE, where
adding them to the rmsnorm group would make it 128) where a flip of them changes what the model
computes, flipped always, and changed in that kind's variant. A flip that leaves every profile the
model runs under as it was says so (``applies``).
"""

from __future__ import annotations

import contextlib
import itertools

import torch

from rla.alignment import aligned, replay_routes, routes_from_records
from rla.engines.live_points import (points_of, runs, second_points, second_values, set_in, split, values,
                                     variant_points, with_points)
from rla.profiles import POINTS, REGION_POINTS
from rla.profiles.variant_points import BODY_POINTS

__all__ = ["train_logprobs", "stats", "score", "better", "search", "flip", "BUCKETS", "GROUPS", "variant_points",
           "points_of", "with_points", "values", "SECOND_WITH", "BODY_WITH"]

GROUPS: tuple[tuple[str, ...], ...] = tuple(
    tuple(dict.fromkeys(points + REGION_POINTS["swiglu"])) for region, points in REGION_POINTS.items()
    if region != "swiglu"
)
"""The point groups searched jointly: each region's points with SwiGLU's (module docstring)."""

SECOND_WITH: tuple[str, ...] = (*REGION_POINTS["swiglu"], "norm_residual", "residual_stream")
"""The points searched with a second kind's (module docstring): SwiGLU's and the two of the residual add."""

BODY_WITH: tuple[str, ...] = ("norm_residual", "residual_stream")
"""The points searched with Gemma 4's model-body points (module docstring): ``stream_variance`` acts under
``fp32_sum``, ``ple_add`` under ``fp32_carry``."""

BUCKETS = ((0, 1024), (1024, 4096), (4096, 16384), (16384, 1 << 30))
"""Position buckets of the per-position statistics (the scored token's position)."""

HEAD_CHUNK = 4096
"""Rows of the LM head computed at once."""


def train_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log pi of tokens 1..n-1 from one forward over the whole sequence (what a trainer does),
    the head in chunks: vLLM's ``log_softmax(bf16 logits, dtype=float32)``."""
    x = torch.tensor(ids, device=next(model.parameters()).device)[None]
    with torch.no_grad():
        h = model.model(input_ids=x).last_hidden_state[0]
        out = []
        for s in range(0, len(ids) - 1, HEAD_CHUNK):
            e = min(s + HEAD_CHUNK, len(ids) - 1)
            lp = model.lm_head(h[s:e]).log_softmax(-1, dtype=torch.float32)
            out.append(lp.gather(-1, x[0, s + 1:e + 1, None])[:, 0])
    return torch.cat(out).double().cpu()


def stats(train: list[torch.Tensor], engine: list[torch.Tensor], offsets: list[int] | None = None) -> dict:
    """Bit-equal fraction, k3, mean and max abs delta of ``train`` against ``engine`` (fp64);
    with ``offsets`` (each sequence's first position) also per position bucket."""
    t, e = torch.cat(train), torch.cat(engine)
    d = t - e
    k3 = (torch.exp(d) - 1 - d)
    row = {"tokens": int(d.numel()), "equal": float((d == 0).double().mean()), "k3": float(k3.mean()),
           "mean_abs": float(d.abs().mean()), "max_abs": float(d.abs().max())}
    if offsets is not None:  # per position bucket (position of the scored token)
        pos = torch.cat([torch.arange(len(x)) + 1 + o for x, o in zip(train, offsets)])
        row["by_position"] = {f"{lo}-{hi}": {"equal": float((d[(pos >= lo) & (pos < hi)] == 0).double().mean()),
                                             "k3": float(k3[(pos >= lo) & (pos < hi)].mean())}
                              for lo, hi in BUCKETS if ((pos >= lo) & (pos < hi)).any()}
    return row


def _replaying(model, experts):
    return contextlib.nullcontext() if experts is None else replay_routes(model, experts)


def score(model, profile, prompts, pre, records, ops=None, regions=None, routes=None) -> dict:
    """Prefill and decode statistics of ``model`` under ``profile`` (None: as it is) against the
    engine's prompt logprobs ``pre`` (one list per prompt, tokens 1..n-1) and ``records``;
    ``ops``: aligned with those ops (``rla.align``'s ``ops``, e.g. an engine-backed forward);
    ``regions``: the regions aligned (None: ``rla.align``'s default); ``routes``: per prompt the
    engine's experts of its tokens (``rla.engines.live_verify.EngineData.prompt_routes``), every
    forward then routed as the engine routed it (``rla.replay_routes``: a prompt by ``routes``, a
    record by its own ``routes``)."""
    kw = {} if regions is None else {"regions": tuple(regions)}
    ctx = aligned(model, profile, ops=ops, **kw) if profile is not None else contextlib.nullcontext()
    if routes is not None and len(routes) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(routes)} prompt route lists")
    with ctx:
        tp, td = [], []
        for i, p in enumerate(prompts):
            with _replaying(model, None if routes is None else torch.as_tensor(routes[i], dtype=torch.long)[None]):
                tp.append(train_logprobs(model, p))
        for r in records:
            with _replaying(model, None if routes is None else routes_from_records([r])):
                td.append(train_logprobs(model, r.prompt_ids + r.response_ids)[len(r.prompt_ids) - 1:])
    ep = [torch.tensor(x, dtype=torch.float64) for x in pre]
    ed = [torch.tensor(r.logprobs, dtype=torch.float64) for r in records]
    return {"prefill": stats(tp, ep, [0] * len(tp)), "decode": stats(td, ed)}


def better(a: dict, b: dict | None) -> bool:
    """Does score ``a`` beat ``b``: lower prefill k3, then more bit-equal logprobs."""
    if b is None:
        return True
    return (-a["prefill"]["k3"], a["prefill"]["equal"]) > (-b["prefill"]["k3"], b["prefill"]["equal"])


def search(model, start, prompts, pre, records, log) -> tuple:
    """The best row from ``start`` (module docstring): ``(row, its score, every row tried,
    each point's flip)``; ``log(message)`` is told of each improvement. A flip of a value set in the
    family kind's variant (a variant point, or a row point the variant sets) names that kind (``kind``;
    :func:`flip`); so does a second kind's (keyed ``moe_experts.moe_out``, with its ``point``). Rows
    tried and flips are keyed by search point (:func:`rla.engines.live_points.values`)."""
    kind, extra = variant_points(model)
    second = second_points(model, start)
    moving = tuple(k for k in second if runs(model, with_points(start, {k: _other(model, start, k, second[k])}, kind))
                   != runs(model, start))  # a second kind's point this model computes
    choices = {**POINTS, **extra, **second}
    layer = tuple(p for p in extra if p not in BODY_POINTS)
    body = tuple(p for p in extra if p in BODY_POINTS)
    groups = tuple(g + layer if "norm_residual" in g else g for g in GROUPS) + (
        (SECOND_WITH + moving,) if moving else ()) + ((body + BODY_WITH,) if body else ())
    best, best_score = start, score(model, start, prompts, pre, records)
    tried = [{"points": values(model, start), **best_score}]
    for _ in range(2):
        changed = False
        for points in groups:
            for combo in itertools.product(*(choices[p] for p in points)):
                change = dict(zip(points, combo))
                now = values(model, best)
                if all(now[p] == v for p, v in change.items()):
                    continue
                cand = with_points(best, change, kind)
                try:
                    s = score(model, cand, prompts, pre, records)
                except NotImplementedError as e:  # a combination rla.align refuses: say so, go on
                    tried.append({"points": values(model, cand), "error": str(e)})
                    continue
                tried.append({"points": values(model, cand), **s})
                if better(s, best_score):
                    best, best_score, changed = cand, s, True
                    log(f"    {change}: prefill eq {s['prefill']['equal']:.4%} k3 {s['prefill']['k3']:.3e}")
        if not changed:
            break
    flips = {point: flip(model, best, best_score, point, allowed, kind, prompts, pre, records)
             for point, allowed in choices.items()}
    return best, best_score, tried, flips


def _other(model, row, point: str, allowed) -> str:
    """The value of ``point`` (a search key) other than the one the model computes under ``row``."""
    return next(v for v in allowed if v != values(model, row)[point])


def flip(model, best, best_score, point: str, allowed, kind: str | None, prompts, pre, records) -> dict:
    """``point`` of ``best`` flipped alone to its other value where the model reads it
    (:func:`rla.engines.live_points.with_points`): that value, the kind whose variant it was set in
    (``kind``: a variant point, a row point the family's variant sets, or a second kind's point, which
    also names its ``point``: ``moe_experts.moe_out`` -> ``moe_experts``, ``moe_out``), for a row point the
    second kinds' own values of it (``second``: the routed experts' ``moe_experts``), the score and
    whether it moved (``decided``); ``applies`` False where the flip leaves every profile the model runs
    under as it was (:func:`rla.engines.live_points.runs`): it changes nothing this model computes, so
    the tie is no measurement."""
    other = _other(model, best, point, allowed)
    by, name = split(point)
    if by:
        where = {"kind": by, "point": name}
    else:
        where = {"kind": kind} if point not in POINTS or point in set_in(best, kind) else {}
        second = second_values(model, best, point)
        where.update({"second": second} if second else {})
    cand = with_points(best, {point: other}, kind)
    where.update({} if runs(model, cand) != runs(model, best) else {"applies": False})
    try:
        s = score(model, cand, prompts, pre, records)
    except NotImplementedError as e:
        return {"other": other, **where, "error": str(e)}
    return {"other": other, **where, "prefill_equal": s["prefill"]["equal"], "prefill_k3": s["prefill"]["k3"],
            "decided": s["prefill"]["equal"] != best_score["prefill"]["equal"]
            or s["prefill"]["k3"] != best_score["prefill"]["k3"]}
