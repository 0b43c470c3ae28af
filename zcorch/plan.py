"""Expansion: a validated Experiment -> an ordered Plan of cells and runs. Pure (no I/O, no clock).
A cell's id hashes its parameters' canonical JSON, so results match across edits, resumed sweeps and versions;
excluded and (with `skip_invalid`) invalid cells go to `plan.dropped` with the reason."""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional, Sequence

from zcorch.config.timings import Timings, switch_keys
from zcorch.errors import ConfigError
from zcorch.config import yamlsrc as ys
from zcorch.config.baselines.kind import Cost
from zcorch.config.baselines.registry import BY_NAME
from zcorch.config.cells import cell_problems, filesystem_problem
from zcorch.config.experiment import Experiment, load_experiment
from zcorch.config.inventory import InventoryPair
from zcorch.config.reference import reference_problems
from zcorch.params import PARAM_KEYS, format_value
from zcorch.plan_matrix import ID_LENGTH, canonical, cell_id, matrix_cells, member  # noqa: F401 (the plan API)

MIN_RUNS_95 = 6   # a 95% interval of a median needs this many runs (intervals.min_runs_for(0.95))

_MAX_LISTED = 5  # cells named per reason in an error message


@dataclass(slots=True)   # 100k of them in a big plan
class Cell:
    id: str
    params: dict
    origin: str           # "matrix" or "include[i]"


@dataclass(slots=True)
class Run:
    id: str               # the cell's id (same for every repeat)
    repeat: int           # 0-based
    params: dict          # every parameter; the cell's own dict (shared by its repeats): read-only


@dataclass(slots=True)
class Dropped:
    id: str
    params: dict
    origin: str
    reason: str           # "excluded by exclude[0]" or "invalid: <why the worker cannot run it>"


@dataclass
class Plan:
    experiment: Experiment
    cells: "list[Cell]"
    runs: "list[Run]"
    dropped: "list[Dropped]" = field(default_factory=list)
    merged: "list[tuple[str, str]]" = field(default_factory=list)  # (origin, id) identical to an earlier cell
    warnings: "list[str]" = field(default_factory=list)
    control: Optional[Cell] = None   # the cell the experiment's `control:` names (None without one)

    @cached_property
    def varying(self) -> "list[str]":
        """Parameters whose value differs between cells, in parameter-table order."""
        exp = self.experiment
        candidates = {p for a in exp.matrix if len(a.values) > 1 for p in a.params}
        base = exp.include_base()
        for inc in exp.include:
            candidates.update(k for k in PARAM_KEYS if inc[k] != base[k])
        first = self.cells[0].params if self.cells else {}
        return [k for k in PARAM_KEYS if k in candidates and any(c.params[k] != first[k] for c in self.cells)]

    def fewest_repeats(self) -> int:
        """The fewest runs a cell can end with: N, or max(min, 6) capped at max (no 95% interval before 6)."""
        p = self.experiment.repeat_policy
        return self.experiment.repeats if p is None else min(p.max, max(p.min, MIN_RUNS_95))

    @cached_property
    def linked(self) -> "list":
        """The linked axes whose label differs between cells (zcorch.config.experiment.Axis), in file order."""
        return [a for a in self.experiment.linked_axes() if len({a.label_of(c.params) for c in self.cells}) > 1]


def load_plan(path: "str | os.PathLike", overrides: "Sequence[str]" = (),
              hosts: "Optional[InventoryPair]" = None, unknown_hosts: bool = False) -> Plan:
    return expand(load_experiment(path, overrides, hosts, unknown_hosts))


def expand(exp: Experiment, reduced: bool = False) -> Plan:
    """Every cell and run of an experiment, in execution order; ConfigError for cells that cannot run.
    reduced: a run reduced by `--set` (also a resumed set's effective document): reference matches only warn."""
    reduced = reduced or bool(exp.overrides)
    cells: "list[Cell]" = []
    dropped: "list[Dropped]" = []
    merged: "list[tuple[str, str]]" = []
    seen: "dict[str, Cell]" = {}
    bad: "dict[tuple[str, str], list[dict]]" = {}   # (origin, reason) -> cells (for the error message)

    def check(params: dict) -> "tuple[list[str], Optional[str]]":
        return cell_problems(params), filesystem_problem(params)

    def admit(cid: str, params: dict, origin: str, verdict=None) -> None:
        problems, fs_problem = verdict or check(params)
        if fs_problem:
            bad.setdefault((origin, fs_problem), []).append(params)
            return
        if problems:
            if exp.skip_invalid:
                dropped.append(Dropped(cid, params, origin, "invalid: " + "; ".join(problems)))
            else:
                for reason in problems:
                    bad.setdefault((origin, reason), []).append(params)
            return
        if cid in seen:
            merged.append((origin, cid))
            return
        cell = Cell(cid, params, origin)
        seen[cid] = cell
        cells.append(cell)

    ex_hits = [0] * len(exp.exclude)
    if exp.matrix or not exp.include:
        for cid, params, hit, verdict in matrix_cells(exp, check):
            if hit is None:
                admit(cid, params, "matrix", verdict)
            else:
                ex_hits[hit] += 1
                dropped.append(Dropped(cid, params, "matrix", f"excluded by exclude[{hit}]"))

    for i, params in enumerate(exp.include):   # include cells: not subject to exclude
        admit(cell_id(params), dict(params), f"include[{i}]")

    if bad:
        raise ConfigError(_invalid_messages(exp, bad))
    if not cells:
        raise ConfigError(f"{exp.where('matrix')}: no cell left to run (every cell was excluded or dropped)")

    ref_problems = reference_problems(exp.reference, [c.params for c in cells]) if exp.reference else []
    if ref_problems and not reduced:
        raise ConfigError([f"{ys.where(exp.path, pos)}: {key}: {msg}" for pos, key, msg in ref_problems])

    control = _control_cell(exp, cells, dropped) if isinstance(exp.control, dict) else None
    if isinstance(exp.control, str):
        _one_network(exp, cells)
    plan = Plan(exp, cells, _order_runs(exp, cells), dropped, merged, control=control)
    plan.warnings = _warnings(exp, plan, ex_hits)
    # --set reduced the study: what the reference names but this run lacks is reported as not measured
    plan.warnings += [f"{ys.where(exp.path, pos)}: {key}: {msg} as run (--set): the report shows it as not "
                      "measured" for pos, key, msg in ref_problems]
    return plan


def control_matches(exp: Experiment, params: dict) -> bool:
    """Whether a cell's parameters hold every value of the experiment's `control:` (a linked axis: its label)."""
    linked = {a.key: a for a in exp.matrix if a.linked}
    return all(linked[key].label_of(params) == value if key in linked else member(params.get(key), [value])
               for key, value in exp.control.items())


def _one_network(exp: Experiment, cells: "list[Cell]") -> None:
    """A control is measured in every round: ConfigError when the cells differ in `network`."""
    if len({c.params.get("network") for c in cells}) > 1:
        raise ConfigError(f"{exp.where('control')}: control: the cells differ in `network`, and the runs of each "
                          "network run together (each configuration applied once), so the control would not be "
                          "measured in the same round as the cells of the other networks: split the experiment "
                          "by network")


def _control_cell(exp: Experiment, cells: "list[Cell]", dropped: "list[Dropped]") -> Cell:
    """The one cell `control:` names; ConfigError at the key when it names none or several."""
    where = exp.where("control")
    written = " ".join(f"{k}={v if k not in PARAM_KEYS else format_value(k, v)}" for k, v in exp.control.items())
    found = [c for c in cells if control_matches(exp, c.params)]
    if len(found) == 1:
        _one_network(exp, cells)
        return found[0]
    listed = "; ".join(f"[{c.id}] {describe_cell(exp, c.params, c.origin)}" for c in (found or cells)[:_MAX_LISTED])
    more = len(found or cells) - _MAX_LISTED
    listed += f" and {more} more" if more > 0 else ""
    if found:
        raise ConfigError(f"{where}: control: `{written}` matches {len(found)} cells of the plan: {listed}; name more "
                          "parameters so that it names one cell")
    gone = [d for d in dropped if control_matches(exp, d.params)]
    why = f" (it names a dropped cell: {gone[0].reason})" if gone else ""
    raise ConfigError(f"{where}: control: `{written}` matches no cell of the plan{why}; the cells: {listed}")


def control_record(plan: Plan) -> Optional[dict]:
    """What a result set records of its control (manifest.json "control"): {"cell", "params", "label"}, or for a
    baseline kind {"baseline", "key", "label"}; None without one."""
    if isinstance(plan.experiment.control, str):
        kind = plan.experiment.control
        key = control_baseline_key(plan.experiment)
        return {"baseline": kind, "key": key,
                "label": f"{kind} " + " ".join(f"{k}={'auto' if v is None else json.dumps(v)}" for k, v in key.items())}
    if plan.control is None:
        return None
    exp, cell = plan.experiment, plan.control
    return {"cell": cell.id, "params": dict(exp.control),
            "label": describe_cell(exp, cell.params, cell.origin)}


def control_baseline_key(exp: Experiment) -> dict:
    """The key of the test `control: <kind>` runs in every round, under the experiment's settings of it."""
    kind = BY_NAME[exp.control]
    return kind.control_key(exp.baselines.get(kind.name))


def _order_runs(exp: Experiment, cells: "list[Cell]") -> "list[Run]":
    runs = _order_runs_ungrouped(exp, cells)
    if len({c.params.get("network") for c in cells}) < 2:
        return runs
    # A network is applied once per group: the runs of each `network` run together, in first-use order.
    groups: "dict[object, list[Run]]" = {}
    for run in runs:
        groups.setdefault(run.params.get("network"), []).append(run)
    return [run for group in groups.values() for run in group]


def _order_runs_ungrouped(exp: Experiment, cells: "list[Cell]") -> "list[Run]":
    r = exp.repeats
    if exp.order == "sequential":
        return [Run(c.id, k, c.params) for c in cells for k in range(r)]
    if exp.order == "interleave":
        return [Run(c.id, k, c.params) for k in range(r) for c in cells]
    # Cells in id order first, so the shuffled order does not depend on axis order.
    rng = random.Random(exp.seed)
    by_id = sorted(cells, key=lambda c: c.id)
    runs = []
    for k in range(r):
        round_cells = by_id.copy()
        rng.shuffle(round_cells)
        runs.extend([Run(c.id, k, c.params) for c in round_cells])
    return runs


def describe_cell(exp: Experiment, params: dict, origin: str) -> str:
    """`send_mode=mmap recv_mode=read` over the parameters that distinguish cells of this file."""
    keys = [p for a in exp.matrix if len(a.values) > 1 for p in a.params]
    if origin.startswith("include["):
        base = exp.include_base()
        keys += [k for k in PARAM_KEYS if params[k] != base[k] and k not in keys]
    if not keys:
        keys = ["send_mode", "recv_mode"]
    return " ".join(f"{k}={format_value(k, params[k])}" for k in keys)


def _invalid_messages(exp: Experiment, bad: dict) -> "list[str]":
    out = []
    hint = "" if exp.skip_invalid else "; fix or exclude them, or set `skip_invalid: true` to drop them"
    for (origin, reason), cells in bad.items():
        where = exp.where(origin)
        named = ", ".join(f"[{cell_id(p)}] {describe_cell(exp, p, origin)}" for p in cells[:_MAX_LISTED])
        more = f" and {len(cells) - _MAX_LISTED} more" if len(cells) > _MAX_LISTED else ""
        n = f"{len(cells)} cell{'s' if len(cells) != 1 else ''}"
        fixable = "" if reason.startswith("sink `") else hint
        out.append(f"{where}: {origin}: {n} cannot run: {reason}: {named}{more}{fixable}")
    return out


def _warnings(exp: Experiment, plan: Plan, ex_hits: "list[int]") -> "list[str]":
    out = []
    policy = exp.repeat_policy
    if policy is not None and policy.max < MIN_RUNS_95:
        out.append(f"{exp.where('repeats')}: repeats.max {policy.max} is below {MIN_RUNS_95}: a 95% interval of a "
                   f"median needs {MIN_RUNS_95} ok runs, so no cell can converge; every cell runs {policy.max} times "
                   "and is marked converged: false")
    out += [f"{exp.where(f'exclude[{i}]')}: exclude[{i}] matches no cell (a typo in a value?)"
            for i, hits in enumerate(ex_hits) if hits == 0]
    out += [f"{ys.where(exp.path, a.pos)}: matrix.{a.key} overrides params.{p} in every matrix cell"
            for a in exp.matrix for p in a.params if p in exp.params]
    for key, defined in (("filesystem", exp.filesystems), ("network", exp.networks)):
        used = {c.params.get(key) for c in plan.cells}
        out += [f"{exp.where(f'{key}s.{name}')}: {key}s.{name} is defined but no cell uses it"
                for name in defined if name not in used]
    return out + [f"{exp.where(origin)}: {origin} is identical to cell {cid}; merged (run once per repeat)"
                  for origin, cid in plan.merged]


# ---------------------------------------------------------------- duration estimate

DEFAULT_RATE = 1024 ** 3          # bytes/s assumed for every transfer and dd pass (override: --rate)
DEFAULT_OVERHEAD = 0.5            # seconds per run and per baseline test: worker start-up, connection, records


@dataclass
class Estimate:
    total_s: float
    transfer_s: float
    overhead_s: float
    baseline_s: float
    rate: float
    per_run_overhead: float
    baselines: "tuple[tuple[str, Cost], ...]" = ()   # (kind, its share) of each baseline kind that runs
    runs: int = 0               # runs planned (repeats: {min, max, ...}: every cell at max)
    runs_min: int = 0           # the fewest that may run (every cell converging as early as it can)
    total_min_s: float = 0.0    # the duration if they do
    timings: Optional[Timings] = None   # learned from an earlier result set (else the assumptions above)
    setup_s: float = 0.0        # with timings: filesystems made and released, networks switched

    def tests(self, kind: str) -> int:
        """How many tests/passes the baseline kind `kind` runs (0: off)."""
        return next((cost.tests for name, cost in self.baselines if name == kind), 0)

    @property
    def is_range(self) -> bool:
        return self.runs_min != self.runs

    def explain(self) -> str:
        from zcorch.units import format_size

        parts = ", ".join(cost.what for _, cost in self.baselines) or "none"
        span = (f"estimated duration {hms(self.total_min_s)}..{hms(self.total_s)} ({self.runs_min}..{self.runs} "
                f"runs: every cell converging as early as it can .. every cell at max); at most"
                if self.is_range else "estimated duration")
        if self.timings is not None:
            t = self.timings
            rate = f"{format_size(int(self.rate))}/s" if t.rate else "each cell's duration"
            return (f"{span} {hms(self.total_s)}, from what {t.source} took: transfers {hms(self.transfer_s)} "
                    f"(at its {rate}) + {self.per_run_overhead:.2f}s between runs ({hms(self.overhead_s)}) + "
                    f"configurations made, switched and released {hms(self.setup_s)} + before the first run and "
                    f"after the last {hms(self.baseline_s)}.")
        return (f"{span} {hms(self.total_s)}: transfers {hms(self.transfer_s)} "
                f"(bytes at an assumed {format_size(int(self.rate))}/s, each capped by its timeout, or the cell's "
                f"duration) + {self.per_run_overhead:g}s overhead per run ({hms(self.overhead_s)}) + baselines "
                f"{hms(self.baseline_s)} ({parts}). Real rates differ: use --rate.")


def estimate(plan: Plan, rate: float = DEFAULT_RATE, overhead: float = DEFAULT_OVERHEAD,
             timings: Optional[Timings] = None) -> Estimate:
    """How long `zcorch run` should take, from assumptions or from an earlier set's `timings`."""
    if timings is not None:
        return _learned_estimate(plan, timings, rate)
    by_id = {c.id: c.params for c in plan.cells}
    # each run: its transfer, after the receiver's and then the sender's idle probe (one after the other)
    per_cell = {cid: _transfer_s(p, rate) + 2 * (p.get("idle_probe") or 0) for cid, p in by_id.items()}
    transfer = sum(per_cell[r.id] for r in plan.runs)
    over = overhead * len(plan.runs)
    shares = tuple((kind.name, kind.estimate(conf, list(by_id.values()), rate, overhead))
                   for kind, conf in plan.experiment.baselines.enabled())
    if isinstance(plan.experiment.control, str):   # its test once in every round
        kind = BY_NAME[plan.experiment.control]
        rounds = plan.experiment.repeats
        shares += ((f"control {kind.name}", Cost(rounds, rounds * (kind.test_seconds(
            plan.experiment.baselines.get(kind.name)) + overhead), f"{rounds} {kind.name} tests, one per round")),)
    baseline = sum(cost.seconds for _, cost in shares)
    # repeats: {min, max, target_ci}: each cell may stop after its fewest repeats (Plan.fewest_repeats)
    fewest = plan.fewest_repeats()
    early = [r for r in plan.runs if r.repeat < fewest]
    total_min = sum(per_cell[r.id] for r in early) + overhead * len(early) + baseline
    return Estimate(transfer + over + baseline, transfer, over, baseline, rate, overhead, shares,
                    len(plan.runs), len(early), total_min)


def _learned_estimate(plan: Plan, t: Timings, rate: float) -> Estimate:
    rate = t.rate or rate
    by_id = {c.id: c.params for c in plan.cells}
    per_cell = {cid: _transfer_s(p, rate) for cid, p in by_id.items()}   # its idle probes are in per_run

    def total(runs: "Sequence[Run]") -> "tuple[float, float, float]":
        keys = switch_keys([by_id[r.id] for r in runs])
        transfer = sum(per_cell[r.id] for r in runs)
        setup = sum(t.cost(k) for k in keys if k)
        return transfer, t.per_run * max(0, len(runs) - 1), setup

    transfer, over, setup = total(plan.runs)
    fewest = plan.fewest_repeats()
    early = [r for r in plan.runs if r.repeat < fewest]
    fixed = t.before + t.after
    return Estimate(transfer + over + setup + fixed, transfer, over, fixed, rate, t.per_run, (), len(plan.runs),
                    len(early), sum(total(early)) + fixed, timings=t, setup_s=setup)


def _transfer_s(p: dict, rate: float) -> float:
    """A run's transfer: its duration, else its bytes at `rate`, capped by its timeout."""
    return p["duration"] if p.get("duration") is not None else min(p["bytes"] / rate, p["timeout"])


def hms(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def runs_json(plan: Plan) -> "list[dict]":
    """The runs as `zcorch plan --json` prints them; one its cell may not need has `"optional": true`."""
    fewest = plan.fewest_repeats()   # (fixed `repeats: N`: every run is below it)
    return [{"id": r.id, "repeat": r.repeat, "params": r.params, **({"optional": True} if r.repeat >= fewest else {})}
            for r in plan.runs]
