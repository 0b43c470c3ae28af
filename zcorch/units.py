"""Sizes and durations as users write them. Pure functions, stdlib-only (deployed with the worker).
Sizes follow iperf3 and dd: KiB and bare K are powers of 1024, KB powers of 1000; durations 500ms, 5s, 2m, 1h."""
from __future__ import annotations

import re

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([A-Za-z]*)\s*$")
_SIZE_UNITS = {"": 1, "b": 1, **{p + suffix: base ** i for i, p in enumerate("kmgt", start=1)
                                 for suffix, base in (("", 1024), ("ib", 1024), ("b", 1000))}}

_DUR_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|)\s*$")
_DUR_UNITS = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "h": 3600.0}


def parse_size(value: "int | str") -> int:
    """Bytes from an int or a string like '64KiB', '1M', '10GB'. Raises ValueError."""
    return _parse(value, "size", "64KiB", int, int, _SIZE_RE, _SIZE_UNITS,
                  "use bytes or a suffix KiB, MiB, GiB, TiB, K, M, G, T, KB, MB, GB, TB")


def parse_duration(value: "int | float | str") -> float:
    """Seconds from a number or a string like '500ms', '5s', '2m'. Raises ValueError."""
    return _parse(value, "duration", "5s", (int, float), float, _DUR_RE, _DUR_UNITS, "use e.g. 500ms, 5s, 2m, 1h")


def _parse(value, what: str, like: str, numbers, cast, rx, units: dict, hint: str):
    """A number of `numbers` (not below 0) or a string `rx` reads as a number and a unit of `units`."""
    if isinstance(value, bool):
        raise ValueError(f"expected a {what}, got boolean {value!r}")
    if isinstance(value, numbers):
        if value < 0:
            raise ValueError(f"{what} must not be negative: {value}")
        return cast(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a {what} like {like}, got {value!r}")
    m = rx.match(value)
    unit = m.group(2).lower() if m else None
    if not m or unit not in units:
        raise ValueError(f"not a {what}: {value!r} ({hint})")
    return cast(m.group(1)) * units[unit]


def format_size(n: int) -> str:
    """The shortest exact binary-unit spelling: 65536 -> '64KiB', 1000 -> '1000'."""
    for unit, factor in (("TiB", 1024 ** 4), ("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if n and n % factor == 0:
            return f"{n // factor}{unit}"
    return str(n)


# ---------------------------------------------------------------- published quantities (`reference:`)
# A value converts between units of one dimension only; rates are bit/s-based (MB = 10^6 bytes, MiB = 2^20).

_RATE = {"bit/s": 1.0, "kbit/s": 1e3, "Mbit/s": 1e6, "Gbit/s": 1e9, "Kb/s": 1e3, "Mb/s": 1e6, "Gb/s": 1e9,
         "B/s": 8.0, "kB/s": 8e3, "KB/s": 8e3, "MB/s": 8e6, "GB/s": 8e9,
         "KiB/s": 8.0 * 1024, "MiB/s": 8.0 * 1024 ** 2, "GiB/s": 8.0 * 1024 ** 3}
_TIME = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}
_BYTES = {"B": 1.0, "KiB": 1024.0, "MiB": 1024.0 ** 2, "GiB": 1024.0 ** 3, "KB": 1e3, "MB": 1e6, "GB": 1e9}
_COUNT = {"count": 1.0, "": 1.0, "segments": 1.0}
_CPU_COST = {"s/GiB": 1.0, "ms/GiB": 1e-3}
UNIT_DIMENSIONS = {"rate": _RATE, "time": _TIME, "size": _BYTES, "count": _COUNT, "cpu cost": _CPU_COST}
_UNIT_TO_DIM = {u: (dim, f) for dim, table in UNIT_DIMENSIONS.items() for u, f in table.items()}
_QUANTITY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)(?:\s*(?:-|–|\.\.)\s*(\d+(?:\.\d+)?))?\s*([A-Za-zµ/]*)\s*$")


def unit_dimension(unit: str) -> str:
    """The dimension of a unit ("rate", "time", "size", "count", "cpu cost"). Raises ValueError."""
    try:
        return _UNIT_TO_DIM[unit][0]
    except KeyError:
        raise ValueError(f"unknown unit {unit!r} (known: {', '.join(u for u in _UNIT_TO_DIM if u)})") from None


def convert(value: float, unit: str, to: str) -> float:
    """`value` in `unit` expressed in `to` (e.g. 857 MB/s -> 6.856 Gbit/s). ValueError across dimensions."""
    dim, factor = _UNIT_TO_DIM.get(unit, (None, 0.0))
    to_dim, to_factor = _UNIT_TO_DIM.get(to, (None, 0.0))
    if dim is None or to_dim is None:
        raise ValueError(f"unknown unit {unit if dim is None else to!r}")
    if dim != to_dim:
        raise ValueError(f"cannot convert {unit} ({dim}) to {to} ({to_dim})")
    return value * factor / to_factor


def parse_quantity(text: str) -> "tuple[float, float, str]":
    """(low, high, unit) from '857 MB/s' or a range '465-520 MB/s' (also – or ..); ValueError else."""
    m = _QUANTITY_RE.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"not a quantity: {text!r} (write a number or a range and a unit, e.g. `857 MB/s`, "
                         "`465-520 MB/s`, `6.864 s`)")
    low = float(m.group(1))
    high = float(m.group(2)) if m.group(2) is not None else low
    unit = m.group(3)
    unit_dimension(unit)
    if high < low:
        raise ValueError(f"{text!r}: the range's high end is below its low end")
    return low, high, unit
