"""`zcorch compare` on real result sets: a sweep against itself, and against a really slower sweep.

The slower sweep is a real run, never edited numbers, with identical parameters (same cell ids):
in the two-host lab, the candidate's data link is rate-limited with `tc qdisc ... tbf` on the
sender's data interface (inside the sender's namespace: the data flows sender -> receiver, so that
is where a queue limits it). (Confining a localhost run to one CPU next to busy loops is not a
reliable slowdown: splice->splice got faster that way.)
"""
import json
import re

import pytest

import zcorch
from zcorch.analysis.compare import compare_frames

from fixtures_analysis import DATA, copy_result_set, slowed_copy, zcorch_cli



def check_regression(base, cand, n_cells: int, min_drop_pct: float, n_runs: int = 6):
    res = zcorch_cli("compare", base, cand)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"REGRESSION: {n_cells} cell(s) regressed" in res.stdout, res.stdout
    assert res.stdout.splitlines()[-1].startswith(f"zcorch compare: regression: {n_cells} cell(s) regressed: ")
    table = compare_frames(zcorch.load(base), zcorch.load(cand))
    assert list(table["verdict"]) == ["regressed"] * n_cells, table.to_string()
    assert (table["change_pct"] < -min_drop_pct).all() and (table["p_value"] < 0.01).all()
    assert (table["n_base"] == n_runs).all() and (table["n_cand"] == n_runs).all()
    md = zcorch_cli("compare", base, cand, "--format", "markdown")
    assert md.returncode == 1 and "| regressed |" in md.stdout

    back = zcorch_cli("compare", cand, base)  # the other way round it is an improvement
    assert back.returncode == 0 and f"{n_cells} improved" in back.stdout, back.stdout
    # a threshold larger than the slowdown tolerates it
    worst = float(-table["change_pct"].min())
    assert zcorch_cli("compare", base, cand, "--threshold", str(worst + 1)).returncode == 0


@pytest.mark.slow
def test_a_set_against_itself_with_too_few_runs_cannot_tell_never_passes(cpu_set, tmp_path):
    # 2 repeats a cell: no difference could ever be significant, so identical sets are no all-clear
    other = copy_result_set(cpu_set, tmp_path / "again")
    res = zcorch_cli("compare", cpu_set, other)
    assert res.returncode == 3, res.stdout + res.stderr
    last = res.stdout.splitlines()[-1]
    assert last.startswith("zcorch compare: cannot tell: 4 cell(s) cannot tell: "), last
    assert "could see no change at all" in last and re.search(r"needs ≥ \d+ runs a side", last), last
    js = json.loads(zcorch_cli("compare", cpu_set, other, "--format", "json").stdout)
    assert (js["verdict"], js["exit_code"]) == ("cannot tell", 3)
    assert js["power"] == 0.8 and js["detectable_pct"] is None and js["detectable"] == "none"
    assert all(c["verdict"] == "cannot tell" and c["detectable_pct"] is None for c in js["cells"])


@pytest.mark.slow
def test_an_a_a_rerun_passes_only_where_its_detectable_change_is_within_the_threshold(compare_set_recorded,
                                                                                     tmp_path):
    # a real sweep of 6 repeats a cell against a copy of itself: the verdict hangs on what it could have seen
    base = copy_result_set(compare_set_recorded, tmp_path / "base")
    again = copy_result_set(compare_set_recorded, tmp_path / "again")
    doc = json.loads(zcorch_cli("compare", base, again, "--format", "json").stdout)
    seen = doc["detectable_pct"]   # 6 runs a side reach p < 0.05: finite, however noisy the machine was
    assert seen is not None and 0 < seen, doc
    assert max(c["detectable_pct"] for c in doc["cells"]) == pytest.approx(seen)
    wide = zcorch_cli("compare", base, again, "--threshold", f"{seen * 1.1 + 0.05:.2f}")
    assert wide.returncode == 0, wide.stdout
    assert wide.stdout.splitlines()[-1].startswith("zcorch compare: no regression: 2 cell(s) compared; could see "
                                                   "changes ≥ "), wide.stdout
    narrow = zcorch_cli("compare", base, again, "--threshold", f"{seen * 0.8:.2f}")
    assert narrow.returncode == 3, narrow.stdout
    assert "cannot tell" in narrow.stdout.splitlines()[-1] and "runs a side" in narrow.stdout.splitlines()[-1]


def test_a_large_drop_on_too_few_runs_is_never_an_all_clear(small_set, tmp_path):
    # the real small set (3 repeats) against itself as a machine 5x slower records it: -80% in every cell
    slow = slowed_copy(small_set, tmp_path / "slow", 5.0)
    res = zcorch_cli("compare", small_set, slow)
    assert res.returncode == 3, res.stdout   # 3 against 3 never reach p < 0.05: cannot tell, not "no regression"
    assert "-80.0" in res.stdout and "cannot tell" in res.stdout.splitlines()[-1]
    # one run against one run
    one, one_slow = slowed_copy(small_set, tmp_path / "one", 1.0, repeats=1), slowed_copy(small_set, tmp_path / "o5",
                                                                                           5.0, repeats=1)
    res = zcorch_cli("compare", one, one_slow, "--format", "json")
    doc = json.loads(res.stdout)
    assert res.returncode == 3 and doc["verdict"] == "cannot tell", res.stdout
    judged = [c for c in doc["cells"] if c["n_base"] and c["n_cand"]]
    assert judged and all(c["verdict"] == "cannot tell" and c["needs"].startswith("≥ 4 runs a side") for c in judged)


def test_a_result_set_with_failed_runs_is_incomplete_even_against_itself(small_set, tmp_path):
    # a real sweep in which one cell always fails: 36 of its 39 planned runs are ok. Nothing regressed
    # among the cells both sides measured, but the gate must not pass on the runs it does not have.
    other = copy_result_set(small_set, tmp_path / "again")
    res = zcorch_cli("compare", small_set, other)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "12 cannot tell" in res.stdout and "1 no base data" in res.stdout  # the cell that always fails
    last = res.stdout.splitlines()[-1]
    assert last.startswith("zcorch compare: cannot tell: ")
    assert f"base {small_set}: 36 of 39 planned runs ok" in last and f"candidate {other}: 36 of 39" in last
    md = zcorch_cli("compare", small_set, other, "--format", "markdown")
    assert md.returncode == 3 and md.stdout.startswith("### zcorch compare: CANNOT TELL: ")
    assert "too few repeats" in md.stdout  # 3 repeats a side can never be significant
    # identical values on both sides are ties: the exact permutation distribution, and the output says so
    tied = "two-sided Mann–Whitney U (scipy.stats.mannwhitneyu, exact permutation distribution, ties)"
    assert f"significance: {tied}, alpha 0.05" in res.stdout and tied in md.stdout
    js = zcorch_cli("compare", small_set, other, "--format", "json")
    doc = json.loads(js.stdout)
    cells = doc["cells"]
    assert js.returncode == 3 and len(cells) == 13
    assert doc["verdict"] == "cannot tell" and doc["exit_code"] == 3 and "36 of 39" in doc["reason"]
    assert doc["metric"] == "gbit_s" and doc["threshold_pct"] == 5.0
    assert [c["test"] for c in cells if c["p_value"] is not None] == [tied] * 12
    assert all(c["p_value"] == 1.0 for c in cells if c["p_value"] is not None)


def test_bad_options_are_clean_errors(small_set):
    res = zcorch_cli("compare", small_set, small_set, "--threshold", "-1")
    assert res.returncode == 2 and "--threshold" in res.stderr and "Traceback" not in res.stderr
    res = zcorch_cli("compare", small_set, small_set.parent / "missing")
    assert res.returncode == 2 and "missing" in res.stderr and "Traceback" not in res.stderr
    res = zcorch_cli("compare", small_set, small_set, "--metric", "no_such_metric")
    assert res.returncode == 2 and "--metric" in res.stderr and "Traceback" not in res.stderr
    (small_set / "plan.json").unlink()        # a set that cannot say what it should hold is no input to gate on
    res = zcorch_cli("compare", small_set, small_set)
    assert res.returncode == 2 and "plan.json" in res.stderr and "Traceback" not in res.stderr


def test_two_result_sets_with_no_cell_in_common_are_incomplete(small_set, cpu_set):
    # two real sweeps of different experiments: nothing can be compared, which is no pass
    res = zcorch_cli("compare", cpu_set, small_set)
    assert res.returncode == 3, res.stdout + res.stderr
    last = res.stdout.splitlines()[-1]
    assert last.startswith("zcorch compare: cannot tell: no cell measured on both sides (base 4 cells planned, "
                           "candidate 13)")
    assert "4 cell(s) only in base" in last and "13 cell(s) only in candidate" in last


def test_a_short_candidate_is_incomplete_and_a_failed_cell_is_named(cpu_set, tmp_path):
    # the candidate is the same real sweep cut short as a killed one is: its last runs never written
    cand = copy_result_set(cpu_set, tmp_path / "cut")
    lines = (cand / "runs.jsonl").read_text().splitlines(keepends=True)
    (cand / "runs.jsonl").write_text("".join(lines[:-2]))
    manifest = json.loads((cand / "manifest.json").read_text())
    manifest["status"] = "interrupted"
    (cand / "manifest.json").write_text(json.dumps(manifest))
    res = zcorch_cli("compare", cpu_set, cand)
    assert res.returncode == 3, res.stdout + res.stderr
    assert f"candidate {cand}: status interrupted, 6 of 8 planned runs ok" in res.stdout.splitlines()[-1]


@pytest.mark.lab
@pytest.mark.slow
def test_a_rate_limited_link_is_a_significant_regression(throttled_nights, tmp_path):
    # the lab's session sweeps: one shaped to 2 Gbit/s, the same shaped to 500 Mbit/s (5 runs a cell)
    base = copy_result_set(throttled_nights.alike[1], tmp_path / "base")
    cand = copy_result_set(throttled_nights.slowed, tmp_path / "candidate")
    cand_df = zcorch.load(cand)
    assert (cand_df["gbit_s"] < 0.55).all()  # the limit is what the candidate got
    check_regression(base, cand, n_cells=2, min_drop_pct=30, n_runs=5)


@pytest.mark.slow
def test_testing_only_beyond_the_threshold_gives_the_same_verdicts_and_spares_scipy(small_set):
    """compare_frames(test_all=False), what the end of a fleet run uses: a change within the threshold is
    `unchanged` whatever the test says when the cell could have seen a change of the threshold, and one with too
    few runs to ever reach p < alpha (3 a side: p >= 0.1) `cannot tell` whatever it says, so neither is tested
    (p NaN); every verdict is the one of test_all=True. And nothing on that path imports scipy until a test runs."""
    import math
    import subprocess
    import sys

    import pandas as pd

    from zcorch.analysis.stats import can_be_significant

    small = zcorch.load(small_set)
    doubled = pd.concat([small, small], ignore_index=True)   # 6 runs a cell: p can go below 0.05
    for base in (small, doubled):
        cand = base.copy()
        halved = sorted(set(cand["cell"]))[::2]   # half the cells really slower in the candidate
        cand.loc[cand["cell"].isin(halved), "gbit_s"] *= 0.5
        full = compare_frames(base, cand)
        lazy = compare_frames(base, cand, test_all=False)
        assert list(lazy["verdict"]) == list(full["verdict"])
        if base is small:
            assert set(lazy["verdict"]) == {"cannot tell", "no base data"}
        else:
            assert "regressed" in set(lazy["verdict"])
        tested = 0
        for (_, f), (_, z) in zip(full.iterrows(), lazy.iterrows()):
            within = (not abs(f["change_pct"]) > 5.0 and f["detectable_pct"] <= 5.0
                      if not math.isnan(f["change_pct"]) else True)
            hopeless = not can_be_significant(int(f["n_base"]), int(f["n_cand"]), 0.05)
            assert math.isnan(z["p_value"]) == (within or hopeless or math.isnan(f["p_value"])), (f.to_dict(),
                                                                                                 z.to_dict())
            tested += not math.isnan(z["p_value"])
        assert (tested == 0) == (base is small), tested   # 3 a side: never; 6 a side: at least the halved cells
    code = ("import sys, zcorch.analysis.pairs, zcorch.analysis.load; "
            "sys.exit(1 if 'scipy.stats' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
