"""One command timed under two or more zcorch trees, interleaved (A B A B ...): what a mechanism buys.

A tree is a directory holding the zcorch package (a checkout, or `git archive` of a commit with the built
zcorch/_native*.so copied in). The command runs with PYTHONPATH=TREE, `{tree}` in its words replaced by the
tree and `{n}` by a number of its own per run (fresh output directories). Each tree first runs the command
--warmup times untimed (byte-code caches, a calibration). The figure is the child's wall time, or a number its output gives (--figure REGEX, group 1), and its CPU
time. Printed per tree: medians, and the median of each round's ratio to the first tree (so drift of the
machine's speed between rounds cancels), with the rounds' range; the load average before and after.

    python benchmarks/bench_ab.py --tree with=DIR --tree without=DIR [--rounds 5] [--figure REGEX] -- CMD...
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time


_runs = iter(range(1, 1 << 30))


def run_once(tree: str, command: "list[str]", figure: "re.Pattern | None") -> "tuple[float, float]":
    """(figure, CPU seconds of the child and its children) of one run of `command` under `tree`."""
    n = str(next(_runs))
    argv = [word.replace("{tree}", tree).replace("{n}", n) for word in command]
    env = dict(os.environ, PYTHONPATH=tree)
    env.pop("PYTHONDONTWRITEBYTECODE", None)   # as a user's shell runs it: with the byte-code cache
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        sys.exit(f"{tree}: {' '.join(argv)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    if figure is None:
        return wall, cpu
    found = figure.search(done.stdout + done.stderr)
    if found is None:
        sys.exit(f"{tree}: no match for {figure.pattern!r} in:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return float(found.group(1)), cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, metavar="NAME=DIR",
                    help="a tree (twice or more; the first is the one the others are compared with)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs per tree first (default 1)")
    ap.add_argument("--figure", help="a regular expression whose group 1 is the figure in the output "
                                     "(default: the wall time)")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    trees = [tuple(t.split("=", 1)) for t in args.tree]
    if len(trees) < 2 or not command:
        ap.error("two --tree NAME=DIR or more, and a command")
    figure = re.compile(args.figure) if args.figure else None
    figures = {name: [] for name, _ in trees}
    cpus = {name: [] for name, _ in trees}
    for _ in range(args.warmup):
        for _name, tree in trees:
            run_once(os.path.abspath(tree), command, figure)
    load0 = os.getloadavg()[0]
    for rnd in range(args.rounds):
        order = trees if rnd % 2 == 0 else [trees[0], *reversed(trees[1:])]
        for name, tree in order:
            value, cpu = run_once(os.path.abspath(tree), command, figure)
            figures[name].append(value)
            cpus[name].append(cpu)
    load1 = os.getloadavg()[0]
    ref = trees[0][0]
    print(f"{' '.join(command)}: {args.rounds} rounds, load average {load0:.1f} -> {load1:.1f}")
    for name, _ in trees:
        line = (f"  {name}: median {statistics.median(figures[name]):.4g}, CPU {statistics.median(cpus[name]):.3g} s")
        if name != ref:
            ratios = [b / a for a, b in zip(figures[ref], figures[name])]
            cpu_ratios = [b / a for a, b in zip(cpus[ref], cpus[name]) if a > 0]
            line += (f"; {name}/{ref} median of rounds {statistics.median(ratios):.2f} "
                     f"({min(ratios):.2f}-{max(ratios):.2f}), CPU {statistics.median(cpu_ratios):.2f}")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
