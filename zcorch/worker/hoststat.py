"""Host-wide counters over a transfer: `host_deltas` between two snapshots of /proc/stat, /proc/softirqs,
/proc/net/snmp and /proc/vmstat that the C core copies around its timed region (native/core/hoststat.c).

Every value is a delta over the window, never negative (some kernels let iowait step backwards: 0); a counter
missing from either snapshot is None. /proc/net/snmp is the reading process's network namespace's, the
others the machine's. Stdlib-only pure functions (tests feed them captured texts).
"""
from __future__ import annotations

import os

from zcorch.params import HOST_CPU_FIELDS

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only
    from typing import Any, Dict, Optional

FILES = ("/proc/stat", "/proc/softirqs", "/proc/net/snmp", "/proc/vmstat")  # zc_host_snap's order
# The time fields of a /proc/stat cpu line, in the kernel's column order (guest and guest_nice are
# already counted in user and nice, so they are never added).
STAT_COLUMNS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")
# What the metrics report, in this order (also the order of each host_per_cpu_us list): zcorch.params'.
CPU_FIELDS = HOST_CPU_FIELDS
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def parse_stat(text: str) -> "Dict[str, Dict[str, int]]":
    """/proc/stat -> {"cpu": {field: ticks}, "cpu0": {...}, ...} (the time fields of STAT_COLUMNS that
    the line has; older kernels have fewer columns)."""
    out: "Dict[str, Dict[str, int]]" = {}
    for parts in (line.split() for line in text.splitlines() if line.startswith("cpu")):
        if parts[0] == "cpu" or parts[0][3:].isdigit():
            out[parts[0]] = {col: int(v) for col, v in zip(STAT_COLUMNS, parts[1:])}
    return out


def parse_softirqs(text: str) -> "Dict[str, int]":
    """/proc/softirqs -> {"NET_RX": count summed over the CPUs, ...}."""
    out: "Dict[str, int]" = {}
    for line in text.splitlines()[1:]:  # the first line names the CPUs
        name, sep, counts = line.partition(":")
        if sep:
            out[name.strip()] = sum(int(v) for v in counts.split())
    return out


def parse_snmp(text: str) -> "Dict[str, Dict[str, int]]":
    """/proc/net/snmp (pairs of lines: `Proto: names...` then `Proto: values...`) -> {"Tcp": {"RetransSegs": n}}."""
    out: "Dict[str, Dict[str, int]]" = {}
    lines = text.splitlines()
    for names, values in zip(lines[0::2], lines[1::2]):
        proto, _, keys = names.partition(":")
        proto2, _, nums = values.partition(":")
        if proto != proto2:
            continue
        out[proto.strip()] = {k: int(v) for k, v in zip(keys.split(), nums.split())}
    return out


def parse_vmstat(text: str) -> "Dict[str, int]":
    """/proc/vmstat -> {"pgfault": n, ...}."""
    return {parts[0]: int(parts[1]) for parts in map(str.split, text.splitlines())
            if len(parts) == 2 and parts[1].lstrip("-").isdigit()}


def _delta(a: "Optional[int]", b: "Optional[int]") -> "Optional[int]":
    if a is None or b is None:
        return None
    return max(b - a, 0)


def cpu_delta_ticks(before: "Dict[str, int]", after: "Dict[str, int]") -> "Dict[str, Optional[int]]":
    """{field of CPU_FIELDS: ticks} between two parsed cpu lines."""
    return {f: _delta(before.get(f), after.get(f)) for f in CPU_FIELDS}


def _us(ticks: "Optional[int]", clk_tck: int) -> "Optional[int]":
    return None if ticks is None else ticks * 1_000_000 // clk_tck


# file -> (its parser into {counter: n}, {metric: counter})
_COUNTERS = {
    "/proc/softirqs": (parse_softirqs, {"host_net_rx_softirqs": "NET_RX", "host_net_tx_softirqs": "NET_TX"}),
    "/proc/net/snmp": (lambda text: parse_snmp(text).get("Tcp", {}),
                       {"host_tcp_retrans_segs": "RetransSegs", "host_tcp_out_segs": "OutSegs",
                        "host_tcp_in_segs": "InSegs"}),
    "/proc/vmstat": (parse_vmstat, {"host_pgfault": "pgfault", "host_pgmajfault": "pgmajfault"}),
}


def host_deltas(before: "Dict[str, Optional[str]]", after: "Dict[str, Optional[str]]",
                window_ns: "Optional[int]" = None, clk_tck: "Optional[int]" = None) -> "Dict[str, Any]":
    """The host_* metrics (zcorch.params METRICS) between two snapshots; see the module docstring."""
    clk_tck = clk_tck or os.sysconf("SC_CLK_TCK")
    out: "Dict[str, Any]" = {f"host_{f}_us": None for f in CPU_FIELDS}
    out.update(host_window_ns=window_ns, host_ncpus=None, host_per_cpu_us=None, host_clk_tck=None, host_ticks=None)
    st0, st1 = before.get("/proc/stat"), after.get("/proc/stat")
    if st0 is not None and st1 is not None:
        s0, s1 = parse_stat(st0), parse_stat(st1)
        if "cpu" in s0 and "cpu" in s1:
            total = cpu_delta_ticks(s0["cpu"], s1["cpu"])
            out.update({f"host_{f}_us": _us(total[f], clk_tck) for f in CPU_FIELDS})
            out["host_clk_tck"] = clk_tck
            # the ticks the window holds, counted (not window × USER_HZ × CPUs: a CPU's idle may lag a tick)
            out["host_ticks"] = None if None in total.values() else sum(total.values())
        cpus = sorted((n for n in s1 if n != "cpu" and n in s0), key=lambda name: int(name[3:]))  # hot-plugged: skipped
        out["host_ncpus"] = len(cpus)
        out["host_per_cpu_us"] = {n: [_us(v, clk_tck) for v in cpu_delta_ticks(s0[n], s1[n]).values()]
                                  for n in cpus}
    for path, (parse, metrics) in _COUNTERS.items():
        text0, text1 = before.get(path), after.get(path)
        c0, c1 = (parse(text0), parse(text1)) if text0 is not None and text1 is not None else ({}, {})
        out.update({metric: _delta(c0.get(name), c1.get(name)) for metric, name in metrics.items()})
    return out


def idle_share(before: "Optional[str]", after: "Optional[str]") -> "Optional[float]":
    """Share (0..1) of all CPUs' time that was idle (idle + iowait: nothing to run) between two /proc/stat
    texts, of the time this kernel had its CPUs (steal, when the hypervisor ran others, is not in it); None
    when either is missing or no tick passed (a window too short to count)."""
    if before is None or after is None:
        return None
    s0, s1 = parse_stat(before).get("cpu"), parse_stat(after).get("cpu")
    if s0 is None or s1 is None:
        return None
    ticks = cpu_delta_ticks(s0, s1)
    if None in ticks.values():
        return None
    total = sum(ticks.values()) - (ticks.get("steal") or 0)
    return None if total <= 0 else (ticks["idle"] + ticks["iowait"]) / total


def probe_idle(seconds: "Optional[float]") -> "Optional[float]":
    """The host's idle share over the next `seconds` (idle_share of two /proc/stat reads; the caller sleeps
    through the window, so its own CPU is not in it). None for no probe or /proc/stat unreadable."""
    if not seconds:
        return None
    import time

    before = _read("/proc/stat")
    time.sleep(seconds)
    return idle_share(before, _read("/proc/stat"))


def boot_id() -> "Optional[str]":
    """This kernel's boot id: the same for every process (and network namespace) of one running kernel,
    so two workers that report the same one share /proc/stat and their host CPU must not be added."""
    return (_read(BOOT_ID) or "").strip() or None


def _read(path: str) -> "Optional[str]":
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None
