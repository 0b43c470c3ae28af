"""A fleet run: one experiment on several host pairs of an inventory at once, one result set per pair.

Each pair is its own forked `zcorch run --json` process (not a thread: its signals and teardown stay those of
one sweep, and a pair that dies takes no other with it). Hosts and `shares:` shared between pairs are excluded
by flocks taken in one sorted order. Layout, fleet.json, locks, exit status: docs/architecture.md, "Fleets".
"""
from __future__ import annotations

import ctypes
import datetime as _dt
import fcntl
import gc
import hashlib
import json
import os
import queue
import re
import signal
import stat
import sys
import threading
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from zcorch._version import __version__
from zcorch.config.hosts import HostSpec
from zcorch.config.inventory import InventoryPair, select_pairs
from zcorch.errors import ConfigError, ResultsError
from zcorch.results import setfiles
from zcorch.results.store import BASELINES, RUNS, complete_length, lock_result_set, utc_now, write_json_atomic
from zcorch.sweep.pipeline import SweepObserver, default_output, experiment_source
from zcorch.sweep import json_object
from zcorch.sweep.runner import SweepOutcome, run_event_fields
from zcorch.worker.hoststat import boot_id

FORMAT = "zcorch-fleet"
FORMAT_VERSION = 1
FLEET_MANIFEST = "fleet.json"
EXPERIMENT_COPY = "experiment.yaml"
LOCK_DIR = ".locks"
# What `zcorch run` makes of a pair's exit status (that of one sweep: zcorch.cli.run).
EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_BUSY, EXIT_INTERRUPTED = 0, 1, 2, 75, 130
# The stages a pair holds locks through besides its runs: those that load its hosts take its host locks (a
# second pair on the host reuses the deploy's build), those that transfer take all of them.
HOST_STAGES = ("deploy", "calibrate", "sources")
LINK_STAGES = ("baselines", "commands")
HOST_LOCK_PREFIX = "host-"
LOCALHOST = "localhost"   # the host identity of this machine (a pair on localhost measures the controller's CPUs)
_LOCK_NAME_RE = re.compile(r"[^A-Za-z0-9._-]")


def is_fleet_dir(directory: "str | os.PathLike | None") -> bool:
    return bool(directory) and os.path.isfile(os.path.join(os.fspath(directory), FLEET_MANIFEST))


# -- The exclusions -----------------------------------------------------------------------------

def host_identity(spec: Optional[HostSpec], allow_ssh_config_exec: bool = False) -> str:
    """The machine a host spec reaches: `localhost`, or `hostname:port` after the ssh config (not the user)."""
    if spec is None:
        return LOCALHOST
    from zcorch.hosts.ssh import resolve_target  # paramiko: only when a fleet of remote pairs is planned

    target = resolve_target(spec, allow_exec=allow_ssh_config_exec)
    return f"{target.hostname.lower()}:{target.port}"


def pair_locks(pair: InventoryPair, allow_ssh_config_exec: bool = False) -> Tuple[List[str], List[str]]:
    """(the pair's host identities, its share names), each sorted and without repeats."""
    hosts = pair.hosts
    if hosts.localhost:
        ids = [LOCALHOST]
    else:
        ids = sorted({host_identity(hosts.spec(r), allow_ssh_config_exec) for r in ("sender", "receiver")})
    return ids, sorted(set(pair.shares))


def lock_files(hosts: Sequence[str], shares: Sequence[str]) -> List[str]:
    """The lock file names of hosts and shares, in the one global order every pair takes them in."""
    def name(kind: str, key: str) -> str:
        # readable, and unique even where two keys differ only in characters a file name cannot hold
        return f"{kind}-{_LOCK_NAME_RE.sub('_', key)[:60]}-{hashlib.sha256(key.encode()).hexdigest()[:8]}.lock"

    return sorted([name(HOST_LOCK_PREFIX[:-1], h) for h in hosts] + [name("share", s) for s in shares])


def lock_dir(fleet_dir: str) -> str:
    """Where a fleet's host and share locks live: as root, HOST_LEASE_DIR/fleet (0700), shared by every fleet on
    this machine; another user (or a /run root cannot write): FLEET/.locks, this fleet's pairs only."""
    from zcorch.provision.fs_state import HOST_LEASE_DIR

    if os.geteuid() == 0:
        d = os.path.join(HOST_LEASE_DIR, "fleet")
        with suppress(OSError):
            os.makedirs(d, mode=0o700, exist_ok=True)
            st = os.lstat(d)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022:
                return d
    return os.path.join(fleet_dir, LOCK_DIR)


def _holder(fd: int) -> Dict[str, Any]:
    """Who wrote the lock file (the holder, or a holder that died holding it); {} when nobody."""
    with suppress(OSError):
        return json_object(os.pread(fd, 4096, 0).decode("utf-8", "replace") or "{}") or {}
    return {}


def _alive(holder: Dict[str, Any]) -> bool:
    pid = holder.get("pid")
    if holder.get("boot_id") != boot_id() or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _who(holder: Dict[str, Any]) -> str:
    return (f"pid {holder.get('pid')}" + (f", pair {holder['pair']}" if holder.get("pair") else "")
            + (f" of fleet {holder['fleet']}" if holder.get("fleet") else "") + f", since {holder.get('since')}")


class FleetLocks:
    """The flocks of one pair (lock_files under `directory`), all taken or none. The holder writes who it is into
    each file and clears it on release: a waiter says whom it waits for, and a file naming a dead holder is taken
    over with a message saying so."""

    def __init__(self, directory: str, names: Sequence[str], say: Optional[Callable[[str], None]] = None,
                 who: Optional[Dict[str, str]] = None):
        self.directory, self.names = directory, sorted(names)
        self.say = say or (lambda _m: None)
        self.who = who or {}
        self._fds: List[int] = []

    @property
    def held(self) -> bool:
        return bool(self._fds)

    def acquire(self) -> None:
        if self._fds:
            return
        try:
            for name in self.names:  # one global order: no two pairs wait on each other in a circle
                fd = os.open(os.path.join(self.directory, name),
                             os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                self._fds.append(fd)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _holder(fd)
                    if holder.get("pid") != os.getpid():
                        self.say(f"waiting for {name} in {self.directory}, held by "
                                 f"{_who(holder) if holder else 'another pair'}")
                    fcntl.flock(fd, fcntl.LOCK_EX)   # retried after a signal whose handler returned (PEP 475)
                stale = _holder(fd)
                if stale and not _alive(stale):
                    self.say(f"took over {name} in {self.directory} from a holder that died holding it "
                             f"({_who(stale)}, boot {str(stale.get('boot_id'))[:8]})")
                me = {"pid": os.getpid(), "boot_id": boot_id(), **self.who,
                      "since": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(me).encode(), 0)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        fds, self._fds = self._fds, []
        for fd in reversed(fds):
            with suppress(OSError):
                os.ftruncate(fd, 0)   # still held: nobody else's record is cleared
            os.close(fd)   # closing the descriptor drops its flock


class LockingObserver:
    """Wraps the observer of one pair's sweep: holds all the pair's locks during each run and the LINK_STAGES,
    its host locks through the HOST_STAGES. Every other hook is the wrapped observer's (run_sweep knows no fleet)."""

    def __init__(self, inner: SweepObserver, directory: str, names: Sequence[str],
                 who: Optional[Dict[str, str]] = None):
        self.inner = inner
        self.all = FleetLocks(directory, names, say=self._say, who=who)
        self.hosts = FleetLocks(directory, [n for n in names if n.startswith(HOST_LOCK_PREFIX)], say=self._say,
                                who=who)
        self._said: set = set()

    def _say(self, text: str) -> None:
        key = text.split(", since")[0]
        if key not in self._said:      # once per holder, not before every run
            self._said.add(key)
            self.inner.message(text)

    def _release(self) -> None:
        self.all.release()
        self.hosts.release()

    def __getattr__(self, name: str) -> Any:   # the wrapped observer's other hooks and attributes
        return getattr(self.inner, name)

    def stage(self, name: str, title: str) -> None:
        self._release()
        if name in HOST_STAGES:
            self.hosts.acquire()
        elif name in LINK_STAGES:
            self.all.acquire()
        self.inner.stage(name, title)

    def run_started(self, cell: str, repeat: int) -> None:
        self._release()
        self.all.acquire()
        self.inner.run_started(cell, repeat)

    def run_done(self, record: dict, outcome: SweepOutcome, todo: int) -> None:
        self._release()
        self.inner.run_done(record, outcome, todo)

    def sweep_ended(self) -> None:
        self._release()
        self.inner.sweep_ended()


# -- The fleet manifest -------------------------------------------------------------------------

@dataclass
class PairState:
    """One pair of the fleet as fleet.json records it."""

    pair: str
    dir: str                               # its result set, relative to the fleet directory
    hosts: List[str]                       # host identities (host locks)
    shares: List[str]
    status: str = "pending"                # pending | running | complete | failed | interrupted
    exit_status: Optional[int] = None
    reason: Optional[str] = None
    started: Optional[str] = None
    finished: Optional[str] = None
    runs: Dict[str, int] = field(default_factory=lambda: {"planned": 0, "ok": 0, "failed": 0})
    pid: Optional[int] = None              # the process of its latest sweep

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict) -> "PairState":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)

    @property
    def done(self) -> bool:
        """Nothing left to run: complete, every run ok."""
        return self.status == "complete" and self.exit_status == EXIT_OK


def load_fleet(directory: str) -> dict:
    path = os.path.join(directory, FLEET_MANIFEST)
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 22)
        doc = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise ResultsError(f"{path}: not a readable fleet manifest ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ResultsError(f"{path}: not a zcorch fleet manifest (format {doc.get('format')!r})")
    if doc.get("format_version") != FORMAT_VERSION:
        raise ResultsError(f"{path}: fleet format version {doc.get('format_version')!r}; this zcorch reads "
                           f"{FORMAT_VERSION}")
    return doc


def pair_dirs(directory: str) -> Dict[str, str]:
    """pair -> its result set's path, from a fleet directory's manifest (file order); a `dir` that is not a
    directory beneath the fleet's (`../x`, an absolute path, a link out) is refused (setfiles.dir_beneath)."""
    return {p["pair"]: setfiles.dir_beneath(directory, p["dir"]) for p in load_fleet(directory)["pairs"]}


# -- Running the fleet --------------------------------------------------------------------------

class FleetObserver:
    """What run_fleet reports; every method does nothing here."""

    def fleet_started(self, directory: str, pairs: List[PairState], resumed: bool) -> None:
        """The pairs about to run (pairs already done on --resume have status complete)."""

    def pairs_running(self) -> None:
        """Every pair's process is forked: the fleet's process may start threads now (never during a fork)."""

    def event(self, pair: str, doc: dict) -> None:
        """One JSON event of a pair's sweep (zcorch run --json: start, stage, run, baseline, ..., end)."""

    def pair_ended(self, state: PairState, stderr_tail: List[str]) -> None:
        """A pair's sweep ended (state.status, exit_status, reason)."""

    def message(self, text: str) -> None:
        """Something the user should know."""


@dataclass
class FleetResult:
    directory: str
    status: str                   # complete | interrupted (as fleet.json records it)
    exit_status: int
    pairs: List[PairState]

    @property
    def failed(self) -> List[PairState]:
        return [p for p in self.pairs if not p.done]


def _new_fleet_dir(base: str, unique: bool) -> str:
    parent = os.path.dirname(base)
    if parent:
        os.makedirs(parent, exist_ok=True)
    for n in range(1, 10000 if unique else 2):
        candidate = base if n == 1 else f"{base}-{n}"
        with suppress(FileExistsError):
            os.mkdir(candidate)
            return candidate
    raise ResultsError(f"{base}: exists; choose another -o (or --resume it)")


def _validate(experiment: str, pairs: List[InventoryPair], overrides: Sequence[str]) -> str:
    """The experiment's name, once it loaded and planned on every pair (else ConfigError: nothing run)."""
    from zcorch import plan as planmod
    from zcorch.config.experiment import load_experiment

    problems: List[str] = []
    name = ""
    for pair in pairs:
        try:
            exp = load_experiment(experiment, overrides, pair)
            planmod.expand(exp)
            name = name or exp.name or os.path.splitext(os.path.basename(experiment))[0]
        except ConfigError as exc:
            problems += [f"pair `{pair.pair}`: {p}" for p in exc.problems]
    if problems:
        raise ConfigError(problems)
    return name


@dataclass(frozen=True)
class Start:
    """How a pair's sweep starts the first time: the experiment file, the inventory, the --set values."""

    experiment: str
    inventory: str
    overrides: Tuple[str, ...] = ()


def _child_argv(state: PairState, fleet_dir: str, start: Start, flags: List[str]) -> List[str]:
    """The pair's `zcorch run` command line (without the program name)."""
    pair_dir = os.path.join(fleet_dir, state.dir)
    argv = ["run"]
    if os.path.isfile(os.path.join(pair_dir, "manifest.json")):
        argv += ["--resume", pair_dir]           # its own experiment.yaml, its recorded hosts
    else:
        argv += [start.experiment, "--hosts", f"{start.inventory}:{state.pair}",
                 *[a for o in start.overrides for a in ("--set", o)], "-o", pair_dir]
    argv += ["--json", "--fleet-lock-dir", lock_dir(fleet_dir)]
    return argv + [a for name in lock_files(state.hosts, state.shares) for a in ("--fleet-lock", name)] + flags


def _prctl():
    """libc's prctl, resolved in the parent (the forked child only calls it); None where there is none."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _before_forks() -> None:
    """Once for every pair's process, which inherits it: the imports a sweep makes lazily, the controller's
    metadata, then gc.freeze (a pair's collections never walk, hence never copy, the pages it shares)."""
    import zcorch.provision.deploy  # noqa: F401
    import zcorch.provision.filesystems  # noqa: F401
    import zcorch.provision.network  # noqa: F401
    from zcorch.sweep import metadata

    metadata.remember_controller()
    gc.freeze()


# What a pair's process runs: zcorch.cli.main given `zcorch` ARGS (passed in: the command line sits above).
PairMain = Callable[[List[str]], int]


class _Child:
    """One pair's `zcorch run`, forked (not exec'd: N pairs cost one interpreter start-up) before any thread of
    the fleet runs (start_reading() afterwards): a fork while another thread holds a lock would copy it held."""

    def __init__(self, state: PairState, argv: List[str], pair_main: PairMain, close_in_child: List[int],
                 prctl: Any, result_dir: str):
        self.state = state
        self.stderr: List[str] = []
        self.end: Optional[dict] = None
        self.returncode: Optional[int] = None
        self.todo = 0
        # The record files' complete length before the sweep, and the records it reported: those of a sweep killed
        # between writing a record and printing its event are read back from there (unreported).
        self.result_dir = result_dir
        self.records_before = {name: complete_length(result_dir, name) for name in RECORD_EVENTS}
        self.reported: set = set()   # _record_key of every run and baseline event seen
        self.runs_reported = 0
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:   # the pair's process: never returns
            code = 1
            try:
                for fd in (out_r, err_r, *close_in_child):
                    os.close(fd)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                for fd in (devnull, out_w, err_w):
                    os.close(fd)
                # To the fleet's pipes whatever sys.stdout/stderr were (a test's capture is not fd 1/2); line-buffered:
                # what it said before a SIGKILL is there.
                sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)
                sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):   # its own sweep installs its handlers
                    signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
                if prctl is not None:
                    prctl(1, int(signal.SIGTERM))   # PR_SET_PDEATHSIG: SIGTERM when the fleet's process ends
                if os.getppid() != parent:          # it ended before that took effect
                    os._exit(EXIT_INTERRUPTED)
                os.environ.pop("ZCORCH_HOSTS", None)   # the pair is given explicitly
                sys.argv = ["zcorch", *argv]
                code = pair_main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except KeyboardInterrupt:
                code = EXIT_INTERRUPTED
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                for stream in (sys.stdout, sys.stderr):
                    with suppress(Exception):
                        stream.flush()
                os._exit(code)
        os.close(out_w)
        os.close(err_w)
        self.pid = pid
        self.fds = [out_r, err_r]   # what a later child must not inherit
        self._out = os.fdopen(out_r, "rb")
        self._err = os.fdopen(err_r, "rb")
        self._threads: List[threading.Thread] = []

    def start_reading(self, events: "queue.Queue") -> None:
        self._threads = [threading.Thread(target=self._read_events, args=(events,), daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for t in self._threads:
            t.start()

    def _read_events(self, events: "queue.Queue") -> None:
        for raw in self._out:
            doc = json_object(raw)
            if doc is not None:
                events.put((self, doc))
        events.put((self, None))   # this pair's events are over

    def _read_stderr(self) -> None:
        for raw in self._err:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                self.stderr = (self.stderr + [line])[-40:]

    def unreported(self, name: str) -> List[dict]:
        """The records this sweep appended to its `name` (RECORD_EVENTS) and never reported as an event (read
        as every reader of a result set reads it: setfiles, no link followed, streamed)."""
        out = []
        with suppress(OSError, ResultsError):   # a link or another kind of file in its place: nothing of ours
            for _, raw, whole in setfiles.iter_lines(self.result_dir, name, offset=self.records_before[name]):
                if not whole:
                    break   # a torn last line: the record was never written whole
                record = json_object(raw)
                if record is not None and _record_key(RECORD_EVENTS[name], record) not in self.reported:
                    out.append(record)
        return out

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def signal(self, sig: int) -> None:
        if self.poll() is None:
            with suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def join(self) -> int:
        if self.returncode is None:
            try:
                status = os.waitpid(self.pid, 0)[1]
            except ChildProcessError:   # reaped already
                status = 0
            self.returncode = os.waitstatus_to_exitcode(status)
        for t in self._threads:
            t.join(timeout=5)
        self._out.close()
        self._err.close()
        return self.returncode


# A result set's record files and the event that reports each record (zcorch run --json).
RECORD_EVENTS = {RUNS: "run", BASELINES: "baseline"}


def _record_key(event: str, record: dict) -> Tuple[Any, ...]:
    """A record's identity, the same in its file and in its event: a run by cell, repeat and start (a resumed
    sweep may run a (cell, repeat) again), a baseline by kind, host and start."""
    if event == "run":
        return event, record.get("cell"), record.get("repeat"), record.get("started")
    return event, record.get("kind"), record.get("host"), record.get("started")


def _reason(child: "_Child", rc: int) -> Optional[str]:
    state = child.state
    if rc == EXIT_OK:
        return None
    if rc < 0:
        return f"its sweep was killed by {signal.Signals(-rc).name}"
    errors = [line for line in child.stderr if "error" in line.lower() or line.startswith("zcorch")]
    last = (errors or child.stderr or [""])[-1]
    if rc == EXIT_FAILED and state.runs["failed"] and (child.end or {}).get("status") == "complete":
        return f"{state.runs['failed']} run(s) failed"
    if rc == EXIT_INTERRUPTED:
        return "interrupted" + (f": {last}" if last else "")
    return f"exit status {rc}" + (f": {last}" if last else "")


class Fleet:
    """One fleet run (run_fleet builds it); stop() ends every pair's sweep as SIGTERM ends one sweep."""

    def __init__(self, directory: str, doc: dict, states: List[PairState], start: Start, flags: List[str],
                 observer: FleetObserver, lock_fd: int, pair_main: PairMain):
        self.directory, self.doc, self.states = directory, doc, states
        self.start, self.flags, self.observer = start, flags, observer
        self.lock_fd = lock_fd   # DIR/.lock: held until close()
        self.pair_main = pair_main
        self.children: List[_Child] = []
        self.stopping = threading.Event()
        self._stop_sent = False

    def save(self) -> None:
        self.doc["pairs"] = [s.as_dict() for s in self.states]
        write_json_atomic(os.path.join(self.directory, FLEET_MANIFEST), self.doc)

    def stop(self) -> None:
        """Safe from a signal handler: the waiting loop forwards SIGTERM to every pair."""
        self.stopping.set()

    def run(self) -> FleetResult:
        events: "queue.Queue" = queue.Queue()
        prctl = _prctl()
        _before_forks()
        for state in self.states:
            if state.done:
                continue
            state.status, state.started, state.finished = "running", utc_now(), None
            state.exit_status = state.reason = None
            inherited = [self.lock_fd] + [fd for c in self.children for fd in c.fds]
            child = _Child(state, _child_argv(state, self.directory, self.start, self.flags), self.pair_main,
                           inherited, prctl, os.path.join(self.directory, state.dir))
            state.pid = child.pid
            self.children.append(child)
        for child in self.children:
            child.start_reading(events)
        self.save()
        self.observer.pairs_running()
        open_streams = len(self.children)
        while open_streams:
            if self.stopping.is_set() and not self._stop_sent:   # forwarded once, from this thread
                self._stop_sent = True
                for child in self.children:
                    child.signal(signal.SIGTERM)
            try:
                child, doc = events.get(timeout=0.2)
            except queue.Empty:
                continue
            if doc is None:
                open_streams -= 1
                self._ended(child)
            else:
                self._event(child, doc)
        interrupted = self.stopping.is_set() or any(s.status == "interrupted" for s in self.states)
        failed = any(not s.done for s in self.states)
        exit_status = EXIT_INTERRUPTED if interrupted else EXIT_FAILED if failed else EXIT_OK
        self.doc.update(status="interrupted" if interrupted else "complete", finished=utc_now(),
                        exit_status=exit_status)
        self.save()
        return FleetResult(self.directory, self.doc["status"], exit_status, self.states)

    def close(self) -> None:
        """Release the fleet directory's lock (another `zcorch run --resume` may continue it now)."""
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

    def _event(self, child: _Child, doc: dict) -> None:
        state = child.state
        kind = doc.get("event")
        if kind == "start":
            state.runs.update(planned=int(doc.get("runs") or 0), ok=int(doc.get("already_ok") or 0), failed=0)
            child.todo = max(state.runs["planned"] - state.runs["ok"], 0)
        elif kind == "run":
            child.reported.add(_record_key("run", doc))
            child.runs_reported += 1
            state.runs["ok" if doc.get("status") == "ok" else "failed"] += 1
        elif kind == "baseline" and isinstance(doc.get("record"), dict):
            child.reported.add(_record_key("baseline", doc["record"]))
        elif kind == "end":
            child.end = doc
        self.observer.event(state.pair, doc)

    def _ended(self, child: _Child) -> None:
        rc = child.join()
        if child.end is None:   # its sweep did not end its report: records it wrote may be unreported
            self._recover_records(child)
        state = child.state
        state.exit_status, state.finished = rc, utc_now()
        if rc == EXIT_OK:
            state.status = "complete"
        elif rc == EXIT_INTERRUPTED or (rc < 0 and self.stopping.is_set()):
            state.status = "interrupted"
        else:
            state.status = "failed"
        state.reason = _reason(child, rc)
        self.save()
        self.observer.pair_ended(state, child.stderr)

    def _recover_records(self, child: _Child) -> None:
        """Report the baselines and runs a killed sweep recorded but never printed, as events marked
        `recovered`, so the fleet's events and fleet.json count what the pair's result set holds."""
        for record in child.unreported(BASELINES):
            self._event(child, {"event": "baseline", "time": utc_now(), "record": record, "recovered": True})
        for record in child.unreported(RUNS):
            doc = {"event": "run", "time": utc_now(), **run_event_fields(record),
                   "done": child.runs_reported + 1, "todo": child.todo,
                   "failed_so_far": child.state.runs["failed"] + (record.get("status") != "ok"), "recovered": True}
            self._event(child, doc)


def prepare_fleet(experiment: Optional[str], hosts_spec: Optional[str] = None, *, pair_main: PairMain,
                  output: Optional[str] = None,
                  resume: Optional[str] = None, overrides: Sequence[str] = (), accept_new_host_keys: bool = False,
                  allow_ssh_config_exec: bool = False, observer: Optional[FleetObserver] = None,
                  command: Optional[List[str]] = None, recalibrate: bool = False) -> Fleet:
    """Validate, make (or reopen, with `resume`) the fleet directory and lock it; `Fleet.run()` runs it. A new
    fleet: experiment on the pairs of hosts_spec (`INV:PAIR1,PAIR2` / `INV:all`); resume: a fleet directory, whose
    pairs not complete with every run ok are continued."""
    observer = observer or FleetObserver()
    # what every start of a pair's sweep in this invocation is given (the first one and each --resume)
    flags = [flag for flag, given in (("--accept-new-host-keys", accept_new_host_keys),
                                      ("--allow-ssh-config-exec", allow_ssh_config_exec),
                                      ("--recalibrate", recalibrate)) if given]
    command = command or ["zcorch", "run"]
    if resume:
        if overrides:
            raise ConfigError(f"--set cannot change the fleet being resumed ({resume})")
        if hosts_spec:
            raise ConfigError(f"--hosts cannot change the fleet being resumed ({resume}): each pair keeps its hosts")
        doc = load_fleet(resume)
        lock = lock_result_set(resume)
        states = [PairState.from_dict(p) for p in doc["pairs"]]
        # a pair that never started starts from the fleet's copy of the experiment, as the others did
        start = Start(os.path.join(os.path.abspath(resume), EXPERIMENT_COPY), doc["inventory"]["path"],
                      tuple(doc.get("overrides", [])))
        doc.setdefault("resumed", []).append({"at": utc_now(), "command": command})
        doc.update(status="running", finished=None, exit_status=None)
        fleet = Fleet(resume, doc, states, start, flags, observer, lock, pair_main)
    else:
        if not experiment:
            raise ConfigError("zcorch run: give an experiment FILE")
        if hosts_spec is None:
            raise ConfigError("a fleet run needs --hosts INVENTORY:PAIR1,PAIR2... or INVENTORY:all")
        inv, pairs = select_pairs(hosts_spec)
        name = _validate(experiment, pairs, overrides)
        exp_bytes = experiment_source(experiment, None)[1]
        states = [PairState(p.pair, p.pair, *pair_locks(p, allow_ssh_config_exec)) for p in pairs]
        directory = _new_fleet_dir(output or default_output(f"{name}-fleet"), unique=output is None)
        lock = lock_result_set(directory)
        os.makedirs(os.path.join(directory, LOCK_DIR), mode=0o700, exist_ok=True)
        with open(os.path.join(directory, EXPERIMENT_COPY), "xb") as f:
            f.write(exp_bytes)
        doc = {"format": FORMAT, "format_version": FORMAT_VERSION, "name": name, "created": utc_now(),
               "finished": None, "status": "running", "exit_status": None, "zcorch_version": __version__,
               "command": command,
               "experiment": {"path": os.path.abspath(experiment),
                              "sha256": hashlib.sha256(exp_bytes).hexdigest(), "copy": EXPERIMENT_COPY},
               "inventory": {"path": inv.path, "sha256": inv.sha256}, "overrides": list(overrides),
               "exclusions": _exclusions(states), "pairs": []}
        start = Start(os.path.abspath(experiment), inv.path, tuple(overrides))
        fleet = Fleet(directory, doc, states, start, flags, observer, lock, pair_main)
    fleet.save()
    observer.fleet_started(fleet.directory, fleet.states, bool(resume))
    return fleet


def _exclusions(states: List[PairState]) -> dict:
    """{"hosts": {host: [pairs]}, "shares": {name: [pairs]}}: only those held by more than one pair."""
    out: Dict[str, Dict[str, List[str]]] = {"hosts": {}, "shares": {}}
    for s in states:
        for h in s.hosts:
            out["hosts"].setdefault(h, []).append(s.pair)
        for n in s.shares:
            out["shares"].setdefault(n, []).append(s.pair)
    return {k: {n: ps for n, ps in v.items() if len(ps) > 1} for k, v in out.items()}


@dataclass(frozen=True)
class FleetPlan:
    """What `zcorch plan FILE --hosts INV:PAIRS` shows of a fleet: each pair's plan, and which pairs take turns."""
    pairs: "List[tuple[InventoryPair, Any]]"      # (pair, its zcorch.plan.Plan), in the order given
    groups: "List[List[str]]"                     # pairs that share a host or a share: they never transfer at once

    def estimate_s(self, seconds: "Dict[str, float]") -> "tuple[float, List[str]]":
        """(the fleet's duration, the group that sets it) from each pair's own estimate: pairs of one group take
        turns run by run (their durations add up), groups run at once (the longest one sets the fleet's)."""
        best = max(self.groups, key=lambda g: sum(seconds[p] for p in g))
        return sum(seconds[p] for p in best), best


def plan_fleet(experiment: str, hosts_spec: str, overrides: Sequence[str] = (),
               allow_ssh_config_exec: bool = False) -> FleetPlan:
    """Each pair's plan of a fleet (ConfigError as `zcorch run` would raise it, before anything runs) and the
    groups of pairs its exclusions make take turns (pair_locks: a host or a share in common, transitively)."""
    from zcorch.plan import load_plan

    _inv, pairs = select_pairs(hosts_spec)
    plans = [(pair, load_plan(experiment, overrides, pair, unknown_hosts=True)) for pair in pairs]
    keys = {pair.pair: set(h for h in pair_locks(pair, allow_ssh_config_exec)[0]) |
            {"share:" + n for n in pair.shares} for pair in pairs}
    groups: List[List[str]] = []
    for pair in pairs:
        joined = [g for g in groups if any(keys[p] & keys[pair.pair] for p in g)]
        merged = [p for g in joined for p in g] + [pair.pair]
        groups = [g for g in groups if g not in joined] + [merged]
    return FleetPlan(plans, groups)
