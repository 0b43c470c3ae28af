"""How the figures users compare are derived from a worker's metrics, defined once for the end-of-run
summary and for the analysis frames. Plain arithmetic, so each takes floats or numpy arrays alike
(zc_verdict: one run's or one cell's numbers).
"""
from __future__ import annotations

import math

from zcorch.params import HOST_BUSY_FIELDS

GIB = float(1 << 30)


def gbit_s(nbytes, wall_ns):
    """Throughput in Gbit/s (bits per nanosecond)."""
    return nbytes * 8.0 / wall_ns


def mb_s(nbytes, wall_ns):
    """Throughput in MB/s (10^6 bytes per second), as the seeds report it."""
    return nbytes * 1e3 / wall_ns


def cpu_s_per_gib(utime_us, stime_us, nbytes):
    """User + system CPU seconds per GiB moved: netperf's service demand, per side."""
    return (utime_us + stime_us) / 1e6 / (nbytes / GIB)


def per_gib(seconds, nbytes):
    """Seconds per GiB moved."""
    return seconds / (nbytes / GIB)


def host_busy_us(metrics: dict):
    """Busy host CPU µs of one worker's metrics (HOST_BUSY_FIELDS of host_<field>_us: everything but idle
    and iowait, all CPUs); None when the worker did not report them."""
    parts = [metrics.get(f"host_{f}_us") for f in HOST_BUSY_FIELDS]
    return None if any(p is None for p in parts) else sum(parts)


# A host-CPU window holding fewer ticks than this measures CPU time to worse than 1% (a tick per CPU).
MIN_TICKS = 100
# How far a window's tick counts may be off, in ticks per CPU: a tick at each end of the window, plus a
# delayed timer interrupt's late tick (a loaded or virtual machine).
TICK_ERROR = 2
ASSUMED_CLK_TCK = 100  # USER_HZ of records written before the worker reported it (every Linux port's value)
# Busier than this (in CPUs) just before the run: the host is shared, its CPU per GiB others' load.
SHARED_CPUS = 0.10


def background_cpus(idle_before, ncpus):
    """CPUs busy with other work just before the run: (1 - the probe's idle share) × CPUs; NaN unprobed."""
    return (1.0 - idle_before) * ncpus


def cpu_resolution(sides) -> str:
    """Can a run's host-CPU numbers be trusted? `sides`: (host_ticks, busy_s, ncpus, window_s, clk_tck[,
    background_cpus]) per worker. `ok`, `n/a`, or "; "-joined `too short: N ticks`, `busy > capacity (R×)`,
    `host shared (B CPUs busy before)`."""
    fewest, worst, shared = None, None, None
    known = False
    for side in sides:
        ticks, busy, ncpus, window, clk = side[:5]
        background = side[5] if len(side) > 5 else None
        if not _missing(background) and background > SHARED_CPUS:
            shared = max(shared or 0.0, background)
        if _missing(busy) or _missing(ncpus) or _missing(window) or ncpus <= 0 or window <= 0:
            continue
        known = True
        clk = ASSUMED_CLK_TCK if _missing(clk) or clk <= 0 else clk
        ticks = round(window * clk * ncpus) if _missing(ticks) else int(ticks)
        if ticks < MIN_TICKS:
            fewest = ticks if fewest is None else min(fewest, ticks)
        capacity = ncpus * window
        if busy > capacity + TICK_ERROR * ncpus / clk:
            worst = max(worst or 0.0, busy / capacity)
    if not known:
        return "n/a"
    parts = []
    if fewest is not None:
        parts.append(f"too short: {fewest} ticks")
    if worst is not None:
        parts.append(f"busy > capacity ({worst:.2f}×)")
    if shared is not None:
        parts.append(f"host shared ({shared:.2f} CPUs busy before)")
    return "; ".join(parts) or "ok"


def run_cpu_resolution(sender: dict, receiver: dict) -> str:
    """cpu_resolution of one run's worker metrics (the records' `sender` / `receiver`)."""
    sides = []
    for m in (sender or {}, receiver or {}):
        busy = host_busy_us(m)
        window = m.get("host_window_ns")
        idle, ncpus = m.get("host_idle_before"), m.get("host_ncpus")
        sides.append((m.get("host_ticks"), None if busy is None else busy / 1e6, ncpus,
                      None if window is None else window / 1e9, m.get("host_clk_tck"),
                      None if _missing(idle) or _missing(ncpus) else background_cpus(idle, ncpus)))
    return cpu_resolution(sides)


def cell_cpu_resolution(verdicts) -> str:
    """A cell's host-CPU resolution from its ok runs' (cpu_resolution): `ok` when every run's is, else the
    worst flag with how many runs carry one, e.g. `too short: 9 ticks (3/3 runs)`; `n/a` without host data."""
    verdicts = list(verdicts)
    flagged = [v for v in verdicts if v not in ("ok", "n/a")]
    if not flagged:
        return "ok" if "ok" in verdicts else "n/a"
    worst = min(flagged, key=lambda v: (int(v.split()[2]) if v.startswith("too short") else 10 ** 9, v))
    if any("host shared" in v for v in flagged) and "host shared" not in worst:
        worst += "; host shared"     # never hidden behind another flag
    return f"{worst} ({len(flagged)}/{len(verdicts)} runs)"


def zc_verdict(completions, copied) -> str:
    """Was it zero-copy? From the kernel's completion reports: `n/a` without any, `zero-copy`, `copied`, else
    `partly copied (N%)` (N = share copied, 1..99)."""
    if _missing(completions) or _missing(copied) or completions <= 0:
        return "n/a"
    if copied <= 0:
        return "zero-copy"
    if copied >= completions:
        return "copied"
    pct = min(max(round(100.0 * copied / completions), 1), 99)
    return f"partly copied ({pct}%)"


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def zc_recv_verdict(mapped, copied) -> str:
    """Was the receive zero-copy? From zerocopy_recv's byte counts: `n/a` without bytes, `mapped`, `copied`
    (said, not hidden: the mode still ran), else `partly mapped (N%)` (N = share mapped, 1..99)."""
    if _missing(mapped) or _missing(copied) or mapped + copied <= 0:
        return "n/a"
    if copied <= 0:
        return "mapped"
    if mapped <= 0:
        return "copied"
    pct = min(max(round(100.0 * mapped / (mapped + copied)), 1), 99)
    return f"partly mapped ({pct}%)"


def zc_label(completions, copied, recv_mapped, recv_copied) -> str:
    """The one zero-copy column of a run or cell: the send side's verdict (zc_verdict), and when the
    receiver reported mapping, `receive <zc_recv_verdict>` after it; `n/a` when neither side reported."""
    send, recv = zc_verdict(completions, copied), zc_recv_verdict(recv_mapped, recv_copied)
    if recv == "n/a":
        return send
    return f"receive {recv}" if send == "n/a" else f"{send}; receive {recv}"
