"""Looking at a host's block devices and mounts without changing anything: pure parsers of the tools'
output, the device safety check that guards every mkfs/mdadm/mount, and `snapshot()` for before/after checks.
"""
from __future__ import annotations

import json
import re
import shlex
from typing import Iterator, Mapping, Optional, Sequence

from zcorch.errors import HostError
from zcorch.hosts.local import CommandResult, Host
from zcorch.provision.remote_call import host_python, run_remote


# ---------------------------------------------------------------- pure parsers

def _tree(nodes) -> "Iterator[dict]":
    """Every node of a findmnt/lsblk JSON tree, depth first."""
    for node in nodes or []:
        yield node
        yield from _tree(node.get("children"))


def parse_findmnt_json(text: str) -> "list[dict]":
    """`findmnt -J -b -o TARGET,SOURCE,FSTYPE,OPTIONS,SIZE,AVAIL` -> flat list of filesystems."""
    if not text.strip():
        return []
    return [{k: v for k, v in node.items() if k != "children"} for node in _tree(json.loads(text).get("filesystems"))]


def parse_btrfs_df(text: str) -> "dict[str, str]":
    """`btrfs filesystem df -b MNT` -> {"data": "raid0", "metadata": "raid0", "system": "raid0"}."""
    profiles: dict = {}
    for line in text.splitlines():
        m = re.match(r"^\s*(Data|Metadata|System|Data\+Metadata),\s*([A-Za-z0-9]+):", line)
        if m:
            profiles[m.group(1).lower()] = m.group(2).lower()
    return profiles


def parse_mdadm_detail(text: str) -> dict:
    """`mdadm --detail /dev/mdN` -> {"raid_level", "raid_devices", "chunk_size", "array_size_kib", "members"}."""
    fields: dict = {}
    members: list = []
    for line in text.splitlines():
        m = re.match(r"^\s*([A-Za-z][A-Za-z ]*?)\s*:\s*(.*?)\s*$", line)
        if m and not line.startswith("/dev/"):
            fields[m.group(1).lower()] = m.group(2)
            continue
        m = re.match(r"^\s*\d+\s+\d+\s+\d+\s+\S+\s+.*?(/dev/\S+)\s*$", line)
        if m:
            members.append(m.group(1))
    info: dict = {"raid_level": fields.get("raid level"), "members": members}
    for field, key, convert in (("raid devices", "raid_devices", int), ("chunk size", "chunk_size", str),
                                ("array size", "array_size_kib", lambda v: int(v.split()[0])), ("state", "state", str)):
        if field in fields:
            info[key] = convert(fields[field])
    return info


def parse_wipefs_json(text: str) -> "list[dict]":
    """`wipefs -n -J DEV` -> the signatures found (empty list when none; wipefs prints nothing then)."""
    if not text.strip():
        return []
    return list(json.loads(text).get("signatures") or [])


def lsblk_mountpoints(text: str) -> "list[str]":
    """`lsblk -J -o PATH,MOUNTPOINTS DEV` -> every mountpoint of the device and its partitions/holders."""
    found: list = []
    for node in _tree(json.loads(text).get("blockdevices") if text.strip() else []):
        mps = node.get("mountpoints")
        if mps is None and "mountpoint" in node:  # older lsblk: a single "mountpoint"
            mps = [node["mountpoint"]]
        found.extend(p for p in (mps or []) if p)
    return found


def lsblk_children(text: str) -> "list[str]":
    """`lsblk -J -o PATH,MOUNTPOINTS DEV` -> paths of partitions/holders below the device."""
    nodes = json.loads(text).get("blockdevices") if text.strip() else []
    return [n.get("path") or n.get("name") for top in nodes or [] for n in _tree(top.get("children"))]


def split_options(options: str) -> "list[str]":
    """'rw,noatime,nodelalloc' -> ['rw', 'noatime', 'nodelalloc']."""
    return [o for o in options.split(",") if o]


# ---------------------------------------------------------------- host helpers

def run_checked(host: Host, argv: Sequence[str], what: str, timeout: float = 120.0,
                input: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> CommandResult:
    """Run argv on host; HostError naming the host, the purpose and the command's stderr if it fails."""
    res = host.run(list(argv), timeout=timeout, input=input, env=env)
    if not res.ok:
        detail = (res.stderr or res.stdout).strip() or f"exit status {res.returncode}"
        # mkfs answers a bad option with its whole usage text: the reason is the line before it.
        detail = detail.split("\nUsage:", 1)[0]
        if len(detail) > 800:
            detail = detail[:800] + " [...]"
        raise HostError(f"{host.name}: {what}: `{shlex.join(res.argv)}` failed: {detail}")
    return res


def has_tool(host: Host, tool: str) -> bool:
    # `command -v` is a shell builtin; the tool name is passed as $1, never spliced into the script.
    return host.run(["sh", "-c", 'command -v "$1" >/dev/null 2>&1', "sh", tool]).ok


def read_text(host: Host, path: str) -> Optional[str]:
    """A small file's text, None if it does not exist/is unreadable."""
    res = host.run(["cat", "--", path])
    return res.stdout if res.ok else None


def is_dir(host: Host, path: str) -> bool:
    return host.run(["test", "-d", path]).ok


def findmnt_target(host: Host, path: str, contains: bool = False) -> Optional[dict]:
    """Mount entry whose target is `path` (contains=True: the filesystem holding `path`), None if none."""
    argv = ["findmnt", "-J", "-b", "-o", "TARGET,SOURCE,FSTYPE,OPTIONS,SIZE,AVAIL"]
    argv += ["-T", path] if contains else ["--mountpoint", path]
    res = host.run(argv)
    entries = parse_findmnt_json(res.stdout) if res.ok else []
    return entries[-1] if entries else None


def md_supported(host: Host) -> bool:
    return host.run(["test", "-e", "/proc/mdstat"]).ok


def snapshot(host: Host) -> dict:
    """What teardown must restore: `losetup -a`, `findmnt -rn` and /proc/mdstat (None where md is absent)."""
    loops = host.run(["losetup", "-a"]).stdout
    mounts = host.run(["findmnt", "-rn"]).stdout
    return {"loops": sorted(loops.splitlines()), "mounts": sorted(mounts.splitlines()),
            "mdstat": read_text(host, "/proc/mdstat")}


# ---------------------------------------------------------------- device safety

def device_problems(host: Host, device: str, allowed: bool, where: str) -> "list[str]":
    """Why `device` must not be given to mkfs/mdadm/mount (empty: it may be). Always: not a block device under
    /dev, mounted, held, backing a loop, opened exclusively; unless `allowed` (allow_destroy): anything else."""
    pre = f"{where}: device {device}"
    if not device.startswith("/dev/"):
        return [f"{pre}: refused, not under /dev"]
    res = host.run(["realpath", "-e", "--", device])
    if not res.ok:
        return [f"{pre}: does not exist on {host.name}"]
    real = res.stdout.strip()
    if not real.startswith("/dev/"):
        return [f"{pre}: refused, resolves to {real} which is not under /dev"]
    pre = f"{where}: device {device}" + (f" (= {real})" if real != device else "")
    kind = host.run(["stat", "-L", "-c", "%F", "--", real]).stdout.strip()
    if kind != "block special file":
        return [f"{pre}: refused, not a block device ({kind or 'unknown type'})"]
    problems: list = []
    tree = host.run(["lsblk", "-J", "-o", "PATH,MOUNTPOINTS", real])
    if tree.ok:
        mounts = lsblk_mountpoints(tree.stdout)
        if mounts:
            problems.append(f"{pre}: refused, mounted at {', '.join(mounts)}")
        kids = lsblk_children(tree.stdout)
        if kids:
            problems.append(f"{pre}: refused, in use by {', '.join(kids)} (partitions or holders)")
    elif host.run(["findmnt", "-rn", "--source", real]).ok:
        problems.append(f"{pre}: refused, mounted")
    kname = real.rsplit("/", 1)[1]
    holders = host.run(["ls", "-1", f"/sys/class/block/{kname}/holders"]).stdout.split()
    if holders and not any("in use by" in p for p in problems):
        problems.append(f"{pre}: refused, held by {', '.join(holders)}")
    backed = host.run(["losetup", "--list", "--noheadings", "--output", "NAME", "--associated", real]).stdout.split()
    if backed:
        problems.append(f"{pre}: refused, it backs loop device(s) {', '.join(backed)}")
    excl = run_remote(host, "open-excl", real)
    if excl.returncode == 127:
        problems.append(f"{pre}: cannot check exclusive use: {host_python(host)} not found on {host.name}")
    elif not excl.ok and not problems:
        problems.append(f"{pre}: refused, opened exclusively by another user (mounted elsewhere, "
                        f"btrfs/md member, swap...)")
    if problems:
        return problems
    if allowed:
        return []
    sigs = host.run(["wipefs", "-n", "-J", real])
    if not sigs.ok:
        return [f"{pre}: refused, cannot read its signatures: {sigs.stderr.strip()}"]
    found = parse_wipefs_json(sigs.stdout)
    if found:
        kinds = ", ".join(sorted({s.get("type") or "?" for s in found}))
        return [f"{pre}: refused, carries a {kinds} signature and is not listed in allow_destroy"]
    return [f"{pre}: refused, not listed in allow_destroy (zcorch only formats devices it created "
            f"or that the entry's allow_destroy names)"]
