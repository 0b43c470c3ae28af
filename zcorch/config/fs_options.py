"""`mkfs_options` and `mount_options` of a `filesystems:` entry, read the way mkfs (getopt, with an allow-list of
each tool's letters and keys) and mount read them: whatever names another device or file, makes nothing or
something else, or panics the kernel is refused. Each problem is (index into the list, message)."""
from __future__ import annotations

import re
from collections import namedtuple
from typing import Optional, Sequence

# Values that name a device the way mount/mkfs/blkid resolve one.
_DEVICE_TAG_RE = re.compile(r"(^|[,=])(LABEL|UUID|PARTUUID|PARTLABEL|ID)=", re.IGNORECASE)
DEVICE_REFERENCE = "names another device or file"

# A mkfs: its flags without a value, its letters that take one (value: a key list or a policy), its long options.
_Tool = namedtuple("_Tool", ("name", "flags", "valued", "long_opts"))


def _keys(allowed: str, refused: "dict[str, str]") -> "dict[str, None | str]":
    """A key=value list: key -> None (any value), or a string (the key is refused with that reason)."""
    return {**dict.fromkeys(allowed.split()), **refused}


_DEV = "names another device (devices come only from `loop` or `devices`)"
_FILE = "names a file mkfs would read or write"

_EXT_E = _keys("stride stripe_width stripe-width offset resize packed_meta_blocks lazy_itable_init "
               "lazy_journal_init no_copy_xattrs num_backup_sb root_owner test_fs discard nodiscard quotatype "
               "encoding encoding_flags orphan_file_size assume_storage_prezeroed hash_seed mmp_update_interval "
               "revision", {"android_sparse": "writes a sparse image file instead of the device"})
_EXT_J = _keys("size fast_commit_size location", {"device": _DEV})
_EXT = _Tool("mke2fs", flags="cDFjKqSvVn", valued={
    "b": "int", "C": "int", "E": _EXT_E, "e": ("continue", "remount-ro"), "g": "int", "G": "int", "i": "int",
    "I": "int", "J": _EXT_J, "L": "text", "m": "num", "M": "text", "N": "int", "o": "text", "O": "features",
    "r": "int", "T": "text", "U": "text", "d": _FILE, "l": _FILE, "z": _FILE, "t": "the filesystem type comes "
    "from `fs`"}, long_opts={})
_EXT_REFUSED_FLAGS = {"S": "writes only superblocks over an existing filesystem",
                      "n": "makes no filesystem (a dry run)", "V": "makes no filesystem (prints the version)"}

_XFS_SUB = {
    "b": _keys("size log", {}),
    "m": _keys("crc finobt uuid rmapbt reflink inobtcount bigtime exchange metadir autofsck", {}),
    "d": _keys("agcount agsize cowextsize size sunit su swidth sw noalign extszinherit daxinherit rtinherit "
               "projinherit nodefrag concurrency", {"name": _DEV, "file": _FILE}),
    "i": _keys("size log perblock maxpct align attr projid32bit sparse nrext64 exchange", {}),
    "l": _keys("internal size version sunit su lazy-count agnum concurrency", {"logdev": _DEV, "name": _DEV,
                                                                               "file": _FILE}),
    "n": _keys("size log version ftype parent", {}),
    "r": _keys("extsize size noalign rtgroups rgcount rgsize zoned", {"rtdev": _DEV, "name": _DEV, "file": _FILE}),
    "s": _keys("size log", {}),
}
_XFS = _Tool("mkfs.xfs", flags="fKq", valued={**_XFS_SUB, "L": "text", "p": _FILE, "c": _FILE},
             long_opts={})
_XFS_REFUSED_FLAGS = {"N": "makes no filesystem (a dry run)", "V": "makes no filesystem (prints the version)"}

_BTRFS_PROFILES = ("single", "dup", "raid0", "raid1", "raid1c3", "raid1c4", "raid10", "raid5", "raid6")
_BTRFS = _Tool("mkfs.btrfs", flags="fKMqv", valued={
    "A": "num", "b": "num", "d": _BTRFS_PROFILES, "m": _BTRFS_PROFILES, "L": "text", "n": "num", "s": "num",
    "O": "features", "R": "features", "U": "text", "r": _FILE, "u": _FILE}, long_opts={
    "byte-count": "b", "data": "d", "metadata": "m", "mixed": None, "label": "L", "nodesize": "n",
    "sectorsize": "s", "features": "O", "runtime-features": "R", "uuid": "U", "nodiscard": None, "quiet": None,
    "verbose": None, "force": None, "checksum": "text", "csum": "text", "device-uuid": "text",
    "rootdir": _FILE, "subvol": _FILE, "inode-flags": _FILE, "reflink": _FILE, "shrink": _FILE,
    "compress": _FILE})
_BTRFS_REFUSED_FLAGS = {"V": "makes no filesystem (prints the version)", "h": "makes no filesystem (help)"}

TOOLS = {"ext2": (_EXT, _EXT_REFUSED_FLAGS), "ext3": (_EXT, _EXT_REFUSED_FLAGS), "ext4": (_EXT, _EXT_REFUSED_FLAGS),
         "xfs": (_XFS, _XFS_REFUSED_FLAGS), "btrfs": (_BTRFS, _BTRFS_REFUSED_FLAGS)}
_FEATURE_RE = re.compile(r"^\^?[a-z0-9_-]+$")


# mke2fs takes a feature by its bit too, FEATURE_<C|I|R><n>: the bits e2fsprogs names (lib/e2p/feature.c).
_FEATURE_BITS = {
    "c": ("dir_prealloc", "imagic_inodes", "has_journal", "ext_attr", "resize_inode", "dir_index", "lazy_bg",
          "snapshot_bitmap", "exclude_bitmap", "sparse_super2", "fast_commit", "stable_inodes", "orphan_file"),
    "i": ("compression", "filetype", "needs_recovery", "journal_dev", "meta_bg", None, "extent", "64bit", "mmp",
          "flex_bg", "ea_inode", None, "dirdata", "metadata_csum_seed", "large_dir", "inline_data", "encrypt",
          "casefold"),
    "r": ("sparse_super", "large_file", None, "huge_file", "uninit_bg", "dir_nlink", "extra_isize", None, "quota",
          "bigalloc", "metadata_csum", "replica", "read-only", "project", "shared_blocks", "verity",
          "orphan_present"),
}
_FEATURE_NUMBER_RE = re.compile(r"^feature_([cir])([0-9]+)$", re.IGNORECASE)


def _feature_name(feat: str) -> "tuple[Optional[str], bool]":
    """(name, True) of a feature name or a FEATURE_<C|I|R><bit> e2fsprogs names; (None, False) else."""
    m = _FEATURE_NUMBER_RE.match(feat)
    if not m:
        return feat.lower(), True
    names, bit = _FEATURE_BITS[m.group(1).lower()], int(m.group(2))
    name = names[bit] if bit < len(names) else None
    return name, name is not None


def _value_problem(tool: _Tool, opt: str, kind: object, value: str) -> Optional[str]:
    """Why `value` of option `opt` is refused (None if fine)."""
    if _DEVICE_TAG_RE.search(value):
        return f"`{value}` refers to a device by LABEL/UUID: {DEVICE_REFERENCE}"
    if "/" in value:
        return f"`{value}` is a path: {DEVICE_REFERENCE}"
    if kind == _FILE:
        return f"{opt} {_FILE}"
    if isinstance(kind, str) and kind not in ("int", "num", "text", "features"):
        return f"{opt} is refused: {kind}"
    if kind == "int" and not re.match(r"^[0-9]+$", value):
        return f"{opt} expects a number, got `{value}`"
    if kind == "features":
        for feat in value.split(","):
            name, known = _feature_name(feat.lstrip("^"))
            if not known:
                return (f"{opt} `{feat}` is a feature number mke2fs has no name for: give the feature by its "
                        "name")
            if name == "journal_dev":
                what = "journal_dev" if feat.lstrip("^").lower() == "journal_dev" else f"`{feat}` (journal_dev)"
                return f"{opt} {what} would make the target an external journal ({DEVICE_REFERENCE})"
            if not _FEATURE_RE.match(feat):
                return f"{opt} `{feat}` is not a feature name"
    if isinstance(kind, tuple) and value not in kind:
        return f"{opt} `{value}`: expected one of {', '.join(kind)}"
    if isinstance(kind, dict):
        for item in value.split(","):
            key = item.split("=", 1)[0]
            if key not in kind:
                known = ", ".join(k for k, v in kind.items() if v is None)
                return f"{opt} `{key}` is not a key zcorch passes to {tool.name} (accepted: {known})"
            why = kind[key]
            if isinstance(why, str):
                return f"{opt} `{key}=` {why}"
    return None


def names_something(why: str) -> bool:
    """Whether a problem message is about a device or file the option would name."""
    return DEVICE_REFERENCE in why or _FILE in why or _DEV in why


def mkfs_option_problems(fs: str, items: Sequence[str]) -> "list[tuple[int, str]]":
    """(index, message) for each refused item of `mkfs_options` of an `fs` entry, parsed as its mkfs does."""
    tool, refused_flags = TOOLS[fs]
    problems: "list[tuple[int, str]]" = []
    i = 0
    while i < len(items):
        item = items[i]
        at = i
        i += 1
        if item == "--" or not item.startswith("-") or item == "-":
            problems.append((at, f"`{item}` is not an option: {tool.name} would read it as a device "
                                 f"({DEVICE_REFERENCE}; devices come only from `loop` or `devices`)"))
            continue
        if item.startswith("--"):
            name, eq, value = item[2:].partition("=")
            if name not in tool.long_opts:
                problems.append((at, f"`--{name}` is not an option zcorch passes to {tool.name}"))
                continue
            kind = tool.long_opts[name]
            if kind is None:
                if eq:
                    problems.append((at, f"`--{name}` takes no value"))
                continue
            if not eq:
                if i >= len(items):
                    problems.append((at, f"`--{name}` needs a value"))
                    continue
                value, at = items[i], i
                i += 1
            if isinstance(kind, str) and len(kind) == 1:
                kind = tool.valued[kind]
            why = _value_problem(tool, f"--{name}", kind, value)
            if why:
                problems.append((at, why))
            continue
        # Short options, bundled as getopt allows: "-qF", "-Jsize=4", "-qJ" "size=4".
        j = 1
        while j < len(item):
            letter = item[j]
            j += 1
            if letter in refused_flags:
                problems.append((at, f"-{letter} {refused_flags[letter]}"))
                break
            if letter in tool.flags:
                continue
            if letter not in tool.valued:
                problems.append((at, f"-{letter} is not an option zcorch passes to {tool.name}"))
                break
            value = item[j:]
            if not value:
                if i >= len(items):
                    problems.append((at, f"-{letter} needs a value"))
                    break
                value, at = items[i], i
                i += 1
            why = _value_problem(tool, f"-{letter}", tool.valued[letter], value)
            if why:
                problems.append((at, why))
            break
    return problems


# Mount options that name a device or file, set up a loop device, change what `mount` does, or panic the kernel.
_MOUNT_DEVICE_KEYS = ("device", "logdev", "rtdev", "journal_dev", "journal_path", "loop", "offset", "sizelimit",
                      "usrjquota", "grpjquota", "prjjquota", "helper", "x-mount.mkdir")
_MOUNT_ACTIONS = ("bind", "rbind", "move", "remount", "make-shared", "make-slave", "make-private",
                  "make-unbindable", "make-rshared", "make-rslave", "make-rprivate", "make-runbindable")
_MOUNT_PANIC = {"errors": "panic", "fatal_errors": "panic"}


def mount_option_problem(text: str) -> Optional[str]:
    """Why one `mount_options` item is refused (None if fine)."""
    key, eq, value = text.partition("=")
    low = key.lower()
    if _DEVICE_TAG_RE.search(text) or "/" in text or low in _MOUNT_DEVICE_KEYS:
        return f"`{text}` {DEVICE_REFERENCE}; a mount option may not name a device or path " \
               "(devices come only from `loop` or `devices`)"
    if low in _MOUNT_ACTIONS:
        return f"`{text}` changes what mount does (zcorch mounts the device it made, nothing else)"
    if low in _MOUNT_PANIC and value.lower() == _MOUNT_PANIC[low]:
        return f"`{text}` panics the kernel on the first filesystem error (use errors=remount-ro or continue)"
    return None
