"""The verdict of a regression gate (`zcorch compare`, `zcorch history --check`) and its exit code.

A gate that passes on missing data is worse than no gate: a nightly job whose sweep failed, or whose two
result sets share no cell, must not read as "no regression". So the two gates answer with the same four
codes, each meaning one thing, and one line that says why:

    0  no regression: every cell the plan asked for was measured on both sides, none regressed
    1  regression: a cell measured on both sides is significantly worse (wins over 3: a measured
       regression is reported even when other cells are missing; the reason names both)
    2  usage or input error: a missing or unreadable result set, an unknown metric, a bad option
       (raised as ZcorchError by the command; the code is here so that it is documented once)
    3  incomplete: no cell in common, a side (or the newest sweep) did not complete or has fewer ok runs
       than its plan asked for, a cell missing from one side, or nothing earlier to compare with.
       With `repeats: {min, max, target_ci}` the plan lists every cell up to `max`: a cell that converged
       early is complete (it was not missing runs), one that did not is complete with all `max` ok
       (zcorch.results.convergence, the same rule as the sweep's)

Pure functions of the comparison tables and of each result set's `Completeness`, which reads only the
manifest, the plan and the run records (zcorch.results.store): no pandas needed for that part.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence

from zcorch.results.convergence import RepeatPolicy, incomplete_cells, policy_from_record
from zcorch.results.store import PLAN, RUNS, latest_runs, load_manifest, read_jsonl

# The defaults of `zcorch compare`'s --threshold and --alpha: two sets, runs against runs (two-sided
# Mann–Whitney U; zcorch.analysis.compare).
DEFAULT_THRESHOLD_PCT = 5.0
DEFAULT_ALPHA = 0.05
# The defaults of `zcorch history` (and --check): the newest nights against the spread of nightly medians
# (zcorch.analysis.detector), chosen with benchmarks/bench_detector.py --grid on this machine's real nights
# (docs/nightly.md, "How often it is wrong"). Here, not in the detector: the command line reads them without
# importing numpy.
HISTORY_THRESHOLD_PCT = 3.0
HISTORY_ALPHA = 0.005
HISTORY_MIN_NIGHTS = 3      # earlier nights at the stable level needed to judge by their spread (docs/nightly.md: 2 alarms
                            # less, but two nights give t one degree of freedom: a -75% night is then not significant)

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_INPUT = 2
EXIT_INCOMPLETE = 3
VERDICTS = {EXIT_OK: "no regression", EXIT_REGRESSION: "regression", EXIT_INPUT: "usage or input error",
            EXIT_INCOMPLETE: "incomplete"}
_MAX_NAMED = 4  # cells named in a reason line before "and N more"


@dataclass(frozen=True)
class Gate:
    """The overall answer of a gate: its exit code, the verdict word and the one-line reason."""

    code: int
    reason: str

    @property
    def verdict(self) -> str:
        return VERDICTS[self.code]

    def line(self, prog: str) -> str:
        """'zcorch compare: incomplete: no cell in common ...' (what the command prints last)."""
        return f"{prog}: {self.verdict}: {self.reason}"

    def as_dict(self) -> dict:
        return {"verdict": self.verdict, "exit_code": self.code, "reason": self.reason}


@dataclass(frozen=True)
class Completeness:
    """How much of its plan a result set measured: planned (cell, repeat) runs and those whose newest
    record is ok, per cell too, and the set's status (complete, failed, interrupted, running)."""

    path: str
    status: str
    planned: int
    ok: int
    cells_planned: frozenset
    cells_short: tuple          # cells with fewer ok runs than planned (adaptive: neither converged nor at max), sorted
    repeat_policy: Optional[RepeatPolicy] = None   # manifest "repeats": the set repeats until stable

    @property
    def complete(self) -> bool:
        return self.status == "complete" and not self.cells_short

    def describe(self, side: str) -> str:
        """'candidate runs/b: status failed, 2 of 72 planned runs ok' (empty when complete)."""
        if self.complete:
            return ""
        parts = [] if self.status == "complete" else [f"status {self.status}"]
        if self.cells_short and self.repeat_policy is not None:
            parts.append(f"{len(self.cells_short)} of {len(self.cells_planned)} cells neither converged nor "
                         f"with all {self.repeat_policy.max} repeats ok ({self.ok} runs ok)")
        elif self.cells_short:
            parts.append(f"{self.ok} of {self.planned} planned runs ok")
        return f"{side} {self.path}: {', '.join(parts)}"


def completeness(directory: "str | os.PathLike") -> Completeness:
    """Completeness of one result set (ResultsError if it is not one)."""
    d = os.fspath(directory)
    manifest = load_manifest(d)
    plan = _plan_keys(d)
    latest = latest_runs(read_jsonl(os.path.join(d, RUNS))) if os.path.exists(os.path.join(d, RUNS)) else {}
    ok_keys = {k for k, rec in latest.items() if rec.get("status") == "ok"}
    policy = policy_from_record(manifest.get("repeats"))
    short = sorted(incomplete_cells(({"id": c, "repeat": r} for c, r in plan), latest, policy))
    return Completeness(d, str(manifest.get("status") or "unknown"), len(plan), len(plan & ok_keys),
                        frozenset(cell for cell, _ in plan), tuple(short), policy)


def _plan_keys(directory: str) -> set:
    from zcorch.errors import ResultsError
    from zcorch.results import setfiles

    path = os.path.join(directory, PLAN)
    try:  # a regular file inside the set, bounded (zcorch.results.setfiles)
        runs = setfiles.read_json(directory, PLAN, setfiles.MAX_PLAN_BYTES)
        return {(str(r["id"]), int(r["repeat"])) for r in runs}
    except FileNotFoundError:
        raise ResultsError(f"{directory}: its plan ({PLAN}) is missing: the set cannot say what it should hold") from None
    except (ValueError, TypeError, KeyError) as exc:
        raise ResultsError(f"{path}: not a plan of runs ({exc})") from None


def _named(cells: Sequence[str]) -> str:
    cells = list(cells)
    text = ", ".join(cells[:_MAX_NAMED])
    return text + (f" and {len(cells) - _MAX_NAMED} more" if len(cells) > _MAX_NAMED else "")


def compare_gate(verdicts: "Iterable[tuple[str, str]]", base: Completeness, cand: Completeness,
                 labels: "Optional[dict]" = None) -> Gate:
    """The gate of `zcorch compare`: `verdicts` are (cell, verdict) of zcorch.analysis.compare's table."""
    labels = labels or {}
    rows = list(verdicts)
    common = [c for c, v in rows if v not in ("only in base", "only in candidate", "no base data", "failed", "fixed")]
    regressed = [labels.get(c, c) for c, v in rows if v == "regressed"]
    incomplete: List[str] = []
    if not common:
        incomplete.append(f"no cell measured on both sides (base {len(base.cells_planned)} cells planned, "
                          f"candidate {len(cand.cells_planned)})")
    for side, comp in (("base", base), ("candidate", cand)):
        if comp.describe(side):
            incomplete.append(comp.describe(side))
    for side, word in (("base", "only in base"), ("candidate", "only in candidate")):
        only = [labels.get(c, c) for c, v in rows if v == word]
        if only:
            incomplete.append(f"{len(only)} cell(s) {word}: {_named(only)}")
    failed = [labels.get(c, c) for c, v in rows if v == "failed"]
    if failed:
        incomplete.append(f"{len(failed)} cell(s) with no ok run in the candidate: {_named(failed)}")
    return _decide(regressed, incomplete, f"{len(common)} cell(s) compared")


def _decide(regressed: List[str], incomplete: List[str], ok_reason: str) -> Gate:
    if regressed:
        reason = f"{len(regressed)} cell(s) regressed: {_named(regressed)}"
        if incomplete:
            reason += "; also incomplete: " + "; ".join(incomplete)
        return Gate(EXIT_REGRESSION, reason)
    if incomplete:
        return Gate(EXIT_INCOMPLETE, "; ".join(incomplete))
    return Gate(EXIT_OK, ok_reason)


def history_gate(experiments: Sequence) -> Gate:
    """The gate of `zcorch history --check` over zcorch.analysis.history's ExperimentHistory list: the
    newest sweep of every experiment against its stable level."""
    regressed: List[str] = []
    incomplete: List[str] = []
    compared = 0
    for exp in experiments:
        newest = exp.newest
        comp = newest.completeness()   # from its files, or what an exported dataset recorded of them
        if comp.describe("newest sweep"):
            incomplete.append(f"{exp.name}: {comp.describe('newest sweep')}")
        if len(exp.sweeps) < 2:
            incomplete.append(f"{exp.name}: one sweep only, nothing earlier to compare with")
        last = len(exp.sweeps) - 1
        # a cell the sweep before measured and the newest has not (a cell dropped from the experiment
        # long ago is history, not a hole: only the previous sweep counts)
        missing = [ch.label for ch in exp.cells if last >= 1 and ch.present(last - 1) and not ch.present(last)]
        if missing:
            incomplete.append(f"{exp.name}: {len(missing)} cell(s) of the previous sweep missing from the newest: "
                              f"{_named(missing)}")
        for ch in exp.cells:
            c = ch.comparison
            if c is None:
                continue
            if c.verdict == "regressed":
                regressed.append(f"{exp.name} {ch.label}")
            elif c.verdict == "failed":
                incomplete.append(f"{exp.name} {ch.label}: no ok run in the newest sweep")
            else:
                compared += 1
    if not experiments:
        incomplete.append("no experiment found")
    return _decide(regressed, incomplete, f"{compared} cell(s) of {len(experiments)} experiment(s) checked")


def describe_codes() -> str:
    """The exit codes in words, for --help texts."""
    return "; ".join(f"{code} {word}" for code, word in VERDICTS.items())

