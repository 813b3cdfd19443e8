"""Which temperature the recorded logprobs were computed at, fitted, against what rounding can move.

A wrong temperature on near-certain samples hides inside rounding's *size*: sampled at 0.7 and
recorded as 1.0, the bundled model's rollouts have a k3 of 2-3x the rounding scale, and the
size-based verdict (:mod:`.verdict`) calls that rounding. It is not rounding's *shape*. For a
near-certain token the surprisal ``s = -log p`` is about ``sum_j exp(-gap_j / T)``, so
``log s`` scales with ``1/T``: on that scale a temperature error moves every token the same way
(by a tenth of ``|log s|`` for a 10% error), while rounding the logits moves ``log s`` by their
rounding error over ``T``, a few hundredths, in no common direction.

The fit: the training forward's logprobs at temperature ``f x`` each record's, for every ``f`` of
:data:`FACTORS` (one forward; :func:`rla.logprobs` ``temperature_factors``); the factor whose
log-surprisals are nearest the records' in least squares (tokens whose recorded surprisal is at
least :data:`FLOOR`, where fp32's resolution of a logprob near 0 is a small part of it), refined
by a parabola through the grid minimum.

What rounding can do to that fit is measured on the same sequences, as the k3 scale is
(:mod:`.scale`): the same fit of every profile's bf16 forward against the fp32 forward of the same
weights, where the temperature is right by construction. Rounding moves it by ``r_P``; an engine
and a trainer that each round like some profile differ by at most about ``2 max r_P``, and the
fit is called far when ``|log f|`` exceeds ``FAR_T = 5`` times ``max r_P`` (2.5 times that bound,
as :data:`rla.diagnosis.scale.FAR` is to the k3 bound) and :data:`TOLERANCE`.

What this gives on the bundled model -- how far rounding moves the fit, what rollouts sampled hot
or cold and recorded at 1.0 fit, what rollouts of a noised checkpoint fit -- is the table in
docs/diagnosis.md ("The temperature fit").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

import rla.metrics as M

__all__ = ["FACTORS", "FLOOR", "FAR_T", "TOLERANCE", "MIN_TOKENS", "FIT_TOKENS", "TemperatureFit",
           "fit_factor", "fit_temperature", "fit_rows", "at_factor"]

FACTORS = tuple(2.0 ** (k / 24) for k in range(-48, 49))
"""Temperature factors tried: 1/4 to 4, 2.9% apart, 1.0 exactly among them."""
ONE = FACTORS.index(1.0)

FLOOR = 1e-5
"""Tokens whose recorded surprisal -log mu is below this are left out: fp32 resolves a logprob near
0 in steps of about 1.2e-7 (the spacing of floats at 1 in ``log(1 + eps)``), 1% of 1e-5."""
_QUANTUM = 1e-7  # a surprisal below fp32's resolution near 0 is taken as this
_CEILING = 1e3  # a token another temperature's top-k / top-p filters out (-inf) is taken as this

FAR_T = 5.0
"""The fit is far when |log f| exceeds FAR_T x the most rounding moves it (2.5x the 2x bound)."""
TOLERANCE = 0.01
"""And when it exceeds this (a temperature within 1% of the record's is not called wrong)."""
MIN_TOKENS = 16
"""The fit is not made on fewer tokens above :data:`FLOOR` (each gives the temperature ratio to
about its log-surprisal's rounding error, 0.5-1% of it, before averaging)."""
FIT_TOKENS = 32768
"""At most about this many response tokens are fitted (the first records, in order): the fit needs
few, and its grid costs ``len(FACTORS)`` numbers per token."""


def fit_rows(lengths) -> list[int]:
    """The records the fit uses: the first ones, until :data:`FIT_TOKENS` response tokens (at least one)."""
    rows, total = [], 0
    for i, n in enumerate(lengths):
        if rows and total + n > FIT_TOKENS:
            break
        rows.append(i)
        total += n
    return rows


def _log_surprisal(logp: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.clip(-logp, _QUANTUM, _CEILING))


def _curve(grid: np.ndarray, target: np.ndarray, use: np.ndarray) -> np.ndarray:
    """Mean squared log-surprisal difference per factor over the tokens ``use`` ([F])."""
    d = _log_surprisal(grid[use]) - _log_surprisal(target[use])[:, None]
    return (d**2).mean(axis=0)


def fit_factor(curve: np.ndarray) -> tuple[float, bool]:
    """``(factor, at_edge)``: the grid minimum refined by a parabola in log f; ``at_edge`` when the
    minimum is the grid's first or last factor (the true one may lie beyond)."""
    j = int(np.argmin(curve))
    x = math.log(FACTORS[j])
    if 0 < j < len(FACTORS) - 1:
        y0, y1, y2 = curve[j - 1 : j + 2]
        den = y0 - 2 * y1 + y2
        if den > 0:
            h = math.log(FACTORS[j + 1]) - x
            x += h * (y0 - y2) / (2 * den)
        return math.exp(x), False
    return math.exp(x), True


def at_factor(grid: np.ndarray, factor: float) -> np.ndarray:
    """The logprobs at ``factor``, linear in log f between the two nearest grid factors (the grid is
    2.9% apart; a 1% error already moves a logprob of -3 by 0.03, more than rounding does)."""
    x = np.log(FACTORS)
    t = float(np.clip(math.log(factor), x[0], x[-1]))
    j = int(np.clip(np.searchsorted(x, t) - 1, 0, len(x) - 2))
    w = (t - x[j]) / (x[j + 1] - x[j])
    lo, hi = grid[..., j], grid[..., j + 1]
    with np.errstate(invalid="ignore"):
        out = (1 - w) * lo + w * hi
    return np.where(np.isfinite(lo) & np.isfinite(hi), out, np.where(w < 0.5, lo, hi))


@dataclass
class TemperatureFit:
    factor: float
    """The factor f (fitted temperature / recorded) of the profile's forward that explains the
    records best at its fitted temperature (``label``)."""
    at_edge: bool
    by_group: dict[str, float]
    """profile group label -> the fitted factor of its forward against the records."""
    rounding: dict[str, float]
    """profile group label -> the factor its bf16 forward fits against the fp32 forward (rounding only)."""
    threshold: float
    """|log f| beyond which the fit is far: max(FAR_T x max |log rounding factor|, TOLERANCE)."""
    tokens: int
    sequences: int
    k3_record: float = float("nan")
    """The lowest k3 of a profile's forward against the records at their temperature (fit rows)."""
    k3_fit: float = float("nan")
    """k3 of ``label``'s forward at its fitted factor (:func:`at_factor`): what the fitted temperature explains."""
    per_sequence: dict[int, float] = field(default_factory=dict)
    """0-based input index -> that sequence's own fitted factor (``label``'s forward), where it has
    at least a few tokens to fit."""
    label: str = ""
    temperatures: tuple[float, ...] = ()
    """The recorded temperatures of the fitted records (distinct, sorted)."""

    @property
    def far(self) -> bool:
        """The fit is farther from the records' temperature than rounding moves it, and the fitted
        temperature explains the records better (lower k3) than theirs."""
        return abs(math.log(self.factor)) > self.threshold and self.k3_fit < self.k3_record

    @property
    def rounding_moves(self) -> float:
        """The most rounding moved the fit, as a fraction (max over profiles of |f_P - 1|)."""
        return max(abs(f - 1) for f in self.rounding.values())

    def flagged(self) -> list[int]:
        return sorted(i for i, f in self.per_sequence.items() if abs(math.log(f)) > self.threshold)

    def to_dict(self) -> dict:
        return {"factor": self.factor, "at_edge": self.at_edge, "far": self.far, "best_profile": self.label,
                "k3_record": self.k3_record, "k3_fit": self.k3_fit,
                "by_group": self.by_group, "rounding": self.rounding, "threshold": self.threshold,
                "tokens": self.tokens, "sequences": self.sequences, "temperatures": list(self.temperatures),
                "per_sequence": {str(k): v for k, v in self.per_sequence.items()}}


def fit_temperature(grids: dict[str, np.ndarray], reference: np.ndarray, mu: np.ndarray, mask: np.ndarray,
                    indices=None, temperatures=()) -> TemperatureFit | None:
    """The fit (module docstring), or None when fewer than :data:`MIN_TOKENS` tokens qualify.

    ``grids``: group label -> [B, R, len(FACTORS)] training logprobs; ``reference``: [B, R] the fp32
    forward's at the recorded temperature; ``mu``/``mask``: the records'; all over the same rows.
    Each group's forward is fitted; the one reported is the group that explains the records best
    at its fitted temperature (lowest k3 there). ``indices``: each row's 0-based input index, for
    ``per_sequence``; ``temperatures``: each row's recorded temperature (for the message).
    """
    use = mask & (-mu >= FLOOR) & np.isfinite(mu)
    if int(use.sum()) < MIN_TOKENS:
        return None
    by_group, rounding, edges, k3_at_fit, k3_at_record = {}, {}, {}, {}, {}
    for label, g in grids.items():  # rounding is measured on the tokens the records' fit uses
        by_group[label], edges[label] = fit_factor(_curve(g, mu, use))
        rounding[label] = fit_factor(_curve(g, reference, use))[0]
        k3_at_fit[label] = M.mismatch(at_factor(g, by_group[label]), mu, mask)["mismatch/k3"]
        k3_at_record[label] = M.mismatch(g[..., ONE], mu, mask)["mismatch/k3"]
    best = min(k3_at_fit, key=k3_at_fit.get)
    spread = max(abs(math.log(f)) for f in rounding.values())
    indices = list(range(mask.shape[0])) if indices is None else list(indices)
    per_seq = {}
    g = grids[best]
    for row in range(mask.shape[0]):
        if use[row].sum() >= 4:
            per_seq[indices[row]] = fit_factor(_curve(g[row : row + 1], mu[row : row + 1], use[row : row + 1]))[0]
    return TemperatureFit(by_group[best], edges[best], by_group, rounding, max(FAR_T * spread, TOLERANCE),
                          int(use.sum()), int(use.any(axis=1).sum()), min(k3_at_record.values()), k3_at_fit[best],
                          per_seq, best, tuple(sorted({float(t) for t in temperatures})))
