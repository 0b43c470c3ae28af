"""Change points in a series of sweep medians: a piecewise-constant fit with a penalty per step.

asv's method (asv/step_detect.py, after Friedrich et al. 2008): among all segmentations, the one minimising
penalty × segments + Σ w_i·|y_i − level of its segment|, with w_i = 1/σ_i and each level the segment's weighted
median, so one wild night does not pull a level and a step counts in units of each night's own noise. The fit is
exact (dynamic programming over every segmentation, _optimal_partition compiled by numba).

σ_i (point_sigmas) is the standard error of the median read off the sweep's CI, floored at FLOOR_REL × the
series' level, and scaled up by the MAD of consecutive differences when nights differ more than runs do.
The penalty 2 + 2·log n (default_penalty) grows as the largest of n noise-only savings does; its calibration
on simulated nights is in docs/performance.md and tests/test_history_steps.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numba
from numba.cpython.unsafe.numbers import leading_zeros, trailing_zeros
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


def median_of(x: np.ndarray) -> float:
    """np.median of a short 1-d array without NaN, the same float (the middle value, or the two middle ones'
    sum halved, as np.median's mean of them): without np.median's general machinery, ~10 µs a call, and a
    fleet's history asks several per series (point_sigmas) and per judged window (zcorch.analysis.detector)."""
    s = np.sort(x)
    n = len(s)
    h = n // 2
    return float(s[h]) if n % 2 else float((s[h - 1] + s[h]) / 2)


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
    level = median_of(np.abs(y[known])) if known.any() else 0.0
    floor = max(FLOOR_REL * level, 1e-12)
    finite = np.isfinite(s)
    if finite.any():
        fill = median_of(s[finite])   # np.nanmedian's value
    else:  # no CI anywhere: the spread of the consecutive differences is all there is
        d = np.diff(y[known])
        fill = float(median_of(np.abs(d)) / (0.6745 * math.sqrt(2))) if len(d) else floor
    s = np.where(np.isfinite(s), s, fill)
    s = np.maximum(s, floor)
    idx = np.flatnonzero(known)
    if len(idx) >= MIN_FOR_SCALE:
        yk, sk = y[idx], s[idx]
        z = np.diff(yk) / np.sqrt(sk[1:] ** 2 + sk[:-1] ** 2)
        scale = 1.4826 * median_of(np.abs(z - median_of(z)))
        if scale > 1:
            s = s * scale
    return np.where(known, s, np.nan)


def ci_sds(ci_low: Sequence[float], ci_high: Sequence[float], ci: "float | Sequence[float]" = 0.95) -> np.ndarray:
    """The sampling sd of each median read off its interval (half-width / z of the level it really has),
    with no floor and no scaling; NaN where there is no interval. zcorch.analysis.detector uses these raw."""
    low = np.asarray(ci_low, dtype="float64")
    n = len(low)
    levels = np.broadcast_to(np.asarray(ci, dtype="float64"), (n,))
    # one quantile per distinct level (a series has a few: one per count of ok runs)
    z = np.full(n, np.nan)
    for c in np.unique(levels[np.isfinite(levels)]).tolist():
        z[levels == c] = Z95 if c == 0.95 else _normal_quantile((1 + c) / 2) if 0 < c < 1 else np.nan
    s = (np.asarray(ci_high, dtype="float64") - low) / (2 * z)
    return np.where(np.isfinite(s) & (s >= 0), s, np.nan)


def _normal_quantile(p: float) -> float:
    from statistics import NormalDist
    return NormalDist().inv_cdf(p)


# Numerical slack of the fit's comparison of one segmentation's total against the best so far, relative to
# the totals: totals equal in exact arithmetic (equal weights, a point exactly between two levels) are taken
# as equal, and the one whose last segment starts earliest wins (fewer, later steps), whatever the rounding
# of the order in which their sums were added.
_TIE = 1e-9


@numba.njit(cache=True, nogil=True)
def _next_member(members, p):  # pragma: no cover - compiled
    """The lowest rank above p whose bit is set (one exists)."""
    i = p + 1
    k = i >> 6
    word = members[k] >> np.uint64(i & 63)
    if word != 0:
        return i + trailing_zeros(word)
    k += 1
    while members[k] == 0:
        k += 1
    return (k << 6) + trailing_zeros(members[k])


@numba.njit(cache=True, nogil=True)
def _previous_member(members, p):  # pragma: no cover - compiled
    """The highest rank below p whose bit is set (one exists)."""
    i = p - 1
    k = i >> 6
    j = i & 63
    word = members[k] if j == 63 else members[k] & ((np.uint64(1) << np.uint64(j + 1)) - np.uint64(1))
    while word == 0:
        k -= 1
        word = members[k]
    return (k << 6) + 63 - leading_zeros(word)


@numba.njit(cache=True, nogil=True)
def _optimal_partition(y, w, order, rank, penalty):  # pragma: no cover - compiled (by _optimal_partitions)
    """The exact dynamic programme of fit_steps in O(n^2) updates, no n x n table kept.

    best[b] = min over a < b of best[a] + cost(a, b) + penalty, cost(a, b) = min over m of
    sum_{a<=i<b} w_i |y_i - m|. For each end b the start a runs from b - 1 down to 0, adding y[a] to the
    segment; its weighted median is kept as a pointer into the sorted order of the whole series (order:
    indices by value, ties by index, as a stable argsort; rank: its inverse) that moves over the ranks of the
    segment's own points (a is <= index < b), with the weights and weighted values at or below it, so that
    each cost is O(1) from those sums; the pointer skips the ranks of other points 64 at a time (a bit set of
    the segment's ranks). Returns back[b] (the start of the last segment of the best fit
    of y[:b]) and the rank of the weighted median of that segment."""
    n = len(y)
    best = np.empty(n + 1)
    best[0] = 0.0
    back = np.zeros(n + 1, dtype=np.int64)
    members = np.zeros((n >> 6) + 1, dtype=np.uint64)
    for b in range(1, n + 1):
        p = rank[b - 1]          # the segment y[b-1 : b]: its only point is its median
        members[:] = 0           # the ranks of the segment's points, a bit each
        members[p >> 6] |= np.uint64(1) << np.uint64(p & 63)
        w_le = w[b - 1]          # weights of the segment's points at ranks <= p
        s_le = w[b - 1] * y[b - 1]
        w_all = w_le
        s_all = s_le
        top = np.inf
        arg = b - 1
        for a in range(b - 1, -1, -1):
            if a < b - 1:
                q = rank[a]
                members[q >> 6] |= np.uint64(1) << np.uint64(q & 63)
                w_all += w[a]
                s_all += w[a] * y[a]
                if q <= p:
                    w_le += w[a]
                    s_le += w[a] * y[a]
                half = 0.5 * w_all
                # the median: the lowest rank whose cumulative weight reaches half of all (where two ranks
                # tie, either one gives the same cost; the segment's level is taken by _weighted_median)
                while w_le < half:          # too little at or below: up to the next point of the segment
                    p = _next_member(members, p)
                    w_le += w[order[p]]
                    s_le += w[order[p]] * y[order[p]]
                # enough without the point at p (then a point of the segment lies below it, weight > 0):
                # down to the previous one
                while w_le - w[order[p]] >= half:
                    w_le -= w[order[p]]
                    s_le -= w[order[p]] * y[order[p]]
                    p = _previous_member(members, p)
            m = y[order[p]]
            cost = (s_all - s_le) - m * (w_all - w_le) + m * w_le - s_le
            if cost < 0.0:
                cost = 0.0
            total = best[a] + cost + penalty
            # a descends: an earlier start equal to the best so far (within the slack) takes its place
            if top == np.inf or total <= top + _TIE * (abs(top) + 1.0):
                if total < top:
                    top = total
                arg = a
        best[b] = top
        back[b] = arg
    return back


def _weighted_median(y: np.ndarray, w: np.ndarray) -> float:
    """The level of a segment: the lowest value whose cumulative weight (values sorted, ties by index)
    reaches half of all."""
    order = np.argsort(y, kind="stable")
    cum = np.cumsum(w[order])
    return float(y[order][int(np.argmax(cum >= cum[-1] / 2))])


@numba.njit(cache=True, nogil=True)
def _optimal_partitions(y, w, order, rank, penalty, offsets):  # pragma: no cover - compiled
    """_optimal_partition of each series k, y[offsets[k]:offsets[k + 1]] (and w, order, rank alike; order and
    rank within the series), with penalty[k]: its back array at offsets[k] + k, n + 1 values. One call for many
    series: the GIL is released once for all of them (fit_many)."""
    back = np.empty(len(y) + len(offsets) - 1, dtype=np.int64)
    for k in range(len(offsets) - 1):
        a, b = offsets[k], offsets[k + 1]
        back[a + k:b + k + 1] = _optimal_partition(y[a:b], w[a:b], order[a:b], rank[a:b], penalty[k])
    return back


@dataclass(frozen=True)
class _Prepared:
    """A series ready for _optimal_partition: its points with a value, centred, their weights, order and ranks."""
    n_all: int
    idx: np.ndarray
    yk: np.ndarray
    wk: np.ndarray
    centre: float
    order: np.ndarray
    rank: np.ndarray
    sigma: np.ndarray
    penalty: float


def _prepare(y: Sequence[float], sigma: Optional[Sequence[float]], penalty: Optional[float]) -> "_Prepared | StepFit":
    """What fit_steps gives `_optimal_partition`, or the fit itself when it needs none (no point, or too few)."""
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
    wk = 1.0 / sk
    if n < MIN_POINTS_FOR_STEPS:
        return StepFit([Segment(0, len(y), _weighted_median(yk, wk))], sigma, penalty)
    # centred on a value of the series: the sums of the costs are then of the deviations' size, not the level's
    centre = float(np.median(yk))
    order = np.argsort(yk, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    return _Prepared(len(y), idx, yk, wk, centre, order.astype(np.int64), rank, sigma, penalty)


def _finish(prep: _Prepared, back: np.ndarray) -> StepFit:
    """The fit of a prepared series from _optimal_partition's back array."""
    yk, wk, idx = prep.yk, prep.wk, prep.idx
    cuts = []
    b = len(yk)
    while b > 0:
        a = int(back[b])
        cuts.append((a, b, _weighted_median(yk[a:b], wk[a:b])))
        b = a
    cuts.reverse()
    segments = []
    for k, (a, b, level) in enumerate(cuts):
        start = 0 if k == 0 else int(idx[a])
        end = prep.n_all if k == len(cuts) - 1 else int(idx[b])
        segments.append(Segment(start, end, level))
    return StepFit(segments, prep.sigma, prep.penalty)


def fit_steps(y: Sequence[float], sigma: Optional[Sequence[float]] = None,
              penalty: Optional[float] = None) -> StepFit:
    """The best piecewise-constant fit of `y` (module docstring). `sigma`: the noise of each point
    (default: point_sigmas(y), i.e. from the spread of the differences); NaN points are skipped and
    belong to the segment around them. `penalty`: cost of one more segment, in σ units
    (default_penalty of the number of points)."""
    # through the batch programme (a batch of one): one compiled function for every fit, loaded once
    return _start([_prepare(y, sigma, penalty)], None).result()[0]


class PendingFits:
    """The fits of some series being computed (start_fits): result() gives them, in order."""

    def __init__(self, preps: list, compiled):
        self.preps, self.compiled = preps, compiled   # compiled: None, a future, or the back arrays' function

    def result(self) -> List[StepFit]:
        backs = {} if self.compiled is None else (
            self.compiled() if callable(self.compiled) else self.compiled.result())
        return [p if isinstance(p, StepFit) else _finish(p, backs[k]) for k, p in enumerate(self.preps)]


def start_fits(series: "Sequence[tuple[Sequence[float], Optional[Sequence[float]]]]", pool=None) -> PendingFits:
    """fit_steps of each (y, sigma), the same fits: prepared here, the compiled part of all of them in one call
    submitted to `pool` (a concurrent.futures executor; None: made when result() is asked), which holds no GIL from
    start to end. A thread per fit took and gave back the GIL a few dozen times a series (its numpy calls), and a
    thread judging meanwhile waited behind it at each of its own (a fleet's year: its 1,200 series judged in three
    times their time)."""
    return _start([_prepare(y, sigma, None) for y, sigma in series], pool)


def _start(preps: list, pool) -> PendingFits:
    todo = [k for k, p in enumerate(preps) if not isinstance(p, StepFit)]
    if not todo:
        return PendingFits(preps, None)
    ps = [preps[k] for k in todo]
    offsets = np.concatenate([[0], np.cumsum([len(p.yk) for p in ps])]).astype(np.int64)
    args = (np.concatenate([p.yk - p.centre for p in ps]), np.concatenate([p.wk for p in ps]),
            np.concatenate([p.order for p in ps]), np.concatenate([p.rank for p in ps]),
            np.array([p.penalty for p in ps], dtype="float64"), offsets)

    def compiled() -> Dict[int, np.ndarray]:
        back = _optimal_partitions(*args)
        return {k: back[offsets[j] + j:offsets[j + 1] + j + 1] for j, k in enumerate(todo)}

    return PendingFits(preps, pool.submit(compiled) if pool is not None else compiled)


def fit_many(series: "Sequence[tuple[Sequence[float], Optional[Sequence[float]]]]", threads: int = 2) -> List[StepFit]:
    """fit_steps of each (y, sigma), in order, the same fits: start_fits of `threads` shares (every k-th series), each
    on a thread of its own."""
    threads = max(1, min(threads, len(series)))
    if threads == 1:
        return start_fits(series).result()
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(threads, thread_name_prefix="zcorch-fit") as pool:
        shares = [start_fits(series[i::threads], pool) for i in range(threads)]
        fits = [share.result() for share in shares]
    out: List[StepFit] = [None] * len(series)   # type: ignore[list-item]
    for i, share in enumerate(fits):
        out[i::threads] = share
    return out


def load_compiled() -> None:
    """The compiled fit loaded from numba's cache (or compiled) now, by fitting a small series: the first
    fit otherwise pays it (~0.7 s). zcorch.analysis.dataset calls it on a thread while DuckDB queries
    (which release the GIL). A failure here is left to the real fit to raise."""
    try:
        fit_steps(np.arange(MIN_POINTS_FOR_STEPS, dtype="float64"), np.ones(MIN_POINTS_FOR_STEPS))
    except Exception:   # noqa: BLE001 - the same call in the real fit raises it where it is handled
        pass
