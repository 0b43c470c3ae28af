"""FilesystemManager on the lab's receiver over real SSH (its own mount namespace and home)."""
from __future__ import annotations

import signal
import subprocess

import pytest

from fixtures_fs import SMALL_CONFIGS, host_state, start_provisioner, write_sink
from fixtures_run import kill_watchdogs
from zcorch.config.filesystems import filesystems_from_mapping
from zcorch.provision.filesystems import FilesystemManager

pytestmark = [pytest.mark.lab, pytest.mark.root, pytest.mark.timeout(300)]
CONFIGS = {"ext4-nodelalloc": SMALL_CONFIGS["ext4-nodelalloc"], "btrfs-raid0": SMALL_CONFIGS["btrfs-raid0"]}
STATE_DIR = "~/.cache/zcorch/fs"


@pytest.fixture
def receiver(lab):
    h = lab.connect("receiver")
    yield h
    h.close()


def test_provision_write_describe_and_restore_over_ssh(receiver, lab):
    before = host_state(receiver)
    log: list = []
    fm = FilesystemManager(receiver, filesystems_from_mapping(CONFIGS), STATE_DIR, log=log.append)
    assert fm.preflight() == []
    try:
        for name in CONFIGS:
            mnt = fm.ensure(name)
            # `~` was expanded on the receiver: its private home, not the controller's.
            assert mnt.startswith("/root/.cache/zcorch/fs/fs-")
            src, sink = write_sink(receiver, mnt)
            assert src == sink
            # The mount lives in the receiver's mount namespace only.
            assert lab.run_in("receiver", ["findmnt", "--mountpoint", mnt]).returncode == 0
            assert receiver.run(["findmnt", "--mountpoint", mnt]).ok
            assert subprocess.run(["findmnt", "--mountpoint", mnt], capture_output=True).returncode != 0
        ext4, btrfs = fm.describe("ext4-nodelalloc"), fm.describe("btrfs-raid0")
        assert "nodelalloc" in ext4["mount_options"] and ext4["fstype"] == "ext4"
        assert btrfs["raid_kernel"]["data"] == "raid0" and len(btrfs["devices"]) == 2
    finally:
        fm.teardown_all()
    after = host_state(receiver)
    # loop devices are machine-wide: one another process made meanwhile is not this manager's leftover (its
    # own are under its session directory, fs-<token>); its mounts and md arrays are compared whole
    ours = f"fs-{fm.token}"
    assert [x for x in after["loops"] if ours in x] == [] and after["mounts"] == before["mounts"], after
    assert {k: v for k, v in after.items() if k not in ("loops", "mounts")} == {
        k: v for k, v in before.items() if k not in ("loops", "mounts")}
    assert all(line.startswith("[receiver] ") for line in log)


def test_cleanup_stale_over_ssh_after_a_sigkilled_controller(receiver, lab):
    before = host_state(receiver)
    proc = start_provisioner(CONFIGS, STATE_DIR, "", lab.hosts_spec)
    try:
        lines = [proc.stdout.readline().strip() for _ in range(3)]
        assert lines[-1] == "ready", proc.stderr.read()
        assert receiver.run(["findmnt", "--mountpoint", lines[0]]).ok
        assert len(kill_watchdogs(lab.pids_in("receiver"))) == 1   # else it undoes all at once: left for cleanup
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert host_state(receiver) != before
    undone = FilesystemManager.cleanup_stale(receiver, STATE_DIR)
    assert sum(u.startswith("unmounted ") for u in undone) == 2
    assert host_state(receiver) == before
    assert FilesystemManager.cleanup_stale(receiver, STATE_DIR) == []
