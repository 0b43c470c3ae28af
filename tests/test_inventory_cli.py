"""`zcorch run|plan --hosts INVENTORY[:PAIR] --set KEY=VALUE` as a user runs them (subprocesses on localhost,
through an inventory whose pair is `localhost`), what the result set records, --resume, and result
directories of sweeps started at the same moment."""
import hashlib
import json
import os
import subprocess
import sys

import pytest
import yaml

from fixtures_analysis import zcorch_cli
from fixtures_run import REPO, new_resultset, zcorch
from zcorch.analysis.report import experiment_section
from zcorch.errors import ResultsError
from zcorch.results.store import ResultSet, read_jsonl

EXP = """\
# the file as written
name: inv
hosts: inventory
params: {bytes: 1MiB, source: /dev/zero, timeout: 10s}
matrix:
  send_mode: [write, sendfile]
  buffer: [64KiB, 128KiB]
repeats: 2
baselines: false
"""
INVENTORY = """\
pairs:
  here: localhost
  far:
    sender:   {ssh: nobody@192.0.2.1, data_address: 192.0.2.1, identity_file: keys/id}
    receiver: {ssh: nobody@192.0.2.2, data_address: 192.0.2.2}
"""


@pytest.fixture
def files(tmp_path):
    exp, inv = tmp_path / "inv.yaml", tmp_path / "hosts.yaml"
    exp.write_text(EXP)
    inv.write_text(INVENTORY)
    return exp, inv


def plan_with(monkeypatch, hosts: str, *args) -> subprocess.CompletedProcess:
    """`zcorch plan ARGS` (in this process) with ZCORCH_HOSTS=hosts in its environment."""
    with monkeypatch.context() as m:
        m.setenv("ZCORCH_HOSTS", hosts)
        return zcorch_cli("plan", *args)


def test_plan_takes_hosts_set_and_the_environment(files, tag, monkeypatch):
    exp, inv = files
    # without a pair the plan still shows the cells, its hosts unknown; a run refuses (and says how to name them)
    r = zcorch_cli("plan", exp)
    assert r.returncode == 0, r.stderr
    assert "hosts: unknown until run: `hosts: inventory`" in r.stdout and "4 cells x 2 repeats" in r.stdout
    r = zcorch_cli("plan", exp, "--json")
    assert r.returncode == 0 and len(json.loads(r.stdout)) == 8
    r = zcorch(tag, "run", exp, "--dry-run")
    assert r.returncode == 2 and "hosts: `inventory`: this experiment runs on two hosts" in r.stderr
    r = zcorch_cli("plan", exp, "--hosts", f"{inv}:far", "--set", "bytes=2MiB", "--set", "matrix.buffer=[64KiB]")
    assert r.returncode == 0, r.stderr
    assert f"hosts: sender nobody@192.0.2.1 -> receiver nobody@192.0.2.2 (pair `far` of {inv})" in r.stdout
    assert "--set bytes=2MiB\n--set matrix.buffer=[64KiB]\n" in r.stdout and "2 cells x 2 repeats" in r.stdout
    r = plan_with(monkeypatch, f"{inv}:here", exp, "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)) == 8
    # the flag wins over the environment (whose pair does not even exist)
    r = plan_with(monkeypatch, f"{inv}:nope", exp, "--hosts", f"{inv}:here")
    assert r.returncode == 0 and f"hosts: localhost (pair `here` of {inv})" in r.stdout, r.stderr
    r = plan_with(monkeypatch, f"{inv}:nope", exp)
    assert r.returncode == 2 and f"error: ZCORCH_HOSTS {inv}:nope: {inv} has no pair `nope`" in r.stderr
    assert "(its pairs: here, far)" in r.stderr
    r = zcorch_cli("plan", exp, "--hosts", inv, "--set", "byts=1", "--set", "repeats=0")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--set byts=1: byts: unknown key `byts`; did you mean `bytes`?" in r.stderr
    assert "--set repeats=0: repeats: expected an integer between 1 and 10000" in r.stderr


@pytest.mark.slow
def test_run_records_inventory_and_overrides_and_resume_keeps_the_hosts(files, tag, tmp_path):
    exp, inv = files
    out = tmp_path / "rs"
    r = zcorch(tag, "run", exp, "--hosts", f"{inv}:here", "--set", "bytes=2MiB", "--set", "matrix.buffer=[64KiB]",
               "--set", "repeats=1", "-o", out)
    assert r.returncode == 0, r.stderr
    assert f"zcorch run: hosts: localhost (pair `here` of {inv})" in r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inventory"] == {"path": str(inv), "pair": "here",
                                     "sha256": hashlib.sha256(inv.read_bytes()).hexdigest()}
    assert manifest["overrides"] == ["bytes=2MiB", "matrix.buffer=[64KiB]", "repeats=1"]
    assert manifest["experiment_source"] == {"path": str(exp), "sha256": hashlib.sha256(exp.read_bytes()).hexdigest(),
                                             "copy": "experiment.source.yaml"}
    assert (out / "experiment.source.yaml").read_bytes() == exp.read_bytes()
    effective = (out / "experiment.yaml").read_text()
    assert effective.startswith("# zcorch run: the experiment as this sweep runs it")
    assert f"#   hosts: pair `here` of the inventory {inv}" in effective and "#   --set repeats=1\n" in effective
    data = yaml.safe_load(effective)
    assert data["hosts"] == "localhost" and data["params"]["bytes"] == "2MiB" and data["repeats"] == 1
    runs = read_jsonl(str(out / "runs.jsonl"))
    assert len(runs) == 2 and all(x["status"] == "ok" and x["receiver"]["bytes"] == 2 << 20 for x in runs)
    # the report shows what ran: the effective document and where its hosts came from
    section = experiment_section(manifest, effective)
    rows = dict(section["table"].rows)
    assert json.loads(rows["inventory"])["pair"] == "here" and json.loads(rows["overrides"])[0] == "bytes=2MiB"

    # --resume runs on the recorded hosts: ZCORCH_HOSTS is not read (a broken value does not matter) ...
    (out / "runs.jsonl").write_text((out / "runs.jsonl").read_text().splitlines()[0] + "\n")
    r = zcorch(tag, "run", "--resume", out, env={"ZCORCH_HOSTS": "/no/such/inventory.yaml"})
    assert r.returncode == 0, r.stderr
    assert len(read_jsonl(str(out / "runs.jsonl"))) == 2
    # ... --set cannot change it ...
    r = zcorch(tag, "run", "--resume", out, "--set", "bytes=1MiB")
    assert r.returncode == 2 and "--set cannot change the result set being resumed" in r.stderr
    # ... and --hosts given again replaces them, recorded in the resumed entry
    r = zcorch(tag, "run", "--resume", out, "--hosts", f"{inv}:here")
    assert r.returncode == 0, r.stderr
    resumed = json.loads((out / "manifest.json").read_text())["resumed"]
    assert "inventory" not in resumed[0] and resumed[1]["inventory"]["pair"] == "here"
    assert json.loads((out / "manifest.json").read_text())["inventory"]["pair"] == "here"


@pytest.mark.slow
def test_without_hosts_or_set_experiment_yaml_stays_the_byte_copy(tmp_path, tag):
    exp = tmp_path / "plain.yaml"
    exp.write_text(EXP.replace("hosts: inventory", "hosts: localhost").replace("repeats: 2", "repeats: 1")
                   .replace("[64KiB, 128KiB]", "[64KiB]"))
    out = tmp_path / "rs"
    r = zcorch(tag, "run", exp, "-o", out)
    assert r.returncode == 0, r.stderr
    assert (out / "experiment.yaml").read_bytes() == exp.read_bytes()
    assert not (out / "experiment.source.yaml").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inventory"] is None and manifest["overrides"] == []
    assert manifest["experiment_source"]["copy"] is None and manifest["experiment_source"]["path"] == str(exp)


@pytest.mark.slow
def test_set_values_reach_no_shell(files, tag, tmp_path):
    """A --set value with shell syntax is a file name, byte for byte (argv lists only, no shell anywhere)."""
    exp, inv = files
    sink = tmp_path / "out`touch pwned`$(touch pwned2);.dat"
    r = zcorch(tag, "run", exp, "--hosts", inv, "--set", f"sink={sink}", "--set", "matrix.send_mode=[write]",
               "--set", "matrix.buffer=[64KiB]", "--set", "repeats=1", "-o", tmp_path / "rs", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sink.stat().st_size == 1 << 20
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
    assert not os.path.exists(os.path.join(REPO, "pwned"))


@pytest.mark.slow
def test_two_sweeps_started_at_once_get_their_own_result_directories(files, tag, tmp_path):
    """Default names are results/<name>-<UTC second>: the second sweep of that second gets `-2`."""
    exp, inv = files
    args = ["run", exp, "--hosts", f"{inv}:here", "--set", "repeats=1", "--set", "matrix.buffer=[64KiB]"]
    env = dict(os.environ, PYTHONPATH=REPO, ZCORCH_TEST_TAG=tag)
    procs = [subprocess.Popen([sys.executable, "-m", "zcorch", *map(str, args)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    dirs = sorted(os.listdir(tmp_path / "results"))
    assert len(dirs) == 3 and all(d.startswith("inv-") for d in dirs)
    for d in dirs:
        rs = tmp_path / "results" / d
        assert json.loads((rs / "manifest.json").read_text())["status"] == "complete"
        assert len(read_jsonl(str(rs / "runs.jsonl"))) == 2


def test_result_set_create_unique_takes_the_next_free_name(tmp_path):
    base = str(tmp_path / "results" / "t-20261122T000000Z")
    made = [ResultSet.create(base, name="t", experiment_bytes=b"name: t\n", plan_runs=[], command=["pytest"],
                             accept_new_host_keys=False, zcorch_version="test", git_revision=None, unique=True).dir
            for _ in range(3)]
    assert made == [base, base + "-2", base + "-3"]
    new_resultset(tmp_path / "explicit")
    with pytest.raises(ResultsError, match="already holds a result set"):
        new_resultset(tmp_path / "explicit")  # an explicit -o is never renamed


def test_lab_inventory_of_a_lab_that_is_not_up(tag):
    r = zcorch(tag, "lab", "inventory", "--name", "nosuchlab", "--index", "251")
    assert r.returncode == 1 and "lab 'nosuchlab' is not up" in r.stderr
    assert "zcorch lab up --name nosuchlab" in r.stderr
    assert r.stdout == ""
