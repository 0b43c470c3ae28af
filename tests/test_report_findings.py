"""The report opens with the answer (zcorch.analysis.findings): configurations ranked by throughput, grouped
where their intervals overlap, with CPU per GiB in both views, shares of the baselines and the runs' flags;
`zcorch report --format json|markdown` for any result set, the JSON checked against its documented schema.
On the small real result sets (tests/data, private copies) and a real localhost sweep with host CPU (cpu_set)."""
import json
import re

import jsonschema
import numpy as np
import pandas as pd
import pytest

import zcorch
from zcorch.analysis import plots
from zcorch.analysis.findings import MIN_HOST_TICKS, findings, short_host_windows
from zcorch.analysis.report import build_report, cells_table

from fixtures_analysis import ROOT, zcorch_cli

SCHEMA = json.loads((ROOT / "docs" / "schemas" / "report.schema.json").read_text())


def ranking_of(path):
    df = zcorch.load(path)
    found = findings(df, zcorch.load_baselines(path))
    (ranking,) = found["rankings"]        # /dev/null only: one ranking
    return df, found, ranking


def test_configurations_are_ranked_and_grouped_by_overlapping_intervals(small_set):
    df, found, ranking = ranking_of(small_set)
    modes = ranking["modes"]
    ranked = [m for m in modes if m["rank"]]
    assert [m["rank"] for m in ranked] == list(range(1, 13))
    assert [m["mb_s"] for m in ranked] == sorted((m["mb_s"] for m in ranked), reverse=True)
    # each median is the ok runs' median of that configuration
    for m in ranked:
        runs = df[(df["cell"] == m["cell"]) & (df["status"] == "ok")]
        assert m["mb_s"] == pytest.approx(runs["mb_s"].median()) and m["n"] == len(runs) == 3
        assert m["mb_s_ci"]["label"] == "75% CI" and m["mb_s_ci"]["level"] == 0.75   # three runs: never "95%"
    # the rule: a member overlaps its group's leader; a new group's leader does not overlap the previous leader
    leaders = {}
    for m in ranked:
        lead = leaders.setdefault(m["group"], m)
        if lead is not m:
            assert m["mb_s_ci"]["high"] >= lead["mb_s_ci"]["low"]
        elif m["group"] > 1:
            prev = leaders[m["group"] - 1]
            assert m["mb_s_ci"]["high"] < prev["mb_s_ci"]["low"]
    assert len(leaders) >= 2
    # against the fastest, three answers: the fastest, slower (separated intervals), cannot tell (overlapping),
    # each with the smallest difference its interval and the fastest's could separate
    lead = ranked[0]
    assert lead["versus_fastest"] == {"verdict": "fastest", "resolves_pct": None}
    for m in ranked[1:]:
        vs = m["versus_fastest"]
        assert vs["verdict"] == ("cannot tell" if m["group"] == lead["group"] else "slower"), m
        reach = (lead["mb_s"] - lead["mb_s_ci"]["low"]) + (m["mb_s_ci"]["high"] - m["mb_s"])
        assert vs["resolves_pct"] == pytest.approx(reach / lead["mb_s"] * 100)
    top = [m for m in ranked if m["group"] == lead["group"]]
    from zcorch.analysis.report import headline
    text = headline(ranking)
    if len(top) > 1:
        assert f"cannot tell it apart from {len(top) - 1} other(s) (these runs separate differences of ≥ " in text
    else:
        assert "ahead of the rest by this rule" in text
    # the cell whose runs all failed: last, unranked, flagged
    assert modes[-1]["rank"] is None and modes[-1]["flags"] == ["failed: 3 of 3 runs"]
    assert modes[-1]["versus_fastest"] is None
    assert "send_cpu=4095" in modes[-1]["label"] and "send_cpu" not in modes[0]["label"]


def test_cpu_shares_and_the_efficient_front(small_set):
    df, found, ranking = ranking_of(small_set)
    assert found["efficiency_metric"] == "total_cpu_s_per_gib"   # no host CPU in this set: both processes
    ranked = [m for m in ranking["modes"] if m["rank"]]
    for m in ranked:
        runs = df[(df["cell"] == m["cell"]) & (df["status"] == "ok")]
        assert m["cpu"]["send_cpu_s_per_gib"] == pytest.approx(runs["send_cpu_s_per_gib"].median())
        assert m["cpu"]["send_host_busy_s_per_gib"] is None
        iperf3 = m["share_of_baseline"]["iperf3"]
        assert iperf3["share"] == pytest.approx(m["mb_s"] / iperf3["baseline_mb_s"])
    # efficient: nothing at least as fast for no more CPU; every other one has such a rival
    cost = {m["cell"]: m["cpu"]["total_cpu_s_per_gib"] for m in ranked}
    for m in ranked:
        rivals = [o for o in ranked if o is not m and o["mb_s"] >= m["mb_s"] and cost[o["cell"]] <= cost[m["cell"]]]
        assert m["efficient"] == (not rivals), m["label"]
    assert ranked[0]["efficient"]   # the fastest is on the front by definition


def test_flags_for_short_host_windows_and_cells_that_did_not_converge(cpu_set):
    df = zcorch.load(cpu_set)
    assert df["send_host_busy_s_per_gib"].notna().any()
    ticks = df["send_host_window_ns"] / 1e9 * 100 * df["send_host_ncpus"]
    assert (short_host_windows(df) == ((ticks < MIN_HOST_TICKS) | (df["recv_host_window_ns"] / 1e9 * 100
                                                                    * df["recv_host_ncpus"] < MIN_HOST_TICKS))).all()
    # one run's window edited to 0.2 s on 2 CPUs (40 ticks); the records of a cell given the convergence state
    # an adaptive sweep (repeats: {min, max, target_ci}) writes, that cell unconverged
    edited = df.copy()
    first = edited.index[edited["status"] == "ok"][0]
    edited.loc[first, ["send_host_window_ns", "send_host_ncpus"]] = [200_000_000, 2]
    cell = edited.loc[first, "cell"]
    edited["convergence"] = [json.dumps({"n": 2, "width_pct": None, "converged": c != cell}) for c in edited["cell"]]
    found = findings(edited, zcorch.load_baselines(cpu_set))
    assert found["have_host_cpu"] and found["efficiency_metric"] == "total_host_busy_s_per_gib"
    assert found["flags"]["short_host_window_runs"] == int(short_host_windows(df).sum()) + (not short_host_windows(df)[first])
    assert found["flags"]["not_converged_cells"] == [cell] and found["flags"]["convergence_recorded"]
    (entry,) = [m for r in found["rankings"] for m in r["modes"] if m["cell"] == cell]
    assert any(f.startswith("host CPU too short to measure") for f in entry["flags"])
    assert "not converged (fewer than 6 ok runs after 2 ok runs)" in entry["flags"] and entry["converged"] is False
    others = [m for r in found["rankings"] for m in r["modes"] if m["cell"] != cell]
    assert all(m["converged"] is True and not any("converged" in f for f in m["flags"]) for m in others)
    assert findings(df, zcorch.load_baselines(cpu_set))["rankings"][0]["modes"][0]["converged"] is None
    jsonschema.validate(json.loads(json.dumps(_document(found))), SCHEMA)


def _document(found):
    return {"$schema": "x", "format": "zcorch-report/1", "zcorch_version": "0", "name": "n", "result_set": "d",
            "status": "complete", "runs": 1, "cells": 1, "failed_runs": 0, "findings": found, "reproduction": None}


def test_report_json_and_markdown_for_a_sweep_without_a_reference(small_set):
    res = zcorch_cli("report", small_set, "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["reproduction"] is None and doc["failed_runs"] == 3 and doc["runs"] == 39
    assert doc["findings"]["rankings"][0]["modes"][0]["rank"] == 1
    assert not (small_set / "report.html").exists()
    md = zcorch_cli("report", small_set, "--format", "markdown")
    assert md.returncode == 0, md.stderr
    lines = md.stdout.splitlines()
    assert lines[0] == "## Findings: quickstart-small"
    first = next(line for line in lines if line.startswith("| 1 | 1 |"))
    assert re.match(r"\| 1 \| 1 \| \w+ → \w+, buffer=\d+KiB \* \| \d+ \| \d+–\d+ \(75% CI\) \| 3 \|", first)


@pytest.mark.slow
def test_the_page_opens_with_the_findings_and_sorts_tables_by_mode(small_set):
    page = build_report(small_set)
    h2 = re.findall(r"<h2[^>]*>([^<]+)</h2>", page)
    assert h2[0] == "Findings" and h2[-2:] == ["Hosts", "Experiment"]
    assert page.index("Contents") > page.index(">Findings</h2>")
    assert "overlaps the interval" in page   # the grouping rule is stated
    # the experiment file and the raw host facts collapsed at the end
    assert re.search(r"<details><summary>The experiment file as run</summary>\s*<pre>", page)
    raw = page[page.index("<details><summary>Every recorded host fact"):]
    assert "kernel.release" in raw and "why_null.interface.speed_mbps" in raw
    hosts = page[page.index('<h2 id="hosts">'):page.index("<details><summary>Every recorded host fact")]
    assert "<th>memory</th><td>23.5 GiB</td><td>23.5 GiB</td>" in hosts    # 25276510208 bytes, rounded
    assert "4 MiB" in hosts and "0.37872010133333334" not in page
    # Every cell: by send mode, receive mode, buffer; no column without a value; the cell id last
    t = cells_table(zcorch.load(small_set))
    assert t.header[:3] == ["send_mode", "recv_mode", "buffer"] and t.header[-1] == "cell id"
    keys = [(r[0], r[1]) for r in t.rows]
    assert keys == sorted(keys)
    assert all(any(str(r[i]) != "" for r in t.rows) for i in range(len(t.header)))
    assert "send host CPU s/GiB" not in t.header   # no host CPU in this set: the empty column is gone


def test_heatmaps_share_one_colour_scale_and_every_cell_is_drawn(small_set, monkeypatch):
    df = zcorch.load(small_set)
    maps = [p for p in plots.heatmap(df, "x") if p.figure]
    assert len(maps) == 2   # one per buffer size
    clims = {m.figure.axes[0].images[0].get_clim() for m in maps}
    assert len(clims) == 1
    ok = df[df["status"] == "ok"]
    assert min(clims)[0] == pytest.approx(ok.groupby(["buffer", "send_mode", "recv_mode"])["gbit_s"].median().min())
    # the CPU views of more cells than one chart holds: split into parts, none left out
    fake = df.assign(send_host_busy_s_per_gib=df["send_cpu_s_per_gib"] * 1.5,
                     recv_host_busy_s_per_gib=df["recv_cpu_s_per_gib"] * 1.5)
    monkeypatch.setattr(plots, "MAX_CELLS_DRAWN", 5)
    parts = plots.cpu_views(fake, "x")
    assert len(parts) == 3 and all(p.figure is not None and not p.note for p in parts)
    drawn = sum(len(p.figure.axes[1].get_xticklabels()) for p in parts)
    assert drawn == ok["cell"].nunique()
    label = parts[0].figure.axes[1].get_xticklabels()[0]
    assert label.get_rotation() == 35 and label.get_ha() == "right"


def test_hosts_side_by_side_mark_what_differs(small_set):
    from zcorch.analysis.hosts import comparison

    meta = json.loads((small_set / "meta.json").read_text())
    same = comparison(meta)
    assert same["roles"] == ["sender", "receiver"] and same["n_differ"] == 0   # localhost: one machine
    rows = {r["label"]: r for r in same["rows"]}
    assert rows["sink"]["values"] == ["–", "/dev/null on devtmpfs (/dev)"] and not rows["sink"]["differs"]
    assert rows["TCP receive buffer (tcp_rmem)"]["values"][0] == "min 4 KiB, default 128 KiB, max 32 MiB"
    # a receiver with another kernel and a larger rmem_max (edited: one machine cannot differ from itself)
    meta["hosts"]["receiver"]["kernel"]["release"] = "6.1.0-other"
    meta["hosts"]["receiver"]["sysctls"]["net.core.rmem_max"] = str(64 << 20)
    rows = {r["label"]: r for r in comparison(meta)["rows"]}
    assert rows["kernel"]["differs"] and rows["kernel"]["values"][1] == "6.1.0-other x86_64"
    assert rows["socket receive buffer limit (rmem_max)"]["values"] == ["4 MiB", "64 MiB"]
    assert [label for label, r in rows.items() if r["differs"]] == ["kernel", "socket receive buffer limit (rmem_max)"]


def test_one_ranking_per_filesystem_against_its_own_dd(fs_set):
    df = zcorch.load(fs_set)
    baselines = zcorch.load_baselines(fs_set)
    found = findings(df, baselines)
    assert found["context_params"] == ["filesystem"]
    assert [r["context"]["filesystem"] for r in found["rankings"]] == sorted(df["filesystem"].unique())
    for ranking in found["rankings"]:
        fs = ranking["context"]["filesystem"]
        dd = baselines[(baselines["kind"] == "dd_write") & (baselines["key_filesystem"] == fs)
                       & (baselines["status"] == "ok")]["mb_s"].median()
        for m in ranking["modes"]:
            assert m["share_of_baseline"]["dd_write"]["baseline_mb_s"] == pytest.approx(dd)
            runs = df[(df["filesystem"] == fs) & (df["cell"] == m["cell"]) & (df["status"] == "ok")]
            assert m["mb_s"] == pytest.approx(runs["mb_s"].median())
