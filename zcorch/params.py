"""The parameter and metric tables: every name a cell or a worker result has, written once (as fio's
`fio_options[]`); the schema, worker flags, analysis columns, docs tables and C structs derive from them.
Stdlib-only and deployed with the worker: namedtuples, as dataclasses would slow every worker start.
"""
from __future__ import annotations

import sys
from collections import namedtuple

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: importing typing costs the worker's start-up ~5 ms
    from typing import Any, Optional

from zcorch.errors import ZcorchError
from zcorch.units import format_size

KINDS = ("choice", "size", "int", "cpu", "bool", "duration", "path", "name", "cpus")
SIDES = ("send", "recv", "both", "controller")
INT_MAX = 2 ** 31 - 1  # SO_SNDBUF / SO_RCVBUF / F_SETPIPE_SZ take a C int
CPU_MAX = 65535
SIZE_MAX = 2 ** 62     # beyond it a run never ends, or arithmetic overflows
BUFFER_MAX = 2 ** 30   # one chunk buffer: allocated whole, per stream
WINDOW_MAX = INT_MAX // 2  # Linux doubles SO_SNDBUF / SO_RCVBUF requests, into a C int
DURATION_MIN = 0.001   # 1ms: the sampler's tick and the shortest deadline worth a poll
DURATION_MAX = 7 * 86400.0
# Device paths a source / sink may name without `allow_destroy:`: opening others has effects (a watchdog starts).
SOURCE_DEVICES = ("/dev/zero", "/dev/null", "/dev/urandom")
SINK_DEVICES = ("/dev/null",)


class Param(namedtuple("Param", ("key", "kind", "default", "side", "flag", "help", "unit", "choices", "min",
                                 "max", "unset", "noun", "placeholders", "worker_absent", "registry_choices", "devices",
                                 "id_omit_default", "replaces", "ctype", "c_unset", "cell_rule"),
                       defaults=("", (), None, None, None, "", (), "default", False, (), False, None, None, None,
                                 False))):
    """One parameter of a cell: its experiment-file key, how it is parsed, and how the worker gets it.

    unset: None = required, "auto" = the kernel's default, "null" = not set. worker_absent: without the flag the
    worker applies `default`, refuses to start or leaves it unset ("none"). id_omit_default: left out of the cell
    id at its default (older sets keep their ids). replaces: the `both` parameter it overrides for its side.
    """

    __slots__ = ()

    @property
    def dest(self) -> Optional[str]:
        """The worker's argparse destination and zcorch.worker.native keyword (`--pipe-size` -> pipe_size)."""
        return None if self.flag is None else self.flag[2:].replace("-", "_")


# In the order of every table and of the analysis columns.
PARAMS: "tuple[Param, ...]" = (
    Param("send_mode", "choice", "write", "send", "--mode", "how the sender hands the data to the socket",
          choices=("write", "mmap", "sendfile", "splice", "vmsplice", "msg_zerocopy", "io_uring", "io_uring_zc"),
          noun="send mode", worker_absent="required", registry_choices=True, ctype="const char *", cell_rule=True),
    Param("recv_mode", "choice", "read", "recv", "--mode", "how the receiver takes the data from the socket",
          choices=("read", "mmap", "vmsplice", "splice", "io_uring", "zerocopy_recv", "discard"),
          noun="receive mode",
          worker_absent="required", registry_choices=True, ctype="const char *", cell_rule=True),
    Param("bytes", "size", 1024 ** 3, "both", "--bytes",
          "total bytes per transfer (worker without it: the source file's size, or until EOF); not used by a "
          "cell with `duration`: the default then gives way, a `bytes` written for that cell is refused",
          unit="B", min=1, max=SIZE_MAX, unset="null", worker_absent="none", ctype="uint64_t", c_unset=0,
          cell_rule=True),
    Param("duration", "duration", None, "both", "--duration",
          "send for this long instead of a byte count (as iperf3 -t): the sender stops at the first chunk "
          "boundary after it, the receiver reads until EOF; source `mem` or /dev/zero only (a file runs "
          "out), one stream per file sink; the `timeout` deadline then counts from the end of it",
          unit="s", min=DURATION_MIN, max=DURATION_MAX, unset="null", worker_absent="none", id_omit_default=True,
          ctype="double", c_unset=0, cell_rule=True),
    Param("buffer", "size", 128 * 1024, "both", "--buffer", "bytes per call", unit="B", min=1, max=BUFFER_MAX,
          ctype="uint64_t", cell_rule=True),
    Param("send_buffer", "size", None, "send", "--buffer",
          "bytes per call of the sender alone (null: `buffer`), e.g. send() in 8 KiB against 64 KiB reads",
          unit="B", min=1, max=BUFFER_MAX, unset="null", id_omit_default=True, replaces="buffer", cell_rule=True),
    Param("recv_buffer", "size", None, "recv", "--buffer",
          "bytes per call of the receiver alone (null: `buffer`)",
          unit="B", min=1, max=BUFFER_MAX, unset="null", id_omit_default=True, replaces="buffer", cell_rule=True),
    Param("window", "size", None, "both", "--window",
          "SO_SNDBUF (sender) / SO_RCVBUF (receiver), set before connect/listen", unit="B", min=1,
          max=WINDOW_MAX, unset="auto", ctype="uint64_t", c_unset=0),
    Param("subblocks", "int", 1, "both", "--subblocks", "calls per buffer (at most `buffer`)", min=1,
          max=BUFFER_MAX, ctype="int", cell_rule=True),
    Param("pipe_size", "size", None, "both", "--pipe-size",
          "F_SETPIPE_SZ of the splice/vmsplice pipe (auto: raised to one call's bytes if smaller: a sub-block, "
          "the buffer with `splice_grain: whole`)",
          unit="B", min=1, max=INT_MAX, unset="auto", ctype="uint64_t", c_unset=0),
    Param("send_cpu", "cpu", None, "send", "--cpu", "CPU to pin the sender's transfer to", min=0, max=CPU_MAX,
          unset="null", ctype="int", c_unset=-1),
    Param("recv_cpu", "cpu", None, "recv", "--cpu", "CPU to pin the receiver's transfer to", min=0,
          max=CPU_MAX, unset="null", ctype="int", c_unset=-1),
    Param("gift", "bool", False, "both", "--gift", "SPLICE_F_GIFT (vmsplice modes only)", ctype="int",
          cell_rule=True),
    # The splice-write-benchmark's LARGE_MMAP / LARGE_VECIO: each of the study's rows is a cell of its own.
    Param("mmap_grain", "choice", "whole", "send", "--mmap-grain",
          "send `vmsplice` with fresh buffers (`gift`, or a file source): one mapping per buffer (`whole`) or one "
          "per sub-block (`subblock`), each filled, spliced and unmapped",
          choices=("whole", "subblock"), noun="granularity", id_omit_default=True, ctype="int", cell_rule=True),
    Param("splice_grain", "choice", "subblock", "send", "--splice-grain",
          "send `vmsplice`: one vmsplice()+splice() per sub-block (`subblock`) or per buffer (`whole`: one "
          "vmsplice of every sub-block's iovec, at most IOV_MAX of them a call)",
          choices=("whole", "subblock"), noun="granularity", id_omit_default=True, ctype="int", cell_rule=True),
    Param("refill", "bool", False, "send", "--refill",
          "source `mem`, a send mode with a buffer of its own (capability `refill`, `zcorch worker info`): every "
          "message is written anew into the sender's buffer before it is sent, on every iteration (with what: `fill`)",
          id_omit_default=True, ctype="int", cell_rule=True),
    # What `refill` writes: its own parameter so that stored sets keep `refill` a bool and their cell ids.
    Param("fill", "choice", "pattern", "send", "--fill",
          "with `refill`: `pattern` copies the pattern of source `mem` (the stores of a memset); `rand_crc32` "
          "writes each message as a seeded pseudo-random stream (rand() times a seed) and computes its crc32, "
          "the per-message work of a sender that makes and checksums its data",
          choices=("pattern", "rand_crc32"), noun="fill", id_omit_default=True, ctype="int", cell_rule=True),
    Param("fsync", "bool", False, "recv", "--fsync", "fsync the sink inside the timed region (file sinks only)",
          ctype="int", cell_rule=True),
    Param("source", "path", "mem", "send", "--source",
          "what the sender sends: `mem` is a fixed pattern made in memory, a path a file (/dev/zero allowed)",
          choices=("mem",), placeholders=("{scratch}",), devices=SOURCE_DEVICES, ctype="const char *",
          cell_rule=True),
    Param("sink", "path", "/dev/null", "recv", "--sink",
          "where the receiver writes: a file (see `sink_state`) or /dev/null",
          placeholders=("{scratch}", "{filesystem}"), devices=SINK_DEVICES, ctype="const char *",
          cell_rule=True),
    Param("timeout", "duration", 60.0, "both", "--timeout", "deadline of the transfer, from listen/connect",
          unit="s", min=DURATION_MIN, max=DURATION_MAX, ctype="double"),
    Param("filesystem", "name", None, "controller", None,
          "the name of an entry under `filesystems:`, mounted on the receiver for the cell", unset="null",
          cell_rule=True),
    Param("sink_state", "choice", "fresh", "recv", "--sink-state",
          "the sink file before the run: created fresh, preallocated, or overwritten (file sinks only)",
          choices=("fresh", "preallocated", "overwrite"), noun="sink state", ctype="int", cell_rule=True),
    Param("streams", "int", 1, "both", "--streams",
          "parallel TCP connections per run, each moving its own slice of the data (4 KiB-aligned) to the same "
          "offsets of the sink; `threads` says how many threads run them", min=1, max=256, id_omit_default=True,
          ctype="int", cell_rule=True),
    Param("threads", "int", None, "both", "--threads",
          "threads per side running the streams (stream i on thread i mod threads; a thread of several streams "
          "multiplexes their nonblocking sockets with epoll, io_uring rings included); thread t runs on CPU t of "
          "`send_cpus`/`recv_cpus` (round robin), else on `send_cpu`/`recv_cpu`. auto: one per CPU of "
          "`send_cpus`/`recv_cpus`, one with `send_cpu`/`recv_cpu`, else one per stream; never more than the "
          "streams nor the CPUs the worker may run on. A value above `streams` is capped at it (a thread "
          "without a stream has nothing to run); each worker records the number it ran in its params",
          min=1, max=256, unset="auto", id_omit_default=True, ctype="int", c_unset=0),
    Param("send_cpus", "cpus", None, "send", "--cpus",
          "CPUs for the sender's threads: thread t runs on the t-th (round robin; with `threads` auto, one "
          "thread per CPU, so stream i on the i-th); when given, the transfers run there rather than on `send_cpu`",
          unset="null", id_omit_default=True),
    Param("recv_cpus", "cpus", None, "recv", "--cpus",
          "CPUs for the receiver's threads: thread t runs on the t-th (round robin; with `threads` auto, one "
          "thread per CPU, so stream i on the i-th); when given, the transfers run there rather than on `recv_cpu`",
          unset="null", id_omit_default=True),
    Param("uring_depth", "int", 8, "both", "--uring-depth",
          "io_uring modes: sub-blocks per submission, sent as one linked chain (send); provided buffers, "
          "rounded up to a power of two (receive)", min=1, max=4096, id_omit_default=True,
          ctype="int"),
    Param("tcp_maxseg", "int", None, "recv", "--tcp-maxseg",
          "TCP_MAXSEG of the receiver's listening socket: caps the sender's payload per segment at this "
          "less 12 bytes of timestamps (null: the kernel's; `zerocopy_recv` then takes whole pages for the "
          "data interface's MTU)", min=88, max=32767, unset="null", id_omit_default=True,
          ctype="int", c_unset=0),
    Param("sample_interval", "duration", 1.0, "both", "--sample-interval",
          "interval of the per-run samples (bytes, process and host CPU, TCP_INFO), kept for transfers that "
          "last at least 3 intervals; null = no samples", unit="s", min=DURATION_MIN, max=DURATION_MAX,
          unset="null", worker_absent="none", id_omit_default=True),
    Param("idle_probe", "duration", None, "both", "--idle-probe",
          "before its transfer each worker reads the host's /proc/stat twice this far apart and records the share "
          "of the host's CPU time that was idle (`host_idle_before`): whether other work was running. The receiver "
          "probes before it listens, the sender before it connects, so neither window holds the other's "
          "transfer; null = no probe", unit="s", min=DURATION_MIN, max=60.0, unset="null", worker_absent="none",
          id_omit_default=True),
    Param("network", "name", None, "controller", None,
          "the name of an entry under `networks:` (MTU of the data link, congestion control, sysctls), applied "
          "on both hosts for the cell and restored after; null leaves the hosts' network as it is",
          unset="null", noun="network", id_omit_default=True),
)

_BY_KEY = {p.key: p for p in PARAMS}
CELL_RULE_KEYS: "tuple[str, ...]" = tuple(p.key for p in PARAMS if p.cell_rule)
NUMERIC_KINDS = ("size", "int", "cpu", "duration")
_LIMIT_NOUNS = {"size": "a size", "int": "an integer", "cpu": "an integer", "duration": "a duration"}
ID_OMIT_AT_DEFAULT: "dict[str, Any]" = {p.key: p.default for p in PARAMS if p.id_omit_default}
DEFAULTS: "dict[str, Any]" = {p.key: p.default for p in PARAMS}
PARAM_KEYS: "tuple[str, ...]" = tuple(_BY_KEY)
SIZE_KEYS = frozenset(p.key for p in PARAMS if p.kind == "size")
_REPLACER = {(p.side, p.replaces): p.key for p in PARAMS if p.replaces}


def param(key: str) -> Param:
    """The table entry of `key`; ZcorchError naming the known keys if there is none."""
    try:
        return _BY_KEY[key]
    except KeyError:
        raise ZcorchError(f"unknown parameter {key!r} (known: {', '.join(PARAM_KEYS)})") from None


def side_params(side: str) -> "tuple[Param, ...]":
    """The parameters the worker of `side` ("send" or "recv") gets as flags, in table order."""
    if side not in ("send", "recv"):
        raise ZcorchError(f"side must be send or recv, not {side!r}")
    return tuple(p for p in PARAMS if p.flag is not None and p.side in (side, "both") and not p.replaces)


def side_value(side: str, params: "dict[str, Any]", key: str) -> Any:
    """The value of `key` the worker of `side` gets: its per-side replacement when set (send_buffer)."""
    replacer = _REPLACER.get((side, key))
    if replacer is not None and not _is_missing(params.get(replacer)):  # NaN: a missing cell of a frame
        return params[replacer]
    return params.get(key)


def limit_text(p: Param) -> str:
    """The limits of a numeric parameter in words: the one wording of the plan's and the worker's."""
    if p.kind == "size":
        text = f"between {p.min} and {p.max} bytes"
        pretty = format_size(p.max)
        return text + (f" ({pretty})" if pretty != str(p.max) else "")
    if p.kind == "duration":
        return f"between {p.min:g}s and {p.max:g}s"
    return f"between {p.min} and {p.max}"


def limit_expectation(p: Param) -> str:
    """"expected an integer between 1 and 256": a limit message less the value it got."""
    return f"expected {_LIMIT_NOUNS[p.kind]} {limit_text(p)}"


def format_got(p: Param, value: Any) -> str:
    """A value in a limit message, as the C worker prints it (`%.9gs` for a duration, an integer else)."""
    return f"{value:.9g}s" if p.kind == "duration" else str(value)


def limit_problem(p: Param, value: Any) -> Optional[str]:
    """None if `value` is within the limits of `p`, else the message plan and worker both give."""
    return None if p.min <= value <= p.max else f"{limit_expectation(p)}, got {format_got(p, value)}"


def c_params() -> "tuple[Param, ...]":
    """The parameters with a field in the C worker's zc_params, one per field (`dest`), in table order."""
    out: "dict[str, Param]" = {}
    for p in PARAMS:
        if p.ctype is not None:
            out.setdefault(p.dest, p)
    return tuple(out.values())


def c_value(p: Param, value: Any) -> Any:
    """The C field's value of `p` for a worker value: c_unset, a choice's index, 0/1 for a bool, else itself."""
    if value is None:
        return p.c_unset
    if p.kind == "choice" and p.ctype == "int":
        return p.choices.index(value)
    if p.kind == "bool":
        return 1 if value else 0
    return value


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)  # NaN: a missing pandas cell


def format_value(key: str, value: Any) -> str:
    """A parameter value as a user would write it (sizes with binary units, `auto`/`none` when unset, true/false,
    durations in s or whole minutes); also what frames hold (NaN, numpy scalars); a non-parameter key as is."""
    p = _BY_KEY.get(key)
    if _is_missing(value):
        if p is not None and p.replaces:
            return f"({p.replaces})"  # null: the shared parameter's value
        return "auto" if p is not None and p.unset == "auto" else "none"
    if isinstance(value, bool) or (p is not None and p.kind == "bool"):
        return "true" if value else "false"
    if p is None or isinstance(value, str):
        return str(value)
    if p.kind == "cpus" and isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if p.kind in ("size", "int", "cpu"):
        try:
            n = int(value)
        except (TypeError, ValueError):
            return str(value)
        return str(value) if n != value else format_size(n) if p.kind == "size" else str(n)
    if p.kind == "duration":
        return f"{value / 60:g}m" if value >= 60 and value % 60 == 0 else f"{value:g}s"
    return str(value)


def _flag_value(value: Any) -> str:
    if isinstance(value, float):  # exact and in a form units.parse_duration reads (never 1e+07)
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def worker_flags(side: str, params: "dict[str, Any]") -> "list[str]":
    """Worker flags for one side of a cell, in table order (switches last); an unset value leaves its out."""
    args: "list[str]" = []
    switches: "list[str]" = []
    for p in side_params(side):
        value = side_value(side, params, p.key)
        if p.kind == "bool":
            if value:
                switches.append(p.flag)
        elif value is not None and value != "auto":
            args += [p.flag, _flag_value(value)]
    return args + switches


# ---------------------------------------------------------------- metrics

class Metric(namedtuple("Metric", ("name", "unit", "side", "applies_to", "help", "combine", "ctype", "extent"),
                        defaults=("sum", "int64_t", None))):
    """One key of a worker's result: its unit, which side reports it ("send", "recv", "both"), for which modes.

    applies_to: None = every mode, or the C mode capability it needs. extent: "total" (grows with `bytes`),
    "level" (a peak, size or end state) or None (an id, a flag, a list)."""

    __slots__ = ()


# How parallel streams' values make the group's (span: measured by the group; once: host-wide, around it).
COMBINES = ("sum", "max", "min", "mean", "first", "span", "once")

def _host(name: str, unit: str, help: str, extent: "Optional[str]" = None) -> Metric:
    """A host-wide metric: read around the whole group of streams, no zc_metrics field."""
    return Metric(name, unit, "both", None, help, combine="once", ctype=None, extent=extent)


# In the order of the C struct (zc_metrics, generated) and of the analysis columns.
METRICS: "tuple[Metric, ...]" = (
    Metric("bytes", "B", "both", None, "payload bytes moved", ctype="uint64_t", extent="total"),
    Metric("wall_ns", "ns", "both", None, "wall-clock time of the timed region", combine="span", extent="total"),
    Metric("utime_us", "µs", "both", None, "user CPU time of the worker process during the transfer", extent="total"),
    Metric("stime_us", "µs", "both", None, "system CPU time of the worker process during the transfer", extent="total"),
    Metric("minflt", "count", "both", None, "minor page faults", extent="total"),
    Metric("majflt", "count", "both", None, "major page faults (needed I/O)", extent="total"),
    Metric("nvcsw", "count", "both", None, "voluntary context switches", extent="total"),
    Metric("nivcsw", "count", "both", None, "involuntary context switches", extent="total"),
    Metric("maxrss_kib", "KiB", "both", None, "peak resident set size of the process (not a delta)", combine="max", extent="level"),
    Metric("sndbuf", "B", "both", None, "SO_SNDBUF read back from the connected socket (Linux doubles a request)",
           combine="first", extent="level"),
    Metric("rcvbuf", "B", "both", None, "SO_RCVBUF read back from the connected socket (Linux doubles a request)",
           combine="first", extent="level"),
    Metric("tcp_rtt_us", "µs", "both", None, "smoothed round-trip time (TCP_INFO at the end)", combine="mean", extent="level"),
    Metric("tcp_rttvar_us", "µs", "both", None, "round-trip time variance (TCP_INFO at the end)", combine="mean", extent="level"),
    Metric("tcp_retransmits", "count", "both", None, "retransmissions of the oldest unacknowledged segment", extent="level"),
    Metric("tcp_total_retrans", "count", "both", None, "segments retransmitted over the connection", extent="total"),
    Metric("tcp_snd_cwnd", "segments", "both", None, "congestion window", extent="level"),
    Metric("tcp_snd_mss", "B", "both", None, "sending maximum segment size", combine="min", extent="level"),
    Metric("tcp_rcv_mss", "B", "both", None, "receiving maximum segment size", combine="min", extent="level"),
    Metric("tcp_pmtu", "B", "both", None, "path MTU", combine="min", extent="level"),
    Metric("fsync_ns", "ns", "recv", None, "time of the fsync of the sink inside the timed region (`fsync` only)",
           combine="span", extent="total"),
    Metric("zc_completions", "count", "send", "zc_completions",
           "MSG_ZEROCOPY completion notifications (io_uring_zc: its notification completions)", extent="total"),
    Metric("zc_copied", "count", "send", "zc_completions",
           "completions the kernel marked as copied (SO_EE_CODE_ZEROCOPY_COPIED; io_uring_zc: "
           "IORING_NOTIF_USAGE_ZC_COPIED)", extent="total"),
    Metric("pipe_size", "B", "both", "pipe", "effective pipe size (F_GETPIPE_SZ)", combine="first", extent="level"),
    Metric("zc_recv_mapped", "B", "recv", "zc_recv",
           "bytes TCP_ZEROCOPY_RECEIVE mapped into the receiver instead of copying them", extent="total"),
    Metric("zc_recv_copied", "B", "recv", "zc_recv",
           "bytes the zero-copy receiver had to read() (payload that was not whole, mappable pages)", extent="total"),
    Metric("uring_cqes", "count", "both", "uring", "io_uring completions reaped (zero-copy notifications included)", extent="total"),
    Metric("uring_bundle", "0/1", "recv", "uring",
           "1 when the receive used bundles (IORING_RECVSEND_BUNDLE), 0 when the kernel has none", combine="max"),
    Metric("refused_connections", "count", "recv", None,
           "data connections the receiver dropped before its sender's: from another address than the sender's "
           "data address, or without the run's nonce in their stream hello (the result's `refused` says which)",
           combine="first", ctype="int64_t", extent="level"),
    # Host-wide, read just outside the timed region (zcorch.worker.hoststat): the "host CPU" view.
    _host("host_window_ns", "ns",
          "time between the two /proc/stat reads around the transfer: the window of every host_* time", "total"),
    _host("host_user_us", "µs", "host-wide user time, all CPUs (/proc/stat; includes guest)", "total"),
    _host("host_nice_us", "µs", "host-wide niced user time, all CPUs (/proc/stat)", "total"),
    _host("host_system_us", "µs", "host-wide system time, all CPUs (/proc/stat)", "total"),
    _host("host_irq_us", "µs", "host-wide hard-interrupt time, all CPUs (/proc/stat)", "total"),
    _host("host_softirq_us", "µs",
          "host-wide softirq time, all CPUs (/proc/stat): most of the network stack's receive work", "total"),
    _host("host_iowait_us", "µs", "host-wide idle time waiting for I/O, all CPUs (/proc/stat)", "total"),
    _host("host_steal_us", "µs", "host-wide time stolen by the hypervisor, all CPUs (/proc/stat)", "total"),
    _host("host_idle_us", "µs", "host-wide idle time, all CPUs (/proc/stat)", "total"),
    _host("host_ncpus", "count", "CPUs in /proc/stat at both reads", "level"),
    _host("host_clk_tck", "ticks/s",
          "USER_HZ, the tick of every /proc/stat time (usually 100/s per CPU)", "level"),
    _host("host_ticks", "ticks",
          "ticks /proc/stat counted in the window, all CPUs and fields (≈ window × USER_HZ × CPUs): the resolution "
          "of every host_* time (a count is off by up to 2 ticks per CPU); fewer than 100 flag the run (`cpu_resolution`)", "total"),
    _host("host_per_cpu_us", "µs",
          "per CPU (`cpuN`): [user, nice, system, irq, softirq, iowait, steal, idle] over the window"),
    _host("host_net_rx_softirqs", "count", "NET_RX softirqs run on the host (/proc/softirqs, all CPUs)", "total"),
    _host("host_net_tx_softirqs", "count", "NET_TX softirqs run on the host (/proc/softirqs, all CPUs)", "total"),
    _host("host_tcp_retrans_segs", "count",
          "TCP segments retransmitted in the host's network namespace (/proc/net/snmp RetransSegs)", "total"),
    _host("host_tcp_out_segs", "count",
          "TCP segments sent in the host's network namespace (/proc/net/snmp OutSegs)", "total"),
    _host("host_tcp_in_segs", "count",
          "TCP segments received in the host's network namespace (/proc/net/snmp InSegs)", "total"),
    _host("host_pgfault", "count", "page faults on the host (/proc/vmstat pgfault)", "total"),
    _host("host_pgmajfault", "count", "major page faults on the host (/proc/vmstat pgmajfault)", "total"),
    _host("host_idle_before", "share",
          "share (0..1) of the host's CPU time that was idle (idle + iowait) over the `idle_probe` window just "
          "before the worker started: 1 = a quiet machine, near 0 = every CPU busy with other work", "level"),
    _host("host_boot_id", "id",
          "the kernel's boot id (not a delta): the same on both sides = one machine, whose host CPU counts once"),
)
METRIC_KEYS: "tuple[str, ...]" = tuple(m.name for m in METRICS)
# The host_<field>_us fields, and the busy ones: not idle, iowait (could run something) nor steal (not ours).
HOST_CPU_FIELDS: "tuple[str, ...]" = ("user", "nice", "system", "irq", "softirq", "iowait", "steal", "idle")
HOST_BUSY_FIELDS: "tuple[str, ...]" = ("user", "nice", "system", "irq", "softirq")


def metric_applies(metric: Metric, side: str, mode_caps: "frozenset[str]") -> bool:
    """Whether the worker of `side` running a mode with capabilities `mode_caps` reports `metric`."""
    return metric.side in (side, "both") and (metric.applies_to is None or metric.applies_to in mode_caps)


# ---------------------------------------------------------------- docs tables

# The cell rules the planner (on names) and the C worker (on what it opened) both apply, worded once;
# native/gen_params.py writes each as a printf format ZC_RULE_<NAME> (%s unless in CELL_RULE_FORMATS).
CELL_RULES = {
    "file_sink": "receive mode `{mode}` needs a regular file as sink, not {sink}",
    "no_sink": "receive mode `{mode}` keeps no data: its sink must be /dev/null, not `{sink}`",
    "file_source": "send mode `{mode}` reads from a file; source `mem` is not one (use a path or /dev/zero)",
    "mappable_source": "send mode `{mode}` cannot map {source}; use a regular file as source",
    "grain": "{grains}: send mode `{mode}` makes no such calls (only {only})",
    "grain_needs_gift": "`mmap_grain: subblock` maps fresh buffers: source `mem` needs `gift: true` (without it "
                        "the pattern is spliced from memory mapped once)",
    "refill": "`refill` fills a buffer of the sender's own: send mode `{mode}` has none (only {only})",
    "refill_needs_mem": "`refill` rewrites the pattern of source `mem`; a file source (`{source}`) is read into "
                        "the buffer instead",
    "fill_needs_refill": "`fill: {fill}` says what `refill` writes into each message: it needs `refill: true`",
    "one_stream": "{side} mode `{mode}` handles one stream only; `streams: {streams}` needs another",
    "subblocks": "subblocks ({subblocks}) > {buffer_key} ({buffer} bytes): a sub-block would be empty",
    "fsync_sink": "`fsync` needs a regular file as sink, not {sink}",
    "sink_state_sink": "sink_state `{sink_state}` needs a regular file as sink, not {sink}",
    "sink_state_bytes": "sink_state `{sink_state}` prepares `bytes` of the sink: it needs `bytes`, not `duration`",
    "bytes_and_duration": "`bytes` and `duration` are both set: a cell moves a byte count or runs for a time, "
                          "not both (leave `bytes` unwritten, or null, for the cells with `duration`)",
    "duration_source": "`duration` needs source `mem` or /dev/zero: a file (`{source}`) runs out before the "
                       "time is up (use `bytes`)",
    "duration_streams": "`duration` with `streams: {streams}` needs sink /dev/null: a stream's slice of a file "
                        "sink is unknown until the time is up",
}
CELL_RULE_FORMATS = {"streams": "%d", "subblocks": "%d", "buffer": "%llu"}


def rule_text(name: str, **values: Any) -> str:
    """The message of cell rule `name` with its placeholders filled."""
    return CELL_RULES[name].format(**values)


_SIDE_WORDS = {"send": "sender", "recv": "receiver", "both": "both", "controller": "controller"}


def describe(p: Param) -> str:
    """The accepted values of a parameter, in words (the docs' `values` column)."""
    if p.kind == "choice":
        text = ", ".join(f"`{c}`" for c in p.choices)
    elif p.kind == "size":
        at_most, below = format_size(p.max), format_size(p.max + 1)
        text = f"size > 0 (≤ {at_most})" if not at_most.isdigit() or below.isdigit() else f"size > 0 (< {below})"
    elif p.kind in ("int", "cpu"):
        what = "CPU index" if p.kind == "cpu" else "integer"
        text = f"{what} ≥ {p.min}" if p.max is None else f"{what} between {p.min} and {p.max}"
    elif p.kind == "duration":
        text = f"duration {limit_text(p)}"
    elif p.kind == "path":
        forms = [f"`{w}`" for w in p.choices] + ["an absolute path"] + [f"`{ph}/FILE`" for ph in p.placeholders]
        text = ", ".join(forms[:-1]) + " or " + forms[-1] if len(forms) > 1 else forms[0]
    else:
        text = {"bool": "`true`/`false`", "cpus": "a CPU list (`0-3`, `0,2`)"}.get(p.kind, "a name")
    if p.replaces:
        text += f", or null = `{p.replaces}`"
    elif p.unset == "auto":
        text += ", or `auto`/null = kernel default"
    elif p.unset == "null":
        text += ", or null"
    return text


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_tables() -> "dict[str, str]":
    """{"params": table, "metrics": table}: the generated Markdown of docs/experiment-files.md."""
    rows = ["| key | default | values | worker flag |", "|---|---|---|---|"]
    for p in PARAMS:
        default = f"unset (`{'auto' if p.unset == 'auto' else 'null'}`)" if p.default is None \
            else f"`{format_value(p.key, p.default)}`"
        flag = f"`{p.flag}` ({_SIDE_WORDS[p.side]})" if p.flag else f"– ({_SIDE_WORDS[p.side]})"
        rows.append(f"| `{p.key}` | {default} | {_cell(describe(p))}: {_cell(p.help)} | {flag} |")
    params_md = "\n".join(rows)
    rows = ["| metric | unit | side | applies to | meaning |", "|---|---|---|---|---|"]
    for m in METRICS:
        modes = "all modes" if m.applies_to is None else f"modes with capability `{m.applies_to}`"
        rows.append(f"| `{m.name}` | {m.unit} | {_SIDE_WORDS[m.side]} | {modes} | {_cell(m.help)} |")
    return {"params": params_md, "metrics": "\n".join(rows)}


def doc_markers(block: str) -> "tuple[str, str]":
    return f"<!-- {block}:begin -->", f"<!-- {block}:end -->"


def replace_block(text: str, block: str, table: str) -> str:
    """`text` with the lines between the markers of `block` replaced by `table`; ValueError without."""
    begin, end = doc_markers(block)
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"the document has no `{begin}` ... `{end}` block")
    return text[:start + len(begin)] + "\n" + table + "\n" + text[stop:]


def render_docs(text: str) -> str:
    """`text` with every generated block (markdown_tables) replaced by the current table."""
    for block, table in markdown_tables().items():
        text = replace_block(text, block, table)
    return text


def rewrite_docs(path: str, render: "Any") -> None:
    """The file `path` rewritten by `render(text)` when that changes it (OSError, ValueError as they come)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    new = render(text)
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)


def main(argv: "Optional[list[str]]" = None) -> int:
    """`python -m zcorch.params --markdown` prints the tables; `--update-docs FILE` rewrites their blocks."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m zcorch.params", description=main.__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", action="store_true", help="print both tables with their markers")
    group.add_argument("--update-docs", metavar="FILE", help="rewrite the generated blocks of FILE in place")
    args = parser.parse_args(argv)
    if args.markdown:
        for block, table in markdown_tables().items():
            begin, end = doc_markers(block)
            print(f"{begin}\n{table}\n{end}\n")
        return 0
    try:
        rewrite_docs(args.update_docs, render_docs)
    except (OSError, ValueError) as exc:
        print(f"python -m zcorch.params: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
