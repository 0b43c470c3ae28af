"""The result set on disk (format version 1, layout in docs/architecture.md).

Writers append and fsync one JSON line per finished run/baseline; readers skip a torn final line, which
`ResultSet.open_for_resume` truncates. After `--resume` the newest record of a (cell, repeat) wins.
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
from pathlib import Path
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
    """The manifest's `clock`: boot id and CLOCK_BOOTTIME, which order sets of one boot even when the wall clock
    is set back (zcorch.analysis.history.clock_problems). Empty where the system has neither."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return {"boot_id": boot_id, "boottime_ns": time.clock_gettime_ns(time.CLOCK_BOOTTIME)}
    except (OSError, AttributeError):
        return {}


def write_text_atomic(path: str, text: str) -> None:
    """Replace `path` with `text` through an fsynced exclusive temporary (setfiles.write_inside)."""
    setfiles.write_inside(os.path.dirname(path) or ".", os.path.basename(path), text.encode("utf-8"), fsync=True)


def write_json_atomic(path: str, obj: Any) -> None:
    """Replace `path` with `obj` as JSON without ever leaving a half-written file."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def iter_jsonl(path: str) -> Iterator[Tuple[int, Any]]:
    """(line number, record) of a JSON-lines file, streamed, read as setfiles reads a set's files (bounds
    included); a torn final line is skipped, a bad line elsewhere raises ResultsError. No file: no records."""
    decode = _DECODER.decode  # json.loads minus its per-call type and encoding checks
    root, name = os.path.dirname(path) or ".", os.path.basename(path)
    # runs.jsonl is refused beyond what its set's plan can hold (nothing past the bound is parsed)
    limit, why = setfiles.run_record_limit(root) if name == RUNS else (setfiles.MAX_RECORDS, None)
    for lineno, raw, terminated in setfiles.iter_lines(root, name, max_records=limit, refuse_beyond=why):
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
    """The offset just past the last newline of the first `size` bytes of `f` (0 if none), read backwards."""
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
    """Bytes of a result set's JSON-lines file up to its last newline (0 when it is missing, a link or no
    regular file): where the records appended from now on begin."""
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
    return {(rec["cell"], int(rec["repeat"])): rec for rec in records}


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
    """The result set's exclusive lock (flock on DIR/.lock, never through a symlink), held by the returned fd;
    ResultSetBusy naming the holder when another process has it."""
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
        unique: a default name: `-2`, `-3` ... is appended if another sweep took it (exclusive mkdir)."""
        if unique:
            directory = _new_directory(directory)
        else:
            os.makedirs(directory, exist_ok=True)
        lock = lock_result_set(directory)   # before looking: a concurrent create or resume of the same -o
        if os.path.exists(os.path.join(directory, MANIFEST)):
            os.close(lock)
            raise ResultsError(f"{directory} already holds a result set; use --resume {directory} "
                               "to continue it or choose another -o")
        os.makedirs(os.path.join(directory, LOGS), exist_ok=True)
        Path(directory, EXPERIMENT).write_bytes(experiment_bytes)
        if source_bytes is not None:
            Path(directory, EXPERIMENT_SOURCE).write_bytes(source_bytes)
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
        """Reopen a result set (ResultSetBusy while another process writes it); `inventory`: --hosts's pair."""
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
        """Write samples/<cell>-r<repeat>.jsonl whole (one line per sample with its "side"), replacing an
        earlier run's, before the record that names it. Returns its relative path."""
        rel = f"{SAMPLES}/{cell}-r{repeat}.jsonl"
        text = "".join(json.dumps(dict(row, side=side), sort_keys=True) + "\n"
                       for side, rows in samples.items() for row in rows)
        setfiles.write_inside(self.dir, rel, text.encode("utf-8"), fsync=True)  # samples/ no link either
        return rel

    # -- records ----------------------------------------------------------------------------
    def _append(self, name: str, record: dict) -> None:
        data = (json.dumps(record, sort_keys=True, default=str) + "\n").encode("utf-8")
        # The whole line, then fsync. A short write (ENOSPC mid-line) is cut back to where the line began:
        # the next append must not glue onto half a record.
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
        keep_previous=False updates this sweep's metadata in place, keeping the "previous" list."""
        path = self.path(META)
        if os.path.exists(path):
            old = setfiles.read_json(self.dir, META)
            meta = dict(meta)
            if keep_previous:
                meta["previous"] = old.get("previous", []) + [{k: v for k, v in old.items() if k != "previous"}]
            elif "previous" in old:
                meta["previous"] = old["previous"]
        write_json_atomic(path, meta)

    def record_convergence(self, states: Dict[str, dict]) -> None:
        """{cell: {"n", "width_pct", "converged"}} of an adaptive sweep, the manifest's "convergence"."""
        self.manifest["convergence"] = dict(states)

    def _write_manifest(self) -> None:
        write_json_atomic(self.path(MANIFEST), self.manifest)

    def finish(self, status: str, error: Optional[BaseException] = None) -> None:
        """Record the final status; `error`: what ended the sweep early (the manifest's "error"). The load cache
        is the caller's to write (zcorch.analysis.cache): this package stays free of pandas."""
        if status not in ("complete", "interrupted", "failed", "running"):
            raise ValueError(f"bad result-set status {status!r}")
        self.manifest["status"] = status
        self.manifest["finished"] = utc_now()
        if error is not None:
            self.manifest["error"] = {"type": type(error).__name__, "message": str(error)}
        else:
            self.manifest.pop("error", None)  # a resumed set that now ends well: the old error is history
        self._write_manifest()
