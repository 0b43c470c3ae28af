"""Reproduction: a study's published figures next to this run's, each as a fraction of its own side's baseline, and
a verdict per claim `metric(a) OP K × metric(b)` from the two medians' intervals (*untestable here* when a condition
it `needs:` is not met; docs/reproductions.md). Pure functions of the runs, baselines and `reference:`."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pandas as pd

from zcorch.analysis.links import href
from zcorch.analysis.frames import OK
from zcorch.analysis.stats import CI, ci_label, min_runs_for, summarize
from zcorch import conditions as cond
from zcorch import metrics
from zcorch.config.baselines.registry import BY_RECORD
from zcorch.config.reference import COMMAND_KIND_PREFIX, LEVEL, Claim, Figure, Match, Reference
from zcorch.params import format_value, side_value
from zcorch.units import convert, unit_dimension

HOLDS, FAILS, INCONCLUSIVE, UNTESTABLE = "holds", "does not hold", "inconclusive", "untestable here"


def needs_runs(level: float = LEVEL) -> str:
    """'needs 5 runs': the fewest ok runs a side needs for an interval of `level` (min_runs_for)."""
    return f"needs {min_runs_for(level)} runs"
VERDICTS = (HOLDS, FAILS, INCONCLUSIVE, UNTESTABLE)


def baseline_word(kind: str) -> str:
    """How a baseline kind reads in a table: `dd write`, or `nc (command)` for `command:nc`."""
    if kind.startswith(COMMAND_KIND_PREFIX):
        return f"{kind[len(COMMAND_KIND_PREFIX):]} (command)"
    registered = BY_RECORD.get(kind)
    return registered.words.get(kind, kind) if registered else kind


@dataclass(frozen=True)
class Measured:
    """One cell's measurement of a metric in this result set (NaN where there is none)."""

    cell: Optional[str]      # None: the match selects no cell of this run
    n: int = 0
    n_failed: int = 0
    median: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    note: str = ""           # why there is no value or no interval
    ci_level: float = math.nan  # the level the interval really has (zcorch.analysis.stats.median_ci)

    @property
    def has_ci(self) -> bool:
        return np.isfinite(self.ci_low) and np.isfinite(self.ci_high)


@dataclass(frozen=True)
class FigureRow:
    figure: Figure
    unit: str                            # the metric's unit; every number below is in it
    published: "tuple[float, float]"     # low, high (equal for a single number)
    published_norm: "Optional[tuple[float, float]]"   # / the study's baseline
    measured: Measured
    measured_baseline: float             # this run's baseline of the same kind, Gbit/s (NaN: none)
    measured_norm: float                 # measured median / measured_baseline
    per_byte: bool = False               # a total (time, count): ratio compares per byte moved
    run_bytes: float = math.nan          # the cell's `bytes` (for a total)

    @property
    def ratio(self) -> float:
        """measured / published (a range's midpoint); totals per byte when the bytes differ (NaN: study's unknown)."""
        mid = (self.published[0] + self.published[1]) / 2
        if not mid:
            return math.nan
        if self.per_byte:
            study = self.figure.bytes
            if study is None:
                return math.nan
            return (self.measured.median / self.run_bytes) / (mid / study)
        return self.measured.median / mid


@dataclass(frozen=True)
class ClaimRow:
    claim: Claim
    unit: str
    a: Measured
    b: Measured
    verdict: str
    evidence: str            # one line: the numbers the verdict rests on
    published: str           # the study's own numbers for the claim, when its figures give them ("" if not)
    checks: "tuple[cond.Check, ...]" = ()   # the claim's `needs:`, checked on its runs and hosts
    detail: str = ""         # what the verdict word needs beside it ("needs 5 runs" for too few)

    @property
    def verdict_text(self) -> str:
        return f"{self.verdict}: {self.detail}" if self.detail else self.verdict


# ---------------------------------------------------------------- numbers as text

def show(value: float, unit: str) -> str:
    """A value of a metric with 3 significant digits; times in s, ms, µs or ns, whichever reads best."""
    if not np.isfinite(value):
        return "–"
    if unit_dimension(unit) == "time" and value:
        secs = convert(value, unit, "s")
        unit = next(u for u, lim in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 0.0)) if abs(secs) >= lim)
        value = convert(secs, "s", unit)
    text = f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}" if unit not in ("count", "") else text


def show_range(low: float, high: float, unit: str) -> str:
    if low == high:
        return show(low, unit)
    lo, hi = show(low, unit), show(high, unit)
    lo_num, _, lo_unit = lo.partition(" ")
    return f"{lo_num}–{hi}" if lo_unit == hi.partition(" ")[2] else f"{lo}–{hi}"


def show_measured(m: Measured, unit: str) -> str:
    """'854 MB/s (75% CI 850–860, n=3)' or why there is nothing: the interval's own level."""
    if m.cell is None:
        return m.note or "not in this run"
    if not np.isfinite(m.median):
        return m.note or "no ok run"
    inner = f"n={m.n}" + (f", {m.n_failed} failed" if m.n_failed else "")
    if m.has_ci:
        inner = f"{ci_label(m.ci_level)} {show_range(m.ci_low, m.ci_high, unit)}, " + inner
    return f"{show(m.median, unit)} ({inner})"


def _ratio(x: float) -> str:
    return f"{x:.2f}" if np.isfinite(x) else "∞" if x == math.inf else "–"


# ---------------------------------------------------------------- measuring

def _firsts(df: pd.DataFrame, *matches: "Match | None") -> list:
    """Each cell's first run as a dict; given matches, only the columns they name (and the cell)."""
    cols = list(df.columns)
    if matches:
        keys = {c.key for m in matches if m is not None for c in m.conditions}
        cols = ["cell", *(k for k in cols if k in keys and k != "cell")]
    return df.loc[~df["cell"].duplicated(), cols].to_dict("records")


def cell_rows(df: pd.DataFrame, match: Match) -> pd.DataFrame:
    """The runs of the cell a match selects (empty when none); ValueError if it selects several cells."""
    if df.empty:
        return df
    cells = [r["cell"] for r in _firsts(df, match) if match.selects(r)]
    if len(cells) > 1:
        raise ValueError(f"{match.describe()} selects {len(cells)} cells of the result set")
    return df[df["cell"] == cells[0]] if cells else df.iloc[0:0]


def measure(df: pd.DataFrame, match: Match, metric: str, level: float = CI) -> Measured:
    try:
        rows = cell_rows(df, match)
    except ValueError as exc:   # several sweeps in one frame, or a reference edited after the run
        return Measured(None, note=str(exc))
    if rows.empty:
        return Measured(None, note="not in this run")
    cell = str(rows["cell"].iloc[0])
    if metric not in rows:
        return Measured(cell, note=f"no `{metric}` recorded")
    return _measured(rows, metric, level, ("runs", "ok run", "one ok run"))


def _measured(rows: pd.DataFrame, metric: str, level: float, words: "tuple[str, str, str]") -> Measured:
    """The Measured of the rows of one `cell`; `words` name them in its note."""
    s = summarize(rows, by=["cell"], metrics=[metric], ci=level).iloc[0]
    n, failed = int(s["n"]), int(s["n_failed"])
    note = "" if n >= 2 else (f"all {failed} {words[0]} failed" if n == 0 and failed else
                              f"no {words[1]}" if n == 0 else f"{words[2]}: no interval")
    return Measured(str(s["cell"]), n, failed, float(s[f"{metric}_median"]), float(s[f"{metric}_ci_low"]),
                    float(s[f"{metric}_ci_high"]), note, float(s[f"{metric}_ci_level"]))


def own_baseline(baselines: pd.DataFrame, kind: str, cell: dict) -> "list[float]":
    """The Gbit/s of this result set's ok baseline records of `kind` that stand for `cell` (baseline_rows)."""
    rows = baseline_rows(baselines, kind, cell)
    rows = rows[rows["status"] == OK] if len(rows) else rows
    return [float(v) for v in pd.to_numeric(rows["gbit_s"], errors="coerce").dropna()] if len(rows) else []


def baseline_rows(baselines: pd.DataFrame, kind: str, cell: dict) -> pd.DataFrame:
    """The records of `kind` (any status) that stand for `cell`: with the kind's fixed key values, matching the cell
    on its match keys when some do (its strict keys, e.g. dd's filesystem, always)."""
    if baselines is None or baselines.empty:
        return pd.DataFrame()
    if kind.startswith(COMMAND_KIND_PREFIX):  # a command baseline: the records of that command
        rows = baselines[baselines["kind"] == "command"]
        name = kind[len(COMMAND_KIND_PREFIX):]
        return rows[rows["key_name"] == name] if "key_name" in rows else rows.iloc[0:0]
    rows = baselines[baselines["kind"] == kind]
    registered = BY_RECORD.get(kind)
    for key, value in (registered.match_fixed if registered else {}).items():
        if f"key_{key}" in rows:
            rows = rows[rows[f"key_{key}"].fillna(value).astype(type(value)) == value]
    for key in (registered.match_keys if registered else ()):
        col = f"key_{key}"
        if col in rows and key in cell:
            want = side_value("send", cell, key) if key == "buffer" else cell[key]  # the sender's call size
            same = rows[rows[col].map(lambda v: format_value(key, v)) == format_value(key, want)]
            if len(same) or key in registered.strict_keys:
                rows = same
    return rows


def measure_of(df: pd.DataFrame, baselines: pd.DataFrame, match: Match, kind: str, metric: str,
               level: float = CI) -> Measured:
    """This run's baseline `kind` on the configuration `match` selects (`of: kind`), in the metric's unit."""
    cells = [r for r in (_firsts(df) if len(df) else ()) if match.selects(r)]
    if not cells:
        return Measured(None, note="not in this run")
    cell = cells[0]
    keys = BY_RECORD[kind].match_keys if kind in BY_RECORD else ()
    where = ", ".join(f"{k}={format_value(k, cell.get(k))}" for k in keys if k in cell)
    label = f"{baseline_word(kind)}" + (f" on {where}" if where else "")
    rows = baseline_rows(baselines, kind, cell)
    if rows.empty:
        return Measured(label, note=f"no {baseline_word(kind)} baseline in this run")
    unit = metrics.get(metric).unit
    frame = pd.DataFrame({"cell": label, "status": rows["status"].to_numpy(),
                          metric: [convert(float(v), "Gbit/s", unit) if pd.notna(v) else math.nan
                                   for v in pd.to_numeric(rows["gbit_s"], errors="coerce")]})
    return _measured(frame, metric, level, ("records", "ok record", "one record"))


# ---------------------------------------------------------------- figures and claims

def figures(df: pd.DataFrame, baselines: pd.DataFrame, ref: Reference) -> "list[FigureRow]":
    out = []
    for f in ref.figures:
        unit = metrics.get(f.metric).unit
        published = f.value.to(unit)
        if f.of:   # the study's number is a baseline's (its dd): this run's same baseline, same configuration
            out.append(FigureRow(f, unit, published, None, measure_of(df, baselines, f.match, f.of, f.metric),
                                 math.nan, math.nan))
            continue
        m = measure(df, f.match, f.metric)
        pub_norm, base_gbit, norm = None, math.nan, math.nan
        study = ref.baseline(f.baseline)
        if study is not None:
            lo, hi = study.value.to("Gbit/s")
            p_lo, p_hi = (convert(v, unit, "Gbit/s") for v in published)
            pub_norm = (p_lo / hi, p_hi / lo)
            if m.cell is not None:
                first = cell_rows(df, f.match).iloc[0]
                vals = own_baseline(baselines, study.kind, {k: first[k] for k in first.index})
                base_gbit = float(np.median(vals)) if vals else math.nan
                if np.isfinite(m.median) and base_gbit > 0:
                    norm = convert(m.median, unit, "Gbit/s") / base_gbit
        per_byte, run_bytes = metrics.get(f.metric).extensive, math.nan
        if per_byte and m.cell is not None:
            run_bytes = float(cell_rows(df, f.match)["bytes"].iloc[0]) if "bytes" in df else math.nan
            per_byte = not (f.bytes is not None and run_bytes == f.bytes)
        out.append(FigureRow(f, unit, published, pub_norm, m, base_gbit, norm, per_byte, run_bytes))
    return out


def verdict(a: Measured, b: Measured, op: str, factor: float, level: float = LEVEL) -> "tuple[str, str]":
    """(verdict, why) of `a OP factor × b` from the two medians' confidence intervals; an interval of less
    than `level` (too few runs) decides nothing: inconclusive, with the runs a side needs."""
    for side, m in (("a", a), ("b", b)):
        if m.cell is None:
            return INCONCLUSIVE, f"{side} is not in this run"
        if not m.has_ci:
            return INCONCLUSIVE, f"{needs_runs(level)} ({side}: {m.note or 'no confidence interval'})"
        if not m.ci_level >= level:
            return INCONCLUSIVE, f"{needs_runs(level)} (a {level:.0%} interval; {side} has {m.n} ok)"
    b_lo, b_hi = factor * b.ci_low, factor * b.ci_high
    above, below = a.ci_low > b_hi, a.ci_high < b_lo
    if op in (">", ">="):
        return (HOLDS, "intervals separated, a above") if above else \
            (FAILS, "intervals separated, a below") if below else (INCONCLUSIVE, "intervals overlap")
    return (HOLDS, "intervals separated, a below") if below else \
        (FAILS, "intervals separated, a above") if above else (INCONCLUSIVE, "intervals overlap")


def _published_for(ref: Reference, match: Match, metric: str,
                   of: Optional[str] = None) -> "Optional[tuple[float, float]]":
    unit = metrics.get(metric).unit
    for f in ref.figures:
        if f.match == match and f.of == of and (f.metric == metric or {f.metric, metric} <= metrics.RATES):
            return f.value.to(unit)
    return None


@dataclass(frozen=True)
class HostFacts:
    """What the conditions need of a result set's hosts (meta.json; None where it was not recorded)."""

    link_kinds: "tuple[Optional[str], ...]" = ()   # the data interfaces' kinds, sender's and receiver's
    mem_total: Optional[int] = None                # the smaller host's memory, bytes
    recv_mem_total: Optional[int] = None           # the receiver's memory, bytes
    cpus: Optional[int] = None                     # the fewer CPUs of the two hosts (the workers' affinity)
    send_mem_total: Optional[int] = None           # the sender's memory, bytes
    md_driver: Optional[bool] = None               # whether the receiver's kernel has md (software RAID)
    filesystems: "tuple[tuple[str, dict], ...]" = ()   # meta.json filesystems: (name, record)


def host_facts(meta: Optional[dict]) -> HostFacts:
    """HostFacts of a meta.json as written (zcorch.analysis.frames.read_meta; {} or None: nothing known)."""
    hosts = (meta or {}).get("hosts") or {}
    roles = [hosts.get(r) or {} for r in ("sender", "receiver")]

    def fewest(values):
        known = [v for v in values if isinstance(v, int) and v > 0]
        return min(known) if known else None
    return HostFacts(
        link_kinds=tuple((h.get("interface") or {}).get("kind") for h in roles if h),
        mem_total=fewest(h.get("mem_total_bytes") for h in roles),
        recv_mem_total=fewest([roles[1].get("mem_total_bytes")]),
        cpus=fewest(h.get("cpu_affinity_count") or h.get("cpu_count") for h in roles),
        send_mem_total=fewest([roles[0].get("mem_total_bytes")]),
        md_driver=roles[1].get("md_driver") if isinstance(roles[1].get("md_driver"), bool) else None,
        filesystems=tuple((str(k), v) for k, v in ((meta or {}).get("filesystems") or {}).items()
                          if isinstance(v, dict)))


def _column(rows: pd.DataFrame, name: str) -> list:
    return list(rows[name]) if name in rows else [None] * len(rows)


def _finite(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and math.isfinite(v)


def _pinned_cpus(rows: pd.DataFrame) -> "list[int]":
    """The CPUs the runs' parameters name (send_cpu, recv_cpu, and the canonical "0,2" lists of send_cpus/recv_cpus)."""
    named: "set[int]" = set()
    for key in ("send_cpu", "recv_cpu"):
        named.update(int(v) for v in _column(rows, key) if v is not None and v == v)
    for key in ("send_cpus", "recv_cpus"):
        for v in _column(rows, key):
            if isinstance(v, str):
                named.update(int(x) for x in v.split(",") if x.strip().isdigit())
    return sorted(named)


def _reads_file(source) -> bool:
    """Whether a run's `source` is a file read from a filesystem (not memory, nor a device like /dev/zero)."""
    return isinstance(source, str) and bool(source) and source != "mem" and not source.startswith("/dev/")


def claim_checks(df: pd.DataFrame, claim: Claim, hosts: HostFacts) -> "tuple[cond.Check, ...]":
    """Each condition the claim needs, checked on the ok runs of its two cells and on the hosts."""
    if not claim.needs:
        return ()
    # the runs of every cell either side selects (a claim `of` a baseline kind selects a configuration's cells)
    firsts = [(r["cell"], r) for r in _firsts(df, claim.a, claim.b)]
    side_cells = [{c for c, p in firsts if m is not None and m.selects(p)} for m in (claim.a, claim.b)]
    rows = df[df["cell"].isin(side_cells[0] | side_cells[1])]
    rows = rows[rows["status"] == OK] if "status" in rows else rows
    out = []
    for name, number in claim.needs:
        if name == "idle_hosts":
            sides = [pd.to_numeric(pd.Series(_column(rows, f"{p}host_idle_before"), dtype=object), errors="coerce")
                     for p in ("send_", "recv_")]
            per_run = [None if (math.isnan(x) and math.isnan(y)) else float(np.nanmin([x, y]))
                       for x, y in zip(*sides)]
            out.append(cond.check_idle(per_run))
        elif name == "one_kernel":
            out.append(cond.check_one_kernel([None if v is None or v != v else bool(v)
                                              for v in _column(rows, "same_host")]))
        elif name in ("virtual_link", "real_nic"):
            out.append(cond.check_link(hosts.link_kinds, virtual=name == "virtual_link"))
        elif name in ("data_in_ram", "data_beyond_ram"):
            inside = name == "data_in_ram"
            out.append(cond.check_ram(_column(rows, "bytes"), hosts.mem_total if inside else hosts.recv_mem_total,
                                      inside))
        elif name == "cpus":
            out.append(cond.check_cpus(_pinned_cpus(rows), hosts.cpus, number))
        elif name == "md_raid":
            recorded = dict(hosts.filesystems)
            names = sorted({str(v) for v in _column(rows, "filesystem") if isinstance(v, str) and v})
            out.append(cond.check_md_raid([(n, recorded.get(n)) for n in names], hosts.md_driver))
        elif name == "same_sender_work":
            per_side = []
            for cells in side_cells:
                side = rows[rows["cell"].isin(cells)]
                per_side.append([u / 1e6 / (b / 2**30) if _finite(u) and _finite(b) and b > 0 else None
                                 for u, b in zip(_column(side, "send_utime_us"), _column(side, "bytes"))])
            out.append(cond.check_sender_work(per_side[0], per_side[1], number))
        elif name == "disk_source":
            files = [b for b, src in zip(_column(rows, "bytes"), _column(rows, "source")) if _reads_file(src)]
            out.append(cond.check_disk_source(files, hosts.send_mem_total))
    return tuple(out)


def claims(df: pd.DataFrame, ref: Reference, baselines: Optional[pd.DataFrame] = None,
           hosts: Optional[HostFacts] = None) -> "list[ClaimRow]":
    """The verdict of each claim; `baselines` for claims `of` a baseline kind, `hosts` for the conditions needed."""
    def side(c: Claim, m: Match) -> Measured:
        return measure_of(df, baselines, m, c.of, c.metric, ref.level) if c.of else measure(df, m, c.metric, ref.level)

    out = []
    hosts = hosts or HostFacts()
    for c in ref.claims:
        unit = metrics.get(c.metric).unit
        a = side(c, c.a)
        if c.b is None:     # against a constant: an exact "interval" of the constant itself
            b = Measured(f"{c.factor:g}", 0, 0, c.factor, c.factor, c.factor, "the claim's constant", 1.0)
        else:
            b = side(c, c.b)
        v, why = verdict(a, b, c.op, 1.0 if c.b is None else c.factor, ref.level)
        checks = claim_checks(df, c, hosts) if len(df) else ()
        failing = cond.untestable_reason(checks)
        if failing:
            v, why = UNTESTABLE, f"the numbers say {v}, but this machine cannot test the claim: {failing}"
        ratio = math.nan
        if np.isfinite(a.median) and np.isfinite(b.median):
            ratio = a.median / b.median if b.median else (math.inf if a.median > 0 else math.nan)
        bounds = ""
        if a.has_ci and b.has_ci and b.ci_low > 0:
            bounds = f" (interval bounds {_ratio(a.ci_low / b.ci_high)}–{_ratio(a.ci_high / b.ci_low)})"
        if c.b is None:
            evidence = f"measured (this run): a {show_measured(a, unit)}; claim a {c.op} {c.factor:g}: {why}"
        else:
            evidence = (f"measured (this run): a {show_measured(a, unit)} vs b {show_measured(b, unit)}; "
                        f"a/b = {_ratio(ratio)}{bounds}, claim {c.op} {c.factor:g}: {why}")
        pa = _published_for(ref, c.a, c.metric, c.of)
        pb = _published_for(ref, c.b, c.metric, c.of) if c.b is not None else None
        published = ""
        if pa and pb:
            published = (f"published: a {show_range(*pa, unit)} vs b {show_range(*pb, unit)}; "
                         f"a/b = {_ratio(((pa[0] + pa[1]) / 2) / ((pb[0] + pb[1]) / 2))}")
        detail = needs_runs(ref.level) if v == INCONCLUSIVE and why.startswith("needs ") else ""
        out.append(ClaimRow(c, unit, a, b, v, evidence, published, checks, detail))
    return out


# ---------------------------------------------------------------- tables (the report and markdown share them)

FIGURE_HEADER = ["published as", "cell", "metric", "published (study)", "published / study baseline",
                 "measured (this run)", "measured / our baseline", "measured ÷ published"]
CLAIM_HEADER = ["claim (published finding)", "condition", "verdict", "conditions here", "evidence"]


def _norm_text(low: float, high: float, kind: Optional[str]) -> str:
    word = baseline_word(kind or "")
    if not (np.isfinite(low) and np.isfinite(high)):
        return "–"
    return f"{_ratio(low)} × {word}" if abs(low - high) < 0.005 else f"{_ratio(low)}–{_ratio(high)} × {word}"


def _what(match: Match, of: Optional[str]) -> str:
    """What a figure or claim side is measured on: a cell, or a baseline of the cells' configuration."""
    return f"{baseline_word(of)} of {match.describe()}" if of else match.describe()


def figure_table(rows: "list[FigureRow]") -> "list[list[str]]":
    out = []
    for r in rows:
        f, m = r.figure, r.measured
        kind = f.baseline
        pub_norm = _norm_text(*r.published_norm, kind) if r.published_norm else "–"
        if kind is None:
            ours = "–"
        elif not np.isfinite(r.measured_baseline):
            ours = f"no {baseline_word(kind)} baseline in this run"
        else:
            ours = (f"{_norm_text(r.measured_norm, r.measured_norm, kind)} "
                    f"({baseline_word(kind)} {show(r.measured_baseline, 'Gbit/s')})")
        ratio = _ratio(r.ratio)
        if m.cell is None:     # a cell this run left out (e.g. --set): nothing to compare, whatever the study gives
            ratio = "– (not run in this set)"
        elif r.per_byte:
            ratio = (f"{ratio} per byte" if np.isfinite(r.ratio) else
                     "– (a total: the study's bytes are not given)" if f.bytes is None else "–")
        out.append([(f.label or "–") + (f" ({f.note})" if f.note else ""), _what(f.match, f.of), f.metric, show_range(*r.published, r.unit), pub_norm,
                    show_measured(m, r.unit), ours, ratio])
    return out


def conditions_text(row: ClaimRow) -> str:
    """The claim's conditions as checked here, one `✓ name: numbers` per condition ("–": it needs none)."""
    return "; ".join(str(c) for c in row.checks) or "–"


def claim_table(rows: "list[ClaimRow]") -> "list[list[str]]":
    out = []
    for r in rows:
        c = r.claim
        rule = f"{c.metric}: {c.condition}, a = {_what(c.a, c.of)}" + (
            f"; b = {_what(c.b, c.of)}" if c.b is not None else "")
        evidence = r.evidence + (f" · {r.published}" if r.published else "") + (f" · note: {c.note}" if c.note else "")
        out.append([c.says, rule, r.verdict_text, conditions_text(r), evidence])
    return out


def baseline_table(ref: Reference, baselines: pd.DataFrame) -> "list[list[str]]":
    """[kind, published (study) with its command, measured (this run)] per baseline the study gives."""
    out = []
    for b in ref.baselines:
        lo, hi = b.value.to("Gbit/s")
        study = f"{b.value}" + (f" = {show_range(lo, hi, 'Gbit/s')}" if b.value.unit != "Gbit/s" else "")
        for where, cell in _configurations(baselines, b.kind):
            vals = own_baseline(baselines, b.kind, cell)
            ours = float(np.median(vals)) if vals else math.nan
            spread = (f" (median of {len(vals)}: {show_range(min(vals), max(vals), 'Gbit/s')})"
                      if len(vals) > 1 and min(vals) < max(vals) else "")
            out.append([baseline_word(b.kind) + (f" on {where}" if where else ""), study, b.command or "–",
                        f"{show(ours, 'Gbit/s')} = {show(convert(ours, 'Gbit/s', 'MB/s'), 'MB/s')}{spread}"
                        if np.isfinite(ours) else "not measured"])
    return out


def _configurations(baselines: pd.DataFrame, kind: str) -> "list[tuple[str, dict]]":
    """(label, cell) per configuration of a kind's strict keys in the records (dd: per filesystem); else [("", {})]."""
    registered = BY_RECORD.get(kind)
    keys = [k for k in (registered.strict_keys if registered else ()) if baselines is not None
            and f"key_{k}" in baselines]
    if not keys:
        return [("", {})]
    rows = baselines[baselines["kind"] == kind]
    combos = rows[[f"key_{k}" for k in keys]].drop_duplicates()
    cells = [{k: combo[f"key_{k}"] for k in keys} for _, combo in combos.iterrows()]
    out = [(", ".join(f"{k}={format_value(k, v)}" for k, v in cell.items() if pd.notna(v)), cell) for cell in cells]
    return out or [("", {})]


BASELINE_HEADER = ["baseline", "published (study)", "the study's command", "measured (this run), all tests"]


def verdict_counts(rows: "list[ClaimRow]") -> str:
    counts = {v: sum(r.verdict == v for r in rows) for v in VERDICTS}
    return ", ".join(f"{n} {v}" for v, n in counts.items() if n) or "no claims"


def markdown(ref: Reference, df: pd.DataFrame, baselines: pd.DataFrame, name: str = "",
             hosts: Optional[HostFacts] = None) -> str:
    """The Reproduction section as Markdown (what `zcorch report DIR --format markdown` prints)."""
    s = ref.source
    cite = ", ".join(x for x in (s.author, f"“{s.title}”", s.venue, s.date) if x)
    lines = [f"## Reproduction{': ' + name if name else ''}", "",
             f"Published: {cite}" + (f" — <{href(s.url)}>" if href(s.url).startswith("http") else
                                     f" — `{s.url}`" if s.url else "") + ".", ""]
    if ref.setup:
        lines += [f"**The study's setup (published):** {' '.join(ref.setup.split())}", ""]
    if ref.units:
        lines += [f"**The study's units:** {' '.join(ref.units.split())}", ""]
    lines += ["Numbers labelled *published* are the study's, on its hardware; *measured (this run)* are this "
              f"result set's medians with order-statistic confidence intervals, each labelled with the level it "
              f"really has (three runs: 75%; {CI:.0%} needs six). Throughput is also shown as a "
              "fraction of each setup's own baseline.", ""]

    if ref.baselines:
        lines += ["### Baselines", ""] + markdown_table(BASELINE_HEADER, baseline_table(ref, baselines))
    fig_rows = figures(df, baselines, ref)
    if fig_rows:
        lines += ["### Published figures vs this run", ""] + markdown_table(FIGURE_HEADER, figure_table(fig_rows))
    claim_rows = claims(df, ref, baselines, hosts)
    if claim_rows:
        lines += [f"### Claims ({verdict_counts(claim_rows)})", "",
                  f"A verdict needs both confidence intervals separated, each of at least {ref.level:.0%} "
                  f"({needs_runs(ref.level)} a side); overlapping intervals or fewer runs are *inconclusive*; a claim whose conditions this machine does not meet is *untestable here*.", ""] + markdown_table(CLAIM_HEADER, claim_table(claim_rows))
    return "\n".join(lines)


def markdown_table(header: list, rows: list) -> "list[str]":
    """A Markdown table's lines and a blank one; `|` and newlines in a value escaped."""
    esc = [[str(v).replace("|", "\\|").replace("\n", " ") for v in r] for r in rows]
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"] + \
        ["| " + " | ".join(r) + " |" for r in esc] + [""]
