"""Where commands run: a Host runs argument lists (never shell strings built from input).

`LocalHost` runs them as local subprocesses; `zcorch.hosts.ssh.SSHHost` runs the same lists over SSH.
Every stage sees only this interface, so it works the same on both.
"""
from __future__ import annotations

import contextlib
import os
import posixpath
import queue
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, List, Mapping, Optional, Sequence

if TYPE_CHECKING:
    from zcorch.config.hosts import HostSpec

from zcorch.errors import HostError
from zcorch.hosts import critical


@dataclass
class CommandResult:
    argv: list
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class Process:
    """A started command whose stdout is read line by line and whose whole process group can be killed."""

    host: "Host"
    pgid: Optional[int]

    def lines(self, timeout: float) -> Iterator[str]:
        """Yield stdout lines until EOF; raise TimeoutError if none arrives within `timeout` s."""
        yield from iter(lambda: self.readline(timeout), None)

    def readline(self, timeout: float) -> Optional[str]:  # pragma: no cover - interface
        """Next stdout line (without newline), None at EOF; TimeoutError after `timeout` s."""
        raise NotImplementedError

    def wait(self, timeout: float) -> int:  # pragma: no cover - interface
        """Exit status; TimeoutError if still running after `timeout` s. Negative = killed by signal."""
        raise NotImplementedError

    def _drain_stderr(self, readline) -> None:
        """Collect stderr on a thread: a full pipe would stall the command."""
        self._err_chunks: list = []
        self._err_t = threading.Thread(target=lambda: self._err_chunks.extend(iter(readline, "")), daemon=True)
        self._err_t.start()

    def stderr_text(self, wait: float = 1.0) -> str:
        self._err_t.join(timeout=wait)
        return "".join(self._err_chunks)

    def send_line(self, text: str) -> None:  # pragma: no cover - interface
        """Write one line to the command's stdin (which stays open)."""
        raise NotImplementedError

    def kill_group(self, sig: int = signal.SIGKILL) -> None:  # pragma: no cover - interface
        """Signal every process of the command's process group (not just the channel)."""
        raise NotImplementedError


def _waiting_for(host: str, argv: Sequence[object], doing: str = "") -> str:
    """How a held Ctrl-C names the command it waits for: "`mkfs.xfs -f -- /dev/loop2` on receiver"."""
    text = shlex.join(str(a) for a in argv)
    return f"{doing}`{text[:80] + ' ...' if len(text) > 80 else text}` on {host}"


def expand_home(home: str, path: str) -> str:
    """`~` and relative paths on a host whose home is `home` -> absolute."""
    path = str(path)
    if path == "~" or path.startswith("~/"):
        return home + path[1:]
    return path if path.startswith("/") else posixpath.join(home, path)


class Host:
    """One machine the sweep uses. `name` is for messages ('sender', 'receiver', 'localhost')."""

    name: str
    # Address the data connection should use to reach this host.
    data_address: str
    is_local: bool = False
    # The `hosts:` entry the host was opened from (SSH hosts); None: the defaults of zcorch.config.hosts apply.
    spec: "Optional[HostSpec]" = None

    def run(self, argv: Sequence[str], timeout: float = 60.0, env: Optional[Mapping[str, str]] = None,
            input: Optional[str] = None) -> CommandResult:
        """Run argv to completion (a signal waits for it: zcorch.hosts.critical); on timeout its group is killed."""
        argv = [str(a) for a in argv]
        with critical.section(_waiting_for(self.name, argv)):
            return self._run(argv, timeout, env, input)

    def _run(self, argv: List[str], timeout: float, env: Optional[Mapping[str, str]],
             input: Optional[str]) -> CommandResult:  # pragma: no cover - interface
        raise NotImplementedError

    def start(self, argv: Sequence[str], env: Optional[Mapping[str, str]] = None) -> Process:  # pragma: no cover
        """Start argv in its own process group; its stdin stays open: EOF there means "controller gone"."""
        raise NotImplementedError

    def put_file(self, local_path: str, remote_path: str, mode: int = 0o644) -> None:
        self.put_bytes(Path(local_path).read_bytes(), remote_path, mode)

    def put_bytes(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:  # pragma: no cover
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _LineReader:
    """Reads a pipe on a thread so readline() can time out without select() on every platform."""

    def __init__(self, readline):
        self._q: "queue.Queue[Optional[str]]" = queue.Queue()
        threading.Thread(target=self._pump, args=(readline,), daemon=True).start()

    def _pump(self, readline) -> None:
        for raw in iter(readline, ""):
            self._q.put(raw.rstrip("\n"))
        self._q.put(None)

    def readline(self, timeout: float) -> Optional[str]:
        try:
            return self._q.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            raise TimeoutError(f"no output within {timeout:.1f}s") from None


class LocalProcess(Process):
    def __init__(self, host: "LocalHost", popen: subprocess.Popen):
        self.host = host
        self.popen = popen
        self.pgid = popen.pid  # start_new_session=True: the child leads its own group
        self._out = _LineReader(popen.stdout.readline)
        self._drain_stderr(popen.stderr.readline)

    def readline(self, timeout: float) -> Optional[str]:
        return self._out.readline(timeout)

    def wait(self, timeout: float) -> int:
        try:
            status = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"still running after {timeout:.1f}s") from None
        self._close_stdin()
        return status

    def send_line(self, text: str) -> None:
        self.popen.stdin.write(text + "\n")
        self.popen.stdin.flush()

    def _close_stdin(self) -> None:
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, sig)


def _kill_session(p: subprocess.Popen) -> None:
    """SIGKILL the process group p leads (start_new_session=True) and reap p."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def _leftover_output(p: subprocess.Popen) -> "tuple[str, str]":
    """What a killed command printed (bounded: a member that left its group may still hold the pipes)."""
    try:
        out, err = p.communicate(timeout=2.0)
    except subprocess.TimeoutExpired:
        for f in (p.stdout, p.stderr):
            f.close()
        return "", "(output lost: a process that left the command's group still holds its pipes)"
    return out or "", err or ""


class LocalHost(Host):
    """This machine, through subprocess. Never uses a shell."""

    is_local = True

    def __init__(self, name: str = "localhost", data_address: str = "127.0.0.1"):
        self.name = name
        self.data_address = data_address

    @staticmethod
    def _env(env: Optional[Mapping[str, str]]) -> Optional[dict]:
        return {**os.environ, **env} if env else None

    def _run(self, argv: List[str], timeout: float, env: Optional[Mapping[str, str]],
             input: Optional[str]) -> CommandResult:
        try:
            # Its own session: on timeout (or Ctrl-C) the whole group goes, not just the direct child
            # (subprocess.run(timeout=) kills only that one; a dd under a shell would keep writing).
            p = subprocess.Popen(argv, stdin=subprocess.PIPE if input is not None else None,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self._env(env),
                                 start_new_session=True)
        except FileNotFoundError as exc:
            return CommandResult(argv, 127, "", f"{argv[0]}: command not found ({exc})")
        except OSError as exc:   # found but cannot be run: not executable (EACCES), not a program (ENOEXEC)...
            return CommandResult(argv, 126, "", f"{argv[0]}: found but cannot be run: {exc.strerror or exc} "
                                                f"(chmod +x it, or install the package that provides it)")
        try:
            out, err = p.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_session(p)
            out, err = _leftover_output(p)
            return CommandResult(argv, -signal.SIGKILL, out, err + f"\n(timed out after {timeout:.1f}s)")
        except BaseException:  # KeyboardInterrupt included: nothing of the command may outlive us
            _kill_session(p)
            raise
        return CommandResult(argv, p.returncode, out, err)

    def start(self, argv, env=None) -> LocalProcess:
        # stdin: a pipe only this controller holds (close_fds keeps it out of other children), so
        # its EOF tells a worker started with --exit-on-stdin-eof that the controller died.
        try:
            with critical.section(_waiting_for(self.name, argv, "starting ")):
                popen = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         stdin=subprocess.PIPE, text=True, env=self._env(env),
                                         start_new_session=True, close_fds=True)
        except OSError as exc:   # missing, or found but not runnable: the caller's error, not a traceback
            raise HostError(f"{self.name}: {argv[0]}: cannot be started: {exc.strerror or exc}") from None
        return LocalProcess(self, popen)

    def put_bytes(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        with critical.section(f"writing {remote_path} on {self.name}"):
            remote_path = os.path.expanduser(remote_path)
            tmp = f"{remote_path}.tmp{os.getpid()}.{time.monotonic_ns()}"
            try:
                os.makedirs(os.path.dirname(remote_path) or ".", exist_ok=True)
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())  # the rename must never expose a file whose data a crash lost
                os.chmod(tmp, mode)
                os.replace(tmp, remote_path)
            except OSError as exc:
                # A full disk (or any failure) leaves the old file as it was and no temp file behind.
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise HostError(f"{self.name}: cannot write {remote_path}: {exc}") from None
