"""`zcorch compare`'s reading: two result sets (compare_sets), or a fleet's pairs side by side (pairs.md): each pair
judged with `zcorch compare`'s statistics and gate against the other pairs' runs pooled, or one pair (`against`)."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from typing import Dict, List, Mapping, Optional

import pandas as pd

from zcorch.analysis.compare import (cell_labels, cells_json, compare_frames, fmt_number, gate_of,
                                     render as render_table)
from zcorch.analysis.gate import (DEFAULT_ALPHA, DEFAULT_THRESHOLD_PCT, EXIT_INCOMPLETE, EXIT_OK, EXIT_REGRESSION,
                                  Completeness, Gate, completeness, sees)
from zcorch.analysis.frames import read_meta
from zcorch.analysis.hostdiff import diff_meta
from zcorch.analysis.load import load
from zcorch.errors import ResultsError
from zcorch.results import setfiles

FLEET_MANIFEST = "fleet.json"   # zcorch.sweep.fleet.FLEET_MANIFEST (analysis does not import the sweep)
DIFFERENT = ("regressed", "improved", "failed", "fixed")


@dataclass(frozen=True)
class Compared:
    table: pd.DataFrame
    gate: Gate
    host_changes: list


def compare_sets(base: str, candidate: str, metric: str = "gbit_s", threshold_pct: float = DEFAULT_THRESHOLD_PCT,
                 alpha: float = DEFAULT_ALPHA, dataset: "Optional[str]" = None) -> Compared:
    """Compare two result sets: their directories, or (`dataset`) two sets of an exported dataset."""
    if dataset is not None:
        from zcorch.analysis.dataset import Dataset  # duckdb: only when reading a dataset

        data = Dataset(dataset, tables=("sets", "runs", "hosts"))
        b, c = data.find(base), data.find(candidate)
        sides = [(s.completeness(), data.runs(s.set_id), data.host_meta(s.set_id)) for s in (b, c)]
    else:
        sides = [(completeness(d), load(d), read_meta(d)) for d in (base, candidate)]
    (b_done, b_runs, b_meta), (c_done, c_runs, c_meta) = sides
    table = compare_frames(b_runs, c_runs, metric, threshold_pct, alpha)
    return Compared(table, gate_of(table, b_done, c_done), diff_meta(b_meta, c_meta))


@dataclass(frozen=True)
class PairComparison:
    pair: str
    reference: str            # "the other pairs (a, c)" or "pair a"
    table: pd.DataFrame       # compare_frames(reference, pair)
    gate: Gate

    def differing(self) -> List[dict]:
        """The cells where this pair differs from its reference: label, verdict, change in %, p."""
        labels = cell_labels(self.table)
        rows = self.table[self.table["verdict"].isin(DIFFERENT)]
        return [{"cell": r["cell"], "label": labels.get(r["cell"], r["cell"]), "verdict": r["verdict"],
                 "change_pct": None if math.isnan(r["change_pct"]) else float(r["change_pct"]),
                 "p_value": None if math.isnan(r["p_value"]) else float(r["p_value"]),
                 "reference_median": _num(r["base_median"]), "pair_median": _num(r["cand_median"])}
                for _, r in rows.iterrows()]


@dataclass(frozen=True)
class PairsComparison:
    directory: str
    metric: str
    threshold_pct: float
    alpha: float
    against: Optional[str]
    pairs: List[PairComparison]
    gate: Gate

    def different_pairs(self) -> Dict[str, List[dict]]:
        return {p.pair: p.differing() for p in self.pairs if p.differing()}


def _num(x) -> Optional[float]:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def fleet_pairs(directory: str) -> Dict[str, str]:
    """pair -> result set path, from FLEET/fleet.json (ResultsError when it is not a fleet directory)."""
    path = os.path.join(directory, FLEET_MANIFEST)
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(1 << 22))
        pairs = [(str(p["pair"]), p["dir"]) for p in doc["pairs"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ResultsError(f"{directory}: not a fleet directory ({FLEET_MANIFEST}: {exc})") from None
    # each pair's set beneath the fleet directory (setfiles.dir_beneath): `../x` or a link out is refused
    return {pair: setfiles.dir_beneath(directory, rel) for pair, rel in pairs}


def _pooled(parts: List[Completeness], label: str) -> Completeness:
    """One Completeness for several pairs' result sets pooled as one reference."""
    status = next((c.status for c in parts if c.status != "complete"), "complete")
    return replace(parts[0], path=label, status=status, planned=sum(c.planned for c in parts),
                   ok=sum(c.ok for c in parts), cells_planned=frozenset().union(*(c.cells_planned for c in parts)),
                   cells_short=tuple(sorted(set().union(*(c.cells_short for c in parts)))))


def compare_fleet(directory: str, metric: str = "gbit_s", threshold_pct: float = DEFAULT_THRESHOLD_PCT,
                  alpha: float = DEFAULT_ALPHA, against: Optional[str] = None,
                  loaded: Optional[Mapping[str, pd.DataFrame]] = None,
                  test_all: bool = True) -> Optional[PairsComparison]:
    """Every pair of the fleet against its reference; None when fewer than two pairs have a result set, ResultsError
    for an unknown `against`. `loaded`: pair -> its frame where the caller has it. test_all=False: cells within the
    threshold are tested only in a pair that differs somewhere (the same verdicts; agreeing pairs import no scipy)."""
    dirs = fleet_pairs(directory)
    if against is not None and against not in dirs:
        raise ResultsError(f"{directory}: no pair `{against}` (its pairs: {', '.join(dirs)})")
    started = {p: d for p, d in dirs.items() if os.path.isfile(os.path.join(d, "manifest.json"))}
    missing = [(p, "no result set (its sweep never started)") for p in dirs if p not in started]
    if len(started) < 2 or (against is not None and against not in started):
        return None
    loaded = loaded or {}
    frames = {p: loaded[p] if p in loaded else load(d) for p, d in started.items()}
    comp = {p: completeness(d) for p, d in started.items()}
    # the pooled reference: the pairs that measured something (one that ran no cell is judged, not a reference)
    measured = [p for p in started if len(frames[p]) and (frames[p]["status"] == "ok").any()]
    out: List[PairComparison] = []
    for pair in started:
        if pair == against:
            continue
        refs = [against] if against is not None else [p for p in measured if p != pair]
        if not refs:
            missing.append((pair, "no other pair measured anything to compare it with"))
            continue
        label = f"pair {against}" if against is not None else f"the other pairs ({', '.join(refs)})"
        base = pd.concat([frames[p] for p in refs], ignore_index=True)
        table = compare_frames(base, frames[pair], metric, threshold_pct, alpha, test_all)
        if not test_all and table["verdict"].isin(DIFFERENT).any():   # shown in full: every cell tested
            table = compare_frames(base, frames[pair], metric, threshold_pct, alpha)
        ref_comp = comp[against] if against is not None else _pooled([comp[p] for p in refs], label)
        out.append(PairComparison(pair, label, table, gate_of(table, ref_comp, comp[pair])))
    return PairsComparison(directory, metric, threshold_pct, alpha, against, out, _fleet_gate(out, missing))


def _fleet_gate(pairs: List[PairComparison], missing: "List[tuple[str, str]]") -> Gate:
    worse = [p for p in pairs if p.gate.code == EXIT_REGRESSION]
    short = [p for p in pairs if p.gate.code == EXIT_INCOMPLETE]
    notes = [f"pair {p}: {why}" for p, why in missing] + [f"pair {p.pair}: {p.gate.reason}" for p in short]
    seen = [p.gate.detectable_pct for p in pairs if p.gate.detectable_pct == p.gate.detectable_pct]
    worst = max(seen) if seen else float("nan")
    if worse:
        reason = "; ".join(f"pair {p.pair} is worse than {p.reference}: {p.gate.reason}" for p in worse)
        return Gate(EXIT_REGRESSION, reason + ("; also cannot tell: " + "; ".join(notes) if notes else ""), worst)
    if notes:
        return Gate(EXIT_INCOMPLETE, "; ".join(notes), worst)
    differ = [p.pair for p in pairs if p.differing()]
    if differ:
        return Gate(EXIT_OK, f"no pair worse; better than the rest in some cell: {', '.join(differ)}; {sees(worst)}",
                    worst)
    return Gate(EXIT_OK, f"{len(pairs)} pair(s) compared, none differs; {sees(worst)}", worst)


def render(c: PairsComparison, fmt: str = "text") -> str:
    """The comparison as text, markdown or JSON: which pair differs, where, by how much; then their full tables."""
    if fmt == "json":
        doc = dict(c.gate.as_dict(), metric=c.metric, threshold_pct=c.threshold_pct, alpha=c.alpha,
                   against=c.against, fleet=c.directory,
                   pairs=[dict(p.gate.as_dict(), pair=p.pair, reference=p.reference, differing=p.differing(),
                               cells=cells_json(p.table)) for p in c.pairs])
        return json.dumps(doc, indent=1) + "\n"
    md = fmt == "markdown"
    head = f"{c.gate.verdict.upper() if c.gate.code else c.gate.verdict}: {c.gate.reason}"
    lines = [f"## zcorch compare (pairs): {head}" if md else f"zcorch compare (pairs): {head}", "",
             f"metric {c.metric}; each pair against {'pair ' + c.against if c.against else 'the other pairs pooled'}; "
             f"threshold {c.threshold_pct}%, alpha {c.alpha}", ""]
    for p in c.pairs:
        cells = p.differing()
        if not cells:
            word = "cannot tell whether it differs from" if p.gate.code == EXIT_INCOMPLETE else "no cell differs from"
            lines.append(f"{'- ' if md else ''}pair {p.pair}: {word} {p.reference} ({p.gate.reason})")
            continue
        lines.append(f"{'- ' if md else ''}pair {p.pair} differs from {p.reference} in {len(cells)} cell(s):")
        for cell in cells:
            lines.append(f"{'  - ' if md else '    '}{cell['label']}: {cell['verdict']}, "
                         f"{fmt_number(cell['change_pct'], '+.1f')}% "
                         f"({fmt_number(cell['reference_median'], '.3f')} -> "
                         f"{fmt_number(cell['pair_median'], '.3f')}, p {fmt_number(cell['p_value'], '.3g')})")
    for p in c.pairs:
        if p.differing():
            lines += ["", render_table(p.table, fmt, p.reference, f"pair {p.pair}", p.gate).rstrip("\n")]
    return "\n".join(lines) + "\n"


def exit_code(c: Optional[PairsComparison]) -> int:
    return EXIT_INCOMPLETE if c is None else c.gate.code

