"""Faults that end a sweep early: whatever the exception, the result set gets a final status
with the reason, the runs written so far stay, the exception still propagates, and --resume completes it."""
import json
import subprocess
from collections import Counter

import pytest

from fixtures_fs import fill_disk
from fixtures_run import TAG_VAR, wait_no_workers, zcorch
from zcorch.errors import ResultsError
from zcorch.results.store import read_jsonl
from zcorch.sweep.pipeline import SweepObserver, run_sweep

EXP = """name: faults
params: {bytes: 1MiB, source: /dev/zero, timeout: 10s}
matrix:
  send_mode: [write, sendfile]
repeats: 2
baselines: false
"""


class CrashAfterFirstRun(SweepObserver):
    """A bug in an observer (the pipeline's public extension point): the second run_done raises. No real
    part of a localhost sweep raises a non-ZcorchError on demand, so the crash comes in through here."""

    def __init__(self):
        self.done = 0

    def run_done(self, record, outcome, todo):
        self.done += 1
        if self.done == 2:
            raise RuntimeError("observer bug")


@pytest.mark.slow
def test_a_crash_that_is_not_a_zcorch_error_marks_the_set_failed_and_resume_completes_it(tmp_path, tag,
                                                                                          monkeypatch):
    monkeypatch.setenv(TAG_VAR, tag)
    exp = tmp_path / "faults.yaml"
    exp.write_text(EXP)
    out = tmp_path / "rs"
    with pytest.raises(RuntimeError, match="observer bug"):   # still crashes loudly, same exception
        run_sweep(str(exp), output=str(out), observer=CrashAfterFirstRun(), command=["test"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["finished"]
    assert manifest["error"] == {"type": "RuntimeError", "message": "observer bug"}
    assert [r["status"] for r in read_jsonl(str(out / "runs.jsonl"))] == ["ok", "ok"]  # both kept
    assert wait_no_workers(tag, 2.0) == []

    result = run_sweep(resume=str(out), command=["test", "--resume"])
    assert (result.status, result.exit_status) == ("complete", 0)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and "error" not in manifest
    runs = read_jsonl(str(out / "runs.jsonl"))
    assert len(runs) == 4   # the two kept, the two left: none run twice
    assert Counter((r["cell"], r["repeat"]) for r in runs if r["status"] == "ok") == \
        Counter({(r["id"], r["repeat"]): 1 for r in json.loads((out / "plan.json").read_text())})


def test_a_manifest_that_cannot_be_written_does_not_hide_the_error(tmp_path, tag, monkeypatch):
    monkeypatch.setenv(TAG_VAR, tag)
    exp = tmp_path / "faults.yaml"
    exp.write_text(EXP)
    out = tmp_path / "rs"

    class CrashAndBreakManifest(SweepObserver):
        def run_done(self, record, outcome, todo):
            # The manifest's directory entry replaced by a directory: write_json_atomic's os.replace
            # fails for real (root ignores read-only modes, so this is the fault root cannot skip).
            (out / "manifest.json").unlink()
            (out / "manifest.json").mkdir()
            raise RuntimeError("observer bug")

    with pytest.raises(RuntimeError, match="observer bug") as info:
        run_sweep(str(exp), output=str(out), observer=CrashAndBreakManifest(), command=["test"])
    assert any("could not be marked failed" in n and "--resume" in n for n in info.value.__notes__)


def test_zcorch_run_stopped_by_an_error_says_how_to_resume(tmp_path, tag):
    exp = tmp_path / "faults.yaml"
    exp.write_text(EXP.replace("baselines: false\n", "baselines: false\nhosts:\n"
                               "  sender: {ssh: 'root@127.0.0.1:1', data_address: 127.0.0.1}\n"
                               "  receiver: {ssh: 'root@127.0.0.1:1', data_address: 127.0.0.1}\n"))
    r = zcorch(tag, "run", exp, "-o", tmp_path / "rs")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"continue with: zcorch run --resume {tmp_path / 'rs'}" in r.stderr
    manifest = json.loads((tmp_path / "rs" / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["error"]["type"] == "HostError"


def test_a_full_disk_when_the_sweep_finishes_is_a_results_error_and_resume_finishes_it(tmp_path, tag, monkeypatch):
    monkeypatch.setenv(TAG_VAR, tag)
    exp = tmp_path / "faults.yaml"
    exp.write_text(EXP)
    out = tmp_path / "rs"
    out.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "zc-results", str(out)], check=True)
    filler = out / "zc-filler"

    class FillTheDisk(SweepObserver):
        def sweep_ended(self):   # the runs are over, the manifest not yet finished: the disk fills up
            fill_disk(str(out))

    try:
        with pytest.raises(ResultsError, match="cannot mark the result set complete") as info:
            run_sweep(str(exp), output=str(out), observer=FillTheDisk(), command=["test"])
        assert f"zcorch run --resume {out}" in str(info.value)
        assert [r["status"] for r in read_jsonl(str(out / "runs.jsonl"))] == ["ok"] * 4
        filler.unlink()
        result = run_sweep(resume=str(out), command=["test", "--resume"])
        assert (result.status, result.exit_status) == ("complete", 0)
        assert len(read_jsonl(str(out / "runs.jsonl"))) == 4   # nothing run twice
        assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    finally:
        subprocess.run(["umount", "-l", str(out)])
