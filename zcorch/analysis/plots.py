"""Plots of a run frame (matplotlib without pyplot: headless, no global backend touched). Each plot function returns
a list of `Plot`s; one that does not apply comes back with `figure=None` and a `note` why. Other varying parameters
get a plot per combination (a chart too full is split, never cut); only successful runs are drawn."""
from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from zcorch.config.views import View
from zcorch.metrics import BY_NAME as METRICS_BY_NAME
from zcorch.params import format_value
from zcorch.results import setfiles
from zcorch.units import convert
from zcorch.units import format_size
from zcorch.analysis.frames import OK
from zcorch.analysis.stats import linked_axes, mode_label, summarize, varying_params
from zcorch.analysis.trendplot import image_bytes

MAX_PANELS = 12


@dataclass
class Plot:
    name: str  # file stem, unique within a report
    title: str
    figure: Optional[Figure]
    note: Optional[str] = None  # why it was skipped (figure is None) or a caveat
    # each format drawn once: the report embeds the PNG it also writes under plots/
    rendered: dict = field(default_factory=dict, repr=False, compare=False)

    def image(self, fmt: str = "png") -> bytes:
        if fmt not in self.rendered:
            self.rendered[fmt] = image_bytes(self.figure, fmt)
        return self.rendered[fmt]


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == OK]


def slices(df: pd.DataFrame, plotted: Sequence[str]) -> list:
    """[(label, frame, {param: value})] per combination of the varying parameters not plotted."""
    others = [c for c in varying_params(df) if c not in plotted]
    if "sweep" in df and df["sweep"].nunique() > 1 and "sweep" not in plotted:
        others = ["sweep"] + others
    if not others:
        return [("", df, {})]
    groups = [(key if isinstance(key, tuple) else (key,), sub) for key, sub in df.groupby(others, dropna=False)]
    return [(_combo_label(others, key), sub, dict(zip(others, key))) for key, sub in groups]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60]


def _name(base: str, label: str) -> str:
    return f"{base}-{_slug(label)}" if label else base


def _title(exp: str, what: str, label: str) -> str:
    title = f"{exp}: {what}" if exp else what
    return f"{title}\n{label}" if label else title


def _titled(name: str, title: str, fig: Figure, **layout) -> Plot:
    """The Plot of a finished figure, `title` as its heading, laid out (`layout`: tight_layout's)."""
    fig.suptitle(title)
    fig.tight_layout(**layout)
    return Plot(name, title, fig)


def baseline_lines(baselines: "pd.DataFrame | None", params: "dict | None" = None) -> list:
    """[(kind, name, Gbit/s)]: the median of the ok baselines per kind and per key that differs between them,
    preferring those run with a parameter of the plotted slice (`params`, e.g. its buffer)."""
    if baselines is None or baselines.empty:
        return []
    ok = baselines[(baselines["status"] == OK) & baselines["gbit_s"].notna()]
    for param, value in (params or {}).items():
        col = "key_" + param
        if col in ok and not pd.isna(value):
            match = ok[ok[col].astype(object) == value]
            ok = pd.concat([match, ok[(ok["kind"].isin(set(ok["kind"]) - set(match["kind"])))]])
    lines = []
    for kind, group in ok.groupby("kind", sort=True):
        keys = [c for c in group.columns if c.startswith("key_")
                and group[c].astype(str).nunique(dropna=False) > 1]
        parts = group.groupby(keys, dropna=False) if keys else [((), group)]
        for key, part in parts:
            key = key if isinstance(key, tuple) else (key,)
            gbit = float(part["gbit_s"].median())
            what = ", ".join(f"{k[4:]}={format_value(k[4:], v)}" for k, v in zip(keys, key))
            name = f"{kind} ({what})" if what else kind
            lines.append((kind, name, gbit))
    return lines


def copy_line(df: pd.DataFrame, prefix: str) -> "Optional[float]":
    """CPU seconds one memcpy of a GiB costs on that side's host (`<prefix>copy_s_per_gib`), None without one."""
    col = prefix + "copy_s_per_gib"
    if col not in df:
        return None
    values = pd.to_numeric(df[col], errors="coerce").dropna()
    return float(values.median()) if len(values) else None


def draw_copy_line(ax, value: "Optional[float]", label_host: str = "") -> None:
    """The "one copy of the data" reference line on a CPU-per-GiB axis."""
    if value is None:
        return
    where = f" on the {label_host}" if label_host else ""
    ax.axhline(value, linestyle=":", linewidth=1.5, color="black",
               label=f"one copy of the data (memcpy{where}): {value:.3f} s/GiB")


# ---------------------------------------------------------------- small multiples

def _determined_by(df: pd.DataFrame, param: str, by: "Sequence[str]") -> bool:
    """Whether each combination of `by` has one value of `param` (the pinning study's buffer follows the mode)."""
    if not by:
        return False
    return bool((df.groupby(list(by), dropna=False)[param].nunique(dropna=False) <= 1).all())


def _linked(df: pd.DataFrame, params: "Sequence[str]") -> bool:
    """Whether only some combinations of the parameters occur (a linked axis, e.g. the pinning cases)."""
    if len(params) < 2:
        return False
    present = len(df[list(params)].astype(str).drop_duplicates())
    return present < int(np.prod([df[p].astype(str).nunique(dropna=False) for p in params]))


def default_view(df: pd.DataFrame, metric: str = "gbit_s", ok_only: bool = True) -> "tuple[View, list]":
    """(view, folded) for the varying parameters: receive mode along x and send mode as colour, others as x (when
    free), colour and panels; parameters that only follow the colour are `folded` into its labels. `ok_only`: of the
    successful runs (plots), else of all (tables: a cell whose runs all failed keeps its place)."""
    ok = _ok(df) if ok_only else df
    vary = varying_params(ok)
    hue = ["send_mode"] if "send_mode" in vary else []
    x = ["recv_mode"] if "recv_mode" in vary else []
    rest = [p for p in vary if p not in ("send_mode", "recv_mode")]
    folded = [p for p in rest if _determined_by(ok, p, hue)]
    rest = [p for p in rest if p not in folded]
    if not x:
        if rest and _linked(ok, rest):
            x, rest = rest, []
        elif rest:
            x, rest = [rest[0]], rest[1:]
        elif hue:
            x, hue = hue, []
    if not hue and rest:
        hue, rest = [rest[0]], rest[1:]
    if not x:  # nothing varies: one bar
        x = ["send_mode"]
    return View(tuple(x), tuple(hue), tuple(rest), metric), folded


def _combo_label(params: "Sequence[str]", key: tuple, named: bool = True) -> str:
    if len(params) == 1 and not named:
        return format_value(params[0], key[0])
    return ", ".join(f"{p}={format_value(p, v)}" for p, v in zip(params, key))


def _keys(df: pd.DataFrame, params: "Sequence[str]") -> list:
    """The combinations of `params` present, sorted by value (numbers as numbers, missing first)."""
    if not params:
        return [()]
    combos = df[list(params)].drop_duplicates()
    keys = [tuple(r) for r in combos.itertuples(index=False, name=None)]
    axes = linked_axes(df)
    rank = {p: {label: i for i, label in enumerate(axes[p]["labels"])} for p in params if p in axes}

    def order(key):  # a linked axis in the file's order of its values
        return tuple((1, rank[p].get(v, len(rank[p])), str(v)) if p in rank and not pd.isna(v) else
                     (0, 0, "") if pd.isna(v) else (1, float(v), "") if isinstance(v, (int, float, np.number))
                     and not isinstance(v, bool) else (2, 0, str(v)) for p, v in zip(params, key))
    return sorted(keys, key=order)


def _select(df: pd.DataFrame, params: "Sequence[str]", key: tuple) -> pd.DataFrame:
    return df.iloc[_positions(df, params, key)]


def view_summary(df: pd.DataFrame, view: View) -> "tuple[pd.DataFrame, list, list, list]":
    """(summary by facet + hue + x, facet keys, hue keys, x keys) of the ok runs for a view."""
    ok = _ok(df)
    by = list(view.facet) + list(view.hue) + list(view.x)
    missing = [p for p in by if p not in ok]
    if missing:
        raise KeyError(f"the runs have no parameter {missing[0]!r}")
    metrics = [view.metric] if view.metric in ok else []
    s = summarize(ok, by=by, metrics=metrics) if metrics else pd.DataFrame()
    return s, _keys(ok, view.facet), _keys(ok, view.hue), _keys(ok, view.x)


def _in_keys(df: pd.DataFrame, params: "Sequence[str]", keys: list) -> pd.Series:
    """Rows of `df` whose values of `params` are one of `keys`."""
    mask = np.zeros(len(df), dtype=bool)
    for key in keys:
        mask[_positions(df, params, key)] = True
    return pd.Series(mask, index=df.index)


def _positions(df: pd.DataFrame, params: "Sequence[str]", key: tuple) -> np.ndarray:
    mask = np.ones(len(df), dtype=bool)
    for p, v in zip(params, key):
        col = df[p]
        mask &= (col.isna() if pd.isna(v) else (col == v)).to_numpy()
    return np.flatnonzero(mask)


def small_multiples(df: pd.DataFrame, view: View, baselines: "pd.DataFrame | None" = None, experiment: str = "",
                    folded: "Sequence[str]" = (), name: str = "view", part: str = "") -> "Plot | list":
    """One figure: a panel per facet combination, bars per x and hue, median with CI whiskers, baselines as lines on
    throughput panels; more than MAX_PANELS panels: a list of figures."""
    metric = view.metric
    declared = METRICS_BY_NAME.get(metric)
    unit = declared.unit if declared is not None else ""
    axes_words = " × ".join("+".join(p) for p in (view.x, view.hue) if p)
    what = view.title or f"{metric} by {axes_words}" + (f", panels by {'+'.join(view.facet)}" if view.facet else "")
    ok = _ok(df)
    if ok.empty or metric not in ok:
        return Plot(name, _title(experiment, what, ""), None,
                    "no successful runs to plot" if ok.empty else f"the runs have no `{metric}`")
    s, facets, hues, xs = view_summary(df, view)
    if len(facets) > MAX_PANELS and "_part" not in name:  # every panel drawn: one figure per MAX_PANELS
        n_parts = -(-len(facets) // MAX_PANELS)
        return [small_multiples(df[_in_keys(df, view.facet, facets[i:i + MAX_PANELS])], view, baselines, experiment,
                                folded, f"{name}_part{i // MAX_PANELS + 1}", f" (part {i // MAX_PANELS + 1} of {n_parts})")
                for i in range(0, len(facets), MAX_PANELS)]
    ncols = min(3, len(facets))
    nrows = -(-len(facets) // ncols)
    width = max(4.5, 0.5 * len(xs) * max(1, len(hues)) + 2.5)
    fig = Figure(figsize=(max(7.0, min(6.0 * ncols, width * ncols)), 4.2 * nrows + 1.4))
    axes = np.atleast_1d(fig.subplots(nrows, ncols, sharey=True, squeeze=False)).ravel()
    bar_w = 0.8 / max(1, len(hues))
    pos = np.arange(len(xs))
    hue_rows = {hkey: _select(ok, view.hue, hkey) for hkey in hues}
    folded_vals = {hkey: ", ".join(f"{p}={format_value(p, rows[p].iloc[0])}" for p in folded if len(rows))
                   for hkey, rows in hue_rows.items()}
    rate = declared is not None and declared.rate   # throughput panels carry the baselines
    top = 0.0
    for ax, fkey in zip(axes, facets):
        panel = _select(s, view.facet, fkey)
        for i, hkey in enumerate(hues):
            rows = _select(panel, view.hue, hkey)
            med, lo, hi = [], [], []
            for xkey in xs:
                r = _select(rows, view.x, xkey)
                r = r[r["n"] > 0] if len(r) else r
                m = float(r[f"{metric}_median"].iloc[0]) if len(r) else np.nan
                med.append(m)
                lo.append(m - float(r[f"{metric}_ci_low"].iloc[0]) if len(r) else np.nan)
                hi.append(float(r[f"{metric}_ci_high"].iloc[0]) - m if len(r) else np.nan)
            label = _combo_label(view.hue, hkey, named=False) if view.hue else metric
            if folded_vals.get(hkey):
                label += f" ({folded_vals[hkey]})"
            ax.bar(pos + (i - (len(hues) - 1) / 2) * bar_w, med, bar_w,
                   yerr=[np.nan_to_num(lo), np.nan_to_num(hi)], capsize=3, label=label, color=f"C{i}")
            tops = np.array(med) + np.nan_to_num(np.array(hi))
            top = max([top] + [t for t in tops if np.isfinite(t)])
        if rate and baselines is not None:
            values = dict(zip(view.facet, fkey))
            for j, (_, bname, gbit) in enumerate(baseline_lines(baselines, values)):
                ax.axhline(convert(gbit, "Gbit/s", unit), linestyle="--", linewidth=1.1, color=f"C{len(hues) + j}",
                           label=f"{bname}: {gbit * 125:.0f} MB/s ({gbit:.2f} Gbit/s)")
                top = max(top, convert(gbit, "Gbit/s", unit))
        ax.set_xticks(pos, [_combo_label(view.x, k, named=len(view.x) > 1) for k in xs],
                      rotation=20 if len(xs) > 3 or len(view.x) > 1 else 0, ha="right" if len(xs) > 3 else "center",
                      fontsize="small")
        ax.set_xlim(-0.5, len(xs) - 0.5)   # every position, also where a panel has no bar
        ax.set_xlabel(" + ".join(view.x))
        if view.facet:
            ax.set_title(_combo_label(view.facet, fkey), fontsize="medium")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylim(0, top * 1.08 if top > 0 else 1)   # shared by every panel
    for ax in axes[len(facets):]:
        ax.set_visible(False)
    for r in range(nrows):
        axes[r * ncols].set_ylabel(f"{metric} ({unit}), median and CI" if unit else metric)   # the column a view names
    handles, labels = axes[0].get_legend_handles_labels()
    if not view.hue:   # one colour: its name is the y axis already
        keep = [i for i, label in enumerate(labels) if label != metric]
        handles, labels = [handles[i] for i in keep], [labels[i] for i in keep]
    height = fig.get_figheight()
    bottom = 0.0
    if handles:
        # as many columns as fit the figure's width (small font: ~0.075 in per character, plus the marker)
        per_col = 0.075 * max(len(label) for label in labels) + 0.7
        ncol = max(1, min(3, len(labels), int(fig.get_figwidth() // per_col)))
        rows = -(-len(labels) // ncol) + (1 if view.hue else 0)
        fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize="small",
                   title="+".join(view.hue) if view.hue else None, bbox_to_anchor=(0.5, 0.0))
        bottom = min(0.5, (0.25 + 0.2 * rows) / height)
    return _titled(name, _title(experiment, what + part, ""), fig, rect=(0, bottom, 1, 1))


def views(df: pd.DataFrame, declared: "Sequence[View]" = (), baselines: "pd.DataFrame | None" = None,
          experiment: str = "") -> list:
    """The report's small-multiple charts: the experiment's declared views, or the default one."""
    if _ok(df).empty:
        return [Plot("view", "throughput", None, "no successful runs to plot")]
    if declared:
        out = []
        for i, v in enumerate(declared):
            missing = [p for p in (*v.x, *v.hue, *v.facet) if p not in df]
            if missing:
                out.append(Plot(f"view-{i + 1}", v.title or f"view {i + 1}", None, f"the runs have no `{missing[0]}`"))
                continue
            out += _listed(small_multiples(df, v, baselines, experiment, name=f"view-{i + 1}"))
        return out
    view, folded = default_view(df)
    return _listed(small_multiples(df, view, baselines, experiment, folded, name="view"))


def _listed(plot: "Plot | list") -> list:
    return plot if isinstance(plot, list) else [plot]


def versus_buffer(df: pd.DataFrame, experiment: str = "") -> list:
    """Throughput and CPU per GiB (each side) against buffer size, one line per mode; log2 x."""
    what = "throughput and CPU cost against buffer size"
    ok = _ok(df)
    if "buffer" not in ok or ok["buffer"].nunique() < 2:
        return [Plot("buffer", what, None, "skipped: the runs use a single buffer size")]
    others = [c for c in varying_params(ok) if c not in ("buffer", "send_mode", "recv_mode")]
    fig = Figure(figsize=(15, 4.5))
    axes = fig.subplots(1, 3)
    panels = [(m, METRICS_BY_NAME[m].axis_label) for m in ("gbit_s", "send_cpu_s_per_gib", "recv_cpu_s_per_gib")]
    keys = ["send_mode", "recv_mode"] + others
    s = summarize(ok, by=keys + ["buffer"], metrics=[m for m, _ in panels])
    for key, line in s.groupby(keys, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        label = f"{key[0]} → {key[1]}" + "".join(f", {p}={format_value(p, v)}" for p, v in zip(others, key[2:]))
        line = line.sort_values("buffer")
        for ax, (m, _) in zip(axes, panels):
            ax.plot(line["buffer"].astype(float), line[f"{m}_median"], marker="o", label=label)
    buffers = sorted(ok["buffer"].astype(float).unique())
    draw_copy_line(axes[1], copy_line(ok, "send_"), "sender")
    draw_copy_line(axes[2], copy_line(ok, "recv_"), "receiver")
    for ax, (_, ylabel) in zip(axes, panels):
        ax.set_xscale("log", base=2)
        ax.set_xticks(buffers, [format_size(int(b)) for b in buffers], rotation=30)
        ax.set_xlabel("buffer size (bytes, log2)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize="small")
    for ax in axes[1:]:
        if any(line.get_linestyle() == ":" for line in ax.get_lines()):
            ax.legend(handles=[line for line in ax.get_lines() if line.get_linestyle() == ":"], fontsize="small")
    return [_titled("buffer", _title(experiment, what, ""), fig)]


def cpu_stacked(df: pd.DataFrame, experiment: str = "") -> list:
    """CPU seconds per GiB as stacked user/system bars per mode, sender and receiver side by side."""
    what = "process CPU cost per mode (the worker's user + system seconds per GiB)"
    ok = _ok(df)
    sides = []
    for prefix, mode_col, side in (("send_", "send_mode", "sender"), ("recv_", "recv_mode", "receiver")):
        need = [prefix + "utime_us", prefix + "stime_us", prefix + "bytes", mode_col]
        if all(c in ok for c in need):
            part = ok[need].dropna()
            part = part[part[prefix + "bytes"] > 0]
            if not part.empty:
                gib = part[prefix + "bytes"].astype(float) / float(1 << 30)
                frame = pd.DataFrame({"mode": part[mode_col],
                                      "usr": part[prefix + "utime_us"].astype(float) / 1e6 / gib,
                                      "sys": part[prefix + "stime_us"].astype(float) / 1e6 / gib})
                sides.append((side, frame.groupby("mode", sort=True)[["usr", "sys"]].median(), copy_line(ok, prefix)))
    if not sides:
        return [Plot("cpu", what, None, "no successful runs with CPU times to plot")]
    fig = Figure(figsize=(6 * len(sides), 4.5))
    axes = np.atleast_1d(fig.subplots(1, len(sides)))
    for ax, (side, med, copy) in zip(axes, sides):
        x = np.arange(len(med))
        ax.bar(x, med["usr"], 0.6, label="user", color="C0")
        ax.bar(x, med["sys"], 0.6, bottom=med["usr"], label="system", color="C3")
        draw_copy_line(ax, copy)
        ax.set_xticks(x, list(med.index))
        ax.set_xlabel(f"{side} mode")
        ax.set_ylabel("process CPU seconds per GiB (median)")
        ax.set_title(f"{side}")
        ax.legend(fontsize="small")
    return [_titled("cpu", _title(experiment, what, ""), fig)]


MAX_CELLS_DRAWN = 16


def cpu_views(df: pd.DataFrame, experiment: str = "") -> list:
    """Per cell and side: process CPU next to host CPU in s/GiB, with one copy of the data as the reference line."""
    what = "where the CPU goes: process CPU and host CPU per GiB"
    ok = _ok(df)
    have = [c for c in ("send_host_busy_s_per_gib", "recv_host_busy_s_per_gib") if c in ok and ok[c].notna().any()]
    if not have:
        return [Plot("cpuviews", what, None, "skipped: the runs have no host CPU (recorded before zcorch read /proc/stat)")]
    metrics = ["send_cpu_s_per_gib", "recv_cpu_s_per_gib", "send_host_busy_s_per_gib", "recv_host_busy_s_per_gib"]
    s = summarize(ok, metrics=metrics)
    s = s[s["n"] > 0].copy()
    for key in ("send_mode", "recv_mode"):  # carried along only when they vary
        if key not in s:
            s[key] = ok[key].iloc[0]
    others = [c for c in varying_params(ok) if c not in ("send_mode", "recv_mode") and c in s]
    s = s.sort_values(["send_mode", "recv_mode"] + others + ["cell"])
    # every cell drawn: MAX_CELLS_DRAWN per figure, as many figures as it takes, on one y scale
    top = max(float(np.nanmax(s[[f"{m}_median" for m in metrics]].to_numpy(dtype=float))), 0.0) * 1.08 or 1.0
    n_parts = -(-len(s) // MAX_CELLS_DRAWN)
    return [_cpu_views_figure(s.iloc[i:i + MAX_CELLS_DRAWN], ok, others, experiment,
                              what + (f" (part {i // MAX_CELLS_DRAWN + 1} of {n_parts})" if n_parts > 1 else ""),
                              "cpuviews" + (f"_part{i // MAX_CELLS_DRAWN + 1}" if n_parts > 1 else ""), top)
            for i in range(0, len(s), MAX_CELLS_DRAWN)]


def _cpu_views_figure(s: pd.DataFrame, ok: pd.DataFrame, others: list, experiment: str, what: str, name: str,
                      top: float) -> Plot:
    labels = [mode_label(r, others) for _, r in s.iterrows()]
    fig = Figure(figsize=(max(8.0, 0.9 * len(s) + 3), 10))
    axes = fig.subplots(2, 1, sharex=True)
    x = np.arange(len(s))
    same = "same_host" in ok and bool(ok["same_host"].fillna(False).astype(bool).any())
    for ax, prefix, side in zip(axes, ("send_", "recv_"), ("sender", "receiver")):
        ax.bar(x - 0.2, s[f"{prefix}cpu_s_per_gib_median"], 0.4, label="process CPU (the worker's rusage)",
               color="C0")
        ax.bar(x + 0.2, s[f"{prefix}host_busy_s_per_gib_median"], 0.4,
               label="host CPU (whole machine, /proc/stat incl. softirq)", color="C1")
        draw_copy_line(ax, copy_line(ok, prefix), side)
        ax.set_ylabel(f"{side}: CPU seconds per GiB (median)")
        ax.set_title(side + (" (one machine with the receiver: its host CPU is the same machine's)"
                             if same and side == "sender" else ""))
        ax.legend(fontsize="small")
        ax.set_ylim(0, top)
        ax.grid(True, axis="y", alpha=0.3)
    # slanted, anchored at their right end under the bar pair: long labels never run into each other
    axes[1].set_xticks(x, labels, fontsize="small", rotation=35, ha="right", rotation_mode="anchor")
    axes[1].set_xlabel("send mode → receive mode")
    return _titled(name, _title(experiment, what, ""), fig)


def samples_timelines(df: pd.DataFrame, samples: "pd.DataFrame | None", experiment: str = "") -> list:
    """Per-interval samples of one run of the slowest and the fastest cell: throughput, CPUs busy, cwnd and RTT."""
    what = "per-interval samples"
    if samples is None or samples.empty:
        return [Plot("samples", what, None, "skipped: no run kept samples (`sample_interval`: samples are kept "
                                            "for transfers of at least 3 intervals)")]
    ok = _ok(df)
    ok = ok[ok["samples"].notna()] if "samples" in ok else ok.iloc[0:0]
    if ok.empty:
        return [Plot("samples", what, None, "skipped: no successful run kept samples")]
    medians = ok.groupby("cell")["gbit_s"].median().sort_values()
    picks = [("slowest", medians.index[0])] + ([("fastest", medians.index[-1])] if len(medians) > 1 else [])
    plots = []
    for which, cell in picks:
        run = ok[ok["cell"] == cell].sort_values("repeat").iloc[0]
        part = samples[(samples["cell"] == cell) & (samples["repeat"] == run["repeat"])]
        if "sweep" in samples and "sweep" in run:
            part = part[part["sweep"] == run["sweep"]]
        label = f"{which} cell {cell}: {run['send_mode']} → {run['recv_mode']}, repeat {int(run['repeat'])}, " \
                f"median {medians[cell]:.2f} Gbit/s"
        fig = Figure(figsize=(10, 9))
        axes = fig.subplots(3, 1, sharex=True)
        one_machine = isinstance(run.get("same_host"), (bool, np.bool_)) and bool(run.get("same_host"))
        for side, style in (("send", "-"), ("recv", "--")):
            sp = part[part["side"] == side].sort_values("t_s")
            if sp.empty:
                continue
            name = "sender" if side == "send" else "receiver"
            axes[0].plot(sp["t_s"], sp["gbit_s"], style, marker=".", label=name)
            axes[1].plot(sp["t_s"], sp["proc_cpus"], style, marker=".", label=f"{name} process CPU")
            if not (one_machine and side == "recv"):  # one machine: one /proc/stat, drawn once
                host = "host CPU (one machine for both)" if one_machine else f"{name} host CPU"
                axes[1].plot(sp["t_s"], sp["host_busy_cpus"], style, marker="x", label=host)
            if side == "send":
                axes[2].plot(sp["t_s"], sp["tcp_snd_cwnd"], style, marker=".", color="C2", label="sender cwnd")
                rtt = axes[2].twinx()
                rtt.plot(sp["t_s"], sp["tcp_rtt_us"], ":", marker=".", color="C4", label="sender RTT (right axis)")
                rtt.set_ylabel("RTT (µs)")
                rtt.set_ylim(bottom=0)
                axes[2].legend(handles=axes[2].get_lines() + rtt.get_lines(), fontsize="small", loc="lower left")
        axes[0].set_ylabel("throughput (Gbit/s)")
        axes[1].set_ylabel("CPUs busy (CPU s per s)")
        axes[2].set_ylabel("congestion window (segments)")
        axes[2].set_xlabel("time since the start of the transfer (s)")
        for ax in axes:
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
        for ax in axes[:2]:
            ax.legend(fontsize="small", loc="lower left")
        plots.append(_titled(f"samples-{which}", _title(experiment, what, label), fig))
    return plots


def heatmap(df: pd.DataFrame, experiment: str = "") -> list:
    """Median throughput, send mode (rows) × receive mode (columns)."""
    what = "median throughput (Gbit/s), send × receive mode"
    ok = _ok(df)
    if ok["send_mode"].nunique() < 2 or ok["recv_mode"].nunique() < 2:
        return [Plot("heatmap", what, None,
                     "skipped: a heatmap needs at least two send modes and two receive modes")]
    plots = []
    tables = [(label, _ok(sub).groupby(["send_mode", "recv_mode"])["gbit_s"].median().unstack("recv_mode")
               .sort_index().sort_index(axis=1)) for label, sub, _ in slices(ok, ["send_mode", "recv_mode"])]
    # one colour scale for every panel: the same colour is the same throughput in each
    every = np.concatenate([t.to_numpy(dtype=float).ravel() for _, t in tables if not t.empty] or [np.array([])])
    every = every[np.isfinite(every)]
    vmin, vmax = (float(every.min()), float(every.max())) if every.size else (None, None)
    for label, table in tables:
        if table.empty:
            continue
        fig = Figure(figsize=(max(7.0, 1.4 * table.shape[1] + 3), 0.7 * table.shape[0] + 2.5))
        ax = fig.add_subplot()
        im = ax.imshow(table.to_numpy(dtype=float), cmap="viridis", aspect="auto", vmin=vmin, vmax=vmax)
        ax.set_xticks(range(table.shape[1]), table.columns)
        ax.set_yticks(range(table.shape[0]), table.index)
        ax.set_xlabel("receive mode")
        ax.set_ylabel("send mode")
        values = table.to_numpy(dtype=float)
        mid = (vmin + vmax) / 2 if vmin is not None else 0
        for (i, j), v in np.ndenumerate(values):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="black" if v > mid else "white")
        fig.colorbar(im, ax=ax, label="Gbit/s (one scale for every panel)" if len(tables) > 1 else "Gbit/s")
        ax.set_title(_title(experiment, what, label))
        fig.tight_layout()
        plots.append(Plot(_name("heatmap", label), _title(experiment, what, label), fig))
    return plots


def all_plots(df: pd.DataFrame, baselines: "pd.DataFrame | None" = None, experiment: str = "",
              samples: "pd.DataFrame | None" = None, declared: "Sequence[View]" = ()) -> list:
    """Every plot of the report, in order (skipped ones carry their note); `samples`: zcorch.load_samples."""
    return (views(df, declared, baselines, experiment) + versus_buffer(df, experiment)
            + cpu_stacked(df, experiment) + cpu_views(df, experiment) + heatmap(df, experiment)
            + samples_timelines(df, samples, experiment))


def report_figures(df: pd.DataFrame, baselines: "pd.DataFrame | None" = None, experiment: str = "",
                   fmt: str = "png") -> "list[tuple[str, bytes | None, str]]":
    """The report's charts for a notebook (`zcorch.report_figures`): (title, image bytes or None, note) each."""
    return [(plot.title, None if plot.figure is None else image_bytes(plot.figure, fmt), plot.note)
            for plot in all_plots(df, baselines, experiment)]


def data_uri(plot: Plot, fmt: str = "png") -> str:
    mime = {"png": "image/png", "svg": "image/svg+xml"}[fmt]
    return f"data:{mime};base64," + base64.b64encode(plot.image(fmt)).decode("ascii")


def save(plots: Sequence[Plot], directory: "str | Path", formats: Sequence[str] = ("png", "svg"),
         subdir: str = "") -> list:
    """Write every drawn plot as DIRECTORY[/SUBDIR]/NAME.{png,svg}; returns the paths. No link below DIRECTORY is
    followed (a result set's plots/ may hold planted ones)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for plot in plots:
        if plot.figure is None:
            continue
        for fmt in formats:
            rel = f"{subdir}/{plot.name}.{fmt}" if subdir else f"{plot.name}.{fmt}"
            paths.append(setfiles.write_inside(out, rel, plot.image(fmt)))
    return paths


EFFICIENCY_AXES = {"total_host_busy_s_per_gib": "CPU per GiB, both hosts (host view: /proc/stat busy s/GiB)",
                   "total_cpu_s_per_gib": "CPU per GiB, sender + receiver process (rusage s/GiB)"}


def efficiency(found: dict, experiment: str = "") -> list:
    """Throughput against CPU per GiB, a chart per ranking of the Findings: each configuration a point numbered by
    its rank; the efficient ones (the Pareto front) filled, labelled and joined."""
    what = "throughput against CPU per GiB: the efficient configurations"
    metric = found.get("efficiency_metric")
    if not metric:
        return [Plot("efficiency", what, None, "skipped: the runs have no CPU times")]
    out = []
    for i, ranking in enumerate(found["rankings"]):
        pts = [e for e in ranking["modes"] if e["mb_s"] is not None and e["cpu"].get(metric) is not None]
        if not pts:
            continue
        fig = Figure(figsize=(10, 6))
        ax = fig.add_subplot()
        front = sorted((e for e in pts if e["efficient"]), key=lambda e: e["cpu"][metric])
        for e in pts:
            ci = e["mb_s_ci"]
            yerr = [[e["mb_s"] - ci["low"]], [ci["high"] - e["mb_s"]]] if ci else None
            ax.errorbar([e["cpu"][metric]], [e["mb_s"]], yerr=yerr, fmt="o", markersize=11 if e["efficient"] else 9,
                        color="C3" if e["efficient"] else "0.55", mfc="C3" if e["efficient"] else "white",
                        capsize=3, zorder=3 if e["efficient"] else 2)
            ax.annotate(str(e["rank"]), (e["cpu"][metric], e["mb_s"]), ha="center", va="center", fontsize=7,
                        color="white" if e["efficient"] else "black", zorder=4)
        ax.plot([e["cpu"][metric] for e in front], [e["mb_s"] for e in front], "-", color="C3", alpha=0.6,
                label="efficient (Pareto front): no other is as fast for less CPU", zorder=1)
        # limits from the data with room for the labels (autoscaling stops at the outermost point)
        xmax = max(e["cpu"][metric] for e in pts) * 1.25 or 1.0
        ymax = max([e["mb_s_ci"]["high"] if e["mb_s_ci"] else e["mb_s"] for e in pts]
                   + [b["mb_s"] for b in best_baselines(ranking["baselines"])]) * 1.12 or 1.0
        for e in front:
            right = e["cpu"][metric] > 0.55 * xmax   # label on the side with room
            ax.annotate(f"#{e['rank']} {e['label']}", (e["cpu"][metric], e["mb_s"]), xytext=(-8 if right else 8, 6),
                        textcoords="offset points", fontsize="small", color="C3", fontweight="bold",
                        ha="right" if right else "left")
        for b in best_baselines(ranking["baselines"]):
            ax.axhline(b["mb_s"], linestyle="--", linewidth=1, color="0.35")
            ax.annotate(f"{b['name']}: {b['mb_s']:.0f} MB/s", (1.0, b["mb_s"]), xycoords=("axes fraction", "data"),
                        ha="right", va="bottom", fontsize="x-small", color="0.35")
        ax.set_xlim(0, xmax)
        ax.set_ylim(0, ymax)
        ax.set_xlabel(EFFICIENCY_AXES.get(metric, metric) + " (less is better)")
        ax.set_ylabel("throughput (MB/s), median and CI (more is better)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="best")
        title = _title(experiment, what, ranking["label"])
        ax.set_title(title, fontsize="medium")
        fig.tight_layout()
        out.append(Plot(_name("efficiency", ranking["label"]) if ranking["label"] else "efficiency"
                        + (f"-{i}" if i else ""), title, fig,
                        "Points are numbered by their rank in the table above; grey: a faster or cheaper one exists."))
    return out or [Plot("efficiency", what, None, "skipped: no configuration has both throughput and CPU")]


def best_baselines(refs: list) -> list:
    """The fastest baseline of each kind (the ceiling each tool reached), from the Findings' baselines."""
    best: dict = {}
    for b in refs:
        best[b["kind"]] = max(best.get(b["kind"], b), b, key=lambda x: x["mb_s"])
    return list(best.values())
