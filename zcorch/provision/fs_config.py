"""The `filesystems:` entries of an experiment file, checked and normalised. Pure: no host access.

Two kinds of entry:

    array:     {path: /mnt/array}                        # existing directory: used and recorded, never touched
    ext4-loop: {fs: ext4, loop: {count: 1, size: 2GiB}, mount_options: [noatime]}
    md-raid0:  {fs: xfs, raid: raid0, devices: [/dev/sdb, /dev/sdc], allow_destroy: [/dev/sdb, /dev/sdc]}

Keys of a provisioned entry: fs (ext2|ext3|ext4|xfs|btrfs), exactly one of loop {count, size, dir,
direct_io} or devices [...], raid (btrfs: its own profiles via mkfs.btrfs -d/-m; other fs: md via mdadm),
raid_chunk (md only), allow_destroy (subset of devices), mkfs_options, mount_options, mountpoint.
`config_problems()` is what the spec validation and the manager's preflight both use.
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from zcorch.units import parse_size

FS_TYPES = ("ext2", "ext3", "ext4", "xfs", "btrfs")
MD_LEVELS = ("raid0", "raid1", "raid10", "raid5", "raid6")
BTRFS_PROFILES = ("single", "dup", "raid0", "raid1", "raid1c3", "raid1c4", "raid10", "raid5", "raid6")
# Fewest member devices each level accepts (mdadm / mkfs.btrfs refuse fewer).
MIN_DEVICES = {"single": 1, "dup": 1, "raid0": 2, "raid1": 2, "raid1c3": 3, "raid1c4": 4,
               "raid10": 4, "raid5": 3, "raid6": 4}
# Smallest filesystems the mkfs tools accept (xfsprogs: "must be larger than 300MB";
# mkfs.btrfs: "minimum size for each btrfs device is 131072000").
XFS_MIN_BYTES = 300 * 1024 ** 2
BTRFS_MIN_DEVICE_BYTES = 131072000

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PATH_KEYS = {"path"}
_PROVISION_KEYS = {"fs", "loop", "devices", "raid", "raid_chunk", "allow_destroy", "mkfs_options",
                   "mount_options", "mountpoint"}
_LOOP_KEYS = {"count", "size", "dir", "direct_io"}


@dataclass(frozen=True)
class FsConfig:
    """One normalised entry. `path` set = existing directory; otherwise `fs` is set and zcorch provisions."""

    name: str
    path: Optional[str] = None
    fs: Optional[str] = None
    raid: Optional[str] = None
    raid_chunk: Optional[int] = None
    loop_count: int = 0
    loop_size: int = 0
    loop_dir: Optional[str] = None
    loop_direct_io: bool = False
    devices: tuple = ()
    allow_destroy: tuple = ()
    mkfs_options: tuple = ()
    mount_options: tuple = ()
    mountpoint: Optional[str] = None

    @property
    def existing(self) -> bool:
        return self.path is not None

    @property
    def uses_md(self) -> bool:
        return self.raid is not None and self.fs != "btrfs"

    @property
    def device_count(self) -> int:
        return self.loop_count if self.loop_count else len(self.devices)


def _abs_path(value: Any, where: str, problems: list) -> Optional[str]:
    if not isinstance(value, str) or not value.startswith("/"):
        problems.append(f"{where}: expected an absolute path, got {value!r}")
        return None
    return posixpath.normpath(value)


def _str_list(value: Any, where: str, problems: list) -> tuple:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        problems.append(f"{where}: expected a list of non-empty strings, got {value!r}")
        return ()
    return tuple(value)


def _usable_bytes(raid: Optional[str], count: int, size: int) -> int:
    """Rough data capacity of `count` devices of `size` bytes at a RAID level (for minimum-size checks)."""
    data_disks = {None: 1, "single": count, "raid0": count, "raid10": count // 2, "raid5": count - 1,
                  "raid6": count - 2}.get(raid, 1)
    return size * max(data_disks, 1)


def parse_config(name: Any, raw: Any) -> "tuple[Optional[FsConfig], list[str]]":
    """Normalise one entry; returns (config or None, problems). Every problem names `filesystems.<name>`."""
    where = f"filesystems.{name}"
    problems: list = []
    if not isinstance(name, str) or not _NAME_RE.match(name):
        problems.append(f"{where}: name must be letters, digits, '.', '_' or '-' (it becomes a directory name)")
    if not isinstance(raw, Mapping):
        return None, problems + [f"{where}: expected a mapping like {{fs: ext4, loop: {{count: 1, size: 1GiB}}}}"
                                 f" or {{path: /mnt/array}}, got {raw!r}"]
    # The spec's normalised form lists every key, absent ones as None: treat those as not given.
    raw = {k: v for k, v in raw.items() if v is not None}
    keys = set(raw)
    if "path" in raw:
        extra = sorted(keys - _PATH_KEYS)
        if extra:
            problems.append(f"{where}: an existing 'path' entry is never provisioned; remove {', '.join(extra)}")
        path = _abs_path(raw["path"], f"{where}.path", problems)
        return (FsConfig(name=name, path=path) if not problems else None), problems

    unknown = sorted(keys - _PROVISION_KEYS)
    if unknown:
        problems.append(f"{where}: unknown key(s) {', '.join(map(str, unknown))} "
                        f"(known: path, {', '.join(sorted(_PROVISION_KEYS))})")
    fs = raw.get("fs")
    if fs not in FS_TYPES:
        problems.append(f"{where}.fs: expected one of {', '.join(FS_TYPES)}, got {fs!r}")
    kw: dict = {}
    if ("loop" in raw) == ("devices" in raw):
        problems.append(f"{where}: give exactly one of 'loop' (zcorch creates loop devices) or 'devices'")
    if "loop" in raw:
        loop = raw["loop"]
        if not isinstance(loop, Mapping):
            problems.append(f"{where}.loop: expected {{count: N, size: SIZE}}, got {loop!r}")
        else:
            bad = sorted(set(loop) - _LOOP_KEYS)
            if bad:
                problems.append(f"{where}.loop: unknown key(s) {', '.join(map(str, bad))} "
                                f"(known: {', '.join(sorted(_LOOP_KEYS))})")
            count = loop.get("count", 1)
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                problems.append(f"{where}.loop.count: expected an integer >= 1, got {count!r}")
                count = 1
            kw["loop_count"] = count
            if "size" not in loop:
                problems.append(f"{where}.loop.size: required (e.g. 2GiB; the backing files are sparse)")
            else:
                try:
                    kw["loop_size"] = parse_size(loop["size"])
                    if kw["loop_size"] <= 0:
                        problems.append(f"{where}.loop.size: must be > 0")
                except ValueError as exc:
                    problems.append(f"{where}.loop.size: {exc}")
            if loop.get("dir") is not None:
                kw["loop_dir"] = _abs_path(loop["dir"], f"{where}.loop.dir", problems)
            direct_io = loop.get("direct_io", False)
            if not isinstance(direct_io, bool):
                problems.append(f"{where}.loop.direct_io: expected true or false, got {direct_io!r}")
            kw["loop_direct_io"] = bool(direct_io)
    if "devices" in raw:
        devs = _str_list(raw["devices"], f"{where}.devices", problems)
        if "devices" in raw and not devs and isinstance(raw["devices"], (list, tuple)):
            problems.append(f"{where}.devices: must not be empty")
        devs = tuple(d for d in (_abs_path(d, f"{where}.devices", problems) for d in devs) if d)
        if len(set(devs)) != len(devs):
            problems.append(f"{where}.devices: lists a device twice")
        kw["devices"] = devs
    allow = _str_list(raw.get("allow_destroy"), f"{where}.allow_destroy", problems)
    allow = tuple(posixpath.normpath(a) for a in allow)
    for a in allow:
        if a not in kw.get("devices", ()):
            problems.append(f"{where}.allow_destroy: {a} is not one of this entry's devices")
    kw["allow_destroy"] = allow

    raid = raw.get("raid")
    levels = BTRFS_PROFILES if fs == "btrfs" else MD_LEVELS
    count = kw.get("loop_count") or len(kw.get("devices", ()))
    if raid is not None:
        if raid not in levels:
            how = "btrfs profile" if fs == "btrfs" else "md RAID level"
            problems.append(f"{where}.raid: expected a {how} ({', '.join(levels)}), got {raid!r}")
        elif count and count < MIN_DEVICES[raid]:
            problems.append(f"{where}.raid: {raid} needs at least {MIN_DEVICES[raid]} devices, got {count}")
    elif count > 1 and fs != "btrfs":  # btrfs over several devices without raid: mkfs.btrfs's defaults
        problems.append(f"{where}: {count} devices need a 'raid' level (md: {', '.join(MD_LEVELS)})")
    if raw.get("raid_chunk") is not None:
        if fs == "btrfs" or raid is None:
            problems.append(f"{where}.raid_chunk: only for md RAID (a non-btrfs fs with 'raid')")
        else:
            try:
                chunk = parse_size(raw["raid_chunk"])
                if chunk < 4096 or chunk % 4096:
                    problems.append(f"{where}.raid_chunk: must be a multiple of 4KiB")
                kw["raid_chunk"] = chunk
            except ValueError as exc:
                problems.append(f"{where}.raid_chunk: {exc}")
    kw["mkfs_options"] = _str_list(raw.get("mkfs_options"), f"{where}.mkfs_options", problems)
    kw["mount_options"] = _str_list(raw.get("mount_options"), f"{where}.mount_options", problems)
    if raw.get("mountpoint") is not None:
        kw["mountpoint"] = _abs_path(raw["mountpoint"], f"{where}.mountpoint", problems)

    size = kw.get("loop_size", 0)
    if size and fs == "xfs" and _usable_bytes(raid, count, size) < XFS_MIN_BYTES:
        problems.append(f"{where}.loop.size: xfs needs a filesystem of at least 300MiB")
    if size and fs == "btrfs" and size < BTRFS_MIN_DEVICE_BYTES:
        problems.append(f"{where}.loop.size: btrfs needs at least {BTRFS_MIN_DEVICE_BYTES} bytes (125MiB) "
                        f"per device")
    if problems:
        return None, problems
    return FsConfig(name=name, fs=fs, raid=raid, **kw), problems


def parse_configs(raw: Any) -> "tuple[dict, list[str]]":
    """All entries of a `filesystems:` mapping -> ({name: FsConfig}, problems)."""
    if raw is None:
        return {}, []
    if not isinstance(raw, Mapping):
        return {}, [f"filesystems: expected a mapping of name -> configuration, got {raw!r}"]
    configs: dict = {}
    problems: list = []
    for name, entry in raw.items():
        cfg, probs = parse_config(name, entry)
        problems.extend(probs)
        if cfg is not None:
            configs[name] = cfg
    return configs, problems


def config_problems(raw: Any) -> "list[str]":
    """Problems of a whole `filesystems:` mapping (empty if valid): for the spec validation."""
    return parse_configs(raw)[1]
