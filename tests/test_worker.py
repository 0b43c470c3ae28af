"""The worker command line as the controller uses it: real worker processes over loopback,
JSON lines on stdout, error events + exit 1, and dead/stalled peers ending within --timeout."""
from __future__ import annotations

import platform
import signal
import subprocess
import sys
import time

import pytest

from fixtures_worker import (REPO, WorkerProcess, expected_mem, needs_native, pattern_file, run_worker,
                             start_receiver, worker_env)

pytestmark = needs_native

from zcorch._version import __version__  # noqa: E402

HUGE = "64GiB"  # far more than loopback moves in a test's lifetime


def test_info_reports_version_modes_kernel():
    rc, events, _ = run_worker("info")
    assert rc == 0 and len(events) == 1
    info = events[0]
    assert info["event"] == "info" and info["version"] == __version__
    assert info["kernel"] == platform.release()
    assert info["modes"]["send"] == ["write", "mmap", "sendfile", "splice", "vmsplice", "msg_zerocopy"]
    assert info["modes"]["recv"] == ["read", "mmap", "vmsplice", "splice"]


def test_zcorch_cli_dispatches_worker_and_lists_it_in_help():
    env = worker_env()
    p = subprocess.run([sys.executable, "-m", "zcorch", "worker", "info"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and '"event": "info"' in p.stdout
    h = subprocess.run([sys.executable, "-c", "from zcorch.cli import build_parser; build_parser().print_help()"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=30)
    assert "worker" in h.stdout


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
    (["recv", "--listen", "127.0.0.1:0", "--mode", "mmap", "--sink", "/dev/null"], "recv mmap: needs a regular-file sink"),
    (["send", "--connect", "127.0.0.1:9", "--mode", "sendfile", "--bytes", "1M"], "send sendfile: needs a file source"),
    (["send", "--connect", "127.0.0.1:9", "--mode", "mmap", "--source", "/dev/zero", "--bytes", "1M"], "send mmap"),
    (["send", "--connect", "127.0.0.1:9", "--mode", "teleport", "--bytes", "1M"], "unknown send mode"),
    (["send", "--connect", "127.0.0.1:9", "--mode", "write", "--buffer", "lots"], "--buffer: not a size"),
    (["send", "--connect", "127.0.0.1:9", "--mode", "write", "--bytes", "1M", "--timeout", "soon"], "--timeout"),
    (["send", "--connect", "127.0.0.1:9", "--mode", "write", "--bytes", "1M", "--subblocks", "x"], "--subblocks"),
    (["send", "--connect", "localhost", "--mode", "write", "--bytes", "1M"], "--connect must be ADDR:PORT"),
    (["send", "--connect", "127.0.0.1:9", "--mode", "write", "--bytes", "1M", "--sink", "/tmp/x"], "unrecognized"),
    (["send", "--connect", "127.0.0.1:9", "--bytes", "1M"], "--mode"),
    (["recv", "--listen", "127.0.0.1:0", "--mode", "read", "--sink-state", "sideways"], "--sink-state"),
    (["recv", "--listen", "127.0.0.1:0", "--mode", "read", "--fsync"], "--fsync needs a regular-file sink"),
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
    time.sleep(0.4)  # let the transfer get going
    assert rx.proc.poll() is None and tx.proc.poll() is None
    return rx, tx


@pytest.mark.parametrize("victim", ["receiver", "sender"])
def test_killed_peer_gives_an_error_event(victim):
    rx, tx = _stream(timeout="20s")
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


@pytest.mark.parametrize("victim", ["receiver", "sender"])
def test_stopped_peer_ends_within_the_timeout(victim):
    start = time.monotonic()
    rx, tx = _stream(timeout="3s")
    try:
        stopped, survivor = (rx, tx) if victim == "receiver" else (tx, rx)
        stopped.signal(signal.SIGSTOP)
        assert survivor.wait(6) == 1
        assert time.monotonic() - start < 3 + 1.5  # deadline + at most one timeout slice + start-up
        ev = survivor.event(1 if survivor is rx else 0)
        assert ev["event"] == "error" and ev["code"] == "ETIMEDOUT", ev
        assert "timed out after 3s" in ev["message"]
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
