"""What a path really is, judged by its name on the host: now only for `zcorch worker layout`'s path.

Sources, sinks and a command's stdin/stdout are not judged here: native/core/openpath.c opens them following
no link and judges the descriptor (a check of the name before an open of the name can be raced).

The plan-time rules (zcorch.config: no `/dev` but the allowed devices, nothing under /proc or /sys) read
the text of a path. On the host a path can lead elsewhere: a symlink to a block device, `/proc/self/root/
dev/loop1`, `/dev/fd/3`, a directory linked into /proc/sys, or procfs mounted somewhere else. So before
the worker opens a source, a sink, a command's stdin/stdout or a dd scratch directory, it resolves the path
and checks what it reaches:

- `kernel_fs(path)`: the filesystem type (from /proc/self/mountinfo) of the mount that holds the resolved
  path, when it is a kernel interface (proc, sysfs, debugfs, ...): writing there changes kernel settings
  (`/proc/sys/net/ipv4/tcp_fin_timeout` set to 7 and never restored) and reading can have effects.
- `device_problem(path, allowed)`: the path (after every link) is a block or character device other
  than the `allowed` ones (compared by device number, so another name of /dev/zero is still /dev/zero).

Stdlib only: it runs with the host's python, beside the C core.
"""
from __future__ import annotations

import errno
import os
import stat
TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only
    from typing import Iterable, List, Optional, Tuple

# Kernel interfaces, never data: what a sink, a source or a scratch directory may not be on.
KERNEL_FS_TYPES = frozenset({
    "proc", "sysfs", "debugfs", "tracefs", "securityfs", "configfs", "cgroup", "cgroup2", "bpf", "pstore",
    "efivarfs", "fusectl", "binfmt_misc", "selinuxfs", "smackfs", "hugetlbfs", "mqueue", "devpts", "nsfs",
    "autofs", "rpc_pipefs", "nfsd",
})
SOURCE_DEVICES = ("/dev/zero", "/dev/null", "/dev/urandom")
SINK_DEVICES = ("/dev/null",)


class PathRefused(Exception):
    """A path the worker will not open; `code` is the errno name the event carries."""

    def __init__(self, message: str, code: int = errno.EPERM):
        super().__init__(message)
        self.code = code


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \\ooo
    out, i = [], 0
    while i < len(field):
        code = field[i + 1:i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts(mountinfo: str = "/proc/self/mountinfo") -> "List[Tuple[str, str]]":
    """(mount point, filesystem type) of every mount this process sees, in mountinfo order."""
    out = []
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                left, sep, right = line.partition(" - ")
                cols = left.split()
                if not sep or len(cols) < 5 or not right.split():
                    continue
                out.append((_unescape(cols[4]), right.split()[0]))
    except OSError:
        pass
    return out


def resolve(path: str) -> str:
    """`path` with every link resolved; for a path that does not exist yet (a new sink), its nearest
    existing ancestor resolved plus the rest."""
    return os.path.realpath(path)


def kernel_fs(path: str, table: "Optional[List[Tuple[str, str]]]" = None) -> "Optional[str]":
    """The kernel filesystem type that holds `path` once resolved, or None when it is ordinary storage.
    Without a readable mount table, /proc and /sys by their names."""
    real = resolve(path)
    table = mounts() if table is None else table
    best, fstype = "", None
    for mnt, kind in table:  # later mounts over the same point win, as in the kernel
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, fstype = mnt, kind
    if fstype is not None:
        return fstype if fstype in KERNEL_FS_TYPES else None
    top = real.split("/")[1:2]
    return {"proc": "proc", "sys": "sysfs"}.get(top[0]) if top else None


def _rdevs(names: "Iterable[str]") -> set:
    out = set()
    for name in names:
        try:
            st = os.stat(name)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            out.add((stat.S_IFMT(st.st_mode), st.st_rdev))
    return out


def device_problem(path: str, allowed: "Iterable[str]") -> "Optional[str]":
    """Why `path` may not be opened as a device (None if it is no device, or one of `allowed`, or missing)."""
    try:
        st = os.stat(path)  # follows every link: /proc/self/root/..., /dev/fd/N, a symlink
    except OSError:
        return None
    if not (stat.S_ISBLK(st.st_mode) or stat.S_ISCHR(st.st_mode)):
        return None
    if (stat.S_IFMT(st.st_mode), st.st_rdev) in _rdevs(allowed):
        return None
    kind = "block" if stat.S_ISBLK(st.st_mode) else "character"
    real = resolve(path)
    shown = path if real == path else f"{path} (resolves to {real})"
    allowed = list(allowed)
    if not allowed:
        return f"{shown} exists and is a {kind} device, not a regular file (no device is allowed here)"
    return f"{shown} exists and is a {kind} device, not one of {', '.join(allowed)}"


def check(path: "Optional[str]", what: str, devices: "Iterable[str]" = (), allow_devices: bool = False) -> None:
    """Raise PathRefused when `path` (a `what`: "source", "sink", ...) resolves onto a kernel filesystem, or
    to a device other than `devices` (unless allow_devices: the experiment's `allow_destroy`)."""
    if not path or not path.startswith("/"):
        return  # `mem`, or no path: nothing is opened
    fs = kernel_fs(path)
    if fs is not None:
        real = resolve(path)
        shown = path if real == path else f"{path} (resolves to {real})"
        raise PathRefused(f"{what} {shown} is on {fs}, a kernel interface, not storage: refused (network "
                          "settings belong in `networks:`, which restores them)")
    if not allow_devices:
        why = device_problem(path, tuple(devices))
        if why:
            hint = (" (the experiment must list it in `allow_destroy:`; the worker needs --allow-device-sink)"
                    if what == "sink" else "")
            raise PathRefused(f"{what} {why}: refused{hint}")
