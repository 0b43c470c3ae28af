"""`zcorch report` on the small real result sets, checked as text and in a real headless browser."""
import json
import re

import pytest

import zcorch
from zcorch.analysis import plots

from fixtures_analysis import raw_baselines, raw_runs, repo_status, zcorch_cli

# Appended to a copy of the report: records, for every image, whether the browser decoded it, the
# section headings and the Filesystems table as the browser laid it out.
PAGE_CHECK = """<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var out = document.createElement('pre');
  var fs = null;
  Array.prototype.forEach.call(document.querySelectorAll('h2'), function (h) {
    if (h.textContent !== 'Filesystems') return;
    var box = h.nextElementSibling.nextElementSibling;   // the table, or the scrolling box around it
    var table = box.tagName === 'TABLE' ? box : box.querySelector('table');
    fs = {width: table.getBoundingClientRect().width, rows: Array.prototype.map.call(table.rows, function (r) {
      return Array.prototype.map.call(r.cells, function (c) { return c.innerText; }); })};
  });
  out.id = 'page-check';
  out.textContent = JSON.stringify({title: document.title, images: imgs.map(function (i) {
    return {ok: i.complete && i.naturalWidth > 0, w: i.naturalWidth, h: i.naturalHeight}; }),
    headings: Array.prototype.map.call(document.querySelectorAll('h2'), function (h) { return h.textContent; }),
    filesystems: fs});
  document.body.appendChild(out);
});
</script>"""


def browser_check(browser, report, tmp_path) -> dict:
    """What a real browser saw in `report` (PAGE_CHECK's record)."""
    page = tmp_path / "checked.html"
    page.write_text(report.read_text().replace("</body>", PAGE_CHECK + "</body>"))
    dom = browser.dump_dom(page.as_uri(), "page-check")
    m = re.search(r'<pre id="page-check">(.*?)</pre>', dom, re.S)
    assert m, dom[-2000:]
    return json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                      .replace("&amp;", "&"))


@pytest.mark.slow
def test_report_cli_writes_a_self_contained_escaped_report(small_set):
    before = repo_status("tests/data")
    res = zcorch_cli("report", small_set)
    assert repo_status("tests/data") == before  # the report went to the private copy only
    assert res.returncode == 0, res.stderr
    out = small_set / "report.html"
    assert res.stdout.strip() == str(out)
    text = out.read_text()
    for heading in ("Experiment", "Hosts", "Baselines", "Results", "Plots",
                    "Every cell", "Failed runs"):
        assert f">{heading}</h2>" in text, heading
    # self-contained: no reference to anything outside the file
    assert not re.search(r'(src|href)="(?!data:|#)', text)
    assert text.count('<img src="data:image/png;base64,') >= 4
    # the experiment file's comment holds markup: shown escaped, never live
    assert "&lt;script&gt;document.title=&#34;pwned&#34;&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in text
    assert "<script>document.title" not in text and "<b>bold</b>" not in text
    # the seeds' table shape: 'MB/s (Gbit/s)' cells with the spread
    assert re.search(r"\d+ MB/s \(\d+\.\d\d Gbit/s\)\n75% CI \d+–\d+, n=3", text)
    # failed runs with their reasons
    failed = text[text.index(">Failed runs</h2>"):]
    assert failed.count("out of range [EINVAL]") == 3
    # baselines and host metadata
    assert "iperf3" in text and "dd_write" in text and "kernel.release" in text
    # plots written as files too
    pngs = sorted(p.stem for p in (small_set / "plots").glob("*.png"))
    svgs = sorted(p.stem for p in (small_set / "plots").glob("*.svg"))
    assert pngs == svgs and {"buffer", "cpu"} <= set(pngs) and "view" in pngs
    assert text.count("<img ") == len(pngs)


def test_report_renders_in_a_real_browser(small_set, tmp_path, browser):
    assert zcorch_cli("report", small_set).returncode == 0
    check = browser_check(browser, small_set / "report.html", tmp_path)
    assert check["title"] == "zcorch report: quickstart-small"  # the escaped script did not run
    assert len(check["images"]) == len(list((small_set / "plots").glob("*.png")))
    assert all(i["ok"] and i["w"] > 200 and i["h"] > 200 for i in check["images"]), check
    assert "Filesystems" not in check["headings"] and check["filesystems"] is None  # no filesystem axis

    shot = browser.screenshot((small_set / "report.html").as_uri(), tmp_path / "report.png", height=3000)
    assert shot.stat().st_size > 50_000  # a rendered page, not a blank one


def test_filesystems_section_renders_side_by_side_in_a_real_browser(fs_set, tmp_path, browser):
    assert zcorch_cli("report", fs_set).returncode == 0
    check = browser_check(browser, fs_set / "report.html", tmp_path)
    assert check["title"] == "zcorch report: filesystems-small"
    # the filesystems side by side in one small-multiples chart (not a chart per filesystem), and the CPU plot
    assert all(i["ok"] and i["w"] > 200 for i in check["images"]) and len(check["images"]) >= 2
    assert check["headings"].index("Filesystems") == check["headings"].index("Baselines") + 1
    rows = check["filesystems"]["rows"]
    assert rows[0] == ["configuration", "btrfs-raid0", "ext4-delalloc", "ext4-nodelalloc", "xfs"]
    assert all(len(r) == 5 for r in rows)
    by_label = {r[0]: r[1:] for r in rows[1:]}
    assert by_label["type"] == ["btrfs", "ext4", "ext4", "xfs"]
    # multi-line cells keep their line break (CSS pre-line): median, then the spread
    assert all(re.fullmatch(r"\d+ \(\d\.\d\d× dd write\)\n75% CI \d+–\d+, n=3", v)
               for v in by_label["median MB/s, recv_mode=read"]), by_label
    assert check["filesystems"]["width"] <= 1200  # fits the page width (long values wrap)


def test_hostile_values_in_the_result_set_are_escaped_in_the_report(small_set, tmp_path, browser):
    # Markup where a result set holds free text: the experiment's name, a failure reason, a
    # baseline's reason (edited records: a sweep does not produce them on demand)
    name = '</title><script>document.title="pwned"</script>'
    manifest = json.loads((small_set / "manifest.json").read_text())
    manifest["name"] = name
    (small_set / "manifest.json").write_text(json.dumps(manifest))
    runs = raw_runs(small_set)
    for r in runs:
        if r["status"] != "ok":
            r["reason"] = "<script>alert(1)</script> & more"
    (small_set / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    baselines = raw_baselines(small_set)
    baselines[0]["reason"] = '<img src=x onerror="alert(2)">'
    (small_set / "baselines.jsonl").write_text("".join(json.dumps(b) + "\n" for b in baselines))

    assert zcorch_cli("report", small_set).returncode == 0
    text = (small_set / "report.html").read_text()
    assert "<script" not in text and "<img src=x" not in text and "</title><script" not in text
    escaped = "&lt;/title&gt;&lt;script&gt;document.title=&#34;pwned&#34;&lt;/script&gt;"
    assert f"<title>zcorch report: {escaped}</title>" in text and f"<h1>zcorch report: {escaped}</h1>" in text
    assert f'alt="{escaped}: throughput and CPU cost against buffer size"' in text  # in an attribute
    failed = text[text.index(">Failed runs</h2>"):]
    assert failed.count("<td>&lt;script&gt;alert(1)&lt;/script&gt; &amp; more</td>") == 3
    assert "<td>&lt;img src=x onerror=&#34;alert(2)&#34;&gt;</td>" in text
    assert not re.search(r'(src|href)="(?!data:|#)', text)
    check = browser_check(browser, small_set / "report.html", tmp_path)
    assert check["title"] == "zcorch report: " + name  # shown as text; the script did not run
    assert check["headings"][-1] == "Experiment"


def test_plots_that_do_not_apply_are_skipped_with_a_note(small_set):
    df = zcorch.load(small_set)
    one_buffer = df[df["buffer"] == 64 * 1024]
    (skipped,) = plots.versus_buffer(one_buffer, "x")
    assert skipped.figure is None and "single buffer size" in skipped.note
    one_send = df[df["send_mode"] == "write"]
    (skipped,) = plots.heatmap(one_send, "x")
    assert skipped.figure is None and "two send modes" in skipped.note
    nothing = df[df["status"] != "ok"]
    assert all(p.figure is None and p.note for p in plots.all_plots(nothing))


@pytest.mark.slow
def test_plots_have_units_legends_and_the_experiment_title(small_set):
    df = zcorch.load(small_set)
    drawn = [p for p in plots.all_plots(df, zcorch.load_baselines(small_set), "quickstart-small") if p.figure]
    assert {p.name.split("-")[0] for p in drawn} == {"view", "buffer", "cpu", "heatmap"}
    for p in drawn:
        axes = [a for a in p.figure.axes if a.get_label() != "<colorbar>"]
        titles = [a.get_title() for a in axes] + [p.figure._suptitle.get_text() if p.figure._suptitle else ""]
        assert any("quickstart-small" in t for t in titles), p.name
        for ax in axes if p.name != "view" else axes[:1]:   # the view's panels share the first one's y axis
            assert ax.get_xlabel() and ax.get_ylabel(), p.name
            assert re.search(r"\((Gbit/s|s/GiB|bytes, log2)|seconds per GiB|mode", ax.get_ylabel() + ax.get_xlabel())
        if not p.name.startswith("heatmap"):
            assert axes[0].get_legend() is not None or p.figure.legends, p.name
    bars = next(p for p in drawn if p.name == "view")
    labels = [t.get_text() for t in bars.figure.legends[0].get_texts()]
    assert any(label.startswith("iperf3") for label in labels) and any(label.startswith("dd_write") for label in labels)
    buffer = next(p for p in drawn if p.name == "buffer")
    assert buffer.figure.axes[0].get_xscale() == "log"


def test_report_of_a_missing_directory_is_a_clean_error(tmp_path):
    res = zcorch_cli("report", tmp_path / "nope")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "nope" in res.stderr and "not found" in res.stderr
