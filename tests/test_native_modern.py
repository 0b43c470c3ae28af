"""The modern paths through zcorch.worker.native, in-process over real loopback sockets into
real files: the io_uring send and receive modes, io_uring_zc, zerocopy_recv, and parallel streams.
Every pair must deliver the non-repeating pattern byte-identically, with one stream and with four.

A mode whose kernel feature this machine lacks is skipped with the worker's own reason (never
assumed present); the refusal itself is tested by forbidding io_uring with a real seccomp filter
(as container runtimes do) and, in test_native_build.py, by a build without the headers' feature
(native/build.py --without). Nothing here fakes the kernel.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import struct
import subprocess
import sys
import threading

import pytest

from fixtures_worker import REPO, expected_mem, needs_native, pattern_file, run_pair, worker_env

pytestmark = needs_native

from zcorch.errors import WorkerError  # noqa: E402
from zcorch.worker import native  # noqa: E402

NEW_SEND = ["io_uring", "io_uring_zc"]
NEW_RECV = ["io_uring", "zerocopy_recv"]
PRIME = 1_000_003                  # not a multiple of the page size
SIZES = [0, 1, PRIME, 6 * 2**20 + 12_345]
BUFFER = 65_537                    # divides none of the sizes
PAGE = os.sysconf("SC_PAGESIZE")
PAIRS = [(s, r) for s in NEW_SEND for r in ("read", "splice")] + \
        [(s, r) for s in ("write", "sendfile") for r in NEW_RECV]


def runnable(*modes: "tuple[str, str]") -> None:
    """Skip unless this kernel and build run every (side, mode), with the worker's reason."""
    unavailable = native.unavailable_modes()
    for side, mode in modes:
        if mode in unavailable[side]:
            pytest.skip(f"{side} mode {mode} cannot run here: {unavailable[side][mode]}")


def check_streams(result: dict, size: int, n: int) -> None:
    """Per-stream entries: consecutive 4 KiB-aligned slices that add up to the total."""
    streams = result["streams"]
    assert [s["stream"] for s in streams] == list(range(n))
    assert sum(s["bytes"] for s in streams) == result["bytes"] == size
    offsets = [s["offset"] for s in streams]
    assert offsets[0] == 0 and all(o % 4096 == 0 for o in offsets)
    for a, b in zip(streams, streams[1:]):
        assert a["offset"] + a["bytes"] == b["offset"]
    for key in ("utime_us", "stime_us", "nvcsw"):  # the totals are the streams' sums
        assert result[key] == sum(s[key] for s in streams), key
    assert result["tcp_total_retrans"] == sum(s["tcp_total_retrans"] for s in streams)
    assert max(s["wall_ns"] for s in streams) <= result["wall_ns"]


# ---------------------------------------------------------------- byte-identical transfers

@pytest.mark.parametrize("streams", [1, 4])
@pytest.mark.parametrize("send_mode,recv_mode", PAIRS)
def test_new_modes_move_a_file_byte_identically(tmp_path, send_mode, recv_mode, streams):
    runnable(("send", send_mode), ("recv", recv_mode))
    for size in SIZES:
        src, sink = tmp_path / f"src{size}", tmp_path / f"sink{size}"
        data = pattern_file(src, size, seed=size)
        sent, got = run_pair(send_mode, recv_mode,
                             send_kw=dict(source=str(src), buffer=BUFFER, streams=streams),
                             recv_kw=dict(sink=str(sink), buffer=BUFFER, streams=streams))
        assert sent["bytes"] == got["bytes"] == size, (send_mode, recv_mode, size)
        assert sink.read_bytes() == data, (send_mode, recv_mode, size, streams)
        assert sent["mode"] == send_mode and got["mode"] == recv_mode
        if streams == 1:
            assert "streams" not in sent and "streams" not in got  # one stream: the result as before
        else:
            check_streams(sent, size, streams)
            check_streams(got, size, streams)


@pytest.mark.parametrize("streams", [1, 4])
@pytest.mark.parametrize("send_mode", NEW_SEND)
@pytest.mark.parametrize("recv_mode", NEW_RECV + ["read"])
def test_source_mem_sub_blocks_and_receiver_bytes(tmp_path, send_mode, recv_mode, streams):
    # the registered pattern ring (io_uring_zc), chains that end inside a chunk (3 sub-blocks, depth 2)
    runnable(("send", send_mode), ("recv", recv_mode))
    size = 3 * 2**20 + 4_321
    sink = tmp_path / "sink"
    sent, got = run_pair(send_mode, recv_mode,
                         send_kw=dict(source="mem", bytes=size, buffer=100_000, subblocks=3, uring_depth=2,
                                      streams=streams),
                         recv_kw=dict(sink=str(sink), bytes=size, buffer=100_000, subblocks=3, uring_depth=2,
                                      streams=streams))
    assert got["bytes"] == size
    assert sink.read_bytes() == expected_mem(0, size)


@pytest.mark.parametrize("send_mode", NEW_SEND)
def test_dev_zero_source_and_small_buffers_reuse_every_slot(tmp_path, send_mode):
    # a buffer of one page and a bit: the chunk buffers are refilled many times (io_uring_zc: each only
    # after its notification; corruption would show in the sink)
    runnable(("send", send_mode))
    size = 2 * 2**20 + 3
    src, sink = tmp_path / "src", tmp_path / "sink"
    data = pattern_file(src, size)
    run_pair(send_mode, "read", send_kw=dict(source=str(src), buffer=4096 + 5, uring_depth=3),
             recv_kw=dict(sink=str(sink)))
    assert sink.read_bytes() == data
    run_pair(send_mode, "read", send_kw=dict(source="/dev/zero", bytes=size), recv_kw=dict(sink=str(sink)))
    assert sink.read_bytes() == bytes(size)


def test_receive_until_eof_with_streams_places_every_slice(tmp_path):
    # the receiver is not told --bytes: each stream learns its slice from the sender's hello
    size = 5 * 2**20 + 77
    src, sink = tmp_path / "src", tmp_path / "sink"
    data = pattern_file(src, size)
    sent, got = run_pair("write", "read", send_kw=dict(source=str(src), streams=3),
                         recv_kw=dict(sink=str(sink), streams=3))
    assert sink.read_bytes() == data
    check_streams(got, size, 3)


# ---------------------------------------------------------------- io_uring specifics

def test_io_uring_zc_reports_its_completions_copied_on_loopback():
    runnable(("send", "io_uring_zc"), ("send", "msg_zerocopy"))
    size, buf = 8 * 2**20, 2**16
    sent, got = run_pair("io_uring_zc", "read", send_kw=dict(source="mem", bytes=size, buffer=buf),
                         recv_kw=dict(sink="/dev/null"))
    # one notification per IORING_OP_SEND_ZC: one send per sub-block (here a whole buffer)
    assert sent["zc_completions"] == size // buf
    # Loopback hands the sender's pages to a local socket, so the kernel copies them (as it does for
    # MSG_ZEROCOPY): every notification carries IORING_NOTIF_USAGE_ZC_COPIED. Asserted, not hidden.
    assert sent["zc_copied"] == sent["zc_completions"]
    assert sent["uring_cqes"] == 2 * sent["zc_completions"]  # each send: its result + its notification
    assert got["zc_completions"] is None and got["zc_copied"] is None
    # the same two metrics as msg_zerocopy, with the same meaning
    zsent, _ = run_pair("msg_zerocopy", "read", send_kw=dict(source="mem", bytes=size, buffer=buf))
    assert zsent["zc_copied"] == zsent["zc_completions"] >= size // buf


@pytest.mark.parametrize("depth", [1, 5, 64])
def test_uring_depth_is_applied_and_completions_counted(tmp_path, depth):
    runnable(("send", "io_uring"), ("recv", "io_uring"))
    size, buf = 3 * 2**20 + 1, 2**15
    sink = tmp_path / "sink"
    sent, got = run_pair("io_uring", "io_uring", send_kw=dict(source="mem", bytes=size, buffer=buf, uring_depth=depth),
                         recv_kw=dict(sink=str(sink), buffer=buf, uring_depth=depth))
    assert sink.read_bytes() == expected_mem(0, size)
    assert sent["uring_cqes"] == -(-size // buf)  # one completion per IORING_OP_SEND
    assert sent["params"]["uring_depth"] == got["params"]["uring_depth"] == depth
    assert got["uring_bundle"] in (0, 1) and sent["uring_bundle"] is None   # recorded, on the receiver only
    # multishot: a completion carries at least one buffer of data, so at most one per buffer (+ the end)
    assert 1 <= got["uring_cqes"] <= -(-size // buf) + 2


def test_io_uring_receive_refuses_a_sender_sending_more_than_bytes():
    runnable(("recv", "io_uring"))
    with pytest.raises(WorkerError) as ei:
        run_pair("write", "io_uring", send_kw=dict(source="mem", bytes=300_000), recv_kw=dict(bytes=200_000))
    # the sender sees the receiver go away; the receiver's own error names the reason
    assert ei.value.code in (errno.EPIPE, errno.ECONNRESET, errno.EPROTO)
    rx = native.Receiver("127.0.0.1", 0, "io_uring", bytes=200_000, timeout=10)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("e", _catch(rx.run)))
    t.start()
    try:
        native.send("127.0.0.1", rx.port, "write", source="mem", bytes=300_000, timeout=10)
    except WorkerError:
        pass
    t.join(15)
    rx.close()
    assert isinstance(out["e"], WorkerError) and out["e"].code == errno.EPROTO
    assert "sent more than --bytes 200000" in str(out["e"])


def _catch(call):
    try:
        return call()
    except WorkerError as exc:
        return exc


# ---------------------------------------------------------------- zerocopy_recv

@pytest.mark.parametrize("send_mode", ["msg_zerocopy", "io_uring_zc"])
def test_zerocopy_recv_maps_pages_with_the_documented_link_setting(tmp_path, send_mode):
    # Over loopback only pages the kernel allocated for the transfer can be mapped: those of the copy a
    # zero-copy sender gets there (docs/experiment-files.md "zerocopy_recv"). The receiver sizes the
    # segments itself (TCP_MAXSEG: whole pages for lo's MTU), so most of the bytes must map.
    runnable(("send", send_mode), ("recv", "zerocopy_recv"))
    size = 8 * 2**20 + 12_345
    sink = tmp_path / "sink"
    sent, got = run_pair(send_mode, "zerocopy_recv", send_kw=dict(source="mem", bytes=size),
                         recv_kw=dict(sink=str(sink)))
    assert sink.read_bytes() == expected_mem(0, size)
    assert got["zc_recv_mapped"] + got["zc_recv_copied"] == got["bytes"] == size
    assert got["zc_recv_mapped"] > size // 2 and got["zc_recv_mapped"] % PAGE == 0
    assert got["tcp_rcv_mss"] % PAGE == 0  # the payload per segment is whole pages
    assert sent["zc_recv_mapped"] is None


def test_zerocopy_recv_with_an_explicit_tcp_maxseg(tmp_path):
    runnable(("send", "msg_zerocopy"), ("recv", "zerocopy_recv"))
    size = 4 * 2**20
    sent, got = run_pair("msg_zerocopy", "zerocopy_recv", send_kw=dict(source="mem", bytes=size),
                         recv_kw=dict(sink=str(tmp_path / "sink"), tcp_maxseg=PAGE + 12))
    assert got["tcp_rcv_mss"] == PAGE and got["params"]["tcp_maxseg"] == PAGE + 12
    assert got["zc_recv_mapped"] > 0 and (tmp_path / "sink").read_bytes() == expected_mem(0, size)


def test_zerocopy_recv_from_a_copying_sender_maps_nothing_and_says_so(tmp_path):
    # write() and sendfile() hand the socket pages the kernel will not map into another process
    # (their own copies, page cache): the bytes arrive by read(), and the result says so
    runnable(("recv", "zerocopy_recv"))
    size = 3 * 2**20
    src = tmp_path / "src"
    data = pattern_file(src, size)
    for send_mode in ("write", "sendfile"):
        sent, got = run_pair(send_mode, "zerocopy_recv", send_kw=dict(source=str(src)),
                             recv_kw=dict(sink=str(tmp_path / "sink")))
        assert (tmp_path / "sink").read_bytes() == data
        assert got["zc_recv_mapped"] == 0 and got["zc_recv_copied"] == size


def test_zerocopy_recv_refuses_a_connection_whose_segments_hold_less_than_a_page():
    runnable(("recv", "zerocopy_recv"))
    rx = native.Receiver("127.0.0.1", 0, "zerocopy_recv", tcp_maxseg=1400, timeout=10)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", _catch(rx.run)))
    t.start()
    with pytest.raises(WorkerError):  # the receiver refuses and closes: the sender loses its peer
        native.send("127.0.0.1", rx.port, "write", source="mem", bytes=50 * 2**20, timeout=10)
    t.join(15)
    rx.close()
    err = out["r"]
    assert isinstance(err, WorkerError) and err.code == errno.EOPNOTSUPP
    assert str(err).startswith("recv zerocopy_recv: ") and f"less than one {PAGE}-byte page" in str(err)
    assert "--tcp-maxseg" in str(err)


# ---------------------------------------------------------------- streams: the rules

@pytest.mark.slow
def test_streams_pin_each_stream_to_its_cpu_from_the_list():
    allowed = sorted(os.sched_getaffinity(0))
    sent, got = run_pair("write", "read", send_kw=dict(source="mem", bytes=2**20, streams=2,
                                                       cpus=f"{allowed[0]},{allowed[-1]}"),
                         recv_kw=dict(streams=2, cpus=str(allowed[0])))
    assert sent["params"]["cpus"] == f"{allowed[0]},{allowed[-1]}" and got["params"]["cpus"] == str(allowed[0])
    # a CPU this process may not use: the streams given it (every second one) fail, named; the first
    # failure is reported, not the others' consequences (their receivers see short transfers)
    bad = 1000 if 1000 not in allowed else 1001
    with pytest.raises(WorkerError) as ei:
        run_pair("write", "read", send_kw=dict(source="mem", bytes=2**20, streams=4, cpus=f"{allowed[0]},{bad}"),
                 recv_kw=dict(streams=4), timeout=10)
    assert ei.value.code == errno.EINVAL
    assert f"send write: stream 1 of 4: sched_setaffinity(cpu {bad})" in str(ei.value) or \
        f"send write: stream 3 of 4: sched_setaffinity(cpu {bad})" in str(ei.value)


def test_stream_count_mismatch_is_refused_with_both_counts():
    rx = native.Receiver("127.0.0.1", 0, "read", streams=4, timeout=5)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", _catch(rx.run)))
    t.start()
    try:
        native.send("127.0.0.1", rx.port, "write", source="mem", bytes=2**20, streams=2, timeout=5)
    except WorkerError:
        pass
    t.join(10)
    rx.close()
    assert isinstance(out["r"], WorkerError) and out["r"].code == errno.EPROTO
    assert "the sender runs 2 streams" in str(out["r"]) and "--streams 4" in str(out["r"])


def test_a_one_stream_mode_refuses_streams_and_bad_values_are_named(tmp_path):
    with pytest.raises(WorkerError) as ei:
        native.Receiver("127.0.0.1", 0, "mmap", sink=str(tmp_path / "s"), streams=2).close()
    assert ei.value.code == errno.EOPNOTSUPP and "one stream only" in str(ei.value)
    for kw, needle in [(dict(streams=0), "--streams"), (dict(streams=257), "--streams"),
                       (dict(uring_depth=0), "--uring-depth"), (dict(cpus="3-1"), "--cpus"),
                       (dict(cpus="x"), "--cpus")]:
        with pytest.raises(WorkerError) as ei:
            native.send("127.0.0.1", 9, "write", source="mem", bytes=1, **kw)
        assert needle in str(ei.value) and ei.value.code == errno.EINVAL, kw
    with pytest.raises(WorkerError, match="--tcp-maxseg"):
        native.Receiver("127.0.0.1", 0, "read", tcp_maxseg=40000).close()
    with pytest.raises(WorkerError, match="receiver parameters"):
        native.send("127.0.0.1", 9, "write", source="mem", bytes=1, tcp_maxseg=4108)


def test_parse_cpus():
    assert native.parse_cpus("0-2,5") == [0, 1, 2, 5] and native.parse_cpus("3") == [3]
    assert native.parse_cpus([1, "2-3"]) == [1, 2, 3] and native.parse_cpus(7) == [7]
    assert native.parse_cpus(None) is None and native.parse_cpus("") is None
    for bad in ("a", "2-1", "-1", True, "1-"):
        with pytest.raises(ValueError):
            native.parse_cpus(bad)


# ---------------------------------------------------------------- a kernel that forbids io_uring

# seccomp: classic BPF returning EPERM for io_uring_setup (425 on every architecture), allowing the rest
_NR_IO_URING_SETUP = 425


def _forbid_io_uring() -> None:  # runs in the child between fork and exec
    prog = [(0x20, 0, 0, 0),                                    # A = seccomp_data.nr
            (0x15, 0, 1, _NR_IO_URING_SETUP),                   # if A == io_uring_setup
            (0x06, 0, 0, 0x00050000 | errno.EPERM),             #   return SECCOMP_RET_ERRNO | EPERM
            (0x06, 0, 0, 0x7fff0000)]                           # return SECCOMP_RET_ALLOW
    raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw)
    fprog = struct.pack("HxxxxxxP", len(prog), ctypes.addressof(buf))
    fbuf = ctypes.create_string_buffer(fprog)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    if libc.prctl(38, 1, 0, 0, 0) != 0:                          # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if libc.prctl(22, 2, ctypes.addressof(fbuf), 0, 0) != 0:     # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")


def _worker_without_io_uring(*args: str) -> "tuple[int, list]":
    p = subprocess.run([sys.executable, "-m", "zcorch.worker", *args], cwd=REPO, env=worker_env(),
                       capture_output=True, text=True, timeout=60, preexec_fn=_forbid_io_uring)
    return p.returncode, [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


def test_io_uring_forbidden_by_seccomp_is_reported_and_refused():
    # A real seccomp filter (what Docker's default profile does to io_uring): the modes' probes see the
    # kernel refuse io_uring_setup, so `worker info` lists them as unavailable with why, and a transfer
    # is refused before it starts. The other kernel-feature modes stay runnable.
    rc, events = _worker_without_io_uring("info")
    assert rc == 0, events
    info = events[0]
    for side, mode in (("send", "io_uring"), ("send", "io_uring_zc"), ("recv", "io_uring")):
        why = info["unavailable"][side].get(mode) or ""
        if "built without" in why or "--without" in why:
            pytest.skip(f"this build has no io_uring: {why}")
        assert "not permitted" in why and "seccomp" in why and "io_uring_disabled" in why, (mode, why)
        assert mode not in info["runnable"][side]
    assert "msg_zerocopy" not in info["unavailable"]["send"]
    assert "zerocopy_recv" not in info["unavailable"]["recv"]
    rc, events = _worker_without_io_uring("recv", "--listen", "127.0.0.1:0", "--mode", "io_uring", "--timeout", "5")
    assert rc == 1 and events[-1]["event"] == "error" and events[-1]["code"] in ("EOPNOTSUPP", "ENOTSUP")
    assert events[-1]["message"].startswith("recv io_uring: cannot run on this kernel: io_uring is not permitted")
