"""The result store: layout, fsynced appends, torn last lines, newest-record-wins on resume."""
import json
import os

import pytest

from zcorch.errors import ResultsError
from zcorch.results.store import (FORMAT_VERSION, ResultSet, complete_length, latest_runs, load_manifest,
                                   read_jsonl)


def make(tmp_path, name="rs"):
    return ResultSet.create(str(tmp_path / name), name="demo", experiment_bytes=b"name: demo\n# comment\n",
                            plan_runs=[{"id": "c1", "repeat": 0, "params": {"bytes": 1}}],
                            command=["zcorch", "run", "x.yaml"], accept_new_host_keys=False,
                            zcorch_version="0.1.0", git_revision="abc")


def rec(cell, repeat, status):
    return {"cell": cell, "repeat": repeat, "params": {}, "status": status, "reason": None,
            "started": "t", "wall_s": 0.1, "sender": None, "receiver": None, "log": None}


def test_create_writes_the_documented_layout(tmp_path):
    rs = make(tmp_path)
    d = tmp_path / "rs"
    assert sorted(os.listdir(d)) == [".lock", "experiment.yaml", "logs", "manifest.json", "plan.json"]
    assert (d / "experiment.yaml").read_bytes() == b"name: demo\n# comment\n"
    m = json.loads((d / "manifest.json").read_text())
    for key in ("format", "format_version", "name", "created", "finished", "zcorch_version", "git_revision",
                "command", "accept_new_host_keys", "experiment_file", "status"):
        assert key in m
    assert m["format_version"] == FORMAT_VERSION and m["status"] == "running"
    rs.finish("complete")
    assert load_manifest(str(d))["status"] == "complete"
    assert load_manifest(str(d))["finished"]


def test_create_refuses_an_existing_result_set(tmp_path):
    make(tmp_path)
    with pytest.raises(ResultsError, match="--resume"):
        make(tmp_path)


def test_append_is_one_line_per_record_on_disk_immediately(tmp_path):
    rs = make(tmp_path)
    rs.append_run(rec("c1", 0, "ok"))
    # Read through a separate file object: the line must already be on disk.
    with open(tmp_path / "rs" / "runs.jsonl") as f:
        assert [json.loads(l)["status"] for l in f] == ["ok"]
    with pytest.raises(ValueError):
        rs.append_run(rec("c1", 0, "weird"))


def test_torn_final_line_is_skipped_and_truncated_on_resume(tmp_path):
    rs = make(tmp_path)
    rs.append_run(rec("c1", 0, "ok"))
    path = tmp_path / "rs" / "runs.jsonl"
    full = json.dumps(rec("c1", 1, "ok"))
    with open(path, "a") as f:
        f.write(full[: len(full) // 2])  # what a crash in the middle of a write leaves
    assert [r["repeat"] for r in read_jsonl(str(path))] == [0]
    rs.close()   # the crashed writer's lock went with its process
    whole = path.read_bytes().index(b"\n") + 1   # the one whole record
    assert complete_length(str(tmp_path / "rs"), "runs.jsonl") == whole   # where a resumed sweep's records begin
    assert complete_length(str(tmp_path), "none.jsonl") == 0
    os.symlink(path, tmp_path / "link.jsonl")
    assert complete_length(str(tmp_path), "link.jsonl") == 0   # never read through a link
    from zcorch.results import setfiles

    # what a reader of the records appended since then gets: the torn line alone, marked unterminated
    assert [(n, ended) for n, _, ended in setfiles.iter_lines(tmp_path / "rs", "runs.jsonl", offset=whole)] == \
        [(1, False)]
    rs2 = ResultSet.open_for_resume(str(tmp_path / "rs"), ["zcorch", "run", "--resume", "rs"])
    assert path.read_text().endswith("\n")
    rs2.append_run(rec("c1", 1, "ok"))
    assert [r["repeat"] for r in rs2.runs()] == [0, 1]
    assert load_manifest(str(tmp_path / "rs"))["resumed"][0]["command"][-1] == "rs"


def test_corruption_in_the_middle_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    with pytest.raises(ResultsError, match=r"runs.jsonl:2"):
        read_jsonl(str(path))


def test_newest_record_per_cell_and_repeat_wins(tmp_path):
    rs = make(tmp_path)
    rs.append_run(rec("c1", 0, "failed"))
    rs.append_run(rec("c1", 1, "ok"))
    rs.append_run(rec("c1", 0, "ok"))
    latest = latest_runs(rs.runs())
    assert latest[("c1", 0)]["status"] == "ok"
    assert rs.ok_keys() == {("c1", 0), ("c1", 1)}
    rs.append_run(rec("c1", 1, "timeout"))
    assert rs.ok_keys() == {("c1", 0)}


def test_manifest_format_is_checked(tmp_path):
    make(tmp_path)
    m = tmp_path / "rs" / "manifest.json"
    data = json.loads(m.read_text())
    data["format_version"] = 99
    m.write_text(json.dumps(data))
    with pytest.raises(ResultsError, match="format version 99"):
        load_manifest(str(tmp_path / "rs"))
    with pytest.raises(ResultsError, match="not a zcorch result set"):
        load_manifest(str(tmp_path))


def test_meta_keeps_previous_collections_on_resume(tmp_path):
    rs = make(tmp_path)
    rs.write_meta({"controller": {"a": 1}, "hosts": {}, "filesystems": {}})
    rs.write_meta({"controller": {"a": 2}, "hosts": {}, "filesystems": {}})
    meta = json.loads((tmp_path / "rs" / "meta.json").read_text())
    assert meta["controller"] == {"a": 2} and meta["previous"][0]["controller"] == {"a": 1}
