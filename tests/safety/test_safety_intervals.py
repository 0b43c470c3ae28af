"""The median's order-statistic interval at any number of ok runs: 2^n overflows a float from n = 1024, so
the binomial tail is divided as exact integers (no OverflowError, the same levels as exact fractions)."""
from __future__ import annotations

import math
from fractions import Fraction

from zcorch.results.intervals import ci_width_pct, median_ci, median_ci_level, median_ci_rank


def _exact(n: int, k: int) -> float:
    return float(1 - Fraction(2 * sum(math.comb(n, i) for i in range(k)), 2 ** n))


def test_levels_at_and_beyond_1024_runs_are_exact():
    for n, k in ((1024, 1), (1024, 481), (1025, 400), (3000, 1450)):
        assert math.isclose(median_ci_level(n, k), _exact(n, k), rel_tol=1e-12, abs_tol=1e-15)
    assert math.isclose(median_ci_level(1024, 512), _exact(1024, 512), rel_tol=1e-12)


def test_a_cell_of_many_ok_runs_has_its_95_percent_interval():
    for n in (1023, 1024, 1500):
        values = [float(i) for i in range(n)]
        low, high, level = median_ci(values)
        k = median_ci_rank(n)
        assert level >= 0.95 and median_ci_level(n, k + 1) < 0.95
        assert (low, high) == (values[k - 1], values[n - k])
        assert math.isfinite(ci_width_pct(values))
