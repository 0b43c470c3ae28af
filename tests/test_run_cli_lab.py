"""`zcorch run` as a user runs it (a subprocess) across the two-host lab, through real SSH: faults."""
import json
import os
import signal
import time

import pytest
import yaml

from fixtures_fs import SMALL_CONFIGS, host_state
from fixtures_run import REPO, kill_watchdogs, poll_until_empty, stall_a_run, start_zcorch, wait_records, zcorch
from zcorch.results.store import read_jsonl

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
    return poll_until_empty(lambda: lab_workers(lab), within, interval=0.05)


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
    # sshd sees the controller's connection drop and closes each worker server's stdin: the servers end
    # within seconds with every run they serve (the runs' --timeout is 60 s), the blocked sender and the
    # stopped receiver alike (a server SIGKILLs its runs' process groups).
    assert wait_no_lab_workers(lab, 5.0) == []
    before = read_jsonl(str(out / "runs.jsonl"))
    r = zcorch("lab", "run", "--resume", out, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert all_ok_once(out)
    assert read_jsonl(str(out / "runs.jsonl"))[:len(before)] == before
    assert lab_workers(lab) == []


# -- filesystems --------------------------------------------------------------------------------
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
    from zcorch.lab.netns import NamespaceHost, _cleanup_filesystems

    before = host_state(receiver)
    exp = fs_exp(tmp_path, lab, repeats=2)

    def kill_mid_sweep(out):
        p = start_zcorch("lab", "run", exp, "-o", out)
        try:
            wait_records(out / "runs.jsonl", 2, timeout=120)  # two configurations mounted, more coming
            # the receiver's watchdog dies too (else it undoes all at once): what is left is the stale cleanup's
            kill_watchdogs(lab.pids_in("receiver"))
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


def test_ctrl_c_mid_filesystem_sweep_tears_down_and_still_describes_what_was_provisioned(lab, receiver, tmp_path):  # noqa: F811,E501
    before = host_state(receiver)
    # Ctrl-C at several moments after the second run: the third configuration is being made (truncate,
    # losetup, mkfs, mount): whichever command is in flight ends first, and the teardown undoes all of it.
    # A Ctrl-C that cut `mount` short left it mounted once, and the next sweep refused to start.
    for i, delay in enumerate((0.0, 0.3, 0.8)):
        out = tmp_path / f"rs{i}"
        p = start_zcorch("lab", "run", fs_exp(tmp_path, lab, repeats=2), "-o", out)
        wait_records(out / "runs.jsonl", 2, timeout=120)  # interleaved: two configurations mounted, more coming
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
        assert p.returncode == 130, err
        assert host_state(receiver) == before, err  # torn down on Ctrl-C, not only at the end of a sweep
        assert "teardown incomplete" not in err, err
        used = {x["params"]["filesystem"] for x in read_jsonl(str(out / "runs.jsonl")) if x["status"] == "ok"}
        fs = json.loads((out / "meta.json").read_text())["filesystems"]
        assert used and all(fs[name].get("fstype") in ("ext4", "xfs", "btrfs") for name in used), fs
        assert wait_no_lab_workers(lab, 5.0) == []


# -- faults through `zcorch run` --------------------------------------------------------------------
def test_killed_sender_is_recorded_and_the_sweep_goes_on(lab, tmp_path):  # noqa: F811
    exp = write_exp(tmp_path, lab, params={"bytes": "256MiB", "timeout": "30s"})
    out = tmp_path / "rs"
    p = start_zcorch("lab", "run", exp, "-o", out)
    deadline = time.monotonic() + 120   # the set-up before the first run (leases, deploy, calibration) varies with load
    while len(lab_workers(lab)) < 2 and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    rx, tx = stall_a_run(lambda: lab_workers(lab))
    os.kill(tx, signal.SIGKILL)  # the sender dies mid-transfer; the receiver (stopped) cannot finish
    os.kill(rx, signal.SIGCONT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1, err
    first, second = read_jsonl(str(out / "runs.jsonl"))
    assert first["status"] == "failed" and "sender on sender" in first["reason"], first
    assert "killed by SIGKILL" in first["reason"] or "ENODATA" in first["reason"] or "ECONNRESET" in first["reason"]
    assert second["status"] == "ok"
    assert lab_workers(lab) == []


def test_ctrl_c_mid_sweep_keeps_finished_runs_and_leaves_no_worker(lab, tmp_path):  # noqa: F811
    exp = write_exp(tmp_path, lab, params={"bytes": "256MiB", "timeout": "60s"}, repeats=4)
    out = tmp_path / "rs"
    p = start_zcorch("lab", "run", exp, "-o", out)
    wait_records(out / "runs.jsonl", 1, timeout=120)
    stall_a_run(lambda: lab_workers(lab))  # a run in progress that cannot end by itself
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"
    runs = read_jsonl(str(out / "runs.jsonl"))
    assert runs[0]["status"] == "ok" and runs[-1]["status"] == "interrupted" and len(runs) < 8
    assert "--resume" in err
    assert wait_no_lab_workers(lab, 3.0) == []


def test_unknown_host_keys_refused_then_accepted_and_recorded(lab, tmp_path):  # noqa: F811
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    known = tmp_path / "known_hosts"
    known.write_text("")
    hosts = lab.hosts_spec
    for spec in hosts.values():
        del spec["ssh_config"]  # its UserKnownHostsFile knows the lab's keys
        spec["known_hosts"] = str(known)
    exp = write_exp(tmp_path, lab, hosts=hosts)
    env = {"HOME": str(home)}
    r = zcorch("lab", "run", exp, "-o", tmp_path / "refused", env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.count("unknown host key") == 2 and "--accept-new-host-keys" in r.stderr, r.stderr
    assert known.read_text() == ""
    r = zcorch("lab", "run", exp, "-o", tmp_path / "accepted", "--accept-new-host-keys", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((tmp_path / "accepted" / "manifest.json").read_text())["accept_new_host_keys"] is True
    assert sorted(line.split()[0] for line in known.read_text().splitlines()) == sorted(
        [lab.sender.mgmt, lab.receiver.mgmt])


def test_failing_remote_build_fails_the_run_with_host_and_compiler_output(lab, tmp_path):  # noqa: F811
    import uuid

    # A real build with a broken C compiler: `python:` is a wrapper that sets CC for the build.
    home = lab.receiver.home
    with open(os.path.join(home, "broken-cc"), "w") as f:
        f.write("#!/bin/sh\necho \"broken-cc: error: this compiler refuses $*\" >&2\nexit 1\n")
    with open(os.path.join(home, "python-broken-cc"), "w") as f:
        f.write("#!/bin/sh\nCC=/root/broken-cc exec python3 \"$@\"\n")
    for name in ("broken-cc", "python-broken-cc"):
        os.chmod(os.path.join(home, name), 0o755)
    hosts = lab.hosts_spec
    hosts["receiver"].update(python="/root/python-broken-cc", workdir=f"~/.cache/zcorch-broken-{uuid.uuid4().hex[:8]}")
    r = zcorch("lab", "run", write_exp(tmp_path, lab, hosts=hosts), "-o", tmp_path / "rs", timeout=240)
    # The remote build's own output (with cffi's traceback) is shown; no traceback of the controller.
    assert r.returncode == 1 and REPO not in r.stderr
    assert f"receiver (root@{lab.receiver.mgmt})" in r.stderr and "building the worker failed" in r.stderr
    assert "broken-cc: error: this compiler refuses" in r.stderr, r.stderr
    assert json.loads((tmp_path / "rs" / "manifest.json").read_text())["status"] == "interrupted"
    assert lab_workers(lab) == []


def test_scratch_resolves_to_each_hosts_own_home_inside_its_mount_namespace(lab, tmp_path):  # noqa: F811
    sub = f"t-{os.getpid()}-{int(time.time() * 1000)}"
    exp = write_exp(tmp_path, lab, name="labscratch",
                    params={"bytes": "4MiB", "timeout": "30s", "send_mode": "sendfile",
                            "source": f"{{scratch}}/{sub}/src.dat"},
                    matrix={"recv_mode": ["mmap"], "sink": [f"{{scratch}}/{sub}/recv.dat"]},
                    include=[{"recv_mode": "read", "sink": "/dev/null"}],
                    baselines={"iperf3": False, "dd": {"bs": "64KiB", "count": 16, "scratch": "{scratch}"}})
    out = tmp_path / "rs"
    r = zcorch("lab", "run", exp, "-o", out, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    meta = json.loads((out / "meta.json").read_text())
    # Each host's ~ is its own /root (a private mount in its namespace), seen over SSH as /root.
    assert meta["hosts"]["sender"]["scratch"] == meta["hosts"]["receiver"]["scratch"] == "/root/.cache/zcorch/scratch"
    rx_scratch = os.path.join(lab.receiver.home, ".cache", "zcorch", "scratch")
    tx_scratch = os.path.join(lab.sender.home, ".cache", "zcorch", "scratch")
    assert os.stat(rx_scratch).st_mode & 0o777 == 0o700 and os.stat(tx_scratch).st_mode & 0o777 == 0o700
    assert os.path.getsize(os.path.join(rx_scratch, sub, "recv.dat")) == 4 << 20
    assert os.path.getsize(os.path.join(tx_scratch, sub, "src.dat")) == 4 << 20
    assert not os.path.exists(os.path.join(tx_scratch, sub, "recv.dat"))
    assert not os.path.exists(os.path.join(rx_scratch, sub, "src.dat"))
    assert not os.path.exists(os.path.join(os.path.expanduser("~"), ".cache", "zcorch", "scratch", sub))
    assert meta["sources_laid_out"] == [{"host": "sender", "path": f"/root/.cache/zcorch/scratch/{sub}/src.dat",
                                         "size": 4 << 20}]
    runs = read_jsonl(str(out / "runs.jsonl"))
    assert [x["status"] for x in runs] == ["ok", "ok"]
    mmap = next(x for x in runs if x["params"]["recv_mode"] == "mmap")
    assert mmap["params"]["sink"] == f"{{scratch}}/{sub}/recv.dat"
    assert mmap["receiver"]["params"]["sink"] == f"/root/.cache/zcorch/scratch/{sub}/recv.dat"
    dd = [b for b in read_jsonl(str(out / "baselines.jsonl")) if b["kind"].startswith("dd_")]
    assert [b["status"] for b in dd] == ["ok"] * 4, dd
    # dd in the sink's directory and in the /dev/null cell's scratch: keys as written, directories resolved.
    assert {(b["key"]["directory"], b["directory"]) for b in dd} == {
        (f"{{scratch}}/{sub}", f"/root/.cache/zcorch/scratch/{sub}"), ("{scratch}", "/root/.cache/zcorch/scratch")}
    assert lab_workers(lab) == []


# -- back-to-back sweeps -------------------------------------------------------------------------
def test_a_second_sweep_right_after_the_first_runs(lab, tmp_path):  # noqa: F811
    """Nightly jobs run experiment files in a row: the first sweep's iperf3 server leaves port 5201 in
    TIME_WAIT on the receiver, and the next sweep's preflight must not take that for a listener."""
    exp = write_exp(tmp_path, lab, name="b2b", matrix={"send_mode": ["write"]},
                    baselines={"iperf3": {"duration": "1s", "per": "sweep"}, "dd": False})
    for out in (tmp_path / "first", tmp_path / "second"):
        r = zcorch("lab", "run", exp, "-o", out, timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        assert all_ok_once(out)


# -- one sweep per receiver -----------------------------------------------------------------------
def test_a_sweep_on_a_receiver_another_controller_holds_is_refused(lab, receiver, tmp_path):  # noqa: F811
    """This test process is the other controller: it holds the receiver's lease over its own SSH
    connection, as a running sweep does."""
    from zcorch.lab.netns import FS_STATE_DIR
    from zcorch.provision.fs_state import Lease

    before = host_state(receiver)
    exp = fs_exp(tmp_path, lab, name="busy")
    lease = Lease.take(receiver, receiver.expand(FS_STATE_DIR))
    try:
        r = zcorch("lab", "run", exp, "-o", tmp_path / "a", timeout=240)
        assert r.returncode != 0 and "another sweep holds this receiver's filesystems" in r.stderr, r.stderr
        assert '"user": "root"' in r.stderr and f'"pid": {os.getpid()}' in r.stderr
        assert host_state(receiver) == before
    finally:
        lease.release()
    r = zcorch("lab", "run", exp, "-o", tmp_path / "b", timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert all_ok_once(tmp_path / "b") and host_state(receiver) == before
