"""zcorch.sweep.pipeline.run_sweep as a library (real workers on localhost) and its dry run on
zcorch.hosts.recording.RecordingHost (nothing runs, nothing is written, the library prints nothing)."""
import json
import shlex
import os
import re
import sys

from fixtures_run import TAG_VAR, wait_no_workers
from zcorch.hosts.interpreter import python_argv
from zcorch._version import __version__
from zcorch.config.hosts import Hosts
from zcorch.hosts.recording import REMOTE_HOME, RecordingHost, RemoteRecordingHost, recording_hosts
from zcorch.provision import remote_call, scratch
from zcorch.results.store import read_jsonl
from zcorch.sweep.pipeline import STAGES, SweepObserver, run_sweep

EXP = """name: lib
params: {{bytes: 1MiB, source: /dev/zero, timeout: 10s}}
matrix:
  send_mode: [write, sendfile]
baselines: {baselines}
"""


class Collect(SweepObserver):
    """Every event, in order, as (name, details)."""

    def __init__(self):
        self.events = []

    def started(self, total, already_ok, result_dir):
        self.events.append(("started", (total, already_ok, result_dir)))

    def stage(self, name, title):
        self.events.append(("stage", name))

    def command(self, entry):
        self.events.append(("command", entry))

    def run_started(self, cell, repeat):
        self.events.append(("run_started", (cell, repeat)))

    def run_done(self, record, outcome, todo):
        self.events.append(("run_done", (record["cell"], record["status"], outcome.ok, todo)))

    def message(self, text):
        self.events.append(("message", text))

    def of(self, kind):
        return [d for k, d in self.events if k == kind]


def test_run_sweep_runs_a_localhost_experiment_and_prints_nothing(tmp_path, tag, monkeypatch, capfd):
    monkeypatch.setenv(TAG_VAR, tag)  # the workers inherit it: wait_no_workers finds only ours
    exp = tmp_path / "lib.yaml"
    exp.write_text(EXP.format(baselines="false"))
    seen = Collect()
    result = run_sweep(str(exp), output=str(tmp_path / "rs"), observer=seen, command=["test"])
    assert (result.status, result.exit_status, result.dry_run) == ("complete", 0, False)
    assert result.result_dir == str(tmp_path / "rs") and result.varying == ("send_mode",)
    assert [r["status"] for r in read_jsonl(str(tmp_path / "rs" / "runs.jsonl"))] == ["ok", "ok"]
    assert json.loads((tmp_path / "rs" / "manifest.json").read_text())["command"] == ["test"]
    assert seen.of("stage") == [name for name, _ in STAGES]
    assert seen.of("started") == [(2, 0, str(tmp_path / "rs"))]
    assert [cell for cell, _ in seen.of("run_started")] == [r["id"] for r in result.plan_runs]
    assert [(d[1], d[2], d[3]) for d in seen.of("run_done")] == [("ok", 1, 2), ("ok", 2, 2)]
    assert seen.of("command") == [] and result.recorded == []
    rows = {line.split()[0]: line.split() for line in result.summary().splitlines()}
    assert sorted(rows[r["id"]][1] for r in result.plan_runs) == ["sendfile", "write"]
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert wait_no_workers(tag, 2.0) == []


def test_dry_run_is_the_same_pipeline_on_recording_hosts(tmp_path, tag, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(TAG_VAR, tag)
    exp = tmp_path / "lib.yaml"
    exp.write_text(EXP.format(baselines="{iperf3: {duration: 1s}, dd: {bs: 64KiB, count: 4}}"))
    seen = Collect()
    result = run_sweep(str(exp), dry_run=True, observer=seen)
    assert result.dry_run and result.result_dir is None and result.exit_status == 0
    assert os.listdir(tmp_path) == ["lib.yaml"]  # no result set, nothing else
    assert seen.of("stage") == [name for name, _ in STAGES]
    # Every command reached the observer as it was recorded, in the same order as in the result.
    assert seen.of("command") == result.recorded
    lines = [entry.display() for entry in result.recorded]
    assert all(line.startswith("localhost$ ") for line in lines)
    recv = [line for line in lines if "zcorch.worker recv --listen 127.0.0.1:0" in line]
    send = [line for line in lines if "zcorch.worker send --connect 127.0.0.1:0" in line]
    assert len(recv) == len(send) == 2
    assert sum("iperf3 -c 127.0.0.1" in line for line in lines) == 2  # plain and -Z, one (window, buffer)
    # dd writes in the receiver's own scratch directory by default (never a shared /tmp)
    assert sum(bool(re.search(r"-m zcorch\.worker\.remote dd \S+/scratch 65536 4", line)) for line in lines) == 1
    # the version check's `worker info` also reads the cached calibration and the metadata (one start, not three)
    assert any(re.search(r"zcorch\.worker info --cache \S+/calibration\.json'? --max-age \S+ --metadata 127\.0\.0\.1 ",
                         line) for line in lines)
    # The runner ran its whole course on the canned answers: records exist, in memory only.
    assert [r["status"] for r in result.records] == ["ok", "ok"]
    assert all(r["receiver"]["not_measured"] for r in result.records)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert wait_no_workers(tag) == []


def test_recording_host_records_answers_and_touches_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    seen = []
    host = RecordingHost("localhost", "127.0.0.1", on_record=seen.append)
    target = tmp_path / "never" / "written"
    host.put_bytes(b"abc", str(target))
    host.put_file(__file__, str(target))
    info = host.run(["python3", "-m", "zcorch.worker", "info"], env={"PYTHONPATH": "/x"})
    assert json.loads(info.stdout) == {"event": "info", "version": __version__, "modes": {},
                                       "kernel": "dry run: not measured", "not_measured": True}
    prepared = remote_call.run_remote(host, "scratch", "~/.cache/zcorch", "sub")
    assert json.loads(prepared.stdout)["path"] == str(tmp_path / "home" / ".cache" / "zcorch" / "scratch")
    assert not host.run(["cat", "--", "/etc/hostname"]).ok  # nothing is read, not even this
    proc = host.start(["python3", "-m", "zcorch.worker", "recv", "--listen", "127.0.0.1:0"])
    assert [json.loads(line)["event"] for line in proc.lines(1.0)] == ["ready", "result"]
    assert proc.wait(0) == 0
    assert not target.parent.exists() and not (tmp_path / "home").exists()
    assert seen == host.recorded and [e.kind for e in seen] == ["put_bytes", "put_file", "run", "run", "run", "start"]
    assert seen[2].display() == "localhost$ env PYTHONPATH=/x python3 -m zcorch.worker info"
    local = shlex.join(python_argv(sys.executable, "zcorch.worker.remote", safe_path=sys.version_info >= (3, 11)))
    assert seen[3].display() == (f"localhost$ env PYTHONPATH={remote_call.PACKAGE_PARENT} {local} "
                                 "scratch '~/.cache/zcorch' sub")
    assert seen[0].display() == f"localhost$ # copy <3 bytes> to {target} (mode 0644)"


def test_remote_recording_hosts_connect_nowhere_and_keep_the_scratch_placeholder():
    hosts = recording_hosts(Hosts.from_mapping({
        "sender": {"ssh": "root@192.0.2.1:1", "data_address": "192.0.2.1"},
        "receiver": {"ssh": "u@192.0.2.2", "data_address": "192.0.2.2", "workdir": "/srv"}}))
    sender, receiver = hosts["sender"], hosts["receiver"]
    assert isinstance(sender, RemoteRecordingHost) and not sender.is_local and sender is not receiver
    assert sender.data_address == "192.0.2.1"
    assert sender.expand("~/.cache/zcorch") == REMOTE_HOME + "/.cache/zcorch"
    info = json.loads(remote_call.run_remote(sender, "scratch", sender.expand("~/.cache/zcorch")).stdout)
    assert info["path"] == scratch.PLACEHOLDER  # unknown before connecting: commands keep it as written
    assert scratch.substitute("{scratch}/src.dat", info["path"]) == "{scratch}/src.dat"
    # The module's text goes on stdin to the host's own python (zcorch.provision.remote_call).
    assert sender.recorded[-1].display() == (f"sender$ {shlex.join(python_argv('python3', None))} scratch "
                                             "~/.cache/zcorch < zcorch/worker/remote.py")
    assert json.loads(remote_call.run_remote(receiver, "scratch", "/srv").stdout)["location"] == "/srv/scratch"
