"""How close `zcorch plan`'s estimate comes to the sweep it estimates, per axis: assumed vs learned.

For each case, after an untimed warm-up sweep (a nightly sweep finds its worker built and calibrated), a sweep A runs (the "last night"), then `zcorch plan` estimates sweep B twice, from its
assumptions (--rate/--overhead defaults) and from A (`--timings A`), then B runs and its wall time is the
actual. B is A's experiment with more repeats (`--set repeats=N`), so the estimate has to scale, not echo.
Cases: a buffer axis on localhost; with root, a filesystem axis (loop ext4/xfs/btrfs made and released) and a
network axis (MTU and congestion control switched) on a two-host lab made for the benchmark.

    python benchmarks/bench_plan_estimate.py [--lab] [--first-index 170]

Prints estimate/actual per case and estimator (goal: learned within ±20%); actual is B's own span (manifest
created .. finished).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def zcorch(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "zcorch", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO)


def estimated(exp: str, sets: list, timings_from: "str | None" = None) -> float:
    """What `zcorch plan EXP --set ... [--timings DIR]` prints as its estimate, unrounded."""
    sys.path.insert(0, REPO)
    from zcorch.plan import estimate, load_plan
    from zcorch.results.timings import learn

    plan = load_plan(exp, sets, None, unknown_hosts=True)
    return estimate(plan, timings=learn(timings_from) if timings_from else None).total_s


def case(name: str, exp: dict, work: str, more_repeats: int) -> tuple:
    path = os.path.join(work, f"{name.split()[0]}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(exp, f)
    # a warm-up sweep first (untimed): a lab's nightly sweep finds its worker built and its calibration cached
    zcorch("run", path, "-o", os.path.join(work, f"{name.split()[0]}-warm"), "--set", "repeats=1")
    a = os.path.join(work, f"{name.split()[0]}-a")
    r = zcorch("run", path, "-o", a)
    if r.returncode not in (0, 1):
        raise SystemExit(r.stdout + r.stderr)
    sets = [f"repeats={more_repeats}"]
    assumed = estimated(path, sets)
    learned = estimated(path, sets, a)
    b = os.path.join(work, f"{name.split()[0]}-b")
    r = zcorch("run", path, "-o", b, *[x for s in sets for x in ("--set", s)])
    if r.returncode not in (0, 1):
        raise SystemExit(r.stdout + r.stderr)
    # the sweep's own span (its manifest's created .. finished): the interpreter's start-up before it is
    # `zcorch --help`'s budget, not the plan's
    with open(os.path.join(b, "manifest.json")) as f:
        m = json.load(f)
    actual = (datetime.fromisoformat(m["finished"]) - datetime.fromisoformat(m["created"])).total_seconds()
    return name, actual, assumed, learned


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lab", action="store_true", help="also the filesystem and network axes on a lab (root)")
    ap.add_argument("--first-index", type=int, default=170, help="the lab index to try first (default 170)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-plan-estimate-")
    rows = []
    rows.append(case("buffer (localhost)", {
        "name": "est-buffer", "params": {"bytes": "256MiB", "timeout": "60s", "source": "mem"},
        "matrix": {"send_mode": ["write", "vmsplice"], "buffer": ["64KiB", "1MiB"]}, "repeats": 2,
        "baselines": {"iperf3": True, "dd": True}}, work, 6))
    labs = []
    if args.lab:
        from zcorch.lab import netns as zlab
        sys.path.insert(0, os.path.join(REPO, "benchmarks"))
        from bench_fleet import start_labs

        try:
            start_labs(1, args.first_index, labs)
            hosts = labs[0].hosts_spec()
            fs = {"ext4": {"fs": "ext4", "loop": {"count": 1, "size": "96MiB"}},
                  "xfs": {"fs": "xfs", "loop": {"count": 1, "size": "320MiB"}},
                  "btrfs": {"fs": "btrfs", "loop": {"count": 1, "size": "128MiB"}}}
            rows.append(case("filesystem (lab)", {
                "name": "est-fs", "hosts": hosts, "filesystems": fs, "order": "interleave",
                "params": {"bytes": "64MiB", "timeout": "60s", "sink": "{filesystem}/recv.dat"},
                "matrix": {"filesystem": list(fs)}, "repeats": 2,
                "baselines": {"iperf3": False, "dd": {"bs": "64KiB", "count": 64}}}, work, 6))
            nets = {"small": {"mtu": 1400, "congestion": "reno"}, "big": {"mtu": 9000, "congestion": "reno"}}
            rows.append(case("network (lab)", {
                "name": "est-net", "hosts": hosts, "networks": nets, "order": "interleave",
                "params": {"bytes": "512MiB", "timeout": "60s"}, "matrix": {"network": list(nets)}, "repeats": 2,
                "baselines": {"iperf3": False, "dd": False}}, work, 6))
        finally:
            for layout in labs:
                zlab.down(layout)
    print(f"{'case':<20} {'actual':>8} {'assumed':>8} {'ratio':>6} {'learned':>8} {'ratio':>6}")
    for name, actual, assumed, learned in rows:
        print(f"{name:<20} {actual:7.1f}s {assumed:7.1f}s {assumed / actual:6.2f} {learned:7.1f}s "
              f"{learned / actual:6.2f}")
    print("(goal: learned within 0.80-1.20 of actual)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
