"""The network-safety fault corpus on the two-host lab (real sshd, real veths, `zcorch run` as a user runs
it): the link carrying SSH and MTUs that delete addresses refused at preflight, a second controller with
another hostname refused by the hosts' network lease before it loads them, a killed sweep's network
restored by the next sweep even without `networks:`, a hostile state file left alone, and TERM every 50 ms
during the teardown."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml

from fixtures_run import REPO, kill_watchdogs, start_zcorch, wait_records
from test_networks_lab import NETWORKS, OTHER_CC, host_net, write_exp
from zcorch.errors import PreflightError
from zcorch.results.store import read_jsonl
from zcorch.sweep.pipeline import run_sweep

pytestmark = [pytest.mark.lab, pytest.mark.root, pytest.mark.timeout(300)]
ROLES = ("sender", "receiver")
MID = (4000, OTHER_CC, "4096 65536 1048576")   # what NETWORKS["mid"] sets


def link_mtu(lab, role, dev):
    return int(lab.run_in(role, ["cat", f"/sys/class/net/{dev}/mtu"], check=True).stdout)


def plain_exp(tmp_path, lab, name, **params):
    """An experiment without `networks:` (and without a `network` parameter)."""
    exp = {"name": name, "hosts": lab.hosts_spec, "params": {"bytes": "8MiB", "timeout": "30s", **params},
           "matrix": {"send_mode": ["write"]}, "baselines": {"iperf3": False, "dd": False}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


def restore_lab(lab):
    """What `zcorch lab down` does first: a test that stops a sweep hard leaves the lab as it found it."""
    from zcorch.lab.netns import NamespaceHost, _restore_network

    removed = {"network": [], "network_errors": []}
    for role in ROLES:
        _restore_network(NamespaceHost(role, lab.sshd_pid(role)), removed)
    assert removed["network_errors"] == []


def test_a_change_of_the_link_carrying_ssh_is_refused_naming_link_and_session(lab, tmp_path):
    spec = lab.hosts_spec
    for role in ROLES:   # the data link is the management link: SSH rides on it
        spec[role]["data_address"] = getattr(lab, role).mgmt
    nets = {"tiny": {"mtu": 68},
            "arp": {"sysctls": {"net.ipv4.conf.mgmt0.arp_ignore": 2}},   # the same link, another spelling
            "cc": {"congestion": "reno"}}                                  # host-wide: not the link's
    before = {r: (link_mtu(lab, r, "mgmt0"), host_net(lab, r)) for r in ROLES}
    has_v6 = any(a.get("family") == "inet6" for link in json.loads(lab.run_in(
        "sender", ["ip", "-j", "addr", "show", "dev", "mgmt0"], check=True).stdout) for a in link.get("addr_info", []))
    for net, refused in (("tiny", True), ("arp", True), ("cc", False)):
        exp = {"name": f"ssh-{net}", "hosts": spec, "networks": nets, "params": {"bytes": "1MiB", "timeout": "30s"},
               "matrix": {"network": [net]}, "baselines": {"iperf3": False, "dd": False}}
        path = tmp_path / f"{net}.yaml"
        path.write_text(yaml.safe_dump(exp))
        try:
            if not refused:   # a host-wide setting on such hosts is still allowed
                assert run_sweep(str(path), output=str(tmp_path / f"rs-{net}")).exit_status == 0
                continue
            with pytest.raises(PreflightError) as ei:
                run_sweep(str(path), output=str(tmp_path / f"rs-{net}"))
        finally:   # today's code cuts the link: put the lab back for the other tests
            for role in ROLES:
                lab.run_in(role, ["ip", "link", "set", "dev", "mgmt0", "mtu", str(before[role][0])])
                lab.run_in(role, ["sh", "-c", "echo 0 > /proc/sys/net/ipv4/conf/mgmt0/arp_ignore"])
        msg = str(ei.value)
        for role in ROLES:   # both hosts, the link and the session (client -> server address) named
            assert f"{role}: network {net!r} would change mgmt0, the data link to" in msg, msg
            assert (f"carries the controller's SSH session ({lab.controller_address} -> "
                    f"{getattr(lab, role).mgmt}:22)") in msg, msg
            # MTU 68 would also cost mgmt0 its IPv6 addresses: said as well
            assert (net == "tiny" and has_v6) == (f"{role}: network 'tiny': mtu 68 is below 1280" in msg), msg
        assert read_jsonl(str(tmp_path / f"rs-{net}" / "runs.jsonl")) == []
    assert {r: (link_mtu(lab, r, "mgmt0"), host_net(lab, r)) for r in ROLES} == before


def test_an_mtu_that_would_delete_the_links_ipv6_addresses_is_refused(lab, tmp_path):
    added = []
    for role in ROLES:   # an IPv6 address on data0 (the lab may have IPv6 off there): what 1000 would delete
        lab.run_in(role, ["sh", "-c", "echo 0 > /proc/sys/net/ipv6/conf/data0/disable_ipv6"], check=True)
        address = f"fd77::{1 if role == 'sender' else 2}"
        lab.run_in(role, ["ip", "-6", "addr", "add", f"{address}/64", "dev", "data0", "nodad"], check=True)
        added.append((role, address))
    try:
        path = write_exp(tmp_path, lab, "v6", {"network": ["low", "ok"]},
                         networks={"low": {"mtu": 1000}, "ok": {"mtu": 1280}})
        before = {r: host_net(lab, r) for r in ROLES}
        with pytest.raises(PreflightError) as ei:
            run_sweep(str(path), output=str(tmp_path / "rs"))
        msg = str(ei.value)
        for role, address in added:
            assert (f"{role}: network 'low': mtu 1000 is below 1280, the least IPv6 needs: the kernel would "
                    f"delete data0's IPv6 addresses") in msg and address in msg, msg
        assert "'ok'" not in msg
        assert {r: host_net(lab, r) for r in ROLES} == before
        for role, address in added:
            assert address in lab.run_in(role, ["ip", "-6", "addr", "show", "dev", "data0"]).stdout
    finally:
        for role, address in added:
            lab.run_in(role, ["ip", "-6", "addr", "del", f"{address}/64", "dev", "data0"])


def _other_controller(*args, hostname="zcorch-other-controller"):
    """`zcorch run ...` from a controller with another hostname (its own UTS namespace, same machine)."""
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run(["unshare", "-u", "sh", "-c", 'hostname "$0" && exec "$@"', hostname, sys.executable,
                           "-m", "zcorch", *map(str, args)], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=240)


def test_a_controller_with_another_hostname_is_refused_before_it_loads_the_hosts(lab, tmp_path):
    before = {r: host_net(lab, r) for r in ROLES}
    long = write_exp(tmp_path, lab, "live", {"network": ["mid"]}, repeats=40,
                     params={"duration": "2s", "timeout": "60s"})  # long enough on any machine
    small = write_exp(tmp_path, lab, "second", {"network": ["small"]})
    plain = plain_exp(tmp_path, lab, "plain")
    p = start_zcorch("lab", "run", long, "-o", tmp_path / "live")
    try:
        wait_records(tmp_path / "live" / "runs.jsonl", 1, timeout=120)
        for exp, out in ((small, "second"), (plain, "plain")):   # with networks, and without
            r = _other_controller("run", exp, "-o", tmp_path / out)
            assert r.returncode == 1, r.stderr
            # the host takes one controller machine's sweeps at a time: refused naming the live one
            assert "is running sweeps on this host" in r.stderr and socket.gethostname() in r.stderr, r.stderr
            assert "Traceback" not in r.stderr
            # refused before it deployed or calibrated on the hosts: no metadata, no calibration, no run
            meta = tmp_path / out / "meta.json"
            assert not meta.exists() or "calibration" not in meta.read_text()
            assert read_jsonl(str(tmp_path / out / "runs.jsonl")) == []
            for role in ROLES:   # and nothing of the live sweep's network was "restored" under it
                assert host_net(lab, role)[:3] == MID
        assert p.poll() is None
    finally:
        p.send_signal(signal.SIGTERM)   # the live sweep stops and restores its network
        _, err = p.communicate(timeout=120)
    recs = read_jsonl(str(tmp_path / "live" / "runs.jsonl"))
    assert recs and all(r["network"]["receiver"]["mtu"] == 4000 for r in recs if r["status"] == "ok")
    assert {r: host_net(lab, r) for r in ROLES} == before, err


def test_a_killed_sweeps_network_is_restored_by_a_sweep_without_networks(lab, tmp_path):
    before = {r: host_net(lab, r) for r in ROLES}
    path = write_exp(tmp_path, lab, "killed", {"network": ["mid"]}, repeats=20,
                     params={"duration": "2s", "timeout": "60s"})  # long enough on any machine
    p = start_zcorch("lab", "run", path, "-o", tmp_path / "rs1")
    try:
        wait_records(tmp_path / "rs1" / "runs.jsonl", 1, timeout=120)
    finally:
        # the hosts' watchdogs die first (else they restore at once): the leftovers are the next sweep's
        assert len(kill_watchdogs(lab.pids_in("sender") + lab.pids_in("receiver"))) == 2
        p.kill()   # SIGKILL mid network group: nothing of the controller's teardown runs
        p.wait()
    for role in ROLES:
        assert host_net(lab, role)[:3] == MID and len(host_net(lab, role)[3]) == 1
    try:
        res = run_sweep(str(plain_exp(tmp_path, lab, "plain")), output=str(tmp_path / "rs2"))
    finally:
        if host_net(lab, "sender")[3]:
            restore_lab(lab)
    assert res.exit_status == 0
    assert sum("restored a previous controller's network leftover" in w for w in res.warnings) >= 2, res.warnings
    rec = read_jsonl(str(tmp_path / "rs2" / "runs.jsonl"))[0]
    assert rec["sender"]["tcp_snd_mss"] > 4000   # it ran on the lab's own 9000, not the killed sweep's 4000
    assert {r: host_net(lab, r) for r in ROLES} == before


def test_a_state_file_others_could_have_written_is_refused_and_left_alone(lab, tmp_path):
    ino = lab.run_in("receiver", ["stat", "-L", "-c", "%i", "/proc/self/ns/net"], check=True).stdout.strip()
    arp = lambda: lab.run_in("receiver", ["cat", "/proc/sys/net/ipv4/conf/data0/arp_ignore"]).stdout.strip()  # noqa: E731
    before = arp()
    state = {"format": "zcorch-net-state", "version": 1, "name": "x", "owner": {"host": "elsewhere", "pid": 1},
             "sysctls": {"net.ipv4.conf.data0.arp_ignore": "2"}}
    directory = "/root/.cache/zcorch/net"
    path = f"{directory}/zcorch-net-{ino}.json"
    lab.run_in("receiver", ["mkdir", "-p", directory], check=True)
    lab.run_in("receiver", ["sh", "-c", f"cat > {path}"], input=json.dumps(state), check=True)
    try:
        for file_mode, dir_mode, bad in (("0666", "0700", "0666"), ("0600", "0777", "0777")):
            lab.run_in("receiver", ["chmod", file_mode, path], check=True)
            lab.run_in("receiver", ["chmod", dir_mode, directory], check=True)
            with pytest.raises(PreflightError) as ei:
                run_sweep(str(plain_exp(tmp_path, lab, f"hostile{file_mode}{dir_mode}")),
                          output=str(tmp_path / f"rs{file_mode}{dir_mode}"))
            # refused by the state file's check or, for the directory, already by the lease's (taken first)
            assert f"mode {bad}" in str(ei.value), str(ei.value)
            assert "not acted on" in str(ei.value) or "cannot hold a lease" in str(ei.value), str(ei.value)
            assert arp() == before   # the "restore" of arp_ignore=2 never happened
    finally:
        lab.run_in("receiver", ["rm", "-f", path])
        lab.run_in("receiver", ["chmod", "0700", directory])


def test_term_every_50ms_during_the_teardown_still_restores_the_hosts_and_closes_the_result_set(lab, tmp_path):
    before = {r: host_net(lab, r) for r in ROLES}
    path = write_exp(tmp_path, lab, "term", {"network": ["small", "mid"]}, repeats=20,
                     params={"duration": "2s", "timeout": "60s"})  # long enough on any machine
    out = tmp_path / "rs"
    p = start_zcorch("lab", "run", path, "-o", out)
    sent = 0
    try:
        wait_records(out / "runs.jsonl", 1, timeout=120)
        deadline = time.monotonic() + 120
        while p.poll() is None and time.monotonic() < deadline:
            p.send_signal(signal.SIGTERM)
            sent += 1
            time.sleep(0.05)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
            restore_lab(lab)
    assert sent > 3, sent     # many signals arrived during the teardown, not just the one that stopped it
    assert p.returncode == 130, err
    assert "Traceback" not in err, err
    assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"
    assert {r: host_net(lab, r) for r in ROLES} == before, err
    assert lab.zcorch_procs("sender") == [] and lab.zcorch_procs("receiver") == []
