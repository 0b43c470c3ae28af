"""runs.parquet, the load cache of a result set (zcorch.analysis.cache): written by `zcorch run` when a
sweep completes and by zcorch.load when missing or stale, valid only for the runs.jsonl it was made
from, readable without zcorch; best effort: a failure is a warning, never lost runs. And the result
store (zcorch.results) no longer reaches up into zcorch.analysis to write it."""
import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pyarrow.parquet as pq
import pytest

import zcorch
from zcorch.analysis import cache, frames
from zcorch.results.store import ResultSet

from fixtures_analysis import ROOT, SMALL, repo_status, zcorch_cli

TINY = """name: tiny
hosts: localhost
params: {bytes: 1MiB, send_mode: write, recv_mode: read, source: /dev/zero, timeout: 20s}
matrix:
  buffer: [64KiB, 128KiB]
repeats: 2
baselines: {iperf3: false, dd: false}
"""


def count_parses(monkeypatch) -> list:
    """Observe (not replace) the JSON-lines parser: the paths it was called for."""
    calls = []
    real = frames.parse_runs
    monkeypatch.setattr(frames, "parse_runs", lambda path: calls.append(path) or real(path))
    return calls


def result_set_with_small_runs(tmp_path, name="rs") -> ResultSet:
    """A result set written through the real writer with the real run records of tests/data/quickstart-small."""
    rs = ResultSet.create(str(tmp_path / name), name=name, experiment_bytes=(SMALL / "experiment.yaml").read_bytes(),
                          plan_runs=json.loads((SMALL / "plan.json").read_text()),
                          command=["zcorch", "run", "small.yaml"], accept_new_host_keys=False,
                          zcorch_version="test", git_revision=None)
    for line in (SMALL / "runs.jsonl").read_text().splitlines():
        rs.append_run(json.loads(line))
    return rs


def stamp_in(path) -> dict:
    """The validity stamp in a runs.parquet's key-value metadata, read with plain pyarrow."""
    return json.loads(pq.read_schema(path).metadata[b"zcorch.cache"])


@pytest.mark.slow
def test_zcorch_run_leaves_a_cache_the_first_load_uses(tmp_path, monkeypatch):
    exp = tmp_path / "tiny.yaml"
    exp.write_text(TINY)
    out = tmp_path / "out"
    res = zcorch_cli("run", exp, "-o", out)
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr
    assert (out / "runs.parquet").is_file() and not (out / "runs.cache").exists()
    calls = count_parses(monkeypatch)
    first = zcorch.load(out)
    assert calls == []  # the very first load read the cache written by `zcorch run`
    assert len(first) == 4 and (first["status"] == "ok").all()
    pd.testing.assert_frame_equal(first, zcorch.load(out, cache=False))


def test_finish_writes_no_cache_and_write_cache_does_once(tmp_path, monkeypatch):
    rs = result_set_with_small_runs(tmp_path)
    d = tmp_path / "rs"
    rs.finish("complete")
    assert not (d / "runs.parquet").exists()  # the store leaves the cache to the analysis
    assert cache.write_cache(d, warn=pytest.fail) == d / "runs.parquet"
    calls = count_parses(monkeypatch)
    pd.testing.assert_frame_equal(zcorch.load(d), zcorch.load(d, cache=False))
    assert len(calls) == 1  # only the cache=False load parsed
    # a valid cache is not rebuilt
    assert cache.write_cache(d, warn=pytest.fail) == d / "runs.parquet" and len(calls) == 1


def test_the_stamp_is_the_size_and_content_hash_of_runs_jsonl(small_set):
    path = cache.write_cache(small_set, warn=pytest.fail)
    data = (small_set / "runs.jsonl").read_bytes()
    stamp = stamp_in(path)
    assert (stamp["size"], stamp["sha256"], stamp["cache_version"]) == (len(data), hashlib.sha256(data).hexdigest(),
                                                                        cache.CACHE_VERSION)


def test_a_record_edited_in_place_with_size_and_mtime_kept_is_not_hidden_by_the_cache(small_set):
    """A flipped `status` (same length, mtime restored) must not show `ok` beside a failure reason."""
    cache.write_cache(small_set, warn=pytest.fail)
    runs = small_set / "runs.jsonl"
    st = runs.stat()
    data = runs.read_bytes()
    assert b'"status": "ok"' in data
    flipped = data.replace(b'"status": "ok"', b'"status": "xx"', 1)
    assert len(flipped) == len(data)
    runs.write_bytes(flipped)
    os.utime(runs, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert runs.stat().st_size == st.st_size and runs.stat().st_mtime_ns == st.st_mtime_ns
    df = zcorch.load(small_set)
    assert (df["status"] == "xx").sum() == 1  # what runs.jsonl says, not the stale cache
    pd.testing.assert_frame_equal(df, zcorch.load(small_set, cache=False))


def count_hashes(monkeypatch) -> list:
    """Observe (not replace) hashing of runs.jsonl (the stamp of its bytes): one entry per call."""
    calls = []
    real = cache._Source.stamp
    monkeypatch.setattr(cache._Source, "stamp", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    return calls


def test_a_load_of_an_unchanged_set_reads_no_byte_of_runs_jsonl(small_set, monkeypatch):
    """The first load of a finished set costs the Parquet read, not a hash of a GB of JSON. The
    cache written right after the last append (as `zcorch run` does) still records the file's identity."""
    runs = small_set / "runs.jsonl"
    with open(runs, "ab") as f:  # a write just now: the identity must wait RACY_NS to be trusted
        f.write(runs.read_bytes().splitlines(keepends=True)[0])
    path = cache.write_cache(small_set, warn=pytest.fail)
    st = runs.stat()
    assert stamp_in(path)["file"] == [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    hashes, parses = count_hashes(monkeypatch), count_parses(monkeypatch)
    pd.testing.assert_frame_equal(zcorch.load(small_set), zcorch.load(small_set, cache=False))
    assert hashes == [] and len(parses) == 1  # the cached load neither hashed nor parsed


def test_a_copied_set_is_hashed_and_its_cache_still_used(small_set, tmp_path, monkeypatch):
    cache.write_cache(small_set, warn=pytest.fail)
    copy = tmp_path / "copy"
    shutil.copytree(small_set, copy)  # a new inode and ctime: the identity no longer matches
    hashes, parses = count_hashes(monkeypatch), count_parses(monkeypatch)
    frame = zcorch.load(copy)
    assert len(hashes) == 1 and parses == []  # same bytes: proved by the hash, the Parquet file used
    assert len(frame) == len(zcorch.load(small_set))


def test_an_identity_is_not_trusted_when_the_file_changed_in_the_same_tick(small_set, monkeypatch):
    """A cache built by a reader (no wait) right after a write records no identity: ctime ticks coarsely,
    and a second write in the same tick would keep it. Its next load hashes instead."""
    runs = small_set / "runs.jsonl"
    runs.write_bytes(runs.read_bytes())  # changed just now
    (small_set / "runs.parquet").unlink(missing_ok=True)
    monkeypatch.setattr(cache, "RACY_NS", 10 ** 12)  # "just now" for the whole test, however slow the host
    zcorch.load(small_set)
    assert stamp_in(small_set / "runs.parquet")["file"] is None
    hashes, parses = count_hashes(monkeypatch), count_parses(monkeypatch)
    zcorch.load(small_set)
    assert len(hashes) == 1 and parses == []


def count_derivations(monkeypatch) -> list:
    """Observe (not replace) zcorch.load's derivation of columns (frames.add_derived, as load calls it)."""
    from zcorch.analysis import load as load_module

    calls = []
    real = load_module.add_derived
    monkeypatch.setattr(load_module, "add_derived", lambda frame: calls.append(len(frame)) or real(frame))
    return calls


def test_derived_columns_are_used_as_stored_by_the_same_code_from_the_same_meta(small_set, monkeypatch):
    """The cache holds the per-run verdicts: deriving them in Python costs more than reading the file."""
    cache.write_cache(small_set, warn=pytest.fail)
    derivations = count_derivations(monkeypatch)
    cached = zcorch.load(small_set)
    assert derivations == []
    pd.testing.assert_frame_equal(cached, zcorch.load(small_set, cache=False))
    assert derivations == [len(cached)]  # the parsed load derived them: the two agree


def test_a_changed_calibration_in_meta_json_recomputes_the_copy_units(small_set, monkeypatch):
    cache.write_cache(small_set, warn=pytest.fail)
    meta_path = small_set / "meta.json"
    meta = json.loads(meta_path.read_text())
    before = zcorch.load(small_set)["send_copy_s_per_gib"].iloc[0]
    meta["hosts"]["sender"].setdefault("calibration", {})["memcpy_s_per_gib"] = 0.5
    meta_path.write_text(json.dumps(meta))
    derivations = count_derivations(monkeypatch)
    after = zcorch.load(small_set)
    assert len(derivations) == 1 and after["send_copy_s_per_gib"].iloc[0] == 0.5 != before
    pd.testing.assert_frame_equal(after, zcorch.load(small_set, cache=False))


def test_derived_columns_of_other_code_are_recomputed(small_set, monkeypatch):
    """A cache written by another zcorch (simulated: the digest of the deriving code is replaced, as an
    upgrade would change it) keeps its runs but not its derived columns."""
    cache.write_cache(small_set, warn=pytest.fail)
    monkeypatch.setattr(cache, "_code_digest", "0" * 64)
    derivations, parses = count_derivations(monkeypatch), count_parses(monkeypatch)
    zcorch.load(small_set)
    assert len(derivations) == 1 and parses == []


def test_plain_pandas_reads_the_cache_without_zcorch(small_set):
    """The frame of zcorch.load, minus `sweep` (the directory's name), for any Parquet reader."""
    path = cache.write_cache(small_set, warn=pytest.fail)
    out = small_set.parent / "external.pkl"
    script = ("import sys, pandas\n"
              "frame = pandas.read_parquet(sys.argv[1])\n"
              "assert not [m for m in sys.modules if m.startswith('zcorch')], 'zcorch imported'\n"
              "frame.to_pickle(sys.argv[2])\n")
    res = subprocess.run([sys.executable, "-c", script, str(path), str(out)], capture_output=True, text=True,
                         cwd=small_set.parent)
    assert res.returncode == 0, res.stderr
    external = pd.read_pickle(out)  # written just above by the subprocess
    loaded = zcorch.load(small_set)
    assert len(external) == 39
    pd.testing.assert_frame_equal(external, loaded.drop(columns="sweep"))


def test_a_frame_from_the_cache_can_be_changed_like_a_parsed_one(small_set, fs_set, monkeypatch):
    """Every cell can be assigned to (Arrow hands out read-only memory), in a set with failed runs
    (metrics with nulls) and one without (metrics all numbers)."""
    for d in (small_set, fs_set):
        cache.write_cache(d, warn=pytest.fail)
        calls = count_parses(monkeypatch)
        cached, parsed = zcorch.load(d), zcorch.load(d, cache=False)
        assert len(calls) == 1  # the first came from the cache
        for frame in (cached, parsed):
            for i in range(frame.shape[1]):
                frame.iloc[0, i] = frame.iloc[1, i]
        pd.testing.assert_frame_equal(cached, parsed)
        assert cached.iloc[0]["started"] == parsed.iloc[1]["started"]


@pytest.mark.parametrize("change", ["append", "truncate", "torn"])
def test_a_change_of_runs_jsonl_makes_the_cache_stale(small_set, monkeypatch, change):
    cache.write_cache(small_set, warn=pytest.fail)
    runs = small_set / "runs.jsonl"
    lines = runs.read_bytes().splitlines(keepends=True)
    if change == "append":  # what --resume does: a newer record of the first run
        rec = dict(json.loads(lines[0]), status="failed", reason="re-run", sender=None, receiver=None)
        runs.write_bytes(b"".join(lines) + json.dumps(rec).encode() + b"\n")
    elif change == "truncate":
        runs.write_bytes(b"".join(lines[:-1]))
    else:  # a crash mid-write: the torn line is not a run
        runs.write_bytes(b"".join(lines) + lines[0][:40])
    expected = zcorch.load(small_set, cache=False)
    calls = count_parses(monkeypatch)
    got = zcorch.load(small_set)
    assert len(calls) == 1  # re-parsed
    pd.testing.assert_frame_equal(got, expected)
    assert len(got) == {"append": 39, "truncate": 38, "torn": 39}[change]
    if change == "append":  # the newest record wins and comes last
        assert got.iloc[-1]["reason"] == "re-run" and (got["reason"] == "re-run").sum() == 1
    assert stamp_in(small_set / "runs.parquet")["size"] == runs.stat().st_size  # rewritten for the new file
    pd.testing.assert_frame_equal(zcorch.load(small_set), expected)
    assert len(calls) == 1  # and then used


def test_a_deleted_cache_is_written_again(small_set, monkeypatch):
    cache.write_cache(small_set, warn=pytest.fail)
    (small_set / "runs.parquet").unlink()
    calls = count_parses(monkeypatch)
    first = zcorch.load(small_set)
    assert len(calls) == 1 and (small_set / "runs.parquet").is_file()
    pd.testing.assert_frame_equal(zcorch.load(small_set), first)
    assert len(calls) == 1


def test_an_old_runs_cache_is_ignored_and_removed(small_set, monkeypatch):
    # The numpy-array format of earlier versions, with a stamp that matches runs.jsonl and no rows:
    # read, it would turn 39 runs into none.
    st = (small_set / "runs.jsonl").stat()
    header = json.dumps({"stamp": {"cache_version": 2, "size": st.st_size, "mtime_ns": st.st_mtime_ns},
                         "rows": 0, "columns": []}).encode()
    magic = b"ZCORCH-RUNS-CACHE\n"
    (small_set / "runs.cache").write_bytes(magic + (len(magic) + 8 + len(header)).to_bytes(8, "little") + header)
    calls = count_parses(monkeypatch)
    df = zcorch.load(small_set)
    assert len(calls) == 1 and len(df) == 39
    assert not (small_set / "runs.cache").exists() and (small_set / "runs.parquet").is_file()


def test_mixed_type_columns_survive_the_cache(small_set):
    """A parameter unknown to zcorch that is text in one run and a number in another stays an
    object column of exactly those values (JSON text in the Parquet file)."""
    runs = small_set / "runs.jsonl"
    records = [json.loads(line) for line in runs.read_text().splitlines()]
    records[0]["params"]["tuning"] = "auto"
    records[1]["params"]["tuning"] = 4
    records[2]["params"]["tuning"] = True
    runs.write_text("".join(json.dumps(r) + "\n" for r in records))
    cold = zcorch.load(small_set, cache=False)
    assert cold["tuning"].dtype == object and cold["tuning"].tolist()[:4] == ["auto", 4, True, None]
    pd.testing.assert_frame_equal(zcorch.load(small_set), cold)  # parsed, cache written
    pd.testing.assert_frame_equal(zcorch.load(small_set), cold)  # from the cache
    assert pd.read_parquet(small_set / "runs.parquet")["tuning"].tolist()[:3] == ['"auto"', "4", "true"]


def test_an_unwritable_cache_is_a_warning_and_keeps_every_run(tmp_path, capsys):
    rs = result_set_with_small_runs(tmp_path)
    runs = tmp_path / "rs" / "runs.jsonl"
    before = runs.read_bytes()
    (tmp_path / "rs" / "runs.parquet").mkdir()  # a real fault: the cache path cannot be replaced
    rs.finish("complete")
    assert cache.write_cache(tmp_path / "rs") is None
    err = capsys.readouterr().err
    assert "zcorch: warning:" in err and "runs.parquet not built" in err and "IsADirectoryError" in err
    assert "the first zcorch.load will parse it" in err
    assert runs.read_bytes() == before
    assert json.loads((tmp_path / "rs" / "manifest.json").read_text())["status"] == "complete"
    with pytest.warns(UserWarning, match="cache not written"):
        assert len(zcorch.load(tmp_path / "rs")) == 39


def test_a_corrupt_runs_file_is_a_warning_naming_the_line(tmp_path):
    result_set_with_small_runs(tmp_path)
    runs = tmp_path / "rs" / "runs.jsonl"
    lines = runs.read_bytes().splitlines(keepends=True)
    lines[3] = b"{not json\n"
    runs.write_bytes(b"".join(lines))
    warnings = []
    assert cache.write_cache(tmp_path / "rs", warn=warnings.append) is None
    assert len(warnings) == 1 and "ResultsError" in warnings[0] and "runs.jsonl:4" in warnings[0]
    assert runs.read_bytes() == b"".join(lines) and not (tmp_path / "rs" / "runs.parquet").exists()


def test_a_large_runs_file_is_announced(tmp_path, monkeypatch, capsys):
    result_set_with_small_runs(tmp_path)
    monkeypatch.setattr(cache, "_ANNOUNCE_BYTES", 1000)  # the real threshold needs a 100 MB runs.jsonl
    cache.write_cache(tmp_path / "rs", warn=pytest.fail)
    err = capsys.readouterr().err
    assert "zcorch: writing runs.parquet for the 0 MB runs.jsonl so that the first load is fast" in err
    cache.write_cache(tmp_path / "rs", warn=pytest.fail)
    assert capsys.readouterr().err == ""  # valid already: nothing to write, nothing to say


def test_ctrl_c_while_building_is_a_warning(tmp_path, monkeypatch):
    # Ctrl-C cannot be delivered at a chosen point of the parse by a real terminal: the parser raises it
    rs = result_set_with_small_runs(tmp_path)

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(frames, "parse_runs", interrupted)
    warnings = []
    rs.finish("complete")
    assert cache.write_cache(rs.dir, warn=warnings.append) is None
    assert warnings and "(interrupted)" in warnings[0]
    assert sorted(p.name for p in (tmp_path / "rs").iterdir()) == [
        ".lock", "experiment.yaml", "logs", "manifest.json", "plan.json", "runs.jsonl"]  # no temp file left


def test_new_parser_matches_record_by_record(tmp_path):
    """Records of several key layouts (ok, failed with null metrics, an extra fact, a nested value)
    come out in file order with the newest record per (cell, repeat), as the records say."""
    d = shutil.copytree(SMALL, tmp_path / "mixed",
                        ignore=shutil.ignore_patterns("runs.cache", "runs.parquet", "report.html", "plots"))
    records = [json.loads(line) for line in (d / "runs.jsonl").read_text().splitlines()]
    extra = dict(records[0], repeat=7, note={"why": ["nested"]})
    no_reason = {k: v for k, v in records[1].items() if k != "reason"}
    no_reason["repeat"] = 8
    redo = dict(records[2], status="failed", reason="redone", sender=None, receiver=None)
    records += [extra, no_reason, redo]
    (d / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    df = frames.parse_runs(d / "runs.jsonl")
    newest = {}
    for r in records:
        newest.pop((r["cell"], r["repeat"]), None)
        newest[(r["cell"], r["repeat"])] = r  # re-insert: order of the newest record
    assert list(zip(df["cell"], df["repeat"])) == list(newest)
    by_key = df.set_index(["cell", "repeat"])
    assert by_key.loc[(extra["cell"], 7), "note"] == '{"why": ["nested"]}'
    assert pd.isna(by_key.loc[(no_reason["cell"], 8), "reason"])
    row = by_key.loc[(redo["cell"], redo["repeat"])]
    assert row["status"] == "failed" and row["reason"] == "redone" and pd.isna(row["send_wall_ns"])
    for r in newest.values():
        got = by_key.loc[(r["cell"], r["repeat"])]
        for k, v in (r["params"] or {}).items():
            assert (got[k] is None or pd.isna(got[k])) if v is None else got[k] == v, (k, v, got[k])
        if r["receiver"]:
            assert got["recv_wall_ns"] == r["receiver"]["wall_ns"] and got["recv_bytes"] == r["receiver"]["bytes"]
    assert str(df["recv_wall_ns"].dtype) == "float64" and str(df["repeat"].dtype) == "int64"


def test_a_cut_short_cache_is_rebuilt(tmp_path, monkeypatch):
    result_set_with_small_runs(tmp_path)
    path = cache.write_cache(tmp_path / "rs", warn=pytest.fail)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])  # disk full, copy cut: no Parquet footer
    calls = count_parses(monkeypatch)
    pd.testing.assert_frame_equal(zcorch.load(tmp_path / "rs"), zcorch.load(tmp_path / "rs", cache=False))
    assert len(calls) == 2 and path.stat().st_size == len(data)  # re-parsed and rewritten whole


def test_loading_the_repository_data_leaves_no_cache_in_it(small_set):
    before = repo_status("tests/data")
    cache.write_cache(small_set, warn=pytest.fail)
    zcorch.load(small_set)
    assert repo_status("tests/data") == before
    assert not list((ROOT / "tests" / "data").glob("**/runs.parquet*"))


# ---------------------------------------------------------------------------------------------
# zcorch.results does not depend on zcorch.analysis


def test_the_result_store_imports_no_analysis_module(tmp_path):
    """Importing zcorch.results and writing and finishing a result set (as `zcorch run` does) loads
    no zcorch.analysis module: the store is below the analysis, not beside it."""
    script = """
import json, pkgutil, importlib, sys
import zcorch.results
for m in pkgutil.iter_modules(zcorch.results.__path__):
    importlib.import_module("zcorch.results." + m.name)
from zcorch.results.store import ResultSet
rs = ResultSet.create(sys.argv[1], name="x", experiment_bytes=b"name: x\\n", plan_runs=[], command=["zcorch"],
                      accept_new_host_keys=False, zcorch_version="test", git_revision=None)
rs.append_run({"cell": "c", "repeat": 0, "status": "ok", "params": {}})
rs.finish("complete")
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("zcorch", "pandas")))))
"""
    res = subprocess.run([sys.executable, "-c", script, str(tmp_path / "rs")], capture_output=True, text=True,
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == 0, res.stderr
    modules = json.loads(res.stdout)
    assert "zcorch.results.store" in modules
    assert not [m for m in modules if m.startswith(("zcorch.analysis", "pandas"))], modules


def test_no_module_of_zcorch_results_names_zcorch_analysis():
    """Also no import deferred into a function that the run above did not reach."""
    for path in (ROOT / "zcorch" / "results").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.startswith("zcorch.analysis")], (path, node.lineno)


def test_the_cache_carries_its_plans_count_and_a_stamp_is_trusted_only_as_far_as_plan_json_allows(tmp_path):
    """Loading a cached set bounds its rows by plan.json; the cache keeps the planned count (and plan.json's size)
    so that a million-run plan is not parsed again at every load. A count is taken only while plan.json has
    that size and could hold that many entries (3 bytes each at least): a forged stamp allows no more rows
    than a forged plan.json of the same bytes would."""
    from zcorch.results import setfiles

    d = tmp_path / "small"
    shutil.copytree(SMALL, d)
    assert cache.write_cache(d) is not None
    plan_bytes = (d / "plan.json").stat().st_size
    stamp = json.loads(pq.read_schema(d / "runs.parquet").metadata[cache.META_KEY])["plan"]
    assert stamp == {"size": plan_bytes, "runs": len(json.loads((d / "plan.json").read_text()))}
    parsed = setfiles.run_record_limit(d)
    assert setfiles.run_record_limit(d, stamp) == parsed
    most = plan_bytes // 3
    as_stamped = setfiles.run_record_limit(d, {"size": plan_bytes, "runs": most})
    assert as_stamped[0] == min(setfiles.MAX_RECORDS, most * setfiles.RETRY_FACTOR + setfiles.RETRY_SLACK)
    for forged in ({"size": plan_bytes, "runs": most + 1}, {"size": plan_bytes + 1, "runs": 1},
                   {"size": plan_bytes, "runs": -1}, {"size": plan_bytes, "runs": True}, "39", None):
        assert setfiles.run_record_limit(d, forged) == parsed, forged
    assert len(zcorch.load(d)) == stamp["runs"]
