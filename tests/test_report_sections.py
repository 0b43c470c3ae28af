"""The report's section order exists once (zcorch.analysis.report.SECTIONS): the page includes each present
section's template in that order and its table of contents lists the same sections."""
from __future__ import annotations

import re

import pytest

from fixtures_analysis import fs_set, small_set  # noqa: F401 - fixtures
from zcorch.analysis.report import SECTIONS, build_report


def headings(html: str) -> "list[str]":
    return [m for m in re.findall(r'<h2 id="([a-z]+)"', html) if m in dict(SECTIONS)]


def contents(html: str) -> "list[str]":
    toc = html.split('<nav class="toc"', 1)[1].split("</nav>", 1)[0]
    return re.findall(r'href="#([a-z]+)"', toc)


@pytest.mark.slow
def test_the_page_and_its_contents_follow_the_one_section_list(small_set, fs_set):  # noqa: F811
    for result_set in (small_set, fs_set):
        html = build_report(result_set)
        order = [s for s, _ in SECTIONS]
        shown = headings(html)
        assert shown == sorted(shown, key=order.index) and len(shown) == len(set(shown))
        assert contents(html) == shown
        assert {"results", "baselines", "hosts", "experiment"} <= set(shown)
    assert "filesystems" in shown   # the filesystems set has that section, placed by the list too
