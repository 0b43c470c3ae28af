"""Helpers for the filesystem tests: small real configurations, loop devices made outside the manager,
a host-state snapshot for before/after comparisons, and a sink written the way a receiver cell writes it."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from typing import Iterator, Optional

import pytest

from zcorch.provision.fs_probe import snapshot
from zcorch.hosts.local import Host

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The four configurations of the issue, at the smallest sizes the mkfs tools accept (sparse files).
# xfs: 300MiB is the minimum; with su=64k,sw=4 mkfs.xfs wants a 64MB log, which needs ~520MiB.
SMALL_CONFIGS = {
    "ext4-loop": {"fs": "ext4", "loop": {"count": 1, "size": "32MiB"}, "mount_options": ["noatime"]},
    "ext4-nodelalloc": {"fs": "ext4", "loop": {"count": 1, "size": "32MiB"},
                        "mount_options": ["noatime", "nodelalloc"]},
    "xfs-stripe": {"fs": "xfs", "loop": {"count": 1, "size": "520MiB"}, "mkfs_options": ["-d", "su=64k,sw=4"]},
    "btrfs-raid0": {"fs": "btrfs", "raid": "raid0", "loop": {"count": 2, "size": "128MiB"}},
}


def host_state(host: Host) -> dict:
    """`losetup -a`, `findmnt -rn`, /proc/mdstat - minus network-namespace handles, which the lab
    helpers create and remove concurrently on this shared machine and which no filesystem code touches."""
    snap = snapshot(host)
    snap["mounts"] = [m for m in snap["mounts"] if " nsfs " not in m]
    return snap


def _run(argv) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def external_loop(directory: str, size: str = "32MiB", mkfs: Optional[str] = None) -> Iterator[str]:
    """A loop device the test makes itself (not the manager), optionally with a filesystem on it."""
    backing = os.path.join(directory, f"external-{os.getpid()}-{len(os.listdir(directory))}.img")
    _run(["truncate", "-s", size, backing])
    dev = _run(["losetup", "--find", "--show", backing])
    try:
        if mkfs:
            _run([f"mkfs.{mkfs}", "-q", "-F", dev] if mkfs.startswith("ext") else [f"mkfs.{mkfs}", "-q", "-f", dev])
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)
        os.unlink(backing)


@contextlib.contextmanager
def mounted(dev: str, directory: str) -> Iterator[str]:
    mnt = os.path.join(directory, "external-mnt")
    os.makedirs(mnt, exist_ok=True)
    _run(["mount", dev, mnt])
    try:
        yield mnt
    finally:
        subprocess.run(["umount", mnt], check=False)


@contextlib.contextmanager
def small_tmpfs(directory, size: str, name: str, lazy_umount: bool = False) -> Iterator[str]:
    """A tmpfs of `size` mounted on `directory` (made here) for a test that fills a filesystem (root only:
    skips otherwise). lazy_umount: detach even while a worker's mapping may still hold it (and do not fail)."""
    if os.geteuid() != 0:
        pytest.skip(f"needs root: mounts a {size} tmpfs")
    os.mkdir(directory)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", name, str(directory)], check=True)
    try:
        yield directory
    finally:
        subprocess.run(["umount", *(["-l"] if lazy_umount else []), str(directory)], check=not lazy_umount)


def fs_uuid(dev: str) -> str:
    return _run(["blkid", "-p", "-s", "UUID", "-o", "value", dev])


def write_sink(host: Host, mountpoint: str, mib: int = 8) -> "tuple[str, str]":
    """Write a random sink file onto the filesystem with dd (fsync'd), as a receiver cell does; return
    the sha256 of the source and of the sink."""
    src = f"/tmp/zcorch-fs-src-{os.getpid()}.bin"
    sink = f"{mountpoint}/recv.dat"
    for argv in (["dd", "if=/dev/urandom", f"of={src}", "bs=1M", f"count={mib}", "status=none"],
                 ["dd", f"if={src}", f"of={sink}", "bs=1M", "conv=fsync", "status=none"]):
        res = host.run(argv, timeout=120)
        assert res.ok, res.stderr
    sums = host.run(["sha256sum", src, sink]).stdout.split()
    host.run(["rm", "-f", src])
    return sums[0], sums[2]


PROVISIONER = r"""
import json, os, signal, sys, time
from zcorch.config.filesystems import filesystems_from_mapping
from zcorch.provision.filesystems import FilesystemManager
configs, state_dir, kill_at, hosts_spec = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
if hosts_spec:
    from zcorch.config.hosts import Hosts
    from zcorch.hosts.ssh import connect
    host = connect(Hosts.from_mapping(hosts_spec).spec("receiver"), "receiver")
else:
    from zcorch.hosts.local import LocalHost
    host = LocalHost()
def log(msg):
    # A real SIGKILL of this process at a chosen step (the message is logged just before it runs).
    # A step of zcorch.worker.remote (mount-beneath: the mount) is named by its action.
    if kill_at and (msg.startswith("[" + host.name + "] " + kill_at + " ")
                    or kill_at == "mount-beneath" and " mount-beneath " in msg):
        # its host's watchdog dies first (else it undoes everything at once): left for the stale cleanup
        fm._watchdog.proc.kill_group()
        os.kill(os.getpid(), signal.SIGKILL)
fm = FilesystemManager(host, filesystems_from_mapping(configs), state_dir, log=log)
for name in configs:
    print(fm.ensure(name), flush=True)
print("ready", flush=True)
time.sleep(600)
"""


def start_provisioner(configs: dict, state_dir: str, kill_at: str = "",
                      hosts_spec: Optional[dict] = None) -> subprocess.Popen:
    """A separate controller process that provisions `configs` (over SSH if hosts_spec is given) and
    then waits to be killed - or kills itself with SIGKILL just before the step `kill_at`."""
    import json

    return subprocess.Popen([sys.executable, "-c", PROVISIONER, json.dumps(configs), state_dir, kill_at,
                             json.dumps(hosts_spec or {})],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def fs_state_dir(tmp_path) -> str:
    d = tmp_path / "state"
    return str(d)


def worker_sink(host: Host, mountpoint: str, source: str, nbytes: int, recv_mode: str,
                sink_state: str = "fresh") -> "tuple[dict, dict]":
    """One real cell on loopback: `zcorch.worker recv` writes `<mountpoint>/recv.dat` from a
    `zcorch.worker send` of `source`. Returns (send result, recv result) JSON events."""
    import json

    worker = [sys.executable, "-m", "zcorch.worker"]
    sink = f"{mountpoint}/recv.dat"
    recv = host.start(worker + ["recv", "--listen", "127.0.0.1:0", "--mode", recv_mode, "--bytes", str(nbytes),
                                "--sink", sink, "--sink-state", sink_state, "--fsync", "--timeout", "60"],
                      env={"PYTHONPATH": REPO})
    try:
        ready = json.loads(recv.readline(timeout=30) or "{}")
        assert ready.get("event") == "ready", (ready, recv.stderr_text())
        send = subprocess.run(worker + ["send", "--connect", f"127.0.0.1:{ready['port']}", "--mode", "sendfile",
                                        "--bytes", str(nbytes), "--source", source, "--timeout", "60"],
                              cwd=REPO, capture_output=True, text=True, timeout=90)
        assert send.returncode == 0, send.stdout + send.stderr
        sent = json.loads(send.stdout.splitlines()[-1])
        lines = list(recv.lines(timeout=60))
        assert recv.wait(timeout=30) == 0, (lines, recv.stderr_text())
        got = json.loads(lines[-1])
        assert got["event"] == "result", got
        return sent, got
    finally:
        recv.kill_group()


def fill_disk(directory: str) -> str:
    """Write `directory`/zc-filler until its filesystem is full (a real ENOSPC); returns the file's path."""
    path = os.path.join(directory, "zc-filler")
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return path
