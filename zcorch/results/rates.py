"""How the figures users compare are derived from a worker's metrics, defined once for the end-of-run
summary and for the analysis frames. Plain arithmetic, so each takes floats or numpy arrays alike.
"""
from __future__ import annotations

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
