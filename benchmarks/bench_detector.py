"""How often `zcorch history --check` cries wolf, and how soon it catches a real step: measured, not claimed.

Nightly series are built from REAL runs of this machine: several sweeps of the same small localhost
experiment (write→read and sendfile→splice, 1 s runs by `duration`, recorded now, or given with --sets;
--keep DIR keeps them) are the pool. A night is one of those sweeps, chosen at random (so nights differ as
much as this machine's sweeps do, not only as much as runs within a sweep), whose runs are drawn from it
one at a time, as `repeats: {min: 3, max: 30, target_ci: 2%}` draws them, until the 95% interval of their
median is within 2% of it or 30 runs are reached. A change is a step of the whole level (5% or 10% worse
from night `--step-at` on). Every night is judged by the code `history --check` runs,
zcorch.analysis.detector.judge_newest (the newest night, and the mean of the newest 2 and 3, against the
mean and sd of the stable segment's nightly medians, one-sided t; runs against runs below --min-nights),
on the medians, intervals and change-point fit that zcorch.analysis.history computes, with the defaults of
zcorch.analysis.gate (HISTORY_*).

Printed: false alarms per 100 series-nights on series without a change (from night --warmup + 1 on; in
brackets the first nights 2 to --warmup, judged on fewer baseline nights), and the share of series whose
5% and 10% steps are caught within 1, 2 and 3 nights; with --grid the same for other thresholds, alphas
and min_nights (how the defaults were chosen). The machine's noise heads the output: a step well below the
between-sweep sd of medians cannot be caught within 3 nights without many false alarms, whatever the rule.

    python benchmarks/bench_detector.py [--sets DIR ...] [--sweeps 4] [--repeats 12] [--keep DIR]
                                        [--duration 1s | --bytes SIZE] [--series 200] [--nights 30] [--grid]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from zcorch.analysis.detector import DEFAULT_ALPHA, DEFAULT_THRESHOLD_PCT, MIN_NIGHTS, judge_newest  # noqa: E402
from zcorch.analysis.stats import ci_width_pct, median_ci  # noqa: E402
from zcorch.analysis.steps import ci_sds, fit_steps, point_sigmas  # noqa: E402

EXPERIMENT = """name: detector-noise
hosts: localhost
params: {{{length}, buffer: 128KiB, sink: /dev/null, timeout: 30s{pin}}}
matrix:
  send_mode: [write, sendfile]
  recv_mode: [read, splice]
  source: [mem, /dev/zero]
exclude:
  - {{send_mode: sendfile, recv_mode: read}}
  - {{send_mode: write, recv_mode: splice}}
  - {{send_mode: sendfile, source: mem}}
  - {{send_mode: write, source: /dev/zero}}
repeats: {repeats}
order: interleave
baselines: false
"""


def record(n_sweeps: int, repeats: int, length: str, out: str, pin: str = "") -> list:
    """n_sweeps real localhost sweeps of EXPERIMENT (write→read, sendfile→splice) into `out`; `length` is
    "duration: 1s" or "bytes: 256MiB"; `pin` "S,R" pins the sender to CPU S and the receiver to CPU R."""
    from zcorch.sweep.pipeline import run_sweep

    exp = os.path.join(out, "detector-noise.yaml")
    with open(exp, "w") as f:
        cpus = pin.split(",") if pin else []
        f.write(EXPERIMENT.format(length=length, repeats=repeats,
                                  pin=f", send_cpu: {cpus[0]}, recv_cpu: {cpus[1]}" if cpus else ""))
    dirs = []
    for i in range(n_sweeps):
        d = os.path.join(out, f"sweep{i}")
        res = run_sweep(exp, output=d, command=["bench_detector"])
        if res.exit_status != 0:
            print(f"warning: sweep {i} exit {res.exit_status}", file=sys.stderr)
        dirs.append(d)
    return dirs


def pools(dirs: list, metric: str) -> "dict[str, list[np.ndarray]]":
    """cell label -> one array of the ok runs' metric per sweep."""
    import zcorch

    out: "dict[str, list[np.ndarray]]" = {}
    for d in dirs:
        df = zcorch.load(d)
        ok = df[df["status"] == "ok"]
        for (send, recv), g in ok.groupby(["send_mode", "recv_mode"]):
            out.setdefault(f"{send}->{recv}", []).append(g[metric].to_numpy(dtype=float))
    return {k: v for k, v in out.items() if len(v) == len(dirs) and all(len(a) >= 3 for a in v)}


class Synthetic:
    """Nights of known noise instead of a pool of real sweeps (--synthetic RUN_PCT,NIGHT_PCT): a night's level
    is 1 + NIGHT_PCT % × a standard normal, each run that level × (1 + RUN_PCT % × a standard normal)."""

    def __init__(self, run_pct: float, night_pct: float):
        self.run, self.night = run_pct / 100, night_pct / 100

    @property
    def label(self) -> str:
        return f"synthetic run {self.run * 100:g}%, night {self.night * 100:g}%"


def night(rng: np.random.Generator, sweeps: "list | Synthetic", target: float, lo: int = 3,
          hi: int = 30) -> np.ndarray:
    """One night's ok runs: a random sweep of the pool (or a synthetic night's level), runs drawn from it until
    the median's 95% interval is within `target` % of it (or `hi` runs)."""
    if isinstance(sweeps, Synthetic):
        level = 10.0 * (1 + sweeps.night * rng.standard_normal())

        def draw(n):
            return level * (1 + sweeps.run * rng.standard_normal(n))
    else:
        pool = sweeps[rng.integers(len(sweeps))]

        def draw(n):
            return rng.choice(pool, n)
    runs = list(draw(lo))
    while len(runs) < hi and ci_width_pct(runs) > target:
        runs.append(float(draw(1)[0]))
    return np.asarray(runs)


def nightly_sd_pct(sweeps: list, rng, target: float, n: int = 2000) -> "tuple[float, float]":
    """The sd of nightly medians (in % of their mean) that nights drawn as `night` draws them have, and their
    mean number of runs."""
    drawn = [night(rng, sweeps, target) for _ in range(n)]
    med = np.array([np.median(x) for x in drawn])
    return float(np.std(med, ddof=1) / np.mean(med) * 100), float(np.mean([len(x) for x in drawn]))


def best_within_3(step_pct: float, sd_pct: float, false_alarms: float = 0.01) -> float:
    """An upper bound on the share of steps any rule catches within 3 nights: a rule that alarms on at most
    `false_alarms` of the nights alarms on at most 3x that within 3 nights with no change, so it can catch no
    more than the most powerful test at that level, the known-sd z test of the 3 nights' mean (Neyman-Pearson)."""
    from scipy.stats import norm

    return float(norm.sf(norm.isf(3 * false_alarms) - step_pct * math.sqrt(3) / sd_pct))


def one_test_within_3(step_pct: float, sd_pct: float, false_alarms: float = 0.01) -> float:
    """What the 3 nights' mean alone catches on the third night when judged at `false_alarms` a night with the
    level and spread known: a rule judging every night afresh at that rate reaches about this, not the bound,
    and a rule that estimates them from earlier nights less."""
    from scipy.stats import norm

    return float(norm.sf(norm.isf(false_alarms) - step_pct * math.sqrt(3) / sd_pct))


def decide(nights: list, settings: list) -> list:
    """For each (threshold, alpha, min_nights) of `settings`: whether `zcorch history --check` flags the newest
    of `nights` (arrays of ok runs, oldest first; higher is better) as regressed, by the code it runs
    (zcorch.analysis.detector.judge_newest, on the medians, intervals and change-point fit history computes)."""
    med = np.array([np.median(x) for x in nights])
    ci = np.array([median_ci(x) for x in nights])
    fit = fit_steps(med, point_sigmas(med, ci[:, 0], ci[:, 1], ci[:, 2]))
    sd = ci_sds(ci[:, 0], ci[:, 1], ci[:, 2])
    out = []
    for threshold, alpha, min_nights in settings:
        c = judge_newest(med, sd, nights, fit, True, threshold, alpha, min_nights)
        out.append(c is not None and c.verdict == "regressed")
    return out


def simulate(pool: list, rng, n_series: int, n_nights: int, warmup: int, step_at: int, target: float,
             settings: list) -> dict:
    """{setting: {"fa": false alarms per 100 nights judged from night `warmup` on, "fa_first": the same for the
    nights before (2 to `warmup`), "caught": {step: [share within 1, 2, 3 nights]}}}."""
    out = {s: {"fa": [0, 0], "fa_first": [0, 0], "caught": {0.05: [0, 0, 0], 0.10: [0, 0, 0]}} for s in settings}
    for _ in range(n_series):
        base = [night(rng, pool, target) for _ in range(n_nights)]
        for t in range(1, n_nights):
            for s, bad in zip(settings, decide(base[:t + 1], settings)):
                counts = out[s]["fa" if t >= warmup else "fa_first"]
                counts[0] += bad
                counts[1] += 1
        for step in (0.05, 0.10):
            series = [x if i < step_at else x * (1 - step) for i, x in enumerate(base[:step_at + 3])]
            first = {s: None for s in settings}
            for k in range(3):
                for s, bad in zip(settings, decide(series[:step_at + k + 1], settings)):
                    if bad and first[s] is None:
                        first[s] = k
            for s in settings:
                if first[s] is not None:
                    for k in range(first[s], 3):
                        out[s]["caught"][step][k] += 1
    return {s: {"fa": 100 * v["fa"][0] / max(v["fa"][1], 1), "fa_first": 100 * v["fa_first"][0] / max(v["fa_first"][1], 1),
                "caught": {st: [c / n_series for c in cs] for st, cs in v["caught"].items()}}
            for s, v in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic", metavar="RUN_PCT,NIGHT_PCT", action="append", default=[],
                    help="series of known noise instead of real sweeps: runs spread by RUN_PCT %% (sd) about their "
                         "night's level, levels by NIGHT_PCT %% about the series' (repeatable: one case each)")
    ap.add_argument("--sets", nargs="*", help="result sets of one experiment repeated (default: record them now)")
    ap.add_argument("--sweeps", type=int, default=4, help="sweeps to record (default 4)")
    ap.add_argument("--repeats", type=int, default=12, help="repeats per cell of each recorded sweep (default 12)")
    ap.add_argument("--duration", default="1s", help="length of each recorded run (default 1s, the quick start's)")
    ap.add_argument("--bytes", help="bytes per recorded run instead of --duration")
    ap.add_argument("--pin", metavar="S,R", default="",
                    help="record with the sender pinned to CPU S and the receiver to CPU R (default: not pinned)")
    ap.add_argument("--keep", metavar="DIR", help="record into DIR and keep the sets (for --sets later)")
    ap.add_argument("--metric", default="gbit_s")
    ap.add_argument("--series", type=int, default=200, help="series per cell and case (default 200)")
    ap.add_argument("--nights", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10, help="nights before the first judged one (default 10)")
    ap.add_argument("--step-at", type=int, default=20)
    ap.add_argument("--target", type=float, default=2.0, help="target_ci in %% (default 2)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--grid", action="store_true", help="also other thresholds and alphas")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    length = f"bytes: {args.bytes}" if args.bytes else f"duration: {args.duration}"
    if args.synthetic:
        cases = [Synthetic(*(float(v) for v in spec.split(","))) for spec in args.synthetic]
        noise = {c.label: c for c in cases}
    else:
        with tempfile.TemporaryDirectory(prefix="bench-detector-") as tmp:
            if args.keep:
                os.makedirs(args.keep, exist_ok=True)
            dirs = args.sets or record(args.sweeps, args.repeats, length, args.keep or tmp, args.pin)
            noise = pools(dirs, args.metric)
    if not noise:
        print("no cell with ok runs in every sweep", file=sys.stderr)
        return 1
    default = (DEFAULT_THRESHOLD_PCT, DEFAULT_ALPHA, MIN_NIGHTS)
    settings = [default] + ([(t, a, m) for t in (3.0, 5.0) for a in (0.002, 0.005, 0.01) for m in (2, 3)
                             if (t, a, m) != default] if args.grid else [])
    rng = np.random.default_rng(args.seed)
    if args.synthetic:
        print("noise: synthetic (runs: level x (1 + RUN % x N(0,1)), levels: 1 + NIGHT % x N(0,1)): "
              + "; ".join(noise))
    else:
        print(f"noise: {len(dirs)} real sweeps of this machine ({args.metric}, ok runs per sweep and cell):")
    for cell, sweeps in noise.items() if not args.synthetic else ():
        meds = [float(np.median(s)) for s in sweeps]
        within = float(np.median([np.std(s) / np.median(s) * 100 for s in sweeps]))
        between = float(np.std(meds) / np.median(meds) * 100)
        print(f"  {cell}: runs/sweep {[len(s) for s in sweeps]}, sweep medians {', '.join(f'{m:.2f}' for m in meds)}; "
              f"within-sweep sd {within:.1f}%, between-sweep sd of medians {between:.1f}%")
    print(f"series: {args.series} per cell and case, {args.nights} nights, judged from night {args.warmup + 1} "
          f"(the first nights 2-{args.warmup} apart), step at night {args.step_at + 1}; nights drawn as repeats "
          f"{{min: 3, max: 30, target_ci: {args.target:g}%}}")
    rows = {s: {"fa": [], "fa_first": [], 0.05: [], 0.10: []} for s in settings}
    per_cell = {}
    for cell, sweeps in noise.items():
        res = simulate(sweeps, rng, args.series, args.nights, args.warmup, args.step_at, args.target, settings)
        per_cell[cell] = (res[default], nightly_sd_pct(sweeps, rng, args.target))
        for s, r in res.items():
            for key in ("fa", "fa_first"):
                rows[s][key].append(r[key])
            rows[s][0.05].append(r["caught"][0.05])
            rows[s][0.10].append(r["caught"][0.10])
    print()
    print(f"threshold  alpha  min_nights  false alarms/100 series-nights (nights 2-{args.warmup})   "
          "5% step caught within 1/2/3 nights   10% step within 1/2/3")
    for s in settings:
        r = rows[s]
        c5 = np.mean(r[0.05], axis=0)
        c10 = np.mean(r[0.10], axis=0)
        mark = "  <- default" if s == default else ""
        print(f"{s[0]:>8.1f}%  {s[1]:<6g} {s[2]:>10}  {float(np.mean(r['fa'])):>14.2f} ({float(np.mean(r['fa_first'])):>5.2f})"
              f"{'':>22}{'/'.join(f'{c:.0%}' for c in c5):>16}   {'/'.join(f'{c:.0%}' for c in c10):>21}{mark}")
    print("\nper cell, default settings; `bound`: the most any rule can catch within 3 nights while it raises at most "
          "1 false alarm per 100 nights, at that cell's nightly spread (the known-sd test of the 3 nights' mean at "
          "level 3 x 1%, the false alarms 3 nights may raise)")
    for cell, (r, (sd_pct, n_runs)) in per_cell.items():
        b5, b10 = (best_within_3(step, sd_pct) for step in (5.0, 10.0))
        o5, o10 = (one_test_within_3(step, sd_pct) for step in (5.0, 10.0))
        print(f"  {cell}: nightly sd {sd_pct:.1f}% ({n_runs:.1f} runs a night); false alarms {r['fa']:.2f}/100; 5% step within 1/2/3 nights "
              f"{'/'.join(f'{c:.0%}' for c in r['caught'][0.05])} (bound {b5:.0%}, {r['caught'][0.05][2] / b5:.0%} of it; "
              f"known-spread mean of 3 at 1% {o5:.0%}); 10% step {'/'.join(f'{c:.0%}' for c in r['caught'][0.10])} "
              f"(bound {b10:.0%}, {r['caught'][0.10][2] / b10:.0%} of it; known-spread mean of 3 at 1% {o10:.0%})")
    print(f"\n({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
