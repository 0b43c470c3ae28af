"""A page in a real browser (headless Chromium, tests/fixtures_analysis.chromium): what it logged as errors,
which images did not decode, whether it is wider than the window, and a screenshot kept as a test artifact.

The check is a script put first into a copy of the page, next to the original so that relative links
(the history page's PNG files) resolve as they do for a reader: it records window errors (scripts and,
in the capture phase, resources that failed to load) and console.error calls from the start, then after
the load event every <img> that did not decode and the document's width against the window's. Chromium
prints the DOM after its virtual time budget (--dump-dom), the record is read back from it.

Screenshots go to $ZCORCH_TEST_ARTIFACTS/browser/ when that is set, else tests/artifacts/browser/ (ignored by
git): look at them after a change to the report or history pages."""
from __future__ import annotations

import html
import json
import os
import re
from pathlib import Path

from fixtures_analysis import ROOT, chromium

WIDTH = 1280
CHECK = """<script>
(function () {
  var errors = [];
  window.addEventListener('error', function (e) {
    var t = e.target;
    errors.push(t && t !== window ? 'failed to load ' + (t.tagName || '') + ' ' + String(t.src || t.href || '').slice(0, 80)
                                  : 'error: ' + e.message);
  }, true);
  var origError = console.error;
  console.error = function () { errors.push('console.error: ' + Array.prototype.join.call(arguments, ' ')); return origError.apply(console, arguments); };
  window.addEventListener('load', function () {
    setTimeout(function () {
      var imgs = Array.prototype.slice.call(document.images);
      var wide = [];
      Array.prototype.forEach.call(document.querySelectorAll('body *'), function (el) {
        var r = el.getBoundingClientRect();
        if (r.right > window.innerWidth + 1 && wide.length < 5) wide.push(el.tagName + ' ' + Math.round(r.right));
      });
      var out = document.createElement('pre');
      out.id = 'browser-check';
      out.textContent = JSON.stringify({
        title: document.title, errors: errors,
        images: imgs.map(function (i) { return {ok: i.complete && i.naturalWidth > 0, w: i.naturalWidth, h: i.naturalHeight,
                                                alt: i.alt.slice(0, 80)}; }),
        scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth, wide: wide,
        headings: Array.prototype.map.call(document.querySelectorAll('h2'), function (h) { return h.textContent; })});
      document.body.appendChild(out);
    }, 50);
  });
})();
</script>"""


def artifacts_dir() -> Path:
    d = Path(os.environ.get("ZCORCH_TEST_ARTIFACTS") or ROOT / "tests" / "artifacts") / "browser"
    d.mkdir(parents=True, exist_ok=True)
    return d


def open_in_browser(page: Path, profile: Path, screenshot: str, height: int = 2400) -> dict:
    """What headless Chromium saw in `page` (CHECK's record); writes the screenshot `screenshot`.png of its
    top `height` pixels at WIDTH into artifacts_dir() and returns its path under "screenshot"."""
    text = page.read_text(encoding="utf-8")
    checked = page.with_name(".browser-check-" + page.name)
    # first thing after the charset declaration (which must stay within the first 1024 bytes)
    anchor = r"(<meta charset=[^>]*>)" if re.search(r"<meta charset=", text) else r"(<head[^>]*>)"
    checked.write_text(re.sub(anchor, lambda m: m.group(1) + CHECK, text, count=1), encoding="utf-8")
    try:
        res = chromium("--virtual-time-budget=15000", f"--window-size={WIDTH},{height}", "--dump-dom",
                       checked.as_uri(), profile=profile / "check")
    finally:
        checked.unlink()
    assert res.returncode == 0, res.stderr[-2000:]
    m = re.search(r'<pre id="browser-check">(.*?)</pre>', res.stdout, re.S)
    assert m, "the check did not run: " + res.stdout[-1500:] + res.stderr[-1500:]
    record = json.loads(html.unescape(m.group(1)))
    shot = artifacts_dir() / f"{screenshot}.png"
    res = chromium(f"--screenshot={shot}", f"--window-size={WIDTH},{height}", "--hide-scrollbars",
                   page.as_uri(), profile=profile / "shot")
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    record["screenshot"] = shot
    return record


def assert_page_is_sound(record: dict) -> None:
    """No error, every image decoded, nothing wider than the window."""
    assert record["errors"] == [], record["errors"]
    bad = [i for i in record["images"] if not i["ok"]]
    assert not bad, bad
    assert record["scrollWidth"] <= record["innerWidth"], (record["scrollWidth"], record["innerWidth"], record["wide"])
