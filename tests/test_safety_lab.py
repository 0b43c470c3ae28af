"""SSH transport safety against the lab's real sshd: argv never parsed by a (non-POSIX) login shell,
and every remote operation has a deadline (a frozen sshd, not a mock)."""
import dataclasses
import os
import signal
import socket
import subprocess
import threading
import time
import uuid

import pytest

from conftest import require_tool
from zcorch.errors import HostError

pytestmark = [pytest.mark.lab, pytest.mark.root]

# Everything a shell would act on: quotes, expansions, separators, globs, newlines, options, csh's
# history `!`, backslashes and octal-looking text (the transport's own escape), non-ASCII.
WEIRD = ["a b", "$HOME", "${HOME}", "$(id)", "`id`", "; rm -rf /nonexistent", "a|b&c>d<e", "'single'",
         '"double"', "*", "?[a]", "~", "tab\there", "new\nline\n", "", "-n", "--", "!!", "!$", "\\",
         "\\0101\\c", "%b%s", "trailing\\", "é✓", "x" * 3000]


@pytest.fixture
def csh_user(lab):
    """A throwaway user whose LOGIN shell is csh (not POSIX: a newline inside quotes is an error, `!` is
    history); the lab's sshd takes the lab key for every user (AuthorizedKeysFile is fixed)."""
    require_tool("csh")
    require_tool("useradd")
    name = f"zcs{uuid.uuid4().hex[:8]}"
    home = f"/tmp/{name}"
    subprocess.run(["useradd", "--create-home", "--home-dir", home, "--shell", os.path.realpath("/bin/csh"),
                    "--user-group", name], check=True, capture_output=True)
    # sshd reads authorized_keys as the user: let it through the lab's 0700 state directory (the
    # public keys only; the private key stays 0600) for the test's duration.
    modes = {p: os.stat(p).st_mode & 0o777 for p in (lab.state_dir, lab.layout.authorized_keys)}
    try:
        subprocess.run(["usermod", "-p", "*", name], check=True)  # no password, but not locked (UsePAM no)
        os.chmod(lab.state_dir, 0o711)
        os.chmod(lab.layout.authorized_keys, 0o644)
        yield name
    finally:
        for path, mode in modes.items():
            os.chmod(path, mode)
        subprocess.run(["userdel", "--remove", name], capture_output=True)


def test_argv_arrives_byte_identical_through_a_csh_login_shell(lab, csh_user):
    spec = dataclasses.replace(lab.hosts.sender, ssh=f"{csh_user}@{lab.sender.mgmt}")
    from zcorch.hosts import ssh

    with ssh.connect(spec, "sender", connect_timeout=10) as h:
        shell = h.run(["sh", "-c", 'echo "$SHELL"; id -un'])
        assert shell.ok, shell
        assert shell.stdout.split() == [os.path.realpath("/bin/csh"), csh_user]  # really csh's job
        r = h.run(["/usr/bin/printf", "%s\\0", *WEIRD])
        assert r.ok, r
        assert r.stdout.split("\0")[:-1] == WEIRD
        # env values and stdin (input=) too
        r = h.run(["sh", "-c", 'printf %s "$V"; cat'], env={"V": "x'y\n$(id)!!"}, input="in\n")
        assert (r.returncode, r.stdout) == (0, "x'y\n$(id)!!in\n"), r
        # a started command gets the rest of stdin after its argv (the runner sends the port there)
        proc = h.start(["sh", "-c", 'printf "%s\\n" "$@"; read -r line; echo "got:$line"', "sh", *WEIRD[:6]])
        assert [proc.readline(10) for _ in range(6)] == WEIRD[:6]
        proc.send_line("4711")
        assert proc.readline(10) == "got:4711"
        assert proc.wait(10) == 0


def _sshd_pids(lab, host):
    out = []
    for pid in lab.pids_in(host):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(b"sshd"):
                    out.append(pid)
        except OSError:
            pass
    return set(out)


def _within(seconds, call):
    """(exception or result, elapsed) of call() on a thread; None if it had not returned in time."""
    box = []

    def go():
        try:
            box.append(call())
        except BaseException as exc:  # noqa: B902 - handed to the test
            box.append(exc)

    t0 = time.monotonic()
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    return (box[0] if box else None), time.monotonic() - t0


@pytest.mark.deadlines   # each operation's 2 s deadline, waited for up to 9 s; the elapsed time is printed
def test_frozen_sshd_every_operation_fails_within_its_deadline(lab):
    before = _sshd_pids(lab, "receiver")
    host = lab.connect("receiver")
    try:
        host.op_timeout = 2.0
        # A dead link (not just a frozen peer) ends the connection within about a minute, not TCP's 15:
        # the kernel aborts when the keepalives stay unacknowledged (too slow to wait for here).
        sock = host._client.get_transport().sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) > 0
        assert host.home == "/root"  # SFTP session open before the freeze: its calls must time out
        assert host.run(["true"]).ok
        session = _sshd_pids(lab, "receiver") - before   # this connection's sshd processes only
        assert session
        # A channel opened before the freeze: its exec request is what stalls (paramiko's own
        # exec_command waits forever there). Private API: the only way to stall exactly this step.
        early = host._client.get_transport().open_session(timeout=10)
        for pid in session:
            os.kill(pid, signal.SIGSTOP)
        try:
            limit = 3 * host.op_timeout + 3  # an SFTP write may wait out two requests (data, close)
            # The message names the host and the operation (put_bytes first makes sure of the directory).
            for what, call in (("creating /root", lambda: host.put_bytes(b"x", "~/zc-stalled")),
                               ("creating /root/zc-stalled-dir/sub", lambda: host.makedirs("~/zc-stalled-dir/sub")),
                               ("starting true", lambda: host.run(["true"], timeout=1.0)),
                               ("starting sleep 1", lambda: host.start(["sleep", "1"])),
                               ("exec request", lambda: host._request(early, "exec", "true", "exec request"))):
                got, elapsed = _within(limit, call)
                assert got is not None, f"{what}: still waiting after {limit:.0f}s (no deadline)"
                assert isinstance(got, HostError), f"{what}: {got!r}"
                assert "receiver" in str(got) and what in str(got), str(got)
                print(f"{what}: HostError after {elapsed:.1f}s: {got}")
        finally:
            for pid in session:
                os.kill(pid, signal.SIGCONT)
        # The connection recovers once the host answers again: a fresh SFTP session, new channels.
        host.put_bytes(b"ok", "~/zc-after-stall")
        assert host.run(["cat", "/root/zc-after-stall"]).stdout == "ok"
        host.run(["rm", "-f", "/root/zc-after-stall"])
    finally:
        host.close()


def test_lost_ssh_connection_records_the_run_failed_not_ok(lab, tmp_path):
    """A real HostError mid-sweep (the receiver's connection is gone): the run is failed with the
    error as its reason, never an ok without metrics that --resume would skip for good."""
    from fixtures_run import base_params, new_resultset
    from zcorch.hosts import ssh
    from zcorch.provision import deploy
    from zcorch.sweep.runner import Runner

    hosts = ssh.open_hosts(lab.hosts)
    try:
        handles = deploy.prepare(hosts)
        runs = [{"id": f"c{i}", "repeat": 0, "params": base_params()} for i in range(2)]
        rs = new_resultset(tmp_path / "rs", runs)

        def on_event(name, **info):
            if name == "run_done" and info["record"]["cell"] == "c0":
                hosts["receiver"].close()  # the link to the receiver is lost between two runs

        runner = Runner(hosts["sender"], hosts["receiver"], handles["sender"].worker_argv,
                        handles["receiver"].worker_argv, rs, worker_env={r: handles[r].env for r in handles},
                        on_event=on_event)
        outcome = runner.run_sweep(runs)
        first, lost = rs.runs()
        assert first["status"] == "ok", first
        assert lost["status"] == "failed", lost
        assert lost["reason"].startswith("HostError: receiver (") and "connection lost" in lost["reason"], lost
        assert (outcome.ok, outcome.failed) == (1, 1)
        assert rs.ok_keys() == {("c0", 0)}
        assert "Traceback" in (tmp_path / "rs" / lost["log"]).read_text()
    finally:
        for h in hosts.values():
            h.close()
    # The receiver's workers end when its sshd sees the cut connection (their stdin's EOF), a moment after the
    # close: waited for, not assumed (a worker that stayed would still be found after the 10 s)
    assert lab.zcorch_procs("sender", within=10.0) == [] and lab.zcorch_procs("receiver", within=10.0) == []
