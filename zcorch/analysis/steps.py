"""Change points in a series of sweep medians: a piecewise-constant fit with a penalty per step.

The idea is asv's (airspeed velocity, asv/step_detect.py, after Friedrich et al. 2008, "Complexity
penalized M-estimation"): a nightly metric is a constant plus noise that now and then jumps to another
constant. Among all ways to cut the series into segments, take the one that minimises

    penalty × (number of segments) + Σ_segments Σ_i w_i · |y_i − level of its segment|

with w_i = 1 / σ_i, σ_i the noise of point i, and each level the weighted median of its segment (the
minimiser of the weighted absolute deviations). The absolute deviation (not the square) keeps one wild
night from pulling a level; the weights make a step count in units of each night's own noise, so a
noisy series needs a bigger step than a quiet one. The fit is exact: dynamic programming over every
segmentation (O(n²) segments, each cost computed vectorised), fine for the few hundred nights a lab keeps.

The noise of a point (point_sigmas) is its standard error of the median, read off the CI (at the level that CI really has) that
zcorch.analysis.stats computes per sweep (half-width / 1.96); a point without CI (fewer than two ok
runs) gets the median of the others. Two corrections keep the weights honest:

- a floor of FLOOR_REL × the series' median level: identical repeats give a zero-width CI, and a
  0.1% wobble of a 0%-noise series is not a change;
- nights differ more than runs within a night do (another boot, another page cache): with at least
  MIN_FOR_SCALE points, all σ_i are scaled up by the robust spread (MAD) of the consecutive
  differences measured in those σ (a step moves one difference, the MAD ignores it), when it is > 1.

The penalty (default_penalty) grows with log n, as the Schwarz criterion does: for pure noise the best
split of a segment saves about 0.64·χ²₁ in σ units (near its median the L1 cost is quadratic, curvature
2·φ(0)), and the largest of n such savings grows like 2·log n. The penalty 2 + 2·log n was calibrated on
simulated nights (Gaussian, heteroscedastic, CIs that only estimate the noise, heavy tails;
tests/test_history_steps.py): a false step in about 0.3% of series of 3 to 5 nights and none from 10 on,
while a step of 3σ lasting 5 of 30 nights is found two times in three and one night 10σ off nine in ten.
A lone night a few σ off does not cost a step; the newest night's regression is judged by the Mann–Whitney
comparison of zcorch.analysis.history, which does not wait for the fit to cut it off.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

FLOOR_REL = 0.002           # σ_i >= 0.2% of the series' median level
# Points needed to estimate how much more nights vary than their CIs say: as many as a change point needs.
# With fewer the fit would take a new nightly job's night-to-night wobble for steps (and
# zcorch.analysis.detector would then hold the newest night against a one- or two-night "level").
MIN_FOR_SCALE = 4
PENALTY_PER_LOG = 2.0
PENALTY_CONST = 2.0
Z95 = 1.959963984540054     # normal quantile of a two-sided 95% interval
# Fewer nights than this support no change point: with two or three, a "step" is one night against one or
# two others, which is what the newest sweep's Mann–Whitney comparison judges (and says whether it is
# significant); a step drawn there would claim what that verdict does not.
MIN_POINTS_FOR_STEPS = 4


@dataclass(frozen=True)
class Segment:
    start: int    # first index (into the series given to fit_steps, NaN points included)
    end: int      # one past the last index
    level: float  # weighted median of the segment's points


@dataclass(frozen=True)
class StepFit:
    segments: List[Segment]
    sigma: np.ndarray     # the noise used for each point (NaN where y is NaN)
    penalty: float

    @property
    def steps(self) -> List[int]:
        """Indices where a new level begins (the first point of every segment but the first)."""
        return [s.start for s in self.segments[1:]]

    def segment_of(self, index: int) -> int:
        """Position in `segments` of the segment holding point `index`."""
        for k, s in enumerate(self.segments):
            if s.start <= index < s.end:
                return k
        raise IndexError(index)


def default_penalty(n: int) -> float:
    return PENALTY_CONST + PENALTY_PER_LOG * math.log(max(n, 2))


def point_sigmas(y: Sequence[float], ci_low: Optional[Sequence[float]] = None,
                 ci_high: Optional[Sequence[float]] = None,
                 ci: "float | Sequence[float]" = 0.95) -> np.ndarray:
    """The noise σ_i of each point from its confidence interval (see the module docstring); NaN
    where y is NaN. `ci`: the level of every interval, or of each one (an interval of three runs is a
    75% one: read off as if it were 95% it would make σ 1.7× too small)."""
    y = np.asarray(y, dtype="float64")
    n = len(y)
    known = np.isfinite(y)
    s = np.full(n, np.nan) if ci_low is None or ci_high is None else ci_sds(ci_low, ci_high, ci)
    s = np.where(known & np.isfinite(s), s, np.nan)
    level = float(np.median(np.abs(y[known]))) if known.any() else 0.0
    floor = max(FLOOR_REL * level, 1e-12)
    if np.isfinite(s).any():
        fill = float(np.nanmedian(s))
    else:  # no CI anywhere: the spread of the consecutive differences is all there is
        d = np.diff(y[known])
        fill = float(np.median(np.abs(d)) / (0.6745 * math.sqrt(2))) if len(d) else floor
    s = np.where(np.isfinite(s), s, fill)
    s = np.maximum(s, floor)
    idx = np.flatnonzero(known)
    if len(idx) >= MIN_FOR_SCALE:
        yk, sk = y[idx], s[idx]
        z = np.diff(yk) / np.sqrt(sk[1:] ** 2 + sk[:-1] ** 2)
        scale = 1.4826 * float(np.median(np.abs(z - np.median(z))))
        if scale > 1:
            s = s * scale
    return np.where(known, s, np.nan)


def ci_sds(ci_low: Sequence[float], ci_high: Sequence[float], ci: "float | Sequence[float]" = 0.95) -> np.ndarray:
    """The sampling sd of each median read off its interval (half-width / z of the level it really has),
    with no floor and no scaling; NaN where there is no interval. zcorch.analysis.detector uses these raw."""
    low = np.asarray(ci_low, dtype="float64")
    n = len(low)
    levels = np.broadcast_to(np.asarray(ci, dtype="float64"), (n,))
    z = np.array([Z95 if c == 0.95 else _normal_quantile((1 + c) / 2) if 0 < c < 1 else np.nan for c in levels])
    s = (np.asarray(ci_high, dtype="float64") - low) / (2 * z)
    return np.where(np.isfinite(s) & (s >= 0), s, np.nan)


def _normal_quantile(p: float) -> float:
    from statistics import NormalDist
    return NormalDist().inv_cdf(p)


def _segment_costs(y: np.ndarray, w: np.ndarray) -> "tuple[np.ndarray, np.ndarray]":
    """cost[a, b] = min over m of Σ_{a<=i<b} w_i |y_i − m| and level[a, b] = that m (the weighted
    median), for 0 <= a < b <= n; +inf / NaN elsewhere."""
    n = len(y)
    cost = np.full((n, n + 1), np.inf)
    level = np.full((n, n + 1), np.nan)
    for a in range(n):
        ys, ws = y[a:], w[a:]
        m = n - a
        order = np.argsort(ys, kind="stable")
        sv, sw = ys[order], ws[order]
        # row r: the segment y[a : a + r + 1]; column j: the j-th smallest value of y[a:]
        inside = order[None, :] <= np.arange(m)[:, None]
        weights = np.where(inside, sw[None, :], 0.0)
        cum = np.cumsum(weights, axis=1)
        k = np.argmax(cum >= cum[:, -1:] / 2, axis=1)
        med = sv[k]
        cost[a, a + 1:] = (weights * np.abs(sv[None, :] - med[:, None])).sum(axis=1)
        level[a, a + 1:] = med
    return cost, level


def fit_steps(y: Sequence[float], sigma: Optional[Sequence[float]] = None,
              penalty: Optional[float] = None) -> StepFit:
    """The best piecewise-constant fit of `y` (module docstring). `sigma`: the noise of each point
    (default: point_sigmas(y), i.e. from the spread of the differences); NaN points are skipped and
    belong to the segment around them. `penalty`: cost of one more segment, in σ units
    (default_penalty of the number of points)."""
    y = np.asarray(y, dtype="float64")
    sigma = point_sigmas(y) if sigma is None else np.asarray(sigma, dtype="float64")
    idx = np.flatnonzero(np.isfinite(y))
    n = len(idx)
    if n == 0:
        return StepFit([], sigma, math.nan)
    penalty = default_penalty(n) if penalty is None else float(penalty)
    yk = y[idx]
    sk = sigma[idx]
    if not np.all(np.isfinite(sk) & (sk > 0)):
        raise ValueError("every point with a value needs a positive, finite sigma")
    cost, level = _segment_costs(yk, 1.0 / sk)
    if n < MIN_POINTS_FOR_STEPS:
        return StepFit([Segment(0, len(y), float(level[0, n]))], sigma, penalty)
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    back = np.zeros(n + 1, dtype=int)
    for b in range(1, n + 1):
        total = best[:b] + cost[:b, b] + penalty
        a = int(np.argmin(total))  # the earliest start among equals: fewer, later steps win ties
        best[b], back[b] = total[a], a
    cuts = []
    b = n
    while b > 0:
        cuts.append((int(back[b]), b))
        b = back[b]
    cuts.reverse()
    segments = []
    for k, (a, b) in enumerate(cuts):
        start = 0 if k == 0 else int(idx[a])
        end = len(y) if k == len(cuts) - 1 else int(idx[b])
        segments.append(Segment(start, end, float(level[a, b])))
    return StepFit(segments, sigma, penalty)
