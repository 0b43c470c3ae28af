"""One worker transfer over loopback, as the controller runs it (`python3 -m zcorch.worker` subprocesses):
the helper the loopback benchmarks share."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import List, Tuple

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
