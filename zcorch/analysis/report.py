"""`zcorch report DIR`: a self-contained HTML report of one result set (DIR/report.html).

Everything is inline (CSS, images as data URIs) so the file can be mailed or archived alone; every
value that comes from the result set is HTML-escaped. The plots are also written as PNG and SVG
files under DIR/plots/.
"""
from __future__ import annotations

import datetime as _dt
import html
import json
from pathlib import Path
from typing import Iterable, Optional

import numpy as np
import pandas as pd

from zcorch import __version__
from zcorch.analysis.filesystems import filesystem_cells, filesystem_summary, side_by_side
from zcorch.analysis.frames import OK, load, load_baselines, load_meta, read_manifest, read_meta, result_dir
from zcorch.analysis.plots import all_plots, data_uri, format_value, save, slices
from zcorch.analysis.stats import ci_method, mode_table, summarize, varying_params

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
td { overflow-wrap: anywhere; max-width: 32em; } th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.cell { white-space: pre-line; } .note { color: #666; font-style: italic; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; }
img { max-width: 100%; display: block; margin: 0.5em 0 1.5em; }
.failed { color: #a00; }
"""


def esc(value) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        value = int(value)  # integers that became floats next to missing values in a column
    return html.escape(str(value), quote=True)


def html_table(header: Iterable, rows: Iterable[Iterable], classes: Optional[list] = None) -> str:
    """A table of escaped text; `classes` gives a CSS class per column (e.g. 'num')."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for i, value in enumerate(row):
            cls = f' class="{classes[i]}"' if classes and classes[i] else ""
            cells.append(f"<td{cls}>{esc(value)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _num(value, fmt: str = "{:.2f}") -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return ""
    return fmt.format(v) if np.isfinite(v) else ""


# ---------------------------------------------------------------------------------------------
# Sections


def section_experiment(manifest: dict, experiment_text: str) -> str:
    keys = ["name", "status", "created", "finished", "zcorch_version", "git_revision", "command",
            "accept_new_host_keys", "resumed"]
    rows = []
    for k in keys:
        if k in manifest and manifest[k] is not None:
            v = manifest[k]
            rows.append((k, " ".join(map(str, v)) if k == "command" else
                         json.dumps(v) if isinstance(v, (list, dict)) else v))
    return ("<h2>Experiment</h2>" + html_table(["", "value"], rows)
            + f"<pre>{esc(experiment_text)}</pre>")


def section_hosts(meta: pd.DataFrame) -> str:
    if not meta.empty and "role" in meta:  # filesystems have their own section
        meta = meta[~meta["role"].astype(str).str.startswith("filesystem:")].reset_index(drop=True)
    if meta.empty or "role" not in meta:
        return '<h2>Hosts</h2><p class="note">no host metadata (meta.json missing)</p>'
    roles = list(meta["role"])
    facts = [c for c in meta.columns if c not in ("sweep", "role")]
    rows = []
    for fact in facts:
        values = [meta.iloc[i][fact] for i in range(len(meta))]
        if all(v is None or (isinstance(v, float) and np.isnan(v)) for v in values):
            continue
        rows.append([fact] + values)
    return "<h2>Hosts</h2>" + html_table(["fact"] + roles, rows)


def section_baselines(baselines: pd.DataFrame) -> str:
    if baselines.empty:
        return '<h2>Baselines</h2><p class="note">no baselines in this result set</p>'
    key_cols = [c for c in baselines.columns if c.startswith("key_")]
    rows = []
    for _, b in baselines.iterrows():
        key = ", ".join(f"{c[4:]}={esc(b[c]) if not isinstance(b[c], str) else b[c]}" for c in key_cols
                        if b[c] is not None and not (isinstance(b[c], float) and np.isnan(b[c])))
        rows.append([b["kind"], b["host"], key, b["status"], _num(b["mb_s"], "{:.0f}"), _num(b["gbit_s"]),
                     b["reason"]])
    return "<h2>Baselines</h2>" + html_table(
        ["kind", "host", "parameters", "status", "MB/s", "Gbit/s", "reason"], rows,
        [None, None, None, None, "num", "num", None])


def section_filesystems(df: pd.DataFrame, baselines: pd.DataFrame, descriptions: dict) -> str:
    """One column per receiving filesystem: what it is, its dd ceilings and what the runs landed on it."""
    summary = filesystem_summary(df, baselines, descriptions)
    if summary.empty:
        return ""
    table = side_by_side(summary, filesystem_cells(df, baselines, descriptions))
    rows = [[label] + list(table.loc[label]) for label in table.index]
    return ("<h2>Filesystems</h2>"
            "<p>Each receiving filesystem as the kernel reported it after provisioning (mount options from "
            "/proc/self/mountinfo via findmnt, RAID from mdadm --detail or btrfs filesystem df), its dd "
            "baseline, and the median throughput of the runs that wrote onto it. "
            "Ratio = run MB/s ÷ dd write MB/s (both 10<sup>6</sup> bytes/s until the data is on the "
            "filesystem: dd write + sync; runs: receiver time, including the fsync when the cell asks "
            "for one): can the network path land data as fast as dd writes?</p>"
            + html_table(["configuration"] + list(table.columns), rows, [None] + ["cell"] * len(table.columns)))


def section_mode_tables(df: pd.DataFrame) -> str:
    out = ["<h2>Results: send mode × receive mode</h2>",
           "<p>Median of the successful repeats, MB/s = 10<sup>6</sup> bytes/s as seen by the receiver; "
           f"{esc(ci_method())}.</p>"]
    parts, note = slices(df, ["send_mode", "recv_mode"])
    for label, sub, _ in parts:
        table = mode_table(summarize(sub, by=["send_mode", "recv_mode"], metrics=["mb_s", "gbit_s"]))
        if label:
            out.append(f"<h3>{esc(label)}</h3>")
        rows = [[send] + list(table.loc[send]) for send in table.index]
        out.append(html_table(["send \\ receive"] + list(table.columns), rows,
                              [None] + ["cell"] * len(table.columns)))
    if note:
        out.append(f'<p class="note">{esc(note)}</p>')
    return "".join(out)


def section_cells(df: pd.DataFrame) -> str:
    s = summarize(df)
    params = [c for c in varying_params(df) if c in s]
    header = ["cell"] + params + ["n", "failed", "MB/s median", "MB/s 95% CI", "Gbit/s median",
                                  "send CPU s/GiB", "recv CPU s/GiB"]
    rows = []
    for _, r in s.iterrows():
        ci = (f"{_num(r['mb_s_ci_low'], '{:.0f}')}–{_num(r['mb_s_ci_high'], '{:.0f}')}"
              if np.isfinite(r["mb_s_ci_low"]) else "")
        rows.append([r["cell"]] + [format_value(p, r[p]) for p in params]
                    + [r["n"], r["n_failed"], _num(r["mb_s_median"], "{:.0f}"), ci, _num(r["gbit_s_median"]),
                       _num(r["send_cpu_s_per_gib_median"], "{:.3f}"), _num(r["recv_cpu_s_per_gib_median"], "{:.3f}")])
    classes = [None] * (1 + len(params)) + ["num"] * 7
    return "<h2>Every cell</h2>" + html_table(header, rows, classes)


def section_plots(plots: list) -> str:
    out = ["<h2>Plots</h2>"]
    for plot in plots:
        if plot.figure is None:
            out.append(f'<p class="note">{esc(plot.title)}: {esc(plot.note)}</p>')
            continue
        out.append(f'<img src="{data_uri(plot.figure, "png")}" alt="{esc(plot.title)}">')
        if plot.note:
            out.append(f'<p class="note">{esc(plot.note)}</p>')
    return "".join(out)


def section_failed(df: pd.DataFrame) -> str:
    failed = df[df["status"] != OK]
    if failed.empty:
        return "<h2>Failed runs</h2><p>none</p>"
    params = varying_params(df)
    rows = [[r["cell"], r["repeat"]] + [format_value(p, r[p]) for p in params] + [r["status"], r["reason"], r.get("log")]
            for _, r in failed.iterrows()]
    return ('<h2 class="failed">Failed runs</h2>'
            + html_table(["cell", "repeat"] + params + ["status", "reason", "log"], rows))


# ---------------------------------------------------------------------------------------------


def build_report(path, plots: Optional[list] = None) -> str:
    """The report of one result set as an HTML string."""
    d = result_dir(path)
    manifest = read_manifest(d)
    df = load(d)
    baselines = load_baselines(d)
    meta = load_meta(d)
    descriptions = read_meta(d).get("filesystems") or {}
    exp_file = d / manifest.get("experiment_file", "experiment.yaml")
    experiment_text = exp_file.read_text(errors="replace") if exp_file.is_file() else "(experiment file missing)"
    name = manifest.get("name") or d.name
    if plots is None:
        plots = all_plots(df, baselines, name)
    generated = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>zcorch report: {esc(name)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>zcorch report: {esc(name)}</h1>",
        f'<p class="note">{len(df)} runs in {df["cell"].nunique() if len(df) else 0} cells, '
        f'{int((df["status"] != OK).sum()) if len(df) else 0} failed; result set {esc(d.name)}, '
        f"report by zcorch {esc(__version__)} at {esc(generated)}</p>",
        section_experiment(manifest, experiment_text),
        section_hosts(meta),
        section_baselines(baselines),
        section_filesystems(df, baselines, descriptions),
    ]
    if len(df):
        parts += [section_mode_tables(df), section_plots(plots), section_cells(df), section_failed(df)]
    else:
        parts.append('<p class="note">no runs recorded yet</p>')
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(path, output=None, plot_formats=("png", "svg")) -> Path:
    """Write DIR/report.html (or `output`) and the plots under DIR/plots/; returns the report path."""
    d = result_dir(path)
    manifest = read_manifest(d)
    df = load(d)
    plots = all_plots(df, load_baselines(d), manifest.get("name") or d.name) if len(df) else []
    if plot_formats:
        save(plots, d / "plots", plot_formats)
    out = Path(output) if output else d / "report.html"
    text = build_report(d, plots)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return out

