"""Pure parts of the host CPU view: the /proc parsers and their deltas (zcorch.worker.hoststat) on
texts captured on a real machine (tests/data/proc/*.before|after, taken around a loopback transfer),
the derived columns and verdicts (zcorch.results.rates, zcorch.analysis.frames). Values expected here
were read off the captured texts by hand; nothing depends on the machine running the tests."""
from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd
import pytest

from zcorch.analysis.frames import add_copy_units, add_derived, copy_yardsticks
from zcorch.params import HOST_BUSY_FIELDS, HOST_CPU_FIELDS, METRIC_KEYS
from zcorch.results import rates
from zcorch.worker import hoststat

PROC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "proc")
NAMES = {"/proc/stat": "stat", "/proc/softirqs": "softirqs", "/proc/net/snmp": "net_snmp", "/proc/vmstat": "vmstat"}


def captured(when: str) -> dict:
    out = {}
    for path, name in NAMES.items():
        with open(os.path.join(PROC, f"{name}.{when}")) as f:
            out[path] = f.read()
    return out


BEFORE, AFTER = captured("before"), captured("after")


def test_parse_stat_reads_every_cpu_line_in_column_order():
    st = hoststat.parse_stat(BEFORE["/proc/stat"])
    assert sorted(st) == ["cpu", "cpu0", "cpu1"]  # intr, ctxt, btime ... are not cpu lines
    assert st["cpu"] == {"user": 637466, "nice": 1045, "system": 291019, "idle": 1880398, "iowait": 22701,
                         "irq": 0, "softirq": 73073, "steal": 2145, "guest": 0, "guest_nice": 0}
    assert st["cpu1"]["softirq"] == 27883


def test_parse_softirqs_snmp_and_vmstat():
    q = hoststat.parse_softirqs(BEFORE["/proc/softirqs"])
    assert q["NET_RX"] == 50713575 + 35553091 and q["NET_TX"] == 162792 + 200753 and q["HI"] == 0
    tcp = hoststat.parse_snmp(BEFORE["/proc/net/snmp"])["Tcp"]
    assert tcp["RetransSegs"] == 11267 and tcp["OutSegs"] == 103165120 and tcp["MaxConn"] == -1
    assert "Ip" in hoststat.parse_snmp(BEFORE["/proc/net/snmp"])
    vm = hoststat.parse_vmstat(BEFORE["/proc/vmstat"])
    assert vm["pgfault"] == 244313100 and vm["pgmajfault"] == 532570


def test_host_deltas_of_the_captured_transfer():
    d = hoststat.host_deltas(BEFORE, AFTER, window_ns=123, clk_tck=100)
    # the boot id and the idle share before the run are the worker's own (native._Watch.host_metrics)
    assert set(d) | {"host_boot_id", "host_idle_before"} == {m for m in METRIC_KEYS if m.startswith("host_")}
    tick = 10_000  # µs at USER_HZ 100
    assert {f: d[f"host_{f}_us"] // tick for f in HOST_CPU_FIELDS} == {
        "user": 6, "nice": 0, "system": 16, "irq": 0, "softirq": 12, "iowait": 0, "steal": 0, "idle": 2}
    assert d["host_window_ns"] == 123 and d["host_ncpus"] == 2
    assert d["host_per_cpu_us"] == {"cpu0": [7 * tick, 0, 7 * tick, 0, 3 * tick, 0, 0, 2 * tick],
                                    "cpu1": [0, 0, 8 * tick, 0, 9 * tick, 0, 0, 0]}
    # the kernel converts each counter to ticks on its own: the total line is the per-CPU sum to a tick
    # per CPU (here user: 6 in total, 7 + 0 per CPU)
    for i, f in enumerate(HOST_CPU_FIELDS):
        assert abs(sum(v[i] for v in d["host_per_cpu_us"].values()) - d[f"host_{f}_us"]) <= 2 * tick
    assert (d["host_net_rx_softirqs"], d["host_net_tx_softirqs"]) == (8772, 0)
    assert (d["host_tcp_retrans_segs"], d["host_tcp_out_segs"], d["host_tcp_in_segs"]) == (0, 3624, 3623)
    assert (d["host_pgfault"], d["host_pgmajfault"]) == (14403, 2)
    assert rates.host_busy_us(d) == (6 + 16 + 12) * tick


def test_counters_stepping_back_missing_columns_hotplug_and_unreadable_files():
    before = "cpu  100 0 50 1000 40 0 5 0\ncpu0 100 0 50 1000 40 0 5 0\ncpu3 1 1 1 1 1 1 1 1\n"
    after = "cpu  130 0 60 1100 35 0 9 0\ncpu0 120 0 55 1050 35 0 7 0\ncpu1 10 0 5 50 0 0 2 0\n"
    d = hoststat.host_deltas({"/proc/stat": before}, {"/proc/stat": after}, clk_tck=100)
    assert d["host_iowait_us"] == 0            # iowait went back by 5 ticks: no negative time
    assert d["host_user_us"] == 300_000 and d["host_softirq_us"] == 40_000
    assert list(d["host_per_cpu_us"]) == ["cpu0"] and d["host_ncpus"] == 1   # cpu1 came, cpu3 went
    # a 2.4-era line without iowait/irq/softirq/steal: those are unknown, not zero
    old = hoststat.host_deltas({"/proc/stat": "cpu 1 2 3 4\n"}, {"/proc/stat": "cpu 2 2 5 9\n"}, clk_tck=100)
    assert (old["host_user_us"], old["host_idle_us"], old["host_softirq_us"]) == (10_000, 50_000, None)
    assert rates.host_busy_us(old) is None
    # a file that could not be read in either snapshot: its metrics are null, the others stay
    d = hoststat.host_deltas(dict(BEFORE, **{"/proc/net/snmp": None}), AFTER, clk_tck=100)
    assert d["host_tcp_out_segs"] is None and d["host_pgfault"] == 14403 and d["host_user_us"] == 60_000
    d = hoststat.host_deltas({}, {}, window_ns=None, clk_tck=100)
    assert all(v is None for v in d.values())


def test_busy_fields_are_what_this_kernel_ran_not_idle_iowait_nor_steal():
    assert set(HOST_BUSY_FIELDS) == set(HOST_CPU_FIELDS) - {"idle", "iowait", "steal"}
    assert hoststat.CPU_FIELDS == HOST_CPU_FIELDS


def test_steal_is_neither_busy_nor_idle():
    # 2 CPUs, 1 s: 50 ticks user, 50 idle, 100 stolen by the hypervisor (half of each CPU's time)
    before = "cpu  0 0 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0\n"
    after = "cpu  50 0 0 50 0 0 0 100\ncpu0 25 0 0 25 0 0 0 50\ncpu1 25 0 0 25 0 0 0 50\n"
    assert hoststat.idle_share(before, after) == 0.5      # of the time the kernel had its CPUs
    d = hoststat.host_deltas({"/proc/stat": before}, {"/proc/stat": after}, window_ns=10**9, clk_tck=100)
    assert rates.host_busy_us(d) == 500_000 and d["host_steal_us"] == 1_000_000
    # steal alone does not make the run's host CPU untrustworthy (it is not in it); other work before it does
    assert rates.run_cpu_resolution(dict(d, host_ticks=200, host_idle_before=1.0), {}) == "ok"
    assert rates.run_cpu_resolution(dict(d, host_ticks=200, host_idle_before=0.5), {}) == (
        "host shared (1.00 CPUs busy before)")
    import pandas as pd
    from zcorch.analysis.frames import add_derived
    row = {f"send_{k}": v for k, v in d.items() if not isinstance(v, dict)}
    row.update(send_bytes=1 << 30)
    frame = add_derived(pd.DataFrame([row]))
    assert frame["send_host_steal_cpus"].iloc[0] == 1.0 and frame["send_host_busy_s"].iloc[0] == 0.5


@pytest.mark.parametrize("completions,copied,verdict", [
    (None, None, "n/a"), (float("nan"), 0, "n/a"), (0, 0, "n/a"),
    (100, 0, "zero-copy"), (100, 100, "copied"), (100, 37, "partly copied (37%)"),
    (1000, 1, "partly copied (1%)"),     # never rounded to 0% ...
    (1000, 999, "partly copied (99%)"),  # ... nor to 100%
])
def test_zc_verdict(completions, copied, verdict):
    assert rates.zc_verdict(completions, copied) == verdict


def _frame(**cols) -> pd.DataFrame:
    n = max(len(v) for v in cols.values())
    return pd.DataFrame({k: v if len(v) == n else v * n for k, v in cols.items()})


def test_derived_host_columns_one_machine_and_two():
    gib = 2 ** 30
    host = {f"{side}host_{f}_us": [0] for side in ("send_", "recv_") for f in HOST_CPU_FIELDS}
    host.update({"send_host_user_us": [500_000, 500_000], "send_host_softirq_us": [250_000, 250_000],
                 "recv_host_system_us": [400_000, 400_000], "recv_host_softirq_us": [100_000, 100_000],
                 "send_host_window_ns": [1e9, 1e9], "recv_host_window_ns": [2e9, 2e9]})
    df = _frame(status=["ok", "ok"], send_bytes=[gib, gib], recv_bytes=[gib, gib], send_wall_ns=[1e9, 1e9],
                recv_wall_ns=[1e9, 1e9], send_utime_us=[100_000, 100_000], send_stime_us=[100_000, 100_000],
                recv_utime_us=[0, 0], recv_stime_us=[300_000, 300_000],
                send_host_boot_id=["a", "a"], recv_host_boot_id=["a", "b"], **host)
    d = add_derived(df)
    assert list(d["same_host"]) == [True, False]
    assert d.loc[0, "send_host_busy_s_per_gib"] == pytest.approx(0.75)
    assert d.loc[0, "recv_host_busy_s_per_gib"] == pytest.approx(0.5)
    assert d.loc[0, "send_host_softirq_s_per_gib"] == pytest.approx(0.25)
    assert d.loc[0, "send_host_busy_cpus"] == pytest.approx(0.75)
    assert d.loc[0, "recv_host_busy_cpus"] == pytest.approx(0.25)
    # one machine: counted once (the larger side); two machines: added
    assert list(d["total_host_busy_s_per_gib"]) == pytest.approx([0.75, 1.25])
    assert list(d["total_cpu_s_per_gib"]) == pytest.approx([0.5, 0.5])
    assert list(d["zc_verdict"]) == ["n/a", "n/a"]
    yard = {"sw": {"sender": 0.25, "receiver": 0.1}}
    c = add_copy_units(d.assign(sweep="sw"), yard)
    assert c.loc[0, "send_cpu_copies"] == pytest.approx(0.2 / 0.25)
    assert c.loc[0, "recv_host_busy_copies"] == pytest.approx(0.5 / 0.1)
    assert c.loc[1, "send_copy_s_per_gib"] == 0.25


def test_derived_columns_of_runs_recorded_before_the_host_view():
    df = _frame(status=["ok"], send_bytes=[2 ** 30], recv_bytes=[2 ** 30], send_wall_ns=[1e9], recv_wall_ns=[1e9],
                send_zc_completions=[10.0], send_zc_copied=[4.0], recv_zc_completions=[np.nan])
    d = add_derived(df)
    assert math.isnan(d.loc[0, "send_host_busy_s_per_gib"]) and d.loc[0, "same_host"] is None
    assert d.loc[0, "zc_verdict"] == "partly copied (40%)" and d.loc[0, "zc_copied_share"] == pytest.approx(0.4)
    c = add_copy_units(d.assign(sweep="old"), {"old": copy_yardsticks({})})
    assert c[["send_copy_s_per_gib", "send_cpu_copies"]].isna().all(axis=None)


def test_copy_yardsticks_of_meta():
    meta = {"hosts": {"sender": {"calibration": {"memcpy_s_per_gib": 0.05}}, "receiver": {"calibration":
                                                                                           {"error": "x"}}}}
    y = copy_yardsticks(meta)
    assert y["sender"] == 0.05 and math.isnan(y["receiver"])


@pytest.mark.parametrize("mapped,copied,verdict", [
    (None, None, "n/a"), (float("nan"), 5, "n/a"), (0, 0, "n/a"),
    (4096, 0, "mapped"), (0, 4096, "copied"), (750, 250, "partly mapped (75%)"),
    (1, 999, "partly mapped (1%)"), (999, 1, "partly mapped (99%)"),
])
def test_zc_recv_verdict(mapped, copied, verdict):
    assert rates.zc_recv_verdict(mapped, copied) == verdict


@pytest.mark.parametrize("args,label", [
    ((None, None, None, None), "n/a"),
    ((10, 10, None, None), "copied"),                    # a zero-copy sender, an ordinary receiver
    ((None, None, 0, 4096), "receive copied"),           # zerocopy_recv behind a copying sender
    ((10, 10, 8192, 0), "copied; receive mapped"),       # both sides report
])
def test_zc_label_joins_both_sides(args, label):
    assert rates.zc_label(*args) == label


# ---------------------------------------------------------------- the tick resolution of the host CPU view

def test_the_window_in_ticks_is_counted_from_the_captured_texts():
    d = hoststat.host_deltas(BEFORE, AFTER, window_ns=180_000_000, clk_tck=100)
    # 6 user + 16 system + 12 softirq + 2 idle ticks (read off the captured cpu lines), two CPUs
    assert d["host_ticks"] == 36 and d["host_clk_tck"] == 100
    busy = rates.host_busy_us(d) / 1e6
    assert rates.cpu_resolution([(d["host_ticks"], busy, d["host_ncpus"], 0.18, 100)]) == "too short: 36 ticks"


@pytest.mark.parametrize("sides,verdict", [
    ([(200, 1.0, 2, 1.0, 100)], "ok"),
    ([(200, 2.5, 2, 1.0, 100)], "busy > capacity (1.25×)"),
    ([(200, 2.035, 2, 1.0, 100)], "ok"),  # over CPUs × window by less than the tick error (2 ticks per CPU)
    ([(200, 2.05, 2, 1.0, 100)], "busy > capacity (1.02×)"),
    # a 16 ms window: 1.51× the machine, but 3 ticks: too short, and within the tick error
    ([(3, 0.0483, 2, 0.016, 100)], "too short: 3 ticks"),
    ([(9, 0.30, 2, 0.05, 100)], "too short: 9 ticks; busy > capacity (3.00×)"),
    ([(500, 1.0, 2, 2.5, 100), (40, 0.1, 2, 0.2, 100)], "too short: 40 ticks"),  # the worse side
    ([(None, 0.5, 2, 0.4, None)], "too short: 80 ticks"),  # a record before host_ticks: window × 100/s × CPUs
    ([(None, None, None, None, None), (math.nan, math.nan, math.nan, math.nan, math.nan)], "n/a"),
])
def test_cpu_resolution_flags_short_windows_and_more_busy_cpu_than_the_machine_has(sides, verdict):
    assert rates.cpu_resolution(sides) == verdict


def test_a_cell_resolution_names_its_worst_flag_and_how_many_runs_carry_one():
    assert rates.cell_cpu_resolution(["ok", "ok"]) == "ok"
    assert rates.cell_cpu_resolution(["n/a"]) == "n/a" and rates.cell_cpu_resolution([]) == "n/a"
    assert rates.cell_cpu_resolution(["ok", "too short: 40 ticks", "too short: 9 ticks"]) == \
        "too short: 9 ticks (2/3 runs)"
    assert rates.cell_cpu_resolution(["busy > capacity (1.30×)", "ok"]) == "busy > capacity (1.30×) (1/2 runs)"


def test_the_frame_derives_cpu_resolution_once_per_run():
    frame = pd.DataFrame({
        "send_host_ticks": [36, 400], "send_host_clk_tck": [100, 100], "send_host_ncpus": [2, 2],
        "send_host_window_ns": [180e6, 2e9], "recv_host_ncpus": [np.nan, 2], "recv_host_window_ns": [np.nan, 2e9],
        "recv_host_ticks": [np.nan, 400], "recv_host_clk_tck": [np.nan, 100],
        **{f"send_host_{f}_us": [10_000, 100_000] for f in HOST_BUSY_FIELDS},
        **{f"recv_host_{f}_us": [np.nan, 100_000] for f in HOST_BUSY_FIELDS}})
    assert list(add_derived(frame)["cpu_resolution"]) == ["too short: 36 ticks", "ok"]
