"""`zcorch history --check` on real sweeps in the two-host lab: two alike, then a slower one, the data
link rate-limited with `tc tbf`: same parameters, same cell ids, really slower (the session fixture
fixtures_lab.throttled_nights, which test_compare.py's lab test uses too: the two alike sweeps are shaped to
2 Gbit/s, well below what the link does unshaped, the third to 500 Mbit/s)."""
import re

import pytest

from fixtures_analysis import copy_result_set, zcorch_cli
from fixtures_browser import assert_page_is_sound, open_in_browser


@pytest.mark.lab
@pytest.mark.slow
def test_history_check_on_two_alike_lab_sweeps_then_a_rate_limited_one(throttled_nights, tmp_path, browser):
    root = tmp_path / "nightly"
    for night, recorded in zip(("night1", "night2"), throttled_nights.alike):
        copy_result_set(recorded, root / night / "history-check")
    alike = zcorch_cli("history", root, "--check")
    print(alike.stdout)
    # two nights: runs against runs, 5 against 5, whose smallest two-sided p (0.0079) never reaches history's
    # alpha 0.005: no all-clear however alike they are, and the line says how many runs would decide it
    assert alike.returncode == 3, alike.stdout + alike.stderr
    assert "history-check: 2 sweep(s)" in alike.stdout and "CANNOT TELL" in alike.stdout
    assert re.search(r"needs ≥ \d+ runs a side", alike.stdout.splitlines()[-1]), alike.stdout

    copy_result_set(throttled_nights.slowed, root / "night3" / "history-check")
    slowed = zcorch_cli("history", root, "--check", "--reports")
    print(slowed.stdout)
    assert slowed.returncode == 1, slowed.stdout + slowed.stderr
    assert "history-check: 3 sweep(s)" in slowed.stdout and "REGRESSION (2 regressed)" in slowed.stdout
    for mode in ("read", "splice"):
        line = next(ln for ln in slowed.stdout.splitlines() if f"recv_mode={mode} [cell" in ln)
        assert float(re.search(r"\]: ([-+\d.]+)%", line).group(1)) < -60, line
        assert f"since {root / 'night3' / 'history-check'};" in line
        assert (f"against 2 sweeps {root / 'night1' / 'history-check'} .. "
                f"{root / 'night2' / 'history-check'}") in line
    page = (root / "index.html").read_text()
    assert page.count('<img src="history-plots/history-check/') == 2
    for night in ("night1", "night2", "night3"):
        assert (root / night / "history-check" / "report.html").is_file()
        assert f'href="{night}/history-check/report.html"' in page
    # both pages of two hosts in a real browser (screenshots: tests/fixtures_browser.artifacts_dir)
    seen = open_in_browser(browser, root / "index.html", "history-lab-two-hosts")
    assert_page_is_sound(seen)
    assert len(seen["images"]) == 2
    seen = open_in_browser(browser, root / "night3" / "history-check" / "report.html", "report-lab-two-hosts")
    assert_page_is_sound(seen)
    assert seen["headings"][0] == "Findings"
