"""The controller's clock set back: a new sweep whose `created` (the wall clock) puts it before a sweep created
earlier on the same boot is flagged on the history page and by `--check`, which cannot tell (exit 3) rather than
judge the wrong night as the newest. Real result sets, real boot clocks, `zcorch history` through its entry point
(zcorch_cli)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fixtures_analysis import SMALL, nights_of, slowed_copy, zcorch_cli
from zcorch.results import store


def test_a_new_result_set_records_the_boot_clock(tmp_path):
    rs = store.ResultSet.create(str(tmp_path / "rs"), name="x", experiment_bytes=b"name: x\n", plan_runs=[],
                                command=["zcorch"], accept_new_host_keys=False, zcorch_version="0",
                                git_revision=None)
    rs.close()
    first = json.loads((tmp_path / "rs" / "manifest.json").read_text())["clock"]
    later = _boot_clock()
    assert first["boot_id"] == later["boot_id"] and 0 < first["boottime_ns"] < later["boottime_ns"]


def _boot_clock() -> dict:
    return {"boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
            "boottime_ns": time.clock_gettime_ns(time.CLOCK_BOOTTIME)}


def _set_clock(path, created=None):
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["clock"] = _boot_clock()   # as ResultSet.create records it, in the order they were made
    if created is not None:
        manifest["created"] = created
    (path / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.slow
def test_history_flags_a_sweep_dated_before_one_made_earlier_and_cannot_tell(tmp_path):
    root = tmp_path / "nightly"
    for night in nights_of(SMALL, root, [1.0] * 6):
        _set_clock(night)
    # the next night, after the controller's clock was set back three weeks: a slower machine, dated the oldest
    late = slowed_copy(SMALL, root / "20261107T0300Z" / SMALL.name, 1.5)
    _set_clock(late, created="2026-10-15T03:00:00+00:00")
    site = tmp_path / "site"
    p = zcorch_cli("history", root, "--check", "-o", site)   # in this process: its answer, not its start, is checked
    assert p.returncode == 3, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    assert "clock was set back" in p.stdout.splitlines()[-1] and str(late) in p.stdout.splitlines()[-1]
    assert f"clock set back: {late}" in p.stderr
    assert "clock was set back" in (site / "index.html").read_text()


def test_a_regression_still_wins_over_an_untrusted_order():
    from zcorch.analysis.gate import EXIT_CANNOT_TELL, EXIT_OK, EXIT_REGRESSION, Gate
    from zcorch.analysis.history import _also_cannot_tell

    bad = _also_cannot_tell(Gate(EXIT_REGRESSION, "1 cell(s) regressed: x"), "exp: clock set back")
    assert bad.code == EXIT_REGRESSION and bad.reason == "1 cell(s) regressed: x; also cannot tell: exp: clock set back"
    assert _also_cannot_tell(Gate(EXIT_OK, "fine"), "exp: clock set back").code == EXIT_CANNOT_TELL
