"""One `zcorch run` at a time writes a result set: two concurrent `--resume DIR` ran
every remaining run twice. The lock is a flock on DIR/.lock, held for the whole sweep."""
from __future__ import annotations

import json
import os

import pytest
import yaml

from fixtures_run import new_resultset, start_zcorch, tag, wait_records, zcorch  # noqa: F401  (fixture)
from zcorch.errors import ResultsError, ResultSetBusy
from zcorch.results.store import LOCK, ResultSet, lock_result_set, read_jsonl


def test_the_lock_is_exclusive_and_released_on_close(tmp_path):
    rs = new_resultset(tmp_path / "rs")
    with pytest.raises(ResultSetBusy) as exc:
        ResultSet.open_for_resume(str(tmp_path / "rs"), ["zcorch", "run", "--resume"])
    assert exc.value.exit_status == 75
    assert f"pid {os.getpid()}" in str(exc.value) and "another zcorch run" in str(exc.value)
    rs.close()
    again = ResultSet.open_for_resume(str(tmp_path / "rs"), ["zcorch", "run", "--resume"])
    again.close()


def test_a_symlinked_lock_file_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    rs = new_resultset(tmp_path / "rs")
    rs.close()
    os.unlink(tmp_path / "rs" / LOCK)
    os.symlink(victim, tmp_path / "rs" / LOCK)
    with pytest.raises(ResultsError, match="lock file"):
        lock_result_set(str(tmp_path / "rs"))
    assert victim.read_text() == "keep\n"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_concurrent_resumes_run_each_remaining_run_once(tmp_path, tag):  # noqa: F811
    exp = tmp_path / "lock.yaml"
    exp.write_text(yaml.safe_dump({"name": "lock", "params": {"bytes": "32MiB", "timeout": "60s"},
                                   "matrix": {"send_mode": ["write", "vmsplice"], "recv_mode": ["read"]},
                                   "repeats": 12, "baselines": False}))
    out = tmp_path / "rs"
    # An interrupted sweep with runs left: start, wait for one record, SIGINT.
    p = start_zcorch(tag, "run", exp, "-o", out)
    wait_records(out / "runs.jsonl", 1, timeout=120)
    p.send_signal(2)
    assert p.wait(60) == 130, p.stderr.read()
    before = read_jsonl(str(out / "runs.jsonl"))
    plan = json.loads((out / "plan.json").read_text())
    assert len(before) < len(plan)

    a = start_zcorch(tag, "run", "--resume", out)
    try:
        wait_records(out / "runs.jsonl", len(before) + 1, timeout=120)   # the first resume is running runs
        b = zcorch(tag, "run", "--resume", out, timeout=120)
        assert b.returncode == 75, b.stdout + b.stderr
        assert f"pid {a.pid}" in b.stderr and "being written by another zcorch run" in b.stderr
        assert a.wait(300) == 0, a.stderr.read()
    finally:
        if a.poll() is None:
            a.kill()
    after = read_jsonl(str(out / "runs.jsonl"))
    done_first = {(r["cell"], r["repeat"]) for r in before if r["status"] == "ok"}
    new = [(r["cell"], r["repeat"]) for r in after[len(before):]]
    assert len(new) == len(set(new)), "a run was run twice"
    assert set(new) | done_first == {(r["id"], r["repeat"]) for r in plan}
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
