"""An experiment file can put no device, file or result at risk: refused by `zcorch plan` (exit 2, file:line:col)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from fixtures_fs import external_loop
from fixtures_spec import at
from fixtures_worker import needs_native, run_worker, start_receiver


def plan_cli(path: str) -> subprocess.CompletedProcess:
    """The real `zcorch plan FILE` command."""
    return subprocess.run([sys.executable, "-m", "zcorch", "plan", path], capture_output=True, text=True,
                          timeout=60)


def refused(path: str) -> "list[str]":
    """The problem lines of a refused file (exit status 2, no traceback, nothing on stdout)."""
    r = plan_cli(path)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
    return [line[line.index(path):] for line in r.stderr.splitlines() if path in line]


# ---------------------------------------------------------------- 1. mkfs/mount options name no device

@pytest.mark.parametrize("entry,key", [
    ('{fs: btrfs, loop: {size: 1GiB}, mkfs_options: ["/dev/sda"]}', "mkfs_options[0]"),
    ('{fs: xfs, loop: {size: 1GiB}, mkfs_options: ["-l", "logdev=/dev/sdb,size=10m"]}', "mkfs_options[1]"),
    ('{fs: xfs, loop: {size: 1GiB}, mkfs_options: ["-l", "size=10m,logdev=sdb"]}', "mkfs_options[1]"),
    ('{fs: xfs, loop: {size: 1GiB}, mkfs_options: ["-r", "rtdev=sdb"]}', "mkfs_options[1]"),
    ('{fs: ext4, loop: {size: 1GiB}, mkfs_options: ["-J", "device=UUID=1234"]}', "mkfs_options[1]"),
    ('{fs: ext4, loop: {size: 1GiB}, mkfs_options: ["-O", "journal_dev"]}', "mkfs_options[1]"),
    ('{fs: ext4, loop: {size: 1GiB}, mkfs_options: ["-d", "../../etc"]}', "mkfs_options[1]"),
    ('{fs: btrfs, loop: {size: 1GiB}, mount_options: ["device=/dev/sdb"]}', "mount_options[0]"),
    ('{fs: xfs, loop: {size: 1GiB}, mount_options: ["logdev=sdb"]}', "mount_options[0]"),
    ('{fs: ext4, loop: {size: 1GiB}, mount_options: ["loop"]}', "mount_options[0]"),
    ('{fs: ext4, loop: {size: 1GiB}, mount_options: ["offset=4096"]}', "mount_options[0]"),
])
def test_options_may_not_name_a_device(write_yaml, entry, key):
    path = write_yaml(f"name: t\nfilesystems:\n  one: {entry}\n")
    problems = refused(path)
    assert len(problems) == 1 and at(problems[0], path, 3), problems
    assert f"filesystems.one.{key}" in problems[0] and "may not name a device" in problems[0]


def test_ordinary_options_still_pass(write_yaml):
    path = write_yaml("""
        name: t
        filesystems:
          x: {fs: xfs, loop: {size: 1GiB}, mkfs_options: ["-d", "su=64k,sw=4", "-l", "size=64m"],
              mount_options: [noatime, "logbsize=256k"]}
          e: {fs: ext4, loop: {size: 1GiB}, mkfs_options: ["-b", "4096", "-E", "stride=16"], mount_options: [nodelalloc]}
    """)
    assert plan_cli(path).returncode == 0


# ---------------------------------------------------------------- 2. no device sink, dd scratch, odd source

@pytest.mark.parametrize("text,line,key,needle", [
    ("params: {sink: /dev/vda}", 2, "params.sink", "the sink may only be /dev/null or a device listed"),
    ("params: {sink: //dev/./vda}", 2, "params.sink", "under /dev"),
    ("params: {sink: /dev/shm/../vda}", 2, "params.sink", "under /dev"),
    ("matrix: {sink: [/dev/null, /dev/sdb]}", 2, "matrix.sink[1]", "under /dev"),
    ("params: {sink: /dev/sdb}\nallow_destroy: [/dev/sdc]", 2, "params.sink", "under /dev"),
    ("params: {source: /dev/sda}", 2, "params.source", "the source may only be /dev/zero, /dev/null, /dev/urandom"),
    ("baselines: {dd: {scratch: /dev}}", 2, "baselines.dd.scratch", "must be a real directory"),
    ("baselines: {dd: {scratch: /dev/shm}}", 2, "baselines.dd.scratch", "must be a real directory"),
    ("allow_destroy: [sda]", 2, "allow_destroy[0]", "expected a device path under /dev/"),
    ("allow_destroy: /dev/sda", 2, "allow_destroy", "expected a list of device paths"),
])
def test_device_paths_are_refused(write_yaml, text, line, key, needle):
    path = write_yaml(f"name: t\n{text}\n")
    problems = refused(path)
    assert len(problems) == 1 and at(problems[0], path, line), problems
    assert f" {key}: " in problems[0] and needle in problems[0], problems


def test_allow_destroy_lets_a_listed_device_be_the_sink(write_yaml):
    from zcorch.config.experiment import load_experiment
    path = write_yaml("name: t\nallow_destroy: [/dev/sdb]\nparams: {sink: /dev/sdb, source: /dev/zero}\n")
    exp = load_experiment(path)
    assert exp.allow_destroy == ("/dev/sdb",) and exp.params["sink"] == "/dev/sdb"
    assert plan_cli(write_yaml("name: t\nparams: {sink: /dev/null, source: /dev/urandom}\n", "b.yaml")).returncode == 0


@pytest.mark.root
@needs_native
def test_worker_refuses_a_device_sink_unless_allowed(tmp_path):
    """A real loop device (also behind a symlink) and /dev/zero: refused; the device is not written."""
    with external_loop(str(tmp_path), "1MiB") as dev:
        link = tmp_path / "innocent-file"
        link.symlink_to(dev)
        for sink in (dev, str(link), "/dev/zero"):
            rc, events, _ = run_worker("recv", "--listen", "127.0.0.1:0", "--mode", "read", "--sink", sink)
            assert rc == 1 and events[0]["code"] == "EPERM" and "not /dev/null: refused" in events[0]["message"]
        with open(dev, "rb") as f:
            assert f.read(1 << 20) == bytes(1 << 20)  # untouched
    rx, _ = start_receiver("--listen", "127.0.0.1:0", "--mode", "read", "--sink", "/dev/zero",
                           "--allow-device-sink")  # allowed: it starts
    rx.close()
    rx, _ = start_receiver("--listen", "127.0.0.1:0", "--mode", "read", "--sink", "/dev/null")
    rx.close()
