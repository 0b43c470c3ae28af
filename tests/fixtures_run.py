"""Helpers for the run-stage tests: real workers on localhost, tagged so scans find only ours."""
import os
import signal
import sys
import time
import uuid

import pytest

from zcorch.hosts import LocalHost
from zcorch.results import ResultSet
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
