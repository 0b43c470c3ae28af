"""`zcorch worker serve`: one worker process per host for a whole sweep, handed run after run.

Why: an interpreter start-up with the cffi module costs more than a short transfer; a fork of a warm process
does not. Each run is a forked child running what `zcorch worker recv|send ARGS` runs (cli.main), in its own
process group with its own pipes, so a crash ends only its run.

Protocol, one JSON object per line both ways:
    in   {"op": "run", "id": ID, "argv": [...]} | {"op": "signal", "id": ID, "signal": N} | {"op": "exit"} (or EOF)
    out  {"event": "serving", "pid", "version"} once; then per run {"id", "started": PID}, {"id", "out": LINE},
         {"id", "err": TEXT}, {"id", "exit": STATUS} (after all its output; negative: killed by that signal);
         {"event": "error", "message"[, "id"]} for a request it cannot act on.
Single-threaded (a selector), so fork() is safe. Stdlib only (runs on the hosts).
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import sys
from contextlib import suppress

from zcorch._version import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict

SERVE_ACTIONS = ("recv", "send")   # what a served run may be: the transfers (the rest runs as before)
_CHUNK = 65536


class _Child:
    def __init__(self, rid: "Any", pid: int, stdin_w: int, out_r: int, err_r: int):
        self.rid, self.pid, self.stdin_w = rid, pid, stdin_w
        self.open = {out_r: "out", err_r: "err"}
        self.partial = b""


def _write(frame: "Dict[str, Any]") -> None:
    data = memoryview((json.dumps(frame) + "\n").encode())
    while data:
        data = data[os.write(1, data):]


def _child(argv: "list[str]", run: "Callable[[list[str]], int]", fds: "tuple[int, ...]") -> None:
    """In the forked child: its own process group, the run's pipes as 0, 1, 2, nothing else of the server's
    open; then become the run (never returns)."""
    rc = 70
    try:
        os.setpgid(0, 0)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(len(fds), 1 << 16)   # the server's selector and the other runs' pipes are not this run's
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        # what ps and tests see: the process runs `recv` or `send`, not the server
        with suppress(OSError), open("/proc/self/comm", "w") as f:
            f.write(f"zcorch-{argv[0]}"[:15])
        rc = run(argv)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - a child must never fall back into the server's loop
        with suppress(BaseException):
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
    finally:
        os._exit(rc)


class Server:
    def __init__(self, run: "Callable[[list[str]], int]"):
        self.run = run
        self.sel = selectors.DefaultSelector()
        self.children: "Dict[Any, _Child]" = {}
        self.inbuf = b""
        self.running = True

    # -- requests ------------------------------------------------------------------------------
    def _start(self, rid: "Any", argv: "Any") -> None:
        if rid in self.children:
            _write({"event": "error", "id": rid, "message": f"run {rid!r} is already running"})
            return
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)
                and argv[0] in SERVE_ACTIONS):
            _write({"event": "error", "id": rid, "message": f"argv must be a list of strings starting with one of "
                                                            f"{', '.join(SERVE_ACTIONS)}, got {argv!r}"})
            _write({"id": rid, "exit": 2})
            return
        pid, stdin_w, out_r, err_r = self._fork(argv)
        child = _Child(rid, pid, stdin_w, out_r, err_r)
        self.children[rid] = child
        for fd in (out_r, err_r):
            self.sel.register(fd, selectors.EVENT_READ, child)
        _write({"id": rid, "started": pid})

    def _fork(self, argv: "list[str]") -> "tuple[int, int, int, int]":
        """Fork a child for `argv`: (pid, stdin_w, out_r, err_r) of its pipes."""
        pipes = [os.pipe() for _ in range(3)]   # stdin, stdout, stderr
        theirs = (pipes[0][0], pipes[1][1], pipes[2][1])
        mine = (pipes[0][1], pipes[1][0], pipes[2][0])
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            _child(argv, self.run, theirs)
        with suppress(OSError):
            os.setpgid(pid, pid)   # also here: a signal may come before the child ran its own setpgid
        for fd in theirs:
            os.close(fd)
        return (pid, *mine)

    def _signal(self, rid: "Any", sig: "Any") -> None:
        child = self.children.get(rid)
        if child is None or not isinstance(sig, int):
            return   # ended already (its exit frame is on its way), or nonsense: nothing to signal
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, sig)

    def _request(self, line: bytes) -> None:
        try:
            req = json.loads(line)
        except ValueError:
            _write({"event": "error", "message": f"not JSON: {line[:200]!r}"})
            return
        op = req.get("op") if isinstance(req, dict) else None
        if op == "run":
            self._start(req.get("id"), req.get("argv"))
        elif op == "signal":
            self._signal(req.get("id"), req.get("signal"))
        elif op == "exit":
            self.running = False
        else:
            _write({"event": "error", "message": f"unknown request {line[:200]!r}"})

    # -- children ------------------------------------------------------------------------------
    def _output(self, fd: int, child: _Child) -> None:
        data = os.read(fd, _CHUNK)
        kind = child.open[fd]
        if data:
            if kind == "err":
                _write({"id": child.rid, "err": data.decode("utf-8", "replace")})
                return
            *lines, child.partial = (child.partial + data).split(b"\n")
            for line in lines:
                _write({"id": child.rid, "out": line.decode("utf-8", "replace")})
            return
        self.sel.unregister(fd)
        os.close(fd)
        del child.open[fd]
        if not child.open:   # both pipes at EOF: the child has ended (it never closes them itself)
            self._reap(child)

    def _reap(self, child: _Child) -> None:
        _, status = os.waitpid(child.pid, 0)
        if child.partial:
            _write({"id": child.rid, "out": child.partial.decode("utf-8", "replace")})
        os.close(child.stdin_w)
        del self.children[child.rid]
        _write({"id": child.rid, "exit": os.waitstatus_to_exitcode(status)})

    def stop_all(self) -> None:
        """SIGKILL every run's process group and reap its leader."""
        for child in list(self.children.values()):
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
            with suppress(ChildProcessError):
                os.waitpid(child.pid, 0)

    def loop(self) -> None:
        os.set_blocking(0, False)
        self.sel.register(0, selectors.EVENT_READ, None)
        _write({"event": "serving", "pid": os.getpid(), "version": __version__})
        while self.running:
            for key, _ in self.sel.select():
                if key.data is not None:
                    self._output(key.fd, key.data)
                    continue
                try:
                    data = os.read(0, _CHUNK)
                except BlockingIOError:
                    continue
                if not data:   # the controller is gone
                    self.running = False
                    break
                *lines, self.inbuf = (self.inbuf + data).split(b"\n")
                for line in lines:
                    if line.strip():
                        self._request(line)


def serve(run: "Callable[[list[str]], int]") -> None:
    """Serve runs until EOF on stdin or an `exit` request; every run still going is killed then.
    run(argv) -> exit status: what a child does (zcorch.worker.cli.main with the parser built once)."""
    server = Server(run)
    try:
        with suppress(BrokenPipeError):   # the controller stopped reading: it is gone
            server.loop()
    finally:
        server.stop_all()
