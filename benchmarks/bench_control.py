"""Does a control series cut the between-sweep noise? Measured on this machine, quiet and beside a CPU hog.

Both forms of `control:` from the same runs: a small localhost experiment (write→read from memory, the control
cell; msg_zerocopy→read and sendfile→splice from /dev/zero), `repeats` rounds in `order: interleave`, with
`control: iperf3` (the baseline as control: one iperf3 test before each round's runs, `gbit_s_vs_control`);
the control-cell ratios (`control: {send_mode: write, recv_mode: read}`) are derived from the same sets by
zcorch.analysis.frames.add_control_ratios with that cell, as zcorch.load derives them for a set declaring it.
The experiment is recorded `--sweeps` times on
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
control: iperf3
repeats: {repeats}
order: interleave
baselines: {{iperf3: {{duration: 1s, per: sweep}}, dd: false}}
"""
METRICS = ("gbit_s", "total_host_busy_s_per_gib")
CONTROL_CELL = ("write", "read")   # (send_mode, recv_mode) of the control cell


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
    """(cell label, column) -> the median of the cell's ok runs per sweep: each metric raw, `<m>_vs_cell` (its
    ratio to the control cell's run of the same repeat) and `<m>_vs_iperf3` (to that round's iperf3 test)."""
    import zcorch
    from zcorch.analysis.frames import add_control_ratios

    out: "dict[tuple[str, str], list]" = {}
    for d in dirs:
        df = zcorch.load(d)
        if (zcorch.load_manifest(d).get("control") or {}).get("baseline"):
            df = df.rename(columns={m + "_vs_control": m + "_vs_iperf3" for m in METRICS})
        else:   # a set kept by the bench before `control: iperf3` (its control a cell): no iperf3 ratio
            df = df.drop(columns=[m + "_vs_control" for m in METRICS]).assign(
                **{m + "_vs_iperf3": np.nan for m in METRICS})
        is_cell = (df["send_mode"] == CONTROL_CELL[0]) & (df["recv_mode"] == CONTROL_CELL[1])
        df = add_control_ratios(df, str(df.loc[is_cell, "cell"].iloc[0]))
        df = df.rename(columns={m + "_vs_control": m + "_vs_cell" for m in METRICS})
        ok = df[df["status"] == "ok"]
        for (send, recv), g in ok.groupby(["send_mode", "recv_mode"]):
            for m in METRICS:
                for col in (m, m + "_vs_cell", m + "_vs_iperf3"):
                    out.setdefault((f"{send}->{recv}", col), []).append(float(np.nanmedian(g[col]))
                                                                         if g[col].notna().any() else np.nan)
    return {k: np.asarray(v) for k, v in out.items()}


def iperf3_medians(dirs: list) -> np.ndarray:
    """Per sweep: the median of its rounds' iperf3 control tests (Gbit/s)."""
    import zcorch

    out = []
    for d in dirs:
        b = zcorch.load_baselines(d)
        rounds = b[(b["kind"] == "iperf3") & (b["status"] == "ok")]
        control = zcorch.load_manifest(d).get("control") or {}
        out.append(float(np.nanmedian(b.loc[rounds.index, "gbit_s"])) if control.get("baseline") and len(rounds)
                   else np.nan)
    return np.asarray(out)


def spread_pct(values: np.ndarray) -> float:
    """The sd of the sweep medians (ddof 1) in % of their mean; NaN with fewer than 2."""
    v = values[np.isfinite(values)]
    return float(np.std(v, ddof=1) / np.mean(v) * 100) if len(v) >= 2 and np.mean(v) else float("nan")


def _corr(a: np.ndarray, b: np.ndarray) -> str:
    both = np.isfinite(a) & np.isfinite(b)
    return f"{np.corrcoef(a[both], b[both])[0, 1]:.2f}" if both.sum() > 2 else "n/a"


def table(conditions: "dict[str, list]") -> str:
    """Per condition, cell and metric: the sweeps, the mean of the sweep medians, and the spread of the sweep
    medians of the raw metric (`raw`), of the per-run ratio to the control cell's run of the same repeat
    (`vs cell`) and to the round's iperf3 test (`vs iperf3`; n/a: iperf3 has no host CPU per GiB), and the
    correlation of the cell's raw sweep medians with the control cell's and with iperf3's (a ratio cancels
    the drift the two share: the higher, the more)."""
    header = f"{'condition':<10} {'cell':<20} {'metric':<26} {'sweeps':>6} {'mean':>7} {'raw sd%':>8} " \
             f"{'vs cell sd%':>11} {'vs iperf3 sd%':>13} {'corr cell':>9} {'corr iperf3':>11}"
    lines = [header, "-" * len(header)]
    control = "->".join(CONTROL_CELL)
    for name, dirs in conditions.items():
        med = sweep_medians(dirs)
        iperf3 = iperf3_medians(dirs)
        lines.append(f"{name:<10} {'iperf3 (control)':<20} {'gbit_s':<26} {int(np.isfinite(iperf3).sum()):>6} "
                     f"{np.nanmean(iperf3):>7.3f} {spread_pct(iperf3):>8.2f} {'':>11} {'':>13} "
                     f"{_corr(iperf3, med[(control, 'gbit_s')]):>9} {'':>11}")
        for cell in sorted({c for c, _ in med}):
            for m in METRICS:
                raw = med[(cell, m)]
                fmt = lambda v: "n/a" if not np.isfinite(v) else f"{v:.2f}"   # noqa: E731
                vs_cell = "control" if cell == control else fmt(spread_pct(med[(cell, m + "_vs_cell")]))
                vs_iperf3 = fmt(spread_pct(med[(cell, m + "_vs_iperf3")]))
                c_cell = "" if cell == control else _corr(raw, med[(control, m)])
                c_iperf3 = _corr(raw, iperf3) if m == "gbit_s" else "n/a"
                lines.append(f"{name:<10} {cell:<20} {m:<26} {int(np.isfinite(raw).sum()):>6} {np.nanmean(raw):>7.3f} "
                             f"{spread_pct(raw):>8.2f} {vs_cell:>11} {vs_iperf3:>13} {c_cell:>9} {c_iperf3:>11}")
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
    print(f"{os.cpu_count()} CPUs; 3 cells (control cell write->read) and an iperf3 control test per round, "
          f"{args.repeats} rounds per sweep, "
          f"order interleave, runs of {length}; hog (a `while 1: pass` process) beside: "
          f"{', '.join(hogged_names) or 'none'} of the hog condition")
    print("spread between sweeps = sd of the sweep medians in % of their mean: raw metric; vs cell = the per-run "
          "ratio to the control cell's run of the same repeat; vs iperf3 = to the round's iperf3 test; corr = "
          "correlation of the cell's raw sweep medians with the control cell's / with iperf3's")
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
