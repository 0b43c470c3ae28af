"""A filesystem mounts only beneath the run's own directories: refused at plan time (file:line, key) from the
text, and again on the host on the directory it opened (no link, no mount point, empty, beneath the root).
Real files, real mounts (tmpfs, a real ext4 on a loop device), real `zcorch plan` processes."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from conftest import require_tool
from fixtures_fs import host_state
from zcorch.config.experiment import load_experiment
from zcorch.config.filesystems import FilesystemConfig
from zcorch.errors import ConfigError, HostError
from zcorch.hosts.local import LocalHost
from zcorch.provision.filesystems import FilesystemManager

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EXPERIMENT = """name: fsm
hosts: localhost
filesystems:
  x: {{fs: ext4, loop: {{size: 32MiB}}, mountpoint: "{mnt}"}}
params:
  filesystem: x
  sink: "{{filesystem}}/recv.dat"
"""

# Each a mountpoint that is not a directory beneath the run's own: an absolute path (a system directory, the root,
# the path of {scratch} spelled out), {scratch} itself, `..` and `.` spellings, empty components, a relative path.
REFUSED = ["/usr", "/", "/etc/", "//usr", "/usr/../usr", "/root/.cache/zcorch/scratch/m", "/tmp/m", "/proc/m",
           "{scratch}", "{scratch}/", "{scratch}/..", "{scratch}/../../usr", "{scratch}/a/../../../usr",
           "{scratch}/./m", "{scratch}//m", "{scratch}/m/", "m", "../m", "./m", "{scratch}/m n", "{scratch}/{x}"]


@pytest.mark.parametrize("mnt", REFUSED)
def test_plan_refuses_a_mountpoint_outside_the_runs_directories(tmp_path, mnt):
    path = tmp_path / "exp.yaml"
    path.write_text(EXPERIMENT.format(mnt=mnt))
    with pytest.raises(ConfigError) as exc:
        load_experiment(str(path))
    assert f"{path}:4:" in str(exc.value) and "filesystems.x.mountpoint" in str(exc.value), str(exc.value)


def test_zcorch_plan_refuses_mountpoint_usr_with_file_line_and_key(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(EXPERIMENT.format(mnt="/usr"))
    res = subprocess.run([sys.executable, "-m", "zcorch", "plan", str(path)], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": REPO}, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{path}:4:" in res.stderr and "filesystems.x.mountpoint: `/usr`" in res.stderr


def test_plan_accepts_a_directory_under_scratch(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(EXPERIMENT.format(mnt="{scratch}/mnt-x/deeper"))
    assert load_experiment(str(path)).filesystems["x"].mountpoint == "{scratch}/mnt-x/deeper"


# -- the host's own judgement, on what it opened (zcorch.worker.remote mount-beneath, a real process) ----------

def _mount_beneath(root, mnt) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zcorch.worker.remote", "mount-beneath", str(root), str(mnt),
                           "tmpfs", "size=1m", "zcorch-safety"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": REPO}, timeout=60)


def _mounted_at(path) -> bool:
    return subprocess.run(["findmnt", "--mountpoint", str(path)], capture_output=True).returncode == 0


def _umount(path) -> None:
    while _mounted_at(path):
        subprocess.run(["umount", str(path)], check=True)


@pytest.fixture
def rig(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: mounts tmpfs")
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    victim = tmp_path / "victim"          # stands for /usr: a directory outside the run's own
    victim.mkdir()
    (victim / "precious").write_text("x")
    mounts = []
    yield root, victim, mounts
    for m in reversed(mounts + [root / "m", victim]):
        _umount(m)


@pytest.mark.root
def test_host_mounts_on_an_empty_directory_beneath_the_root(rig):
    root, _victim, _ = rig
    (root / "m").mkdir()
    res = _mount_beneath(root, root / "m")
    assert res.returncode == 0, res.stderr
    assert _mounted_at(root / "m")


@pytest.mark.root
@pytest.mark.parametrize("where", ["last", "middle"])
def test_host_refuses_a_link_in_the_mountpoint(rig, where):
    root, victim, _ = rig
    if where == "last":
        (root / "m").symlink_to(victim)
        mnt = root / "m"
    else:
        (root / "a").symlink_to(victim)
        (victim / "m").mkdir()
        mnt = root / "a" / "m"
    res = _mount_beneath(root, mnt)
    assert res.returncode == 1 and "symbolic link" in res.stderr, res.stderr
    assert not _mounted_at(victim) and not _mounted_at(victim / "m")
    (victim / "m").exists() and os.rmdir(victim / "m")


@pytest.mark.root
def test_host_makes_the_mountpoints_directories_without_following_a_link(rig):
    root, victim, _ = rig
    (root / "a").symlink_to(victim)
    res = subprocess.run([sys.executable, "-m", "zcorch.worker.remote", "mkdir-beneath", str(root),
                          str(root / "a" / "b" / "c")], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": REPO}, timeout=60)
    assert res.returncode == 1 and "symbolic link" in res.stderr, res.stderr
    assert sorted(os.listdir(victim)) == ["precious"]
    res = subprocess.run([sys.executable, "-m", "zcorch.worker.remote", "mkdir-beneath", str(root),
                          str(root / "m" / "n")], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": REPO}, timeout=60)
    assert res.returncode == 0 and (root / "m" / "n").is_dir() and not (root / "m").is_symlink(), res.stderr
    os.rmdir(root / "m" / "n")


@pytest.mark.root
def test_host_refuses_a_root_reached_through_a_link(rig, tmp_path):
    root, _victim, _ = rig
    (root / "m").mkdir()
    (tmp_path / "link").symlink_to(root)
    res = _mount_beneath(tmp_path / "link", tmp_path / "link" / "m")
    assert res.returncode == 1 and "symbolic link" in res.stderr, res.stderr
    assert not _mounted_at(root / "m")


@pytest.mark.root
@pytest.mark.parametrize("kind", ["tmpfs", "bind"])
def test_host_refuses_an_existing_mount_point(rig, tmp_path, kind):
    root, victim, mounts = rig
    (root / "m").mkdir()
    if kind == "tmpfs":
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "zc-other", str(root / "m")], check=True)
    else:   # same device as its parent: only the mount id tells
        subprocess.run(["mount", "--bind", str(victim), str(root / "m")], check=True)
    mounts.append(root / "m")
    before = subprocess.run(["findmnt", "-rn"], capture_output=True, text=True).stdout
    res = _mount_beneath(root, root / "m")
    assert res.returncode == 1 and "mount point already" in res.stderr, res.stderr
    assert subprocess.run(["findmnt", "-rn"], capture_output=True, text=True).stdout == before


@pytest.mark.root
def test_host_refuses_crossing_a_mount_point_below_the_root(rig):
    root, victim, mounts = rig
    (root / "a").mkdir()
    subprocess.run(["mount", "--bind", str(victim), str(root / "a")], check=True)
    mounts.append(root / "a")
    (victim / "m").mkdir()
    res = _mount_beneath(root, root / "a" / "m")
    assert res.returncode == 1 and "mount point already" in res.stderr, res.stderr
    assert not _mounted_at(victim / "m") and not _mounted_at(root / "a" / "m")
    os.rmdir(victim / "m")


@pytest.mark.root
def test_host_refuses_a_directory_that_holds_something(rig):
    root, _victim, _ = rig
    (root / "m").mkdir()
    (root / "m" / "data").write_text("kept")
    res = _mount_beneath(root, root / "m")
    assert res.returncode == 1 and "not empty" in res.stderr, res.stderr
    assert not _mounted_at(root / "m")


@pytest.mark.root
@pytest.mark.parametrize("mnt", ["{root}/../victim", "{root}", "{tmp}/victim", "{root}/./m"])
def test_host_refuses_a_path_not_beneath_the_root(rig, tmp_path, mnt):
    root, victim, _ = rig
    (root / "m").mkdir()
    res = _mount_beneath(root, mnt.format(root=root, tmp=tmp_path))
    assert res.returncode == 1 and "not beneath the mount root" in res.stderr, res.stderr
    assert not _mounted_at(victim) and not _mounted_at(root / "m")


@pytest.mark.root
def test_host_refuses_a_root_others_may_write(rig):
    root, _victim, _ = rig
    (root / "m").mkdir()
    os.chmod(root, 0o777)
    res = _mount_beneath(root, root / "m")
    assert res.returncode == 1 and "not this user's" in res.stderr, res.stderr
    assert not _mounted_at(root / "m")


def _mounts_under(path) -> "list[str]":
    out = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True).stdout.split()
    return [m for m in out if m == str(path) or m.startswith(str(path) + "/")]


@pytest.mark.root
def test_host_never_mounts_through_a_link_swapped_in_mid_check(rig):
    """The rename race: `m` flips between an empty directory and a link to the victim while the job runs;
    every attempt either mounts on the run's own directory or is refused, never on the victim."""
    root, victim, _ = rig
    (root / "m").mkdir()
    stop = threading.Event()
    flips = [0]

    def swap():
        while not stop.is_set():
            try:
                os.rename(root / "m", root / "d")             # the directory away...
                os.symlink(victim, root / "l")
                os.rename(root / "l", root / "m")             # ...a link in its place...
                os.rename(root / "m", root / "l")
                os.unlink(root / "l")
                os.rename(root / "d", root / "m")             # ...and the directory back
                flips[0] += 1
            except OSError:
                pass

    outcomes = []
    for _ in range(40):
        t = threading.Thread(target=swap, daemon=True)
        stop.clear()
        t.start()
        try:
            res = _mount_beneath(root, root / "m")
        finally:
            stop.set()
            t.join()
        outcomes.append(res.returncode)
        assert not _mounted_at(victim), res.stderr
        for m in reversed(_mounts_under(root)):        # mounted on the run's own directory (m, or d if renamed)
            assert res.returncode == 0
            _umount(m)
        for name in ("l",):
            if os.path.lexists(root / name):
                os.unlink(root / name)
        if not (root / "m").is_dir() or (root / "m").is_symlink():
            if (root / "m").is_symlink():
                os.unlink(root / "m")
            os.rename(root / "d", root / "m")
    assert flips[0] > 0 and 1 in outcomes, (flips, outcomes)     # the race ran, and the job refused some
    assert not _mounted_at(victim)


# -- the manager: what reaches the host is judged there too (a real ext4 on a loop device) ---------------

@pytest.fixture
def host():
    if os.geteuid() != 0:
        pytest.skip("needs root: loop devices, mkfs, mount")
    for tool in ("losetup", "mkfs.ext4", "wipefs"):
        require_tool(tool)
    return LocalHost()


def _ext4(mountpoint):
    return {"x": FilesystemConfig(name="x", fs="ext4", loop_count=1, loop_size=32 * 1024 ** 2,
                                  mountpoint=mountpoint)}


@pytest.mark.root
def test_manager_refuses_an_absolute_mountpoint_made_without_the_parser(host, tmp_path):
    """A configuration built in code (no file, no plan-time check) naming a directory outside the run's own:
    nothing is mounted on it (before: an ext4 went over it, as it would over /usr)."""
    victim = tmp_path / "victim"
    victim.mkdir()
    before = host_state(host)
    fm = FilesystemManager(host, _ext4(str(victim)), str(tmp_path / "work" / "fs"))
    try:
        with pytest.raises((ConfigError, HostError), match="mounted only beneath"):
            fm.ensure("x")
        assert not _mounted_at(victim)
    finally:
        fm.teardown_all()
        _umount(victim)
    assert host_state(host) == before


@pytest.mark.root
def test_manager_mounts_under_scratch_and_refuses_a_link_there(host, tmp_path):
    work = tmp_path / "work"
    (work / "scratch").mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim"
    victim.mkdir()
    (work / "scratch" / "evil").symlink_to(victim)
    before = host_state(host)
    fm = FilesystemManager(host, _ext4("{scratch}/evil"), str(work / "fs"))
    try:
        with pytest.raises(HostError, match="symbolic link"):
            fm.ensure("x")
        assert not _mounted_at(victim)
    finally:
        fm.teardown_all()
        _umount(victim)
    assert host_state(host) == before
    fm = FilesystemManager(host, _ext4("{scratch}/evil/deeper/x"), str(work / "fs"))     # a link further up
    touched = os.stat(victim).st_mtime_ns
    time.sleep(0.01)
    try:
        with pytest.raises(HostError, match="symbolic link"):
            fm.ensure("x")
        # nothing was made (and removed again) through the link either: the victim's entries never changed
        assert os.listdir(victim) == [] and os.stat(victim).st_mtime_ns == touched
    finally:
        fm.teardown_all()
    assert host_state(host) == before
    fm = FilesystemManager(host, _ext4("{scratch}/mnt/x"), str(work / "fs"))
    try:
        mnt = fm.ensure("x")
        assert mnt == str(work / "scratch" / "mnt" / "x") and _mounted_at(mnt)
    finally:
        fm.teardown_all()
    assert host_state(host) == before
    assert not (work / "scratch" / "mnt").exists()     # the directories it made are gone again
