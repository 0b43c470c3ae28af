"""An experiment file can put no device, file or result at risk: refused by `zcorch plan` (exit 2, file:line:col)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from fixtures_spec import at


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
