"""Counting bit equality: an engine's outputs against the spec's, under every combination of points.

Calibration's one measurement. Two outputs are compared element by element (NaN equals NaN);
an element that differs is measured in ulps, by mapping sign-magnitude bit patterns to integers
in numeric order, so the report can say how far the best candidate still is where it is not
exact. An :class:`Experiment` is one engine function (or chain) run once per probe, against the
spec's output for each combination of the rounding points it depends on; its counts are what
:mod:`rla.engines.decisions` turns into a choice per point.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from rla.profiles import POINTS, get

__all__ = ["ordered_bits", "count_equal", "Experiment", "run_combinations"]


def ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """Sign-magnitude bit patterns mapped to integers in numeric order (ulp steps apart)."""
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[t.dtype]
    i = t.contiguous().view(bits).to(torch.int64)
    mag = i & ((1 << (8 * t.element_size() - 1)) - 1)
    return torch.where(i < 0, -mag, mag)


def count_equal(engine: torch.Tensor, spec: torch.Tensor) -> tuple[int, int, int]:
    """(equal elements, elements, max ulp distance of the unequal ones)."""
    if engine.shape != spec.shape or engine.dtype != spec.dtype:
        raise ValueError(f"engine output {tuple(engine.shape)} {engine.dtype} vs spec {tuple(spec.shape)} {spec.dtype}")
    eq = (engine == spec) | (engine.isnan() & spec.isnan())
    n_eq = int(eq.sum())
    ulp = 0 if n_eq == eq.numel() else int((ordered_bits(engine) - ordered_bits(spec))[~eq].abs().max())
    return n_eq, eq.numel(), ulp


@dataclass
class Experiment:
    """One engine function (or chain) on its probes against the spec under every combination of
    ``points``; ``counts[combo] = [equal, total, max_ulp]``."""

    name: str
    points: tuple[str, ...]
    counts: dict = field(default_factory=dict)
    evidence: str = ""

    def add(self, combo: tuple[str, ...], engine_outs, spec_outs) -> None:
        c = self.counts.setdefault(combo, [0, 0, 0])
        for e, s in zip(engine_outs, spec_outs):
            n_eq, n, ulp = count_equal(e, s)
            c[0] += n_eq
            c[1] += n
            c[2] = max(c[2], ulp)


def run_combinations(exp: Experiment, cases, engine_fn, spec_fn, fixed: dict) -> Experiment:
    """``cases``: probe list; ``engine_fn(case) -> outputs``; ``spec_fn(case, profile) -> outputs``."""
    base = get("hf").replace(**fixed)
    combos = list(itertools.product(*(POINTS[p] for p in exp.points)))
    for case in cases:
        engine_outs = engine_fn(case)
        for combo in combos:
            exp.add(combo, engine_outs, spec_fn(case, base.replace(**dict(zip(exp.points, combo)))))
    return exp
