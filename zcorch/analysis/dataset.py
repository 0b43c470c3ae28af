"""An exported result dataset (zcorch.analysis.export writes it), read through DuckDB.

`zcorch history DATASET` and `zcorch compare --dataset DATASET BASE CAND` read here instead of loading
every result set: the sets table gives the sweeps (what their manifests, metadata and plans said), one
query gives every (set, cell)'s ok values of the metric, sorted, and the decisions are zcorch.analysis's
own (history.experiment_histories through `DatasetSeries`, the same three methods as history.FrameSeries;
compare.compare_frames; gate). So the answers and exit codes are those of the result-set directories.

Only the part files dataset.json lists are read (a crashed export's leftovers are not), each a regular file
inside the dataset (no link followed to another file).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
import warnings as _warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from zcorch import metrics
from zcorch.analysis.compare import is_control
from zcorch.analysis.export_dest import LOCK, MANIFEST, PARTITIONS, TABLES  # noqa: F401 (the layout, declared there)
from zcorch.analysis.frames import LINKED_ATTR, PARAM_KEYS
from zcorch.params import METRICS as WORKER_METRICS, PARAMS
from zcorch.analysis.gate import HISTORY_ALPHA, HISTORY_MIN_NIGHTS, HISTORY_THRESHOLD_PCT, Completeness
from zcorch.analysis.steps import load_compiled
from zcorch.analysis.history import (HEAD_KEYS, History, Sweep, cell_labels, experiment_histories, series_clock_problems,
                                     series_of)
from zcorch.errors import ResultsError
from zcorch.results import setfiles
from zcorch.results.convergence import policy_from_record
from zcorch.results.intervals import CI, median_ci_level, median_ci_rank

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


def check_part(path: str, max_rows: int) -> None:
    """Refuse (ResultsError naming the file) a part file whose footer claims more rows than `max_rows` (what
    dataset.json and the sets' plans say it holds) or more uncompressed bytes than such rows take: read from
    its metadata alone, before any of its data."""
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
        # read each part's footer again: cached, the footers are read once per connection (a year of a
        # fleet's runs: 0.25 s less CPU a query, three queries a `zcorch history`).
        self.con.execute("SET parquet_metadata_cache = true")
        self._columns: Dict[str, List[str]] = {}
        unknown = sorted(set(tables) - set(TABLES))
        if unknown:
            raise ValueError(f"no table {unknown[0]!r} in a dataset (tables: {', '.join(TABLES)})")
        bounds = self._row_bounds(tables)
        for table in tables:
            files = self.files(table)
            for f in files:
                check_part(f, bounds[table](f))
            if files:
                listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
                self.con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet([{listed}], "
                                 "hive_partitioning = true, union_by_name = true)")

    def _sets_of_part(self) -> Dict[str, List[str]]:
        """{part file name: the set ids dataset.json lists in it}."""
        out: Dict[str, List[str]] = {}
        for sid, e in self.manifest["sets"].items():
            out.setdefault(f"{e['partition']}/{e['part']}", []).append(sid)
        return out

    def _row_bounds(self, tables: Sequence[str]):
        """{table: a function of a part file's path -> the most rows it may have}: the sets table one row per
        set dataset.json lists in the part; runs at most what the plans of those sets can hold (their
        `planned` runs x setfiles.RETRY_FACTOR + RETRY_SLACK, read from the sets table once its parts are
        checked); hosts and baselines at most MAX_HOST_ROWS and MAX_BASELINE_ROWS a set."""
        sets_of = self._sets_of_part()
        root = str(self.path.resolve())

        def part_of(path: str) -> str:
            return "/".join(Path(path).relative_to(root).parts[1:])

        def per_set(n: int):
            return lambda path: n * len(sets_of.get(part_of(path), ()))
        bounds = {"sets": per_set(1), "hosts": per_set(MAX_HOST_ROWS), "baselines": per_set(MAX_BASELINE_ROWS)}
        if "runs" in tables and self.manifest["sets"]:
            planned: Dict[str, int] = {}
            for f in self.files("sets"):
                check_part(f, bounds["sets"](f))
                if "planned" not in pq.read_schema(f).names:   # an older export: the general bound a set
                    continue
                t = pq.read_table(f, columns=["set_id", "planned"])
                for sid, n in zip(t.column("set_id").to_pylist(), t.column("planned").to_pylist()):
                    planned[sid] = int(n) if isinstance(n, (int, float)) and n == n and n >= 0 else 0

            def runs_bound(path: str) -> int:
                return sum(min(setfiles.MAX_RECORDS, planned.get(sid, setfiles.MAX_RECORDS) * setfiles.RETRY_FACTOR
                               + setfiles.RETRY_SLACK) for sid in sets_of.get(part_of(path), ()))
            bounds["runs"] = runs_bound
        return bounds

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

    def _arrow(self, sql: str, params: Sequence = (), con=None) -> pa.Table:
        res = (con or self.con).execute(sql, list(params))
        to_arrow = getattr(res, "to_arrow_table", None) or res.fetch_arrow_table   # duckdb 2 / 1.x
        with _warnings.catch_warnings():   # duckdb 2 notes the copy a DB-API result makes: these answers are small
            _warnings.simplefilter("ignore", UserWarning)
            return to_arrow()

    # --- sets -------------------------------------------------------------------------------

    def sweeps(self) -> "List[ExportedSweep]":
        """Every set, ordered by path (as set_ids)."""
        if not self.manifest["sets"]:
            return []
        rows = self.query("SELECT set_id, path, manifest, hosts, kernel, revision, n_ok, n_failed, status, "
                          "planned, planned_ok, cells_planned, cells_short, linked_axes FROM sets "
                          "ORDER BY path, set_id").fetchall()
        return [ExportedSweep.from_row(r) for r in rows]

    def set_ids(self) -> List[str]:
        """Every set's id as dataset.json lists it (no query: the sets table is read once, by sweeps()),
        ordered as sweeps() orders them when the two agree."""
        sets = self.manifest["sets"]
        return sorted(sets, key=lambda sid: (str(sets[sid].get("path", "")), sid))

    def find(self, ref: str) -> "ExportedSweep":
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

    def ok_values(self, metric: str, set_ids: Sequence[str]):
        """Per (set, cell) of `set_ids`: n (ok runs), n_failed (others), and the ok runs' values of `metric`
        (nulls left out), sorted: a pandas frame."""
        return self.ok_table(metric, set_ids).to_pandas()

    def ok_table(self, metric: str, set_ids: Sequence[str]) -> pa.Table:
        """ok_values as an Arrow table (its `vals` one list array: no Python object per group), ordered by the
        position of the set in `set_ids`, then by cell. On a cursor of its own: it may run on another thread while
        this one queries the sets (dataset_history).

        One DuckDB query groups and sorts (on its own threads, without the GIL): each set id joined to its
        position in `set_ids` (no text of 2 million set ids to hold), per (set, cell) the counts and the sorted
        list of the ok values. A year of a fleet: 0.7 s, against 1.0 s for reading the runs into numpy and
        grouping them there, which held the GIL for a third of it."""
        if metric not in self.columns("runs"):
            raise ResultsError(f"{self.path}: no column {metric!r} in its runs")
        wanted = pa.array(list(dict.fromkeys(set_ids)), type=pa.string())
        v = 'CAST(r."' + metric.replace('"', '""') + '" AS DOUBLE)'
        cur = self.con.cursor()
        try:
            cur.register("wanted_sets", pa.table({"set_id": wanted,
                                                  "position": pa.array(np.arange(len(wanted), dtype=np.int64))}))
            # ok: status 'ok' (a null status is not); the values: of the ok runs, nulls and NaN left out
            groups = self._arrow(
                f"SELECT w.position AS s, r.cell, count(*) FILTER (WHERE r.status = 'ok') AS n, count(*) AS runs, "
                f"list({v} ORDER BY {v}) FILTER (WHERE r.status = 'ok' AND {v} IS NOT NULL AND NOT isnan({v})) "
                f"AS vals FROM runs r JOIN wanted_sets w ON r.set_id = w.set_id GROUP BY w.position, r.cell "
                f"ORDER BY w.position, r.cell NULLS LAST", con=cur)
        finally:
            cur.close()
        n = groups.column("n").to_numpy(zero_copy_only=False).astype(np.int64)
        vals = groups.column("vals").combine_chunks()
        if vals.null_count:   # a group with no ok value: an empty list, not a null one
            vals = pa.ListArray.from_arrays(vals.offsets, vals.values, type=vals.type)
        return pa.table({"set_id": wanted.take(groups.column("s")),
                         "cell": groups.column("cell").cast(pa.string()),
                         "n": pa.array(n),
                         "n_failed": pa.array(groups.column("runs").to_numpy(zero_copy_only=False).astype(np.int64) - n),
                         "vals": vals})

    def cell_params(self, set_ids: Sequence[str], linked: Sequence[str], by: Optional[Sequence[str]] = None):
        """The distinct (cell, parameters) of the runs of `set_ids`: what history.cell_labels needs. With `by`
        (a key per set id, e.g. its series), the distinct (key, cell, parameters) in one query, the key in
        column BY."""
        have = set(self.columns("runs"))
        cols = ["cell"] + [c for c in list(PARAM_KEYS) + list(linked) if c in have]
        wanted = {"set_id": pa.array(list(set_ids), type=pa.string())}
        if by is not None:
            wanted[BY] = pa.array(list(by), type=pa.string())
        self.con.register("wanted_sets", pa.table(wanted))
        try:
            sel = ", ".join([f'"{BY}"'] * (by is not None) + ['"' + c.replace('"', '""') + '"' for c in cols])
            frame = self.frame(f"SELECT DISTINCT {sel} FROM runs JOIN wanted_sets USING (set_id)")
        finally:
            self.con.unregister("wanted_sets")
        for name in self.manifest["json_columns"].get("runs", []):
            if name in frame:
                frame[name] = [None if v is None else json.loads(v) for v in frame[name]]
        return frame


BY = "_series"   # the column of Dataset.cell_params' key


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


_NO_RUNS = pd.DataFrame({"cell": pd.Series(dtype=object), "status": pd.Series(dtype=object)})


@dataclass
class ExportedSweep(Sweep):
    """A sweep as the dataset recorded it: what history and the gate ask of a Sweep, without its files.

    Its manifest is kept as the exported text and parsed when asked for; what history reads of every sweep
    (Sweep.head) is kept parsed: a fleet's year of parsed manifests held 170 MB."""
    set_id: str = ""
    stored: Optional[dict] = None

    @classmethod
    def from_row(cls, row) -> "ExportedSweep":
        (set_id, path, manifest, hosts, kernel, revision, n_ok, n_failed, status, planned, planned_ok,
         cells_planned, cells_short, linked) = row
        parsed = json.loads(manifest)
        meta = {"controller": {"git_revision": revision}} if revision else {}
        runs = _NO_RUNS   # one shared empty frame: the runs are read through DatasetSeries, never from here
        completeness = Completeness(path, str(status or "unknown"), int(planned), int(planned_ok),
                                    _shared_set(cells_planned), tuple(cells_short or ()),
                                    policy_from_record(parsed.get("repeats")))
        return cls(Path(path), manifest, meta, runs, set_id=set_id,
                   stored={"hosts": hosts, "kernel": kernel or "", "n_ok": int(n_ok), "n_failed": int(n_failed),
                           "completeness": completeness, "linked": _linked(linked),
                           "head": {k: parsed[k] for k in HEAD_KEYS if k in parsed}})

    @property   # type: ignore[override]
    def manifest(self) -> dict:
        if self._manifest is None:
            self._manifest = json.loads(self._manifest_text)
        return self._manifest

    @manifest.setter
    def manifest(self, value: "dict | str") -> None:
        """The manifest, or its JSON text (parsed when first asked for)."""
        self._manifest, self._manifest_text = (None, value) if isinstance(value, str) else (value, None)

    @property
    def head(self) -> dict:
        return self.stored["head"]

    @property
    def n_ok(self) -> int:
        return self.stored["n_ok"]

    @property
    def n_failed(self) -> int:
        return self.stored["n_failed"]

    @property
    def kernel(self) -> str:
        return self.stored["kernel"]

    @property
    def hosts(self) -> str:
        return self.stored["hosts"] or ""

    def completeness(self) -> Completeness:
        return self.stored["completeness"]


class OkGroups:
    """The (set, cell) groups of Dataset.ok_table as numpy arrays (no Python object per group): for each group
    its set id, cell, n, n_failed and where its sorted ok values lie in one flat array; and the median and the
    interval of each, as zcorch.analysis.stats.summarize computes them from the runs (the median of the sorted
    values, numpy's: the middle one or the mean of the middle two; the interval of zcorch.results.intervals:
    the order statistics of rank k and m + 1 - k of m values, k per count)."""

    def __init__(self, table: pa.Table):
        vals = table.column("vals").combine_chunks()
        self.set_id = table.column("set_id").to_numpy(zero_copy_only=False).astype(object)
        self.cell = table.column("cell").to_numpy(zero_copy_only=False).astype(object)
        self.n = table.column("n").to_numpy().astype(np.int64)
        self.n_failed = table.column("n_failed").to_numpy().astype(np.int64)
        offsets = vals.offsets.to_numpy().astype(np.int64)
        self.flat = vals.values.to_numpy(zero_copy_only=False).astype("float64")
        self.start = offsets[:-1]
        self.m = np.diff(offsets)
        have = self.m > 0
        lo = np.where(have, self.start + (self.m - 1) // 2, 0)
        hi = np.where(have, self.start + self.m // 2, 0)
        flat = self.flat if len(self.flat) else np.full(1, np.nan)
        self.median = np.where(have, (flat[lo] + flat[hi]) / 2, np.nan)
        k = np.zeros(len(self.m), dtype=np.int64)
        self.ci_level = np.full(len(self.m), np.nan)
        for m in np.unique(self.m):
            rank = median_ci_rank(int(m), CI)
            at = self.m == m
            k[at] = rank
            self.ci_level[at] = median_ci_level(int(m), rank) if rank else np.nan
        with_ci = k > 0
        self.ci_low = np.where(with_ci, flat[np.where(with_ci, self.start + k - 1, 0)], np.nan)
        self.ci_high = np.where(with_ci, flat[np.where(with_ci, self.start + self.m - k, 0)], np.nan)

    def values(self, row: int) -> np.ndarray:
        return self.flat[self.start[row]:self.start[row] + self.m[row]]


class DatasetSeries:
    """history.FrameSeries over a dataset: labels, per-cell series and a cell's runs of one series of sweeps,
    from one DuckDB query of the ok values of every set (the decisions stay history's, stats', compare's)."""

    def __init__(self, data: Dataset, sweeps: list, metric: str, groups: OkGroups, rows: np.ndarray,
                 params: "pd.DataFrame | None" = None, label_memo: "Optional[dict]" = None):
        """`rows`: the groups of these sweeps; `params`: their distinct (cell, parameters) (default: queried);
        `label_memo`: labels already made of the same (cell, parameters) rows, shared by the series of one
        dataset (a fleet's pairs run the same cells: cell_labels once, not once per pair)."""
        self.data, self.sweeps, self.metric, self.groups, self.params = data, sweeps, metric, groups, params
        self.label_memo = label_memo if label_memo is not None else {}
        index = {s.set_id: i for i, s in enumerate(sweeps)}
        n_sweeps = len(sweeps)
        sweep_of = np.array([index[x] for x in groups.set_id[rows]], dtype=np.int64)
        cells = groups.cell[rows]
        self.cells: Dict[str, dict] = {}
        self.row_of: Dict[str, np.ndarray] = {}   # cell -> the group of each sweep (-1: none)
        order = np.argsort(cells, kind="stable")
        names, first = np.unique(cells[order], return_index=True)
        for name, part in zip(names, np.split(order, first[1:])):
            at, g = sweep_of[part], rows[part]
            cols = {k: np.full(n_sweeps, np.nan) for k in ("median", "ci_low", "ci_high", "ci_level")}
            cols.update({k: np.zeros(n_sweeps, dtype=int) for k in ("n", "n_failed")})
            for k in ("median", "ci_low", "ci_high", "ci_level", "n", "n_failed"):
                cols[k][at] = getattr(groups, k)[g]
            row_of = np.full(n_sweeps, -1, dtype=np.int64)
            row_of[at] = g
            self.cells[name], self.row_of[name] = cols, row_of

    def labels(self) -> Dict[str, str]:
        linked = [s.stored["linked"] for s in self.sweeps]
        same = all(x == linked[0] for x in linked)
        names = sorted({n for x in linked for n in x})
        if self.params is None:
            frame = self.data.cell_params([s.set_id for s in self.sweeps], names)
        else:
            have = [c for c in self.params.columns if c in ("cell", *PARAM_KEYS, *names)]
            frame = self.params[have].drop_duplicates(ignore_index=True)
        frame.attrs[LINKED_ATTR] = linked[0] if same else {}
        # the same rows and linked axes make the same labels (a cell has one row of parameters; DuckDB's
        # DISTINCT gives them in any order): the key is their exact text, rows sorted
        key = repr((list(frame.columns), sorted(map(repr, frame.values.tolist())),
                    sorted(frame.attrs[LINKED_ATTR].items())))
        if key not in self.label_memo:
            self.label_memo[key] = cell_labels([frame])
        return {c: label for c, label in self.label_memo[key].items() if c in self.cells}

    def series(self, cell: str) -> dict:
        return self.cells[cell]

    def is_control(self, cell: str) -> bool:
        """Whether `cell` is the control of a `_vs_control` metric, as history.FrameSeries.is_control decides
        it (compare.is_control over the cell's runs of every sweep): the exported ratios carry it."""
        if self.metric not in metrics.CONTROL_RATIOS or cell not in self.row_of:
            return False
        runs = [self.cell_runs(i, cell) for i in range(len(self.sweeps))]
        return is_control(self.metric, *[f for f in runs if len(f)])

    def cell_runs(self, i: int, cell: str):
        row = self.row_of[cell][i] if cell in self.row_of else -1
        v, n, n_failed = ((self.groups.values(row), int(self.groups.n[row]), int(self.groups.n_failed[row]))
                          if row >= 0 else (np.empty(0), 0, 0))
        values = np.concatenate([v, np.full(n - len(v), np.nan), np.full(n_failed, np.nan)])
        return pd.DataFrame({"cell": [cell] * len(values), "status": ["ok"] * n + ["failed"] * n_failed,
                             self.metric: values})


def dataset_history(path: "str | os.PathLike", metric: str = "gbit_s", threshold_pct: Optional[float] = None,
                    alpha: Optional[float] = None, min_nights: int = HISTORY_MIN_NIGHTS):
    """history.History of an exported dataset: the same series, steps and comparisons as `zcorch history`
    of the result sets it was exported from (no report is written: the sets need not be here)."""
    threshold_pct = HISTORY_THRESHOLD_PCT if threshold_pct is None else threshold_pct
    alpha = HISTORY_ALPHA if alpha is None else alpha
    try:
        metrics.directed(metric)
    except ValueError as exc:
        raise ResultsError(str(exc)) from None
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
    series = series_of(sweeps)
    series_by_set = {s.set_id: name for name, group in series.items() for s in group}
    # the rows of each series (one sort of the groups by their series, not a filter per series)
    key = np.array([series_by_set[x] for x in groups.set_id], dtype=object)
    order = np.argsort(key, kind="stable")
    names, first = np.unique(key[order], return_index=True) if len(key) else ([], [])
    rows = dict(zip(names, np.split(order, first[1:]) if len(key) else []))
    # the distinct parameters of every series' cells: one query
    linked = sorted({n for s in sweeps for n in s.stored["linked"]})
    params = data.cell_params([s.set_id for s in sweeps], linked, by=[series_by_set[s.set_id] for s in sweeps])
    params_of = dict(list(params.groupby(BY, sort=False))) if len(params) else {}
    no_params = params.iloc[0:0]
    named = []
    label_memo: dict = {}
    for name in sorted(series):
        group = series[name]
        named.append((name, group, DatasetSeries(data, group, metric, groups, rows.get(name, np.empty(0, dtype=np.int64)),
                                                 params_of.get(name, no_params).drop(columns=BY), label_memo)))
    compiled.join()
    experiments = experiment_histories(named, metric, threshold_pct, alpha, min_nights)
    clocks = series_clock_problems(series)
    warnings = [f"clock set back: {line}" for lines in clocks.values() for line in lines]
    return History(Path(path), metric, threshold_pct, alpha, experiments, warnings, min_nights=min_nights,
                   clock_problems=clocks)
