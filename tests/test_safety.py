"""Safe by construction: crashes are recorded failed, local timeouts kill whole groups, a full disk
never corrupts runs.jsonl (real processes, real tmpfs)."""
import os
import signal
import subprocess
import threading
import time

import pytest

from fixtures_run import base_params, local_runner, new_resultset, wait_no_workers
from zcorch.errors import ResultsError
from zcorch.hosts.local import LocalHost
from zcorch.results.store import ResultSet, read_jsonl


# -- 1: a run that crashes is failed, never ok ---------------------------------------------------
def test_crashing_run_is_recorded_failed_with_reason_and_traceback(tmp_path, tag):
    # A timeout that validation lets through: the controller's own wait overflows (OverflowError,
    # a real fault of the real code path, no mock). The next run must still be ok.
    cells = [base_params(timeout=10000000000000000000), base_params()]
    runs = [{"id": f"c{i}", "repeat": 0, "params": p} for i, p in enumerate(cells)]
    rs = new_resultset(tmp_path / "rs", runs)
    outcome = local_runner(rs, tag).run_sweep(runs)
    crashed, fine = rs.runs()
    assert crashed["status"] == "failed", crashed
    assert crashed["reason"].startswith("OverflowError: "), crashed
    assert crashed["sender"] is None and crashed["receiver"] is None
    assert fine["status"] == "ok" and outcome.failed == 1 and outcome.ok == 1
    assert ("c0", 0) not in rs.ok_keys()  # --resume runs it again
    log = (tmp_path / "rs" / crashed["log"]).read_text()
    assert "Traceback (most recent call last)" in log and "OverflowError" in log
    assert wait_no_workers(tag, 2.0) == []


def test_run_recorded_ok_only_with_both_sides_metrics(tmp_path, tag):
    # The invariant where the record is built: a caller bug saying "ok" without metrics is refused.
    rs = new_resultset(tmp_path / "rs")
    runner = local_runner(rs, tag)
    from zcorch.sweep.runner import _Side

    recv, send = _Side("receiver", runner.receiver, []), _Side("sender", runner.sender, [])
    recv.result = {"event": "result", "bytes": 1}
    rec = runner._record("c", 0, {}, "ok", None, "t", 1.0, recv, send, "logs/c-r0.log")
    assert rec["status"] == "failed" and "sender on localhost" in rec["reason"]
