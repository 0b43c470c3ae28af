"""`zcorch report DIR --format json|markdown`: the Findings of a result set and its Reproduction section (with a
`reference:`). The JSON is described by docs/schemas/report.schema.json (a field goes there first); numbers are in
the units their names say, null where there is none."""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from zcorch import __version__
from zcorch.analysis import reproduction as rp
from zcorch.analysis.findings import CPU_COLUMNS, findings, table_row
from zcorch.config.baselines.registry import SHARE_RECORDS
from zcorch.analysis.frames import OK, load_baselines, read_experiment_text, read_manifest, read_meta, result_dir
from zcorch.analysis.load import load
from zcorch.config.sections import reference_of
from zcorch.errors import ConfigError

SCHEMA_ID = "https://github.com/zcorch/zcorch/docs/schemas/report.schema.json"
FORMAT = "zcorch-report/1"


def _reproduction(text: str, path: str, df, baselines, meta: Optional[dict] = None) -> Optional[dict]:
    """The Reproduction section as data (None: no `reference:`; {"error"} when it cannot be read)."""
    try:
        ref = reference_of(text, path)
    except ConfigError as exc:
        return {"error": str(exc)}
    if ref is None:
        return None
    claims = rp.claims(df, ref, baselines, rp.host_facts(meta)) if len(df) else []
    figs = rp.figures(df, baselines, ref) if len(df) and ref.figures else []
    return {
        "error": None, "source": dataclasses.asdict(ref.source), "setup": " ".join(ref.setup.split()),
        "baselines": _rows(rp.BASELINE_HEADER, rp.baseline_table(ref, baselines)) if ref.baselines else [],
        "figures": _rows(rp.FIGURE_HEADER, rp.figure_table(figs)),
        "claims": _rows(rp.CLAIM_HEADER, rp.claim_table(claims)),
        "verdicts": rp.verdict_counts(claims) if claims else "",
        "conditions": [{"claim": r.claim.says, "verdict": r.verdict,
                        "checks": [{"condition": c.name, "state": c.state, "detail": c.detail} for c in r.checks]}
                       for r in claims],
    }


def _rows(header: list, rows: list) -> list:
    return [{h: str(v) for h, v in zip(header, r)} for r in rows]


def _clean(value):
    """NaN and infinities as null (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def report_document(path) -> dict:
    """The JSON document of `zcorch report DIR --format json` (docs/schemas/report.schema.json)."""
    d = result_dir(path)
    manifest = read_manifest(d)
    df = load(d)
    baselines = load_baselines(d)
    exp_path, text = read_experiment_text(d, manifest)
    return _clean({
        "$schema": SCHEMA_ID, "format": FORMAT, "zcorch_version": __version__,
        "name": manifest.get("name") or d.name, "result_set": str(d), "status": manifest.get("status"),
        "runs": int(len(df)), "cells": int(df["cell"].nunique()) if len(df) else 0,
        "failed_runs": int((df["status"] != OK).sum()) if len(df) else 0,
        "findings": findings(df, baselines) if len(df) else None,
        "reproduction": _reproduction(text or "", str(exp_path), df, baselines, read_meta(d)),
    })


def findings_markdown(found: dict, name: str) -> str:
    """The Findings as Markdown: per ranking the configurations by throughput, group, CPU per GiB, shares."""
    lines = [f"## Findings: {name}", "",
             f"Ranked by median throughput (MB/s = 10^6 bytes/s at the receiver). Groups: {found['grouping_rule']}. "
             "* marks the efficient configurations (no other is at least as fast for less CPU per GiB).", ""]
    flags = found["flags"]
    lines.append(f"- {flags['failed_runs']} of {flags['runs']} runs failed.")
    lines.append(f"- {flags['short_host_window_runs']} ok run(s) too short to measure host CPU "
                 f"({flags['short_host_window_rule']})." if found["have_host_cpu"] else
                 "- No host CPU in these runs: the process view only.")
    if flags["not_converged_cells"]:
        lines.append(f"- Not converged: {', '.join(flags['not_converged_cells'])}.")
    lines.append("")
    for ranking in found["rankings"]:
        if ranking["label"]:
            lines += [f"### {ranking['label']}", ""]
        kinds = [k for k in SHARE_RECORDS
                 if any(e["share_of_baseline"].get(k, {}).get("share") is not None for e in ranking["modes"])]
        cpus = [(c, view, side) for c, view, side in CPU_COLUMNS
                if any(e["cpu"].get(c) is not None for e in ranking["modes"])]
        header = (["rank", "group", "configuration", "MB/s", "interval (level)", "ok runs"]
                  + [f"{view} CPU s/GiB, {side}" for _, view, side in cpus] + [f"% of {k}" for k in kinds] + ["flags"])
        rows = [table_row(e, [c for c, _, _ in cpus], kinds, " *") for e in ranking["modes"]]
        lines += rp.markdown_table(header, rows)
        if ranking["baselines"]:
            lines += ["Baselines: " + "; ".join(f"{b['name']} {b['mb_s']:.0f} MB/s" for b in ranking["baselines"]) + ".",
                      ""]
    return "\n".join(lines)


def report_markdown(path) -> str:
    """`zcorch report DIR --format markdown`: the Findings, then the Reproduction section when there is one."""
    d = result_dir(path)
    manifest = read_manifest(d)
    df = load(d)
    name, baselines = manifest.get("name") or d.name, load_baselines(d)
    parts = [findings_markdown(findings(df, baselines), name) if len(df)
             else f"## Findings: {name}\n\nNo runs recorded yet.\n"]
    exp_path, text = read_experiment_text(d, manifest)
    ref = reference_of(text or "", str(exp_path))
    if ref is not None:
        parts.append(rp.markdown(ref, df, baselines, name, rp.host_facts(read_meta(d))))
    return "\n".join(parts)
