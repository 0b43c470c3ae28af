"""Many controllers, one dataset: `zcorch export` run by several processes at once into one DEST (real
processes, real files, a real SIGKILL), read back by DuckDB: every completed set exactly once, no partial set,
the killed exporter's leftovers ignored by readers and removed by the next export."""
import fcntl
import json
import os
import signal
import subprocess
import sys
import time

import duckdb
import pytest

from fixtures_analysis import ROOT, copy_result_set, raw_runs, zcorch_cli
from zcorch.analysis.export import TEST_STALL_ENV, export_results
from zcorch.errors import ResultSetBusy

N_SETS = 9       # S0..S8; exporter i exports copies of S_i and S_i+1 (each set but S0, S8 by two exporters)
N_EXPORTERS = 8  # exporter 7 is the one killed: S8 is only its own


def _set(small_set, where, i):
    """A copy of the real small set made result set S_i (its own creation time: its own identity and date)."""
    d = copy_result_set(small_set, where)
    path = d / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["created"] = f"2099-01-{i + 1:02d}T03:00:00+00:00"
    path.write_text(json.dumps(manifest))
    return d


def _start(root, dest, env=None):
    out = open(f"{root}.out", "w+")
    err = open(f"{root}.err", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "zcorch", "export", str(root), str(dest)], cwd=ROOT,
                            stdout=out, stderr=err, env=dict(os.environ, **(env or {})))
    return proc, out, err


def _wait_for(check, what, timeout=300):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _glob_counts(dest):
    """What DuckDB reads globbing the files (no dataset.json): {set_id: (rows in sets, rows in runs)} of the sets
    whose `sets` row is in place (the commit a file reader joins on), and the set ids of runs rows without one."""
    con = duckdb.connect()
    sets = dict(con.execute(f"SELECT set_id, count(*) FROM read_parquet('{dest}/sets/**/*.parquet', "
                            "hive_partitioning = true) GROUP BY set_id").fetchall())
    runs = dict(con.execute(f"SELECT set_id, count(*) FROM read_parquet('{dest}/runs/**/*.parquet', "
                            "hive_partitioning = true) GROUP BY set_id").fetchall())
    return {s: (n, runs.get(s, 0)) for s, n in sets.items()}, set(runs) - set(sets)


@pytest.mark.slow   # eight export processes at once
def test_eight_exporters_at_once_one_killed_mid_write_leave_each_set_once(small_set, tmp_path):
    sets = tmp_path / "sets"
    roots = []
    for e in range(N_EXPORTERS):
        root = tmp_path / f"controller{e}"
        for i in (e, e + 1):                       # each controller's own copy (another path, the same set)
            _set(small_set, root / f"S{i}" / "quickstart-small", i)
        roots.append(root)
    n_runs = len(raw_runs(small_set))
    dest = tmp_path / "dataset"
    # one set in the dataset before: what readers see while the killed exporter holds the lock
    first = zcorch_cli("export", roots[0] / "S0", dest)
    assert first.returncode == 0 and "1 result set(s) exported" in first.stdout, first.stderr

    # The stalled exporter (TEST_STALL_ENV exists only to place this kill mid-write): it takes the lock, writes
    # half of its first part file, says so and waits.
    stall = tmp_path / "stall"
    stall.mkdir()
    killed, kout, kerr = _start(roots[7], dest, {TEST_STALL_ENV: str(stall)})
    _wait_for(lambda: any(stall.iterdir()) or killed.poll() is not None, "the stalled exporter")
    assert killed.poll() is None, open(kerr.name).read()
    half = [p for p in dest.rglob("*.tmp")]
    assert len(half) == 1 and half[0].name.startswith(".part-"), half
    # meanwhile readers see the dataset as it was: the half-written file is read by nobody
    from zcorch.analysis.dataset import Dataset
    assert len(Dataset(dest).set_ids()) == 1
    by_glob, stray = _glob_counts(dest)
    assert list(by_glob.values()) == [(1, n_runs)] and not stray

    # seven more, at once: they read their sets, then wait for the lock the stalled one holds
    procs = [_start(roots[e], dest) for e in range(7)]
    _wait_for(lambda: all("waiting for zcorch export pid" in open(err.name).read() or p.poll() is not None
                          for p, _, err in procs), "the exporters to wait for the lock")
    assert all(p.poll() is None for p, _, _ in procs), "an exporter did not wait for the lock"
    assert f"pid {killed.pid}" in open(procs[0][2].name).read()
    killed.send_signal(signal.SIGKILL)             # mid-write, holding the lock: the kernel releases it
    killed.wait(timeout=30)
    outputs = []
    for p, out, err in procs:
        assert p.wait(timeout=600) == 0, open(err.name).read()
        outputs.append(open(out.name).read())

    # every set a live exporter had, exactly once: S0..S7 (S8 was only the killed one's)
    doc = json.loads((dest / "dataset.json").read_text())
    assert len(doc["sets"]) == 8
    written = sum(int(o.split(" result set(s) exported")[0].rsplit(None, 1)[-1]) for o in outputs)
    assert written == 7, outputs     # S1..S7: the overlapping ones written by one of their two exporters only
    assert sum(o.count("not written again") for o in outputs) == 6, outputs
    data = Dataset(dest)
    assert len(data.sweeps()) == 8 and sorted(s.set_id for s in data.sweeps()) == sorted(doc["sets"])
    assert data.query("SELECT count(*), count(DISTINCT set_id) FROM runs").fetchone() == (8 * n_runs, 8)
    by_glob, stray = _glob_counts(dest)
    assert sorted(by_glob) == sorted(doc["sets"]) and set(by_glob.values()) == {(1, n_runs)} and not stray
    assert not list(dest.rglob("*.tmp"))           # the killed one's half file: removed by the next export
    dates = duckdb.connect().execute(f"SELECT DISTINCT CAST(date AS VARCHAR) FROM read_parquet("
                                     f"'{dest}/sets/**/*.parquet', hive_partitioning = true) ORDER BY 1").fetchall()
    assert [d for d, in dates] == [f"2099-01-{i + 1:02d}" for i in range(8)]

    # the killed controller exports again: its S8 now, its S7 (another's copy of it is in) not again
    again = zcorch_cli("export", roots[7], dest)
    assert again.returncode == 0 and "1 result set(s) exported, 1 unchanged" in again.stdout, again.stdout
    assert "already in the dataset as set" in again.stdout and "not written again" in again.stdout
    by_glob, stray = _glob_counts(dest)
    assert len(by_glob) == N_SETS and set(by_glob.values()) == {(1, n_runs)} and not stray
    assert len(Dataset(dest).sweeps()) == N_SETS


def test_an_export_waits_for_the_lock_then_says_who_holds_it(small_set, tmp_path):
    root = tmp_path / "root"
    _set(small_set, root / "S0" / "quickstart-small", 0)
    dest = tmp_path / "dataset"
    dest.mkdir()
    fd = os.open(dest / ".export.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)             # a real holder: this process
        os.write(fd, b"zcorch export pid 1 on elsewhere since 03:00:00 UTC\n")
        said = []
        with pytest.raises(ResultSetBusy, match="pid 1 on elsewhere .* more than 0 s: nothing exported"):
            export_results(root, dest, said.append, wait=0.3)
        assert said == [f"waiting for zcorch export pid 1 on elsewhere since 03:00:00 UTC to finish writing {dest}"]
        assert sorted(os.listdir(dest)) == [".export.lock"]
    finally:
        os.close(fd)                               # released: the next export goes through
    assert len(export_results(root, dest).exported) == 1


def test_the_same_set_twice_under_one_root_is_exported_once(small_set, tmp_path):
    root = tmp_path / "root"
    a = _set(small_set, root / "a" / "quickstart-small", 3)
    _set(small_set, root / "b" / "quickstart-small", 3)
    res = export_results(root, tmp_path / "dataset")
    assert res.exported == [str(a)] and len(res.notes) == 1 and "the same result set as" in res.notes[0]
