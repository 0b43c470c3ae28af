"""The C core's host view over real loopback transfers: /proc snapshots around the timed region
(native/core/hoststat.c parsed by zcorch.worker.hoststat), the per-interval sampler thread, the
copy-cost calibration (native/core/calibrate.c, `zcorch worker calibrate`) and the `discard` receive
mode (recv(MSG_TRUNC): no bytes are kept, so only counts can be checked)."""
from __future__ import annotations

import errno
import math
import os
import threading
import time

import pytest

from fixtures_worker import needs_native, run_pair, run_worker

pytestmark = needs_native

from zcorch.config.experiment import DEFAULTS, cell_problems  # noqa: E402
from zcorch.errors import WorkerError  # noqa: E402
from zcorch.params import HOST_BUSY_FIELDS, HOST_CPU_FIELDS  # noqa: E402
from zcorch.worker import native  # noqa: E402

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def online_cpus() -> int:
    """CPUs /proc/stat lists now (what host_ncpus counts)."""
    with open("/proc/stat") as f:
        return sum(1 for line in f if line.startswith("cpu") and line[3].isdigit())


def host_seconds(r: dict, fields) -> float:
    return sum(r[f"host_{f}_us"] for f in fields) / 1e6


def test_host_cpu_over_a_transfer_is_consistent_with_the_clock():
    size = 128 * 2**20
    sent, got = run_pair("write", "read", send_kw=dict(source="mem", bytes=size), recv_kw=dict(sink="/dev/null"))
    for r in (sent, got):
        ncpu = r["host_ncpus"]
        assert ncpu == online_cpus()
        window = r["host_window_ns"] / 1e9
        assert r["wall_ns"] / 1e9 <= window < r["wall_ns"] / 1e9 + 1.0  # the window brackets the timed region
        busy, total = host_seconds(r, HOST_BUSY_FIELDS), host_seconds(r, HOST_CPU_FIELDS)
        slack = ncpu * len(HOST_CPU_FIELDS) * TICK_S    # /proc/stat counts whole ticks per CPU and field
        # physics: no more busy CPU time than there were CPUs, and every CPU's time accounted for
        assert 0 < busy <= ncpu * window + slack
        assert abs(total - ncpu * window) <= slack + 0.1 * ncpu * window
        per_cpu = r["host_per_cpu_us"]
        assert len(per_cpu) == ncpu and all(len(v) == len(HOST_CPU_FIELDS) for v in per_cpu.values())
        for i, f in enumerate(HOST_CPU_FIELDS):
            assert abs(sum(v[i] for v in per_cpu.values()) / 1e6 - r[f"host_{f}_us"] / 1e6) <= ncpu * TICK_S
        # loopback hands every segment to the NET_RX softirq; at most 64 KiB a segment
        assert r["host_net_rx_softirqs"] > 0
        assert r["host_tcp_out_segs"] >= size // 65536 and r["host_tcp_in_segs"] >= size // 65536
        assert r["host_pgfault"] >= 0 and r["host_tcp_retrans_segs"] >= 0
    with open("/proc/sys/kernel/random/boot_id") as f:
        assert sent["host_boot_id"] == got["host_boot_id"] == f.read().strip()
    assert sent["samples"] is None  # no sample_interval: no sampler


def test_samples_of_a_transfer_longer_than_three_intervals(tmp_path):
    # The sender reads a FIFO that a thread feeds in 8 pieces 0.1 s apart: a slow transfer without load.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    piece, pieces = 256 * 1024, 8
    size = piece * pieces

    def feed() -> None:
        with open(fifo, "wb") as f:
            for _ in range(pieces):
                f.write(os.urandom(piece))
                f.flush()
                time.sleep(0.1)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        sent, got = run_pair("write", "read", send_kw=dict(source=str(fifo), bytes=size, sample_interval=0.05),
                             recv_kw=dict(sink="/dev/null", sample_interval="50ms"))
    finally:
        feeder.join(10)
    for r in (sent, got):
        assert r["params"]["sample_interval"] == 0.05
        smp = r["samples"]
        assert smp["interval_s"] == 0.05 and smp["error"] is None and smp["dropped"] is False
        rows = smp["rows"]
        wall = r["wall_ns"] / 1e9
        assert wall >= 0.6 and len(rows) >= wall / 0.05 * 0.5   # about one per interval, a late wake-up skips one
        ts = [s["t_s"] for s in rows]
        assert ts == sorted(ts) and 0 < ts[0] and abs(ts[-1] - wall) < 0.05  # the last one: the end
        for key in ("bytes", "proc_cpu_s", "host_busy_s", "host_idle_s"):   # cumulative since the start
            values = [s[key] for s in rows]
            assert values == sorted(values) and values[0] >= 0, key
        assert rows[-1]["bytes"] == size and 0 < rows[len(rows) // 2]["bytes"] < size
        assert all(s["tcp_snd_cwnd"] > 0 and s["tcp_rtt_us"] >= 0 and s["tcp_total_retrans"] >= 0 for s in rows)
        # a sampled transfer mostly waits here: the machine is far from busy on every CPU
        assert rows[-1]["host_busy_s"] <= r["host_ncpus"] * ts[-1] + r["host_ncpus"] * TICK_S * 6


def test_no_samples_below_three_intervals_and_bad_intervals():
    sent, got = run_pair("write", "read", send_kw=dict(source="mem", bytes=2**20, sample_interval=30),
                         recv_kw=dict(sample_interval=0))
    assert sent["samples"] is None and got["samples"] is None and got["params"]["sample_interval"] is None
    for bad, needle in (("-1s", "--sample-interval"),
                        ("0.0001", "--sample-interval: expected a duration between 0.001s")):
        with pytest.raises(WorkerError) as ei:
            native.send("127.0.0.1", 9, "write", source="mem", bytes=1, sample_interval=bad)
        assert ei.value.code == errno.EINVAL and needle in str(ei.value)


def test_the_worker_cli_takes_the_interval_and_reports_the_host_view():
    rc, events, err = run_worker("recv", "--listen", "127.0.0.1:0", "--mode", "discard", "--sample-interval", "bogus")
    assert rc == 1 and events[-1]["event"] == "error" and "--sample-interval" in events[-1]["message"]


def test_calibration_returns_positive_finite_yardsticks():
    before = os.sched_getaffinity(0)
    cal = native.calibrate(8 * 2**20, cpu=0)
    # pinned while it measured, then this thread has its CPUs back (the processes it starts later too)
    assert os.sched_getaffinity(0) == before
    for key, value in cal.items():
        if key != "cpu":
            assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, key
    assert cal["cpu"] == 0 and cal["memcpy_bytes"] == 8 * 2**20 and cal["memcpy_rounds"] >= 5
    assert cal["memcpy_best_ns"] <= cal["memcpy_ns"]
    assert cal["memcpy_s_per_gib"] == pytest.approx(cal["memcpy_ns"] / 1e9 * 128)
    assert cal["fault_pages"] == 8 * 2**20 // cal["page_size"]
    assert cal["fault_minflt"] >= 0.9 * cal["fault_pages"]   # each first touch of a fresh page faults
    assert cal["syscall_ns_per_call"] == pytest.approx(cal["syscall_ns"] / cal["syscall_calls"])
    with pytest.raises(WorkerError) as ei:
        native.calibrate(1000)
    assert ei.value.code == errno.EINVAL and "--bytes" in str(ei.value)


def test_worker_calibrate_action():
    rc, events, _ = run_worker("calibrate", "--bytes", "4MiB")
    assert rc == 0 and len(events) == 1 and events[0]["event"] == "calibration"
    assert events[0]["memcpy_bytes"] == 4 * 2**20 and events[0]["memcpy_s_per_gib"] > 0
    assert events[0]["boot_id"] and events[0]["kernel"]
    rc, events, _ = run_worker("calibrate", "--bytes", "lots")
    assert rc == 1 and events[-1]["event"] == "error" and "--bytes" in events[-1]["message"]


# ---------------------------------------------------------------- discard

@pytest.mark.parametrize("size", [0, 1, 1_000_003, 6 * 2**20 + 12_345])
@pytest.mark.parametrize("send_mode", ["write", "sendfile", "msg_zerocopy"])
def test_discard_moves_the_bytes(tmp_path, send_mode, size):
    src = tmp_path / "src"
    src.write_bytes(os.urandom(size))
    sent, got = run_pair(send_mode, "discard", send_kw=dict(source=str(src), buffer=65_537),
                         recv_kw=dict(buffer=65_537))
    assert sent["bytes"] == got["bytes"] == size
    assert got["mode"] == "discard" and got["pipe_size"] is None


def test_discard_with_bytes_and_subblocks_and_a_sender_that_sends_more():
    size = 3 * 2**20 + 777
    sent, got = run_pair("write", "discard", send_kw=dict(source="mem", bytes=size, buffer=100_000, subblocks=3),
                         recv_kw=dict(bytes=size, buffer=100_000, subblocks=3))
    assert sent["bytes"] == got["bytes"] == size
    with pytest.raises(WorkerError) as ei:
        run_pair("write", "discard", send_kw=dict(source="mem", bytes=size), recv_kw=dict(bytes=size - 1))
    assert "more than --bytes" in str(ei.value)


def test_discard_refuses_a_file_sink_in_the_worker_and_the_planner(tmp_path):
    sink = tmp_path / "sink"
    with pytest.raises(WorkerError) as ei:
        native.Receiver("127.0.0.1", 0, "discard", sink=str(sink)).close()
    assert ei.value.code == errno.EOPNOTSUPP and "keeps no data" in str(ei.value) and "/dev/null" in str(ei.value)
    assert cell_problems(dict(DEFAULTS, recv_mode="discard", sink=str(sink))) == [
        f"receive mode `discard` keeps no data: its sink must be /dev/null, not `{sink}`"]
    assert cell_problems(dict(DEFAULTS, recv_mode="discard")) == []


def test_parallel_streams_take_the_host_view_once_around_all_streams():
    # streams > 1: one /proc window and one sampler for the whole group (not one per stream thread), the
    # samples counting every stream's bytes; the host-wide metrics are in the totals only.
    size, n = 256 * 2**20 + 12_345, 4   # tens of ms on loopback: many 1 ms intervals
    sent, got = run_pair("write", "read", send_kw=dict(source="mem", bytes=size, streams=n, sample_interval=0.001),
                         recv_kw=dict(sink="/dev/null", streams=n, sample_interval=0.001))
    for r in (sent, got):
        assert r["bytes"] == size and len(r["streams"]) == n
        assert r["wall_ns"] <= r["host_window_ns"] < r["wall_ns"] + 1e9   # the window brackets the group's span
        assert r["host_ncpus"] == online_cpus() and r["host_net_rx_softirqs"] > 0
        assert all(not key.startswith("host_") for s in r["streams"] for key in s)
        assert "samples" not in r["streams"][0]
        rows = r["samples"]["rows"]
        assert len(rows) >= 3 and rows[-1]["bytes"] == size   # summed over the streams: each moved about 1/n
        values = [s["bytes"] for s in rows]
        assert values == sorted(values)
        assert all(s["tcp_snd_cwnd"] > 0 for s in rows)
