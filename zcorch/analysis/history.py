"""`zcorch history ROOT`: every result set under ROOT, per experiment (and per host pair of a fleet) over time:
each cell's median per sweep, its change points, the newest sweep judged against the stable level before it and
what changed on the hosts; write_index renders the page. The method: docs/nightly.md."""
from __future__ import annotations

import collections.abc
import datetime as _dt
import functools
import json
import math
import os
import re
import warnings as _warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Protocol, Sequence

import numpy as np
import pandas as pd

from zcorch import __version__, metrics
from zcorch.analysis.detector import (DEFAULT_ALPHA, DEFAULT_THRESHOLD_PCT, MIN_NIGHTS, NIGHTLY, Comparison,
                                      judge_newest, method_text, stable_baselines)
from zcorch.analysis.frames import LINKED_ATTR, OK, PARAM_KEYS, read_experiment_text, read_meta
from zcorch.analysis.hostdiff import diff_meta
from zcorch.results import setfiles
from zcorch.analysis.load import load
from zcorch.analysis.sparkline import sparkline
from zcorch.analysis.stats import ci_label, ci_method, varying_params
from zcorch.analysis.gate import (CANNOT_TELL, EXIT_CANNOT_TELL, EXIT_OK, EXIT_REGRESSION, Completeness, Gate, completeness,
                                  experiment_gates, format_detectable, sees)
from zcorch.analysis.steps import MIN_POINTS_FOR_STEPS, StepFit, ci_sds, fit_many, point_sigmas, start_fits
from zcorch.analysis.trendplot import TrendSpec, draw_trend, png
from zcorch.config import yamlsrc
from zcorch.errors import ResultsError, ZcorchError
from zcorch.params import format_value
from zcorch.results import store
from zcorch.results.intervals import CI, median_ci_level, median_ci_rank

if TYPE_CHECKING:
    import pyarrow as pa
    from matplotlib.figure import Figure

INDEX = "index.html"
PLOTS_DIR = "history-plots"   # next to index.html: one PNG per plotted experiment × cell
# Trend plots a page draws (matplotlib is slow): every cell's up to this many cells, else the cells that moved,
# the bad ones first (trend_cells). Every row has its sparkline.
TREND_PLOTS_MAX = 8


# Finding result sets


MAX_SEARCH_DEPTH = 64   # directory levels below a history's root searched for result sets


def _walk(root: Path):
    """os.walk(root) top-down in sorted order, without recursion (a tree of any depth) and without following
    links; a directory more than MAX_SEARCH_DEPTH levels below root is an input error (ResultsError)."""
    stack = [(str(root), 0)]
    while stack:
        top, depth = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = list(it)
        except OSError:
            continue
        dirnames = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
        filenames = [e.name for e in entries if not e.is_dir(follow_symlinks=False)]
        yield top, dirnames, filenames
        if dirnames and depth >= MAX_SEARCH_DEPTH:
            raise ResultsError(f"{root}: directories more than {MAX_SEARCH_DEPTH} levels deep ({top}/"
                               f"{dirnames[0]}): not a tree of result sets; give a directory nearer them")
        stack.extend((os.path.join(top, d), depth + 1) for d in reversed(dirnames))


def find_result_sets(root: "str | os.PathLike", warn: Callable[[str], None] = lambda _: None) -> List[Path]:
    """Every result-set directory under `root` (root included, nothing below a set searched), sorted; an unreadable
    or unsupported zcorch manifest is skipped with a warning, one of another format silently."""
    root = Path(root)
    if not root.is_dir():
        raise ResultsError(f"{root}: no such directory")
    found = []
    for dirpath, dirnames, filenames in _walk(root):
        if store.MANIFEST not in filenames:
            continue
        try:
            manifest = setfiles.read_json(dirpath, store.MANIFEST)
        except (OSError, ValueError, ResultsError) as exc:
            warn(f"{dirpath}: skipped, manifest.json unreadable ({exc})")
            continue
        if not isinstance(manifest, dict) or manifest.get("format") != store.FORMAT:
            continue
        try:
            store.load_manifest(dirpath)
        except ResultsError as exc:
            warn(f"skipped: {exc}")
            continue
        found.append(Path(dirpath))
        dirnames[:] = []  # logs/, plots/ of a result set hold no result sets
    return sorted(found)


# One sweep


HEAD_KEYS = ("name", "inventory", "created", "status", "git_revision", "error", "clock")   # Sweep.head


class Sweep:
    """One result set, from its directory (read_set) or an exported dataset's row (zcorch.analysis.dataset); its
    runs are read through a RunsReader. A manifest given as JSON text is parsed when first asked for."""

    def __init__(self, path: Path, manifest: "dict | str", meta: dict, *, set_id: str, n_ok: int, n_failed: int,
                 kernel: str, hosts: str, linked: "Optional[dict]" = None, host_shared: bool = False,
                 head: "Optional[dict]" = None, completeness: "Optional[Completeness]" = None):
        self.path, self.meta, self.set_id = path, meta, set_id
        self._manifest, self._manifest_text = (None, manifest) if isinstance(manifest, str) else (manifest, None)
        self.head = head if head is not None else {k: self.manifest[k] for k in HEAD_KEYS if k in self.manifest}
        self.n_ok, self.n_failed, self.kernel, self.hosts = n_ok, n_failed, kernel, hosts
        self.linked = linked or {}
        self.host_shared = host_shared   # an ok run began on a shared host (frames' `host_shared`)
        self._completeness = completeness
        self.report: Optional[Path] = None
        self.report_problem: Optional[str] = None

    @property
    def manifest(self) -> dict:
        if self._manifest is None:
            self._manifest = json.loads(self._manifest_text)
        return self._manifest

    def completeness(self) -> "Completeness":
        """How much of its plan the sweep measured (zcorch.analysis.gate): as exported, else from its files."""
        return self._completeness if self._completeness is not None else completeness(self.path)

    @property
    def name(self) -> str:
        return str(self.head.get("name") or self.path.name)

    @property
    def pair(self) -> Optional[str]:
        """The inventory pair the manifest records (`--hosts INV:PAIR`), else None."""
        inv = self.head.get("inventory")
        pair = inv.get("pair") if isinstance(inv, dict) else None
        return str(pair) if pair else None

    @property
    def created(self) -> Optional[_dt.datetime]:
        return parse_time(self.head.get("created"))

    @property
    def status(self) -> str:
        return str(self.head.get("status") or "unknown")

    @property
    def git_revision(self) -> str:
        rev = self.head.get("git_revision") or (self.meta.get("controller") or {}).get("git_revision")
        return rev[:12] + ("-dirty" if rev.endswith("-dirty") else "") if rev else ""

    @property
    def error(self) -> str:
        err = self.head.get("error")
        return f"{err.get('type', 'error')}: {err.get('message', '')}" if isinstance(err, dict) else ""

    def date(self) -> str:
        t = self.created
        return t.strftime("%Y-%m-%d %H:%M UTC") if t else str(self.head.get("created") or "")


def kernel_of(meta: dict) -> str:
    """The kernel releases of a sweep's hosts (meta.json), sender first, each once."""
    hosts = meta.get("hosts") or {}
    releases = [((hosts.get(role) or {}).get("kernel") or {}).get("release") for role in ("sender", "receiver")]
    return " / ".join(r for r in dict.fromkeys(releases) if r)


def series_of(sweeps: Sequence[Sweep]) -> Dict[str, List[Sweep]]:
    """The series the sweeps form, each oldest first: one per experiment name, split into `NAME @ PAIR` when its
    sweeps record two or more inventory pairs (a fleet; a sweep with no pair stays under NAME)."""
    by_name: Dict[str, List[Sweep]] = {}
    for s in sweeps:
        by_name.setdefault(s.name, []).append(s)
    out: Dict[str, List[Sweep]] = {}
    for name, group in by_name.items():
        split = len({s.pair for s in group if s.pair}) > 1
        for s in group:
            out.setdefault(f"{name} @ {s.pair}" if split and s.pair else name, []).append(s)
    return {k: sorted(v, key=sweep_order) for k, v in out.items()}


def sweep_order(s: Sweep) -> tuple:
    """Oldest first: by `created`, then by path."""
    return (s.created or _dt.datetime.min.replace(tzinfo=_dt.timezone.utc), str(s.path))


def _clock(s: Sweep) -> "Optional[tuple]":
    """(boot id, CLOCK_BOOTTIME ns) the manifest recorded at creation (store.clock_stamp), else None."""
    c = s.head.get("clock")
    if not isinstance(c, dict) or not isinstance(c.get("boot_id"), str) or not c["boot_id"]:
        return None
    t = c.get("boottime_ns")
    return (c["boot_id"], t) if isinstance(t, int) and not isinstance(t, bool) and t >= 0 else None


def clock_problems(sweeps: Sequence[Sweep]) -> List[str]:
    """A line per sweep whose `created` (wall clock) is before that of a sweep created earlier on the same boot
    (by CLOCK_BOOTTIME): the clock was set back, and ordering by `created` would judge the wrong night."""
    by_boot: Dict[str, list] = {}
    for s in sweeps:
        c = _clock(s)
        if c is not None and s.created is not None:
            by_boot.setdefault(c[0], []).append((c[1], s))
    out = []
    for runs in by_boot.values():
        runs.sort(key=lambda x: x[0])
        newest: Optional[Sweep] = None
        for _, s in runs:
            if newest is not None and s.created < newest.created:
                out.append(f"{s.path}: created {s.head.get('created')} by the wall clock, before {newest.path} "
                           f"({newest.head.get('created')}) which was created earlier on the same boot: the clock "
                           "was set back, so the order of these sweeps by time cannot be trusted")
            if newest is None or s.created > newest.created:
                newest = s
    return out


def parse_time(text) -> Optional[_dt.datetime]:
    """An ISO time as UTC (a naive one read as UTC); None when `text` is not one."""
    if not isinstance(text, str):
        return None
    try:
        t = _dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return t.astimezone(_dt.timezone.utc)


def host_pair(manifest: dict, directory: Path, meta: dict) -> str:
    """Which hosts ran a sweep: the manifest's inventory pair, else the experiment copy's `hosts:` (`localhost`
    or "SENDER → RECEIVER" ssh targets), else meta.json's hostnames."""
    inv = manifest.get("inventory")
    if isinstance(inv, dict):
        pair = inv.get("pair") or inv.get("name")
        where = inv.get("path") or inv.get("file")
        if pair or where:
            return f"{pair or '?'} ({os.path.basename(str(where))})" if where else str(pair)
    elif isinstance(inv, str) and inv:
        return inv
    exp, text = read_experiment_text(directory, manifest)
    root = yamlsrc.parse(text, str(exp))[0] if text is not None else None
    hosts = root.get("hosts") if isinstance(root, yamlsrc.YMap) else None
    if isinstance(hosts, yamlsrc.YScalar) and not hosts.is_null:
        return hosts.text
    if isinstance(hosts, yamlsrc.YMap):
        specs = [hosts.get(role) for role in ("sender", "receiver")]
        sshs = [spec.get("ssh") if isinstance(spec, yamlsrc.YMap) else None for spec in specs]
        return " → ".join(ssh.text if isinstance(ssh, yamlsrc.YScalar) else "?" for ssh in sshs)
    names = [((meta.get("hosts") or {}).get(r) or {}).get("hostname") for r in ("sender", "receiver")]
    names = [n for n in names if n]
    return names[0] if len(names) == 2 and names[0] == names[1] else " → ".join(names)


def read_set(path: Path) -> "tuple[Sweep, pd.DataFrame]":
    """(the sweep, its runs as zcorch.load reads them) of one result set."""
    manifest, meta, runs = store.load_manifest(str(path)), read_meta(path), load(path)
    ok = (runs["status"] == OK) if len(runs) else pd.Series(dtype=bool)
    shared = bool(len(runs) and "host_shared" in runs and runs.loc[ok, "host_shared"].fillna(False).astype(bool).any())
    sweep = Sweep(path, manifest, meta, set_id=str(path), n_ok=int(ok.sum()), n_failed=len(runs) - int(ok.sum()),
                  kernel=kernel_of(meta), hosts=host_pair(manifest, path, meta), linked=runs.attrs.get(LINKED_ATTR),
                  host_shared=shared)
    return sweep, runs


def open_sweep(path: Path) -> Sweep:
    return read_set(path)[0]


def ensure_report(sweep: Sweep) -> None:
    """sweep.report = DIR/report.html, written when missing or stale (not while running); a failure is noted."""
    from zcorch.analysis.report import write_report  # the report's plots: only when one is written

    path = sweep.path / "report.html"
    inputs = [sweep.path / store.RUNS, sweep.path / store.MANIFEST]
    newest_input = max((p.stat().st_mtime for p in inputs if p.exists()), default=0.0)
    fresh = setfiles.is_regular_inside(sweep.path, path.name) and path.stat().st_mtime >= newest_input
    if not fresh and sweep.status != "running":
        try:
            write_report(sweep.path)
        except (ZcorchError, OSError) as exc:
            sweep.report_problem = f"report not written: {exc}"
    link_report(sweep)


def link_report(sweep: Sweep) -> None:
    """sweep.report = DIR/report.html when one is there as a regular file (a link could lead anywhere)."""
    path = sweep.path / "report.html"
    sweep.report = path if setfiles.is_regular_inside(sweep.path, path.name) else None


# Per cell: the series, its steps, the newest sweep against the level before


@dataclass
class CellHistory:
    cell: str
    label: str                    # the parameters that distinguish it within the experiment
    median: np.ndarray            # per sweep (NaN: no ok run of this cell in that sweep)
    ci_low: np.ndarray
    ci_high: np.ndarray
    ci_level: np.ndarray          # the level each sweep's interval really has (zcorch.analysis.stats.median_ci)
    n: np.ndarray                 # ok runs per sweep
    n_failed: np.ndarray          # other runs per sweep
    fit: StepFit
    comparison: Optional[Comparison] = None
    plot: Optional[str] = None    # path of the trend plot relative to index.html

    def present(self, i: int) -> bool:
        return bool(self.n[i] + self.n_failed[i])


@dataclass
class ExperimentHistory:
    name: str
    sweeps: List[Sweep]
    cells: List[CellHistory]
    metric: str
    problem: Optional[str] = None  # the newest sweep measured nothing

    @property
    def newest(self) -> Sweep:
        return self.sweeps[-1]

    @property
    def regressions(self) -> List[CellHistory]:
        return [c for c in self.cells if c.comparison is not None and c.comparison.bad]

    @property
    def bad(self) -> bool:
        return bool(self.problem or self.regressions)


def cell_labels(frames: Sequence[pd.DataFrame]) -> Dict[str, str]:
    """cell id -> "key=value, ..." of the parameters that vary across the sweeps (the modes when none does)."""
    frames = [f for f in frames if len(f)]
    if not frames:
        return {}
    df = pd.concat(frames, ignore_index=True)
    params = varying_params(df) or [p for p in ("send_mode", "recv_mode") if p in df]  # one cell: its modes
    labels = {}
    for cell, group in df.groupby("cell", sort=False):
        first = group.iloc[0]
        labels[cell] = ", ".join(f"{p}={format_value(p, first[p])}" for p in params) or f"cell {cell}"
    return labels


class OkGroups:
    """The (set, cell) groups of ok_table as numpy arrays (no Python object per group), with each group's median
    and interval as zcorch.analysis.stats.summarize computes them (order statistics k and m + 1 - k)."""

    def __init__(self, table: "pa.Table"):
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


def ok_table(con, metric: str, set_ids: Sequence[str]) -> "pa.Table":
    """Per (set, cell) of `set_ids` in the `runs` relation of `con`: n (ok runs), n_failed and the ok values of
    `metric` sorted, nulls and NaN left out (`vals`), in the order of `set_ids`, then cell (null last)."""
    import pyarrow as pa

    wanted = pa.array(list(dict.fromkeys(set_ids)), type=pa.string())
    v = 'CAST(r."' + metric.replace('"', '""') + '" AS DOUBLE)'
    cur = con.cursor()   # a cursor of its own: it may run on another thread while `con` answers others
    try:
        cur.register("wanted_sets", pa.table({"set_id": wanted,
                                              "position": pa.array(np.arange(len(wanted), dtype=np.int64))}))
        # ok: status 'ok' (a null status is not); the values: of the ok runs, nulls and NaN left out
        groups = arrow_of(cur.execute(
            f"SELECT w.position AS s, r.cell, count(*) FILTER (WHERE r.status = 'ok') AS n, count(*) AS runs, "
            f"list({v} ORDER BY {v}) FILTER (WHERE r.status = 'ok' AND {v} IS NOT NULL AND NOT isnan({v})) "
            f"AS vals FROM runs r JOIN wanted_sets w ON r.set_id = w.set_id GROUP BY w.position, r.cell "
            f"ORDER BY w.position, r.cell NULLS LAST"))
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


def arrow_of(result) -> "pa.Table":
    """A DuckDB result as an Arrow table (duckdb 2 and 1.x)."""
    to_arrow = getattr(result, "to_arrow_table", None) or result.fetch_arrow_table
    with _warnings.catch_warnings():   # duckdb 2 notes the copy a DB-API result makes: these answers are small
        _warnings.simplefilter("ignore", UserWarning)
        return to_arrow()


BY = "_series"   # the column of a RunsReader.cell_params' key


class RunsReader(Protocol):
    """Where history reads the runs of its sweeps: SetRuns or zcorch.analysis.dataset.Dataset."""

    def ok_table(self, metric: str, set_ids: Sequence[str]) -> "pa.Table": ...

    def cell_params(self, set_ids: Sequence[str], linked: Sequence[str], by: Sequence[str]) -> pd.DataFrame: ...


class SetRuns:
    """The RunsReader of result-set directories: their runs as DuckDB's `runs`, grouped by ok_table's query."""

    def __init__(self, runs: Dict[str, pd.DataFrame], metric: str):
        """`runs`: {set id (the set's path): its runs}; ResultsError when a set with runs has no `metric`."""
        import duckdb
        import pyarrow as pa

        parts, params = [], []
        schema = pa.schema([("set_id", pa.string()), ("cell", pa.string()), ("status", pa.string()),
                            ("value", pa.float64())])
        for sid, frame in runs.items():
            if not len(frame):
                continue
            if metric not in frame:
                raise ResultsError(f"{sid}: no column {metric!r} in its runs")
            cells = pd.Series([None if c is None or (isinstance(c, float) and c != c) else str(c)
                               for c in (frame["cell"] if "cell" in frame else [None] * len(frame))],
                              index=frame.index, dtype=object, name="cell")
            parts.append(pa.table({"set_id": [sid] * len(frame), "cell": cells.tolist(),
                                   "status": [s if isinstance(s, str) else None for s in frame["status"]],
                                   "value": pd.to_numeric(frame[metric], errors="coerce").to_numpy(dtype="float64")},
                                  schema=schema))
            keep = [c for c in (*PARAM_KEYS, *frame.attrs.get(LINKED_ATTR, {})) if c in frame]
            params.append(pd.concat([pd.Series(sid, index=frame.index, name="set_id"), cells,
                                     frame[keep]], axis=1)[cells.notna()].drop_duplicates())
        table = pa.concat_tables(parts) if parts else schema.empty_table()
        self.metric = metric
        self.params = pd.concat(params, ignore_index=True) if params else pd.DataFrame({"set_id": [], "cell": []})
        self.con = duckdb.connect(":memory:")
        self.con.execute("SET enable_progress_bar = false")
        self.con.register("runs_table", table)   # a table, not a view: ok_table reads it on a cursor of its own
        column = '"' + metric.replace('"', '""') + '"'
        self.con.execute(f"CREATE TABLE runs AS SELECT set_id, cell, status, value AS {column} FROM runs_table")
        self.con.unregister("runs_table")

    def ok_table(self, metric: str, set_ids: Sequence[str]) -> "pa.Table":
        if metric != self.metric:
            raise ValueError(f"SetRuns read {self.metric!r}, not {metric!r}")
        return ok_table(self.con, metric, set_ids)

    def cell_params(self, set_ids: Sequence[str], linked: Sequence[str], by: Sequence[str]) -> pd.DataFrame:
        """The distinct (series key `by` of each set id in column BY, cell, parameters) of the runs of `set_ids`."""
        key = dict(zip(set_ids, by))
        frame = self.params[self.params["set_id"].isin(key)]
        cols = ["cell"] + [c for c in list(PARAM_KEYS) + list(linked) if c in frame]
        return pd.concat([frame["set_id"].map(key).rename(BY), frame[cols]], axis=1).drop_duplicates(ignore_index=True)


class SeriesCells:
    """Per series and cell, its columns per sweep (NaN, or 0 for the counts, where the cell has no group): views
    into flat arrays filled from one ok_table of every set at once (a fleet's year has 440,000 groups)."""

    COLUMNS = ("median", "ci_low", "ci_high", "ci_level", "n", "n_failed")

    def __init__(self, series: Dict[str, List[Sweep]], metric: str, groups: OkGroups):
        self.series, self.metric, self.groups = series, metric, groups
        names = sorted(series)
        where = {s.set_id: (k, i) for k, name in enumerate(names) for i, s in enumerate(series[name])}
        set_code, set_ids = pd.factorize(groups.set_id)
        cell_code, cells = pd.factorize(groups.cell)   # a null cell (-1) is no cell of a series
        at = np.array([where[x] for x in set_ids], dtype=np.int64).reshape(-1, 2)[set_code]
        rows = np.flatnonzero(cell_code >= 0)
        slots, slot = np.unique(at[rows, 0] * len(cells) + cell_code[rows], return_inverse=True)
        length = np.array([len(series[name]) for name in names], dtype=np.int64)[slots // max(len(cells), 1)]
        start = np.concatenate([[0], np.cumsum(length)])
        flat = start[slot] + at[rows, 1]
        cols = {k: np.full(start[-1], np.nan) for k in self.COLUMNS[:4]}
        cols.update({k: np.zeros(start[-1], dtype=np.int64) for k in self.COLUMNS[4:]})
        for k, values in cols.items():
            values[flat] = getattr(groups, k)[rows]
        row_of = np.full(start[-1], -1, dtype=np.int64)   # the group of each sweep (-1: none)
        row_of[flat] = rows
        self.cells: Dict[str, Dict[str, Dict[str, np.ndarray]]] = {name: {} for name in names}
        self.row_of: Dict[str, Dict[str, np.ndarray]] = {name: {} for name in names}
        for j, (key, a, b) in enumerate(zip(slots.tolist(), start[:-1].tolist(), start[1:].tolist())):
            name, cell = names[key // len(cells)], str(cells[key % len(cells)])
            self.cells[name][cell] = {k: v[a:b] for k, v in cols.items()}
            self.row_of[name][cell] = row_of[a:b]

    def labels(self, reader: "RunsReader") -> Dict[str, Dict[str, str]]:
        """{series: {cell id: label (cell_labels)}}, from one query of the distinct parameters; series with the same
        parameter rows and linked axes (a fleet's pairs) share one cell_labels call."""
        sweeps = [s for group in self.series.values() for s in group]
        by = {s.set_id: name for name, group in self.series.items() for s in group}
        params = reader.cell_params([s.set_id for s in sweeps], sorted({n for s in sweeps for n in s.linked}),
                                    by=[by[s.set_id] for s in sweeps])
        columns, series_of_row = list(params.columns), params[BY].to_numpy(dtype=object)
        rows: Dict[str, list] = {}
        for name, row in zip(series_of_row, params.itertuples(index=False, name=None)):
            rows.setdefault(name, []).append(row)
        memo: dict = {}
        out = {}
        for name, group in self.series.items():
            # the linked axes of the sweeps that ran (a sweep without runs knows none of its experiment's)
            linked = [s.linked for s in group if s.n_ok + s.n_failed] or [{}]
            axes = linked[0] if all(x == linked[0] for x in linked) else {}
            have = [k for k, c in enumerate(columns) if c in ("cell", *PARAM_KEYS, *{n for x in linked for n in x})]
            # the same rows and linked axes make the same labels (a cell has one row of parameters; DuckDB's
            # DISTINCT gives them in any order): the key is their exact text, rows sorted
            text = sorted({repr([r[k] for k in have]) for r in rows.get(name, ())})
            key = repr(([columns[k] for k in have], text, sorted(axes.items())))
            if key not in memo:
                frame = params[series_of_row == name].iloc[:, have].drop_duplicates(ignore_index=True)
                frame.attrs[LINKED_ATTR] = axes
                memo[key] = cell_labels([frame])
            out[name] = {c: label for c, label in memo[key].items() if c in self.cells[name]}
        return out

    def is_control(self, name: str, cell: str) -> bool:
        """Whether `cell` is the control of a `_vs_control` metric: every sweep that ran it has ok values, all 1."""
        if self.metric not in metrics.CONTROL_RATIOS or cell not in self.row_of[name]:
            return False
        g = self.groups
        ran = [r for r in self.row_of[name][cell] if r >= 0 and g.n[r] + g.n_failed[r]]
        return bool(ran) and all(len(v) and bool((v == 1.0).all()) for v in map(g.values, ran))


class CellRuns(collections.abc.Sequence):
    """The sorted ok values of one cell's metric per sweep, each read when asked for (judge_newest reads few)."""

    def __init__(self, groups: OkGroups, row_of: np.ndarray):
        self.groups, self.row_of = groups, row_of

    def __len__(self) -> int:
        return len(self.row_of)

    def __getitem__(self, i):
        if not isinstance(i, int):
            raise TypeError("CellRuns: one sweep at a time")
        row = self.row_of[i]   # IndexError beyond the sweeps
        return self.groups.values(row) if row >= 0 else np.empty(0)


def newest_against_stable(ch: CellHistory, runs: CellRuns, control: bool, metric: str, threshold_pct: float,
                          alpha: float, min_nights: int = MIN_NIGHTS) -> Optional[Comparison]:
    """The newest sweep of a cell against the stable level before it; None without one, or for a `control` cell."""
    last = len(ch.median) - 1
    if not ch.present(last):
        return None
    if ch.n[last] == 0:   # every run of the newest night failed where earlier nights had ok runs
        earlier = stable_baselines(ch.fit, np.flatnonzero(np.asarray(ch.n) > 0).tolist(), last)
        if not earlier:
            return None
        base = earlier[0][0]
        return Comparison("failed", math.nan, float(np.median(ch.median[base])), math.nan, math.nan, "",
                          len(base), 0, list(base), last, NIGHTLY, [last])
    if control:
        return None
    return judge_newest(ch.median, ci_sds(ch.ci_low, ch.ci_high, ch.ci_level), runs, ch.fit,
                        metrics.get(metric).better == "higher", threshold_pct, alpha, min_nights)


# One fitting thread (no GIL held) beside the one judging keeps two CPUs busy (benchmarks/bench_history.py)
FIT_THREADS = 1


def fit_series(series: Sequence[Dict[str, np.ndarray]], pool: Optional[ThreadPoolExecutor] = None):
    """The change-point fit of each cell's series: a list, or with `pool` steps.PendingFits submitted there."""
    pairs = [(cols["median"], point_sigmas(cols["median"], cols["ci_low"], cols["ci_high"], cols["ci_level"]))
             for cols in series]
    return start_fits(pairs, pool) if pool is not None else fit_many(pairs, FIT_THREADS)


def experiment_histories(cells: SeriesCells, labels: Dict[str, Dict[str, str]], threshold_pct: float,
                         alpha: float, min_nights: int) -> List[ExperimentHistory]:
    """The ExperimentHistory of each series, by name: cells fitted on FIT_THREADS while this thread judges."""
    names = sorted(cells.series)
    order = {name: sorted(labels[name], key=lambda c: (labels[name][c], c)) for name in names}
    with ThreadPoolExecutor(FIT_THREADS, thread_name_prefix="zcorch-fit") as pool:
        try:
            pending = [fit_series([cells.cells[name][c] for c in order[name]], pool) for name in names]
            out = []
            for name, fits in zip(names, pending):
                hist = ExperimentHistory(name, cells.series[name], [], cells.metric)
                for cell, fit in zip(order[name], fits.result()):
                    cols = cells.cells[name][cell]
                    ch = CellHistory(cell, labels[name][cell], *(cols[k] for k in SeriesCells.COLUMNS), fit)
                    ch.comparison = newest_against_stable(
                        ch, CellRuns(cells.groups, cells.row_of[name][cell]), cells.is_control(name, cell),
                        cells.metric, threshold_pct, alpha, min_nights)
                    hist.cells.append(ch)
                newest = hist.newest
                if newest.status != "running" and newest.n_ok == 0:
                    why = f" ({newest.error})" if newest.error else ""
                    hist.problem = (f"the newest sweep {newest.path} measured nothing: status {newest.status}, "
                                    f"{newest.n_ok} ok / {newest.n_failed} failed runs{why}")
                out.append(hist)
            return out
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)   # after an error, the fits not started are not waited for
            raise


# The whole tree


@dataclass
class History:
    root: Path
    metric: str
    threshold_pct: float
    alpha: float
    experiments: List[ExperimentHistory]
    warnings: List[str] = field(default_factory=list)
    index: Optional[Path] = None
    min_nights: int = MIN_NIGHTS
    clock_problems: Dict[str, List[str]] = field(default_factory=dict)   # per series: clock_problems(its sweeps)
    _gates: "Optional[tuple]" = field(default=None, repr=False, compare=False)

    def gates(self) -> "tuple[Gate, Dict[str, Gate]]":
        """(the gate over every experiment, {experiment name: its own}) (zcorch.analysis.gate); a series whose
        sweeps' order cannot be trusted (clock_problems) cannot tell, and neither can the whole."""
        if self._gates is None:
            overall, each = experiment_gates(self.experiments)
            each = dict(each)
            problems = self.clock_problems

            def untrusted(name: str) -> str:
                return f"{name}: the order of its sweeps cannot be trusted: {problems[name][0]}"
            for name in problems:
                more = f" (and {len(problems[name]) - 1} more)" if len(problems[name]) > 1 else ""
                each[name] = _also_cannot_tell(each.get(name), untrusted(name) + more)
            if problems:
                first = sorted(problems)
                more = f"; and {len(first) - 2} more series" if len(first) > 2 else ""
                overall = _also_cannot_tell(overall, "; ".join(map(untrusted, first[:2])) + more)
            self._gates = (overall, each)
        return self._gates

    @property
    def n_sweeps(self) -> int:
        return sum(len(e.sweeps) for e in self.experiments)

    @property
    def bad(self) -> bool:
        return any(e.bad for e in self.experiments)


def build_history(root: "str | os.PathLike", metric: str = "gbit_s", threshold_pct: float = DEFAULT_THRESHOLD_PCT,
                  alpha: float = DEFAULT_ALPHA, reports: bool = False, min_nights: int = MIN_NIGHTS) -> History:
    """Every result set under `root`, grouped and analysed (docs/nightly.md); `reports`: each sweep's report.html
    written when missing or stale, else only one already there linked (a nightly gate answers in seconds)."""
    check_metric(metric)
    warnings: List[str] = []
    dirs = find_result_sets(root, warnings.append)
    if not dirs:
        raise ResultsError(f"{root}: no zcorch result set found (a directory with manifest.json) at any depth")
    sweeps: List[Sweep] = []
    runs: Dict[str, pd.DataFrame] = {}
    for d in dirs:
        try:
            with _warnings.catch_warnings(record=True) as caught:  # what a bounded reader skipped, said here
                _warnings.simplefilter("always", setfiles.SkippedWarning)
                sweep, runs[str(d)] = read_set(d)
            warnings += [f"partly read: {w.message}" for w in caught if issubclass(w.category, setfiles.SkippedWarning)]
        except ResultsError as exc:
            warnings.append(f"skipped: {exc}")
            continue
        sweeps.append(sweep)
    reader = SetRuns(runs, metric)
    for s in sweeps:
        if reports:
            ensure_report(s)
            if s.report_problem:
                warnings.append(f"{s.path}: {s.report_problem}")
        else:
            link_report(s)
    groups = OkGroups(reader.ok_table(metric, [s.set_id for s in sweeps]))
    return history_of(Path(root), sweeps, reader, groups, metric, threshold_pct, alpha, min_nights, warnings)


def check_metric(metric: str) -> None:
    """ResultsError unless `metric` has a better direction (zcorch.metrics): history follows only those."""
    try:
        metrics.directed(metric)
    except ValueError as exc:
        raise ResultsError(str(exc)) from None


def history_of(root: Path, sweeps: List[Sweep], reader: RunsReader, groups: OkGroups, metric: str, threshold_pct: float,
               alpha: float, min_nights: int, warnings: List[str], before_fits: Callable[[], None] = lambda: None
               ) -> History:
    """The History of `sweeps` whose runs `reader` holds (`groups`: its ok_table); `before_fits` runs first."""
    series = series_of(sweeps)
    cells = SeriesCells(series, metric, groups)
    labels = cells.labels(reader)
    before_fits()
    experiments = experiment_histories(cells, labels, threshold_pct, alpha, min_nights)
    clocks = {name: lines for name, lines in ((n, clock_problems(g)) for n, g in series.items()) if lines}
    warnings = warnings + [f"clock set back: {line}" for lines in clocks.values() for line in lines]
    return History(root, metric, threshold_pct, alpha, experiments, warnings, min_nights=min_nights,
                   clock_problems=clocks)


# Plots and the page


def _slug(text: str) -> str:
    """A file name made of `text` (a name from a result set: never `..`, `/` or a hidden name)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-.")[:80] or "experiment"


def _tick_label(i: int, s: Sweep, dated: bool) -> str:
    """'#3' (the # of the page's tables), over the sweep's date when `dated`."""
    if not dated:
        return f"#{i + 1}"
    t = s.created
    return f"#{i + 1}\n" + (t.strftime("%m-%d %H:%M") if t else s.path.name[:12])


def trend_spec(exp: ExperimentHistory, ch: CellHistory) -> TrendSpec:
    """What the cell's trend plot shows (zcorch.analysis.trendplot.draw_trend draws it)."""
    n = len(exp.sweeps)
    have = np.isfinite(ch.median)
    # too few sweeps support no fit: no "level" is drawn through two or three points
    fitted = ch.fit.segments if int(have.sum()) >= MIN_POINTS_FOR_STEPS else []
    segs = ch.fit.segments
    steps = [(seg.start, (seg.level - prev.level) / prev.level * 100 if prev.level else None)
             for prev, seg in zip(segs, segs[1:])]
    cmp = ch.comparison
    step = max(1, int(math.ceil(n / 12)))
    ticks = list(range(n - 1, -1, -step))[::-1]
    every = max(1, int(math.ceil(len(ticks) / 5)))  # dates on at most 5 ticks (the newest one dated)
    return TrendSpec(ch.median, ch.ci_low, ch.ci_high, [(s.start, s.end, s.level) for s in fitted], steps,
                     (ch.n == 0) & (ch.n_failed > 0), bool(cmp is not None and cmp.bad and have[n - 1]), ticks,
                     [_tick_label(i, exp.sweeps[i], (len(ticks) - 1 - k) % every == 0) for k, i in enumerate(ticks)],
                     metrics.axis_label(exp.metric), ch.label)


def trend_figure(exp: ExperimentHistory, ch: CellHistory) -> Figure:
    """The cell's trend plot (trend_spec)."""
    return draw_trend(trend_spec(exp, ch))


def _fmt(v, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float, np.floating)) and np.isfinite(v) else "–"


def _rel(path: Path, start: Path) -> str:
    """os.path.relpath, the directory part computed once per directory (a fleet's 18,000 sweeps share a few)."""
    path, start = os.path.abspath(path), os.path.abspath(start)
    head, tail = os.path.split(path)
    if not tail or (start + os.sep).startswith(path + os.sep):   # path is start or above it: no shortcut
        return Path(os.path.relpath(path, start)).as_posix()
    rel = _rel_dir(head, start)
    # what Path(...).as_posix() would give, without a Path per sweep
    return (tail if rel == "." else os.path.join(rel, tail)).replace(os.sep, "/")


@functools.lru_cache(maxsize=4096)
def _rel_dir(directory: str, start: str) -> str:
    return os.path.relpath(directory, start)


def page_context(history: History, out_dir: Path) -> dict:
    """What the template history.html.j2 shows (every value autoescaped there)."""
    declared = metrics.get(history.metric)
    unit = f"{declared.label}, {declared.unit}, {declared.better} is better"
    overall, gates = history.gates()
    experiments = []
    for exp in history.experiments:
        sweeps = [{"index": i + 1, "date": s.date(), "revision": s.git_revision, "kernel": s.kernel,
                   "hosts": s.hosts, "status": s.status, "ok": s.n_ok, "failed": s.n_failed,
                   "dir": _rel(s.path, out_dir), "report": _rel(s.report, out_dir) if s.report else None,
                   "error": s.error, "report_problem": s.report_problem, "host_shared": s.host_shared}
                  for i, s in reversed(list(enumerate(exp.sweeps)))]
        cells = []
        for ch in exp.cells:
            c = ch.comparison
            last = len(exp.sweeps) - 1
            row = {"cell": ch.cell, "label": ch.label, "plot": ch.plot, "spark": cell_sparkline(exp, ch),
                   "steps": ", ".join(f"#{s + 1}" for s in ch.fit.steps),
                   "newest": (f"{_fmt(ch.median[last], '.3f')}" + (
                              f" [{_fmt(ch.ci_low[last], '.3f')}–{_fmt(ch.ci_high[last], '.3f')}, "
                              f"{ci_label(ch.ci_level[last])}]" if np.isfinite(ch.ci_low[last]) else " [no interval]")
                              if np.isfinite(ch.median[last]) else
                              ("all failed" if ch.n_failed[last] else "not run")),
                   "n": f"{ch.n[last]}/{ch.n[last] + ch.n_failed[last]}"}
            if c is not None:
                row.update(base=_fmt(c.base_median, ".3f"), change=_fmt(c.change_pct, "+.1f"),
                           p=_fmt(c.p_value, ".3g"), verdict=c.verdict, bad=c.bad,
                           undecided=c.verdict == CANNOT_TELL,
                           detectable=format_detectable(getattr(c, "detectable_pct", math.nan)),
                           needs=getattr(c, "needs", ""),
                           since=f"#{c.since + 1}" if c.bad else "", against=_span(c.baseline))
            else:
                row.update(base="–", change="–", p="–", verdict="nothing to compare", bad=False, since="",
                           against="", undecided=False, detectable="–", needs="")
            cells.append(row)
        experiments.append({"name": exp.name, "anchor": _slug(exp.name), "sweeps": sweeps, "cells": cells,
                            "plotted": [c for c in cells if c["plot"]],
                            "problem": exp.problem, "n_regressed": len(exp.regressions), "bad": exp.bad,
                            "gate": _gate_view(gates[exp.name]), "host_changes": host_changes(exp),
                            "newest": {"index": len(exp.sweeps), "date": exp.newest.date(),
                                       "dir": _rel(exp.newest.path, out_dir)}})
    return {"root": str(history.root), "metric": history.metric, "unit": unit, "version": __version__,
            "generated": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "threshold": history.threshold_pct, "alpha": history.alpha, "ci_method": ci_method(),
            "method": method_text(declared.better, history.threshold_pct, history.alpha, history.min_nights),
            "experiments": experiments, "warnings": history.warnings, "bad": history.bad,
            "gate": _gate_view(overall),
            "n_sweeps": history.n_sweeps, "trend_plots_max": TREND_PLOTS_MAX}


def _has_hosts(meta: dict) -> bool:
    return isinstance(meta, dict) and any(isinstance(h, dict) for h in (meta.get("hosts") or {}).values())


def host_changes(exp: ExperimentHistory) -> List[dict]:
    """What changed on the hosts at each change point, first regressed sweep and the newest, against the sweep
    before ("at") and up to the newest ("since"), where both recorded their hosts (an exported sweep does not)."""
    last = len(exp.sweeps) - 1
    points = {k for ch in exp.cells for k in ch.fit.steps} | {last}
    points |= {ch.comparison.since for ch in exp.cells if ch.comparison is not None and ch.comparison.bad}
    out = []
    for k in sorted(p for p in points if 0 < p <= last):
        before, at = exp.sweeps[k - 1], exp.sweeps[k]
        if not (_has_hosts(before.meta) and _has_hosts(at.meta)):
            continue
        entry = {"index": k + 1, "date": at.date(), "at": diff_meta(before.meta, at.meta, (f"#{k}", f"#{k + 1}"))}
        if k < last and _has_hosts(exp.newest.meta):
            entry["since"] = diff_meta(before.meta, exp.newest.meta, (f"#{k}", f"#{last + 1}"))
        out.append(entry)
    return out


def _also_cannot_tell(gate: "Optional[Gate]", why: str) -> Gate:
    """`gate` with `why` it cannot tell added: a regression still wins (exit 1, the reason names both)."""
    if gate is not None and gate.code == EXIT_REGRESSION:
        return Gate(EXIT_REGRESSION, f"{gate.reason}; also cannot tell: {why}", gate.detectable_pct)
    return Gate(EXIT_CANNOT_TELL, why, gate.detectable_pct if gate is not None else math.nan)


def _gate_view(gate: Gate) -> dict:
    """A gate as the page shows it: its state (the headline's colour), verdict, reason, detectable change."""
    state = {EXIT_OK: "ok", EXIT_CANNOT_TELL: "undecided"}.get(gate.code, "bad")
    return {"state": state, "verdict": gate.verdict, "reason": gate.reason, "sees": sees(gate.detectable_pct)}


def cell_sparkline(exp: ExperimentHistory, ch: CellHistory):
    """The row's small drawing of the series (zcorch.analysis.sparkline), of what trend_figure draws."""
    have = np.isfinite(ch.median)
    levels = [(s.start, s.end, s.level) for s in ch.fit.segments] if int(have.sum()) >= MIN_POINTS_FOR_STEPS else []
    bad = ch.comparison is not None and ch.comparison.bad
    title = (f"{ch.label}: {int(have.sum())} of {len(exp.sweeps)} sweeps with ok runs, {len(ch.fit.steps)} change "
             f"point(s)" + (f", newest {_fmt(ch.median[-1], '.3g')} {exp.metric}" if have[-1] else ""))
    return sparkline(ch.median, levels, ch.fit.steps, (ch.n == 0) & (ch.n_failed > 0), bad, title)


def _span(indices: Sequence[int]) -> str:
    if not indices:
        return ""
    if len(indices) == 1:
        return f"#{indices[0] + 1}"
    return f"#{indices[0] + 1}–#{indices[-1] + 1} ({len(indices)} sweeps)"


def trend_cells(history: History) -> "List[tuple[ExperimentHistory, CellHistory]]":
    """The cells that get a trend plot (TREND_PLOTS_MAX)."""
    every = [(exp, ch) for exp in history.experiments for ch in exp.cells]
    if len(every) <= TREND_PLOTS_MAX:
        return every
    # the cells that moved: a measured change, or one beyond the threshold not shown significant (a cell that
    # cannot tell only because its nights could not see the threshold did not move: its sparkline shows it)
    changed = [(exp, ch) for exp, ch in every if ch.comparison is not None and (
        ch.comparison.verdict not in ("unchanged", CANNOT_TELL) or abs(ch.comparison.change_pct) > history.threshold_pct)]
    size = [abs(ch.comparison.change_pct) if np.isfinite(ch.comparison.change_pct) else math.inf for _, ch in changed]
    order = sorted(range(len(changed)), key=lambda k: (not changed[k][1].comparison.bad, -size[k]))
    return [changed[k] for k in order[:TREND_PLOTS_MAX]]


def write_index(history: History, out: "str | os.PathLike | None" = None) -> Path:
    """OUT/index.html (default ROOT/index.html) and its trend plots under OUT/history-plots/ (trend_cells)."""
    from zcorch.analysis.templating import environment

    out_dir = Path(out) if out is not None else history.root
    out_dir.mkdir(parents=True, exist_ok=True)
    plotted = trend_cells(history)
    specs = [trend_spec(exp, ch) for exp, ch in plotted]
    rels = []
    for exp, ch in plotted:
        rels.append(f"{PLOTS_DIR}/{_slug(exp.name)}/{_slug(ch.cell)}-{history.metric}.png")
        ch.plot = _rel(Path(out_dir, rels[-1]), out_dir)   # where setfiles.write_inside puts it
    page = environment().get_template("history.html.j2").render(page_context(history, out_dir))
    for rel, spec in zip(rels, specs):
        # no link below out_dir followed: the root holds result sets that may come from anyone
        setfiles.write_inside(out_dir, rel, png(spec))
    index = setfiles.write_inside(out_dir, INDEX, page.encode("utf-8"))
    history.index = index
    return index


# What the command prints


def as_json(history: History, gate: "Optional[dict]" = None) -> dict:
    """What `zcorch history --format json` prints: per experiment its sweeps and per cell the newest median, its
    interval and comparison; `gate` (the answer of --check) first."""
    def num(v):
        return float(v) if v is not None and np.isfinite(v) else None

    exps = []
    for exp in history.experiments:
        last = len(exp.sweeps) - 1
        cells = []
        for ch in exp.cells:
            c = ch.comparison
            cells.append({"cell": ch.cell, "label": ch.label, "median": num(ch.median[last]),
                          "ci_low": num(ch.ci_low[last]), "ci_high": num(ch.ci_high[last]),
                          "ci_level": num(ch.ci_level[last]), "n": int(ch.n[last]),
                          "n_failed": int(ch.n_failed[last]), "steps": [int(i) for i in ch.fit.steps],
                          "comparison": None if c is None else {
                              "verdict": c.verdict, "change_pct": num(c.change_pct), "base_median": num(c.base_median),
                              "cand_median": num(c.cand_median), "p_value": num(c.p_value), "test": c.test,
                              "n_base": c.n_base, "n_cand": c.n_cand, "method": c.method,
                              "spread_pct": num(c.spread_pct),
                              "detectable_pct": num(c.detectable_pct), "detectable": format_detectable(c.detectable_pct),
                              "needs": c.needs,
                              "judged": [str(exp.sweeps[i].path) for i in c.window],
                              "baseline": [str(exp.sweeps[i].path) for i in c.baseline],
                              "since": str(exp.sweeps[c.since].path)}})
        exps.append({"name": exp.name, "problem": exp.problem,
                     "sweeps": [{"path": str(s.path), "created": s.head.get("created"), "status": s.status,
                                 "ok": s.n_ok, "failed": s.n_failed, "git_revision": s.git_revision,
                                 "host_shared": s.host_shared}
                                for s in exp.sweeps],
                     "cells": cells})
    doc = dict(gate or {})
    doc.update(root=str(history.root), metric=history.metric, threshold_pct=history.threshold_pct,
               alpha=history.alpha, min_nights=history.min_nights, ci_method=ci_method(),
               method=method_text(metrics.get(history.metric).better, history.threshold_pct, history.alpha,
                                  history.min_nights), warnings=list(history.warnings), experiments=exps)
    return doc


def _moved(c: Comparison, metric: str) -> str:
    """'-12.0% (gbit_s 9.400 -> 8.272, ': how far a comparison moved, its parenthesis left open."""
    return f"{_fmt(c.change_pct, '+.1f')}% ({metric} {_fmt(c.base_median, '.3f')} -> {_fmt(c.cand_median, '.3f')}, "


def _judged(c: Comparison) -> str:
    return "newest night" if len(c.window) <= 1 else f"mean of the newest {len(c.window)} nights"


def _undecided(c: Comparison, metric: str) -> str:
    """A `cannot tell` cell in one line: how far it moved, what it could have seen, what would decide it."""
    text = (f"{_moved(c, metric)}{_judged(c)}, p={_fmt(c.p_value, '.3g')}); "
            f"{sees(getattr(c, 'detectable_pct', math.nan))}")
    needs = getattr(c, "needs", "")
    return text + (f"; needs {needs}" if needs else "")


def render_text(history: History) -> str:
    """Per experiment its newest sweep, and every bad cell: by how much, since which sweep, against which."""
    lines = [f"zcorch history: {history.n_sweeps} result set(s) of {len(history.experiments)} experiment(s) "
             f"under {history.root}" + (f" -> {history.index}" if history.index else "")]
    for exp in history.experiments:
        newest = exp.newest
        head = (f"{exp.name}: {len(exp.sweeps)} sweep(s); newest {newest.path} ({newest.date()}, {newest.status}, "
                f"{newest.n_ok} ok / {newest.n_failed} failed)")
        verdicts = pd.Series([c.comparison.verdict for c in exp.cells if c.comparison is not None], dtype=object)
        counts = ", ".join(f"{n} {v}" for v, n in verdicts.value_counts().items()) or "no cell to compare"
        gate = history.gates()[1][exp.name]
        if gate.code == EXIT_OK:
            lines.append(f"{head}: no regression ({counts}; {sees(gate.detectable_pct)})")
            continue
        if not exp.bad:
            lines.append(f"{head}: CANNOT TELL ({counts})")
            undecided = [f"  {ch.label} [cell {ch.cell}]: {_undecided(ch.comparison, history.metric)}"
                         for ch in exp.cells if ch.comparison is not None and ch.comparison.verdict == CANNOT_TELL]
            lines += undecided or [f"  {gate.reason}"]
            continue
        lines.append(f"{head}: REGRESSION ({counts})")
        if exp.problem:
            lines.append(f"  {exp.problem}")
        for ch in exp.regressions:
            c = ch.comparison
            since = exp.sweeps[c.since].path
            base = [exp.sweeps[i].path for i in c.baseline]
            against = str(base[0]) if len(base) == 1 else f"{len(base)} sweeps {base[0]} .. {base[-1]}"
            if c.verdict == "failed":
                what = f"every run failed (base median {_fmt(c.base_median, '.3f')} {history.metric})"
            elif c.method == NIGHTLY:
                what = (f"{_moved(c, history.metric)}{_judged(c)}; nightly spread {_fmt(c.spread_pct, '.1f')}%, "
                        f"p={_fmt(c.p_value, '.3g')}, nights {c.n_base}/{c.n_cand})")
            else:
                what = (f"{_moved(c, history.metric)}p={_fmt(c.p_value, '.3g')}, runs {c.n_base}/{c.n_cand}; "
                        f"fewer than {history.min_nights} nights at the level: runs against runs)")
            lines.append(f"  {ch.label} [cell {ch.cell}]: {what} since {since}; against {against}")
    lines.append("method: " + method_text(metrics.get(history.metric).better, history.threshold_pct, history.alpha,
                                          history.min_nights))
    return "\n".join(lines) + "\n"
