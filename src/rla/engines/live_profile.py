"""A profile row from a live calibration (``rla calibrate --engine vllm --live``): the row
:func:`rla.engines.live_calibration.search` found, with ``live`` evidence and the measurement.

The row is named from the engine's version and mode (``vllm-0.26``, ``vllm-0.26-eager``), as the
op-level rows are, and carries in ``calibration.live`` the engine's settings, the model's family and
shape, how many logprobs were scored, and the start row's and the found row's bit-equal fractions
and k3 against the engine (prefill and decode).

Per point the evidence says what the live engine decided on this model. A point whose flip (the
found row with that point alone changed) moves the prefill score is ``live``: its note gives the
flipped value's k3 beside the row's. A point the model does not exercise (its flip ties: q/k norms
in a model without them) is not decided by this run: it keeps the start row's value and that
row's evidence for it, and the note says so -- a live row claims nothing it did not measure.
``matched`` is None for live points: the measurement is the model-level fraction in
``calibration.live``, not a per-point fraction of probe elements.

The row carries the start row's variants (what ``rla.align`` ran for the family's modules while
the search scored it), each with the start row's evidence; a variant point the search flipped
(Gemma's ``post_norm_out``, set in the family's kind) gets the same rule as a point: ``live`` where
its flip moved the score, else the start row's value and evidence; one the start row does not set
and nothing decided (Gemma 4's model-body points from a row that leaves them at HF's) stays unset, as
for a second kind's point below. So does a row point the
family kind's variant sets (the vLLM rows' ``qwen3_5`` variant's ``qk_norm_out``): the model computes
the variant's value, so that is what was searched and flipped and where a decided value is written;
the row's own value of the point keeps the start row's, and its evidence says the model did not read
it. A flip that changes no profile the model runs under (:mod:`rla.engines.live_points`) is noted as
not applying to this model, not as a tie.

A second kind's point (``moe_experts.swiglu``, ``moe_experts.moe_out``: what an MoE block's routed
experts and its shared + routed sum compute; ``gemma4_ple``'s) is written into that kind's variant by the
same rule, never into the row's own point: ``live`` where its flip moved the score, else the start
row's value with its evidence and a note saying why (its flip ties, or it does not apply to this
model: GPT-OSS's experts and blocks without shared experts compute neither). One the start row's
variant does not set and nothing decided (``moe_out`` from a row without a ``moe_experts`` variant)
stays unset, as it was; the report's flips say why.
"""

from __future__ import annotations

from rla.engines.live_points import family_kind, points_of, second_value, set_in, split, values
from rla.profiles import POINTS, VARIANT_EXTENDS, Calibration, PointEvidence, RoundingProfile

__all__ = ["live_name", "live_row", "settle"]


def live_name(engine: str, version: str, mode: str) -> str:
    """``<engine>-<major.minor>`` (default mode) or ``<engine>-<major.minor>-<mode>``."""
    short = ".".join(version.split(".")[:2])
    return f"{engine}-{short}" + ("" if mode == "default" else f"-{mode}")


def settle(model, start: RoundingProfile, best: RoundingProfile, best_score: dict, flips: dict,
           prompts, pre, records) -> tuple[RoundingProfile, dict]:
    """``best`` with every point whose flip ties (the model does not decide it) set back to the
    start row's value, and its score. The search may move such a point along with others of its
    group (a tie is no worse), which would leave a value nobody measured (``rope_inv_freq`` on a
    CPU, where host and device are one place). Kept only when the settled row scores exactly as
    ``best`` on prefill (k3 and bit-equal fraction); else ``best`` is returned unchanged."""
    from rla.engines.live_calibration import score, with_points

    kind = family_kind(model)
    was, now = values(model, start), values(model, best)
    tied = {p: was[p] for p, f in flips.items() if "error" not in f and not f["decided"] and now[p] != was[p]}
    if not tied:
        return best, best_score
    row = with_points(best, tied, kind)
    s = score(model, row, prompts, pre, records)
    same = (s["prefill"]["k3"], s["prefill"]["equal"]) == (best_score["prefill"]["k3"], best_score["prefill"]["equal"])
    return (row, s) if same else (best, best_score)


_NO_OP = "does not apply to this model: its flip leaves every profile the model runs under as it was"


def _second(f: dict) -> str:
    """What the flip did not change: the values a second kind's modules keep (the routed experts')."""
    return "".join(f"; modules of the {k} variant keep {v}" for k, v in (f.get("second") or {}).items())


def _score(name: str, s: dict) -> dict:
    return {"name": name, "prefill_equal": s["prefill"]["equal"], "prefill_k3": s["prefill"]["k3"],
            "decode_equal": s["decode"]["equal"], "decode_k3": s["decode"]["k3"]}


def live_row(engine: dict, start: RoundingProfile, start_score: dict, best: RoundingProfile, best_score: dict,
             flips: dict, model: dict, *, date: str, gpu: str, torch: str, command: str, results: str = "",
             name: str | None = None) -> RoundingProfile:
    """The row (module docstring). ``engine``: the engine's metadata (``name``, ``version``,
    ``mode``, ``settings``); ``start`` / ``start_score``: the row the search began from and its
    score; ``best`` / ``best_score`` / ``flips``: what :func:`search` returned; ``model``: the
    model's family and shape (:func:`rla.engines.live_verify.model_info`)."""
    missing = [p for p in POINTS if p not in flips]
    if missing:
        raise ValueError(f"the search's flips lack {missing}: every point must have been flipped")
    kind = family_kind(model.get("family") or "") or next(
        (f["kind"] for p, f in flips.items() if f.get("kind") and split(p)[0] is None), None)
    inside = set_in(start, kind)  # row points the family's variant sets: it computes the variant's value
    evidence = {}
    variants = {k: dict(v) for k, v in best.variants.items()}
    variant_evidence = {k: dict(v) for k, v in best.variant_evidence.items()}
    for p, f in flips.items():
        if split(p)[0]:
            _second_point(p, f, kind, start, best, best_score, variants, variant_evidence)
            continue
        if not f.get("kind"):
            continue
        value, before = points_of(best, kind)[p], points_of(start, kind)[p]
        kept = start.variant_evidence.get(kind, {}).get(p) or start.variant_evidence.get(
            VARIANT_EXTENDS.get(kind, ""), {}).get(p)
        undecided = not (value != before or ("error" not in f and f["decided"]))
        if p in POINTS and undecided:
            continue  # a row point the variant sets, not decided here: the start's variants keep it as it was
        stated = p in start.variants.get(kind, {}) or p in start.variants.get(VARIANT_EXTENDS.get(kind, ""), {})
        if undecided and not stated:
            continue  # a variant point the start does not set and nothing decided: unset, as it was
        variants.setdefault(kind, {})[p] = value
        variant_evidence.setdefault(kind, {})[p] = _point_evidence(p, f, value, before, kept, start, best_score)
    for p in POINTS:
        f = flips[p]
        value = getattr(best, p)
        if p in inside:  # the row's own value is not what this model computes: nothing measured it
            decided, why = False, f"this model computes the {kind} variant's value ({points_of(best, kind)[p]})"
        elif "error" in f:  # the other value is a combination rla.align refuses: not measured
            decided = False
            why = f"the other value ({f['other']}) cannot be aligned with this row's other points ({f['error']})"
        elif f.get("applies") is False:
            decided, why = False, _NO_OP
        else:
            decided = bool(f["decided"])
            why = (f"flipped to {f['other']}: prefill k3 {f['prefill_k3']:.3e}, bit-equal {f['prefill_equal']:.4%}; "
                   f"this row: k3 {best_score['prefill']['k3']:.3e}, bit-equal {best_score['prefill']['equal']:.4%}"
                   + _second(f))
            if not decided:
                why = "its flip ties"
        if decided:
            evidence[p] = PointEvidence("live", None, why)
        elif value == getattr(start, p) and start.calibration is not None and p in start.calibration.points:
            kept = start.calibration.points[p]
            evidence[p] = PointEvidence(kept.evidence, kept.matched, f"not decided by the live engine on this model "
                                        f"({why}); kept from {start.name}" + (f": {kept.note}" if kept.note else ""))
        else:
            raise ValueError(f"point {p}: the live search left it undecided ({why}) "
                             f"and {start.name} has no evidence for the value {value!r}: no row is written "
                             "with a value nobody measured")
    version, mode = engine["version"], engine["mode"]
    live = {"settings": dict(engine.get("settings") or {}), "model": dict(model),
            "prefill_tokens": int(best_score["prefill"]["tokens"]), "decode_tokens": int(best_score["decode"]["tokens"]),
            "start": _score(start.name, start_score), "found": _score(name or live_name(engine["name"], version, mode),
                                                                     best_score)}
    cal = Calibration(engine=engine["name"], version=version, mode=mode, date=date, gpu=gpu, torch=torch,
                      command=command, results=results, points=evidence, live=live)
    found = live["found"]
    return RoundingProfile(
        name=found["name"],
        description=(f"{engine['name']} {version} {mode} mode, calibrated against the live engine by rla calibrate "
                     f"--live on {gpu or 'a GPU'} ({model.get('family')} h{model.get('hidden_size')} x "
                     f"{model.get('num_hidden_layers')} layers; prefill bit-equal {found['prefill_equal']:.3%})"),
        calibration=cal, variants=variants, variant_evidence=variant_evidence, **best.points(),
    )


def _second_point(name: str, f: dict, kind: str | None, start: RoundingProfile, best: RoundingProfile,
                  best_score: dict, variants: dict, variant_evidence: dict) -> None:
    """A second kind's point (``moe_experts.moe_out``) into that kind's variant, with its evidence
    (module docstring); left unset where the start's variant does not set it and nothing decided it."""
    second, p = split(name)
    value, before = second_value(best, kind, name), second_value(start, kind, name)
    if not ("error" not in f and f["decided"]) and value == before and p not in start.variants.get(second, {}):
        variants.get(second, {}).pop(p, None)  # as the start had it: unset (the search may have set it back)
        variant_evidence.get(second, {}).pop(p, None)
        if second in variants and not variants[second]:
            del variants[second]
        return
    variants.setdefault(second, {})[p] = value
    variant_evidence.setdefault(second, {})[p] = _point_evidence(
        p, f, value, before, start.variant_evidence.get(second, {}).get(p), start, best_score)


def _point_evidence(p: str, f: dict, value: str, before: str, kept, start: RoundingProfile,
                    best_score: dict) -> PointEvidence:
    """A flipped variant point's evidence, by the rule of the row's points (module docstring)."""
    if "error" not in f and f["decided"]:
        return PointEvidence("live", None, f"in the {f['kind']} variant: flipped to {f['other']}: prefill k3 "
                             f"{f['prefill_k3']:.3e}, bit-equal {f['prefill_equal']:.4%}; this row: k3 "
                             f"{best_score['prefill']['k3']:.3e}, bit-equal {best_score['prefill']['equal']:.4%}"
                             + _second(f))
    why = (f"the other value ({f['other']}) cannot be aligned ({f['error']})" if "error" in f
           else _NO_OP if f.get("applies") is False else "its flip ties")
    if value == before and kept is not None:
        return PointEvidence(kept.evidence, kept.matched, f"not decided by the live engine on this model ({why}); "
                             f"kept from {start.name}" + (f": {kept.note}" if kept.note else ""))
    raise ValueError(f"variant point {p} ({f['kind']}): the live search left it undecided ({why}) and {start.name} "
                     f"has no evidence for the value {value!r}: no row is written with a value nobody measured")
