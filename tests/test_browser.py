"""The report and history pages in a real browser (headless Chromium, tests/fixtures_browser.py): no console
or load error, every image decodes, nothing wider than the window; screenshots kept in
$ZCORCH_TEST_ARTIFACTS/browser/ or tests/artifacts/browser/ (ignored by git) for a person to look at.
The two-host versions (a lab sweep's report and history) are in test_history_lab.py."""
import re

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


# A cell that is a bare number or a range of two (an interval): its column's header must say the unit.
_NUMBER = r"[-+−]?\d[\d,]*(?:\.\d+)?"
_NUMERIC_CELL = re.compile(rf"^{_NUMBER}(?:\s*(?:–|-|\.\.)\s*{_NUMBER})?$")
_EMPTY_CELL = {"", "—", "-", "n/a"}


def _units() -> "set[str]":
    """Every unit zcorch names: the unit tables of zcorch.units and the metrics' units, plus % and ×."""
    from zcorch import metrics
    from zcorch.units import UNIT_DIMENSIONS

    found = {u for table in UNIT_DIMENSIONS.values() for u in table if u and u != "count"}
    found |= {m.unit for m in metrics.ANALYSIS_METRICS if m.unit}
    return found | {"%", "×"}


# Columns of counts, which need no unit: what they count is their name.
_COUNTS = re.compile(r"^(rank|group|repeat|n|CPUs|(ok |failed )?runs?|failed)$")


def unitless_numeric_headers(record: dict) -> "list[tuple[str, list]]":
    """(header, its table's headers) of every column whose cells are numbers and whose header names no unit."""
    unit = re.compile("|".join(rf"(?<![\w/]){re.escape(u)}(?![\w/])" for u in sorted(_units(), key=len, reverse=True)))
    out = []
    for table in record["tables"]:
        headers, rows = table["headers"], [r for r in table["rows"] if len(r) == len(table["headers"])]
        for j, header in enumerate(headers):
            cells = [r[j] for r in rows if r[j] not in _EMPTY_CELL]
            if cells and all(_NUMERIC_CELL.match(c) for c in cells) and not unit.search(header) \
                    and not _COUNTS.match(header):
                out.append((header, headers))
    return out


def test_report_tables_fit_1280_px_and_numeric_headers_carry_units(cpu_set, tmp_path, browser):
    """A real sweep's report (process and host CPU, baselines) at 1280 px: nothing scrolls sideways, and every
    column of numbers says its unit in its header ("process CPU send (s/GiB)"), a count names what it counts."""
    assert zcorch_cli("report", cpu_set).returncode == 0
    seen = open_in_browser(browser, cpu_set / "report.html", "report-cpu-1280")
    assert seen["innerWidth"] == 1280
    assert seen["scrollWidth"] <= 1280, (seen["scrollWidth"], seen["wide"])
    assert len(seen["tables"]) >= 3 and any(t["rows"] for t in seen["tables"])
    assert unitless_numeric_headers(seen) == []


def test_the_unit_check_flags_a_bare_numeric_header():
    """The check above can fail: a CPU column headed "host both" without its unit is named, its unit or a
    count's name passes, and a column of words is not a numeric one."""
    table = {"headers": ["configuration", "ok runs", "host both", "process send (s/GiB)", "Gbit/s"],
             "rows": [["write→read", "3", "0.41", "0.20", "9.1"], ["splice→read", "3", "0.32–0.35", "—", "12"]]}
    assert [h for h, _ in unitless_numeric_headers({"tables": [table]})] == ["host both"]
