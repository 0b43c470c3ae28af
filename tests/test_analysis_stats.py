"""Pure statistics: bootstrap CI of the median, Mann–Whitney U, summarize, the seeds' table shape,
and compare verdicts, on frames built here (real result sets are in test_analysis_load.py)."""
import itertools
import math

import numpy as np
import pandas as pd
import pytest
import scipy.stats

import zcorch
from zcorch.analysis import stats
from zcorch.analysis.compare import compare_frames, judge, regressed, render
from zcorch.analysis.frames import add_derived


def runs_frame(cells):
    """A frame shaped like zcorch.load's: cells = {(send, recv): [(status, mb_s), ...]}."""
    rows = []
    for (send, recv), runs in cells.items():
        for repeat, (status, mb_s) in enumerate(runs):
            rows.append({"sweep": "t", "cell": f"{send}-{recv}", "repeat": repeat, "status": status,
                         "send_mode": send, "recv_mode": recv, "buffer": 65536,
                         "mb_s": mb_s, "gbit_s": mb_s * 8 / 1000 if mb_s is not None else np.nan})
    return pd.DataFrame(rows)


# -- order-statistic interval of the median -----------------------------------------------------

@pytest.mark.parametrize("n, level", [(2, 0.5), (3, 0.75), (4, 0.875), (5, 0.9375), (6, 0.96875)])
def test_min_max_is_the_interval_of_few_runs_at_the_level_it_really_has(n, level):
    values = list(np.linspace(10.0, 20.0, n))
    low, high, got = stats.median_ci(values)
    assert (low, high) == (10.0, 20.0)
    assert got == pytest.approx(level)


def test_the_level_is_met_from_six_runs_and_the_interval_narrows_with_more():
    assert stats.min_runs_for(0.95) == 6
    assert stats.median_ci_rank(5) == 1 and stats.median_ci_level(5, 1) < 0.95
    x = list(range(1, 10))                        # 9 runs: [x(2), x(8)] has 96.1%, [x(3), x(7)] only 82%
    assert stats.median_ci(x)[:2] == (2.0, 8.0)
    assert stats.median_ci(x)[2] == pytest.approx(0.9609375)
    x = list(range(1, 101))
    low, high, level = stats.median_ci(x)
    assert 0.95 <= level < 0.97 and 35 < low < 50 < high < 66


def test_the_interval_covers_the_median_as_often_as_its_level_says():
    # the claim itself, checked by simulation on a skewed distribution (any continuous one would do):
    # a percentile bootstrap of three runs called [min, max] "95%" while it covers the median 75% of the time
    rng = np.random.default_rng(3)
    true_median = math.log(2)                     # of Exp(1)
    for n in (3, 5, 9):
        hits = 0
        trials = 4000
        for _ in range(trials):
            low, high, level = stats.median_ci(rng.exponential(1.0, n))
            hits += low <= true_median <= high
        assert abs(hits / trials - level) < 0.03, (n, hits / trials, level)


def test_no_interval_below_two_values_and_nans_are_left_out():
    for values in ([5.0], [], [np.nan, 3.0]):
        assert all(math.isnan(v) for v in stats.median_ci(values))
    assert stats.median_ci([857.0, 857.0, 857.0])[:2] == (857.0, 857.0)
    assert stats.median_ci([1.0, np.nan, 3.0, 2.0])[:2] == (1.0, 3.0)


def test_labels_never_round_a_level_up_to_one_it_does_not_have():
    assert stats.ci_label(0.75) == "75% CI"
    assert stats.ci_label(0.9375) == "93.7% CI"     # not "94%", never "95%"
    assert stats.ci_label(math.nan) == ""
    assert "order statistics" in stats.ci_method() and "bootstrap" not in stats.ci_method()


# -- Mann–Whitney U ---------------------------------------------------------------------------

def enumerated_p(x, y) -> float:
    """Two-sided p of U by brute force: U of the first sample over every way to split the pooled
    values into samples of these sizes (average ranks, so ties count as halves)."""
    pooled = np.concatenate([x, y]).astype(float)
    n1 = len(x)

    def u(first):
        rest = np.delete(pooled, first)
        return sum((a > b) + 0.5 * (a == b) for a in pooled[list(first)] for b in rest)

    us = np.array([u(first) for first in itertools.combinations(range(len(pooled)), n1)])
    observed = u(tuple(range(n1)))
    return min(1.0, 2 * min((us <= observed).mean(), (us >= observed).mean()))


def test_mann_whitney_matches_published_example():
    # The example of scipy.stats.mannwhitneyu's documentation (Conover): U1 = 17, exact two-sided
    # p = 0.1111, asymptotic with continuity correction p = 0.11134688653314041.
    males = [19, 22, 16, 29, 24]
    females = [20, 11, 17, 12]
    exact = stats.mann_whitney_u(males, females)
    assert exact.u == 17 and exact.method == "exact"
    assert exact.p_value == pytest.approx(0.1111111111111111)
    assert exact.description == "two-sided Mann–Whitney U (scipy.stats.mannwhitneyu, exact)"
    normal = stats.mann_whitney_u(males, females, exact_limit=0)
    assert normal.method == "normal"
    assert normal.p_value == pytest.approx(0.11134688653314041, rel=1e-9)


def test_mann_whitney_exact_p_of_real_cells_is_the_enumerated_one(small_set):
    df = zcorch.load(small_set)
    ok = df[df["status"] == "ok"]
    cells = [g["gbit_s"].to_numpy(float) for _, g in ok.groupby("cell")]
    assert len(cells) == 12
    for x, y in itertools.combinations(cells[:6], 2):  # 3 repeats a side, no ties
        r = stats.mann_whitney_u(x, y)
        assert r.method == "exact"
        assert r.p_value == pytest.approx(enumerated_p(x, y), rel=1e-12)
    both = np.concatenate(cells[:2]), np.concatenate(cells[2:4])  # 6 a side
    assert stats.mann_whitney_u(*both).p_value == pytest.approx(enumerated_p(*both), rel=1e-12)


def test_mann_whitney_separated_samples_and_minimum_p():
    r = stats.mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert r.u == 0 and r.p_value == pytest.approx(2 / math.comb(10, 5))
    assert stats.mann_whitney_u([1, 2, 3], [4, 5, 6]).p_value == pytest.approx(0.1)
    assert stats.min_p_value(3, 3) == pytest.approx(0.1)
    assert stats.mann_whitney_u([6, 7, 8], [1, 2, 3]).u == 9  # U of the first sample
    for n1, n2 in itertools.product(range(1, 8), repeat=2):
        separated = stats.mann_whitney_u(range(n1), range(n1, n1 + n2))
        assert stats.min_p_value(n1, n2) == pytest.approx(separated.p_value, rel=1e-12), (n1, n2)


def test_can_be_significant_is_whether_some_samples_of_those_sizes_reach_alpha():
    """False only where no two samples of these sizes, tied or not, give p < alpha (the end of a fleet run then
    skips their test): every split of 1..7 against 1..7 distinct ranks and a tied case checked by the test."""
    for n1, n2 in itertools.product(range(1, 8), repeat=2):
        separated = stats.mann_whitney_u(range(n1), range(n1, n1 + n2)).p_value   # the smallest p of these sizes
        # (scipy's permutation test takes no sample of one value: tied samples from two a side)
        tied = stats.mann_whitney_u([0] * n1, [1] * n2).p_value if min(n1, n2) > 1 else separated
        for alpha in (0.01, 0.05, 0.1):
            possible = stats.can_be_significant(n1, n2, alpha)
            assert possible == (separated < alpha), (n1, n2, alpha)
            assert possible or tied >= alpha, (n1, n2, alpha)
    assert stats.can_be_significant(2, 6, 0.05) is False and stats.can_be_significant(5, 5, 0.05) is True
    assert stats.can_be_significant(21, 1, 0.05) is True   # beyond the exact methods: never assumed hopeless


def test_mann_whitney_small_tied_samples_use_the_permutation_distribution():
    for x, y in [([1, 1, 2, 2, 3], [2, 3, 3, 4, 4]), ([1, 1, 1], [2, 2, 2]), ([800, 800, 810], [790, 800, 800])]:
        r = stats.mann_whitney_u(x, y)
        assert r.method == "permutation" and "exact permutation distribution, ties" in r.description
        assert r.p_value == pytest.approx(enumerated_p(x, y), rel=1e-12)
    # The normal approximation would give 3 ties against 3 ties p = 0.047: significant although
    # min_p_value(3, 3) says 3 repeats a side never can be.
    tied = stats.mann_whitney_u([1, 1, 1], [2, 2, 2])
    assert tied.p_value == pytest.approx(0.1) and tied.p_value >= stats.min_p_value(3, 3)
    same = stats.mann_whitney_u([5, 5, 5], [5, 5, 5])
    assert same.p_value == 1.0


def test_one_run_against_tied_runs_is_judged_not_a_crash():
    """scipy's permutation test wants two values a side: one run against runs it ties with (`repeats: 1`, a CPU
    figure in whole ticks) raised ValueError out of compare and history; it is the same enumeration here."""
    for x, y in [([5], [5, 5]), ([5], [5]), ([3], [1, 2, 3]), ([1, 2, 3], [3]), ([2], [1, 1, 2, 2, 3])]:
        r = stats.mann_whitney_u(x, y)
        assert r.method == "permutation" and r.p_value == pytest.approx(enumerated_p(x, y), rel=1e-12), (x, y)
        assert r.p_value >= stats.min_p_value(len(x), len(y))
    j = judge(np.array([10.0]), np.array([10.0, 10.0]), higher_better=True, threshold_pct=3.0, alpha=0.05)
    # one run tells no spread and 1 against 2 never reach p < 0.05: not an all-clear, and it says what would be
    assert j.verdict == "cannot tell" and j.p_value == 1.0 and j.detectable_pct == math.inf
    assert j.needs.startswith("≥ 4 runs a side")
    # where scipy takes the samples, the enumeration here is its definition of the two-sided p
    rng = np.random.default_rng(7)
    for _ in range(60):
        x, y = (rng.integers(0, 4, n).astype(float) for n in rng.integers(2, 6, 2))
        ours = stats._split_permutation_u(x, y)
        theirs = scipy.stats.mannwhitneyu(x, y, use_continuity=True, alternative="two-sided",
                                          method=scipy.stats.PermutationMethod(n_resamples=np.inf))
        assert ours == pytest.approx((theirs.statistic, theirs.pvalue), rel=1e-12), (x, y)


def test_mann_whitney_large_tied_samples_use_the_corrected_normal_approximation():
    x, y = [1] * 5 + [2] * 5, [2] * 5 + [3] * 5  # C(20, 10) splits: too many to enumerate
    r = stats.mann_whitney_u(x, y)
    assert r.method == "normal" and r.u == 12.5
    # by hand: mu = 50, tie groups of 5, 10, 5: sigma^2 = 100/12 * (21 - (120 + 990 + 120) / 380)
    z = (50 - 12.5 - 0.5) / math.sqrt(100 / 12 * (21 - 1230 / 380))
    assert r.p_value == pytest.approx(math.erfc(z / math.sqrt(2)), rel=1e-9)
    assert math.isnan(stats.mann_whitney_u([], [1.0]).p_value)


# -- summarize ------------------------------------------------------------------------------------

def test_summarize_counts_failed_runs_but_never_averages_them():
    df = runs_frame({("write", "read"): [("ok", 800), ("ok", 820), ("ok", 810), ("failed", 99999),
                                         ("timeout", None)],
                     ("splice", "read"): [("failed", None), ("failed", None)]})
    s = stats.summarize(df, by=["send_mode", "recv_mode"], metrics=["mb_s"])
    wr = s[s["send_mode"] == "write"].iloc[0]
    assert (wr["n"], wr["n_failed"]) == (3, 2)
    assert (wr["mb_s_median"], wr["mb_s_min"], wr["mb_s_max"]) == (810, 800, 820)
    assert (wr["mb_s_ci_low"], wr["mb_s_ci_high"]) == (800, 820)   # three runs: min-max ...
    assert wr["mb_s_ci_level"] == pytest.approx(0.75) and wr["ci_level"] == pytest.approx(0.75)
    assert not wr["ci_met"]                                           # ... at 75%, not the 95% asked for
    assert stats.format_spread(wr) == "75% CI 800–820, n=3, 2 failed"
    sp = s[s["send_mode"] == "splice"].iloc[0]
    assert (sp["n"], sp["n_failed"]) == (0, 2) and math.isnan(sp["mb_s_median"])
    assert math.isnan(sp["ci_level"]) and not sp["ci_met"]
    assert "order statistics" in s.attrs["ci_method"]


def test_summarize_default_groups_by_cell_and_carries_varying_params():
    df = runs_frame({("write", "read"): [("ok", 1), ("ok", 2)], ("splice", "read"): [("ok", 3)]})
    s = stats.summarize(df, metrics=["mb_s"])
    assert list(s.columns[:4]) == ["cell", "send_mode", "n", "n_failed"]
    assert "recv_mode" not in s.columns  # constant across the frame
    assert "buffer" not in s.columns
    assert sorted(s["n"]) == [1, 2]
    with pytest.raises(KeyError, match="nope"):
        stats.summarize(df, by="nope")


def test_mode_table_has_the_seeds_shape():
    df = runs_frame({("write", "read"): [("ok", 857), ("ok", 857), ("ok", 857)],
                     ("splice", "read"): [("ok", 854), ("failed", None)],
                     ("write", "splice"): [("failed", None)]})
    table = stats.mode_table(stats.summarize(df, by=["send_mode", "recv_mode"], metrics=["mb_s", "gbit_s"]))
    assert list(table.index) == ["splice", "write"] and list(table.columns) == ["read", "splice"]
    assert table.loc["write", "read"].startswith("857 MB/s (6.86 Gbit/s)\n")
    assert "n=3" in table.loc["write", "read"]
    assert table.loc["splice", "read"].endswith("n=1, 1 failed")
    assert table.loc["write", "splice"] == "–\nall 1 failed"
    assert table.loc["splice", "splice"] == ""


# -- derived columns ----------------------------------------------------------------------------

def test_derived_columns_follow_the_definitions():
    df = pd.DataFrame({"status": ["ok", "failed"],
                       "send_bytes": [2 ** 30, np.nan], "send_wall_ns": [2e9, np.nan],
                       "send_utime_us": [250_000, np.nan], "send_stime_us": [750_000, np.nan],
                       "recv_bytes": [2 ** 30, np.nan], "recv_wall_ns": [1e9, np.nan],
                       "recv_utime_us": [100_000, np.nan], "recv_stime_us": [400_000, np.nan]})
    d = add_derived(df)
    assert d.loc[0, "mb_s"] == pytest.approx(2 ** 30 / 1e6)  # receiver's wall time wins
    assert d.loc[0, "gbit_s"] == pytest.approx(2 ** 30 * 8 / 1e9)
    assert d.loc[0, "send_cpu_s_per_gib"] == pytest.approx(1.0)
    assert d.loc[0, "recv_cpu_s_per_gib"] == pytest.approx(0.5)
    assert d.loc[0, "send_sys_share"] == pytest.approx(0.75)
    assert d.loc[1, ["mb_s", "gbit_s", "send_cpu_s_per_gib", "send_sys_share"]].isna().all()


# -- compare ------------------------------------------------------------------------------------

def test_compare_verdicts():
    base = runs_frame({("write", "read"): [("ok", v) for v in (800, 810, 805, 795, 802)],
                       ("splice", "read"): [("ok", v) for v in (900, 905, 910, 895, 901)],
                       ("mmap", "read"): [("ok", v) for v in (500, 510, 505)],
                       ("vmsplice", "read"): [("ok", 100), ("ok", 101), ("ok", 99)],
                       ("sendfile", "read"): [("ok", 700)] * 5})
    cand = runs_frame({("write", "read"): [("ok", v) for v in (600, 610, 605, 595, 602)],  # -25 %, n=5
                       ("splice", "read"): [("ok", v) for v in (903, 899, 911, 897, 902)],  # noise
                       ("mmap", "read"): [("ok", v) for v in (300, 310, 305)],  # -40 % but n=3
                       ("vmsplice", "read"): [("failed", None)] * 3,
                       ("msg_zerocopy", "read"): [("ok", 1)]})
    t = compare_frames(base, cand, metric="mb_s", threshold_pct=5).set_index("send_mode")
    assert t.loc["write", "verdict"] == "regressed"
    assert t.loc["write", "change_pct"] == pytest.approx((602 - 802) / 802 * 100)  # medians
    assert t.loc["write", "p_value"] == pytest.approx(2 / 252)
    assert t.loc["splice", "verdict"] == "unchanged"
    assert t.loc["splice", "detectable_pct"] <= 5   # 5 quiet runs a side could have seen a 5% change
    assert t.loc["mmap", "verdict"] == "cannot tell"  # -40 % but 3 vs 3: p >= 0.1 at best
    assert t.loc["mmap", "detectable_pct"] == math.inf and t.loc["mmap", "needs"].startswith("≥ 4 runs a side")
    assert t.loc["vmsplice", "verdict"] == "failed"
    assert t.loc["sendfile", "verdict"] == "only in base"
    assert t.loc["msg_zerocopy", "verdict"] == "only in candidate"
    assert regressed(t.reset_index())
    md = render(t.reset_index(), "markdown", "nightly-1", "nightly-2")
    assert md.startswith("### zcorch compare: REGRESSION: 2 cell(s)")
    write_line = next(line for line in md.splitlines() if line.startswith("| write-read |"))
    assert write_line.endswith("| regressed |")
    assert "too few repeats" in md
    exact = "two-sided Mann–Whitney U (scipy.stats.mannwhitneyu, exact)"
    assert f"significance: {exact}, alpha 0.05" in md  # the method used, said in the output
    assert t.loc["write", "test"] == exact and t.loc["vmsplice", "test"] == ""


def test_compare_improvement_is_not_a_regression_and_cpu_is_lower_is_better():
    base = runs_frame({("write", "read"): [("ok", v) for v in (600, 610, 605, 595, 602)]})
    cand = runs_frame({("write", "read"): [("ok", v) for v in (800, 810, 805, 795, 802)]})
    t = compare_frames(base, cand, metric="gbit_s")
    assert list(t["verdict"]) == ["improved"] and not regressed(t)
    base["send_cpu_s_per_gib"], cand["send_cpu_s_per_gib"] = base["mb_s"], cand["mb_s"]
    t = compare_frames(base, cand, metric="send_cpu_s_per_gib")
    assert list(t["verdict"]) == ["regressed"]


def test_compare_names_each_test_it_used():
    base = runs_frame({("write", "read"): [("ok", v) for v in (800, 800, 810)],
                       ("splice", "read"): [("ok", v) for v in (900, 905, 910)]})
    cand = runs_frame({("write", "read"): [("ok", v) for v in (800, 790, 790)],  # ties: permutation
                       ("splice", "read"): [("ok", v) for v in (700, 705, 710)]})
    t = compare_frames(base, cand, metric="mb_s")
    text = render(t)
    assert ("significance: two-sided Mann–Whitney U (scipy.stats.mannwhitneyu, exact permutation distribution, "
            "ties) in 1 cell(s); two-sided Mann–Whitney U (scipy.stats.mannwhitneyu, exact) in 1 cell(s)") in text
    only_base = compare_frames(base, cand.iloc[0:0], metric="mb_s")
    assert "significance: two-sided Mann–Whitney U (no cell had ok runs on both sides)" in render(only_base)


def test_the_exact_binomial_sums_agree_with_scipy():
    import scipy.stats
    for n in range(2, 60):
        for k in range(1, n // 2 + 1):
            assert stats.median_ci_level(n, k) == pytest.approx(1 - 2 * scipy.stats.binom.cdf(k - 1, n, 0.5),
                                                                abs=1e-12)


def test_the_width_a_target_is_held_to():
    assert stats.ci_width_pct([100.0] * 5) == math.inf            # five runs: no 95% interval yet
    assert stats.ci_width_pct([100.0, 99.0, 101.0, 100.5, 99.5, 100.0]) == pytest.approx(1.0)
    assert stats.ci_width_pct([100.0, 99.0, 101.0, 100.5, 99.5, 100.0], ci=0.5) == pytest.approx(0.5)
    assert stats.ci_width_pct([0.0] * 8) == math.inf


@pytest.mark.slow
def test_the_detectable_change_is_found_as_often_as_its_power_says():
    """A shift of stats.shift_pct's size between normal samples is found by mann_whitney_u at alpha about 80%
    of the time (at least 75%: the statement errs on the safe side, never promising what the test cannot
    see), and not far more often (at most 93%: not so wide it calls every decidable cell undecidable)."""
    from zcorch.analysis.stats import attainable_alpha, mann_whitney_u, shift_pct

    rng = np.random.default_rng(7)
    for n1, n2, alpha in ((4, 4, 0.05), (5, 5, 0.05), (3, 8, 0.05), (6, 6, 0.005), (12, 12, 0.05), (25, 25, 0.05)):
        shift = shift_pct(0.03, n1, n2, alpha)
        hits = sum(mann_whitney_u(100 + 3 * rng.standard_normal(n1),
                                  100 * (1 - shift / 100) + 3 * rng.standard_normal(n2)).p_value < alpha
                   for _ in range(600))
        assert 0.75 <= hits / 600 <= 0.93, (n1, n2, alpha, shift, hits)
    # no p below alpha is attainable: nothing is detectable, whatever the spread
    assert shift_pct(0.0, 3, 3, 0.05) == math.inf and shift_pct(0.01, 5, 5, 0.005) == math.inf
    assert attainable_alpha(4, 4, 0.05) == pytest.approx(2 / 70) and attainable_alpha(3, 3, 0.05) == 0.0


def test_runs_needed_is_the_fewest_that_see_the_threshold():
    from zcorch.analysis.stats import runs_needed, shift_pct

    for rel, thr in ((0.03, 5.0), (0.08, 5.0), (0.01, 3.0)):
        n = runs_needed(rel, thr, 0.05)
        assert shift_pct(rel, n, n, 0.05) <= thr < shift_pct(rel, n - 1, n - 1, 0.05)
    assert runs_needed(0.0, 5.0, 0.05) == 4   # no spread: only the rank test's smallest p limits it
