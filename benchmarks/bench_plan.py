"""Planning speed: load + validate + expand a 100 000-cell experiment file (target: < 1 s).

    python3 benchmarks/bench_plan.py [--reps 7] [--repeats 1]

Prints the median of interleaved repetitions of:
  plan      zcorch.plan.load_plan(FILE)  (YAML -> validated Experiment -> cells and runs, ids included)
  plan+rules  the same matrix with exclude entries and cells the worker cannot run (skip_invalid: true)
  naive     the peer: itertools.product over the same axes building each cell's dict and hashing
            json.dumps(cell, sort_keys=True) per cell (what the plan does without its fast path)
and the ratio plan/naive. The machine is shared: expect noise, trust medians.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from itertools import product

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from zcorch import plan as planmod  # noqa: E402

AXES = {
    "buffer": [f"{4 * (i + 1)}KiB" for i in range(10)],
    "window": ["auto"] + [f"{i + 1}MiB" for i in range(9)],
    "bytes": [f"{64 * (i + 1)}MiB" for i in range(10)],
    "send_cpu": ["null"] + [str(i) for i in range(9)],
    "recv_cpu": ["null"] + [str(i) for i in range(9)],
}


def write_file(directory: str, rules: bool, repeats: int) -> str:
    axes = dict(AXES)
    lines = ["name: bench-100k", f"repeats: {repeats}", "order: shuffle", "seed: 7",
             "params: {source: /dev/zero, sink: /tmp/zcorch-bench.dat}"]
    if rules:
        # 4 send modes x 5 x 10 x 10 x 10 x 5 = 100 000 combinations; mmap from /dev/zero is invalid,
        # and an exclude entry drops a slice.
        axes = {"send_mode": ["write", "mmap", "splice", "vmsplice"], "buffer": AXES["buffer"][:5],
                "window": AXES["window"], "bytes": AXES["bytes"], "send_cpu": AXES["send_cpu"],
                "recv_cpu": AXES["recv_cpu"][:5]}
        lines += ["skip_invalid: true", "exclude:", "  - {send_mode: splice, recv_cpu: [0, 1]}"]
    lines.append("matrix:")
    lines += [f"  {k}: [{', '.join(v)}]" for k, v in axes.items()]
    path = os.path.join(directory, f"bench-{'rules' if rules else 'plain'}.yaml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def naive(exp) -> int:
    base = exp.base_params()
    keys = [a.key for a in exp.matrix]
    n = 0
    for combo in product(*(a.values for a in exp.matrix)):
        cell = dict(base)
        cell.update(zip(keys, combo))
        hashlib.sha256(json.dumps(cell, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]
        n += 1
    return n


REFERENCE_N = 10_000_000


def reference_loop() -> None:
    x = 0
    for i in range(REFERENCE_N):
        x += i


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=1, help="repeats: in the file (runs = cells x repeats)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        plain, rules = write_file(d, False, args.repeats), write_file(d, True, args.repeats)
        exp = planmod.load_experiment(plain)
        contenders = {"plan": lambda: planmod.load_plan(plain), "plan+rules": lambda: planmod.load_plan(rules),
                      "naive": lambda: naive(exp), "reference": reference_loop}
        wall = {k: [] for k in contenders}
        cpu = {k: [] for k in contenders}
        sizes = {}
        for _ in range(args.reps):  # interleaved: each repetition runs every contender once
            for name, fn in contenders.items():
                w, c = time.perf_counter(), time.process_time()
                out = fn()
                cpu[name].append(time.process_time() - c)
                wall[name].append(time.perf_counter() - w)
                if isinstance(out, planmod.Plan):
                    sizes[name] = f"cells {len(out.cells):>6}  runs {len(out.runs):>6}  dropped {len(out.dropped):>6}"
                del out
    mw = {k: statistics.median(v) for k, v in wall.items()}
    mc = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"planning a 100 000-combination matrix, median of {args.reps} interleaved runs (target < 1 s wall):")
    print(f"  load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for k in contenders:
        print(f"  {k:<11} wall {mw[k]:6.3f} s  cpu {mc[k]:6.3f} s   {sizes.get(k, '')}")
    print(f"  ratio plan/naive (cpu): {mc['plan'] / mc['naive']:.2f}  (naive = dict + json.dumps + sha256 per cell,"
          f" no validation, no runs)")
    print(f"  reference = {REFERENCE_N:,} iterations of `x += i` (machine speed: ~0.4 s cpu on an idle 3 GHz core)")
    ok = mw["plan"] < 1.0 and mw["plan+rules"] < 1.0
    print("OK: under 1 s" if ok else "SLOW: over 1 s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
