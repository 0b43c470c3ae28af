"""Statistics on run frames: per-cell medians with distribution-free confidence intervals, Mann–Whitney U.

A median's interval is the order-statistic one (zcorch.results.intervals) and carries the level it really has
(three runs: [min, max] at 75%, never a claimed 95%); no bootstrap, which would claim 95% for 3 to 6 repeats."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from zcorch.analysis.frames import OK, PARAM_KEYS
from zcorch.results.intervals import CI, ci_width_pct, median_ci, median_ci_level, median_ci_rank, min_runs_for  # noqa: F401
from zcorch.metrics import SUMMARY
from zcorch.params import format_value

METRICS = SUMMARY   # the default metrics of summarize (zcorch.metrics)


def ci_method(ci: float = CI) -> str:
    """How summarize() computes its confidence intervals, in words (the report quotes it)."""
    return (f"confidence interval of the median from order statistics (distribution-free, binomial): the "
            f"narrowest [x(k), x(n+1-k)] of the ok runs covering the median with at least {ci:.0%}, "
            f"else [min, max] at the lower level it has (each interval states its level)")


def ci_label(level: float) -> str:
    """How a table tags an interval: "75% CI" for three runs, "" with none; rounded down (93.8% never reads 94%)."""
    return f"{math.floor(level * 1000) / 10:g}% CI" if level == level else ""


def varying_params(df: pd.DataFrame, with_members: bool = False) -> list:
    """Parameter columns with more than one value in the frame. A varying linked axis replaces its parameters
    (`with_members`: followed by them); a sink that only follows the filesystem is left out."""
    out = [col for col in PARAM_KEYS if col in df and df[col].astype(str).nunique(dropna=False) > 1]
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
            out[at:at] = [name] + (members if with_members else [])
    return out


def linked_axes(df: pd.DataFrame) -> dict:
    """{axis name: {"params", "labels"}} of the linked axes whose columns zcorch.load added (frames.add_linked_axes)."""
    return {k: v for k, v in (df.attrs.get("linked_axes") or {}).items() if k in df}


def summarize(df: pd.DataFrame, by: "str | Sequence[str] | None" = None,
              metrics: Sequence[str] = METRICS, ci: float = CI) -> pd.DataFrame:
    """Per group of runs (`by`, default the cell and the sweep when several, varying parameters carried): n (ok
    runs), n_failed, per metric its median, min, max, ci_low, ci_high, ci_level, and `ci_met` (level >= `ci`); with
    adaptive `repeats:` also `width_pct` and `converged`."""
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
        good = group[ok.loc[group.index]]
        row = {**dict(zip(by, key)), **{c: group[c].iloc[0] for c in carry}, "n": len(good),
               "n_failed": len(group) - len(good)}
        for m in metrics:
            vals = pd.to_numeric(good[m], errors="coerce").dropna().to_numpy(dtype="float64")
            for stat, of in (("median", np.median), ("min", np.min), ("max", np.max)):
                row[f"{m}_{stat}"] = float(of(vals)) if len(vals) else math.nan
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
    """Whether every cell of a group ended converged, by the `convergence` of its highest repeat's record."""
    import json

    last = group.sort_values("repeat").groupby("cell", sort=False).tail(1)["convergence"]
    states = [json.loads(v) if isinstance(v, str) else v for v in last]
    return bool(states) and all(isinstance(st, dict) and bool(st.get("converged")) for st in states)


def _summary_columns(keys: list, metrics: list) -> list:
    return list(keys) + ["n", "n_failed", "ci_level", "ci_met"] + [
        f"{m}_{s}" for m in metrics for s in ("median", "min", "max", "ci_low", "ci_high", "ci_level")]


# Mann–Whitney U (two-sided)


# How each method of mann_whitney_u() is described in compare's output.
MW_METHODS = {"exact": "exact",
              "permutation": "exact permutation distribution, ties",
              "normal": "normal approximation, tie and continuity corrections"}
# With ties and at most this many splits of the pooled values: enumerate them all rather than approximate.
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
    """Two-sided Mann–Whitney U test of x against y (scipy.stats.mannwhitneyu), NaNs dropped. Both samples within
    `exact_limit`: the exact distribution, or with ties the exact permutation one (up to PERMUTATION_LIMIT splits);
    else the normal approximation. The exact methods never go below min_p_value(), the normal one could."""
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
        # scipy's permutation test wants two values a side: the same enumeration of every split, done here
        return MannWhitney(*_split_permutation_u(x, y), method)
    res = scipy.stats.mannwhitneyu(x, y, use_continuity=True, alternative="two-sided", method=scipy_method)
    return MannWhitney(float(res.statistic), float(res.pvalue), method)


def _split_permutation_u(x: np.ndarray, y: np.ndarray) -> "tuple[float, float]":
    """(U of x, two-sided p) from every split of the pooled values (midranks for ties): p = 2 x the smaller tail, at
    most 1, as scipy.stats.permutation_test defines it."""
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
    """The smallest two-sided p-value mann_whitney_u() gives for exact samples of these sizes: 2 / C(n1 + n2, n1)."""
    return min(1.0, 2.0 / math.comb(n1 + n2, n1))


def can_be_significant(n1: int, n2: int, alpha: float, exact_limit: int = 20) -> bool:
    """Whether mann_whitney_u() of samples of these sizes can give p < alpha at all: False only where its method is
    exact whatever the values and min_p_value() is not below alpha (2 repeats against 6: p >= 2/28)."""
    if n1 > exact_limit or n2 > exact_limit or math.comb(n1 + n2, n1) > PERMUTATION_LIMIT:
        return True
    return min_p_value(n1, n2) < alpha


# The minimum detectable change of a two-sample comparison

# Mann–Whitney U's asymptotic efficiency against the t test on normal data: its shift is √(π/3) times the t's
MW_ARE = 3 / math.pi
MAX_RUNS_NEEDED = 1000


def detectable_change_pct(base: Sequence[float], cand: Sequence[float], alpha: float, power: float = 0.8) -> float:
    """The smallest change of the median, in % of the base's, a two-sided Mann–Whitney U test of these samples finds
    at `alpha` with `power` (shift_pct of their relative_spread): inf when unattainable or no spread, NaN when the
    base median is 0. tests/test_compare.py checks its power by simulation."""
    b, c = _finite(base), _finite(cand)
    rel = relative_spread(b, c)
    if rel != rel:
        return math.nan
    return shift_pct(rel, len(b), len(c), alpha, power)


def relative_spread(base: Sequence[float], cand: Sequence[float]) -> float:
    """The pooled sd of two samples (ddof 1) relative to the base's median: inf when neither side has two values,
    NaN when the base median is 0 or the base is empty."""
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
    """detectable_change_pct for a relative run spread `rel_sd` and counts n1, n2 (inf where the rank test cannot
    reach alpha): the t test's shift at the attainable_alpha, widened by √(π/3) for the rank test's efficiency and
    by 1 + 1/(n1 + n2), which brings small samples to the power asked (tests/test_compare.py)."""
    import scipy.special

    if n1 < 1 or n2 < 1 or not can_be_significant(n1, n2, alpha) or rel_sd == math.inf:
        return math.inf
    level = attainable_alpha(n1, n2, alpha)
    dof = max(n1 + n2 - 2, 1)
    quantiles = float(scipy.special.stdtrit(dof, 1 - level / 2)) + float(scipy.special.stdtrit(dof, power))
    return (100 * quantiles * rel_sd * math.sqrt(1 / n1 + 1 / n2) / math.sqrt(MW_ARE)) * (1 + 1 / (n1 + n2))


def attainable_alpha(n1: int, n2: int, alpha: float, exact_limit: int = 20) -> float:
    """The test's real level: the largest two-sided exact p below `alpha` (`alpha` past exact_limit, 0.0: none)."""
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
    """How many orderings of n1 + n2 distinct values give each U = 0 .. n1·n2 (recurrence on the largest value)."""
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
    """The fewest runs a side to detect a change of the threshold at this spread (else MAX_RUNS_NEEDED + 1)."""
    if not rel_sd < math.inf:
        return MAX_RUNS_NEEDED + 1
    n = 2
    while n <= MAX_RUNS_NEEDED:
        if shift_pct(rel_sd, n, n, alpha, power) <= threshold_pct:
            return n
        n = n + 1 if n < 50 else int(n * 1.1)
    return MAX_RUNS_NEEDED + 1


# The seeds' table: rows send mode, columns receive mode, cells "MB/s (Gbit/s)" with the spread


def format_rate(mb_s: float, gbit_s: float) -> str:
    return f"{mb_s:.0f} MB/s ({gbit_s:.2f} Gbit/s)" if np.isfinite(mb_s) else "–"


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
    """A summary by (send_mode, recv_mode) as the seeds' tables: cells 'MB/s (Gbit/s)' and the spread below."""
    cells = {(row["send_mode"], row["recv_mode"]): format_rate(row["mb_s_median"], row["gbit_s_median"]) + "\n"
             + format_spread(row) for _, row in summary.iterrows()}
    sends = sorted({k[0] for k in cells})
    recvs = sorted({k[1] for k in cells})
    table = pd.DataFrame([[cells.get((s, r), "") for r in recvs] for s in sends], index=sends, columns=recvs)
    table.index.name = "send mode"
    table.columns.name = "receive mode"
    return table
