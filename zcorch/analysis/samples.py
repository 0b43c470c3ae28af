"""`zcorch.load_samples`: the per-interval samples of the runs (`sample_interval`, the files their newest records
name) as one frame: a row per sample and side, its counters, TCP_INFO, the interval's rates and the run's
parameters (`bytes`: moved so far)."""
from __future__ import annotations

import json
import warnings
from typing import Iterable

import numpy as np
import pandas as pd

from zcorch.analysis.frames import PathLike, _as_dirs, _sweep_names, read_manifest
from zcorch.analysis.load import load
from zcorch.errors import ResultsError
from zcorch.results import setfiles
from zcorch.params import PARAM_KEYS

SAMPLE_COLUMNS = ["t_s", "bytes", "proc_cpu_s", "host_busy_s", "host_softirq_s", "host_idle_s", "tcp_snd_cwnd",
                  "tcp_rtt_us", "tcp_total_retrans"]
DERIVED = ["dt_s", "gbit_s", "proc_cpus", "host_busy_cpus"]
HEAD = ["sweep", "cell", "repeat", "side"]


def _read(d, rel: str) -> list:
    """The samples of one run: d/rel read as a regular file inside the set, bounded (zcorch.results.setfiles)."""
    rows = []
    path = f"{d}/{rel}"
    for lineno, line, _ in setfiles.iter_lines(d, rel, max_records=setfiles.MAX_SAMPLE_RECORDS):
        try:
            row = json.loads(line)
        except ValueError:
            raise ResultsError(f"{path}:{lineno}: not a JSON sample: {line[:80]!r}") from None
        if not isinstance(row, dict) or "side" not in row or "t_s" not in row:
            raise ResultsError(f"{path}:{lineno}: a sample needs `side` and `t_s`")
        rows.append(row)
    return rows


def _per_interval(frame: pd.DataFrame) -> pd.DataFrame:
    """dt_s and the interval rates, within each (sweep, cell, repeat, side), from the previous sample (or t = 0)."""
    keys = ["sweep", "cell", "repeat", "side"]
    frame = frame.sort_values(keys + ["t_s"], kind="stable").reset_index(drop=True)
    grouped = frame.groupby(keys, sort=False)

    def diff(col: str) -> np.ndarray:
        values = pd.to_numeric(frame[col], errors="coerce")
        return (values - grouped[col].shift(1).astype("float64").fillna(0.0)).to_numpy(dtype="float64")

    dt = diff("t_s")
    with np.errstate(divide="ignore", invalid="ignore"):
        dt = np.where(dt > 0, dt, np.nan)
        frame["dt_s"] = dt
        frame["gbit_s"] = diff("bytes") * 8 / dt / 1e9
        frame["proc_cpus"] = diff("proc_cpu_s") / dt
        frame["host_busy_cpus"] = diff("host_busy_s") / dt
    return frame


def load_samples(path_or_paths: "PathLike | Iterable[PathLike]") -> pd.DataFrame:
    """Every sample of one or several result sets; an empty frame with the columns when no run kept any."""
    dirs = _as_dirs(path_or_paths)
    parts, params = [], []
    for d, sweep in zip(dirs, _sweep_names(dirs)):
        read_manifest(d)
        runs = load(d)
        runs["sweep"] = sweep
        if "samples" not in runs:
            continue
        # the run's parameters, but `bytes` (the run's total) would clash with the samples' bytes moved
        params = [p for p in PARAM_KEYS if p in runs and p not in SAMPLE_COLUMNS] or params
        for _, run in runs[runs["samples"].notna()].iterrows():
            try:
                rows = _read(d, str(run["samples"]))
            except ResultsError as exc:  # a link, a path out of the set: those samples are not read
                warnings.warn(str(exc), setfiles.SkippedWarning, stacklevel=2)
                continue
            if not rows:
                continue
            part = pd.DataFrame.from_records(rows)
            part["sweep"], part["cell"], part["repeat"] = sweep, run["cell"], int(run["repeat"])
            for p in params:
                part[p] = run[p]
            parts.append(part)
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=object if c in ("sweep", "cell", "side") else "float64")
                             for c in HEAD + SAMPLE_COLUMNS + DERIVED + params})
    frame = pd.concat(parts, ignore_index=True)
    for col in SAMPLE_COLUMNS:
        if col not in frame:
            frame[col] = np.nan
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    frame = _per_interval(frame)
    rest = [c for c in frame.columns if c not in HEAD + SAMPLE_COLUMNS + DERIVED + params]
    return frame[HEAD + SAMPLE_COLUMNS + DERIVED + params + rest]
