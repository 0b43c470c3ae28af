"""The load cache of a result set: runs.jsonl parsed once into `runs.parquet` beside it.

Loading a large runs.jsonl is dominated by JSON parsing (about a minute per GB), so the parsed runs
are kept as Parquet. The file holds the frame zcorch.load returns minus `sweep` (the directory's
name, which the loader adds), with the same columns and dtypes, so pandas, polars, DuckDB or Spark
read a result set without zcorch (the copy units come from meta.json as it was when the file was written).
Object columns whose values Parquet cannot type faithfully
(mixed types, e.g. an unknown parameter that is a number in one run and text in another) are
stored as JSON text and decoded again by zcorch.

What the file is valid for is in its key-value metadata under `zcorch.cache`: the size and the
SHA-256 of the runs.jsonl bytes it was built from, and the cache format version. Any change of
runs.jsonl (an append, a truncation, a torn last line, `--resume`, a record edited in place with its
size and mtime kept) makes it stale, and the next zcorch.load parses runs.jsonl again and rewrites it;
hashing costs about a second per GB, parsing a minute. It is replaced atomically (an exclusive
temporary + rename, no link followed: zcorch.results.setfiles), read only as a regular file inside
the set, never trusted when unreadable, and safe to delete (a copy stays valid). `zcorch run`
writes it when a sweep completes (`write_cache`), zcorch.load when it is missing or stale. The
hand-rolled `runs.cache` of earlier versions is ignored, and removed when runs.parquet is written.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
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
CACHE_VERSION = 4  # 4: keyed on the SHA-256 of runs.jsonl, not its size and mtime
META_KEY = b"zcorch.cache"
_ANNOUNCE_BYTES = 100_000_000


def _stamp(runs: Path) -> Optional[dict]:
    """What a cache of `runs` is valid for: its size and the SHA-256 of those bytes (None: no runs.jsonl yet).
    A file that grows meanwhile is hashed up to the size first seen, so a longer file never matches."""
    try:
        fd = setfiles.open_inside(runs.parent, runs.name)
    except FileNotFoundError:
        return None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        size = left = os.fstat(f.fileno()).st_size
        while left > 0:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    return {"cache_version": CACHE_VERSION, "size": size - left, "sha256": digest.hexdigest()}


def runs_of(path: frames.PathLike, cache: bool = True) -> pd.DataFrame:
    """The raw runs frame (no derived columns) of one result set, from runs.parquet when it
    matches runs.jsonl; otherwise parsed, and the cache (re)written unless cache=False."""
    d = frames.result_dir(path)
    frames.read_manifest(d)
    runs = d / results.RUNS
    stamp = _stamp(runs)  # taken before parsing: a file that grows meanwhile invalidates the cache
    if stamp is None:
        return frames.parse_runs(runs)  # a set interrupted before its first run: no runs
    cache_path = d / CACHE_NAME
    if cache:
        frame = _read(cache_path, stamp)
        if frame is not None:
            return frame
    frame = frames.parse_runs(runs)
    if cache:
        try:
            _write(frame, cache_path, stamp)
        except OSError as exc:  # a read-only result set still loads, just without the speed-up
            warnings.warn(f"{cache_path}: cache not written ({exc})", stacklevel=3)
    return frame


def write_cache(path: frames.PathLike, warn: Optional[Callable[[str], None]] = None) -> Optional[Path]:
    """Write runs.parquet of a result set now, unless a valid one is there already: what `zcorch run`
    does when a sweep completes, so that the first zcorch.load reads columns instead of parsing every
    JSON line. Returns the cache path.

    Best effort: runs.jsonl stays the source of truth and is only read; any failure, even Ctrl-C,
    is a warning (to `warn`, default: on stderr) and None, and the next zcorch.load parses runs.jsonl
    as it always could. Also None when there is no runs.jsonl (no runs to cache)."""
    d = Path(path)
    try:
        d = frames.result_dir(path)
        frames.read_manifest(d)
        stamp = _stamp(d / results.RUNS)
        if stamp is None:
            return None
        if not _matches(d / CACHE_NAME, stamp):
            if stamp["size"] > _ANNOUNCE_BYTES:  # about 1 min per GB: say why the run has not ended yet
                print(f"zcorch: writing {CACHE_NAME} for the {stamp['size'] / 1e6:.0f} MB {results.RUNS} so that "
                      "the first load is fast (Ctrl-C skips it)", file=sys.stderr, flush=True)
            _write(frames.parse_runs(d / results.RUNS), d / CACHE_NAME, stamp)
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


# ---------------------------------------------------------------------------------------------
# The Parquet file


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {value!r}")


def arrow_table(frame: pd.DataFrame) -> "tuple[pa.Table, list]":
    """`frame` as an Arrow table, and the object columns stored as JSON text (module docstring): what
    runs.parquet holds, and the result dataset's runs (zcorch.analysis.export). `frame` is not changed."""
    full = frame.copy(deep=False)
    json_columns = []
    for name in full.columns[full.dtypes == object]:
        col = full[name]
        try:
            kind = pa.array(col, from_pandas=True).type
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            kind = None
        # Arrow reads back bools (with nulls) and all-null columns as the same object column; any
        # other object column (mixed types, or text pandas did not type as str) would change dtype.
        if kind != pa.bool_() and kind != pa.null():
            full[name] = [None if v is None else json.dumps(v, default=_json_default) for v in col]
            json_columns.append(name)
    return pa.Table.from_pandas(full, preserve_index=False), json_columns


def _to_table(frame: pd.DataFrame, stamp: dict, yardsticks: Optional[dict] = None) -> pa.Table:
    """`frame` plus its derived columns (and the copy units of `yardsticks`, frames.copy_yardsticks of the
    set's meta.json) as an Arrow table, with the validity stamp in its metadata."""
    full = frames.add_derived(frame.copy(deep=False))  # shallow: the derived columns go to the copy only
    full = frames.add_copy_units(full, {None: yardsticks or frames.copy_yardsticks({})})
    raw = set(frame.columns)
    derived = [c for c in full.columns if c not in raw]
    table, json_columns = arrow_table(full)
    meta = {**stamp, "derived": derived, "json_columns": json_columns}
    return table.replace_schema_metadata({**(table.schema.metadata or {}), META_KEY: json.dumps(meta).encode()})


def _write(frame: pd.DataFrame, cache_path: Path, stamp: dict) -> None:
    try:
        yardsticks = frames.copy_yardsticks(frames.read_meta(cache_path.parent))
    except ResultsError:  # an unreadable meta.json: the copy units are left out, as zcorch.load leaves them
        yardsticks = None
    table = _to_table(frame, stamp, yardsticks)
    # readers see the old file or the whole new one, never a part; nothing is written through a link
    setfiles.write_inside(cache_path.parent, cache_path.name, lambda f: pq.write_table(table, f))
    try:
        (cache_path.parent / OLD_CACHE_NAME).unlink()
    except OSError:  # already gone (the usual case) or not removable: it is ignored either way
        pass


def _cache_meta(schema: pa.Schema) -> Optional[dict]:
    meta = json.loads((schema.metadata or {}).get(META_KEY, b"null"))
    return meta if isinstance(meta, dict) else None


def _valid_for(meta: Optional[dict], stamp: dict) -> bool:
    return meta is not None and all(meta.get(k) == v for k, v in stamp.items())


def _open_cache(cache_path: Path) -> int:
    """An fd of runs.parquet: a regular file inside the set, no larger than MAX_CACHE_BYTES (else ResultsError)."""
    fd = setfiles.open_inside(cache_path.parent, cache_path.name)
    if os.fstat(fd).st_size > setfiles.MAX_CACHE_BYTES:
        os.close(fd)
        raise ResultsError(f"{cache_path}: larger than {setfiles.MAX_CACHE_BYTES} bytes: not read")
    return fd


def _matches(cache_path: Path, stamp: dict) -> bool:
    try:
        fd = _open_cache(cache_path)
    except (OSError, ResultsError):
        return False
    try:
        return _valid_for(_cache_meta(pq.read_schema(setfiles.fd_path(fd))), stamp)
    except (OSError, ValueError, pa.ArrowException):
        return False
    finally:
        os.close(fd)


def _read(cache_path: Path, stamp: dict) -> Optional[pd.DataFrame]:
    """The raw runs frame stored in `cache_path` if it is valid for `stamp`, else None (missing,
    stale, cut short, foreign: rebuilt, never trusted)."""
    # Most of a first load is the kernel faulting in fresh memory for the frame. The default pool
    # (mimalloc) asks for transparent huge pages, whose faults can stall on compaction (3x slower
    # on a busy host); plain malloc's small pages do not. Explicit here: the default pool of the
    # process is the caller's. The dataset API is the reader that takes a pool.
    pool = pa.system_memory_pool()
    try:
        fd = _open_cache(cache_path)
    except (OSError, ResultsError):
        return None
    try:
        # The fd's own file, reopened by Arrow through /proc: no link below the set is followed.
        data = ds.dataset(setfiles.fd_path(fd), format="parquet")
        meta = _cache_meta(data.schema)
        if not _valid_for(meta, stamp):
            return None
        derived = set(meta["derived"])  # recomputed by zcorch.load, so never stale
        table = data.to_table(columns=[n for n in data.schema.names if n not in derived], memory_pool=pool)
        json_values = {name: table.column(name).to_pylist() for name in meta["json_columns"]}
        # Single-chunk numbers and timestamps without nulls become read-only views on Arrow's
        # buffers: copied below, so that the caller can assign to any cell as in a parsed frame.
        shared = [name for name, col in zip(table.column_names, table.columns)
                  if col.num_chunks == 1 and col.null_count == 0
                  and (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)
                       or pa.types.is_timestamp(col.type))]
        # One block per column, each column's Arrow memory freed as soon as it is converted: less
        # memory to fault in than a consolidated frame.
        frame = table.to_pandas(split_blocks=True, self_destruct=True, memory_pool=pool)
        del table  # unusable after self_destruct
        for name in shared:
            frame[name] = frame[name].copy()
        for name, values in json_values.items():
            col = np.empty(len(values), dtype=object)
            col[:] = [None if v is None else json.loads(v) for v in values]
            frame[name] = col
        return frame
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    finally:
        os.close(fd)
