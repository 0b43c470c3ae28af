"""Loopback throughput and CPU cost of every worker mode, against iperf3 measured in the same run.

    python3 benchmarks/bench_modes.py [--bytes 2GiB] [--reps 5] [--buffer 128KiB] [--window auto]

Send modes are measured with receiver `read` into /dev/null; receive modes with sender
`sendfile` from a cached file (sink /dev/null where the mode allows, a file in /tmp for `mmap`), and
`zerocopy_recv` also behind `msg_zerocopy` (over loopback only a zero-copy sender's pages can be
mapped). `write`/`read` over 4 parallel streams (--streams 4) and `io_uring` both ways are in the same
run. Modes this kernel or build cannot run are left out, with the reason. iperf3 runs with the same
chunk size (-l) and window (-w), plain and with -Z (sendfile).
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

from zcorch.units import format_size, parse_size  # noqa: E402
from _loopback import transfer  # noqa: E402

GIB = 2**30


def unavailable() -> "dict[str, dict[str, str]]":
    p = subprocess.run(worker("info"), capture_output=True, text=True, env=ENV, check=True)
    return json.loads(p.stdout.splitlines()[-1])["unavailable"]


def run_pair(send: "list[str]", recv: "list[str]", timeout: float) -> "dict[str, float]":
    s, r = transfer(send, recv, timeout)
    gib = r["bytes"] / GIB
    out = {"gbps": r["bytes"] * 8 / r["wall_ns"],
           "send_cpu": (s["utime_us"] + s["stime_us"]) / 1e6 / gib,
           "recv_cpu": (r["utime_us"] + r["stime_us"]) / 1e6 / gib}
    if s.get("zc_completions"):  # share of zero-copy sends the kernel copied after all
        out["zc_copied_share"] = s["zc_copied"] / s["zc_completions"]
    if r.get("zc_recv_mapped") is not None and r["bytes"]:  # share of received bytes mapped, not copied
        out["zc_recv_mapped_share"] = r["zc_recv_mapped"] / r["bytes"]
    return out


def run_iperf3(nbytes: int, buffer: int, window: "int | None", zerocopy: bool, timeout: float,
               parallel: int = 1) -> "dict[str, float]":
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
    args = ap.parse_args()
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
        "send write (mem)": lambda: run_pair(send_cfg("write", "mem"), recv_null, args.timeout),
        "send write (file)": lambda: run_pair(send_cfg("write", src), recv_null, args.timeout),
        "send mmap": lambda: run_pair(send_cfg("mmap", src), recv_null, args.timeout),
        "send sendfile": lambda: run_pair(send_cfg("sendfile", src), recv_null, args.timeout),
        "send splice": lambda: run_pair(send_cfg("splice", src), recv_null, args.timeout),
        "send vmsplice (mem)": lambda: run_pair(send_cfg("vmsplice", "mem"), recv_null, args.timeout),
        "send msg_zerocopy (mem)": lambda: run_pair(send_cfg("msg_zerocopy", "mem"), recv_null, args.timeout),
        "recv read -> /dev/null": lambda: run_pair(send_file, recv_null, args.timeout),
        "recv mmap -> /tmp file": lambda: run_pair(send_file, ["--mode", "mmap", "--sink", sink, *common],
                                                   args.timeout),
        "recv vmsplice -> /dev/null": lambda: run_pair(send_file, ["--mode", "vmsplice", *common], args.timeout),
        "recv splice -> /dev/null": lambda: run_pair(send_file, ["--mode", "splice", *common], args.timeout),
        # the modern paths (issue 14), against write/read of this same run
        "send io_uring (mem)": lambda: run_pair(send_cfg("io_uring", "mem"), recv_null, args.timeout),
        "send io_uring (file)": lambda: run_pair(send_cfg("io_uring", src), recv_null, args.timeout),
        "send io_uring_zc (mem)": lambda: run_pair(send_cfg("io_uring_zc", "mem"), recv_null, args.timeout),
        "send io_uring_zc (file)": lambda: run_pair(send_cfg("io_uring_zc", src), recv_null, args.timeout),
        "recv io_uring -> /dev/null": lambda: run_pair(send_file, ["--mode", "io_uring", *common], args.timeout),
        "recv zerocopy_recv -> /dev/null": lambda: run_pair(send_file, ["--mode", "zerocopy_recv", *common],
                                                            args.timeout),
        "recv zerocopy_recv <- msg_zc": lambda: run_pair(send_cfg("msg_zerocopy", "mem"),
                                                         ["--mode", "zerocopy_recv", *common], args.timeout),
        "io_uring -> io_uring (mem)": lambda: run_pair(send_cfg("io_uring", "mem"), ["--mode", "io_uring", *common],
                                                       args.timeout),
        "write -> read, 4 streams": lambda: run_pair(send_cfg("write", "mem") + ["--streams", "4"],
                                                     recv_null + ["--streams", "4"], args.timeout),
        "iperf3": lambda: run_iperf3(nbytes, buffer, window, False, args.timeout),
        "iperf3 -Z": lambda: run_iperf3(nbytes, buffer, window, True, args.timeout),
        "iperf3 -P 4": lambda: run_iperf3(nbytes, buffer, window, False, args.timeout, parallel=4),
    }
    missing = unavailable()
    for name in list(configs):
        words = name.replace("(", " ").replace("<-", " ").replace("->", " ").split()
        sides = [("send", words[1])] if words[0] == "send" else [("recv", words[1])] if words[0] == "recv" else []
        if name.startswith("recv zerocopy_recv <-"):
            sides.append(("send", "msg_zerocopy"))
        if name.startswith("io_uring ->"):
            sides = [("send", "io_uring"), ("recv", "io_uring")]
        why = next((missing[s].get(m) for s, m in sides if missing.get(s, {}).get(m)), None)
        if why or (args.only and args.only not in name and not name.startswith("iperf3")):
            if why:
                print(f"# left out {name!r}: {why}", file=sys.stderr)
            del configs[name]
    samples: "dict[str, list[dict[str, float]]]" = {k: [] for k in configs}
    try:
        for rep in range(args.reps):
            for name, fn in configs.items():
                samples[name].append(fn())
            print(f"# repetition {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = {k: {m: statistics.median(s[m] for s in v) for m in ("gbps", "send_cpu", "recv_cpu")}
           for k, v in samples.items()}
    print(f"loopback, {format_size(nbytes)} per run, buffer {format_size(buffer)}, window {args.window}, "
          f"median of {args.reps} interleaved repetitions, kernel {os.uname().release}, {os.cpu_count()} CPUs")
    print(f"{'configuration':32s} {'Gbit/s':>8s} {'send CPU-s/GiB':>15s} {'recv CPU-s/GiB':>15s} "
          f"{'min..max Gbit/s':>16s}  zero copy")
    for k, v in med.items():
        lo, hi = min(s["gbps"] for s in samples[k]), max(s["gbps"] for s in samples[k])
        zc = []
        for key, what in (("zc_copied_share", "sends copied"), ("zc_recv_mapped_share", "bytes mapped")):
            vals = [s[key] for s in samples[k] if key in s]
            if vals:
                zc.append(f"{statistics.median(vals):.0%} {what}")
        print(f"{k:32s} {v['gbps']:8.2f} {v['send_cpu']:15.3f} {v['recv_cpu']:15.3f} {lo:7.2f}..{hi:<7.2f}  "
              f"{', '.join(zc)}")
    print()
    for ours, peer in (("send write (mem)", "iperf3"), ("send sendfile", "iperf3 -Z"),
                       ("write -> read, 4 streams", "iperf3 -P 4"), ("send io_uring (mem)", "send write (mem)"),
                       ("send io_uring_zc (mem)", "send msg_zerocopy (mem)"),
                       ("recv io_uring -> /dev/null", "recv read -> /dev/null"),
                       ("recv zerocopy_recv <- msg_zc", "recv read -> /dev/null")):
        if ours in med and peer in med:
            print(f"ratio {ours} / {peer}: throughput {med[ours]['gbps'] / med[peer]['gbps']:.2f}, "
                  f"sender CPU per GiB {med[ours]['send_cpu'] / med[peer]['send_cpu']:.2f}, "
                  f"receiver CPU per GiB {med[ours]['recv_cpu'] / med[peer]['recv_cpu']:.2f} (lower is better)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
