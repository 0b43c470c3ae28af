"""The result set on disk (format version 1, layout in docs/architecture.md).

Writers append one JSON line per finished run/baseline and fsync it before returning, so a
crash loses at most the run in progress. Readers skip a torn final line (a crash mid-write);
`ResultSet.open_for_resume` truncates it so the next append starts on a clean line.

Several records may exist for one (cell, repeat) after `--resume` re-ran a failed run: the
newest record (last in the file) wins (`latest_runs`).
"""
from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import json
import os
import socket
import stat
import time
from typing import Any, BinaryIO, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from zcorch.errors import ResultsError, ResultSetBusy, ResultsWriteError
from zcorch.results import setfiles

FORMAT = "zcorch-results"
FORMAT_VERSION = 1

MANIFEST = "manifest.json"
EXPERIMENT = "experiment.yaml"
EXPERIMENT_SOURCE = "experiment.source.yaml"  # the file as written, when experiment.yaml is the effective document
PLAN = "plan.json"
META = "meta.json"
RUNS = "runs.jsonl"
BASELINES = "baselines.jsonl"
RUNS_CACHE = "runs.parquet"  # runs.jsonl parsed, written by zcorch.analysis.cache (never by this module)
LOCK = ".lock"   # flock()ed by the one `zcorch run` writing the set; holds "pid host started" for messages
LOGS = "logs"
SAMPLES = "samples"  # per-run samples: samples/<cell>-r<repeat>.jsonl, one line per sample and side

RUN_STATUSES = ("ok", "failed", "timeout", "interrupted")


def utc_now() -> str:
    """ISO-8601 UTC timestamp with microseconds (sortable, unambiguous)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def clock_stamp() -> dict:
    """What orders sets created on this boot even when the wall clock is set back (`created` is the wall clock):
    the boot id and CLOCK_BOOTTIME (monotonic, counts suspend, never goes back within a boot), the manifest's
    `clock` (zcorch.analysis.history.clock_problems). Empty where the system has neither."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
        return {"boot_id": boot_id, "boottime_ns": time.clock_gettime_ns(time.CLOCK_BOOTTIME)}
    except (OSError, AttributeError):
        return {}


def write_text_atomic(path: str, text: str) -> None:
    """Replace `path` with `text` without ever leaving a half-written file: an exclusive temporary (random
    name, O_EXCL|O_NOFOLLOW, fsynced) renamed over it, so nothing is written through a planted link; a
    full disk leaves no temporary behind."""
    setfiles.write_inside(os.path.dirname(path) or ".", os.path.basename(path), text.encode("utf-8"), fsync=True)


def write_json_atomic(path: str, obj: Any) -> None:
    """Replace `path` with `obj` as JSON without ever leaving a half-written file."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def iter_jsonl(path: str) -> Iterator[Tuple[int, Any]]:
    """(line number, record) of a JSON-lines file, streamed (a million-run file does not fit in memory as
    dicts); a torn (unparsable, unterminated) final line is skipped.

    A bad line anywhere else is corruption, not a crash artefact, and raises ResultsError. The file is read
    as zcorch.results.setfiles reads a result set's files: a regular file (no link followed), streamed, with
    overlong lines and records beyond the bound skipped and said (SkippedWarning); a runs.jsonl with more
    records than its set's plan can hold is refused (ResultsError, setfiles.run_record_limit). No file (a
    sweep that stopped before its first run): no records.
    """
    decode = _DECODER.decode  # json.loads minus its per-call type and encoding checks
    root, name = os.path.dirname(path) or ".", os.path.basename(path)
    lines = setfiles.iter_runs_lines(root, name) if name == RUNS else setfiles.iter_lines(root, name)
    for lineno, raw, terminated in lines:
        try:
            rec = decode(raw.decode("utf-8"))
        except ValueError:  # also UnicodeDecodeError
            if not terminated:  # no newline after it: the write was cut short
                return
            raise ResultsError(f"{path}:{lineno}: not a JSON record: {raw[:80]!r}") from None
        yield lineno, rec


_DECODER = json.JSONDecoder()


def read_jsonl(path: str) -> List[dict]:
    """Records of a JSON-lines file (iter_jsonl's rules)."""
    return [rec for _, rec in iter_jsonl(path)]


def _complete_lines_end(f: BinaryIO, size: int) -> int:
    """The offset just past the last newline of the first `size` bytes of `f` (0 when there is none), looked
    for from the end a chunk at a time: a huge or sparse tail never sits in memory whole."""
    pos = size
    while pos > 0:
        step = min(pos, 1 << 20)
        pos -= step
        f.seek(pos)
        i = f.read(step).rfind(b"\n")
        if i >= 0:
            return pos + i + 1
    return 0


def complete_length(directory: str, name: str) -> int:
    """Bytes of a result set's JSON-lines file up to its last newline, read as setfiles reads the set's files
    (0 when it does not exist, is a link or no regular file): where the records appended from now on begin (a
    torn tail after it is never a record)."""
    try:
        fd = setfiles.open_inside(directory, name)
    except (OSError, ResultsError):
        return 0
    with os.fdopen(fd, "rb") as f:
        return _complete_lines_end(f, f.seek(0, os.SEEK_END))


def _truncate_torn_tail(path: str) -> bool:
    """Cut an unterminated last line (crash mid-write). Returns True if something was cut."""
    if not os.path.exists(path):
        return False
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return False
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return False
        f.truncate(_complete_lines_end(f, size))
        f.flush()
        os.fsync(f.fileno())
    return True


def _new_directory(base: str) -> str:
    """Make `base` (or `base-2`, `base-3` ... if taken) with an exclusive mkdir; returns the one made."""
    parent = os.path.dirname(base)
    if parent:
        os.makedirs(parent, exist_ok=True)
    for n in range(1, 10000):
        candidate = base if n == 1 else f"{base}-{n}"
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        return candidate
    raise ResultsError(f"{base}: 9999 result directories of that name exist; choose another -o")


def latest_runs(records: Iterable[dict]) -> Dict[Tuple[str, int], dict]:
    """Newest record per (cell, repeat): later lines supersede earlier ones (resume re-runs)."""
    latest: Dict[Tuple[str, int], dict] = {}
    for rec in records:
        latest[(rec["cell"], int(rec["repeat"]))] = rec
    return latest


def load_manifest(directory: str) -> dict:
    path = os.path.join(directory, MANIFEST)
    try:
        manifest = setfiles.read_json(directory, MANIFEST)
    except FileNotFoundError:
        raise ResultsError(f"{directory}: not a zcorch result set (no {MANIFEST})") from None
    except ValueError as exc:
        raise ResultsError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise ResultsError(f"{path}: expected a JSON object")
    if manifest.get("format") != FORMAT:
        raise ResultsError(f"{path}: not a zcorch result set (format {manifest.get('format')!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ResultsError(f"{path}: result-set format version {manifest.get('format_version')!r} is not "
                           f"supported (this zcorch reads version {FORMAT_VERSION})")
    return manifest


def lock_result_set(directory: str) -> int:
    """Take the result set's exclusive lock (flock on DIR/.lock, never through a symlink); returns the fd,
    which holds it until closed or this process ends. Raises ResultSetBusy naming the holder when another
    process has it: two `zcorch run --resume DIR` would otherwise both run every remaining run."""
    path = os.path.join(directory, LOCK)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise ResultsError(f"{path}: cannot open the result set's lock file ({exc.strerror or exc})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise ResultsError(f"{path}: cannot lock the result set ({exc.strerror or exc})") from None
        who = f" (pid {holder.split()[0]} on {holder.split()[1]}, since {holder.split()[2]})" \
            if len(holder.split()) == 3 else ""
        raise ResultSetBusy(f"{directory} is being written by another zcorch run{who}: wait for it to end "
                            "(or stop it), then run again") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {utc_now()}\n".encode(), 0)
    return fd


class ResultSet:
    """One result directory being written by `zcorch run`, locked (lock_result_set) until close()."""

    def __init__(self, directory: str, manifest: dict, lock_fd: Optional[int] = None):
        self.dir = directory
        self.manifest = manifest
        self._lock_fd = lock_fd
        self.baseline_written: Optional[Callable[[dict], None]] = None  # told of each baseline record written

    def close(self) -> None:
        """Release the result set's lock (also released when the process ends)."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    # -- creation / reopening ------------------------------------------------------------
    @classmethod
    def create(cls, directory: str, *, name: str, experiment_bytes: bytes, plan_runs: List[dict],
               command: List[str], accept_new_host_keys: bool, zcorch_version: str,
               git_revision: Optional[str], unique: bool = False, source: Optional[dict] = None,
               source_bytes: Optional[bytes] = None, inventory: Optional[dict] = None,
               overrides: Sequence[str] = (), repeat_policy: Optional[dict] = None,
               control: Optional[dict] = None) -> "ResultSet":
        """A new result set in `directory` (docs/architecture.md, "Result set", has the manifest's fields).

        unique: `directory` is a default name: if another sweep took it, `-2`, `-3` ... is appended (an
        exclusive mkdir: two sweeps never share one). experiment_bytes: experiment.yaml (the document as run);
        source_bytes: the file as written when that differs. source / inventory: {"path", "sha256"[, "pair"]};
        overrides: the --set applied; repeat_policy: `repeats: {min, max, target_ci}` (None: a fixed N);
        control: zcorch.plan.control_record's.
        """
        if unique:
            directory = _new_directory(directory)
        else:
            os.makedirs(directory, exist_ok=True)
        lock = lock_result_set(directory)   # before looking: a concurrent create or resume of the same -o
        try:
            if os.path.exists(os.path.join(directory, MANIFEST)):
                raise ResultsError(f"{directory} already holds a result set; use --resume {directory} "
                                   "to continue it or choose another -o")
        except BaseException:
            os.close(lock)
            raise
        os.makedirs(os.path.join(directory, LOGS), exist_ok=True)
        with open(os.path.join(directory, EXPERIMENT), "wb") as f:
            f.write(experiment_bytes)
        if source_bytes is not None:
            with open(os.path.join(directory, EXPERIMENT_SOURCE), "wb") as f:
                f.write(source_bytes)
        write_json_atomic(os.path.join(directory, PLAN), plan_runs)
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "name": name, "clock": clock_stamp(), "created": utc_now(),
            "finished": None, "zcorch_version": zcorch_version, "git_revision": git_revision,
            "command": list(command), "accept_new_host_keys": bool(accept_new_host_keys),
            "experiment_file": EXPERIMENT, "status": "running",
            "experiment_source": dict(source or {}, copy=EXPERIMENT_SOURCE if source_bytes is not None else None),
            "inventory": dict(inventory) if inventory else None, "overrides": list(overrides),
        }
        if repeat_policy is not None:
            manifest["repeats"] = dict(repeat_policy)
        if control is not None:
            manifest["control"] = dict(control)
        rs = cls(directory, manifest, lock)
        rs._write_manifest()
        return rs

    @classmethod
    def open_for_resume(cls, directory: str, command: List[str], inventory: Optional[dict] = None) -> "ResultSet":
        """Reopen a result set; `inventory`: the pair given with --hosts for this resume (recorded in its
        `resumed` entry; without it the hosts of experiment.yaml run again). Raises ResultSetBusy while
        another process writes it."""
        load_manifest(directory)            # a result set at all, before a lock file is made in it
        lock = lock_result_set(directory)
        try:
            manifest = load_manifest(directory)  # as the previous writer left it
        except BaseException:
            os.close(lock)
            raise
        for name in (RUNS, BASELINES):
            _truncate_torn_tail(os.path.join(directory, name))
        os.makedirs(os.path.join(directory, LOGS), exist_ok=True)
        entry: Dict[str, Any] = {"at": utc_now(), "command": list(command)}
        if inventory:
            entry["inventory"] = dict(inventory)
        manifest.setdefault("resumed", []).append(entry)
        manifest["status"] = "running"
        manifest["finished"] = None
        rs = cls(directory, manifest, lock)
        rs._write_manifest()
        return rs

    # -- paths ------------------------------------------------------------------------------
    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def experiment_path(self) -> str:
        return self.path(self.manifest.get("experiment_file", EXPERIMENT))

    def log_relpath(self, cell: str, repeat: int) -> str:
        return f"{LOGS}/{cell}-r{repeat}.log"

    def write_samples(self, cell: str, repeat: int, samples: Dict[str, List[dict]]) -> str:
        """samples/<cell>-r<repeat>.jsonl: one JSON line per sample, {"side": "send"|"recv", ...the sample}
        (sides in the order given), replacing an earlier run's file (a re-run wins, as its record does);
        written whole (temp file, fsync, rename) before the record that names it. Returns its relative path."""
        rel = f"{SAMPLES}/{cell}-r{repeat}.jsonl"
        text = "".join(json.dumps(dict(row, side=side), sort_keys=True) + "\n"
                       for side, rows in samples.items() for row in rows)
        setfiles.write_inside(self.dir, rel, text.encode("utf-8"), fsync=True)  # samples/ no link either
        return rel

    # -- records ----------------------------------------------------------------------------
    def _append(self, name: str, record: dict) -> None:
        data = (json.dumps(record, sort_keys=True, default=str) + "\n").encode("utf-8")
        # The whole line, then fsync: after a crash the file ends either before the line or (rarely)
        # in a torn line that readers skip and resume truncates. write() may write less than asked
        # (ENOSPC mid-line): then the file is cut back to where the line began, so the next append
        # cannot glue onto half a record and make the whole set unreadable.
        path = self.path(name)
        # O_NOFOLLOW: a --resume of someone else's set never appends through a link they planted
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ResultsError(f"{path}: not a regular file: no record appended")
            start = os.fstat(fd).st_size  # the only writer: O_APPEND writes land here
            try:
                done = 0
                while done < len(data):
                    n = os.write(fd, data[done:])
                    if n <= 0:
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    done += n
                os.fsync(fd)
            except OSError as exc:
                try:
                    os.ftruncate(fd, start)
                    os.fsync(fd)
                except OSError as undo:
                    raise ResultsWriteError(f"{path}: cannot write a record ({exc}) nor cut the partial line back "
                                       f"to byte {start} ({undo}); `zcorch run --resume` cuts it") from None
                full = " (the disk is full)" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
                raise ResultsWriteError(f"{path}: cannot write a record{full}: {exc.strerror or exc}; nothing "
                                   "written before was lost, the partial line was removed") from None
        finally:
            os.close(fd)

    def append_run(self, record: dict) -> None:
        if record.get("status") not in RUN_STATUSES:
            raise ValueError(f"run status must be one of {RUN_STATUSES}, got {record.get('status')!r}")
        self._append(RUNS, record)

    def append_baseline(self, record: dict) -> None:
        self._append(BASELINES, record)
        if self.baseline_written is not None:
            self.baseline_written(record)

    def runs(self) -> List[dict]:
        return read_jsonl(self.path(RUNS))

    def baselines(self) -> List[dict]:
        return read_jsonl(self.path(BASELINES))

    def ok_keys(self) -> set:
        """(cell, repeat) pairs whose newest record is ok: what --resume skips."""
        return {k for k, rec in latest_runs(self.runs()).items() if rec.get("status") == "ok"}

    def plan_runs(self) -> List[dict]:
        return setfiles.read_json(self.dir, PLAN, setfiles.MAX_PLAN_BYTES)

    # -- meta / manifest --------------------------------------------------------------------
    def write_meta(self, meta: dict, keep_previous: bool = True) -> None:
        """meta.json; on resume the earlier metadata is kept under "previous" (hosts may differ).

        keep_previous=False updates this sweep's metadata in place (e.g. filesystems, known only
        after provisioning) and carries over the existing "previous" list.
        """
        path = self.path(META)
        if os.path.exists(path) and not keep_previous:
            old = setfiles.read_json(self.dir, META)
            meta = dict(meta)
            if "previous" in old:
                meta["previous"] = old["previous"]
        elif os.path.exists(path):
            old = setfiles.read_json(self.dir, META)
            meta = dict(meta)
            meta["previous"] = old.get("previous", []) + [{k: v for k, v in old.items() if k != "previous"}]
        write_json_atomic(path, meta)

    def record_convergence(self, states: Dict[str, dict]) -> None:
        """{cell: {"n", "width_pct", "converged"}} at the end of an adaptive sweep (manifest "convergence",
        written by finish()): which cells did not converge, and the width each reached."""
        self.manifest["convergence"] = dict(states)

    def _write_manifest(self) -> None:
        write_json_atomic(self.path(MANIFEST), self.manifest)

    def finish(self, status: str, error: Optional[BaseException] = None) -> None:
        """Record the final status; `error`: what ended the sweep early (its type and message go into
        the manifest's "error", so a set that did not complete says why). The load cache of a complete
        sweep is written by the caller (zcorch.analysis.cache.write_cache): this package stays free of
        pandas and the analysis."""
        if status not in ("complete", "interrupted", "failed", "running"):
            raise ValueError(f"bad result-set status {status!r}")
        self.manifest["status"] = status
        self.manifest["finished"] = utc_now()
        if error is not None:
            self.manifest["error"] = {"type": type(error).__name__, "message": str(error)}
        else:
            self.manifest.pop("error", None)  # a resumed set that now ends well: the old error is history
        self._write_manifest()
