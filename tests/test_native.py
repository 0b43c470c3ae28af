"""The C transfer core through zcorch.worker.native, in-process (receiver thread + sender), over real
loopback sockets into real files. Every send x receive pair must deliver byte-identical data."""
from __future__ import annotations

import errno
import os

import pytest

from fixtures_worker import expected_mem, needs_native, pattern_file, run_pair

pytestmark = needs_native

from zcorch.worker import native  # noqa: E402
from zcorch.errors import WorkerError  # noqa: E402

SEND_MODES = ["write", "mmap", "sendfile", "splice", "vmsplice", "msg_zerocopy"]
NEW_SEND_MODES = ["io_uring", "io_uring_zc"]  # tests/test_native_modern.py
DATA_RECV_MODES = ["read", "mmap", "vmsplice", "splice"]   # the receive modes that keep the data
RECV_MODES = DATA_RECV_MODES + ["discard"]                  # discard: tests/test_hostcpu.py
NEW_RECV_MODES = ["io_uring", "zerocopy_recv"]  # tests/test_native_modern.py
PRIME = 1_000_003                  # not a multiple of the page size
SIZES = [0, 1, PRIME, 6 * 2**20 + 12_345]
BUFFER = 65_537                    # divides none of the sizes


def test_compiled_modes_match_the_contract():
    assert native.compiled_modes() == {"send": SEND_MODES + NEW_SEND_MODES, "recv": DATA_RECV_MODES + NEW_RECV_MODES + ["discard"]}


def test_mem_pattern_matches_the_documented_formula():
    assert native.mem_pattern_period() == 2**20
    for off, n in [(0, 64), (3, 29), (2**20 - 5, 17), (5 * 2**20 + 1, 4099)]:
        assert native.mem_pattern(off, n) == expected_mem(off, n)
    first = expected_mem(0, 2**20)
    words = {first[i:i + 8] for i in range(0, len(first), 8)}
    assert len(words) == 2**20 // 8  # no word repeats within a period


@pytest.mark.parametrize("send_mode", SEND_MODES)
@pytest.mark.parametrize("recv_mode", DATA_RECV_MODES)
def test_every_pair_moves_a_file_byte_identically(tmp_path, send_mode, recv_mode):
    for size in SIZES:
        src, sink = tmp_path / f"src{size}", tmp_path / f"sink{size}"
        data = pattern_file(src, size, seed=size)
        sent, got = run_pair(send_mode, recv_mode,
                             send_kw=dict(source=str(src), buffer=BUFFER),
                             recv_kw=dict(sink=str(sink), buffer=BUFFER))
        assert sent["bytes"] == got["bytes"] == size, (send_mode, recv_mode, size)
        assert sink.read_bytes() == data, (send_mode, recv_mode, size)
        assert sent["side"] == "send" and got["side"] == "recv"
        assert sent["mode"] == send_mode and got["mode"] == recv_mode


@pytest.mark.parametrize("send_mode", SEND_MODES)
@pytest.mark.parametrize("recv_mode", DATA_RECV_MODES)
def test_subblocks_and_receiver_bytes(tmp_path, send_mode, recv_mode):
    # 3 sub-blocks of a buffer that 3 does not divide (last sub-block shorter), receiver told --bytes
    size = 3 * 2**20 + 777
    src, sink = tmp_path / "src", tmp_path / "sink"
    data = pattern_file(src, size)
    sent, got = run_pair(send_mode, recv_mode,
                         send_kw=dict(source=str(src), buffer=100_000, subblocks=3),
                         recv_kw=dict(sink=str(sink), buffer=100_000, subblocks=3, bytes=size))
    assert got["bytes"] == size
    assert sink.read_bytes() == data
    assert got["params"]["subblocks"] == 3


@pytest.mark.parametrize("send_mode,gift", [("write", False), ("vmsplice", False), ("vmsplice", True),
                                            ("msg_zerocopy", False)])
@pytest.mark.parametrize("recv_mode", DATA_RECV_MODES)
def test_source_mem_is_the_offset_pattern(tmp_path, send_mode, gift, recv_mode):
    size = 3 * 2**20 + 4_321  # crosses the 1 MiB pattern period several times
    sink = tmp_path / "sink"
    sent, got = run_pair(send_mode, recv_mode, send_kw=dict(source="mem", bytes=size, buffer=BUFFER, gift=gift),
                         recv_kw=dict(sink=str(sink), buffer=BUFFER, gift=gift))
    assert got["bytes"] == size
    assert sink.read_bytes() == expected_mem(0, size)


@pytest.mark.parametrize("send_mode", ["write", "sendfile", "splice", "vmsplice", "msg_zerocopy"])
def test_dev_zero_source(tmp_path, send_mode):
    size = 2 * 2**20 + 3
    sink = tmp_path / "sink"
    sent, got = run_pair(send_mode, "read", send_kw=dict(source="/dev/zero", bytes=size, buffer=BUFFER),
                         recv_kw=dict(sink=str(sink)))
    assert sink.read_bytes() == bytes(size)


def test_msg_zerocopy_counts_completions_and_copies(tmp_path):
    size, buf = 8 * 2**20, 2**16
    sent, got = run_pair("msg_zerocopy", "read", send_kw=dict(source="mem", bytes=size, buffer=buf),
                         recv_kw=dict(sink="/dev/null"))
    calls_min = size // buf  # one completion id per successful send() call, at least one per chunk
    assert calls_min <= sent["zc_completions"] <= size
    assert 0 <= sent["zc_copied"] <= sent["zc_completions"]
    # Loopback delivers the sender's skbs to a local socket, which forces the kernel to copy the
    # pages: every completion must come back marked SO_EE_CODE_ZEROCOPY_COPIED. Asserted, not hidden.
    assert sent["zc_copied"] == sent["zc_completions"]
    assert got["zc_completions"] is None and sent["fsync_ns"] is None


def test_file_source_zerocopy_ring_is_never_overwritten_in_flight(tmp_path):
    # a small buffer means many ring slots get reused: corruption would show in the sink
    size = 4 * 2**20 + 1
    src, sink = tmp_path / "src", tmp_path / "sink"
    data = pattern_file(src, size)
    sent, _ = run_pair("msg_zerocopy", "read", send_kw=dict(source=str(src), buffer=4096 + 5),
                       recv_kw=dict(sink=str(sink)))
    assert sink.read_bytes() == data
    assert sent["zc_completions"] >= size // (4096 + 5)


def test_metrics_are_deltas_of_the_transfer(tmp_path):
    size = 16 * 2**20
    sent, got = run_pair("write", "read", send_kw=dict(source="mem", bytes=size), recv_kw=dict(sink="/dev/null"))
    for r in (sent, got):
        assert set(native.METRIC_KEYS) <= set(r)
        assert r["bytes"] == size
        assert 0 < r["wall_ns"] < 20e9
        assert r["utime_us"] + r["stime_us"] > 0
        assert r["utime_us"] + r["stime_us"] <= r["wall_ns"] / 1000 * 1.5 + 20_000  # one thread's CPU
        assert r["maxrss_kib"] > 0 and r["sndbuf"] > 0 and r["rcvbuf"] > 0
        assert r["tcp_snd_mss"] > 0 and r["tcp_pmtu"] > 0
    assert sent["pipe_size"] is None


def test_window_and_pipe_size_are_applied_and_read_back(tmp_path):
    size = 2**20
    sent, got = run_pair("splice", "splice",
                         send_kw=dict(source="/dev/zero", bytes=size, window="256KiB", pipe_size="1MiB"),
                         recv_kw=dict(window="512KiB", pipe_size="256KiB"))
    assert sent["sndbuf"] >= 256 * 1024      # Linux doubles the requested value
    assert got["rcvbuf"] >= 512 * 1024
    assert sent["pipe_size"] == 2**20 and got["pipe_size"] == 256 * 1024
    assert sent["params"]["window"] == 256 * 1024 and got["params"]["pipe_size"] == 256 * 1024


def test_auto_pipe_size_holds_one_sub_block():
    sent, got = run_pair("vmsplice", "vmsplice", send_kw=dict(source="mem", bytes=2**20, buffer=2**19),
                         recv_kw=dict(buffer=2**19))
    assert sent["pipe_size"] >= 2**19 and got["pipe_size"] >= 2**19


def test_cpu_pinning(tmp_path):
    before = os.sched_getaffinity(0)
    sent, got = run_pair("write", "read", send_kw=dict(source="mem", bytes=2**20, cpu=0), recv_kw=dict(cpu=0))
    assert sent["params"]["cpu"] == 0
    # the streams ran on threads of their own: the caller's CPUs are untouched
    assert os.sched_getaffinity(0) == before
    with pytest.raises(WorkerError) as ei:
        native.send("127.0.0.1", 9, "write", source="mem", bytes=1, cpu=100_000)
    assert "--cpu" in str(ei.value)


def test_fsync_is_timed_inside_the_transfer(tmp_path):
    sink = tmp_path / "sink"
    sent, got = run_pair("write", "read", send_kw=dict(source="mem", bytes=4 * 2**20),
                         recv_kw=dict(sink=str(sink), fsync=True))
    assert 0 < got["fsync_ns"] <= got["wall_ns"]
    assert sink.stat().st_size == 4 * 2**20


@pytest.mark.parametrize("recv_mode", DATA_RECV_MODES)
def test_sink_states(tmp_path, recv_mode):
    size = 1_500_007
    payload = expected_mem(0, size)
    kw = dict(source="mem", bytes=size)
    # fresh: an existing longer file is truncated
    sink = tmp_path / "fresh"
    sink.write_bytes(b"\xaa" * (size + 5000))
    run_pair("write", recv_mode, send_kw=kw, recv_kw=dict(sink=str(sink), sink_state="fresh"))
    assert sink.read_bytes() == payload
    # preallocated: fallocated to --bytes before the timed region
    sink = tmp_path / "prealloc"
    run_pair("write", recv_mode, send_kw=kw, recv_kw=dict(sink=str(sink), sink_state="preallocated", bytes=size))
    assert sink.read_bytes() == payload
    # overwrite: a longer file is written over from offset 0 and keeps its tail
    sink = tmp_path / "overwrite"
    sink.write_bytes(b"\xaa" * (size + 5000))
    run_pair("write", recv_mode, send_kw=kw, recv_kw=dict(sink=str(sink), sink_state="overwrite", bytes=size))
    assert sink.read_bytes() == payload + b"\xaa" * 5000
    # overwrite of a missing file: written once (untimed), then overwritten
    sink = tmp_path / "missing"
    run_pair("write", recv_mode, send_kw=kw, recv_kw=dict(sink=str(sink), sink_state="overwrite", bytes=size))
    assert sink.read_bytes() == payload


def test_short_transfer_is_an_error_when_bytes_given(tmp_path):
    with pytest.raises(WorkerError) as ei:
        run_pair("write", "read", send_kw=dict(source="mem", bytes=1000), recv_kw=dict(bytes=1001))
    assert ei.value.code == errno.ENODATA
    assert "recv read" in str(ei.value) and "1000 of 1001" in str(ei.value)


@pytest.mark.parametrize("side,mode,kw,needle", [
    ("recv", "mmap", dict(sink="/dev/null"), "regular file as sink"),
    ("send", "mmap", dict(source="mem", bytes=10), "source `mem`"),
    ("send", "mmap", dict(source="/dev/zero", bytes=10), "cannot map /dev/zero"),
    ("send", "sendfile", dict(source="mem", bytes=10), "source `mem`"),
    ("send", "splice", dict(source="mem", bytes=10), "source `mem`"),
])
def test_impossible_combinations_name_mode_and_reason(side, mode, kw, needle):
    with pytest.raises(WorkerError) as ei:
        if side == "recv":
            native.Receiver("127.0.0.1", 0, mode, **kw).close()
        else:
            native.send("127.0.0.1", 9, mode, **kw)  # fails before connecting
    assert ei.value.code == errno.EOPNOTSUPP
    assert str(ei.value).startswith(f"{side} {mode}: ") and needle in str(ei.value)


@pytest.mark.parametrize("kw,needle", [
    (dict(source="mem"), "--bytes is required with source mem"),
    (dict(source="/dev/zero"), "--bytes is required"),
    (dict(source="mem", bytes=10, buffer=0), "--buffer"),
    (dict(source="mem", bytes=10, buffer="2GiB"), "--buffer"),
    (dict(source="mem", bytes=10, subblocks=0), "--subblocks"),
    (dict(source="mem", bytes=10, buffer=4, subblocks=5), "subblocks (5) > buffer (4 bytes)"),
    (dict(source="mem", bytes=10, timeout=0), "--timeout"),
    (dict(source="mem", bytes="ten"), "--bytes"),
    (dict(source="/nonexistent/file", bytes=10), "cannot open source /nonexistent/file"),
])
def test_bad_values_are_einval_or_named(kw, needle):
    with pytest.raises(WorkerError) as ei:
        native.send("127.0.0.1", 9, "write", **kw)
    assert needle in str(ei.value)


def test_file_shorter_than_bytes(tmp_path):
    src = tmp_path / "src"
    pattern_file(src, 100)
    with pytest.raises(WorkerError) as ei:
        native.send("127.0.0.1", 9, "sendfile", source=str(src), bytes=101)
    assert "shorter than --bytes 101" in str(ei.value) and ei.value.code == errno.EINVAL


@pytest.mark.parametrize("kw,needle", [
    (dict(sink="/dev/null", sink_state="preallocated", bytes=10), "needs a regular file as sink, not /dev/null"),
    (dict(sink="/dev/null", fsync=True), "`fsync` needs a regular file as sink"),
    (dict(sink_state="bogus"), "--sink-state"),
])
def test_bad_sink_values(tmp_path, kw, needle):
    with pytest.raises(WorkerError) as ei:
        native.Receiver("127.0.0.1", 0, "read", **kw).close()
    assert needle in str(ei.value)


def test_preallocated_without_bytes(tmp_path):
    with pytest.raises(WorkerError) as ei:
        native.Receiver("127.0.0.1", 0, "read", sink=str(tmp_path / "s"), sink_state="preallocated").close()
    assert "it needs `bytes`" in str(ei.value)


def test_receiver_times_out_without_sender():
    rx = native.Receiver("127.0.0.1", 0, "read", timeout=0.3)
    with pytest.raises(WorkerError) as ei:
        rx.run()
    assert ei.value.code == errno.ETIMEDOUT and "waiting for the sender to connect" in str(ei.value)


def test_ipv6_loopback(tmp_path):
    rx = native.Receiver("::1", 0, "read", timeout=10)
    import threading
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", rx.run()))
    t.start()
    sent = native.send("::1", rx.port, "write", source="mem", bytes=12345, timeout=10)
    t.join(10)
    assert out["r"]["bytes"] == sent["bytes"] == 12345
    assert out["r"]["params"]["listen"] == "[::1]:0"
    assert os.path.exists("/dev/null")


def test_sender_sending_more_than_receiver_bytes_is_an_error_on_both_sides():
    import threading
    rx = native.Receiver("127.0.0.1", 0, "read", bytes=1000, timeout=10)
    out = {}

    def target():
        try:
            rx.run()
        except WorkerError as exc:
            out["recv"] = exc

    t = threading.Thread(target=target)
    t.start()
    with pytest.raises(WorkerError) as ei:
        native.send("127.0.0.1", rx.port, "write", source="mem", bytes=5000, timeout=10)
    t.join(10)
    assert out["recv"].code == errno.EPROTO and "more than --bytes 1000" in str(out["recv"])
    assert ei.value.code in (errno.ECONNRESET, errno.EPIPE)
