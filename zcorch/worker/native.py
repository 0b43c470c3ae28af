"""Python face of the C transfer core (`zcorch._native`, built by native/build.py).

The one place where C error codes become `WorkerError`s. Calls into C release the GIL, so a `Receiver`
and `send()` can run in two threads of one process. Stdlib-only apart from the built extension: deployed
to remote hosts with the worker.

    with Receiver("127.0.0.1", 0, "read", sink="/tmp/out", timeout=10) as rx:   # listening now
        ...start the sender (another thread/process) towards rx.port...
        result = rx.run()                                                      # accept + transfer
    result = send("127.0.0.1", port, "sendfile", source="/tmp/in", buffer=65536, timeout=10)

Results are flat dicts: the metric keys of docs/architecture.md (None where one does not apply) plus "side",
"mode", "params" (as applied), "samples", and with `streams=N` a "streams" list whose totals are the top-level
metrics; host_* metrics and samples are host-wide, taken once around all streams.
"""
from __future__ import annotations

import errno
import os
TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: importing typing costs the worker's start-up ~5 ms
    from typing import Any, Optional

from zcorch import params as _table
from zcorch.worker import hoststat
from zcorch.errors import WorkerError
from zcorch.params import METRICS, metric_applies
from zcorch.units import parse_duration, parse_size

try:
    from zcorch import _native as _module
except ImportError as _exc:  # pragma: no cover - exercised on hosts without a build
    _module = ffi = lib = None
    _IMPORT_ERROR: Optional[ImportError] = _exc
else:
    ffi, lib = _module.ffi, _module.lib
    _IMPORT_ERROR = None

SIDES = {"send": 0, "recv": 1}
SINK_STATES = {name: i for i, name in enumerate(_table.param("sink_state").choices)}  # ZC_SINK_STATE_* in C
# The metric names are the table's in zcorch.params (METRIC_KEYS stays importable from here).
METRIC_KEYS = _table.METRIC_KEYS
SAMPLE_MIN_INTERVALS = 3   # samples are kept for transfers of at least this many intervals
MAX_SAMPLES = 200_000    # 14 MB of zc_sample at most (a tiny interval with a long timeout)


def _lib():
    if lib is None:
        raise WorkerError(errno.ENOENT, f"the native module zcorch._native is not built ({_IMPORT_ERROR}); "
                                        "run: python3 native/build.py --out <dir holding zcorch/>")
    return lib


def native_path() -> str:
    """File of the loaded extension (reported by `zcorch worker info`)."""
    _lib()
    return str(_module.__file__)


def compiled_modes() -> "dict[str, list[str]]":
    """{'send': [...], 'recv': [...]} in registry order."""
    L = _lib()
    return {side: [ffi.string(L.zc_mode_name(n, i)).decode() for i in range(L.zc_mode_count(n))]
            for side, n in SIDES.items()}


_CAPS: "Optional[dict[str, dict[str, frozenset[str]]]]" = None  # the C tables never change: read once


def capability_names() -> "tuple[str, ...]":
    """Every capability name, in bit order (ZC_CAP_* of zcorch_api.h)."""
    L = _lib()
    return tuple(ffi.string(L.zc_cap_name(1 << i)).decode() for i in range(int(L.ZC_CAP_ALL).bit_length()))


def mode_capabilities() -> "dict[str, dict[str, frozenset[str]]]":
    """{'send': {'write': frozenset(), 'mmap': frozenset({'file_source', 'mappable_source'}), ...},
    'recv': {...}}: what each compiled mode declares in its C ops table, in registry order."""
    global _CAPS
    if _CAPS is None:
        L = _lib()
        if not hasattr(L, "zc_mode_caps"):
            raise WorkerError(errno.ENOENT, f"the native module {native_path()} was built from sources without "
                                            "mode capabilities; rebuild it: python3 native/build.py --out <dir "
                                            "holding zcorch/>")
        bits = [(1 << i, name) for i, name in enumerate(capability_names())]
        _CAPS = {side: {mode: frozenset(name for bit, name in bits if L.zc_mode_caps(SIDES[side], mode.encode()) & bit)
                        for mode in modes}
                 for side, modes in compiled_modes().items()}
    return {side: dict(modes) for side, modes in _CAPS.items()}


def unavailable_modes() -> "dict[str, dict[str, str]]":
    """{'send': {mode: why}, 'recv': {...}}: compiled modes this kernel cannot run (their
    kernel-feature probe failed), with the reason. Probes the kernel on each call."""
    L = _lib()
    why = ffi.new("char[]", 256)
    out: "dict[str, dict[str, str]]" = {}
    for side, modes in compiled_modes().items():
        out[side] = {}
        for mode in modes:
            if L.zc_mode_available(SIDES[side], mode.encode(), why, len(why)) != 1:
                out[side][mode] = ffi.string(why).decode(errors="replace")
    return out


def build_features() -> "dict[str, Optional[str]]":
    """{feature: None if this build has it, else why not} (native/build.py FEATURES: io_uring,
    io_uring_send_zc, io_uring_pbuf_ring, tcp_zerocopy_receive). {} for a build older than them."""
    L = _lib()
    if not hasattr(L, "zc_build_feature_name"):
        return {}
    out: "dict[str, Optional[str]]" = {}
    i = 0
    while True:
        name = L.zc_build_feature_name(i)
        if name == ffi.NULL:
            return out
        why = L.zc_build_feature_missing(i)
        out[ffi.string(name).decode()] = None if why == ffi.NULL else ffi.string(why).decode(errors="replace")
        i += 1


def parse_cpus(value: Any) -> "Optional[list[int]]":
    """A CPU list: "0,2-3" / "0 2 3", a list of ints, or one int -> [0, 2, 3]; None/"" -> None.
    ValueError naming the problem."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError(f"not a CPU list: {value!r}")
    if isinstance(value, int):
        items: "list[Any]" = [value]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = [t for t in str(value).replace(",", " ").split() if t]
    cpus: "list[int]" = []
    for item in items:
        if isinstance(item, bool):
            raise ValueError(f"not a CPU: {item!r}")
        if isinstance(item, int):
            lo = hi = item
        else:
            text = str(item).strip()
            first, dash, last = text.partition("-")
            if not first.isdigit() or (dash and not last.isdigit()):
                raise ValueError(f"not a CPU or range (N or N-M): {text!r}")
            lo, hi = int(first), int(last) if dash else int(first)
            if hi < lo:
                raise ValueError(f"range {text!r} runs backwards")
        if lo < 0 or hi > _table.CPU_MAX:
            raise ValueError(f"CPU {lo if lo < 0 else hi} is out of range (0..{_table.CPU_MAX})")
        cpus.extend(range(lo, hi + 1))
    if not cpus:
        raise ValueError("an empty CPU list")
    return cpus


OPEN_FLAGS = {"source": 0, "sink": 1}


def open_file(path: str, what: str, create: bool = False, devices: bool = False, walk: bool = False) -> int:
    """A descriptor of `path` opened as the C core opens a source ("source": read-only) or a sink ("sink":
    read-write, never truncated; `create`: made when missing), following no link, judged on the descriptor
    (native/core/openpath.c; `devices`: any device). `walk`: component by component, as without openat2
    (tests). WorkerError with the reason otherwise."""
    L = _lib()
    how = OPEN_FLAGS[what] | (int(L.ZC_OPEN_CREATE) if create else 0) | (int(L.ZC_OPEN_DEVICES) if devices else 0)
    how |= int(L.ZC_OPEN_WALK) if walk else 0
    err = ffi.new("zc_error *")
    created = ffi.new("int *")
    fd = L.zc_open_file(os.fsencode(path), how, created, err)
    if fd < 0:
        _raise(err)
    return int(fd)


def open_dir(path: str, walk: bool = False) -> int:
    """An O_PATH descriptor of directory `path` (absolute) for the *at calls, reached following no link and
    judged on the descriptor, so what is created beneath it stays there however the names change. `walk` as
    in open_file; WorkerError with the reason otherwise."""
    L = _lib()
    err = ffi.new("zc_error *")
    fd = L.zc_open_dir(os.fsencode(path), int(L.ZC_OPEN_WALK) if walk else 0, err)
    if fd < 0:
        _raise(err)
    return int(fd)


def mem_pattern(offset: int, length: int) -> bytes:
    """The bytes source `mem` sends at [offset, offset+length) (see native/mempattern.c)."""
    L = _lib()
    buf = ffi.new("unsigned char[]", max(length, 1))
    L.zc_mem_pattern(offset, buf, length)
    return bytes(ffi.buffer(buf, length))


def mem_pattern_period() -> int:
    return int(_lib().zc_mem_pattern_period())


CALIBRATE_BYTES = 64 << 20
_GIB = float(1 << 30)


def calibrate(bytes: int = CALIBRATE_BYTES, cpu: Optional[int] = None) -> "dict[str, Any]":
    """Copy-cost yardsticks of this host (native/core/calibrate.c), on this thread (pinned to `cpu` while it measures): the
    zc_calibration fields, and derived from them memcpy_s_per_gib (CPU seconds one copy of a GiB costs),
    memcpy_gib_s, memcpy_best_s_per_gib, fault_ns_per_page, fault_s_per_gib, syscall_ns_per_call."""
    L = _lib()
    out = ffi.new("zc_calibration *")
    err = ffi.new("zc_error *")
    if L.zc_calibrate(int(bytes), -1 if cpu is None else int(cpu), out, err) != 0:
        _raise(err)
    r: "dict[str, Any]" = {name: int(getattr(out, name)) for name, _ in ffi.typeof("zc_calibration").fields}
    gib = r["memcpy_bytes"] / _GIB
    r["memcpy_s_per_gib"] = r["memcpy_ns"] / 1e9 / gib
    r["memcpy_best_s_per_gib"] = r["memcpy_best_ns"] / 1e9 / gib
    r["memcpy_gib_s"] = gib / (r["memcpy_ns"] / 1e9)
    r["fault_ns_per_page"] = r["fault_ns"] / r["fault_pages"]
    r["fault_s_per_gib"] = r["fault_ns"] / 1e9 / (r["fault_pages"] * r["page_size"] / _GIB)
    r["syscall_ns_per_call"] = r["syscall_ns"] / r["syscall_calls"]
    r["cpu"] = cpu
    return r


def _bad(message: str) -> WorkerError:
    return WorkerError(errno.EINVAL, message)


def _worker_params(side: str) -> "dict[str, _table.Param]":
    """{keyword (dest): parameter} of the side's worker, the mode aside (native's positional argument)."""
    return {p.dest: p for p in _table.side_params(side) if p.dest != "mode"}


def _as_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _as_choice(p: "_table.Param", value: Any) -> str:
    if value not in p.choices:
        raise ValueError(f"must be one of {', '.join(p.choices)}, not {value!r}")
    return value


# kind -> the worker's parser of one value (the limits are the C core's: zc_validate)
_PARSERS = {"size": lambda p, v: parse_size(v), "int": lambda p, v: _as_int(v), "cpu": lambda p, v: _as_int(v),
            "duration": lambda p, v: parse_duration(v), "bool": lambda p, v: bool(v), "choice": _as_choice,
            "path": lambda p, v: v or p.default,
            # as the experiment file's canonical text "0,2,3" (the C list is made from it); None: unset
            "cpus": lambda p, v: ",".join(map(str, parse_cpus(v) or ())) or None}


def _parse(p: "_table.Param", value: Any) -> Any:
    """One parameter's value as the worker applies it (None: unset); WorkerError(EINVAL) naming its flag. The
    C core checks the table's limits (zc_validate); here only what C cannot see: a value C would take for
    "unset" (window 0), and a parameter C does not get."""
    if p.kind == "path":
        return _PARSERS["path"](p, value)
    if value is None or (p.unset == "auto" and value == "auto"):
        return None
    if p.kind == "duration" and p.unset == "null" and value in (0, "0"):
        return None  # sample_interval 0: no samples
    try:
        parsed = _PARSERS[p.kind](p, value)
    except ValueError as exc:
        raise _bad(f"{p.flag}: {exc}") from None
    if p.kind in _table.NUMERIC_KINDS and (p.ctype is None or parsed == p.c_unset):
        problem = _table.limit_problem(p, parsed)
        if problem:
            raise _bad(f"{p.flag}: {problem}")
    return parsed


def normalize_params(side: str, **given: Any) -> "dict[str, Any]":
    """Parameters as they will be applied (sizes in bytes, durations in s, a CPU list as "0,2"), keyed by
    the worker's keyword (zcorch.params Param.dest); the table's default for one not given. WorkerError
    (EINVAL) for a value that cannot be parsed, or one of the other side's parameters given a value."""
    if side not in SIDES:
        raise _bad(f"side must be send or recv, not {side!r}")
    mine = _worker_params(side)
    other_side = "recv" if side == "send" else "send"
    others = {dest: p for dest, p in _worker_params(other_side).items() if dest not in mine}
    unknown = sorted(set(given) - set(mine) - set(others))
    if unknown:
        raise TypeError(f"normalize_params() got unexpected keyword arguments: {', '.join(unknown)}")
    misplaced = [p.flag for dest, p in others.items() if given.get(dest) not in (None, False, p.default)]
    if misplaced:
        words = ("receiver", "sender") if side == "send" else ("sender", "receiver")
        raise _bad(f"the {words[0]} parameters {', '.join(misplaced)} do not apply to the {words[1]}")
    return {dest: _parse(p, given.get(dest, p.default if p.worker_absent == "default" else None))
            for dest, p in mine.items()}


class _CParams:
    """A zc_params struct plus the C strings and arrays it points to (kept alive as long as this object); a
    field of the table's (zcorch.params.c_params) this side does not get keeps zc_params_init's default."""

    def __init__(self, side: str, mode: str, host: str, port: int, p: "dict[str, Any]",
                 run: "Optional[dict[str, Any]]" = None):
        self._keep: "list[Any]" = []
        s = ffi.new("zc_params *")
        lib.zc_params_init(s)
        s.side = SIDES[side]
        s.mode = self._str(mode)
        s.host = self._str(host)
        s.port = port
        run = run or {}
        s.allow_device_sink = 1 if run.get("allow_device_sink") else 0
        s.peer = self._str(run.get("peer"))
        s.nonce = self._str(run.get("nonce"))
        for prm in _table.c_params():
            if prm.dest == "mode" or prm.dest not in p:
                continue
            value = _table.c_value(prm, p[prm.dest])
            try:
                setattr(s, prm.dest, self._str(value) if prm.ctype == "const char *" else value)
            except OverflowError:  # beyond the C type: beyond the table's limits too
                raise _bad(f"{prm.flag}: {_table.limit_problem(prm, p[prm.dest])}") from None
        cpus = parse_cpus(p.get("cpus")) or []
        if cpus:
            arr = ffi.new("int[]", cpus)
            self._keep.append(arr)
            s.cpus = arr
        s.ncpus = len(cpus)
        if s.streams > 1:
            self.stream_metrics = ffi.new("zc_metrics[]", s.streams)
            self.stream_offsets = ffi.new("uint64_t[]", s.streams)
            s.stream_metrics = self.stream_metrics
            s.stream_offsets = self.stream_offsets
        self.watch = _Watch(p.get("sample_interval"), p["timeout"] + (p.get("duration") or 0))
        s.watch = self.watch.struct
        self.struct = s
        # the threads the streams run on: auto and a value above --streams resolved by the C core (the one
        # place), recorded among the parameters as applied
        p["threads"] = int(lib.zc_threads_effective(s))

    def _str(self, value: Optional[str]):
        if value is None:
            return ffi.NULL
        c = ffi.new("char[]", value.encode())
        self._keep.append(c)
        return c


def validate(side: str, mode: str, **params: Any) -> "dict[str, Any]":
    """The checks a run starts with, and nothing else: the parameters as applied (normalize_params), or
    WorkerError as send() / Receiver() would raise it (the C core's zc_validate: the table's limits, the
    mode, what the mode cannot do). Opens nothing."""
    L = _lib()
    applied = normalize_params(side, **params)
    c = _CParams(side, mode, "", 0, applied)
    err = ffi.new("zc_error *")
    if L.zc_validate(c.struct, err) != 0:
        _raise(err)
    return applied


def _proc_size(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return len(f.read())
    except OSError:
        return 0


class _Watch:
    """A zc_watch (zcorch_api.h) with its buffers: /proc snapshots around the timed region and, with an
    interval, room for one sample per interval of the whole timeout."""

    def __init__(self, interval: Optional[float], timeout: float):
        self.struct = ffi.new("zc_watch *")
        self.idle_before: Optional[float] = None   # hoststat.probe_idle's share, set before the run
        self.interval = interval
        # Room for twice what the files hold now (a busier machine has larger counters) and more.
        cap = 2 * sum(_proc_size(f) for f in hoststat.FILES) + 65536
        self._bufs = [ffi.new("char[]", cap), ffi.new("char[]", cap)]
        for snap, buf in zip((self.struct.before, self.struct.after), self._bufs):
            snap.buf, snap.cap = buf, cap
        if interval:
            n = min(int(timeout / interval) + 4, MAX_SAMPLES)
            self._samples = ffi.new("zc_sample[]", n)
            self.struct.interval_s = interval
            self.struct.samples = self._samples
            self.struct.samples_cap = n

    @staticmethod
    def _texts(snap) -> "dict[str, Optional[str]]":
        return {name: ffi.buffer(snap.buf + snap.off[i], snap.len[i])[:].decode("ascii", "replace")
                if snap.buf != ffi.NULL and snap.err[i] == 0 else None for i, name in enumerate(hoststat.FILES)}

    def host_metrics(self) -> "dict[str, Any]":
        w = self.struct
        stat_ok = w.before.err[0] == 0 and w.after.err[0] == 0
        window = int(w.after.at_ns - w.before.at_ns) if stat_ok else None
        out = hoststat.host_deltas(self._texts(w.before), self._texts(w.after), window)
        out["host_boot_id"] = hoststat.boot_id()
        out["host_idle_before"] = self.idle_before
        return out

    def samples(self, wall_ns: int) -> "Optional[dict[str, Any]]":
        w = self.struct
        if not self.interval or wall_ns < SAMPLE_MIN_INTERVALS * self.interval * 1e9:
            return None
        tck = float(os.sysconf("SC_CLK_TCK"))

        def opt(v: int, scale: float = 1.0) -> Any:
            return None if v < 0 else (v / scale if scale != 1.0 else int(v))

        rows = [{"t_s": s.t_ns / 1e9, "bytes": int(s.bytes), "proc_cpu_s": s.proc_cpu_ns / 1e9,
                 "host_busy_s": opt(s.host_busy_ticks, tck), "host_softirq_s": opt(s.host_softirq_ticks, tck),
                 "host_idle_s": opt(s.host_idle_ticks, tck), "tcp_snd_cwnd": opt(s.tcp_snd_cwnd),
                 "tcp_rtt_us": opt(s.tcp_rtt_us), "tcp_total_retrans": opt(s.tcp_total_retrans)}
                for s in (w.samples[i] for i in range(w.n_samples))]
        error = os.strerror(w.sampler_err) if w.sampler_err else None
        return {"interval_s": self.interval, "dropped": bool(w.samples_dropped), "error": error, "rows": rows}


def _raise(err) -> None:
    raise WorkerError(int(err.code), ffi.string(err.message).decode(errors="replace"))


_STRUCT_METRICS: "Optional[frozenset[str]]" = None   # the zc_metrics fields; other metrics come from the watch


def _metrics(side: str, caps: "frozenset[str]", m, host: "Optional[dict[str, Any]]") -> "dict[str, Any]":
    """The METRICS of one zc_metrics (null where one does not apply to this side and mode); the host-wide ones
    from `host`, left out when it is None (one stream of several: the host counts once, in the totals)."""
    global _STRUCT_METRICS
    if _STRUCT_METRICS is None:
        _STRUCT_METRICS = frozenset(name for name, _ in ffi.typeof("zc_metrics").fields)
    out: "dict[str, Any]" = {}
    for metric in METRICS:
        if metric.name in _STRUCT_METRICS:
            out[metric.name] = int(getattr(m, metric.name)) if metric_applies(metric, side, caps) else None
        elif host is not None:
            out[metric.name] = host.get(metric.name) if metric_applies(metric, side, caps) else None
    return out


def _result(side: str, mode: str, m, params: "dict[str, Any]", c: _CParams) -> "dict[str, Any]":
    caps = mode_capabilities()[side].get(mode, frozenset())
    out: "dict[str, Any]" = {"side": side, "mode": mode, **_metrics(side, caps, m, c.watch.host_metrics())}
    if not params.get("fsync"):
        out["fsync_ns"] = None
    out["samples"] = c.watch.samples(out["wall_ns"])
    if hasattr(c, "stream_metrics"):  # per stream: its slice and its own metrics (the totals are above)
        # the group fsyncs once, after every stream (in the totals)
        out["streams"] = [{"stream": i, "offset": int(c.stream_offsets[i]),
                           **_metrics(side, caps, c.stream_metrics[i], None), "fsync_ns": None}
                          for i in range(params.get("streams", 1))]
    out["params"] = params
    return out


def _check_port(port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise _bad(f"port must be 0..65535, got {port!r}")


class Receiver:
    """Listening receiver: sink prepared, mode set up and socket listening once constructed. allow_device_sink:
    the sink may be any device (else only /dev/null); peer: accept data connections from this address only;
    nonce: the run's (32 hex digits) every stream hello must carry (None: zeros on both sides)."""

    def __init__(self, host: str, port: int, mode: str, *, allow_device_sink: bool = False,
                 peer: Optional[str] = None, nonce: Optional[str] = None, **params: Any):
        L = _lib()
        _check_port(port)
        self.mode = mode
        self.params = normalize_params("recv", **params)
        self.params["listen"] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._c = _CParams("recv", mode, host, port, self.params,
                           {"allow_device_sink": allow_device_sink, "peer": peer, "nonce": nonce})
        self._c.watch.idle_before = hoststat.probe_idle(self.params.get("idle_probe"))   # before listening
        self._listener = ffi.new("zc_listener *")
        err = ffi.new("zc_error *")
        if L.zc_recv_listen(self._c.struct, self._listener, err) != 0:
            _raise(err)
        self.port: int = int(self._listener.port)

    def run(self) -> "dict[str, Any]":
        """Accept one sender within the deadline and receive; the listener is consumed either way."""
        m = ffi.new("zc_metrics *")
        err = ffi.new("zc_error *")
        if lib.zc_recv_run(self._c.struct, self._listener, m, err) != 0:
            _raise(err)
        out = _result("recv", self.mode, m, self.params, self._c)
        text = ffi.string(self._listener.refused_text).decode(errors="replace")
        out["refused"] = text.split("; ") if text else []   # the connections refused_connections counts
        return out

    def close(self) -> None:
        lib.zc_listener_close(self._listener)

    def __enter__(self) -> "Receiver":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def send(host: str, port: int, mode: str, *, nonce: Optional[str] = None, **params: Any) -> "dict[str, Any]":
    """Connect to a receiver and send; raises WorkerError naming the mode and the reason. nonce: the run's
    (the receiver's), carried by the stream hello."""
    L = _lib()
    _check_port(port)
    applied = normalize_params("send", **params)
    applied["connect"] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    c = _CParams("send", mode, host, port, applied, {"nonce": nonce})
    c.watch.idle_before = hoststat.probe_idle(applied.get("idle_probe"))   # before connecting
    m = ffi.new("zc_metrics *")
    err = ffi.new("zc_error *")
    if L.zc_send_run(c.struct, m, err) != 0:
        _raise(err)
    return _result("send", mode, m, applied, c)
