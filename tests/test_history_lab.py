"""`zcorch history --check` on real sweeps in the two-host lab: two alike, then a slower one, the data
link rate-limited with `tc tbf` (lab.rate_limited, the slowdown test_compare.py uses too): same
parameters, same cell ids, really slower.

The two alike sweeps run shaped to 2 Gbit/s, well below what the link does unshaped: unshaped, this
machine's throughput follows whatever else its two CPUs run (other test sessions), and two sweeps a
minute apart can really differ by more than the 5% threshold; shaped, both are the same sweep. The
third is shaped to 500 Mbit/s."""
import re

import pytest

from conftest import require_tool
from fixtures_analysis import zcorch_cli
from fixtures_browser import assert_page_is_sound, open_in_browser

# Tiny on purpose: 2 cells x 5 repeats of 32 MiB (5 a side: Mann-Whitney can reach p < 0.05).
EXPERIMENT = """\
name: history-check
params: {bytes: 32MiB, buffer: 64KiB, timeout: 60s, source: /dev/zero}
matrix:
  send_mode: [write]
  recv_mode: [read, splice]
repeats: 5
baselines: false
"""


@pytest.mark.lab
@pytest.mark.slow
def test_history_check_on_two_alike_lab_sweeps_then_a_rate_limited_one(lab, tmp_path):
    require_tool("tc")
    experiment = tmp_path / "history-check.yaml"
    experiment.write_text(EXPERIMENT + lab.layout.hosts_yaml())
    root = tmp_path / "nightly"
    for night in ("night1", "night2"):
        with lab.rate_limited("sender", "2gbit"):
            res = zcorch_cli("run", experiment, "-o", root / night / "history-check")
        assert res.returncode == 0, res.stderr[-3000:]
    alike = zcorch_cli("history", root, "--check")
    print(alike.stdout)
    # two nights: runs against runs, 5 against 5, whose smallest two-sided p (0.0079) never reaches history's
    # alpha 0.005: no all-clear however alike they are, and the line says how many runs would decide it
    assert alike.returncode == 3, alike.stdout + alike.stderr
    assert "history-check: 2 sweep(s)" in alike.stdout and "CANNOT TELL" in alike.stdout
    assert re.search(r"needs ≥ \d+ runs a side", alike.stdout.splitlines()[-1]), alike.stdout

    with lab.rate_limited("sender", "500mbit"):
        res = zcorch_cli("run", experiment, "-o", root / "night3" / "history-check")
    assert res.returncode == 0, res.stderr[-3000:]
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
    seen = open_in_browser(root / "index.html", tmp_path, "history-lab-two-hosts")
    assert_page_is_sound(seen)
    assert len(seen["images"]) == 2
    seen = open_in_browser(root / "night3" / "history-check" / "report.html", tmp_path, "report-lab-two-hosts")
    assert_page_is_sound(seen)
    assert seen["headings"][0] == "Findings"
