"""One worker transfer over loopback, as the controller runs it (`python3 -m zcorch.worker` subprocesses):
the helper the loopback benchmarks share."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import List, Set, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


def worker(*args: str) -> List[str]:
    return [sys.executable, "-m", "zcorch.worker", *args]


def transfer(send: List[str], recv: List[str], timeout: float) -> Tuple[dict, dict]:
    """(sender's result event, receiver's) of one transfer: a receiver on 127.0.0.1:0 with `recv` flags, a
    sender with `send` flags; RuntimeError with the worker's message when either side failed."""
    deadline = ["--timeout", f"{timeout}s"]
    rx = subprocess.Popen(worker("recv", "--listen", "127.0.0.1:0", *deadline, *recv),
                          stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        ready = json.loads(rx.stdout.readline())
        if ready.get("event") != "ready":
            raise RuntimeError(f"receiver: {ready}")
        tx = subprocess.run(worker("send", "--connect", f"127.0.0.1:{ready['port']}", *deadline, *send),
                            capture_output=True, text=True, env=ENV, timeout=timeout + 10)
        r = json.loads(rx.stdout.readline())
        s = json.loads(tx.stdout.splitlines()[-1])
    finally:
        rx.kill()
        rx.wait()
    for ev in (s, r):
        if ev["event"] != "result":
            raise RuntimeError(ev["message"])
    return s, r


def host_busy_s(event: dict, cpus: "Set[int] | None" = None) -> float:
    """Busy CPU seconds (/proc/stat, softirq included) of a worker's host window, on `cpus` or on all CPUs.
    `host_per_cpu_us` lists [user, nice, system, irq, softirq, iowait, steal, idle] per CPU."""
    from zcorch.params import HOST_BUSY_FIELDS, HOST_CPU_FIELDS
    if cpus is None:
        return sum(event[f"host_{f}_us"] for f in HOST_BUSY_FIELDS) / 1e6
    idx = [HOST_CPU_FIELDS.index(f) for f in HOST_BUSY_FIELDS]
    return sum(v[i] for name, v in event["host_per_cpu_us"].items() if int(name[3:]) in cpus for i in idx) / 1e6


def host_event(s: dict, r: dict) -> dict:
    """Of one machine's two workers, the event whose /proc/stat window is the longer (the receiver's ends last:
    the data landed)."""
    return r if r["host_window_ns"] >= s["host_window_ns"] else s
