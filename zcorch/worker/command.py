"""One end of a command baseline, run on its host by the deployed worker (`zcorch worker command`).

The user's argv starts without a shell, stdin and stdout as files; events (ready, listening, exit) are JSON
lines on stdout (docs/architecture.md). Nothing the command starts outlives it: as a child subreaper the
worker gets even a process that left with setsid(), and kills every descendant on the timeout, on
SIGTERM/SIGINT/SIGHUP and after the command exits (`killed`, `leftover` count them). Stdlib only.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from contextlib import suppress
TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the worker imports nothing it does not need at run time
    from typing import Any, Dict, List, Optional

from zcorch.worker import native

LISTEN_WAIT_S = 10.0
STDERR_TAIL = 600
_TCP_LISTEN = "0A"  # the state column of /proc/net/tcp{,6}


def listening(port: int) -> bool:
    """Whether some TCP socket of this network namespace listens on `port` (/proc/net/tcp and tcp6)."""
    want = f"{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with suppress(OSError), open(table, encoding="ascii") as fh:
            next(fh, None)
            for line in fh:
                cols = line.split()
                if len(cols) > 3 and cols[3] == _TCP_LISTEN and cols[1].rsplit(":", 1)[-1] == want:
                    return True
    return False


_PR_SET_CHILD_SUBREAPER = 36
KILL_WAIT_S = 5.0          # how long killing the tree may take before the worker gives up and says so


def become_subreaper() -> bool:
    """Orphans among our descendants are re-parented to this process (not init): none escapes the kill."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> "List[int]":
    """Pids of the live (not zombie) processes below `root`, from /proc's parent links."""
    children: "Dict[int, List[int]]" = {}
    zombies = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(name))
        if fields[0] == b"Z":
            zombies.add(int(name))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            found.append(pid)
            todo.append(pid)
    return [p for p in found if p not in zombies]


def _reap() -> None:
    """Collect the exit status of any dead child (orphans re-parented to us become our children)."""
    with suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def kill_tree(proc: "Optional[subprocess.Popen]" = None) -> int:
    """SIGKILL every descendant of this process until none is left (a process forking meanwhile is caught
    by the next pass); `proc` is waited for first so its exit status stays Popen's. Returns how many
    processes were killed."""
    killed: "set[int]" = set()
    deadline = time.monotonic() + KILL_WAIT_S
    while True:
        pids = descendants(os.getpid())
        if not pids or time.monotonic() > deadline:
            break
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        if proc is not None and proc.returncode is None:
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1.0)
        _reap()
        time.sleep(0.01)
    return len(killed)


def _emit(doc: "Dict[str, Any]") -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def run(argv: "List[str]", stdin: "Optional[str]" = None, stdout: "Optional[str]" = None,
        listen_port: "Optional[int]" = None, sink: "Optional[str]" = None, remove: "List[str] | None" = None,
        timeout: float = 3600.0, wait_go: bool = False) -> "Dict[str, Any]":
    """Run argv as described above; emits the events and returns the exit event."""
    result: "Dict[str, Any]" = {"event": "exit", "rc": None, "wall_s": None, "stderr": "", "sink_bytes": None,
                              "error": None, "killed": 0}
    # Opened as the C core opens a source and a sink: no link followed, judged on the descriptor (WorkerError,
    # an `error` event, before anything starts).
    fin = os.fdopen(native.open_file(stdin or os.devnull, "source"), "rb")
    try:
        out_fd = native.open_file(stdout or os.devnull, "sink", create=True)
    except BaseException:
        fin.close()
        raise
    if stat.S_ISREG(os.fstat(out_fd).st_mode):
        os.ftruncate(out_fd, 0)
    fout = os.fdopen(out_fd, "wb")
    become_subreaper()
    proc: "Optional[subprocess.Popen]" = None

    def on_signal(signum: int, frame: "Any") -> None:
        raise _Stopped(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        if shutil.which(argv[0]) is None:
            fin.close()
            fout.close()
            result.update(rc=127, error=f"{argv[0]}: not found on this host (not on its PATH)")
            return result
        with fin, fout:
            if wait_go:
                _emit({"event": "ready"})
                if not sys.stdin.readline():
                    result.update(rc=125, error="the controller went away before the start")
                    return result
            start = time.monotonic()
            try:
                # in our process group: the controller's kill of the group ends the command too
                proc = subprocess.Popen(argv, stdin=fin, stdout=fout, stderr=subprocess.PIPE)
            except OSError as exc:
                result.update(rc=126, error=f"{argv[0]}: {exc.strerror or exc}")
                return result
            # stderr on a thread: a process the command left behind may hold the pipe open after it exits
            chunks: "List[bytes]" = []
            reader = threading.Thread(target=_drain, args=(proc.stderr, chunks), daemon=True)
            reader.start()
            if listen_port is not None:
                while not listening(listen_port) and proc.poll() is None:
                    if time.monotonic() - start > LISTEN_WAIT_S:
                        break
                    time.sleep(0.005)
                if listening(listen_port):
                    _emit({"event": "listening", "port": listen_port, "after_s": time.monotonic() - start})
            try:
                proc.wait(timeout=timeout)
                result["wall_s"] = time.monotonic() - start
                left = kill_tree(proc)
                if left:
                    result["leftover"] = left
            except subprocess.TimeoutExpired:
                result["wall_s"] = time.monotonic() - start
                result["killed"] = kill_tree(proc)
                result["error"] = (f"killed after the timeout of {timeout:g} s, with the "
                                   f"{result['killed']} process(es) of its tree")
            result["rc"] = proc.returncode
            reader.join(timeout=2.0)
            result["stderr"] = b"".join(chunks).decode("utf-8", "replace")[-STDERR_TAIL:]
            still = descendants(os.getpid())
            if still:
                result["error"] = (result["error"] or "") + f"; processes {still} could not be killed"
        with suppress(OSError):
            result["sink_bytes"] = os.stat(sink).st_size if sink else None
        return result
    except _Stopped as stop:
        result["killed"] = kill_tree(proc)
        if proc is not None:
            result["rc"] = proc.returncode
        result["error"] = (f"stopped by {signal.Signals(stop.args[0]).name} from the controller, with the "
                           f"{result['killed']} process(es) of the command's tree")
        return result
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
        for path in remove or ():
            with suppress(OSError):
                os.unlink(path)
        _emit(result)


class _Stopped(Exception):
    """A signal from the controller ended the command (args[0]: its number)."""


def _drain(stream: "Any", chunks: "List[bytes]") -> None:
    """Read `stream` to EOF keeping about STDERR_TAIL bytes at its end."""
    kept = 0
    for chunk in iter(lambda: stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536), b""):
        chunks.append(chunk)
        kept += len(chunk)
        while kept - len(chunks[0]) > STDERR_TAIL * 4 and len(chunks) > 1:
            kept -= len(chunks.pop(0))
