"""The host CPU view end to end, on a result set recorded by a real localhost sweep (fixture cpu_set):
what the run records and meta.json hold, zcorch.load's both CPU views and copy units,
zcorch.load_samples, the summary, and the report's CPU section, copy line and sample plots."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

import zcorch
from zcorch.analysis import plots
from zcorch.analysis.report import write_report
from zcorch.results.store import read_jsonl
from zcorch.sweep.summary import summary_table

from fixtures_analysis import raw_runs
from fixtures_worker import needs_native

pytestmark = needs_native

SIZE = 256 * 2**20


def test_records_and_meta_hold_the_host_view_samples_and_calibration(cpu_set):
    runs = raw_runs(cpu_set)
    assert len(runs) == 8 and all(r["status"] == "ok" for r in runs)
    for r in runs:
        assert r["same_host"] is True                          # localhost: one kernel
        assert r["sender"]["host_boot_id"] == r["receiver"]["host_boot_id"]
        for side in ("sender", "receiver"):
            assert r[side]["host_window_ns"] >= r[side]["wall_ns"] and r[side]["host_ncpus"] >= 1
            assert "samples" not in r[side]                    # moved out of the metrics into the file
        rows = read_jsonl(str(cpu_set / r["samples"]))
        assert r["samples"] == f"samples/{r['cell']}-r{r['repeat']}.jsonl"
        assert {row["side"] for row in rows} == {"send", "recv"}
        assert max(row["bytes"] for row in rows if row["side"] == "recv") == SIZE
    meta = json.loads((cpu_set / "meta.json").read_text())
    assert meta["same_host"] is True
    cal = [meta["hosts"][role]["calibration"] for role in ("sender", "receiver")]
    assert cal[0] == cal[1] and cal[0]["memcpy_s_per_gib"] > 0   # one host, calibrated once
    assert meta["hosts"]["sender"]["interface"] == dict(meta["hosts"]["sender"]["interface"], name="lo",
                                                          kind="loopback")


def test_load_has_both_cpu_views_copy_units_and_verdicts(cpu_set):
    df = zcorch.load(cpu_set)
    meta = json.loads((cpu_set / "meta.json").read_text())
    copy = meta["hosts"]["sender"]["calibration"]["memcpy_s_per_gib"]
    assert (df["send_copy_s_per_gib"] == copy).all()
    assert np.allclose(df["send_cpu_copies"], df["send_cpu_s_per_gib"] / copy)
    assert np.allclose(df["recv_host_busy_copies"], df["recv_host_busy_s_per_gib"] / copy)
    assert df["same_host"].tolist() == [True] * len(df)
    # one machine: both sides read one /proc/stat; the total counts it once
    assert np.allclose(df["total_host_busy_s_per_gib"], np.fmax(df["send_host_busy_s_per_gib"],
                                                               df["recv_host_busy_s_per_gib"]))
    assert (df["send_host_busy_s_per_gib"] > 0).all()
    # MSG_ZEROCOPY over loopback: the kernel copies every send (tests/test_native.py asserts it too)
    assert set(df.loc[df["send_mode"] == "msg_zerocopy", "zc_verdict"]) == {"copied"}
    assert set(df.loc[df["send_mode"] == "write", "zc_verdict"]) == {"n/a"}


def test_load_samples(cpu_set):
    s = zcorch.load_samples(cpu_set)
    runs = raw_runs(cpu_set)
    assert set(zip(s["cell"], s["repeat"])) == {(r["cell"], r["repeat"]) for r in runs}
    assert list(s.columns[:4]) == ["sweep", "cell", "repeat", "side"]
    assert {"t_s", "bytes", "gbit_s", "proc_cpus", "host_busy_cpus", "tcp_snd_cwnd", "send_mode", "recv_mode"} <= set(s)
    last = s.groupby(["cell", "repeat", "side"])["bytes"].max()
    assert (last == SIZE).all()                 # `bytes` is the samples' (moved so far), not the parameter
    # the intervals add up to the bytes moved
    moved = s.assign(b=s["gbit_s"] * s["dt_s"] * 1e9 / 8).groupby(["cell", "repeat", "side"])["b"].sum()
    assert np.allclose(moved, SIZE)
    assert (s["dt_s"] > 0).all() and (s["proc_cpus"] >= 0).all()


def test_load_samples_leaves_out_runs_whose_samples_file_is_gone(cpu_set):
    runs = raw_runs(cpu_set)
    gone = runs[0]
    (cpu_set / gone["samples"]).unlink()
    s = zcorch.load_samples(cpu_set)
    assert (gone["cell"], gone["repeat"]) not in set(zip(s["cell"], s["repeat"]))
    assert set(zip(s["cell"], s["repeat"])) == {(r["cell"], r["repeat"]) for r in runs[1:]}


def test_summary_shows_both_views_and_the_verdict(cpu_set):
    plan = json.loads((cpu_set / "plan.json").read_text())
    text = summary_table(plan, read_jsonl(str(cpu_set / "runs.jsonl")))
    head, *rows = text.splitlines()
    assert "send proc-CPU" in head and "recv host-CPU" in head and "zero-copy" in head
    assert head.endswith("host-CPU resolution")   # whether a run's host window could measure its CPU at all
    zc = [line for line in rows if " msg_zerocopy " in line]
    assert len(zc) == 2 and all(" copied " in line for line in zc)
    assert any(line.startswith("CPU in seconds per GiB moved: proc = ") for line in rows)
    assert "sender and receiver share one kernel: their host-CPU columns are one machine's, count it once" in rows


@pytest.mark.slow
def test_report_shows_both_cpu_views_the_copy_line_and_samples(cpu_set):
    out = write_report(cpu_set)
    text = out.read_text()
    section = text[text.index(">Where the CPU goes</h2>"):text.index(">Plots</h2>")]
    for needle in ("<b>Process CPU</b>", "<b>Host CPU</b>", "one copy of a GiB (memcpy, s)",
                   "send in copies", "recv host CPU s/GiB", "ran on one machine",
                   "lo (loopback) on the sender", "The kernel copies every MSG_ZEROCOPY send"):
        assert needle in section, needle
    assert re.search(r"<td class=\"num\">\d+\.\d×</td>", section)
    cells = text[text.index(">Every cell</h2>"):]
    assert "send process CPU s/GiB" in cells and "send host CPU s/GiB" in cells and "<td>copied</td>" in cells
    pngs = {p.stem for p in (cpu_set / "plots").glob("*.png")}
    assert {"cpu", "cpuviews", "samples-slowest", "samples-fastest"} <= pngs
    assert text.count("<img ") == len(pngs)
    # the reference line "one copy of the data" on the CPU plots, at the calibrated value
    df = zcorch.load(cpu_set)
    copy = float(df["send_copy_s_per_gib"].iloc[0])
    for plot in plots.cpu_views(df, "x") + plots.cpu_stacked(df, "x"):
        for ax in plot.figure.axes:
            lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("one copy of the data")]
            assert len(lines) == 1 and lines[0].get_ydata()[0] == pytest.approx(copy), plot.name
    views = plots.cpu_views(df, "x")[0].figure.axes
    assert {t.get_text() for t in views[0].get_legend().get_texts()} >= {
        "process CPU (the worker's rusage)", "host CPU (whole machine, /proc/stat incl. softirq)"}
    slow, fast = plots.samples_timelines(df, zcorch.load_samples(cpu_set), "x")
    medians = df.groupby("cell")["gbit_s"].median()
    assert medians.idxmin() in slow.title and medians.idxmax() in fast.title


@pytest.mark.slow
def test_sets_without_the_host_view_still_report(small_set):
    # recorded before zcorch read /proc/stat or calibrated: the section says so, nothing breaks
    text = write_report(small_set).read_text()
    section = text[text.index(">Where the CPU goes</h2>"):text.index(">Plots</h2>")]
    assert "no host CPU" in section and "no calibration in meta.json" in section
    assert zcorch.load_samples(small_set).empty
