"""The receiver-side record of what zcorch created, and how each thing is undone.

`<state_dir>/zcorch-fs-state-<token>.json` (one per FilesystemManager) lists, per configuration and in
creation order, the resources zcorch made: directories, sparse backing files, loop devices, md arrays,
btrfs device registrations, mounts. An entry is written *before* the step that creates it, so a
controller killed at any moment leaves a record that covers everything it made (a loop device is
found again through its backing file with `losetup -j`, even if its name was never recorded).
Undo only ever touches what an entry names, and checks it is still zcorch's before acting: the host's own
code does it (zcorch.worker.watchdog.restore_fs, the watchdog's), for the live manager and, kept within the
run's own directories and loops, for a killed controller's file (which may be hand-edited or not ours).
"""
from __future__ import annotations

import getpass
import json
import os
import posixpath
import re
import socket
import time
from typing import Any, Optional

from zcorch.errors import PreflightError
from zcorch.provision.fs_probe import read_text
from zcorch.hosts.local import Host

STATE_PREFIX = "zcorch-fs-state-"
FORMAT = "zcorch-fs-state"
# Tokens of managers alive in this process: cleanup_stale from the same process leaves them alone.
ACTIVE_TOKENS: set = set()


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


def owner_problem(euid_text: str, stat_lines: "list[str]") -> Optional[str]:
    """Pure: why paths must not be acted on, from `id -u` and their `stat -L -c '%u %a %n'` lines (None if
    every one is the effective user's and writable by no one else)."""
    euid = int(euid_text.strip())
    for line in stat_lines:
        owner, mode, name = line.split(" ", 2)
        if int(owner) != euid:
            return f"{name} is owned by uid {owner}, not by uid {euid} who runs the cleanup — remove it or chown it"
        if int(mode, 8) & 0o022:
            return f"{name} is writable by group or others (mode {int(mode, 8):04o}) — chmod go-w {name}"
    return None


# Lease.take's one command before the lock (a constant script; the directories arrive as its $1 and $2, no value
# goes through the shell): the host-wide directory $2 when given and the host's root can make it (0700), with the
# inode of this network namespace; else `~` of $1 expanded as on the host and the directory made (0700); then
# its resolved path, the namespace inode (empty for $1), the effective uid and the directory's owner and mode,
# one per line. One round trip, not four (printenv HOME, mkdir, id -u, stat): a sweep takes a lease on each host
# before anything else.
_PREPARE_DIR = ('d=$1; n=; if [ -n "$2" ] && [ "$(id -u)" = 0 ] && mkdir -p -m 0700 -- "$2" 2>/dev/null; then '
                'd=$2; n=$(stat -L -c %i /proc/self/ns/net) || exit 1; else '
                'case $d in "~") d=$HOME ;; "~/"*) d=$HOME/${d#"~/"} ;; esac; '
                'case $d in /*) ;; *) echo "\\$HOME is not an absolute path (${HOME:-unset}) to place $1" >&2; exit 1 ;; esac; '
                'mkdir -p -m 0700 -- "$d"; fi; '
                'printf "%s\\n%s\\n" "$d" "$n" && id -u && stat -L -c "%u %a %n" -- "$d"')
# Where root keeps a host's leases whatever the inventory's workdir (Lease.take's host_wide): one place per
# machine, shared by every controller, fleet and workdir. Others (who cannot change a host's network) keep
# theirs in the workdir as before.
HOST_LEASE_DIR = "/run/zcorch"

LEASE_NAME = "zcorch-fs.lease"
BUSY = 75  # flock -E: the lock is held by someone else


def _lease_dir(host: Host, state_dir: str, host_wide: Optional[str]) -> "tuple[str, str]":
    """(the directory a lease of `host` lives in, its network namespace inode or ""): `host_wide` when the
    host's root can make it, else `state_dir` (`~/` expanded on the host). PreflightError if others may write
    there: the lock file could be swapped under a holder (two sweeps would then lock two files) or the
    holder's file be planted, so it is refused, as the state files are refused."""
    prep = host.run(["sh", "-c", _PREPARE_DIR, "sh", state_dir, host_wide or ""])
    lines = prep.stdout.splitlines()
    if not prep.ok or len(lines) < 4:
        raise PreflightError(f"{host.name}: cannot hold a lease in {state_dir}: cannot check its owner: "
                             f"{(prep.stderr or prep.stdout).strip()}")
    state_dir, netns = lines[0], lines[1]
    why = owner_problem(lines[2], lines[3:])
    if why:
        raise PreflightError(f"{host.name}: cannot hold a lease in {state_dir}: {why}")
    if netns and not netns.isdigit():
        raise PreflightError(f"{host.name}: cannot tell its network namespace ({netns!r})")
    return state_dir, netns


class Lease:
    """One sweep's hold on a host's state: `flock` on `<state_dir>/<name>` (zcorch-fs.lease: a receiver's
    filesystems; zcorch-net.lease: a host's network, zcorch.provision.network), held by a process on the host
    that ends on stdin EOF (Host.start keeps stdin open while the controller lives: a killed controller's
    lease ends with its pipe or SSH channel). Who holds it is in `<name>.json`."""

    def __init__(self, host: Host, path: str, proc, info: bool = False):
        self.host, self.path, self.proc, self.info = host, path, proc, info

    @classmethod
    def take(cls, host: Host, state_dir: str, timeout: float = 30.0, name: str = LEASE_NAME,
             what: str = "this receiver's filesystems", wait: float = 0.0, token: str = "",
             shared: bool = False, host_wide: Optional[str] = None) -> "Lease":
        """`state_dir` may start with `~/` (the host's home). Raises PreflightError naming the holder when
        another sweep holds it (after `wait` seconds: a just-killed controller's lease ends when its connection
        does). A lease this same sweep (`token`)
        already holds on the same file (two host names for one machine) is shared: release() does nothing.
        shared: a reader's hold (flock -s): readers coexist, an exclusive holder excludes them all.
        host_wide: a directory of the whole host (HOST_LEASE_DIR) used instead of `state_dir` when the host's
        root can make it; the lease is then one per network namespace there (`<name minus .lease>-<netns
        inode>.lease`), whatever workdir a sweep names."""
        state_dir, netns = _lease_dir(host, state_dir, host_wide)
        if netns:
            name = f"{name[:-len('.lease')] if name.endswith('.lease') else name}-{netns}.lease"
        path = posixpath.join(state_dir, name)
        # A constant script (no value goes through the shell): say "held" once locked, then wait for EOF.
        lock = (["-w", f"{wait:g}"] if wait > 0 else ["-n"]) + (["-s"] if shared else [])
        proc = host.start(["flock", *lock, "-E", str(BUSY), path, "sh", "-c", "echo held; exec cat >/dev/null"])
        line = proc.readline(timeout + wait)
        if (line or "").strip() != "held":
            proc.kill_group()
            holder = (read_text(host, path + ".json") or "").strip() or "a sweep holding it shared"
            try:
                mine = bool(token) and json.loads(holder).get("token") == token
            except (ValueError, AttributeError):
                mine = False
            if mine:
                return cls(host, path, None)
            raise PreflightError(f"{host.name}: another sweep holds {what} ({holder}) — wait for it to end "
                                 f"(its lock: {path})")
        if shared:   # many readers: none of them is "the" holder
            return cls(host, path, proc)
        info = {"user": getpass.getuser(), "host": socket.gethostname(), "pid": os.getpid(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **({"token": token} if token else {})}
        host.put_bytes((json.dumps(info) + "\n").encode(), path + ".json", mode=0o600)
        return cls(host, path, proc, info=True)

    def release(self) -> None:
        if self.proc is None:
            return
        if self.info:   # while still held: the next holder's file is never removed
            self.host.run(["rm", "-f", "--", self.path + ".json"])
        self.proc.kill_group()
        try:
            self.proc.wait(10.0)
        except TimeoutError:
            pass


# ControllerLease.take's holder (a constant script; values arrive as $1..$4, no value goes through the shell):
# under the gate's flock, refuse ("busy", then the owner's record) when another controller's group file still
# has a holder; else hold our own group file shared (fd 9, kept by the final `cat` until stdin's EOF), record
# ourselves as the owner, drop the gate and say "held".
_HOLD_FOR_CONTROLLER = (
    'd=$1; b=$2; me=$3; exec 8>>"$d/$b.gate" || exit 1; flock -w 30 8 || { echo gate; exit 75; }; '
    'owner=$(cat -- "$d/$b.owner" 2>/dev/null); '
    'if [ -n "$owner" ] && [ "$owner" != "$me" ] && ! flock -n "$d/$b-$owner.lease" true; then '
    'echo busy; cat -- "$d/$b.owner.json" 2>/dev/null; exit 75; fi; '
    'exec 9>>"$d/$b-$me.lease" || exit 1; flock -s 9 || exit 1; '
    'printf "%s" "$me" > "$d/$b.owner" && printf "%s\n" "$4" > "$d/$b.owner.json" || exit 1; '
    'exec 8>&-; echo held; exec cat >/dev/null')
CONTROLLER_LEASE = "zcorch-controller"


def controller_identity() -> str:
    """This controller machine, as a file-name-safe word: its host name and boot id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()[:8]
    except OSError:
        boot = "noboot"
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{socket.gethostname()}-{boot}")[:100]


class ControllerLease(Lease):
    """One controller machine's hold on a host, for the whole of each of its sweeps: every sweep and fleet pair
    of this controller shares it (the controller's own locks, zcorch.sweep.fleet, order them), a sweep of
    another controller is refused naming the holder. The fleet's locks live on the controller; this one lives
    on the host (HOST_LEASE_DIR as root, one per network namespace; else the state directory), so two
    controllers' fleets never transfer on one host at once. Held by a process on the host that ends with the
    controller's connection (as Lease)."""

    @classmethod
    def take(cls, host: Host, state_dir: str, host_wide: Optional[str] = HOST_LEASE_DIR,
             timeout: float = 45.0) -> "ControllerLease":
        directory, netns = _lease_dir(host, state_dir, host_wide)
        base = f"{CONTROLLER_LEASE}-{netns}" if netns else CONTROLLER_LEASE
        me = controller_identity()
        info = {"controller": socket.gethostname(), "user": getpass.getuser(), "pid": os.getpid(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        proc = host.start(["sh", "-c", _HOLD_FOR_CONTROLLER, "sh", directory, base, me, json.dumps(info)])
        path = posixpath.join(directory, base + ".owner")
        try:
            line = (proc.readline(timeout) or "").strip()
            if line == "held":
                return cls(host, path, proc)
            holder = (proc.readline(5.0) or "").strip() if line == "busy" else ""
        except TimeoutError:
            line, holder = "", ""
        proc.kill_group()
        if line != "busy":
            raise PreflightError(f"{host.name}: cannot take this host's controller lease in {directory} "
                                 f"({line or 'no answer'}: {proc.stderr_text().strip()[:300]})")
        try:
            doc = json.loads(holder)
            who = (f"controller {doc.get('controller')} (pid {doc.get('pid')}, user {doc.get('user')}, "
                   f"since {doc.get('since')})")
        except (ValueError, AttributeError):
            who = f"another controller ({holder or 'unrecorded'})"
        raise PreflightError(f"{host.name}: {who} is running sweeps on this host: a host takes the sweeps of one "
                             f"controller machine at a time — wait for it to end (its lock: {path})")


def lease_held(host: Host, state_dir: str) -> bool:
    """True while some sweep's Lease is held on this state directory (util-linux only: any host can ask)."""
    path = posixpath.join(state_dir, LEASE_NAME)
    return host.run(["test", "-e", path]).ok and host.run(["flock", "-n", "-E", str(BUSY), path, "true"]).returncode == BUSY


def list_state_files(host: Host, state_dir: str) -> "list[str]":
    res = host.run(["find", state_dir, "-maxdepth", "1", "-type", "f", "-name", f"{STATE_PREFIX}*.json"])
    return sorted(line for line in res.stdout.splitlines() if line) if res.ok else []


def owner_alive(data: dict) -> bool:
    """True if the state belongs to a live controller process on this machine (not ours to undo).

    A controller on another machine cannot be asked: its state counts as stale (one sweep per receiver).
    """
    return controller_alive(data.get("owner"), data.get("token"), ACTIVE_TOKENS)


def controller_alive(owner: Any, token: Any, active: "set | frozenset") -> bool:
    """True if `owner` ({"host", "pid"} of a state file) is a live controller process on this machine; this
    process only while `token` (the state's) is among its `active` ones. Another machine's cannot be asked."""
    if not isinstance(owner, dict) or owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
        return False
    if owner["pid"] == os.getpid():
        return token in active
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
