"""A page in a real browser: the session fixture `browser`, one headless Chromium for the whole test session
(a start costs seconds on a loaded machine; each page gets its own tab), driven over the DevTools protocol
on a pipe (--remote-debugging-pipe: NUL-terminated JSON on fds 3 and 4, no port, no extra library).
Using the fixture is what marks a test `browser` (conftest.FIXTURE_MARKERS), so `--quick` leaves it out.

open_in_browser(browser, page, name): what the page logged as errors, which images did not decode, whether
it is wider than the window, and a screenshot kept as a test artifact. The check is a script put first into
a copy of the page, next to the original so that relative links (the history page's PNG files) resolve as
they do for a reader: it records window errors (scripts and, in the capture phase, resources that failed
to load) and console.error calls from the start, then after the load event every <img> that did not decode
and the document's width against the window's, and each table's header row and body cells, in an element the
browser waits for.

Screenshots go to $ZCORCH_TEST_ARTIFACTS/browser/ when that is set, else tests/artifacts/browser/ (ignored by
git): look at them after a change to the report or history pages."""
from __future__ import annotations

import base64
import html
import json
import os
import re
import select
import subprocess
import time
from pathlib import Path

import pytest

from fixtures_analysis import ROOT

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
        headings: Array.prototype.map.call(document.querySelectorAll('h2'), function (h) { return h.textContent; }),
        tables: Array.prototype.map.call(document.querySelectorAll('table'), function (t) {
          var text = function (c) { return c.textContent.replace(/\\s+/g, ' ').trim(); };
          var heads = t.querySelectorAll('thead tr');
          return {headers: heads.length ? Array.prototype.map.call(heads[heads.length - 1].cells, text) : [],
                  rows: Array.prototype.map.call(t.querySelectorAll('tbody tr'), function (r) {
                    return Array.prototype.map.call(r.cells, text); })};
        })});
      document.body.appendChild(out);
    }, 50);
  });
})();
</script>"""


def artifacts_dir() -> Path:
    d = Path(os.environ.get("ZCORCH_TEST_ARTIFACTS") or ROOT / "tests" / "artifacts") / "browser"
    d.mkdir(parents=True, exist_ok=True)
    return d


class Browser:
    """One headless Chromium; dump_dom and screenshot open each page in a fresh tab of it."""

    def __init__(self, exe: str, profile: Path):
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()
        self._log = profile / "chromium.log"
        with open(self._log, "wb") as log:
            # chromium reads commands from fd 3 and writes replies to fd 4
            self._proc = subprocess.Popen(
                ["bash", "-c", f'exec "$@" 3<&{cmd_r} 4>&{out_w}', "bash", exe, "--headless", "--no-sandbox",
                 "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--hide-scrollbars", "--remote-debugging-pipe",
                 f"--user-data-dir={profile}", "about:blank"],
                pass_fds=(cmd_r, out_w), stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        os.close(cmd_r)
        os.close(out_w)
        self._buf = b""
        self._id = 0
        self._events: list = []

    def _died(self, why: str) -> AssertionError:
        return AssertionError(f"chromium: {why}; its log: {self._log.read_text(errors='replace')[-2000:]}")

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out_r], [], [], left)[0]:
                raise self._died("no answer in time")
            chunk = os.read(self._out_r, 1 << 20)
            if not chunk:
                raise self._died("it exited")
            self._buf += chunk
        message, self._buf = self._buf.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: "dict | None" = None, session: "str | None" = None,
             timeout: float = 60) -> dict:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._cmd_w, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise AssertionError(f"chromium: {method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self._events.append(reply)

    def _wait_event(self, method: str, session: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self._events):
                if event["method"] == method and event.get("sessionId") == session:
                    return self._events.pop(i)
            reply = self._read(deadline)
            if "method" in reply:
                self._events.append(reply)

    def _open(self, url: str, width: int, height: int, timeout: float) -> "tuple[str, str]":
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.send("Page.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)
        self.send("Page.navigate", {"url": url}, session)
        self._wait_event("Page.loadEventFired", session, timeout)
        return target, session

    def _close(self, target: str) -> None:
        self.send("Target.closeTarget", {"targetId": target})
        self._events.clear()

    def _eval(self, session: str, expression: str):
        return self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                         session)["result"].get("value")

    def dump_dom(self, url: str, until: str, width: int = WIDTH, height: int = 2400, timeout: float = 30) -> str:
        """The page's DOM as HTML once the element with id `until` exists (the page's own check put it there)."""
        target, session = self._open(url, width, height, timeout)
        try:
            deadline = time.monotonic() + timeout
            while not self._eval(session, f"!!document.getElementById({json.dumps(until)})"):
                if time.monotonic() > deadline:
                    raise AssertionError(f"no #{until} in {url} after {timeout} s: "
                                         + str(self._eval(session, "document.documentElement.outerHTML"))[-1500:])
                time.sleep(0.05)
            return self._eval(session, "document.documentElement.outerHTML")
        finally:
            self._close(target)

    def screenshot(self, url: str, path: Path, width: int = WIDTH, height: int = 2400, timeout: float = 30) -> Path:
        """A PNG of the page's top `height` pixels at `width`, written to `path`."""
        target, session = self._open(url, width, height, timeout)
        try:
            data = self.send("Page.captureScreenshot", {"format": "png"}, session)["data"]
            Path(path).write_bytes(base64.b64decode(data))
            return Path(path)
        finally:
            self._close(target)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (AssertionError, OSError):
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._cmd_w)
        os.close(self._out_r)


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    from conftest import require_tool

    exe = require_tool("chromium")
    b = Browser(exe, tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield b
    finally:
        b.close()


def open_in_browser(browser: Browser, page: Path, screenshot: str, height: int = 2400) -> dict:
    """What the browser saw in `page` (CHECK's record); writes the screenshot `screenshot`.png of its
    top `height` pixels at WIDTH into artifacts_dir() and returns its path under "screenshot"."""
    text = page.read_text(encoding="utf-8")
    checked = page.with_name(".browser-check-" + page.name)
    # first thing after the charset declaration (which must stay within the first 1024 bytes)
    anchor = r"(<meta charset=[^>]*>)" if re.search(r"<meta charset=", text) else r"(<head[^>]*>)"
    checked.write_text(re.sub(anchor, lambda m: m.group(1) + CHECK, text, count=1), encoding="utf-8")
    try:
        dom = browser.dump_dom(checked.as_uri(), "browser-check", height=height)
    finally:
        checked.unlink()
    m = re.search(r'<pre id="browser-check">(.*?)</pre>', dom, re.S)
    assert m, "the check did not run: " + dom[-1500:]
    record = json.loads(html.unescape(m.group(1)))
    shot = browser.screenshot(page.as_uri(), artifacts_dir() / f"{screenshot}.png", height=height)
    assert shot.stat().st_size > 0
    record["screenshot"] = shot
    return record


def assert_page_is_sound(record: dict) -> None:
    """No error, every image decoded, nothing wider than the window."""
    assert record["errors"] == [], record["errors"]
    bad = [i for i in record["images"] if not i["ok"]]
    assert not bad, bad
    assert record["scrollWidth"] <= record["innerWidth"], (record["scrollWidth"], record["innerWidth"], record["wide"])
