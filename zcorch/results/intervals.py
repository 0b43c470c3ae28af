"""The sign-test confidence interval of a median (zcorch.analysis.stats says why), and how close a cell's runs
are to a target. Stdlib only, exact integers: the sweep's loop asks after every run and must not load scipy.
"""
from __future__ import annotations

import math
from typing import Sequence, Tuple

CI = 0.95  # the level asked for unless told otherwise


def median_ci_level(n: int, k: int) -> float:
    """Coverage of [x(k), x(n+1-k)] for the median of n independent runs: P(k ≤ B ≤ n-k), B ~ Bin(n, 1/2);
    NaN when there is no such interval (n < 2, k outside 1..n//2)."""
    if n < 2 or not 1 <= k <= n // 2:
        return math.nan
    tail = sum(math.comb(n, i) for i in range(k))  # P(B ≤ k-1) × 2^n
    return _level(n, tail)


def _level(n: int, tail: int) -> float:
    """1 - 2 tail / 2^n, the quotient of the two integers rounded once (a float of 2^n overflows from n = 1024)."""
    return 1.0 - (2 * tail) / (1 << n)


def median_ci_rank(n: int, ci: float = CI) -> int:
    """k of the narrowest [x(k), x(n+1-k)] with coverage ≥ ci; 1 (min–max) when none reaches ci; 0 for n < 2.
    The binomial tail is summed once, term by term (exact integers, any n)."""
    if n < 2:
        return 0
    k, term, tail = 1, n, 1   # term = C(n, k), tail = the sum of C(n, i) for i < k
    while k + 1 <= n // 2:
        tail += term            # now the sum of C(n, i), i ≤ k: the tail of k + 1
        if _level(n, tail) < ci:
            break
        term = term * (n - k) // (k + 1)
        k += 1
    return k


def _finite_sorted(values: Sequence[float]) -> list:
    return sorted(float(v) for v in values if v is not None and v == v)  # v == v: not NaN


def median_ci(values: Sequence[float], ci: float = CI) -> Tuple[float, float, float]:
    """(low, high, level): the order-statistic confidence interval of the median of `values` (NaNs left
    out) and the confidence level it really has (below `ci` when too few values reach it); NaNs for < 2."""
    x = _finite_sorted(values)
    k = median_ci_rank(len(x), ci)
    if k == 0:
        return math.nan, math.nan, math.nan
    return x[k - 1], x[len(x) - k], median_ci_level(len(x), k)


def min_runs_for(ci: float = CI) -> int:
    """The fewest runs whose [min, max] covers the median with at least `ci` (95%: 6)."""
    n = 2
    while median_ci_level(n, 1) < ci:
        n += 1
    return n


def ci_width_pct(values: Sequence[float], ci: float = CI) -> float:
    """How far the median's interval at level `ci` reaches from the median (its larger side, in % of the
    median): what `repeats: {target_ci}` holds a cell to. inf without such an interval or with median 0."""
    x = _finite_sorted(values)
    low, high, level = median_ci(x, ci)
    if not x or not level >= ci:
        return math.inf
    n = len(x)
    med = x[n // 2] if n % 2 else (x[n // 2 - 1] + x[n // 2]) / 2
    if not med:
        return math.inf
    return max(med - low, high - med) / abs(med) * 100
