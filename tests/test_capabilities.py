"""Mode capabilities declared in the C ops tables: the table as Python reads it, the C refusals behind
each flag (real API calls, real sockets and files), `zcorch worker info`, and the planner's cell
checks agreeing with what the worker really refuses over the whole send x recv x source x sink grid."""
from __future__ import annotations

import errno
import itertools
import re
import signal
import socket
import string
import struct
import threading
import time

import pytest

from fixtures_worker import needs_native, pattern_file, run_pair, run_worker

pytestmark = needs_native

from zcorch.config import capabilities, capabilities_table  # noqa: E402
from zcorch.config.experiment import DEFAULTS, cell_problems  # noqa: E402
from zcorch.errors import WorkerError  # noqa: E402
from zcorch.params import CELL_RULES  # noqa: E402
from zcorch.worker import native  # noqa: E402

# The modes and flags as the committed table declares them (tests/test_capability_table.py holds it equal to
# the built worker's); each test below checks that a declared flag is real behaviour of the mode.
DECLARED = capabilities.mode_capabilities()
NBYTES = 64 * 1024 + 3


def caps(side: str, mode: str) -> "frozenset[str]":
    return native.mode_capabilities()[side][mode]


def all_modes(side: str) -> "list[str]":
    return native.compiled_modes()[side]


def test_capability_names_are_the_c_bits_in_order():
    names = native.capability_names()
    assert names == capabilities_table.CAPABILITY_NAMES
    for i, name in enumerate(names):  # each name is the ZC_CAP_* macro of its bit
        assert getattr(native.lib, f"ZC_CAP_{name.upper()}") == 1 << i
    assert native.lib.ZC_CAP_ALL == (1 << len(names)) - 1
    # only single ZC_CAP_* bits have a name
    for value in (0, 3, native.lib.ZC_CAP_ALL + 1):
        assert native.lib.zc_cap_name(value) == native.ffi.NULL


def test_the_worker_declares_every_mode_in_registry_order():
    table = native.mode_capabilities()
    assert table == DECLARED
    assert [list(modes) for modes in table.values()] == [all_modes("send"), all_modes("recv")]
    assert all(isinstance(c, frozenset) for modes in table.values() for c in modes.values())
    table["send"]["write"] = frozenset({"x"})  # callers get a copy: the cache stays intact
    assert caps("send", "write") == DECLARED["send"]["write"]


def test_unknown_modes_through_the_c_api():
    why = native.ffi.new("char[]", 64)
    assert native.lib.zc_mode_caps(0, b"nope") == 0
    assert native.lib.zc_mode_available(1, b"nope", why, len(why)) == -1
    assert native.lib.zc_mode_available(0, b"write", why, len(why)) == 1 and native.ffi.string(why) == b""


def _closed_port():
    """A port bound but not listening, so a sender that gets past its setup fails with ECONNREFUSED."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s


@pytest.mark.parametrize("mode", list(DECLARED["recv"]))
def test_file_sink_flag_matches_the_refusal_of_dev_null(mode):
    if "file_sink" in caps("recv", mode):
        with pytest.raises(WorkerError) as ei:
            native.Receiver("127.0.0.1", 0, mode, sink="/dev/null").close()
        assert ei.value.code == errno.EOPNOTSUPP and str(ei.value).startswith(f"recv {mode}: ")
    else:
        with native.Receiver("127.0.0.1", 0, mode, sink="/dev/null") as rx:
            assert rx.port > 0


@pytest.mark.parametrize("mode", list(DECLARED["recv"]))
def test_no_sink_flag_matches_the_refusal_of_a_file_sink(tmp_path, mode):
    sink = tmp_path / "sink"
    if "no_sink" in caps("recv", mode):
        with pytest.raises(WorkerError) as ei:
            native.Receiver("127.0.0.1", 0, mode, sink=str(sink)).close()
        assert ei.value.code == errno.EOPNOTSUPP and str(ei.value).startswith(f"recv {mode}: ")
        assert "/dev/null" in str(ei.value)
    else:
        with native.Receiver("127.0.0.1", 0, mode, sink=str(sink)) as rx:
            assert rx.port > 0


@pytest.mark.parametrize("mode", list(DECLARED["send"]))
@pytest.mark.parametrize("source,flags", [("mem", {"file_source", "mappable_source"}),
                                          ("/dev/zero", {"mappable_source"})])
def test_source_flags_match_the_refusals(mode, source, flags):
    with _closed_port() as s:
        with pytest.raises(WorkerError) as ei:
            native.send("127.0.0.1", s.getsockname()[1], mode, source=source, bytes=NBYTES, timeout=5)
    if caps("send", mode) & flags:
        assert ei.value.code == errno.EOPNOTSUPP and str(ei.value).startswith(f"send {mode}: ")
    else:  # got past setup: only the connection failed
        assert ei.value.code == errno.ECONNREFUSED, str(ei.value)


@pytest.mark.parametrize("send_mode,recv_mode", [("splice", "splice"), ("vmsplice", "vmsplice"),
                                                 ("write", "read"), ("sendfile", "mmap")])
def test_pipe_flag_matches_a_reported_pipe_size(tmp_path, send_mode, recv_mode):
    src = tmp_path / "src"
    pattern_file(src, NBYTES)
    sent, got = run_pair(send_mode, recv_mode, send_kw=dict(source=str(src)), recv_kw=dict(sink=str(tmp_path / "o")))
    for side, r in (("send", sent), ("recv", got)):
        assert (r["pipe_size"] is not None) == ("pipe" in caps(side, r["mode"])), (side, r["mode"])


@pytest.mark.parametrize("mode", [m for m, c in DECLARED["send"].items() if "zc_completions" in c])
def test_zc_completions_flag_means_completions_are_counted(mode):
    sent, got = run_pair(mode, "read", send_kw=dict(source="mem", bytes=4 * NBYTES))
    assert sent["zc_completions"] > 0 and got["zc_completions"] is None


def test_kernel_feature_modes_are_probed_and_run_here():
    # Only modes declaring a kernel feature can be unavailable. Each flagged mode this kernel (and
    # build) can run must really transfer; one it cannot must be refused with the probe's reason.
    # MSG_ZEROCOPY (Linux 4.14) runs on any kernel the suite supports; io_uring may be forbidden (a
    # seccomp filter, kernel.io_uring_disabled) or too old: tests/test_native_modern.py forbids it.
    unavailable = native.unavailable_modes()
    flagged = [(s, m) for s in ("send", "recv") for m in all_modes(s) if "kernel_feature" in caps(s, m)]
    assert ("send", "msg_zerocopy") in flagged and ("recv", "discard") in flagged
    assert all(mode in dict.fromkeys(m for s, m in flagged) for side in unavailable for mode in unavailable[side])
    # this kernel discards TCP data with recv(MSG_TRUNC) (one copying on MSG_TRUNC cannot be produced in a test)
    assert "msg_zerocopy" not in unavailable["send"] and "discard" not in unavailable["recv"]
    for side, mode in flagged:
        send_mode, recv_mode = (mode, "read") if side == "send" else ("write", mode)
        if mode in unavailable[side]:
            with pytest.raises(WorkerError) as ei:
                run_pair(send_mode, recv_mode, send_kw=dict(source="mem", bytes=NBYTES))
            assert ei.value.code == errno.EOPNOTSUPP and unavailable[side][mode] in str(ei.value)
            continue
        sent, got = run_pair(send_mode, recv_mode, send_kw=dict(source="mem", bytes=NBYTES))
        assert sent["bytes"] == got["bytes"] == NBYTES


def test_worker_info_reports_capabilities_and_availability():
    rc, events, _ = run_worker("info")
    assert rc == 0 and len(events) == 1
    info = events[0]
    assert info["capabilities"] == {side: {m: sorted(c) for m, c in modes.items()} for side, modes in DECLARED.items()}
    assert info["unavailable"] == native.unavailable_modes()
    assert list(info["modes"]) == ["send", "recv"]  # the existing keys stay
    # runnable = compiled minus unavailable, in registry order; build = what native/build.py's probes found
    assert info["runnable"] == {s: [m for m in info["modes"][s] if m not in info["unavailable"][s]]
                                for s in ("send", "recv")}
    assert set(info["build"]) == {"io_uring", "io_uring_send_zc", "io_uring_pbuf_ring", "tcp_zerocopy_receive"}
    assert all(why is None or "built" in why for why in info["build"].values())


# ---------------------------------------------------------------- the planner agrees with the worker

HELLO_MAGIC = 0x325343a5   # native/core/net.c ZC_HELLO_MAGIC


def worker_outcome(send_mode: str, recv_mode: str, source: str, sink: str) -> "WorkerError | None":
    """Run the cell for real (receiver thread + sender); the WorkerError of whichever side refused."""
    try:
        rx = native.Receiver("127.0.0.1", 0, recv_mode, sink=sink, timeout=20)
    except WorkerError as exc:
        return exc
    out: dict = {}

    def receive() -> None:
        try:
            out["result"] = rx.run()
        except WorkerError as exc:
            out["error"] = exc

    t = threading.Thread(target=receive)
    t.start()
    try:
        sent = native.send("127.0.0.1", rx.port, send_mode, source=source, bytes=NBYTES, timeout=20)
    except WorkerError as exc:
        # refused before connecting: a stream hello of no bytes (zero nonce, one stream: what
        # native/core/net.c expects first) lets the receiver finish at once; a bare connection is dropped
        with socket.create_connection(("127.0.0.1", rx.port)) as s:
            s.sendall(struct.pack("<IIIIQQ", HELLO_MAGIC, 0, 1, 0, 0, 0) + bytes(16))
        t.join(25)
        return exc
    finally:
        t.join(25)
        rx.close()
    if "error" in out:
        return out["error"]
    assert sent["bytes"] == out["result"]["bytes"] == NBYTES
    return None


@pytest.mark.slow
def test_cell_problems_agree_with_the_worker_over_the_whole_grid(tmp_path):
    src = tmp_path / "src"
    pattern_file(src, NBYTES)
    disagreements = []
    grid = itertools.product(all_modes("send"), all_modes("recv"), ["mem", "/dev/zero", str(src)], ["/dev/null", "file"])
    for i, (send_mode, recv_mode, source, sink) in enumerate(grid):
        sink = str(tmp_path / f"sink{i}") if sink == "file" else sink
        planned = cell_problems(dict(DEFAULTS, send_mode=send_mode, recv_mode=recv_mode, source=source, sink=sink))
        refused = worker_outcome(send_mode, recv_mode, source, sink)
        assert refused is None or refused.code == errno.EOPNOTSUPP, str(refused)
        if bool(planned) != (refused is not None):
            disagreements.append((send_mode, recv_mode, source, sink, planned, str(refused)))
    assert disagreements == []


def test_gift_check_follows_the_gift_flag():
    for send_mode, recv_mode in itertools.product(all_modes("send"), all_modes("recv")):
        sink = "/dev/null" if "no_sink" in caps("recv", recv_mode) else "/x/sink"  # a sink the receive mode takes
        cell = dict(DEFAULTS, send_mode=send_mode, recv_mode=recv_mode, gift=True, source="/x/src", sink=sink)
        problems = cell_problems(cell)
        honoured = "gift" in caps("send", send_mode) | caps("recv", recv_mode)
        assert problems == ([] if honoured else ["`gift` (SPLICE_F_GIFT) only applies to the vmsplice modes"])


@pytest.mark.parametrize("side", ["send", "recv"])
def test_parameter_flags_match_what_the_worker_validates(side):
    # grain, refill, one_stream: the worker's checks on parameters alone (zc_validate opens nothing);
    # a refusal must be that flag's own rule (a file-source mode gets a file, so its source is no reason)
    probes = {"grain": (dict(splice_grain="whole"), "makes no such calls"),
              "refill": (dict(refill=True), "fills a buffer of the sender's own"),
              "one_stream": (dict(streams=2), "handles one stream only")}
    for mode in all_modes(side):
        source = {} if side == "recv" else {"source": "/x/src" if caps(side, mode) & {"file_source",
                                                                                      "mappable_source"} else "mem"}
        for flag, (given, words) in probes.items():
            if flag != "one_stream" and side == "recv":
                continue  # send parameters
            try:
                native.validate(side, mode, **source, **given)
                refused = ""
            except WorkerError as exc:
                refused = str(exc)
            wanted = (flag in caps(side, mode)) == (flag == "one_stream")  # one_stream refuses, the others allow
            assert (words in refused) == wanted and (refused == "" or wanted), (side, mode, flag, refused)


def _rule_pattern(template: str) -> str:
    """A regular expression matching the messages of a CELL_RULES template, whatever fills its fields."""
    return "".join(re.escape(literal) + (".+?" if field is not None else "")
                   for literal, field, _, _ in string.Formatter().parse(template))


def _worker_words(side: str, mode: str, **params) -> str:
    """The worker's refusal of a side's parameters (sink prepared, source opened, mode set up: nothing
    connects), without the "<side> <mode>: " every worker error starts with."""
    try:
        if side == "recv":
            native.Receiver("127.0.0.1", 0, mode, **params).close()
        else:
            with _closed_port() as s:
                native.send("127.0.0.1", s.getsockname()[1], mode, timeout=5, **params)
    except WorkerError as exc:
        text, prefix = str(exc), f"{side} {mode}: "
        assert text.startswith(prefix), text
        return text[len(prefix):]
    raise AssertionError(f"the worker took {side} {mode} {params}")


def test_the_planner_and_the_worker_refuse_with_the_same_words(tmp_path):
    src, sink = str(tmp_path / "src"), str(tmp_path / "sink")
    pattern_file(src, NBYTES)
    # rule: (side, mode, the worker's parameters, the cell's besides DEFAULTS)
    cases = {
        "file_sink": ("recv", "mmap", dict(sink="/dev/null"), dict(recv_mode="mmap")),
        "no_sink": ("recv", "discard", dict(sink=sink), dict(recv_mode="discard", sink=sink)),
        "file_source": ("send", "sendfile", dict(bytes=NBYTES), dict(send_mode="sendfile")),
        "mappable_source": ("send", "mmap", dict(source="/dev/zero", bytes=NBYTES),
                            dict(send_mode="mmap", source="/dev/zero")),
        "grain": ("send", "write", dict(splice_grain="whole", mmap_grain="subblock", bytes=NBYTES),
                  dict(splice_grain="whole", mmap_grain="subblock")),
        "grain_needs_gift": ("send", "vmsplice", dict(mmap_grain="subblock", bytes=NBYTES),
                             dict(send_mode="vmsplice", mmap_grain="subblock")),
        "refill": ("send", "sendfile", dict(refill=True, source=src),
                   dict(send_mode="sendfile", refill=True, source=src)),
        "refill_needs_mem": ("send", "write", dict(refill=True, source="/dev/zero", bytes=NBYTES),
                             dict(refill=True, source="/dev/zero")),
        "fill_needs_refill": ("send", "write", dict(fill="rand_crc32", bytes=NBYTES), dict(fill="rand_crc32")),
        "one_stream": ("recv", "mmap", dict(streams=2, sink=sink), dict(recv_mode="mmap", streams=2, sink=sink)),
        "subblocks": ("send", "write", dict(buffer=4096, subblocks=8192, bytes=NBYTES),
                      dict(buffer=4096, subblocks=8192)),
        "fsync_sink": ("recv", "read", dict(fsync=True), dict(fsync=True)),
        "sink_state_sink": ("recv", "read", dict(sink_state="overwrite", bytes=NBYTES), dict(sink_state="overwrite")),
        "sink_state_bytes": ("recv", "read", dict(sink_state="preallocated", duration=0.2, sink=sink),
                             dict(sink_state="preallocated", duration=0.2, bytes=None, sink=sink)),
        "bytes_and_duration": ("send", "write", dict(bytes=NBYTES, duration=0.2), dict(duration=0.2)),
        "duration_source": ("send", "write", dict(duration=0.2, source=src),
                            dict(duration=0.2, bytes=None, source=src)),
        "duration_streams": ("recv", "read", dict(duration=0.2, streams=2, sink=sink + "2"),
                             dict(duration=0.2, bytes=None, streams=2, sink=sink + "2")),
    }
    assert set(cases) == set(CELL_RULES)  # a new rule needs its case here
    for rule, (side, mode, params, cell) in cases.items():
        words = _worker_words(side, mode, **params)
        assert cell_problems(dict(DEFAULTS, **cell)) == [words], rule
        assert re.fullmatch(_rule_pattern(CELL_RULES[rule]), words), (rule, words)  # this rule's own words


# ---------------------------------------------------------------- the one EINTR/EAGAIN retry helper

@pytest.mark.parametrize("send_mode,recv_mode", [("write", "read"), ("sendfile", "splice"),
                                                 ("msg_zerocopy", "vmsplice"), ("io_uring", "io_uring"),
                                                 ("io_uring_zc", "zerocopy_recv")])
def test_transfers_survive_signals_interrupting_their_calls(tmp_path, send_mode, recv_mode):
    for side, mode in (("send", send_mode), ("recv", recv_mode)):
        why = native.unavailable_modes()[side].get(mode)
        if why:
            pytest.skip(f"{side} mode {mode} cannot run here: {why}")
    # Python installs its handlers without SA_RESTART, so the blocked socket/pipe calls of both sides
    # return EINTR again and again; each must be retried without losing or repeating a byte.
    size = 32 * 2**20 + 5
    src, sink = tmp_path / "src", tmp_path / "sink"
    data = pattern_file(src, size)
    hits = []
    old = signal.signal(signal.SIGUSR1, lambda *a: hits.append(1))
    rx = native.Receiver("127.0.0.1", 0, recv_mode, sink=str(sink), bytes=size, buffer=65536, timeout=30)
    out: dict = {}
    release = threading.Event()

    def side(key, call) -> None:
        try:
            out[key] = call()
        except BaseException as exc:  # re-raised below
            out[key] = exc
        release.wait()  # stay alive until the signals stop: pthread_kill needs a live thread

    threads = [threading.Thread(target=side, args=("recv", rx.run)),
               threading.Thread(target=side, args=("send", lambda: native.send(
                   "127.0.0.1", rx.port, send_mode, source=str(src), buffer=65536, timeout=30)))]
    sent_signals = 0
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 40
        while len(out) < 2 and time.monotonic() < deadline:
            for t in threads:
                signal.pthread_kill(t.ident, signal.SIGUSR1)
                sent_signals += 1
            time.sleep(0.0005)
    finally:
        release.set()
        for t in threads:
            t.join(40)
        rx.close()
        signal.signal(signal.SIGUSR1, old)
    for r in out.values():
        if isinstance(r, BaseException):
            raise r
    assert out["send"]["bytes"] == out["recv"]["bytes"] == size
    assert sink.read_bytes() == data
    assert sent_signals > 20 and hits
