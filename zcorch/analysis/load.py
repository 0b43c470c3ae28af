"""`zcorch.load`: one row per run of one or several result sets, through the runs.parquet cache."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd

from zcorch.analysis.cache import runs_of
from zcorch.params import PARAM_KEYS
from zcorch.errors import ResultsError, ZcorchError
from zcorch.analysis.frames import (LINKED_ATTR, PathLike, _as_dirs, _sweep_names, add_control_ratios,
                                    add_copy_units, add_derived, add_linked_axes, control_of, copy_yardsticks,
                                    read_experiment_text, read_manifest, read_meta)


def load(path_or_paths: "PathLike | Iterable[PathLike]", cache: bool = True) -> pd.DataFrame:
    """One row per run of one or several result sets (`sweep` = directory name), with the derived columns, copy
    units, ratios to the control and a column per linked axis (`frame.attrs["linked_axes"]`)."""
    dirs = _as_dirs(path_or_paths)
    frames = []
    linked: dict = {}
    for d, sweep in zip(dirs, _sweep_names(dirs)):
        frame, complete = runs_of(d, cache=cache)
        if not complete:  # derived per set, as the cache stores them (runs.parquet without zcorch)
            try:
                yardsticks = copy_yardsticks(read_meta(d))
            except ResultsError:  # a broken meta.json costs the copy units only, never the runs
                yardsticks = copy_yardsticks({})
            frame = add_control_ratios(add_copy_units(add_derived(frame), {None: yardsticks}),
                                       control_of(read_manifest(d), d))
        # one concat, not frame.insert: the frame is hundreds of columns built one by one (fragmented)
        frame = pd.concat([pd.Series(sweep, index=frame.index, name="sweep"), frame], axis=1)
        frame = add_linked_axes(frame, experiment_axes(d))
        for name, info in frame.attrs.get(LINKED_ATTR, {}).items():
            seen = linked.setdefault(name, {"params": info["params"], "labels": []})
            seen["labels"] += [x for x in info["labels"] if x not in seen["labels"]]
        frame.attrs = {}
        frames.append(frame)
    frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    frame.attrs[LINKED_ATTR] = linked
    return frame


def experiment_axes(path: PathLike) -> list:
    """The linked axes of a result set's stored experiment ([] when none, or the file cannot be read)."""
    d = Path(path)
    try:
        exp_file, text = read_experiment_text(d, read_manifest(d))
        if text is None or not _may_link_axes(text):
            return []
        # the experiment validator (costly imports) only for a matrix that may link axes
        from zcorch.config.sections import linked_axes_of

        return linked_axes_of(text, str(exp_file))
    except (OSError, ZcorchError):
        return []


def _may_link_axes(text: str) -> bool:
    """Whether an experiment's `matrix:` has a key that is not a parameter (a linked axis); True when in doubt."""
    import yaml

    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        return True
    if not isinstance(doc, dict) or doc.get("matrix") is None:
        return not isinstance(doc, dict)  # no matrix: no linked axis
    matrix = doc["matrix"]
    return not isinstance(matrix, dict) or any(key not in PARAM_KEYS for key in matrix)
