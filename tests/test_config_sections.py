"""The typed sections of an experiment file built from plain data: the same parser (and messages) as a file."""
from __future__ import annotations

import dataclasses

import pytest

from zcorch.config.baselines import BASELINES_OFF, Baselines, DdBaseline, Iperf3Baseline
from zcorch.config.baselines.dd import KIND as DD
from zcorch.config.filesystems import FilesystemConfig, filesystems_from_mapping
from zcorch.config.hosts import DEFAULT_WORKDIR, LOCALHOST, Hosts, HostSpec
from zcorch.errors import ConfigError

ISSUE_EXAMPLE = {
    "array": {"path": "/mnt/array"},
    "ext4-loop": {"fs": "ext4", "loop": {"count": 1, "size": "2GiB"}, "mount_options": ["noatime"]},
    "xfs-stripe": {"fs": "xfs", "loop": {"count": 1, "size": "2GiB"}, "mkfs_options": ["-d", "su=64k,sw=4"]},
    "btrfs-raid0": {"fs": "btrfs", "raid": "raid0", "loop": {"count": 2, "size": "1GiB"}},
    "md-raid0": {"fs": "xfs", "raid": "raid0", "devices": ["/dev/sdb", "/dev/sdc"],
                 "allow_destroy": ["/dev/sdb", "/dev/sdc"]},
    "md-raid6": {"fs": "ext4", "raid": "raid6", "raid_chunk": "64KiB", "loop": {"count": 4, "size": "1GiB"}},
}


# ---------------------------------------------------------------- filesystems

def test_filesystems_from_plain_data_are_normalised():
    configs = filesystems_from_mapping(ISSUE_EXAMPLE)
    assert list(configs) == list(ISSUE_EXAMPLE)
    assert configs["array"] == FilesystemConfig(name="array", path="/mnt/array") and configs["array"].existing
    assert configs["ext4-loop"].loop_size == 2 * 1024 ** 3 and configs["ext4-loop"].loop_count == 1
    assert configs["btrfs-raid0"].loop_count == 2 and not configs["btrfs-raid0"].uses_md
    assert configs["md-raid0"].uses_md and configs["md-raid0"].allow_destroy == ("/dev/sdb", "/dev/sdc")
    assert configs["xfs-stripe"].mkfs_options == ("-d", "su=64k,sw=4")
    assert configs["md-raid6"].raid_chunk == 64 * 1024 and configs["md-raid6"].uses_md
    with pytest.raises(dataclasses.FrozenInstanceError):
        configs["array"].path = "/elsewhere"  # type: ignore[misc]


@pytest.mark.parametrize("entry, needle", [
    ({"fs": "zfs", "loop": {"size": "1GiB"}}, "filesystems.bad.fs: `zfs` is not a filesystem type"),
    ({"fs": "ext4"}, "needs exactly one of `path`"),
    ({"fs": "ext4", "loop": {"size": "1GiB"}, "devices": ["/dev/sdb"]}, "needs exactly one of"),
    ({"fs": "ext4", "loop": {"size": "lots"}}, "filesystems.bad.loop.size: "),
    ({"fs": "ext4", "loop": {"count": 0, "size": "1GiB"}}, "loop.count: expected an integer between 1 and 64"),
    ({"fs": "ext4", "loop": {"count": 2, "size": "1GiB"}}, "2 devices for ext4 need `raid:`"),
    ({"fs": "xfs", "raid": "raid0", "loop": {"count": 1, "size": "1GiB"}}, "raid0 needs at least 2 devices"),
    ({"fs": "ext4", "raid": "raid5", "loop": {"count": 2, "size": "1GiB"}}, "raid5 needs at least 3 devices"),
    ({"fs": "ext4", "raid": "raid6", "loop": {"count": 3, "size": "1GiB"}}, "raid6 needs at least 4 devices"),
    ({"fs": "btrfs", "raid": "raid7", "loop": {"count": 2, "size": "1GiB"}}, "`raid7` is not a RAID level"),
    ({"fs": "xfs", "loop": {"size": "100MiB"}}, "filesystems.bad.loop.size: xfs needs a filesystem of at least 300MiB"),
    ({"fs": "btrfs", "raid": "raid0", "loop": {"count": 2, "size": "64MiB"}}, "btrfs needs at least"),
    ({"fs": "ext4", "devices": ["/dev/sdb"], "allow_destroy": ["/dev/sdc"]}, "`/dev/sdc` is not one of"),
    ({"fs": "ext4", "devices": ["sdb"]}, "expected a device path under /dev/"),
    ({"fs": "ext4", "loop": {"size": "1GiB"}, "mount_options": "noatime"}, "expected a list of mount options"),
    ({"fs": "ext4", "loop": {"size": "1GiB"}, "mkfs_opts": []}, "unknown key `mkfs_opts`"),
    ({"path": "/mnt/a", "fs": "ext4"}, "`fs` does not apply"),
    ({"path": "relative"}, "filesystems.bad.path: expected an absolute directory"),
    ({"fs": "btrfs", "raid": "raid0", "raid_chunk": "64KiB", "loop": {"count": 2, "size": "1GiB"}},
     "raid_chunk: only for md RAID"),
    ({"fs": "ext4", "raid": "raid0", "raid_chunk": 1000, "loop": {"count": 2, "size": "1GiB"}}, "multiple of 4KiB"),
    ("ext4", "expected a mapping of filesystem keys"),
])
def test_bad_entries_name_the_entry_and_the_problem(entry, needle):
    with pytest.raises(ConfigError) as info:
        filesystems_from_mapping({"bad": entry})
    problems = info.value.problems
    assert any(needle in p for p in problems), problems
    assert all("filesystems.bad" in p for p in problems) and all(p.startswith("<filesystems>:") for p in problems)


def test_bad_name_is_reported():
    with pytest.raises(ConfigError, match="`a/b` is not a valid name"):
        filesystems_from_mapping({"a/b": {"path": "/x"}})


# ---------------------------------------------------------------- hosts

def test_hosts_from_plain_data_have_the_file_defaults():
    hosts = Hosts.from_mapping({"sender": {"ssh": "root@10.77.0.2", "data_address": "10.78.0.2"},
                                "receiver": {"ssh": "r", "data_address": "10.78.0.3", "workdir": "/srv/zc/"}})
    assert not hosts.localhost and hosts.sender == HostSpec(ssh="root@10.77.0.2", data_address="10.78.0.2")
    assert hosts.sender.python == "python3" and hosts.workdir("sender") == DEFAULT_WORKDIR == "~/.cache/zcorch"
    assert hosts.fs_state_dir == "/srv/zc/fs" and hosts.receiver.fs_state_dir == "/srv/zc/fs"
    assert hosts.describe() == "sender root@10.77.0.2 -> receiver r"
    assert Hosts.from_mapping(hosts.to_data()) == hosts  # round trip through the file form
    assert Hosts.from_mapping("localhost") == LOCALHOST and LOCALHOST.fs_state_dir == "~/.cache/zcorch/fs"
    assert HostSpec.from_mapping({"ssh": "s", "data_address": "10.0.0.1"}, "sender").workdir == DEFAULT_WORKDIR


@pytest.mark.parametrize("data, needle", [
    ({"sender": {"ssh": "-oProxyCommand=x", "data_address": "10.0.0.1"},
      "receiver": {"ssh": "r", "data_address": "10.0.0.2"}}, "<hosts>:3:10: hosts.sender.ssh: "),
    ({"sender": {"ssh": "s", "data_address": "10.0.0.1"}}, "missing `receiver:`"),
    ({"sender": {"ssh": "s"}, "receiver": {"ssh": "r", "data_address": "10.0.0.2"}},
     "hosts.sender: missing required key `data_address`"),
    ({"sender": {"ssh": "s", "data_address": "10.0.0.1", "pyhton": "python3"},
      "receiver": {"ssh": "r", "data_address": "10.0.0.2"}}, "did you mean `python`?"),
    ("local", "expected `localhost` or a mapping"),
])
def test_hosts_from_bad_data_raise_config_error_with_the_key(data, needle):
    with pytest.raises(ConfigError) as info:
        Hosts.from_mapping(data)
    assert needle in str(info.value)


def test_hosts_invariant_localhost_or_both_specs():
    spec = HostSpec(ssh="s", data_address="10.0.0.1")
    with pytest.raises(ValueError):
        Hosts(localhost=True, sender=spec)
    with pytest.raises(ValueError):
        Hosts(localhost=False, sender=spec)
    assert Hosts.remote(spec, spec).spec("receiver") is spec


# ---------------------------------------------------------------- baselines

def test_baselines_from_plain_data():
    assert Baselines.from_mapping(None) == Baselines() == Baselines(Iperf3Baseline(), DdBaseline())
    assert Baselines.from_mapping(False) == BASELINES_OFF
    b = Baselines.from_mapping({"iperf3": {"per": "sweep", "duration": "3s"}, "dd": {"bs": "32k", "count": "512k"}})
    assert b.iperf3 == Iperf3Baseline(duration=3.0, per="sweep") and b.dd == DdBaseline(bs=32 * 1024, count=512 * 1024)
    assert Baselines.from_mapping({"iperf3": False}) == Baselines(iperf3=None)
    with pytest.raises(ConfigError, match="baselines.iperf3.per: `cell` is not a baseline frequency"):
        Baselines.from_mapping({"iperf3": {"per": "cell"}})
    with pytest.raises(ConfigError, match="baselines.dd.bs"):
        Baselines.from_mapping({"dd": {"bs": "lots"}})
    # dd repeats: an interval for claims about a study's dd; the plan's estimate counts them
    assert Baselines.from_mapping({"dd": {"repeats": 3}}).dd == DdBaseline(repeats=3)
    assert DD.estimate(DdBaseline(repeats=3), [{"filesystem": "a"}, {"filesystem": "b"}], 1e9, 0).tests == 12
    with pytest.raises(ConfigError, match="baselines.dd.repeats"):
        Baselines.from_mapping({"dd": {"repeats": 0}})
    with pytest.raises(ConfigError, match="baselines.iperf3.port: unknown key"):
        Baselines.from_mapping({"iperf3": {"port": 5202}})
