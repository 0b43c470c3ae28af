"""The load cache of a result set: runs.jsonl parsed once into `runs.parquet` beside it (object columns as JSON
text), stamped with the size, SHA-256 and identity of the runs.jsonl bytes it was built from: any change makes it
stale. Written atomically, never through a link; safe to delete. An older `runs.cache` is removed."""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from zcorch.analysis import frames
from zcorch.errors import ResultsError
from zcorch.results import setfiles
from zcorch.results import store as results

CACHE_NAME = results.RUNS_CACHE
OLD_CACHE_NAME = "runs.cache"  # the numpy-array cache of earlier versions
CACHE_VERSION = 5
META_KEY = b"zcorch.cache"
_ANNOUNCE_BYTES = 100_000_000
# How long before hashing runs.jsonl must have last changed for its identity to be trusted: more than the
# coarsest ctime tick, so any later write gets a later ctime.
RACY_NS = 50_000_000


def _identity(st: os.stat_result) -> list:
    """What changes whenever a file's bytes do (ctime cannot be set back by any call)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


class _Source:
    """runs.jsonl of a set, opened once: its identity now, and (on demand) the stamp a cache of it carries."""

    def __init__(self, runs: Path, fd: int):
        self.runs = runs
        self._file = os.fdopen(fd, "rb")
        self.stat = os.fstat(self._file.fileno())
        self.size = self.stat.st_size
        self._stamp: Optional[dict] = None

    def close(self) -> None:
        self._file.close()

    def stamp(self, settle: bool = False) -> dict:
        """{cache_version, size, sha256, file}: of the bytes up to the size first seen, and the file's identity when
        safe to trust (else None); `settle`: wait out RACY_NS first so that the identity can be recorded."""
        if self._stamp is not None and (not settle or self._stamp["file"] is not None):
            return self._stamp
        before = self.stat
        age = time.time_ns() - before.st_ctime_ns
        if settle and 0 <= age < RACY_NS:
            time.sleep((RACY_NS - age) / 1e9)
            before = self.stat = os.fstat(self._file.fileno())
            age = time.time_ns() - before.st_ctime_ns
        digest = hashlib.sha256()
        self._file.seek(0)
        left = before.st_size
        while left > 0:
            chunk = self._file.read(min(left, 1 << 20))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
        after = os.fstat(self._file.fileno())
        trusted = age >= RACY_NS and _identity(after) == _identity(before)
        self._stamp = {"cache_version": CACHE_VERSION, "size": before.st_size - left, "sha256": digest.hexdigest(),
                       "file": _identity(before) if trusted else None}
        return self._stamp

    def unchanged_since(self, stamp: dict) -> bool:
        """Whether the file is still the one `stamp` identified (a cache built meanwhile may be written)."""
        return stamp["file"] is None or _identity(os.fstat(self._file.fileno())) == stamp["file"]

    def matches(self, meta: Optional[dict]) -> bool:
        """Whether a cache with metadata `meta` was built from exactly these bytes: by identity, else by hash."""
        if meta is None or meta.get("cache_version") != CACHE_VERSION or meta.get("size") != self.size:
            return False
        if meta.get("file") is not None and meta["file"] == _identity(self.stat):
            return True
        stamp = self.stamp()
        return meta.get("size") == stamp["size"] and meta.get("sha256") == stamp["sha256"]


def _source(runs: Path) -> Optional[_Source]:
    """runs.jsonl opened inside its set (no link followed); None when there is none yet."""
    try:
        fd = setfiles.open_inside(runs.parent, runs.name)
    except FileNotFoundError:
        return None
    return _Source(runs, fd)


def runs_of(path: frames.PathLike, cache: bool = True) -> "tuple[pd.DataFrame, bool]":
    """(frame, complete) of one result set: from runs.parquet when it matches runs.jsonl, else parsed and the cache
    (re)written unless cache=False; complete: the frame holds derived columns still valid (_derived_stamp)."""
    d = frames.result_dir(path)
    frames.read_manifest(d)
    runs = d / results.RUNS
    source = _source(runs)
    if source is None:
        return frames.parse_runs(runs), False  # a set interrupted before its first run: no runs
    try:
        cache_path = d / CACHE_NAME
        if not cache:
            return frames.parse_runs(runs), False
        found = _read(cache_path, source)
        if found is not None:
            return found
        stamp = source.stamp()  # taken before parsing: a file that grows meanwhile is stale
        frame = frames.parse_runs(runs)
        if source.unchanged_since(stamp):
            try:
                _write(frame, cache_path, stamp)
            except OSError as exc:  # a read-only result set still loads, just without the speed-up
                warnings.warn(f"{cache_path}: cache not written ({exc})", stacklevel=3)
        return frame, False
    finally:
        source.close()


def write_cache(path: frames.PathLike, warn: Optional[Callable[[str], None]] = None) -> Optional[Path]:
    """Write runs.parquet of a result set now unless a valid one is there (`zcorch run` at a sweep's end); returns
    its path. Best effort: any failure, even Ctrl-C, is a warning (to `warn`, default stderr) and None, as is a set
    without runs.jsonl."""
    d = Path(path)
    try:
        d = frames.result_dir(path)
        frames.read_manifest(d)
        source = _source(d / results.RUNS)
        if source is None:
            return None
        try:
            if not _matches(d / CACHE_NAME, source):
                if source.size > _ANNOUNCE_BYTES:  # about 1 min per GB: say why the run has not ended yet
                    print(f"zcorch: writing {CACHE_NAME} for the {source.size / 1e6:.0f} MB {results.RUNS} so "
                          "that the first load is fast (Ctrl-C skips it)", file=sys.stderr, flush=True)
                stamp = source.stamp(settle=True)
                frame = frames.parse_runs(d / results.RUNS)
                if not source.unchanged_since(stamp):
                    raise ResultsError(f"{d / results.RUNS} changed while it was read")
                _write(frame, d / CACHE_NAME, stamp)
        finally:
            source.close()
        return d / CACHE_NAME
    except (Exception, KeyboardInterrupt) as exc:
        what = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"{type(exc).__name__}: {exc}"
        message = (f"{d / CACHE_NAME} not built ({what}); the results are complete in {d / results.RUNS}, "
                   "the first zcorch.load will parse it")
        if warn is None:
            print(f"zcorch: warning: {message}", file=sys.stderr)
        else:
            warn(message)
        return None


# The Parquet file


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {value!r}")


def arrow_table(frame: pd.DataFrame) -> "tuple[pa.Table, list]":
    """`frame` (not changed) as an Arrow table, and the object columns stored as JSON text."""
    full = frame.copy(deep=False)
    json_columns = []
    for name in full.columns[full.dtypes == object]:
        col = full[name]
        try:
            kind = pa.array(col, from_pandas=True).type
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            kind = None
        # only bools (with nulls) and all-null columns read back as the same object column
        if kind != pa.bool_() and kind != pa.null():
            full[name] = [None if v is None else json.dumps(v, default=_json_default) for v in col]
            json_columns.append(name)
    return pa.Table.from_pandas(full, preserve_index=False), json_columns


def _to_table(frame: pd.DataFrame, stamp: dict, yardsticks: Optional[dict] = None,
              derived_stamp: Optional[dict] = None, control: "Optional[str | dict]" = None,
              plan: Optional[dict] = None) -> pa.Table:
    """`frame` with its derived columns as an Arrow table, the validity stamp in its metadata."""
    full = frames.add_derived(frame.copy(deep=False))  # shallow: the derived columns go to the copy only
    full = frames.add_copy_units(full, {None: yardsticks or frames.copy_yardsticks({})})
    full = frames.add_control_ratios(full, control)
    raw = set(frame.columns)
    derived = [c for c in full.columns if c not in raw]
    table, json_columns = arrow_table(full)
    meta = {**stamp, "derived": derived, "json_columns": json_columns, "derived_from": derived_stamp, "plan": plan}
    return table.replace_schema_metadata({**(table.schema.metadata or {}), META_KEY: json.dumps(meta).encode()})


def _write(frame: pd.DataFrame, cache_path: Path, stamp: dict) -> None:
    derived_stamp = _derived_stamp(cache_path.parent)
    try:
        yardsticks = frames.copy_yardsticks(frames.read_meta(cache_path.parent))
    except ResultsError:  # an unreadable meta.json: the copy units are left out, as zcorch.load leaves them
        yardsticks = None
    if derived_stamp is not None and derived_stamp != _derived_stamp(cache_path.parent):
        derived_stamp = None  # meta.json changed while it was read: the copy units are recomputed on load
    control = derived_stamp["control"] if derived_stamp is not None else _control(cache_path.parent)
    try:
        plan = setfiles.plan_stamp(cache_path.parent)
    except (OSError, ResultsError):  # the load bounds the cache by plan.json itself then
        plan = None
    table = _to_table(frame, stamp, yardsticks, derived_stamp, control, plan)
    # readers see the old file or the whole new one, never a part; nothing is written through a link
    setfiles.write_inside(cache_path.parent, cache_path.name, lambda f: pq.write_table(table, f))
    try:
        (cache_path.parent / OLD_CACHE_NAME).unlink()
    except OSError:  # already gone (the usual case) or not removable: it is ignored either way
        pass


# The modules whose code computes the derived columns and copy units (frames.add_derived, add_copy_units).
_DERIVING_MODULES = ("zcorch.analysis.frames", "zcorch.results.rates", "zcorch.metrics", "zcorch.params")
_code_digest: Optional[str] = None


def _deriving_code() -> Optional[str]:
    """SHA-256 of the source of the modules that derive columns (None: unreadable): a fix of a derivation is never
    hidden by a cache an older zcorch wrote."""
    global _code_digest
    if _code_digest is None:
        digest = hashlib.sha256()
        try:
            for name in _DERIVING_MODULES:
                origin = getattr(sys.modules.get(name), "__file__", None)
                if not origin:
                    return None
                with open(origin, "rb") as f:
                    digest.update(f.read())
        except OSError:
            return None
        _code_digest = digest.hexdigest()
    return _code_digest


def _control(d: Path) -> "Optional[str | dict]":
    """The control of set `d` (frames.control_of); None when it has none or the manifest cannot be read."""
    try:
        return frames.control_of(frames.read_manifest(d), d)
    except (OSError, ValueError, ResultsError):
        return None


def _derived_stamp(d: Path) -> Optional[dict]:
    """What a cache's derived columns depend on besides runs.jsonl: the deriving code, meta.json's bytes and the
    control; None: never trusted (unreadable)."""
    code = _deriving_code()
    if code is None:
        return None
    try:
        meta = setfiles.read_bytes(d, "meta.json", setfiles.MAX_JSON_BYTES)
        control = frames.control_of(frames.read_manifest(d), d)
    except FileNotFoundError:
        meta, control = b"", _control(d)
    except (OSError, ValueError, ResultsError):
        return None
    return {"code": code, "meta_sha256": hashlib.sha256(meta).hexdigest(), "control": control}


def _cache_meta(schema: pa.Schema) -> Optional[dict]:
    meta = json.loads((schema.metadata or {}).get(META_KEY, b"null"))
    return meta if isinstance(meta, dict) else None


def _open_cache(cache_path: Path) -> int:
    """An fd of runs.parquet: a regular file inside the set, no larger than MAX_CACHE_BYTES (else ResultsError)."""
    fd = setfiles.open_inside(cache_path.parent, cache_path.name)
    if os.fstat(fd).st_size > setfiles.MAX_CACHE_BYTES:
        os.close(fd)
        raise ResultsError(f"{cache_path}: larger than {setfiles.MAX_CACHE_BYTES} bytes: not read")
    return fd


# A row of runs.parquet is one (cell, repeat) of runs.jsonl, whose records take at least this many bytes each.
MIN_RECORD_BYTES = 16
# The uncompressed data of runs.parquet, at most this many times the bytes of runs.jsonl (plus CACHE_BYTES_SLACK).
CACHE_BYTES_FACTOR = 8
CACHE_BYTES_SLACK = 64 * 1024 ** 2
MAX_CACHE_COLUMNS = 10_000


def _oversized(fd: int, source: _Source, meta: Optional[dict] = None) -> Optional[str]:
    """Why runs.parquet (open as `fd`, its stamp `meta`) holds more than `source`'s runs.jsonl can give (rows,
    columns, bytes), from its footer alone; None when it fits."""
    md = pq.ParquetFile(setfiles.fd_path(fd)).metadata
    try:
        limit, why = setfiles.run_record_limit(source.runs.parent, (meta or {}).get("plan"))
    except (OSError, ResultsError) as exc:
        return f"its plan cannot be read ({exc})"
    by_size = source.size // MIN_RECORD_BYTES
    if md.num_rows > min(limit, by_size):
        reason = why if limit <= by_size else f"its {source.size}-byte {results.RUNS} can hold"
        return f"{md.num_rows} rows, more than {min(limit, by_size)}: more than {reason}"
    if md.num_columns > MAX_CACHE_COLUMNS:
        return f"{md.num_columns} columns, more than {MAX_CACHE_COLUMNS}"
    data_bytes = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    bound = CACHE_BYTES_FACTOR * source.size + CACHE_BYTES_SLACK
    if data_bytes > bound:
        return f"{data_bytes} bytes of data uncompressed, more than {bound} for its {source.size}-byte {results.RUNS}"
    return None


def _matches(cache_path: Path, source: _Source) -> bool:
    try:
        fd = _open_cache(cache_path)
    except (OSError, ResultsError):
        return False
    try:
        meta = _cache_meta(pq.read_schema(setfiles.fd_path(fd)))
        return source.matches(meta) and _oversized(fd, source, meta) is None
    except (OSError, ValueError, pa.ArrowException):
        return False
    finally:
        os.close(fd)


def _read(cache_path: Path, source: _Source) -> "Optional[tuple[pd.DataFrame, bool]]":
    """(frame, complete) stored in `cache_path` if built from `source`'s bytes, else None; complete as runs_of's."""
    # plain malloc: mimalloc's huge pages can stall a first load's page faults on compaction
    pool = pa.system_memory_pool()
    try:
        fd = _open_cache(cache_path)
    except (OSError, ResultsError):
        return None
    try:
        # The fd's own file, reopened by Arrow through /proc: no link below the set is followed.
        data = ds.dataset(setfiles.fd_path(fd), format="parquet")
        meta = _cache_meta(data.schema)
        if not source.matches(meta):
            return None
        problem = _oversized(fd, source, meta)
        if problem is not None:  # a stamp can be copied: what the file holds is checked before it is read
            warnings.warn(f"{cache_path}: {problem}: ignored, rebuilt from {results.RUNS}", setfiles.SkippedWarning,
                          stacklevel=3)
            return None
        stored = meta.get("derived_from")
        complete = stored is not None and stored == _derived_stamp(cache_path.parent)
        derived = set() if complete else set(meta["derived"])  # else recomputed by zcorch.load: never stale
        table = data.to_table(columns=[n for n in data.schema.names if n not in derived], memory_pool=pool)
        json_values = {name: table.column(name).to_pylist() for name in meta["json_columns"]}
        # read-only views on Arrow's buffers: copied below, so the caller can assign as in a parsed frame
        shared = [name for name, col in zip(table.column_names, table.columns)
                  if col.num_chunks == 1 and col.null_count == 0
                  and (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)
                       or pa.types.is_timestamp(col.type))]
        # a block per column, each one's Arrow memory freed once converted
        frame = table.to_pandas(split_blocks=True, self_destruct=True, memory_pool=pool)
        del table  # unusable after self_destruct
        for name in shared:
            frame[name] = frame[name].copy()
        for name, values in json_values.items():
            col = np.empty(len(values), dtype=object)
            col[:] = [None if v is None else json.loads(v) for v in values]
            frame[name] = col
        return frame, complete
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    finally:
        os.close(fd)
