"""`zcorch compare BASE CANDIDATE`: did a sweep get slower? Per cell: the median on each side, the change in % and a
two-sided Mann–Whitney U test of the ok repeats; verdicts `regressed` / `improved` (beyond the threshold, p < alpha),
`failed`, `unchanged` (within it and able to see it), else `cannot tell` (`needs` says what would decide it)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pandas as pd

from zcorch import metrics
from zcorch.analysis.frames import OK
from zcorch.params import format_value
from zcorch.analysis.gate import (CANNOT_TELL, DEFAULT_ALPHA, DEFAULT_THRESHOLD_PCT, POWER, UNCHANGED, CellJudged,
                                  Completeness, Gate, cell_verdict, compare_gate, format_detectable)
from zcorch.analysis.stats import (MAX_RUNS_NEEDED, can_be_significant, detectable_change_pct, mann_whitney_u,
                                   min_p_value, relative_spread, runs_needed, varying_params)

VERDICTS_BAD = ("regressed", "failed")


def compare_frames(base: pd.DataFrame, cand: pd.DataFrame, metric: str = "gbit_s",
                   threshold_pct: float = DEFAULT_THRESHOLD_PCT, alpha: float = DEFAULT_ALPHA,
                   test_all: bool = True) -> pd.DataFrame:
    """One row per cell: params, counts, medians, change_pct, p_value, test, verdict ('only in base' / 'only in
    candidate' for a cell of one side); test_all: judge's."""
    declared = metrics.directed(metric)   # ValueError for a metric without a direction
    params = varying_params(pd.concat([base, cand], ignore_index=True))
    rows = []
    cells = list(dict.fromkeys(list(base["cell"]) + list(cand["cell"])))
    base_groups, cand_groups = dict(list(base.groupby("cell"))), dict(list(cand.groupby("cell")))
    empty = base.iloc[0:0]
    for cell in cells:
        b, c = base_groups.get(cell, empty), cand_groups.get(cell, empty)
        any_side = b if len(b) else c
        row = {"cell": cell, **{p: any_side[p].iloc[0] if p in any_side else None for p in params}}
        bv = b.loc[b["status"] == OK, metric].dropna().to_numpy(dtype=float)
        cv = c.loc[c["status"] == OK, metric].dropna().to_numpy(dtype=float)
        row.update(n_base=len(bv), n_cand=len(cv), base_failed=len(b) - len(bv), cand_failed=len(c) - len(cv),
                   base_median=float(np.median(bv)) if len(bv) else math.nan,
                   cand_median=float(np.median(cv)) if len(cv) else math.nan,
                   change_pct=math.nan, p_value=math.nan, test="", detectable_pct=math.nan, needs="")
        if not len(b):
            row["verdict"] = "only in candidate"
        elif not len(c):
            row["verdict"] = "only in base"
        elif len(bv) and not len(cv):
            row["verdict"] = "failed"
        elif not len(bv):
            row["verdict"] = "no base data" if not len(cv) else "fixed"
        elif is_control(metric, b, c):
            # what the other cells are divided by: its ratio is 1 in every run
            row.update(verdict=CONTROL, test=f"the control: judge it with --metric {metrics.CONTROL_RATIOS[metric]}")
        elif shared_host(metric, b, c):
            # the machine's busy CPU over the run: on a host busy with other work, their load, not this cell's
            row.update(verdict=CANNOT_TELL, test="host shared: judge it with --metric total_host_own_s_per_gib",
                       needs="quiet hosts")
        else:
            j = judge(bv, cv, declared.better == "higher", threshold_pct, alpha, test_all)
            row.update(change_pct=j.change_pct, p_value=j.p_value, test=j.test, verdict=j.verdict,
                       detectable_pct=j.detectable_pct, needs=j.needs)
        rows.append(row)
    cols = ["cell"] + params + ["n_base", "n_cand", "base_failed", "cand_failed", "base_median", "cand_median",
                                "change_pct", "p_value", "test", "verdict", "detectable_pct", "needs"]
    out = pd.DataFrame(rows, columns=cols)
    out.attrs.update(metric=metric, threshold_pct=threshold_pct, alpha=alpha)
    return out


def shared_host(metric: str, *frames: pd.DataFrame) -> bool:
    """Whether `metric` is the host's busy CPU and an ok run of these frames began on a shared host (other load)."""
    if "host_busy" not in metric:
        return False
    return any(bool(f.loc[f["status"] == OK, "host_shared"].fillna(False).astype(bool).any())
               for f in frames if len(f) and "host_shared" in f)


CONTROL = "control"   # the verdict of a `_vs_control` metric's control cell: not judged by its ratio


def is_control(metric: str, *frames: pd.DataFrame) -> bool:
    """Whether these runs of one cell are a `_vs_control` metric's control: their ok values all exactly 1."""
    if metric not in metrics.CONTROL_RATIOS:
        return False
    values = [pd.to_numeric(f.loc[f["status"] == OK, metric], errors="coerce").dropna()
              for f in frames if len(f) and metric in f]
    return bool(values) and all(len(v) and bool((v == 1.0).all()) for v in values)


@dataclass(frozen=True)
class Judgement:
    verdict: str        # regressed, improved, unchanged, cannot tell (zcorch.analysis.gate.cell_verdict)
    change_pct: float   # of the candidate's median against the base's
    p_value: float
    test: str           # the significance test, in words
    detectable_pct: float = math.nan   # the smallest change these runs could show (stats.detectable_change_pct)
    needs: str = ""     # what would make a `cannot tell` decidable ("≥ 9 runs a side"), else ""


def judge(base: np.ndarray, cand: np.ndarray, higher_better: bool, threshold_pct: float = DEFAULT_THRESHOLD_PCT,
          alpha: float = DEFAULT_ALPHA, test_all: bool = True) -> Judgement:
    """The verdict on two non-empty samples of ok runs (module docstring). test_all=False: the test (and scipy.stats'
    import) is skipped where the verdict cannot depend on it (p NaN)."""
    b_med, c_med = float(np.median(base)), float(np.median(cand))
    change = (c_med - b_med) / b_med * 100 if b_med else math.nan
    worse = change < 0 if higher_better else change > 0
    detectable = detectable_change_pct(base, cand, alpha, POWER)
    n_base, n_cand = int(np.count_nonzero(~np.isnan(base))), int(np.count_nonzero(~np.isnan(cand)))
    if not test_all and abs(change) <= threshold_pct and detectable <= threshold_pct:
        return Judgement(UNCHANGED, change, math.nan, "not tested (within the threshold)", detectable)
    if not test_all and not can_be_significant(n_base, n_cand, alpha):
        verdict, p_value = CANNOT_TELL, math.nan
        test = f"not tested ({n_base} against {n_cand} runs cannot reach p < {alpha})"
    else:
        mw = mann_whitney_u(base, cand)
        verdict, p_value, test = cell_verdict(change, mw.p_value, alpha, threshold_pct, detectable, worse), \
            mw.p_value, mw.description
    # what would decide it: asked only of a cell that cannot tell with too little to see the threshold
    undecidable = verdict == CANNOT_TELL and not detectable <= threshold_pct
    needs = _needs(base, cand, threshold_pct, alpha) if undecidable else ""
    return Judgement(verdict, change, p_value, test, detectable, needs)


def _needs(base: np.ndarray, cand: np.ndarray, threshold_pct: float, alpha: float) -> str:
    """What would let two samples like these see a change of the threshold: '≥ 9 runs a side'."""
    rel = relative_spread(base, cand)
    if rel != rel:
        return "a base median that is not 0"
    if rel == math.inf:
        return f"≥ {max(runs_needed(0.0, threshold_pct, alpha), 2)} runs a side (one run tells no spread)"
    n = runs_needed(rel, threshold_pct, alpha, POWER)
    if n > MAX_RUNS_NEEDED:
        return f"more than {MAX_RUNS_NEEDED} runs a side at a run spread of {rel * 100:.2g}% (a quieter setup)"
    return f"≥ {n} runs a side (run spread {rel * 100:.2g}%)"


def regressed(table: pd.DataFrame) -> bool:
    return bool(table["verdict"].isin(VERDICTS_BAD).any())


def tests_used(table: pd.DataFrame) -> str:
    """The significance tests of the table's cells, with the number of cells each when they differ."""
    counts = table.loc[table["test"] != "", "test"].value_counts(sort=False)
    if len(counts) == 0:
        return "two-sided Mann–Whitney U (no cell had ok runs on both sides)"
    if len(counts) == 1:
        return str(counts.index[0])
    return "; ".join(f"{t} in {n} cell(s)" for t, n in counts.items())


def fmt_number(v, spec: str) -> str:
    """A number in `spec`; "–" for None, NaN or infinity."""
    return format(v, spec) if isinstance(v, (int, float)) and np.isfinite(v) else "–"


def _rows(table: pd.DataFrame, params: list) -> list:
    return [[r["cell"]] + [format_value(p, r[p]) for p in params] + [
            f"{r['n_base']}/{r['n_cand']}", fmt_number(r["base_median"], ".3f"),
            fmt_number(r["cand_median"], ".3f"), fmt_number(r["change_pct"], "+.1f"), fmt_number(r["p_value"], ".3g"),
            format_detectable(r["detectable_pct"]),
            r["verdict"] + (f" (needs {r['needs']})" if r["verdict"] == CANNOT_TELL and r["needs"] else "")]
            for _, r in table.iterrows()]


_NOT_PARAMS = ("cell", "n_base", "n_cand", "base_failed", "cand_failed", "base_median", "cand_median", "change_pct",
               "p_value", "test", "verdict", "detectable_pct", "needs")


def cell_labels(table: pd.DataFrame) -> dict:
    """cell id -> 'write→read (buffer=64KiB)': the modes, then the other parameters that vary."""
    params = [c for c in table.columns if c not in _NOT_PARAMS]
    out = {}
    for _, r in table.iterrows():
        modes = "→".join(format_value(p, r[p]) for p in ("send_mode", "recv_mode") if p in params)
        rest = ", ".join(f"{p}={format_value(p, r[p])}" for p in params if p not in ("send_mode", "recv_mode"))
        out[r["cell"]] = " ".join(x for x in (modes, f"({rest})" if rest else "") if x) or r["cell"]
    return out


def gate_of(table: pd.DataFrame, base: "Completeness", cand: "Completeness") -> "Gate":
    """The overall verdict and exit code of comparing two result sets (zcorch.analysis.gate)."""
    labels = cell_labels(table)
    return compare_gate(zip(table["cell"], table["verdict"]), base, cand, labels, judged_cells(table, labels))


def judged_cells(table: pd.DataFrame, labels: "Optional[dict]" = None) -> "list[CellJudged]":
    """The cells of compare's table measured on both sides, as the gate reads them."""
    labels = labels if labels is not None else cell_labels(table)
    both = table[(table["n_base"] > 0) & (table["n_cand"] > 0)]
    return [CellJudged(labels.get(r.cell, r.cell), r.verdict, float(r.change_pct), float(r.p_value),
                       float(r.detectable_pct), str(r.needs or "")) for r in both.itertuples(index=False)]


def cells_json(table: pd.DataFrame) -> list:
    """compare's table as JSON records; the detectable change as a number (null: none, or not judged) and words."""
    cells = json.loads(table.to_json(orient="records"))
    for cell, d in zip(cells, table["detectable_pct"]):   # inf is no JSON number
        cell["detectable_pct"] = float(d) if math.isfinite(d) else None
        cell["detectable"] = format_detectable(d)
    return cells


def render(table: pd.DataFrame, fmt: str = "text", base_name: str = "base", cand_name: str = "candidate",
           gate: "Optional[Gate]" = None, host_changes: "Optional[list]" = None) -> str:
    """The comparison as plain text, markdown or JSON; `gate`'s line heads it, `host_changes` follow."""
    metric, thr, alpha = table.attrs["metric"], table.attrs["threshold_pct"], table.attrs["alpha"]
    if fmt == "json":
        doc = dict(gate.as_dict() if gate else {}, metric=metric, threshold_pct=thr, alpha=alpha, power=POWER,
                   base=base_name, candidate=cand_name, cells=cells_json(table))
        if host_changes is not None:
            doc["host_changes"] = list(host_changes)
        return json.dumps(doc, indent=1) + "\n"
    hosts = None if host_changes is None else (
        "hosts: " + "; ".join(host_changes) if host_changes else "hosts: no recorded change (meta.json)")
    params = [c for c in table.columns if c not in _NOT_PARAMS]
    header = ["cell"] + params + ["n base/cand", f"base {metric}", f"cand {metric}", "change %", "p", "could see",
                                  "verdict"]
    declared = metrics.get(metric)
    what = f"{metric} ({declared.unit}, {declared.better} is better)"
    bad = table[table["verdict"].isin(VERDICTS_BAD)]
    summary = ", ".join(f"{n} {v}" for v, n in table["verdict"].value_counts().items())
    method = (f"median of ok repeats; significance: {tests_used(table)}, alpha {alpha}; threshold {thr}%; "
              f"'could see': the smallest change each cell's runs would show at alpha with {POWER:.0%} power")
    small = table[(table["n_base"] > 0) & (table["n_cand"] > 0)]
    caveat = ""
    if len(small) and (small.apply(lambda r: min_p_value(int(r["n_base"]), int(r["n_cand"])), axis=1) >= alpha).any():
        caveat = "some cells have too few repeats to ever reach significance (use >= 4 repeats a side at alpha 0.05)"
    headline = (f"{gate.verdict.upper() if gate.code else gate.verdict}: {gate.reason}" if gate is not None else
                f"REGRESSION: {len(bad)} cell(s) regressed or failed" if len(bad) else "no significant regression")
    rows = _rows(table, params)
    if fmt == "markdown":
        lines = [f"### zcorch compare: {headline}", "",
                 f"**{base_name}** → **{cand_name}**, metric `{metric}` ({declared.unit}, {declared.better} is "
                 f"better; {summary}). {method}.", ""]
        if hosts:
            lines += [f"**{hosts}**" if host_changes else f"_{hosts}_", ""]
        if caveat:
            lines += [f"_Note: {caveat}._", ""]
        lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(str(v).replace("|", "\\|") for v in r) + " |" for r in rows]
        return "\n".join(lines) + "\n"
    widths = [max([len(str(h))] + [len(str(r[i])) for r in rows]) for i, h in enumerate(header)]
    lines = [f"zcorch compare: {headline}", *([hosts] if hosts else []),
             f"{base_name} -> {cand_name}, metric {what} ({summary})", method]
    if caveat:
        lines.append(f"note: {caveat}")
    lines += ["  ".join(str(v).ljust(w) for v, w in zip(r, widths)) for r in [header, *rows]]
    return "\n".join(lines) + "\n"

