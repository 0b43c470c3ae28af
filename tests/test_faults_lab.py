"""Fault corpus on the two-host lab (real sshd, real workers, `zcorch run` as a user runs it): a dropped
SSH connection, a full disk on the receiver and on the controller. Every fault ends with nothing lost and
`zcorch run --resume` completing each run exactly once."""
import json
import os
import signal
import subprocess
from collections import Counter

import pytest
import yaml

from fixtures_fs import fill_disk
from fixtures_run import poll_until_empty, stall_a_run, start_zcorch, zcorch, wait_records
from zcorch.results.store import latest_runs, read_jsonl

pytestmark = [pytest.mark.lab, pytest.mark.root, pytest.mark.timeout(300)]


def write_exp(tmp_path, lab, **body):
    exp = {"name": "faults", "hosts": lab.hosts_spec, "params": {"bytes": "256MiB", "timeout": "60s"},
           "matrix": {"send_mode": ["write", "vmsplice"]}, "repeats": 2,
           "baselines": {"iperf3": False, "dd": False}}
    exp.update(body)
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


def lab_workers(lab):
    return lab.zcorch_procs("sender") + lab.zcorch_procs("receiver")


def session_sshds(lab, host):
    """The per-connection sshd processes of `host` (every sshd there but the listener)."""
    listener, found = lab.sshd_pid(host), []
    for pid in lab.pids_in(host):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(b"sshd") and pid != listener:
                    found.append(pid)
        except OSError:
            pass
    return found


def each_run_ok_once(out):
    """Exactly one ok record per planned (cell, repeat), and each one's newest record is that ok."""
    runs = read_jsonl(str(out / "runs.jsonl"))
    plan = [(p["id"], p["repeat"]) for p in json.loads((out / "plan.json").read_text())]
    ok = Counter((r["cell"], r["repeat"]) for r in runs if r["status"] == "ok")
    latest = latest_runs(runs)
    return ok == Counter(plan) and all(latest[k]["status"] == "ok" for k in plan)


def test_dropped_receiver_connection_stops_the_sweep_and_resume_completes(lab, tmp_path):
    exp = write_exp(tmp_path, lab)
    out = tmp_path / "rs"
    p = start_zcorch("lab", "run", exp, "-o", out)
    try:
        wait_records(out / "runs.jsonl", 1, timeout=120)
        rx, _ = stall_a_run(lambda: lab_workers(lab))   # a run in progress that cannot end by itself
        sessions = session_sshds(lab, "receiver")
        assert sessions
        for pid in sessions:   # the controller's SSH connection to the receiver drops
            os.kill(pid, signal.SIGKILL)
        try:   # the receiver's worker server, its stdin gone with the connection, SIGKILLs its runs
            os.kill(rx, signal.SIGCONT)
        except ProcessLookupError:
            pass
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 1, err
    assert "Traceback" not in err
    assert f"zcorch run --resume {out}" in err and "receiver" in err
    runs = read_jsonl(str(out / "runs.jsonl"))
    assert runs[0]["status"] == "ok" and runs[-1]["status"] == "failed", runs[-1]
    assert "receiver (" in runs[-1]["reason"] and "connection lost" in runs[-1]["reason"], runs[-1]  # why
    assert len(runs) < 4   # it stopped: not every run left recorded failed in turn
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["error"]["type"] == "HostError", manifest
    assert poll_until_empty(lambda: lab_workers(lab), 10.0, interval=0.1) == []

    before = read_jsonl(str(out / "runs.jsonl"))
    r = zcorch("lab", "run", "--resume", out, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    after = read_jsonl(str(out / "runs.jsonl"))
    assert after[:len(before)] == before   # the failed record stays as history
    assert each_run_ok_once(out)
    assert lab_workers(lab) == []


def test_full_sink_disk_on_the_receiver_fails_its_runs_and_the_sweep_goes_on(lab, tmp_path):
    full = "/scratch/zc-full"   # a tiny tmpfs in the receiver's own mount namespace: a real ENOSPC
    assert lab.run_in("receiver", ["mkdir", "-p", full]).returncode == 0
    mounted = lab.run_in("receiver", ["mount", "-t", "tmpfs", "-o", "size=1m", "zc-full", full])
    assert mounted.returncode == 0, mounted.stderr
    try:
        exp = write_exp(tmp_path, lab, params={"bytes": "16MiB", "timeout": "30s", "send_mode": "write"},
                        matrix={"sink": [f"{full}/recv.dat", "/dev/null"]}, order="interleave")
        out = tmp_path / "rs"
        r = zcorch("lab", "run", exp, "-o", out, timeout=240)
    finally:
        lab.run_in("receiver", ["umount", full])
        lab.run_in("receiver", ["rmdir", full])
    assert r.returncode == 1, r.stdout + r.stderr   # some runs failed, none lost
    runs = read_jsonl(str(out / "runs.jsonl"))
    assert len(runs) == 4   # the sweep went on after each full-disk failure
    for rec in runs:
        if rec["params"]["sink"] == "/dev/null":
            assert rec["status"] == "ok", rec
        else:
            assert rec["status"] == "failed" and "ENOSPC" in rec["reason"], rec
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    assert lab_workers(lab) == []


def test_full_result_disk_on_the_controller_stops_with_a_results_error_and_resume_completes(lab, tmp_path):
    out = tmp_path / "rs"
    out.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "zc-results", str(out)], check=True)
    try:
        exp = write_exp(tmp_path, lab, repeats=3)
        p = start_zcorch("lab", "run", exp, "-o", out)
        try:
            wait_records(out / "runs.jsonl", 1, timeout=120)
            filler = fill_disk(str(out))   # the disk fills up while the sweep runs
            _, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 1, err
        assert "Traceback" not in err
        assert "cannot write a record (the disk is full)" in err and f"zcorch run --resume {out}" in err, err
        runs = read_jsonl(str(out / "runs.jsonl"))   # parseable: no torn line left behind
        assert 1 <= len(runs) < 6 and (out / "runs.jsonl").read_bytes().endswith(b"\n")
        assert not [n for n in os.listdir(out) if ".tmp" in n]   # no half-written manifest left behind
        assert poll_until_empty(lambda: lab_workers(lab), 10.0, interval=0.1) == []

        os.unlink(filler)   # space freed: the sweep can go on
        r = zcorch("lab", "run", "--resume", out, timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        assert read_jsonl(str(out / "runs.jsonl"))[:len(runs)] == runs
        assert each_run_ok_once(out)
        assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    finally:
        subprocess.run(["umount", "-l", str(out)])
