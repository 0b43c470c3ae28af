"""The `filesystems:` section: an existing directory (never touched) or one provisioned on loop files or devices,
with md or btrfs RAID. What mdadm and mkfs would refuse is refused here at plan time, never half-way through.
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Mapping, Optional

from zcorch.config import checks, fs_options
from zcorch.config import yamlsrc as ys
from zcorch.config.checks import SCRATCH_PLACEHOLDER, Checker

FS_TYPES = ("ext2", "ext3", "ext4", "xfs", "btrfs")
MD_LEVELS = ("raid0", "raid1", "raid10", "raid5", "raid6")
BTRFS_PROFILES = ("single", "dup", "raid0", "raid1", "raid1c3", "raid1c4", "raid10", "raid5", "raid6")
RAID_LEVELS = tuple(dict.fromkeys(MD_LEVELS + BTRFS_PROFILES))
# Fewest member devices each level accepts (mdadm / mkfs.btrfs refuse fewer).
MIN_DEVICES = {"single": 1, "dup": 1, "raid0": 2, "raid1": 2, "raid1c3": 3, "raid1c4": 4,
               "raid10": 4, "raid5": 3, "raid6": 4}
# Smallest filesystems the mkfs tools accept (xfsprogs, mkfs.btrfs).
XFS_MIN_BYTES = 300 * 1024 ** 2
BTRFS_MIN_DEVICE_BYTES = 131072000
MAX_LOOP_DEVICES = 64
FS_KEYS = ("path", "fs", "loop", "devices", "raid", "raid_chunk", "mkfs_options", "mount_options", "allow_destroy",
           "mountpoint")
LOOP_KEYS = ("count", "size", "dir", "direct_io")

_MKFS_OPT_RE = re.compile(r"^[A-Za-z0-9_.,=:/+@%^-]+$")
_MOUNT_OPT_RE = re.compile(r"^[A-Za-z0-9_.=:/+@%-]+$")
_MD_LIST = ", ".join(MD_LEVELS[:-1]) + f" or {MD_LEVELS[-1]}"


@dataclass(frozen=True)
class FilesystemConfig:
    """One entry. `path` set = existing directory; otherwise `fs` is set and zcorch provisions it."""

    name: str
    path: Optional[str] = None
    fs: Optional[str] = None
    raid: Optional[str] = None
    raid_chunk: Optional[int] = None      # bytes
    loop_count: int = 0                   # 0: `devices` instead of loop devices
    loop_size: int = 0                    # bytes per loop device
    loop_dir: Optional[str] = None
    loop_direct_io: bool = False
    devices: "tuple[str, ...]" = ()
    allow_destroy: "tuple[str, ...]" = ()
    mkfs_options: "tuple[str, ...]" = ()
    mount_options: "tuple[str, ...]" = ()
    mountpoint: Optional[str] = None      # `{scratch}/DIR` as written (the manager resolves it on the host)

    @property
    def existing(self) -> bool:
        return self.path is not None

    @property
    def uses_md(self) -> bool:
        return self.raid is not None and self.fs != "btrfs"


def filesystems_from_mapping(data: Mapping, path: str = "<filesystems>") -> "dict[str, FilesystemConfig]":
    """Validate plain data ({name: entry} as a file writes it) through the file's parser; ConfigError if bad."""
    return checks.parse_data("filesystems", data, parse_filesystems, path)


def parse_filesystems(chk: Checker, node: ys.YNode) -> "dict[str, FilesystemConfig]":
    """The `filesystems:` node -> {name: config} of the valid entries; problems go to `chk`."""
    return checks.named_entries(chk, node, "filesystems", FS_KEYS, "filesystem keys", _entry)


def _entry(chk: Checker, fields: dict, node: ys.YMap, path: str, name: str) -> Optional[FilesystemConfig]:
    """One entry, normalised (sizes in bytes, paths normalised), or None if it has problems."""
    forms = [k for k in ("path", "loop", "devices") if k in fields]
    if len(forms) != 1:
        got = "none" if not forms else " and ".join(f"`{f}`" for f in forms)
        chk.problem(node.pos, path, f"needs exactly one of `path` (an existing directory), `loop` "
                                    f"(loop devices the run creates) or `devices`; got {got}")
        return None
    n_problems = len(chk.problems)
    if forms == ["path"]:
        for k in fields:
            if k != "path":
                chk.problem(fields[k][0], f"{path}.{k}", "an existing directory (`path`) is used as it "
                                                         f"is: `{k}` does not apply")
        p = chk.value(fields["path"][1], f"{path}.path", _existing_dir)
        return FilesystemConfig(name=name, path=p) if len(chk.problems) == n_problems else None

    kw: dict = {}
    if "fs" not in fields:
        chk.problem(node.pos, path, f"missing required key `fs` (one of {', '.join(FS_TYPES)})")
    fs = kw["fs"] = chk.field(fields, path, "fs", lambda n: checks.choice(n, FS_TYPES, "filesystem type"))
    size_node = None
    if "loop" in fields:
        loop, size_node = _loop(chk, fields["loop"][1], f"{path}.loop")
        kw.update(loop or {})
        n_dev = kw["loop_count"] if loop else None
    else:
        devices = _device_list(chk, fields["devices"][1], f"{path}.devices", allow_empty=False)
        kw["devices"] = tuple(devices or ())
        n_dev = len(devices) if devices is not None else None
    raid = kw["raid"] = chk.field(fields, path, "raid", lambda n: checks.choice(n, RAID_LEVELS, "RAID level"))
    chunk = kw["raid_chunk"] = chk.field(fields, path, "raid_chunk", checks.positive_size)
    kw["mountpoint"] = chk.field(fields, path, "mountpoint", _mountpoint)
    for key, rx, what in (("mkfs_options", _MKFS_OPT_RE, "mkfs option"),
                          ("mount_options", _MOUNT_OPT_RE, "mount option")):
        if key in fields:
            kw[key] = tuple(_option_list(chk, fields[key][1], f"{path}.{key}", rx, what, fs))
    if "allow_destroy" in fields:
        kpos, child = fields["allow_destroy"]
        if "devices" not in fields:
            chk.problem(kpos, f"{path}.allow_destroy", "only applies to `devices` (loop devices the run "
                                                       "creates need no permission)")
        else:
            allowed = _device_list(chk, child, f"{path}.allow_destroy", allow_empty=True) or []
            for i, dev in enumerate(allowed):
                if n_dev is not None and dev not in kw["devices"]:
                    chk.problem(child.items[i].pos, f"{path}.allow_destroy[{i}]",  # type: ignore[union-attr]
                                f"`{dev}` is not one of this configuration's `devices`")
            kw["allow_destroy"] = tuple(allowed)
    if len(chk.problems) != n_problems or fs is None:
        return None

    # Rules across keys: what mdadm and the mkfs tools would refuse, found now.
    if raid is not None:
        raid_pos = fields["raid"][1].pos
        if fs != "btrfs" and raid not in MD_LEVELS:
            chk.problem(raid_pos, f"{path}.raid", f"`{raid}` is a btrfs profile; for {fs} use {_MD_LIST} (mdadm)")
        elif n_dev is not None and n_dev < MIN_DEVICES[raid]:
            chk.problem(raid_pos, f"{path}.raid", f"{raid} needs at least {MIN_DEVICES[raid]} devices, "
                                                  f"this configuration has {n_dev}")
    elif n_dev is not None and n_dev > 1 and fs != "btrfs":  # btrfs over several devices: mkfs.btrfs's defaults
        chk.problem(node.pos, path, f"{n_dev} devices for {fs} need `raid:` ({_MD_LIST}, built with mdadm)")
    if chunk is not None:
        chunk_pos = fields["raid_chunk"][1].pos
        if fs == "btrfs" or raid is None:
            chk.problem(chunk_pos, f"{path}.raid_chunk", "only for md RAID (a non-btrfs `fs` with `raid:`)")
        elif chunk % 4096:
            chk.problem(chunk_pos, f"{path}.raid_chunk", "must be a multiple of 4KiB")
    size = kw.get("loop_size", 0)
    if size and size_node is not None:
        if fs == "xfs" and _usable_bytes(raid, kw["loop_count"], size) < XFS_MIN_BYTES:
            chk.problem(size_node.pos, f"{path}.loop.size", "xfs needs a filesystem of at least 300MiB")
        if fs == "btrfs" and size < BTRFS_MIN_DEVICE_BYTES:
            chk.problem(size_node.pos, f"{path}.loop.size", f"btrfs needs at least {BTRFS_MIN_DEVICE_BYTES} "
                                                            "bytes (125MiB) per device")
    if len(chk.problems) != n_problems:
        return None
    return FilesystemConfig(name=name, **{k: v for k, v in kw.items() if v is not None})


def _usable_bytes(raid: Optional[str], count: int, size: int) -> int:
    """Rough data capacity of `count` devices of `size` bytes at a RAID level (for minimum-size checks)."""
    data_disks = {None: 1, "single": count, "raid0": count, "raid10": count // 2, "raid5": count - 1,
                  "raid6": count - 2}.get(raid, 1)
    return size * max(data_disks, 1)


def _loop(chk: Checker, node: ys.YNode, path: str) -> "tuple[Optional[dict], Optional[ys.YNode]]":
    """({loop_count, loop_size, loop_dir, loop_direct_io} or None if bad, the `size` node)."""
    fields = chk.mapping(node, path, LOOP_KEYS, "loop settings")
    if not isinstance(node, ys.YMap):
        return None, None
    conf: dict = {"loop_count": 1}
    if "count" in fields:
        conf["loop_count"] = chk.value(fields["count"][1], f"{path}.count",
                                       lambda n: checks.int_range(n, 1, MAX_LOOP_DEVICES), None)
    size_node = None
    if "size" not in fields:
        chk.problem(node.pos, path, "missing required key `size` (size of each loop device, e.g. 2GiB)")
        conf["loop_size"] = None
    else:
        size_node = fields["size"][1]
        conf["loop_size"] = chk.value(size_node, f"{path}.size", checks.positive_size, None)
    if "dir" in fields:
        conf["loop_dir"] = chk.value(fields["dir"][1], f"{path}.dir", _existing_dir, None)
    if "direct_io" in fields:
        conf["loop_direct_io"] = chk.value(fields["direct_io"][1], f"{path}.direct_io", ys.as_bool, None)
    return (conf if None not in conf.values() else None), size_node


def _device_list(chk: Checker, node: ys.YNode, path: str, allow_empty: bool) -> "Optional[list[str]]":
    if not isinstance(node, ys.YSeq):
        chk.problem(node.pos, path, f"expected a list of device paths, got {ys.describe(node)}")
        return None
    if not node.items and not allow_empty:
        chk.problem(node.pos, path, "empty list: name at least one device")
        return None
    out: "list[str]" = []
    for i, item in enumerate(node.items):
        dev = chk.value(item, f"{path}[{i}]", _device, None)
        if dev is None:
            continue
        if dev in out:
            chk.problem(item.pos, f"{path}[{i}]", f"`{dev}` is listed twice")
            continue
        out.append(dev)
    return out


device_list = _device_list  # the top-level `allow_destroy:` (zcorch.config.experiment) is the same kind of list


def _option_list(chk: Checker, node: ys.YNode, path: str, rx, what: str, fs: Optional[str]) -> "list[str]":
    """The items of an option list: plain text naming no device, file or kernel panic (zcorch.config.fs_options)."""
    if not isinstance(node, ys.YSeq):
        chk.problem(node.pos, path, f"expected a list of {what}s (one item per argument), got {ys.describe(node)}")
        return []
    texts: "list[str]" = []
    for i, item in enumerate(node.items):
        text = chk.value(item, f"{path}[{i}]", lambda n: ys.as_str(n, f"a {what}"), None)
        if text is None:
            return []
        if not rx.match(text):
            extra = " or commas (one option per item)" if what == "mount option" else ""
            chk.problem(item.pos, f"{path}[{i}]", f"`{text}`: a {what} may not contain whitespace, quotes "
                                                  f"or shell metacharacters{extra}")
            return []
        texts.append(text)
    if what == "mount option":
        problems = [(i, why) for i, t in enumerate(texts) for why in [fs_options.mount_option_problem(t)] if why]
    elif fs is not None:
        problems = fs_options.mkfs_option_problems(fs, texts)
    else:
        problems = []  # no valid `fs`: already a problem; its tool's rules cannot be applied
    for i, why in problems:
        if fs_options.names_something(why) and "may not name" not in why:
            why += f"; a {what} may not name a device, file or path (devices come only from `loop` or `devices`)"
        chk.problem(node.items[i].pos, f"{path}[{i}]", f"`{texts[i]}`: {why}")
    return [] if problems else texts


def _existing_dir(node: ys.YNode) -> str:
    text = checks.check_abs_path(ys.as_str(node, "a path"), "directory")
    checks.check_braces(text, "path")
    if checks.kernel_fs_path(text):
        # a sink, mountpoint or loop.dir there would write to, mount over or fill kernel interfaces
        raise ys.ValueProblem(f"`{text}` is under /proc or /sys: kernel interfaces, not a directory for data")
    return posixpath.normpath(text)


# A directory name under `{scratch}` a mountpoint may use: letters, digits and `_ . @ + -` (not `.` or `..`).
_MOUNT_NAME_RE = re.compile(r"^[A-Za-z0-9_.@+-]{1,255}$")


def mountpoint_problem(text: str) -> Optional[str]:
    """Why `text` may not be a `mountpoint` (None if it may): only `{scratch}/DIR[/DIR...]` of plain names; an
    absolute path is refused whatever it names (the host judges the directory it opens too)."""
    prefix = SCRATCH_PLACEHOLDER + "/"
    if checks.kernel_fs_path(text):
        return f"`{text}` is under /proc or /sys: kernel interfaces; a filesystem mounts only beneath {prefix}"
    if not text.startswith(prefix):
        return (f"`{text}`: a filesystem is mounted only beneath the run's own directories: write "
                f"`{SCRATCH_PLACEHOLDER}/DIR` (a new or empty directory under the receiver's {SCRATCH_PLACEHOLDER}), "
                "or leave `mountpoint` out (a directory of the run's own under the receiver's workdir); an absolute "
                "path, a system directory or an existing mount point is refused")
    bad = [c for c in text[len(prefix):].split("/") if c in ("", ".", "..") or not _MOUNT_NAME_RE.match(c)]
    if bad:
        return (f"`{text}`: `{bad[0]}` is not a directory name (letters, digits, `_ . @ + -`; no `..`, `.` or empty "
                f"components): the mountpoint stays beneath {SCRATCH_PLACEHOLDER}")
    if len(text) > 1024:
        return f"`{text[:40]}...`: longer than 1024 characters"
    return None


def _mountpoint(node: ys.YNode) -> str:
    text = ys.as_str(node, "a mountpoint")
    why = mountpoint_problem(text)
    if why:
        raise ys.ValueProblem(why)
    return text


def _device(node: ys.YNode) -> str:
    text = ys.as_str(node, "a device path")
    if not text.startswith("/dev/") or len(text) <= 5:
        raise ys.ValueProblem(f"expected a device path under /dev/, got `{text}`")
    if not re.match(r"^/dev/[A-Za-z0-9_./:+-]+$", text) or "/../" in text or text.endswith("/.."):
        raise ys.ValueProblem(f"`{text}` is not a plain device path")
    return posixpath.normpath(text)
