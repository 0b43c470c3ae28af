"""`baselines.iperf3`: iperf3 between the hosts' data addresses, plain and -Z, before the cells
(`iperf3: {duration: 2s, per: pair, omit: 0}`; `per: sweep` = once, `pair` = per (window, buffer))."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from zcorch.config import checks
from zcorch.config.baselines.kind import (BaselineError, ServerClientKind, Tool, _describe, cell_pairs, per_choice,
                                          sizes_where, tool_duration, whole_seconds)
from zcorch.units import format_size

PORT = 5201                 # remote hosts; on localhost a free port is picked
IDLE_TIMEOUT = 30           # server --idle-timeout (s): a stuck server exits by itself
ZEROCOPY = (False, True)    # plain and -Z, so write and sendfile cells both have a peer
MAX_OMIT = 60               # iperf3 refuses -O above 60 (`bogus value for --omit`)
MAX_BLOCK = 1024 ** 2       # iperf3 refuses a TCP -l above 1 MiB (`block size too large (maximum = 1048576 bytes)`)


@dataclass(frozen=True)
class Iperf3Baseline:
    """iperf3 between the hosts' data addresses (plain and -Z) before the cells."""

    duration: float = 2.0    # seconds (iperf3 -t, rounded up to whole seconds)
    per: str = "pair"        # "pair": once per distinct (window, buffer) of the cells; "sweep": once
    omit: int = 0            # iperf3 -O: seconds of slow start left out


def server_argv(bind: str, port: int, idle_timeout: int = IDLE_TIMEOUT) -> List[str]:
    """One-off server that exits if no client comes (--forceflush: its line reaches the pipe at once)."""
    return ["iperf3", "-s", "-1", "-B", bind, "-p", str(port), "--idle-timeout", str(idle_timeout),
            "--forceflush"]


def client_argv(server: str, port: int, window: Optional[int], buffer: Optional[int],
                zerocopy: bool, duration: float, omit: int = 0) -> List[str]:
    argv = ["iperf3", "-c", server, "-p", str(port), "-J", "-t", str(whole_seconds(duration))]
    for flag, value in (("-O", omit), ("-w", window), ("-l", buffer)):
        if value:
            argv += [flag, str(value)]
    return argv + (["-Z"] if zerocopy else [])


def parse_iperf3_json(text: str) -> Dict[str, Any]:
    """Throughput and CPU from `iperf3 -J` output; BaselineError with iperf3's own message."""
    try:
        doc = json.loads(text)
    except ValueError:
        first = next((ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")), "")
        raise BaselineError(f"iperf3 printed no JSON result (starts with {first[:120]!r})") from None
    if not isinstance(doc, dict):
        raise BaselineError("iperf3 JSON is not an object")
    if doc.get("error"):
        raise BaselineError(f"iperf3: {doc['error']}")
    end = doc.get("end") or {}
    sent, received = end.get("sum_sent"), end.get("sum_received")
    if not sent or not received:
        raise BaselineError("iperf3 JSON has no end.sum_sent/sum_received (test did not finish)")
    cpu = end.get("cpu_utilization_percent") or {}
    start = doc.get("start") or {}
    test = start.get("test_start") or {}
    return {
        "bits_per_second": received["bits_per_second"],          # what arrived: the peer of a cell
        "sent_bits_per_second": sent["bits_per_second"],
        "bytes": received["bytes"],
        "seconds": received["seconds"],
        "retransmits": sent.get("retransmits"),
        "sender_cpu_percent": cpu.get("host_total"),
        "sender_cpu_user_percent": cpu.get("host_user"),
        "sender_cpu_system_percent": cpu.get("host_system"),
        "receiver_cpu_percent": cpu.get("remote_total"),
        "receiver_cpu_user_percent": cpu.get("remote_user"),
        "receiver_cpu_system_percent": cpu.get("remote_system"),
        "sndbuf_actual": start.get("sndbuf_actual"),
        "rcvbuf_actual": start.get("rcvbuf_actual"),
        "sock_bufsize": start.get("sock_bufsize"),
        "blksize": test.get("blksize"),
        "congestion": end.get("sender_tcp_congestion"),
        "version": start.get("version"),
    }


class Iperf3Kind(ServerClientKind):
    name = "iperf3"
    settings = Iperf3Baseline
    default_on = True
    record_kinds = {"iperf3": "iperf3 throughput (network alone)"}
    share_records = ("iperf3",)
    figure_reference = "iperf3"
    version_label = "iperf3"
    words = {"iperf3": "iperf3"}
    match_keys = ("buffer", "window")
    match_fixed = {"zerocopy": False}
    parsers = {"duration": tool_duration, "per": per_choice, "omit": lambda n: checks.int_range(n, 0, MAX_OMIT)}
    port = PORT
    ready_marker = "Server listening"
    busy_marker = "Address already in use"

    def tools(self, conf: Any) -> Sequence[Tool]:
        return (Tool("iperf3", "iperf3"),)

    def keys(self, conf: Iperf3Baseline, params_list: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
        return [{"window": w, "buffer": b, "zerocopy": z} for (w, b) in cell_pairs(conf.per, params_list)
                for z in ZEROCOPY]

    def commands(self, conf: Iperf3Baseline, key: Mapping[str, Any], address: str,
                 port: int) -> Tuple[List[str], List[str]]:
        return (server_argv(address, port),
                client_argv(address, port, key["window"], key["buffer"], key["zerocopy"], conf.duration, conf.omit))

    def refusal(self, conf: Iperf3Baseline, key: Mapping[str, Any]) -> Optional[str]:
        if key.get("buffer") and key["buffer"] > MAX_BLOCK:
            return (f"iperf3 sends blocks of at most {format_size(MAX_BLOCK)} (-l): none of "
                    f"{format_size(key['buffer'])}, the cells' call size")
        return None

    def test_seconds(self, conf: Iperf3Baseline) -> float:
        return conf.duration + conf.omit

    def parse_output(self, text: str) -> Dict[str, Any]:
        return parse_iperf3_json(text)

    def describe(self, record: Mapping[str, Any]) -> str:
        key = record.get("key") or {}
        return _describe("iperf3 -Z" if key.get("zerocopy") else "iperf3", sizes_where(key), record)


KIND = Iperf3Kind()
