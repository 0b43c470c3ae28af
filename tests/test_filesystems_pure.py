"""The filesystem manager's plans and the probes' output parsers: pure functions on captured real output.

The `filesystems:` schema itself (every rule) is tested in test_config_sections.py and test_spec.py.
"""
from __future__ import annotations

import sys

import pytest

from zcorch.hosts.interpreter import python_argv
from zcorch.config.filesystems import filesystems_from_mapping
from zcorch.errors import ConfigError
from zcorch.provision.filesystems import FilesystemManager
from zcorch.provision.fs_probe import (lsblk_children, lsblk_mountpoints, parse_btrfs_df, parse_findmnt_json,
                             parse_mdadm_detail, parse_wipefs_json)
from zcorch.hosts.local import LocalHost

ISSUE_EXAMPLE = {
    "array": {"path": "/mnt/array"},
    "ext4-loop": {"fs": "ext4", "loop": {"count": 1, "size": "2GiB"}, "mount_options": ["noatime"]},
    "ext4-nodelalloc": {"fs": "ext4", "loop": {"count": 1, "size": "2GiB"}, "mount_options": ["noatime", "nodelalloc"]},
    "xfs-stripe": {"fs": "xfs", "loop": {"count": 1, "size": "2GiB"}, "mkfs_options": ["-d", "su=64k,sw=4"]},
    "btrfs-raid0": {"fs": "btrfs", "raid": "raid0", "loop": {"count": 2, "size": "1GiB"}},
    "md-raid0": {"fs": "xfs", "raid": "raid0", "devices": ["/dev/sdb", "/dev/sdc"],
                 "allow_destroy": ["/dev/sdb", "/dev/sdc"]},
}


def test_plan_commands_of_the_issue_example_cover_every_step():
    fm = FilesystemManager(LocalHost(), filesystems_from_mapping(ISSUE_EXAMPLE), "/var/lib/zcorch-test", dry_run=True)
    plan = fm.plan_commands("btrfs-raid0")
    assert [a[0] for a in plan] == ["mkdir", "truncate", "losetup", "truncate", "losetup", "mkfs.btrfs",
                                    "btrfs", "mkdir", sys.executable, sys.executable]
    assert plan[5] == ["mkfs.btrfs", "-f", "-d", "raid0", "-m", "raid0", "--", "<loop0>", "<loop1>"]
    # mounted by zcorch.worker.remote on the directory it opens beneath the run's own (mount-beneath)
    remote = [*python_argv(sys.executable, "zcorch.worker.remote", safe_path=sys.version_info >= (3, 11))]
    mnt = fm.mountpoint("btrfs-raid0")
    assert plan[-2] == [*remote, "mount-beneath", mnt.rsplit("/", 2)[0], mnt, "btrfs", "", "<loop0>"]
    # autoclear on our loops, by zcorch.worker.remote with the host's python (localhost: this one)
    assert plan[-1] == [*python_argv(sys.executable, "zcorch.worker.remote", safe_path=sys.version_info >= (3, 11)),
                        "loop-autoclear", "<loop0>", "<loop1>"]
    md = fm.plan_commands("md-raid0")
    assert md[0] == ["mdadm", "--create", "<md>", "--run", "--level=raid0", "--raid-devices=2",
                     "--metadata=1.2", "/dev/sdb", "/dev/sdc"]
    assert md[1] == ["mkfs.xfs", "-f", "--", "<md>"] and md[-1][len(remote)] == "mount-beneath"  # no loop step
    ext4 = fm.plan_commands("ext4-nodelalloc")
    assert ext4[-2][len(remote):][3:] == ["ext4", "noatime,nodelalloc", "<loop0>"]
    # ext4 initialises eagerly (no background writer during cells); the user's options come after.
    assert ext4[3] == ["mkfs.ext4", "-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", "--", "<loop0>"]
    assert fm.plan_commands("array") == []
    assert fm.plan_commands("xfs-stripe")[3] == ["mkfs.xfs", "-f", "-d", "su=64k,sw=4", "--", "<loop0>"]


def test_unknown_names_raise_config_error():
    fm = FilesystemManager(LocalHost(), filesystems_from_mapping(ISSUE_EXAMPLE), "/tmp/x", dry_run=True)
    with pytest.raises(ConfigError, match="'nope' is not defined under 'filesystems:'"):
        fm.ensure("nope")
    assert fm.preflight(["nope"]) == ["filesystem 'nope' is not defined under 'filesystems:'"]


# --- captured on this machine (util-linux 2.38.1, btrfs-progs 6.2, kernel 6.18) --------------------

FINDMNT_EXT4 = """{
   "filesystems": [
      {
         "target": "/tmp/fstry/m",
         "source": "/dev/loop0",
         "fstype": "ext4",
         "options": "rw,noatime,nodelalloc",
         "size": 26464256,
         "avail": 24101888
      }
   ]
}
"""

BTRFS_DF = """Data, RAID0: total=134217728, used=0
System, RAID0: total=16777216, used=16384
Metadata, RAID0: total=67108864, used=131072
GlobalReserve, single: total=5767168, used=0
"""

WIPEFS_EXT4 = """{
   "signatures": [
      {
         "device": "loop0",
         "offset": "0x438",
         "type": "ext4",
         "uuid": "75ac3fc3-b238-4d52-b56e-e8bd63b6d0a5",
         "label": null
      }
   ]
}
"""

WIPEFS_NONE = """{
   "signatures": [

   ]
}
"""

LSBLK_MOUNTED = """{
   "blockdevices": [
      {
         "name": "loop0",
         "path": "/dev/loop0",
         "type": "loop",
         "size": 136314880,
         "mountpoints": [
             "/tmp/fstry/m"
         ],
         "fstype": null
      }
   ]
}
"""

LSBLK_UNMOUNTED_WITH_PARTS = """{
   "blockdevices": [
      {"path": "/dev/vdb", "mountpoints": [null],
       "children": [{"path": "/dev/vdb1", "mountpoints": [null]}, {"path": "/dev/vdb2", "mountpoints": ["/boot"]}]}
   ]
}
"""

# No md driver on this machine: mdadm 4.x output as published in the mdadm documentation and
# user reports (layout of `mdadm --detail` and /proc/mdstat for a two-member raid0, metadata 1.2).
MDADM_DETAIL = """/dev/md1:
        Version : 1.2
  Creation Time : Sun Jun  6 17:43:12 2021
     Raid Level : raid0
     Array Size : 937440256 (894.01 GiB 959.94 GB)
   Raid Devices : 2
  Total Devices : 2
    Persistence : Superblock is persistent

    Update Time : Sun Jun  6 17:43:12 2021
          State : clean
 Active Devices : 2
Working Devices : 2
 Failed Devices : 0
  Spare Devices : 0

     Chunk Size : 512K

           Name : host:1  (local to host host)
           UUID : 06234ac8:694ae295:3659e4fc:b59a7d55
         Events : 0

    Number   Major   Minor   RaidDevice State
       0     259        0        0      active sync   /dev/nvme2n1
       1     259        1        1      active sync   /dev/nvme0n1
"""

MDSTAT = """Personalities : [raid0]
md0 : active raid0 sdc[1] sdb[0]
      2093056 blocks super 1.2 512k chunks

md127 : active raid1 loop4[1](F) loop3[0]
      100352 blocks super 1.2 [2/1] [U_]

unused devices: <none>
"""


def test_parse_findmnt():
    (entry,) = parse_findmnt_json(FINDMNT_EXT4)
    assert entry["source"] == "/dev/loop0" and entry["size"] == 26464256
    assert entry["options"].split(",") == ["rw", "noatime", "nodelalloc"]
    assert parse_findmnt_json("") == []


def test_parse_btrfs_df():
    assert parse_btrfs_df(BTRFS_DF) == {"data": "raid0", "system": "raid0", "metadata": "raid0"}


def test_parse_wipefs():
    assert [s["type"] for s in parse_wipefs_json(WIPEFS_EXT4)] == ["ext4"]
    assert parse_wipefs_json(WIPEFS_NONE) == [] and parse_wipefs_json("") == []


def test_lsblk_mounts_and_children():
    assert lsblk_mountpoints(LSBLK_MOUNTED) == ["/tmp/fstry/m"] and lsblk_children(LSBLK_MOUNTED) == []
    assert lsblk_mountpoints(LSBLK_UNMOUNTED_WITH_PARTS) == ["/boot"]
    assert lsblk_children(LSBLK_UNMOUNTED_WITH_PARTS) == ["/dev/vdb1", "/dev/vdb2"]


def test_parse_mdadm_detail():
    info = parse_mdadm_detail(MDADM_DETAIL)
    assert info == {"raid_level": "raid0", "raid_devices": 2, "chunk_size": "512K", "array_size_kib": 937440256,
                    "state": "clean", "members": ["/dev/nvme2n1", "/dev/nvme0n1"]}


def test_parse_mdstat():
    from zcorch.worker.watchdog import parse_mdstat_arrays   # the host's undo judges md arrays by it

    assert parse_mdstat_arrays(MDSTAT) == {"md0": ["sdc", "sdb"], "md127": ["loop4", "loop3"]}
    assert parse_mdstat_arrays("Personalities : \nunused devices: <none>\n") == {}
