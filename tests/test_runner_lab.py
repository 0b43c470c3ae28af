"""The run stage across the two-host lab through real SSH (root: network namespaces + sshd)."""
import json
import os
import signal
import subprocess
import sys
import threading

import pytest
import yaml

from fixtures_run import REPO, base_params, new_resultset
from zcorch.results.store import read_jsonl
from zcorch.sweep.runner import Runner

pytestmark = [pytest.mark.lab, pytest.mark.root]


@pytest.fixture
def lab_runner(lab, tmp_path):  # noqa: F811
    from zcorch.provision import deploy
    from zcorch.hosts import ssh

    hosts = ssh.open_hosts(lab.hosts)
    handles = deploy.prepare(hosts)

    def make(rs, **kw):
        return Runner(hosts["sender"], hosts["receiver"], handles["sender"].worker_argv,
                      handles["receiver"].worker_argv, rs, worker_env={r: handles[r].env for r in handles}, **kw)

    yield make
    for h in hosts.values():
        h.close()
    assert lab.zcorch_procs("sender") == [] and lab.zcorch_procs("receiver") == []


def runs_of(params_list):
    return [{"id": f"c{i}", "repeat": 0, "params": p} for i, p in enumerate(params_list)]


def test_small_matrix_across_the_lab(lab, lab_runner, tmp_path):  # noqa: F811
    cells = [base_params(send_mode=s, source="/dev/zero" if s == "sendfile" else "mem", recv_mode=r)
             for s, r in (("write", "read"), ("sendfile", "splice"), ("vmsplice", "read"))]
    rs = new_resultset(tmp_path / "rs", runs_of(cells))
    outcome = lab_runner(rs).run_sweep(runs_of(cells))
    assert outcome.ok == 3, [r["reason"] for r in rs.runs()]
    for rec in rs.runs():
        assert rec["receiver"]["bytes"] == rec["params"]["bytes"]
        assert rec["receiver_host"] != rec["sender_host"]
        assert rec["sender"]["params"]["connect"].startswith(lab.receiver.data + ":")
    overheads = sorted(r["overhead_s"] for r in rs.runs())
    assert overheads[1] < 2.0  # generous: the machine is shared; the benchmark measures it properly


def test_stalled_and_killed_receiver_across_the_lab(lab, lab_runner, tmp_path):  # noqa: F811
    cells = [base_params(bytes=1 << 40, timeout=2.0), base_params(bytes=1 << 40, timeout=30.0), base_params()]
    rs = new_resultset(tmp_path / "rs", runs_of(cells))
    seen = []

    def on_event(name, **info):
        if name == "receiver_ready":
            seen.append(info["pid"])
            sig = signal.SIGSTOP if len(seen) == 1 else signal.SIGKILL
            if len(seen) <= 2:
                pid = info["pid"]
                threading.Timer(0.5, lambda: os.kill(pid, sig)).start()  # one pid namespace: the host's pid

    lab_runner(rs, on_event=on_event, margin=3.0).run_sweep(runs_of(cells))
    stalled, killed, fine = rs.runs()
    assert stalled["status"] == "timeout", stalled
    assert killed["status"] == "failed" and "receiver" in killed["reason"], killed
    assert fine["status"] == "ok"
    assert lab.zcorch_procs("receiver") == [] and lab.zcorch_procs("sender") == []


def test_zcorch_run_across_the_lab(lab, tmp_path):  # noqa: F811
    exp = {"name": "labrun", "hosts": lab.hosts_spec,
           "params": {"bytes": "4MiB", "timeout": "20s"},
           "matrix": {"send_mode": ["write", "vmsplice"]},
           "baselines": {"iperf3": {"duration": "1s"}, "dd": {"bs": "64KiB", "count": 16}}}
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(exp))
    r = subprocess.run([sys.executable, "-m", "zcorch", "run", str(path), "-o", str(tmp_path / "rs")],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    base = read_jsonl(str(tmp_path / "rs" / "baselines.jsonl"))
    iperf = [b for b in base if b["kind"] == "iperf3"]
    assert len(iperf) == 2 and all(b["status"] == "ok" for b in iperf), iperf
    assert all(b["argv"][2] == lab.receiver.data for b in iperf)
    meta = json.loads((tmp_path / "rs" / "meta.json").read_text())
    assert meta["hosts"]["receiver"]["interface"]["mtu"] == 9000
    assert lab.zcorch_procs("receiver") == [] and lab.zcorch_procs("sender") == []


def test_modern_modes_and_streams_across_the_lab(lab, lab_runner, tmp_path):  # noqa: F811
    # Across the lab's MTU-9000 veth: the worker built on the hosts (with their kernel headers) runs
    # the io_uring modes and parallel streams; zerocopy_recv sizes its segments to whole pages for that
    # MTU itself (8192 payload bytes); meta.json says the veth could not do io_uring zcrx.
    from zcorch.hosts import ssh
    from zcorch.provision import deploy
    from zcorch.provision.remote_call import host_python
    from zcorch.sweep import metadata

    hosts = ssh.open_hosts(lab.hosts)
    try:
        handle = deploy.prepare(hosts)["receiver"]
        info = json.loads(hosts["receiver"].run(handle.command(["info"]), timeout=60).stdout.splitlines()[-1])
        meta = metadata.collect_host(hosts["receiver"], host_python(hosts["receiver"]))
    finally:
        for h in hosts.values():
            h.close()
    iface = lab.data_interface("receiver")
    assert meta["zcrx"][iface]["kind"] == "veth" and meta["zcrx"][iface]["possible"] is False
    wanted = [("io_uring", "io_uring", 2), ("io_uring_zc", "zerocopy_recv", 1), ("msg_zerocopy", "zerocopy_recv", 1),
              ("write", "read", 4)]
    cells = [base_params(send_mode=s, recv_mode=r, streams=n, bytes=8 * 2**20 + 3) for s, r, n in wanted
             if s not in info["unavailable"]["send"] and r not in info["unavailable"]["recv"]]
    rs = new_resultset(tmp_path / "rs", runs_of(cells))
    outcome = lab_runner(rs).run_sweep(runs_of(cells))
    assert outcome.ok == len(cells), [r["reason"] for r in rs.runs()]
    for rec in rs.runs():
        assert rec["receiver"]["bytes"] == rec["params"]["bytes"]
        if rec["params"]["streams"] > 1:
            assert len(rec["receiver"]["streams"]) == rec["params"]["streams"]
        if rec["params"]["recv_mode"] == "zerocopy_recv":
            got = rec["receiver"]
            assert got["tcp_rcv_mss"] % 4096 == 0 and got["tcp_pmtu"] == 9000
            assert got["zc_recv_mapped"] + got["zc_recv_copied"] == got["bytes"]
            # a zero-copy sender's data reaches the other namespace in pages the kernel allocated: mapped
            assert got["zc_recv_mapped"] > got["bytes"] // 2, got
