"""The newest night of a cell against the spread of its nightly levels: the decision behind `zcorch history` and
`--check`. A night is the median of its ok runs; the newest 1, 2 and 3 nights' mean is judged against the earlier
nights of its stable segment by Student's t, alpha shared by WINDOW_WEIGHTS; a short level borrows the spread of
the cell's other levels, else runs are judged as `zcorch compare` does. The rule and its constants: docs/nightly.md."""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import numpy as np
import scipy.special   # not scipy.stats: its import costs three times as much CPU and memory (zcorch history)

from zcorch.analysis.compare import VERDICTS_BAD, judge
from zcorch.analysis.gate import HISTORY_ALPHA, HISTORY_MIN_NIGHTS, HISTORY_THRESHOLD_PCT, POWER, cell_verdict
from zcorch.analysis.steps import FLOOR_REL, StepFit, median_of

# The defaults of `zcorch history` (zcorch.analysis.gate, where the command line reads them).
DEFAULT_THRESHOLD_PCT = HISTORY_THRESHOLD_PCT
DEFAULT_ALPHA = HISTORY_ALPHA
MIN_NIGHTS = HISTORY_MIN_NIGHTS   # baseline nights needed to know the nightly spread (fewer: runs against runs)
WINDOW = 3                    # the newest 1, 2 and 3 nights are judged
# each window's share of alpha (weighted Bonferroni; renormalised over the windows judged): the three nights'
# mean is the most powerful statistic within three nights, the short windows catch a gross step at once
WINDOW_WEIGHTS = (0.1, 0.1, 0.8)
EXCESS_FROM = 1.5             # a judged night's interval this much wider than the typical one adds its excess
WEIGHTED_FROM = 8             # baseline nights from which the windows share alpha by WINDOW_WEIGHTS (else equally)
NEEDS_MAX_NIGHTS = 30         # `needs` projects up to this many more nights before asking for a lower spread
VERDICTS = ("regressed", "improved", "unchanged", "cannot tell", "failed")
MIN_STABLE = 2                # nights a segment needs to be the level at all (a one-night spike is not one)
REJECT_MADS = 5.0             # a baseline night further than this many MAD-sds from the median is left out...
MAD_TO_SD = 1 / float(scipy.special.ndtri(0.75))   # the MAD of normal data times this is its sd
REJECT_FROM = 8               # ...from this many baseline nights on (the MAD of fewer is too unsure to judge one)
# A level shorter than this is held to the spread successive nights of the whole earlier history show (below)
SHORT_LEVEL = 12
NIGHTLY = "nightly"
RUNS = "runs"


@dataclass
class Comparison:
    """The newest night(s) of one cell against a stable level."""
    verdict: str             # regressed, improved, unchanged, cannot tell, failed (VERDICTS)
    change_pct: float        # of the judged nights' level against the baseline's
    base_median: float       # the baseline's level (mean of its nightly medians; median of its runs for "runs")
    cand_median: float       # the judged nights' level (mean of their medians; the newest median for "runs")
    p_value: float           # one-sided, windows counted (nightly); two-sided Mann–Whitney U (runs)
    test: str                # the method in words
    n_base: int              # baseline nights (nightly) or runs (runs)
    n_cand: int              # judged nights (nightly) or runs (runs)
    baseline: List[int]      # night indices of the baseline
    since: int               # first night of the change
    method: str = NIGHTLY    # NIGHTLY or RUNS (fewer than MIN_NIGHTS baseline nights)
    window: List[int] = field(default_factory=list)   # the judged nights
    spread_pct: float = math.nan   # the nightly spread σ in % of the level (nightly)
    # the smallest change, in % of the level, found at alpha with 80% power (inf: significance unreachable)
    detectable_pct: float = math.nan
    needs: str = ""          # when detectable_pct > the threshold: what would make the cell decidable

    @property
    def bad(self) -> bool:
        return self.verdict in VERDICTS_BAD


def stable_baselines(fit: StepFit, has_ok: Sequence[int], last: int) -> "List[tuple[List[int], int]]":
    """What the newest night `last` is held against, in order: (baseline nights, first night of the change): the
    nearest earlier segment with MIN_STABLE nights with ok runs, since the change point; then the earlier nights of
    its own segment, since itself."""
    if not fit.segments:
        return []
    segs = fit.segments
    k = fit.segment_of(last)
    has_ok = sorted(has_ok)

    def within(start: int, end: int) -> List[int]:   # the nights with ok runs in [start, end), in order
        return has_ok[bisect.bisect_left(has_ok, start):bisect.bisect_left(has_ok, end)]

    candidates = []
    if k > 0:
        ok_in = [within(s.start, s.end) for s in segs[:k]]   # `last` lies in segs[k], after all of these
        j = next((j for j in range(k - 1, -1, -1) if len(ok_in[j]) >= MIN_STABLE), k - 1)
        if ok_in[j]:
            candidates.append((ok_in[j], segs[k].start))
    same = within(segs[k].start, last)
    if same:
        candidates.append((same, last))
    return candidates


@dataclass(frozen=True)
class PooledSpread:
    rel: float   # the sd of nightly medians about their level's mean, relative to that mean
    df: int      # its degrees of freedom: nights minus levels


def moving_range_spread(median: np.ndarray, nights: Sequence[int]) -> float:
    """The nightly spread, relative to the level, of successive `nights` (von Neumann's estimate without the largest
    difference; 0 with fewer than MIN_NIGHTS + 1): a step moves one difference only, so this sees the spread across
    levels a fit cut in lumpy nights, whose own spreads are far too small."""
    y = np.asarray([median[i] for i in nights], dtype="float64")
    if len(y) < MIN_NIGHTS + 1:
        return 0.0
    mid = (y[1:] + y[:-1]) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.abs(np.diff(y)) / np.abs(mid)
    d = np.sort(d[np.isfinite(d)])[:-1]
    return math.sqrt(float(np.mean(d ** 2)) / 2) if len(d) else 0.0


def pooled_spread(median: np.ndarray, fit: StepFit, nights: Sequence[int]) -> Optional[PooledSpread]:
    """The nightly spread of one cell pooled over its fit's levels (None without two nights in one): what a young
    level borrows, as runs against runs ignore the nightly spread and alarm falsely (benchmarks/bench_detector.py)."""
    ss, df = 0.0, 0
    for seg in fit.segments:
        y = np.array([median[i] for i in nights if seg.start <= i < seg.end], dtype="float64")
        if len(y) < 2 or not np.mean(y):
            continue
        rel = y / np.mean(y)
        ss += float(np.sum((rel - 1.0) ** 2))
        df += len(y) - 1
    return PooledSpread(math.sqrt(ss / df), df) if df else None


@dataclass(frozen=True)
class NightlyTest:
    verdict: str
    change_pct: float
    level: float
    judged: float
    p_value: float
    spread: float
    detectable_pct: float = math.nan   # module docstring, "detectable change"
    dof: int = 0                       # of the t
    alpha_window: float = math.nan     # alpha times the window's share (the level of its one-sided test)
    n_judged: int = 0                  # w
    n_base: int = 0                    # k (the nights kept)


def detectable(alpha_window: float, dof: int, se_rel: float, power: float = POWER) -> float:
    """The smallest change, in % of the level, a one-sided t test at `alpha_window` with `dof` and relative SE
    `se_rel` finds with probability `power`: (t_{1-α'} + t_{power}) × SE × 100; inf when unreachable."""
    if not (dof >= 1 and 0 < alpha_window < 1 and math.isfinite(se_rel)):
        return math.inf
    q = float(scipy.special.stdtrit(dof, 1 - alpha_window)) + float(scipy.special.stdtrit(dof, power))
    return q * se_rel * 100


def needs_text(res: "NightlyTest", threshold_pct: float, alpha: float) -> str:
    """What would bring res.detectable_pct within the threshold, in words: more nights at this level (the spread
    projected unchanged), or when NEEDS_MAX_NIGHTS would not do, the nightly spread that would."""
    if not res.detectable_pct > threshold_pct or not res.level:
        return ""
    if not math.isfinite(res.detectable_pct):
        return "more nights with ok runs at this level (no spread to judge by yet)"
    rel = res.spread / abs(res.level)
    a3 = alpha * _shares(WINDOW)[-1]
    for m in range(1, NEEDS_MAX_NIGHTS + 1):
        if detectable(a3, res.dof + m, rel * math.sqrt(1 / WINDOW + 1 / (res.n_base + m))) <= threshold_pct:
            return f"{m} more night{'s' if m > 1 else ''} at this level"
    target = rel * 100 * threshold_pct / detectable(a3, res.dof + NEEDS_MAX_NIGHTS,
                                                    rel * math.sqrt(1 / WINDOW + 1 / (res.n_base + NEEDS_MAX_NIGHTS)))
    return f"a nightly spread below {target:.2g}% (now {rel * 100:.2g}%: more repeats, pinning, or a control)"


def nightly_test(base: Sequence[float], base_sd: Sequence[float], judged: Sequence[float],
                 judged_sd: Sequence[float], higher_better: bool, threshold_pct: float, alpha: float,
                 n_tests: int = 1, borrowed: "Optional[PooledSpread]" = None,
                 weight: Optional[float] = None, floor_rel: float = 0.0) -> NightlyTest:
    """The judged nights' medians (1 to WINDOW) against the baseline nights' (module docstring). `*_sd`: each night's
    sampling sd of its median (NaN: none); `weight`: this window's share of alpha (default 1 / `n_tests`);
    `borrowed`: a pooled spread for a baseline too short to tell its own; `floor_rel`: the least relative spread."""
    share = (1.0 / n_tests) if weight is None else float(weight)
    base = np.asarray(base, dtype="float64")
    judged = np.asarray(judged, dtype="float64")
    k, w = len(base), len(judged)
    if k < (1 if borrowed is not None else 2) or w < 1:
        raise ValueError(f"a nightly test needs two baseline nights and a judged one, got {k} and {w}")
    center = median_of(base)
    # the MAD and the t's sf through scipy's ufunc cores: the scipy.stats wrappers are slow for every cell
    mad = median_of(np.abs(base - center)) * MAD_TO_SD
    kept = base[np.abs(base - center) <= REJECT_MADS * mad] if mad > 0 and k >= REJECT_FROM else base
    if len(kept) < 2 or k - len(kept) > k // REJECT_FROM:
        # more "wild" nights than one in REJECT_FROM: lumpy nights (a machine of a few states), not outliers
        kept = base
    k = len(kept)
    level = float(np.mean(kept))
    mean = float(np.mean(judged))
    change = (mean - level) / level * 100 if level else math.nan
    sd_base = np.asarray(base_sd, dtype="float64")
    finite_sd = sd_base[np.isfinite(sd_base)]
    typical = median_of(finite_sd) if len(finite_sd) else 0.0   # np.nanmedian's value
    own = borrowed.rel * abs(level) if borrowed is not None else float(np.std(kept, ddof=1))
    dof = borrowed.df if borrowed is not None else k - 1
    spread = max(own, typical, FLOOR_REL * abs(level), floor_rel * abs(level), 1e-12)
    # a judged night's interval's excess over the typical one, relative to its own level (a night 4x higher has
    # a 4x wider interval at the same precision, and must not hide its rise behind it)
    sd_judged = np.asarray(judged_sd, dtype="float64")
    with np.errstate(divide="ignore", invalid="ignore"):
        rel_judged = np.where(judged != 0, np.nan_to_num(sd_judged, nan=0.0) / np.abs(judged), 0.0)
    rel_typical = typical / abs(level) if level else 0.0
    # only a clearly wider interval (EXCESS_FROM x) adds its excess: intervals scatter about the typical one
    wide = rel_judged > EXCESS_FROM * rel_typical
    extra = float(np.sum(np.where(wide, rel_judged ** 2 - rel_typical ** 2, 0.0))) * level ** 2 / w ** 2
    se = math.sqrt(spread ** 2 * (1 / w + 1 / k) + extra)
    t = (mean - level) / se
    p = min(1.0, float(scipy.special.stdtr(dof, -abs(t))) / share)
    alpha_window = alpha * share
    mdc = detectable(alpha_window, dof, se / abs(level)) if level else math.inf
    worse = change < 0 if higher_better else change > 0
    verdict = cell_verdict(change, p, alpha, threshold_pct, mdc, worse)
    return NightlyTest(verdict, change, level, mean, p, spread, mdc, dof, alpha_window, w, k)


def _shares(n: int) -> "List[float]":
    """The shares of alpha of the newest 1..n windows (WINDOW_WEIGHTS scaled to sum to 1)."""
    w = WINDOW_WEIGHTS[:n]
    return [x / sum(w) for x in w]


def nightly_method(alpha: float) -> str:
    return ("the newest 1–3 nights' medians against the mean and sd of the stable level's nightly medians (nights "
            f"beyond {REJECT_MADS:g} MAD-sds left out); one-sided t, alpha {alpha:g} shared by the windows "
            f"{'/'.join(f'{x:g}' for x in WINDOW_WEIGHTS)} (weighted Bonferroni)")


def method_text(better: str, threshold_pct: float, alpha: float, min_nights: int) -> str:
    """The rule in one line (what `zcorch history` prints under its table)."""
    return (f"median of ok repeats per night ({better} is better); the newest night, and the mean of the newest "
            f"2 and 3, against the mean and sd of the nightly medians of the preceding stable segment (nights beyond "
            f"{REJECT_MADS:g} MAD-sds left out): beyond {threshold_pct:g}% and one-sided p < {alpha:g} (t, alpha "
            f"shared {'/'.join(f'{x:g}' for x in WINDOW_WEIGHTS)} by the 1, 2 and 3 nights); within it unchanged only "
            f"where a {threshold_pct:g}% change was detectable, else cannot tell; a level of fewer than {SHORT_LEVEL} "
            "nights is held to at least the spread successive earlier nights show, one of fewer than "
            f"{min_nights} borrows the spread of the cell's other levels; "
            "with none, the newest night's runs against theirs (two-sided Mann–Whitney U, as zcorch compare)")


def judge_newest(median: Sequence[float], sd: Sequence[float], runs: Sequence[Sequence[float]], fit: StepFit,
                 higher_better: bool, threshold_pct: float = DEFAULT_THRESHOLD_PCT, alpha: float = DEFAULT_ALPHA,
                 min_nights: int = MIN_NIGHTS, window: int = WINDOW) -> Optional[Comparison]:
    """The decision on the newest night of one cell: `median`, `sd` (of the median) and `runs` per night, oldest
    first (NaN / empty without ok runs), `fit` the medians' change-point fit. The first bad comparison, else the most
    telling one made; None when there is nothing earlier or the newest night has no ok run."""
    median = np.asarray(median, dtype="float64")
    sd = np.asarray(sd, dtype="float64")
    last = len(median) - 1
    if last < 1 or not np.isfinite(median[last]):
        return None
    has_ok = np.flatnonzero(np.isfinite(median)).tolist()
    made: List[Comparison] = []
    for baseline, since in stable_baselines(fit, has_ok, last):
        # the judged windows: the newest w nights with ok runs, all after the baseline and the change point
        windows = []
        for w in range(1, window + 1):
            win = has_ok[-w:]
            if len(win) < w or (since != last and win[0] < since):
                break
            if any(baseline[-1] < i < since for i in win):
                break   # a night of a segment between the baseline's and the newest one's (a spike) is no level
            base = baseline[:bisect.bisect_left(baseline, win[0])]   # a baseline is in order (stable_baselines)
            if len(base) >= min_nights:
                windows.append((win, base, None))
                continue
            # a level too young to tell its own spread borrows the one its cell shows at its other levels
            pooled = pooled_spread(median, fit, has_ok[:bisect.bisect_left(has_ok, win[0])]) if base else None
            if pooled is not None and pooled.df >= min_nights - 1:
                windows.append((win, base, pooled))
        if not windows:
            made.append(_runs_comparison(baseline, since, last, runs, higher_better, threshold_pct, alpha,
                                         min_nights))
        # a short level is often noise the fit took for a step: its windows share alpha equally
        weighted = all(len(base) >= WEIGHTED_FROM for _, base, _ in windows)
        shares = _shares(len(windows)) if weighted else [1 / len(windows)] * len(windows)
        for (win, base, pooled), share in zip(windows, shares):
            floor = 0.0
            if len(base) < SHORT_LEVEL:   # the nights before the judged ones, across the fit's cuts
                floor = moving_range_spread(median, has_ok[:bisect.bisect_left(has_ok, win[0])])
            res = nightly_test(median[base], sd[base], median[win], sd[win], higher_better, threshold_pct,
                               alpha, n_tests=len(windows), borrowed=pooled, weight=share, floor_rel=floor)
            needs = needs_text(res, threshold_pct, alpha)
            made.append(Comparison(res.verdict, res.change_pct, res.level, res.judged, res.p_value,
                                   nightly_method(alpha), len(base), len(win), list(base),
                                   since if since != last else win[0], NIGHTLY, list(win),
                                   res.spread / abs(res.level) * 100 if res.level else math.nan,
                                   res.detectable_pct, needs))
        bad = next((c for c in made if c.bad), None)
        if bad is not None:
            return bad
    # the first improvement, else the first window beyond the threshold without significance (cannot tell), else
    # (every window within it) the most sensitive one, the first on a tie
    telling = (next((c for c in made if c.verdict == "improved"), None)
               or next((c for c in made if abs(c.change_pct) > threshold_pct), None))
    if telling is not None or not made:
        return telling
    return min(made, key=lambda c: c.detectable_pct if not math.isnan(c.detectable_pct) else math.inf)


def _runs_comparison(baseline: List[int], since: int, last: int, runs: Sequence[Sequence[float]],
                     higher_better: bool, threshold_pct: float, alpha: float, min_nights: int) -> Comparison:
    """Too few nights for their spread: the newest night's runs against the baseline nights' runs."""
    base = np.concatenate([np.asarray(runs[i], dtype="float64") for i in baseline])
    cand = np.asarray(runs[last], dtype="float64")
    j = judge(base, cand, higher_better, threshold_pct, alpha)
    mdc, needs = j.detectable_pct, j.needs   # the rank test's (zcorch.analysis.stats.detectable_change_pct)
    worse = j.change_pct < 0 if higher_better else j.change_pct > 0
    verdict = cell_verdict(j.change_pct, j.p_value, alpha, threshold_pct, mdc, worse)
    if mdc > threshold_pct and not needs:
        needs = f"{min_nights} nights at this level, to judge by their spread"
    return Comparison(verdict, j.change_pct, float(np.median(base)), float(np.median(cand)), j.p_value,
                      f"fewer than {min_nights} nights at this level: runs against runs, {j.test}",
                      len(base), len(cand), list(baseline), since, RUNS, [last], math.nan, mdc, needs)


