"""`zcorch.load`: one row per run of one or several result sets, through the runs.parquet cache.

The order of the analysis modules: frames (parse result-set files into frames) <- cache (runs.parquet,
built from the frames parser) <- load (the public entry point that prefers the cache).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd

from zcorch.analysis.cache import runs_of
from zcorch.config.sections import linked_axes_of
from zcorch.errors import ResultsError, ZcorchError
from zcorch.analysis.frames import (LINKED_ATTR, PathLike, _as_dirs, _sweep_names, add_copy_units, add_derived,
                                    add_linked_axes, copy_yardsticks, read_experiment_text, read_manifest,
                                    read_meta)


def load(path_or_paths: "PathLike | Iterable[PathLike]", cache: bool = True) -> pd.DataFrame:
    """One row per run of one or several result sets (concatenated, `sweep` = directory name), with the
    derived columns (zcorch.analysis.frames), the copy units of each sweep's calibration (meta.json) and a
    column per linked axis of each sweep's experiment (frames.add_linked_axes; `frame.attrs["linked_axes"]`)."""
    dirs = _as_dirs(path_or_paths)
    frames = []
    yardsticks = {}
    linked: dict = {}
    for d, sweep in zip(dirs, _sweep_names(dirs)):
        frame = runs_of(d, cache=cache)
        # one concat, not frame.insert: the frame is hundreds of columns built one by one (fragmented)
        frame = pd.concat([pd.Series(sweep, index=frame.index, name="sweep"), frame], axis=1)
        frame = add_linked_axes(frame, experiment_axes(d))
        for name, info in frame.attrs.get(LINKED_ATTR, {}).items():
            seen = linked.setdefault(name, {"params": info["params"], "labels": []})
            seen["labels"] += [x for x in info["labels"] if x not in seen["labels"]]
        frame.attrs = {}
        frames.append(frame)
        try:
            yardsticks[sweep] = copy_yardsticks(read_meta(d))
        except ResultsError:  # a broken meta.json costs the copy units only, never the runs
            yardsticks[sweep] = copy_yardsticks({})
    frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    frame = add_copy_units(add_derived(frame), yardsticks)
    frame.attrs[LINKED_ATTR] = linked
    return frame


def experiment_axes(path: PathLike) -> list:
    """The linked axes of a result set's experiment (its stored experiment.yaml; [] when it has none, or the
    file is missing or cannot be read: the runs then go without the axis columns)."""
    d = Path(path)
    try:
        exp_file, text = read_experiment_text(d, read_manifest(d))
        return linked_axes_of(text, str(exp_file)) if text is not None else []
    except (OSError, ZcorchError):
        return []
