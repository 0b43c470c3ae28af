"""The newest night of a cell against the spread of its nightly levels: the one decision behind `zcorch
history` (its table, plots and JSON) and `zcorch history --check`.

Why nights and not runs: nights differ more than runs within a night do (another boot, another page
cache, another neighbour on the machine). Testing the newest night's runs against the pooled runs of
earlier nights, as `zcorch compare` tests two sets, ignores that spread: on this machine it raised 15–19
false alarms per 100 series-nights (benchmarks/bench_detector.py). So here a night is one number, the
median of its ok runs, and its noise is how much earlier nights' medians spread:

- **baseline**: the earlier nights of the stable segment the newest one is held against (`stable_baselines`:
  the change-point fit of zcorch.analysis.steps says where levels change); **level** = the mean of their
  medians;
- **nightly spread** σ: the sd of those medians (numpy, ddof 1), never below the baseline nights' typical
  sampling sd (their medians cannot spread less than their own intervals say) nor below steps.FLOOR_REL of
  the level. A night further than REJECT_MADS robust sds (the MAD of the medians scaled to a normal sd,
  scipy.stats.median_abs_deviation(scale="normal")) from their median is left out of the level and the
  spread first (from REJECT_FROM baseline nights on: the MAD of fewer is too unsure a judge; 5 normal
  nights would lose one too often and alarm 7% instead of 5%; and at most one night in REJECT_FROM: more
  "wild" nights mean lumpy nights, a machine with a few states, whose MAD would keep one state and a
  fraction of the spread): one wild night does not blind the detector for as long as it stays in the segment, and
  normal nights are almost never left out (0.2% of the nights of baselines of 15), so the t distribution below
  still holds. (The MAD itself as the spread was tried: it is robust but worth only 37% as many nights,
  and caught a 6σ drop after 8 nights in 31% of series where this catches it in 92%.);
- **the judged nights**: the newest one, and the mean of the newest two and three (a step is judged on its
  first night alone, and on its second and third night with their average, whose noise is σ/√2 and σ/√3: a
  step smaller than one night's spread is still caught within three nights). A judged night whose own
  interval is wider, relative to its median, than the baseline's typical one (a night that did not
  converge) adds the difference, taken at the baseline's level (relative: a night 4x higher has a 4x wider
  interval with the same precision, and must not hide its rise behind it);
- **statistic**: the prediction of a new night from k baseline nights, T = (judged − level) /
  √(σ²·(1/w + 1/k) + extra), w judged nights; one-sided p in the direction of the change from Student's t
  with k − 1 degrees of freedom (scipy.stats.t: exact for normal nights), times the number of windows
  judged (Bonferroni), so that alpha bounds the false alarms of a night with no change
  (tests/test_detector.py simulates it);
- **verdict**: `unchanged` within the threshold; beyond it `regressed` / `improved` when p < alpha, else
  `not significant`. A regression is reported as long as the newest night stays below the stable level
  before its change point, "since" the first night of the change.

A level younger than MIN_NIGHTS nights (after a change point, real or found in noise) borrows the spread
its cell's nights show at its other levels (`pooled_spread`: relative to each level, pooled, with its degrees
of freedom), when they have at least MIN_NIGHTS − 1 of them: how much nights spread belongs to the machine and
the cell, not to one level. Judging such a level runs against runs raised 7 of 8 false alarms of this
machine's write->read series.

Fewer than MIN_NIGHTS baseline nights and nothing to borrow (a new series) tell no spread: the newest night's runs are then judged against the
baseline nights' runs as `zcorch compare` judges two sets (zcorch.analysis.compare.judge: threshold and
two-sided Mann–Whitney U), and its `method` says so ("runs"): that rule ignores the nightly spread and
alarms more often (benchmarks/bench_detector.py prints how often), but a new nightly job still catches a
gross regression in its first nights. `zcorch compare A B` keeps that rule: two sets carry no nightly spread.

Pure functions of per-night medians, interval sds and ok runs: benchmarks/bench_detector.py calls `judge_newest`
exactly as zcorch.analysis.history does.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import numpy as np
import scipy.special   # not scipy.stats: its import costs three times as much CPU and memory (zcorch history)

from zcorch.analysis.compare import VERDICTS_BAD, judge
from zcorch.analysis.gate import HISTORY_ALPHA, HISTORY_MIN_NIGHTS, HISTORY_THRESHOLD_PCT
from zcorch.analysis.steps import FLOOR_REL, StepFit, median_of

# The defaults of `zcorch history` (zcorch.analysis.gate, where the command line reads them).
DEFAULT_THRESHOLD_PCT = HISTORY_THRESHOLD_PCT
DEFAULT_ALPHA = HISTORY_ALPHA
MIN_NIGHTS = HISTORY_MIN_NIGHTS   # baseline nights needed to know the nightly spread (fewer: runs against runs)
WINDOW = 3                    # the newest 1, 2 and 3 nights are judged
MIN_STABLE = 2                # nights a segment needs to be the level at all (a one-night spike is not one)
REJECT_MADS = 5.0             # a baseline night further than this many MAD-sds from the median is left out...
MAD_TO_SD = 1 / float(scipy.special.ndtri(0.75))   # the MAD of normal data times this is its sd (scale="normal";
# scipy.stats.norm.ppf is ndtri)
REJECT_FROM = 8               # ...from this many baseline nights on (the MAD of fewer is too unsure to judge one)
NIGHTLY = "nightly"
RUNS = "runs"


@dataclass
class Comparison:
    """The newest night(s) of one cell against a stable level."""
    verdict: str             # regressed, improved, unchanged, not significant, failed
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

    @property
    def bad(self) -> bool:
        return self.verdict in VERDICTS_BAD


def stable_baselines(fit: StepFit, has_ok: Sequence[int], last: int) -> "List[tuple[List[int], int]]":
    """What the newest night `last` is held against, in order: (the baseline nights, the first night of
    the change). With a change point before `last`: the nearest earlier segment with at least MIN_STABLE
    nights with ok runs (a one-night spike is not a level), "since" the change point; then the earlier
    nights of its own segment, "since" itself. Whether a baseline has enough nights to be judged by its
    spread is judge_newest's question."""
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


def pooled_spread(median: np.ndarray, fit: StepFit, nights: Sequence[int]) -> Optional[PooledSpread]:
    """The nightly spread of one cell pooled over every level of its fit (each night's median relative to
    the mean of its segment's `nights`), or None without two nights in one segment. Why: how much nights
    spread is the machine's and the cell's, not one level's; a level that is two nights old (after a real
    change, or one the fit found in noise) borrows it instead of being judged runs against runs, which
    ignores the nightly spread and alarmed 7 of 8 false alarms on this machine's write->read series
    (benchmarks/bench_detector.py)."""
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


def nightly_test(base: Sequence[float], base_sd: Sequence[float], judged: Sequence[float],
                 judged_sd: Sequence[float], higher_better: bool, threshold_pct: float, alpha: float,
                 n_tests: int = 1, borrowed: "Optional[PooledSpread]" = None) -> NightlyTest:
    """The judged nights' medians (`judged`, 1 to WINDOW of them) against the baseline nights' medians
    (`base`): the rule of the module docstring. `*_sd`: each night's sampling sd of its median (from its
    interval, NaN when it has none); `n_tests`: the windows judged in all (the p-value is multiplied by it);
    `borrowed`: the cell's nightly spread pooled over its other levels, for a baseline too short to tell its
    own (then one baseline night is enough, and the t has the pooled degrees of freedom)."""
    base = np.asarray(base, dtype="float64")
    judged = np.asarray(judged, dtype="float64")
    k, w = len(base), len(judged)
    if k < (1 if borrowed is not None else 2) or w < 1:
        raise ValueError(f"a nightly test needs two baseline nights and a judged one, got {k} and {w}")
    center = median_of(base)
    # scipy.stats.median_abs_deviation(scale="normal") and scipy.stats.t.sf, through their ufunc cores: the
    # wrappers cost ~6 ms a call, and history/bench_detector judge every cell of every night.
    mad = median_of(np.abs(base - center)) * MAD_TO_SD
    kept = base[np.abs(base - center) <= REJECT_MADS * mad] if mad > 0 and k >= REJECT_FROM else base
    if len(kept) < 2 or k - len(kept) > k // REJECT_FROM:
        # More "wild" nights than one in REJECT_FROM: the nights are lumpy (a machine with a few states, e.g.
        # where the scheduler put the two sides), not normal with an outlier, and their MAD judges nothing:
        # leaving them out would keep one state and a spread of a fraction of the real one.
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
    spread = max(own, typical, FLOOR_REL * abs(level), 1e-12)
    # The excess of a judged night's interval over the baseline's typical one, relative to each night's own
    # level and applied at the baseline's: a night that is 4x higher has a 4x wider interval in absolute
    # terms with the same precision, and must not hide its own rise behind it.
    sd_judged = np.asarray(judged_sd, dtype="float64")
    with np.errstate(divide="ignore", invalid="ignore"):
        rel_judged = np.where(judged != 0, np.nan_to_num(sd_judged, nan=0.0) / np.abs(judged), 0.0)
    rel_typical = typical / abs(level) if level else 0.0
    extra = float(np.sum(np.maximum(rel_judged ** 2 - rel_typical ** 2, 0.0))) * level ** 2 / w ** 2
    t = (mean - level) / math.sqrt(spread ** 2 * (1 / w + 1 / k) + extra)
    p = min(1.0, n_tests * float(scipy.special.stdtr(dof, -abs(t))))
    worse = change < 0 if higher_better else change > 0
    if not abs(change) > threshold_pct:
        verdict = "unchanged"
    elif p < alpha:
        verdict = "regressed" if worse else "improved"
    else:
        verdict = "not significant"
    return NightlyTest(verdict, change, level, mean, p, spread)


def nightly_method(alpha: float) -> str:
    return ("the newest 1–3 nights' medians against the mean and sd of the stable level's nightly medians (nights "
            f"beyond {REJECT_MADS:g} MAD-sds left out); one-sided t, Bonferroni over the windows, alpha {alpha:g}")


def method_text(better: str, threshold_pct: float, alpha: float, min_nights: int) -> str:
    """The rule in one line (what `zcorch history` prints under its table)."""
    return (f"median of ok repeats per night ({better} is better); the newest night, and the mean of the newest "
            f"2 and 3, against the mean and sd of the nightly medians of the preceding stable segment (nights beyond "
            f"{REJECT_MADS:g} MAD-sds left out): beyond {threshold_pct:g}% and one-sided p < {alpha:g} (t, Bonferroni "
            f"over the 3); a level of fewer than {min_nights} nights borrows the spread of the cell's other levels; "
            "with none, the newest night's runs against theirs (two-sided Mann–Whitney U, as zcorch compare)")


def judge_newest(median: Sequence[float], sd: Sequence[float], runs: Sequence[Sequence[float]], fit: StepFit,
                 higher_better: bool, threshold_pct: float = DEFAULT_THRESHOLD_PCT, alpha: float = DEFAULT_ALPHA,
                 min_nights: int = MIN_NIGHTS, window: int = WINDOW) -> Optional[Comparison]:
    """The decision on the newest night of one cell (module docstring): `median`, `sd` (sampling sd of the
    median from its interval) and `runs` (its ok runs) per night, oldest first, NaN / empty where a night
    has no ok run; `fit` the change-point fit of the medians. The first bad comparison, else the first
    one made; None when there is nothing earlier (or the newest night has no ok run: the caller says
    `failed`)."""
    median = np.asarray(median, dtype="float64")
    sd = np.asarray(sd, dtype="float64")
    last = len(median) - 1
    if last < 1 or not np.isfinite(median[last]):
        return None
    has_ok = np.flatnonzero(np.isfinite(median)).tolist()
    made: List[Comparison] = []
    for baseline, since in stable_baselines(fit, has_ok, last):
        # the judged windows: the newest w nights with ok runs, all after the baseline and the change point
        # (after a change point only nights of the newest segment; within it, the baseline is what precedes them)
        windows = []
        for w in range(1, window + 1):
            win = has_ok[-w:]
            if len(win) < w or (since != last and win[0] < since):
                break
            base = baseline[:bisect.bisect_left(baseline, win[0])]   # a baseline is in order (stable_baselines)
            if len(base) >= min_nights:
                windows.append((win, base, None))
                continue
            # a level too young to tell its own spread borrows the one its cell shows at its other levels
            pooled = pooled_spread(median, fit, [i for i in has_ok if i < win[0]]) if base else None
            if pooled is not None and pooled.df >= min_nights - 1:
                windows.append((win, base, pooled))
        if not windows:
            made.append(_runs_comparison(baseline, since, last, runs, higher_better, threshold_pct, alpha,
                                         min_nights))
        for win, base, pooled in windows:
            res = nightly_test(median[base], sd[base], median[win], sd[win], higher_better, threshold_pct,
                               alpha, n_tests=len(windows), borrowed=pooled)
            made.append(Comparison(res.verdict, res.change_pct, res.level, res.judged, res.p_value,
                                   nightly_method(alpha), len(base), len(win), list(base),
                                   since if since != last else win[0], NIGHTLY, list(win),
                                   res.spread / abs(res.level) * 100 if res.level else math.nan))
        bad = next((c for c in made if c.bad), None)
        if bad is not None:
            return bad
    return made[0] if made else None


def _runs_comparison(baseline: List[int], since: int, last: int, runs: Sequence[Sequence[float]],
                     higher_better: bool, threshold_pct: float, alpha: float, min_nights: int) -> Comparison:
    """Too few nights for their spread: the newest night's runs against the baseline nights' runs."""
    base = np.concatenate([np.asarray(runs[i], dtype="float64") for i in baseline])
    cand = np.asarray(runs[last], dtype="float64")
    j = judge(base, cand, higher_better, threshold_pct, alpha)
    return Comparison(j.verdict, j.change_pct, float(np.median(base)), float(np.median(cand)), j.p_value,
                      f"fewer than {min_nights} nights at this level: runs against runs, {j.test}",
                      len(base), len(cand), list(baseline), since, RUNS, [last])
