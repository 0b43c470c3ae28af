"""Loopback throughput and CPU cost of every worker mode, against iperf3 measured in the same run.

    python3 benchmarks/bench_modes.py [--bytes 2GiB] [--reps 5] [--buffer 128KiB] [--window auto]

Send modes are measured with receiver `read` into /dev/null; receive modes with sender
`sendfile` from a cached file (sink /dev/null where the mode allows, a file in /tmp for `mmap`), and
`zerocopy_recv` also behind `msg_zerocopy` (over loopback only a zero-copy sender's pages can be
mapped). `io_uring` both ways is in the same run. Modes this kernel or build cannot run are left out, with
the reason. iperf3 runs with the same chunk size (-l) and window (-w), plain and with -Z (sendfile).
`write`/`read` over 4 and 8 parallel streams (--streams N, the worker's default --threads: one thread per
pinned CPU) runs against iperf3 -P N with the same -A, and both again unpinned (`--only streams`: those
alone). --only keeps the configurations whose name holds the text, and the iperf3 runs they are compared with.
The sender is pinned to one CPU and the receiver to another (--pin, default 0,1; iperf3 -A likewise), so
each side has two CPU views: the process view (the worker's own user+system time; iperf3's from its -J
output) and the host view (busy time of that side's CPU from /proc/stat, softirq included: where the
kernel's work for the side lands, whoever's context it ran in; iperf3 has none).
Every configuration runs once per repetition, repetitions interleaved; medians are printed.
The workers run as the controller runs them (`python3 -m zcorch.worker` subprocesses); the
figures are the workers' own (C-timed transfer only); iperf3's are from its -J output.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from zcorch.results.intervals import median_ci  # noqa: E402
from zcorch.units import format_size, parse_size  # noqa: E402
from _loopback import ENV, host_busy_s, host_event, transfer, worker  # noqa: E402

GIB = 2**30


def unavailable() -> "dict[str, dict[str, str]]":
    p = subprocess.run(worker("info"), capture_output=True, text=True, env=ENV, check=True)
    return json.loads(p.stdout.splitlines()[-1])["unavailable"]


def run_pair(send: "list[str]", recv: "list[str]", timeout: float,
             pin: "tuple[int, int] | None") -> "dict[str, float]":
    if pin:
        send, recv = send + ["--cpu", str(pin[0])], recv + ["--cpu", str(pin[1])]
    s, r = transfer(send, recv, timeout)
    gib = r["bytes"] / GIB
    out = {"gbps": r["bytes"] * 8 / r["wall_ns"],
           "send_cpu": (s["utime_us"] + s["stime_us"]) / 1e6 / gib,
           "recv_cpu": (r["utime_us"] + r["stime_us"]) / 1e6 / gib}
    if pin:  # one machine, one /proc/stat: each side's CPU from the window that ends last
        host = host_event(s, r)
        out["send_host"] = host_busy_s(host, {pin[0]}) / gib
        out["recv_host"] = host_busy_s(host, {pin[1]}) / gib
    if s.get("zc_completions"):  # share of zero-copy sends the kernel copied after all
        out["zc_copied_share"] = s["zc_copied"] / s["zc_completions"]
    if r.get("zc_recv_mapped") is not None and r["bytes"]:  # share of received bytes mapped, not copied
        out["zc_recv_mapped_share"] = r["zc_recv_mapped"] / r["bytes"]
    return out


def run_iperf3(nbytes: int, buffer: int, window: "int | None", zerocopy: bool, timeout: float,
               pin: "tuple[int, int] | None", parallel: int = 1) -> "dict[str, float]":
    port = 5201 + os.getpid() % 1000
    srv = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(port), "-B", "127.0.0.1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        cmd = ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-n", str(nbytes), "-l", str(buffer), "-J"]
        if window:
            cmd += ["-w", str(window)]
        if zerocopy:
            cmd.append("-Z")
        if parallel > 1:
            cmd += ["-P", str(parallel)]
        if pin:  # -A n,m: the client on n, the server on m
            cmd += ["-A", f"{pin[0]},{pin[1]}"]
        for _ in range(50):  # the server needs a moment to listen
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            out = json.loads(p.stdout)
            if "error" not in out:
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"iperf3: {out['error']}")
    finally:
        srv.wait(timeout)
    end = out["end"]
    secs = end["sum_received"]["seconds"]
    gib = end["sum_received"]["bytes"] / GIB
    cpu = end["cpu_utilization_percent"]
    return {"gbps": end["sum_received"]["bits_per_second"] / 1e9,
            "send_cpu": cpu["host_total"] / 100 * secs / gib,
            "recv_cpu": cpu["remote_total"] / 100 * secs / gib}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", default="2GiB", help="bytes per run (default 2GiB)")
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions (default 5, median reported)")
    ap.add_argument("--buffer", default="128KiB", help="chunk size, also iperf3 -l (default 128KiB)")
    ap.add_argument("--window", default="auto", help="SO_SNDBUF/SO_RCVBUF, also iperf3 -w (default auto)")
    ap.add_argument("--timeout", type=float, default=120.0, help="per-run timeout in seconds")
    ap.add_argument("--only", default="", help="run only the configurations whose name contains this text")
    ap.add_argument("--pin", default="0,1", help="SEND_CPU,RECV_CPU, or none (default 0,1; the host view "
                                                 "needs the sides on CPUs of their own)")
    args = ap.parse_args()
    pin = None if args.pin == "none" else tuple(int(c) for c in args.pin.split(","))
    if pin is not None and (len(pin) != 2 or pin[0] == pin[1] or not set(pin) <= os.sched_getaffinity(0)):
        print(f"--pin {args.pin}: two different CPUs this process may run on, or none", file=sys.stderr)
        return 2
    nbytes, buffer = parse_size(args.bytes), parse_size(args.buffer)
    window = None if args.window == "auto" else parse_size(args.window)
    if shutil.which("iperf3") is None:
        print("iperf3 not installed (scripts/install-system-deps installs it)", file=sys.stderr)
        return 2

    tmp = tempfile.mkdtemp(prefix="zcorch-bench-")
    src, sink = os.path.join(tmp, "source"), os.path.join(tmp, "sink")
    with open(src, "wb") as fh:  # a non-repeating file, then read once so it is in the page cache
        chunk = os.urandom(2**20)
        for i in range(nbytes // 2**20 + 1):
            fh.write(chunk[i % 997:] + chunk[:i % 997])
    subprocess.run(["cat", src], stdout=subprocess.DEVNULL, check=True)

    common = ["--buffer", str(buffer)] + (["--window", str(window)] if window else [])
    recv_null = ["--mode", "read", "--sink", "/dev/null", *common]
    send_file = ["--mode", "sendfile", "--source", src, "--bytes", str(nbytes), *common]

    def send_cfg(mode: str, source: str) -> "list[str]":
        return ["--mode", mode, "--source", source, "--bytes", str(nbytes), *common]

    configs = {
        "send write (mem)": lambda: run_pair(send_cfg("write", "mem"), recv_null, args.timeout, pin),
        "send write (file)": lambda: run_pair(send_cfg("write", src), recv_null, args.timeout, pin),
        "send mmap": lambda: run_pair(send_cfg("mmap", src), recv_null, args.timeout, pin),
        "send sendfile": lambda: run_pair(send_cfg("sendfile", src), recv_null, args.timeout, pin),
        "send splice": lambda: run_pair(send_cfg("splice", src), recv_null, args.timeout, pin),
        "send vmsplice (mem)": lambda: run_pair(send_cfg("vmsplice", "mem"), recv_null, args.timeout, pin),
        "send msg_zerocopy (mem)": lambda: run_pair(send_cfg("msg_zerocopy", "mem"), recv_null, args.timeout, pin),
        "recv read -> /dev/null": lambda: run_pair(send_file, recv_null, args.timeout, pin),
        "recv mmap -> /tmp file": lambda: run_pair(send_file, ["--mode", "mmap", "--sink", sink, *common],
                                                   args.timeout, pin),
        "recv vmsplice -> /dev/null": lambda: run_pair(send_file, ["--mode", "vmsplice", *common], args.timeout, pin),
        "recv splice -> /dev/null": lambda: run_pair(send_file, ["--mode", "splice", *common], args.timeout, pin),
        # the modern paths, against write/read of this same run
        "send io_uring (mem)": lambda: run_pair(send_cfg("io_uring", "mem"), recv_null, args.timeout, pin),
        "send io_uring (file)": lambda: run_pair(send_cfg("io_uring", src), recv_null, args.timeout, pin),
        "send io_uring_zc (mem)": lambda: run_pair(send_cfg("io_uring_zc", "mem"), recv_null, args.timeout, pin),
        "send io_uring_zc (file)": lambda: run_pair(send_cfg("io_uring_zc", src), recv_null, args.timeout, pin),
        "recv io_uring -> /dev/null": lambda: run_pair(send_file, ["--mode", "io_uring", *common], args.timeout, pin),
        "recv zerocopy_recv -> /dev/null": lambda: run_pair(send_file, ["--mode", "zerocopy_recv", *common],
                                                            args.timeout, pin),
        "recv zerocopy_recv <- msg_zc": lambda: run_pair(send_cfg("msg_zerocopy", "mem"),
                                                         ["--mode", "zerocopy_recv", *common], args.timeout, pin),
        "io_uring -> io_uring (mem)": lambda: run_pair(send_cfg("io_uring", "mem"), ["--mode", "io_uring", *common],
                                                       args.timeout, pin),
        "iperf3": lambda: run_iperf3(nbytes, buffer, window, False, args.timeout, pin),
        "iperf3 -Z": lambda: run_iperf3(nbytes, buffer, window, True, args.timeout, pin),
    }
    # parallel streams: N streams on the pinned CPUs (the worker's default --threads: one thread per
    # side, multiplexing its N sockets) against iperf3 -P N -A with the same CPUs; and both unpinned
    peers = {"send write (mem)": "iperf3", "send sendfile": "iperf3 -Z"}
    for n in (4, 8):
        streams = ["--streams", str(n)]
        for where, cpus in (("", pin), (", unpinned", None)):
            if where and pin is None:
                continue  # --pin none: the first pair is already unpinned
            ours, peer = f"write -> read, {n} streams{where}", f"iperf3 -P {n}{where}"
            configs[ours] = lambda streams=streams, cpus=cpus: run_pair(send_cfg("write", "mem") + streams,
                                                                        recv_null + streams, args.timeout, cpus)
            configs[peer] = lambda n=n, cpus=cpus: run_iperf3(nbytes, buffer, window, False, args.timeout, cpus,
                                                              parallel=n)
            peers[ours] = peer
    missing = unavailable()
    for name in list(configs):
        words = name.replace("(", " ").replace("<-", " ").replace("->", " ").split()
        sides = [("send", words[1])] if words[0] == "send" else [("recv", words[1])] if words[0] == "recv" else []
        if name.startswith("recv zerocopy_recv <-"):
            sides.append(("send", "msg_zerocopy"))
        if name.startswith("io_uring ->"):
            sides = [("send", "io_uring"), ("recv", "io_uring")]
        why = next((missing[s].get(m) for s, m in sides if missing.get(s, {}).get(m)), None)
        if why:
            print(f"# left out {name!r}: {why}", file=sys.stderr)
            del configs[name]
    if args.only:  # the configurations named, and the iperf3 runs they are compared with
        keep = {name for name in configs if args.only in name}
        keep |= {peers[name] for name in keep if name in peers}
        for name in list(configs):
            if name not in keep:
                del configs[name]
    samples: "dict[str, list[dict[str, float]]]" = {k: [] for k in configs}
    try:
        for rep in range(args.reps):
            for name, fn in configs.items():
                samples[name].append(fn())
            print(f"# repetition {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    views = ("gbps", "send_cpu", "recv_cpu", "send_host", "recv_host")
    med = {k: {m: statistics.median(s[m] for s in v) if m in v[0] else None for m in views}
           for k, v in samples.items()}
    pinned = f"sender on CPU {pin[0]}, receiver on CPU {pin[1]}" if pin else "not pinned"
    print(f"loopback, {format_size(nbytes)} per run, buffer {format_size(buffer)}, window {args.window}, {pinned}, "
          f"median of {args.reps} interleaved repetitions, kernel {os.uname().release}, {os.cpu_count()} CPUs")
    tick = 1.0 / os.sysconf("SC_CLK_TCK") / (nbytes / GIB)
    print("CPU in seconds per GiB: process = the side's own user+system time; host = busy time of the side's CPU "
          f"(whole /proc/stat ticks: {tick:.3f} s/GiB per tick at this size; on a shared machine it includes "
          "everyone else on that CPU)")
    print(f"{'configuration':32s} {'Gbit/s':>7s} {'send proc':>9s} {'send host':>9s} {'recv proc':>9s} "
          f"{'recv host':>9s} {'min..max Gbit/s':>16s}  zero copy")

    def cpu(v: "float | None") -> str:
        return "-" if v is None else f"{v:.3f}"

    for k, v in med.items():
        lo, hi = min(s["gbps"] for s in samples[k]), max(s["gbps"] for s in samples[k])
        zc = []
        for key, what in (("zc_copied_share", "sends copied"), ("zc_recv_mapped_share", "bytes mapped")):
            vals = [s[key] for s in samples[k] if key in s]
            if vals:
                zc.append(f"{statistics.median(vals):.0%} {what}")
        print(f"{k:32s} {v['gbps']:7.2f} {cpu(v['send_cpu']):>9s} {cpu(v['send_host']):>9s} "
              f"{cpu(v['recv_cpu']):>9s} {cpu(v['recv_host']):>9s} {lo:7.2f}..{hi:<7.2f}  {', '.join(zc)}")
    print()
    for ours, peer in (*peers.items(), ("send io_uring (mem)", "send write (mem)"),
                       ("send io_uring_zc (mem)", "send msg_zerocopy (mem)"),
                       ("recv io_uring -> /dev/null", "recv read -> /dev/null"),
                       ("recv zerocopy_recv <- msg_zc", "recv read -> /dev/null")):
        if ours in med and peer in med:
            a, b = med[ours], med[peer]
            cpu_ratios = ", ".join(f"{what} {a[key] / b[key]:.2f}" for key, what in (
                ("send_cpu", "sender process"), ("send_host", "sender host"), ("recv_cpu", "receiver process"),
                ("recv_host", "receiver host")) if a[key] is not None and b[key])
            print(f"ratio {ours} / {peer}: throughput {a['gbps'] / b['gbps']:.2f}; CPU per GiB {cpu_ratios} "
                  "(lower is better)")
    # The ratio of two medians moves with the machine's drift between them; each repetition ran both back to
    # back, so the per-repetition ratios share that drift and their median has a distribution-free interval
    # (the order-statistic one zcorch gives a cell's median), at the level it really has.
    print()
    for ours, peer in peers.items():
        if ours not in samples or peer not in samples:
            continue
        parts = []
        for key, what in (("gbps", "throughput"), ("send_cpu", "sender CPU/GiB"), ("recv_cpu", "receiver CPU/GiB")):
            pairs = [x[key] / y[key] for x, y in zip(samples[ours], samples[peer]) if y.get(key)]
            if not pairs:
                continue
            low, high, level = median_ci(pairs)
            where = f" [{low:.2f}, {high:.2f}] at {level:.1%}" if level == level else " (no interval: < 2 pairs)"
            parts.append(f"{what} {statistics.median(pairs):.2f}{where}")
        print(f"paired {ours} / {peer}, median of {len(samples[ours])} per-repetition ratios: {'; '.join(parts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
