"""rla.rl.experiment_summary.stats: the statistics over seeds that every summary table prints,
against Python's own ``statistics`` module (an independent expression of the same definitions)."""

import math
import random
import statistics

from rla.rl.experiment_summary import stats


def test_mean_sample_std_and_range_match_the_statistics_module():
    rng = random.Random(21)
    for n in (2, 3, 5, 17):
        xs = [rng.uniform(-1, 1) * 10 ** rng.randint(-6, 2) for _ in range(n)]
        s = stats(xs)
        assert s["n"] == n
        assert math.isclose(s["mean"], statistics.fmean(xs), rel_tol=1e-12, abs_tol=1e-300)
        assert math.isclose(s["std"], statistics.stdev(xs), rel_tol=1e-12)  # sample std, ddof=1
        assert (s["min"], s["max"]) == (min(xs), max(xs))


def test_three_seeds_sample_not_population():
    # the GRPO table's three final rewards of one arm: ddof=1 gives 0.0189, ddof=0 gave the old 0.0155
    s = stats([0.584375, 0.621875, 0.5984375])
    assert round(s["std"], 4) == 0.0189
    assert round(statistics.pstdev([0.584375, 0.621875, 0.5984375]), 4) == 0.0155


def test_one_seed_has_no_std_and_non_numbers_are_left_out():
    assert stats([0.5]) == {"mean": 0.5, "std": None, "min": 0.5, "max": 0.5, "n": 1}
    s = stats([1.0, float("nan"), None, "x", 3.0, float("inf")])
    assert s["n"] == 2 and s["mean"] == 2.0 and math.isclose(s["std"], math.sqrt(2))
    assert stats([]) == {"mean": None, "std": None, "min": None, "max": None, "n": 0}
