"""The receiver-side record of what zcorch created, and how each thing is undone.

`<state_dir>/zcorch-fs-state-<token>.json` (one per FilesystemManager) lists, per configuration and in
creation order, the resources zcorch made: directories, sparse backing files, loop devices, md arrays,
btrfs device registrations, mounts. An entry is written *before* the step that creates it, so a
controller killed at any moment leaves a record that covers everything it made (a loop device is
found again through its backing file with `losetup -j`, even if its name was never recorded).
Undo only ever touches what an entry names, and checks it is still zcorch's before acting.
"""
from __future__ import annotations

import json
import os
import posixpath
import shlex
import socket
import time
from typing import Callable, Optional

from zcorch.errors import HostError
from zcorch.provision.fs_probe import findmnt_target, loops_of, parse_mdstat_arrays, read_text
from zcorch.hosts.local import Host

STATE_PREFIX = "zcorch-fs-state-"
FORMAT = "zcorch-fs-state"
Log = Callable[[str], None]
# Tokens of managers alive in this process: cleanup_stale from the same process leaves them alone.
ACTIVE_TOKENS: set = set()


def _noop(_msg: str) -> None:
    pass


class StateFile:
    """One manager's state file on the host. Every change is written through immediately."""

    def __init__(self, host: Host, state_dir: str, token: str, data: Optional[dict] = None):
        self.host = host
        self.path = posixpath.join(state_dir, f"{STATE_PREFIX}{token}.json")
        self.data = data or {"format": FORMAT, "version": 1, "token": token,
                             "owner": {"host": socket.gethostname(), "pid": os.getpid(),
                                       "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
                             "configs": {}}

    def resources(self, name: str) -> list:
        return self.data["configs"].setdefault(name, [])

    def add(self, name: str, resource: dict) -> dict:
        self.resources(name).append(resource)
        self.save()
        return resource

    def save(self) -> None:
        self.host.put_bytes((json.dumps(self.data, indent=1) + "\n").encode(), self.path, mode=0o600)

    def delete(self) -> None:
        self.host.run(["rm", "-f", "--", self.path])


def _do(host: Host, argv: list, log: Log):
    log(f"[{host.name}] {shlex.join(argv)}")
    return host.run(argv)


def _umount(host: Host, res: dict, log: Log) -> Optional[str]:
    mnt = res["mountpoint"]
    entry = findmnt_target(host, mnt)
    if entry is None:
        return None
    ours = set(res.get("sources") or [])
    if ours and entry.get("source") not in ours:
        raise HostError(f"{host.name}: {mnt} is mounted from {entry.get('source')}, not from zcorch's "
                        f"{', '.join(sorted(ours))}: left alone")
    last = None
    for attempt in range(10):  # a just-killed worker may hold its sink open for a moment
        last = _do(host, ["umount", "--", mnt], log)
        if last.ok:
            return f"unmounted {mnt}"
        time.sleep(0.3 * (attempt + 1))
    raise HostError(f"{host.name}: umount {mnt} failed: {last.stderr.strip()}")


def _stop_md(host: Host, res: dict, log: Log) -> Optional[str]:
    dev = res.get("device")
    if not dev:
        return None
    mdstat = read_text(host, "/proc/mdstat") or ""
    arrays = parse_mdstat_arrays(mdstat)
    kname = posixpath.basename(dev)
    if kname not in arrays:
        return None
    members = {posixpath.basename(m) for m in res.get("members") or []}
    if members and not set(arrays[kname]) <= members:
        raise HostError(f"{host.name}: {dev} has members {arrays[kname]}, not zcorch's {sorted(members)}: left alone")
    r = _do(host, ["mdadm", "--stop", dev], log)
    if not r.ok:
        raise HostError(f"{host.name}: mdadm --stop {dev} failed: {r.stderr.strip()}")
    for m in res.get("members") or []:
        # The members were zcorch's loops or allow_destroy devices: clear the superblock so
        # nothing re-assembles the array later.
        _do(host, ["mdadm", "--zero-superblock", m], log)
    return f"stopped md array {dev}"


def _forget_btrfs(host: Host, res: dict, log: Log) -> Optional[str]:
    devs = res.get("devices") or []
    if devs:
        _do(host, ["btrfs", "device", "scan", "--forget", *devs], log)
    return None  # bookkeeping in the kernel only: nothing a user would notice


def _loops_after_autoclear(host: Host, backing: str) -> "list[str]":
    """Loops still on `backing`, giving an autoclear detach (after umount / md stop) a moment to finish."""
    for attempt in range(10):
        loops = loops_of(host, backing)
        if not loops:
            return []
        time.sleep(0.1 * (attempt + 1))
    return loops


def _detach_loops(host: Host, res: dict, log: Log) -> Optional[str]:
    done = []
    for dev in loops_of(host, res["backing_file"]):
        r = _do(host, ["losetup", "-d", dev], log)
        if not r.ok and dev in _loops_after_autoclear(host, res["backing_file"]):
            raise HostError(f"{host.name}: losetup -d {dev} failed: {r.stderr.strip()}")
        done.append(dev)
    return f"detached loop device(s) {', '.join(done)}" if done else None


def _remove_file(host: Host, res: dict, log: Log) -> Optional[str]:
    path = res["path"]
    if not host.run(["test", "-e", path]).ok:
        return None
    if _loops_after_autoclear(host, path):
        raise HostError(f"{host.name}: {path} still backs a loop device: not removed")
    r = _do(host, ["rm", "-f", "--", path], log)
    if not r.ok:
        raise HostError(f"{host.name}: rm {path} failed: {r.stderr.strip()}")
    return f"removed backing file {path}"


def _remove_dir(host: Host, res: dict, log: Log) -> Optional[str]:
    path = res["path"]
    if not host.run(["test", "-d", path]).ok:
        return None
    if findmnt_target(host, path) is not None:
        raise HostError(f"{host.name}: {path} is still a mountpoint: not removed")
    r = _do(host, ["rmdir", "--", path], log)  # only if empty: never deletes anything else
    if not r.ok:
        raise HostError(f"{host.name}: rmdir {path} failed: {r.stderr.strip()}")
    return f"removed directory {path}"


UNDO = {"mount": _umount, "md": _stop_md, "btrfs_devices": _forget_btrfs, "loop": _detach_loops,
        "backing_file": _remove_file, "dir": _remove_dir}


def undo_resources(host: Host, resources: list, log: Log = _noop, on_change: Callable[[], None] = lambda: None
                   ) -> "tuple[list[str], list[str]]":
    """Undo resources newest first, removing each from the list once undone.

    Returns (what was undone, errors). Stops at the first failure: what lies below (a loop under
    a mount that would not unmount) must not be pulled away; the rest stays listed for a retry.
    """
    undone: list = []
    while resources:
        res = resources[-1]
        try:
            what = UNDO[res["kind"]](host, res, log)
        except HostError as exc:
            return undone, [str(exc)]
        if what:
            undone.append(what)
        resources.pop()
        on_change()
    return undone, []


def list_state_files(host: Host, state_dir: str) -> "list[str]":
    res = host.run(["find", state_dir, "-maxdepth", "1", "-type", "f", "-name", f"{STATE_PREFIX}*.json"])
    return sorted(line for line in res.stdout.splitlines() if line) if res.ok else []


def owner_alive(data: dict) -> bool:
    """True if the state belongs to a live controller process on this machine (not ours to undo).

    A controller on another machine cannot be asked: its state counts as stale (one sweep per receiver).
    """
    owner = data.get("owner") or {}
    if owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
        return False
    if owner["pid"] == os.getpid():
        return data.get("token") in ACTIVE_TOKENS
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
