"""`zcorch.load`: one row per run of one or several result sets, through the runs.parquet cache.

The order of the analysis modules: frames (parse result-set files into frames) <- cache (runs.parquet,
built from the frames parser) <- load (the public entry point that prefers the cache).
"""
from __future__ import annotations

from typing import Iterable

import pandas as pd

from zcorch.analysis.cache import runs_of
from zcorch.errors import ResultsError
from zcorch.analysis.frames import (PathLike, _as_dirs, _sweep_names, add_copy_units, add_derived, copy_yardsticks,
                                    read_meta)


def load(path_or_paths: "PathLike | Iterable[PathLike]", cache: bool = True) -> pd.DataFrame:
    """One row per run of one or several result sets (concatenated, `sweep` = directory name), with the
    derived columns (zcorch.analysis.frames) and the copy units of each sweep's calibration (meta.json)."""
    dirs = _as_dirs(path_or_paths)
    frames = []
    yardsticks = {}
    for d, sweep in zip(dirs, _sweep_names(dirs)):
        frame = runs_of(d, cache=cache)
        # one concat, not frame.insert: the frame is hundreds of columns built one by one (fragmented)
        frames.append(pd.concat([pd.Series(sweep, index=frame.index, name="sweep"), frame], axis=1))
        try:
            yardsticks[sweep] = copy_yardsticks(read_meta(d))
        except ResultsError:  # a broken meta.json costs the copy units only, never the runs
            yardsticks[sweep] = copy_yardsticks({})
    frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    return add_copy_units(add_derived(frame), yardsticks)
