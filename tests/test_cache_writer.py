"""The helper process that writes runs.parquet for `zcorch run` (zcorch.cli.cache_writer): it imports pandas
and pyarrow while the sweep sets up, is waited for before the first stage that may measure, writes the cache
of a completed sweep before the command exits, and ends without writing anything otherwise. Real processes."""
import os
import time

from zcorch.analysis import cache
from zcorch.cli import cache_writer
from zcorch.cli.run import _wait_before_measuring
from zcorch.sweep.pipeline import FIRST_MEASURING_STAGE, STAGES, SweepObserver

from fixtures_analysis import small_set  # noqa: F401 - fixture


def _gone(pid, within=5.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


def test_the_helper_writes_the_cache_of_a_completed_sweep(small_set):  # noqa: F811
    (small_set / "runs.parquet").unlink(missing_ok=True)
    writer = cache_writer.CacheWriter()
    pid = writer.proc.pid
    writer.wait_ready()
    assert writer.ready
    writer.write(str(small_set))
    assert writer.proc is None and _gone(pid)
    source = cache._source(small_set / "runs.jsonl")
    try:
        assert cache._matches(small_set / "runs.parquet", source)   # valid for this runs.jsonl
    finally:
        source.close()


def test_a_helper_not_given_a_directory_writes_nothing_and_ends(small_set):  # noqa: F811
    (small_set / "runs.parquet").unlink(missing_ok=True)
    for wait in (True, False):   # an interrupted sweep (ready), one that failed during the set-up (importing)
        writer = cache_writer.CacheWriter()
        pid = writer.proc.pid
        if wait:
            writer.wait_ready()
        writer.close()
        assert _gone(pid)
    assert not (small_set / "runs.parquet").exists()


def test_the_command_waits_for_the_helper_before_the_first_stage_that_may_measure():
    seen = []

    class Shown(SweepObserver):
        def stage(self, name, title):
            seen.append(name)

    observer = Shown()
    waits = []
    _wait_before_measuring(observer, lambda: waits.append(len(seen)))
    for name, title in STAGES:
        observer.stage(name, title)
    first = [name for name, _ in STAGES].index(FIRST_MEASURING_STAGE)
    assert seen == [name for name, _ in STAGES]
    assert waits and waits[0] == first   # waited for before that stage was shown and run, not earlier
