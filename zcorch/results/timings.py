"""What an earlier result set took, for `zcorch plan --timings DIR`: `learn(DIR) -> zcorch.plan.Timings`.

From its runs.jsonl and manifest: the transfer rate, a run's cost beyond its transfer, a filesystem's or a
network's switch (the gaps between runs), and the time before the first run and after the last.
"""
from __future__ import annotations

import os
import statistics
from datetime import datetime
from typing import Dict, List, Optional

from zcorch.errors import ConfigError
from zcorch.config.timings import Timings, switch_keys
from zcorch.results.store import RUNS, load_manifest, read_jsonl


def _when(text: object) -> Optional[float]:
    try:
        return datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return None


def learn(directory: str) -> Timings:
    """The Timings of the result set in `directory` (ConfigError naming what is missing)."""
    manifest = load_manifest(directory)
    runs = [r for r in read_jsonl(os.path.join(directory, RUNS)) if _when(r.get("started")) is not None]
    runs.sort(key=lambda r: _when(r["started"]))
    if len(runs) < 2:
        raise ConfigError(f"--timings {directory}: fewer than 2 runs recorded: nothing to learn a sweep's pace from")
    start = [_when(r["started"]) for r in runs]
    wall = [float(r.get("wall_s") or 0.0) for r in runs]
    rates = [r["receiver"]["bytes"] / w for r, w in zip(runs, wall)
             if r.get("status") == "ok" and w > 0 and (r.get("receiver") or {}).get("bytes")
             and not (r.get("params") or {}).get("duration")]
    plain: List[float] = []
    switches: Dict[str, List[float]] = {}
    for i, key in enumerate(switch_keys([r.get("params") or {} for r in runs])):
        if i == 0:
            continue
        gap = start[i] - start[i - 1] - wall[i - 1]
        (switches.setdefault(key, []) if key else plain).append(gap)
    per_run = statistics.median(plain) if plain else min(g for gaps in switches.values() for g in gaps)
    # the first configuration's set-up happened before the first run: in `before`, as in the plan's first switch
    created, finished = _when(manifest.get("created")), _when(manifest.get("finished"))
    before = max(0.0, start[0] - created) if created is not None else 0.0
    after = max(0.0, finished - start[-1] - wall[-1]) if finished is not None else 0.0
    first = runs[0].get("params") or {}
    first_keys = [f"{axis}={first.get(axis)}" for axis in ("filesystem", "network") if first.get(axis)]
    setup = {key: max(0.0, statistics.median(gaps) - per_run) for key, gaps in switches.items()}
    return Timings(source=os.path.abspath(directory), rate=statistics.median(rates) if rates else None,
                   per_run=max(0.0, per_run), setup=setup, before=before, after=after,
                   first=tuple(first_keys))
