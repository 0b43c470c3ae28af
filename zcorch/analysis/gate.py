"""The verdict of a regression gate (`zcorch compare`, `zcorch history --check`) and its exit code: 0 no regression
(every planned cell measured, none regressed, each able to see the threshold), 1 regression (wins over 3), 2 input
error, 3 cannot tell, with one line why (docs/nightly.md). Pure functions; no pandas."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence

from zcorch.results.convergence import RepeatPolicy, incomplete_cells, policy_from_record
from zcorch.results.store import PLAN, RUNS, latest_runs, load_manifest, read_jsonl

# The defaults of `zcorch compare`'s --threshold and --alpha (runs against runs).
DEFAULT_THRESHOLD_PCT = 5.0
DEFAULT_ALPHA = 0.05
# The defaults of `zcorch history` (chosen in docs/nightly.md); here so that the command line needs no numpy.
HISTORY_THRESHOLD_PCT = 3.0
HISTORY_ALPHA = 0.007
HISTORY_MIN_NIGHTS = 3      # nights at the stable level to judge by their spread

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_INPUT = 2
EXIT_INCOMPLETE = 3
EXIT_CANNOT_TELL = EXIT_INCOMPLETE
VERDICTS = {EXIT_OK: "no regression", EXIT_REGRESSION: "regression", EXIT_INPUT: "usage or input error",
            EXIT_CANNOT_TELL: "cannot tell"}
# The verdicts of one cell: two measured changes, an all-clear the data could have refused, and neither
REGRESSED, IMPROVED, UNCHANGED, CANNOT_TELL, FAILED = "regressed", "improved", "unchanged", "cannot tell", "failed"
POWER = 0.8   # the power at which a cell's minimum detectable change is stated
_MAX_NAMED = 4  # cells named in a reason line before "and N more"


def cell_verdict(change_pct: float, p_value: float, alpha: float, threshold_pct: float, detectable_pct: float,
                 worse: bool) -> str:
    """The verdict of one judged cell: beyond the threshold and significant, `regressed` or `improved`; within it,
    `unchanged` only when a change of the threshold was detectable; else (and on NaN) `cannot tell`."""
    if not abs(change_pct) <= threshold_pct:          # beyond, or NaN
        if abs(change_pct) > threshold_pct and p_value < alpha:
            return REGRESSED if worse else IMPROVED
        return CANNOT_TELL
    return UNCHANGED if detectable_pct <= threshold_pct else CANNOT_TELL


def format_detectable(pct: float) -> str:
    """'≥ 7.1%' / 'none' (never significant at these counts) / '–' (not judged)."""
    if pct != pct:
        return "–"
    if pct == float("inf"):
        return "none"
    return f"≥ {pct:.2g}%" if pct < 10 else f"≥ {pct:.0f}%"


def sees(pct: float) -> str:
    """The detectable change in words: 'could see changes ≥ 7.1%'."""
    if pct != pct:
        return "what it could see is unknown"
    if pct == float("inf"):
        return "could see no change at all (too few runs or nights to ever be significant)"
    return f"could see changes {format_detectable(pct)}"


@dataclass(frozen=True)
class CellJudged:
    """What a gate needs of one judged cell (a row of compare's table, a history cell's comparison)."""
    label: str
    verdict: str
    change_pct: float = float("nan")
    p_value: float = float("nan")
    detectable_pct: float = float("nan")
    needs: str = ""

    def why_cannot_tell(self) -> str:
        """'write→read: −12.0%, p=0.1, could see changes ≥ 25%; needs ≥ 9 runs a side'."""
        parts = []
        if self.change_pct == self.change_pct:
            parts.append(f"{self.change_pct:+.1f}%" + (f", p={self.p_value:.2g}" if self.p_value == self.p_value
                                                        else ""))
        parts.append(sees(self.detectable_pct))
        text = f"{self.label}: {', '.join(parts)}"
        return text + (f"; needs {self.needs}" if self.needs else "")


@dataclass(frozen=True)
class Gate:
    """The overall answer of a gate: exit code, one-line reason and the largest detectable change of its cells."""

    code: int
    reason: str
    detectable_pct: float = float("nan")

    @property
    def verdict(self) -> str:
        return VERDICTS[self.code]

    def line(self, prog: str) -> str:
        """'zcorch compare: cannot tell: no cell in common ...' (what the command prints last)."""
        return f"{prog}: {self.verdict}: {self.reason}"

    def as_dict(self) -> dict:
        d = self.detectable_pct
        return {"verdict": self.verdict, "exit_code": self.code, "reason": self.reason,
                "detectable_pct": None if d != d else (None if d == float("inf") else d),
                "detectable": format_detectable(d)}


@dataclass(frozen=True)
class Completeness:
    """How much of its plan a result set measured: planned (cell, repeat) runs, those ok, per cell, and its status."""

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
                 labels: "Optional[dict]" = None, judged: "Sequence[CellJudged]" = ()) -> Gate:
    """The gate of `zcorch compare`: `verdicts` (cell, verdict) of its table, `judged` its cells of both sides."""
    labels = labels or {}
    rows = list(verdicts)
    common = [c for c, v in rows
              if v not in ("only in base", "only in candidate", "no base data", "failed", "fixed", "control")]
    regressed = [labels.get(c, c) for c, v in rows if v == "regressed"]
    incomplete: List[str] = _cannot_tell(judged)
    if not common:
        incomplete.append(f"no cell measured on both sides (base {len(base.cells_planned)} cells planned, "
                          f"candidate {len(cand.cells_planned)})")
    incomplete += [said for said in (base.describe("base"), cand.describe("candidate")) if said]
    for word, said in (("only in base", "only in base"), ("only in candidate", "only in candidate"),
                       ("failed", "with no ok run in the candidate")):
        cells = [labels.get(c, c) for c, v in rows if v == word]
        if cells:
            incomplete.append(f"{len(cells)} cell(s) {said}: {_named(cells)}")
    return _decide(regressed, incomplete, f"{len(common)} cell(s) compared", judged)


def _cannot_tell(judged: "Sequence[CellJudged]") -> List[str]:
    """The reason line of the cells that cannot be told, worst first, with what would decide each."""
    cells = [c for c in judged if c.verdict == CANNOT_TELL]
    if not cells:
        return []
    cells.sort(key=lambda c: -(c.detectable_pct if c.detectable_pct == c.detectable_pct else float("inf")))
    shown = "; ".join(c.why_cannot_tell() for c in cells[:_MAX_NAMED])
    more = f"; and {len(cells) - _MAX_NAMED} more" if len(cells) > _MAX_NAMED else ""
    return [f"{len(cells)} cell(s) cannot tell: {shown}{more}"]


def worst_detectable(judged: "Sequence[CellJudged]") -> float:
    """The largest detectable change of the cells judged unchanged or undecided (NaN with none)."""
    values = [c.detectable_pct for c in judged
              if c.verdict in (UNCHANGED, CANNOT_TELL) and c.detectable_pct == c.detectable_pct]
    return max(values) if values else float("nan")


def _decide(regressed: List[str], incomplete: List[str], ok_reason: str,
            judged: "Sequence[CellJudged]" = ()) -> Gate:
    worst = worst_detectable(judged)
    if regressed:
        reason = f"{len(regressed)} cell(s) regressed: {_named(regressed)}"
        if incomplete:
            reason += "; also cannot tell: " + "; ".join(incomplete)
        return Gate(EXIT_REGRESSION, reason, worst)
    if incomplete:
        return Gate(EXIT_CANNOT_TELL, "; ".join(incomplete), worst)
    return Gate(EXIT_OK, f"{ok_reason}; {sees(worst)}" if judged else ok_reason, worst)


def experiment_gates(experiments: Sequence) -> "tuple[Gate, dict]":
    """(the gate of them all, {experiment name: its own gate}), each experiment's files read once."""
    parts = {exp.name: _experiment_parts(exp) for exp in experiments}
    return _combine(list(parts.values()), len(experiments)), {n: _combine([p], 1) for n, p in parts.items()}


def _experiment_parts(exp) -> "tuple[List[str], List[str], List[CellJudged], int]":
    """(regressed cells, what cannot be told, the cells judged, how many were compared) of one experiment."""
    regressed: List[str] = []
    incomplete: List[str] = []
    judged: List[CellJudged] = []
    compared = 0
    comp = exp.newest.completeness()   # from its files, or what an exported dataset recorded of them
    if comp.describe("newest sweep"):
        incomplete.append(f"{exp.name}: {comp.describe('newest sweep')}")
    if len(exp.sweeps) < 2:
        incomplete.append(f"{exp.name}: one sweep only, nothing earlier to compare with")
    last = len(exp.sweeps) - 1
    # a cell the sweep before measured and the newest has not (one dropped long ago is no hole)
    missing = [ch.label for ch in exp.cells if last >= 1 and ch.present(last - 1) and not ch.present(last)]
    if missing:
        incomplete.append(f"{exp.name}: {len(missing)} cell(s) of the previous sweep missing from the newest: "
                          f"{_named(missing)}")
    for ch in exp.cells:
        c = ch.comparison
        if c is None:
            continue
        if c.verdict == FAILED:
            incomplete.append(f"{exp.name} {ch.label}: no ok run in the newest sweep")
            continue
        detectable = getattr(c, "detectable_pct", float("nan"))
        verdict = c.verdict
        if verdict == UNCHANGED and detectable != detectable:   # an all-clear needs what it could have seen
            verdict = CANNOT_TELL
        judged.append(CellJudged(f"{exp.name} {ch.label}", verdict, c.change_pct, c.p_value, detectable,
                                 getattr(c, "needs", "") or ("a detectable change" if verdict != c.verdict else "")))
        if c.verdict == REGRESSED:
            regressed.append(f"{exp.name} {ch.label}")
        else:
            compared += 1
    return regressed, incomplete, judged, compared


def _combine(parts: "Sequence[tuple[List[str], List[str], List[CellJudged], int]]", n_experiments: int) -> Gate:
    regressed = [x for p in parts for x in p[0]]
    incomplete = [x for p in parts for x in p[1]]
    judged = [x for p in parts for x in p[2]]
    compared = sum(p[3] for p in parts)
    if not n_experiments:
        incomplete.append("no experiment found")
    incomplete[:0] = _cannot_tell(judged)
    return _decide(regressed, incomplete, f"{compared} cell(s) of {n_experiments} experiment(s) checked", judged)


def describe_codes() -> str:
    """The exit codes in words, for --help texts."""
    return "; ".join(f"{code} {word}" for code, word in VERDICTS.items())

