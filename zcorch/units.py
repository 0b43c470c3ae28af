"""Sizes and durations as users write them. Pure functions, stdlib-only (deployed with the worker).

Sizes follow iperf3 and dd: integers are bytes; KiB/MiB/GiB/TiB and bare K/M/G/T are powers
of 1024; KB/MB/GB/TB are powers of 1000. Durations: 500ms, 5s, 2m, 1h, or a bare number of seconds.
"""
from __future__ import annotations

import re

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([A-Za-z]*)\s*$")
_SIZE_UNITS = {"": 1, "b": 1}
for _i, _p in enumerate("kmgt", start=1):
    _SIZE_UNITS[_p] = 1024 ** _i
    _SIZE_UNITS[_p + "ib"] = 1024 ** _i
    _SIZE_UNITS[_p + "b"] = 1000 ** _i

_DUR_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|)\s*$")
_DUR_UNITS = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "h": 3600.0}


def parse_size(value: "int | str") -> int:
    """Bytes from an int or a string like '64KiB', '1M', '10GB'. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size, got boolean {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative: {value}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a size like 64KiB, got {value!r}")
    m = _SIZE_RE.match(value)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _SIZE_UNITS:
        raise ValueError(f"not a size: {value!r} (use bytes or a suffix KiB, MiB, GiB, TiB, K, M, G, T, KB, MB, GB, TB)")
    return int(m.group(1)) * _SIZE_UNITS[unit]


def parse_duration(value: "int | float | str") -> float:
    """Seconds from a number or a string like '500ms', '5s', '2m'. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration, got boolean {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"duration must not be negative: {value}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration like 5s, got {value!r}")
    m = _DUR_RE.match(value)
    if not m:
        raise ValueError(f"not a duration: {value!r} (use e.g. 500ms, 5s, 2m, 1h)")
    return float(m.group(1)) * _DUR_UNITS[m.group(2)]


def format_size(n: int) -> str:
    """The shortest exact binary-unit spelling: 65536 -> '64KiB', 1000 -> '1000'."""
    for unit, factor in (("TiB", 1024 ** 4), ("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if n and n % factor == 0:
            return f"{n // factor}{unit}"
    return str(n)
