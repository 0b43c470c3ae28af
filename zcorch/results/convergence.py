"""Repeat until stable: when a cell with `repeats: {min, max, target_ci}` has had enough runs
(docs/experiment-files.md). Pure functions of a cell's ok runs, so the sweep, `--resume`, the summary and the
gates decide alike: converged with at least `min` ok runs whose median's 95% interval is within `target_ci`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from zcorch.config.schema import RepeatPolicy
from zcorch.results import rates
from zcorch.results.intervals import CI, ci_width_pct

__all__ = ["CellState", "RepeatPolicy", "cell_state", "cell_states", "incomplete_cells", "policy_from_record",
           "run_value"]


@dataclass(frozen=True)
class CellState:
    """A cell's standing after its runs so far: n ok runs, how far the 95% interval of their median reaches
    (% of the median, inf while there is no 95% interval) and whether that is within the target."""

    n: int
    width_pct: float
    converged: bool

    def as_record(self) -> dict:
        """The `convergence` entry of a run record and the manifest (width_pct null without a 95% interval)."""
        width = None if not math.isfinite(self.width_pct) else round(self.width_pct, 4)
        return {"n": self.n, "width_pct": width, "converged": self.converged}


def run_value(record: Mapping) -> Optional[float]:
    """The value a run adds to its cell: its throughput in Gbit/s as the receiver saw it; None for a run
    that is not ok or lacks the receiver's bytes and wall time."""
    if record.get("status") != "ok":
        return None
    recv = record.get("receiver") or {}
    nbytes, wall = recv.get("bytes"), recv.get("wall_ns")
    if not nbytes or not wall:
        return None
    return rates.gbit_s(nbytes, wall)


def cell_state(values: Sequence[float], policy: Optional[RepeatPolicy]) -> CellState:
    """The state of a cell with these ok values (a fixed `repeats: N`: policy None, never converged)."""
    width = ci_width_pct(values, CI)
    converged = policy is not None and len(values) >= policy.min and width <= policy.target_ci
    return CellState(len(values), width, converged)


def _values(plan_runs: Iterable[Mapping], latest: Mapping[Tuple[str, int], Mapping]
            ) -> "Tuple[Dict[str, List[float]], Dict[str, List[int]]]":
    values: Dict[str, List[float]] = {}
    repeats: Dict[str, List[int]] = {}
    for run in plan_runs:
        cell, repeat = str(run["id"]), int(run["repeat"])
        repeats.setdefault(cell, []).append(repeat)
        values.setdefault(cell, [])
        rec = latest.get((cell, repeat))
        v = run_value(rec) if rec is not None else None
        if v is not None:
            values[cell].append(v)
    return values, repeats


def cell_states(plan_runs: Iterable[Mapping], latest: Mapping[Tuple[str, int], Mapping],
                policy: Optional[RepeatPolicy]) -> Dict[str, CellState]:
    """{cell: CellState} from the newest record of each planned (cell, repeat) (zcorch.results.store.latest_runs)."""
    values, _ = _values(plan_runs, latest)
    return {cell: cell_state(v, policy) for cell, v in values.items()}


def incomplete_cells(plan_runs: Iterable[Mapping], latest: Mapping[Tuple[str, int], Mapping],
                     policy: Optional[RepeatPolicy]) -> Dict[str, int]:
    """{cell: planned repeats not ok} of the cells that are not complete: neither converged nor with every
    planned repeat ok (module docstring). A fixed `repeats: N` (policy None): every cell short of N ok runs."""
    plan_runs = list(plan_runs)
    values, repeats = _values(plan_runs, latest)
    out = {}
    for cell, reps in repeats.items():
        if cell_state(values[cell], policy).converged:
            continue
        missing = sum(1 for r in reps if (latest.get((cell, r)) or {}).get("status") != "ok")
        if missing:
            out[cell] = missing
    return out


def policy_from_record(data: Optional[Mapping]) -> Optional[RepeatPolicy]:
    """The RepeatPolicy of a manifest's "repeats" (None: a fixed count, or an older set)."""
    if not isinstance(data, Mapping):
        return None
    try:
        return RepeatPolicy(int(data["min"]), int(data["max"]), float(data["target_ci"]))
    except (KeyError, TypeError, ValueError):
        return None
