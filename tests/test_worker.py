"""The worker command line as the controller uses it: real worker processes over loopback,
JSON lines on stdout, error events + exit 1, and dead/stalled peers ending within --timeout."""
from __future__ import annotations

import errno
import platform
import signal
import subprocess
import sys
import threading
import time

import pytest

from fixtures_worker import REPO, WorkerProcess, expected_mem, needs_native, pattern_file, run_worker, start_receiver, wait_until_moving, worker_env

pytestmark = needs_native

from zcorch._version import __version__  # noqa: E402

HUGE = "64GiB"  # far more than loopback moves in a test's lifetime


def test_info_reports_version_modes_kernel():
    rc, events, _ = run_worker("info")
    assert rc == 0 and len(events) == 1
    info = events[0]
    assert info["event"] == "info" and info["version"] == __version__
    assert info["kernel"] == platform.release()
    assert info["modes"]["send"] == ["write", "mmap", "sendfile", "splice", "vmsplice", "msg_zerocopy", "io_uring",
                                     "io_uring_zc"]
    assert info["modes"]["recv"] == ["read", "mmap", "vmsplice", "splice", "io_uring", "zerocopy_recv", "discard"]


def test_zcorch_cli_dispatches_worker_and_lists_it_in_help():
    env = worker_env()
    p = subprocess.run([sys.executable, "-m", "zcorch", "worker", "info"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and '"event": "info"' in p.stdout
    # `zcorch --help` lists it: cli registers zcorch.cli.worker, whose register() adds the subcommand
    # (built here on a bare parser so the test does not import every other stage)
    import argparse

    from zcorch import cli
    from zcorch.cli import worker
    assert ("worker", "zcorch.cli.worker") in [(name, module) for name, module, _help in cli.COMMANDS]
    parser = argparse.ArgumentParser(prog="zcorch")
    worker.register(parser.add_subparsers(dest="command"))
    assert "worker" in parser.format_help()
    args = parser.parse_args(["worker", "info"])
    assert args.argv == ["info"] and callable(args.func)


def test_file_transfer_through_the_cli(tmp_path):
    src, sink = tmp_path / "src", tmp_path / "sink"
    data = pattern_file(src, 3 * 2**20 + 11)
    rx, port = start_receiver("--listen", "127.0.0.1:0", "--mode", "splice", "--sink", str(sink),
                              "--buffer", "64KiB", "--timeout", "20s", "--fsync")
    try:
        rc, events, err = run_worker("send", "--connect", f"127.0.0.1:{port}", "--mode", "sendfile",
                                     "--source", str(src), "--buffer", "64KiB", "--timeout", "20s")
        assert rc == 0, (events, err)
        assert rx.wait(20) == 0
        got = rx.event(1)
    finally:
        rx.close()
    sent = events[-1]
    assert sent["event"] == "result" and sent["side"] == "send" and sent["mode"] == "sendfile"
    assert got["event"] == "result" and got["side"] == "recv" and got["mode"] == "splice"
    assert sent["bytes"] == got["bytes"] == len(data)
    assert sink.read_bytes() == data
    assert sent["params"]["buffer"] == 65536 and sent["params"]["timeout"] == 20.0
    assert got["params"]["fsync"] is True and got["fsync_ns"] > 0


def test_mem_source_ipv6_and_receiver_bytes(tmp_path):
    sink = tmp_path / "sink"
    rx, port = start_receiver("--listen", "[::1]:0", "--mode", "vmsplice", "--sink", str(sink), "--bytes", "1MiB",
                              "--timeout", "20")
    try:
        rc, events, err = run_worker("send", "--connect", f"[::1]:{port}", "--mode", "vmsplice", "--gift",
                                     "--bytes", "1MiB", "--subblocks", "4", "--timeout", "20")
        assert rc == 0, (events, err)
        assert rx.wait(20) == 0
        assert rx.event(1)["bytes"] == 2**20
    finally:
        rx.close()
    assert sink.read_bytes() == expected_mem(0, 2**20)


@pytest.mark.parametrize("args,needle", [
    (["recv", "--listen", "127.0.0.1:0", "--mode", "mmap", "--sink", "/dev/null"], "recv mmap: receive mode `mmap` needs a regular file as sink"),
    (["send", "--connect", "127.0.0.1:9", "--mode", "sendfile", "--bytes", "1M"], "send sendfile: send mode `sendfile` reads from a file"),
    (["send", "--connect", "127.0.0.1:9", "--mode", "mmap", "--source", "/dev/zero", "--bytes", "1M"], "send mmap"),
    (["send", "--connect", "127.0.0.1:9", "--mode", "teleport", "--bytes", "1M"], "unknown send mode"),
    (["send", "--connect", "127.0.0.1:9", "--mode", "write", "--buffer", "lots"], "--buffer: not a size"),
    (["send", "--connect", "127.0.0.1:9", "--mode", "write", "--bytes", "1M", "--timeout", "soon"], "--timeout"),
    (["send", "--connect", "127.0.0.1:9", "--mode", "write", "--bytes", "1M", "--subblocks", "x"], "--subblocks"),
    (["send", "--connect", "localhost", "--mode", "write", "--bytes", "1M"], "--connect must be ADDR:PORT"),
    (["send", "--connect", "127.0.0.1:9", "--mode", "write", "--bytes", "1M", "--sink", "/tmp/x"], "unrecognized"),
    (["send", "--connect", "127.0.0.1:9", "--bytes", "1M"], "--mode"),
    (["recv", "--listen", "127.0.0.1:0", "--mode", "read", "--sink-state", "sideways"], "--sink-state"),
    (["recv", "--listen", "127.0.0.1:0", "--mode", "read", "--fsync"], "`fsync` needs a regular file as sink, not /dev/null"),
    (["send", "--connect", "127.0.0.1:1", "--mode", "write", "--bytes", "1M"], "Connection refused"),
    (["launch"], "invalid choice"),
    ([], "required"),
])
def test_errors_are_json_events_with_exit_1(args, needle):
    rc, events, stderr = run_worker(*args)
    assert rc == 1
    assert len(events) == 1, events
    ev = events[0]
    assert ev["event"] == "error" and ev["code"].startswith("E")
    assert needle in ev["message"], ev
    assert "usage:" not in stderr


def test_short_file_source_is_an_error(tmp_path):
    src = tmp_path / "src"
    pattern_file(src, 1000)
    rc, events, _ = run_worker("send", "--connect", "127.0.0.1:9", "--mode", "write", "--source", str(src),
                               "--bytes", "1001")
    assert rc == 1 and events[0]["code"] == "EINVAL" and "shorter than --bytes 1001" in events[0]["message"]


def _stream(recv_mode: str = "read", send_mode: str = "write", timeout: str = "3s"):
    rx, port = start_receiver("--listen", "127.0.0.1:0", "--mode", recv_mode, "--bytes", HUGE, "--timeout", timeout)
    tx = WorkerProcess("send", "--connect", f"127.0.0.1:{port}", "--mode", send_mode, "--bytes", HUGE,
                       "--timeout", timeout)
    wait_until_moving(rx.proc.pid)
    assert rx.proc.poll() is None and tx.proc.poll() is None
    return rx, tx


@pytest.mark.parametrize("victim,send_mode", [("receiver", "write"), ("receiver", "vmsplice"),
                                              ("receiver", "msg_zerocopy"), ("sender", "write")])
def test_killed_peer_gives_an_error_event(victim, send_mode):
    rx, tx = _stream(send_mode=send_mode, timeout="20s")
    try:
        dead, survivor = (rx, tx) if victim == "receiver" else (tx, rx)
        t0 = time.monotonic()
        dead.signal(signal.SIGKILL)
        assert survivor.wait(10) == 1
        assert time.monotonic() - t0 < 5  # noticed at once, not at the 20 s deadline
        ev = survivor.event(1 if survivor is rx else 0)
        assert ev["event"] == "error"
        if victim == "receiver":
            assert ev["code"] in ("EPIPE", "ECONNRESET"), ev
        else:
            assert ev["code"] == "ENODATA" and "short transfer" in ev["message"], ev
    finally:
        rx.close()
        tx.close()


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["receiver", "sender"])
def test_stopped_peer_ends_within_the_timeout(victim):
    rx, tx = _stream(timeout="3s")
    try:
        stopped, survivor = (rx, tx) if victim == "receiver" else (tx, rx)
        stopped.signal(signal.SIGSTOP)
        t_stop = time.monotonic()  # the survivor started earlier, so its deadline is before t_stop + 3 s
        assert survivor.wait(6) == 1
        assert time.monotonic() - t_stop < 3 + 0.75  # + at most one 250 ms timeout slice + exit
        ev = survivor.event(1 if survivor is rx else 0)
        assert ev["event"] == "error" and ev["code"] == "ETIMEDOUT", ev
        assert "timed out after 3s" in ev["message"]
        assert "is the peer stalled or gone?" in ev["message"] and "still moving" not in ev["message"], ev
    finally:
        rx.close()
        tx.close()


def test_a_timeout_shorter_than_the_transfer_says_so_not_a_stalled_peer():
    # both sides healthy and moving data the whole time: the transfer simply takes longer than 1 s
    rx, tx = _stream(timeout="1s")
    try:
        assert tx.wait(10) == 1 and rx.wait(10) == 1
        for side, proc in ((0, tx), (1, rx)):
            ev = proc.event(side)
            if ev.get("code") != "ETIMEDOUT":   # the other side may see the first one's close instead
                continue
            assert "with data still moving" in ev["message"] and "raise `timeout`" in ev["message"], ev
            assert "stalled or gone" not in ev["message"], ev
            break
        else:
            raise AssertionError("neither side timed out")
    finally:
        rx.close()
        tx.close()


def test_ready_is_printed_before_any_sender_and_flushed():
    rx = WorkerProcess("recv", "--listen", "127.0.0.1:0", "--mode", "read", "--timeout", "1")
    try:
        ready = rx.event(0, timeout=10)
        assert ready["event"] == "ready" and ready["port"] > 0
        assert rx.wait(5) == 1
        assert rx.event(1)["code"] == "ETIMEDOUT"
    finally:
        rx.close()


@pytest.mark.slow
@pytest.mark.parametrize("send_mode,source", [("sendfile", "file"), ("splice", "file"), ("vmsplice", "mem"),
                                              ("msg_zerocopy", "mem")])
def test_stopped_receiver_stops_every_blocking_send_path(tmp_path, send_mode, source):
    # the sender runs in-process here (SIGSTOP needs a process; the receiver is one)
    from zcorch.worker import native
    from zcorch.errors import WorkerError
    src = "mem"
    if source == "file":
        src = str(tmp_path / "src")
        pattern_file(src, 64 * 2**20)
    rx, port = start_receiver("--listen", "127.0.0.1:0", "--mode", "read", "--timeout", "30")
    try:
        rx.signal(signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as ei:
            native.send("127.0.0.1", port, send_mode, source=src, bytes=64 * 2**20, timeout=1.5)
        assert ei.value.code == errno.ETIMEDOUT, ei.value
        assert time.monotonic() - t0 < 1.5 + 0.6
    finally:
        rx.close()


@pytest.mark.slow
@pytest.mark.parametrize("recv_mode", ["mmap", "vmsplice", "splice"])
def test_stopped_sender_stops_every_blocking_receive_path(tmp_path, recv_mode):
    from zcorch.worker import native
    from zcorch.errors import WorkerError
    rx = native.Receiver("127.0.0.1", 0, recv_mode, sink=str(tmp_path / "sink"), timeout=2.5)
    tx = WorkerProcess("send", "--connect", f"127.0.0.1:{rx.port}", "--mode", "write", "--bytes", HUGE,
                       "--timeout", "30")
    try:
        t0 = time.monotonic()
        tx_stopper = threading.Timer(0.8, tx.signal, args=(signal.SIGSTOP,))
        tx_stopper.start()  # the receiver is blocked in rx.run() in this thread: stop the sender from a timer
        with pytest.raises(WorkerError) as ei:
            rx.run()
        assert ei.value.code == errno.ETIMEDOUT, ei.value
        assert time.monotonic() - t0 < 2.5 + 0.6
    finally:
        tx_stopper.cancel()
        tx.close()
        rx.close()


def test_worker_imports_only_stdlib_and_the_deployed_modules():
    # what runs on bare remote hosts: nothing third-party, only the deployed zcorch modules
    code = ("import sys, zcorch.worker; "
            "names = {m.split('.')[0] for m in sys.modules}; "
            "print(sorted(m for m in sys.modules if m.startswith('zcorch'))); "
            "print(sorted(n for n in names if n not in sys.stdlib_module_names and n != 'zcorch'))")
    p = subprocess.run([sys.executable, "-S", "-c", code], cwd=REPO, env=worker_env(), capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    zc, third_party = (eval(line) for line in p.stdout.splitlines())
    assert set(zc) <= {"zcorch", "zcorch.worker", "zcorch.worker.native", "zcorch._native", "zcorch._version",
                       "zcorch.errors", "zcorch.units"}, zc
    assert set(third_party) <= {"_cffi_backend", "__main__"}, third_party


def test_stream_flags_and_their_errors_on_the_command_line():
    rx, port = start_receiver("--listen", "127.0.0.1:0", "--mode", "read", "--streams", "2", "--cpus", "0",
                              "--tcp-maxseg", "4108", "--timeout", "10")
    try:
        rc, events, _ = run_worker("send", "--connect", f"127.0.0.1:{port}", "--mode", "write", "--bytes", "1MiB",
                                   "--streams", "2", "--uring-depth", "4", "--timeout", "10")
        assert rc == 0 and events[-1]["event"] == "result", events
        sent = events[-1]
        got = rx.event(1)
        assert rx.wait(10) == 0
    finally:
        rx.close()
    assert [s["stream"] for s in sent["streams"]] == [0, 1] and got["params"]["cpus"] == "0"
    assert got["params"]["tcp_maxseg"] == 4108 and got["tcp_rcv_mss"] <= 4096 and sent["params"]["uring_depth"] == 4
    for args, needle in ((["--cpus", "1-0"], "--cpus: range '1-0' runs backwards"),
                         (["--streams", "0"], "--streams: expected an integer between 1 and 256, got 0")):
        rc, events, _ = run_worker("send", "--connect", "127.0.0.1:9", "--mode", "write", "--bytes", "1", *args)
        assert rc == 1 and events[-1]["code"] == "EINVAL" and needle in events[-1]["message"], events
