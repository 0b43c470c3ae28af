"""Where the CPU goes on loopback: process view, host view and one copy of the data, per send mode and
pinning layout.

    python3 benchmarks/bench_cpu_cost.py [--bytes 1GiB] [--reps 3] [--buffer 128KiB] [--recv-mode read]

For write, sendfile, splice, vmsplice and msg_zerocopy (receiver: `read` into /dev/null) with both ends
pinned to the same CPU and to two different CPUs, it prints Gbit/s and CPU seconds per GiB:

- process view: each worker's own user+system time (rusage of its transfer thread);
- host view: busy CPU time of the machine over the transfer (/proc/stat, softirq included), per side
  on the CPU that side is pinned to (in the same-CPU layout both sides share one CPU, so only "used"
  is shown), on the pinned CPUs together ("used") and on all CPUs ("all", which on a shared machine
  includes everyone else);

each also in units of one memcpy of the data (`zcorch worker calibrate` on CPU 0 of this machine).
The physics check: the busy time of the CPUs used cannot exceed (number of CPUs used) x wall time
(pinned to one CPU: 1 x wall), and the whole machine's cannot exceed (all CPUs) x wall; /proc/stat
counts whole ticks, so each bound gets one tick per CPU and field of slack. Every configuration runs
once per repetition, repetitions interleaved; medians are printed. The workers run as the controller
runs them (`python3 -m zcorch.worker` subprocesses).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from zcorch.params import HOST_CPU_FIELDS  # noqa: E402
from zcorch.units import format_size, parse_size  # noqa: E402
from _loopback import ENV, host_busy_s, host_event, transfer, worker  # noqa: E402

GIB = 2**30
MODES = [("write", "mem"), ("sendfile", "file"), ("splice", "file"), ("vmsplice", "mem"), ("msg_zerocopy", "mem")]
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def calibrate() -> float:
    p = subprocess.run(worker("calibrate", "--cpu", "0"), capture_output=True, text=True, env=ENV, timeout=300)
    event = json.loads(p.stdout.splitlines()[-1])
    if event.get("event") != "calibration":
        raise RuntimeError(f"calibrate: {event}")
    return float(event["memcpy_s_per_gib"])


def run_pair(mode: str, source: str, nbytes: int, buffer: int, cpus: "tuple[int, int]", recv_mode: str,
             timeout: float) -> dict:
    common = ["--bytes", str(nbytes), "--buffer", str(buffer)]
    s, r = transfer(["--mode", mode, "--source", source, "--cpu", str(cpus[0]), *common],
                    ["--mode", recv_mode, "--cpu", str(cpus[1]), *common], timeout)
    gib = r["bytes"] / GIB
    used = set(cpus)
    # One machine: both workers read one /proc/stat; the receiver's window ends last (the data landed).
    window = max(s["host_window_ns"], r["host_window_ns"]) / 1e9
    host = host_event(s, r)
    return {"gbps": r["bytes"] * 8 / r["wall_ns"],
            "proc_send": (s["utime_us"] + s["stime_us"]) / 1e6 / gib,
            "proc_recv": (r["utime_us"] + r["stime_us"]) / 1e6 / gib,
            "host_send": host_busy_s(host, {cpus[0]}) / gib, "host_recv": host_busy_s(host, {cpus[1]}) / gib,
            "host_used": host_busy_s(host, used) / gib, "host_all": host_busy_s(host) / gib,
            "wall": window / gib, "n_used": len(used), "n_all": host["host_ncpus"],
            "used_ok": host_busy_s(host, used) <= len(used) * (window + len(HOST_CPU_FIELDS) * TICK_S),
            "all_ok": host_busy_s(host) <= host["host_ncpus"] * (window + len(HOST_CPU_FIELDS) * TICK_S)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", default="1GiB")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--buffer", default="128KiB")
    ap.add_argument("--recv-mode", default="read", help="receive mode (default read; try discard)")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args()
    nbytes, buffer = parse_size(args.bytes), parse_size(args.buffer)
    ncpu = len(os.sched_getaffinity(0))
    layouts = [("same CPU", (0, 0))] + ([("two CPUs", (0, 1))] if ncpu > 1 else [])
    copy = calibrate()
    print(f"loopback, {format_size(nbytes)} per run, buffer {format_size(buffer)}, receiver {args.recv_mode}, "
          f"{args.reps} interleaved repetitions (medians); one memcpy of a GiB here: {copy:.4f} s (CPU 0)")
    with tempfile.TemporaryDirectory(prefix="zcorch-bench-cpu-") as tmp:
        src = os.path.join(tmp, "src")
        with open(src, "wb") as f:  # in the page cache for the file modes
            chunk = os.urandom(1 << 20)
            for _ in range(0, nbytes, len(chunk)):
                f.write(chunk)
        results: "dict[tuple, list]" = {}
        for _ in range(args.reps):
            for lname, cpus in layouts:
                for mode, source in MODES:
                    r = run_pair(mode, src if source == "file" else "mem", nbytes, buffer, cpus, args.recv_mode,
                                 args.timeout)
                    results.setdefault((lname, mode), []).append(r)
    head = (f"{'layout':<9} {'send mode':<13} {'Gbit/s':>7}  {'process send':>13} {'process recv':>13} "
            f"{'host send CPU':>13} {'host recv CPU':>13} {'host (used CPUs)':>17} {'host (all CPUs)':>16} "
            f"{'wall':>6}  bound")
    print(head)
    print("-" * len(head))
    every_bound = True
    for (lname, mode), runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("gbps", "proc_send", "proc_recv", "host_send",
                                                                   "host_recv", "host_used", "host_all", "wall")}
        ok = all(r["used_ok"] and r["all_ok"] for r in runs)
        every_bound &= ok
        n_used = runs[0]["n_used"]

        def cell(v: float) -> str:
            return f"{v:.3f} ({v / copy:4.1f}x)"

        # same CPU: the host view cannot tell the sides apart (one CPU runs both and their softirqs)
        sides = ((cell(med["host_send"]), cell(med["host_recv"])) if n_used > 1 else ("(shared)", "(shared)"))
        print(f"{lname:<9} {mode:<13} {med['gbps']:>7.2f}  {cell(med['proc_send']):>13} {cell(med['proc_recv']):>13} "
              f"{sides[0]:>13} {sides[1]:>13} {cell(med['host_used']):>17} {cell(med['host_all']):>16} "
              f"{med['wall']:>6.3f}  "
              f"{'holds' if ok else 'VIOLATED'} (used {med['host_used'] / med['wall']:.2f} of {n_used} CPU"
              f"{'s' if n_used > 1 else ''})")
    print("CPU in seconds per GiB (in units of one memcpy of the data); wall = the transfer's wall time per GiB; "
          f"host figures are whole /proc/stat ticks: {TICK_S / (nbytes / GIB):.3f} s/GiB per tick at this size.")
    print("bound: busy on the CPUs used <= CPUs used x wall, and on all CPUs <= all CPUs x wall (one tick of slack "
          f"per CPU and field): {'holds everywhere' if every_bound else 'VIOLATED somewhere'}")
    return 0 if every_bound else 1


if __name__ == "__main__":
    sys.exit(main())
