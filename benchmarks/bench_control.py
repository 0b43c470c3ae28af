"""Does a control series cut the between-sweep noise? Measured on this machine, quiet and beside a CPU hog.

A small localhost experiment with a `control:` cell (write→read from memory; the other cells msg_zerocopy→read
and sendfile→splice from /dev/zero), `repeats` rounds in `order: interleave`, is recorded `--sweeps` times on
the machine as it is ("quiet": whatever else runs here), then `--sweeps` times more with a CPU hog (a
`python -c 'while 1: pass'` process, started before and killed after the sweep) beside every other sweep, so
that nights differ the way a noisy neighbour makes them differ. Each cell's sweep medians of the raw metric
and of its ratio to the control (`<metric>_vs_control`: each run over the control's run of the same repeat,
zcorch.analysis.frames.add_control_ratios) are compared by their spread between sweeps: the sd of the sweep
medians in % of their mean. A gate judges a night against exactly that spread (docs/nightly.md), so the
lower one is the better gate metric here.

    python benchmarks/bench_control.py [--sweeps 10] [--repeats 5] [--duration 1s | --bytes SIZE] [--keep DIR]
                                       [--sets QUIET_DIR[,QUIET_DIR...] HOG_DIR[,HOG_DIR...]]

--keep DIR keeps the result sets (DIR/quiet/sweepN, DIR/hog/sweepN, with DIR/hog/hogged.txt naming the
sweeps the hog ran beside); --sets analyses such kept sets again without running anything (several kept runs,
comma-separated, pool their sweeps).
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EXPERIMENT = """name: control-noise
hosts: localhost
params: {{{length}, buffer: 128KiB, sink: /dev/null, timeout: 60s, source: mem}}
matrix:
  send_mode: [write, msg_zerocopy]
  recv_mode: [read]
include:
  - {{send_mode: sendfile, recv_mode: splice, source: /dev/zero}}
control: {{send_mode: write, recv_mode: read}}
repeats: {repeats}
order: interleave
baselines: false
"""
METRICS = ("gbit_s", "total_host_busy_s_per_gib")


def hog() -> subprocess.Popen:
    """A busy loop in its own process: a neighbour that wants a whole CPU."""
    return subprocess.Popen([sys.executable, "-c", "while 1: pass"])


def record(out: str, n_sweeps: int, repeats: int, length: str, hogged: "set[int]") -> list:
    """n_sweeps real sweeps into out/sweepN (`length`: "duration: 1s" or "bytes: 256MiB"); the hog runs beside
    the sweeps whose index is in `hogged`."""
    from zcorch.sweep.pipeline import run_sweep

    os.makedirs(out, exist_ok=True)
    exp = os.path.join(out, "control-noise.yaml")
    with open(exp, "w") as f:
        f.write(EXPERIMENT.format(length=length, repeats=repeats))
    dirs = []
    for i in range(n_sweeps):
        d = os.path.join(out, f"sweep{i}")
        proc = hog() if i in hogged else None
        try:
            if proc is not None:
                time.sleep(0.5)   # the hog is spinning before the first run
            res = run_sweep(exp, output=d, command=["bench_control"])
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()
        if res.exit_status != 0:
            print(f"warning: {d}: exit {res.exit_status}", file=sys.stderr)
        dirs.append(d)
        print(f"  {d}{' (hog)' if proc is not None else ''}", file=sys.stderr, flush=True)
    with open(os.path.join(out, "hogged.txt"), "w") as f:
        f.write("".join(f"sweep{i}\n" for i in sorted(hogged)))
    return dirs


def sweep_medians(dirs: list) -> "dict[tuple[str, str], np.ndarray]":
    """(cell label, column) -> the median of the cell's ok runs per sweep, for each metric and its ratio."""
    import zcorch

    out: "dict[tuple[str, str], list]" = {}
    for d in dirs:
        df = zcorch.load(d)
        ok = df[df["status"] == "ok"]
        for (send, recv), g in ok.groupby(["send_mode", "recv_mode"]):
            for m in METRICS:
                for col in (m, m + "_vs_control"):
                    out.setdefault((f"{send}->{recv}", col), []).append(float(np.nanmedian(g[col])))
    return {k: np.asarray(v) for k, v in out.items()}


def spread_pct(values: np.ndarray) -> float:
    """The sd of the sweep medians (ddof 1) in % of their mean; NaN with fewer than 2."""
    v = values[np.isfinite(values)]
    return float(np.std(v, ddof=1) / np.mean(v) * 100) if len(v) >= 2 and np.mean(v) else float("nan")


def table(conditions: "dict[str, list]") -> str:
    """Per condition, cell and metric: the sweeps, the mean of the sweep medians, and the spread of the sweep
    medians of the raw metric (`raw`), of the per-run ratio to the control (`ratio`: the median of each sweep's
    `<metric>_vs_control`) and of the ratio of the sweep medians (`med/med`: the cell's sweep median over the
    control's, which pairs no single runs), the ratio's mean, and `corr`: the correlation of the cell's sweep
    medians with the control's (a ratio cancels the drift the two share: the higher, the more)."""
    header = f"{'condition':<10} {'cell':<20} {'metric':<26} {'sweeps':>6} {'mean':>7} {'raw sd%':>8} " \
             f"{'ratio sd%':>9} {'med/med sd%':>11} {'ratio mean':>10} {'corr':>5}"
    lines = [header, "-" * len(header)]
    for name, dirs in conditions.items():
        med = sweep_medians(dirs)
        cells = sorted({c for c, _ in med})
        control = next(c for c in cells if np.allclose(med[(c, "gbit_s_vs_control")], 1.0, equal_nan=True))
        for cell in cells:
            for m in METRICS:
                raw, ratio = med[(cell, m)], med[(cell, m + "_vs_control")]
                of_medians = raw / med[(control, m)]
                both = np.isfinite(raw) & np.isfinite(med[(control, m)])
                corr = np.corrcoef(raw[both], med[(control, m)][both])[0, 1] if both.sum() > 2 else np.nan
                r_sd, mm_sd, corr = ("control", "control", "") if cell == control else \
                    (f"{spread_pct(ratio):.2f}", f"{spread_pct(of_medians):.2f}", f"{corr:.2f}")
                lines.append(f"{name:<10} {cell:<20} {m:<26} {int(np.isfinite(raw).sum()):>6} {np.nanmean(raw):>7.3f} "
                             f"{spread_pct(raw):>8.2f} {r_sd:>9} {mm_sd:>11} {np.nanmean(ratio):>10.3f} {corr:>5}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sweeps", type=int, default=10, help="sweeps per condition (default 10)")
    ap.add_argument("--repeats", type=int, default=5, help="rounds per sweep (default 5)")
    ap.add_argument("--duration", default="1s", help="each run's duration (default 1s)")
    ap.add_argument("--bytes", help="bytes per run instead of a duration (e.g. 128MiB)")
    ap.add_argument("--keep", help="keep the result sets in this directory")
    ap.add_argument("--sets", nargs=2, metavar=("QUIET_DIRS", "HOG_DIRS"),
                    help="analyse kept sets (DIR/quiet and DIR/hog of --keep DIR; several comma-separated), run nothing")
    args = ap.parse_args()
    print("$ python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__)] + sys.argv[1:]))
    started = time.monotonic()
    length = f"bytes: {args.bytes}" if args.bytes else f"duration: {args.duration}"
    if args.sets:
        conditions, hogged_paths = {}, set()
        for name, dirs in zip(("quiet", "hog"), args.sets):
            conditions[name] = []
            for d in dirs.split(","):
                conditions[name] += sorted((os.path.join(d, x) for x in os.listdir(d) if x.startswith("sweep")),
                                           key=lambda p: int(p.rsplit("sweep", 1)[1]))
                hogged_file = os.path.join(d, "hogged.txt")
                if name == "hog" and os.path.exists(hogged_file):
                    hogged_paths |= {os.path.join(d, x) for x in open(hogged_file).read().split()}
        hogged_names = sorted(os.path.relpath(p, os.path.dirname(os.path.dirname(os.path.dirname(p))))
                              for p in hogged_paths)
    else:
        root = args.keep or tempfile.mkdtemp(prefix="bench-control-")
        conditions = {"quiet": record(os.path.join(root, "quiet"), args.sweeps, args.repeats, length, set())}
        hogged = set(range(0, args.sweeps, 2))   # every other sweep: the nights differ
        conditions["hog"] = record(os.path.join(root, "hog"), args.sweeps, args.repeats, length, hogged)
        hogged_names = [f"sweep{i}" for i in sorted(hogged)]
        hogged_paths = {os.path.join(root, "hog", x) for x in hogged_names}
    print(f"{os.cpu_count()} CPUs; 3 cells (control write->read), {args.repeats} rounds per sweep, "
          f"order interleave, runs of {length}; hog (a `while 1: pass` process) beside: "
          f"{', '.join(hogged_names) or 'none'} of the hog condition")
    print("spread between sweeps = sd of the sweep medians in % of their mean: raw metric; ratio = the per-run "
          "ratio to the control's run of the same repeat; med/med = the cell's sweep median over the control's; "
          "corr = correlation of the cell's sweep medians with the control's")
    print(table(conditions))
    hog_dirs = conditions["hog"]
    hogged_at = [i for i, d in enumerate(hog_dirs) if d in hogged_paths]
    if hogged_at and len(hogged_at) < len(hog_dirs):
        med = sweep_medians(hog_dirs)
        beside = np.zeros(len(hog_dirs), dtype=bool)
        beside[hogged_at] = True
        effect = ", ".join(f"{cell} {np.nanmean(v[beside]) / np.nanmean(v[~beside]):.2f}x"
                           for (cell, col), v in sorted(med.items()) if col == "gbit_s")
        print(f"the hog's effect on gbit_s (mean of the sweep medians beside it / without it): {effect}")
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
