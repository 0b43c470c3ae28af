"""`zcorch history` on result sets written through zcorch.results.store (real files, synthetic numbers):
finding and grouping sweeps, the newest sweep against the preceding stable segment, the page in a real
browser. The lab sweeps (a real `tc tbf` slowdown) are in test_history_lab.py."""
import datetime as dt
import json
import os
import re
from urllib.parse import unquote, urlparse

import numpy as np
import pytest

import zcorch
from zcorch.analysis.history import build_history, find_result_sets, render_text
from zcorch.plan import cell_id
from zcorch.results.store import ResultSet

from fixtures_analysis import copy_result_set, zcorch_cli

T0 = dt.datetime(2026, 11, 1, 3, 0, tzinfo=dt.timezone.utc)
READ = {"send_mode": "write", "recv_mode": "read", "buffer": 65536, "bytes": 1 << 26}
SPLICE = {"send_mode": "write", "recv_mode": "splice", "buffer": 65536, "bytes": 1 << 26}


def write_sweep(directory, name, night, cells, status="complete", rel_noise=0.01, repeats=5,
                kernel="6.1.0-test", manifest_extra=None, hosts="localhost", error=None, worker_extra=None):
    """A result set as `zcorch run` writes it, through ResultSet: `cells` = [(params, Gbit/s or None
    for runs that all fail)]; noise of rel_noise per run, seeded by the night."""
    exp_text = f"name: {name}\nhosts: {hosts}\n"
    rs = ResultSet.create(str(directory), name=name, experiment_bytes=exp_text.encode(), plan_runs=[],
                          command=["zcorch", "run"], accept_new_host_keys=False, zcorch_version="0",
                          git_revision=f"{night:02d}abcdef0123456789abcdef0123456789abcd-dirty")
    rng = np.random.default_rng(night)
    for params, gbit in cells:
        for r in range(repeats):
            rec = {"cell": cell_id(params), "repeat": r, "params": params, "status": "ok", "reason": None,
                   "sender": None, "receiver": None}
            if gbit is None:
                rec.update(status="failed", reason="worker failed")
            else:
                wall = int(params["bytes"] * 8 / (gbit * (1 + rel_noise * rng.standard_normal())))
                rec["receiver"] = rec["sender"] = {"bytes": params["bytes"], "wall_ns": wall, **(worker_extra or {})}
            rs.append_run(rec)
    rs.write_meta({"hosts": {role: {"hostname": "h", "kernel": {"release": kernel}} for role in ("sender", "receiver")}})
    rs.manifest["created"] = (T0 + dt.timedelta(days=night)).isoformat()
    rs.manifest.update(manifest_extra or {})
    rs.finish(status, error)
    return directory


def nights(root, name, levels, **kw):
    """One sweep per night under ROOT/<night>/<name> (as contrib/nightly/zcorch-nightly lays them out);
    levels[i] = [(params, Gbit/s)] of night i."""
    for i, cells in enumerate(levels):
        write_sweep(root / f"2026{i:04d}T0300Z" / name, name, i, cells, **kw)


def check(root, *args):
    return zcorch_cli("history", root, "--check", *args)


@pytest.mark.slow
def test_stable_nights_pass_and_a_slower_newest_night_fails_naming_cells_change_and_since(tmp_path):
    root = tmp_path / "nightly"
    nights(root, "exp", [[(READ, 10.0), (SPLICE, 5.0)]] * 6)
    # five earlier nights at 1% run noise could not show a 3% change: no all-clear, and what would decide it
    res = check(root)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "exp: 6 sweep(s)" in res.stdout and "CANNOT TELL (2 cannot tell)" in res.stdout
    assert re.search(r"needs \d+ more nights? at this level", res.stdout), res.stdout
    # a 10% change they could show: no regression, with what it could see
    res = check(root, "--threshold", "10")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no regression (2 unchanged; could see changes ≥ " in res.stdout
    assert (root / "index.html").is_file()

    write_sweep(root / "20260006T0300Z" / "exp", "exp", 6, [(READ, 8.0), (SPLICE, 5.0)])
    res = check(root)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "REGRESSION (1 regressed, 1 unchanged)" in res.stdout
    line = next(ln for ln in res.stdout.splitlines() if "recv_mode=read" in ln)
    change = float(re.search(r"\[cell \w+\]: ([-+\d.]+)%", line).group(1))
    assert -22 < change < -18
    assert f"since {root / '20260006T0300Z' / 'exp'};" in line
    assert f"against 6 sweeps {root / '20260000T0300Z' / 'exp'} .. {root / '20260005T0300Z' / 'exp'}" in line
    assert "recv_mode=splice" not in res.stdout.split("REGRESSION")[1].split("method:")[0]
    # without --check the same report, exit 0
    plain = zcorch_cli("history", root)
    assert plain.returncode == 0 and "REGRESSION" in plain.stdout


def test_a_regression_stays_reported_since_the_step_and_is_measured_against_the_level_before(tmp_path):
    root = tmp_path / "r"
    nights(root, "exp", [[(READ, 10.0)]] * 8 + [[(READ, 7.0)]] * 3)
    hist = build_history(root, reports=False)
    (exp,) = hist.experiments
    (cell,) = exp.cells
    assert cell.fit.steps == [8]
    c = cell.comparison
    assert c.verdict == "regressed" and c.since == 8 and c.baseline == list(range(8))
    assert c.change_pct == pytest.approx(-30, abs=2)
    assert f"since {exp.sweeps[8].path};" in render_text(hist)


@pytest.mark.slow
def test_a_fixed_regression_passes_and_a_spike_is_not_the_level(tmp_path):
    root = tmp_path / "r"
    # 10, a slow stretch, back to 10: the newest night is compared with the slow stretch's segment...
    nights(root, "fixed", [[(READ, 10.0)]] * 6 + [[(READ, 7.0)]] * 3 + [[(READ, 10.0)]] * 2)
    # ...and one very fast night before the newest one is a spike, not the level to hold it against
    nights(root, "spike", [[(READ, 10.0)]] * 10 + [[(READ, 20.0)]] + [[(READ, 10.0)]])
    hist = build_history(root, reports=False)
    fixed, spike = hist.experiments
    assert fixed.cells[0].fit.steps == [6, 9] and fixed.cells[0].comparison.verdict == "improved"
    assert spike.cells[0].fit.steps == [10, 11]
    c = spike.cells[0].comparison
    # the newest night alone is judged (no window reaches back over the spike), against the 10 nights before it:
    # as high as they are; one night against a 0.7% spread just sees 3% (at a stricter alpha it could not,
    # and would need one more night)
    assert c.baseline == list(range(10)) and c.window == [11] and abs(c.change_pct) < 1
    assert c.verdict == "unchanged" and 2.5 < c.detectable_pct < 3 and not c.needs, c
    strict = build_history(root, alpha=0.005, reports=False).experiments[1].cells[0].comparison
    assert strict.verdict == "cannot tell" and 3 < strict.detectable_pct < 4, strict
    assert strict.needs == "1 more night at this level", strict
    assert not hist.bad


def test_noisy_equal_nights_are_not_a_regression(tmp_path):
    root = tmp_path / "r"
    nights(root, "exp", [[(READ, 10.0), (SPLICE, 5.0)]] * 12, rel_noise=0.03)
    hist = build_history(root, reports=False)
    assert not hist.bad
    assert all(c.fit.steps == [] for c in hist.experiments[0].cells)


def test_cells_that_now_always_fail_and_a_sweep_that_measured_nothing(tmp_path):
    root = tmp_path / "r"
    nights(root, "cells", [[(READ, 10.0), (SPLICE, 5.0)]] * 4)
    write_sweep(root / "n5" / "cells", "cells", 5, [(READ, 10.0), (SPLICE, None)])
    nights(root, "dead", [[(READ, 10.0)]] * 3)
    # the hosts were unreachable: the set exists, with no run and the error
    rs = ResultSet.create(str(root / "n5" / "dead"), name="dead", experiment_bytes=b"name: dead\n", plan_runs=[],
                          command=["zcorch"], accept_new_host_keys=False, zcorch_version="0", git_revision=None)
    rs.manifest["created"] = (T0 + dt.timedelta(days=9)).isoformat()
    rs.finish("failed", ConnectionRefusedError("sender: connection refused"))
    res = check(root)
    assert res.returncode == 3, res.stdout + res.stderr   # nothing measured regressed: the data is missing
    assert "recv_mode=splice [cell" in res.stdout and "every run failed" in res.stdout
    last = res.stdout.splitlines()[-1]
    assert last.startswith("zcorch history: cannot tell: ")
    assert f"dead: newest sweep {root / 'n5' / 'dead'}: status failed" in last
    assert "cells recv_mode=splice: no ok run in the newest sweep" in last
    assert (f"the newest sweep {root / 'n5' / 'dead'} measured nothing: status failed, 0 ok / 0 failed runs "
            "(ConnectionRefusedError: sender: connection refused)") in res.stdout
    assert zcorch.load(root / "n5" / "dead").empty  # a set with no runs.jsonl loads as no rows


def test_result_sets_at_any_depth_grouped_by_name_and_what_is_not_one(tmp_path):
    root = tmp_path / "r"
    write_sweep(root / "a", "one", 0, [(READ, 1.0)])
    write_sweep(root / "x" / "y" / "z" / "b", "one", 1, [(READ, 1.0)])
    write_sweep(root / "c", "two", 2, [(READ, 1.0)])
    write_sweep(root / "a" / "logs" / "nested", "one", 3, [(READ, 1.0)])   # inside a result set: not searched
    (root / "foreign").mkdir()
    (root / "foreign" / "manifest.json").write_text('{"format": "something-else"}')
    (root / "future").mkdir()
    (root / "future" / "manifest.json").write_text('{"format": "zcorch-results", "format_version": 99}')
    warnings = []
    found = find_result_sets(root, warnings.append)
    assert found == [root / "a", root / "c", root / "x" / "y" / "z" / "b"]
    assert len(warnings) == 1 and "version 99" in warnings[0]
    hist = build_history(root, reports=False)
    assert [(e.name, [s.path for s in e.sweeps]) for e in hist.experiments] == [
        ("one", [root / "a", root / "x" / "y" / "z" / "b"]), ("two", [root / "c"])]
    res = zcorch_cli("history", root)
    assert res.returncode == 0 and "version 99" in res.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    res = zcorch_cli("history", empty, "--check")
    assert res.returncode == 2 and "no zcorch result set found" in res.stderr and "Traceback" not in res.stderr
    res = zcorch_cli("history", root, "--threshold", "-1")
    assert res.returncode == 2 and "--threshold" in res.stderr


def test_other_metrics_and_their_direction(tmp_path):
    root = tmp_path / "r"
    nights(root, "exp", [[(READ, 10.0)]] * 5 + [[(READ, 12.0)]])
    assert check(root).returncode == 0        # faster is no regression
    assert check(root, "--metric", "mb_s").returncode == 0
    res = zcorch_cli("history", root, "--metric", "nope")
    assert res.returncode == 2 and "invalid choice" in res.stderr


def test_the_page_lists_sweeps_links_reports_and_shows_the_plots_in_a_browser(tmp_path, browser):
    root = tmp_path / "nightly"
    inv = {"inventory": {"path": "/etc/zcorch/inventory.yaml", "pair": "rack3"}}
    nights(root, "exp <b>x</b>", [[(READ, 10.0), (SPLICE, 5.0)]] * 3, manifest_extra=inv)
    hosts = "{sender: {ssh: root@s.example, data_address: 10.0.0.1}, receiver: {ssh: r.example, data_address: 10.0.0.2}}"
    write_sweep(root / "20260003T0300Z" / "exp <b>x</b>", "exp <b>x</b>", 3, [(READ, 7.0), (SPLICE, 5.0)],
                kernel="6.2.0-new", hosts=hosts)
    out = tmp_path / "site"
    res = zcorch_cli("history", root, "-o", out, "--reports")
    assert res.returncode == 0, res.stderr
    page = (out / "index.html").read_text()
    assert not (root / "index.html").exists()
    assert "exp &lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
    for night in range(4):
        d = root / f"2026{night:04d}T0300Z" / "exp <b>x</b>"
        assert (d / "report.html").is_file()  # written because it was missing
        # percent-encoded (zcorch.analysis.links): a path, whatever characters the names hold
        assert f'href="../nightly/2026{night:04d}T0300Z/exp%20%3Cb%3Ex%3C/b%3E/report.html"' in page
    assert "rack3 (inventory.yaml)" in page and "root@s.example → r.example" in page
    assert "6.2.0-new" in page and "6.1.0-test" in page and "03abcdef0123-dirty" in page
    assert page.count('<img src="history-plots/') == 2
    assert 'class="bad"' in page and "regressed" in page

    # a report newer than the runs is kept; one older than them is written again
    report = root / "20260000T0300Z" / "exp <b>x</b>" / "report.html"
    report.write_text("kept")
    zcorch_cli("history", root, "-o", out, "--reports")
    assert report.read_text() == "kept"
    runs = report.parent / "runs.jsonl"
    stamp = report.stat().st_mtime + 10
    os.utime(runs, (stamp, stamp))
    zcorch_cli("history", root, "-o", out)          # without --reports: none written, the stale one linked
    assert report.read_text() == "kept" and "exp%20%3Cb%3Ex%3C/b%3E/report.html" in (out / "index.html").read_text()
    zcorch_cli("history", root, "-o", out, "--reports")
    assert report.read_text().startswith("<!DOCTYPE html>")
    # a night without a report is not linked (none is written without --reports)
    (root / "20260001T0300Z" / "exp <b>x</b>" / "report.html").unlink()
    zcorch_cli("history", root, "-o", out)
    assert "20260001T0300Z/exp%20%3Cb%3Ex%3C/b%3E/report.html" not in (out / "index.html").read_text()
    assert not (root / "20260001T0300Z" / "exp <b>x</b>" / "report.html").exists()
    page = (out / "index.html").read_text()

    # in a real browser: every image decodes, every link leads to a file
    probe = out / "probe.html"
    probe.write_text(page.replace("</body>", PROBE + "</body>"))
    dom = browser.dump_dom(probe.as_uri(), "probe")
    seen = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1)
                      .replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
    assert len(seen["images"]) == 2 and all(i["ok"] and i["w"] > 400 for i in seen["images"])
    files = [unquote(urlparse(h).path) for h in seen["links"] if h.startswith("file:")]
    assert len(files) >= 8 and all(os.path.exists(f) for f in files), files


def test_a_night_whose_runs_began_on_a_shared_host_is_marked(tmp_path):
    # the workers' idle probe before each run: 40% idle of 2 CPUs is 1.2 CPUs of other work (host_shared);
    # 99% idle is 0.02 CPU, a quiet host
    root = tmp_path / "nightly"
    for night, idle in enumerate((0.99, 0.4, 0.99)):
        write_sweep(root / f"2026{night:04d}T0300Z" / "exp", "exp", night, [(READ, 10.0)],
                    worker_extra={"host_idle_before": idle, "host_ncpus": 2})
    out = tmp_path / "site"
    res = zcorch_cli("history", root, "-o", out)
    assert res.returncode == 0, res.stderr
    page = (out / "index.html").read_text()
    rows = [r for r in page.split("<tr>") if "<code>" in r and "abcdef" in r]   # the sweeps table, newest first
    assert len(rows) == 3
    assert ["host shared</span>" in r for r in rows] == [False, True, False]
    doc = json.loads(zcorch_cli("history", root, "--format", "json").stdout)
    assert [s["host_shared"] for s in doc["experiments"][0]["sweeps"]] == [False, True, False]


PROBE = """<script>
window.addEventListener('load', function () {
  var out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify({
    images: Array.prototype.map.call(document.images, function (i) {
      return {ok: i.complete && i.naturalWidth > 0, w: i.naturalWidth}; }),
    links: Array.prototype.map.call(document.links, function (a) { return a.href; })});
  document.body.appendChild(out);
});
</script>"""


@pytest.mark.slow
def test_check_on_real_result_sets_exit_codes_and_json(cpu_set, small_set, tmp_path):
    """Each exit code of `history --check` on result sets that real sweeps wrote: two nights of a complete
    sweep of two runs a cell cannot tell (3: two runs against two are never significant); a newest night with
    failed runs (the quickstart-small sweep, whose one cell always fails)
    is incomplete (3), as is an experiment with one night only; a missing root is an input error (2)."""
    root = tmp_path / "nightly"
    first = copy_result_set(cpu_set, root / "n1" / "cpu-small")
    second = copy_result_set(cpu_set, root / "n2" / "cpu-small")
    manifest = json.loads((second / "manifest.json").read_text())
    manifest["created"] = "2099-01-01T03:00:00+00:00"     # the copy is the later night
    (second / "manifest.json").write_text(json.dumps(manifest))
    res = check(root)
    assert res.returncode == 3, res.stdout + res.stderr
    last = res.stdout.splitlines()[-1]
    assert last.startswith("zcorch history: cannot tell: 4 cell(s) cannot tell: ") and "runs a side" in last, last
    js = zcorch_cli("history", root, "--check", "--format", "json")
    doc = json.loads(js.stdout)
    assert js.returncode == 3 and (doc["verdict"], doc["exit_code"]) == ("cannot tell", 3)
    cell = doc["experiments"][0]["cells"][0]
    assert cell["n"] == 2 and cell["ci_level"] == pytest.approx(0.5)   # two runs: [min, max] covers 50%
    # two runs against two can never be significant: no change is detectable, so not "unchanged"
    assert cell["steps"] == [] and cell["comparison"]["verdict"] == "cannot tell"
    assert cell["comparison"]["detectable_pct"] is None and cell["comparison"]["needs"]
    assert first != second

    for n in ("n1", "n2"):
        copy_result_set(small_set, root / n / "quickstart-small")
    later = root / "n2" / "quickstart-small" / "manifest.json"
    manifest = json.loads(later.read_text())
    manifest["created"] = "2099-01-01T03:00:00+00:00"
    later.write_text(json.dumps(manifest))
    res = check(root)
    assert res.returncode == 3, res.stdout + res.stderr
    last = res.stdout.splitlines()[-1]
    assert f"quickstart-small: newest sweep {root / 'n2' / 'quickstart-small'}: 36 of 39 planned runs ok" in last
    assert zcorch_cli("history", root).returncode == 0          # without --check: a page, not a gate

    alone = tmp_path / "alone"
    copy_result_set(cpu_set, alone / "cpu-small")
    res = check(alone)
    assert res.returncode == 3 and "cpu-small: one sweep only, nothing earlier to compare with" in res.stdout
    res = check(tmp_path / "missing")
    assert res.returncode == 2 and "Traceback" not in res.stderr


def test_result_sets_are_grouped_by_the_datasets_query_as_summarize_reads_their_runs():
    """history.SetRuns (result sets' runs in one DuckDB relation, the query an exported dataset is read with)
    gives each (set, cell) the n, n_failed, median and interval stats.summarize computes from the same runs:
    a null or odd status is not ok, text and NaN values are left out, a null cell is no cell of the series, a
    set without runs has no group."""
    import pandas as pd

    from zcorch.analysis.history import OkGroups, SetRuns
    from zcorch.analysis.stats import summarize
    from zcorch.errors import ResultsError

    a = pd.DataFrame({"cell": ["c1", "c1", "c1", "c1", None, "c2", "c2", "c2", "c2", "c2", "c2", "c2"],
                      "status": ["ok", "failed", None, "ok", "ok", "ok", "ok", "ok", "ok", "ok", "ok", 3],
                      "gbit_s": [2.0, 1.0, 3.0, "x", 9.0, 5.0, -1.0, float("nan"), 4.0, 4.5, 6.0, 1.0],
                      "buffer": [1] * 12})
    b = pd.DataFrame({"cell": ["c1"] * 7, "status": ["ok"] * 7, "gbit_s": [7.0, 1.0, 3.0, 2.0, 6.0, 5.0, 4.0],
                      "buffer": [1] * 7})
    reader = SetRuns({"/a": a, "/b": b, "/empty": a.iloc[0:0]}, "gbit_s")
    groups = OkGroups(reader.ok_table("gbit_s", ["/b", "/a", "/empty"]))
    got = {(s, c): (int(n), int(f), m, lo, hi) for s, c, n, f, m, lo, hi in zip(
        groups.set_id, groups.cell, groups.n, groups.n_failed, groups.median, groups.ci_low, groups.ci_high)
        if c is not None}
    want = {}
    for sid, frame in (("/a", a), ("/b", b)):
        summ = summarize(frame[frame["cell"].notna()], by=["cell"], metrics=["gbit_s"])
        for _, row in summ.iterrows():
            want[(sid, row["cell"])] = (int(row["n"]), int(row["n_failed"]), row["gbit_s_median"],
                                        row["gbit_s_ci_low"], row["gbit_s_ci_high"])
    assert got.keys() == want.keys() and list(groups.set_id[:1]) == ["/b"]
    for k in want:
        assert got[k][:2] == want[k][:2], k
        np.testing.assert_allclose(got[k][2:], want[k][2:], equal_nan=True, err_msg=str(k))
    params = reader.cell_params(["/a", "/b"], [], by=["x", "y"])
    assert sorted(map(tuple, params[["_series", "cell"]].values.tolist())) == [("x", "c1"), ("x", "c2"), ("y", "c1")]
    with pytest.raises(ResultsError, match="/a: no column 'mb_s'"):
        SetRuns({"/a": a}, "mb_s")
