"""`zcorch export ROOT DEST`: every result set under ROOT as one hive-partitioned Parquet dataset (tables sets, runs,
baselines, hosts by experiment and date, one declared schema), what zcorch.analysis.dataset reads. A set is written
again only when its content changed; concurrent exports write under DEST/.export.lock, dataset.json last, so a
reader sees whole sets only. Layout, schema and concurrency: docs/dataset.md."""
from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import os
import secrets
import socket
import time
import warnings as _warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from zcorch import __version__
from zcorch.analysis import dataset as layout
from zcorch.analysis.export_dest import MANIFEST_TMP, dest_problem
from zcorch.analysis.frames import LINKED_ATTR, load_baselines
from zcorch.analysis.gate import completeness
from zcorch.analysis.hosts import fact
from zcorch.analysis.history import find_result_sets, parse_time, read_set
from zcorch.config.checks import NAME_RE
from zcorch.errors import ResultSetBusy, ResultsError
from zcorch.results import setfiles, store

HASHED = (store.MANIFEST, store.PLAN, store.META, store.RUNS, store.BASELINES)
HOST_FACTS = {  # column -> dotted path in a meta.json host entry
    "hostname": "hostname", "kernel_release": "kernel.release", "kernel_version": "kernel.version",
    "machine": "kernel.machine", "cpu_model": "cpu_model", "cpu_count": "cpu_count",
    "mem_total_bytes": "mem_total_bytes", "mtu": "interface.mtu", "speed_mbps": "interface.speed_mbps",
    "interface_kind": "interface.kind", "boot_id": "boot_id"}


@dataclass
class ExportResult:
    dest: Path
    exported: List[str] = field(default_factory=list)     # set paths written (new or changed)
    unchanged: int = 0                                     # sets already exported with the same content
    skipped: List[str] = field(default_factory=list)      # why a set was not exported
    notes: List[str] = field(default_factory=list)        # sets not written again: the same set seen elsewhere

    def line(self) -> str:
        return (f"{len(self.exported)} result set(s) exported, {self.unchanged} unchanged, "
                f"{len(self.skipped)} skipped -> {self.dest}")


def content_hash(directory: Path) -> str:
    """SHA-256 over the name, size and bytes of each file of HASHED in the set (no link followed)."""
    digest = hashlib.sha256()
    for name in HASHED:
        try:
            fd = setfiles.open_inside(directory, name)
        except FileNotFoundError:
            digest.update(f"{name}\0-\0".encode())
            continue
        with os.fdopen(fd, "rb") as f:
            digest.update(f"{name}\0{os.fstat(f.fileno()).st_size}\0".encode())
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _tables_of(directory: Path, set_id: str, sha: str) -> "tuple[dict, Dict[str, pa.Table], dict]":
    """(the set's partition values, {table: Arrow table}, {table: JSON-text columns}) of one result set."""
    with _warnings.catch_warnings():
        _warnings.simplefilter("ignore")     # what a bounded reader skipped is said by `zcorch history ROOT`
        sweep, set_runs = read_set(directory)
    manifest, meta = sweep.manifest, sweep.meta
    created = parse_time(str(manifest.get("created")))
    common = {"set_id": set_id, "pair": sweep.pair, "kernel": sweep.kernel or None,
              "revision": manifest.get("git_revision") or fact(meta, "controller.git_revision") or None}
    comp = completeness(directory)
    linked = set_runs.attrs.get(LINKED_ATTR) or {}
    finished = parse_time(str(manifest.get("finished"))) if manifest.get("finished") else None
    sets_row = {**common, "path": str(directory.resolve()), "status": sweep.status, "created": created,
                "finished": finished, "hosts": sweep.hosts,
                "zcorch_version": manifest.get("zcorch_version"), "n_ok": sweep.n_ok, "n_failed": sweep.n_failed,
                "planned": comp.planned, "planned_ok": comp.ok, "cells_planned": sorted(comp.cells_planned),
                "cells_short": list(comp.cells_short), "linked_axes": json.dumps(linked),
                "manifest": json.dumps(manifest), "sha256": sha}
    sets_table = pa.Table.from_pylist([sets_row], schema=layout.SET_SCHEMA)
    runs = set_runs.drop(columns=["sweep"])
    runs.attrs = {}
    runs_table, json_runs = runs_table_of(runs, common, linked)
    base = load_baselines(directory)
    brecs = store.read_jsonl(str(directory / store.BASELINES)) if (directory / store.BASELINES).exists() else []
    baselines = pd.DataFrame([{**common, "kind": r.get("kind"), "status": r.get("status"), "reason": r.get("reason"),
                               "host": r.get("host"), "started": r.get("started"), "gbit_s": g, "mb_s": m,
                               "key": json.dumps(r.get("key")), "result": json.dumps(r.get("result"))}
                              for r, g, m in zip(brecs, base["gbit_s"], base["mb_s"])],
                             columns=list(common) + list(BASELINE_COLUMNS))
    roles = [("controller", meta.get("controller"))] + list((meta.get("hosts") or {}).items())
    hosts = [{**common, "role": role, **{c: _scalar(fact(facts, p)) for c, p in HOST_FACTS.items()},
              "facts": json.dumps(facts)} for role, facts in roles if isinstance(facts, dict)]
    hosts_frame = pd.DataFrame(hosts, columns=list(common) + list(HOST_COLUMNS))
    tables = {"sets": sets_table, "runs": runs_table,
              "baselines": pa.Table.from_pandas(baselines, preserve_index=False, schema=declared_schema("baselines")),
              "hosts": pa.Table.from_pandas(hosts_frame, preserve_index=False, schema=declared_schema("hosts"))}
    part = {"experiment": sweep.name, "date": created.strftime("%Y-%m-%d") if created else None}
    return part, tables, {"runs": json_runs}


def runs_table_of(runs: pd.DataFrame, common: dict, linked: "dict | Iterable[str]" = ()) -> "tuple[pa.Table, List[str]]":
    """(the runs of one set (`common`: the values of dataset.COMMON) as an Arrow table of the declared runs schema,
    the columns it holds as JSON text): declared columns at their types, linked axes as text, others JSON text;
    ResultsError naming the column when a value does not read as its declared type."""
    n = len(runs)
    cols: Dict[str, pa.Array] = {c: pa.array([common.get(c)] * n, pa.string()) for c in layout.COMMON}
    json_cols = []
    for name in runs.columns:
        if name in layout.COMMON or name in layout.PARTITIONS:
            continue
        want = layout.RUN_TYPES.get(name)
        if want is None and name not in linked:
            cols[name] = pa.array([None if _missing(v) else json.dumps(v, default=_json_default) for v in runs[name]],
                                  pa.string())
            json_cols.append(name)
        else:
            cols[name] = _typed(name, runs[name], want or pa.string())
    schema = layout.runs_schema(c for c in cols if c not in layout.RUN_TYPES)
    arrays = [cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema), json_cols


def _json_default(v):
    """JSON of what json.dumps does not know: a numpy scalar as its value, anything else (a timestamp) as its text."""
    return v.item() if isinstance(v, np.generic) else str(v)


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and v != v) or v is pd.NaT


def _typed(name: str, values: pd.Series, want: pa.DataType) -> pa.Array:
    """A frame column as an Arrow array of type `want` (NaN and None null); text from a number or flag: its JSON text;
    a number from a whole float: cast, never rounded."""
    try:
        arr = pa.Array.from_pandas(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):   # an object column of mixed kinds
        arr = None
    try:
        if pa.types.is_string(want) and (arr is None or not (pa.types.is_string(arr.type) or pa.types.is_large_string(
                arr.type) or pa.types.is_null(arr.type))):
            return pa.array([None if _missing(v) else v if isinstance(v, str) else json.dumps(v, default=_json_default)
                             for v in values], pa.string())
        if arr is None:
            raise pa.ArrowInvalid("values of mixed kinds")
        if pa.types.is_timestamp(want) and pa.types.is_timestamp(arr.type):
            return pa.compute.cast(arr, want, safe=False)   # ns to us: the record holds microseconds
        return arr.cast(want)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise ResultsError(f"runs column {name!r} does not read as {want} (its declared type): {exc}") from None


def _scalar(v):
    return json.dumps(v) if isinstance(v, (dict, list)) else (None if v is None else str(v))


BASELINE_COLUMNS = ("kind", "status", "reason", "host", "started", "gbit_s", "mb_s", "key", "result")
HOST_COLUMNS = ("role", *HOST_FACTS, "facts")


def declared_schema(table: str, extra: "Iterable[str]" = ()) -> pa.Schema:
    """The declared schema of `table` (runs: with the undeclared `extra` columns), that of each of its part files."""
    if table == "sets":
        return layout.SET_SCHEMA
    if table == "runs":
        return layout.runs_schema(extra)
    cols, types = ((BASELINE_COLUMNS, layout.BASELINE_TYPES) if table == "baselines" else
                   (HOST_COLUMNS, layout.HOST_TYPES))
    return pa.schema([(c, types.get(c, pa.string())) for c in (*layout.COMMON, *cols)])


# Writing


def _conform(table: pa.Table, schema: pa.Schema, decode: "frozenset[str] | set" = frozenset()) -> pa.Table:
    """`table` with every column of `schema` (missing ones null) in its order and types; `decode`: columns of JSON
    text in an older file, declared now, decoded first."""
    cols = []
    for f in schema:
        if f.name not in table.column_names:
            cols.append(pa.nulls(len(table), f.type))
            continue
        col = table.column(f.name)
        if col.type == f.type:
            cols.append(col)
            continue
        values = col.to_pylist()
        if f.name in decode:
            values = [None if v is None else json.loads(v) for v in values]
        cols.append(_typed(f.name, pd.Series(values, dtype=object), f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def _target(table: str, old: Optional[pa.Schema], new: pa.Schema) -> pa.Schema:
    """The schema `table`'s files are to have: the declared one, with the undeclared columns of `old` and `new`."""
    if table == "runs":
        return declared_schema("runs", [c for sch in (old, new) if sch is not None for c in sch.names])
    base = declared_schema(table)
    return pa.schema(list(base) + [f for f in (old or []) if f.name not in base.names])


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


# Test-only (tests/test_export_concurrent.py): write half a part file, make DIR/stalled-PID, wait to be killed.
TEST_STALL_ENV = "ZCORCH_TEST_EXPORT_STALL"


def _stall_mid_write(f, data: bytes) -> None:
    where = os.environ.get(TEST_STALL_ENV)
    if not where:
        f.write(data)
        return
    f.write(data[:len(data) // 2])
    f.flush()
    os.fsync(f.fileno())
    Path(where, f"stalled-{os.getpid()}").touch()
    while True:
        time.sleep(60)


def _write_parquet(dest: Path, rel: str, table: pa.Table) -> None:
    setfiles.write_inside(dest, rel, _parquet_bytes(table), fsync=True)


def _stage_parquet(dest: Path, rel: str, table: pa.Table) -> setfiles.Staged:
    data = _parquet_bytes(table)
    return setfiles.stage_inside(dest, rel, lambda f: _stall_mid_write(f, data), fsync=True)


# How long an export waits for another one holding the dataset (for seconds), before ResultSetBusy.
LOCK_WAIT_S = 600.0


class _Lock:
    """DEST/.export.lock, flock()ed while an export changes the dataset: released however its holder ends (NFS: by
    the server's lock manager); a filesystem without locks is refused. The holder writes who it is into it."""

    def __init__(self, dest: Path, wait: float, say: Callable[[str], None]):
        self.fd = os.open(os.path.join(dest, layout.LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        deadline, pause, told = time.monotonic() + wait, 0.02, False
        try:
            while True:
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    holder = os.pread(self.fd, 200, 0).decode(errors="replace").strip() or "another zcorch export"
                    if time.monotonic() >= deadline:
                        raise ResultSetBusy(f"{dest}: {holder} has been writing this dataset for more than {wait:.0f} s:"
                                            " nothing exported (export again later)") from None
                    if not told:
                        say(f"waiting for {holder} to finish writing {dest}")
                        told = True
                    time.sleep(pause)
                    pause = min(pause * 2, 0.5)
                except OSError as exc:   # ENOLCK, EINVAL, ENOSYS: no locks on this filesystem (or none left)
                    raise ResultsError(f"{dest}: cannot lock {layout.LOCK} ({exc.strerror}): concurrent exports "
                                       "could not be kept apart (on NFS, run the lock manager; on Lustre, mount "
                                       "with -o flock): nothing exported") from None
            me = f"zcorch export pid {os.getpid()} on {socket.gethostname()} since {_dt.datetime.now(_dt.timezone.utc):%H:%M:%S} UTC"
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, me.encode() + b"\n", 0)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        os.close(self.fd)


def _check_dest(dest: Path) -> Path:
    """DEST checked and made when missing (one with a lock may be another export's: checked again under it)."""
    problem = dest_problem(dest)
    lock = dest / layout.LOCK
    if problem and not (dest.is_dir() and not dest.is_symlink() and lock.is_file() and not lock.is_symlink()):
        raise ResultsError(problem)
    dest.mkdir(parents=True, exist_ok=True)
    return dest


def set_identity(manifest: dict) -> str:
    """A result set's id in a dataset: a hash of what its manifest says at creation and never changes (a copy of
    the set elsewhere is the same set; a resumed set keeps it)."""
    birth = {k: manifest.get(k) for k in IDENTITY_KEYS}
    return hashlib.sha256(json.dumps(birth, sort_keys=True, default=str).encode()).hexdigest()[:16]


IDENTITY_KEYS = ("name", "created", "clock", "command", "inventory")


def _previous(doc: dict, sid: str, directory: Path) -> "tuple[Optional[str], dict]":
    """(the key, the entry) under which `doc` lists this set: its identity, or (an older dataset) the hash of its
    path; (None, {}) when not listed."""
    if sid in doc["sets"]:
        return sid, doc["sets"][sid]
    legacy = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:16]
    entry = doc["sets"].get(legacy)
    if entry and entry.get("path") == str(directory.resolve()):
        return legacy, entry
    return None, {}


def _read_doc(dest: Path) -> dict:
    return layout.read_manifest(dest) if (dest / layout.MANIFEST).exists() else layout.new_manifest()


def export_results(root: "str | os.PathLike", dest: "str | os.PathLike",
                   warn: Callable[[str], None] = lambda _: None, wait: float = LOCK_WAIT_S) -> ExportResult:
    """Export every result set under `root` into the dataset `dest`: read unlocked, written once each under the lock."""
    root, dest = Path(root), Path(os.path.abspath(dest))
    dirs = find_result_sets(root, warn)
    dest = _check_dest(dest)
    result = ExportResult(dest)
    # the costly part, unlocked: each set's tables, unless dataset.json lists it with this content
    seen = _read_doc(dest)
    read: list = []       # (directory, set id, content hash, partition values, tables, json columns)
    for d in dirs:
        try:
            manifest = store.load_manifest(str(d))
            if manifest.get("status") == "running":
                result.skipped.append(f"{d}: still running (exported by a later export)")
                continue
            if not NAME_RE.match(str(manifest.get("name") or "")):
                result.skipped.append(f"{d}: experiment name {manifest.get('name')!r} cannot name a partition")
                continue
            sid, sha = set_identity(manifest), content_hash(d)
            key, entry = _previous(seen, sid, d)
            if entry.get("sha256") == sha:
                _unchanged(result, d, sid, entry)
                continue
            part, tables, js = _tables_of(d, sid, sha)
        except (ResultsError, OSError) as exc:
            result.skipped.append(f"{d}: {exc}")
            continue
        if part["date"] is None:
            result.skipped.append(f"{d}: no valid `created` time in its manifest")
            continue
        if any(r[1] == sid for r in read):
            result.notes.append(f"{d}: the same result set as {next(r[0] for r in read if r[1] == sid)} "
                                f"(set {sid}): exported once")
            continue
        read.append((d, sid, sha, part, tables, js))
    lock = _Lock(dest, wait, warn)
    try:
        problem = dest_problem(dest)
        if problem:
            raise ResultsError(problem)
        doc = _read_doc(dest)
        _remove_orphans(dest, doc)
        _upgrade(dest, doc, result)
        _write_sets(dest, doc, read, result)
    finally:
        lock.close()
    return result


def _unchanged(result: ExportResult, d: Path, sid: str, entry: dict) -> None:
    result.unchanged += 1
    if entry.get("path") != str(d.resolve()):
        result.notes.append(f"{d}: already in the dataset as set {sid} (exported from {entry.get('path')}, same "
                            "content): not written again")


def _write_sets(dest: Path, doc: dict, read: list, result: ExportResult) -> None:
    """Under the lock: the sets read that dataset.json does not list with their content (now), written."""
    batch: Dict[str, list] = {}      # partition -> [(set_id, tables)]
    json_columns = {t: set(doc["json_columns"].get(t, [])) for t in layout.TABLES}
    new_entries, replaced = {}, []
    for d, sid, sha, part, tables, js in read:
        key, entry = _previous(doc, sid, d)
        if entry.get("sha256") == sha:   # written by another export since this one read dataset.json
            _unchanged(result, d, sid, entry)
            if entry.get("path") == str(d.resolve()):
                result.notes.append(f"{d}: exported meanwhile by another export (set {sid}): not written again")
            continue
        if key is not None:
            replaced.append(key)
        for t, cols in js.items():
            json_columns[t] |= set(cols)
        partition = f"experiment={part['experiment']}/date={part['date']}"
        batch.setdefault(partition, []).append((sid, tables))
        new_entries[sid] = {"path": str(d.resolve()), "sha256": sha, "partition": partition,
                            "exported": _dt.datetime.now(_dt.timezone.utc).isoformat()}
        result.exported.append(str(d))
    if not new_entries:
        return
    if replaced:
        # the changed sets' old rows and entries go first: a crash leaves them out, never listed twice or rowless
        _drop_sets(dest, doc, replaced)
        layout.write_manifest(dest, doc)
    part_name = f"part-{_dt.datetime.now(_dt.timezone.utc).strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}.parquet"
    # without pandas' schema metadata, which would differ between files of one table
    merged = {t: pa.concat_tables([tables[t].replace_schema_metadata(None) for items in batch.values()
                                   for _, tables in items],
                                  promote_options="permissive") for t in layout.TABLES}
    staged: List[setfiles.Staged] = []
    try:
        # sets last: a set in `sets` has its rows in every other table
        for t in PUBLISH_ORDER:
            old = _table_schema(dest, doc, t)
            schema = _target(t, old, merged[t].schema)
            if old is not None and not schema.equals(old):   # a new undeclared column: the older files get it
                _rewrite_table(dest, doc, t, schema)
            for partition, items in batch.items():
                ids = pa.array([sid for sid, _ in items])
                rows = merged[t].filter(pa.compute.is_in(merged[t].column("set_id"), value_set=ids))
                staged.append(_stage_parquet(dest, f"{t}/{partition}/{part_name}", _conform(rows, schema)))
    except BaseException:
        for s in staged:
            s.discard()
        raise
    for s in staged:
        s.publish()
    for sid, entry in new_entries.items():
        doc["sets"][sid] = dict(entry, part=part_name)
    doc.update(json_columns={t: sorted(c) for t, c in json_columns.items() if c}, schema_version=layout.SCHEMA_VERSION,
               updated=_dt.datetime.now(_dt.timezone.utc).isoformat(), zcorch_version=__version__)
    layout.write_manifest(dest, doc)


PUBLISH_ORDER = ("runs", "baselines", "hosts", "sets")


def _files(doc: dict, table: str) -> List[str]:
    return sorted({f"{table}/{e['partition']}/{e['part']}" for e in doc["sets"].values()})


def _reading(dest: Path, rel: str, read: Callable):
    """`read` of the file DEST/rel, opened inside it (no link followed)."""
    fd = setfiles.open_inside(dest, rel)
    try:
        return read(setfiles.fd_path(fd))
    finally:
        os.close(fd)


def _table_schema(dest: Path, doc: dict, table: str) -> Optional[pa.Schema]:
    files = _files(doc, table)
    return _reading(dest, files[0], pq.read_schema).remove_metadata() if files else None


def _read(dest: Path, rel: str) -> pa.Table:
    return _reading(dest, rel, lambda path: pq.read_table(path, partitioning=None))


def _rewrite_table(dest: Path, doc: dict, table: str, schema: pa.Schema, decode: "frozenset[str] | set" = frozenset()
                   ) -> None:
    """Every file of `table` again, with the widened `schema` (`decode`: _conform's)."""
    for rel in _files(doc, table):
        _write_parquet(dest, rel, _conform(_read(dest, rel), schema, decode))


def _upgrade(dest: Path, doc: dict, result: ExportResult) -> None:
    """Under the lock: a dataset of an older schema version widened to this one (every file rewritten to the declared
    schema, JSON text of columns declared now decoded), and said; one of a newer version refused."""
    version = doc.get("schema_version", 1)
    if not isinstance(version, int) or version > layout.SCHEMA_VERSION:
        raise ResultsError(f"{dest / layout.MANIFEST}: dataset schema version {version!r}, written by a newer zcorch; "
                           f"this one writes version {layout.SCHEMA_VERSION}: export with that zcorch (or newer), or "
                           "into a new directory: nothing exported")
    if version == layout.SCHEMA_VERSION:
        return
    if doc["sets"]:
        json_runs = set(doc["json_columns"].get("runs", []))
        declared = set(layout.RUN_TYPES)
        for t in PUBLISH_ORDER:
            old = _table_schema(dest, doc, t)
            target = _target(t, old, declared_schema(t))
            if old is not None and not target.equals(old):
                _rewrite_table(dest, doc, t, target, json_runs & declared if t == "runs" else frozenset())
            if t == "runs" and old is not None:   # an undeclared column of numbers or flags: JSON text now
                json_runs |= {f.name for f in old if f.name not in layout.RUN_SCHEMA.names and not (
                    pa.types.is_string(f.type) or pa.types.is_large_string(f.type) or pa.types.is_null(f.type))}
        doc["json_columns"]["runs"] = sorted(json_runs - declared)
        if not doc["json_columns"]["runs"]:
            del doc["json_columns"]["runs"]
        result.notes.append(f"{dest}: dataset widened from schema version {version} to {layout.SCHEMA_VERSION} "
                            f"(the declared columns of this zcorch's parameter and metric tables, at their types)")
    doc["schema_version"] = layout.SCHEMA_VERSION
    layout.write_manifest(dest, doc)


def _drop_sets(dest: Path, doc: dict, set_ids: List[str]) -> None:
    """Remove the rows of `set_ids` (sets exported again because they changed) from their files."""
    if not set_ids:
        return
    gone = pa.array(set_ids)
    files = {f"{t}/{doc['sets'][s]['partition']}/{doc['sets'][s]['part']}" for s in set_ids for t in layout.TABLES}
    for rel in sorted(files):
        try:
            table = _read(dest, rel)
        except FileNotFoundError:
            continue
        keep = table.filter(pa.compute.invert(pa.compute.is_in(table.column("set_id"), value_set=gone)))
        _write_parquet(dest, rel, keep)   # an empty file keeps the schema; the set's entry is replaced below
    for s in set_ids:
        del doc["sets"][s]


def _remove_orphans(dest: Path, doc: dict) -> None:
    """Remove the part files dataset.json does not list and stale temporaries (under the lock: nobody's work)."""
    listed = {f for t in layout.TABLES for f in _files(doc, t)}
    for name in os.listdir(dest):
        if MANIFEST_TMP.fullmatch(name) and os.path.isfile(dest / name) and not os.path.islink(dest / name):
            os.unlink(dest / name)
    for t in layout.TABLES:
        top = dest / t
        if not top.is_dir() or top.is_symlink():
            continue
        for dirpath, dirnames, filenames in os.walk(top):   # os.walk follows no directory link
            for name in filenames:
                rel = os.path.relpath(os.path.join(dirpath, name), dest)
                if rel not in listed and (name.endswith(".parquet") or name.endswith(".tmp")):
                    os.unlink(os.path.join(dirpath, name))
        