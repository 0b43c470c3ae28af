"""Helpers for the native worker tests: real files, real loopback sockets, real worker processes."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Optional

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    from zcorch.worker import native
    HAVE_NATIVE = native.lib is not None
except ImportError:  # pragma: no cover
    HAVE_NATIVE = False

needs_native = pytest.mark.skipif(not HAVE_NATIVE, reason="zcorch._native not built: python3 native/build.py --out .")

MEM_PERIOD = 1 << 20
MEM_MULT = 0x9E3779B97F4A7C15


def expected_mem(offset: int, length: int) -> bytes:
    """Source `mem` bytes, computed independently of the C code (spec: native/mempattern.c)."""
    if length == 0:
        return b""
    k0, k1 = offset // 8, (offset + length + 7) // 8
    k = np.arange(k0, k1, dtype=np.uint64) % np.uint64(MEM_PERIOD // 8)
    words = (k + np.uint64(1)) * np.uint64(MEM_MULT)  # wraps modulo 2**64 like the C code
    raw = words.astype("<u8").tobytes()
    start = offset - k0 * 8
    return raw[start:start + length]


def pattern_file(path, size: int, seed: int = 1) -> bytes:
    """A file of non-repeating (pseudo-random) bytes; returns its content."""
    data = random.Random(seed).randbytes(size)
    with open(path, "wb") as fh:
        fh.write(data)
    return data


def run_pair(send_mode: str, recv_mode: str, *, send_kw: Optional[dict] = None, recv_kw: Optional[dict] = None,
             timeout: float = 20) -> "tuple[dict, dict]":
    """One transfer over loopback in this process: receiver in a thread, sender in the caller.

    Both C calls release the GIL. Errors of either side are raised (the sender's first).
    """
    recv_kw = dict(recv_kw or {}, timeout=timeout)
    send_kw = dict(send_kw or {}, timeout=timeout)
    rx = native.Receiver("127.0.0.1", 0, recv_mode, **recv_kw)
    out: "dict[str, Any]" = {}

    def target() -> None:
        try:
            out["result"] = rx.run()
        except BaseException as exc:  # re-raised in the caller
            out["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    try:
        sent = native.send("127.0.0.1", rx.port, send_mode, **send_kw)
    finally:
        t.join(timeout + 5)
        rx.close()
    if "error" in out:
        raise out["error"]
    return sent, out["result"]


def worker_argv(*args: str) -> "list[str]":
    return [sys.executable, "-m", "zcorch.worker", *args]


def worker_env() -> "dict[str, str]":
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_worker(*args: str, timeout: float = 30) -> "tuple[int, list[dict], str]":
    """Run a worker to completion: (exit status, JSON events on stdout, stderr)."""
    p = subprocess.run(worker_argv(*args), cwd=REPO, env=worker_env(), capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, parse_events(p.stdout), p.stderr


def parse_events(stdout: str) -> "list[dict]":
    """Every stdout line must be one JSON object (the contract): fails the test otherwise."""
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


class WorkerProcess:
    """A worker started in the background; stdout lines are collected by a reader thread."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen(worker_argv(*args), cwd=REPO, env=worker_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines: "list[str]" = []
        self._cv = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cv:
                self.lines.append(line)
                self._cv.notify_all()

    def event(self, index: int, timeout: float = 10) -> dict:
        """The index-th JSON event, waiting up to `timeout` s for it."""
        end = time.monotonic() + timeout
        with self._cv:
            while len(self.lines) <= index:
                left = end - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"no event #{index} from {self.proc.args}: {self.lines!r} "
                                         f"stderr={self.proc.stderr.read() if self.proc.poll() is not None else ''}")
                self._cv.wait(min(left, 0.1))
            return json.loads(self.lines[index])

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(5)
        self._reader.join(5)
        for f in (self.proc.stdout, self.proc.stderr):
            f.close()


def wait_until_moving(pid: int, nbytes: int = 8 * 2**20, timeout: float = 15) -> None:
    """Wait until process `pid` has read() `nbytes` (its rchar in /proc/PID/io): the transfer is under way."""
    def rchar() -> int:
        with open(f"/proc/{pid}/io") as fh:
            return int(next(line for line in fh if line.startswith("rchar:")).split()[1])

    base, end = rchar(), time.monotonic() + timeout
    while rchar() - base < nbytes:
        if time.monotonic() > end:
            raise AssertionError(f"process {pid} did not start receiving within {timeout}s")
        time.sleep(0.02)


def start_receiver(*args: str) -> "tuple[WorkerProcess, int]":
    rx = WorkerProcess("recv", *args)
    ready = rx.event(0)
    assert ready["event"] == "ready", ready
    assert ready["pid"] == rx.proc.pid
    return rx, ready["port"]
