"""`zcorch run` as a user runs it (a subprocess) across the two-host lab, through real SSH: faults."""
import json
import os
import signal
import time

import pytest
import yaml

from fixtures_fs import SMALL_CONFIGS, host_state
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


# -- filesystems (issue 6) ------------------------------------------------------------------------
FS_CONFIGS = {name: SMALL_CONFIGS[name] for name in ("ext4-loop", "ext4-nodelalloc", "xfs-stripe", "btrfs-raid0")}


def fs_exp(tmp_path, lab, name="labfs", repeats=1):  # noqa: F811
    return write_exp(tmp_path, lab, name=name, params={"bytes": "4MiB", "timeout": "30s", "recv_mode": "read",
                                                       "send_mode": "write", "sink": "{filesystem}/recv.dat"},
                     matrix={"filesystem": list(FS_CONFIGS)}, filesystems=FS_CONFIGS, repeats=repeats,
                     order="interleave", baselines={"iperf3": False, "dd": {"bs": "64KiB", "count": 16}})


@pytest.fixture
def receiver(lab):  # noqa: F811
    h = lab.connect("receiver")
    yield h
    h.close()


def test_filesystem_sweep_across_the_lab(lab, receiver, tmp_path):  # noqa: F811
    before = host_state(receiver)
    out = tmp_path / "rs"
    t0 = time.monotonic()
    r = zcorch("lab", "run", fs_exp(tmp_path, lab), "-o", out, timeout=240)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    runs = read_jsonl(str(out / "runs.jsonl"))
    assert sorted(x["params"]["filesystem"] for x in runs) == sorted(FS_CONFIGS)
    assert all(x["status"] == "ok" and x["receiver"]["bytes"] == 4 << 20 for x in runs)
    assert all(x["receiver"]["params"]["sink"].startswith("/root/.cache/zcorch/fs/fs-") for x in runs)
    fs = json.loads((out / "meta.json").read_text())["filesystems"]
    assert {name: fs[name]["fstype"] for name in FS_CONFIGS} == {
        "ext4-loop": "ext4", "ext4-nodelalloc": "ext4", "xfs-stripe": "xfs", "btrfs-raid0": "btrfs"}
    assert "nodelalloc" in fs["ext4-nodelalloc"]["mount_options"]
    assert "nodelalloc" not in fs["ext4-loop"]["mount_options"] and "noatime" in fs["ext4-loop"]["mount_options"]
    assert fs["xfs-stripe"]["mkfs_options"] == ["-d", "su=64k,sw=4"]
    assert fs["btrfs-raid0"]["raid"] == "raid0" and fs["btrfs-raid0"]["raid_kernel"]["data"] == "raid0"
    assert len(fs["btrfs-raid0"]["devices"]) == 2 and len(fs["xfs-stripe"]["devices"]) == 1
    assert fs["xfs-stripe"]["loop"]["size_bytes"] == 520 << 20 and fs["xfs-stripe"]["size_bytes"] > 400 << 20
    assert "sunit=128" in fs["xfs-stripe"]["mount_options"]  # su=64k in 512-byte units: the stripe took
    dd = [b for b in read_jsonl(str(out / "baselines.jsonl")) if b["kind"] == "dd_write"]
    assert sorted(b["key"]["filesystem"] for b in dd) == sorted(FS_CONFIGS)
    assert all(b["status"] == "ok" for b in dd), dd
    assert host_state(receiver) == before
    assert lab_workers(lab) == []
    assert took < 60, f"the filesystem sweep took {took:.0f}s"


def test_killed_filesystem_sweep_is_undone_by_lab_down_cleanup_and_by_the_next_run(lab, receiver, tmp_path):  # noqa: F811,E501
    from zcorch.lab import NamespaceHost, _cleanup_filesystems

    before = host_state(receiver)
    exp = fs_exp(tmp_path, lab, repeats=2)

    def kill_mid_sweep(out):
        p = start_zcorch("lab", "run", exp, "-o", out)
        try:
            wait_records(out / "runs.jsonl", 2, timeout=120)  # two configurations mounted, more coming
        finally:
            p.kill()
            p.wait()
        assert wait_no_lab_workers(lab, 5.0) == []
        assert host_state(receiver) != before

    # What `zcorch lab down` does before destroying the hosts' namespaces (without destroying ours).
    kill_mid_sweep(tmp_path / "rs1")
    removed = {"filesystems": [], "filesystem_errors": []}
    _cleanup_filesystems(NamespaceHost("receiver", lab.sshd_pid("receiver")), removed)
    assert removed["filesystem_errors"] == [] and any("unmounted" in u for u in removed["filesystems"])
    assert host_state(receiver) == before
    # The next `zcorch run` (here a resume) undoes the leftovers first, then finishes the sweep.
    kill_mid_sweep(tmp_path / "rs2")
    r = zcorch("lab", "run", "--resume", tmp_path / "rs2", timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "undid a previous controller's leftover" in r.stderr
    assert all_ok_once(tmp_path / "rs2")
    assert host_state(receiver) == before
