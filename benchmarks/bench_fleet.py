"""Orchestration time of a fleet run: four lab pairs at once against one pair (target: at most 1.2x).

Orchestration = the command's wall time minus the transfers (`baselines: false`: none run): everything zcorch does
around them, i.e. start-up, SSH, preflight and the reused deploy, metadata, calibration, starting and
reaping the workers of every run, writing the result sets. The transfers are 64 KiB (microseconds), and
their time is subtracted anyway: per pair the sum of its runs' receiver wall_ns, and for pairs that ran at
once the longest of those sums.

Three commands, interleaved round by round, medians printed with ratios:
    one     `zcorch run EXP --hosts INV:p1`            one pair, as zcorch ran before fleets
    fleet1  `zcorch run EXP --hosts ONE:all`           the same pair through the fleet machinery
    fleet4  `zcorch run EXP --hosts INV:all`           four pairs, four labs, no shared host or link
Needs root: the four labs (network namespaces with sshd, tests/fixtures_lab.start_lab) are made for the
benchmark and removed after. One untimed warm-up fleet builds the worker on every host first (a deploy is
reused afterwards, as on any second night) and writes zcorch's bytecode (the commands run without
PYTHONDONTWRITEBYTECODE, as an installed zcorch has its .pyc files).

Where the time goes, per command (medians): the controller's CPU (zcorch's process and the pairs' processes
it forks) and the host side's CPU (each lab's sshd and everything it started: the remote python calls of
preflight, deploy check, metadata and calibration, the workers). The labs' hosts are namespaces of this
machine, so the host side of eight hosts runs on the same CPUs as the controller (on a real lab each host
pair has its own): `CPU / wall` above the CPU count means the fleet waited for CPU, not for its hosts.
What the fleet run does after its pairs (each pair's runs.parquet, the pairs compared: FLEET/pairs.md) is in
the timed path: it is the fleet command's own work (zcorch.cli.fleet.EndWork begins it while the pairs run).

    python benchmarks/bench_fleet.py [--rounds R]
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
sys.path.insert(0, os.path.join(REPO, "tests"))

EXPERIMENT = """\
name: benchfleet
hosts: inventory
params: {bytes: 64KiB, source: mem, sink: /dev/null, timeout: 30s}
matrix:
  send_mode: [write, vmsplice]
  recv_mode: [read]
repeats: 2
baselines: false
"""


def zcorch(*args: str) -> "tuple[float, float, subprocess.CompletedProcess]":
    """(wall s, controller CPU s, the result): CPU of zcorch and every process it forked and reaped."""
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    before = os.times()
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "zcorch", "-q", *args], capture_output=True, text=True,
                         env=env, timeout=1800)
    wall = time.monotonic() - t0
    after = os.times()
    if res.returncode != 0:
        raise SystemExit(f"zcorch {' '.join(args)}: exit {res.returncode}\n{res.stderr[-3000:]}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu, res


def host_cpu_s(pids: "list[int]") -> float:
    """CPU the labs' hosts used so far: each namespace process's own and that of the children it reaped (sshd
    reaps its sessions, and they every command and worker of the sweep)."""
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += sum(int(x) for x in fields[11:15])   # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def transfer_s(result_dir: str) -> float:
    with open(os.path.join(result_dir, "runs.jsonl")) as f:
        return sum((json.loads(line).get("receiver") or {}).get("wall_ns", 0) for line in f) / 1e9


def pair_dirs(fleet_dir: str) -> "list[str]":
    with open(os.path.join(fleet_dir, "fleet.json")) as f:
        return [os.path.join(fleet_dir, p["dir"]) for p in json.load(f)["pairs"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_fleet: needs root (the labs)", file=sys.stderr)
        return 2
    import yaml
    from fixtures_lab import start_lab

    from zcorch.lab import netns as zlab

    layouts = []
    try:
        for suffix in "abcd":
            layouts.append(start_lab(f"bfl{os.getpid()}{suffix}"))
        with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
            pairs = {f"p{i + 1}": layout.hosts_spec() for i, layout in enumerate(layouts)}
            inv, one_inv, exp = (os.path.join(tmp, n) for n in ("inv.yaml", "one.yaml", "exp.yaml"))
            with open(inv, "w") as f:
                yaml.safe_dump({"pairs": pairs}, f)
            with open(one_inv, "w") as f:
                yaml.safe_dump({"pairs": {"p1": pairs["p1"]}}, f)
            with open(exp, "w") as f:
                f.write(EXPERIMENT)
            lab_pids = [pid for layout in layouts for role in ("sender", "receiver")
                        for pid in zlab.netns_pids(layout.ns(role))]
            print(f"# machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (loaded by others)")
            print("# warm-up: one fleet of four, untimed (builds the worker on the 8 hosts)")
            zcorch("run", exp, "--hosts", f"{inv}:all", "-o", os.path.join(tmp, "warm"))
            kinds = ("one", "fleet1", "fleet4")
            times: "dict[str, list[float]]" = {k: [] for k in kinds}
            cpus: "dict[str, list[tuple[float, float]]]" = {k: [] for k in kinds}
            for r in range(args.rounds):
                for kind in kinds:
                    out = os.path.join(tmp, f"{kind}-{r}")
                    host0 = host_cpu_s(lab_pids)
                    if kind == "one":
                        wall, cpu, _ = zcorch("run", exp, "--hosts", f"{inv}:p1", "-o", out)
                        moved = transfer_s(out)
                    else:
                        spec = f"{one_inv}:all" if kind == "fleet1" else f"{inv}:all"
                        wall, cpu, _ = zcorch("run", exp, "--hosts", spec, "-o", out)
                        moved = max(transfer_s(d) for d in pair_dirs(out))
                    host = host_cpu_s(lab_pids) - host0
                    times[kind].append(wall - moved)
                    cpus[kind].append((cpu, host))
                    print(f"round {r + 1} {kind:7s} wall {wall:7.2f} s  transfers {moved * 1e3:7.2f} ms  "
                          f"orchestration {wall - moved:7.2f} s  CPU controller {cpu:5.2f} s, hosts {host:5.2f} s  "
                          f"(load {os.getloadavg()[0]:.1f})", flush=True)
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"\nmedian orchestration over {args.rounds} rounds: one pair {med['one']:.2f} s, "
                  f"fleet of one {med['fleet1']:.2f} s, fleet of four {med['fleet4']:.2f} s")
            for kind in kinds:
                ctl = statistics.median(c for c, _ in cpus[kind])
                host = statistics.median(h for _, h in cpus[kind])
                print(f"  {kind:7s} median CPU: controller {ctl:5.2f} s, hosts {host:5.2f} s; "
                      f"CPU / wall {(ctl + host) / med[kind]:.2f} of {os.cpu_count()} CPUs")
            paired = statistics.median(f / o for f, o in zip(times["fleet4"], times["one"]))
            print(f"fleet of four / one pair:      {med['fleet4'] / med['one']:.2f}x (target <= 1.2x); median of the "
                  f"rounds' own ratios {paired:.2f}x (each round measures both back to back)")
            print(f"fleet of four / fleet of one:  {med['fleet4'] / med['fleet1']:.2f}x")
            print(f"fleet of one / one pair:       {med['fleet1'] / med['one']:.2f}x (the fleet's own cost)")
    finally:
        for layout in layouts:
            zlab.down(layout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
