"""`duration:` (as iperf3 -t): the sender moves data until the time is up, the receiver reads until EOF.

Real transfers over loopback (the C core's zc_send_more is the one place every send mode stops), the worker's
refusals, and the plan's rules (one of `bytes` / `duration` per cell; the default `bytes` gives way).
"""
from __future__ import annotations

import pytest

from fixtures_spec import at, only_problem, write_yaml  # noqa: F401 (fixture)
from fixtures_worker import expected_mem, needs_native, run_pair
from zcorch.params import worker_flags
from zcorch.plan import load_plan

DURATION = 1.0

# (send mode, receive mode, source, streams): the send loops of every family, with 1 and 4 streams
CASES = [
    ("write", "read", "mem", 1),
    ("write", "read", "mem", 4),
    ("splice", "splice", "/dev/zero", 1),
    ("vmsplice", "read", "mem", 4),
    ("msg_zerocopy", "read", "mem", 1),
    ("io_uring", "io_uring", "mem", 4),
]


@pytest.mark.slow
@needs_native
@pytest.mark.parametrize("send_mode,recv_mode,source,streams", CASES, ids=[f"{c[0]}-{c[1]}-x{c[3]}" for c in CASES])
def test_each_run_lasts_its_duration_within_ten_percent(send_mode, recv_mode, source, streams):
    from zcorch.worker import native

    gone = native.unavailable_modes()
    why = gone["send"].get(send_mode) or gone["recv"].get(recv_mode)
    if why:  # a kernel without the feature: the mode refuses to run (tests/test_capabilities.py)
        pytest.skip(why)
    sent, got = run_pair(send_mode, recv_mode, send_kw=dict(duration=DURATION, source=source, streams=streams),
                         recv_kw=dict(streams=streams), timeout=10)
    for side, result in (("sender", sent), ("receiver", got)):
        wall = result["wall_ns"] / 1e9
        assert abs(wall - DURATION) <= 0.1 * DURATION, (side, wall)
    assert sent["bytes"] == got["bytes"] > 0  # the receiver got every byte sent, read until EOF


@pytest.mark.slow
@needs_native
def test_a_duration_run_delivers_the_source_byte_for_byte(tmp_path):
    sink = tmp_path / "out"
    sent, got = run_pair("write", "read", send_kw=dict(duration=0.2, buffer=65536),
                         recv_kw=dict(sink=str(sink)), timeout=10)
    data = sink.read_bytes()
    assert len(data) == sent["bytes"] == got["bytes"] and data == expected_mem(0, len(data))


@needs_native
@pytest.mark.parametrize("send_kw,recv_kw,message", [
    (dict(duration=0.2, bytes=1 << 20), {}, "`bytes` and `duration` are both set"),
    (dict(duration=0.2, source="FILE"), {}, "`duration` needs source `mem` or /dev/zero"),
    (dict(duration=0.2, streams=2), dict(streams=2, sink="SINK"), "`duration` with `streams: 2` needs sink /dev/null"),
], ids=["bytes-and-duration", "file-source", "file-sink-streams"])
@pytest.mark.slow
def test_the_worker_refuses_what_a_duration_cannot_mean(tmp_path, send_kw, recv_kw, message):
    src = tmp_path / "src"
    src.write_bytes(b"x" * 65536)
    fix = {"FILE": str(src), "SINK": str(tmp_path / "sink")}
    send_kw = {k: fix.get(v, v) if isinstance(v, str) else v for k, v in send_kw.items()}
    recv_kw = {k: fix.get(v, v) if isinstance(v, str) else v for k, v in recv_kw.items()}
    if "sink" in recv_kw:
        recv_kw["duration"] = send_kw["duration"]
    with pytest.raises(Exception, match=message):
        run_pair("write", "read", send_kw=send_kw, recv_kw=recv_kw, timeout=5)


# ---------------------------------------------------------------- the plan

def test_the_default_bytes_gives_way_to_duration(write_yaml):
    plan = load_plan(write_yaml("""
        name: t
        matrix:
          duration: [null, 2s]
        """))
    amounts = sorted((c.params["bytes"] or 0, c.params["duration"] or 0) for c in plan.cells)
    assert amounts == [(0, 2.0), (2 ** 30, 0)]
    timed = next(c.params for c in plan.cells if c.params["duration"])
    assert "--bytes" not in worker_flags("send", timed) and "--bytes" not in worker_flags("recv", timed)
    assert worker_flags("send", timed)[2:4] == ["--duration", "2"]


def test_a_cell_with_both_bytes_and_duration_is_refused_naming_file_and_line(write_yaml):
    path = write_yaml("""
        name: t
        params:
          bytes: 64MiB
        include:
          - {duration: 2s}
        """)
    problem = only_problem(path)
    assert at(problem, path, 5) and "include[0]" in problem and "`bytes` and `duration` are both set" in problem


@pytest.mark.parametrize("params,message", [
    ("{duration: 2s, send_mode: sendfile, source: /srv/in.bin}", "`duration` needs source `mem` or /dev/zero"),
    ("{duration: 2s, streams: 4, sink: /srv/out.bin}", "needs sink /dev/null"),
    ("{bytes: null}", "neither `bytes` nor `duration` is set"),
])
def test_the_plan_refuses_what_the_worker_would(write_yaml, params, message):
    path = write_yaml(f"name: t\nparams: {params}\n")
    assert message in only_problem(path)


@pytest.mark.slow
@needs_native
def test_a_short_run_is_flagged_and_a_duration_run_is_not():
    from zcorch.results import rates

    short = run_pair("write", "read", send_kw=dict(bytes=1 << 20), recv_kw=dict(bytes=1 << 20))
    timed = run_pair("write", "read", send_kw=dict(duration=1.5 * DURATION))  # ≥ 150 ticks with one CPU
    assert rates.run_cpu_resolution(*short).startswith("too short: ")  # a 1 MiB loopback run lasts ~1 ms
    for side in timed:
        assert side["host_ticks"] >= rates.MIN_TICKS and side["host_clk_tck"] > 0
    assert rates.run_cpu_resolution(*timed) == "ok"
