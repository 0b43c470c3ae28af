"""`{scratch}`: resolution per host (real directories on localhost) and the runner using it with real workers."""
import os
import sys

import pytest

from fixtures_run import base_params, local_runner, new_resultset, wait_no_workers
from zcorch.config.hosts import HostSpec
from zcorch.provision import scratch
from zcorch.errors import PreflightError
from zcorch.hosts.local import LocalHost


def test_substitute_and_resolve_params_are_pure():
    assert scratch.substitute("{scratch}/a/b.dat", "/home/u/.cache/zcorch/scratch/") == \
        "/home/u/.cache/zcorch/scratch/a/b.dat"
    assert scratch.substitute("{scratch}", "/s") == "/s"
    assert scratch.substitute("/tmp/{scratch}", "/s") == "/tmp/{scratch}"   # only a leading placeholder
    assert scratch.substitute("{scratch}/x", None) == "{scratch}/x"
    params = base_params(source="{scratch}/src.dat", sink="{scratch}/sink.dat")
    frozen = dict(params)
    out = scratch.resolve_params(params, {"sender": "/tx", "receiver": "/rx"})
    assert out["source"] == "/tx/src.dat" and out["sink"] == "/rx/sink.dat"
    assert params == frozen                        # plan params are shared by the repeats: never mutated
    plain = base_params()
    assert scratch.resolve_params(plain, {"sender": "/tx", "receiver": "/rx"}) is plain
    # A role without a directory keeps the placeholder (--dry-run of a remote experiment).
    assert scratch.resolve_params(params, {"receiver": "/rx"})["source"] == "{scratch}/src.dat"


def test_needs_lists_roles_and_subdirectories():
    cells = [base_params(source="{scratch}/in/src.dat"), base_params(sink="{scratch}/a/b/recv.dat"),
             base_params(sink="{scratch}/top.dat"), base_params(source="/dev/zero", sink="/dev/null")]
    assert scratch.needs(cells) == {"sender": ["in"], "receiver": ["a/b"]}
    assert scratch.needs([base_params()], dd_scratch="{scratch}/dd") == {"receiver": ["dd"]}
    assert scratch.needs([base_params()], dd_scratch="/tmp") == {}
    assert scratch.needs([base_params()], dd_scratch=None) == {}


def test_prepare_creates_scratch_0700_in_the_home_and_reuses_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    info = scratch.prepare(LocalHost(), sys.executable, ["a/b", "dd"])
    path = tmp_path / ".cache" / "zcorch" / "scratch"
    assert info == {"path": str(path), "created": True, "mode": "0700"}
    assert (path.stat().st_mode & 0o777) == 0o700 and (path / "a" / "b").is_dir() and (path / "dd").is_dir()
    (path / "keep.dat").write_bytes(b"x")
    again = scratch.prepare(LocalHost(), sys.executable)
    assert again == {"path": str(path), "created": False, "mode": "0700"}
    assert (path / "keep.dat").read_bytes() == b"x"


def test_prepare_uses_the_host_workdir(tmp_path):
    host = LocalHost()
    # as an SSH host's spec carries it (LocalHost has none: the default workdir)
    host.spec = HostSpec(ssh="localhost", data_address="127.0.0.1", workdir=str(tmp_path / "wd"))
    assert scratch.prepare(host, sys.executable)["path"] == str(tmp_path / "wd" / "scratch")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directory to another user (chown)")
def test_prepare_refuses_a_scratch_directory_of_another_user(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / ".cache" / "zcorch" / "scratch"
    path.mkdir(parents=True)
    os.chown(path, 65534, 65534)
    with pytest.raises(PreflightError) as info:
        scratch.prepare(LocalHost(), sys.executable)
    msg = str(info.value)
    assert msg.startswith("localhost: the {scratch} directory") and str(path) in msg
    assert "is owned by uid 65534, not by this user (uid 0)" in msg and "workdir" in msg


def test_prepare_refuses_a_file_in_its_place(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".cache" / "zcorch").mkdir(parents=True)
    (tmp_path / ".cache" / "zcorch" / "scratch").write_text("not a directory")
    with pytest.raises(PreflightError, match="exists and is not a directory"):
        scratch.prepare(LocalHost(), sys.executable)


def test_prepare_all_prepares_a_shared_host_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    local = LocalHost()
    said = []
    infos = scratch.prepare_all({"sender": local, "receiver": local}, {"sender": sys.executable,
                                                                        "receiver": sys.executable},
                                {"sender": ["in"], "receiver": ["out"]}, log=said.append)
    path = str(tmp_path / ".cache" / "zcorch" / "scratch")
    assert infos["sender"] is infos["receiver"] and infos["sender"]["path"] == path
    assert os.path.isdir(os.path.join(path, "in")) and os.path.isdir(os.path.join(path, "out"))
    assert said == [f"created the {{scratch}} directory {path} on localhost (mode 0700)"]


def test_runner_resolves_scratch_for_the_workers_and_records_it_as_written(tmp_path, tag):
    tx, rx = tmp_path / "tx-scratch", tmp_path / "rx-scratch"
    tx.mkdir()
    rx.mkdir()
    (tx / "src.dat").write_bytes(os.urandom(1 << 20))
    cells = [base_params(send_mode="sendfile", source="{scratch}/src.dat", recv_mode="mmap",
                         sink="{scratch}/recv.dat")]
    runs = [{"id": "c0", "repeat": 0, "params": cells[0]}]
    rs = new_resultset(tmp_path / "rs", runs)
    dd = []
    outcome = local_runner(rs, tag, scratch={"sender": str(tx), "receiver": str(rx)},
                           before_directory=lambda fs, sink: dd.append(sink)).run_sweep(runs)
    assert outcome.ok == 1, rs.runs()
    (rec,) = rs.runs()
    assert rec["params"]["source"] == "{scratch}/src.dat" and rec["params"]["sink"] == "{scratch}/recv.dat"
    assert rec["sender"]["params"]["source"] == str(tx / "src.dat")
    assert rec["receiver"]["params"]["sink"] == str(rx / "recv.dat")
    assert (rx / "recv.dat").read_bytes() == (tx / "src.dat").read_bytes()
    assert dd == ["{scratch}/recv.dat"]   # the dd hook gets the path as written (its key) and resolves it
    log = (tmp_path / "rs" / rec["log"]).read_text()
    assert f"--sink {rx / 'recv.dat'}" in log and "{scratch}" not in log.split("\n", 1)[1]
    assert cells[0]["source"] == "{scratch}/src.dat"   # the plan's params are untouched
    assert wait_no_workers(tag) == []


def test_source_layout_errors_match_resolved_scratch_sources(tmp_path, tag):
    """A {scratch} source that could not be laid out fails its cells unrun (sources' errors use real paths)."""
    tx = tmp_path / "tx"
    tx.mkdir()
    cells = [base_params(send_mode="sendfile", source="{scratch}/missing.dat")]
    runs = [{"id": "c0", "repeat": 0, "params": cells[0]}]
    rs = new_resultset(tmp_path / "rs", runs)
    why = f"source {tx}/missing.dat is missing on localhost and could not be laid out: disk full"
    local_runner(rs, tag, scratch={"sender": str(tx)}, source_errors={f"{tx}/missing.dat": why}).run_sweep(runs)
    (rec,) = rs.runs()
    assert rec["status"] == "failed" and rec["reason"] == why and rec["params"]["source"] == "{scratch}/missing.dat"
