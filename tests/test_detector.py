"""zcorch.analysis.detector: the newest night against the spread of nightly medians (the decision of
`zcorch history` and `history --check`). The pure functions on synthetic nights (a known spread is the
point: real nights are benchmarks/bench_detector.py's), the gate on result sets written through
zcorch.results.store."""
import math

import numpy as np
import pytest
import scipy.stats

from zcorch.analysis.compare import judge
from zcorch.analysis.detector import MIN_NIGHTS, NIGHTLY, RUNS, judge_newest, nightly_test
from zcorch.analysis.steps import ci_sds, fit_steps, point_sigmas
from zcorch.results.intervals import median_ci

from test_history import READ, check, nights, write_sweep


def series(levels, runs_per_night=9, run_sd=0.01, seed=0):
    """Nights of ok runs: night i has `runs_per_night` runs around levels[i] (relative sd `run_sd`)."""
    rng = np.random.default_rng(seed)
    return [lv * (1 + run_sd * rng.standard_normal(runs_per_night)) for lv in levels]


def decide(runs, higher_better=True, **kw):
    """judge_newest as zcorch.analysis.history calls it: medians, interval sds and the change-point fit."""
    med = np.array([np.median(r) if len(r) else math.nan for r in runs])
    ci = np.array([median_ci(r) for r in runs])
    fit = fit_steps(med, point_sigmas(med, ci[:, 0], ci[:, 1], ci[:, 2]))
    return judge_newest(med, ci_sds(ci[:, 0], ci[:, 1], ci[:, 2]), runs, fit, higher_better, **kw)


def nightly_levels(n, spread, seed):
    return list(10.0 * (1 + spread * np.random.default_rng(seed).standard_normal(n)))


@pytest.mark.slow
def test_a_stable_noisy_series_does_not_alarm_where_runs_against_runs_would():
    """Nights that spread by 4% (more than their runs: 1%) and no change: the nights from the sixth on of
    five series raise at most alpha (1%) false alarms, give or take the binomial noise of 175 nights; the
    runs-against-runs rule of `zcorch compare` calls many of the same nights regressed."""
    alarms = pooled = judged = 0
    for seed in range(5):
        runs = series(nightly_levels(40, 0.04, seed=seed), seed=seed)
        for t in range(max(MIN_NIGHTS, 2), len(runs)):
            c = decide(runs[:t + 1], threshold_pct=4.0, alpha=0.01)
            alarms += c.bad
            pooled += judge(np.concatenate(runs[:t]), runs[t], True, 4.0, 0.01).verdict == "regressed"
            judged += 1
    assert alarms <= 0.03 * judged, (alarms, judged)
    assert pooled >= 0.08 * judged, (pooled, judged)
    # a quiet stretch: not a single alarm
    quiet = series(nightly_levels(20, 0.01, seed=9), seed=9)
    assert not any(decide(quiet[:t + 1]).bad for t in range(max(MIN_NIGHTS, 2), 20))


def test_a_5pct_step_beyond_the_nightly_spread_alarms_on_its_first_night_and_after():
    levels = nightly_levels(25, 0.01, seed=5) + [9.5] * 3
    runs = series(levels, seed=5)
    first = decide(runs[:26])
    assert first.verdict == "regressed" and first.method == NIGHTLY
    assert first.baseline == list(range(25)) and first.since == 25 and first.window == [25]
    assert first.change_pct == pytest.approx(-5, abs=1.5) and first.spread_pct < 2
    assert first.n_base == 25 and first.p_value < 0.01
    third = decide(runs)
    assert third.verdict == "regressed" and third.since in (25, 26, 27)
    # with 10 earlier nights the spread is less certain: the step is caught by the mean of its nights
    short = series(nightly_levels(10, 0.01, seed=5) + [9.5] * 3, seed=5)
    assert decide(short).verdict == "regressed"
    # the same 5% step within nights that spread by 6% cannot be told on its first night: what would tell it
    wide = decide(series(nightly_levels(25, 0.06, seed=5) + [9.5], seed=5))
    assert wide.verdict == "cannot tell" and wide.spread_pct > 3
    assert wide.detectable_pct > 3 and "nightly spread below" in wide.needs, wide


def test_a_small_step_is_caught_by_the_mean_of_the_newest_nights():
    """A 3% step in nights that spread by 1.5%: judged on three nights' mean (noise σ/√3)."""
    runs = series(nightly_levels(20, 0.015, seed=11) + [9.7] * 3, seed=11)
    verdicts = [decide(runs[:t + 1], threshold_pct=2.0) for t in (20, 21, 22)]
    assert verdicts[-1].verdict == "regressed" and len(verdicts[-1].window) >= 2, verdicts[-1]


def test_lower_is_better_and_an_improvement_is_not_bad():
    runs = series(nightly_levels(12, 0.01, seed=2) + [12.0], seed=2)
    assert decide(runs, higher_better=False).verdict == "regressed"     # a CPU cost rose by 20%
    assert decide(runs, higher_better=True).verdict == "improved"


def test_too_few_nights_judges_runs_against_runs_and_says_so():
    """Fewer than `min_nights` earlier nights (here 5; one night is always too few: a spread needs two): no
    spread to judge by; the newest night's runs against the earlier nights' runs (compare's rule), method
    "runs", and the test says why; within the threshold: unchanged."""
    runs = series([10.0] * 3 + [8.0])
    c = decide(runs, min_nights=5)
    assert c.method == RUNS and c.verdict == "regressed" and "fewer than 5 nights" in c.test
    assert (c.n_base, c.n_cand) == (27, 9) and c.baseline == [0, 1, 2]
    same = decide(series([10.0] * 3 + [10.05]), min_nights=5)
    assert same.method == RUNS and same.verdict == "unchanged"
    one = decide(runs[2:], min_nights=2)
    assert one.method == RUNS and one.verdict == "regressed" and one.baseline == [0]
    assert decide(runs[:1]) is None   # nothing earlier
    assert decide(runs, min_nights=3).method == NIGHTLY


def test_a_newest_night_without_ok_runs_is_left_to_the_caller():
    runs = series([10.0] * 8) + [np.empty(0)]
    assert decide(runs) is None


@pytest.mark.slow
def test_false_alarms_of_normal_nights_are_at_most_alpha():
    """Student's t with the kept nights' degrees of freedom keeps the false-alarm rate of normal nights near
    alpha (one-sided) for every baseline length from two nights on: leaving out nights beyond REJECT_MADS
    robust sds almost never drops a normal night (dropping many would shrink the spread and alarm more)."""
    rng = np.random.default_rng(7)
    alpha, trials = 0.05, 3000
    for k in (2, 5, 8, 12, 25):
        alarms = 0
        for _ in range(trials):
            x = rng.standard_normal(k + 1) + 100
            alarms += nightly_test(x[:k], [np.nan] * k, x[k:], [np.nan], True, 0.0, alpha).verdict == "regressed"
        # binomial sd at 5% and 3000 trials: 0.4%
        assert alarms / trials < alpha + 0.015, (k, alarms / trials)
        assert alarms / trials > alpha / 3, (k, alarms / trials)   # the floors make it conservative


def test_one_wild_night_is_left_out_and_the_spread_is_floored_by_the_nights_own_noise():
    base = [10.0, 10.1, 9.9, 10.0, 10.2, 9.8, 10.1, 9.9, 30.0]  # one wild night does not widen the spread
    res = nightly_test(base, [0.01] * 9, [9.0], [0.01], True, 5.0, 0.01)
    assert res.spread == pytest.approx(np.std(base[:-1], ddof=1)) and res.level == pytest.approx(10.0)
    assert res.verdict == "regressed"
    assert scipy.stats.median_abs_deviation(base, scale="normal") > 0   # what judged the wild night
    flat = nightly_test([10.0] * 6, [0.2] * 6, [9.8], [0.2], True, 1.0, 0.01)
    assert flat.spread == pytest.approx(0.2) and flat.verdict == "cannot tell"


@pytest.mark.slow
def test_a_failed_newest_sweep_still_exits_3_and_a_stable_series_exits_0(tmp_path):
    root = tmp_path / "nightly"
    nights(root, "exp", [[(READ, 10.0)]] * 8, rel_noise=0.02)
    # 2% run noise, 5 runs a night, 7 nights before: the gate could not see a 3% change, so no all-clear...
    res = check(root)
    assert res.returncode == 3, res.stdout + res.stderr
    last = res.stdout.splitlines()[-1]
    assert last.startswith("zcorch history: cannot tell: 1 cell(s) cannot tell: ") and "needs " in last, last
    # ...but one of 10% it could, and says what it could see
    res = check(root, "--threshold", "10")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "could see changes ≥ " in res.stdout.splitlines()[-1]
    assert "MAD" in res.stdout   # the method line names the rule
    write_sweep(root / "newest" / "exp", "exp", 8, [(READ, 10.0)], status="failed",
                rel_noise=0.02)
    res = check(root, "--threshold", "10")
    assert res.returncode == 3, res.stdout + res.stderr
    assert res.stdout.splitlines()[-1].startswith("zcorch history: cannot tell: exp: newest sweep ")


def test_a_rise_is_not_hidden_by_the_wider_interval_its_own_higher_level_brings():
    """A night 4x higher with the baseline's *relative* precision has a 4x wider interval in absolute
    terms; that is no sign of a night that did not converge, and must not hide the rise."""
    from zcorch.analysis.detector import nightly_test

    base, base_sd = [1.0, 1.0, 1.0], [0.15, 0.15, 0.15]
    rise = nightly_test(base, base_sd, [4.0], [0.6], higher_better=False, threshold_pct=3.0, alpha=0.005)
    assert rise.verdict == "regressed", rise
    # a night at the same level whose interval is really wider (relative) still adds its excess
    loose = nightly_test(base, base_sd, [4.0], [2.4], higher_better=False, threshold_pct=3.0, alpha=0.005)
    assert loose.p_value > rise.p_value


def test_a_young_level_borrows_the_cells_nightly_spread_instead_of_runs_against_runs():
    """After a real step, the new level's first nights have too few nights of their own for a spread: they
    are judged with the spread the cell's nights show at its earlier level (relative), not runs against
    runs, which ignores how nights differ. Nights spread 4% around each level, runs within a night 1%."""
    rng_levels = nightly_levels(20, 0.04, seed=21) + list(np.array(nightly_levels(3, 0.04, seed=22)) * 0.7)
    runs = series(rng_levels, seed=21)
    med = np.array([np.median(r) for r in runs])
    ci = np.array([median_ci(r) for r in runs])
    fit = fit_steps(med, point_sigmas(med, ci[:, 0], ci[:, 1], ci[:, 2]))
    assert fit.steps == [20], fit.steps   # the 30% drop is found, where it is
    sd = ci_sds(ci[:, 0], ci[:, 1], ci[:, 2])
    # night 22, the third of the new level: the drop is still reported against the old level...
    c = judge_newest(med, sd, runs, fit, True)
    assert c.verdict == "regressed" and c.method == NIGHTLY and c.since == 20
    # ...and the new level's own first nights, judged against it, borrow the spread (no runs rule)
    young = judge_newest(med[20:], sd[20:], runs[20:], fit_steps(med[20:], point_sigmas(
        med[20:], ci[20:, 0], ci[20:, 1], ci[20:, 2])), True)
    assert young.method == RUNS   # nothing to borrow from: a series of three nights knows no spread
    from zcorch.analysis.detector import pooled_spread
    pooled = pooled_spread(med, fit, list(range(22)))
    assert pooled is not None and pooled.df == 19 + 1   # 20 nights of the old level, 2 of the new one
    assert 0.02 < pooled.rel < 0.08, pooled


@pytest.mark.slow
def test_borrowing_the_spread_cuts_the_false_alarms_of_spurious_levels():
    """No change, but lumpy nights (each night one of six machine states, as this machine's sweeps are: the
    medians of six real write->read sweeps relative to their mean): the change-point fit sometimes splits
    such a series into levels. A young level judged runs against runs alarmed on such nights
    (bench_detector: 7 of 8 false alarms of this machine's write->read series); with the borrowed spread
    at most alpha of the nights alarm, while the runs rule on the same young levels alarms far more."""
    states = np.array([16.10, 16.03, 17.22, 15.94, 16.84, 16.80]) / 16.49
    alarms = judged = runs_rule = young = young_alarms = 0
    for seed in range(40):
        rng = np.random.default_rng(300 + seed)
        runs = series(list(10.0 * rng.choice(states, 30)), seed=300 + seed)
        for t in range(10, 30):
            c = decide(runs[:t + 1], alpha=0.01)
            judged += 1
            alarms += c.bad
            if c.method == NIGHTLY and c.n_base < MIN_NIGHTS:
                young += 1
                young_alarms += c.bad
                base = np.concatenate([runs[i] for i in c.baseline])
                runs_rule += judge(base, runs[t], True, 3.0, 0.01).verdict == "regressed"
    assert alarms <= 0.015 * judged, (alarms, judged)
    assert young >= 3, young   # the fit did split series: the borrowing was exercised
    assert runs_rule >= 2 and young_alarms <= runs_rule // 2, (young, young_alarms, runs_rule)


def test_the_detectors_median_is_numpys():
    from zcorch.analysis.steps import median_of as _median   # the detector's and the fit's sigmas' median

    rng = np.random.default_rng(11)
    for _ in range(2000):
        x = rng.standard_normal(int(rng.integers(1, 40))) * 10 ** rng.uniform(-4, 4) + rng.uniform(-100, 100)
        assert _median(x) == float(np.median(x))


def synthetic_nights(rng, n, run_pct, night_pct, runs_per_night=20):
    """Nights of known noise (as benchmarks/bench_detector.py --synthetic RUN_PCT,NIGHT_PCT): a night's level
    spreads by night_pct % about 10, its runs by run_pct % about that level."""
    levels = 10.0 * (1 + night_pct / 100 * rng.standard_normal(n))
    return [lv * (1 + run_pct / 100 * rng.standard_normal(runs_per_night)) for lv in levels]


def test_the_default_rule_catches_steps_near_the_bound_with_few_false_alarms():
    """Runs spread 3%, nights 1% (20 runs a night: nightly medians spread ~1.3%). False alarms of the default
    rule at most 1 per 100 series-nights (nights 11-30 of series with no change), and 5% and 10% steps caught
    within 3 nights in at least 80% of the bound: the most any rule can catch within 3 nights at 1 false alarm
    per 100 nights (the known-sd test of the 3 nights' mean at 3%)."""
    rng = np.random.default_rng(42)
    alarms = judged = 0
    medians = []
    for _ in range(30):
        runs = synthetic_nights(rng, 30, 3.0, 1.0)
        medians.append([np.median(r) for r in runs])
        for t in range(10, 30):
            c = decide(runs[:t + 1])
            alarms += c.bad
            judged += 1
            assert c.verdict != "unchanged" or c.detectable_pct <= 3.0, c
    assert alarms <= judged / 100, (alarms, judged)
    sd_pct = float(np.mean([np.std(m, ddof=1) / np.mean(m) for m in medians])) * 100
    for step in (0.05, 0.10):
        bound = scipy.stats.norm.sf(scipy.stats.norm.isf(0.03) - step * 100 * math.sqrt(3) / sd_pct)
        caught = 0
        for _ in range(10):
            runs = synthetic_nights(rng, 23, 3.0, 1.0)
            runs = runs[:20] + [r * (1 - step) for r in runs[20:]]
            caught += any(decide(runs[:t + 1]).verdict == "regressed" for t in (20, 21, 22))
        assert caught >= 0.8 * bound * 10, (step, caught, bound)


def test_a_change_of_the_detectable_size_is_caught_about_80pct_of_the_time():
    """detectable_pct is the change the window finds with 80% power: shifting normal nights by the value a
    null comparison states, the rule finds the shift in 70-90% of trials (the spread it states is estimated);
    by half of it, far less often."""
    rng = np.random.default_rng(5)
    k, sd = 20, 0.02
    x = 10 * (1 + sd * rng.standard_normal(k + 3))
    ref = nightly_test(x[:k], [np.nan] * k, x[k:], [np.nan] * 3, True, 0.0, 0.01, weight=0.8)
    assert 0 < ref.detectable_pct < math.inf and ref.dof == k - 1
    from zcorch.analysis.detector import detectable
    mdc = detectable(0.01 * 0.8, k - 1, sd * math.sqrt(1 / 3 + 1 / k))   # at the true spread
    for shift, lo, hi in ((mdc, 0.7, 0.9), (mdc / 2, 0.0, 0.45)):
        hits = 0
        for _ in range(1500):
            y = 10 * (1 + sd * rng.standard_normal(k + 3))
            y[k:] *= 1 - shift / 100
            hits += nightly_test(y[:k], [np.nan] * k, y[k:], [np.nan] * 3, True, 0.0, 0.01,
                                 weight=0.8).verdict == "regressed"
        assert lo <= hits / 1500 <= hi, (shift, hits / 1500)


def test_unchanged_needs_a_detectable_change_within_the_threshold():
    """A noisy cell that did not move (nights spread 5%, threshold 3%) is `cannot tell`, never `unchanged`,
    and says what would tell it; a quiet one (nights 0.5%) is `unchanged` with a detectable change within the
    threshold and no `needs`."""
    noisy = [decide(series(nightly_levels(12, 0.05, seed=s) + [10.0], seed=s)) for s in range(8)]
    assert all(c.verdict in ("cannot tell", "regressed", "improved") for c in noisy), [c.verdict for c in noisy]
    told = [c for c in noisy if c.verdict == "cannot tell"]
    assert told and all(c.detectable_pct > 3.0 and c.needs for c in told), told
    quiet = decide(series(nightly_levels(20, 0.005, seed=3) + [10.0], seed=3))
    assert quiet.verdict == "unchanged" and quiet.detectable_pct <= 3.0 and quiet.needs == "", quiet
    assert len(quiet.window) == 3   # the most sensitive window judged


def test_cell_verdict_rule():
    from zcorch.analysis.gate import cell_verdict as _cell_verdict

    assert _cell_verdict(-5.0, 0.001, 0.01, 3.0, 2.0, True) == "regressed"
    assert _cell_verdict(5.0, 0.001, 0.01, 3.0, 2.0, False) == "improved"
    assert _cell_verdict(-5.0, 0.2, 0.01, 3.0, 2.0, True) == "cannot tell"
    assert _cell_verdict(-1.0, 0.2, 0.01, 3.0, 2.0, True) == "unchanged"
    assert _cell_verdict(-1.0, 0.2, 0.01, 3.0, 4.0, True) == "cannot tell"
    assert _cell_verdict(-1.0, 0.2, 0.01, 3.0, math.inf, True) == "cannot tell"
    assert _cell_verdict(-1.0, 0.2, 0.01, 3.0, math.nan, True) == "cannot tell"
    assert _cell_verdict(math.nan, math.nan, 0.01, 3.0, 1.0, True) == "cannot tell"


@pytest.mark.slow
def test_a_short_level_is_held_to_the_spread_successive_nights_show(monkeypatch):
    """No change, but nights drawn from four machine states as far apart as this machine's unpinned
    write->read sweeps (their medians 9.61, 4.52, 8.01, 6.35 Gbit/s, relative to their mean): the fit cuts
    such a series where a few nights happened to land high, and those short levels' own spread is far below
    the machine's. Held to the spread successive nights show (moving_range_spread), at most 1 night in 100
    alarms; without that floor the same series alarm clearly more often."""
    import zcorch.analysis.detector as det

    states = np.array([9.61, 4.52, 8.01, 6.35]) / 7.12
    def alarms():
        count = judged = 0
        for seed in range(40):
            rng = np.random.default_rng(700 + seed)
            runs = series(list(10.0 * rng.choice(states, 30)), runs_per_night=12, run_sd=0.05, seed=700 + seed)
            for t in range(10, 30):
                count += decide(runs[:t + 1]).bad
                judged += 1
        return count, judged

    held, judged = alarms()
    assert held <= judged / 100, (held, judged)
    monkeypatch.setattr(det, "SHORT_LEVEL", 0)
    unheld, _ = alarms()
    assert unheld >= held + 3, (held, unheld)


def test_the_moving_range_spread_sees_across_a_step():
    """One step moves one successive difference only: the spread of normal nights around two levels is
    their own, not the step's; fewer than MIN_NIGHTS + 1 nights tell none."""
    from zcorch.analysis.detector import moving_range_spread

    rng = np.random.default_rng(5)
    y = np.concatenate([10 * (1 + 0.02 * rng.standard_normal(40)), 6 * (1 + 0.02 * rng.standard_normal(40))])
    assert 0.014 < moving_range_spread(y, range(80)) < 0.028
    assert moving_range_spread(y, range(MIN_NIGHTS)) == 0.0
