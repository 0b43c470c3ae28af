"""Cost of opening a sink and a source the way the worker does now (native/core/openpath.c: openat2 with no
link followed, an O_PATH verdict, fstat + fstatfs, the open beneath the directory) against the way it did
(the name checked first: resolved, its mount looked up in /proc/self/mountinfo, stat for a device; then
open(2) of the name), and a bare open(2) as the peer, interleaved.
A whole loopback run (receiver + sender of 4 KiB into a file sink) is timed too, to put the difference in scale.

    python benchmarks/bench_open.py [--rounds R] [--opens N]
"""
from __future__ import annotations

import argparse
import os
import stat
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from zcorch.worker import native  # noqa: E402

KERNEL_FS = {"proc", "sysfs", "debugfs", "tracefs", "securityfs", "configfs", "cgroup", "cgroup2", "bpf"}


def name_check(path: str, devices: bool) -> None:
    """What the worker did before opening (the former zcorch.worker.paths.check): judge the name."""
    real = os.path.realpath(path)
    best, fstype = "", None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            cols, _, right = line.partition(" - ")
            mnt = cols.split()[4]
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, fstype = mnt, right.split()[0]
    if fstype in KERNEL_FS:
        raise PermissionError(f"{path} is on {fstype}")
    if not devices:
        try:
            st = os.stat(path)
        except OSError:
            return
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            raise PermissionError(f"{path} is a device")


def old_sink(path: str) -> int:
    name_check(path, devices=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)


def new_sink(path: str) -> int:
    fd = native.open_file(path, "sink", create=True)
    os.ftruncate(fd, 0)
    return fd


def old_source(path: str) -> int:
    name_check(path, devices=False)
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def new_source(path: str) -> int:
    return native.open_file(path, "source")


def bare(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CLOEXEC)


def per_open(fn, path: str, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        os.close(fn(path))
    return (time.perf_counter() - t0) / n


def one_run(sink: str) -> float:
    t0 = time.perf_counter()
    rx = native.Receiver("127.0.0.1", 0, "read", sink=sink, bytes=4096, timeout=10)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", rx.run()))
    t.start()
    native.send("127.0.0.1", rx.port, "write", source="mem", bytes=4096, timeout=10)
    t.join()
    rx.close()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--opens", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="zcorch-bench-open-") as d:
        sink = os.path.join(d, "a", "b", "sink")
        os.makedirs(os.path.dirname(sink))
        with open(sink, "wb") as f:
            f.write(b"x" * 4096)
        kinds = {"bare open(2)": bare, "old sink (check name + open)": old_sink, "new sink (openpath.c)": new_sink,
                 "old source": old_source, "new source": new_source}
        times = {k: [] for k in kinds}
        runs = []
        for r in range(args.rounds):
            order = list(kinds) if r % 2 == 0 else list(reversed(kinds))
            for k in order:
                times[k].append(per_open(kinds[k], sink, args.opens))
            runs.append(one_run(sink))
        base = statistics.median(times["bare open(2)"])
        print(f"{args.rounds} interleaved rounds of {args.opens} opens each; medians:")
        for k, v in times.items():
            m = statistics.median(v)
            print(f"  {k:32s} {m * 1e6:8.1f} us   x{m / base:5.2f} of a bare open")
        run = statistics.median(runs)
        saved = statistics.median(times["old sink (check name + open)"]) - statistics.median(times["new sink (openpath.c)"])
        print(f"  whole loopback run (4 KiB)       {run * 1e6:8.1f} us   (old - new sink open = {saved * 1e6:.1f} us, "
              f"{saved / run * 100:+.1f}% of a run)")


if __name__ == "__main__":
    main()
