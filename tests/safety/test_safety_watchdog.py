"""Every host change reverts itself unless confirmed: a watchdog on the host (zcorch.worker.watchdog), armed over
the controller's connection before a network or filesystem change and renewed every few seconds, puts the host
back by itself when the controller is lost, within zcorch.provision.watchdog.BOUND_S, and the next sweep says
"restored by watchdog". Real mechanisms on the two-host lab: a `zcorch run` process SIGKILLed mid network group,
the controller's sshd session processes killed on the receiver (its connection cut, the controller alive), a
`zcorch run` SIGKILLed with a loop filesystem mounted, a `zcorch run` SIGSTOPped (its renewals stop, its
connections stay up).

Each restore time (from the kill to the host as it was) is printed and appended to $ZCORCH_WATCHDOG_TIMES (a
file) when set; ZCORCH_WATCHDOG_REPEATS=N repeats each scenario N times (the medians in docs/reproductions-notes.md)."""
from __future__ import annotations

import os
import signal
import time

import pytest
import yaml

from fixtures_fs import host_state
from fixtures_run import start_zcorch, wait_records
from test_networks_lab import host_net, write_exp
from zcorch.provision.watchdog import BOUND_S, LAPSE_S, RENEW_S
from zcorch.results.store import read_jsonl
from zcorch.sweep.pipeline import run_sweep

# deadlines: a restore is bounded by BOUND_S (the product's stated bound, seconds beyond the lapse) and its time
# is printed; the lapse is a lower bound; each test has a lab of its own process: the parallel pass runs them
pytestmark = [pytest.mark.lab, pytest.mark.root, pytest.mark.timeout(400), pytest.mark.deadlines]
ROLES = ("sender", "receiver")
REPEATS = range(int(os.environ.get("ZCORCH_WATCHDOG_REPEATS", "1")))


def _note(scenario: str, seconds: float) -> None:
    print(f"watchdog restore time, {scenario}: {seconds:.2f} s")
    path = os.environ.get("ZCORCH_WATCHDOG_TIMES")
    if path:
        with open(path, "a") as f:
            f.write(f"{scenario} {seconds:.3f}\n")


def _until(check, bound: float) -> float:
    """Seconds until check() holds; AssertionError past `bound`."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > bound:
            raise AssertionError(f"not restored within {bound:g} s")
        time.sleep(0.05)
    return time.monotonic() - start


def _next_sweep_says_restored_by_watchdog(lab, tmp_path, name):
    exp = {"name": name, "hosts": lab.hosts_spec, "params": {"bytes": "1MiB", "timeout": "30s"},
           "matrix": {"send_mode": ["write"]}, "baselines": {"iperf3": False, "dd": False}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(exp))
    res = run_sweep(str(path), output=str(tmp_path / f"rs-{name}"))
    assert res.exit_status == 0
    return [w for w in res.warnings if w.startswith("restored by watchdog")]


def _first_record(p, path):
    try:
        wait_records(path, 1, timeout=120)
    except AssertionError:
        if p.poll() is not None:
            raise AssertionError(f"the sweep ended with {p.returncode}: {p.stderr.read()[-3000:]}") from None
        raise


def _sshd_sessions(lab, role):
    """The receiver's per-connection sshd processes (not the listener): the controller's SSH sessions."""
    listener = lab.sshd_pid(role)
    out = []
    for pid in lab.pids_in(role):
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if pid != listener and comm in ("sshd", "sshd-session"):
            out.append(pid)
    return out


@pytest.mark.parametrize("attempt", REPEATS)
def test_a_sigkilled_controller_mid_network_group_is_restored_by_the_hosts(lab, tmp_path, attempt):
    before = {r: host_net(lab, r) for r in ROLES}
    path = write_exp(tmp_path, lab, "killed", {"network": ["mid"]}, repeats=20,
                     params={"duration": "2s", "timeout": "60s"})
    p = start_zcorch("lab", "run", path, "-o", tmp_path / "rs1")
    try:
        _first_record(p, tmp_path / "rs1" / "runs.jsonl")
        assert all(host_net(lab, r)[0] == 4000 for r in ROLES)     # the group's MTU is applied
    finally:
        p.kill()   # SIGKILL: nothing of the controller's teardown runs
        killed = time.monotonic()
        p.wait()
    _until(lambda: all(host_net(lab, r) == before[r] for r in ROLES), BOUND_S)
    _note("SIGKILLed controller, network (MTU, congestion, tcp_rmem)", time.monotonic() - killed)
    said = _next_sweep_says_restored_by_watchdog(lab, tmp_path, "after")
    assert len(said) == 2 and all("data0 mtu 9000" in w or "mtu 9000" in w for w in said), said
    assert {r: host_net(lab, r) for r in ROLES} == before


@pytest.mark.parametrize("attempt", REPEATS)
def test_a_hung_controller_stops_renewing_and_the_hosts_restore_after_the_lapse(lab, tmp_path, attempt):
    """SIGSTOP: the controller's connections stay up (no EOF), only its renewals stop."""
    before = {r: host_net(lab, r) for r in ROLES}
    path = write_exp(tmp_path, lab, "hung", {"network": ["mid"]}, repeats=20,
                     params={"duration": "2s", "timeout": "60s"})
    p = start_zcorch("lab", "run", path, "-o", tmp_path / "rs1")
    try:
        _first_record(p, tmp_path / "rs1" / "runs.jsonl")
        assert all(host_net(lab, r)[0] == 4000 for r in ROLES)
        p.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        _until(lambda: all(host_net(lab, r) == before[r] for r in ROLES), BOUND_S)
        took = time.monotonic() - stopped
        _note("SIGSTOPped controller (renewals stop, connection up), network", took)
        # restored by the lapse (counted from the last renewal, up to RENEW_S before the stop), not by an EOF
        assert took >= LAPSE_S - RENEW_S - 1.0
    finally:
        p.kill()
        p.wait()
    said = _next_sweep_says_restored_by_watchdog(lab, tmp_path, "after")
    assert len(said) == 2 and all(f"no renewal from the controller for {LAPSE_S:g} s" in w for w in said), said


@pytest.mark.parametrize("attempt", REPEATS)
def test_a_cut_ssh_session_mid_network_group_is_restored_by_the_host(lab, tmp_path, attempt):
    before = {r: host_net(lab, r) for r in ROLES}
    earlier = set(_sshd_sessions(lab, "receiver"))   # sessions an earlier test of the session still holds
    path = write_exp(tmp_path, lab, "cut", {"network": ["mid"]}, repeats=20,
                     params={"duration": "2s", "timeout": "60s"})
    p = start_zcorch("lab", "run", path, "-o", tmp_path / "rs1")
    try:
        _first_record(p, tmp_path / "rs1" / "runs.jsonl")
        assert host_net(lab, "receiver")[0] == 4000
        sessions = [pid for pid in _sshd_sessions(lab, "receiver") if pid not in earlier]   # this sweep's
        assert sessions
        for pid in sessions:          # the controller lives on; its connection to the receiver is gone
            os.kill(pid, signal.SIGKILL)
        cut = time.monotonic()
        _until(lambda: host_net(lab, "receiver") == before["receiver"], BOUND_S)
        _note("cut SSH session, network (receiver)", time.monotonic() - cut)
        _, err = p.communicate(timeout=180)   # the sweep ends on its lost host, restoring the sender itself
        assert p.returncode != 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    _until(lambda: all(host_net(lab, r) == before[r] for r in ROLES), BOUND_S)
    said = _next_sweep_says_restored_by_watchdog(lab, tmp_path, "after")
    assert any("on receiver" in w and "mtu 9000" in w for w in said), said


@pytest.mark.parametrize("attempt", REPEATS)
def test_a_sigkilled_controller_with_a_loop_filesystem_mounted_is_undone_by_the_receiver(lab, tmp_path, attempt):
    receiver = lab.connect("receiver")
    try:
        before = host_state(receiver)
        exp = {"name": "fskill", "hosts": lab.hosts_spec,
               "filesystems": {"lp": {"fs": "ext4", "loop": {"count": 1, "size": "64MiB"}}},
               "params": {"bytes": "4MiB", "timeout": "60s", "sink": "{filesystem}/recv.dat"},
               "matrix": {"filesystem": ["lp"]}, "repeats": 40, "baselines": {"iperf3": False, "dd": False}}
        path = tmp_path / "fskill.yaml"
        path.write_text(yaml.safe_dump(exp))
        p = start_zcorch("lab", "run", path, "-o", tmp_path / "rs1")
        try:
            _first_record(p, tmp_path / "rs1" / "runs.jsonl")
            during = host_state(receiver)
            assert during["loops"] != before["loops"] and during["mounts"] != before["mounts"]
        finally:
            p.kill()
            killed = time.monotonic()
            p.wait()
        _until(lambda: host_state(receiver) == before, BOUND_S)
        _note("SIGKILLed controller, loop filesystem (umount + losetup -d)", time.monotonic() - killed)
        assert read_jsonl(str(tmp_path / "rs1" / "runs.jsonl"))
    finally:
        receiver.close()
    said = _next_sweep_says_restored_by_watchdog(lab, tmp_path, "after")
    # the loop is attached with autoclear: the umount detaches it (host_state above saw it gone)
    assert any("on receiver" in w and "unmounted /root/" in w and "removed backing file" in w for w in said), said


def test_both_watchdogs_are_armed_at_once_and_before_any_change(lab, tmp_path):
    """The network's watchdogs are armed on both hosts at once (zcorch.hosts.parallel.per_host), all of them
    before the first change anywhere: with the sender's SSH session stopped (its sshd processes SIGSTOPped: a
    real host that answers late), the receiver's watchdog is armed meanwhile and neither host is changed yet;
    once the sender answers again, both are armed, the network is applied, and the teardown restores it."""
    import threading

    from fixtures_run import WATCHDOG_MARKER
    from zcorch.config.experiment import load_experiment
    from zcorch.provision.network import NetworkManager
    from zcorch.provision.remote_call import host_python

    def watchdogs(role):
        found = []
        for pid in lab.pids_in(role):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if WATCHDOG_MARKER in f.read():
                        found.append(pid)
            except OSError:
                pass
        return found

    _until(lambda: not watchdogs("sender") and not watchdogs("receiver"), BOUND_S)   # an earlier test's are gone
    before = {r: host_net(lab, r) for r in ROLES}
    exp = load_experiment(str(write_exp(tmp_path, lab, "both", {"network": ["small"]})))
    earlier = set(_sshd_sessions(lab, "sender"))
    hosts = {r: lab.connect(r) for r in ROLES}
    sessions = [pid for pid in _sshd_sessions(lab, "sender") if pid not in earlier]   # this connection's
    netman = NetworkManager(hosts, {r: host_python(hosts[r]) for r in ROLES}, exp.networks, exp.hosts)
    assert [t.roles for t in netman.targets] == [["sender"], ["receiver"]] and sessions
    out: dict = {}

    def ensure():
        try:
            out["facts"] = netman.ensure("small")
        except BaseException as exc:   # noqa: BLE001 - the test thread's to judge
            out["error"] = exc

    applier = threading.Thread(target=ensure, daemon=True)
    try:
        try:
            for pid in sessions:
                os.kill(pid, signal.SIGSTOP)
            applier.start()
            # the sender (armed first, one after the other) cannot answer: the receiver is armed meanwhile
            _until(lambda: watchdogs("receiver"), 30.0)
            time.sleep(1.0)
            assert {r: host_net(lab, r) for r in ROLES} == before      # no change before every host is armed
        finally:
            for pid in sessions:
                os.kill(pid, signal.SIGCONT)
            applier.join(120)
        assert "error" not in out, out
        assert all(t.watchdog is not None and t.watchdog.lost is None for t in netman.targets)
        assert watchdogs("sender") and watchdogs("receiver")
        assert all(host_net(lab, r)[0] == 1400 for r in ROLES)
    finally:
        netman.teardown_all()
        for h in hosts.values():
            h.close()
    assert {r: host_net(lab, r) for r in ROLES} == before
    _until(lambda: not watchdogs("sender") and not watchdogs("receiver"), 15.0)   # confirmed: they exit
