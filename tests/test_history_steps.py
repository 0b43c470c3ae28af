"""The step detector of `zcorch history` (zcorch.analysis.steps) on synthetic series with fixed seeds:
steps of known size found at their index, pure noise without steps, noisier points needing bigger steps."""
import numpy as np
import pytest

from zcorch.analysis.steps import FLOOR_REL, default_penalty, fit_steps, point_sigmas


def series(levels, sd=1.0, seed=0, lengths=None):
    """Piecewise-constant levels (each `lengths[i]` points) plus Gaussian noise of sd; the CIs of
    every point are those of its noise (±1.96 sd)."""
    rng = np.random.default_rng(seed)
    y = np.concatenate([np.full(n, lvl, dtype=float) for lvl, n in zip(levels, lengths)])
    sd = np.broadcast_to(np.asarray(sd, dtype=float), y.shape)
    y = y + sd * rng.standard_normal(len(y))
    return y, y - 1.96 * sd, y + 1.96 * sd


@pytest.mark.parametrize("seed", range(5))
def test_one_step_is_found_at_its_index(seed):
    y, lo, hi = series([100, 90], sd=1.0, seed=seed, lengths=[20, 10])
    fit = fit_steps(y, point_sigmas(y, lo, hi))
    assert fit.steps == [20]
    assert [s.level for s in fit.segments] == [pytest.approx(100, abs=1), pytest.approx(90, abs=1)]
    assert (fit.segments[0].start, fit.segments[-1].end) == (0, 30)


@pytest.mark.parametrize("seed", range(5))
def test_two_steps_and_a_recovery(seed):
    y, lo, hi = series([50, 45, 50], sd=0.5, seed=seed, lengths=[15, 8, 12])
    fit = fit_steps(y, point_sigmas(y, lo, hi))
    assert fit.steps == [15, 23]


def test_a_step_near_the_end_lasting_three_nights():
    y, lo, hi = series([10.0, 8.0], sd=0.1, seed=3, lengths=[27, 3])
    assert fit_steps(y, point_sigmas(y, lo, hi)).steps == [27]


@pytest.mark.parametrize("n", [3, 5, 10, 30, 100, 300])
def test_pure_noise_has_no_step(n):
    """Nights of different noise (sd 0.5 to 2), each night's CI saying how noisy it is."""
    rng = np.random.default_rng(n)
    found = []
    for _ in range(40):
        sd = rng.uniform(0.5, 2.0, n)
        y = 100 + sd * rng.standard_normal(n)
        found.append(fit_steps(y, point_sigmas(y, y - 1.96 * sd, y + 1.96 * sd)).steps)
    assert found == [[]] * 40


def test_noise_with_estimated_cis_rarely_has_a_step():
    """Real CIs only estimate a night's noise (here off by a factor e^N(0, 0.3)): a false step in at
    most 1% of the series (calibration of the penalty: about 0.3% for 3 to 5 nights, none from 10 on)."""
    rng = np.random.default_rng(42)
    false = 0
    for n in (3, 5, 10, 30, 100):
        for _ in range(100):
            sd = rng.uniform(0.5, 2.0, n)
            y = 100 + sd * rng.standard_normal(n)
            est = sd * np.exp(rng.normal(0, 0.3, n))
            false += bool(fit_steps(y, point_sigmas(y, y - 1.96 * est, y + 1.96 * est)).steps)
    assert false <= 5


def test_heavy_tailed_noise_and_a_lone_outlier_are_not_steps():
    rng = np.random.default_rng(7)
    for _ in range(20):
        y = 100 + rng.standard_t(5, 40)
        assert fit_steps(y, np.ones(40)).steps == []
    y = 100 + rng.standard_normal(40)
    y[17] += 6  # one wild night (6 sigma): the absolute-deviation fit does not cut around it
    fit = fit_steps(y, np.ones(40))
    assert fit.steps == [] and abs(fit.segments[0].level - 100) < 0.5


def test_noisier_points_need_bigger_steps():
    """The same step of 3 is found when each night's CI says ±1 and not when it says ±5."""
    y, _, _ = series([100, 97], sd=1.0, seed=11, lengths=[20, 10])
    quiet = fit_steps(y, point_sigmas(y, y - 1.96, y + 1.96))
    noisy = fit_steps(y, point_sigmas(y, y - 5 * 1.96, y + 5 * 1.96))
    assert quiet.steps == [20] and noisy.steps == []


def test_nights_that_vary_more_than_their_cis_widen_the_noise():
    """CIs of ±0.1 on nights that really vary by sd 1: the consecutive differences scale σ up, so
    the night-to-night wobble is not cut into steps."""
    rng = np.random.default_rng(5)
    y = 100 + rng.standard_normal(40)
    sigma = point_sigmas(y, y - 0.196, y + 0.196)
    assert 0.5 < float(np.median(sigma)) < 2.0
    assert fit_steps(y, sigma).steps == []
    assert fit_steps(y, np.full(40, 0.1)).steps != []  # taken at their word, the CIs would give steps


def test_point_sigmas_fill_and_floor():
    y = np.array([10.0, 10.0, 10.0, np.nan, 10.0])
    lo = np.array([10.0, 9.0, np.nan, np.nan, 10.0])     # identical repeats: a zero-width CI
    hi = np.array([10.0, 11.0, np.nan, np.nan, 10.0])
    s = point_sigmas(y, lo, hi)
    assert np.isnan(s[3])
    assert s[0] == s[4] == pytest.approx(FLOOR_REL * 10)
    assert s[1] == pytest.approx(1 / 1.96, rel=1e-3)
    assert s[2] == pytest.approx(np.median([FLOOR_REL * 10, 1 / 1.96, FLOOR_REL * 10]))


def test_missing_points_belong_to_the_segment_around_them():
    y, lo, hi = series([20, 10], sd=0.2, seed=2, lengths=[10, 10])
    y[[3, 12]] = np.nan
    fit = fit_steps(y, point_sigmas(y, lo, hi))
    assert fit.steps == [10]
    assert fit.segment_of(3) == 0 and fit.segment_of(12) == 1 and fit.segments[-1].end == 20
    y[10] = np.nan  # the first point after the step missing: the step begins at the next known point
    assert fit_steps(y, point_sigmas(y, lo, hi)).steps == [11]


def test_degenerate_series():
    assert fit_steps([]).segments == []
    assert fit_steps([np.nan, np.nan]).segments == []
    one = fit_steps([5.0])
    assert one.steps == [] and one.segments[0].level == 5.0
    flat = fit_steps([3.0] * 10)
    assert flat.steps == [] and flat.segments[0].level == 3.0
    assert default_penalty(100) > default_penalty(10)
    with pytest.raises(ValueError):
        fit_steps([1.0, 2.0], sigma=[1.0, 0.0])


def test_too_short_a_series_supports_no_change_point():
    # two nights +136% apart: a change point there would claim what the newest-night verdict does not
    from zcorch.analysis.steps import MIN_POINTS_FOR_STEPS
    for y in ([1.0, 2.36], [1.0, 2.36, 1.0]):
        fit = fit_steps(y, np.full(len(y), 0.001))
        assert fit.steps == [] and len(fit.segments) == 1
    y = [1.0] * (MIN_POINTS_FOR_STEPS - 2) + [2.36] * 2
    assert fit_steps(y, np.full(len(y), 0.001)).steps == [MIN_POINTS_FOR_STEPS - 2]


def test_the_trend_of_a_short_series_draws_no_fitted_level(tmp_path):
    # three sweeps, the newest far below: no level may be drawn through points that were not measured there
    from test_history import READ, nights
    from zcorch.analysis.history import build_history, trend_figure

    root = tmp_path / "r"
    nights(root, "short", [[(READ, 2.0)], [(READ, 2.0)], [(READ, 0.5)]])
    nights(root / "long", "long", [[(READ, 2.0)]] * 4 + [[(READ, 0.5)]] * 2)
    hist = build_history(root, reports=False)
    by_name = {e.name: e for e in hist.experiments}
    for name, drawn in (("short", False), ("long", True)):
        exp = by_name[name]
        fig = trend_figure(exp, exp.cells[0])
        labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert ("fitted level" in labels) == drawn, (name, labels)


def exhaustive_fit(y, sigma, penalty):
    """The fit by its definition, the way zcorch computed it before the compiled programme: every segment's
    weighted-L1 cost by sorting its points (O(n^3) in all), then the dynamic programme over every start.
    Returns (steps, levels) over the known points."""
    idx = np.flatnonzero(np.isfinite(y))
    yk, wk = np.asarray(y, float)[idx], 1.0 / np.asarray(sigma, float)[idx]
    n = len(yk)
    cost, level = np.full((n, n + 1), np.inf), np.full((n, n + 1), np.nan)
    for a in range(n):
        for b in range(a + 1, n + 1):
            order = np.argsort(yk[a:b], kind="stable")
            v, w = yk[a:b][order], wk[a:b][order]
            cum = np.cumsum(w)
            m = v[int(np.argmax(cum >= cum[-1] / 2))]
            cost[a, b], level[a, b] = float(np.sum(wk[a:b] * np.abs(yk[a:b] - m))), m
    best, back = np.full(n + 1, np.inf), np.zeros(n + 1, dtype=int)
    best[0] = 0.0
    for b in range(1, n + 1):
        total = best[:b] + cost[:b, b] + penalty
        back[b] = int(np.argmin(total))
        best[b] = total[back[b]]
    cuts, b = [], n
    while b > 0:
        cuts.append((int(back[b]), b))
        b = back[b]
    cuts.reverse()
    return [int(idx[a]) for a, _ in cuts[1:]], [float(level[a, b]) for a, b in cuts]


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_fit_finds_what_the_exhaustive_one_finds(seed):
    """fit_steps (O(n^2) updates of a weighted-median pointer, compiled) against the fit by its definition on
    random series: noise, steps, heavy tails with missing nights, and integers of equal weight (ties of the
    median and of whole segmentations): the same change points and levels."""
    rng = np.random.default_rng(seed)
    for trial in range(60):
        n = int(rng.integers(4, 45))
        kind = trial % 4
        if kind == 0:
            y, sd = rng.normal(100, 1, n), rng.uniform(0.5, 2, n)
        elif kind == 1:
            y = np.repeat(rng.normal(100, 5, 4), -(-n // 4))[:n] + rng.normal(0, 1, n)
            sd = rng.uniform(0.5, 2, n)
        elif kind == 2:
            y, sd = rng.integers(0, 4, n).astype(float), np.ones(n)
        else:
            y = rng.standard_t(2, n) + np.repeat(rng.normal(0, 3, 3), -(-n // 3))[:n]
            y[rng.random(n) < 0.15] = np.nan
            sd = rng.uniform(0.2, 3, n)
        if np.isfinite(y).sum() < 4:
            continue
        sigma = point_sigmas(y, y - 1.96 * sd, y + 1.96 * sd)
        fit = fit_steps(y, sigma)
        steps, levels = exhaustive_fit(y, sigma, fit.penalty)
        assert (fit.steps, [s.level for s in fit.segments]) == (steps, levels), (seed, trial, y.tolist())


def test_many_fits_at_once_are_fit_steps_fits_whatever_the_threads():
    """steps.fit_many and steps.start_fits (the compiled programme over many series in one call, on threads, as
    zcorch history fits a fleet's cells) give exactly fit_steps' fits: series of every length (none, too few for a
    step, long), with gaps, ties and steps."""
    from concurrent.futures import ThreadPoolExecutor

    from zcorch.analysis.steps import fit_many, start_fits

    rng = np.random.default_rng(3)
    series = []
    for k in range(120):
        n = int(rng.integers(0, 90))
        y = 10 + rng.standard_normal(n) * 0.3
        if n > 10 and k % 3 == 0:
            y[n // 2:] += 2
        if n and k % 4 == 0:
            y[rng.integers(0, n, size=max(1, n // 5))] = np.nan
        if k % 7 == 0:
            y = np.round(y)
        series.append((y, point_sigmas(y) if np.isfinite(y).any() else np.full(n, np.nan)))
    one_by_one = [fit_steps(y, s) for y, s in series]

    def same(fits):
        assert len(fits) == len(one_by_one)
        for got, want in zip(fits, one_by_one):
            assert got.segments == want.segments
            assert got.penalty == want.penalty or (np.isnan(got.penalty) and np.isnan(want.penalty))

    assert sum(len(f.steps) for f in one_by_one) > 20   # the series do have steps
    for threads in (1, 2, 3):
        same(fit_many(series, threads))
    same(start_fits(series).result())
    with ThreadPoolExecutor(2) as pool:
        same(start_fits(series, pool).result())
