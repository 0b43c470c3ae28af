"""What one controller costs per pair: a fleet of 1, 4, 16, 32 lab pairs, one `zcorch run --hosts INV:all` each.

Each pair is a lab of its own (`zcorch lab up`: two network namespaces with sshd, zcorch.lab.netns), its
transfers small (64 KiB from memory to /dev/null, `repeats: 2`, two cells: four runs a pair), the exclusions
on: every GROUP pairs declare one `shares:` name (a rack's uplink), so their transfers never overlap. One
untimed warm-up fleet of every lab (one run a pair) builds the worker on every host first (a deploy is
reused afterwards, as on any second night). Printed per size:

- wall time of the fleet command, and the controller's own CPU: every process of the command's tree (the
  fleet process and the pair processes it forks, and what they start), from getrusage of the reaped
  children: in total and per run (goal: at the largest size within 1.5x of one pair's), and the fleet
  process's own (as last sampled: its imports, events, end work);
- its peak memory, sampled from /proc every SAMPLE s over the whole tree: the sum of RSS (shared pages
  counted once per process) and of PSS (shared pages divided between their sharers: the memory the tree
  really holds), in total and per pair (goal: PSS <= 60 MiB a pair), and the fleet process's;
- the peak number of processes, threads, open file descriptors and SSH connections (TCP sockets to port 22
  held by the tree, from /proc/PID/fd and /proc/net/tcp), the fleet process's fds apart;
- start skew: the spread of the pairs' result-set creation times (fork and start-up), and of their first
  runs (with exclusions on, a rack's pairs wait for each other: the first runs of the pairs that lead their
  rack are given apart);
- completeness: every pair's result set complete with every planned run ok, and every run delivered as
  exactly one `run` event of the fleet's --json stream (0 lost, 0 doubled); exclusions: run intervals of
  pairs of one rack that overlap (goal 0).

The labs are made for the benchmark (names bf<PID>x<I>, the first free lab indices from --first-index) and
removed after, whatever happens; the end checks that none of their namespaces is left. Root only.

    python benchmarks/bench_fleet.py --pairs 1,4,16,32 [--group 4] [--rounds 1] [--tree NAME=DIR ...]

--tree (twice or more): each round runs the fleet under each tree (a directory holding a zcorch package,
PYTHONPATH=DIR), interleaved, and prints the median of the rounds' wall-time ratios to the first tree.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

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
RUNS_PER_PAIR = 4
SAMPLE = 0.2
MIB = 1024 * 1024


# -- the controller's processes, from /proc ------------------------------------------------------

def _tree(root: int) -> "list[int]":
    children: "dict[int, list[int]]" = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _kib(path: str, key: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _ssh_inodes() -> "set[str]":
    """Inodes of the established TCP connections of this (the controller's) network namespace to port 22."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "01" and fields[2].rsplit(":", 1)[1] == "0016":
                        out.add(fields[9])
        except OSError:
            pass
    return out


class Sampler(threading.Thread):
    """Peaks of the process tree under `root`, every SAMPLE s until stopped."""

    def __init__(self, root: int):
        super().__init__(daemon=True)
        self.root, self.stop_at = root, threading.Event()
        self.peak = {"procs": 0, "threads": 0, "fds": 0, "ssh": 0, "rss_kib": 0, "pss_kib": 0, "fleet_pss_kib": 0, "fleet_fds": 0}
        self.fleet_cpu = 0.0   # the fleet process's own CPU (not its children's), as last seen

    def run(self) -> None:
        while not self.stop_at.wait(SAMPLE):
            self.sample()

    def sample(self) -> None:
        pids = _tree(self.root)
        ssh = _ssh_inodes()
        now = {"procs": len(pids), "threads": 0, "fds": 0, "ssh": 0, "rss_kib": 0, "pss_kib": 0,
               "fleet_pss_kib": _kib(f"/proc/{self.root}/smaps_rollup", "Pss:"), "fleet_fds": 0}
        try:
            with open(f"/proc/{self.root}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            self.fleet_cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            now["fleet_fds"] = len(os.listdir(f"/proc/{self.root}/fd"))
        except (OSError, ValueError, IndexError):
            pass
        for pid in pids:
            now["threads"] += _kib(f"/proc/{pid}/status", "Threads:")
            now["rss_kib"] += _kib(f"/proc/{pid}/status", "VmRSS:")
            now["pss_kib"] += _kib(f"/proc/{pid}/smaps_rollup", "Pss:")
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            now["fds"] += len(fds)
            for fd in fds:
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("socket:[") and target[8:-1] in ssh:
                    now["ssh"] += 1
        for k, v in now.items():
            self.peak[k] = max(self.peak[k], v)


def run_fleet(args: "list[str]", tree: str = REPO) -> dict:
    """`zcorch run ARGS --json` (zcorch from `tree`): wall time, the tree's CPU, its peaks, its stdout's events."""
    env = dict(os.environ, PYTHONPATH=tree)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "zcorch", "-q", "run", *args, "--json"], stdout=out,
                                stderr=err, env=env, text=True)
        sampler = Sampler(proc.pid)
        sampler.start()
        try:
            rc = proc.wait(timeout=3600)
        finally:
            sampler.stop_at.set()
            sampler.join()
            if proc.poll() is None:
                proc.kill()
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if rc != 0:
        raise SystemExit(f"zcorch run {' '.join(args)}: exit {rc}\n{stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return {"wall": wall, "cpu": cpu, "peak": sampler.peak, "fleet_cpu": sampler.fleet_cpu, "events": events}


# -- the result sets -----------------------------------------------------------------------------

def _records(path: str) -> "list[dict]":
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _t(iso: str) -> float:
    return dt.datetime.fromisoformat(iso).timestamp()


def check_fleet(out: str, events: "list[dict]", groups: "dict[str, list[str]]") -> dict:
    with open(os.path.join(out, "fleet.json")) as f:
        pairs = {p["pair"]: os.path.join(out, p["dir"]) for p in json.load(f)["pairs"]}
    incomplete, lost, doubled, created, first = [], 0, 0, {}, {}
    intervals = {}
    for name, d in pairs.items():
        with open(os.path.join(d, "manifest.json")) as f:
            manifest = json.load(f)
        recs = _records(os.path.join(d, "runs.jsonl"))
        if manifest.get("status") != "complete" or sum(r.get("status") == "ok" for r in recs) != RUNS_PER_PAIR:
            incomplete.append(name)
        got = [(e["cell"], e["repeat"], e["started"]) for e in events if e.get("event") == "run" and e.get("pair") == name]
        want = {(r["cell"], r["repeat"], r["started"]) for r in recs}
        lost += len(want - set(got))
        doubled += len(got) - len(set(got)) + len(set(got) - want)
        created[name] = _t(manifest["created"])
        first[name] = min(_t(r["started"]) for r in recs) if recs else float("nan")
        intervals[name] = [(_t(r["started"]), _t(r["started"]) + r["wall_s"]) for r in recs]
    overlapping = 0
    for members in groups.values():
        members = [m for m in members if m in intervals]
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                overlapping += sum(1 for x in intervals[a] for y in intervals[b] if x[0] < y[1] and y[0] < x[1])
    leaders = [min(m for m in members if m in first) for members in groups.values() if any(m in first for m in members)]
    return {"pairs": len(pairs), "incomplete": incomplete, "lost": lost, "doubled": doubled,
            "overlapping": overlapping,
            "create_skew": max(created.values()) - min(created.values()),
            "first_skew": max(first.values()) - min(first.values()),
            "leader_skew": max(first[m] for m in leaders) - min(first[m] for m in leaders)}


# -- the labs ------------------------------------------------------------------------------------

def start_labs(n: int, first_index: int, labs: list) -> None:
    """n labs named bf<PID>x<I> on the first free indices from `first_index` (skipping another's lab), each
    appended to `labs` as it is made (before up(), whose failure undoes its own part): an interrupted start
    leaves the caller every lab to take down."""
    from zcorch.errors import LabError
    from zcorch.lab import netns as zlab

    index = first_index
    while len(labs) < n:
        if index > 255:
            raise SystemExit(f"bench_fleet: no free lab index left for lab {len(labs) + 1} of {n}")
        layout = zlab.LabLayout(f"bf{os.getpid()}x{len(labs)}", index)
        index += 1
        if zlab._index_owner(layout) is not None or zlab._link(layout.bridge) is not None:
            continue
        labs.append(layout)
        try:
            zlab.up(layout)
        except LabError as exc:   # taken by another session meanwhile (up() undid its own part)
            labs.pop()
            if any(s in str(exc) for s in ("in use", "cannot create bridge", "already exists")):
                continue
            raise


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="1,4", help="fleet sizes, comma-separated (default 1,4)")
    ap.add_argument("--group", type=int, default=4, help="pairs per `shares:` name (default 4)")
    ap.add_argument("--rounds", type=int, default=1, help="timed fleets per size (default 1)")
    ap.add_argument("--first-index", type=int, default=150, help="the first lab index tried (default 150)")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                    help="time the fleet under each of these zcorch trees, interleaved (default: this checkout)")
    args = ap.parse_args()
    trees = [tuple(t.split("=", 1)) for t in args.tree] or [("", REPO)]
    trees = [(name, os.path.abspath(tree)) for name, tree in trees]
    sizes = [int(x) for x in args.pairs.split(",")]
    if os.geteuid() != 0:
        print("bench_fleet: needs root (the labs)", file=sys.stderr)
        return 2
    import yaml

    from zcorch.lab import netns as zlab

    signal.signal(signal.SIGTERM, signal.default_int_handler)   # a TERM unwinds through the labs' teardown too
    labs: list = []
    t_up = time.monotonic()
    try:
        start_labs(max(sizes), args.first_index, labs)
        print(f"# {len(labs)} labs up in {time.monotonic() - t_up:.0f} s (indices "
              f"{labs[0].index}-{labs[-1].index}); machine: {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f} (shared with other work)", flush=True)
        rows = []
        with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
            exp = os.path.join(tmp, "exp.yaml")
            with open(exp, "w") as f:
                f.write(EXPERIMENT)
            # one untimed fleet of every pair, one run each: deploys the worker on every host
            warm_exp = os.path.join(tmp, "warm.yaml")
            with open(warm_exp, "w") as f:
                f.write(EXPERIMENT.replace("[write, vmsplice]", "[write]").replace("repeats: 2", "repeats: 1"))
            inv = os.path.join(tmp, "all.yaml")
            with open(inv, "w") as f:
                yaml.safe_dump({"pairs": {f"w{i}": lab.hosts_spec() for i, lab in enumerate(labs)}}, f)
            t0 = time.monotonic()
            for name, tree in trees:   # each tree's worker is a deploy of its own
                run_fleet([warm_exp, "--hosts", f"{inv}:all", "-o", os.path.join(tmp, f"warm{name}")], tree)
            print(f"# warm-up (deploy on {2 * len(labs)} hosts, one run a pair, untimed): "
                  f"{time.monotonic() - t0:.0f} s", flush=True)
            for n in sizes:
                names = [f"p{i + 1:02d}" for i in range(n)]
                groups: "dict[str, list[str]]" = {}
                pairs = {}
                for i, name in enumerate(names):
                    rack = f"rack{i // args.group}"
                    groups.setdefault(rack, []).append(name)
                    pairs[name] = dict(labs[i].hosts_spec(), shares=[rack])
                inv = os.path.join(tmp, f"inv{n}.yaml")
                with open(inv, "w") as f:
                    yaml.safe_dump({"pairs": pairs}, f)
                walls: "dict[str, list[float]]" = {name: [] for name, _ in trees}
                for r, (name, tree) in ((r, t) for r in range(args.rounds) for t in trees):
                    out = os.path.join(tmp, f"fleet{n}-{r}{name}")
                    load = os.getloadavg()[0]
                    res = run_fleet([exp, "--hosts", f"{inv}:all", "-o", out], tree)
                    chk = check_fleet(out, res["events"], groups)
                    walls[name].append(res["wall"])
                    if name == trees[0][0]:
                        rows.append((n, res, chk, load))
                    p = res["peak"]
                    print(f"{name + ' ' if name else ''}pairs {n:3d}: wall {res['wall']:6.1f} s  controller CPU {res['cpu']:6.2f} s = "
                          f"{res['cpu'] / (n * RUNS_PER_PAIR) * 1e3:6.0f} ms/run (the fleet process {res['fleet_cpu']:5.2f} s)  "
                          f"peak PSS {p['pss_kib'] / 1024:6.0f} MiB ({p['pss_kib'] / 1024 / n:5.1f}/pair; the fleet "
                          f"process {p['fleet_pss_kib'] / 1024:4.0f})  "
                          f"RSS {p['rss_kib'] / 1024:6.0f} MiB ({p['rss_kib'] / 1024 / n:5.1f}/pair)  "
                          f"procs {p['procs']:3d} threads {p['threads']:4d} fds {p['fds']:4d} (the fleet process {p['fleet_fds']:3d}) "
                          f"ssh {p['ssh']:3d}  "
                          f"skew: created {chk['create_skew']:5.2f} s, first runs {chk['first_skew']:5.2f} s "
                          f"(rack leaders {chk['leader_skew']:5.2f} s)  "
                          f"complete {n - len(chk['incomplete'])}/{n}, events lost {chk['lost']} doubled "
                          f"{chk['doubled']}, overlapping runs in a rack {chk['overlapping']}  (load {load:.1f})",
                          flush=True)
                for name, _ in trees[1:]:
                    ratios = [b / a for a, b in zip(walls[trees[0][0]], walls[name])]
                    print(f"pairs {n:3d}: wall {name}/{trees[0][0]} median of {len(ratios)} rounds "
                          f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}); medians "
                          f"{statistics.median(walls[trees[0][0]]):.1f} s, {statistics.median(walls[name]):.1f} s")
        small = min(sizes)
        base = statistics.median(res["cpu"] / (n * RUNS_PER_PAIR) for n, res, _, _ in rows if n == small)
        pss0 = max(res["peak"]["pss_kib"] for n, res, _, _ in rows if n == small) / 1024
        print(f"\nsize  CPU/run vs {small} pair(s)   PSS/pair MiB (each added pair)  goals: CPU/run <= 1.5x, "
              "PSS <= 60 MiB/pair, 0 lost/doubled/overlapping")
        for n in sizes:
            mine = [(res, chk) for m, res, chk, _ in rows if m == n]
            per_run = statistics.median(res["cpu"] / (n * RUNS_PER_PAIR) for res, _ in mine)
            pss = max(res["peak"]["pss_kib"] for res, _ in mine) / 1024
            added = f"{(pss - pss0) / (n - small):5.1f}" if n > small else "    -"
            clean = all(not c["incomplete"] and c["lost"] == c["doubled"] == c["overlapping"] == 0 for _, c in mine)
            print(f"{n:4d}  {per_run / base:5.2f}x ({per_run * 1e3:4.0f} ms)  {pss / n:12.1f} ({added})     "
                  f"CPU {'met' if per_run <= 1.5 * base else 'MISSED'}, memory "
                  f"{'met' if pss / n <= 60 else 'MISSED'}, events/exclusions {'met' if clean else 'MISSED'}")
    finally:
        for layout in labs:
            zlab.down(layout)
        left = [ns for ns in zlab.list_netns() if ns.startswith(f"zcorch-bf{os.getpid()}x")]
        print(f"# labs down: {len(labs)} removed, {len(left)} namespaces of theirs left {left if left else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
