"""The metric table (zcorch.metrics): its entries are consistent, every derived column of a real frame is
declared, and `zcorch compare` / `zcorch history` follow the host-CPU metrics with the right direction.

The result sets are a real localhost sweep recorded here (2 cells × 4 repeats: 4 against 4 runs can reach
p < 0.05). The candidate with more host CPU is a copy of it whose runs.jsonl was edited minimally: the
sender's (or both sides') busy host-CPU fields (`host_{user,nice,system,irq,softirq,steal}_us`) multiplied by
one factor, every other byte of every record as recorded. A real sweep cannot be made to burn a known extra
amount of host CPU per byte reliably on a shared machine; the edit gives a known change whose direction the
verdicts must get right. The factor exceeds twice the spread of the recorded repeats (other processes' CPU
counts in a host-wide figure), so every edited run is above every recorded one.
"""
import json
import math
import re
import tempfile
from pathlib import Path

import pytest

import zcorch
from zcorch import metrics
from zcorch.analysis.compare import compare_frames
from zcorch.params import HOST_BUSY_FIELDS, METRICS as WORKER_METRICS, PARAM_KEYS

from fixtures_analysis import copy_result_set, record_sweep, zcorch_cli

# 1 s runs: the host-CPU window then holds ~200 /proc/stat ticks; a 32 MiB run could hold none (a ratio of 0)
EXPERIMENT = """name: host-cpu
params: {duration: 1s, source: mem, timeout: 30s}
matrix:
  send_mode: [write]
  recv_mode: [read, discard]
repeats: 4
baselines: false
"""


# ---------------------------------------------------------------- the table itself

def test_every_entry_is_consistent():
    names = [m.name for m in metrics.ANALYSIS_METRICS]
    assert len(names) == len(set(names))
    for m in metrics.ANALYSIS_METRICS:
        assert m.side in metrics.SIDES and m.better in metrics.BETTER, m
        assert m.combine is None or m.combine in metrics.COMBINE, m
        assert m.label and m.help and m.unit, m
        if m.side in ("send", "recv"):
            assert m.name.startswith(m.side + "_"), m
    for total in metrics.TOTALS:
        assert total.combine is not None and total.name.startswith("total_")
        for part in map(metrics.get, total.parts):   # both sides declared alike: what the total adds up
            assert (part.unit, part.better, part.combine) == (total.unit, total.better, total.combine), part
    # what compare and history offer: every metric with a direction, the host-CPU ones among them
    assert set(metrics.DIRECTED) == {m.name for m in metrics.ANALYSIS_METRICS if m.better}
    assert {"send_host_busy_s_per_gib", "recv_host_busy_s_per_gib", "total_host_busy_s_per_gib"} <= set(metrics.DIRECTED)
    assert metrics.get("gbit_s").worse(-1.0) and not metrics.get("gbit_s").worse(1.0)
    assert metrics.get("total_host_busy_s_per_gib").worse(1.0) and not metrics.get("total_host_busy_s_per_gib").worse(-1.0)
    assert metrics.RATES == {"gbit_s", "mb_s"}
    assert set(metrics.SUMMARY) <= set(metrics.BY_NAME)
    with pytest.raises(ValueError, match="no better direction"):
        metrics.directed("send_stime_us")
    with pytest.raises(ValueError, match="is not a metric"):
        metrics.directed("send_host_busy")


def test_every_worker_metric_is_a_per_side_entry_and_classified():
    """A worker metric (zcorch.params) with a number per run appears per side, and is declared a total over
    the transfer (extensive) or a level: a new worker metric fails here until it is classified."""
    for wm in WORKER_METRICS:
        for side in ("send", "recv"):
            entry = metrics.BY_NAME.get(f"{side}_{wm.name}")
            if entry is None:
                continue
            assert wm.side in (side, "both") and entry.unit == wm.unit
            assert wm.extent in ("total", "level"), f"{wm.name}: say extent='total' or 'level' in zcorch/params.py"
            assert entry.extensive == (wm.extent == "total")
    assert "send_host_per_cpu_us" not in metrics.BY_NAME and "recv_host_boot_id" not in metrics.BY_NAME
    assert metrics.get("recv_fsync_ns").extensive and not metrics.get("send_tcp_rtt_us").extensive
    assert "send_fsync_ns" not in metrics.BY_NAME   # the receiver's alone


def test_the_docs_table_is_the_tables():
    path = Path(__file__).resolve().parent.parent / "docs" / "experiment-files.md"
    text = path.read_text(encoding="utf-8")
    assert metrics.render_docs(text) == text, "run `python -m zcorch.metrics docs/experiment-files.md`"
    assert "| `total_host_busy_s_per_gib` | s/GiB | lower |" in text
    with pytest.raises(ValueError, match="analysis-metrics:begin"):
        metrics.render_docs("no block here")


# ---------------------------------------------------------------- real result sets

@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A real localhost sweep with the host CPU view."""
    return record_sweep(tmp_path_factory.mktemp("hostcpu"), "host-cpu", EXPERIMENT)


def factor_beyond_spread(src) -> float:
    """1 + twice the largest max/min ratio of a side's host busy per GiB among the repeats of a cell."""
    df = zcorch.load(copy_result_set(src, Path(tempfile.mkdtemp()) / "spread"))
    ratios = [g[c].max() / g[c].min() for _, g in df.groupby("cell")
              for c in ("send_host_busy_s_per_gib", "recv_host_busy_s_per_gib")]
    return 1.0 + 2.0 * max(ratios)


def more_host_cpu(src, dst, sides=("sender",)):
    """A copy of the result set `src` whose runs.jsonl has the busy host-CPU fields of `sides` multiplied by
    factor_beyond_spread (the module docstring says why); nothing else changes. Returns (dst, factor)."""
    factor = factor_beyond_spread(src)
    copy_result_set(src, dst)
    lines = []
    for line in (dst / "runs.jsonl").read_text().splitlines():
        rec = json.loads(line)
        for side in sides:
            for field in HOST_BUSY_FIELDS:
                rec[side][f"host_{field}_us"] = round(rec[side][f"host_{field}_us"] * factor)
        lines.append(json.dumps(rec))
    (dst / "runs.jsonl").write_text("\n".join(lines) + "\n")
    return dst, factor


@pytest.mark.slow
def test_every_derived_column_of_a_real_frame_is_declared_and_totals_follow_their_rule(recorded, tmp_path):
    df = zcorch.load(copy_result_set(recorded, tmp_path / "base"))
    raw = set(df.columns) - {m.name for m in metrics.DERIVED}
    for m in metrics.DERIVED:
        assert m.name in df, m.name
    # every other side's column is a parameter or a worker metric
    worker = {f"{s}_{w.name}" for w in WORKER_METRICS for s in ("send", "recv")}
    undeclared = {c for c in raw if c.startswith(("send_", "recv_", "total_")) and c not in worker | set(PARAM_KEYS)}
    assert not undeclared, f"derived columns missing from zcorch.metrics: {sorted(undeclared)}"
    ok = df[df["status"] == "ok"]
    assert len(ok) == 8 and ok["send_host_busy_s_per_gib"].notna().all()
    assert ok["same_host"].all()   # both workers on localhost: one kernel, counted once
    for _, r in ok.iterrows():
        assert math.isclose(r["total_host_busy_s_per_gib"],
                            max(r["send_host_busy_s_per_gib"], r["recv_host_busy_s_per_gib"]))
        assert math.isclose(r["total_cpu_s_per_gib"], r["send_cpu_s_per_gib"] + r["recv_cpu_s_per_gib"])


@pytest.mark.slow
def test_compare_flags_a_rise_of_host_cpu_as_a_regression_and_a_fall_as_an_improvement(recorded, tmp_path):
    base = copy_result_set(recorded, tmp_path / "base")
    cand, factor = more_host_cpu(recorded, tmp_path / "cand")
    res = zcorch_cli("compare", "--metric", "send_host_busy_s_per_gib", base, cand)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "REGRESSION: 2 cell(s) regressed" in res.stdout
    assert "metric send_host_busy_s_per_gib (s/GiB, lower is better)" in res.stdout
    table = compare_frames(zcorch.load(base), zcorch.load(cand), "send_host_busy_s_per_gib")
    assert list(table["verdict"]) == ["regressed"] * 2, table.to_string()
    # the medians grew by the factor (the fields are rounded to whole µs)
    assert all(math.isclose(c, (factor - 1) * 100, rel_tol=1e-3) for c in table["change_pct"]), table["change_pct"]

    back = zcorch_cli("compare", "--metric", "send_host_busy_s_per_gib", cand, base)   # less CPU: better
    assert back.returncode == 0 and "no regression" in back.stdout and "2 improved" in back.stdout, \
        back.stdout
    # the receiver's host CPU and the throughput are as recorded
    for metric in ("recv_host_busy_s_per_gib", "gbit_s"):
        # unchanged runs: no regression where the runs could have seen the threshold, else cannot tell; with a
        # threshold above what the noisiest cell could see, an all-clear
        doc = json.loads(zcorch_cli("compare", "--metric", metric, base, cand, "--format", "json").stdout)
        assert all(c["change_pct"] == 0 for c in doc["cells"]), doc["cells"]
        assert all(c["verdict"] == ("unchanged" if c["detectable_pct"] <= 5 else "cannot tell") for c in doc["cells"])
        wide = f"{max(5.0, doc['detectable_pct'] * 1.1):.2f}"
        same = zcorch_cli("compare", "--metric", metric, base, cand, "--threshold", wide)
        assert same.returncode == 0 and "2 unchanged" in same.stdout, same.stdout


def test_a_metric_not_in_the_table_or_without_a_direction_is_a_usage_error(recorded, tmp_path):
    base = copy_result_set(recorded, tmp_path / "base")
    for name in ("host_busy_s_per_gib", "send_stime_us", "send_sys_share"):
        res = zcorch_cli("compare", "--metric", name, base, base)
        assert res.returncode == 2 and "invalid choice" in res.stderr and "Traceback" not in res.stderr, res.stderr
        res = zcorch_cli("history", base, "--metric", name)
        assert res.returncode == 2 and "invalid choice" in res.stderr, res.stderr
    with pytest.raises(ValueError, match="no better direction"):
        compare_frames(zcorch.load(base), zcorch.load(base), "send_stime_us")


def nightly_root(root, sets):
    """ROOT/<night>/host-cpu: copies of `sets` (oldest first) with the manifest's `created` one night apart (the
    one field changed: history orders the sweeps of an experiment by it)."""
    for night, src in enumerate(sets):
        d = copy_result_set(src, root / f"2026110{night}T0300Z" / "host-cpu")
        manifest = json.loads((d / "manifest.json").read_text())
        manifest["created"] = f"2026-11-0{night + 1}T03:00:00+00:00"
        (d / "manifest.json").write_text(json.dumps(manifest))
    return root


@pytest.mark.slow
def test_history_follows_total_host_cpu_and_a_rise_is_a_regression(recorded, tmp_path):
    more, factor = more_host_cpu(recorded, tmp_path / "more", sides=("sender", "receiver"))   # the total grows too
    root = nightly_root(tmp_path / "rising", [recorded] * 3 + [more])
    res = zcorch_cli("history", root, "--check", "--metric", "total_host_busy_s_per_gib")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "REGRESSION (2 regressed)" in res.stdout
    changes = [float(c) for c in re.findall(r"([-+\d.]+)% \(total_host_busy_s_per_gib", res.stdout)]
    assert len(changes) == 2 and all(math.isclose(c, (factor - 1) * 100, rel_tol=1e-3) for c in changes), res.stdout
    assert "(lower is better)" in res.stdout
    page = (root / "index.html").read_text()
    assert "metric total_host_busy_s_per_gib (both host CPU, s/GiB, lower is better)" in page
    # the throughput is as recorded: never a regression; with three nights of identical copies an all-clear
    # only where what they could see is within the threshold
    doc = json.loads(zcorch_cli("history", root, "--check", "--format", "json").stdout)
    assert doc["exit_code"] in (0, 3) and all(c["comparison"]["verdict"] in ("unchanged", "cannot tell")
                                              for c in doc["experiments"][0]["cells"]), doc["reason"]

    root = nightly_root(tmp_path / "falling", [more] * 3 + [recorded])
    res = zcorch_cli("history", root, "--check", "--metric", "total_host_busy_s_per_gib")
    # Less CPU is never a regression. Whether each cell's fall is *significant* depends on the cell's own
    # spread: three baseline nights give Student's t two degrees of freedom (zcorch.analysis.detector), and
    # a cell whose repeats spread widely at the higher level may stay "cannot tell" (a rise of the same
    # size from the lower level is a regression: above).
    assert res.returncode in (0, 3) and "REGRESSION" not in res.stdout, res.stdout + res.stderr
    assert "regressed" not in res.stdout.split("method:")[0], res.stdout
