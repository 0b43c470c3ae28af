"""`zcorch export ROOT DEST` and reading the dataset back: by DuckDB and pandas without zcorch (the hive
partitions as columns), incrementally, atomically; `zcorch history DATASET` and `zcorch compare --dataset`
answer exactly as from the result-set directories (real small sets, and sets written through ResultSet)."""
import json
import os
import shutil
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from fixtures_analysis import copy_result_set, raw_runs, zcorch_cli
from test_history import READ, SPLICE, nights, write_sweep
from zcorch.cli import main as zcorch_main

ROOT = Path(__file__).resolve().parent.parent


def run(capsys, *args):
    """`zcorch ARGS` in this process (the command line's own main: exit code and stdout), which saves the
    interpreter start-up of each of the many calls; test_export_* run the installed command."""
    code = zcorch_main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _later(directory, created):
    """Make the copy a later night: its manifest's `created`."""
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["created"] = created
    path.write_text(json.dumps(manifest))


@pytest.fixture
def two_nights(small_set, tmp_path):
    """ROOT with two nights of the real quickstart-small set (the second one dated later)."""
    root = tmp_path / "nightly"
    copy_result_set(small_set, root / "n1" / "quickstart-small")
    _later(copy_result_set(small_set, root / "n2" / "quickstart-small"), "2099-01-01T03:00:00+00:00")
    return root


def test_export_is_read_by_duckdb_and_pandas_with_its_partitions(two_nights, tmp_path):
    dest = tmp_path / "dataset"
    res = zcorch_cli("export", two_nights, dest)
    assert res.returncode == 0, res.stderr
    assert "2 result set(s) exported, 0 unchanged, 0 skipped" in res.stdout
    doc = json.loads((dest / "dataset.json").read_text())
    assert (doc["format"], doc["format_version"]) == ("zcorch-dataset", 1) and len(doc["sets"]) == 2
    n_runs = len(raw_runs(two_nights / "n1" / "quickstart-small"))

    con = duckdb.connect()
    runs = con.execute(f"SELECT experiment, CAST(date AS VARCHAR) AS date, count(*) AS n, count(DISTINCT set_id) AS sets "
                       f"FROM read_parquet('{dest}/runs/**/*.parquet', hive_partitioning = true) "
                       "GROUP BY ALL ORDER BY date").fetchall()
    assert runs == [("quickstart-small", "2026-11-22", n_runs, 1), ("quickstart-small", "2099-01-01", n_runs, 1)]
    sets = con.execute(f"SELECT status, planned, planned_ok, revision FROM read_parquet('{dest}/sets/**/*.parquet', "
                       "hive_partitioning = true)").fetchall()
    assert sets == [("complete", 39, 36, "ce90c9bf173d3101fcfadbf6e2e8e03854ebeadd-dirty")] * 2
    roles = con.execute(f"SELECT role, count(*) FROM read_parquet('{dest}/hosts/**/*.parquet', hive_partitioning = true) "
                        "GROUP BY role ORDER BY role").fetchall()
    assert [r for r, _ in roles] == ["controller", "receiver", "sender"]

    frame = pd.read_parquet(dest / "runs")     # pyarrow's hive discovery: experiment= and date= become columns
    assert {"experiment", "date", "set_id", "pair", "kernel", "revision", "cell", "gbit_s"} <= set(frame.columns)
    assert len(frame) == 2 * n_runs and set(frame["date"].astype(str)) == {"2026-11-22", "2099-01-01"}
    ok = frame[(frame["status"] == "ok") & (frame["date"].astype(str) == "2026-11-22")]
    mine = pd.read_parquet(two_nights / "n1" / "quickstart-small" / "runs.parquet")   # zcorch.load's own table
    assert sorted(ok["gbit_s"]) == pytest.approx(sorted(mine.loc[mine["status"] == "ok", "gbit_s"]))
    base = pd.read_parquet(dest / "baselines")
    assert len(base) == 2 * 6 and {"kind", "key", "result", "gbit_s", "experiment", "date"} <= set(base.columns)


def test_export_is_incremental_replaces_a_changed_set_and_removes_a_dead_exports_leftovers(two_nights, tmp_path):
    dest = tmp_path / "dataset"
    assert zcorch_cli("export", two_nights, dest).returncode == 0
    again = zcorch_cli("export", two_nights, dest)
    assert again.returncode == 0 and "0 result set(s) exported, 2 unchanged" in again.stdout
    parts = sorted(p.name for p in dest.rglob("*.parquet"))

    # a set that changed (a resumed sweep's manifest) is exported again and its old rows go
    second = two_nights / "n2" / "quickstart-small"
    manifest = json.loads((second / "manifest.json").read_text())
    manifest["finished"] = "2099-01-01T04:00:00+00:00"
    (second / "manifest.json").write_text(json.dumps(manifest))
    # a part file an export that died left behind: not listed in dataset.json, removed
    stray = dest / "runs" / "experiment=quickstart-small" / "date=2099-01-01" / "part-dead.parquet"
    stray.write_bytes((next(dest.rglob("runs/**/*.parquet"))).read_bytes())
    res = zcorch_cli("export", two_nights, dest)
    assert res.returncode == 0 and "1 result set(s) exported, 1 unchanged" in res.stdout, res.stdout
    assert not stray.exists()
    n = duckdb.connect().execute(f"SELECT count(*), count(DISTINCT set_id) FROM read_parquet('{dest}/runs/**/*.parquet')"
                                 ).fetchone()
    assert n == (2 * len(raw_runs(second)), 2)
    finished = duckdb.connect().execute(f"SELECT CAST(max(finished) AS VARCHAR) FROM read_parquet('{dest}/sets/**/*.parquet')"
                                        ).fetchone()[0]
    assert finished.startswith("2099-01-01 04:00:00")
    assert sorted(p.name for p in dest.rglob("*.parquet")) != parts

    # never through a link; never into a directory that is not a dataset
    link = tmp_path / "link"
    link.symlink_to(dest)
    res = zcorch_cli("export", two_nights, link)
    assert res.returncode == 2 and "symbolic link" in res.stderr
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    res = zcorch_cli("export", two_nights, other)
    assert res.returncode == 2 and "not a zcorch dataset" in res.stderr and "Traceback" not in res.stderr
    assert os.listdir(other) == ["notes.txt"]


def _without_root(text: str) -> str:
    doc = json.loads(text)
    doc.pop("root")
    return json.dumps(doc, indent=1)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["real sets, incomplete", "a regression", "no regression", "a fleet"])
def test_history_and_compare_through_duckdb_answer_as_the_result_sets_do(case, two_nights, tmp_path, capsys):
    if case == "real sets, incomplete":
        root = two_nights
    elif case == "a fleet":
        # one experiment on two inventory pairs (a series each, their own cells: labels of their own) and a
        # night that records no pair (a series of its own): the dataset's parameters are read per pair
        root = tmp_path / "fleet"
        for pair, cells, newest in (("p1", [(READ, 10.0), (SPLICE, 5.0)], 8.0), ("p2", [(READ, 12.0)], 12.0)):
            inv = {"inventory": {"pair": pair, "path": "/etc/zcorch/lab.yaml"}}
            nights(root / pair, "exp", [cells] * 6 + [[(READ, newest)] + cells[1:]], manifest_extra=inv)
        write_sweep(root / "nopair" / "20260000T0300Z" / "exp", "exp", 0, [(SPLICE, 5.0)])
    else:
        root = tmp_path / "synthetic"
        slow = 8.0 if case == "a regression" else 10.0
        nights(root, "exp", [[(READ, 10.0), (SPLICE, 5.0)]] * 6 + [[(READ, slow), (SPLICE, 5.0)]])
    dest = tmp_path / "dataset"
    assert run(capsys, "export", root, dest)[0] == 0
    # seven nights at 1% run noise see a 10% change, not a 3% one: the all-clear is asked of what they could see
    wide = ["--threshold", "10"] if case == "no regression" else []
    for args in (["--check", "--format", "json"], ["--check", "--format", "json", "--metric", "recv_cpu_s_per_gib"],
                 ["--check"]):
        code_a, out_a, _ = run(capsys, "history", root, "-o", tmp_path / "site-a", *args, *wide)
        code_b, out_b, err_b = run(capsys, "history", dest, "-o", tmp_path / "site-b", *args, *wide)
        assert code_a == code_b, (out_a, out_b, err_b)
        if "--metric" not in args:   # (the synthetic sets have no CPU figures: nothing to compare there)
            assert code_a == {"real sets, incomplete": 3, "a regression": 1, "no regression": 0, "a fleet": 1}[case], out_a
        if "json" in args:
            assert _without_root(out_a) == _without_root(out_b)
        else:   # the text names the root on its first line only
            assert out_a.splitlines()[1:] == out_b.splitlines()[1:]
    assert (tmp_path / "site-b" / "index.html").is_file()

    sets = sorted(p.parent for p in root.rglob("manifest.json"))
    for fmt in ("markdown", "text", "json"):
        a = run(capsys, "compare", sets[0], sets[-1], "--format", fmt)
        b = run(capsys, "compare", "--dataset", dest, sets[0], sets[-1], "--format", fmt)
        assert a[:2] == b[:2], b[2]
    ids = json.loads((dest / "dataset.json").read_text())["sets"]
    by_path = {v["path"]: k for k, v in ids.items()}
    by_id = run(capsys, "compare", "--dataset", dest, by_path[str(sets[0])], by_path[str(sets[-1])], "--format", "json")
    assert by_id[0] == a[0] and json.loads(by_id[1])["cells"] == json.loads(a[1])["cells"]
    missing = run(capsys, "compare", "--dataset", dest, "nope", sets[0])
    assert missing[0] == 2 and "no exported result set" in missing[2]


def test_an_exported_sweep_reads_its_manifest_when_asked_and_keeps_the_fields_history_reads(two_nights, tmp_path):
    from zcorch.analysis.dataset import Dataset
    from zcorch.analysis.history import HEAD_KEYS, open_sweep

    dest = tmp_path / "dataset"
    assert zcorch_cli("export", two_nights, dest).returncode == 0
    for exported in Dataset(dest).sweeps():
        own = open_sweep(exported.path)
        assert exported.head == {k: own.manifest[k] for k in HEAD_KEYS if k in own.manifest}
        assert (exported.name, exported.pair, exported.created, exported.status, exported.error, exported.date()) == \
               (own.name, own.pair, own.created, own.status, own.error, own.date())
        assert exported.manifest == own.manifest   # the whole manifest, parsed from the exported text


def test_ok_table_counts_and_sorts_each_sets_cells_as_summarize_reads_runs(tmp_path):
    """Dataset.ok_table (DuckDB groups and sorts): per (set, cell) the ok runs (a null status is not ok), the
    others, and the ok runs' values sorted with nulls and NaN left out; a null cell is a group of its own; the
    sets in the order asked for, a set asked for twice or not exported answers once or not at all."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zcorch.analysis.dataset import Dataset, new_manifest, write_manifest

    part = "experiment=x/date=2026-01-01"
    for table in ("runs", "sets"):
        (tmp_path / table / part).mkdir(parents=True)
    pq.write_table(pa.table({
        "set_id": ["a", "a", "a", "a", "b", "b", "b", "a", "b", "c"],
        "cell": ["c1", "c1", "c1", None, "c1", "c2", "c2", "c2", None, "c9"],
        "status": ["ok", "failed", None, "ok", "ok", "ok", "ok", "ok", "ok", "failed"],
        "gbit_s": [2.0, 1.0, 3.0, float("nan"), None, 5.0, -1.0, 0.0, 1.5, 7.0]}), tmp_path / "runs" / part / "p.parquet")
    pq.write_table(pa.table({"set_id": ["a", "b", "c"], "path": ["/a", "/b", "/c"]}), tmp_path / "sets" / part / "p.parquet")
    doc = new_manifest()
    doc["sets"] = {s: {"partition": part, "part": "p.parquet", "path": "/" + s, "sha256": "0"} for s in "abc"}
    write_manifest(tmp_path, doc)
    got = Dataset(tmp_path, tables=("sets", "runs")).ok_table("gbit_s", ["b", "a", "b", "c", "zz"]).to_pylist()
    assert [tuple(r.values()) for r in got] == [
        ("b", "c1", 1, 0, []), ("b", "c2", 2, 0, [-1.0, 5.0]), ("b", None, 1, 0, [1.5]),
        ("a", "c1", 1, 2, [2.0]), ("a", "c2", 1, 0, [0.0]), ("a", None, 1, 0, []),
        ("c", "c9", 0, 1, [])]


@pytest.mark.slow
def test_a_first_export_that_died_before_its_manifest_is_taken_up_by_the_next(two_nights, tmp_path):
    """An export killed before it wrote dataset.json leaves its lock file and part files: the next export
    writes the dataset there (the dead one's files removed), while anything that is not such a leftover
    keeps the directory refused and untouched."""
    dest = tmp_path / "dataset"
    assert zcorch_cli("export", two_nights, dest).returncode == 0
    (dest / "dataset.json").unlink()                                   # died before the manifest
    part = next(dest.rglob("runs/**/part-*.parquet"))
    (part.parent / f".{part.name}.0123456789abcdef.tmp").write_bytes(b"half")   # and mid-write of one file
    dead = sorted(p.relative_to(dest) for p in dest.rglob("*") if p.is_file())
    for planted in ("notes.txt", "runs/mine.parquet", "runs/experiment=x/date=y/z/part-1T1-ab.parquet",
                    "sets/experiment=x/own.csv"):
        path = dest / planted
        made = next((a for a in reversed(path.parents) if not a.exists()), path)   # what the planting adds
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("mine")
        res = zcorch_cli("export", two_nights, dest)
        assert res.returncode == 2 and "not a zcorch dataset" in res.stderr, (planted, res.stdout, res.stderr)
        assert path.read_text() == "mine" and not (dest / "dataset.json").exists()
        shutil.rmtree(made) if made.is_dir() else made.unlink()
    assert sorted(p.relative_to(dest) for p in dest.rglob("*") if p.is_file()) == dead
    res = zcorch_cli("export", two_nights, dest)
    assert res.returncode == 0 and "2 result set(s) exported" in res.stdout, res.stdout + res.stderr
    n = duckdb.connect().execute(f"SELECT count(DISTINCT set_id), count(*) FROM read_parquet('{dest}/runs/**/*.parquet')"
                                 ).fetchone()
    assert n[0] == 2 and n[1] == sum(len(raw_runs(d)) for d in (two_nights / "n1" / "quickstart-small",
                                                                 two_nights / "n2" / "quickstart-small"))
    assert not list(dest.rglob("*.tmp"))


CPUS_EXPERIMENT = """name: cpus-export
hosts: localhost
params: {bytes: 4MiB, source: mem, timeout: 30s%s}
matrix:
  send_mode: [write]
  recv_mode: [read]
repeats: 2
baselines: false
"""


@pytest.fixture(scope="module")
def cpu_list_sets(tmp_path_factory):
    """Real localhost sweeps: `lists` pins the sender to a CPU list (`send_cpus: "0-1"`, text), `plain` does not
    (the column all null); `empty`: a copy of `plain` dated later whose sweep stopped before its first run (no
    runs at all: every runs column, `same_host` too, has no value to be typed by)."""
    from fixtures_analysis import record_sweep

    base = tmp_path_factory.mktemp("cpu-lists")
    (base / "a").mkdir()
    (base / "b").mkdir()
    lists = record_sweep(base / "a", "lists", CPUS_EXPERIMENT % ', send_cpus: "0-1"')
    plain = record_sweep(base / "b", "plain", CPUS_EXPERIMENT % "")
    empty = copy_result_set(plain, base / "c" / "empty")
    _later(empty, "2099-02-01T03:00:00+00:00")
    (empty / "runs.jsonl").write_text("")
    for cache in empty.glob("runs*.parquet"):
        cache.unlink()
    return {"lists": lists, "plain": plain, "empty": empty}


def _schemas(dest):
    """{table: the distinct schemas of its part files} (each file's own footer: what a reader that takes one
    file's schema for all, Spark and pyarrow.dataset without unification, sees)."""
    import pyarrow.parquet as pq

    return {t: {pq.read_schema(f).remove_metadata() for f in (dest / t).rglob("*.parquet")}
            for t in ("sets", "runs", "baselines", "hosts")}


# How DuckDB names the Arrow types of the declared schemas.
_DUCK = {"string": "VARCHAR", "int64": "BIGINT", "double": "DOUBLE", "bool": "BOOLEAN",
         "timestamp[us, tz=UTC]": "TIMESTAMP WITH TIME ZONE", "list<item: string>": "VARCHAR[]"}


@pytest.mark.slow
@pytest.mark.parametrize("order", ["one batch", "with lists first", "with lists last", "run --export"])
def test_a_dataset_has_one_declared_schema_whatever_set_came_first(order, cpu_list_sets, tmp_path):
    """A set that pins to CPU lists, one that does not, and one with no runs make one dataset of the declared
    schema (the parameter and metric tables' columns at their types: send_cpus text although all null in two of
    the sets, same_host bool although one set has no run), in one export, incrementally in either order, or from
    `run --export` after an export of the others: every part file of a table has that one schema, which
    pyarrow.dataset reads as one dataset (no unification, no union by name) and DuckDB with the same rows and
    types."""
    import pyarrow as pa
    import pyarrow.dataset as pads

    from zcorch.analysis import dataset as layout
    from zcorch.analysis.export import declared_schema

    sets = cpu_list_sets
    dest = tmp_path / "ds"
    roots = {name: copy_result_set(d, tmp_path / name / d.name).parent for name, d in sets.items()}
    if order == "one batch":
        root = tmp_path / "all"
        for name, d in sets.items():
            copy_result_set(d, root / name)
        steps = [root]
    elif order == "with lists first":
        steps = [roots["lists"], roots["empty"], roots["plain"]]
    else:
        steps = [roots["empty"], roots["plain"], roots["lists"]]
    for root in steps:
        res = zcorch_cli("export", root, dest)
        assert res.returncode == 0 and "0 skipped" in res.stdout, res.stdout + res.stderr
    n_runs = 4
    if order == "run --export":   # the others exported, then a night's run exports itself into the same dataset
        exp = tmp_path / "night.yaml"
        exp.write_text(CPUS_EXPERIMENT % ', send_cpus: "0-1"')
        res = zcorch_cli("run", exp, "-o", tmp_path / "night", "--export", dest)
        assert res.returncode == 0 and "export: 1 result set(s) exported" in res.stdout, res.stdout + res.stderr
        assert "the export to" not in res.stderr and "warning: export" not in res.stderr, res.stderr
        n_runs = 6
    doc = json.loads((dest / "dataset.json").read_text())
    assert doc["schema_version"] == layout.SCHEMA_VERSION and doc["json_columns"] == {}
    schemas = _schemas(dest)
    for table, found in schemas.items():
        assert found == {declared_schema(table)}, (table, found)
    runs = declared_schema("runs")
    assert runs.field("send_cpus").type == pa.string() and runs.field("same_host").type == pa.bool_()
    assert runs.field("send_cpu").type == pa.int64() and runs.field("bytes").type == pa.int64()

    table = pads.dataset(dest / "runs", format="parquet", partitioning="hive").to_table()
    assert table.num_rows == n_runs
    assert table.schema.names[-2:] == ["experiment", "date"]   # the hive partitions, from the paths
    assert pa.schema(list(table.schema)[:-2]) == runs
    assert sorted(v for v in table.column("send_cpus").to_pylist() if v) == ["0,1"] * (n_runs - 2)
    assert set(table.column("same_host").to_pylist()) <= {True, False, None}

    con = duckdb.connect()
    described = con.execute(f"DESCRIBE SELECT * FROM read_parquet('{dest}/runs/**/*.parquet', "
                            "hive_partitioning = false)").fetchall()
    assert [(name, kind) for name, kind, *_ in described] == [(f.name, _DUCK[str(f.type)]) for f in runs]
    rows = con.execute(f"SELECT count(*), count(send_cpus), count(DISTINCT set_id) FROM "
                       f"read_parquet('{dest}/runs/**/*.parquet', hive_partitioning = true)").fetchone()
    assert rows == (n_runs, n_runs - 2, 2 if order != "run --export" else 3), rows
    n_sets = con.execute(f"SELECT count(*) FROM read_parquet('{dest}/sets/**/*.parquet')").fetchone()[0]
    assert n_sets == (3 if order != "run --export" else 4)


def test_the_declared_schema_is_pinned_to_its_version():
    """Growing the parameter or metric tables changes the dataset's declared schema: that takes a new
    SCHEMA_VERSION (with its digest), so that the next export widens older datasets explicitly."""
    from zcorch.analysis import dataset as layout

    assert layout.SCHEMA_DIGESTS.get(layout.SCHEMA_VERSION) == layout.schema_digest(), (
        "the declared dataset schema changed (a parameter or metric added?): raise dataset.SCHEMA_VERSION and "
        f"record its digest {layout.schema_digest()!r} in dataset.SCHEMA_DIGESTS")


@pytest.mark.slow
def test_every_column_of_a_recorded_set_is_declared(cpu_list_sets, tmp_path):
    """What zcorch.load gives of real recorded sets (the shipped ones, the reproductions with linked axes, today's
    sweeps) is every column declared, or a linked axis's labels: nothing of theirs is left to the JSON text of
    undeclared columns."""
    import zcorch
    from fixtures_analysis import DATA
    from zcorch.analysis import dataset as layout

    shipped = sorted(p.parent for p in DATA.rglob("runs.jsonl"))
    assert len(shipped) >= 5
    for d in shipped + [cpu_list_sets["lists"], cpu_list_sets["empty"]]:
        frame = zcorch.load(str(copy_result_set(d, tmp_path / "copy" / d.name)))
        linked = set(frame.attrs.get("linked_axes") or {})
        assert [c for c in frame.columns if c not in layout.RUN_TYPES and c not in linked and c != "sweep"] == [], d


def _as_version_1(dest):
    """DEST as an export of schema version 1 wrote it: each runs file typed by its set's values (send_cpus double
    where all null), only the columns the set had, `same_host` null-typed in a set with no runs, a column held as
    JSON text, and no schema_version in dataset.json."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    doc = json.loads((dest / "dataset.json").read_text())
    for f in (dest / "runs").rglob("*.parquet"):
        t = pq.read_table(f, partitioning=None)
        keep = [c for c in t.column_names if t.column(c).null_count < len(t) or c in (
            "set_id", "pair", "kernel", "revision", "cell", "repeat", "status", "send_cpus", "same_host")]
        t = t.select(keep)
        i = t.column_names.index("send_cpus")
        if t.column(i).null_count == len(t):
            t = t.set_column(i, "send_cpus", pa.nulls(len(t), pa.float64()))
        i = t.column_names.index("same_host")
        if len(t) == 0:
            t = t.set_column(i, "same_host", pa.nulls(0, pa.null()))
        i = t.column_names.index("repeat")
        t = t.set_column(i, "repeat", pa.array([json.dumps(v) for v in t.column(i).to_pylist()], pa.string()))
        pq.write_table(t, f)
    doc.pop("schema_version")
    doc["json_columns"] = {"runs": ["repeat"]}
    (dest / "dataset.json").write_text(json.dumps(doc))


@pytest.mark.slow
def test_an_older_dataset_is_widened_to_the_declared_schema_and_a_newer_one_refused(cpu_list_sets, tmp_path):
    from zcorch.analysis import dataset as layout
    from zcorch.analysis.export import declared_schema

    dest = tmp_path / "ds"
    first = copy_result_set(cpu_list_sets["plain"], tmp_path / "r1" / "plain").parent
    copy_result_set(cpu_list_sets["empty"], first / "empty")
    assert zcorch_cli("export", first, dest).returncode == 0
    _as_version_1(dest)
    assert len(_schemas(dest)["runs"]) == 2     # what no engine reads as one dataset
    res = zcorch_cli("export", copy_result_set(cpu_list_sets["lists"], tmp_path / "r2" / "lists").parent, dest)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "dataset widened from schema version 1 to 2" in res.stdout, res.stdout
    assert _schemas(dest)["runs"] == {declared_schema("runs")}
    doc = json.loads((dest / "dataset.json").read_text())
    assert doc["schema_version"] == layout.SCHEMA_VERSION and doc["json_columns"] == {}
    got = duckdb.connect().execute(f"SELECT repeat, send_cpus FROM read_parquet('{dest}/runs/**/*.parquet') "
                                   "ORDER BY send_cpus NULLS FIRST, repeat").fetchall()
    assert got == [(0, None), (1, None), (0, "0,1"), (1, "0,1")]

    doc["schema_version"] = layout.SCHEMA_VERSION + 1
    (dest / "dataset.json").write_text(json.dumps(doc))
    before = sorted((p, p.stat().st_mtime_ns) for p in dest.rglob("*.parquet"))
    later = copy_result_set(cpu_list_sets["lists"], tmp_path / "r3" / "lists")
    _later(later, "2099-03-01T03:00:00+00:00")
    res = zcorch_cli("export", later.parent, dest)
    assert res.returncode == 2 and f"schema version {layout.SCHEMA_VERSION + 1}" in res.stderr, res.stderr
    assert "newer zcorch" in res.stderr and "Traceback" not in res.stderr
    assert sorted((p, p.stat().st_mtime_ns) for p in dest.rglob("*.parquet")) == before


@pytest.fixture(scope="module")
def cpu_list_dataset(cpu_list_sets, tmp_path_factory):
    root = tmp_path_factory.mktemp("cpu-lists-root")
    for name, d in cpu_list_sets.items():
        copy_result_set(d, root / name)
    dest = tmp_path_factory.mktemp("cpu-lists-ds") / "ds"
    assert zcorch_cli("export", root, dest).returncode == 0
    return dest


def test_spark_reads_the_dataset_as_pyarrow_and_duckdb_do(cpu_list_dataset):
    """Spark, where pyspark and Java are present, reads the runs as one dataset (its default: the schema of one
    file, no mergeSchema) with the rows and the types of the declared schema."""
    import shutil as _shutil

    pytest.importorskip("pyspark", reason="pyspark is not installed (not in the test extras: a 300+ MB download); "
                                          "`pip install pyspark` to read the dataset with Spark here")
    if not _shutil.which("java"):
        pytest.skip("no java on PATH: Spark needs a JVM")
    from pyspark.sql import SparkSession

    from zcorch.analysis.export import declared_schema

    spark = (SparkSession.builder.master("local[1]").appName("zcorch-dataset")
             .config("spark.ui.enabled", "false").getOrCreate())
    try:
        dest = cpu_list_dataset
        runs = spark.read.option("basePath", f"{dest}/runs").parquet(f"{dest}/runs")
        kinds = dict(runs.dtypes)
        spark_of = {"string": "string", "int64": "bigint", "double": "double", "bool": "boolean",
                    "timestamp[us, tz=UTC]": "timestamp"}
        assert {f.name: kinds[f.name] for f in declared_schema("runs")} == {
            f.name: spark_of[str(f.type)] for f in declared_schema("runs")}
        assert runs.count() == 4 and runs.where("send_cpus IS NOT NULL").count() == 2
    finally:
        spark.stop()


def test_the_readme_duckdb_example_runs_on_an_export_and_names_the_notebook_extra(cpu_list_dataset):
    """The README's DuckDB one-liner runs as written (python -c, the module zcorch installs: no DuckDB command
    line needed) on an export; the README names the `zcorch[notebook]` extra and each package it brings."""
    import re
    import shlex
    import subprocess
    import sys
    import tomllib

    readme = (ROOT / "README.md").read_text()
    line = next(l for l in readme.splitlines() if "import duckdb" in l and "python -c" in l)
    command = re.search(r"`(python -c .*)`", line).group(1)
    argv = shlex.split(command.replace("DEST", str(cpu_list_dataset)))
    out = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "median(gbit_s)" in out.stdout

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = [re.match(r"[A-Za-z0-9_.-]+", req).group(0) for req in extras["notebook"]]
    assert "pip install 'zcorch[notebook]'" in readme
    at = readme.index("pip install 'zcorch[notebook]'")
    said = readme[at:at + 300]
    assert names and [n for n in names if f"`{n}`" not in said] == [], said
