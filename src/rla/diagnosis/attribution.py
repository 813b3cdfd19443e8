"""Exact Shapley attribution of a mismatch metric to the aligned regions.

The game: a coalition S of regions is aligned to the profile, the rest run as HF eager, and
m(S) is the mismatch metric of the training forward against the rollouts. The value of S is
the mismatch it removes, v(S) = m({}) - m(S). Each region's Shapley value is its average
marginal contribution over all orders in which regions could be aligned, so the values are
fair when regions interact (aligning the norm can matter more once RoPE is aligned) and they
sum exactly to v(all) = m({}) - m(all). What full alignment leaves, m(all), is the share no
rounding profile explains: GEMM and attention kernel differences, decode vs. prefill.
"""

from __future__ import annotations

from itertools import combinations
from math import factorial

__all__ = ["subsets", "shapley"]


def subsets(regions: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Every subset of ``regions``, smallest first, each in ``regions`` order."""
    return [c for k in range(len(regions) + 1) for c in combinations(regions, k)]


def shapley(values: dict[frozenset, float], regions: tuple[str, ...]) -> dict[str, float]:
    """Shapley value of each region for the game ``v(S) = values[{}] - values[S]``.

    ``values`` maps every subset (as a frozenset) to the metric measured with that subset aligned.
    """
    n = len(regions)
    missing = [s for s in subsets(regions) if frozenset(s) not in values]
    if missing:
        raise ValueError(f"shapley needs the metric for every subset; missing {missing}")
    base = values[frozenset()]

    def v(s):
        return base - values[frozenset(s)]

    phi = {}
    for r in regions:
        others = tuple(x for x in regions if x != r)
        total = 0.0
        for s in subsets(others):
            weight = factorial(len(s)) * factorial(n - len(s) - 1) / factorial(n)
            total += weight * (v(s + (r,)) - v(s))
        phi[r] = total
    return phi
