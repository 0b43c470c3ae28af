"""Fleet runs (zcorch.sweep.fleet, zcorch.cli.fleet) without the lab: the locks (real flocks between real
threads and processes), host identities through a real ssh config, and whole fleets of localhost pairs
(real `zcorch run` children and workers): every localhost pair is the same machine, so their runs must
never overlap; one unreachable pair fails without stopping the others; the JSON events carry the pair and
follow the documented schema; the pairs are compared. The four-lab fleet is tests/test_fleet_lab.py."""
from __future__ import annotations

import datetime as dt
import json
import os
import textwrap
import threading
from pathlib import Path

import pytest

from fixtures_analysis import zcorch_cli
from fixtures_run import zcorch
from zcorch.config.hosts import HostSpec
from zcorch.config.inventory import load_inventory
from zcorch.sweep import fleet as fl

ROOT = Path(__file__).resolve().parent.parent

EXPERIMENT = """\
name: fleettiny
hosts: localhost
params: {bytes: 256KiB, source: mem, sink: /dev/null, timeout: 20s}
matrix:
  send_mode: [write]
  recv_mode: [read]
repeats: 3
baselines: false
"""


def write(path: Path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    return str(path)


def run_intervals(result_dir: Path) -> list:
    """(start, end) of every run record of a result set, in seconds since the epoch."""
    out = []
    for line in (result_dir / "runs.jsonl").read_text().splitlines():
        rec = json.loads(line)
        start = dt.datetime.fromisoformat(rec["started"]).timestamp()
        out.append((start, start + rec["wall_s"]))
    return out


def overlaps(a: list, b: list) -> list:
    return [(x, y) for x in a for y in b if x[0] < y[1] and y[0] < x[1]]


# -- locks ---------------------------------------------------------------------------------------

def test_lock_files_are_one_global_order_and_distinct_for_keys_a_file_name_cannot_hold():
    names = fl.lock_files(["b:22", "a:22"], ["tor/1", "tor_1"])
    assert names == sorted(names) and len(set(names)) == 4
    assert [n.split("-")[0] for n in names] == ["host", "host", "share", "share"]
    assert all("/" not in n for n in names)


def test_a_held_lock_makes_the_other_pair_wait_until_it_is_dropped(tmp_path):
    first = fl.FleetLocks(str(tmp_path), fl.lock_files(["h:22"], ["link"]))
    second = fl.FleetLocks(str(tmp_path), fl.lock_files(["h:22"], []))
    first.acquire()
    got = threading.Event()
    waiter = threading.Thread(target=lambda: (second.acquire(), got.set()))
    waiter.start()
    assert not got.wait(0.5)          # blocked on the host lock (a real flock, another file description)
    first.release()
    assert got.wait(10)
    waiter.join()
    second.release()
    assert not first.held and not second.held


def test_host_identity_follows_the_ssh_config_and_ignores_the_user(tmp_path):
    config = write(tmp_path / "ssh_config", """\
        Host rack3-a
          HostName 192.0.2.7
          Port 2222
        """)
    alias = HostSpec(ssh="bob@rack3-a", data_address="192.0.2.7", ssh_config=config)
    direct = HostSpec(ssh="root@192.0.2.7:2222", data_address="192.0.2.7", ssh_config=config)
    other_port = HostSpec(ssh="192.0.2.7", data_address="192.0.2.7", ssh_config=config)
    assert fl.host_identity(alias) == fl.host_identity(direct) == "192.0.2.7:2222"
    assert fl.host_identity(other_port) == "192.0.2.7:22"
    assert fl.host_identity(None) == "localhost"


def test_pair_locks_of_an_inventory(tmp_path):
    inv = load_inventory(write(tmp_path / "inv.yaml", """\
        pairs:
          a: {sender: {ssh: root@10.0.0.1, data_address: 10.1.0.1}, receiver: {ssh: root@10.0.0.2, data_address: 10.1.0.2},
              shares: [tor1]}
          b: {sender: {ssh: root@10.0.0.2, data_address: 10.1.0.2}, receiver: {ssh: root@10.0.0.1, data_address: 10.1.0.1}}
          c: localhost
        """))
    assert fl.pair_locks(inv.pair("a")) == (["10.0.0.1:22", "10.0.0.2:22"], ["tor1"])
    assert fl.pair_locks(inv.pair("b"))[0] == fl.pair_locks(inv.pair("a"))[0]
    assert fl.pair_locks(inv.pair("c")) == (["localhost"], [])


def test_the_end_work_waits_for_the_end_while_a_pair_measures_this_machine(tmp_path):
    """The fleet's end work (caches, imports for the comparison) runs beside the pairs only when none of them
    measures the controller's own CPUs (localhost, or ssh to a loopback address)."""
    from zcorch.cli.fleet import EndWork

    for hosts, beside in ((["localhost"], False), (["127.0.0.1:22"], False), (["::1:2222"], False),
                          (["10.0.0.1:22", "10.0.0.2:22"], True)):
        end = EndWork()
        end.fleet_started(str(tmp_path), [fl.PairState("a", "a", hosts, []),
                                          fl.PairState("b", "b", ["10.0.0.9:22"], [])], False)
        end.pairs_running()
        assert (end.thread is not None) == beside, hosts
        assert end.finish([]) == {}


# -- whole fleets of localhost pairs -------------------------------------------------------------

@pytest.fixture
def fleet_files(tmp_path):
    exp = write(tmp_path / "exp.yaml", EXPERIMENT)
    inv = write(tmp_path / "inv.yaml", """\
        pairs:
          a: localhost
          b: {sender: {ssh: "127.0.0.1:1", data_address: 127.0.0.1}, receiver: {ssh: "127.0.0.1:1", data_address: 127.0.0.1},
              shares: lo-link}
          c: localhost
        """)
    return exp, inv


@pytest.mark.slow
def test_a_fleet_of_localhost_pairs_never_overlaps_and_one_failure_stops_no_other(tmp_path, fleet_files, tag):
    jsonschema = pytest.importorskip("jsonschema")
    exp, inv = fleet_files
    out = tmp_path / "fleet"
    res = zcorch(tag, "run", exp, "--hosts", f"{inv}:a,b,c", "-o", out, "--json", timeout=300)
    # b's ssh port refuses: its sweep stops, a and c complete; the fleet says which failed (exit 1)
    assert res.returncode == 1, res.stderr[-3000:]
    events = [json.loads(line) for line in res.stdout.splitlines()]
    schema = json.loads((ROOT / "docs" / "schemas" / "run-events.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    for ev in events:
        errors = [e.message for e in validator.iter_errors(ev)]
        assert not errors, (ev["event"], errors)
    assert events[0]["event"] == "fleet_start" and events[-1]["event"] == "fleet_end"
    assert [p["pair"] for p in events[0]["pairs"]] == ["a", "b", "c"]
    assert all("pair" in e for e in events[1:-1] if e["event"] not in ("fleet_start", "fleet_end"))
    ends = {e["pair"]: e for e in events if e["event"] == "pair_end"}
    assert ends["a"]["status"] == ends["c"]["status"] == "complete" and ends["b"]["status"] == "failed"
    assert "127.0.0.1" in ends["b"]["reason"] or "refused" in ends["b"]["reason"].lower(), ends["b"]
    assert events[-1]["failed_pairs"] == ["b"] and events[-1]["exit_status"] == 1

    doc = json.loads((out / "fleet.json").read_text())
    assert doc["format"] == "zcorch-fleet" and doc["format_version"] == 1
    assert doc["exclusions"]["hosts"] == {"localhost": ["a", "c"]}
    assert {p["pair"]: p["status"] for p in doc["pairs"]} == {"a": "complete", "b": "failed", "c": "complete"}
    for pair in "ac":
        manifest = json.loads((out / pair / "manifest.json").read_text())
        assert manifest["status"] == "complete" and manifest["inventory"]["pair"] == pair
        assert len(run_intervals(out / pair)) == 3
        assert (out / pair / "runs.parquet").is_file()   # written by the fleet, at its end (localhost pairs)
    # a and c are one machine: not one moment where both ran a cell
    assert overlaps(run_intervals(out / "a"), run_intervals(out / "c")) == []
    assert events[-1]["pairs_compared"]["file"] == "pairs.md" and (out / "pairs.md").is_file()

    # --resume runs only what is not done: b again (still unreachable), a and c untouched
    before = {p: (out / p / "runs.jsonl").read_text() for p in "ac"}
    again = zcorch(tag, "run", "--resume", out, timeout=300)
    assert again.returncode == 1, again.stderr[-3000:]
    assert {p: (out / p / "runs.jsonl").read_text() for p in "ac"} == before
    doc = json.loads((out / "fleet.json").read_text())
    assert len(doc["resumed"]) == 1 and doc["pairs"][1]["status"] == "failed"
    assert "[b] failed" in again.stderr and "fleet of 3 pair(s) resumed: b" in again.stderr

    # which pair is different: a against c (the only two with runs), same exit codes as across nights
    cmp = zcorch_cli("compare", out, "--format", "json")
    verdict = json.loads(cmp.stdout)
    assert cmp.returncode == verdict["exit_code"] == 3   # b never measured anything: incomplete
    assert "pair b" in verdict["reason"] and [p["pair"] for p in verdict["pairs"]] == ["a", "b", "c"]
    by_pair = {p["pair"]: p for p in verdict["pairs"]}
    assert by_pair["a"]["reference"] == "the other pairs (c)"   # b measured nothing: no one's reference
    # and 3 runs of a against 3 of c can never be significant: cannot tell, with the runs that would decide it
    assert by_pair["b"]["exit_code"] == 3 and by_pair["a"]["exit_code"] == 3 and "runs a side" in by_pair["a"]["reason"]
    against = zcorch_cli("compare", out, "--against", "a")
    assert "against pair a" in against.stdout and "pair c" in against.stdout
    assert zcorch_cli("compare", out, "--against", "zz").returncode == 2


def test_bad_fleet_input_is_refused_before_anything_starts(tmp_path, fleet_files, tag):
    exp, inv = fleet_files
    unknown = zcorch(tag, "run", exp, "--hosts", f"{inv}:a,zz", "-o", tmp_path / "x")
    assert unknown.returncode == 2 and "no pair `zz`" in unknown.stderr and not (tmp_path / "x").exists()
    bad = zcorch(tag, "run", exp, "--hosts", f"{inv}:all", "--set", "bogus=1", "-o", tmp_path / "y")
    assert bad.returncode == 2 and "pair `a`" in bad.stderr and not (tmp_path / "y").exists()
    dry = zcorch(tag, "run", exp, "--hosts", f"{inv}:all", "--dry-run")
    assert dry.returncode == 2 and "--hosts INVENTORY:PAIR" in dry.stderr


@pytest.mark.slow
def test_a_fleet_directory_is_driven_by_one_zcorch_run_at_a_time(tmp_path, fleet_files, tag):
    exp, inv = fleet_files
    out = tmp_path / "fleet"
    res = zcorch(tag, "run", exp, "--hosts", f"{inv}:a,c", "-o", out, "--set", "repeats=1", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "pair a" in res.stdout and "results:" in res.stdout
    from zcorch.results.store import lock_result_set

    fd = lock_result_set(str(out))      # as a running fleet holds it
    try:
        busy = zcorch(tag, "run", "--resume", out)
        assert busy.returncode == 75 and "another zcorch run" in busy.stderr
    finally:
        os.close(fd)
    done = zcorch(tag, "run", "--resume", out, timeout=120)   # every pair complete: nothing starts
    assert done.returncode == 0 and "nothing left to run" in done.stderr, done.stderr
    assert json.loads((out / "a" / "manifest.json").read_text()).get("resumed") in (None, [])


@pytest.mark.slow
def test_recalibrate_reaches_every_pair(tmp_path, fleet_files, tag):
    """`zcorch run --hosts INV:... --recalibrate`: each pair's sweep re-measures its hosts' copy cost rather
    than reading the hosts' calibration cache (a pair's own `zcorch run` is given the flag)."""
    exp, inv = fleet_files
    out = tmp_path / "fleet"
    res = zcorch(tag, "run", exp, "--hosts", f"{inv}:a,c", "-o", out, "--recalibrate", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    for pair in "ac":
        meta = json.loads((out / pair / "meta.json").read_text())
        for role in ("sender", "receiver"):
            cal = meta["hosts"][role]["calibration"]
            assert cal["cached"] is False and cal["cache"]["status"] == "refresh", (pair, role, cal)


def _run_script(tag, tmp_path, name: str, text: str, *args) -> "subprocess.CompletedProcess":
    """`python SCRIPT ARGS` (a script written from `text`), with the checkout on PYTHONPATH and our tag."""
    import subprocess
    import sys

    from fixtures_run import REPO, TAG_VAR

    script = tmp_path / name
    script.write_text(text)
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO, **{TAG_VAR: tag}))


KILL_AFTER_RECORD = """\
import os, signal, sys
from zcorch.cli import main
from zcorch.results.store import ResultSet

records = sys.argv.pop(1)  # runs.jsonl or baselines.jsonl: the file after whose first record the pair dies
victim = sys.argv.pop(1)   # the --hosts value of the pair to kill, as the fleet gives it to that pair's process
append = ResultSet._append


def append_then_die(self, name, record):
    append(self, name, record)   # the record whole on disk, its event not yet printed
    if name == records and victim in sys.argv:   # that pair's forked process (the fleet sets its argv)
        os.kill(os.getpid(), signal.SIGKILL)


ResultSet._append = append_then_die
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_pair_killed_between_writing_a_run_and_printing_it_still_has_that_run_reported(tmp_path, fleet_files,
                                                                                          tag):
    """A pair's sweep SIGKILLed after a run's record reached its runs.jsonl but before its `run` event was
    printed: the fleet reads the record back when the sweep ends and reports it (`recovered`), so the events,
    fleet.json and the result set agree, and a --resume does not run it again. The instant between the two
    writes is too short to hit from outside on demand (the four-lab test's kill lands there only sometimes),
    so the pair's process kills itself there: a real SIGKILL of a real `zcorch run` fleet's pair, placed by
    wrapping ResultSet._append (KILL_AFTER_RECORD, the command line run by a script that does only that)."""
    jsonschema = pytest.importorskip("jsonschema")
    exp, inv = fleet_files
    out = tmp_path / "fleet"
    res = _run_script(tag, tmp_path, "kill_after_record.py", KILL_AFTER_RECORD, "runs.jsonl", f"{inv}:c", "run", exp,
                      "--hosts", f"{inv}:a,c", "-o", out, "--json")
    assert res.returncode == 1, res.stderr[-3000:]
    events = [json.loads(line) for line in res.stdout.splitlines()]
    ends = {e["pair"]: e for e in events if e["event"] == "pair_end"}
    assert ends["a"]["status"] == "complete" and ends["c"]["status"] == "failed"
    assert "SIGKILL" in ends["c"]["reason"], ends["c"]
    assert ends["c"]["runs"] == {"planned": 3, "ok": 1, "failed": 0}

    records = [json.loads(line) for line in (out / "c" / "runs.jsonl").read_text().splitlines()]
    assert len(records) == 1
    runs = {p: [e for e in events if e["event"] == "run" and e["pair"] == p] for p in "ac"}
    assert len(runs["a"]) == 3 and not any(e.get("recovered") for e in runs["a"])
    (recovered,) = runs["c"]
    assert recovered["recovered"] is True and recovered["done"] == 1 and recovered["todo"] == 3
    assert (recovered["cell"], recovered["repeat"], recovered["started"]) == \
        (records[0]["cell"], records[0]["repeat"], records[0]["started"])
    assert recovered["status"] == "ok" and recovered["gbit_s"] > 0
    assert set(recovered) == set(runs["a"][0]) | {"recovered"}   # the same event a live sweep prints
    schema = json.loads((ROOT / "docs" / "schemas" / "run-events.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    assert [e.message for e in validator.iter_errors(recovered)] == []
    doc = json.loads((out / "fleet.json").read_text())
    assert {p["pair"]: p["runs"] for p in doc["pairs"]}["c"] == {"planned": 3, "ok": 1, "failed": 0}

    # --resume: c runs only its two missing repeats; the recovered run is kept, never reported twice
    again = zcorch(tag, "run", "--resume", out, "--json", timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = [json.loads(line) for line in again.stdout.splitlines()]
    rerun = [e for e in rerun if e["event"] == "run"]
    assert {e["pair"] for e in rerun} == {"c"} and len(rerun) == 2 and not any(e.get("recovered") for e in rerun)
    assert len((out / "c" / "runs.jsonl").read_text().splitlines()) == 3


LIBRARY_CALLER = """\
import io, json, sys
from zcorch.cli import main
from zcorch.sweep import fleet

exp, hosts, out = sys.argv[1:]
sys.stdout = sys.stderr = io.StringIO()   # what a notebook or a capturing harness puts there: not fd 1 or 2
runs = []


class Collect(fleet.FleetObserver):
    def event(self, pair, doc):   # as each pair's sweep printed them (not read back from its records)
        runs.extend([pair] if doc.get("event") in ("run", "end") and not doc.get("recovered") else [])


f = fleet.prepare_fleet(exp, hosts, pair_main=main, output=out, observer=Collect())
try:
    status = f.run().exit_status
finally:
    f.close()
sys.__stdout__.write(json.dumps({"exit_status": status, "runs": runs}))
"""


@pytest.mark.slow
def test_a_library_caller_whose_sys_stdout_is_not_fd_1_still_gets_every_pairs_events(tmp_path, fleet_files, tag):
    """run_fleet from Python with sys.stdout/stderr replaced (a notebook, a capture): each pair's process
    writes its events to the fleet's pipe, not into its copy of the caller's stream object."""
    exp, inv = fleet_files
    res = _run_script(tag, tmp_path, "library_caller.py", LIBRARY_CALLER, exp, f"{inv}:a,c", tmp_path / "fleet")
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout)
    assert got["exit_status"] == 0 and sorted(got["runs"]) == ["a"] * 4 + ["c"] * 4, got   # 3 runs and the end


@pytest.mark.slow
def test_a_pair_killed_between_writing_a_baseline_and_printing_it_still_has_that_baseline_reported(
        tmp_path, fleet_files, tag):
    """The same for a baseline record (iperf3 on localhost): reported as a `baseline` event marked
    recovered, carrying the record as written; the pair ran no cell, so it reports no run."""
    import shutil

    if shutil.which("iperf3") is None:
        pytest.skip("iperf3 is not installed (scripts/install-system-deps installs it)")
    jsonschema = pytest.importorskip("jsonschema")
    _, inv = fleet_files
    exp = write(tmp_path / "exp-baseline.yaml",
                EXPERIMENT.replace("baselines: false", "baselines:\n  iperf3: {duration: 1s}"))
    out = tmp_path / "fleet"
    res = _run_script(tag, tmp_path, "kill_after_record.py", KILL_AFTER_RECORD, "baselines.jsonl", f"{inv}:c", "run",
                      exp, "--hosts", f"{inv}:a,c", "-o", out, "--json")
    assert res.returncode == 1, res.stderr[-3000:]
    events = [json.loads(line) for line in res.stdout.splitlines()]
    ends = {e["pair"]: e for e in events if e["event"] == "pair_end"}
    assert ends["a"]["status"] == "complete" and ends["c"]["status"] == "failed"
    assert "SIGKILL" in ends["c"]["reason"], ends["c"]
    written = [json.loads(line) for line in (out / "c" / "baselines.jsonl").read_text().splitlines()]
    assert len(written) == 1 and written[0]["kind"] == "iperf3"
    (recovered,) = [e for e in events if e["event"] == "baseline" and e["pair"] == "c"]
    assert recovered["recovered"] is True and recovered["record"] == written[0]
    assert not [e for e in events if e["event"] == "run" and e["pair"] == "c"]
    assert not any(e.get("recovered") for e in events if e.get("pair") == "a")
    schema = json.loads((ROOT / "docs" / "schemas" / "run-events.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    assert [e.message for e in validator.iter_errors(recovered)] == []


def test_plan_takes_a_fleet_and_estimates_it_from_the_pairs_that_take_turns(fleet_files, tag):
    exp, inv = fleet_files
    res = zcorch_cli("plan", exp, "--hosts", f"{inv}:all")
    assert res.returncode == 0, res.stderr
    for pair in "abc":
        assert f"== pair {pair}\n" in res.stdout
    # a and c are one machine (localhost): they take turns; b shares nothing with them
    assert "fleet of 3 pair(s): a, c share a host or a share and take turns run by run" in res.stdout, res.stdout
    each = [line for line in res.stdout.splitlines() if line.startswith("estimated duration")]
    assert len(each) == 3
    fleet = next(line for line in res.stdout.splitlines() if line.startswith("fleet estimated duration"))
    assert "(a, c set it)" in fleet
    runs = json.loads(zcorch_cli("plan", exp, "--hosts", f"{inv}:a,b", "--json").stdout)
    assert sorted(runs) == ["a", "b"] and runs["a"] == runs["b"] and len(runs["a"]) > 0
    unknown = zcorch_cli("plan", exp, "--hosts", f"{inv}:a,zz")
    assert unknown.returncode == 2 and "no pair `zz`" in unknown.stderr
