"""Repeat until stable during a sweep: which planned runs still run, and each cell's state in its records.

The plan lists every cell's repeats up to `max`; the runner asks `wants(cell)` before each run (a converged cell
gets no more). Seeded from the result set's records, so `--resume` continues only unconverged cells.
"""
from __future__ import annotations

from typing import Dict, Iterable, Mapping

from zcorch.results.convergence import CellState, RepeatPolicy, cell_state, run_value
from zcorch.results.store import latest_runs


class Convergence:
    """The cells' values and states of one sweep with a RepeatPolicy."""

    def __init__(self, policy: RepeatPolicy, plan_runs: Iterable[Mapping], records: Iterable[dict] = ()):
        self.policy = policy
        self._values: Dict[str, Dict[int, float]] = {str(r["id"]): {} for r in plan_runs}
        for (cell, repeat), rec in latest_runs(records).items():
            value = run_value(rec)
            if value is not None and cell in self._values:
                self._values[cell][repeat] = value

    def state(self, cell: str) -> CellState:
        return cell_state(list(self._values.get(cell, {}).values()), self.policy)

    def wants(self, cell: str) -> bool:
        """Whether the cell still gets runs: it has not converged."""
        return not self.state(cell).converged

    def observe(self, record: dict) -> None:
        """Count a finished run's value (ok runs only; a re-run replaces its repeat's value) and add the cell's
        state after it to the record, before the record is written."""
        cell, repeat = str(record["cell"]), int(record["repeat"])
        values = self._values.setdefault(cell, {})
        value = run_value(record)
        if value is None:
            values.pop(repeat, None)
        else:
            values[repeat] = value
        record["convergence"] = self.state(cell).as_record()

    def expected(self, ahead: Mapping[str, int]) -> int:
        """Of the runs not reached yet (`ahead`: cell -> how many), those that will run: every one of a cell
        that has not converged (it may still stop early: this is the most the sweep can still take)."""
        return sum(n for cell, n in ahead.items() if n > 0 and self.wants(cell))

    def states(self) -> Dict[str, CellState]:
        return {cell: self.state(cell) for cell in self._values}
