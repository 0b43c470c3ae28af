"""An exported result dataset (zcorch.analysis.export writes it), read through DuckDB.

`zcorch history DATASET` and `zcorch compare --dataset DATASET BASE CAND` read here instead of loading
every result set: the sets table gives the sweeps (history.Sweep, as a result set's directory gives them), and
`Dataset` is the reader history asks for the runs (history.SetRuns is the other one): the same ok_table query,
the same history.SeriesCells and decisions. So the answers and exit codes are those of the result-set directories.

Only the part files dataset.json lists are read (a crashed export's leftovers are not), each a regular file
inside the dataset (no link followed to another file).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from zcorch import metrics
from zcorch.analysis.export_dest import LOCK, MANIFEST, PARTITIONS, TABLES  # noqa: F401 (the layout, declared there)
from zcorch.analysis.frames import LINKED_ATTR, PARAM_KEYS
from zcorch.params import METRICS as WORKER_METRICS, PARAMS
from zcorch.analysis.gate import HISTORY_ALPHA, HISTORY_MIN_NIGHTS, HISTORY_THRESHOLD_PCT, Completeness
from zcorch.analysis.steps import load_compiled
from zcorch.analysis.history import (BY, HEAD_KEYS, History, OkGroups, Sweep, arrow_of, check_metric, history_of,
                                     ok_table)
from zcorch.errors import ResultsError
from zcorch.results import setfiles
from zcorch.results.convergence import policy_from_record

FORMAT = "zcorch-dataset"
FORMAT_VERSION = 1
COMMON = ("set_id", "pair", "kernel", "revision")   # columns of every table, first


_TS = pa.timestamp("us", tz="UTC")
# A list of text as Parquet stores it and reads it back (its item named `element`, the format's own name): a
# schema read from a part file then equals the declared one.
_TEXTS = pa.list_(pa.field("element", pa.string()))
SET_SCHEMA = pa.schema([(c, pa.string()) for c in COMMON] + [
    ("path", pa.string()), ("status", pa.string()), ("created", _TS), ("finished", _TS), ("hosts", pa.string()),
    ("zcorch_version", pa.string()), ("n_ok", pa.int64()), ("n_failed", pa.int64()), ("planned", pa.int64()),
    ("planned_ok", pa.int64()), ("cells_planned", _TEXTS), ("cells_short", _TEXTS),
    ("linked_axes", pa.string()), ("manifest", pa.string()), ("sha256", pa.string())])
BASELINE_TYPES = {"gbit_s": pa.float64(), "mb_s": pa.float64()}   # every other column of baselines: text
HOST_TYPES: "dict[str, pa.DataType]" = {}                         # hosts: text (values as meta.json has them)

# The runs table: one declared schema, whatever the sets exported held (a column every run of a set left null
# read as double in one set and as text in another: files that no engine reads as one dataset). Every column
# of the parameter table (zcorch.params PARAMS, typed by its kind), of the worker's metric table (per side),
# of the analysis metric table (zcorch.metrics) and of the run record (zcorch.sweep.runner) is in every part
# file, at its type here, null where a set has none; a column none of them declares (a parameter of a newer
# zcorch, a run fact of an older one) is JSON text (`json_columns`), never a type guessed from its values.
_KIND_TYPES = {"size": pa.int64(), "int": pa.int64(), "cpu": pa.int64(), "bool": pa.bool_(), "duration": pa.float64(),
               "choice": pa.string(), "path": pa.string(), "name": pa.string(), "cpus": pa.string()}
RUN_PARAM_TYPES: "dict[str, pa.DataType]" = {p.key: _KIND_TYPES[p.kind] for p in PARAMS}
JSON = pa.string()   # a nested value (a dict, a list): JSON text, as zcorch.load has it (frames._scalar)
# The run record's own keys (zcorch.sweep.runner; frames.RUN_COLUMNS, RUN_TAIL_COLUMNS), and what frames.add_derived
# adds besides the analysis metrics.
_RUN_HEAD = {"cell": pa.string(), "repeat": pa.int64(), "status": pa.string(), "reason": pa.string()}
_RUN_FACTS = {"started": pa.timestamp("us", tz="UTC"), "wall_s": pa.float64(), "log": pa.string(),
              "sender_host": pa.string(), "receiver_host": pa.string(), "overhead_s": pa.float64(),
              "network": JSON, "samples": pa.string(), "samples_note": pa.string()}
_DERIVED_FACTS = {"same_host": pa.bool_(), "host_shared": pa.bool_(), "cpu_resolution": pa.string(),
                  "zc_verdict": pa.string()}


def _nested(m) -> bool:
    """A worker metric that is no number, id nor flag: a table (host_per_cpu_us: a list per CPU)."""
    return m.extent is None and m.unit not in ("id", "0/1")


def _worker_metric_type(m) -> pa.DataType:
    """A worker metric's column type: its C field's (a count, bytes, nanoseconds: int64; a double: float64); a
    host-wide one (no C field) by its unit: a share float64, an id text, a per-CPU table JSON text."""
    if _nested(m) or m.unit == "id":
        return pa.string()
    if m.unit == "share" or m.ctype in ("double", "float"):
        return pa.float64()
    return pa.int64()


def _run_types() -> "dict[str, pa.DataType]":
    out = dict(_RUN_HEAD)
    out.update(RUN_PARAM_TYPES)
    out.update(_RUN_FACTS)
    for side in ("send", "recv"):   # both sides: each worker's result has every field of zc_metrics
        out.update({f"{side}_{m.name}": _worker_metric_type(m) for m in WORKER_METRICS})
    out.update({m.name: pa.float64() for m in metrics.DERIVED})
    out.update(_DERIVED_FACTS)
    return out


RUN_TYPES: "dict[str, pa.DataType]" = _run_types()
RUN_SCHEMA = pa.schema([(c, pa.string()) for c in COMMON] + list(RUN_TYPES.items()))

# The version of the declared schemas. A dataset records the one it was written with (dataset.json
# `schema_version`; absent: 1, each column typed by the first set that held it). When the tables above grow (a
# parameter, a metric), the version goes up and SCHEMA_DIGESTS gets the new schema's digest
# (tests/test_dataset.py checks the two agree): the next export widens a dataset of an older version (its files
# rewritten to the new schema, the new columns null) and says so; a dataset of a newer version is refused.
SCHEMA_VERSION = 2
SCHEMA_DIGESTS = {2: "eafdb30b41b1001f"}


def schema_digest() -> str:
    """SHA-256 (16 hex digits) of the declared schemas: the names and types of every declared column."""
    text = json.dumps({"sets": [(f.name, str(f.type)) for f in SET_SCHEMA],
                       "runs": [(f.name, str(f.type)) for f in RUN_SCHEMA],
                       "baselines": sorted((k, str(v)) for k, v in BASELINE_TYPES.items()),
                       "hosts": sorted((k, str(v)) for k, v in HOST_TYPES.items())})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def runs_schema(extra: "Iterable[str]" = ()) -> pa.Schema:
    """The runs table's schema: the declared columns, then the `extra` columns (undeclared: JSON text, listed in
    dataset.json `json_columns`) by name."""
    return pa.schema(list(RUN_SCHEMA) + [(c, pa.string()) for c in sorted(set(extra) - set(RUN_SCHEMA.names))])




# ---------------------------------------------------------------------------------------------
# dataset.json


def new_manifest() -> dict:
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "schema_version": SCHEMA_VERSION,
            "tables": list(TABLES), "partitioning": list(PARTITIONS), "json_columns": {}, "sets": {}}


def is_dataset(path: "str | os.PathLike") -> bool:
    return setfiles.is_regular_inside(path, MANIFEST) if os.path.isdir(path) else False


def read_manifest(path: "str | os.PathLike") -> dict:
    where = os.path.join(os.fspath(path), MANIFEST)
    try:
        doc = setfiles.read_json(path, MANIFEST)
    except FileNotFoundError:
        raise ResultsError(f"{path}: not a zcorch dataset (no {MANIFEST})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ResultsError(f"{where}: not a zcorch dataset manifest (format {FORMAT!r})")
    if doc.get("format_version") != FORMAT_VERSION:
        raise ResultsError(f"{where}: dataset format version {doc.get('format_version')!r}; this zcorch reads "
                           f"version {FORMAT_VERSION} (export again into a new directory)")
    if not isinstance(doc.get("sets"), dict):
        raise ResultsError(f"{where}: `sets` is not an object")
    doc.setdefault("json_columns", {})
    return doc


def write_manifest(dest: "str | os.PathLike", doc: dict) -> None:
    setfiles.write_inside(dest, MANIFEST, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode(), fsync=True)


# ---------------------------------------------------------------------------------------------
# Reading


# Rows of the hosts and baselines tables a set may have in a part (a set has two roles, a few baselines).
MAX_HOST_ROWS = 64
MAX_BASELINE_ROWS = 100_000
# Uncompressed bytes a part may hold per row it may have (a row of runs is about a kilobyte), plus a slack.
MAX_PART_BYTES_PER_ROW = 64 * 1024
PART_BYTES_SLACK = 64 * 1024 ** 2


def check_part(path: str, max_rows: int) -> "pq.FileMetaData":
    """Refuse (ResultsError naming the file) a part file whose footer claims more rows than `max_rows` (what
    dataset.json and the sets' plans say it holds) or more uncompressed bytes than such rows take: read from
    its metadata alone, before any of its data. Returns that metadata."""
    try:
        md = pq.ParquetFile(path).metadata
    except (OSError, pa.ArrowException) as exc:
        raise ResultsError(f"{path}: not a readable Parquet file ({exc}): not read") from None
    if md.num_rows > max_rows:
        raise ResultsError(f"{path}: {md.num_rows} rows, more than the {max_rows} that the sets {MANIFEST} lists "
                           "in it can hold (their plans): not read")
    data_bytes = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    bound = max_rows * MAX_PART_BYTES_PER_ROW + PART_BYTES_SLACK
    if data_bytes > bound:
        raise ResultsError(f"{path}: {data_bytes} bytes of data uncompressed, more than the {bound} its "
                           f"{max_rows} rows may take: not read")
    return md


def _parquet_source(files: Sequence[str], footers: "Sequence[pq.FileMetaData]") -> str:
    """read_parquet over `files` (hive partitions as columns), their columns matched by name only where their
    schemas differ (an older export): matching by name binds every file's schema again at each query."""
    listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
    same = all(md.schema.equals(footers[0].schema) for md in footers[1:])
    return f"read_parquet([{listed}], hive_partitioning = true, union_by_name = {str(not same).lower()})"


class Dataset:
    """An exported dataset opened for reading: one in-memory DuckDB connection with a view per table over
    the part files dataset.json lists (hive partitions `experiment`, `date` as columns); `tables`: the views
    made (default every table; each costs a check of its files and a read of their footers: a year of a
    fleet's is 365 a table)."""

    def __init__(self, path: "str | os.PathLike", tables: Sequence[str] = TABLES):
        import duckdb

        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.con = duckdb.connect(":memory:")
        self.con.execute("SET enable_progress_bar = false")
        # Every query of a view binds read_parquet over every listed part (a year: 365 a table), and each bind
        # read each part's footer again: cached, the footers are read once per connection.
        self.con.execute("SET parquet_metadata_cache = true")
        self._columns: Dict[str, List[str]] = {}
        unknown = sorted(set(tables) - set(TABLES))
        if unknown:
            raise ValueError(f"no table {unknown[0]!r} in a dataset (tables: {', '.join(TABLES)})")
        # the most rows a part may have: one a set dataset.json lists in it (sets), MAX_HOST_ROWS and
        # MAX_BASELINE_ROWS a set (hosts, baselines); runs: what the plans of its sets can hold (_runs_bound)
        per_set = {"sets": 1, "hosts": MAX_HOST_ROWS, "baselines": MAX_BASELINE_ROWS}
        self._footers: Dict[str, list] = {}
        self._sets_of: Dict[str, List[str]] = {}   # part file ("partition/part") -> the set ids listed in it
        for sid, e in self.manifest["sets"].items():
            self._sets_of.setdefault(f"{e['partition']}/{e['part']}", []).append(sid)
        for table in sorted(tables, key=lambda t: t != "sets"):   # the sets first: the runs' bounds read them
            bound = self._runs_bound() if table == "runs" else lambda sids, n=per_set[table]: n * len(sids)
            files = self.files(table)
            footers = self._footers[table] = [check_part(f, bound(self._sets_in(f))) for f in files]
            if files:
                self.con.execute(f"CREATE VIEW {table} AS SELECT * FROM {_parquet_source(files, footers)}")

    def _sets_in(self, part: str) -> List[str]:
        """The set ids dataset.json lists in the part file at the absolute path `part`."""
        return self._sets_of.get("/".join(Path(part).relative_to(self.path.resolve()).parts[1:]), [])

    def _runs_bound(self):
        """A function of a runs part's set ids -> the most runs their plans can hold (`planned` x
        setfiles.RETRY_FACTOR + RETRY_SLACK each, read from the sets table once its parts are checked; a set of
        an older export, without the column: setfiles.MAX_RECORDS)."""
        files = self.files("sets")
        footers = self._footers.get("sets") or [check_part(f, len(self._sets_in(f))) for f in files]
        have = [(f, md) for f, md in zip(files, footers) if "planned" in md.schema.names]
        rows = self.con.execute(f"SELECT set_id, planned FROM {_parquet_source(*zip(*have))}").fetchall() if have else []
        planned = {sid: int(n) if isinstance(n, (int, float)) and n == n and n >= 0 else 0 for sid, n in rows}
        return lambda sids: sum(min(setfiles.MAX_RECORDS, planned.get(sid, setfiles.MAX_RECORDS) * setfiles.RETRY_FACTOR
                                    + setfiles.RETRY_SLACK) for sid in sids)

    def files(self, table: str) -> List[str]:
        """The absolute paths of `table`'s part files: each a regular file inside the dataset."""
        rels = sorted({f"{table}/{e['partition']}/{e['part']}" for e in self.manifest["sets"].values()})
        out = []
        for rel in rels:
            if not setfiles.is_regular_inside(self.path, rel):
                raise ResultsError(f"{self.path / rel}: listed in {MANIFEST} but not a regular file inside the "
                                   "dataset: not read")
            out.append(str(self.path.resolve() / rel))
        return out

    def columns(self, table: str) -> List[str]:
        """The columns of `table` (asked once: DESCRIBE of a view over a year of part files reads their schemas)."""
        if not self.manifest["sets"]:
            return []
        if table not in self._columns:
            self._columns[table] = [r[0] for r in self.con.execute(f"DESCRIBE {table}").fetchall()]
        return list(self._columns[table])

    def query(self, sql: str, params: Sequence = ()):
        return self.con.execute(sql, list(params))

    def frame(self, sql: str, params: Sequence = ()) -> pd.DataFrame:
        """The answer as a pandas frame, through Arrow (as zcorch.load reads runs.parquet)."""
        return self._arrow(sql, params).to_pandas()

    def _arrow(self, sql: str, params: Sequence = ()) -> pa.Table:
        return arrow_of(self.con.execute(sql, list(params)))

    # --- sets -------------------------------------------------------------------------------

    def sweeps(self) -> List[Sweep]:
        """Every set, ordered by path (as set_ids)."""
        if not self.manifest["sets"]:
            return []
        rows = self.query("SELECT set_id, path, manifest, hosts, kernel, revision, n_ok, n_failed, status, "
                          "planned, planned_ok, cells_planned, cells_short, linked_axes FROM sets "
                          "ORDER BY path, set_id").fetchall()
        return [sweep_of_row(r) for r in rows]

    def set_ids(self) -> List[str]:
        """Every set's id as dataset.json lists it (no query: the sets table is read once, by sweeps()),
        ordered as sweeps() orders them when the two agree."""
        sets = self.manifest["sets"]
        return sorted(sets, key=lambda sid: (str(sets[sid].get("path", "")), sid))

    def find(self, ref: str) -> Sweep:
        """The set `ref` names: its set id (or a unique prefix of it), or the path it had when exported."""
        sweeps = self.sweeps()
        path = os.path.abspath(ref)
        hits = [s for s in sweeps if s.set_id == ref or str(s.path) == path or
                (os.path.exists(path) and str(s.path) == os.path.realpath(path))]
        if not hits and len(ref) >= 4:
            hits = [s for s in sweeps if s.set_id.startswith(ref)]
        if len(hits) != 1:
            what = "no" if not hits else f"{len(hits)}"
            raise ResultsError(f"{self.path}: {what} exported result set(s) named {ref!r} (give a set id, or the "
                               "path the set had when it was exported)")
        return hits[0]

    def host_meta(self, set_id: str) -> dict:
        """meta.json's {"hosts": {role: facts}} of one exported set, from the hosts table's `facts` (each role's
        entry as exported; zcorch.analysis.hostdiff compares two). {} without a hosts table or rows."""
        if not self.files("hosts"):
            return {}
        rows = self.query("SELECT role, facts FROM hosts WHERE set_id = ? AND role <> 'controller'",
                          [set_id]).fetchall()
        return {"hosts": {role: json.loads(facts) for role, facts in rows if facts}} if rows else {}

    # --- runs -------------------------------------------------------------------------------

    def runs(self, set_id: str):
        """The runs of one set as zcorch.load returns them (minus `sweep`; linked axes in attrs)."""
        drop = set(COMMON) | set(PARTITIONS)
        frame = self.frame("SELECT * FROM runs WHERE set_id = ?", [set_id])
        frame = frame[[c for c in frame.columns if c not in drop]]
        for name in self.manifest["json_columns"].get("runs", []):
            if name in frame:
                frame[name] = [None if v is None else json.loads(v) for v in frame[name]]
        linked = self.query("SELECT linked_axes FROM sets WHERE set_id = ?", [set_id]).fetchone()
        frame.attrs[LINKED_ATTR] = json.loads(linked[0]) if linked and linked[0] else {}
        return frame

    def ok_table(self, metric: str, set_ids: Sequence[str]) -> pa.Table:
        """history.ok_table of the dataset's runs: per (set, cell) n, n_failed and the sorted ok values."""
        if metric not in self.columns("runs"):
            raise ResultsError(f"{self.path}: no column {metric!r} in its runs")
        return ok_table(self.con, metric, set_ids)

    def cell_params(self, set_ids: Sequence[str], linked: Sequence[str], by: Sequence[str]) -> pd.DataFrame:
        """The distinct (key, cell, parameters) of the runs of `set_ids`, `by` a key per set id (its series) in
        column BY, in one query: what history.cell_labels needs."""
        have = set(self.columns("runs"))
        cols = ["cell"] + [c for c in list(PARAM_KEYS) + list(linked) if c in have]
        self.con.register("wanted_sets", pa.table({"set_id": pa.array(list(set_ids), type=pa.string()),
                                                   BY: pa.array(list(by), type=pa.string())}))
        try:
            sel = ", ".join([f'"{BY}"'] + ['"' + c.replace('"', '""') + '"' for c in cols])
            frame = self.frame(f"SELECT DISTINCT {sel} FROM runs JOIN wanted_sets USING (set_id)")
        finally:
            self.con.unregister("wanted_sets")
        for name in self.manifest["json_columns"].get("runs", []):
            if name in frame:
                frame[name] = [None if v is None else json.loads(v) for v in frame[name]]
        return frame


@functools.lru_cache(maxsize=256)
def _shared_set_of(cells: tuple) -> frozenset:
    return frozenset(cells)


def _shared_set(cells) -> frozenset:
    """The planned cells as one frozenset shared by every set that planned the same ones (a fleet's year:
    18,000 sets, a few plans)."""
    return _shared_set_of(tuple(cells or ()))


@functools.lru_cache(maxsize=256)
def _linked_of(text: str) -> dict:
    return json.loads(text)


def _linked(text: Optional[str]) -> dict:
    """A set's linked axes: parsed once per distinct text (a fleet's year: 18,000 sets, a few texts); the same
    dict for the same text, which nobody changes."""
    return _linked_of(text) if text else {}


def sweep_of_row(row) -> Sweep:
    """The Sweep of one row of the sets table (Dataset.sweeps' columns): its manifest kept as the exported text,
    parsed when asked for; no meta.json but the revision; no `host_shared` (the sets table has none)."""
    (set_id, path, manifest, hosts, kernel, revision, n_ok, n_failed, status, planned, planned_ok,
     cells_planned, cells_short, linked) = row
    parsed = json.loads(manifest)
    completeness = Completeness(path, str(status or "unknown"), int(planned), int(planned_ok),
                                _shared_set(cells_planned), tuple(cells_short or ()),
                                policy_from_record(parsed.get("repeats")))
    return Sweep(Path(path), manifest, {"controller": {"git_revision": revision}} if revision else {},
                 set_id=set_id, n_ok=int(n_ok), n_failed=int(n_failed), kernel=kernel or "", hosts=hosts or "",
                 linked=_linked(linked), head={k: parsed[k] for k in HEAD_KEYS if k in parsed},
                 completeness=completeness)


def dataset_history(path: "str | os.PathLike", metric: str = "gbit_s", threshold_pct: Optional[float] = None,
                    alpha: Optional[float] = None, min_nights: int = HISTORY_MIN_NIGHTS) -> History:
    """history.History of an exported dataset: the same series, steps and comparisons as `zcorch history`
    of the result sets it was exported from (no report is written: the sets need not be here)."""
    threshold_pct = HISTORY_THRESHOLD_PCT if threshold_pct is None else threshold_pct
    alpha = HISTORY_ALPHA if alpha is None else alpha
    check_metric(metric)
    # numba's cache of the fit loaded while DuckDB reads (steps.load_compiled), joined before the first fit
    compiled = threading.Thread(target=load_compiled, name="zcorch-load-fit", daemon=True)
    compiled.start()
    data = Dataset(path, tables=("sets", "runs"))   # what history reads
    set_ids = data.set_ids()
    if not set_ids:
        raise ResultsError(f"{path}: the dataset holds no result set")
    data.columns("runs")   # asked here, once: ok_table asks it on its thread
    # The runs' values are read and grouped (DuckDB and numpy: without the GIL most of the time) on a thread while
    # this one makes the sweeps of the sets' rows (Python): a fleet's year, about a second and a half each.
    with ThreadPoolExecutor(1, thread_name_prefix="zcorch-runs") as pool:
        reading = pool.submit(lambda: OkGroups(data.ok_table(metric, set_ids)))
        sweeps = data.sweeps()
        groups = reading.result()
    if sorted(s.set_id for s in sweeps) != sorted(set_ids):
        raise ResultsError(f"{path}: the sets its part files hold are not those {MANIFEST} lists (a part file "
                           "changed by something else than zcorch export?): not read")
    return history_of(Path(path), sweeps, data, groups, metric, threshold_pct, alpha, min_nights, [],
                      before_fits=compiled.join)
