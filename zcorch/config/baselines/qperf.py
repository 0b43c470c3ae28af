"""`baselines.qperf`: qperf's tcp_bw between the hosts' data addresses, with both ends' CPU figures (off unless
written). The server (silent) runs on the receiver; the client waits for it (`-ws`) and prints `name = value
unit` lines. qperf's "% cpus" is of one CPU (200 = two busy).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from zcorch.config import checks
from zcorch.config.baselines.kind import (BaselineError, ServerClientKind, Tool, _describe, cell_pairs, per_choice,
                                          sizes_where, tool_duration, whole_seconds)

PORT = 19765                # qperf's own default listen port (remote receivers; localhost: a free one)
WAIT_SERVER_S = 10          # the client retries connecting this long (the server says nothing when ready)
MAX_MSG_SIZE = 1024 ** 3    # as the cells' buffer (the worker's limit)


@dataclass(frozen=True)
class QperfBaseline:
    duration: float = 2.0            # qperf -t (whole seconds, rounded up)
    per: str = "pair"                # as iperf3: per distinct (window, buffer) of the cells, or once
    msg_size: Optional[int] = None   # qperf -m for every test (None: the cell's sender buffer, or qperf's)


def server_argv(port: int) -> List[str]:
    """qperf's server: it serves tests until killed (the sweep kills it after its client ends)."""
    return ["qperf", "-lp", str(port)]


def client_argv(server: str, port: int, duration: float, msg_size: Optional[int],
                window: Optional[int]) -> List[str]:
    argv = ["qperf", server, "-lp", str(port), "-t", str(whole_seconds(duration)), "-ws", str(WAIT_SERVER_S),
            "-e", "6", "-uu", "-vv"]
    for flag, value in (("-m", msg_size), ("-sb", window)):
        if value:
            argv += [flag, str(value)]
    return argv + ["tcp_bw"]


_LINE_RE = re.compile(r"^\s+([a-z_]+)\s+=\s+([0-9][0-9.,]*)\s*(.*?)\s*$")
# unit as qperf prints it -> (factor to the base unit, suffix of the result key)
_UNITS = {
    "bytes/sec": (1, "_bytes_per_s"), "KB/sec": (1e3, "_bytes_per_s"), "MB/sec": (1e6, "_bytes_per_s"),
    "GB/sec": (1e9, "_bytes_per_s"),
    "bytes": (1, "_bytes"), "KB": (1e3, "_bytes"), "MB": (1e6, "_bytes"), "GB": (1e9, "_bytes"),
    "ns": (1e-9, "_s"), "us": (1e-6, "_s"), "ms": (1e-3, "_s"), "sec": (1, "_s"),
    "ns/GB": (1e-9, "_s_per_gb"), "us/GB": (1e-6, "_s_per_gb"), "ms/GB": (1e-3, "_s_per_gb"),
    "sec/GB": (1, "_s_per_gb"),
    "% cpus": (1, "_percent"),
    "/sec": (1, "_per_s"), "K/sec": (1e3, "_per_s"), "M/sec": (1e6, "_per_s"),
    "": (1, ""), "thousand": (1e3, ""), "million": (1e6, ""), "billion": (1e9, ""),
}
_EXACT_RE = re.compile(r"^[KMG]iB \(([0-9,]+)\)$")   # `64 KiB (65,536)`: the exact byte count
_SIDES = {"loc_": "send_", "rem_": "recv_"}           # without a send/recv split (-un, -m 0): client = sender


def parse_qperf(text: str) -> Dict[str, Any]:
    """`qperf -vv ... tcp_bw` output in base units plus bits_per_second; BaselineError without a result."""
    out: Dict[str, Any] = {}
    unknown = []
    for line in text.splitlines():
        m = _LINE_RE.match(line)
        if not m:
            if line.strip() and not line.rstrip().endswith(":"):
                unknown.append(line.strip())
            continue
        name, number, unit = m.group(1), float(m.group(2).replace(",", "")), m.group(3)
        exact = _EXACT_RE.match(unit)
        if exact:
            factor, suffix, number = 1, "_bytes", float(exact.group(1).replace(",", ""))
        elif unit in _UNITS:
            factor, suffix = _UNITS[unit]
        else:
            raise BaselineError(f"qperf printed `{line.strip()}`: unit `{unit}` is not one zcorch reads")
        for short, side in _SIDES.items():
            if name.startswith(short):
                name = side + name[len(short):]
        value = number * factor
        if name.endswith(suffix):   # send_bytes in bytes: send_bytes, not send_bytes_bytes
            suffix = ""
        out[name + suffix] = int(value) if value.is_integer() and suffix in ("_bytes", "") else value
    bw = out.pop("bw_bytes_per_s", None)
    if bw is None:
        raise BaselineError("qperf printed no tcp_bw result: " + (" ".join(unknown)[:300] or "(nothing)"))
    if not bw > 0:
        raise BaselineError("qperf measured no data (bw = 0)")
    out["bytes_per_second"] = bw
    out["bits_per_second"] = bw * 8
    if "time_s" in out:
        out["seconds"] = out.pop("time_s")
    return out


class QperfKind(ServerClientKind):
    name = "qperf"
    settings = QperfBaseline
    record_kinds = {"qperf": "qperf tcp_bw throughput (network alone)"}
    version_label = "qperf"
    words = {"qperf": "qperf"}
    match_keys = ("buffer", "window")
    parsers = {"duration": tool_duration, "per": per_choice,
               "msg_size": lambda n: checks.positive_size(n, MAX_MSG_SIZE)}
    port = PORT

    def tools(self, conf: Any) -> Sequence[Tool]:
        return (Tool("qperf", "qperf", version_argv=("--version",)),)

    def keys(self, conf: QperfBaseline, params_list: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
        keys: List[Dict[str, Any]] = []
        for window, buffer in cell_pairs(conf.per, params_list):
            key = {"window": window, "buffer": conf.msg_size or buffer}
            if key not in keys:
                keys.append(key)
        return keys

    def commands(self, conf: QperfBaseline, key: Mapping[str, Any], address: str,
                 port: int) -> Tuple[List[str], List[str]]:
        return server_argv(port), client_argv(address, port, conf.duration, key.get("buffer"), key.get("window"))

    def test_seconds(self, conf: QperfBaseline) -> float:
        return float(whole_seconds(conf.duration))

    def parse_output(self, text: str) -> Dict[str, Any]:
        return parse_qperf(text)

    def describe(self, record: Mapping[str, Any]) -> str:
        line = _describe("qperf tcp_bw", sizes_where(record.get("key") or {}), record)
        result = record.get("result") or {}
        if record.get("status") == "ok" and "send_cpus_used_percent" in result:
            line += (f", CPU send {result['send_cpus_used_percent']:.0f}% recv "
                     f"{result.get('recv_cpus_used_percent', float('nan')):.0f}% of one CPU")
        return line


KIND = QperfKind()
