"""--threads: streams multiplexed on fewer threads, through zcorch.worker.native in-process over
real loopback sockets into real files.

Every pair of stream-capable modes runs 3 streams on 1, 2 and 3 threads (2: one thread of two streams
beside a thread of one), and each stream's slice must arrive byte-identically where it belongs. The
thread count is resolved in one place (the C core) and recorded in the worker's params; a stalled peer
still ends a multiplexed transfer at its deadline. Nothing here fakes the kernel: a mode this machine
cannot run is skipped with the worker's own reason.
"""
from __future__ import annotations

import errno
import os
import socket
import threading
import time

import pytest

from fixtures_worker import needs_native, pattern_file, run_pair

pytestmark = needs_native

from zcorch import params as table  # noqa: E402
from zcorch.errors import WorkerError  # noqa: E402
from zcorch.worker import native  # noqa: E402

STREAMS = 3
SIZE = 4 * 2**20 + 12_345           # each stream's slice many buffers long (a stream gives way after one buffer)
BUFFER = 65_537                     # divides no slice: partial chunks at every slice's end


def _stream_capable(side: str) -> "list[str]":
    caps = native.mode_capabilities()[side]
    mode_param = table.param("send_mode" if side == "send" else "recv_mode")
    return [m for m in mode_param.choices if "one_stream" not in caps.get(m, frozenset())]


SEND = _stream_capable("send")
RECV = _stream_capable("recv")
PAIRS = [(s, r) for s in SEND for r in RECV]


def _runnable(send_mode: str, recv_mode: str) -> None:
    unavailable = native.unavailable_modes()
    for side, mode in (("send", send_mode), ("recv", recv_mode)):
        if mode in unavailable[side]:
            pytest.skip(f"{side} mode {mode} cannot run here: {unavailable[side][mode]}")


def _check_each_stream(result: dict, data: "bytes | None", sink: "bytes | None", threads: int) -> None:
    """Per-stream records as with a thread per stream, each slice in place; totals the streams' sums."""
    assert result["params"]["threads"] == threads and result["params"]["streams"] == STREAMS
    streams = result["streams"]
    assert [s["stream"] for s in streams] == list(range(STREAMS))
    assert sum(s["bytes"] for s in streams) == result["bytes"] == SIZE
    for a, b in zip(streams, streams[1:]):
        assert a["offset"] + a["bytes"] == b["offset"]
    for s in streams:
        assert s["bytes"] > 0 and s["wall_ns"] > 0, s
        if sink is not None:
            off, n = s["offset"], s["bytes"]
            assert sink[off:off + n] == data[off:off + n], f"stream {s['stream']} of {STREAMS}: its slice differs"
    for key in ("utime_us", "stime_us", "minflt", "nvcsw", "nivcsw"):  # each stream its share of its thread
        assert result[key] == sum(s[key] for s in streams), key
        assert all(s[key] >= 0 for s in streams), key


@pytest.mark.parametrize("threads", [1, 2, STREAMS])
@pytest.mark.parametrize("send_mode,recv_mode", PAIRS, ids=[f"{s}-{r}" for s, r in PAIRS])
def test_every_stream_capable_pair_on_every_thread_count_delivers_each_slice(tmp_path, send_mode, recv_mode,
                                                                             threads):
    _runnable(send_mode, recv_mode)
    src = tmp_path / "src"
    data = pattern_file(src, SIZE, seed=threads)
    keeps = "no_sink" not in native.mode_capabilities()["recv"][recv_mode]
    sink = tmp_path / "sink" if keeps else None
    common = dict(buffer=BUFFER, streams=STREAMS, threads=threads, uring_depth=3)
    sent, got = run_pair(send_mode, recv_mode, send_kw=dict(common, source=str(src)),
                         recv_kw=dict(common, sink=str(sink) if sink else "/dev/null", bytes=SIZE))
    written = sink.read_bytes() if sink else None
    if sink:
        assert written == data
    _check_each_stream(sent, data, written, threads)
    _check_each_stream(got, data, written, threads)


def test_the_thread_count_is_resolved_once_and_recorded():
    allowed = sorted(os.sched_getaffinity(0))
    cases = [
        (dict(streams=4), min(4, len(allowed))),                      # auto, unpinned: per stream, capped at CPUs
        (dict(streams=4, cpu=allowed[0]), 1),                          # one CPU: one thread
        (dict(streams=4, cpus=",".join(map(str, allowed))), min(4, len(allowed))),  # one per CPU of the list
        (dict(streams=2, threads=8), 2),                               # above streams: capped at streams
        (dict(streams=1), 1),
        (dict(streams=5, threads=3), 3),
    ]
    for kw, want in cases:
        applied = native.validate("send", "write", source="mem", bytes=1, **kw)
        assert applied["threads"] == want, (kw, applied["threads"])
    for bad in (0, 257):
        with pytest.raises(WorkerError) as ei:
            native.validate("send", "write", source="mem", bytes=1, streams=2, threads=bad)
        assert ei.value.code == errno.EINVAL and "--threads" in str(ei.value)


def test_streams_sharing_a_thread_take_turns_over_a_duration():
    # one thread, four streams, a time instead of a byte count: every stream moves data (round robin), and
    # the sender's streams stop together at the time
    sent, got = run_pair("write", "read", send_kw=dict(source="mem", duration=0.3, streams=4, threads=1),
                         recv_kw=dict(streams=4, threads=1))
    assert sent["params"]["threads"] == 1 and got["params"]["threads"] == 1
    assert all(s["bytes"] > 0 for s in sent["streams"]), [s["bytes"] for s in sent["streams"]]
    assert [s["bytes"] for s in got["streams"]] == [s["bytes"] for s in sent["streams"]]


def test_a_stalled_receiver_ends_streams_sharing_a_thread_at_the_deadline():
    # a listener that accepts the streams and never reads: the sender's sockets fill, every stream waits in
    # the thread's epoll, and the deadline ends the run with ETIMEDOUT (not a hang)
    srv = socket.create_server(("127.0.0.1", 0), backlog=8)
    held: "list[socket.socket]" = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept)
    t.start()
    try:
        with pytest.raises(WorkerError) as ei:
            native.send("127.0.0.1", srv.getsockname()[1], "write", source="mem", bytes=256 * 2**20, streams=2,
                        threads=1, window=65536, timeout=1)
    finally:
        stop.set()
        t.join()
        for s in held:
            s.close()
        srv.close()
    assert ei.value.code == errno.ETIMEDOUT and "timed out" in str(ei.value), ei.value


@pytest.mark.slow
def test_a_thread_of_streams_waiting_on_a_stalled_peer_sleeps_instead_of_polling():
    # a receiver (plain sockets) that reads nothing for STALL seconds, then everything: the sender's two
    # streams fill their sockets and park, and their thread (pinned: the one that polls before it sleeps,
    # while polling pays; mux.c: a poll that saw nothing stops polling) sleeps through the stall. A thread
    # that kept polling would spend the stall on the CPU; this one's CPU over the transfer stays a small part.
    stall = 1.5
    srv = socket.create_server(("127.0.0.1", 0), backlog=8)
    conns: "list[socket.socket]" = []

    def drain(c: socket.socket) -> None:
        with c:
            while c.recv(1 << 20):
                pass

    def serve() -> None:
        srv.settimeout(30)
        for _ in range(2):
            conns.append(srv.accept()[0])
        time.sleep(stall)
        readers = [threading.Thread(target=drain, args=(c,)) for c in conns]
        for r in readers:
            r.start()
        for r in readers:
            r.join()

    t = threading.Thread(target=serve)
    t.start()
    try:
        sent = native.send("127.0.0.1", srv.getsockname()[1], "write", source="mem", bytes=16 * 2**20, streams=2,
                           threads=1, cpu=min(os.sched_getaffinity(0)), window=65536, timeout=30)
    finally:
        t.join()
        srv.close()
    assert sent["params"]["threads"] == 1
    assert sent["wall_ns"] >= 0.8 * stall * 1e9, sent["wall_ns"]  # the stall fell inside the timed transfer
    assert sent["utime_us"] + sent["stime_us"] < stall * 1e6 / 10, (sent["utime_us"], sent["stime_us"])
