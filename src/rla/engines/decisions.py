"""From counts to a choice per rounding point, and the fallbacks when counting cannot decide.

A point's candidate fraction is the best over the other points of its experiments (the points
an experiment depends on are decided together, each at the other points' best values). The
candidate at 100% wins; two at 100% are *ambiguous* and reported as such, never guessed; none at
100% gives the best one with the largest ulp distance of the rest. ``norm_reduction`` is chosen
only when one order rla reproduces matches every element, else it is ``unpinned``. A point
nothing ran for keeps the adapter's baseline profile's choice and evidence, and says so. The
evidence of a decision is the weakest of the experiments it came from (``rla.profiles.EVIDENCE``
lists them strongest first).
"""

from __future__ import annotations

from rla.engines.bit_match import Experiment
from rla.engines.conformance import PointResult
from rla.engines.source import EngineUnavailable
from rla.profiles import EVIDENCE, POINTS, get

__all__ = ["decide", "weakest", "point_evidence", "settle_reduction", "kept_from_baseline"]


def decide(point: str, experiments: list[Experiment], evidence: str, note: str = "") -> PointResult:
    mine = [e for e in experiments if point in e.points]
    fractions, ulps, total = {}, {}, 0
    for choice in POINTS[point]:
        eq, n, ulp = 0, 0, 0
        for e in mine:
            i = e.points.index(point)
            best = max((c for combo, c in e.counts.items() if combo[i] == choice), key=lambda c: c[0])
            eq, n, ulp = eq + best[0], n + best[1], max(ulp, best[2])
        fractions[choice], ulps[choice], total = eq / n, ulp, n
    perfect = [c for c, f in fractions.items() if f == 1.0]
    ambiguous = len(perfect) > 1
    choice = None if ambiguous else max(fractions, key=fractions.get)
    return PointResult(
        point=point,
        choice=choice,
        evidence=evidence,
        fractions=fractions,
        ambiguous=ambiguous,
        max_ulp=None if choice is None else ulps[choice],
        elements=total,
        experiments=[e.name for e in mine],
        note=note,
    )


def weakest(evidences) -> str:
    """The weakest of several evidences (``EVIDENCE`` lists them strongest first)."""
    return max(evidences, key=EVIDENCE.index)


def point_evidence(point: str, experiments: list[Experiment]) -> str:
    return weakest(e.evidence for e in experiments if point in e.points)


def settle_reduction(red: PointResult, notes: list[str]) -> None:
    """``norm_reduction`` names an order rla reproduces; it is chosen only when that order alone
    reproduces every probe element. Otherwise the engine's order is not one rla reproduces (or
    the probes do not tell the orders apart) and the point is ``unpinned``, which says so."""
    reproduced = [c for c, f in red.fractions.items() if c != "unpinned" and f == 1.0]
    # ambiguous as everywhere (docs/rounding.md): two or more choices at 100%, whatever is then kept
    red.ambiguous = sum(f == 1.0 for f in red.fractions.values()) > 1
    if len(reproduced) == 1 and red.fractions.get("unpinned", 0.0) < 1.0:
        red.choice = reproduced[0]
        return
    red.choice = "unpinned"
    red.max_ulp = None
    red.fallback = (
        "the probes do not tell the orders apart" if reproduced
        else "no order rla reproduces matched every element: the engine's own order is left unpinned"
    )
    notes.append(f"norm_reduction: {red.fallback} (fractions: "
                 + ", ".join(f"{c} {100 * f:.4f}%" for c, f in red.fractions.items()) + ")")


def kept_from_baseline(eng, point: str, why: str) -> PointResult:
    """A point nothing ran for: the adapter's baseline profile's choice and evidence, said so."""
    if eng.baseline is None:
        raise EngineUnavailable(f"{eng.name} {eng.version}: nothing ran for {point} ({why}), and the "
                                "adapter names no baseline profile to keep it from")
    base = get(eng.baseline)
    ev = base.calibration.points.get(point) if base.calibration else None
    evidence = ev.evidence if ev else "source"
    matched = "" if ev is None or ev.matched is None else f", matched {100 * ev.matched:.4f}% there"
    return PointResult(
        point=point,
        choice=getattr(base, point),
        evidence=evidence,
        fractions={},
        fallback=f"not run here ({why}); kept from profile {base.name} (evidence {evidence}{matched})",
        note=ev.note if ev else "",
    )
