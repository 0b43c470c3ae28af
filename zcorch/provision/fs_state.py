"""The receiver-side record of what zcorch created, and the leases that keep sweeps apart.

`<state_dir>/zcorch-fs-state-<token>.json` (one per FilesystemManager) lists, per configuration and in
creation order, the resources zcorch made, each written *before* the step that creates it: a controller
killed at any moment leaves a record of everything it made. Undo (the host's own code,
zcorch.worker.watchdog.restore_fs) touches only what an entry names, after checking it is still zcorch's.
"""
from __future__ import annotations

import contextlib
import getpass
import json
import os
import posixpath
import re
import socket
import time
from pathlib import Path
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


# A lease's directory in one round trip (a constant script, values as $1 $2): the host-wide $2 if root can make
# it (0700), with this network namespace's inode, else $1 with `~` expanded, made 0700; then prints its path,
# the inode (empty for $1), the effective uid and the directory's `owner mode path`, one per line.
_PREPARE_DIR = ('d=$1; n=; if [ -n "$2" ] && [ "$(id -u)" = 0 ] && mkdir -p -m 0700 -- "$2" 2>/dev/null; then '
                'd=$2; n=$(stat -L -c %i /proc/self/ns/net) || exit 1; else '
                'case $d in "~") d=$HOME ;; "~/"*) d=$HOME/${d#"~/"} ;; esac; '
                'case $d in /*) ;; *) echo "\\$HOME is not an absolute path (${HOME:-unset}) to place $1" >&2; exit 1 ;; esac; '
                'mkdir -p -m 0700 -- "$d"; fi; '
                'printf "%s\\n%s\\n" "$d" "$n" && id -u && stat -L -c "%u %a %n" -- "$d"')
# Where root keeps a host's leases whatever the workdir (Lease.take's host_wide).
HOST_LEASE_DIR = "/run/zcorch"

LEASE_NAME = "zcorch-fs.lease"
BUSY = 75  # flock -E: the lock is held by someone else


def _lease_dir(host: Host, state_dir: str, host_wide: Optional[str]) -> "tuple[str, str]":
    """(the lease directory: `host_wide` if root can make it, else `state_dir`; its netns inode or ""). Others
    may not write there (PreflightError): a lock file swapped under its holder would let two sweeps in."""
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
    """One sweep's hold on a host's state: `flock` on `<state_dir>/<name>`, held by a process on the host that
    ends on stdin EOF (a killed controller's lease ends with its connection). Who holds it: `<name>.json`."""

    def __init__(self, host: Host, path: str, proc, info: bool = False):
        self.host, self.path, self.proc, self.info = host, path, proc, info

    @classmethod
    def take(cls, host: Host, state_dir: str, timeout: float = 30.0, name: str = LEASE_NAME,
             what: str = "this receiver's filesystems", wait: float = 0.0, token: str = "",
             shared: bool = False, host_wide: Optional[str] = None) -> "Lease":
        """PreflightError naming the holder when another sweep holds it (after `wait` s); one this sweep (`token`)
        holds already (two names, one machine) is shared, release() a no-op. shared: flock -s."""
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
        with contextlib.suppress(TimeoutError):
            self.proc.wait(10.0)


# ControllerLease.take's holder (a constant script, values as $1..$4): under the gate's flock, "busy" and the
# owner's record if another controller's file has a holder; else hold ours shared until stdin's EOF, and "held".
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
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        boot = "noboot"
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{socket.gethostname()}-{boot}")[:100]


class ControllerLease(Lease):
    """One controller machine's hold on a host (as Lease), shared by its sweeps and fleet pairs: another
    controller's sweeps are refused naming the holder, so two fleets never transfer on one host at once."""

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
    """True if the state belongs to a live controller process on this machine (not ours to undo)."""
    return controller_alive(data.get("owner"), data.get("token"), ACTIVE_TOKENS)


def controller_alive(owner: Any, token: Any, active: "set | frozenset") -> bool:
    """True if `owner` ({"host", "pid"}) is a live controller process on this machine (this one only while
    `token` is among its `active` ones); another machine's cannot be asked."""
    if not isinstance(owner, dict) or owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
        return False
    if owner["pid"] == os.getpid():
        return token in active
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # alive, someone else's
        pass
    return True
