"""An exported result dataset (zcorch.analysis.export writes it), read through DuckDB: `zcorch history DATASET` and
`zcorch compare --dataset` get the sweeps from its sets table and the runs through `Dataset` (the RunsReader beside
history.SetRuns), so the answers are those of the result-set directories. Only the part files dataset.json lists
are read, each a regular file inside the dataset."""
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
# A list of text as Parquet reads it back (item named `element`): a part file's schema equals the declared one.
_TEXTS = pa.list_(pa.field("element", pa.string()))
SET_SCHEMA = pa.schema([(c, pa.string()) for c in COMMON] + [
    ("path", pa.string()), ("status", pa.string()), ("created", _TS), ("finished", _TS), ("hosts", pa.string()),
    ("zcorch_version", pa.string()), ("n_ok", pa.int64()), ("n_failed", pa.int64()), ("planned", pa.int64()),
    ("planned_ok", pa.int64()), ("cells_planned", _TEXTS), ("cells_short", _TEXTS),
    ("linked_axes", pa.string()), ("manifest", pa.string()), ("sha256", pa.string())])
BASELINE_TYPES = {"gbit_s": pa.float64(), "mb_s": pa.float64()}   # every other column of baselines: text
HOST_TYPES: "dict[str, pa.DataType]" = {}                         # hosts: text (values as meta.json has them)

# The runs table has one declared schema whatever a set held (parameters, worker and analysis metrics, the run
# record's keys), null where a set has none; an undeclared column is JSON text (`json_columns`), never guessed.
_KIND_TYPES = {"size": pa.int64(), "int": pa.int64(), "cpu": pa.int64(), "bool": pa.bool_(), "duration": pa.float64(),
               "choice": pa.string(), "path": pa.string(), "name": pa.string(), "cpus": pa.string()}
RUN_PARAM_TYPES: "dict[str, pa.DataType]" = {p.key: _KIND_TYPES[p.kind] for p in PARAMS}
JSON = pa.string()   # a nested value (a dict, a list): JSON text, as zcorch.load has it (frames._scalar)
# The run record's own keys (zcorch.sweep.runner), and what frames.add_derived adds besides the metrics.
_RUN_HEAD = {"cell": pa.string(), "repeat": pa.int64(), "status": pa.string(), "reason": pa.string()}
_RUN_FACTS = {"started": pa.timestamp("us", tz="UTC"), "wall_s": pa.float64(), "log": pa.string(),
              "sender_host": pa.string(), "receiver_host": pa.string(), "overhead_s": pa.float64(),
              "network": JSON, "samples": pa.string(), "samples_note": pa.string()}
_DERIVED_FACTS = {"same_host": pa.bool_(), "host_shared": pa.bool_(), "cpu_resolution": pa.string(),
                  "zc_verdict": pa.string()}


def _worker_metric_type(m) -> pa.DataType:
    """A worker metric's column type: its C field's (int64 or float64), else by its unit (share, id, table)."""
    if m.unit == "id" or (m.extent is None and m.unit != "0/1"):   # an id, or a table (a list per CPU): text
        return pa.string()
    if m.unit == "share" or m.ctype in ("double", "float"):
        return pa.float64()
    return pa.int64()


RUN_TYPES: "dict[str, pa.DataType]" = {
    **_RUN_HEAD, **RUN_PARAM_TYPES, **_RUN_FACTS,
    **{f"{side}_{m.name}": _worker_metric_type(m) for side in ("send", "recv") for m in WORKER_METRICS},
    **{m.name: pa.float64() for m in metrics.DERIVED}, **_DERIVED_FACTS}
RUN_SCHEMA = pa.schema([(c, pa.string()) for c in COMMON] + list(RUN_TYPES.items()))

# The version of the declared schemas (dataset.json `schema_version`; absent: 1): when the tables above grow it goes
# up with a new SCHEMA_DIGESTS entry (tests/test_dataset.py); an export widens an older dataset, refuses a newer.
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
    """The runs table's schema: the declared columns, then the undeclared `extra` ones (JSON text) by name."""
    return pa.schema(list(RUN_SCHEMA) + [(c, pa.string()) for c in sorted(set(extra) - set(RUN_SCHEMA.names))])


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


# Reading


# Rows of the hosts and baselines tables a set may have in a part (a set has two roles, a few baselines).
MAX_HOST_ROWS = 64
MAX_BASELINE_ROWS = 100_000
# Uncompressed bytes a part may hold per row it may have (a row of runs is about a kilobyte), plus a slack.
MAX_PART_BYTES_PER_ROW = 64 * 1024
PART_BYTES_SLACK = 64 * 1024 ** 2


def check_part(path: str, max_rows: int) -> "pq.FileMetaData":
    """The footer of a part file; ResultsError naming it when it claims more rows than `max_rows` or more
    uncompressed bytes than such rows take (read before any of its data)."""
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
    """An exported dataset opened for reading: a DuckDB view per table of `tables` over the part files listed."""

    def __init__(self, path: "str | os.PathLike", tables: Sequence[str] = TABLES):
        import duckdb

        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.con = duckdb.connect(":memory:")
        self.con.execute("SET enable_progress_bar = false")
        # every query binds read_parquet over every part again: its footers read once per connection
        self.con.execute("SET parquet_metadata_cache = true")
        self._columns: Dict[str, List[str]] = {}
        unknown = sorted(set(tables) - set(TABLES))
        if unknown:
            raise ValueError(f"no table {unknown[0]!r} in a dataset (tables: {', '.join(TABLES)})")
        # the most rows a part may have per set listed in it; runs: what their plans can hold (_runs_bound)
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
        """A function of a runs part's set ids -> the most runs their plans can hold (from the sets table; an older
        export without `planned`: setfiles.MAX_RECORDS)."""
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
        for rel in rels:
            if not setfiles.is_regular_inside(self.path, rel):
                raise ResultsError(f"{self.path / rel}: listed in {MANIFEST} but not a regular file inside the "
                                   "dataset: not read")
        return [str(self.path.resolve() / rel) for rel in rels]

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
        return arrow_of(self.query(sql, params)).to_pandas()

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
        """Every set's id as dataset.json lists it (no query), in sweeps()'s order when the two agree."""
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
            raise ResultsError(f"{self.path}: {len(hits) or 'no'} exported result set(s) named {ref!r} (give a set id, "
                               "or the path the set had when it was exported)")
        return hits[0]

    def host_meta(self, set_id: str) -> dict:
        """meta.json's {"hosts": {role: facts}} of one exported set from the hosts table ({} without rows)."""
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
        frame = self._decoded(frame[[c for c in frame.columns if c not in drop]])
        linked = self.query("SELECT linked_axes FROM sets WHERE set_id = ?", [set_id]).fetchone()
        frame.attrs[LINKED_ATTR] = json.loads(linked[0]) if linked and linked[0] else {}
        return frame

    def ok_table(self, metric: str, set_ids: Sequence[str]) -> pa.Table:
        """history.ok_table of the dataset's runs: per (set, cell) n, n_failed and the sorted ok values."""
        if metric not in self.columns("runs"):
            raise ResultsError(f"{self.path}: no column {metric!r} in its runs")
        return ok_table(self.con, metric, set_ids)

    def cell_params(self, set_ids: Sequence[str], linked: Sequence[str], by: Sequence[str]) -> pd.DataFrame:
        """history.SetRuns.cell_params, in one query."""
        have = set(self.columns("runs"))
        cols = ["cell"] + [c for c in list(PARAM_KEYS) + list(linked) if c in have]
        self.con.register("wanted_sets", pa.table({"set_id": pa.array(list(set_ids), type=pa.string()),
                                                   BY: pa.array(list(by), type=pa.string())}))
        try:
            sel = ", ".join([f'"{BY}"'] + ['"' + c.replace('"', '""') + '"' for c in cols])
            frame = self.frame(f"SELECT DISTINCT {sel} FROM runs JOIN wanted_sets USING (set_id)")
        finally:
            self.con.unregister("wanted_sets")
        return self._decoded(frame)

    def _decoded(self, frame: pd.DataFrame) -> pd.DataFrame:
        """`frame` with its columns exported as JSON text decoded."""
        for name in self.manifest["json_columns"].get("runs", []):
            if name in frame:
                frame[name] = [None if v is None else json.loads(v) for v in frame[name]]
        return frame


# One frozenset of planned cells, one dict of linked axes, per distinct value: 18,000 sets of a year share a few
@functools.lru_cache(maxsize=256)
def _shared_set(cells: tuple) -> frozenset:
    return frozenset(cells)


@functools.lru_cache(maxsize=256)
def _linked_of(text: str) -> dict:
    return json.loads(text)


def sweep_of_row(row) -> Sweep:
    """The Sweep of one row of the sets table (Dataset.sweeps' columns): its manifest as text, parsed when asked for;
    no meta.json but the revision; no `host_shared`."""
    (set_id, path, manifest, hosts, kernel, revision, n_ok, n_failed, status, planned, planned_ok,
     cells_planned, cells_short, linked) = row
    parsed = json.loads(manifest)
    completeness = Completeness(path, str(status or "unknown"), int(planned), int(planned_ok),
                                _shared_set(tuple(cells_planned or ())), tuple(cells_short or ()),
                                policy_from_record(parsed.get("repeats")))
    return Sweep(Path(path), manifest, {"controller": {"git_revision": revision}} if revision else {},
                 set_id=set_id, n_ok=int(n_ok), n_failed=int(n_failed), kernel=kernel or "", hosts=hosts or "",
                 linked=_linked_of(linked) if linked else {}, head={k: parsed[k] for k in HEAD_KEYS if k in parsed},
                 completeness=completeness)


def dataset_history(path: "str | os.PathLike", metric: str = "gbit_s", threshold_pct: Optional[float] = None,
                    alpha: Optional[float] = None, min_nights: int = HISTORY_MIN_NIGHTS) -> History:
    """history.History of an exported dataset: the same as `zcorch history` of its result sets (no reports)."""
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
    # the runs read and grouped (mostly without the GIL) on a thread while this one makes the sweeps
    with ThreadPoolExecutor(1, thread_name_prefix="zcorch-runs") as pool:
        reading = pool.submit(lambda: OkGroups(data.ok_table(metric, set_ids)))
        sweeps = data.sweeps()
        groups = reading.result()
    if sorted(s.set_id for s in sweeps) != sorted(set_ids):
        raise ResultsError(f"{path}: the sets its part files hold are not those {MANIFEST} lists (a part file "
                           "changed by something else than zcorch export?): not read")
    return history_of(Path(path), sweeps, data, groups, metric, threshold_pct, alpha, min_nights, [],
                      before_fits=compiled.join)
