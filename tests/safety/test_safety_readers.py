"""Bounded readers: a result set's runs.parquet, runs.jsonl and an exported dataset's part files are checked
against what the set's own plan (and dataset.json's set list) say before any of their data is loaded. Real
hostile files of the sizes an attacker can make cheaply (hundreds of millions of rows in a few MB), real
`python -m zcorch` processes, their peak memory measured."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fixtures_analysis import ROOT, SMALL, copy_result_set

GIB_KIB = 1024 ** 2  # ru_maxrss is in KiB
BATCH = 10_000_000

# Runs a command and prints its exit code and its peak RSS (KiB) as the last line: RUSAGE_CHILDREN of a fresh
# process, so no earlier child of the test process counts.
_MEASURE = """
import json, resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stdout.write(r.stdout); sys.stderr.write(r.stderr)
print(json.dumps([r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))
"""


def measured(*args) -> "tuple[int, int, str]":
    """(exit code, peak RSS in KiB, its output: stdout and stderr) of `python -m zcorch ARGS`."""
    p = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "zcorch", *map(str, args)],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    *out, last = p.stdout.strip().splitlines()
    code, rss = json.loads(last)
    return code, rss, "\n".join(out) + p.stderr


def many_rows(path: Path, rows: int, columns: dict, metadata: "dict | None" = None) -> None:
    """A Parquet file of `rows` rows, each column one value repeated (a few MB: dictionary + run-length).
    The columns go in as dictionary arrays (the Parquet dictionary encoding they get anyway) and without
    statistics: a third of the cost of hashing and scanning every value; the footer's row count is the same."""
    zeros = pa.array(np.zeros(BATCH, dtype=np.int32))
    batch = pa.table({k: pa.DictionaryArray.from_arrays(zeros, pa.array([v])) for k, v in columns.items()})
    if metadata:
        batch = batch.replace_schema_metadata(metadata)
    with pq.ParquetWriter(path, batch.schema, write_statistics=False) as w:
        left = rows
        while left > 0:
            w.write_table(batch.slice(0, min(left, BATCH)), row_group_size=BATCH)
            left -= BATCH


@pytest.mark.slow   # 200M rows written: the size is the hazard
def test_a_stamped_runs_parquet_of_200m_rows_is_ignored_and_rebuilt(tmp_path):
    from zcorch.analysis import cache

    rs = copy_result_set(SMALL, tmp_path / "root" / "small")
    assert cache.write_cache(rs) is not None
    stamp = pq.read_schema(rs / "runs.parquet").metadata[cache.META_KEY]
    meta = dict(json.loads(stamp), derived=[], json_columns=[])
    many_rows(rs / "runs.parquet", 200_000_000, {"cell": "c"}, {cache.META_KEY: json.dumps(meta).encode()})
    assert (rs / "runs.parquet").stat().st_size < 16 * 1024 ** 2
    hostile = (rs / "runs.parquet").read_bytes()
    for args in (["report", rs, "--format", "json"], ["history", tmp_path / "root", "--check"]):
        (rs / "runs.parquet").write_bytes(hostile)
        code, rss, err = measured(*args)
        assert rss < GIB_KIB, (args, rss)
        assert code in (0, 3), (args, code, err)
        assert "Traceback" not in err
        assert "runs.parquet: 200000000 rows, more than" in err and "rebuilt from runs.jsonl" in err, (code, rss, err)
        assert pq.ParquetFile(rs / "runs.parquet").metadata.num_rows == 39  # rebuilt


def test_runs_jsonl_beyond_what_its_plan_can_hold_is_refused(tmp_path):
    rs = copy_result_set(SMALL, tmp_path / "small")
    record = b'{"cell":"c","repeat":0,"status":"ok"}\n'
    with open(rs / "runs.jsonl", "ab") as f:
        for _ in range(20):
            f.write(record * 100_000)   # 2M tiny records, well within the 10M of setfiles.MAX_RECORDS
    code, rss, err = measured("report", rs, "--format", "json")
    assert rss < GIB_KIB, rss
    assert code == 2, err
    assert "Traceback" not in err
    assert "runs.jsonl: more than 220 records" in err and "plan.json lists 39 runs" in err


@pytest.mark.slow   # 300M rows written: the size is the hazard
def test_a_dataset_part_of_300m_rows_is_an_input_error_naming_it(tmp_path):
    rs = copy_result_set(SMALL, tmp_path / "root" / "small")
    dest = tmp_path / "dataset"
    p = subprocess.run([sys.executable, "-m", "zcorch", "export", rs.parent, dest], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    [part] = (dest / "runs").rglob("part-*.parquet")
    set_id = pq.read_table(part, columns=["set_id"]).column("set_id")[0].as_py()
    many_rows(part, 300_000_000, {"set_id": set_id, "cell": "c", "status": "ok", "gbit_s": 1.0})
    assert part.stat().st_size < 32 * 1024 ** 2
    code, rss, err = measured("history", dest, "--check")
    assert rss < GIB_KIB, rss
    assert code == 2, err
    assert "Traceback" not in err
    assert f"{part.name}: 300000000 rows, more than" in err
