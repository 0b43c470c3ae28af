"""One end of a command baseline, run on its host by the deployed worker (`zcorch worker command`).

    zcorch worker command [--stdin FILE] [--stdout FILE] [--listen-port PORT] [--sink PATH] [--remove PATH]
                          [--wait-go] [--timeout S] -- ARGV...

The user's command (an argv list from `baselines.commands`, placeholders already filled by the controller:
zcorch.sweep.commands) is started without a shell, with stdin from FILE (default /dev/null) and stdout
into FILE (default /dev/null) as file descriptors; `{source}`/`{sink}` are how a command names them
itself. Events, one JSON object a line on stdout:

    {"event": "ready"}                                --wait-go: files open; the command starts when a line
                                                      arrives on stdin (the controller's clock starts then)
    {"event": "listening", "port": P, "after_s": T}   --listen-port: a TCP socket of this host listens on P
    {"event": "exit", "rc": N, "wall_s": T, "stderr": "...tail", "sink_bytes": N|null, "error": "..."|null}

wall_s runs from the start of the command to its exit (time.monotonic). rc 127 with `error` when the
program is not on this host; rc -9 with `error` when --timeout killed it. --sink PATH: its size is reported
after the exit (what arrived), then --remove PATH deletes files the controller created for this baseline.
Stdlib only (it runs with the host's python).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the worker imports nothing it does not need at run time
    from typing import Any, Dict, List, Optional

LISTEN_WAIT_S = 10.0
STDERR_TAIL = 600
_TCP_LISTEN = "0A"  # the state column of /proc/net/tcp{,6}


def listening(port: int) -> bool:
    """Whether some TCP socket of this network namespace listens on `port` (/proc/net/tcp and tcp6)."""
    want = f"{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as fh:
                next(fh, None)
                for line in fh:
                    cols = line.split()
                    if len(cols) > 3 and cols[3] == _TCP_LISTEN and cols[1].rsplit(":", 1)[-1] == want:
                        return True
        except OSError:
            continue
    return False


def _emit(doc: "Dict[str, Any]") -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def _size(path: "Optional[str]") -> "Optional[int]":
    try:
        return os.stat(path).st_size if path else None
    except OSError:
        return None


def run(argv: "List[str]", stdin: "Optional[str]" = None, stdout: "Optional[str]" = None,
        listen_port: "Optional[int]" = None, sink: "Optional[str]" = None, remove: "List[str] | None" = None,
        timeout: float = 3600.0, wait_go: bool = False) -> "Dict[str, Any]":
    """Run argv as described above; emits the events and returns the exit event."""
    result: "Dict[str, Any]" = {"event": "exit", "rc": None, "wall_s": None, "stderr": "", "sink_bytes": None,
                              "error": None}
    try:
        if shutil.which(argv[0]) is None:
            result.update(rc=127, error=f"{argv[0]}: not found on this host (not on its PATH)")
            return result
        with open(stdin or os.devnull, "rb") as fin, open(stdout or os.devnull, "wb") as fout:
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
            if listen_port is not None:
                while not listening(listen_port) and proc.poll() is None:
                    if time.monotonic() - start > LISTEN_WAIT_S:
                        break
                    time.sleep(0.005)
                if listening(listen_port):
                    _emit({"event": "listening", "port": listen_port, "after_s": time.monotonic() - start})
            try:
                _, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
                result["error"] = f"killed after the timeout of {timeout:g} s"
            result["wall_s"] = time.monotonic() - start
            result["rc"] = proc.returncode
            result["stderr"] = err.decode("utf-8", "replace")[-STDERR_TAIL:]
        result["sink_bytes"] = _size(sink)
        return result
    finally:
        for path in remove or ():
            try:
                os.unlink(path)
            except OSError:
                pass
        _emit(result)
