"""Network configurations across the two-host lab (real veth, real sysctls of each host's namespace): applied
per group, recorded per run, restored after the sweep, after a configuration that fails half-way, after a
failed cell, and after a SIGKILLed controller (by the next run and by what `zcorch lab down` does)."""
import json
import os

import pytest
import yaml

from fixtures_run import kill_watchdogs, start_zcorch, wait_records
from zcorch.results.store import read_jsonl
from zcorch.sweep.pipeline import run_sweep

pytestmark = [pytest.mark.lab, pytest.mark.root, pytest.mark.timeout(300)]
RMEM = "net.ipv4.tcp_rmem"
CC = "net.ipv4.tcp_congestion_control"
with open("/proc/sys/net/ipv4/tcp_allowed_congestion_control") as _f:
    # What a network namespace may choose (the kernel says EPERM to others there): reno always, and another.
    OTHER_CC = next((c for c in _f.read().split() if c != "reno"), "reno")
NETWORKS = {"small": {"mtu": 1400, "congestion": "reno"},
            "mid": {"mtu": 4000, "congestion": OTHER_CC, "sysctls": {RMEM: "4096 65536 1048576"}},
            # a real half-way failure: the MTU is set, then the kernel refuses the congestion control
            "broken": {"mtu": 1300, "sysctls": {CC: "nosuchcc"}}}


def host_net(lab, role):
    """(data0 MTU, congestion control, tcp_rmem, state files) as the host sees them."""
    dev = lab.data_interface(role)
    mtu = int(lab.run_in(role, ["cat", f"/sys/class/net/{dev}/mtu"], check=True).stdout)
    cc = lab.run_in(role, ["cat", "/proc/sys/net/ipv4/tcp_congestion_control"], check=True).stdout.strip()
    rmem = " ".join(lab.run_in(role, ["cat", "/proc/sys/net/ipv4/tcp_rmem"], check=True).stdout.split())
    # the state files: root's host-wide one of this namespace (not its lease), and any in the workdir
    state = lab.run_in(role, ["sh", "-c", "ls /run/zcorch/zcorch-net-$(stat -L -c %i /proc/self/ns/net).json "
                                          "/root/.cache/zcorch/net/zcorch-net-*.json 2>/dev/null || true"]).stdout.split()
    return mtu, cc, rmem, state


def write_exp(tmp_path, lab, name, matrix, **body):
    exp = {"name": name, "hosts": lab.hosts_spec, "networks": NETWORKS,
           "params": {"bytes": "8MiB", "timeout": "30s"}, "matrix": matrix,
           "baselines": {"iperf3": False, "dd": False}, **body}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


def test_two_networks_recorded_per_run_and_restored_also_after_failures(lab, tmp_path):
    before = {r: host_net(lab, r) for r in ("sender", "receiver")}
    assert before["sender"][3] == [] and before["sender"][0] == 9000   # the lab's data link as `up` made it
    # send_cpu 4095: a cell that fails for real (no such CPU here), inside a network group
    path = write_exp(tmp_path, lab, "nets", {"network": ["small", "broken", "mid", None], "send_cpu": [None, 4095]},
                     order="interleave")
    res = run_sweep(str(path), output=str(tmp_path / "rs"))
    recs = read_jsonl(str(tmp_path / "rs" / "runs.jsonl"))
    by = {(r["params"]["network"], r["params"]["send_cpu"]): r for r in recs}
    assert len(recs) == 8
    for net, mtu, cc in (("small", 1400, "reno"), ("mid", 4000, OTHER_CC)):
        ok = by[(net, None)]
        assert ok["status"] == "ok", ok["reason"]
        for role in ("sender", "receiver"):
            facts = ok["network"][role]
            assert (facts["interface"], facts["mtu"], facts["congestion"]) == ("data0", mtu, cc)
        # the transfer really ran at that MTU: segments fit it (IPv4 + TCP headers, timestamps)
        assert ok["sender"]["tcp_snd_mss"] <= mtu - 40
        assert by[(net, 4095)]["status"] == "failed" and by[(net, 4095)]["network"]["name"] == net
    assert by[("mid", None)]["network"]["receiver"]["sysctls"][RMEM] == "4096 65536 1048576"
    # the configuration that failed half-way: its runs are recorded unrun, with the kernel's refusal
    for cpu in (None, 4095):
        assert by[("broken", cpu)]["status"] == "failed" and "nosuchcc" in by[("broken", cpu)]["reason"]
    # a null network runs on the hosts as found (the previous network restored before it)
    assert by[(None, None)]["status"] == "ok" and "network" not in by[(None, None)]
    assert by[(None, None)]["sender"]["tcp_snd_mss"] > 4000
    meta = json.loads((tmp_path / "rs" / "meta.json").read_text())["networks"]
    assert meta["small"]["hosts"]["receiver"]["mtu"] == 1400 and meta["broken"]["applied"] is False
    assert res.exit_status == 1
    assert {r: host_net(lab, r) for r in ("sender", "receiver")} == before


def test_preflight_refuses_what_the_hosts_cannot_take_before_any_run(lab, tmp_path):
    from zcorch.errors import PreflightError

    nets = {"x": {"congestion": "nosuchcc"},
            "y": {"mtu": 65535, "sysctls": {"net.ipv4.conf.data0.zcorch_no_such_sysctl": 1}}}
    path = write_exp(tmp_path, lab, "pre", {"network": ["x", "y"]}, networks=nets)
    before = {r: host_net(lab, r) for r in ("sender", "receiver")}
    with pytest.raises(PreflightError) as ei:
        run_sweep(str(path), output=str(tmp_path / "rs"))
    msg = str(ei.value)
    assert "congestion control `nosuchcc` is not available" in msg
    assert "no sysctl net.ipv4.conf.data0.zcorch_no_such_sysctl" in msg
    assert read_jsonl(str(tmp_path / "rs" / "runs.jsonl")) == []
    assert {r: host_net(lab, r) for r in ("sender", "receiver")} == before


def test_a_killed_sweep_is_restored_by_the_next_run_and_by_lab_down(lab, tmp_path):
    from zcorch.lab.netns import NamespaceHost, _restore_network

    before = {r: host_net(lab, r) for r in ("sender", "receiver")}
    path = write_exp(tmp_path, lab, "killed", {"network": ["mid"]}, repeats=20,
                     params={"duration": "2s", "timeout": "60s"})  # long enough on any machine

    def kill_mid_sweep(out):
        p = start_zcorch("lab", "run", path, "-o", out)
        try:
            wait_records(out / "runs.jsonl", 1, timeout=120)
        finally:
            # the hosts' watchdogs die first (else they restore at once): what is left is for lab down / the next run
            assert len(kill_watchdogs(lab.pids_in("sender") + lab.pids_in("receiver"))) == 2
            p.kill()   # SIGKILL: no finally block of the controller runs
            p.wait()
        for role in ("sender", "receiver"):
            mtu, cc, rmem, state = host_net(lab, role)
            assert (mtu, cc, rmem) == (4000, OTHER_CC, "4096 65536 1048576") and len(state) == 1

    # What `zcorch lab down` does before it deletes the namespaces (here without deleting them).
    kill_mid_sweep(tmp_path / "rs1")
    removed = {"network": [], "network_errors": []}
    for role in ("sender", "receiver"):
        _restore_network(NamespaceHost(role, lab.sshd_pid(role)), removed)
    assert removed["network_errors"] == [] and any("data0 mtu 9000" in r for r in removed["network"])
    assert {r: host_net(lab, r) for r in ("sender", "receiver")} == before
    # The next run restores the leftovers first (a warning says so), then runs and restores its own.
    kill_mid_sweep(tmp_path / "rs2")
    small = write_exp(tmp_path, lab, "next", {"network": ["small"]})
    res = run_sweep(str(small), output=str(tmp_path / "rs3"))
    assert res.exit_status == 0
    assert any("restored a previous controller's network leftover" in w for w in res.warnings), res.warnings
    assert {r: host_net(lab, r) for r in ("sender", "receiver")} == before
    # A second sweep while a live controller (a real one, on this machine) holds the hosts' network is
    # refused at preflight, naming it; its values stay until it ends (here: killed, then restored).
    p = start_zcorch("lab", "run", path, "-o", tmp_path / "rs4")
    try:
        wait_records(tmp_path / "rs4" / "runs.jsonl", 1, timeout=120)
        with pytest.raises(Exception, match="another sweep"):
            run_sweep(str(small), output=str(tmp_path / "rs5"))
    finally:
        kill_watchdogs(lab.pids_in("sender") + lab.pids_in("receiver"))
        p.kill()
        p.wait()
    for role in ("sender", "receiver"):
        _restore_network(NamespaceHost(role, lab.sshd_pid(role)), removed)
    assert {r: host_net(lab, r) for r in ("sender", "receiver")} == before
    assert os.path.isdir(tmp_path / "rs4")
