"""Statistics on run frames: per-cell medians with distribution-free confidence intervals, Mann–Whitney U.

The interval of a median is the order-statistic (sign-test) one, [x(k), x(n+1-k)] of n sorted runs, at the
narrowest k whose coverage reaches the level asked, and it carries the level it really has: three runs give
[min, max] at 75%, never a claimed 95% (`ci_met` false). No resampling: a percentile bootstrap of 3 to 6
repeats claims 95% for the min–max of the runs, and scipy.stats.quantile_test gives NaN where the level cannot
be reached without saying what can. The intervals are zcorch.results.intervals' (stdlib, so the sweep's runner
asks them too); Mann–Whitney U is scipy.stats.mannwhitneyu. Fewer than two ok runs: no interval (NaN).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from zcorch.analysis.frames import OK, PARAM_KEYS
# The order-statistic interval itself lives beside the results (stdlib only: the sweep's runner asks it too)
from zcorch.results.intervals import CI, ci_width_pct, median_ci, median_ci_level, median_ci_rank, min_runs_for  # noqa: F401
from zcorch.metrics import SUMMARY
from zcorch.params import format_value

METRICS = SUMMARY   # the default metrics of summarize (zcorch.metrics)


def ci_method(ci: float = CI) -> str:
    """How summarize() computes its confidence intervals, in words (the report quotes it)."""
    return (f"confidence interval of the median from order statistics (distribution-free, binomial): the "
            f"narrowest [x(k), x(n+1-k)] of the ok runs covering the median with at least {ci:.0%}, "
            f"else [min, max] at the lower level it has (each interval states its level)")


def ci_label(level: float, ci: float = CI) -> str:
    """How a table heads or tags an interval: "95% CI" only when its level is at least 95%: "75% CI" for
    three runs, "" with no interval. Levels are rounded down so that 93.8% never reads as 94% met."""
    if not level == level:  # NaN
        return ""
    shown = math.floor(level * 1000) / 10
    return f"{shown:g}% CI"


def varying_params(df: pd.DataFrame, with_members: bool = False) -> list:
    """Parameter columns with more than one value in the frame (what distinguishes cells).

    A linked axis of the experiment that varies (its column, frames.add_linked_axes) replaces its parameters;
    `with_members`: it comes first and its parameters follow it (tables that list every parameter).

    A sink that only follows the filesystem (`{filesystem}/recv.dat` rendered to each mountpoint)
    tells nothing the filesystem does not, so it is left out then."""
    out = []
    for col in PARAM_KEYS:
        if col in df and df[col].astype(str).nunique(dropna=False) > 1:
            out.append(col)
    if "sink" in out and "filesystem" in out:
        pairs = df[["filesystem", "sink"]].astype(str).drop_duplicates()
        if len(pairs) == df["filesystem"].astype(str).nunique(dropna=False):
            out.remove("sink")
    # a linked axis that varies stands for its parameters (its column holds their labels), where its first one was
    for name, info in linked_axes(df).items():
        members = [p for p in info["params"] if p in out]
        if name in df and members and df[name].astype(str).nunique(dropna=False) > 1:
            at = out.index(members[0])
            out = [p for p in out if p not in members]
            if with_members:
                out[at:at] = [name] + members
            else:
                out.insert(at, name)
    return out


def linked_axes(df: pd.DataFrame) -> dict:
    """{axis name: {"params", "labels"}} of the linked axes whose columns zcorch.load added (frames.add_linked_axes)."""
    return {k: v for k, v in (df.attrs.get("linked_axes") or {}).items() if k in df}


def summarize(df: pd.DataFrame, by: "str | Sequence[str] | None" = None,
              metrics: Sequence[str] = METRICS, ci: float = CI) -> pd.DataFrame:
    """Per group of runs: n (ok runs), n_failed (counted, never averaged in), per metric its median, min,
    max, ci_low, ci_high, ci_level (the level the interval really has), and `ci_met` (that level is at least
    `ci`). `by` defaults to the cell (and the sweep when there are several), the varying parameters carried
    along; the CI method is in `.attrs["ci_method"]`. A sweep with adaptive `repeats:` also gets `width_pct`
    (the gbit_s interval's reach from the median, in %; inf below 6 ok runs) and `converged` (as the newest
    records say).
    """
    if by is None:
        by = (["sweep"] if "sweep" in df and df["sweep"].nunique() > 1 else []) + ["cell"]
        carry = [c for c in varying_params(df, with_members=True) if c not in by]
    else:
        by = [by] if isinstance(by, str) else list(by)
        carry = []
    missing = [c for c in by if c not in df]
    if missing:
        raise KeyError(f"summarize: no column {missing[0]!r} in the frame (columns: {', '.join(df.columns)})")
    metrics = [m for m in metrics if m in df]
    ok = df["status"] == OK
    adaptive = "convergence" in df and df["convergence"].notna().any()
    rows = []
    # dropna=False: a parameter that is null (window = kernel default) is a group of its own
    for key, group in df.groupby(by, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key))
        for c in carry:
            row[c] = group[c].iloc[0]
        good = group[ok.loc[group.index]]
        row["n"] = len(good)
        row["n_failed"] = len(group) - len(good)
        for m in metrics:
            vals = pd.to_numeric(good[m], errors="coerce").dropna().to_numpy(dtype="float64")
            if len(vals):
                row[f"{m}_median"] = float(np.median(vals))
                row[f"{m}_min"] = float(vals.min())
                row[f"{m}_max"] = float(vals.max())
            else:
                row[f"{m}_median"] = row[f"{m}_min"] = row[f"{m}_max"] = math.nan
            row[f"{m}_ci_low"], row[f"{m}_ci_high"], row[f"{m}_ci_level"] = median_ci(vals, ci)
        row["ci_level"] = median_ci_level(len(good), median_ci_rank(len(good), ci))
        row["ci_met"] = bool(row["ci_level"] >= ci)
        if adaptive:
            rates = pd.to_numeric(good["gbit_s"], errors="coerce").dropna() if "gbit_s" in good else []
            row["width_pct"] = ci_width_pct(list(rates), CI)
            row["converged"] = _converged(group)
        rows.append(row)
    out = pd.DataFrame(rows, columns=_summary_columns(by + carry, metrics)
                       + (["converged", "width_pct"] if adaptive else []))
    out.attrs["ci_method"] = ci_method(ci)
    out.attrs["ci"] = ci
    return out


def _converged(group: pd.DataFrame) -> bool:
    """Whether every cell of a group ended converged: the `convergence` state of each cell's newest record
    (the frame keeps one record per repeat; the highest repeat run is the cell's last)."""
    import json

    last = group.sort_values("repeat").groupby("cell", sort=False).tail(1)["convergence"]
    states = [json.loads(v) if isinstance(v, str) else v for v in last]
    return bool(states) and all(isinstance(st, dict) and bool(st.get("converged")) for st in states)


def _summary_columns(keys: list, metrics: list) -> list:
    cols = list(keys) + ["n", "n_failed", "ci_level", "ci_met"]
    for m in metrics:
        cols += [f"{m}_{s}" for s in ("median", "min", "max", "ci_low", "ci_high", "ci_level")]
    return cols


# ---------------------------------------------------------------------------------------------
# Mann–Whitney U (two-sided)


# How each method of mann_whitney_u() is described in compare's output.
MW_METHODS = {"exact": "exact",
              "permutation": "exact permutation distribution, ties",
              "normal": "normal approximation, tie and continuity corrections"}
# Ties and at most this many ways to split the pooled values into the two samples: enumerate them
# all (8 runs a side: 12870, a fraction of a second) rather than approximate.
PERMUTATION_LIMIT = 20_000


@dataclass(frozen=True)
class MannWhitney:
    u: float  # U statistic of the first sample
    p_value: float  # two-sided
    method: str  # "exact", "permutation", "normal" (see MW_METHODS) or "none" (an empty sample)

    @property
    def description(self) -> str:
        """E.g. 'two-sided Mann–Whitney U (scipy.stats.mannwhitneyu, exact)'."""
        return f"two-sided Mann–Whitney U (scipy.stats.mannwhitneyu, {MW_METHODS.get(self.method, self.method)})"


def mann_whitney_u(x: Iterable[float], y: Iterable[float], exact_limit: int = 20) -> MannWhitney:
    """Two-sided Mann–Whitney U test of x against y (scipy.stats.mannwhitneyu), NaNs dropped.

    When both samples have at most `exact_limit` values: without ties the exact distribution of U
    (method "exact"); with ties scipy's "exact" would use the distribution without ties, so the exact
    permutation distribution of U given the ties instead (scipy.stats.PermutationMethod, every split
    enumerated) as long as there are at most PERMUTATION_LIMIT splits. Otherwise the normal
    approximation with tie correction and continuity correction. Either exact method keeps
    min_p_value() true: a p-value never goes below it, whereas the normal approximation of small
    tied samples could (3 ties against 3 ties: p = 0.047 < min_p_value(3, 3) = 0.1).
    """
    import scipy.stats   # on first use: its import is most of the CPU a fleet's end comparison costs

    x = np.asarray(list(x), dtype="float64")
    y = np.asarray(list(y), dtype="float64")
    x, y = x[~np.isnan(x)], y[~np.isnan(y)]
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        return MannWhitney(math.nan, math.nan, "none")
    ties = len(np.unique(np.concatenate([x, y]))) < n1 + n2
    if n1 > exact_limit or n2 > exact_limit:
        method, scipy_method = "normal", "asymptotic"
    elif not ties:
        method, scipy_method = "exact", "exact"
    elif math.comb(n1 + n2, n1) <= PERMUTATION_LIMIT:
        method, scipy_method = "permutation", scipy.stats.PermutationMethod(n_resamples=np.inf)
    else:
        method, scipy_method = "normal", "asymptotic"
    if method == "permutation" and min(n1, n2) < 2:
        # scipy's permutation test wants two values a side; one run against tied ones (repeats: 1, a CPU
        # figure in whole ticks) is the same enumeration of every split, done here
        return MannWhitney(*_split_permutation_u(x, y), method)
    res = scipy.stats.mannwhitneyu(x, y, use_continuity=True, alternative="two-sided", method=scipy_method)
    return MannWhitney(float(res.statistic), float(res.pvalue), method)


def _split_permutation_u(x: np.ndarray, y: np.ndarray) -> "tuple[float, float]":
    """(U of x, two-sided p) from every split of the pooled values into |x| and |y| (midranks for ties):
    p = 2 x the smaller tail, at most 1, as scipy.stats.permutation_test defines it for mannwhitneyu's
    PermutationMethod (tests/test_analysis_stats.py checks the two agree where scipy takes the samples)."""
    import itertools

    import scipy.stats

    n1 = len(x)
    ranks = scipy.stats.rankdata(np.concatenate([x, y]))
    offset = n1 * (n1 + 1) / 2
    observed = float(ranks[:n1].sum() - offset)
    null = np.array([ranks[list(split)].sum() for split in itertools.combinations(range(len(ranks)), n1)]) - offset
    eps = 1e-12 * max(1.0, abs(observed))   # rank sums of midranks are halves: exact in floating point anyway
    less, greater = float(np.mean(null <= observed + eps)), float(np.mean(null >= observed - eps))
    return observed, min(1.0, 2 * min(less, greater))


def min_p_value(n1: int, n2: int) -> float:
    """The smallest two-sided p-value mann_whitney_u() can give for samples of these sizes (both at
    most its exact_limit): that of two separated samples without ties, 2 / C(n1 + n2, n1)."""
    return min(1.0, 2.0 / math.comb(n1 + n2, n1))


def can_be_significant(n1: int, n2: int, alpha: float, exact_limit: int = 20) -> bool:
    """Whether mann_whitney_u() of samples of these sizes can give p < alpha at all. False only where its method
    is exact whatever the values (both samples within exact_limit, and few enough splits to enumerate with
    ties), so that min_p_value() bounds every p it gives, and that bound is not below alpha: then any two such
    samples are `not significant`, tested or not (2 repeats against 6: p >= 2/28)."""
    if n1 > exact_limit or n2 > exact_limit or math.comb(n1 + n2, n1) > PERMUTATION_LIMIT:
        return True
    return min_p_value(n1, n2) < alpha


# ---------------------------------------------------------------------------------------------
# The minimum detectable change of a two-sample comparison

# The asymptotic relative efficiency of Mann–Whitney U against the t test on normal data is 3/π: it needs
# π/3 as many runs for the same power, i.e. its detectable shift is √(π/3) times the t test's.
MW_ARE = 3 / math.pi
MAX_RUNS_NEEDED = 1000


def detectable_change_pct(base: Sequence[float], cand: Sequence[float], alpha: float, power: float = 0.8) -> float:
    """The smallest change of the median, in % of the base's, that a two-sided Mann–Whitney U test of samples
    of these sizes would find at `alpha` with `power`, given their spread: inf when no p below alpha is
    attainable at these counts (min_p_value) or neither side has two runs to tell a spread, NaN when the
    base median is 0.

    The spread is relative_spread's; the shift is the t test's, (t(1-α/2) + t(power)) · s · √(1/n1 + 1/n2)
    with n1 + n2 − 2 degrees of freedom, widened by √(π/3) for the rank test's efficiency.
    tests/test_compare.py checks by simulation that a shift of this size is found as often as `power` says."""
    b, c = _finite(base), _finite(cand)
    rel = relative_spread(b, c)
    if rel != rel:
        return math.nan
    return shift_pct(rel, len(b), len(c), alpha, power)


def relative_spread(base: Sequence[float], cand: Sequence[float]) -> float:
    """The pooled sd of two samples (each about its own mean, ddof 1) relative to the base's median: inf
    when neither side has two values, NaN when the base median is 0 or the base is empty."""
    b, c = _finite(base), _finite(cand)
    if not len(b) or not float(np.median(b)):
        return math.nan
    dof = max(len(b) - 1, 0) + max(len(c) - 1, 0)
    if dof < 1:
        return math.inf
    ss = float(np.sum((b - b.mean()) ** 2)) + (float(np.sum((c - c.mean()) ** 2)) if len(c) else 0.0)
    return math.sqrt(ss / dof) / abs(float(np.median(b)))


def _finite(values: Sequence[float]) -> np.ndarray:
    v = np.asarray(values, dtype="float64")
    return v[np.isfinite(v)]


def shift_pct(rel_sd: float, n1: int, n2: int, alpha: float, power: float = 0.8) -> float:
    """detectable_change_pct for a relative run spread `rel_sd` and counts n1, n2: inf where the rank test
    cannot reach alpha at these counts. Small exact samples test at the largest p they can attain below
    alpha (attainable_alpha: 4 runs a side test at 0.029, not 0.05), and the shift is widened by
    1 + 1/(n1 + n2): without it, simulated normal runs found the shift 73-79% of the time at 4-6 runs a side,
    with it 84-86% (tests/test_compare.py)."""
    import scipy.special

    if n1 < 1 or n2 < 1 or not can_be_significant(n1, n2, alpha) or rel_sd == math.inf:
        return math.inf
    level = attainable_alpha(n1, n2, alpha)
    dof = max(n1 + n2 - 2, 1)
    quantiles = float(scipy.special.stdtrit(dof, 1 - level / 2)) + float(scipy.special.stdtrit(dof, power))
    return (100 * quantiles * rel_sd * math.sqrt(1 / n1 + 1 / n2) / math.sqrt(MW_ARE)) * (1 + 1 / (n1 + n2))


def attainable_alpha(n1: int, n2: int, alpha: float, exact_limit: int = 20) -> float:
    """The largest two-sided p-value below `alpha` that the exact Mann–Whitney U distribution of samples of
    these sizes (no ties) can give, i.e. the level the test really has; `alpha` itself past exact_limit
    (the normal approximation is continuous) and 0.0 when no p below alpha is attainable."""
    if n1 > exact_limit or n2 > exact_limit:
        return alpha
    counts = _u_counts(min(n1, n2), max(n1, n2))
    total = float(sum(counts))
    cumulative, best = 0.0, 0.0
    for c in counts[:len(counts) // 2 + 1]:
        cumulative += c
        p = min(1.0, 2 * cumulative / total)
        if p >= alpha:
            break
        best = p
    return best


@functools.lru_cache(maxsize=None)
def _u_counts(n1: int, n2: int) -> "tuple[int, ...]":
    """How many orderings of n1 + n2 distinct values give each U = 0 .. n1·n2 (the exact null distribution,
    by the recurrence on the largest value: it belongs to the first sample, adding n2 to U, or not)."""
    if n1 == 0 or n2 == 0:
        return (1,)
    first, second = _u_counts(n1 - 1, n2), _u_counts(n1, n2 - 1)
    out = [0] * (n1 * n2 + 1)
    for u, c in enumerate(first):
        out[u + n2] += c
    for u, c in enumerate(second):
        out[u] += c
    return tuple(out)


def runs_needed(rel_sd: float, threshold_pct: float, alpha: float, power: float = 0.8) -> int:
    """The fewest runs a side (the same on both) with which a change of the threshold is detectable at this
    spread; MAX_RUNS_NEEDED + 1 when even that many are not enough."""
    if not rel_sd < math.inf:
        return MAX_RUNS_NEEDED + 1
    n = 2
    while n <= MAX_RUNS_NEEDED:
        if shift_pct(rel_sd, n, n, alpha, power) <= threshold_pct:
            return n
        n = n + 1 if n < 50 else int(n * 1.1)
    return MAX_RUNS_NEEDED + 1


# ---------------------------------------------------------------------------------------------
# The seeds' table: rows send mode, columns receive mode, cells "MB/s (Gbit/s)" with the spread


def format_rate(mb_s: float, gbit_s: float) -> str:
    if not np.isfinite(mb_s):
        return "–"
    return f"{mb_s:.0f} MB/s ({gbit_s:.2f} Gbit/s)"


def format_spread(row: "pd.Series | dict", metric: str = "mb_s") -> str:
    """'75% CI 850–860, n=3' (or 'n=1' / 'all 3 failed'), in the metric's unit: the interval's own level."""
    n, failed = int(row["n"]), int(row["n_failed"])
    if n == 0:
        return f"all {failed} failed" if failed else "no runs"
    text = f"n={n}"
    low, high = row[f"{metric}_ci_low"], row[f"{metric}_ci_high"]
    if np.isfinite(low) and np.isfinite(high):
        level = row.get(f"{metric}_ci_level", math.nan) if hasattr(row, "get") else math.nan
        text = f"{ci_label(level) or 'CI'} {low:.0f}–{high:.0f}, " + text
    if failed:
        text += f", {failed} failed"
    return text


def mode_label(row, others: Sequence[str]) -> str:
    """'write → splice, buffer=256KiB': the modes, then the other parameters that vary (a missing one left out)."""
    rest = [f"{p}={format_value(p, row[p])}" for p in others
            if not (row[p] is None or (isinstance(row[p], (float, np.floating)) and math.isnan(row[p])))]
    return ", ".join([f"{row['send_mode']} → {row['recv_mode']}", *rest])


def mode_table(summary: pd.DataFrame) -> pd.DataFrame:
    """A summary by (send_mode, recv_mode) shaped like the seeds' tables: rows send mode, columns
    receive mode, cells 'MB/s (Gbit/s)' followed by the spread on a second line."""
    cells = {}
    for _, row in summary.iterrows():
        text = format_rate(row["mb_s_median"], row["gbit_s_median"]) + "\n" + format_spread(row)
        cells[(row["send_mode"], row["recv_mode"])] = text
    sends = sorted({k[0] for k in cells})
    recvs = sorted({k[1] for k in cells})
    table = pd.DataFrame([[cells.get((s, r), "") for r in recvs] for s in sends], index=sends, columns=recvs)
    table.index.name = "send mode"
    table.columns.name = "receive mode"
    return table
