"""Helpers for the run-stage tests: real workers on localhost, tagged so scans find only ours."""
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from zcorch.hosts.local import LocalHost
from zcorch.results.store import ResultSet, read_jsonl
from zcorch.sweep.runner import Runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = [sys.executable, "-m", "zcorch.worker"]
TAG_VAR = "ZCORCH_TEST_TAG"  # inherited by every worker this test starts; other helpers' workers lack it


def base_params(**overrides):
    from zcorch.config.experiment import DEFAULTS

    p = dict(DEFAULTS)
    p.update(bytes=1 << 20, buffer=64 * 1024, timeout=10.0)
    p.update(overrides)
    return p


def tagged_pids(tag, wanted):
    """Pids of live processes whose environment carries our tag and whose argv (a list of bytes) is `wanted`."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if not wanted(f.read().split(b"\0")):
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


def tagged_worker_pids(tag):
    """Pids of live zcorch.worker processes whose environment carries our tag."""
    return tagged_pids(tag, lambda argv: any(b"zcorch.worker" in a for a in argv))


def poll_until_empty(probe, within, interval=0.1):
    """Call probe() until it returns nothing or `within` s have passed; return its last answer."""
    deadline = time.monotonic() + within
    while True:
        left = probe()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(interval)


def wait_no_workers(tag, within=0.0):
    return poll_until_empty(lambda: tagged_worker_pids(tag), within)


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


_STARTED: list = []   # every controller start_zcorch started (stop_left_controllers ends what a test left)


def start_zcorch(tag, *args):
    env = dict(os.environ, PYTHONPATH=REPO, **{TAG_VAR: tag})
    p = subprocess.Popen([sys.executable, "-m", "zcorch", *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    _STARTED.append(p)
    return p


@pytest.fixture(autouse=True)
def stop_left_controllers():
    """A controller a failed test left running (it did not exit when the test expected) would hold the lab's
    leases and workers and fail every later test: its Python stack goes to the report (py-spy, which says
    where it hung), then SIGTERM (its own teardown), then SIGKILL."""
    yield
    left = [p for p in _STARTED if p.poll() is None]
    _STARTED.clear()
    for p in left:
        spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
        if os.path.exists(spy):
            dump = subprocess.run([spy, "dump", "--pid", str(p.pid)], capture_output=True, text=True, timeout=60)
            sys.stderr.write(f"controller {p.pid} left running by the test:\n{dump.stdout}{dump.stderr}\n")
        p.terminate()
        try:
            p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()


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
            try:  # a served run (zcorch.worker.serve) names itself zcorch-recv / zcorch-send; its server
                with open(f"/proc/{pid}/comm", "rb") as f:   # keeps the interpreter's name
                    comm = f.read().strip()
            except OSError:
                continue
            if comm in (b"zcorch-recv", b"zcorch-send"):
                roles[comm[len(b"zcorch-"):]] = pid
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


# -- another user -------------------------------------------------------------------------------

class OtherUser:
    """A throwaway user (useradd) with its home under `base` (a 0755 directory in /tmp)."""

    def __init__(self, name: str, base: str):
        import pwd

        self.name, self.base = name, base
        entry = pwd.getpwnam(name)
        self.uid, self.home = entry.pw_uid, entry.pw_dir

    def zcorch(self, tag, *args, timeout=300):
        """`zcorch ARGS` run as this user (runuser), with this interpreter and the checkout on PYTHONPATH.

        The interpreter may live under a directory the user cannot enter (a pyenv build in /root, 0700,
        with an absolute RUNPATH to its libpython, so neither a copy elsewhere nor /usr/bin/python3 -
        which lacks numpy/pandas/paramiko here - would do). Then the command runs in a private mount
        namespace where that directory is a 0755 tmpfs holding only the interpreter's tree (bind-mounted
        at its own path): the user sees the same interpreter, nothing else of the blocked directory.
        """
        exe = sys.executable
        env = {"HOME": self.home, "PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": REPO, TAG_VAR: tag,
               "LANG": "C.UTF-8"}
        inner = ["runuser", "-u", self.name, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()],
                 exe, "-m", "zcorch", *map(str, args)]
        # A venv's python is a symlink to the base interpreter, which may be the closed one (CI's .venv).
        real = os.path.realpath(exe)
        blocked = sorted(set(_blocked_ancestors(exe)) | set(_blocked_ancestors(real)))
        if not blocked:
            cmd = inner
        else:
            if len(blocked) > 1:
                pytest.skip(f"{exe}: more than one directory on its path is closed to other users ({blocked})")
            closed = blocked[0]
            keep = os.path.join(closed, os.path.relpath(real, closed).split(os.sep)[0])
            stage = os.path.join(self.base, "stage")
            os.makedirs(stage, exist_ok=True)
            script = ('set -e; mount --bind "$1" "$2"; mount -t tmpfs -o mode=0755,size=1m zcorch-test "$3"; '
                      'mkdir "$1"; mount --bind "$2" "$1"; shift 3; exec "$@"')
            cmd = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", keep, stage,
                   closed, *inner]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.base)


def _blocked_ancestors(path: str) -> list:
    """Directories on `path` that a user who is neither owner nor in the group cannot enter (no o+x)."""
    out, d = [], os.path.dirname(path)
    while True:
        if not os.stat(d).st_mode & 0o001:
            out.append(d)
        if d == "/":
            return out[::-1]
        d = os.path.dirname(d)


@pytest.fixture
def other_user():
    """A throwaway non-root user (removed afterwards, with its home). Skips unless root."""
    import shutil
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("needs root: creates a throwaway user with useradd and runs zcorch as it with runuser")
    for tool in ("useradd", "userdel", "runuser", "unshare"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed")
    if not all(os.stat(d).st_mode & 0o005 == 0o005 for d in (REPO, os.path.join(REPO, "zcorch"))):
        pytest.skip(f"{REPO} is not readable by other users")
    base = tempfile.mkdtemp(prefix="zcorch-user-", dir="/tmp")
    os.chmod(base, 0o755)
    name = f"zct{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--create-home", "--home-dir", os.path.join(base, "home"), "--shell", "/bin/sh",
                    "--user-group", name], check=True, capture_output=True)
    try:
        yield OtherUser(name, base)
    finally:
        subprocess.run(["userdel", "--remove", name], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


WATCHDOG_MARKER = b"zcorch/worker/watchdog.py"


def kill_watchdogs(pids, marker: str = "") -> list:
    """SIGKILL the host watchdogs (zcorch.worker.watchdog) among `pids` whose command line holds `marker` (an
    undo path): a host whose watchdog died too (the OOM killer, a reboot's race), so that what a killed
    controller leaves stays for the stale cleanup the test is about. Returns the pids killed."""
    killed = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if WATCHDOG_MARKER in cmd and marker.encode() in cmd:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    return killed


def all_pids() -> list:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]
