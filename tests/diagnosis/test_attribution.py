import itertools
import math

import pytest

from rla.diagnosis.attribution import shapley, subsets

REGIONS = ("rope", "swiglu", "rmsnorm")


def by_permutations(values, regions):
    """Shapley by its definition: average marginal gain over all n! orders."""
    phi = dict.fromkeys(regions, 0.0)
    base = values[frozenset()]
    orders = list(itertools.permutations(regions))
    for order in orders:
        have = set()
        for r in order:
            before = base - values[frozenset(have)]
            have.add(r)
            phi[r] += (base - values[frozenset(have)]) - before
    return {r: p / len(orders) for r, p in phi.items()}


def test_additive_game_gives_each_region_its_own_effect():
    effect = {"rope": 5e-3, "swiglu": 1e-3, "rmsnorm": 2e-3}
    values = {frozenset(s): 1e-2 - sum(effect[r] for r in s) for s in subsets(REGIONS)}
    phi = shapley(values, REGIONS)
    for r in REGIONS:
        assert phi[r] == pytest.approx(effect[r], rel=1e-12)


def test_interacting_game_matches_the_permutation_definition_and_sums_to_total():
    values = {frozenset(s): v for s, v in zip(subsets(REGIONS), [9.0, 4.0, 8.5, 8.0, 1.0, 3.5, 7.0, 0.5])}
    phi = shapley(values, REGIONS)
    want = by_permutations(values, REGIONS)
    assert phi == pytest.approx(want, rel=1e-12)
    assert math.isclose(sum(phi.values()), values[frozenset()] - values[frozenset(REGIONS)], rel_tol=1e-12)


def test_missing_subset_is_an_error():
    with pytest.raises(ValueError, match="missing"):
        shapley({frozenset(): 1.0}, REGIONS)


def test_subsets_enumerates_all():
    s = subsets(REGIONS)
    assert len(s) == 8 and s[0] == () and s[-1] == REGIONS
