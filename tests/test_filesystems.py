"""FilesystemManager on this machine as root: real loop devices, mkfs, mounts, SIGKILLed controllers."""
from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess

import pytest

from conftest import require_tool
from fixtures_fs import (SMALL_CONFIGS, external_loop, fs_uuid, host_state, mounted, start_provisioner, worker_sink,
                         write_sink)
from fixtures_run import all_pids, kill_watchdogs
from fixtures_worker import needs_native
from zcorch.config.filesystems import FilesystemConfig, filesystems_from_mapping
from zcorch.errors import HostError
from zcorch.provision.filesystems import FilesystemManager
from zcorch.provision.fs_probe import md_supported
from zcorch.hosts.local import LocalHost

pytestmark = [pytest.mark.root, pytest.mark.timeout(240)]


@pytest.fixture
def host():
    for tool in ("losetup", "mkfs.ext4", "mkfs.xfs", "mkfs.btrfs", "wipefs"):
        require_tool(tool)
    return LocalHost()


@pytest.fixture
def before(host):
    return host_state(host)


def _state_files(state_dir):
    return [f for f in os.listdir(state_dir) if f.startswith("zcorch-fs-state-")] if os.path.isdir(state_dir) else []


def test_four_configurations_carry_a_sink_and_leave_the_host_as_before(host, before, fs_state_dir):
    log: list = []
    fm = FilesystemManager(host, filesystems_from_mapping(SMALL_CONFIGS), fs_state_dir, log=log.append)
    assert fm.preflight() == []
    try:
        described = {}
        for name in SMALL_CONFIGS:
            mnt = fm.ensure(name)
            assert fm.ensure(name) == mnt  # provisioned once
            assert host.run(["findmnt", "--mountpoint", mnt]).ok
            src_sum, sink_sum = write_sink(host, mnt)  # dd, as the dd baseline does
            assert src_sum == sink_sum
            # The sink lives on the configuration's own filesystem, not on the one below.
            on = json.loads(host.run(["findmnt", "-J", "-T", f"{mnt}/recv.dat"]).stdout)["filesystems"][0]
            assert on["target"] == mnt
            described[name] = fm.describe(name)
            fm.release(name)
            assert not host.run(["findmnt", "--mountpoint", mnt]).ok
            assert fm.describe(name) == described[name]  # the record outlives the filesystem
    finally:
        fm.teardown_all()
    assert host_state(host) == before
    assert _state_files(fs_state_dir) == []

    ext4, nodelalloc = described["ext4-loop"], described["ext4-nodelalloc"]
    assert ext4["fstype"] == "ext4" and "noatime" in ext4["mount_options"]
    assert "nodelalloc" not in ext4["mount_options"]
    assert "nodelalloc" in nodelalloc["mount_options"] and nodelalloc["mount_options_missing"] == []
    assert ext4["devices"][0]["size_bytes"] == 32 * 1024 ** 2 and ext4["devices"][0]["path"].startswith("/dev/loop")
    assert ext4["raid_kernel"] is None and ext4["size_bytes"] > 0
    xfs = described["xfs-stripe"]
    # su=64k,sw=4 -> the kernel reports the stripe geometry in 512-byte sectors.
    assert xfs["fstype"] == "xfs" and "sunit=128" in xfs["mount_options"] and "swidth=512" in xfs["mount_options"]
    assert xfs["mkfs_options"] == ["-d", "su=64k,sw=4"]
    assert ["mkfs.xfs", "-f", "-d", "su=64k,sw=4", "--", xfs["devices"][0]["path"]] in xfs["commands"]
    btrfs = described["btrfs-raid0"]
    assert btrfs["fstype"] == "btrfs" and len(btrfs["devices"]) == 2
    assert btrfs["raid_kernel"] == {"data": "raid0", "metadata": "raid0", "system": "raid0"}
    assert any(line.startswith("[localhost] mkfs.btrfs -f -d raid0 -m raid0 -- /dev/loop") for line in log)


RECV_MODES = {"ext4-loop": "read", "ext4-nodelalloc": "splice", "xfs-stripe": "mmap", "btrfs-raid0": "vmsplice"}


@needs_native
@pytest.mark.parametrize("sink_state", ["fresh", "preallocated"])
def test_worker_cells_write_their_sink_on_each_configuration(host, before, fs_state_dir, tmp_path, sink_state):
    """A real receiver cell (zcorch.worker recv on loopback, a different receive mode per filesystem)."""
    source = tmp_path / "source.bin"
    source.write_bytes(os.urandom(8 * 1024 * 1024 + 4096 * 3 + 17))  # not a multiple of any buffer
    want = hashlib.sha256(source.read_bytes()).hexdigest()
    fm = FilesystemManager(host, filesystems_from_mapping(SMALL_CONFIGS), fs_state_dir)
    try:
        for name, mode in RECV_MODES.items():
            mnt = fm.ensure(name)
            _sent, got = worker_sink(host, mnt, str(source), source.stat().st_size, mode, sink_state)
            assert got["bytes"] == source.stat().st_size and got["mode"] == mode
            assert host.run(["sha256sum", f"{mnt}/recv.dat"]).stdout.split()[0] == want
            fm.release(name)
    finally:
        fm.teardown_all()
    assert host_state(host) == before


def test_existing_path_is_used_recorded_and_never_touched(host, before, tmp_path, fs_state_dir):
    d = tmp_path / "array"
    d.mkdir()
    (d / "keep").write_text("x")
    log: list = []
    configs = filesystems_from_mapping({"array": {"path": str(d)}, "gone": {"path": str(tmp_path / "nope")}})
    fm = FilesystemManager(host, configs, fs_state_dir, log=log.append)
    assert fm.preflight(["array"]) == []
    assert any("nope is not an existing directory" in p for p in fm.preflight())
    assert fm.ensure("array") == str(d)
    info = fm.describe("array")
    fs_of_tmp = json.loads(host.run(["findmnt", "-J", "-T", str(d)]).stdout)["filesystems"][0]
    assert info["kind"] == "existing" and info["mount_target"] == fs_of_tmp["target"]
    assert info["fstype"] == fs_of_tmp["fstype"] and info["mount_options"] == fs_of_tmp["options"].split(",")
    with pytest.raises(HostError, match="not an existing directory"):
        fm.ensure("gone")
    fm.release("array")
    fm.teardown_all()
    assert log == [] and (d / "keep").read_text() == "x" and not os.path.exists(fs_state_dir)
    assert host_state(host) == before


def test_dry_run_prints_every_command_and_runs_none(host, before, fs_state_dir):
    log: list = []
    fm = FilesystemManager(host, filesystems_from_mapping(SMALL_CONFIGS), fs_state_dir, dry_run=True, log=log.append)
    expected = []
    for name in SMALL_CONFIGS:
        assert fm.ensure(name) == fm.mountpoint(name)
        expected += [f"[localhost] (dry run) {shlex.join(argv)}" for argv in fm.plan_commands(name)]
        fm.release(name)
    fm.teardown_all()
    assert log == expected and len(expected) == 7 + 7 + 7 + 10
    assert not os.path.exists(fs_state_dir) and host_state(host) == before


# --- safety -------------------------------------------------------------------------------------

def test_device_with_a_filesystem_not_in_allow_destroy_is_refused(host, tmp_path, fs_state_dir):
    with external_loop(str(tmp_path), mkfs="ext4") as dev:
        uuid = fs_uuid(dev)
        fm = FilesystemManager(host, filesystems_from_mapping({"d": {"fs": "xfs", "devices": [dev]}}), fs_state_dir)
        problems = fm.preflight()
        assert len(problems) == 1 and "ext4 signature" in problems[0] and "allow_destroy" in problems[0]
        with pytest.raises(HostError, match="ext4 signature"):
            fm.ensure("d")
        fm.teardown_all()
        assert fs_uuid(dev) == uuid  # untouched
        assert _state_files(fs_state_dir) == []


def test_blank_device_not_in_allow_destroy_is_refused(host, tmp_path, fs_state_dir):
    with external_loop(str(tmp_path)) as dev:
        fm = FilesystemManager(host, filesystems_from_mapping({"d": {"fs": "ext4", "devices": [dev]}}), fs_state_dir)
        (problem,) = fm.preflight()
        assert "not listed in allow_destroy" in problem and dev in problem


def test_device_in_allow_destroy_is_accepted_and_only_unmounted_afterwards(host, before, tmp_path, fs_state_dir):
    with external_loop(str(tmp_path), mkfs="ext4") as dev:
        old = fs_uuid(dev)
        configs = filesystems_from_mapping({"d": {"fs": "ext4", "devices": [dev], "allow_destroy": [dev],
                                                  "mount_options": ["nodelalloc"]}})
        fm = FilesystemManager(host, configs, fs_state_dir)
        assert fm.preflight() == []
        try:
            mnt = fm.ensure("d")
            src, sink = write_sink(host, mnt, mib=2)
            assert src == sink
            assert fm.describe("d")["mount_source"] == dev and "nodelalloc" in fm.describe("d")["mount_options"]
        finally:
            fm.teardown_all()
        assert fs_uuid(dev) != old  # it was formatted: the user allowed it
        # The device is the user's: it stays attached; only our mount went away.
        assert host.run(["losetup", dev]).ok and not host.run(["findmnt", "--source", dev]).ok
    assert host_state(host) == before


def test_mounted_device_is_refused_even_when_allowed(host, tmp_path, fs_state_dir):
    with external_loop(str(tmp_path), mkfs="ext4") as dev, mounted(dev, str(tmp_path)) as mnt:
        configs = filesystems_from_mapping({"d": {"fs": "ext4", "devices": [dev], "allow_destroy": [dev]}})
        fm = FilesystemManager(host, configs, fs_state_dir)
        problems = fm.preflight()
        assert any(f"mounted at {mnt}" in p for p in problems), problems
        with pytest.raises(HostError, match="mounted at"):
            fm.ensure("d")
        fm.teardown_all()
        assert host.run(["findmnt", "--mountpoint", mnt]).ok


def test_device_backing_a_loop_is_refused(host, tmp_path, fs_state_dir):
    with external_loop(str(tmp_path)) as dev:
        upper = host.run(["losetup", "--find", "--show", dev]).stdout.strip()
        try:
            configs = filesystems_from_mapping({"d": {"fs": "ext4", "devices": [dev], "allow_destroy": [dev]}})
            fm = FilesystemManager(host, configs, fs_state_dir)
            assert any(f"backs loop device(s) {upper}" in p for p in fm.preflight())
        finally:
            host.run(["losetup", "-d", upper])


def test_btrfs_member_is_refused_as_in_use(host, tmp_path, fs_state_dir):
    # The second member of a mounted two-device btrfs shows no mountpoint: only its exclusive opener does.
    with external_loop(str(tmp_path), "128MiB") as a, external_loop(str(tmp_path), "128MiB") as b:
        assert host.run(["mkfs.btrfs", "-q", "-f", "-d", "raid0", "-m", "raid0", a, b]).ok
        host.run(["btrfs", "device", "scan", a, b])
        with mounted(a, str(tmp_path)):
            configs = filesystems_from_mapping({"d": {"fs": "ext4", "devices": [b], "allow_destroy": [b]}})
            fm = FilesystemManager(host, configs, fs_state_dir)
            problems = fm.preflight()
            assert any("opened exclusively" in p for p in problems), problems
        host.run(["btrfs", "device", "scan", "--forget", a, b])


def test_paths_outside_dev_and_non_block_devices_are_refused(host, tmp_path, fs_state_dir):
    img = tmp_path / "plain.img"
    img.write_bytes(b"\0" * 4096)
    os.symlink(str(img), "/dev/zcorch-test-link-%d" % os.getpid())
    link = "/dev/zcorch-test-link-%d" % os.getpid()
    try:
        cfgs = filesystems_from_mapping({
            "link": {"fs": "ext4", "devices": [link], "allow_destroy": [link]},
            "chr": {"fs": "ext4", "devices": ["/dev/null"], "allow_destroy": ["/dev/null"]},
            "missing": {"fs": "ext4", "devices": ["/dev/zcorch-nonexistent"],
                        "allow_destroy": ["/dev/zcorch-nonexistent"]}})
        # The schema refuses a device outside /dev; built directly, it shows the manager checks again on its own.
        cfgs["file"] = FilesystemConfig(name="file", fs="ext4", devices=(str(img),), allow_destroy=(str(img),))
        fm = FilesystemManager(host, cfgs, fs_state_dir)
        problems = "\n".join(fm.preflight())
        assert f"device {img}: refused, not under /dev" in problems
        assert f"resolves to {img} which is not under /dev" in problems
        assert "device /dev/null: refused, not a block device (character special file)" in problems
        assert "device /dev/zcorch-nonexistent: does not exist" in problems
        with pytest.raises(HostError, match="not under /dev"):
            fm.ensure("file")
        fm.teardown_all()
        assert img.read_bytes() == b"\0" * 4096
    finally:
        os.unlink(link)


# --- failures and cleanup -----------------------------------------------------------------------

def test_failed_mkfs_undoes_the_half_built_configuration(host, before, fs_state_dir):
    # an option zcorch accepts (a key mkfs.xfs knows) whose value mkfs.xfs itself refuses on this device:
    # 999999 allocation groups of a 320 MiB device are 1 block each, below its 4096-block minimum
    configs = filesystems_from_mapping({"x": {"fs": "xfs", "loop": {"count": 1, "size": "320MiB"},
                                              "mkfs_options": ["-d", "agcount=999999"]}})
    fm = FilesystemManager(host, configs, fs_state_dir)
    with pytest.raises(HostError, match=r"filesystem 'x': `mkfs.xfs -f -d agcount=999999 -- /dev/loop\d+` failed"):
        fm.ensure("x")
    assert host_state(host) == before  # loop detached, backing file gone, before teardown_all
    fm.teardown_all()
    fm.teardown_all()  # idempotent
    assert _state_files(fs_state_dir) == [] and os.listdir(fs_state_dir) == []


def test_md_raid_needs_md_in_the_kernel(host, before, fs_state_dir):
    cfg = {"md": {"fs": "xfs", "raid": "raid0", "loop": {"count": 2, "size": "160MiB"}}}
    fm = FilesystemManager(host, filesystems_from_mapping(cfg), fs_state_dir)
    problems = fm.preflight()
    if not md_supported(host):
        assert problems == ["localhost: filesystem(s) md need md RAID but this kernel has no md driver "
                            "(/proc/mdstat missing); use btrfs raid profiles or another host"]
        pytest.skip("this kernel has no md driver (/proc/mdstat missing): md RAID provisioning not testable here")
    require_tool("mdadm")
    assert problems == []
    try:
        mnt = fm.ensure("md")
        src, sink = write_sink(host, mnt)
        assert src == sink
        info = fm.describe("md")
        assert info["raid_kernel"]["raid_level"] == "raid0" and info["raid_kernel"]["raid_devices"] == 2
        assert info["mount_source"] == info["raid_kernel"]["device"]
    finally:
        fm.teardown_all()
    assert host_state(host) == before


@pytest.mark.parametrize("kill_at", ["mkfs.btrfs", "btrfs", "mount-beneath", ""])
def test_cleanup_stale_after_a_sigkilled_controller(host, before, fs_state_dir, kill_at):
    configs = {"ext4-nodelalloc": SMALL_CONFIGS["ext4-nodelalloc"], "btrfs-raid0": SMALL_CONFIGS["btrfs-raid0"]}
    proc = start_provisioner(configs, fs_state_dir, kill_at)
    try:
        if kill_at:
            proc.wait(timeout=120)
            assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
        else:
            lines = [proc.stdout.readline().strip() for _ in range(3)]
            assert lines[-1] == "ready", proc.stderr.read()
            # While the controller lives, cleanup leaves its filesystems alone.
            assert FilesystemManager.cleanup_stale(host, fs_state_dir) == []
            assert host.run(["findmnt", "--mountpoint", lines[0]]).ok
            # the host's watchdog dies first (else it undoes everything at once): left for cleanup_stale
            assert len(kill_watchdogs(all_pids(), fs_state_dir)) == 1
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    left = host_state(host)
    assert left["loops"] != before["loops"]  # the killed controller did leave something behind
    (state_file,) = _state_files(fs_state_dir)
    state = json.load(open(os.path.join(fs_state_dir, state_file)))
    if kill_at == "mkfs.btrfs":
        # Killed just before mkfs: the loop devices exist and are listed by their backing files.
        kinds = [r["kind"] for r in state["configs"]["btrfs-raid0"]]
        assert kinds == ["dir", "backing_file", "loop", "backing_file", "loop"]
    log: list = []
    undone = FilesystemManager.cleanup_stale(host, fs_state_dir, log=log.append)
    assert undone[-1] == f"removed state file {os.path.join(fs_state_dir, state_file)}"
    assert sum(u.startswith("removed backing file ") for u in undone) == (1 if kill_at == "mount-beneath" else 3)
    if kill_at == "":
        # Unmounting was enough: the loops had autoclear set and detached themselves.
        assert sum(u.startswith("unmounted ") for u in undone) == 2
    else:
        assert any(u.startswith("detached loop device(s) /dev/loop") for u in undone)
    assert host_state(host) == before
    assert os.listdir(fs_state_dir) == []
    assert FilesystemManager.cleanup_stale(host, fs_state_dir) == []


def test_loops_detach_themselves_when_their_mount_goes_away(host, before, fs_state_dir):
    """What happens when a killed controller's mount namespace dies (lab down): umount by someone else."""
    fm = FilesystemManager(host, filesystems_from_mapping({"b": SMALL_CONFIGS["btrfs-raid0"]}), fs_state_dir)
    try:
        mnt = fm.ensure("b")
        loops = [d["path"] for d in fm.describe("b")["devices"]]
        assert [open(f"/sys/block/{os.path.basename(d)}/loop/autoclear").read().strip() for d in loops] == ["1", "1"]
        assert host.run(["umount", mnt]).ok
        assert host.run(["btrfs", "device", "scan", "--forget", *loops]).ok
        left = host_state(host)["loops"]
        assert not any(line.startswith(f"{d}:") for d in loops for line in left)
    finally:
        fm.teardown_all()
    assert host_state(host) == before


def test_cleanup_stale_leaves_a_mount_it_did_not_make(host, tmp_path, fs_state_dir):
    """A state file naming a mountpoint that now holds someone else's filesystem: refused, not unmounted."""
    with external_loop(str(tmp_path), mkfs="ext4") as dev, mounted(dev, str(tmp_path)) as mnt:
        os.makedirs(fs_state_dir)
        state = {"format": "zcorch-fs-state", "version": 1, "token": "t", "owner": {"host": "elsewhere", "pid": 1},
                 "configs": {"e": [{"kind": "mount", "mountpoint": mnt, "sources": ["/dev/loop-not-this"]}]}}
        with open(os.path.join(fs_state_dir, "zcorch-fs-state-t.json"), "w") as f:
            json.dump(state, f)
        with pytest.raises(HostError, match="left alone"):
            FilesystemManager.cleanup_stale(host, fs_state_dir)
        assert host.run(["findmnt", "--mountpoint", mnt]).ok
        os.unlink(os.path.join(fs_state_dir, "zcorch-fs-state-t.json"))


def test_teardown_all_on_ctrl_c_mid_sweep(host, before, fs_state_dir):
    """KeyboardInterrupt between cells: the runner's finally calls teardown_all and the host is restored."""
    fm = FilesystemManager(host, filesystems_from_mapping(SMALL_CONFIGS), fs_state_dir)
    with pytest.raises(KeyboardInterrupt):
        try:
            fm.ensure("ext4-loop")
            fm.ensure("btrfs-raid0")
            raise KeyboardInterrupt
        finally:
            fm.teardown_all()
    assert host_state(host) == before and _state_files(fs_state_dir) == []


def _craft_state(state_dir: str, token: str, resources: list, mode: int = 0o600) -> str:
    os.makedirs(state_dir, exist_ok=True)
    path = os.path.join(state_dir, f"zcorch-fs-state-{token}.json")
    with open(path, "w") as f:
        json.dump({"format": "zcorch-fs-state", "version": 1, "token": token,
                   "owner": {"host": "elsewhere", "pid": 1}, "configs": {"x": resources}}, f)
    os.chmod(path, mode)
    return path


def test_cleanup_stale_undoes_nothing_outside_the_runs_own_directories(host, tmp_path, fs_state_dir):
    """A crafted (or corrupt) state file naming a user's file and someone's mount: both survive."""
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    mnt = tmp_path / "their-tmpfs"
    mnt.mkdir()
    assert host.run(["mount", "-t", "tmpfs", "-o", "size=1m", "zc-test-tmpfs", str(mnt)]).ok
    try:
        path = _craft_state(fs_state_dir, "t1", [
            {"kind": "backing_file", "path": str(outside)},
            {"kind": "mount", "mountpoint": str(mnt), "sources": ["zc-test-tmpfs"]}])
        with pytest.raises(HostError, match=f"the mount on {mnt} .* not under zcorch's own directories"):
            FilesystemManager.cleanup_stale(host, fs_state_dir)
        assert host.run(["findmnt", "--mountpoint", str(mnt)]).ok
        with open(path) as f:                                   # the mount gone from the record: the file next
            data = json.load(f)
        data["configs"]["x"] = data["configs"]["x"][:1]
        with open(path, "w") as f:
            json.dump(data, f)
        with pytest.raises(HostError, match=f"{outside} is not under zcorch's own directories"):
            FilesystemManager.cleanup_stale(host, fs_state_dir)
        # `..` does not lead out of the run's directories either.
        sneaky = os.path.join(fs_state_dir, "fs-t1", "..", "..", "precious.txt")
        _craft_state(fs_state_dir, "t1", [{"kind": "backing_file", "path": sneaky}])
        with pytest.raises(HostError, match="not under zcorch's own directories"):
            FilesystemManager.cleanup_stale(host, fs_state_dir)
        assert outside.read_text() == "keep me"
        # What does lie under fs-<token>/ is undone as before.
        own = os.path.join(fs_state_dir, "fs-t1", "x", "dev0.img")
        os.makedirs(os.path.dirname(own))
        open(own, "w").close()
        _craft_state(fs_state_dir, "t1", [{"kind": "backing_file", "path": own}])
        assert FilesystemManager.cleanup_stale(host, fs_state_dir)[0] == f"removed backing file {own}"
    finally:
        host.run(["umount", str(mnt)])


def test_cleanup_stale_ignores_a_state_file_others_could_write(host, tmp_path, fs_state_dir):
    own = os.path.join(fs_state_dir, "fs-t2", "x", "dev0.img")
    os.makedirs(os.path.dirname(own))
    open(own, "w").close()
    path = _craft_state(fs_state_dir, "t2", [{"kind": "backing_file", "path": own}], mode=0o666)
    with pytest.raises(HostError, match=f"{path}: not trusted, left in place .*writable by group or others"):
        FilesystemManager.cleanup_stale(host, fs_state_dir)
    os.chmod(path, 0o600)
    os.chown(path, 65534, 65534)
    with pytest.raises(HostError, match=f"{path}: not trusted, left in place .*owned by uid 65534"):
        FilesystemManager.cleanup_stale(host, fs_state_dir)
    os.chown(path, 0, 0)
    os.chmod(fs_state_dir, 0o777)
    with pytest.raises(HostError, match=f"{fs_state_dir} is writable by group or others"):
        FilesystemManager.cleanup_stale(host, fs_state_dir)
    assert os.path.exists(own)
    os.chmod(fs_state_dir, 0o755)
    # A token other than the file's own name is not trusted either.
    with open(path) as f:
        data = json.load(f)
    data["token"] = "t-other"
    with open(path, "w") as f:
        json.dump(data, f)
    with pytest.raises(HostError, match="token 't-other' is not the one of its file name"):
        FilesystemManager.cleanup_stale(host, fs_state_dir)
    assert os.path.exists(own)


def test_a_held_lease_refuses_a_second_sweep_and_keeps_cleanup_away(host, tmp_path, fs_state_dir):
    """Two controllers on one receiver: the second is refused with who holds it, and its cleanup does not
    tear down the first one's filesystems (whatever host the first controller runs on)."""
    from zcorch.errors import PreflightError
    from zcorch.provision.fs_state import Lease

    own = os.path.join(fs_state_dir, "fs-t3", "x", "dev0.img")
    os.makedirs(os.path.dirname(own))
    open(own, "w").close()
    _craft_state(fs_state_dir, "t3", [{"kind": "backing_file", "path": own}])   # owner "elsewhere": looks dead
    first = Lease.take(host, fs_state_dir)
    try:
        # the user as this process names itself (getpass: $LOGNAME/$USER first), not as the recording machine did
        with pytest.raises(PreflightError, match=rf'another sweep holds .*"user": {re.escape(json.dumps(getpass.getuser()))}, '
                                                 rf'"host": ".*", "pid": {os.getpid()}, "since": "'):
            Lease.take(host, fs_state_dir)
        assert FilesystemManager.cleanup_stale(host, fs_state_dir) == [] and os.path.exists(own)
    finally:
        first.release()
    # Released (or its controller gone): the next sweep takes it and undoes the leftovers.
    second = Lease.take(host, fs_state_dir)
    try:
        assert FilesystemManager.cleanup_stale(host, fs_state_dir, leased=True)[0] == f"removed backing file {own}"
    finally:
        second.release()


def test_a_killed_controllers_lease_ends_with_its_stdin(host, tmp_path, fs_state_dir):
    from zcorch.provision.fs_state import Lease, lease_held

    lease = Lease.take(host, fs_state_dir)
    assert lease_held(host, fs_state_dir)
    lease.proc._close_stdin()       # what the controller's death does to the pipe (or the SSH channel)
    lease.proc.wait(10.0)
    assert not lease_held(host, fs_state_dir)


def test_a_filesystem_unmounted_mid_sweep_is_refused_not_written_below(host, before, fs_state_dir):
    """Someone unmounts a provisioned filesystem between two runs: the next ensure() says so instead of
    handing out the bare mountpoint directory (a sink there would land on the filesystem below)."""
    fm = FilesystemManager(host, filesystems_from_mapping({"e": SMALL_CONFIGS["ext4-loop"]}), fs_state_dir)
    try:
        mnt = fm.ensure("e")
        assert fm.ensure("e") == mnt            # still mounted: the same mountpoint, nothing re-provisioned
        subprocess.run(["umount", mnt], check=True)
        with pytest.raises(HostError, match="no longer mounted"):
            fm.ensure("e")
    finally:
        fm.teardown_all()
    assert host_state(host) == before


def test_a_loop_attached_after_its_undo_looked_is_detached_before_its_file_goes(host, tmp_path, fs_state_dir):
    """Ctrl-C during a loop step: its `losetup` ends on the host after the teardown's loop undo found nothing
    (fresh-clone CI left /dev/loopN on a backing file that way). Removing this run's backing file detaches
    the loop on it first, instead of stopping the teardown with 'still backs a loop device'. The undo is the
    host's (zcorch.worker.watchdog.restore_fs), as the live manager runs it (its record trusted)."""
    from zcorch.worker.watchdog import _loops_of, restore_fs

    backing = os.path.join(fs_state_dir, "fs-late", "dev0.img")
    os.makedirs(os.path.dirname(backing))
    assert host.run(["truncate", "-s", "8M", backing]).ok
    path = _craft_state(fs_state_dir, "late", [{"kind": "backing_file", "path": backing},
                                               {"kind": "loop", "backing_file": backing}])
    with open(path) as f:
        data = json.load(f)
    data["configs"]["x"] = data["configs"]["x"][1:]       # the loop's undo first: nothing attached yet
    data["configs"]["y"] = [{"kind": "backing_file", "path": backing}]
    with open(path, "w") as f:
        json.dump(data, f)
    out = restore_fs(path, only="x", trusted=True)
    assert out["errors"] == [] and out["restored"] == [] and list(out["configs"]) == ["y"], out
    dev = host.run(["losetup", "--find", "--show", backing]).stdout.strip()   # the interrupted step's attach
    try:
        assert dev and _loops_of(backing) == [dev]
        out = restore_fs(path, only="y", trusted=True)
        assert out["errors"] == [] and out["restored"][0] == f"removed backing file {backing}", out
        assert any(dev in what for what in out["restored"][1:]), out
        assert not os.path.exists(backing) and not host.run(["losetup", dev]).stdout.strip().endswith(f"({backing})")
        assert not os.path.exists(path) and out["restored"][-1] == f"removed state file {path}"
    finally:
        if os.path.exists(backing):
            host.run(["losetup", "-d", dev])
