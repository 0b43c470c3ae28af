"""`zcorch run` as a user runs it (a subprocess) across the two-host lab, through real SSH: faults."""
import json
import os
import signal
import time

import pytest
import yaml

from fixtures_lab import lab  # noqa: F401
from fixtures_run import stall_a_run, start_zcorch, wait_records, zcorch
from zcorch.results import latest_runs, read_jsonl

pytestmark = [pytest.mark.lab, pytest.mark.root, pytest.mark.timeout(300)]
NO_BASELINES = {"iperf3": False, "dd": False}


def write_exp(tmp_path, lab, name="labfault", hosts=None, **body):  # noqa: F811
    exp = {"name": name, "hosts": hosts or lab.hosts_spec, "params": {"bytes": "4MiB", "timeout": "30s"},
           "matrix": {"send_mode": ["write", "vmsplice"]}, "baselines": NO_BASELINES}
    exp.update(body)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


def lab_workers(lab):  # noqa: F811
    return lab.zcorch_procs("sender") + lab.zcorch_procs("receiver")


def wait_no_lab_workers(lab, within):  # noqa: F811
    deadline = time.monotonic() + within
    while True:
        left = lab_workers(lab)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def all_ok_once(out):
    runs = read_jsonl(str(out / "runs.jsonl"))
    plan = json.loads((out / "plan.json").read_text())
    ok = sorted((x["cell"], x["repeat"]) for x in runs if x["status"] == "ok")
    return ok == sorted((p["id"], p["repeat"]) for p in plan)


def test_sigkilled_controller_leaves_no_worker_and_resume_completes(lab, tmp_path):  # noqa: F811
    exp = write_exp(tmp_path, lab, params={"bytes": "256MiB", "timeout": "60s"}, repeats=3)
    out = tmp_path / "rs"
    p = start_zcorch("lab", "run", exp, "-o", out)
    try:
        wait_records(out / "runs.jsonl", 1, timeout=120)
        rx, tx = stall_a_run(lambda: lab_workers(lab))
        assert tx in lab.zcorch_procs("sender") and rx in lab.zcorch_procs("receiver")
        p.kill()
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
    # sshd sees the controller's connection drop and closes each worker's stdin: the blocked
    # sender ends within seconds (its --timeout is 60 s)...
    assert wait_no_lab_workers(lab, 5.0) == [rx]
    # ...and the stopped receiver as soon as it runs again.
    os.kill(rx, signal.SIGCONT)
    assert wait_no_lab_workers(lab, 5.0) == []
    before = read_jsonl(str(out / "runs.jsonl"))
    r = zcorch("lab", "run", "--resume", out, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert all_ok_once(out)
    assert read_jsonl(str(out / "runs.jsonl"))[:len(before)] == before
    assert lab_workers(lab) == []
