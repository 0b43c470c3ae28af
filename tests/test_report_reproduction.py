"""The report's Reproduction section and `zcorch report DIR --format markdown`, from the small real result set
(tests/data/quickstart-small) with a `reference:` added to its stored experiment. The published numbers
below are made up for the test; what is asserted is where they and the measured ones appear, labelled."""
from __future__ import annotations

import html
import re

import pytest

from zcorch.analysis import reproduction as rp
from zcorch.analysis.report import build_report
from zcorch.config.experiment import reference_of
import zcorch

REFERENCE = """
reference:
  source: {title: "A <b>test</b> study", author: Nobody, date: 2026-01-02, url: "https://example.org/study",
           venue: a mailing list}
  setup: two hosts, 10GbE back to back
  baselines:
    iperf3: {value: 6.9 Gbit/s, command: "iperf -w 1M -l 64K"}
    dd_write: {value: 465-520 MB/s}
  figures:
    - {label: "C) splice", match: {send_mode: splice, recv_mode: read, buffer: 64KiB}, metric: mb_s, value: 854 MB/s}
    - {label: "A) write", match: {send_mode: write, recv_mode: read, buffer: 64KiB, send_cpu: null}, metric: mb_s,
       value: 472 MB/s}
  claims:
    - says: splice sends faster than write
      metric: gbit_s
      a: {send_mode: splice, recv_mode: read, buffer: 64KiB}
      b: {send_mode: write, recv_mode: read, buffer: 64KiB, send_cpu: null}
      holds_if: a > b
    - says: the pinned sender is slower
      metric: gbit_s
      a: {send_cpu: 4095}
      b: {send_mode: write, recv_mode: read, buffer: 64KiB, send_cpu: null}
      holds_if: a < b
"""


def with_reference(path):
    exp = path / "experiment.yaml"
    exp.write_text(exp.read_text() + REFERENCE)
    return path


@pytest.mark.slow
def test_the_section_shows_published_and_measured_side_by_side(small_set):
    page = build_report(with_reference(small_set))
    section = page[page.index('<h2 id="reproduction">Reproduction</h2>'):page.index('<h2 id="results">')]  # after the Findings
    assert "A &lt;b&gt;test&lt;/b&gt; study" in section                       # escaped like every value
    assert '<a href="https://example.org/study">' in section
    for label in ("published (study)", "measured (this run)", "published / study baseline",
                  "measured / our baseline"):
        assert f"<th>{label}</th>" in section
    assert "<td class=\"num\">854 MB/s</td>" in section
    assert "<td class=\"num\">0.99 × iperf3</td>" in section               # 854 MB/s = 6.83 of 6.9 Gbit/s
    # the pinned cell failed every run: inconclusive, with the reason on the line
    assert re.search(r'class="verdict inconclusive">inconclusive: needs 5 runs</td><td>–</td><td>measured \(this run\): a all 3 runs failed',
                     html.unescape(section)), section


def test_the_verdicts_follow_the_measured_numbers(small_set):
    d = with_reference(small_set)
    ref = reference_of((d / "experiment.yaml").read_text())
    df = zcorch.load(d)
    rows = rp.claims(df, ref)
    a, b = rows[0].a, rows[0].b
    # recompute the expected verdict from the frame, independently of the engine's wording
    if a.ci_low > b.ci_high:
        expected = rp.HOLDS
    elif a.ci_high < b.ci_low:
        expected = rp.FAILS
    else:
        expected = rp.INCONCLUSIVE
    assert rows[0].verdict == expected
    assert rows[1].verdict == rp.INCONCLUSIVE
    fig = rp.figures(df, zcorch.load_baselines(d), ref)[0]
    ok = df[(df["cell"] == fig.measured.cell) & (df["status"] == "ok")]
    assert fig.measured.median == ok["mb_s"].median()
    assert fig.measured_baseline == 7132352246.063828 / 1e9          # the plain 64 KiB iperf3 test of the set


def test_markdown_prints_the_findings_then_the_section(small_set, capsys):
    d = with_reference(small_set)
    from zcorch.cli import main
    assert main(["report", str(d), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## Findings: quickstart-small\n")
    text = out[out.index("\n## Reproduction: quickstart-small\n") + 1:]
    assert "Published: Nobody, “A <b>test</b> study”, a mailing list, 2026-01-02 — <https://example.org/study>." in text
    assert "| C) splice | send_mode=splice, recv_mode=read, buffer=64KiB | mb_s | 854 MB/s | 0.99 × iperf3 |" in text
    assert "### Claims (" in text and "| the pinned sender is slower |" in text
    assert "<h2>" not in text and "Hosts" not in text
    assert not (d / "report.html").exists()


@pytest.mark.slow
def test_markdown_without_a_reference_has_the_findings_alone(small_set, capsys):
    from zcorch.cli import main
    assert main(["report", str(small_set), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## Findings: quickstart-small\n") and "## Reproduction" not in out
    assert ">Reproduction</h2>" not in build_report(small_set)


def test_json_carries_the_findings_and_the_section(small_set):
    import json as _json

    import jsonschema

    from zcorch.analysis.summary import report_document
    from fixtures_analysis import ROOT

    doc = report_document(with_reference(small_set))
    jsonschema.validate(_json.loads(_json.dumps(doc)), _json.loads((ROOT / "docs/schemas/report.schema.json").read_text()))
    rep = doc["reproduction"]
    assert rep["error"] is None and rep["source"]["url"] == "https://example.org/study"
    assert any(c["claim (published finding)"] == "the pinned sender is slower" and c["verdict"] == "inconclusive: needs 5 runs"
               for c in rep["claims"])
    assert doc["findings"]["rankings"][0]["modes"][0]["rank"] == 1
