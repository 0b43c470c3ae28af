"""runs.cache built when a sweep completes (ResultSet.finish), so that the first zcorch.load of a set
just written by `zcorch run` reads columns; best effort: a failure is a warning, never lost runs."""
import json
import shutil

import pandas as pd
import pytest

import zcorch
from zcorch.analysis import frames
from zcorch.results.store import ResultSet

from fixtures_analysis import SMALL, zcorch_cli

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


def test_zcorch_run_leaves_a_cache_the_first_load_uses(tmp_path, monkeypatch):
    exp = tmp_path / "tiny.yaml"
    exp.write_text(TINY)
    out = tmp_path / "out"
    res = zcorch_cli("run", exp, "-o", out)
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr
    assert (out / "runs.cache").is_file()
    calls = count_parses(monkeypatch)
    first = zcorch.load(out)
    assert calls == []  # the very first load read the cache written by `zcorch run`
    assert len(first) == 4 and (first["status"] == "ok").all()
    pd.testing.assert_frame_equal(first, zcorch.load(out, cache=False))


def test_finish_builds_the_cache_only_for_a_complete_sweep(tmp_path, monkeypatch):
    rs = result_set_with_small_runs(tmp_path)
    rs.finish("interrupted")
    assert not (tmp_path / "rs" / "runs.cache").exists()
    rs.finish("complete", warn=pytest.fail)
    calls = count_parses(monkeypatch)
    pd.testing.assert_frame_equal(zcorch.load(tmp_path / "rs"), zcorch.load(tmp_path / "rs", cache=False))
    assert len(calls) == 1  # only the cache=False load parsed
    # a valid cache is not rebuilt
    assert rs.build_load_cache(warn=pytest.fail) and len(calls) == 1


def test_an_unwritable_cache_is_a_warning_and_keeps_every_run(tmp_path, capsys):
    rs = result_set_with_small_runs(tmp_path)
    runs = tmp_path / "rs" / "runs.jsonl"
    before = runs.read_bytes()
    (tmp_path / "rs" / "runs.cache").mkdir()  # a real fault: the cache path cannot be replaced
    rs.finish("complete")
    err = capsys.readouterr().err
    assert "zcorch: warning:" in err and "runs.cache not built" in err and "IsADirectoryError" in err
    assert "the first zcorch.load will parse it" in err
    assert runs.read_bytes() == before
    assert json.loads((tmp_path / "rs" / "manifest.json").read_text())["status"] == "complete"
    with pytest.warns(UserWarning, match="cache not written"):
        assert len(zcorch.load(tmp_path / "rs")) == 39


def test_a_corrupt_runs_file_is_a_warning_naming_the_line(tmp_path):
    rs = result_set_with_small_runs(tmp_path)
    runs = tmp_path / "rs" / "runs.jsonl"
    lines = runs.read_bytes().splitlines(keepends=True)
    lines[3] = b"{not json\n"
    runs.write_bytes(b"".join(lines))
    warnings = []
    assert rs.build_load_cache(warn=warnings.append) is False
    assert len(warnings) == 1 and "ResultsError" in warnings[0] and "runs.jsonl:4" in warnings[0]
    assert runs.read_bytes() == b"".join(lines) and not (tmp_path / "rs" / "runs.cache").exists()


def test_ctrl_c_while_building_is_a_warning(tmp_path, monkeypatch):
    # Ctrl-C cannot be delivered at a chosen point of the parse by a real terminal: the parser raises it
    rs = result_set_with_small_runs(tmp_path)

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(frames, "parse_runs", interrupted)
    warnings = []
    rs.finish("complete", warn=warnings.append)
    assert warnings and "(interrupted)" in warnings[0]
    assert sorted(p.name for p in (tmp_path / "rs").iterdir()) == [
        "experiment.yaml", "logs", "manifest.json", "plan.json", "runs.jsonl"]  # no temp file left


def test_new_parser_matches_record_by_record(tmp_path):
    """Records of several key layouts (ok, failed with null metrics, an extra fact, a nested value)
    come out in file order with the newest record per (cell, repeat), as the records say."""
    d = shutil.copytree(SMALL, tmp_path / "mixed", ignore=shutil.ignore_patterns("runs.cache", "report.html", "plots"))
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
    rs = result_set_with_small_runs(tmp_path)
    rs.finish("complete", warn=pytest.fail)
    cache = tmp_path / "rs" / "runs.cache"
    data = cache.read_bytes()
    cache.write_bytes(data[: len(data) * 2 // 3])  # header intact, columns missing (disk full, copy cut)
    calls = count_parses(monkeypatch)
    pd.testing.assert_frame_equal(zcorch.load(tmp_path / "rs"), zcorch.load(tmp_path / "rs", cache=False))
    assert len(calls) == 2 and cache.stat().st_size == len(data)  # re-parsed and rewritten whole
