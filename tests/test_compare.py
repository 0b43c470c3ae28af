"""`zcorch compare` on real result sets: a sweep against itself, and against a really slower sweep.

The slower sweep is a real run, never edited numbers, with identical parameters (same cell ids):
in the two-host lab, the candidate's data link is rate-limited with `tc qdisc ... tbf` on the
sender's data interface (inside the sender's namespace: the data flows sender -> receiver, so that
is where a queue limits it). (Confining a localhost run to one CPU next to busy loops is not a
reliable slowdown: splice->splice got faster that way.)
"""
import json

import pytest

import zcorch
from zcorch.analysis.compare import compare_frames

from conftest import require_tool
from fixtures_analysis import DATA, copy_result_set, zcorch_cli



def check_regression(base, cand, n_cells: int, min_drop_pct: float):
    res = zcorch_cli("compare", base, cand)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"REGRESSION: {n_cells} cell(s)" in res.stdout, res.stdout
    table = compare_frames(zcorch.load(base), zcorch.load(cand))
    assert list(table["verdict"]) == ["regressed"] * n_cells, table.to_string()
    assert (table["change_pct"] < -min_drop_pct).all() and (table["p_value"] < 0.01).all()
    assert (table["n_base"] == 6).all() and (table["n_cand"] == 6).all()
    md = zcorch_cli("compare", base, cand, "--format", "markdown")
    assert md.returncode == 1 and "| regressed |" in md.stdout

    back = zcorch_cli("compare", cand, base)  # the other way round it is an improvement
    assert back.returncode == 0 and f"{n_cells} improved" in back.stdout, back.stdout
    # a threshold larger than the slowdown tolerates it
    worst = float(-table["change_pct"].min())
    assert zcorch_cli("compare", base, cand, "--threshold", str(worst + 1)).returncode == 0


def test_a_result_set_against_itself_is_unchanged(small_set, tmp_path):
    other = copy_result_set(small_set, tmp_path / "again")
    res = zcorch_cli("compare", small_set, other)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no significant regression" in res.stdout
    assert "12 unchanged" in res.stdout and "1 no base data" in res.stdout  # the cell that always fails
    md = zcorch_cli("compare", small_set, other, "--format", "markdown")
    assert md.returncode == 0 and md.stdout.startswith("### zcorch compare: no significant regression")
    assert "too few repeats" in md.stdout  # 3 repeats a side can never be significant
    # identical values on both sides are ties: the exact permutation distribution, and the output says so
    tied = "two-sided Mann–Whitney U (scipy.stats.mannwhitneyu, exact permutation distribution, ties)"
    assert f"significance: {tied}, alpha 0.05" in res.stdout and tied in md.stdout
    js = zcorch_cli("compare", small_set, other, "--format", "json")
    cells = json.loads(js.stdout)
    assert js.returncode == 0 and len(cells) == 13
    assert [c["test"] for c in cells if c["p_value"] is not None] == [tied] * 12
    assert all(c["p_value"] == 1.0 for c in cells if c["p_value"] is not None)


def test_bad_options_are_clean_errors(small_set):
    res = zcorch_cli("compare", small_set, small_set, "--threshold", "-1")
    assert res.returncode == 2 and "--threshold" in res.stderr and "Traceback" not in res.stderr
    res = zcorch_cli("compare", small_set, small_set.parent / "missing")
    assert res.returncode == 1 and "missing" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.lab
@pytest.mark.slow
def test_a_rate_limited_link_is_a_significant_regression(lab, tmp_path):
    require_tool("tc")
    experiment = tmp_path / "compare-lab.yaml"
    text = (DATA / "compare.yaml").read_text().replace("hosts: localhost\n", "")
    experiment.write_text(text + lab.layout.hosts_yaml())
    base, cand = tmp_path / "base", tmp_path / "candidate"
    res = zcorch_cli("run", experiment, "-o", base)
    assert res.returncode == 0, res.stderr[-3000:]
    with lab.rate_limited("sender", "500mbit"):
        res = zcorch_cli("run", experiment, "-o", cand)
    assert res.returncode == 0, res.stderr[-3000:]
    cand_df = zcorch.load(cand)
    assert (cand_df["gbit_s"] < 0.55).all()  # the limit is what the candidate got
    check_regression(base, cand, n_cells=2, min_drop_pct=30)
