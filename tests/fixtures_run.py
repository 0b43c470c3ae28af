"""Helpers for the run-stage tests: real workers on localhost, tagged so scans find only ours."""
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from zcorch.hosts import LocalHost
from zcorch.results import ResultSet, read_jsonl
from zcorch.runner import Runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = [sys.executable, "-m", "zcorch.worker"]
TAG_VAR = "ZCORCH_TEST_TAG"  # inherited by every worker this test starts; other helpers' workers lack it


def base_params(**overrides):
    from zcorch.spec import DEFAULTS

    p = dict(DEFAULTS)
    p.update(bytes=1 << 20, buffer=64 * 1024, timeout=10.0)
    p.update(overrides)
    return p


def tagged_worker_pids(tag):
    """Pids of live zcorch.worker processes whose environment carries our tag."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"zcorch.worker" not in f.read():
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # a zombie is dead, only not yet reaped by its parent
        except OSError:
            continue
        if f"{TAG_VAR}={tag}".encode() in env:
            pids.append(int(pid))
    return pids


def wait_no_workers(tag, within=0.0):
    deadline = time.monotonic() + within
    while True:
        left = tagged_worker_pids(tag)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


@pytest.fixture
def tag():
    t = uuid.uuid4().hex
    yield t
    left = tagged_worker_pids(t)
    for pid in left:  # don't let a failed test leak workers into the next one
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"zcorch workers left running: {left}"


def new_resultset(path, plan_runs=()):
    return ResultSet.create(str(path), name="t", experiment_bytes=b"name: t\n", plan_runs=list(plan_runs),
                            command=["pytest"], accept_new_host_keys=False, zcorch_version="test",
                            git_revision=None)


def local_runner(rs, tag, **kw):
    host = LocalHost()
    env = {"PYTHONPATH": REPO, TAG_VAR: tag}
    return Runner(host, host, WORKER, WORKER, rs, worker_env={"sender": env, "receiver": env}, **kw)


# -- `zcorch run` as a subprocess ---------------------------------------------------------------

def zcorch(tag, *args, **kw):
    """`zcorch ARGS` to completion; env= adds variables to ours."""
    env = dict(os.environ, PYTHONPATH=REPO, **{TAG_VAR: tag}, **kw.pop("env", {}))
    return subprocess.run([sys.executable, "-m", "zcorch", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=kw.pop("timeout", 120), cwd=kw.pop("cwd", REPO), **kw)


def start_zcorch(tag, *args):
    env = dict(os.environ, PYTHONPATH=REPO, **{TAG_VAR: tag})
    return subprocess.Popen([sys.executable, "-m", "zcorch", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)


def wait_records(path, n, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(read_jsonl(str(path))) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path}: fewer than {n} records after {timeout}s")


def worker_pair(list_pids, timeout=20):
    """(receiver pid, sender pid) of one run in progress among list_pids(), found by command line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        roles = {}
        for pid in list_pids():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            roles[b"recv" if b"recv" in argv else b"send"] = pid
        if len(roles) == 2:
            return roles[b"recv"], roles[b"send"]
        time.sleep(0.01)
    raise AssertionError("no run in progress")


def stall_a_run(list_pids):
    """SIGSTOP the receiver of a run in progress, so the transfer cannot end by itself: the sender
    blocks on a full socket, the receiver does nothing at all. Returns (receiver pid, sender pid).
    list_pids() lists the worker pids to look at (every lab host shares our pid namespace)."""
    for _ in range(20):
        rx, tx = worker_pair(list_pids)
        try:
            os.kill(rx, signal.SIGSTOP)
        except ProcessLookupError:
            continue
        time.sleep(0.3)
        if all(os.path.exists(f"/proc/{pid}") for pid in (rx, tx)):
            return rx, tx
        os.kill(rx, signal.SIGCONT)  # that run finished before the stop took hold: try the next
    raise AssertionError("could not stall a run")
