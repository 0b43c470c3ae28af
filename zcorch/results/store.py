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
import json
import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from zcorch.errors import ResultsError, ResultsWriteError

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
LOGS = "logs"
SAMPLES = "samples"  # per-run samples: samples/<cell>-r<repeat>.jsonl, one line per sample and side

RUN_STATUSES = ("ok", "failed", "timeout", "interrupted")


def utc_now() -> str:
    """ISO-8601 UTC timestamp with microseconds (sortable, unambiguous)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def write_text_atomic(path: str, text: str) -> None:
    """Replace `path` with `text` without ever leaving a half-written file."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # A full disk (finishing the manifest of a sweep it ended): no half-written temp file left behind.
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json_atomic(path: str, obj: Any) -> None:
    """Replace `path` with `obj` as JSON without ever leaving a half-written file."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_jsonl(path: str) -> List[dict]:
    """Records of a JSON-lines file; a torn (unparsable, unterminated) final line is skipped.

    A bad line anywhere else is corruption, not a crash artefact, and raises ResultsError.
    """
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    records = []
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            records.append(json.loads(raw))
        except ValueError:
            is_last = i == len(lines) - 1  # no newline after it: the write was cut short
            if is_last:
                continue
            raise ResultsError(f"{path}:{i + 1}: not a JSON record: {raw[:80]!r}") from None
    return records


def _truncate_torn_tail(path: str) -> bool:
    """Cut an unterminated last line (crash mid-write). Returns True if something was cut."""
    if not os.path.exists(path):
        return False
    with open(path, "rb+") as f:
        data = f.read()
        if not data or data.endswith(b"\n"):
            return False
        keep = data.rfind(b"\n") + 1
        f.truncate(keep)
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
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ResultsError(f"{directory}: not a zcorch result set (no {MANIFEST})") from None
    except ValueError as exc:
        raise ResultsError(f"{path}: not valid JSON ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise ResultsError(f"{path}: not a zcorch result set (format {manifest.get('format')!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ResultsError(f"{path}: result-set format version {manifest.get('format_version')!r} is not "
                           f"supported (this zcorch reads version {FORMAT_VERSION})")
    return manifest


class ResultSet:
    """One result directory being written by `zcorch run`."""

    def __init__(self, directory: str, manifest: dict):
        self.dir = directory
        self.manifest = manifest
        self.baseline_written: Optional[Callable[[dict], None]] = None  # told of each baseline record written

    # -- creation / reopening ------------------------------------------------------------
    @classmethod
    def create(cls, directory: str, *, name: str, experiment_bytes: bytes, plan_runs: List[dict],
               command: List[str], accept_new_host_keys: bool, zcorch_version: str,
               git_revision: Optional[str], unique: bool = False, source: Optional[dict] = None,
               source_bytes: Optional[bytes] = None, inventory: Optional[dict] = None,
               overrides: Sequence[str] = ()) -> "ResultSet":
        """A new result set in `directory`.

        unique: `directory` is a default name (results/<name>-<time>): if another sweep took it (two
        started within the same second), `-2`, `-3` ... is appended; the directory is made with an
        exclusive mkdir, so two sweeps never share one. experiment_bytes: what experiment.yaml holds
        (the document as run); source_bytes: the file as written when that differs (experiment.source.yaml).
        source: {"path", "sha256"} of the experiment file given; inventory: {"path", "sha256", "pair"}
        when the hosts came from an inventory; overrides: the --set KEY=VALUE applied, as given.
        """
        if unique:
            directory = _new_directory(directory)
        elif os.path.exists(os.path.join(directory, MANIFEST)):
            raise ResultsError(f"{directory} already holds a result set; use --resume {directory} "
                               "to continue it or choose another -o")
        os.makedirs(os.path.join(directory, LOGS), exist_ok=True)
        with open(os.path.join(directory, EXPERIMENT), "wb") as f:
            f.write(experiment_bytes)
        if source_bytes is not None:
            with open(os.path.join(directory, EXPERIMENT_SOURCE), "wb") as f:
                f.write(source_bytes)
        write_json_atomic(os.path.join(directory, PLAN), plan_runs)
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "name": name, "created": utc_now(),
            "finished": None, "zcorch_version": zcorch_version, "git_revision": git_revision,
            "command": list(command), "accept_new_host_keys": bool(accept_new_host_keys),
            "experiment_file": EXPERIMENT, "status": "running",
            "experiment_source": dict(source or {}, copy=EXPERIMENT_SOURCE if source_bytes is not None else None),
            "inventory": dict(inventory) if inventory else None, "overrides": list(overrides),
        }
        rs = cls(directory, manifest)
        rs._write_manifest()
        return rs

    @classmethod
    def open_for_resume(cls, directory: str, command: List[str], inventory: Optional[dict] = None) -> "ResultSet":
        """Reopen a result set; `inventory`: the pair given with --hosts for this resume (recorded in its
        `resumed` entry; without it the hosts of experiment.yaml run again)."""
        manifest = load_manifest(directory)
        for name in (RUNS, BASELINES):
            _truncate_torn_tail(os.path.join(directory, name))
        os.makedirs(os.path.join(directory, LOGS), exist_ok=True)
        entry: Dict[str, Any] = {"at": utc_now(), "command": list(command)}
        if inventory:
            entry["inventory"] = dict(inventory)
        manifest.setdefault("resumed", []).append(entry)
        manifest["status"] = "running"
        manifest["finished"] = None
        rs = cls(directory, manifest)
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
        path = self.path(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_text_atomic(path, "".join(json.dumps(dict(row, side=side), sort_keys=True) + "\n"
                                        for side, rows in samples.items() for row in rows))
        return rel

    # -- records ----------------------------------------------------------------------------
    def _append(self, name: str, record: dict) -> None:
        data = (json.dumps(record, sort_keys=True, default=str) + "\n").encode("utf-8")
        # The whole line, then fsync: after a crash the file ends either before the line or (rarely)
        # in a torn line that readers skip and resume truncates. write() may write less than asked
        # (ENOSPC mid-line): then the file is cut back to where the line began, so the next append
        # cannot glue onto half a record and make the whole set unreadable.
        path = self.path(name)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
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
        with open(self.path(PLAN), encoding="utf-8") as f:
            return json.load(f)

    # -- meta / manifest --------------------------------------------------------------------
    def write_meta(self, meta: dict, keep_previous: bool = True) -> None:
        """meta.json; on resume the earlier metadata is kept under "previous" (hosts may differ).

        keep_previous=False updates this sweep's metadata in place (e.g. filesystems, known only
        after provisioning) and carries over the existing "previous" list.
        """
        path = self.path(META)
        if os.path.exists(path) and not keep_previous:
            with open(path, encoding="utf-8") as f:
                old = json.load(f)
            meta = dict(meta)
            if "previous" in old:
                meta["previous"] = old["previous"]
        elif os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                old = json.load(f)
            meta = dict(meta)
            meta["previous"] = old.get("previous", []) + [{k: v for k, v in old.items() if k != "previous"}]
        write_json_atomic(path, meta)

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
