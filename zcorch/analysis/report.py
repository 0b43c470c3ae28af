"""`zcorch report DIR`: a self-contained HTML report of one result set (DIR/report.html, everything inline), rendered
by the autoescaping Jinja2 templates in zcorch/analysis/templates/ from the values gathered here; the plots also
as PNG and SVG under DIR/plots/."""
from __future__ import annotations

import datetime as _dt
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from zcorch import __version__, metrics
from zcorch.analysis.filesystems import filesystem_cells, filesystem_summary, side_by_side
from zcorch.analysis.frames import (OK, load_baselines, load_meta, read_experiment_text, read_manifest, read_meta,
                                    result_dir)
from zcorch.analysis.templating import environment, text
from zcorch.results import setfiles
from zcorch.analysis.load import load
from zcorch.analysis.plots import _combo_label, _keys, _select, all_plots, data_uri, default_view, save
from zcorch.analysis.samples import load_samples
from zcorch.config.baselines.registry import SHARE_RECORDS
from zcorch.config.views import View
from zcorch.analysis import reproduction as rp
from zcorch.config.sections import reference_of, views_of
from zcorch.errors import ConfigError
from zcorch.params import format_value
from zcorch.analysis.stats import ci_label, ci_method, format_rate, format_spread, summarize, varying_params


@dataclass
class Table:
    """A table of text for the templates' `table` macro, without the columns (but the first) no row has a value in;
    `classes`: a CSS class per column ('num', 'cell') or None."""
    header: list
    rows: list
    classes: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.header = list(self.header)
        self.rows = [list(r) for r in self.rows]
        self.classes = list(self.classes) + [None] * (len(self.header) - len(self.classes))
        if self.rows:
            keep = [i for i in range(len(self.header)) if i == 0 or any(text(r[i]) != "" for r in self.rows)]
            self.header = [self.header[i] for i in keep]
            self.classes = [self.classes[i] for i in keep]
            self.rows = [[r[i] for i in keep] for r in self.rows]


@functools.lru_cache(maxsize=None)
def _num(value, fmt: str = "{:.2f}") -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return ""
    return fmt.format(v) if np.isfinite(v) else ""


# What each section shows (the templates lay it out)


def experiment_section(manifest: dict, experiment_text: str) -> dict:
    keys = ["name", "status", "created", "finished", "zcorch_version", "git_revision", "command",
            "accept_new_host_keys", "inventory", "overrides", "resumed"]
    given = [(k, manifest[k]) for k in keys if manifest.get(k) is not None and manifest[k] != []]
    rows = [(k, " ".join(map(str, v)) if k == "command" else json.dumps(v) if isinstance(v, (list, dict)) else v)
            for k, v in given]
    return {"table": Table(["", "value"], rows), "text": experiment_text}


def hosts_table(meta: pd.DataFrame) -> Optional[Table]:
    """One column per role, one row per fact; None without host metadata."""
    if not meta.empty and "role" in meta:  # filesystems have their own section
        meta = meta[~meta["role"].astype(str).str.startswith("filesystem:")].reset_index(drop=True)
    if meta.empty or "role" not in meta:
        return None
    roles = list(meta["role"])
    facts = [c for c in meta.columns if c not in ("sweep", "role")]
    rows = []
    for fact in facts:
        values = [meta.iloc[i][fact] for i in range(len(meta))]
        if all(v is None or (isinstance(v, float) and np.isnan(v)) for v in values):
            continue
        rows.append([fact] + values)
    return Table(["fact"] + roles, rows)


def baselines_table(baselines: pd.DataFrame) -> Optional[Table]:
    if baselines.empty:
        return None
    key_cols = [c for c in baselines.columns if c.startswith("key_")]
    rows = []
    for _, b in baselines.iterrows():
        key = ", ".join(f"{c[4:]}={text(b[c])}" for c in key_cols
                        if b[c] is not None and not (isinstance(b[c], float) and np.isnan(b[c])))
        rows.append([b["kind"], b["host"], key, b["status"], _num(b["mb_s"], "{:.0f}"), _num(b["gbit_s"]),
                     b["reason"]])
    return Table(["kind", "host", "parameters", "status", "MB/s", "Gbit/s", "reason"], rows,
                 [None, None, None, None, "num", "num", None])


def filesystems_table(df: pd.DataFrame, baselines: pd.DataFrame, descriptions: dict) -> Optional[Table]:
    """One column per receiving filesystem: what it is, its dd ceilings, what the runs landed on it; None without."""
    summary = filesystem_summary(df, baselines, descriptions)
    if summary.empty:
        return None
    table = side_by_side(summary, filesystem_cells(df, baselines, descriptions))
    rows = [[label] + list(table.loc[label]) for label in table.index]
    return Table(["configuration"] + list(table.columns), rows, [None] + ["cell"] * len(table.columns))


def results_section(df: pd.DataFrame) -> dict:
    """The throughput tables of the default view: rows its colour, columns its x, a table per panel."""
    view, folded = default_view(df, ok_only=False)
    view = View(view.x, view.hue, view.facet, "mb_s")
    tables = []
    s = summarize(df, by=list(view.facet) + list(view.hue) + list(view.x), metrics=["mb_s", "gbit_s"])
    facets, hues, xs = (_keys(df, p) for p in (view.facet, view.hue, view.x))
    for fkey in facets:
        panel = _select(s, view.facet, fkey)
        rows = []
        for hkey in hues:
            part = _select(panel, view.hue, hkey)
            label = _combo_label(view.hue, hkey, named=False) or "all"
            if folded and len(_select(df, view.hue, hkey)):
                first = _select(df, view.hue, hkey).iloc[0]
                label += " (" + ", ".join(f"{p}={format_value(p, first[p])}" for p in folded) + ")"
            picked = [_select(part, view.x, xkey) for xkey in xs]
            cells = ["" if r.empty else format_rate(r["mb_s_median"].iloc[0], r["gbit_s_median"].iloc[0])
                     + "\n" + format_spread(r.iloc[0]) for r in picked]
            if any(cells):
                rows.append([label] + cells)
        corner = f"{'+'.join(view.hue) or ' '} \\ {'+'.join(view.x)}"
        tables.append((_combo_label(view.facet, fkey),
                       Table([corner] + [_combo_label(view.x, k, named=len(view.x) > 1) for k in xs], rows,
                             [None] + ["cell"] * len(xs))))
    return {"ci_method": ci_method(), "tables": tables,
            "axes": f"rows: {'+'.join(view.hue) or '–'}; columns: {'+'.join(view.x)}"
                    + (f"; one table per {'+'.join(view.facet)}" if view.facet else "")}


# The CPU columns of the tables (metrics of zcorch.metrics: their headers are the table's labels and units).
CELL_CPU_METRICS = ("send_cpu_s_per_gib", "recv_cpu_s_per_gib", "send_host_busy_s_per_gib", "recv_host_busy_s_per_gib")
CPU_SECTION_METRICS = ("send_cpu_s_per_gib", "send_cpu_copies", "send_host_busy_s_per_gib", "send_host_busy_copies",
                       "recv_cpu_s_per_gib", "recv_cpu_copies", "recv_host_busy_s_per_gib", "recv_host_busy_copies",
                       "total_host_busy_s_per_gib")


def _header(name: str) -> str:
    """A metric's column header: `send process CPU s/GiB`; one in copies of the data beside it: `send in copies`."""
    m = metrics.get(name)
    return f"{m.side} in {m.unit}" if m.unit == "copies" else f"{m.label} {m.unit}"


def _cpu_median(r: pd.Series, name: str) -> str:
    return _median(r, name, "{:.1f}×" if metrics.get(name).unit == "copies" else "{:.3f}")


def _median(r: pd.Series, metric: str, fmt: str = "{:.3f}") -> str:
    return _num(r.get(f"{metric}_median"), fmt)


def cell_zc_verdicts(df: pd.DataFrame) -> dict:
    """{cell: zero-copy verdict (zcorch.results.rates.zc_label)} over the summed reports of each cell's ok runs."""
    from zcorch.results.rates import zc_label

    def total(group: pd.DataFrame, column: str) -> Optional[float]:
        values = pd.to_numeric(group[column], errors="coerce") if column in group else None
        return float(values.sum()) if values is not None and values.notna().any() else None

    ok = df[df["status"] == OK]
    out = {}
    for cell, group in ok.groupby("cell", sort=False):
        sides = [(total(group, side + "zc_completions"), total(group, side + "zc_copied") or 0.0)
                 for side in ("send_", "recv_")]
        reported = [s for s in sides if s[0] is not None]
        completions = sum(c for c, _ in reported) if reported else None
        copied = sum(k for _, k in reported) if reported else None
        out[cell] = zc_label(completions, copied, total(group, "recv_zc_recv_mapped"),
                             total(group, "recv_zc_recv_copied"))
    return out


def cell_cpu_resolutions(df: pd.DataFrame) -> dict:
    """{cell: host-CPU resolution} over the ok runs of each cell (zcorch.results.rates.cell_cpu_resolution)."""
    from zcorch.results.rates import cell_cpu_resolution

    if "cpu_resolution" not in df:
        return {}
    ok = df[df["status"] == OK]
    return {cell: cell_cpu_resolution(group["cpu_resolution"]) for cell, group in ok.groupby("cell", sort=False)}


def cells_table(df: pd.DataFrame) -> Table:
    s = summarize(df, metrics=["mb_s", "gbit_s", *CELL_CPU_METRICS])
    params = [c for c in varying_params(df, with_members=True) if c in s]
    s = by_mode(s, params)
    verdicts = cell_zc_verdicts(df)
    resolutions = cell_cpu_resolutions(df)
    adaptive = "converged" in s   # repeats: {min, max, target_ci}: did each cell converge, how wide it got
    header = params + ["n", "failed", "MB/s median", "MB/s CI (level)", "Gbit/s median",
                       *map(_header, CELL_CPU_METRICS), "zero-copy", "host CPU resolution"] \
        + (["converged (95% CI ±)"] if adaptive else []) + ["cell id"]
    rows = []
    for _, r in s.iterrows():
        ci = (f"{_num(r['mb_s_ci_low'], '{:.0f}')}–{_num(r['mb_s_ci_high'], '{:.0f}')} ({ci_label(r['mb_s_ci_level'])})"
              if np.isfinite(r["mb_s_ci_low"]) else "")
        rows.append(_values(r, params)
                    + [r["n"], r["n_failed"] or "", _num(r["mb_s_median"], "{:.0f}"), ci, _num(r["gbit_s_median"]),
                       *(_cpu_median(r, m) for m in CELL_CPU_METRICS), verdicts.get(r["cell"], ""),
                       resolutions.get(r["cell"], "")]
                    + ([_converged(r)] if adaptive else []) + [r["cell"]])
    return Table(header, rows, ["nowrap"] * len(params) + ["num", "num", "num", "num nowrap", "num"]
                 + ["num"] * len(CELL_CPU_METRICS) + [None] * (3 if adaptive else 2) + ["nowrap"])


def _values(r: pd.Series, params: list) -> list:
    """A row's parameter values as the tables show them ("" where missing)."""
    return ["" if pd.isna(r[p]) else format_value(p, r[p]) for p in params]


def by_mode(summary: pd.DataFrame, params: list) -> pd.DataFrame:
    """A per-cell summary ordered by the modes, then the other parameters (numbers as numbers, missing first)."""
    keys = [p for p in ["send_mode", "recv_mode"] + [p for p in params if p not in ("send_mode", "recv_mode")]
            if p in summary]
    if not keys or summary.empty:
        return summary

    def norm(key):  # NaN never equals itself: missing values as None on both sides of the lookup
        return tuple(None if pd.isna(v) else v for v in key)
    order = {norm(key): i for i, key in enumerate(_keys(summary, keys))}
    rank = [order.get(norm(r), len(order)) for r in summary[keys].itertuples(index=False, name=None)]
    return summary.assign(_order=rank).sort_values(["_order", "cell"], kind="stable").drop(columns="_order")


def _converged(r: pd.Series) -> str:
    """`yes (±1.2%)` / `no (±3.4%)` / `no (n<6)`, as the end-of-run summary says it."""
    width = f"±{r['width_pct']:.1f}%" if np.isfinite(r["width_pct"]) else "n<6"
    return f"{'yes' if r['converged'] else 'no'} ({width})"


def _measured(cal: dict) -> str:
    """`for this sweep` / `cached, 3.2 h before` (with why a cache was not used, when it was not)."""
    if "cached" not in cal:
        return ""
    if cal["cached"]:
        return f"cached, {float(cal.get('age_s') or 0) / 3600:.1f} h before"
    why = (cal.get("cache") or {}).get("why")
    status = (cal.get("cache") or {}).get("status")
    return "for this sweep" + (f" ({status}: {why})" if why else f" ({status})" if status else "")


def calibration_table(meta: dict) -> Optional[Table]:
    """The copy-cost yardsticks of each host (meta.json hosts.<role>.calibration); None without any."""
    hosts = meta.get("hosts") or {}
    cals = {role: (hosts.get(role) or {}).get("calibration") for role in ("sender", "receiver")}
    if not any(isinstance(c, dict) for c in cals.values()):
        return None
    facts = [("one copy of a GiB (memcpy, s)", "memcpy_s_per_gib", "{:.4f}"),
             ("memcpy bandwidth (GiB/s, median round)", "memcpy_gib_s", "{:.2f}"),
             ("memcpy, best round (s per GiB)", "memcpy_best_s_per_gib", "{:.4f}"),
             ("memcpy buffer (bytes)", "memcpy_bytes", "{:.0f}"),
             ("page fault + zeroing of a fresh 4 KiB page (ns)", "fault_ns_per_page", "{:.0f}"),
             ("first touch of a GiB of fresh pages (s)", "fault_s_per_gib", "{:.4f}"),
             ("trivial system call, getppid (ns)", "syscall_ns_per_call", "{:.0f}")]
    rows = [[label] + [_num(c.get(key), fmt) if isinstance(c, dict) else "" for c in cals.values()]
            for label, key, fmt in facts]
    if any(isinstance(c, dict) and "cached" in c for c in cals.values()):   # zcorch.worker.calcache
        rows.append(["measured"] + [_measured(c) if isinstance(c, dict) else "" for c in cals.values()])
    errors = [(c or {}).get("error") for c in cals.values()]
    if any(errors):
        rows.append(["calibration error"] + [e or "" for e in errors])
    return Table(["", "sender", "receiver"], rows, [None, "num", "num"])


SIDE_WORDS = {"sender": "send", "receiver": "recv", "both hosts": "both"}  # short headers: the legend says the rest


def headline(ranking: dict) -> str:
    """One sentence with the answer of a ranking: the fastest group and the efficient configurations."""
    modes = [e for e in ranking["modes"] if e["rank"]]
    if not modes:
        return "No configuration has an ok run."
    top = [e for e in modes if e["group"] == modes[0]["group"]]
    lead = modes[0]
    ci = lead["mb_s_ci"]
    text = (f"Fastest: {lead['label']}, {lead['mb_s']:.0f} MB/s"
            + (f" ({ci['label']} {ci['low']:.0f}–{ci['high']:.0f})" if ci else " (no interval)"))
    if len(top) > 1:
        seen = [e["versus_fastest"]["resolves_pct"] for e in top[1:] if (e.get("versus_fastest") or {}).get("resolves_pct")
                is not None]
        text += (f"; cannot tell it apart from {len(top) - 1} other(s)"
                 + (f" (these runs separate differences of ≥ {max(seen):.2g}% at most)" if len(seen) == len(top) - 1
                    else " (some have fewer than two ok runs: no interval to separate)")
                 + ": " + "; ".join(e["label"] for e in top[1:]))
    elif len(modes) > 1:
        text += ", ahead of the rest by this rule"
    eff = [e["label"] for e in modes if e["efficient"]]
    if eff:
        text += ". Efficient (Pareto front of throughput and CPU per GiB): " + "; ".join(eff)
    return text + "."


def findings_section(found: dict) -> dict:
    """The Findings for the page: a table per ranking, empty columns dropped."""
    from zcorch.analysis.findings import CPU_COLUMNS, table_row

    rankings = []
    for ranking in found["rankings"]:
        kinds = [k for k in SHARE_RECORDS if any(k in e["share_of_baseline"] for e in ranking["modes"])]
        header = (["rank", "group", "configuration", "MB/s", "MB/s interval (level)", "Gbit/s", "ok runs"]
                  + [f"{view} {SIDE_WORDS[side]} ({metrics.get(c).unit})" for c, view, side in CPU_COLUMNS]
                  + [f"% of {k}" for k in kinds] + ["flags"])
        classes = ["num", "num", None, "num", "num nowrap", "num", "num"] + ["num"] * len(CPU_COLUMNS) \
            + ["num"] * len(kinds) + [None]
        rows = [{"group": e["group"], "efficient": e["efficient"], "flagged": bool(e["flags"]),
                 "cells": table_row(e, [c for c, _, _ in CPU_COLUMNS], kinds, " ◆", gbit=True)}
                for e in ranking["modes"]]
        keep = [i for i in range(len(header)) if i < 3 or any(text(r["cells"][i]) != "" for r in rows)]
        for r in rows:
            r["cells"] = [r["cells"][i] for i in keep]
        baselines = "; ".join(f"{b['name']} {b['mb_s']:.0f} MB/s" for b in ranking["baselines"])
        rankings.append({"label": ranking["label"], "headline": headline(ranking), "header": [header[i] for i in keep],
                         "classes": [classes[i] for i in keep], "rows": rows, "baselines": baselines,
                         "n_groups": max([e["group"] or 0 for e in ranking["modes"]] or [0])})
    return {"rankings": rankings, "rule": found["grouping_rule"], "flags": found["flags"],
            "context": ", ".join(found["context_params"]), "have_host": found["have_host_cpu"],
            "efficiency": found["efficiency_metric"]}


def _data_links(meta: dict) -> list:
    """[(role, interface name, kind)] of the data links that always copy (loopback, veth)."""
    out = []
    for role in ("sender", "receiver"):
        iface = ((meta.get("hosts") or {}).get(role) or {}).get("interface") or {}
        name, kind = iface.get("name"), iface.get("kind")
        if kind in ("loopback", "veth") or (kind is None and name == "lo"):
            out.append((role, name, kind or "loopback"))
    return out


def cpu_section(df: pd.DataFrame, meta: dict) -> dict:
    """Where the CPU goes: both CPU views per cell in copies of the data, the yardsticks, the data links."""
    ok = df[df["status"] == OK]
    have_host = any(c in ok and ok[c].notna().any() for c in ("send_host_busy_s_per_gib", "recv_host_busy_s_per_gib"))
    same = "same_host" in ok and bool(ok["same_host"].fillna(False).astype(bool).any())
    table = None
    if len(ok):
        s = summarize(df, metrics=CPU_SECTION_METRICS)
        params = [c for c in varying_params(df) if c in s]
        s = by_mode(s, params)
        header = params + [_header(m) for m in CPU_SECTION_METRICS]
        rows = [_values(r, params) + [_cpu_median(r, m) for m in CPU_SECTION_METRICS]
                for _, r in s[s["n"] > 0].iterrows()]
        table = Table(header, rows, ["nowrap"] * len(params) + ["num"] * len(CPU_SECTION_METRICS))
    verdicts = set(cell_zc_verdicts(df).values()) - {"n/a"}
    links = _data_links(meta) if verdicts else []
    return {"table": table, "calibration": calibration_table(meta), "have_host": have_host, "same_host": same,
            "links": [f"{name or '?'} ({kind}) on the {role}" for role, name, kind in links],
            "have_copy": any(c in df and df[c].notna().any() for c in ("send_copy_s_per_gib", "recv_copy_s_per_gib"))}


def reproduction_section(experiment_text: str, path: str, df: pd.DataFrame,
                         baselines: pd.DataFrame, meta: Optional[dict] = None) -> Optional[dict]:
    """The study's published figures and claims next to this run (None: the experiment has no `reference:`)."""
    try:
        ref = reference_of(experiment_text, path)
    except ConfigError as exc:
        return {"error": str(exc)}
    if ref is None:
        return None
    claims = rp.claims(df, ref, baselines, rp.host_facts(meta))
    return {"error": None, "source": ref.source, "setup": " ".join(ref.setup.split()),
            "ci": ci_method(),
            "baselines": Table(rp.BASELINE_HEADER, rp.baseline_table(ref, baselines)) if ref.baselines else None,
            "figures": Table(rp.FIGURE_HEADER, rp.figure_table(rp.figures(df, baselines, ref)),
                             [None, None, None, "num", "num", "num", "num", "num"]) if ref.figures else None,
            "claim_header": rp.CLAIM_HEADER, "claims": rp.claim_table(claims), "counts": rp.verdict_counts(claims)}


def plots_section(plots: list) -> list:
    """Per plot: title, note and the PNG as a data URI (None for a plot that does not apply)."""
    return [{"title": p.title, "note": p.note, "uri": data_uri(p, "png") if p.figure is not None else None}
            for p in plots]


def failed_table(df: pd.DataFrame) -> Optional[Table]:
    failed = df[df["status"] != OK]
    if failed.empty:
        return None
    params = varying_params(df)
    failed = by_mode(failed, params)
    rows = [_values(r, params)
            + [r["repeat"], r["status"], r["reason"], r.get("log"), r["cell"]] for _, r in failed.iterrows()]
    return Table(params + ["repeat", "status", "reason", "log", "cell id"], rows,
                 ["nowrap"] * len(params) + ["num", None, None, None, "nowrap"])


# The sections in the page's order (id, heading; template `<id>.html.j2`); the page lists those present.
SECTIONS = [("findings", "Findings"), ("reproduction", "Reproduction"), ("results", "Results"),
            ("cpu", "Where the CPU goes"), ("plots", "Plots"), ("baselines", "Baselines"),
            ("filesystems", "Filesystems"), ("cells", "Every cell"), ("failed", "Failed runs"),
            ("hosts", "Hosts"), ("experiment", "Experiment")]


def build_report(path, plot_formats: Sequence[str] = ()) -> str:
    """The report of one result set as an HTML string; its plots also saved under DIR/plots/ in `plot_formats`."""
    from zcorch.analysis.findings import findings
    from zcorch.analysis.hosts import comparison
    from zcorch.analysis.plots import efficiency

    d = result_dir(path)
    manifest = read_manifest(d)
    df = load(d)
    baselines = load_baselines(d)
    meta = load_meta(d)
    raw_meta = read_meta(d)
    descriptions = raw_meta.get("filesystems") or {}
    exp_file, experiment_text = read_experiment_text(d, manifest)
    try:   # the experiment's `report:` views; none (the default view) when they cannot be read
        declared = views_of(experiment_text, str(exp_file)) if experiment_text is not None else ()
    except ConfigError:
        declared = ()
    experiment_text = "(experiment file missing)" if experiment_text is None else experiment_text
    name = manifest.get("name") or d.name
    plots = all_plots(df, baselines, name, load_samples(d), declared) if len(df) else []
    found = findings(df, baselines) if len(df) else None
    efficiency_plots = efficiency(found, name) if found else []
    if plot_formats:
        save(efficiency_plots + plots, d, plot_formats, "plots")
    context = {
        "name": name, "dir_name": d.name, "version": __version__,
        "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "n_runs": len(df), "n_cells": df["cell"].nunique() if len(df) else 0,
        "n_failed": int((df["status"] != OK).sum()) if len(df) else 0,
        "experiment": experiment_section(manifest, experiment_text),
        "hosts": comparison(raw_meta), "hosts_raw": hosts_table(meta),
        "baselines": baselines_table(baselines),
        "filesystems": filesystems_table(df, baselines, descriptions),
        "reproduction": reproduction_section(experiment_text, str(exp_file), df, baselines, raw_meta)
        if len(df) else None,
        "findings": findings_section(found) if found else None,
        "efficiency": plots_section(efficiency_plots),
    }
    if len(df):
        context.update(results=results_section(df), plots=plots_section(plots), cells=cells_table(df),
                       cpu=cpu_section(df, raw_meta), failed=failed_table(df))
    present = {"findings": bool(len(df)), "reproduction": bool(context["reproduction"]), "results": bool(len(df)),
               "cpu": bool(len(df)), "plots": bool(len(df)), "filesystems": bool(context["filesystems"]),
               "cells": bool(len(df)), "failed": bool(len(df))}
    # one order: the page includes each present section's template (`<id>.html.j2`) in SECTIONS' order
    context["toc"] = [(anchor, title) for anchor, title in SECTIONS if present.get(anchor, True)]
    context["sections"] = [anchor for anchor, _ in context["toc"]]
    return environment().get_template("report.html.j2").render(context)


def write_report(path, output=None, plot_formats=("png", "svg")) -> Path:
    """Write DIR/report.html (or `output`) and the plots under DIR/plots/; returns the report path."""
    d = result_dir(path)
    out = Path(output) if output else d / "report.html"
    page = build_report(d, plot_formats)
    # an exclusive temporary renamed over the name: a link planted there is replaced, never written through
    return setfiles.write_inside(out.parent, out.name, page.encode("utf-8"))
