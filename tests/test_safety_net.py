"""The network-safety checks that need no lab: an ssh config's `Match exec` runs only when allowed, the
network state file is acted on only when it is private, MTUs that would delete a link's addresses, and the
signal guard of a sweep's teardown in a real process."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from zcorch.config.hosts import HostSpec
from zcorch.errors import ConfigError
from zcorch.hosts import ssh
from zcorch.worker import netcfg

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- Match exec ------------------------------------------------------------------------------------

@pytest.mark.parametrize("line", ['Match exec "touch {mark}"', 'match !exec "touch {mark}"',
                                  'MATCH host box exec "touch {mark}"', 'Match=exec "touch {mark}"',
                                  'Match all exec=touch\\ {mark}'])
def test_a_config_with_match_exec_is_refused_naming_file_and_line_and_runs_only_when_allowed(tmp_path, line):
    mark = tmp_path / "ran"
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host box\n  HostName 127.0.0.1\n{line.format(mark=mark)}\n  User nobody\n")
    spec = HostSpec(ssh="box", data_address="10.1.2.3", ssh_config=str(cfg))
    with pytest.raises(ConfigError, match=rf"{cfg}:3: `Match \.\.\. exec`.*--allow-ssh-config-exec"):
        ssh.resolve_target(spec)
    assert not mark.exists()   # refused before paramiko read (and ran) it
    if not line.startswith("Match exec"):
        return
    # What the flag allows: the command really runs (paramiko through invoke, in a process of its own:
    # invoke reads stdin, which pytest holds).
    code = (f"from zcorch.hosts import ssh; from zcorch.config.hosts import HostSpec; ssh.resolve_target("
            f"HostSpec(ssh='box', data_address='10.1.2.3', ssh_config={str(cfg)!r}), allow_exec=True)")
    subprocess.run([sys.executable, "-c", code], check=True, stdin=subprocess.DEVNULL, timeout=60,
                   env=dict(os.environ, PYTHONPATH=REPO))
    assert mark.exists()


def test_a_config_without_exec_criteria_is_read_as_before(tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host box\n  HostName 127.0.0.1\n  # Match exec in a comment\nMatch host executor\n  User u\n")
    assert ssh.match_exec_lines(cfg.read_text()) == []
    assert ssh.resolve_target(HostSpec(ssh="box", data_address="10.1.2.3", ssh_config=str(cfg))).hostname == "127.0.0.1"


# -- the state file --------------------------------------------------------------------------------

def _state(tmp_path, file_mode=0o600, dir_mode=0o700):
    """A state directory recording this machine's current tcp_rmem (restoring it would change nothing)."""
    d = tmp_path / "net"
    d.mkdir(mode=0o700)
    current = netcfg.read_sysctl("net.ipv4.tcp_rmem")
    path = d / f"zcorch-net-{netcfg.netns_id()}.json"
    path.write_text(json.dumps({"format": netcfg.FORMAT, "version": 1, "name": "x", "owner": {},
                                "sysctls": {"net.ipv4.tcp_rmem": current}}))
    os.chmod(path, file_mode)
    os.chmod(d, dir_mode)
    return str(d), path


@pytest.mark.parametrize("file_mode,dir_mode,why", [(0o666, 0o700, "mode 0666"), (0o600, 0o777, "mode 0777"),
                                                    (0o620, 0o700, "mode 0620")])
def test_a_state_file_others_could_write_is_not_acted_on(tmp_path, file_mode, dir_mode, why):
    state_dir, path = _state(tmp_path, file_mode, dir_mode)
    with pytest.raises(netcfg.ActionError, match=why):
        netcfg.restore(state_dir)
    assert path.exists()       # left for a person to check
    with pytest.raises(netcfg.ActionError):
        netcfg.read_state(state_dir)


def test_a_state_file_owned_by_another_user_or_a_symlink_is_not_acted_on(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    state_dir, path = _state(tmp_path)
    os.chown(path, 65534, 65534)
    with pytest.raises(netcfg.ActionError, match="owned by uid 65534"):
        netcfg.restore(state_dir)
    # a symlink in place of the file, to a private file of this user: never followed
    target = tmp_path / "elsewhere.json"
    os.rename(path, target)
    os.chown(target, 0, 0)
    os.symlink(target, path)
    with pytest.raises(netcfg.ActionError, match="symbolic link"):
        netcfg.restore(state_dir)
    # a symlinked state directory is judged by what it resolves to
    os.unlink(path)
    os.rename(target, path)
    other = tmp_path / "open"
    other.mkdir()
    os.chmod(other, 0o777)
    link = tmp_path / "linkdir"
    os.symlink(other, link)
    os.rename(path, other / path.name)
    with pytest.raises(netcfg.ActionError, match="mode 0777"):
        netcfg.restore(str(link))


def test_a_private_state_file_is_restored_and_removed(tmp_path):
    state_dir, path = _state(tmp_path)
    assert netcfg.restore(state_dir) == {"restored": [], "errors": []}
    assert not path.exists()


# -- an MTU that deletes addresses -----------------------------------------------------------------

def test_an_mtu_below_what_the_link_addresses_need_is_named():
    v6 = {"inet": ["10.0.0.1"], "inet6": ["fe80::1"]}
    why = netcfg.mtu_problem("eth1", 1000, v6)
    assert "1280" in why and "IPv6" in why and "eth1" in why and "fe80::1" in why
    assert netcfg.mtu_problem("eth1", 1280, v6) is None
    assert netcfg.mtu_problem("eth1", 1000, {"inet": ["10.0.0.1"], "inet6": []}) is None
    assert "68" in netcfg.mtu_problem("eth1", 60, {"inet": ["10.0.0.1"]})


# -- signals during a teardown ---------------------------------------------------------------------

GUARDED = textwrap.dedent("""
    import os, signal, sys, time
    from zcorch.sweep import interrupts
    guard = interrupts.InterruptGuard()
    with guard.installed():
        interrupts.left_behind("network", lambda: ["sender: network 'small' is still applied"])
        try:
            os.kill(os.getpid(), signal.SIG{first})
            time.sleep(5)
            print("not interrupted")
        except KeyboardInterrupt:
            interrupts.begin_teardown()
            steps = 0
            for sig in {later}:          # the teardown: each step gets a signal
                os.kill(os.getpid(), getattr(signal, "SIG" + sig))
                time.sleep(0.01)
                steps += 1
            print("teardown finished", steps)
""")


def _guarded(first, later):
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-c", GUARDED.format(first=first, later=later)], capture_output=True,
                          text=True, env=env, timeout=60)


def test_term_signals_never_stop_a_teardown():
    p = _guarded("TERM", ["TERM"] * 40 + ["INT"])
    assert p.returncode == 0, p.stderr
    assert "teardown finished 41" in p.stdout
    assert p.stderr.count("finishing the teardown first") == 2   # once for TERM, once for the Ctrl-C


def test_a_third_ctrl_c_abandons_the_teardown_naming_what_is_left():
    p = _guarded("INT", ["TERM", "INT", "TERM", "INT", "TERM"])
    assert p.returncode == 130
    assert "teardown finished" not in p.stdout
    assert "teardown abandoned (Ctrl-C pressed 3 times)" in p.stderr
    assert "sender: network 'small' is still applied" in p.stderr


def test_without_a_teardown_a_signal_interrupts_as_before():
    p = _guarded("TERM", [])
    assert p.returncode == 0 and "teardown finished 0" in p.stdout
    assert signal.SIGTERM  # (the first signal raised KeyboardInterrupt: the except branch ran)


# -- the network lease (the lab tests run it between controllers) ----------------------------------

def test_the_network_lease_excludes_a_changing_sweep_shares_between_others_and_wants_a_private_directory(tmp_path):
    from zcorch.errors import PreflightError
    from zcorch.hosts.local import LocalHost
    from zcorch.provision.fs_state import Lease
    from zcorch.provision.network import LEASE_NAME

    host, d = LocalHost("localhost", "127.0.0.1"), str(tmp_path / "net")
    kw = dict(name=LEASE_NAME, what="this host's network")
    readers = [Lease.take(host, d, shared=True, **kw), Lease.take(host, d, shared=True, **kw)]   # sweeps without networks:
    try:
        with pytest.raises(PreflightError, match="another sweep holds this host's network"):
            Lease.take(host, d, token="b", **kw)          # one with networks: waits for none of them
    finally:
        for lease in readers:
            lease.release()
    writer = Lease.take(host, d, token="a", **kw)
    try:
        with pytest.raises(PreflightError, match=r'another sweep holds this host\'s network \(.*"token": "a"'):
            Lease.take(host, d, shared=True, **kw)         # nor may another run beside it
        same = Lease.take(host, d, token="a", **kw)       # the same sweep, its other host on this machine
        same.release()                                    # (a no-op: the first one holds it)
        with pytest.raises(PreflightError):
            Lease.take(host, d, token="b", **kw)
    finally:
        writer.release()
    Lease.take(host, d, token="b", **kw).release()        # released: the next one takes it
    os.chmod(d, 0o777)
    with pytest.raises(PreflightError, match="writable by group or others"):
        Lease.take(host, d, token="b", **kw)


def test_a_lease_directory_is_placed_made_and_judged_in_one_command_that_runs_no_value(tmp_path, monkeypatch):
    """Lease.take's one command before the lock: `~/` is the host's home (argv reaches no shell, the constant
    script expands it), the directory is made 0700, and a name full of shell syntax is only a name."""
    from zcorch.errors import PreflightError
    from zcorch.hosts.local import LocalHost
    from zcorch.provision.fs_state import Lease

    host = LocalHost("localhost", "127.0.0.1")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    lease = Lease.take(host, "~/.cache/zcorch/net", name="zcorch-net.lease")
    try:
        assert lease.path == str(home / ".cache" / "zcorch" / "net" / "zcorch-net.lease")
        assert os.stat(home / ".cache" / "zcorch" / "net").st_mode & 0o777 == 0o700
    finally:
        lease.release()
    odd = tmp_path / "$(touch pwned); `touch pwned2` $HOME * \"'"
    Lease.take(host, str(odd), name="x.lease").release()
    assert odd.is_dir() and not (tmp_path / "pwned").exists() and not os.path.exists("pwned")
    assert not os.path.exists("pwned2") and not (home / "pwned2").exists()
    monkeypatch.setenv("HOME", "relative")
    with pytest.raises(PreflightError, match=r"cannot hold a lease in ~/net: .*HOME is not an absolute path"):
        Lease.take(host, "~/net", name="x.lease")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PreflightError, match="cannot hold a lease in"):
        Lease.take(host, "relative-dir", name="x.lease")   # no home to place it in: refused, not made in the cwd
    assert not (tmp_path / "relative-dir").exists()


def test_a_host_whose_preflight_found_no_state_file_is_not_read_again_one_that_did_is(tmp_path, monkeypatch):
    """restore_leftovers skips the hosts the preflight probe found without a network state file (the probe
    runs under the sweep's network leases, which keep every other sweep from changing the network until the
    restore): with the probe's True (or None) the file is read and judged as always."""
    from zcorch.config.hosts import LOCALHOST, net_state_dir
    from zcorch.errors import PreflightError
    from zcorch.hosts.local import LocalHost
    from zcorch.provision import deploy, network
    from zcorch.provision.remote_call import host_python
    from zcorch.worker.netcfg import STATE_PREFIX, netns_id

    monkeypatch.setenv("HOME", str(tmp_path))
    host = LocalHost("localhost", "127.0.0.1")
    hosts, py = {"sender": host, "receiver": host}, {"sender": host_python(host), "receiver": host_python(host)}
    state_dir = net_state_dir(LOCALHOST.workdir("receiver"))
    assert deploy.probe_host(host, net_state=state_dir)["net_state"] is False
    # in the workdir (where a run as another user, or an older zcorch, kept it; read too): root's host-wide
    # file of this machine's own namespace is no test's to write
    path = os.path.join(os.path.expanduser(state_dir), f"{STATE_PREFIX}{netns_id()}.json")
    os.makedirs(os.path.dirname(path), mode=0o700)
    with open(path, "w") as f:
        f.write("not json")
    os.chmod(path, 0o600)
    assert deploy.probe_host(host, net_state=state_dir)["net_state"] is True
    with pytest.raises(PreflightError, match="unreadable state file"):
        network.restore_leftovers(hosts, py, LOCALHOST)
    assert network.restore_leftovers(hosts, py, LOCALHOST, clean=[host]) == []
