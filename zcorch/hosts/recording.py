"""Hosts that record instead of run: `zcorch run --dry-run` is the real sweep pipeline on these.

Each run/start/put becomes a `Recorded` entry answered with the least the pipeline needs, marked not
measured. A command no baseline kind or pipeline stage (_STAGE_PROGRAMS) declares raises UndeclaredCommand:
a dry run never claims a success it cannot know. RemoteRecordingHost stands for an unconnected SSHHost.
"""
from __future__ import annotations

import json
import os
import posixpath
import queue
import shlex
import signal
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

from zcorch._version import __version__
from zcorch.config.baselines.registry import KINDS
from zcorch.config.checks import SCRATCH_PLACEHOLDER
from zcorch.config.hosts import Hosts, HostSpec
from zcorch.hosts.interpreter import STDIN, module_of
from zcorch.hosts.local import CommandResult, Host, Process, expand_home

NOT_MEASURED = "dry run: not measured"
# $HOME of a host never connected to; shown as `~` (Recorded.display).
REMOTE_HOME = "/__remote_home__"


@dataclass
class Recorded:
    """One thing the pipeline would have done on a host."""

    host: str                      # the Host's name ("localhost", "sender", "receiver")
    kind: str                      # "run" | "start" | "put_file" | "put_bytes"
    argv: List[str] = field(default_factory=list)      # run/start
    env: Dict[str, str] = field(default_factory=dict)  # run/start
    source: Optional[str] = None   # put_file: the local file; put_bytes: "<N bytes>"
    target: Optional[str] = None   # put_file/put_bytes: the path on the host
    mode: Optional[int] = None

    def command(self) -> str:
        """The command as one readable line: `env K=V argv`, a host job of zcorch.worker.remote with its name."""
        if self.kind in ("put_file", "put_bytes"):
            text = f"# copy {self.source} to {self.target} (mode {self.mode:04o})"
        else:
            words = [shlex.quote(a) for a in self.argv]
            on_stdin = (module_of(self.argv) or ("",))[0] == STDIN
            if _action_index(self.argv) is not None and on_stdin:
                words.append("< zcorch/worker/remote.py")   # the module's text goes on stdin
            elif _net_action_index(self.argv) is not None and on_stdin:
                words.append("< zcorch/worker/netcfg.py")
            if self.env:
                words = ["env", *(shlex.quote(f"{k}={v}") for k, v in self.env.items()), *words]
            text = " ".join(words)
            note = _program_note(self.argv)
            if note:
                text += f"  # {note}"
        return text.replace(REMOTE_HOME, "~")

    def display(self) -> str:
        """`host$ command`, as the dry run prints it."""
        return f"{self.host}$ {self.command()}"


class UndeclaredCommand(RuntimeError):
    """A dry run met a command no baseline kind or pipeline stage declares: a bug, never a made-up success."""


class RecordingProcess(Process):
    """A started command that prints the canned `lines` and exits 0 at once."""

    def __init__(self, host: "RecordingHost", lines: Sequence[str]):
        self.host, self.pgid = host, None
        self._lines = list(lines)

    def readline(self, timeout: float) -> Optional[str]:
        return self._lines.pop(0) if self._lines else None

    def wait(self, timeout: float) -> int:
        return 0

    def stderr_text(self) -> str:
        return ""

    def send_line(self, text: str) -> None:
        pass

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        pass


class RecordingServer(RecordingProcess):
    """A started `WORKER serve` (zcorch.worker.serve): each run handed to it is recorded as the worker command
    it stands for (`WORKER recv ...`) and answered as a started one would be, in the server's frames."""

    def __init__(self, host: "RecordingHost", worker: List[str], env: Dict[str, str]):
        super().__init__(host, ())
        self.worker, self.env = worker, env
        self._frames: "queue.Queue[Optional[str]]" = queue.Queue()
        self._frames.put(json.dumps({"event": "serving", "pid": 0, "version": __version__}))

    def readline(self, timeout: float) -> Optional[str]:
        try:
            return self._frames.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            raise TimeoutError(f"no output within {timeout:.1f}s") from None

    def send_line(self, text: str) -> None:
        req = json.loads(text)
        if req.get("op") == "exit":
            self._frames.put(None)
        if req.get("op") != "run":
            return
        argv = [*self.worker, *req["argv"]]
        self.host._record(Recorded(self.host.name, "start", argv, dict(self.env)))
        rid = req["id"]
        self._frames.put(json.dumps({"id": rid, "started": 0}))
        for line in self.host.started_lines(argv):
            self._frames.put(json.dumps({"id": rid, "out": line.rstrip("\n")}))
        self._frames.put(json.dumps({"id": rid, "exit": 0}))

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        self._frames.put(None)


class RecordingHost(Host):
    """Stands for this machine (LocalHost) in a dry run; see the module docstring."""

    is_local = True

    @property
    def home(self) -> str:
        return os.path.expanduser("~")

    def __init__(self, name: str, data_address: str, on_record: Optional[Callable[[Recorded], None]] = None):
        self.name, self.data_address = name, data_address
        self.recorded: List[Recorded] = []
        self.on_record = on_record or (lambda entry: None)

    def _record(self, entry: Recorded) -> None:
        self.recorded.append(entry)
        self.on_record(entry)

    def run(self, argv, timeout=60.0, env=None, input=None) -> CommandResult:
        argv = [str(a) for a in argv]
        self._record(Recorded(self.name, "run", argv, dict(env or {})))
        code, out, err = self.answer(argv)
        return CommandResult(argv, code, out, err)

    def start(self, argv, env=None) -> Process:
        argv = [str(a) for a in argv]
        self._record(Recorded(self.name, "start", argv, dict(env or {})))
        if _worker_action(argv) == "serve":
            return RecordingServer(self, argv[:-1], dict(env or {}))
        return RecordingProcess(self, self.started_lines(argv))

    def put_file(self, local_path: str, remote_path: str, mode: int = 0o644) -> None:
        self._record(Recorded(self.name, "put_file", source=local_path, target=remote_path, mode=mode))

    def put_bytes(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        self._record(Recorded(self.name, "put_bytes", source=f"<{len(data)} bytes>", target=remote_path, mode=mode))

    # -- answers ---------------------------------------------------------------------------
    def answer(self, argv: List[str]) -> "tuple[int, str, str]":
        """(exit status, stdout, stderr) for a command run to completion."""
        at = _action_index(argv)
        if at is not None:
            job = _JOBS.get(argv[at])
            if job:
                return 0, job(self, argv[at + 1:]), ""
            kind_job = _kind_job(argv[at], argv[at + 1:])
            if kind_job is None:
                raise UndeclaredCommand(f"dry run: no pipeline stage or baseline kind declares the host job "
                                        f"`{argv[at]}` ({shlex.join(argv)})")
            return 0, kind_job[0], ""
        if _net_action_index(argv) is not None:
            return 0, "", ""
        for kind in KINDS:
            known = kind.dry_run(argv)
            if known is not None:
                return known
        action = _worker_action(argv)
        if action == "info":   # what it was asked along: the metadata (not measured), no cached calibration
            more = {"metadata": {}} if "--metadata" in argv else {}
            return 0, _json({"event": "info", "version": __version__, "modes": {}, "kernel": NOT_MEASURED,
                             **({"calibration": None} if "--cache" in argv else {}), **more}), ""
        if action == "calibrate":
            return 0, _json({"event": "calibration", "kernel": NOT_MEASURED}), ""
        if action == "layout":
            path, size = _flag(argv, "--path"), _flag(argv, "--bytes")
            return 0, _json({"event": "layout", "path": path, "created": False, "size": int(size or 0),
                             "regular": True}), ""
        if argv[:2] == ["printenv", "HOME"]:
            return 0, self.home + "\n", ""
        if argv[:1] == ["cat"]:
            return 1, "", f"{NOT_MEASURED}: no file is read"
        if argv[:2] == ["id", "-u"]:
            # This controller's own uid locally; over SSH unknown before connecting: assume root.
            return 0, f"{os.geteuid() if self.is_local else 0}\n", ""
        if argv[:1] == ["df"]:
            return 0, f"Avail\n{1 << 62}\n", ""   # free space unknown: assume enough
        if _stage_program(argv):
            return 0, "", ""
        raise UndeclaredCommand(f"dry run: no pipeline stage or baseline kind declares `{shlex.join(argv)}` "
                                f"(declare its answer in its baseline kind's dry_run, or in _STAGE_PROGRAMS)")

    def started_lines(self, argv: List[str]) -> List[str]:
        """What a started command prints before it exits."""
        action = _worker_action(argv)
        if action == "recv":
            return [_json({"event": "ready", "port": 0, "pid": 0}), _json({"event": "result", "side": "recv"})]
        if action == "send":
            return [_json({"event": "result", "side": "send"})]
        for kind in KINDS:
            lines = kind.dry_run_lines(argv)
            if lines is not None:
                return lines
        if _stage_program(argv):
            return []
        raise UndeclaredCommand(f"dry run: no pipeline stage or baseline kind declares `{shlex.join(argv)}`")


class RemoteRecordingHost(RecordingHost):
    """Stands for an SSHHost in a dry run, never connected to: its home is REMOTE_HOME, shown as `~`."""

    is_local = False

    def __init__(self, name: str, spec: HostSpec, on_record: Optional[Callable[[Recorded], None]] = None):
        super().__init__(name, spec.data_address, on_record)
        self.spec = spec      # deploy and scratch read `python` / `workdir` from it

    @property
    def where(self) -> str:
        return f"{self.name} (ssh {self.spec.ssh}, not connected: dry run)"

    @property
    def home(self) -> str:
        return REMOTE_HOME

    def expand(self, path: str) -> str:
        return expand_home(self.home, path)


def recording_hosts(hosts: Hosts, on_record: Optional[Callable[[Recorded], None]] = None
                    ) -> Dict[str, RecordingHost]:
    """{"sender", "receiver"} recording hosts for a `hosts:` section, as zcorch.hosts.ssh.open_hosts gives them."""
    if hosts.localhost:
        local = RecordingHost("localhost", "127.0.0.1", on_record=on_record)
        return {"sender": local, "receiver": local}
    return {role: RemoteRecordingHost(role, hosts.spec(role), on_record) for role in ("sender", "receiver")}


# -- the programs zcorch runs as `python -c PROGRAM ARGS...` ------------------------------------

def _json(obj: dict) -> str:
    return json.dumps(dict(obj, not_measured=True)) + "\n"


def _job_index(argv: Sequence[str], name: str, is_job: Callable[[str], bool]) -> Optional[int]:
    """Index of the job name in a command line of the host-side module `name` (zcorch.provision.remote_call):
    the module run by name locally, the program on stdin on SSH hosts (zcorch.hosts.interpreter)."""
    found = module_of(argv)
    if found is None or found[1] >= len(argv):
        return None
    module, i = found
    return i if module == name or (module == STDIN and is_job(argv[i])) else None


def _action_index(argv: Sequence[str]) -> Optional[int]:
    return _job_index(argv, "zcorch.worker.remote", lambda job: job in _JOBS or any(job in k.jobs for k in KINDS))


# zcorch.worker.netcfg's jobs (the data link's MTU and sysctls): answered with nothing (exit 0, no output).
_NET_JOBS = ("probe", "state", "apply", "restore")


def _net_action_index(argv: Sequence[str]) -> Optional[int]:
    return _job_index(argv, "zcorch.worker.netcfg", _NET_JOBS.__contains__)


def _worker_action(argv: Sequence[str]) -> Optional[str]:
    """The action (`recv`, `send`, `info`...) of a worker command line, in either form of zcorch.hosts.interpreter."""
    for start in range(len(argv)):  # after `env VAR=...` the interpreter's argv begins
        found = module_of(argv[start:])
        if found is not None:
            module, i = found
            return argv[start + i] if module == "zcorch.worker" and start + i < len(argv) else None
    return None


def _flag(argv: Sequence[str], flag: str) -> Optional[str]:
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


def _probe_facts(host: RecordingHost, args: List[str]) -> str:
    programs = [b for a, b in zip(args, args[1:]) if a == "--tool"]   # the baseline tools asked for: "found"
    # The worker build asked about is not there (so a deploy shows its whole build).
    at = args.index("--build") if "--build" in args[:-3] else None
    build = {} if at is None else {"build": {"workdir": args[at + 1], "marker": None, "refused": None,
                                             "path": posixpath.join(host.expand(args[at + 1]), args[at + 2])}}
    return _json({"python": list(sys.version_info[:3]), "executable": NOT_MEASURED, "cffi": NOT_MEASURED,
                  "python_h": True, "cc": NOT_MEASURED, "tools": {p: NOT_MEASURED for p in programs},
                  "address_error": None, "busy_ports": [], **build})


def _scratch_info(host: RecordingHost, args: List[str]) -> str:
    where = posixpath.join(args[0], "scratch")
    if host.is_local:  # what the program would make of it here (~ expanded), created by nobody
        return _json({"path": os.path.join(os.path.expanduser(args[0]), "scratch"), "created": False,
                      "mode": "0700"})
    # Unknown before connecting: the placeholder stands for itself in every command (`location`: where).
    return _json({"path": SCRATCH_PLACEHOLDER, "location": where, "created": False, "mode": "0700"})


def _nothing(host: RecordingHost, args: List[str]) -> str:
    return ""


def _not_measured(host: RecordingHost, args: List[str]) -> str:
    return _json({})


def _kind_job(job: str, args: Sequence[str]) -> "Optional[tuple]":
    """(stdout, note) of a baseline kind's host job in a dry run (dd's), or None."""
    for kind in KINDS:
        answer = kind.dry_run_job(job, args)
        if answer is not None:
            return answer
    return None


# Programs the pipeline's own stages run outside the worker and its host jobs (answered: exit 0, no output).
_STAGE_PROGRAMS: "tuple[tuple[str, ...], ...]" = (
    ("test", "-d"), ("test", "-e"), ("find",), ("flock", "-n"), ("modprobe", "-n", "-q"),  # filesystems
    ("sh", "-c", 'command -v "$1" >/dev/null 2>&1'),     # filesystems: its tools' presence (argv after it)
    ("rm", "-rf", "--"),                                 # deploy: a failed build's temporary directory
)
_BUILD_SCRIPT = "/native/build.py"                       # deploy: `PYTHON DIR/native/build.py --out DIR`


def _stage_program(argv: Sequence[str]) -> bool:
    if len(argv) > 1 and argv[1].endswith(_BUILD_SCRIPT):
        return True
    return any(tuple(argv[:len(p)]) == p for p in _STAGE_PROGRAMS)


# zcorch.worker.remote's jobs: answer(host, args) -> stdout.
_JOBS: "Dict[str, Callable[[RecordingHost, List[str]], str]]" = {
    "preflight": _probe_facts,
    "cffi-dir": _nothing,              # find _cffi_backend
    "finalize": _nothing,              # install the built worker
    "scratch": _scratch_info,          # prepare {scratch}
    "metadata": _not_measured,
    "loop-autoclear": _nothing,
    "open-excl": _nothing,             # exclusive-open check
    "private-dirs": _nothing,          # ownership check of the deploy directories
    "private-build": _nothing,         # ownership and mode check of a reused worker build, every file in it
}


def _program_note(argv: Sequence[str]) -> Optional[str]:
    """A baseline kind's note on its host job (none for zcorch.worker.remote's own)."""
    at = _action_index(argv)
    if at is None or argv[at] in _JOBS:
        return None
    kind_job = _kind_job(argv[at], argv[at + 1:])
    return kind_job[1] if kind_job else None
