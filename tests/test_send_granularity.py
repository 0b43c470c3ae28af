"""`mmap_grain`, `splice_grain` and `refill` (the splice-write-benchmark's LARGE_MMAP, LARGE_VECIO and write-path
memset): the sender's system calls really change with them (counted by strace on a real worker process over
loopback), the bytes received stay the source's, and the plan and the worker refuse them where they mean nothing."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from fixtures_worker import (REPO, expected_mem, needs_native, pattern_file, run_pair, run_worker, start_receiver,
                             worker_argv, worker_env)
from zcorch.config.cells import cell_problems
from zcorch.params import DEFAULTS

pytestmark = needs_native

# 2 MiB buffers: no size the interpreter or the C library maps by itself (Python's arenas are 1 MiB, malloc's
# mmaps a page more than asked), so an mmap() of the buffer's or a sub-block's size is the sender's.
BUFFER = 2 << 20
CHUNKS = 4
GRAINS = [(m, s) for m in ("whole", "subblock") for s in ("whole", "subblock")]


def traced_send(subblocks: int, mmap_grain: str, splice_grain: str) -> "tuple[dict, str]":
    """(the sender's result, strace's lines after its connect()) of a gifted vmsplice of CHUNKS buffers."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (apt-get install strace; scripts/install-system-deps lists it)")
    rx, port = start_receiver("--listen", "127.0.0.1:0", "--mode", "read", "--timeout", "30")
    try:
        argv = [strace, "-f", "-qq", "-e", "trace=connect,mmap,vmsplice,splice", *worker_argv(
            "send", "--connect", f"127.0.0.1:{port}", "--mode", "vmsplice", "--gift", "--bytes", str(CHUNKS * BUFFER),
            "--buffer", str(BUFFER), "--subblocks", str(subblocks), "--mmap-grain", mmap_grain,
            "--splice-grain", splice_grain, "--timeout", "30")]
        p = subprocess.run(argv, cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=60)
        if p.returncode != 0 and "ptrace" in p.stderr and "Operation not permitted" in p.stderr:
            pytest.skip(f"strace cannot trace here: {p.stderr.strip()[:200]}")
        assert rx.wait(30) == 0
    finally:
        rx.close()
    results = [line for line in p.stdout.splitlines() if '"event": "result"' in line]
    assert p.returncode == 0 and results, (p.stdout, p.stderr[-2000:])
    trace = p.stderr
    start = re.search(r"^(\[pid +\d+\] |\d+ +)?connect\(.*127\.0\.0\.1", trace, re.M)
    assert start, trace[-2000:]
    return json.loads(results[-1]), trace[start.start():]


def calls(trace: str, name: str, size: "int | None" = None) -> int:
    """How many calls of `name` the trace holds (an mmap() only of `size` bytes)."""
    if size is not None:
        return len(re.findall(rf"\b{name}\(NULL, {size},", trace))
    return len(re.findall(rf"(^|\] |^\d+ +){name}\(", trace, re.M))


@pytest.mark.parametrize("subblocks", [1, 16, 256])
def test_the_granularities_change_the_senders_calls(subblocks):
    sub = BUFFER // subblocks
    counted = {}
    for mmap_grain, splice_grain in GRAINS:
        sent, trace = traced_send(subblocks, mmap_grain, splice_grain)
        assert sent["bytes"] == CHUNKS * BUFFER
        # a vmsplice moves at most a pipe-full (the worker reports the pipe it got: a machine's pipe-max-size)
        unit = BUFFER if splice_grain == "whole" else sub
        per_call = min(sent["pipe_size"], unit)
        counted[mmap_grain, splice_grain] = (calls(trace, "mmap", BUFFER), calls(trace, "mmap", sub),
                                             calls(trace, "vmsplice"))
        whole_maps, sub_maps, vmsplices = counted[mmap_grain, splice_grain]
        if mmap_grain == "whole" or subblocks == 1:
            assert whole_maps == CHUNKS, (mmap_grain, splice_grain, counted)
            assert subblocks == 1 or sub_maps == 0
        else:
            assert (whole_maps, sub_maps) == (0, CHUNKS * subblocks), (mmap_grain, splice_grain, counted)
        assert vmsplices == CHUNKS * (BUFFER // unit) * -(-unit // per_call), (mmap_grain, splice_grain, counted)
        assert calls(trace, "splice") >= vmsplices
    if subblocks > 1:  # four different patterns of calls, not one pattern four times
        assert len(set(counted.values())) == 4, counted


# without gift, source mem is spliced from the pattern ring: nothing is mapped, so mmap_grain stays whole
@pytest.mark.parametrize("mmap_grain,splice_grain,subblocks,gift",
                         [(m, s, n, True) for m, s in GRAINS for n in (1, 3, 64)]
                         + [("whole", s, 64, False) for s in ("whole", "subblock")])
def test_every_granularity_delivers_the_source_bytes(tmp_path, mmap_grain, splice_grain, subblocks, gift):
    size = 5 * 131072 + 12345   # a short last buffer, sub-blocks not a page (3), the period crossed
    sink = tmp_path / "sink"
    sent, got = run_pair("vmsplice", "read",
                         send_kw=dict(source="mem", bytes=size, buffer=131072, subblocks=subblocks, gift=gift,
                                      mmap_grain=mmap_grain, splice_grain=splice_grain),
                         recv_kw=dict(sink=str(sink)))
    assert sent["bytes"] == got["bytes"] == size
    assert sink.read_bytes() == expected_mem(0, size)
    assert sent["params"]["mmap_grain"] == mmap_grain and sent["params"]["splice_grain"] == splice_grain


def test_a_file_source_is_read_into_each_sub_block_mapping(tmp_path):
    src, sink = tmp_path / "src", tmp_path / "sink"
    data = pattern_file(src, 3 * 65536 + 1000)
    sent, _ = run_pair("vmsplice", "read", send_kw=dict(source=str(src), buffer=65536, subblocks=16,
                                                        mmap_grain="subblock", splice_grain="whole"),
                       recv_kw=dict(sink=str(sink)))
    assert sent["bytes"] == len(data) and sink.read_bytes() == data


@pytest.mark.parametrize("subblocks", [1, 7, 256])
def test_refill_sends_the_source_bytes(tmp_path, subblocks):
    size = 3 * 262144 + 999
    sink = tmp_path / "sink"
    sent, _ = run_pair("write", "read", send_kw=dict(source="mem", bytes=size, buffer=262144, subblocks=subblocks,
                                                     refill=True),
                       recv_kw=dict(sink=str(sink)))
    assert sent["bytes"] == size and sent["params"]["refill"] is True
    assert sink.read_bytes() == expected_mem(0, size)


@pytest.mark.parametrize("args,needle", [
    (["--mode", "write", "--mmap-grain", "subblock"], "`mmap_grain`: send mode `write` makes no such calls"),
    (["--mode", "write", "--splice-grain", "whole"], "`splice_grain`: send mode `write` makes no such calls"),
    (["--mode", "vmsplice", "--mmap-grain", "subblock"], "source `mem` needs `gift: true`"),
    (["--mode", "vmsplice", "--refill"], "send mode `vmsplice` has none (only io_uring/io_uring_zc/msg_zerocopy/write)"),
    (["--mode", "write", "--refill", "--source", "/dev/zero"], "`refill` rewrites the pattern of source `mem`"),
    (["--mode", "vmsplice", "--mmap-grain", "sideways"], "--mmap-grain"),
])
def test_the_worker_refuses_them_where_they_mean_nothing(args, needle):
    rc, events, _ = run_worker("send", "--connect", "127.0.0.1:9", "--bytes", "1MiB", *args)
    assert rc == 1 and events[-1]["event"] == "error" and needle in events[-1]["message"], events


def test_the_plan_refuses_the_same_cells():
    base = dict(DEFAULTS, bytes=1 << 20)
    assert cell_problems(dict(base, send_mode="vmsplice", gift=True, mmap_grain="subblock", splice_grain="whole")) == []
    assert cell_problems(dict(base, send_mode="write", refill=True)) == []
    (msg,) = cell_problems(dict(base, send_mode="write", splice_grain="whole"))
    assert "`splice_grain`: send mode `write` makes no such calls (only vmsplice)" in msg
    (msg,) = cell_problems(dict(base, send_mode="vmsplice", mmap_grain="subblock"))
    assert "`mmap_grain: subblock` maps fresh buffers: source `mem` needs `gift: true`" in msg
    (msg,) = cell_problems(dict(base, send_mode="sendfile", source="/srv/f", refill=True))
    assert "`refill` fills a buffer of the sender's own: send mode `sendfile` has none (only io_uring/io_uring_zc/msg_zerocopy/write)" in msg
    (msg,) = cell_problems(dict(base, send_mode="write", source="/dev/zero", refill=True))
    assert "`refill` rewrites the pattern of source `mem`" in msg
