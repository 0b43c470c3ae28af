"""The answer a report opens with, as a JSON-ready dict (docs/schemas/report.schema.json): per context (sink,
filesystem, network) the configurations ranked by median throughput, grouped by GROUPING_RULE where the data cannot
tell them apart, with their CPU per GiB and share of the baselines; and the flags of the runs (SHORT_RULE)."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from zcorch.analysis.frames import OK
from zcorch.analysis.stats import ci_label, ci_method, mode_label, summarize, varying_params
from zcorch.params import format_value

# Parameters that change what the ranking is about (another destination, another link): one ranking each.
CONTEXT_PARAMS = ("sink", "filesystem", "network")
MIN_HOST_TICKS = 100
USER_HZ = 100
# The CPU per GiB the findings show: (column, view, side) in the order of the tables.
CPU_COLUMNS = (("send_cpu_s_per_gib", "process", "sender"), ("recv_cpu_s_per_gib", "process", "receiver"),
               ("send_host_busy_s_per_gib", "host", "sender"), ("recv_host_busy_s_per_gib", "host", "receiver"),
               ("total_host_busy_s_per_gib", "host", "both hosts"))
GROUPING_RULE = ("sorted by median throughput; a configuration joins the group above it when its confidence "
                 "interval of the median overlaps the interval of that group's fastest configuration, else it "
                 "starts a new group (order-statistic intervals at the level each states; fewer than two ok "
                 "runs: no interval, a group of its own)")
SHORT_RULE = (f"a run whose host window holds fewer than {MIN_HOST_TICKS} /proc/stat ticks (host_window_ns × "
              f"{USER_HZ} Hz × host_ncpus, computed: the records carry no tick count) has host CPU that is "
              "mostly tick rounding")


def _finite(value) -> Optional[float]:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _plain(value):
    """A parameter value as JSON holds it (numpy scalars unwrapped, NaN as null)."""
    value = value.item() if isinstance(value, np.generic) else value
    return None if isinstance(value, float) and math.isnan(value) else value


def _norm(key: tuple) -> tuple:
    """A group key with its missing values as None (NaN never equals itself)."""
    return tuple(_plain(v) for v in key)


def short_host_windows(df: pd.DataFrame) -> pd.Series:
    """Per run: True when a side with a host CPU reading had a window of fewer than MIN_HOST_TICKS ticks."""
    short = pd.Series(False, index=df.index)
    for prefix in ("send_", "recv_"):
        window, ncpus = prefix + "host_window_ns", prefix + "host_ncpus"
        if window not in df or ncpus not in df or prefix + "host_busy_s_per_gib" not in df:
            continue
        ticks = (pd.to_numeric(df[window], errors="coerce") / 1e9 * USER_HZ
                 * pd.to_numeric(df[ncpus], errors="coerce"))
        measured = pd.to_numeric(df[prefix + "host_busy_s_per_gib"], errors="coerce").notna()
        short |= (measured & ticks.notna() & (ticks < MIN_HOST_TICKS)).fillna(False)
    return short


def baseline_refs(baselines: "pd.DataFrame | None", values: dict) -> list:
    """[{name, kind, mb_s, gbit_s}]: the ok baselines a ranking is measured against (plots.baseline_lines)."""
    from zcorch.analysis.plots import baseline_lines  # matplotlib: only when a report is built

    return [{"name": name, "kind": kind, "mb_s": gbit * 125.0, "gbit_s": gbit}
            for kind, name, gbit in baseline_lines(baselines, values)]


def _interval(row: pd.Series) -> Optional[dict]:
    low, high = _finite(row["mb_s_ci_low"]), _finite(row["mb_s_ci_high"])
    if low is None or high is None:
        return None
    level = float(row["mb_s_ci_level"])
    return {"low": low, "high": high, "level": level, "label": ci_label(level)}


def group_ranks(entries: list) -> None:
    """Set entry["rank"] and entry["group"] by GROUPING_RULE (entries sorted fastest first, without ok runs last)."""
    group, leader = 0, None
    for rank, e in enumerate(entries, start=1):
        if e["mb_s"] is None:
            e["rank"] = e["group"] = None
            continue
        e["rank"] = rank
        ci, lead_ci = e["mb_s_ci"], (leader or {}).get("mb_s_ci")
        if leader is None or ci is None or lead_ci is None or ci["high"] < lead_ci["low"]:
            group += 1
            leader = e
        e["group"] = group
    versus_fastest(entries)


def versus_fastest(entries: list) -> None:
    """Set entry["versus_fastest"]: {"verdict": "fastest" | "slower" | "cannot tell", "resolves_pct"}: slower where
    the grouping rule separates it from the fastest; resolves_pct: the smallest difference the two intervals could
    separate, in % of the fastest's median (None without both)."""
    lead = next((e for e in entries if e.get("rank")), None)
    for e in entries:
        if not e.get("rank") or lead is None:
            e["versus_fastest"] = None
            continue
        if e is lead:
            e["versus_fastest"] = {"verdict": "fastest", "resolves_pct": None}
            continue
        ci, lead_ci = e["mb_s_ci"], lead["mb_s_ci"]
        resolves = None
        if ci is not None and lead_ci is not None and lead["mb_s"]:
            resolves = ((lead["mb_s"] - lead_ci["low"]) + (ci["high"] - e["mb_s"])) / lead["mb_s"] * 100
        e["versus_fastest"] = {"verdict": "slower" if e["group"] != lead["group"] else "cannot tell",
                               "resolves_pct": resolves}


def pareto(entries: list, cpu: Optional[str]) -> None:
    """Mark entry["efficient"]: no other configuration is at least as fast for no more CPU per GiB (`cpu`) and
    better in one; without that CPU figure, not efficient."""
    points = [(e["mb_s"], e["cpu"].get(cpu)) for e in entries]
    for e, (t, c) in zip(entries, points):
        if t is None or c is None:
            e["efficient"] = False
            continue
        e["efficient"] = not any(t2 is not None and c2 is not None and t2 >= t and c2 <= c and (t2 > t or c2 < c)
                                 for t2, c2 in points)


def table_row(e: dict, cpus: Sequence[str], kinds: Sequence[str], mark: str, gbit: bool = False) -> list:
    """One configuration of a ranking as a table row (`mark` after an efficient one); "" where there is no value."""
    def num(value, fmt: str) -> str:
        return "" if value is None else fmt.format(value)
    ci = e["mb_s_ci"]
    shares = [(e["share_of_baseline"].get(k) or {}).get("share") for k in kinds]
    return ([e["rank"] or "–", e["group"] or "–", e["label"] + (mark if e["efficient"] else ""),
             num(e["mb_s"], "{:.0f}"), f"{ci['low']:.0f}–{ci['high']:.0f} ({ci['label']})" if ci else ""]
            + ([num(e["gbit_s"], "{:.2f}")] if gbit else []) + [e["n"]]
            + [num(e["cpu"].get(c), "{:.3f}") for c in cpus]
            + [num(None if v is None else 100 * v, "{:.0f}%") for v in shares] + ["; ".join(e["flags"])])


def efficiency_metric(df: pd.DataFrame) -> Optional[str]:
    """The CPU figure of the efficiency chart: both hosts' host CPU, else both processes'; None without CPU times."""
    for col in ("total_host_busy_s_per_gib", "total_cpu_s_per_gib"):
        if col in df and pd.to_numeric(df.loc[df["status"] == OK, col], errors="coerce").notna().any():
            return col
    return None


def findings(df: pd.DataFrame, baselines: "pd.DataFrame | None" = None) -> dict:
    """The Findings of a run frame (module docstring)."""
    from zcorch.analysis.plots import best_baselines  # matplotlib: only when a report is built

    vary = varying_params(df)
    contexts = [p for p in CONTEXT_PARAMS if p in vary]
    others = [p for p in vary if p not in contexts and p not in ("send_mode", "recv_mode")]
    df = df.assign(**{p: None for p in ("send_mode", "recv_mode") if p not in df})
    eff = efficiency_metric(df)
    metrics = ["mb_s", "gbit_s"] + [c for c, _, _ in CPU_COLUMNS] + ["total_cpu_s_per_gib"]
    by = contexts + ["send_mode", "recv_mode"] + others
    s = summarize(df, by=by, metrics=metrics) if len(df) else pd.DataFrame()
    short = short_host_windows(df)
    adaptive = "converged" in s
    cells, shorts = {}, {}
    if len(df):
        for key, group in df[by + ["cell"]].assign(_short=short).groupby(by, dropna=False, sort=False):
            key = _norm(key if isinstance(key, tuple) else (key,))
            cells[key], shorts[key] = group["cell"].iloc[0], int(group["_short"].sum())
    rankings = []
    context_keys = s[contexts].drop_duplicates().itertuples(index=False, name=None) if contexts else [()]
    for ckey in list(context_keys):
        part = s
        for p, v in zip(contexts, ckey):
            part = part[part[p].isna()] if _plain(v) is None else part[part[p] == v]
        values = dict(zip(contexts, ckey))
        refs = baseline_refs(baselines, values)
        entries = []
        for _, r in part.iterrows():
            key = _norm(tuple(r[p] for p in by))
            n_short, cell = shorts.get(key, 0), cells.get(key)
            conv = bool(r["converged"]) if adaptive else None
            flags = []
            if r["n_failed"]:
                flags.append(f"failed: {int(r['n_failed'])} of {int(r['n'] + r['n_failed'])} runs")
            if n_short:
                flags.append(f"host CPU too short to measure: {n_short} of {int(r['n'])} ok runs < "
                             f"{MIN_HOST_TICKS} ticks")
            if conv is False:
                width = _finite(r["width_pct"])
                flags.append("not converged (" + (f"95% CI ±{width:.1f}%" if width is not None else "fewer than 6 ok runs")
                             + f" after {int(r['n'])} ok runs)")
            mb = _finite(r["mb_s_median"])
            entries.append({
                "cell": cell, "label": mode_label(r, others),
                "send_mode": _plain(r["send_mode"]), "recv_mode": _plain(r["recv_mode"]),
                "params": {p: _plain(r[p]) for p in others},
                "n": int(r["n"]), "n_failed": int(r["n_failed"]),
                "mb_s": mb, "gbit_s": _finite(r["gbit_s_median"]), "mb_s_ci": _interval(r),
                "cpu": {c: _finite(r.get(f"{c}_median")) for c, _, _ in CPU_COLUMNS + (("total_cpu_s_per_gib", "", ""),)},
                "share_of_baseline": {b["kind"]: {"baseline": b["name"], "baseline_mb_s": b["mb_s"],
                                                  "share": mb / b["mb_s"] if mb is not None and b["mb_s"] else None}
                                      for b in best_baselines(baseline_refs(
                                          baselines, {**values, **{p: r[p] for p in others}}))},
                "flags": flags,
                "converged": conv,
            })
        entries.sort(key=lambda e: (e["mb_s"] is None, -(e["mb_s"] or 0.0), e["label"]))
        group_ranks(entries)
        pareto(entries, eff)
        label = ", ".join(f"{p}={format_value(p, v)}" for p, v in zip(contexts, ckey))
        rankings.append({"context": {p: _plain(v) for p, v in values.items()}, "label": label,
                         "baselines": refs, "modes": entries})
    ok = df[df["status"] == OK] if len(df) else df
    failed_runs = int((df["status"] != OK).sum()) if len(df) else 0
    have_host = any(c in ok and pd.to_numeric(ok[c], errors="coerce").notna().any()
                    for c in ("send_host_busy_s_per_gib", "recv_host_busy_s_per_gib"))
    not_conv = sorted(m["cell"] for r in rankings for m in r["modes"] if m["converged"] is False and m["cell"])
    return {
        "grouping_rule": GROUPING_RULE, "ci_method": ci_method(), "context_params": contexts,
        "other_params": others, "efficiency_metric": eff, "have_host_cpu": have_host,
        "rankings": rankings,
        "flags": {"failed_runs": failed_runs, "runs": int(len(df)),
                  "short_host_window_runs": int(short.sum()), "short_host_window_rule": SHORT_RULE,
                  "not_converged_cells": not_conv,
                  "convergence_recorded": bool(adaptive)},
    }
