"""The report and history pages in a real browser (headless Chromium, tests/fixtures_browser.py): no console
or load error, every image decodes, nothing wider than the window; screenshots kept in
$ZCORCH_TEST_ARTIFACTS/browser/ or tests/artifacts/browser/ (ignored by git) for a person to look at.
The two-host versions (a lab sweep's report and history) are in test_history_lab.py."""
from fixtures_analysis import zcorch_cli
from fixtures_browser import assert_page_is_sound, open_in_browser
from test_history import READ, SPLICE, nights


def test_quickstart_report_in_a_real_browser(small_set, tmp_path, browser):
    assert zcorch_cli("report", small_set).returncode == 0
    seen = open_in_browser(browser, small_set / "report.html", "report-quickstart-small")
    assert_page_is_sound(seen)
    assert seen["title"] == "zcorch report: quickstart-small"
    assert seen["headings"][0] == "Findings" and seen["headings"][-1] == "Experiment"
    assert len(seen["images"]) == len(list((small_set / "plots").glob("*.png"))) >= 5
    assert all(i["w"] > 200 and i["h"] > 200 for i in seen["images"])
    assert seen["screenshot"].stat().st_size > 50_000   # a rendered page, not a blank one


def test_report_with_host_cpu_in_a_real_browser(cpu_set, tmp_path, browser):
    assert zcorch_cli("report", cpu_set).returncode == 0
    seen = open_in_browser(browser, cpu_set / "report.html", "report-cpu-small")
    assert_page_is_sound(seen)
    assert seen["headings"][:2] == ["Findings", "Results"]
    alts = [i["alt"] for i in seen["images"]]
    assert any("efficient configurations" in a for a in alts) and any("process CPU and host CPU" in a for a in alts)


def test_filesystems_report_in_a_real_browser(fs_set, tmp_path, browser):
    assert zcorch_cli("report", fs_set).returncode == 0
    seen = open_in_browser(browser, fs_set / "report.html", "report-filesystems-small")
    assert_page_is_sound(seen)
    assert seen["headings"][0] == "Findings"


def test_history_page_in_a_real_browser(tmp_path, browser):
    root = tmp_path / "nightly"
    nights(root, "exp", [[(READ, 10.0), (SPLICE, 5.0)]] * 5 + [[(READ, 8.0), (SPLICE, 5.0)]])
    res = zcorch_cli("history", root)
    assert res.returncode == 0, res.stderr
    seen = open_in_browser(browser, root / "index.html", "history-localhost")
    assert_page_is_sound(seen)
    assert len(seen["images"]) == 2 and all(i["w"] > 200 for i in seen["images"])   # PNG files beside the page
