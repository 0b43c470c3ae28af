"""`zcorch run ... --export DEST`: a nightly run keeps its dataset current (zcorch.analysis.export, as `zcorch
export`): one sweep's set, then a fleet's pairs into the same dataset (incremental), read back by DuckDB; a DEST
the export would refuse is a bad option before anything runs (exit 2); the run's export waits for another
export holding the dataset (a real flock); a failed export at the end is a warning and leaves the exit status
the sweep's. Real localhost sweeps with real workers."""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

from fixtures_analysis import zcorch_cli
from fixtures_run import TAG_VAR, zcorch

ROOT = Path(__file__).resolve().parent.parent

EXPERIMENT = """\
name: nightlyexport
hosts: localhost
params: {bytes: 256KiB, source: mem, sink: /dev/null, timeout: 20s}
matrix:
  send_mode: [write]
  recv_mode: [read]
repeats: 2
baselines: false
"""


@pytest.fixture
def files(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(EXPERIMENT)
    inv = tmp_path / "inv.yaml"
    inv.write_text(textwrap.dedent("""\
        pairs:
          a: localhost
          c: localhost
        """))
    return exp, inv


def _ok_runs_per_set(dest: Path) -> dict:
    """{the set's path: (its pair, its ok runs)}, as DuckDB reads the dataset."""
    rows = duckdb.connect().execute(
        f"SELECT s.path, s.pair, count(*) FROM read_parquet('{dest}/runs/**/*.parquet', hive_partitioning = true) r "
        f"JOIN read_parquet('{dest}/sets/**/*.parquet', hive_partitioning = true) s USING (set_id) "
        "WHERE r.status = 'ok' AND r.experiment = 'nightlyexport' GROUP BY ALL").fetchall()
    return {Path(path).name: (pair, n) for path, pair, n in rows}


@pytest.mark.slow
def test_run_and_fleet_export_into_one_dataset(tmp_path, files, tag):
    jsonschema = pytest.importorskip("jsonschema")
    exp, inv = files
    dest = tmp_path / "dataset"
    one = zcorch(tag, "run", exp, "-o", tmp_path / "night1", "--export", dest, "--json", timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    events = [json.loads(line) for line in one.stdout.splitlines()]
    validator = jsonschema.Draft202012Validator(
        json.loads((ROOT / "docs" / "schemas" / "run-events.schema.json").read_text()),
        format_checker=jsonschema.FormatChecker())
    for ev in events:
        assert not [e.message for e in validator.iter_errors(ev)], ev
    assert [e["event"] for e in events][-2:] == ["export", "end"]
    assert events[-2]["exported"] == 1 and events[-2]["error"] is None and events[-2]["dest"] == str(dest)
    assert {name: n for name, (_, n) in _ok_runs_per_set(dest).items()} == {"night1": 2}

    fleet = zcorch(tag, "run", exp, "--hosts", f"{inv}:all", "-o", tmp_path / "night2", "--export", dest,
                   timeout=300)
    assert fleet.returncode == 0, fleet.stderr[-3000:]
    assert f"export: 2 result set(s) exported, 0 unchanged, 0 skipped -> {dest}" in fleet.stdout
    doc = json.loads((dest / "dataset.json").read_text())
    assert len(doc["sets"]) == 3   # the first night's set is kept: the export adds, it does not replace
    runs = _ok_runs_per_set(dest)
    assert sorted(runs) == ["a", "c", "night1"] and all(n == 2 for _, n in runs.values())
    assert [runs[p][0].split()[0] for p in "ac"] == ["a", "c"]   # the inventory pair, as a column


def test_a_dest_the_export_would_refuse_is_refused_before_the_sweep(tmp_path, files, tag):
    exp, _ = files
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    linked = zcorch(tag, "run", exp, "-o", tmp_path / "x", "--export", tmp_path / "link")
    assert linked.returncode == 2 and "--export" in linked.stderr and "symbolic link" in linked.stderr
    assert not (tmp_path / "x").exists()
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "notes.txt").write_text("mine")
    foreign = zcorch(tag, "run", exp, "-o", tmp_path / "y", "--export", tmp_path / "stuff")
    assert foreign.returncode == 2 and "not a zcorch dataset" in foreign.stderr and not (tmp_path / "y").exists()


@pytest.mark.slow
def test_a_run_waits_for_another_export_and_a_failed_export_is_a_warning(tmp_path, files, tag):
    exp, _ = files
    dest = tmp_path / "dataset"
    first = zcorch(tag, "run", exp, "-o", tmp_path / "night0", "--export", dest, timeout=300)
    assert first.returncode == 0 and "export: 1 result set(s) exported" in first.stdout, first.stderr[-3000:]
    # the dataset held as another controller's export holds it: the run's export waits for it, then writes
    fd = os.open(dest / ".export.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"zcorch export pid 1 on rack7\n", 0)
        err_file = tmp_path / "night.err"
        with open(err_file, "w") as err_out:
            proc = subprocess.Popen([sys.executable, "-m", "zcorch", "run", str(exp), "-o", str(tmp_path / "night"),
                                     "--export", str(dest)], stdout=subprocess.PIPE, stderr=err_out, text=True,
                                    env=dict(os.environ, PYTHONPATH=str(ROOT), **{TAG_VAR: tag}), cwd=ROOT)
        deadline = time.monotonic() + 300
        while "waiting for zcorch export pid 1 on rack7" not in err_file.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (proc.communicate(), err_file.read_text())
            time.sleep(0.1)
        assert json.loads((tmp_path / "night" / "manifest.json").read_text())["status"] == "complete"
        time.sleep(1.0)
        assert proc.poll() is None      # the sweep is done; its export waits for the lock
    finally:
        os.close(fd)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, err_file.read_text()[-3000:]
    assert "export: 1 result set(s) exported" in out
    assert len(json.loads((dest / "dataset.json").read_text())["sets"]) == 2
    # an export that fails (a dataset.json that is not JSON): a warning, the exit status the sweep's
    good = (dest / "dataset.json").read_bytes()
    (dest / "dataset.json").write_text("{not json")
    res = zcorch(tag, "run", exp, "-o", tmp_path / "night2", "--export", dest, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "the export to" in res.stderr and "not valid JSON" in res.stderr
    assert f"zcorch export {tmp_path / 'night2'} {dest}" in res.stderr   # how to do it again
    assert json.loads((tmp_path / "night2" / "manifest.json").read_text())["status"] == "complete"
    (dest / "dataset.json").write_bytes(good)
    again = zcorch_cli("export", tmp_path / "night2", dest)
    assert again.returncode == 0 and "1 result set(s) exported" in again.stdout
    assert len(json.loads((dest / "dataset.json").read_text())["sets"]) == 3
