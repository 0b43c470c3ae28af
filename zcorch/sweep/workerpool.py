"""The controller's side of `zcorch worker serve` (zcorch.worker.serve): one worker server per host and worker
command for a whole sweep, each run a `ServedRun` (a Process, so the runner drives it as a worker of its own).

A server that dies fails the runs it was serving (their stderr says so) and the next run starts a new one. A
run sent SIGKILL whose end the server does not confirm gets the server killed. ZCORCH_WORKER_SERVER=off starts a
worker process per run instead (the plain path of the benchmark in docs/performance.md).
"""
from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import threading
from contextlib import suppress
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from zcorch.errors import ConfigError, HostError, ZcorchError
from zcorch.hosts.local import Host, Process
from zcorch.hosts.parallel import per_host
from zcorch.sweep import json_object

STARTUP_TIMEOUT = 60.0        # interpreter start-up on a loaded host, over SSH
KILL_CONFIRM_TIMEOUT = 5.0    # a signalled run whose end the server does not report: the server is stuck
_EXIT_TIMEOUT = 5.0


def describe_exit(status: Optional[int]) -> str:
    """How a worker (or its server) ended, as run records say it."""
    if status is None:
        return "was still running (killed)"
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


class ServedRun(Process):
    """One run of a worker server: its output lines, its exit status and its stderr."""

    def __init__(self, server: "WorkerServer", rid: int, argv: List[str]):
        self.host, self.server, self.rid, self.argv = server.host, server, rid, argv
        self.pgid: Optional[int] = None
        self.pid: Optional[int] = None
        self._lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self._err: List[str] = []
        self._status: Optional[int] = None
        self._ended = threading.Event()

    def _exit(self, status: Optional[int], note: Optional[str] = None) -> None:
        if self._ended.is_set():
            return
        if note:
            self._err.append(note + "\n")
        self._status = status
        self._ended.set()
        self._lines.put(None)

    # the Process interface
    def readline(self, timeout: float) -> Optional[str]:
        try:
            line = self._lines.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            raise TimeoutError(f"no output within {timeout:.1f}s") from None
        if line is None:
            self._lines.put(None)   # EOF stays EOF
        return line

    def wait(self, timeout: float) -> int:
        if not self._ended.wait(max(timeout, 0.0)):
            raise TimeoutError(f"still running after {timeout:.1f}s")
        return self._status if self._status is not None else -signal.SIGKILL

    def stderr_text(self) -> str:
        return "".join(self._err)

    def send_line(self, text: str) -> None:
        raise HostError(f"{self.host.name}: a served run reads no stdin (its port is in its arguments)")

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        self.server.signal(self, int(sig))
        if int(sig) == signal.SIGKILL and not self._ended.wait(KILL_CONFIRM_TIMEOUT):
            self.server.kill(f"it did not end run {self.rid} within {KILL_CONFIRM_TIMEOUT:g}s of SIGKILL")


class WorkerServer:
    """`WORKER serve` started on `host`; runs are handed over on its stdin (zcorch.worker.serve)."""

    def __init__(self, host: Host, worker: Sequence[str], env: Optional[Mapping[str, str]] = None):
        self.host, self.worker = host, list(worker)
        self.argv = [*self.worker, "serve"]   # the worker action (zcorch.worker.cli)
        self.proc = host.start(self.argv, env=dict(env) if env else None)
        self.dead: Optional[str] = None
        self._runs: Dict[int, ServedRun] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        try:
            hello = self._first_event()
        except BaseException:
            self.proc.kill_group(signal.SIGKILL)
            raise
        self.pid = hello.get("pid")
        self._reader = threading.Thread(target=self._read, name=f"worker-server-{host.name}", daemon=True)
        self._reader.start()

    def _first_event(self) -> dict:
        try:
            line = self.proc.readline(STARTUP_TIMEOUT)
        except TimeoutError:
            raise HostError(f"{self.host.name}: the worker server did not start within {STARTUP_TIMEOUT:g}s") from None
        event = json_object(line) if line is not None else None
        if event is None or event.get("event") != "serving":
            try:
                status = self.proc.wait(2.0)
            except TimeoutError:
                status = None
            raise HostError(f"{self.host.name}: the worker server did not start (exit {status}, said {line!r}): "
                            f"{self.proc.stderr_text().strip()[-800:]}")
        return event

    def _read(self) -> None:
        while True:
            try:
                line = self.proc.readline(3600.0)
            except TimeoutError:
                continue
            except Exception as exc:  # noqa: BLE001 - a lost link: the runs learn it below
                self._lost(f"{type(exc).__name__}: {exc}")
                return
            if line is None:
                self._lost(None)
                return
            frame = json_object(line)
            if frame is None:
                continue
            with self._lock:
                run = self._runs.get(frame.get("id"))
            if run is None:
                continue
            if "out" in frame:
                run._lines.put(str(frame["out"]))
            elif "err" in frame:
                run._err.append(str(frame["err"]))
            elif "started" in frame:
                run.pid = run.pgid = int(frame["started"])
            elif "exit" in frame:
                with self._lock:
                    self._runs.pop(run.rid, None)
                run._exit(frame["exit"])
            elif frame.get("event") == "error":
                run._err.append(f"worker server: {frame.get('message')}\n")

    def _lost(self, why: Optional[str]) -> None:
        try:
            status = self.proc.wait(2.0)
        except (TimeoutError, ZcorchError):
            status = None
        said = self.proc.stderr_text().strip()[-300:]
        self.dead = (f"the worker server (pid {self.pid}) on {self.host.name} {describe_exit(status)}"
                     + (f" ({why})" if why else "") + (f": {said}" if said else ""))
        with self._lock:
            runs, self._runs = list(self._runs.values()), {}
        for run in runs:
            run._exit(status, self.dead)

    def start(self, args: Sequence[str]) -> ServedRun:
        """Hand the server one run: `args` = the worker's arguments (["recv", "--listen", ...])."""
        if self.dead:
            raise HostError(self.dead)
        args = [str(a) for a in args]
        with self._lock:
            run = ServedRun(self, next(self._ids), [*self.worker, *args])
            self._runs[run.rid] = run
        try:
            self.proc.send_line(json.dumps({"op": "run", "id": run.rid, "argv": args}))
        except (OSError, ZcorchError) as exc:
            with self._lock:
                self._runs.pop(run.rid, None)
            raise HostError(f"{self.host.name}: cannot hand the worker server a run: {exc}") from None
        return run

    def signal(self, run: ServedRun, sig: int) -> None:
        if self.dead:
            return
        with suppress(OSError, ZcorchError):   # gone: its runs end with it (their stdin closes)
            self.proc.send_line(json.dumps({"op": "signal", "id": run.rid, "signal": sig}))

    def kill(self, why: str) -> None:
        """End the server itself (and so its runs); the pool starts another for the next run."""
        if not self.dead:
            self.dead = f"the worker server on {self.host.name} was killed: {why}"
        with suppress(ZcorchError):
            self.proc.kill_group(signal.SIGKILL)

    def close(self) -> None:
        """Ask the server to stop (it kills what still runs), SIGKILL it if it does not."""
        if self.dead is None:
            with suppress(OSError, ZcorchError):
                self.proc.send_line(json.dumps({"op": "exit"}))
        try:
            self.proc.wait(_EXIT_TIMEOUT)
        except TimeoutError:
            self.kill("it did not exit when asked")
            with suppress(TimeoutError):
                self.proc.wait(_EXIT_TIMEOUT)
        except ZcorchError:
            pass
        self._reader.join(timeout=_EXIT_TIMEOUT)


class WorkerPool:
    """One WorkerServer per (host, worker command, environment), started on first use, replaced when it died."""

    def __init__(self) -> None:
        switch = os.environ.get("ZCORCH_WORKER_SERVER", "on")
        if switch not in ("on", "off"):
            raise ConfigError(f"ZCORCH_WORKER_SERVER: expected on or off, got {switch!r}")
        self.serving = switch == "on"
        self._servers: Dict[Tuple[int, Tuple[str, ...], Tuple[Tuple[str, str], ...]], WorkerServer] = {}
        self.restarts: List[str] = []   # why each replaced server ended (the runner's warnings)

    @staticmethod
    def _key(host: Host, worker: Sequence[str], env: Optional[Mapping[str, str]]) -> tuple:
        return id(host), tuple(worker), tuple(sorted((env or {}).items()))

    def start_servers_meanwhile(self, wanted: Sequence[Tuple[Host, Sequence[str], Optional[Mapping[str, str]]]]
                                ) -> "threading.Thread":
        """Start the servers of `wanted` ((host, worker, env)) at once, on a thread the caller joins before anything
        is measured. A server that cannot start is left to the run that needs it (which fails, naming why)."""
        def start() -> None:
            if self.serving:
                distinct = list({self._key(*w): w for w in wanted if self._key(*w) not in self._servers}.values())
                with suppress(ZcorchError):
                    per_host(distinct, lambda w: self.server(*w))

        thread = threading.Thread(target=start, name="worker-servers", daemon=True)
        thread.start()
        return thread

    def server(self, host: Host, worker: Sequence[str], env: Optional[Mapping[str, str]] = None) -> WorkerServer:
        key = self._key(host, worker, env)
        found = self._servers.get(key)
        if found is not None and found.dead:
            self.restarts.append(found.dead)
            found.close()
            found = None
        if found is None:
            found = self._servers[key] = WorkerServer(host, worker, env)
        return found

    def start(self, host: Host, worker: Sequence[str], args: Sequence[str],
              env: Optional[Mapping[str, str]] = None) -> Process:
        if not self.serving:
            return host.start([*worker, *map(str, args)], env=dict(env) if env else None)
        server = self.server(host, worker, env)
        try:
            return server.start(args)
        except HostError as exc:
            # Gone before its reader noticed (a lost link, a killed server): a new one, whose own start
            # says what is wrong with the host if anything is.
            server.kill(str(exc))
            return self.server(host, worker, env).start(args)

    def close(self) -> None:
        servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.close()

    def servers(self) -> List[Any]:
        return list(self._servers.values())
