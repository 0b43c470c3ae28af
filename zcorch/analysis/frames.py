"""Result sets as tidy pandas frames: one row per run (cell, repeat, status, every parameter, the workers' metrics
prefixed `send_`/`recv_`) and the derived columns zcorch.metrics declares (docs/experiment-files.md), computed by
zcorch.results.rates; runs.jsonl is read through the Parquet cache when that matches (zcorch.analysis.cache)."""
from __future__ import annotations

import json
import os
import warnings
from itertools import chain
from pathlib import Path
from typing import Any, Iterable, Optional, Union

import numpy as np
import pandas as pd

from zcorch import metrics
from zcorch.config.baselines.registry import rate_of
from zcorch.nogc import no_cyclic_gc
from zcorch.params import HOST_BUSY_FIELDS, METRIC_KEYS, PARAM_KEYS
from zcorch.results import rates, setfiles
from zcorch.results import store as results
from zcorch.errors import ResultsError

PathLike = Union[str, os.PathLike]

# Keys of a worker's result line that are not metrics (`refused`: counted by refused_connections)
_NOT_METRICS = {"event", "side", "mode", "params", "refused"}
RUN_COLUMNS = ["cell", "repeat", "status", "reason"]
RUN_TAIL_COLUMNS = ["started", "wall_s", "log"]
OK = "ok"


# Result-set files


def result_dir(path: PathLike) -> Path:
    """The result-set directory for a directory or a file inside it (e.g. its runs.jsonl)."""
    p = Path(path)
    if p.is_file():
        p = p.parent
    if not p.is_dir():
        raise ResultsError(f"{path}: no such result set (directory not found)")
    return p


def read_manifest(path: PathLike) -> dict:
    """manifest.json of a result set; ResultsError naming an unknown format version."""
    return results.load_manifest(str(result_dir(path)))


load_manifest = read_manifest   # the public name (`zcorch.load_manifest`)


def read_experiment_text(d: Path, manifest: dict) -> "tuple[Path, Optional[str]]":
    """(path, text) of a result set's experiment file; text None when missing, not a regular file inside, or large."""
    rel = str(manifest.get("experiment_file") or results.EXPERIMENT)
    try:
        return d / rel, setfiles.read_text(d, rel)
    except (OSError, ResultsError) as exc:
        if not isinstance(exc, FileNotFoundError):
            warnings.warn(str(exc), setfiles.SkippedWarning, stacklevel=2)
        return d / rel, None


def _sweep_names(dirs: list) -> list:
    """Short, unique names for result sets: their directory names, or full paths when those clash."""
    names = [d.name for d in dirs]
    return names if len(set(names)) == len(names) else [str(d) for d in dirs]


def _as_dirs(path_or_paths: "PathLike | Iterable[PathLike]") -> list:
    paths = [path_or_paths] if isinstance(path_or_paths, (str, os.PathLike)) else list(path_or_paths)
    if not paths:
        raise ResultsError("no result set given")
    return [result_dir(p) for p in paths]


# Runs


def _scalar(value):
    """Values that fit a column cell; lists/dicts (not expected in parameters) become JSON text."""
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True)
    return value


_EMPTY: dict = {}
_PLAIN_TYPES = frozenset((str, int, float, bool, type(None)))
_NESTED = {"params", "sender", "receiver"}
_HEAD = ("cell", "repeat", "status", "reason")


def _layout(shape: tuple) -> "list[tuple[str, int]]":
    """(column, index into the record's value tuple (*rec, *params, *sender, *receiver values)) for records of one
    key layout `shape`. Of two sources of one column the later wins: other run facts, cell/repeat/status/reason,
    parameters, started/wall_s/log, worker metrics (send_*, recv_*)."""
    top, params, sender, receiver = shape
    extra, head, tail, cols = {}, {}, {}, {}
    for i, key in enumerate(top):
        if key in _NESTED:
            continue
        (head if key in _HEAD else tail if key in RUN_TAIL_COLUMNS else extra)[key] = i
    base = len(top)
    cols.update(extra)
    cols.update(head)
    cols.update({key: base + i for i, key in enumerate(params)})
    cols.update(tail)
    base += len(params)
    for keys, prefix in ((sender, "send_"), (receiver, "recv_")):
        cols.update({prefix + key: base + i for i, key in enumerate(keys) if key not in _NOT_METRICS})
        base += len(keys)
    return list(cols.items())


def _column_order(columns: Iterable[str]) -> list:
    cols = set(columns)
    order = [c for c in RUN_COLUMNS if c in cols]
    params = [c for c in PARAM_KEYS if c in cols]
    tail = [c for c in RUN_TAIL_COLUMNS if c in cols]
    metrics = []
    for prefix in ("send_", "recv_"):
        known = [prefix + m for m in METRIC_KEYS if prefix + m in cols]
        metrics += known
        metrics += sorted(c for c in cols if c.startswith(prefix) and c not in known and c not in params)
    taken = set(order + params + tail + metrics)
    extra = sorted(cols - taken)  # parameters unknown to this version, other run facts
    return order + params + extra + tail + metrics


CHUNK_ROWS = 50_000


def _iter_records(path: Path):
    """(line number, record) of runs.jsonl (store.iter_jsonl), each record checked to be a JSON object."""
    for lineno, rec in results.iter_jsonl(str(path)):
        if not isinstance(rec, dict):
            raise ResultsError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
        yield lineno, rec


def _numeric_if_possible(frame: pd.DataFrame) -> pd.DataFrame:
    """Metric columns of numbers that concatenated as object (null in some chunks) as numbers again."""
    for col in frame.columns:
        s = frame[col]
        if s.dtype != object or not (col.startswith("send_") or col.startswith("recv_")):
            continue
        values = s.dropna()
        if len(values) and all(v.__class__ in (int, float) for v in values):
            frame[col] = pd.to_numeric(s)
        elif not len(values):
            frame[col] = s.astype("float64")
    return frame


def _group_frame(shape: tuple, positions: list, values: list) -> pd.DataFrame:
    """The rows of one key layout as a frame indexed by their position in the file, built and typed in C; only
    object columns are scanned for the rare nested value."""
    width = len(values[0])
    block = np.fromiter(chain.from_iterable(values), dtype=object, count=len(values) * width)
    block = block.reshape(len(values), width)
    layout = _layout(shape)
    frame = pd.DataFrame(block[:, [i for _, i in layout]], columns=[name for name, _ in layout],
                         index=positions).infer_objects()
    for name in frame.columns[frame.dtypes == object]:
        col = frame[name]
        if not _PLAIN_TYPES.issuperset(map(type, col)):
            frame[name] = [_scalar(v) for v in col]
    return frame


def _chunk_frame(groups: dict) -> pd.DataFrame:
    frames = [_group_frame(shape, pos, vals) for shape, (pos, vals) in groups.items()]
    frame = frames[0] if len(frames) == 1 else pd.concat(frames)
    return frame.sort_index(kind="stable") if len(frames) > 1 else frame


def parse_runs(path: Path) -> pd.DataFrame:
    """runs.jsonl → raw frame (no derived columns); the newest record per (cell, repeat) wins, in its order. Records
    are grouped by key layout and kept as value tuples; chunks of CHUNK_ROWS records become frames."""
    with no_cyclic_gc():   # millions of acyclic dicts and tuples (zcorch.nogc)
        return _parse_runs(path)


def _parse_runs(path: Path) -> pd.DataFrame:
    chunks, groups, n = [], {}, 0
    for lineno, rec in _iter_records(path):
        params = rec.get("params") or _EMPTY
        sender = rec.get("sender")
        receiver = rec.get("receiver")
        if params.__class__ is not dict:
            params = _EMPTY
        if sender.__class__ is not dict:
            sender = _EMPTY
        if receiver.__class__ is not dict:
            receiver = _EMPTY
        shape = (tuple(rec), tuple(params), tuple(sender), tuple(receiver))
        group = groups.get(shape)
        if group is None:
            for key in ("cell", "repeat", "status"):
                if key not in rec:
                    raise ResultsError(f"{path}:{lineno}: run record has no {key!r}")
            group = groups[shape] = ([], [])
        group[0].append(n)
        group[1].append((*rec.values(), *params.values(), *sender.values(), *receiver.values()))
        n += 1
        if n % CHUNK_ROWS == 0:
            chunks.append(_chunk_frame(groups))
            groups = {}
    if groups:
        chunks.append(_chunk_frame(groups))
    if not chunks:
        frame = pd.DataFrame({c: pd.Series(dtype=object) for c in RUN_COLUMNS})
        frame["repeat"] = frame["repeat"].astype("int64")
        return frame
    frame = chunks[0] if len(chunks) == 1 else pd.concat(chunks)
    # a column all null in one layout or chunk concatenates as object: typed again from all its values
    frame = _numeric_if_possible(frame.infer_objects())
    for col in RUN_COLUMNS + RUN_TAIL_COLUMNS:
        if col not in frame:
            frame[col] = None
    frame = frame.drop_duplicates(subset=["cell", "repeat"], keep="last")
    frame = frame[_column_order(frame.columns)]
    for col in frame.columns:
        if frame[col].dtype == object:
            frame[col] = frame[col].where(frame[col].notna(), None)
    if "started" in frame:
        frame["started"] = _to_datetime(frame["started"])
    return frame.reset_index(drop=True)


def _to_datetime(s: pd.Series) -> pd.Series:
    try:
        return pd.to_datetime(s, utc=True, format="ISO8601")
    except (ValueError, TypeError):
        return s  # not ISO timestamps: keep the text rather than guess


PAGE = 4096   # the page `*_minflt_per_page` counts in: x86's, and the size the studies' fault counts are of


def add_derived(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with the derived columns of the module docstring (a new frame; the columns of `frame` are shared)."""
    n = len(frame)

    def col(name):
        if name in frame:
            return pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype="float64")
        return np.full(n, np.nan)

    out: dict = {}
    nbytes = col("recv_bytes")
    wall = col("recv_wall_ns")
    use_send = np.isnan(nbytes) | np.isnan(wall) | (wall <= 0)
    nbytes = np.where(use_send, col("send_bytes"), nbytes)
    wall = np.where(use_send, col("send_wall_ns"), wall)
    with np.errstate(divide="ignore", invalid="ignore"):
        wall = np.where(wall > 0, wall, np.nan)
        out["gbit_s"] = rates.gbit_s(nbytes, wall)
        out["mb_s"] = rates.mb_s(nbytes, wall)
        busy, window = {}, {}
        for prefix in ("send_", "recv_"):
            moved = np.where(col(prefix + "bytes") > 0, col(prefix + "bytes"), np.nan)
            out[prefix + "cpu_s_per_gib"] = rates.cpu_s_per_gib(col(prefix + "utime_us"), col(prefix + "stime_us"),
                                                                moved)
        usr, sys_ = col("send_utime_us"), col("send_stime_us")
        out["send_sys_share"] = np.where(usr + sys_ > 0, sys_ / (usr + sys_), np.nan)
        # The host view (every process, interrupt and softirq of the machine, /proc/stat).
        for prefix in ("send_", "recv_"):
            moved = np.where(col(prefix + "bytes") > 0, col(prefix + "bytes"), np.nan)
            busy[prefix] = sum(col(f"{prefix}host_{f}_us") for f in HOST_BUSY_FIELDS) / 1e6
            window[prefix] = col(prefix + "host_window_ns") / 1e9
            out[prefix + "host_busy_s"] = busy[prefix]
            out[prefix + "host_busy_cpus"] = busy[prefix] / np.where(window[prefix] > 0, window[prefix], np.nan)
            out[prefix + "host_busy_s_per_gib"] = rates.per_gib(busy[prefix], moved)
            out[prefix + "host_softirq_s_per_gib"] = rates.per_gib(col(prefix + "host_softirq_us") / 1e6, moved)
            # what the host was busy with before the run (the idle probe), taken out of the window's busy CPU
            background = rates.background_cpus(col(prefix + "host_idle_before"), col(prefix + "host_ncpus"))
            out[prefix + "host_background_cpus"] = background
            out[prefix + "host_steal_cpus"] = col(prefix + "host_steal_us") / 1e6 / np.where(
                window[prefix] > 0, window[prefix], np.nan)
            # never below the worker's own process CPU: on a saturated host the others yield to the transfer,
            # so the background seen before overstates what ran beside it
            process = (col(prefix + "utime_us") + col(prefix + "stime_us")) / 1e6
            own = np.fmax(busy[prefix] - background * window[prefix], np.nan_to_num(process, nan=0.0))
            own = np.where(np.isnan(background), np.nan, own)
            out[prefix + "host_own_s_per_gib"] = rates.per_gib(own, moved)
        for prefix in ("send_", "recv_"):
            pages = np.where(col(prefix + "bytes") > 0, col(prefix + "bytes"), np.nan) / PAGE
            out[prefix + "minflt_per_page"] = col(prefix + "minflt") / pages
        same = same_host_column(frame)
        out["same_host"] = same
        out["host_shared"] = np.nanmax(np.vstack([out["send_host_background_cpus"], out["recv_host_background_cpus"],
                                                  np.full(n, -1.0)]), axis=0) > rates.SHARED_CPUS
        one = np.array([v is True for v in same], dtype=bool)
        for total in metrics.TOTALS:   # total_* of zcorch.metrics: the two sides by the entry's `combine`
            send_v, recv_v = (out[c] if c in out else col(c) for c in total.parts)
            out[total.name] = combine_sides(total.combine, send_v, recv_v, one)
        # one machine: the transfer's own host CPU holds both workers' process CPU at least
        out["total_host_own_s_per_gib"] = np.where(one, np.fmax(out["total_host_own_s_per_gib"],
                                                                out["total_cpu_s_per_gib"]),
                                                   out["total_host_own_s_per_gib"])
        sides = [zip(col(p + "host_ticks"), busy[p], col(p + "host_ncpus"), window[p], col(p + "host_clk_tck"),
                     out[p + "host_background_cpus"]) for p in ("send_", "recv_")]
        out["cpu_resolution"] = [rates.cpu_resolution(pair) for pair in zip(*sides)]
    completions = np.nansum([col("send_zc_completions"), col("recv_zc_completions")], axis=0)
    copied = np.nansum([col("send_zc_copied"), col("recv_zc_copied")], axis=0)
    reported = ~(np.isnan(col("send_zc_completions")) & np.isnan(col("recv_zc_completions")))
    completions = np.where(reported, completions, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["zc_copied_share"] = np.where(completions > 0, copied / completions, np.nan)
    mapped, recv_copied = col("recv_zc_recv_mapped"), col("recv_zc_recv_copied")
    with np.errstate(divide="ignore", invalid="ignore"):
        received = mapped + recv_copied
        out["zc_recv_mapped_share"] = np.where(received > 0, mapped / received, np.nan)
    out["zc_verdict"] = [rates.zc_label(*v) for v in zip(completions, copied, mapped, recv_copied)]
    keep = frame.drop(columns=[c for c in out if c in frame])
    return pd.concat([keep, pd.DataFrame(out, index=frame.index)], axis=1)


def control_of(manifest: dict, path: "Optional[PathLike]" = None) -> "Optional[str | dict]":
    """A result set's control as add_control_ratios takes it (JSON-able: the runs.parquet cache stamps it): a control
    cell's id, or for a baseline {"baseline": kind, "gbit_s": [[repeat, Gbit/s], ...]} from the ok control records
    of set `path`'s baselines.jsonl; None when it declares none."""
    control = manifest.get("control")
    if not isinstance(control, dict):
        return None
    cell, kind = control.get("cell"), control.get("baseline")
    if isinstance(cell, str) and cell:
        return cell
    if not (isinstance(kind, str) and kind) or path is None:
        return None
    return {"baseline": kind, "gbit_s": [[r, v] for r, v in sorted(_control_rates(result_dir(path), kind).items())]}


def _control_rates(d: Path, kind: str) -> "dict[int, float]":
    """repeat -> Gbit/s of the ok control records of baseline `kind` in set `d` (its kind's declared rate)."""
    from zcorch.config.baselines.registry import BY_NAME   # (the registry only for a set that needs it)

    declared = BY_NAME.get(kind)
    out: "dict[int, float]" = {}
    if declared is None:
        return out
    for rec in results.read_jsonl(str(d / results.BASELINES)):   # no file (no baseline yet): no records
        repeat = rec.get("repeat")
        if not (rec.get("control") is True and rec.get("status") == OK and rec.get("kind") in declared.record_kinds
                and isinstance(repeat, int) and not isinstance(repeat, bool)):
            continue
        bps = declared.rate(rec.get("result"))
        if bps is not None and bps > 0:
            out[repeat] = bps / 1e9
    return out


def add_control_ratios(frame: pd.DataFrame, control: "Optional[str | dict]") -> pd.DataFrame:
    """`frame` (one set's runs) with `<metric>_vs_control` per zcorch.metrics.CONTROL_RATIOS: an ok run's value over
    the `control`'s (control_of) of the same repeat, else NaN; a baseline control gives only the metrics it has one
    of (a network baseline has no host CPU per GiB). A new frame; the columns of `frame` are shared."""
    n = len(frame)
    out = {name: np.full(n, np.nan) for name in metrics.CONTROL_RATIOS}
    if control is not None and n and {"cell", "repeat", "status"} <= set(frame.columns):
        ok = (frame["status"] == OK).to_numpy(dtype=bool)
        repeats = frame["repeat"]
        is_control = ok & (frame["cell"] == control).to_numpy(dtype=bool) if isinstance(control, str) else None
        for name, base in metrics.CONTROL_RATIOS.items():
            if base not in frame:
                continue
            values = pd.to_numeric(frame[base], errors="coerce").to_numpy(dtype="float64")
            if is_control is not None:
                # one record per (cell, repeat) in a parsed frame (the newest wins): one control run per repeat
                by_repeat = pd.Series(values[is_control], index=repeats[is_control].to_numpy()).groupby(level=0).last()
            elif control.get(base):
                by_repeat = pd.Series({int(r): float(v) for r, v in control[base]}, dtype="float64")
            else:
                continue
            reference = repeats.map(by_repeat).to_numpy(dtype="float64")
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(ok & (reference > 0), values / reference, np.nan)
            out[name] = ratio
    keep = frame.drop(columns=[c for c in out if c in frame])
    return pd.concat([keep, pd.DataFrame(out, index=frame.index)], axis=1)


def combine_sides(rule: str, send: np.ndarray, recv: np.ndarray, same_host: np.ndarray) -> np.ndarray:
    """Per run, a metric's total over both sides by its `combine` rule: "sum"; "host" takes the larger where both ran
    on one machine (one /proc/stat: adding would count it twice)."""
    if rule == "sum":
        return send + recv
    if rule == "host":
        return np.where(same_host, np.fmax(send, recv), send + recv)
    raise ValueError(f"unknown rule {rule!r} to combine the sides (zcorch.metrics COMBINE)")


LINKED_ATTR = "linked_axes"  # frame.attrs[LINKED_ATTR]: {axis name: {"params": [...], "labels": [...]}}


def add_linked_axes(frame: pd.DataFrame, axes: list) -> pd.DataFrame:
    """`frame` with a column per linked axis (zcorch.config.experiment.Axis) holding each run's label, before the
    axis's first parameter, the axes recorded in `frame.attrs[LINKED_ATTR]`; computed from the parameters, never
    stored (the set's experiment.yaml names them)."""
    info = dict(frame.attrs.get(LINKED_ATTR) or {})
    for axis in axes:
        cols = list(axis.params)
        if not len(frame) or any(c not in frame for c in cols):
            continue
        combos = frame[cols].drop_duplicates()
        combos[axis.key + "\0label"] = [axis.label_of(dict(zip(cols, row)))
                                        for row in combos.itertuples(index=False, name=None)]
        labels = frame[cols].merge(combos, on=cols, how="left")[axis.key + "\0label"].to_numpy(dtype=object)
        if axis.key in frame:
            frame = frame.drop(columns=[axis.key])
        at = int(frame.columns.get_loc(cols[0]))
        frame = pd.concat([frame.iloc[:, :at], pd.DataFrame({axis.key: labels}, index=frame.index), frame.iloc[:, at:]],
                          axis=1)  # one new block (an insert into a wide frame fragments it)
        known = info.get(axis.key, {"params": cols, "labels": []})
        extra = sorted(set(labels) - set(axis.labels) - set(known["labels"]))
        info[axis.key] = {"params": cols, "labels": known["labels"] + [x for x in axis.labels + extra
                                                                          if x not in known["labels"]]}
    frame.attrs[LINKED_ATTR] = info
    return frame


def same_host_column(frame: pd.DataFrame) -> list:
    """Per run whether both workers ran on one kernel (equal host_boot_id, else the record's `same_host`), or None."""
    n = len(frame)
    recorded = list(frame["same_host"]) if "same_host" in frame else [None] * n
    both = "send_host_boot_id" in frame and "recv_host_boot_id" in frame
    sends, recvs = (frame["send_host_boot_id"], frame["recv_host_boot_id"]) if both else ([None] * n, [None] * n)
    return [bool(a == b) if isinstance(a, str) and isinstance(b, str) and a and b else
            bool(r) if isinstance(r, (bool, np.bool_)) else None for a, b, r in zip(sends, recvs, recorded)]


def copy_yardsticks(meta: dict) -> dict:
    """{"sender": s, "receiver": s}: CPU seconds one memcpy of a GiB costs on each host (NaN: not calibrated)."""
    hosts = meta.get("hosts") or {}
    values = {role: ((hosts.get(role) or {}).get("calibration") or {}).get("memcpy_s_per_gib")
              for role in ("sender", "receiver")}
    return {role: float(v) if isinstance(v, (int, float)) and v > 0 else np.nan for role, v in values.items()}


def add_copy_units(frame: pd.DataFrame, yardsticks: dict) -> pd.DataFrame:
    """The copy-unit columns of the module docstring; `yardsticks`: {sweep: copy_yardsticks(meta)}."""
    sweeps = frame["sweep"] if "sweep" in frame else pd.Series([None] * len(frame), index=frame.index)
    # A few sweeps among a million rows: look each up once, then index (codes -1, a missing sweep: None's).
    codes, uniques = pd.factorize(sweeps.astype(object))
    keys = list(uniques) + [None]
    out = {}
    for prefix, role in (("send_", "sender"), ("recv_", "receiver")):
        copy = np.array([yardsticks.get(k, {}).get(role, np.nan) for k in keys], dtype="float64")[codes]
        out[prefix + "copy_s_per_gib"] = copy
        for what, source in (("cpu", prefix + "cpu_s_per_gib"), ("host_busy", prefix + "host_busy_s_per_gib")):
            values = (pd.to_numeric(frame[source], errors="coerce").to_numpy(dtype="float64") if source in frame
                      else np.full(len(frame), np.nan))
            out[f"{prefix}{what}_copies"] = values / copy
    keep = frame.drop(columns=[c for c in out if c in frame])
    return pd.concat([keep, pd.DataFrame(out, index=frame.index)], axis=1)


# Baselines and metadata


def _flatten(value, prefix: str, out: dict) -> dict:
    if isinstance(value, dict):
        for key, sub in value.items():
            _flatten(sub, f"{prefix}{key}" if not prefix else f"{prefix}.{key}", out)
    else:
        out[prefix] = _scalar(value)
    return out


def _baseline_rate(kind: str, result: Any) -> "tuple[float, float]":
    """(Gbit/s, MB/s) of a baseline record's result, as its registered kind reads it (NaN: none)."""
    bps = rate_of(kind, result)
    return (np.nan, np.nan) if bps is None else (bps / 1e9, bps / 8e6)


def load_baselines(path_or_paths: "PathLike | Iterable[PathLike]") -> pd.DataFrame:
    """One row per baseline record: kind, status, reason, host, `key_*`, `result_*`, and `gbit_s`/`mb_s`."""
    dirs = _as_dirs(path_or_paths)
    rows = []
    for d, sweep in zip(dirs, _sweep_names(dirs)):
        read_manifest(d)
        path = d / "baselines.jsonl"
        for i, rec in enumerate(results.read_jsonl(str(path))):
            if "kind" not in rec:
                raise ResultsError(f"{path}: baseline record {i + 1} has no 'kind'")
            row = {"sweep": sweep, "kind": rec["kind"], "status": rec.get("status"),
                   "reason": rec.get("reason"), "host": rec.get("host"), "started": rec.get("started")}
            row.update({"key_" + k: _scalar(v) for k, v in (rec.get("key") or {}).items()})
            result = rec.get("result")
            if isinstance(result, dict):
                row.update({"result_" + k: v for k, v in _flatten(result, "", {}).items()})
            row["gbit_s"], row["mb_s"] = _baseline_rate(rec["kind"], result)
            rows.append(row)
    columns = ["sweep", "kind", "status", "reason", "host", "started", "gbit_s", "mb_s"]
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype=float if c in ("gbit_s", "mb_s") else object) for c in columns})
    frame = pd.DataFrame.from_records(rows)
    rest = sorted(c for c in frame.columns if c not in columns)
    return frame[columns + rest]


def read_meta(path: PathLike) -> dict:
    """meta.json of one result set as written ({} when the run ended before writing it)."""
    d = result_dir(path)
    read_manifest(d)
    path = d / "meta.json"
    try:
        meta = setfiles.read_json(d, "meta.json")
    except FileNotFoundError:
        return {}
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise ResultsError(f"{path}: expected a JSON object")
    return meta


def load_meta(path_or_paths: "PathLike | Iterable[PathLike]") -> pd.DataFrame:
    """meta.json as rows per (sweep, role: controller, sender, receiver, `filesystem:<name>`), keys dotted."""
    dirs = _as_dirs(path_or_paths)
    rows = []
    for d, sweep in zip(dirs, _sweep_names(dirs)):
        meta = read_meta(d)
        # "previous" (metadata of the hosts before a --resume) is not a role of this sweep
        entries = [("controller", meta["controller"])] if "controller" in meta else []
        entries += list((meta.get("hosts") or {}).items())
        entries += [(f"filesystem:{name}", facts) for name, facts in (meta.get("filesystems") or {}).items()]
        for role, facts in entries:
            row = {"sweep": sweep, "role": role}
            _flatten(facts if isinstance(facts, dict) else {"value": facts}, "", row)
            rows.append(row)
    if not rows:
        return pd.DataFrame({"sweep": pd.Series(dtype=object), "role": pd.Series(dtype=object)})
    return pd.DataFrame.from_records(rows)
