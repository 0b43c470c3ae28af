"""Session fixture `lab`: two real SSH hosts (network namespaces + sshd) for the whole test session.

Registered as a plugin in conftest.py, so any test module just names it:

    @pytest.mark.lab
    def test_something(lab):
        hosts = zcorch.hosts.ssh.open_hosts(lab.hosts)
        ...
        assert lab.zcorch_procs("receiver") == []

The lab gets its own name (`pytest<pid>`) and a free index (10.77.N.x / 10.78.N.x), so parallel test
sessions of several engineers do not collide; it is torn down after the session even when tests fail,
and labs left behind by a killed session (its pid is gone) are removed when the next session starts.
Set ZCORCH_TEST_LAB_INDEX to force an index.

Attributes of the yielded `LabHandle`:
    name, index, layout (zcorch.lab.netns.LabLayout), state_dir
    hosts_spec            {"sender": {...}, "receiver": {...}} as in the experiment file (a fresh copy
                          each access: ssh, data_address, identity_file, known_hosts, ssh_config)
    hosts                 the same, validated: zcorch.config.hosts.Hosts (what open_hosts takes;
                          for a changed copy: Hosts.from_mapping(changed hosts_spec))
    sender / receiver     LabHost(role, mgmt, data, ns, home): management/data addresses, netns name,
                          and the controller-side path of the host's private home (bind-mounted at /root)
    ns_sender / ns_receiver   network namespace names
    controller_address    10.77.N.1 (this machine, on the management bridge)
    known_hosts, identity_file, ssh_config   paths of the lab's files
    run_in(host, argv, **kw)  subprocess.run inside the host (its netns *and* sshd's mount namespace,
                          i.e. what an SSH command sees); host = "sender"/"receiver" or a netns name
    pids_in(host)         every pid in the host's netns
    zcorch_procs(host)    pids of zcorch worker processes in the host (assert [] after each scenario)
    connect(role, **kw)   zcorch.hosts.ssh.connect for that role (caller closes it)
    data_interface(role)  name of the host's data-link interface (the one holding its data address)
    rate_limited(role="sender", rate="500mbit")   context manager: the host's data interface shaped
                          with `tc qdisc ... tbf` (a real, identical-parameters slowdown of the sweeps
                          run inside it: data flows sender -> receiver, so the sender's queue limits it)

Session fixture `throttled_nights` (on top of `lab`): three real sweeps of THROTTLED_EXPERIMENT in the lab, the
first two shaped alike to 2 Gbit/s, the third to 500 Mbit/s: same parameters and cell ids, really slower. Run
once for every test that needs a normal-then-throttled pair (tests copy the sets they change or add to).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Sequence

import pytest

from zcorch.config.hosts import Hosts
from zcorch.lab import netns as zlab
from zcorch.errors import LabError

_WORKER_MARKERS = (b"zcorch.worker", b"zcorch\0worker")


@dataclass(frozen=True)
class LabHost:
    role: str
    mgmt: str     # management address (where SSH goes)
    data: str     # data-link address (MTU 9000 veth to the other host)
    ns: str       # network namespace name
    home: str     # controller-side path of the host's /root


class LabHandle:
    def __init__(self, layout: zlab.LabLayout):
        self.layout = layout
        self.name, self.index, self.state_dir = layout.name, layout.index, layout.state_dir
        self.sender = self._host("sender")
        self.receiver = self._host("receiver")
        self.ns_sender, self.ns_receiver = self.sender.ns, self.receiver.ns
        self.controller_address = layout.controller_address
        self.known_hosts, self.identity_file = layout.known_hosts, layout.identity_file
        self.ssh_config = layout.ssh_config

    def _host(self, role: str) -> LabHost:
        return LabHost(role, self.layout.mgmt_address(role), self.layout.data_address(role),
                       self.layout.ns(role), self.layout.home(role))

    @property
    def hosts_spec(self) -> dict:
        return self.layout.hosts_spec()

    @property
    def hosts(self) -> Hosts:
        return self.layout.hosts()

    def _role(self, host: str) -> str:
        for role in zlab.HOSTS:
            if host in (role, self.layout.ns(role)):
                return role
        raise ValueError(f"not a host of lab {self.name}: {host!r}")

    def sshd_pid(self, host: str) -> int:
        pid = zlab._read_pid(self.layout.sshd_pidfile(self._role(host)))
        if not zlab._alive(pid):
            raise RuntimeError(f"sshd of {host} in lab {self.name} is not running")
        return pid

    def run_in(self, host: str, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 60)
        return subprocess.run(["nsenter", "-t", str(self.sshd_pid(host)), "-m", "-n", "--", *argv], **kw)

    def pids_in(self, host: str) -> List[int]:
        return zlab.netns_pids(self.layout.ns(self._role(host)))

    def zcorch_procs(self, host: str, within: float = 0.0) -> List[int]:
        """The zcorch worker processes left in `host`; `within` seconds: the ones still there after waiting
        that long for them to go (a process whose connection was cut ends when sshd notices it: not at once)."""
        deadline = time.monotonic() + within
        while True:
            found = self._zcorch_procs(host)
            if not found or time.monotonic() >= deadline:
                return found
            time.sleep(0.05)

    def _zcorch_procs(self, host: str) -> List[int]:
        found = []
        for pid in self.pids_in(host):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if any(m in cmd for m in _WORKER_MARKERS):
                found.append(pid)
        return found

    def connect(self, role: str, **kw):
        from zcorch.hosts import ssh

        return ssh.connect(self.hosts.spec(role), role, **kw)

    def data_interface(self, role: str) -> str:
        address = self._host(self._role(role)).data
        out = self.run_in(role, ["ip", "-j", "-4", "addr", "show"], check=True).stdout
        for link in json.loads(out):
            if any(a.get("local") == address for a in link.get("addr_info", [])):
                return link["ifname"]
        raise AssertionError(f"no interface with {address} in {role}: {out}")

    @contextlib.contextmanager
    def rate_limited(self, role: str = "sender", rate: str = "500mbit"):
        dev = self.data_interface(role)
        self.run_in(role, ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "256kb",
                           "latency", "50ms"], check=True)
        try:
            yield dev
        finally:
            self.run_in(role, ["tc", "qdisc", "del", "dev", dev, "root"], check=True)


def _pid_alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


# One cleaner at a time: the xdist processes of a run start their labs together, and two `lab down`s of one
# stale lab race (the second finds the state directory half removed).
STALE_LOCK = "/run/lock/zcorch-test-labs.lock" if os.path.isdir("/run/lock") else "/tmp/zcorch-test-labs.lock"


def remove_stale_test_labs() -> None:
    """Labs named pytest<pid> whose session died without teardown (SIGKILL, OOM...)."""
    with open(STALE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _remove_stale_test_labs()


def _remove_stale_test_labs() -> None:
    names = set()
    if os.path.isdir(zlab.STATE_ROOT):
        names |= {n for n in os.listdir(zlab.STATE_ROOT) if re.fullmatch(r"pytest\d+", n)}
    for ns in zlab.list_netns():
        m = re.fullmatch(r"zcorch-(pytest\d+)-(sender|receiver)", ns)
        if m:
            names.add(m.group(1))
    for name in names:
        if not _pid_alive(int(name[len("pytest"):])):
            index = zlab._index_from_state(name, None)
            try:
                zlab.down(zlab.LabLayout(name, index))
            except LabError:
                pass


def start_lab(name: str) -> zlab.LabLayout:
    """Bring up a lab called `name` on the first free index (from the pid, or ZCORCH_TEST_LAB_INDEX)."""
    forced = os.environ.get("ZCORCH_TEST_LAB_INDEX")
    candidates = [int(forced)] if forced else [20 + (os.getpid() + i) % 230 for i in range(40)]
    last = None
    for index in candidates:
        layout = zlab.LabLayout(name, index)
        if zlab._index_owner(layout) not in (None, name):
            continue
        try:
            zlab.up(layout)
            return layout
        except LabError as exc:  # index taken by a parallel session in the meantime, address clash
            last = exc
            if "in use" in str(exc) or "cannot create bridge" in str(exc) or "already exists" in str(exc):
                continue
            raise
    raise LabError(f"no free lab index among {candidates[:3]}...: {last}")


# One worker build for every lab of a machine: each lab host would compile the worker core (seconds of CPU,
# some 16 builds a suite); the first lab deploys it for real and the next labs' hosts start with a copy in
# ~/.cache/zcorch, as hosts deployed before. Tests of the build itself deploy into workdirs of their own.
BUILD_CACHE = "/var/tmp/zcorch-test-worker-builds"   # root's, 0700


def seed_worker_build(layout: zlab.LabLayout) -> None:
    from zcorch.hosts import ssh
    from zcorch.provision import deploy

    name = f"worker-{deploy.content_hash(deploy.worker_sources())}"
    # the hosts' python and cffi too: a build of the same sources for an upgraded python is not this one
    python = subprocess.run(["python3", "-c", "import sys, _cffi_backend as c; print(sys.version, c.__version__)"],
                            capture_output=True, text=True, timeout=60).stdout
    cached = os.path.join(BUILD_CACHE, f"{name}-{hashlib.sha256(python.encode()).hexdigest()[:12]}")
    os.makedirs(BUILD_CACHE, mode=0o700, exist_ok=True)
    with open(os.path.join(BUILD_CACHE, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # another xdist process's lab may be building it, or pruning
        if not os.path.isfile(os.path.join(cached, deploy.MARKER)):
            opened = ssh.open_hosts(layout.hosts())
            try:
                built = deploy.deploy(opened["receiver"]).directory
            finally:
                for host in opened.values():
                    host.close()
            shutil.copytree(os.path.join(layout.home("receiver"), os.path.relpath(built, "/root")), cached,
                            symlinks=True)
        os.utime(cached)
        for old in os.listdir(BUILD_CACHE):   # unused for a day: sources or a python this machine no longer has
            path = os.path.join(BUILD_CACHE, old)
            if old.startswith("worker-") and time.time() - os.stat(path).st_mtime > 86400:
                shutil.rmtree(path, ignore_errors=True)
        for role in zlab.HOSTS:
            workdir = os.path.join(layout.home(role), ".cache", "zcorch")
            if not os.path.exists(os.path.join(workdir, name)):
                os.makedirs(workdir, mode=0o700, exist_ok=True)
                shutil.copytree(cached, os.path.join(workdir, name), symlinks=True)


@pytest.fixture(scope="session")
def lab():
    if os.geteuid() != 0:
        pytest.skip("the lab needs root (network namespaces, sshd)")
    for tool in ("ip", "nsenter", "unshare", "ssh-keygen"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            pytest.skip(f"{tool} not installed (scripts/install-system-deps installs it)")
    if not os.access(zlab.SSHD, os.X_OK):
        pytest.skip("sshd not installed (scripts/install-system-deps installs openssh-server)")
    remove_stale_test_labs()
    name = f"pytest{os.getpid()}"
    layout = start_lab(name)
    try:
        seed_worker_build(layout)
        yield LabHandle(layout)
    finally:
        zlab.down(layout)


# Tiny on purpose: 2 cells x 5 repeats of 32 MiB (5 a side: Mann-Whitney can reach p < 0.05).
THROTTLED_EXPERIMENT = """\
name: history-check
params: {bytes: 32MiB, buffer: 64KiB, timeout: 60s, source: /dev/zero}
matrix:
  send_mode: [write]
  recv_mode: [read, splice]
repeats: 5
baselines: false
"""


@dataclass(frozen=True)
class ThrottledNights:
    alike: "tuple[Path, Path]"   # two sweeps shaped to 2 Gbit/s: unshaped, this machine's throughput follows
                                 # whatever else its two CPUs run, and two sweeps a minute apart can differ
    slowed: Path                 # the same sweep shaped to 500 Mbit/s


@pytest.fixture(scope="session")
def throttled_nights(lab, tmp_path_factory) -> ThrottledNights:
    from conftest import require_tool
    from fixtures_analysis import zcorch_cli

    require_tool("tc")
    base = tmp_path_factory.mktemp("throttled-nights")
    experiment = base / "history-check.yaml"
    experiment.write_text(THROTTLED_EXPERIMENT + lab.layout.hosts_yaml())
    sets = []
    for night, rate in (("night1", "2gbit"), ("night2", "2gbit"), ("night3", "500mbit")):
        with lab.rate_limited("sender", rate):
            res = zcorch_cli("run", experiment, "-o", base / night / "history-check")
        assert res.returncode == 0, res.stderr[-3000:]
        sets.append(base / night / "history-check")
    return ThrottledNights((sets[0], sets[1]), sets[2])
