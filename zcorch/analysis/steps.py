"""Change points in a series of sweep medians, asv's method (after Friedrich et al. 2008): the segmentation minimising
penalty × segments + Σ |y_i − level|/σ_i, each level its segment's weighted median, found exactly by a compiled
dynamic programme. σ_i (point_sigmas) comes from each sweep's CI, floored and scaled up when nights differ more
than runs do; the penalty is 2 + 2·log n (its calibration: docs/performance.md)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numba
from numba.cpython.unsafe.numbers import leading_zeros, trailing_zeros
import numpy as np

FLOOR_REL = 0.002           # σ_i >= 0.2% of the series' median level
# Points needed to estimate how much more nights vary than their CIs say (fewer: a new job's wobble reads as steps)
MIN_FOR_SCALE = 4
PENALTY_PER_LOG = 2.0
PENALTY_CONST = 2.0
Z95 = 1.959963984540054     # normal quantile of a two-sided 95% interval
# Fewer nights support no change point: one night against one or two others is the newest sweep's rank test's call
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
    """np.median of a short 1-d array without NaN, the same float, without np.median's costly generality."""
    s = np.sort(x)
    n = len(s)
    h = n // 2
    return float(s[h]) if n % 2 else float((s[h - 1] + s[h]) / 2)


def point_sigmas(y: Sequence[float], ci_low: Optional[Sequence[float]] = None,
                 ci_high: Optional[Sequence[float]] = None,
                 ci: "float | Sequence[float]" = 0.95) -> np.ndarray:
    """The noise σ_i of each point from its confidence interval (module docstring), NaN where y is; `ci`: the level
    of every interval, or of each one (three runs give 75%: read as 95% σ would be 1.7× too small)."""
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
    """The sampling sd of each median read off its interval (half-width / z of its level); NaN without one."""
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


# Relative slack when comparing a segmentation's total with the best so far: totals equal in exact arithmetic tie,
# and the earliest start of the last segment wins, whatever the rounding of the sums.
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
    """The exact dynamic programme of fit_steps in O(n^2) updates: best[b] = min over a < b of best[a] + cost(a, b)
    + penalty. For each end b the start a descends, the segment's weighted median kept as a pointer into the
    series' sorted order (`order`, its inverse `rank`) moving over the segment's ranks (a bit set), so each cost is
    O(1) from the running sums. Returns back[b], the start of the last segment of the best fit of y[:b]."""
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
    """The level of a segment: the lowest value whose cumulative weight (ties by index) reaches half of all."""
    order = np.argsort(y, kind="stable")
    cum = np.cumsum(w[order])
    return float(y[order][int(np.argmax(cum >= cum[-1] / 2))])


@numba.njit(cache=True, nogil=True)
def _optimal_partitions(y, w, order, rank, penalty, offsets):  # pragma: no cover - compiled
    """_optimal_partition of each series k, y[offsets[k]:offsets[k + 1]], its back array at offsets[k] + k: one call
    (one GIL release) for many series."""
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
    """The best piecewise-constant fit of `y` (module docstring); NaN points belong to the segment around them.
    `sigma` defaults to point_sigmas(y), `penalty` (per segment, in σ units) to default_penalty."""
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
    """fit_steps of each (y, sigma): prepared here, the compiled part of all in one call (no GIL held) submitted to
    `pool` (None: run when result() is asked); a thread per fit would make a judging thread wait on the GIL."""
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
    """fit_steps of each (y, sigma), in order: start_fits of `threads` shares, each on a thread of its own."""
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
    """The compiled fit loaded (or compiled) now by fitting a small series; a failure is left to the real fit."""
    try:
        fit_steps(np.arange(MIN_POINTS_FOR_STEPS, dtype="float64"), np.ones(MIN_POINTS_FOR_STEPS))
    except Exception:   # noqa: BLE001 - the same call in the real fit raises it where it is handled
        pass
