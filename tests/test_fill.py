"""`refill` with `fill: rand_crc32`: the per-message work of a sender that makes and checksums its data
(nettest's xmit, the zero-copy-output-2011 study), in every send mode with a buffer of its own. The bytes
received are the fill's own PRNG stream, the sender's user CPU really grows with it (a real loopback
transfer, interleaved with its peer), and the planner and the worker refuse it where it means nothing."""
from __future__ import annotations

import statistics
import struct
from pathlib import Path

import pytest

from fixtures_worker import needs_native, run_pair, run_worker
from zcorch.config.capabilities import with_capability
from zcorch.config.cells import cell_problems
from zcorch.params import DEFAULTS
from zcorch.plan import load_plan
from zcorch.worker import native

pytestmark = needs_native
REPO = Path(__file__).resolve().parent.parent
M32 = 0xFFFFFFFF


def rand_fill(where: int, length: int) -> bytes:
    """native/core/fill.c's message at transfer offset `where`, written again in Python: the test holds
    the C code to the documented stream (rand()'s LCG step times a per-message seed)."""
    state = ((where ^ (where >> 32)) | 1) & M32
    seed = (((where >> 16) & M32) * 2654435761 + 1) & M32
    words = []
    for _ in range(length // 4):
        state = (state * 1103515245 + 12345) & M32
        words.append((((state >> 16) & 0x7FFF) * seed) & M32)
    tail = bytes((i * seed) & 0xFF for i in range(len(words) * 4, length))
    return struct.pack(f"<{len(words)}I", *words) + tail


def expected(size: int, buffer: int, subblocks: int) -> bytes:
    sub = -(-buffer // subblocks)
    out = bytearray()
    for chunk in range(0, size, buffer):
        clen = min(buffer, size - chunk)
        for o in range(0, clen, sub):
            out += rand_fill(chunk + o, min(sub, clen - o))
    return bytes(out)


def available(mode: str) -> None:
    why = native.unavailable_modes()["send"].get(mode)
    if why:
        pytest.skip(f"send mode {mode} cannot run here: {why}")


def test_the_modes_with_a_buffer_of_their_own_take_it():
    assert with_capability("refill") == ["io_uring", "io_uring_zc", "msg_zerocopy", "write"]
    base = dict(DEFAULTS, bytes=1 << 20, refill=True, fill="rand_crc32")
    for mode in ("write", "msg_zerocopy", "io_uring", "io_uring_zc"):
        assert cell_problems(dict(base, send_mode=mode)) == [], mode
    (msg,) = cell_problems(dict(base, send_mode="vmsplice"))
    assert msg == ("`refill` fills a buffer of the sender's own: send mode `vmsplice` has none "
                   "(only io_uring/io_uring_zc/msg_zerocopy/write)")
    (msg,) = cell_problems(dict(base, send_mode="write", source="/dev/zero"))
    assert "`refill` rewrites the pattern of source `mem`" in msg
    (msg,) = cell_problems(dict(DEFAULTS, bytes=1 << 20, fill="rand_crc32"))
    assert msg == "`fill: rand_crc32` says what `refill` writes into each message: it needs `refill: true`"


@pytest.mark.parametrize("args,needle", [
    (["--mode", "vmsplice", "--refill", "--fill", "rand_crc32"],
     "send mode `vmsplice` has none (only io_uring/io_uring_zc/msg_zerocopy/write)"),
    (["--mode", "write", "--fill", "rand_crc32"], "`fill: rand_crc32` says what `refill` writes"),
    (["--mode", "msg_zerocopy", "--refill", "--fill", "sideways"], "--fill"),
])
def test_the_worker_refuses_the_same(args, needle):
    rc, events, _ = run_worker("send", "--connect", "127.0.0.1:9", "--bytes", "1MiB", *args)
    assert rc == 1 and events[-1]["event"] == "error" and needle in events[-1]["message"], events


@pytest.mark.parametrize("mode,subblocks", [("write", 1), ("write", 7), ("msg_zerocopy", 1), ("msg_zerocopy", 3),
                                            ("io_uring", 3), ("io_uring_zc", 3)])
def test_the_receiver_gets_the_fills_stream(tmp_path, mode, subblocks):
    available(mode)
    size, buffer = 3 * 65536 + 999, 65536
    sink = tmp_path / "sink"
    sent, got = run_pair(mode, "read", send_kw=dict(source="mem", bytes=size, buffer=buffer, subblocks=subblocks,
                                                    refill=True, fill="rand_crc32"),
                         recv_kw=dict(sink=str(sink)))
    assert sent["bytes"] == got["bytes"] == size and sent["params"]["fill"] == "rand_crc32"
    assert sink.read_bytes() == expected(size, buffer, subblocks)


@pytest.mark.serial   # it compares two sweeps' user CPU: another test's load would fall on one of them
def test_msg_zerocopy_with_the_fill_costs_the_sender_user_cpu():
    available("msg_zerocopy")
    size = 128 << 20
    per_gib: "dict[bool, list[float]]" = {False: [], True: []}
    for _ in range(3):   # interleaved: the machine's load falls on both alike
        for filled in (False, True):
            kw = dict(source="mem", bytes=size, buffer=65536, refill=filled, fill="rand_crc32" if filled else "pattern")
            sent, _ = run_pair("msg_zerocopy", "read", send_kw=kw, recv_kw=dict(sink="/dev/null"), timeout=60)
            assert sent["bytes"] == size
            per_gib[filled].append(sent["utime_us"] / (size / 2**30))
    plain, filled = statistics.median(per_gib[False]), statistics.median(per_gib[True])
    print(f"sender user CPU per GiB, msg_zerocopy 64 KiB messages: plain {plain:.0f} µs, "
          f"rand_crc32 {filled:.0f} µs ({per_gib})")
    assert filled > 0 and filled > 1.2 * plain, per_gib


def test_the_zero_copy_study_fills_its_write_cells_as_the_blog_did():
    plan = load_plan(str(REPO / "experiments/zero-copy-output-2011.yaml"), [], None)
    cells = {c.params["send_mode"]: c.params for c in plan.cells}
    assert set(cells) == {"vmsplice", "write"}
    assert cells["write"]["refill"] is True and cells["write"]["fill"] == "rand_crc32"
    assert cells["vmsplice"]["refill"] is False   # no buffer it may rewrite: the study says so
    text = (REPO / "experiments/zero-copy-output-2011.yaml").read_text()
    assert "not comparable" in text and "fill: rand_crc32" in text
