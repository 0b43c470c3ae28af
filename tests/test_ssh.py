"""zcorch.hosts.ssh against the real sshd of the lab hosts (plus pure parsing tests)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import replace

import pytest

from zcorch.config.hosts import LOCALHOST, Hosts, HostSpec
from zcorch.hosts import ssh
from zcorch.errors import HostError
from zcorch.hosts.local import LocalHost


# -- pure -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dest, expected", [
    ("root@10.77.0.2", ("root", "10.77.0.2", None)),
    ("10.77.0.2:2222", (None, "10.77.0.2", 2222)),
    ("me@host.example:22", ("me", "host.example", 22)),
    ("alias", (None, "alias", None)),
    ("root@[fd00::2]:2200", ("root", "fd00::2", 2200)),
    ("fd00::2", (None, "fd00::2", None)),
])
def test_parse_destination(dest, expected):
    assert ssh.parse_destination(dest) == expected


@pytest.mark.parametrize("dest", ["", "root@", "host:0", "host:99999", "host:x"])
def test_parse_destination_rejects(dest):
    with pytest.raises(HostError):
        ssh.parse_destination(dest)


def test_resolve_target_applies_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = tmp_path / "cfg"
    cfg.write_text("Host box\n  HostName 10.1.2.3\n  Port 2200\n  User alice\n  IdentityFile ~/k1\n"
                   "  IdentitiesOnly yes\n  UserKnownHostsFile ~/kh\n  ProxyJump jump1,bob@jump2:2022\n"
                   "Host jump1\n  HostName 10.9.9.9\n  User carol\n")
    t = ssh.resolve_target(HostSpec(ssh="box", data_address="10.1.2.3", ssh_config=str(cfg),
                                    identity_file="/spec/key", known_hosts="/spec/kh"))
    assert (t.hostname, t.port, t.user) == ("10.1.2.3", 2200, "alice")
    assert t.identity_files == ["/spec/key", f"{tmp_path}/k1"]
    assert t.identities_only
    assert t.known_hosts == ["/spec/kh", f"{tmp_path}/kh", f"{tmp_path}/.ssh/known_hosts"]
    assert t.known_hosts_key == "[10.1.2.3]:2200"
    assert [(j.hostname, j.user, j.port) for j in t.jumps] == [("10.9.9.9", "carol", 22), ("jump2", "bob", 2022)]
    # explicit user/port in the destination win over the config
    t2 = ssh.resolve_target(HostSpec(ssh="root@box:22", data_address="10.1.2.3", ssh_config=str(cfg)))
    assert (t2.user, t2.port) == ("root", 22)


def test_open_hosts_localhost():
    hosts = ssh.open_hosts(LOCALHOST)
    assert isinstance(hosts["sender"], LocalHost) and hosts["receiver"] is hosts["sender"]
    assert hosts["sender"].spec is None  # no `hosts:` entry: zcorch.config.hosts' defaults apply


# -- against the lab ------------------------------------------------------------------------
pytestmark_lab = pytest.mark.lab


@pytest.fixture
def isolated_home(tmp_path, monkeypatch):
    """No ~/.ssh of the machine's user (config, known_hosts, keys) and no agent."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


@pytest.fixture(scope="module")
def sender(lab):
    h = lab.connect("sender")
    yield h
    h.close()


def _keygen(path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return str(path)


def _fingerprint(pubfile) -> str:
    out = subprocess.run(["ssh-keygen", "-l", "-f", str(pubfile)], capture_output=True, text=True, check=True)
    return out.stdout.split()[1]


@pytest.mark.lab
def test_run_quotes_every_argument(sender, lab):
    weird = ["a b", "$HOME", "; rm -rf /nonexistent", "'quoted'", '"dq"', "*", "`id`", "tab\there", ""]
    r = sender.run(["printf", "%s|"] + weird)
    assert r.ok, r
    assert r.stdout == "|".join(weird) + "|"
    r = sender.run(["sh", "-c", 'printf %s "$FOO"'], env={"FOO": "x y;$z"})
    assert r.stdout == "x y;$z"
    r = sender.run(["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (r.returncode, r.stdout, r.stderr) == (7, "out\n", "err\n")
    assert sender.run(["cat"], input="line1\nline2\n").stdout == "line1\nline2\n"
    missing = sender.run(["/nonexistent/tool"])
    assert missing.returncode == 127 and "not found" in missing.stderr
    # really in the sender's namespace: its addresses
    ips = sender.run(["ip", "-br", "addr"]).stdout
    assert lab.sender.mgmt in ips and lab.sender.data in ips and lab.receiver.data not in ips


@pytest.mark.lab
def test_run_collects_both_streams_whole_however_they_arrive(sender):
    """run() sleeps between reads until data, the EOF, the exit status or the close arrives (no poll): megabytes
    on both streams at once (beyond each flow-control window, so neither may stall the other), output after a
    silence, output from a process that outlives the command's exit status (the EOF comes last), nothing."""
    script = ("head -c 3000000 /dev/zero | tr '\\0' a & head -c 2500000 /dev/zero | tr '\\0' b >&2; wait; "
              "sleep 0.5; echo late; echo late-err >&2; exit 5")
    r = sender.run(["sh", "-c", script], timeout=60)
    assert r.returncode == 5
    assert r.stdout == "a" * 3_000_000 + "late\n" and r.stderr == "b" * 2_500_000 + "late-err\n"
    r = sender.run(["sh", "-c", "(sleep 0.5; echo after) & echo first"], timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "first\nafter\n", "")
    r = sender.run(["true"])
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


@pytest.mark.lab
def test_run_timeout_kills_whole_group(sender, lab):
    t0 = time.monotonic()
    r = sender.run(["sh", "-c", "sleep 77 & sleep 78; wait"], timeout=1.0)
    assert r.returncode == -signal.SIGKILL and "timed out" in r.stderr
    assert time.monotonic() - t0 < 10
    time.sleep(0.3)
    left = lab.run_in("sender", ["pgrep", "-f", "sleep 7[78]"]).stdout.split()
    assert left == []


@pytest.mark.lab
def test_start_readline_kill_group(sender, lab):
    proc = sender.start(["sh", "-c", "sleep 301 & sleep 302 & echo ready; wait"])
    assert proc.readline(10) == "ready"
    assert proc.pgid and proc.pgid > 1
    members = lab.run_in("sender", ["pgrep", "-g", str(proc.pgid)]).stdout.split()
    assert len(members) == 3, members  # the shell and both sleeps, all in the remote group
    with pytest.raises(TimeoutError):
        proc.wait(0.2)
    proc.kill_group(signal.SIGTERM)
    assert proc.wait(10) == -signal.SIGTERM
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and lab.run_in("sender", ["pgrep", "-f", "sleep 30[12]"]).stdout.strip():
        time.sleep(0.1)
    assert lab.run_in("sender", ["pgrep", "-f", "sleep 30[12]"]).stdout.strip() == ""
    # a normal exit status, and stdout to EOF
    p2 = sender.start(["sh", "-c", "echo a; echo b; echo c >&2; exit 4"])
    assert list(p2.lines(10)) == ["a", "b"]
    assert p2.wait(10) == 4 and p2.stderr_text().strip() == "c"


@pytest.mark.lab
def test_put_file_lands_in_the_hosts_private_home(sender, lab, tmp_path):
    src = tmp_path / "payload.bin"
    src.write_bytes(os.urandom(300_000))
    name = f"zc-test-{os.getpid()}"
    sender.put_file(str(src), f"~/{name}/sub/payload.bin", mode=0o600)
    sender.put_bytes(b"hello\n", f"{name}/hello.txt")
    r = sender.run(["sha256sum", f"{sender.home}/{name}/sub/payload.bin"])
    import hashlib

    assert r.stdout.split()[0] == hashlib.sha256(src.read_bytes()).hexdigest()
    assert sender.run(["stat", "-c", "%a", f"{name}/sub/payload.bin"]).stdout.strip() == "600"
    # the host's /root is the lab's private directory, not the controller's /root
    assert sender.home == "/root"
    assert os.path.exists(os.path.join(lab.sender.home, name, "hello.txt"))
    assert not os.path.exists(f"/root/{name}")


@pytest.mark.lab
def test_unknown_host_key_refused_then_accepted_with_flag(lab, isolated_home, tmp_path):
    kh = tmp_path / "fresh_known_hosts"
    kh.write_text("")
    spec = replace(lab.hosts.sender, known_hosts=str(kh), ssh_config=str(tmp_path / "none"))
    (tmp_path / "none").write_text("")
    fp = _fingerprint(lab.layout.host_key("sender") + ".pub")
    with pytest.raises(HostError) as exc:
        ssh.connect(spec, "sender", accept_new_host_keys=False, connect_timeout=5)
    msg = str(exc.value)
    assert "sender" in msg and lab.sender.mgmt in msg and fp in msg
    assert "--accept-new-host-keys" in msg and str(kh) in msg
    assert kh.read_text() == ""
    with ssh.connect(spec, "sender", accept_new_host_keys=True, connect_timeout=5) as h:
        assert h.run(["true"]).ok
    assert lab.sender.mgmt in kh.read_text()
    with ssh.connect(spec, "sender", accept_new_host_keys=False, connect_timeout=5) as h:  # now known
        assert h.run(["true"]).ok


@pytest.mark.lab
def test_changed_host_key_refused_even_with_flag(lab, isolated_home, tmp_path):
    other = _keygen(tmp_path / "other_hostkey")
    keytype, key = open(other + ".pub").read().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"{lab.sender.mgmt} {keytype} {key}\n")
    spec = replace(lab.hosts.sender, known_hosts=str(kh))
    for accept in (False, True):
        with pytest.raises(HostError, match="HOST KEY CHANGED") as exc:
            ssh.connect(spec, "sender", accept_new_host_keys=accept, connect_timeout=5)
        assert _fingerprint(lab.layout.host_key("sender") + ".pub") in str(exc.value)
        assert _fingerprint(other + ".pub") in str(exc.value)
    assert kh.read_text() == f"{lab.sender.mgmt} {keytype} {key}\n"


@pytest.mark.lab
def test_unreachable_host_fails_within_the_connect_timeout(lab):
    unused = lab.sender.mgmt.rsplit(".", 1)[0] + ".99"
    spec = replace(lab.hosts.sender, ssh=f"root@{unused}")
    t0 = time.monotonic()
    with pytest.raises(HostError) as exc:
        ssh.connect(spec, "sender", connect_timeout=2.0)
    elapsed = time.monotonic() - t0
    print(f"unreachable host reported after {elapsed:.2f}s: {exc.value}")
    assert elapsed < 6.0
    assert "sender" in str(exc.value) and unused in str(exc.value)


@pytest.mark.lab
def test_connection_refused_and_auth_failure(lab, isolated_home, tmp_path):
    spec = replace(lab.hosts.sender, ssh=f"root@{lab.sender.mgmt}:2299")
    t0 = time.monotonic()
    with pytest.raises(HostError, match="refused") as exc:
        ssh.connect(spec, "sender", connect_timeout=5)
    assert time.monotonic() - t0 < 3 and ":2299" in str(exc.value)
    stranger = _keygen(tmp_path / "stranger")
    spec = replace(lab.hosts.sender, identity_file=stranger, ssh_config=str(tmp_path / "empty"))
    (tmp_path / "empty").write_text("")
    with pytest.raises(HostError, match="authentication failed") as exc:
        ssh.connect(spec, "receiver", connect_timeout=5)
    assert str(exc.value).startswith("receiver (root@")


@pytest.mark.lab
def test_ssh_config_alias_with_port_user_identityfile(lab, isolated_home, tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host labrecv\n  HostName {lab.receiver.mgmt}\n  Port 22\n  User root\n"
                   f"  IdentityFile {lab.identity_file}\n  IdentitiesOnly yes\n"
                   f"  UserKnownHostsFile {lab.known_hosts}\n"
                   f"Host labrecv-wrongport\n  HostName {lab.receiver.mgmt}\n  Port 2201\n")
    spec = HostSpec(ssh="labrecv", data_address=lab.receiver.data, ssh_config=str(cfg))
    with ssh.connect(spec, "receiver", connect_timeout=5) as h:
        assert h.run(["id", "-un"]).stdout.strip() == "root"
        assert lab.receiver.data in h.run(["ip", "-br", "addr"]).stdout
        assert h.data_address == lab.receiver.data and h.spec is spec
    with pytest.raises(HostError, match=":2201"):
        ssh.connect(replace(spec, ssh="labrecv-wrongport"), "receiver", connect_timeout=5)


@pytest.mark.lab
def test_proxyjump_through_the_sender(lab, isolated_home, tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host far\n  HostName {lab.receiver.mgmt}\n  User root\n  ProxyJump jump\n"
                   f"Host jump\n  HostName {lab.sender.mgmt}\n  User root\n")
    spec = HostSpec(ssh="far", ssh_config=str(cfg), identity_file=lab.identity_file,
                    known_hosts=lab.known_hosts, data_address=lab.receiver.data)
    with ssh.connect(spec, "receiver", connect_timeout=5) as h:
        # sshd of the receiver saw the connection come from the sender, not from the controller
        client = h.run(["sh", "-c", 'echo "$SSH_CLIENT"']).stdout.split()[0]
        assert client == lab.sender.mgmt
        assert lab.receiver.data in h.run(["ip", "-br", "addr"]).stdout
        proc = h.start(["sleep", "303"])
        proc.kill_group()
        assert proc.wait(10) == -signal.SIGKILL


@pytest.mark.lab
def test_open_hosts_connects_both(lab):
    hosts = ssh.open_hosts(lab.hosts)
    try:
        assert hosts["sender"].data_address == lab.sender.data and hosts["sender"].spec == lab.hosts.sender
        assert hosts["receiver"].data_address == lab.receiver.data
        assert lab.receiver.mgmt in hosts["receiver"].run(["ip", "-br", "addr"]).stdout
    finally:
        for h in hosts.values():
            h.close()
    bad = lab.hosts_spec
    bad["sender"]["ssh"] = f"root@{lab.sender.mgmt}:2298"
    bad["receiver"]["ssh"] = f"root@{lab.receiver.mgmt}:2297"
    with pytest.raises(HostError) as exc:
        ssh.open_hosts(Hosts.from_mapping(bad))
    assert "sender" in str(exc.value) and "receiver" in str(exc.value)
