"""Safe by construction: crashes are recorded failed, local timeouts kill whole groups, a full disk
never corrupts runs.jsonl (real processes, real tmpfs)."""
import os
import signal
import subprocess
import threading
import time

import pytest

from fixtures_fs import small_tmpfs as mounted_small_tmpfs
from fixtures_run import base_params, local_runner, new_resultset, wait_no_workers
from zcorch.errors import HostError, ResultsError
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


# -- 3: a full disk never glues two records ------------------------------------------------------
@pytest.fixture
def small_tmpfs(tmp_path):
    with mounted_small_tmpfs(tmp_path / "small", "64k", "zcorch-test") as d:
        yield d


def test_append_on_a_full_disk_leaves_every_earlier_record_and_no_partial_line(small_tmpfs):
    filler = small_tmpfs / "filler"
    filler.write_bytes(b"x" * 16384)  # freed later: the disk gets space again, as after a cleanup
    rs = ResultSet.create(str(small_tmpfs / "rs"), name="t", experiment_bytes=b"name: t\n", plan_runs=[],
                          command=["pytest"], accept_new_host_keys=False, zcorch_version="test",
                          git_revision=None)
    # 10000-byte lines are not page multiples: the append that hits ENOSPC is a short write mid-line.
    written = []
    with pytest.raises(ResultsError, match="disk is full") as exc:
        for i in range(100):
            rec = {"cell": f"c{i}", "repeat": 0, "params": {"pad": "p" * 9900}, "status": "ok", "reason": None}
            rs.append_run(rec)
            written.append(rec["cell"])
    assert "nothing written before was lost" in str(exc.value)
    assert 0 < len(written) < 100
    raw = (small_tmpfs / "rs" / "runs.jsonl").read_bytes()
    assert raw.endswith(b"\n") and raw.count(b"\n") == len(written)  # no partial line left behind
    filler.unlink()
    rs.append_run({"cell": "after", "repeat": 0, "params": {}, "status": "ok", "reason": None})
    assert [r["cell"] for r in read_jsonl(rs.path("runs.jsonl"))] == written + ["after"]
    rs.close()
    assert ResultSet.open_for_resume(rs.dir, ["pytest"]).ok_keys() == {(c, 0) for c in written + ["after"]}


# -- 2: a local timeout (or Ctrl-C) kills the whole command, grandchildren included ------------------
def _alive(pid: int) -> bool:
    """Running (not a zombie waiting for its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def _grandchild_script(pidfile) -> list:
    # The shell's child (a stand-in for a dd under a script) records its pid and outlives nothing.
    return ["sh", "-c", f'sleep 60 & echo $! > {pidfile}; echo started; wait']


def test_local_run_timeout_kills_the_grandchild(tmp_path):
    pidfile = tmp_path / "pid"
    t0 = time.monotonic()
    r = LocalHost().run(_grandchild_script(pidfile), timeout=1.0)
    assert time.monotonic() - t0 < 10
    assert r.returncode == -signal.SIGKILL and "timed out after 1.0s" in r.stderr
    assert r.stdout == "started\n"  # what it printed before the kill is kept
    grandchild = int(pidfile.read_text())
    try:
        assert _gone_within(grandchild, 3.0), f"grandchild {grandchild} still running after the timeout"
    finally:
        if _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_local_run_ctrl_c_kills_the_grandchild(tmp_path):
    pidfile = tmp_path / "pid"
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))  # a real Ctrl-C to this process
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            LocalHost().run(_grandchild_script(pidfile), timeout=30.0)
    finally:
        timer.cancel()
    grandchild = int(pidfile.read_text())
    try:
        assert _gone_within(grandchild, 3.0), f"grandchild {grandchild} still running after Ctrl-C"
    finally:
        if _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_local_put_bytes_on_a_full_disk_keeps_the_old_file_and_leaves_no_temp(small_tmpfs):
    # put_bytes writes provisioning state files: a full disk must not leave them half-written.
    target = small_tmpfs / "state.json"
    LocalHost().put_bytes(b'{"old": 1}\n', str(target))
    with pytest.raises(HostError, match="cannot write .*state.json"):
        LocalHost().put_bytes(b"x" * 200_000, str(target))
    assert target.read_bytes() == b'{"old": 1}\n'
    assert sorted(os.listdir(small_tmpfs)) == ["state.json"]
