"""A fleet run: one experiment on several host pairs of an inventory at once, one result set per pair.

Each pair is its own `zcorch run --json` child, forked rather than exec'd (one interpreter start-up for N
pairs) and not a thread, so a sweep's signal handling and teardown stay exactly those of one sweep and a
pair that crashes or is killed takes no other with it. Hosts and `shares:` shared between pairs are
excluded by flocks taken in one sorted order (no waiting in a circle; the kernel drops a dead pair's).
Directory layout, fleet.json, locks and exit status: docs/architecture.md, "Fleets".
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
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from zcorch._version import __version__
from zcorch.config.hosts import HostSpec
from zcorch.config.inventory import InventoryPair, select_pairs
from zcorch.errors import ConfigError, ResultsError
from zcorch.results import setfiles
from zcorch.results.store import BASELINES, RUNS, complete_length, lock_result_set, utc_now, write_json_atomic
from zcorch.sweep.pipeline import SweepObserver
from zcorch.sweep.runner import SweepOutcome, run_event_fields
from zcorch.worker.hoststat import boot_id

FORMAT = "zcorch-fleet"
FORMAT_VERSION = 1
FLEET_MANIFEST = "fleet.json"
EXPERIMENT_COPY = "experiment.yaml"
LOCK_DIR = ".locks"
# What `zcorch run` makes of a pair's exit status (that of one sweep: zcorch.cli.run).
EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_BUSY, EXIT_INTERRUPTED = 0, 1, 2, 75, 130
PAIR_STATUSES = ("pending", "running", "complete", "failed", "interrupted")
# The stages a pair holds locks through, besides each run (which takes all its locks): those that load its
# hosts take its host locks (a deploy builds the worker: a second pair on the host then reuses that build),
# those that transfer take all of them.
HOST_STAGES = ("deploy", "calibrate", "sources")
LINK_STAGES = ("baselines", "commands")
HOST_LOCK_PREFIX = "host-"
LOCALHOST = "localhost"   # the host identity of this machine (a pair on localhost measures the controller's CPUs)
_LOCK_NAME_RE = re.compile(r"[^A-Za-z0-9._-]")


def is_fleet_dir(directory: "str | os.PathLike | None") -> bool:
    return bool(directory) and os.path.isfile(os.path.join(os.fspath(directory), FLEET_MANIFEST))


# ---------------------------------------------------------------------------------------------
# The exclusions

def host_identity(spec: Optional[HostSpec], allow_ssh_config_exec: bool = False) -> str:
    """The machine a host spec reaches: `localhost`, or `hostname:port` after the ssh config (an alias and
    its HostName are one machine; the user does not matter)."""
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
    """Where a fleet's host and share locks live: as root, HOST_LEASE_DIR/fleet (0700, root's), one place on
    this machine shared by every fleet and controller process, so two fleets on the same hosts exclude each
    other; another user (or a /run root cannot write): FLEET/.locks, this fleet's pairs only, as before."""
    from zcorch.provision.fs_state import HOST_LEASE_DIR

    if os.geteuid() == 0:
        d = os.path.join(HOST_LEASE_DIR, "fleet")
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            st = os.lstat(d)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022:
                return d
        except OSError:
            pass
    return os.path.join(fleet_dir, LOCK_DIR)


def _holder(fd: int) -> Dict[str, Any]:
    """Who wrote the lock file (the holder, or a holder that died holding it); {} when nobody."""
    try:
        doc = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace") or "{}")
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


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
    """The flocks of one pair (lock_files under `directory`), all taken or none. The holder writes who it is
    (pid, boot id, fleet, pair) into each file and clears it on release: a waiter says whom it waits for, and a
    file still naming a holder whose process is gone (killed while holding: the kernel dropped its flock) is
    taken over with a message saying so."""

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
                    while True:
                        try:
                            fcntl.flock(fd, fcntl.LOCK_EX)
                            break
                        except InterruptedError:  # a signal whose handler returned: wait on
                            continue
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
            try:
                os.ftruncate(fd, 0)   # still held: nobody else's record is cleared
            except OSError:
                pass
            os.close(fd)   # closing the descriptor drops its flock


class LockingObserver:
    """Wraps the observer of one pair's sweep: takes all the pair's locks when a run starts and drops them
    when its record is written; holds its host locks through the HOST_STAGES and all its locks through the
    LINK_STAGES. Every other hook and attribute is the wrapped observer's. (The hooks run_sweep already
    calls are enough: nothing below run_sweep knows about fleets.)"""

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


# ---------------------------------------------------------------------------------------------
# The fleet manifest

@dataclass
class PairState:
    """One pair of the fleet as fleet.json records it."""

    pair: str
    dir: str                               # its result set, relative to the fleet directory
    hosts: List[str]                       # host identities (host locks)
    shares: List[str]
    status: str = "pending"                # PAIR_STATUSES
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


# ---------------------------------------------------------------------------------------------
# Running the fleet

class FleetObserver:
    """What run_fleet reports; every method does nothing here."""

    def fleet_started(self, directory: str, pairs: List[PairState], resumed: bool) -> None:
        """The pairs about to run (pairs already done on --resume have status complete)."""

    def pairs_running(self) -> None:
        """Every pair of this invocation has its process (forked): from here on the fleet's process may start
        threads of its own (one alive during a fork could leave a lock held in the child)."""

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
        return [p for p in self.pairs if p.status != "complete" or p.exit_status != EXIT_OK]


def _default_output(name: str) -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return os.path.join("results", f"{name}-fleet-{stamp}")


def _new_fleet_dir(base: str, unique: bool) -> str:
    parent = os.path.dirname(base)
    if parent:
        os.makedirs(parent, exist_ok=True)
    for n in range(1, 10000 if unique else 2):
        candidate = base if n == 1 else f"{base}-{n}"
        try:
            os.mkdir(candidate)
            return candidate
        except FileExistsError:
            continue
    raise ResultsError(f"{base}: exists; choose another -o (or --resume it)")


def _validate(experiment: str, pairs: List[InventoryPair], overrides: Sequence[str]) -> str:
    """Load and plan the experiment on every pair before anything starts (ConfigError: exit 2, nothing run);
    returns the experiment's name."""
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

    def argv(self, pair: str) -> List[str]:
        return [self.experiment, "--hosts", f"{self.inventory}:{pair}",
                *[a for o in self.overrides for a in ("--set", o)]]


def _child_argv(state: PairState, fleet_dir: str, start: Start, flags: List[str]) -> List[str]:
    """The pair's `zcorch run` command line (without the program name)."""
    pair_dir = os.path.join(fleet_dir, state.dir)
    argv = ["run"]
    if os.path.isfile(os.path.join(pair_dir, "manifest.json")):
        argv += ["--resume", pair_dir]           # its own experiment.yaml, its recorded hosts
    else:
        argv += [*start.argv(state.pair), "-o", pair_dir]
    argv += ["--json", "--fleet-lock-dir", lock_dir(fleet_dir)]
    for name in lock_files(state.hosts, state.shares):
        argv += ["--fleet-lock", name]
    return argv + flags


def _prctl():
    """libc's prctl, resolved in the parent (the forked child only calls it); None where there is none."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _before_forks() -> None:
    """Done once in the fleet's process for all its pairs' processes, which inherit it: import what every pair's
    sweep imports only once it runs (zcorch.sweep.pipeline imports these lazily, so that a dry run or a bad file
    stays quick), rather than each pair importing them again, and this machine's controller metadata (git
    revision, platform: metadata.remember_controller). Then gc.freeze: a pair's collections never walk, hence
    never copy, the pages it shares with the fleet's process."""
    import zcorch.provision.deploy  # noqa: F401
    import zcorch.provision.filesystems  # noqa: F401
    import zcorch.provision.network  # noqa: F401
    from zcorch.sweep import metadata

    metadata.remember_controller()
    gc.freeze()


# What a pair's process runs: the command line's main() (zcorch.cli.main) given `zcorch` ARGS; the fleet
# is given it by its caller (the command line sits above this module).
PairMain = Callable[[List[str]], int]


class _Child:
    """One pair's `zcorch run`, forked from the fleet's process (not exec'd): it starts with every module the
    controller already imported, so N pairs cost one interpreter start-up, not N. Forked before any thread of
    the fleet runs (start_reading() afterwards): a fork while another thread holds a lock would copy it held."""

    def __init__(self, state: PairState, argv: List[str], pair_main: PairMain, close_in_child: List[int],
                 prctl: Any, result_dir: str):
        self.state = state
        self.stderr: List[str] = []
        self.end: Optional[dict] = None
        self.returncode: Optional[int] = None
        self.todo = 0
        # The pair's runs.jsonl and baselines.jsonl as they stand before its sweep starts (their complete
        # lines) and the records its sweep reported: a sweep killed between writing a record and printing its
        # event (SIGKILL, an OOM kill) has its unreported records read back from there (unreported).
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
                # Its events and messages go to the fleet's pipes whatever sys.stdout/stderr were in the
                # fleet's process (a library caller's, a notebook's, a test's capture: not necessarily fd 1/2).
                # Line-buffered, as the interpreter's own stderr is: what it said before a SIGKILL is there.
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
                    try:
                        stream.flush()
                    except Exception:
                        pass
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
            try:
                doc = json.loads(raw)
            except ValueError:
                continue
            if isinstance(doc, dict):
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
        try:
            for _, raw, whole in setfiles.iter_lines(self.result_dir, name, offset=self.records_before[name]):
                if not whole:
                    break   # a torn last line: the record was never written whole
                try:
                    record = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(record, dict) and _record_key(RECORD_EVENTS[name], record) not in self.reported:
                    out.append(record)
        except (OSError, ResultsError):   # a link or another kind of file in its place: nothing of ours to read
            pass
        return out

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def join(self) -> int:
        if self.returncode is None:
            while True:
                try:
                    _, status = os.waitpid(self.pid, 0)
                    break
                except ChildProcessError:   # reaped already
                    status = 0
                    break
            self.returncode = os.waitstatus_to_exitcode(status)
        for t in self._threads:
            t.join(timeout=5)
        self._out.close()
        self._err.close()
        return self.returncode


# A result set's record files and the event that reports each record (zcorch run --json).
RECORD_EVENTS = {RUNS: "run", BASELINES: "baseline"}


def _record_key(event: str, record: dict) -> Tuple[Any, ...]:
    """A record's identity, the same in its file and in its event (a baseline event carries its record whole):
    a run by cell, repeat and start (a resumed sweep may run a (cell, repeat) again), a baseline by kind,
    host and start."""
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

    def _forward_stop(self) -> None:
        if self._stop_sent:
            return
        self._stop_sent = True
        for child in self.children:
            child.signal(signal.SIGTERM)

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
            if self.stopping.is_set():
                self._forward_stop()
            try:
                child, doc = events.get(timeout=0.2)
            except queue.Empty:
                continue
            if doc is None:
                open_streams -= 1
                self._ended(child)
                continue
            self._event(child, doc)
        if self.stopping.is_set():
            status = "interrupted"
        else:
            status = "complete"
        interrupted = status == "interrupted" or any(s.status == "interrupted" for s in self.states)
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
            state.runs["planned"] = int(doc.get("runs") or 0)
            state.runs["ok"] = int(doc.get("already_ok") or 0)
            state.runs["failed"] = 0
            child.todo = max(state.runs["planned"] - state.runs["ok"], 0)
        elif kind == "run":
            child.reported.add(_record_key("run", doc))
            child.runs_reported += 1
            if doc.get("status") == "ok":
                state.runs["ok"] += 1
            else:
                state.runs["failed"] += 1
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
        `recovered`, so the fleet's events and fleet.json count what the pair's result set holds (a --resume
        keeps them: it runs only what is missing)."""
        for record in child.unreported(BASELINES):
            self._event(child, {"event": "baseline", "time": utc_now(), "record": record, "recovered": True})
        for record in child.unreported(RUNS):
            doc = {"event": "run", "time": utc_now(), **run_event_fields(record),
                   "done": child.runs_reported + 1, "todo": child.todo,
                   "failed_so_far": child.state.runs["failed"] + (record.get("status") != "ok"), "recovered": True}
            self._event(child, doc)


def _flags(accept_new_host_keys: bool, allow_ssh_config_exec: bool, recalibrate: bool = False) -> List[str]:
    """What every start of a pair's sweep in this invocation is given (the first one and each --resume)."""
    return (["--accept-new-host-keys"] if accept_new_host_keys else []) + \
           (["--allow-ssh-config-exec"] if allow_ssh_config_exec else []) + \
           (["--recalibrate"] if recalibrate else [])


def prepare_fleet(experiment: Optional[str], hosts_spec: Optional[str] = None, *, pair_main: PairMain,
                  output: Optional[str] = None,
                  resume: Optional[str] = None, overrides: Sequence[str] = (), accept_new_host_keys: bool = False,
                  allow_ssh_config_exec: bool = False, observer: Optional[FleetObserver] = None,
                  command: Optional[List[str]] = None, recalibrate: bool = False) -> Fleet:
    """Validate, make (or reopen, with `resume`) the fleet directory and lock it; `Fleet.run()` runs it.

    experiment + hosts_spec (`INV:PAIR1,PAIR2` / `INV:all`): a new fleet under `output` (default
    results/<name>-fleet-<UTC time>/). resume: a fleet directory; its pairs that are not complete with every
    run ok are continued (`zcorch run --resume` of their result set, or started if they never were)."""
    observer = observer or FleetObserver()
    flags = _flags(accept_new_host_keys, allow_ssh_config_exec, recalibrate)
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
        try:
            with open(experiment, "rb") as f:
                exp_bytes = f.read()
        except OSError as exc:
            raise ConfigError(f"{experiment}: cannot read the experiment file ({exc.strerror})") from None
        states = []
        for p in pairs:
            host_ids, shares = pair_locks(p, allow_ssh_config_exec)
            states.append(PairState(p.pair, p.pair, host_ids, shares))
        directory = _new_fleet_dir(output or _default_output(name), unique=output is None)
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
