"""The host's own guard over a change the controller makes (`commit confirmed`): started before a network or
filesystem change, it puts the host back by itself unless the controller keeps renewing it.

Started by zcorch.provision.watchdog as `python -c BOOTSTRAP KIND UNDO [--lapse=S] [--owner=JSON]`, its program
framed on stdin (a byte-count line, then the bytes; for `net` netcfg's next); then stdin carries `renew` (the
deadline moves LAPSE s on) or `confirm` (exit). On EOF or no renewal for LAPSE s it restores from UNDO
(`net STATE_DIR`: netcfg's restore; `fs STATE_FILE`: restore_fs) and records that for the next sweep's
`reports`. `restore-fs` is that undo on its own (the next sweep's, or with `--trusted` the live manager's).
Once armed it is its own session leader, silent, ignoring SIGHUP/SIGINT/SIGTERM. docs/experiment-files.md,
"Every host change reverts itself unless confirmed". Stdlib-only, importing nothing from zcorch.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from contextlib import suppress
TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only
    from typing import Any, Dict, List, Optional

RECORD_PREFIX = "zcorch-watchdog-"
HOST_DIR = "/run/zcorch"
FORMAT = "zcorch-watchdog-restored"
LAPSE_S = 15.0          # default; the controller passes its own (zcorch.provision.watchdog.LAPSE_S)
FS_STATE_PREFIX = "zcorch-fs-state-"


def _run(argv: "List[str]", timeout: float = 60.0) -> "subprocess.CompletedProcess":
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 1, "", str(exc))


# -- filesystem undo --------------------------------------------------------------------------

def _loops_of(backing: str) -> "List[str]":
    p = _run(["losetup", "-j", backing, "-O", "NAME", "-n"])
    return [line.strip() for line in p.stdout.splitlines() if line.strip().startswith("/dev/")] if p.returncode == 0 \
        else []


def _mount_source(mnt: str) -> "Optional[str]":
    p = _run(["findmnt", "-n", "-o", "SOURCE", "--mountpoint", mnt])
    return p.stdout.strip() or None if p.returncode == 0 else None


class _FsScope:
    """What a state file (maybe hand-edited, maybe not ours) may undo: paths under the run's own directories
    (`<state dir>/fs-<token>/`, `<loop dir>/zcorch-<token>-<name>/`), loops on backing files there, md arrays of
    only those loops, mounts of those or under those directories. Judged on what a path resolves to: from the
    run's directory down nothing may be a symlink (`zcorch-<token>-x` -> /etc would lead the unlink there)."""

    def __init__(self, state_dir: str, token: str, configs: "Dict[str, Any]"):
        self.session = os.path.join(state_dir, f"fs-{token}")
        self.backing_dirs = {f"zcorch-{token}-{name}" for name in configs}
        files = [r.get("path") or r.get("backing_file") for res in configs.values() for r in res
                 if isinstance(r, dict) and r.get("kind") in ("backing_file", "loop")]
        self.loops = {d for f in files if isinstance(f, str) and self.owns(f) for d in _loops_of(f)}

    def owns(self, path: "Any") -> bool:
        if not isinstance(path, str) or not path.startswith("/") or os.path.normpath(path) != path:
            return False
        parts = path.split("/")
        top = self.session if path == self.session or path.startswith(self.session + "/") else next(
            ("/".join(parts[:i + 1]) for i in range(1, len(parts) - 1) if parts[i] in self.backing_dirs), None)
        if top is None:
            return False
        below = path[len(top):]
        return os.path.realpath(path) == os.path.join(os.path.realpath(os.path.dirname(top)),
                                                       os.path.basename(top)) + below

    def device(self, dev: str) -> bool:
        return dev in self.loops

    def may_unmount(self, mnt: str, source: str) -> bool:
        if self.owns(mnt) or self.device(source):
            return True
        members = _md_members(os.path.basename(source)) if source.startswith("/dev/md") else []
        return bool(members) and all(self.device(m) for m in members)


class _Recorded(_FsScope):
    """The live manager's own record (`restore-fs --trusted`): it made every entry, also on `allow_destroy`'s
    devices, so each is undone as recorded (the recorded mount sources and md members must still match)."""

    def owns(self, path: "Any") -> bool:
        return isinstance(path, str)

    def device(self, dev: str) -> bool:
        return True


def parse_mdstat_arrays(text: str) -> "Dict[str, List[str]]":
    """/proc/mdstat -> {"md0": ["sdb", "sdc"], ...} (member kernel names, without [n] roles)."""
    arrays: "Dict[str, List[str]]" = {}
    for line in text.splitlines():
        m = re.match(r"^(md\S+)\s*:\s*\S+\s+(.*)$", line)
        if m:
            arrays[m.group(1)] = [re.sub(r"\[\d+\](\([A-Z]\))?$", "", w)
                                  for w in m.group(2).split() if "[" in w]
    return arrays


def _md_members(kname: str) -> "List[str]":
    try:
        with open("/proc/mdstat") as f:
            return ["/dev/" + m for m in parse_mdstat_arrays(f.read()).get(kname, [])]
    except OSError:
        return []


def _undo_one(res: "Dict[str, Any]", scope: _FsScope) -> "List[str]":
    """What was undone (empty: nothing to do); ValueError when it is not ours or fails (the undo stops:
    what lies below a mount that would not unmount must not be pulled away)."""
    kind = res.get("kind")
    if kind == "mount":
        mnt = res.get("mountpoint")
        source = _mount_source(mnt) if isinstance(mnt, str) else None
        if source is None:
            return []
        if not scope.may_unmount(mnt, source):
            raise ValueError(f"the mount on {mnt} (of {source}) is not under zcorch's own directories nor on its "
                             "loops: left alone")
        if res.get("sources") and source not in res["sources"]:
            raise ValueError(f"{mnt} is mounted from {source}, not from zcorch's {res['sources']}: left alone")
        for attempt in range(10):   # the killed controller's worker may hold a sink open for a moment
            p = _run(["umount", "--", mnt])
            if p.returncode == 0:
                return [f"unmounted {mnt}"]
            time.sleep(0.3 * (attempt + 1))
        raise ValueError(f"umount {mnt} failed: {p.stderr.strip()}")
    if kind == "md":
        dev = res.get("device")
        members = _md_members(os.path.basename(dev)) if isinstance(dev, str) else []
        if not members:
            return []
        recorded = {os.path.basename(m) for m in res.get("members") or []}
        if not all(scope.device(m) for m in members) or (recorded and not {os.path.basename(m) for m in members}
                                                         <= recorded):
            raise ValueError(f"md array {dev} (members {members}) is not made of zcorch's loops: left alone")
        p = _run(["mdadm", "--stop", dev])
        if p.returncode != 0:
            raise ValueError(f"mdadm --stop {dev} failed: {p.stderr.strip()}")
        for m in members:
            _run(["mdadm", "--zero-superblock", m])
        return [f"stopped md array {dev}"]
    if kind == "btrfs_devices":
        devs = [d for d in res.get("devices") or [] if scope.device(d)]
        if devs:
            _run(["btrfs", "device", "scan", "--forget", *devs])
        return []
    if kind in ("loop", "backing_file"):
        backing = res.get("backing_file") if kind == "loop" else res.get("path")
        if not scope.owns(backing):
            raise ValueError(f"{backing} is not under zcorch's own directories: left alone")
        done = []
        for attempt in range(10):   # an autoclear loop detaches a moment after its umount
            loops = _loops_of(backing)
            if not loops:
                break
            for dev in loops:
                if _run(["losetup", "-d", dev]).returncode == 0:
                    done.append(dev)
            time.sleep(0.1 * (attempt + 1))
        if _loops_of(backing):
            raise ValueError(f"{backing} still backs a loop device")
        said = [f"detached loop device(s) {', '.join(done)}"] if done else []
        if kind == "backing_file" and os.path.lexists(backing):
            os.unlink(backing)
            said.insert(0, f"removed backing file {backing}")
        return said
    if kind == "dir":
        path = res.get("path")
        if not scope.owns(path) or not os.path.isdir(path):
            return []
        if _mount_source(path) is not None:
            raise ValueError(f"{path} is still a mountpoint: not removed")
        try:
            os.rmdir(path)      # only if empty: never deletes anything else
        except OSError as exc:
            raise ValueError(f"rmdir {path}: {exc.strerror}") from None
        return [f"removed directory {path}"]
    return []


def _not_private(path: str, st: "os.stat_result") -> "Optional[str]":
    """Why `path` must not be acted on (None if it may): it must be this user's and writable by no one else."""
    if st.st_uid != os.geteuid():
        return (f"{path} is owned by uid {st.st_uid}, not by uid {os.geteuid()} who runs the cleanup — "
                "remove it or chown it")
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}) — chmod go-w {path}"
    return None


def _read_private_json(path: str) -> "Optional[Dict[str, Any]]":
    """The JSON object at `path` when it is a regular file of this user's that no one else may write, in a
    directory no one else may write (the undo is done as it says); None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        why = (_not_private(os.path.dirname(path), os.stat(os.path.dirname(path))) or
               (_not_private(path, st) if stat.S_ISREG(st.st_mode) else "not a regular file"))
        if why:
            raise ValueError(f"{path}: not trusted, left in place ({why})")
        data = json.load(f)
    return data if isinstance(data, dict) else None


def restore_fs(state_file: str, only: "Optional[str]" = None, trusted: bool = False) -> "Dict[str, Any]":
    """Undo what the filesystem state file records (`only`: that configuration's), newest first; the file is
    rewritten with what stays ("configs" of the answer), and removed when nothing does. trusted: the
    live manager's own record (_Recorded), else only within the run's own directories and loops."""
    out: "Dict[str, Any]" = {"restored": [], "errors": []}
    try:
        data = _read_private_json(state_file)
    except (ValueError, OSError) as exc:
        out["errors"].append(str(exc))
        return out
    if data is None:
        return out
    token, configs = data.get("token"), data.get("configs")
    if not isinstance(token, str) or not isinstance(configs, dict) or \
            os.path.basename(state_file) != f"{FS_STATE_PREFIX}{token}.json":
        out["errors"].append(f"{state_file}: its token {token!r} is not the one of its file name: not acted on")
        return out
    scope = (_Recorded if trusted else _FsScope)(os.path.dirname(state_file), token, configs)
    session = [n for n in configs if n == "(session)"]
    for name in [only] if only is not None else [n for n in reversed(list(configs)) if n not in session] + session:
        resources = configs.get(name) or []
        while resources:
            try:
                what = _undo_one(resources[-1], scope)
            except (ValueError, OSError) as exc:
                out["errors"].append(str(exc))
                break
            out["restored"] += what
            resources.pop()
        if resources:
            break
        configs.pop(name, None)
    out["configs"] = configs
    if out["errors"] or configs:
        tmp = f"{state_file}.tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.rename(tmp, state_file)
    else:
        os.unlink(state_file)
        out["restored"].append(f"removed state file {state_file}")
    return out


# -- the guard --------------------------------------------------------------------------------

def _record_prefix() -> str:
    """`zcorch-watchdog-<network namespace inode>-`: hosts that share a /run (lab hosts, network namespaces of
    one machine) each read only their own records."""
    try:
        return f"{RECORD_PREFIX}{os.stat('/proc/self/ns/net').st_ino}-"
    except OSError:
        return RECORD_PREFIX


def _record(kind: str, undo: str, why: str, lost_at: float, result: "Dict[str, Any]", owner: "Any") -> str:
    """Record a restoration: in the host-wide directory for root, else in the undo's own directory."""
    directory = undo if os.path.isdir(undo) else os.path.dirname(undo)
    if os.geteuid() == 0:
        with suppress(OSError):
            os.makedirs(HOST_DIR, mode=0o700, exist_ok=True)
            directory = HOST_DIR
    path = os.path.join(directory, f"{_record_prefix()}{kind}-{os.getpid()}.json")
    doc = {"format": FORMAT, "kind": kind, "undo": undo, "why": why, "owner": owner, "host": socket.gethostname(),
           "lost_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(lost_at)),
           "restored_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "seconds": round(time.time() - lost_at, 2), "restored": result.get("restored", []),
           "errors": result.get("errors", [])}
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
        f.write("\n")
    os.rename(tmp, path)
    return path


def _restore(kind: str, undo: str, netcfg: "Optional[Dict[str, Any]]") -> "Dict[str, Any]":
    try:
        if kind == "net":
            assert netcfg is not None
            return netcfg["restore"](undo)
        return restore_fs(undo)
    except Exception as exc:   # recorded: the next sweep says what could not be restored and why
        return {"restored": [], "errors": [f"{type(exc).__name__}: {exc}"]}


def guard(kind: str, undo: str, lapse: float, owner: "Any", stream: "Any") -> int:
    """Arm, then wait for renewals on `stream`; restore when they stop. Exit status 0 (confirmed) or 3
    (restored; the record says what)."""
    netcfg: "Optional[Dict[str, Any]]" = None
    if kind == "net":   # netcfg's text, framed: a byte-count line, then the bytes
        size = int(stream.readline())
        program = stream.read(size)
        if len(program) != size:
            raise SystemExit("watchdog: its program ended early on stdin")
        netcfg = {"__name__": "zcorch_netcfg"}
        exec(compile(program, "zcorch/worker/netcfg.py", "exec"), netcfg)
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    if os.getsid(0) != os.getpid():
        with suppress(OSError):   # a process group leader already (sshd's session, Popen's new session)
            os.setsid()
    state = {"last": time.monotonic(), "end": None}
    wake = threading.Event()

    def read() -> None:
        while True:
            try:
                line = stream.readline()
            except (OSError, ValueError):
                line = b""
            if not line:
                state["end"] = state["end"] or "eof"
                wake.set()
                return
            word = line.strip()
            if word == b"renew":
                state["last"] = time.monotonic()
            elif word == b"confirm":
                state["end"] = "confirm"
                wake.set()
                return

    threading.Thread(target=read, daemon=True).start()
    sys.stdout.write(f"armed {os.getpid()}\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)       # nothing more is written to the connection, which may be gone when we restore
    os.dup2(devnull, 2)
    while True:
        left = state["last"] + lapse - time.monotonic()
        if state["end"] or left <= 0:
            break
        wake.wait(min(left, 1.0))
    if state["end"] == "confirm":
        return 0
    lost_wall = time.time()
    if state["end"] == "eof":
        why = "the controller's connection ended (controller killed, SSH session cut)"
    else:
        why = f"no renewal from the controller for {lapse:g} s"
        lost_wall -= lapse
    _record(kind, undo, why, lost_wall, _restore(kind, undo, netcfg), owner)
    return 3


# -- the next sweep's reading -----------------------------------------------------------------

def reports(dirs: "List[str]") -> "List[Dict[str, Any]]":
    """The restorations recorded in `dirs` (and the host-wide directory), each removed once read."""
    prefix = _record_prefix()
    paths: "List[str]" = []
    for d in [HOST_DIR] + list(dirs):
        d = os.path.expanduser(d)
        with suppress(OSError):
            paths += [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.startswith(prefix) and n.endswith(".json")]
    out = []
    for path in dict.fromkeys(paths):   # a directory named twice is read once
        try:
            doc = _read_private_json(path)
        except (ValueError, OSError):
            continue
        if doc and doc.get("format") == FORMAT:
            out.append(doc)
            os.unlink(path)
    return out


def main(argv: "Optional[List[str]]" = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["reports"]:
        print(json.dumps({"reports": reports(args[1:])}))
        return 0
    if args[:1] == ["restore-fs"] and len(args) >= 2:
        only = [a[len("--config="):] for a in args[2:] if a.startswith("--config=")]
        print(json.dumps(restore_fs(os.path.expanduser(args[1]), only[0] if only else None, "--trusted" in args[2:])))
        return 0
    if len(args) < 2 or args[0] not in ("net", "fs"):
        sys.stderr.write("usage: watchdog net STATE_DIR|fs STATE_FILE [--lapse=S] [--owner=JSON] | reports DIR... | "
                         "restore-fs STATE_FILE [--trusted] [--config=NAME]\n")
        return 2
    lapse, owner = LAPSE_S, None
    for a in args[2:]:
        if a.startswith("--lapse="):
            lapse = float(a[len("--lapse="):])
        elif a.startswith("--owner="):
            owner = json.loads(a[len("--owner="):])
    # os._exit: the reader thread may still hold stdin's lock, which a normal interpreter exit would wait on
    os._exit(guard(args[0], os.path.expanduser(args[1]), lapse, owner, sys.stdin.buffer))


if __name__ == "__main__":
    sys.exit(main())
