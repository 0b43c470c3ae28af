"""Every gate on data that cannot show a regression: three answers, never a false all-clear.

The nights are copies of one real localhost sweep (tests/data/compare.yaml, 6 repeats of 2 cells) as a machine
that many times slower would have recorded them (fixtures_analysis.slowed_copy: each run's wall time scaled, so
its rate and its noise scale with it): real runs, real within-night spread, a known night-to-night change.
"""
import json

import pytest

from fixtures_analysis import copy_result_set, nights_of, slowed_copy, zcorch_cli
from fixtures_browser import open_in_browser


def gate_of(*args):
    res = zcorch_cli(*args, "--format", "json")
    doc = json.loads(res.stdout)
    return res.returncode, doc


def test_two_drops_of_60_and_68_percent_after_three_noisy_nights_are_never_an_all_clear(compare_set_recorded,
                                                                                          tmp_path, browser):
    root = tmp_path / "nightly"
    nights_of(compare_set_recorded, root, [1.0, 1 / 0.93, 1 / 1.06, 1 / 0.40, 1 / 0.32])
    code, doc = gate_of("history", root, "--check")
    assert code in (1, 3), doc["reason"]
    assert doc["verdict"] in ("regression", "cannot tell")
    cells = [c["comparison"] for e in doc["experiments"] for c in e["cells"]]
    assert all(c["verdict"] in ("regressed", "cannot tell") for c in cells), cells
    assert all(c["change_pct"] < -50 for c in cells), cells
    # the page opens with the same answer, coloured, never the green all-clear
    page = (root / "index.html").read_text()
    assert "No regression in the newest sweep" not in page
    assert ('class="verdict bad"' in page) == (code == 1) and ('class="verdict undecided"' in page) == (code == 3)
    seen = open_in_browser(browser, root / "index.html", "history-drop-60")
    assert not seen["errors"] and seen["scrollWidth"] <= seen["innerWidth"], seen


def test_a_second_night_85_percent_slower_is_never_an_all_clear(compare_set_recorded, tmp_path):
    root = tmp_path / "nightly"
    nights_of(compare_set_recorded, root, [1.0, 1 / 0.15])
    code, doc = gate_of("history", root, "--check")
    assert code in (1, 3), doc["reason"]
    text = zcorch_cli("history", root, "--check")
    assert text.returncode == code and "no regression" not in text.stdout.splitlines()[-1]


@pytest.mark.slow
def test_identical_nights_pass_only_where_the_gate_could_see_its_threshold(compare_set_recorded, tmp_path):
    root = tmp_path / "nightly"
    nights_of(compare_set_recorded, root, [1.0] * 6)
    code, doc = gate_of("history", root, "--check")
    assert code in (0, 3), doc["reason"]
    cells = [c["comparison"] for e in doc["experiments"] for c in e["cells"]]
    for c in cells:
        seen = c["detectable_pct"]
        if c["verdict"] == "unchanged":
            assert seen is not None and seen <= doc["threshold_pct"], c
        else:
            assert c["verdict"] == "cannot tell" and (seen is None or seen > doc["threshold_pct"]) and c["needs"], c
    assert (code == 0) == all(c["verdict"] == "unchanged" for c in cells)
    if code == 0:
        assert doc["detectable_pct"] <= doc["threshold_pct"]
    # a threshold wider than what every cell could see passes; one below it cannot tell
    worst = max(c["detectable_pct"] for c in cells if c["detectable_pct"] is not None)
    assert gate_of("history", root, "--check", "--threshold", f"{worst * 1.2 + 0.1:.2f}")[0] == 0
    assert gate_of("history", root, "--check", "--threshold", f"{worst * 0.5:.3f}")[0] == 3


def test_compare_three_against_three_80_percent_slower_cannot_tell(small_set, tmp_path):
    slow = slowed_copy(small_set, tmp_path / "slow", 5.0)
    code, doc = gate_of("compare", small_set, slow)
    assert code == 3 and doc["verdict"] == "cannot tell"
    judged = [c for c in doc["cells"] if c["n_base"] and c["n_cand"]]
    assert judged and all(c["change_pct"] < -79 and c["verdict"] == "cannot tell" for c in judged)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["failed", "disjoint", "one run"])
def test_every_gate_on_bad_data_says_cannot_tell_not_no_regression(how, compare_set_recorded, cpu_set, tmp_path):
    base = copy_result_set(compare_set_recorded, tmp_path / "base")
    if how == "failed":      # the candidate's sweep failed after its first runs
        cand = copy_result_set(compare_set_recorded, tmp_path / "cand")
        lines = (cand / "runs.jsonl").read_text().splitlines(keepends=True)
        (cand / "runs.jsonl").write_text("".join(lines[:3]))
        m = json.loads((cand / "manifest.json").read_text())
        m["status"] = "failed"
        (cand / "manifest.json").write_text(json.dumps(m))
    elif how == "disjoint":  # another experiment: no cell in common
        cand = cpu_set
    else:                    # one repeat a side: no spread, no attainable p
        base = slowed_copy(compare_set_recorded, tmp_path / "b1", 1.0, repeats=1)
        cand = slowed_copy(compare_set_recorded, tmp_path / "c1", 1.0, repeats=1)
    code, doc = gate_of("compare", base, cand)
    assert code == 3 and doc["verdict"] == "cannot tell", doc["reason"]
    root = tmp_path / "nightly"
    for i, s in enumerate((base, cand)):
        dst = copy_result_set(s, root / f"2026110{i}T0300Z" / s.name)
        m = json.loads((dst / "manifest.json").read_text())
        m["created"] = f"2026-11-0{i + 1}T03:00:00+00:00"
        (dst / "manifest.json").write_text(json.dumps(m))
    code, doc = gate_of("history", root, "--check")
    assert code == 3 and doc["verdict"] == "cannot tell", doc["reason"]
