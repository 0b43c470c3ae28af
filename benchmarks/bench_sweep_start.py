"""How long a warm lab sweep of one 1 MiB run without baselines takes, and where the time goes.

Budget (docs/performance.md): <= 2 s. "Warm": the worker is deployed on both hosts and their copy-cost calibration
is cached (a first sweep, not measured, does both). Measured, interleaved, `--rounds` times each:
  sweep      zcorch.sweep.pipeline.run_sweep in this process (the pipeline: hosts, deploy check, preflight,
             metadata, calibration from the cache, the run, the result set)
  command    `zcorch run FILE` as a subprocess (the above plus the interpreter and the command's imports)
and, as the peer in the same run, the transfer itself: the receiver's wall time of the sweep's one run.
With `--before DIR` (a checkout of an earlier zcorch, with its compiled module, e.g. one without the
calibration cache and the worker servers) its `zcorch run` of the same file is timed interleaved too.
Prints medians, the stage times of the median sweep, and the ratios. Needs root (the lab); the lab is
brought up for the benchmark (tests/fixtures_lab.start_lab) and torn down after.

    python benchmarks/bench_sweep_start.py [--rounds N] [--before DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from zcorch.sweep.pipeline import SweepObserver, run_sweep  # noqa: E402

TARGET_S = 2.0


class StageClock(SweepObserver):
    """Seconds spent in each stage of one sweep."""

    def __init__(self):
        self.stages, self._current, self._t = {}, None, time.monotonic()

    def stage(self, name: str, title: str) -> None:
        now = time.monotonic()
        if self._current is not None:
            self.stages[self._current] = now - self._t
        self._current, self._t = name, now


def experiment(tmp: str, hosts: dict) -> str:
    import yaml

    path = os.path.join(tmp, "start.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({"name": "sweepstart", "hosts": hosts, "params": {"bytes": "1MiB"},
                        "baselines": {"iperf3": False, "dd": False}}, f)
    return path


def transfer_s(result_dir: str) -> float:
    with open(os.path.join(result_dir, "runs.jsonl")) as f:
        rec = json.loads(f.readline())
    assert rec["status"] == "ok", rec
    return rec["receiver"]["wall_ns"] / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--before", metavar="DIR", help="an earlier zcorch checkout whose `zcorch run` to time too")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_sweep_start: needs root (the two-host lab)")
        return 2
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from fixtures_lab import start_lab
    from zcorch.lab import netns as lab

    layout = start_lab(f"bstart{os.getpid()}")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = experiment(tmp, layout.hosts_spec())
            warm = run_sweep(path, output=os.path.join(tmp, "warm"))   # deploys, calibrates (cached after)
            assert warm.exit_status == 0, warm.records
            sweeps, commands, transfers, clocks, befores = [], [], [], [], []
            # As a user's shell runs it: with the byte-code cache (an installed zcorch has its .pyc files;
            # without them every command compiles its modules from source first).
            base_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env = dict(base_env, PYTHONPATH=REPO)
            before_env = dict(base_env, PYTHONPATH=os.path.abspath(args.before)) if args.before else None
            # untimed: writes the .pyc files the timed commands then use
            subprocess.run([sys.executable, "-m", "zcorch", "-q", "run", path, "-o", os.path.join(tmp, "cw")],
                           check=True, env=env, capture_output=True)
            if before_env:   # its own deploy (another content hash) and calibration, not measured
                subprocess.run([sys.executable, "-m", "zcorch", "-q", "run", path, "-o", os.path.join(tmp, "bw")],
                               check=True, env=before_env, capture_output=True, cwd=args.before)
            for i in range(args.rounds):
                clock = StageClock()
                t0 = time.monotonic()
                result = run_sweep(path, output=os.path.join(tmp, f"s{i}"), observer=clock)
                sweeps.append(time.monotonic() - t0)
                assert result.exit_status == 0, result.records
                clock.stage("end", "")
                clocks.append((sweeps[-1], clock.stages))
                transfers.append(transfer_s(result.result_dir))
                t0 = time.monotonic()
                subprocess.run([sys.executable, "-m", "zcorch", "-q", "run", path, "-o", os.path.join(tmp, f"c{i}")],
                               check=True, env=env, capture_output=True)
                commands.append(time.monotonic() - t0)
                transfers.append(transfer_s(os.path.join(tmp, f"c{i}")))
                if before_env:
                    t0 = time.monotonic()
                    subprocess.run([sys.executable, "-m", "zcorch", "-q", "run", path, "-o", os.path.join(tmp, f"b{i}")],
                                   check=True, env=before_env, capture_output=True, cwd=args.before)
                    befores.append(time.monotonic() - t0)
    finally:
        lab.down(layout)
    sweep, command, transfer = (statistics.median(v) for v in (sweeps, commands, transfers))
    print(f"peer: the transfer itself (receiver wall time of the run), median {transfer * 1000:.1f} ms")
    print(f"sweep (run_sweep in-process): median {sweep:.2f} s over {len(sweeps)} (min {min(sweeps):.2f}, max "
          f"{max(sweeps):.2f}); {sweep / transfer:.0f}x the transfer; target <= {TARGET_S} s: "
          f"{'met' if sweep <= TARGET_S else 'NOT met'}")
    print(f"command (`zcorch run` subprocess): median {command:.2f} s (min {min(commands):.2f}, max "
          f"{max(commands):.2f}); {command / transfer:.0f}x the transfer; "
          f"{'met' if command <= TARGET_S else 'NOT met'}")
    if befores:
        before = statistics.median(befores)
        print(f"before ({args.before}, `zcorch run` subprocess): median {before:.2f} s (min {min(befores):.2f}, "
              f"max {max(befores):.2f}); now/before {command / before:.2f}")
    median_clock = sorted(clocks)[len(clocks) // 2][1]
    print("stages of the median sweep: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in median_clock.items()
                                                     if v >= 0.0005))
    return 0


if __name__ == "__main__":
    sys.exit(main())
