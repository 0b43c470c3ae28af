"""`zcorch compare BASE CANDIDATE`: did a sweep get slower? (for nightly runs and CI)

Per cell (matched by cell id, i.e. identical parameters): the median of the metric on each side,
the change in %, and a two-sided Mann–Whitney U test of the ok repeats (scipy.stats.mannwhitneyu: the
exact distribution up to 20 runs a side without ties, the exact permutation distribution of small
samples with ties, the normal approximation otherwise; see stats.mann_whitney_u). Each cell's `test`
names the method, and the text and markdown output say which were used. Verdicts:

- `regressed` / `improved`: the change is beyond the threshold in the bad / good direction and
  significant (p < alpha);
- `failed`: the candidate has no successful run where the base had some (counts as a regression);
- `unchanged`: within the threshold; `not significant`: beyond the threshold but not significant
  (with 3 repeats a side the smallest possible p is 0.1: use ≥ 5 repeats for nightly comparisons);
- cells present on one side only are listed separately.

The overall verdict and exit code (0 no regression, 1 regression, 3 incomplete: a failed or short set, a
cell on one side only, no cell in common) are zcorch.analysis.gate's.
"""
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
from zcorch.analysis.gate import DEFAULT_ALPHA, DEFAULT_THRESHOLD_PCT, Completeness, Gate, compare_gate
from zcorch.analysis.stats import can_be_significant, mann_whitney_u, min_p_value, varying_params

# The metrics that can be compared are those of zcorch.metrics with a better direction (metrics.DIRECTED):
# a rise of a CPU cost is a regression, as is a fall of a throughput.
VERDICTS_BAD = ("regressed", "failed")


def compare_frames(base: pd.DataFrame, cand: pd.DataFrame, metric: str = "gbit_s",
                   threshold_pct: float = DEFAULT_THRESHOLD_PCT, alpha: float = DEFAULT_ALPHA,
                   test_all: bool = True) -> pd.DataFrame:
    """One row per cell: params, n_base, n_cand, base_median, cand_median, change_pct, p_value,
    test, verdict. Cells on one side only have verdict 'only in base' / 'only in candidate'.
    test_all=False: no significance test where the change is within the threshold (see judge)."""
    declared = metrics.directed(metric)   # ValueError for a metric without a direction
    params = [p for p in varying_params(pd.concat([base, cand], ignore_index=True))]
    rows = []
    cells = list(dict.fromkeys(list(base["cell"]) + list(cand["cell"])))
    base_groups, cand_groups = dict(list(base.groupby("cell"))), dict(list(cand.groupby("cell")))
    empty = base.iloc[0:0]
    for cell in cells:
        b, c = base_groups.get(cell, empty), cand_groups.get(cell, empty)
        any_side = b if len(b) else c
        row = {"cell": cell}
        for p in params:
            row[p] = any_side[p].iloc[0] if p in any_side else None
        bv = b.loc[b["status"] == OK, metric].dropna().to_numpy(dtype=float)
        cv = c.loc[c["status"] == OK, metric].dropna().to_numpy(dtype=float)
        row.update(n_base=len(bv), n_cand=len(cv), base_failed=len(b) - len(bv), cand_failed=len(c) - len(cv),
                   base_median=float(np.median(bv)) if len(bv) else math.nan,
                   cand_median=float(np.median(cv)) if len(cv) else math.nan,
                   change_pct=math.nan, p_value=math.nan, test="")
        if not len(b):
            row["verdict"] = "only in candidate"
        elif not len(c):
            row["verdict"] = "only in base"
        elif len(bv) and not len(cv):
            row["verdict"] = "failed"
        elif not len(bv):
            row["verdict"] = "no base data" if not len(cv) else "fixed"
        else:
            j = judge(bv, cv, declared.better == "higher", threshold_pct, alpha, test_all)
            row.update(change_pct=j.change_pct, p_value=j.p_value, test=j.test, verdict=j.verdict)
        rows.append(row)
    cols = ["cell"] + params + ["n_base", "n_cand", "base_failed", "cand_failed", "base_median", "cand_median",
                                "change_pct", "p_value", "test", "verdict"]
    out = pd.DataFrame(rows, columns=cols)
    out.attrs.update(metric=metric, threshold_pct=threshold_pct, alpha=alpha)
    return out


@dataclass(frozen=True)
class Judgement:
    verdict: str        # regressed, improved, unchanged, not significant
    change_pct: float   # of the candidate's median against the base's
    p_value: float
    test: str           # the significance test, in words


def judge(base: np.ndarray, cand: np.ndarray, higher_better: bool, threshold_pct: float = DEFAULT_THRESHOLD_PCT,
          alpha: float = DEFAULT_ALPHA, test_all: bool = True) -> Judgement:
    """The verdict on two non-empty samples of ok runs (the rule of the module docstring): a pure function,
    shared by compare_frames, zcorch history and benchmarks/bench_detector.py. test_all=False: a change
    within the threshold is `unchanged` whatever the test says, so it is not tested (p NaN), nor is a change
    beyond it where samples of these sizes cannot reach p < alpha (stats.can_be_significant: `not significant`
    whatever the values): the verdict is the same, and scipy is not even imported when no change needs a
    test (the end of a fleet run)."""
    b_med, c_med = float(np.median(base)), float(np.median(cand))
    change = (c_med - b_med) / b_med * 100 if b_med else math.nan
    if not test_all and not abs(change) > threshold_pct:
        return Judgement("unchanged", change, math.nan, "not tested (within the threshold)")
    n_base, n_cand = int(np.count_nonzero(~np.isnan(base))), int(np.count_nonzero(~np.isnan(cand)))
    if not test_all and not can_be_significant(n_base, n_cand, alpha):
        return Judgement("not significant", change, math.nan,
                         f"not tested ({n_base} against {n_cand} runs cannot reach p < {alpha})")
    mw = mann_whitney_u(base, cand)
    worse = change < 0 if higher_better else change > 0
    if not abs(change) > threshold_pct:
        verdict = "unchanged"
    elif mw.p_value < alpha:
        verdict = "regressed" if worse else "improved"
    else:
        verdict = "not significant"
    return Judgement(verdict, change, mw.p_value, mw.description)


def regressed(table: pd.DataFrame) -> bool:
    return bool(table["verdict"].isin(VERDICTS_BAD).any())


def tests_used(table: pd.DataFrame) -> str:
    """The significance tests of the table's cells, e.g. 'two-sided Mann–Whitney U
    (scipy.stats.mannwhitneyu, exact)', with the number of cells each when they differ."""
    counts = table.loc[table["test"] != "", "test"].value_counts(sort=False)
    if len(counts) == 0:
        return "two-sided Mann–Whitney U (no cell had ok runs on both sides)"
    if len(counts) == 1:
        return str(counts.index[0])
    return "; ".join(f"{t} in {n} cell(s)" for t, n in counts.items())


def _fmt(v, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) and np.isfinite(v) else "–"


def _rows(table: pd.DataFrame, params: list) -> list:
    out = []
    for _, r in table.iterrows():
        out.append([r["cell"]] + [format_value(p, r[p]) for p in params] + [
            f"{r['n_base']}/{r['n_cand']}", _fmt(r["base_median"], ".3f"), _fmt(r["cand_median"], ".3f"),
            _fmt(r["change_pct"], "+.1f"), _fmt(r["p_value"], ".3g"), r["verdict"]])
    return out


_NOT_PARAMS = ("cell", "n_base", "n_cand", "base_failed", "cand_failed", "base_median", "cand_median", "change_pct",
               "p_value", "test", "verdict")


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
    return compare_gate(zip(table["cell"], table["verdict"]), base, cand, cell_labels(table))


def render(table: pd.DataFrame, fmt: str = "text", base_name: str = "base", cand_name: str = "candidate",
           gate: "Optional[Gate]" = None) -> str:
    """The comparison as plain text, markdown (mail, CI comment) or JSON (an object: the overall verdict,
    its exit code and reason, the settings and one entry per cell). With `gate`, its line heads the text."""
    metric, thr, alpha = table.attrs["metric"], table.attrs["threshold_pct"], table.attrs["alpha"]
    if fmt == "json":
        doc = dict(gate.as_dict() if gate else {}, metric=metric, threshold_pct=thr, alpha=alpha,
                   base=base_name, candidate=cand_name,
                   cells=json.loads(table.to_json(orient="records")))
        return json.dumps(doc, indent=1) + "\n"
    params = [c for c in table.columns if c not in _NOT_PARAMS]
    header = ["cell"] + params + ["n base/cand", f"base {metric}", f"cand {metric}", "change %", "p", "verdict"]
    declared = metrics.get(metric)
    what = f"{metric} ({declared.unit}, {declared.better} is better)"
    bad = table[table["verdict"].isin(VERDICTS_BAD)]
    counts = table["verdict"].value_counts()
    summary = ", ".join(f"{n} {v}" for v, n in counts.items())
    method = f"median of ok repeats; significance: {tests_used(table)}, alpha {alpha}; threshold {thr}%"
    small = table[(table["n_base"] > 0) & (table["n_cand"] > 0)]
    caveat = ""
    if len(small) and (small.apply(lambda r: min_p_value(int(r["n_base"]), int(r["n_cand"])), axis=1) >= alpha).any():
        caveat = "some cells have too few repeats to ever reach significance (use >= 5 repeats a side)"
    if gate is not None:
        headline = f"{gate.verdict.upper() if gate.code else gate.verdict}: {gate.reason}"
    else:
        headline = (f"REGRESSION: {len(bad)} cell(s) regressed or failed" if len(bad)
                    else "no significant regression")
    rows = _rows(table, params)
    if fmt == "markdown":
        lines = [f"### zcorch compare: {headline}", "",
                 f"**{base_name}** → **{cand_name}**, metric `{metric}` ({declared.unit}, {declared.better} is "
                 f"better; {summary}). {method}.", ""]
        if caveat:
            lines += [f"_Note: {caveat}._", ""]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "|".join("---" for _ in header) + "|")
        for r in rows:
            lines.append("| " + " | ".join(str(v).replace("|", "\\|") for v in r) + " |")
        return "\n".join(lines) + "\n"
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(header)]
    lines = [f"zcorch compare: {headline}", f"{base_name} -> {cand_name}, metric {what} ({summary})",
             method]
    if caveat:
        lines.append(f"note: {caveat}")
    lines.append("  ".join(str(h).ljust(w) for h, w in zip(header, widths)))
    for r in rows:
        lines.append("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
    return "\n".join(lines) + "\n"

