"""A fleet run on real SSH hosts: four labs (network namespaces with their own sshd, as `zcorch lab up --name
NAME --index N` makes them) on this machine form four pairs in one inventory, and `zcorch run EXP --hosts INV:all`
runs them at once.

    p1  lab a: sender -> receiver
    p2  lab b's sender -> lab a's receiver   shares lab a's receiver with p1 (over a real veth link between the
                                             two namespaces, MTU 9000 as a lab's own data link: two labs' hosts
                                             have no data link between them otherwise)
    p3  lab c: sender -> receiver      `shares: uplink`
    p4  lab d: sender -> receiver      `shares: uplink`, its data link really slowed by `tc ... tbf`

What must hold: p1 and p2 never run cells at the same time, nor p3 and p4 (the run records' start and end
times never overlap); a pair SIGKILLed mid-run fails alone (the others complete) and `--resume` of the fleet
completes it; every pair's result set is then complete; `zcorch compare FLEET` names p4 as the pair that
differs, in which cells and by how much (exit 1, as a regression across nights); `zcorch export FLEET DEST`
writes the four pairs' sets as one dataset that DuckDB and pandas.read_parquet read with its partitions. Transfers
are 4 MiB: this tests the orchestration, not the bandwidth.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import duckdb
import pandas as pd
import pytest
import yaml

from fixtures_lab import seed_worker_build, start_lab
from fixtures_run import start_zcorch, zcorch
from test_fleet import overlaps, run_intervals
from zcorch.errors import LabError
from zcorch.lab import netns as zlab
from zcorch.results.store import latest_runs, read_jsonl

pytestmark = [pytest.mark.lab, pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(1500)]

EXPERIMENT = """\
name: fleetlab
hosts: inventory
params: {bytes: 4MiB, source: mem, sink: /dev/null, timeout: 30s}
matrix:
  send_mode: [write, vmsplice]
  recv_mode: [read]
repeats: 3
baselines: {iperf3: {duration: 1s}, dd: false}   # small: the share lock holds it too
"""
_STALE = re.compile(r"flt(\d+)[abcd]")


def _remove_stale_fleet_labs() -> None:
    """Labs of a session that died before its teardown (its pid is gone)."""
    names = set(os.listdir(zlab.STATE_ROOT)) if os.path.isdir(zlab.STATE_ROOT) else set()
    for name in names:
        m = _STALE.fullmatch(name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            try:
                zlab.down(zlab.LabLayout(name, zlab._index_from_state(name, None)))
            except LabError:
                pass


@pytest.fixture(scope="module")
def labs():
    if os.geteuid() != 0:
        pytest.skip("the labs need root (network namespaces, sshd)")
    if not os.access(zlab.SSHD, os.X_OK):
        pytest.skip("sshd not installed (scripts/install-system-deps installs openssh-server)")
    _remove_stale_fleet_labs()
    layouts = []
    try:
        for suffix in "abcd":   # names from our pid: other sessions' labs never collide; indexes are found free
            layouts.append(start_lab(f"flt{os.getpid()}{suffix}"))
            seed_worker_build(layouts[-1])
        a, b = layouts[:2]
        cross = _link(b, "sender", a, "receiver", f"10.79.{a.index}")   # p2's data link; it dies with the labs
        yield layouts, cross
    finally:
        for layout in layouts:
            zlab.down(layout)


def _in_netns(layout, role, argv):
    return subprocess.run(["ip", "netns", "exec", layout.ns(role), *argv], capture_output=True, text=True,
                          check=True, timeout=30)


def _link(one, one_role, other, other_role, net: str) -> "tuple[str, str]":
    """A veth data link between a host of one lab and a host of another (NET.2 and NET.3, MTU 9000): their
    data addresses. Both ends live in the labs' namespaces, so the labs' `down` removes it."""
    ends = [f"zfx{os.getpid() % 100000}{x}" for x in "sr"]
    subprocess.run(["ip", "link", "add", ends[0], "type", "veth", "peer", "name", ends[1]], check=True,
                   capture_output=True, timeout=30)
    try:
        for end, layout, role, host in ((ends[0], one, one_role, 2), (ends[1], other, other_role, 3)):
            subprocess.run(["ip", "link", "set", end, "netns", layout.ns(role)], check=True, capture_output=True,
                           timeout=30)
            _in_netns(layout, role, ["ip", "addr", "add", f"{net}.{host}/24", "dev", end])
            _in_netns(layout, role, ["ip", "link", "set", end, "mtu", "9000", "up"])
    except BaseException:
        for end in ends:   # what is still in this namespace
            subprocess.run(["ip", "link", "del", end], capture_output=True, timeout=30)
        raise
    return f"{net}.2", f"{net}.3"


def _inventory(labs, cross) -> dict:
    a, b, c, d = (layout.hosts_spec() for layout in labs)
    return {"pairs": {"p1": {"sender": a["sender"], "receiver": a["receiver"]},
                      "p2": {"sender": dict(b["sender"], data_address=cross[0]),
                             "receiver": dict(a["receiver"], data_address=cross[1])},
                      "p3": {"sender": c["sender"], "receiver": c["receiver"], "shares": "uplink"},
                      "p4": {"sender": d["sender"], "receiver": d["receiver"], "shares": ["uplink"]}}}


def _pair_pid(fleet_dir, pair: str, within: float = 120) -> int:
    """The pid of the pair's sweep, as fleet.json records it once the fleet started its pairs."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            doc = json.loads((fleet_dir / "fleet.json").read_text())
            pid = next(p["pid"] for p in doc["pairs"] if p["pair"] == pair)
            if pid:
                return pid
        except (OSError, ValueError, StopIteration):
            pass
        time.sleep(0.05)
    raise AssertionError(f"fleet.json names no process of {pair}")


def _complete(pair_dir) -> bool:
    plan = json.loads((pair_dir / "plan.json").read_text())
    latest = latest_runs(read_jsonl(str(pair_dir / "runs.jsonl")))
    return all(latest.get((r["id"], r["repeat"]), {}).get("status") == "ok" for r in plan)


def test_four_labs_four_pairs_exclusions_a_killed_pair_resumed_the_odd_pair_named_and_exported(labs, tmp_path,
                                                                                                 tag):
    labs, cross = labs
    inv = tmp_path / "lab.yaml"
    inv.write_text(yaml.safe_dump(_inventory(labs, cross), sort_keys=False))
    exp = tmp_path / "exp.yaml"
    exp.write_text(EXPERIMENT)
    out = tmp_path / "fleet"
    slow = labs[3]   # p4's data link: a real, identical-parameters slowdown (data flows sender -> receiver)
    _in_netns(slow, "sender", ["tc", "qdisc", "add", "dev", "data0", "root", "tbf", "rate", "100mbit",
                               "burst", "256kb", "latency", "50ms"])

    fleet = start_zcorch(tag, "run", exp, "--hosts", f"{inv}:all", "-o", out, "--json")
    try:
        # SIGKILL p3's sweep once it has recorded a run: it fails alone, the other pairs go on
        victim = _pair_pid(out, "p3")
        records = out / "p3" / "runs.jsonl"
        deadline = time.monotonic() + 600
        while not (records.is_file() and read_jsonl(str(records))):
            assert time.monotonic() < deadline and fleet.poll() is None, "p3 recorded no run"
            time.sleep(0.05)
        os.kill(victim, signal.SIGKILL)
        stdout, stderr = fleet.communicate(timeout=900)
    finally:
        if fleet.poll() is None:
            fleet.kill()
    assert fleet.returncode == 1, stderr[-4000:]
    events = [json.loads(line) for line in stdout.splitlines()]
    ends = {e["pair"]: e for e in events if e["event"] == "pair_end"}
    assert ends["p3"]["status"] == "failed" and "SIGKILL" in ends["p3"]["reason"], ends["p3"]
    assert all(ends[p]["status"] == "complete" for p in ("p1", "p2", "p4")), ends
    assert {e["pair"] for e in events if e["event"] == "run"} == {"p1", "p2", "p3", "p4"}
    # every run p3 recorded before the kill was reported (the kill may land between a record and its event:
    # the fleet then reports it as `recovered`), and no other
    assert {(e["cell"], e["repeat"], e["started"]) for e in events if e["event"] == "run" and e["pair"] == "p3"} \
        == {(r["cell"], r["repeat"], r["started"]) for r in read_jsonl(str(records))}
    doc = json.loads((out / "fleet.json").read_text())
    assert doc["exclusions"]["shares"] == {"uplink": ["p3", "p4"]}
    assert doc["exclusions"]["hosts"] == {f"{labs[0].mgmt_address('receiver')}:22": ["p1", "p2"]}   # lab a's receiver
    assert not _complete(out / "p3")
    # remote pairs: each complete pair's runs.parquet written by the fleet as its sweep ended
    assert all((out / p / "runs.parquet").is_file() for p in ("p1", "p2", "p4"))

    again = zcorch(tag, "run", "--resume", out, timeout=900)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "fleet of 4 pair(s) resumed: p3" in again.stderr
    doc = json.loads((out / "fleet.json").read_text())
    assert doc["status"] == "complete" and {p["status"] for p in doc["pairs"]} == {"complete"}
    for pair in ("p1", "p2", "p3", "p4"):
        assert json.loads((out / pair / "manifest.json").read_text())["status"] == "complete"
        assert _complete(out / pair), pair
    # the exclusions held, over both invocations: not one moment where both pairs of a shared host or of
    # the shared uplink ran a cell
    assert overlaps(run_intervals(out / "p1"), run_intervals(out / "p2")) == []
    assert overlaps(run_intervals(out / "p3"), run_intervals(out / "p4")) == []
    for layout in labs:
        assert zlab.netns_pids(layout.ns("sender")) and zlab.netns_pids(layout.ns("receiver"))  # sshd still up

    # which pair is different: p4, in every cell, by far (statistics and exit codes of compare)
    cmp = zcorch(tag, "compare", out, "--format", "json")
    assert cmp.returncode == 1, cmp.stdout + cmp.stderr
    verdict = json.loads(cmp.stdout)
    p4 = next(p for p in verdict["pairs"] if p["pair"] == "p4")
    assert p4["reference"] == "the other pairs (p1, p2, p3)" and p4["exit_code"] == 1
    assert len(p4["differing"]) == 2 and all(c["verdict"] == "regressed" and c["change_pct"] < -30
                                             for c in p4["differing"]), p4["differing"]
    assert "pair p4 is worse than the other pairs" in verdict["reason"]
    text = zcorch(tag, "compare", out)
    assert "pair p4 differs from the other pairs (p1, p2, p3) in 2 cell(s)" in text.stdout

    # the dataset: the four pairs' sets, read without zcorch by DuckDB and by pandas with the partitions
    dest = tmp_path / "dataset"
    exported = zcorch(tag, "export", out, dest)
    assert exported.returncode == 0, exported.stderr
    assert "4 result set(s) exported" in exported.stdout
    con = duckdb.connect()
    per_pair = con.execute("SELECT pair, experiment, count(DISTINCT cell || ':' || CAST(repeat AS VARCHAR)) "
                           f"FROM read_parquet('{dest}/runs/**/*.parquet', hive_partitioning = true) "
                           "WHERE status = 'ok' GROUP BY ALL ORDER BY pair").fetchall()
    assert [(p.split()[0], e, n) for p, e, n in per_pair] == [(p, "fleetlab", 6) for p in ("p1", "p2", "p3", "p4")]
    sets = con.execute(f"SELECT status, planned, planned_ok FROM read_parquet('{dest}/sets/**/*.parquet', "
                       "hive_partitioning = true)").fetchall()
    assert sets == [("complete", 6, 6)] * 4
    frame = pd.read_parquet(dest / "runs")   # pyarrow's hive discovery: experiment= and date= become columns
    assert {"experiment", "date", "pair", "kernel", "revision", "cell", "gbit_s"} <= set(frame.columns)
    assert set(frame["experiment"].astype(str)) == {"fleetlab"} and frame["date"].notna().all()
    assert {p.split()[0] for p in frame["pair"]} == {"p1", "p2", "p3", "p4"}
    iperf = pd.read_parquet(dest / "baselines")
    assert {p.split()[0] for p in iperf.loc[iperf["kind"] == "iperf3", "pair"]} == {"p1", "p2", "p3", "p4"}
