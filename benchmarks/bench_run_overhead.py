"""Per-run controller overhead of `zcorch run`: the time from one run's start to the next one's, runs back to
back as a sweep runs them, minus the worker's transfer time (the records' own overhead_s, wall_s minus the
transfer, is printed beside it: it leaves out what overlaps the next run, e.g. waiting for the workers' exit).

Budget (docs/performance.md): median <= 30 ms per run. Prints medians for localhost and, when the
two-host network-namespace lab can be made (root), for the lab through real SSH, interleaved.
The lab is brought up for the benchmark (tests/fixtures_lab.start_lab) and torn down after.
The runner keeps one worker server per host (zcorch.worker.serve) for all of a setup's runs, as a sweep
does. Peers measured in the same run: starting the worker's Python twice (`python -c "import
zcorch.worker"`: what each run cost when every run started its own workers) and the transfer itself
(the longer worker wall time of each run).

    python benchmarks/bench_run_overhead.py [--runs N] [--rounds R] [--no-lab]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from zcorch.hosts.local import LocalHost  # noqa: E402
from zcorch.results.store import ResultSet  # noqa: E402
from zcorch.sweep.runner import Runner  # noqa: E402
from zcorch.config.experiment import DEFAULTS  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def params() -> dict:
    p = dict(DEFAULTS)
    p.update(bytes=8 << 20, buffer=128 << 10, timeout=30.0)
    return p


def resultset(tmp: str, name: str) -> ResultSet:
    return ResultSet.create(os.path.join(tmp, name), name=name, experiment_bytes=b"", plan_runs=[],
                            command=["bench"], accept_new_host_keys=False, zcorch_version="bench", git_revision=None)


def local_setup(tmp: str):
    """Runner on localhost with the worker command `zcorch run` uses (deploy's handle: python -S)."""
    from zcorch.provision import deploy

    host = LocalHost()
    handle = deploy.deploy(host)
    return Runner(host, host, handle.worker_argv, handle.worker_argv, resultset(tmp, "local"),
                  worker_env={"sender": handle.env, "receiver": handle.env})


def lab_setup(tmp: str):
    """Runner across a fresh two-host lab through real SSH (root only); (runner, hosts, layout) or Nones."""
    if os.geteuid() != 0:
        return None, None, None
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from fixtures_lab import start_lab  # the test suite's lab: own name, first free index

    from zcorch.provision import deploy
    from zcorch.hosts import ssh

    layout = start_lab(f"bench{os.getpid()}")
    hosts = ssh.open_hosts(layout.hosts(), accept_new_host_keys=False)
    handles = deploy.prepare(hosts)
    runner = Runner(hosts["sender"], hosts["receiver"], handles["sender"].worker_argv,
                    handles["receiver"].worker_argv, resultset(tmp, "lab"),
                    worker_env={r: handles[r].env for r in handles})
    return runner, hosts, layout


def python_startup() -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import zcorch.worker"], check=True, env=dict(os.environ, PYTHONPATH=REPO))
    return time.monotonic() - t0


def close(setups: dict) -> None:
    for runner in setups.values():
        runner.close()   # the worker servers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs per round and setup")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-lab", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        setups = {"localhost": local_setup(tmp)}
        lab_hosts, layout = None, None
        if not args.no_lab:
            runner, lab_hosts, layout = lab_setup(tmp)
            if runner is not None:
                setups["lab"] = runner
            else:
                print("lab: needs root; measuring localhost only")
        samples = {name: [] for name in setups}
        transfers = {name: [] for name in setups}
        recorded = {name: [] for name in setups}   # the runs' own overhead_s (wall_s minus the transfer)
        startup = []
        p = params()
        try:
            for rnd in range(args.rounds):
                for name, runner in setups.items():  # interleaved: noise hits every setup alike
                    # Back to back, as a sweep runs them: what a run costs is the time from one run's start to
                    # the next one's (the previous run's worker exits, its record, the next run's start-up)
                    # minus its transfer, not only what its own record's wall_s holds.
                    t_prev = time.monotonic()
                    for i in range(args.runs):
                        rec = runner.run_one(f"bench{rnd}", i, p)
                        now = time.monotonic()
                        if rec["status"] != "ok":
                            print(f"{name}: run failed: {rec['reason']}")
                            t_prev = now
                            continue
                        transfer = rec["wall_s"] - rec["overhead_s"]
                        if i:   # the first run of a round also pays the previous setup's leftovers
                            samples[name].append(now - t_prev - transfer)
                            recorded[name].append(rec["overhead_s"])
                        transfers[name].append(transfer)
                        t_prev = now
                    startup.append(2 * python_startup())
        finally:
            close(setups)
            for h in {id(h): h for h in (lab_hosts or {}).values()}.values():
                h.close()
            if layout is not None:
                from zcorch.lab import netns as lab

                lab.down(layout)
        peer = statistics.median(startup)
        print(f"peer: 2 x worker python start-up (import zcorch.worker), median {peer * 1000:.0f} ms")
        for name, vals in samples.items():
            if not vals:
                continue
            med = statistics.median(vals)
            print(f"{name}: per-run overhead median {med * 1000:.1f} ms over {len(vals)} back-to-back runs "
                  f"(min {min(vals) * 1000:.1f}, max {max(vals) * 1000:.1f}); {med / peer:.2f}x the start-up peer; "
                  f"the records' own overhead_s median {statistics.median(recorded[name]) * 1000:.1f} ms; "
                  f"transfer median {statistics.median(transfers[name]) * 1000:.1f} ms; "
                  f"budget <= 30 ms: {'met' if med <= 0.03 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
