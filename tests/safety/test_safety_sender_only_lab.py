"""A run's receiver takes a data connection only from its sender: from the sender's data address (--peer) and
with the run's nonce in the stream hello (--nonce, new for each run, given to both workers over SSH).

In the two-host lab (real sshd, real served workers): as soon as the receiver says it listens, a process on the
receiver connects first and sends junk, and a process on the sender host (the sender's own address) connects
and sends a well-formed hello with a forged nonce and the run's byte count of zeros. The real run still
completes with the right bytes, and the record counts and describes both refused connections.
"""
from __future__ import annotations

import pytest

from fixtures_run import base_params, new_resultset
from zcorch.sweep.runner import Runner

pytestmark = [pytest.mark.lab, pytest.mark.root]

ATTACK = r"""
import socket, struct, sys, time
addr, port, how, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
s = socket.create_connection((addr, port), timeout=5)
if how == "junk":
    s.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"\xff" * 4096)
else:   # a hello as the worker writes it (magic zcs2, stream 0 of 1, the run's slice), nonce forged: zeros
    s.sendall(struct.pack("<IIIIQQ", 0x325343a5, 0, 1, 0, 0, n) + bytes(16))
    try:   # the payload: the receiver drops the connection after the hello (a reset here says so)
        s.sendall(bytes(min(n, 1 << 20)))
    except (ConnectionResetError, BrokenPipeError):
        pass
time.sleep(0.2)
print("sent")
"""


@pytest.fixture
def lab_runner(lab, tmp_path):  # noqa: F811
    from zcorch.hosts import ssh
    from zcorch.provision import deploy

    hosts = ssh.open_hosts(lab.hosts)
    handles = deploy.prepare(hosts)

    def make(rs, **kw):
        return Runner(hosts["sender"], hosts["receiver"], handles["sender"].worker_argv,
                      handles["receiver"].worker_argv, rs, worker_env={r: handles[r].env for r in handles}, **kw)

    yield make
    for h in hosts.values():
        h.close()
    assert lab.zcorch_procs("sender") == [] and lab.zcorch_procs("receiver") == []


def test_connections_that_are_not_the_runs_sender_are_refused_and_recorded(lab, lab_runner, tmp_path):  # noqa: F811
    n = 8 << 20
    cells = [base_params(bytes=n, timeout=20.0)]
    runs = [{"id": "c0", "repeat": 0, "params": cells[0]}]
    rs = new_resultset(tmp_path / "rs", runs)
    attacks = []

    def on_event(name, **info):
        if name != "receiver_ready":
            return
        port = str(info["port"])
        # first a local user of the receiver, then someone on the sender host: both before the real sender
        for host, how in (("receiver", "junk"), ("sender", "hello")):
            p = lab.run_in(host, ["python3", "-c", ATTACK, lab.receiver.data, port, how, str(n)], timeout=30)
            attacks.append((host, how, p.returncode, p.stdout.strip(), p.stderr[-300:]))

    lab_runner(rs, on_event=on_event).run_sweep(runs)
    assert [a[2:4] for a in attacks] == [(0, "sent"), (0, "sent")], attacks
    (rec,) = rs.runs()
    assert rec["status"] == "ok", rec
    recv = rec["receiver"]
    assert recv["bytes"] == n and rec["sender"]["bytes"] == n
    assert recv["refused_connections"] == 2, recv.get("refused")
    local, forged = recv["refused"]
    assert local.startswith(lab.receiver.data + ":") and "not the sender's data address" in local
    assert forged.startswith(lab.sender.data + ":") and "another nonce than the run's" in forged
