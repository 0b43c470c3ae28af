"""Baselines the seeds measured before every table: iperf3 between the hosts, dd on the receiver.

Argument-list builders and output parsers are pure functions (tested on captured real output in
tests/data/captured/); `run_iperf3` and `run_dd` drive them through the Host interface and
return baselines.jsonl records ({"kind", "key", "status", "reason", "result", "host", "started"}).
"""
from __future__ import annotations

import json
import math
import re
import signal
import socket
import time
from typing import Any, Dict, List, Optional, Sequence

from zcorch.config.baselines import DdBaseline, Iperf3Baseline
from zcorch.errors import ZcorchError
from zcorch.hosts.local import Host
from zcorch.provision.remote_call import run_remote
from zcorch.params import side_value
from zcorch.results.store import utc_now
from zcorch.sweep import commands
from zcorch.units import format_size


class BaselineError(ZcorchError):
    """A baseline tool ran but its output says it failed (message from the tool)."""


# ---------------------------------------------------------------------------------------------
# Fixed run-time values (the settings are the experiment's `baselines:`, zcorch.config.baselines)

IPERF3_PORT = 5201                 # remote hosts; on localhost a free port is picked
IPERF3_BUSY_WAIT = 60.0            # s to wait for a port another sweep's iperf3 test holds (plus one test)
_PORT_BUSY = "Address already in use"
IPERF3_IDLE_TIMEOUT = 30           # server --idle-timeout (s): a stuck server exits by itself
IPERF3_ZEROCOPY = (False, True)    # plain and -Z, so write and sendfile cells both have a peer


# ---------------------------------------------------------------------------------------------
# iperf3: argv builders and the JSON parser


def iperf3_server_argv(bind: str, port: int, idle_timeout: int) -> List[str]:
    """One-off server (-s -1) that exits by itself if the client never comes (--idle-timeout).

    --forceflush: its 'Server listening' line must reach us through a pipe at once.
    """
    return ["iperf3", "-s", "-1", "-B", bind, "-p", str(port), "--idle-timeout", str(idle_timeout),
            "--forceflush"]


def iperf3_client_argv(server: str, port: int, window: Optional[int], buffer: Optional[int],
                       zerocopy: bool, duration: float, omit: int = 0) -> List[str]:
    # iperf3 takes whole seconds and treats 0 as "forever": round up, at least 1.
    argv = ["iperf3", "-c", server, "-p", str(port), "-J", "-t", str(max(1, math.ceil(duration)))]
    if omit:
        argv += ["-O", str(omit)]
    if window:
        argv += ["-w", str(window)]
    if buffer:
        argv += ["-l", str(buffer)]
    if zerocopy:
        argv.append("-Z")
    return argv


def parse_iperf3_json(text: str) -> Dict[str, Any]:
    """Throughput and CPU from `iperf3 -c ... -J` output.

    Raises BaselineError with iperf3's own message when the JSON carries an "error" (refused
    connection, reset mid-test...) or when the output is not JSON (parameter errors print usage).
    """
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


# ---------------------------------------------------------------------------------------------
# dd: argv builders, the stderr parser, and the timing wrapper (`zcorch.worker.remote dd`, host python)

_DD_RE = re.compile(r"^(\d+) bytes?(?: \([^)]*\))? copied, ([0-9.eE+-]+) s, ([0-9.,]+ ?[kMGTP]?B/s)\s*$",
                    re.MULTILINE)


def parse_dd_stderr(text: str) -> Dict[str, Any]:
    """{"bytes", "seconds", "rate"} from dd's summary line (`N bytes (...) copied, T s, R MB/s`).

    Raises BaselineError with dd's message when there is no summary (e.g. cannot open the file).
    """
    matches = _DD_RE.findall(text)
    if not matches:
        msg = " ".join(ln.strip() for ln in text.splitlines() if ln.strip())
        raise BaselineError(f"dd printed no transfer summary: {msg[:300] or '(nothing)'}")
    nbytes, seconds, rate = matches[-1]
    return {"bytes": int(nbytes), "seconds": float(seconds), "rate": rate}


def parse_dd_wrapper(text: str) -> Dict[str, Dict[str, Any]]:
    """{"dd_write": result|BaselineError, "dd_read": ...} from the JSON line of `zcorch.worker.remote dd`."""
    try:
        doc = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BaselineError(f"dd wrapper printed no JSON: {text[:200]!r}") from None
    out: Dict[str, Any] = {}
    for side, kind in (("write", "dd_write"), ("read", "dd_read")):
        part = doc.get(side)
        if part is None:
            continue
        try:
            parsed = parse_dd_stderr(part["stderr"])
        except BaselineError as exc:
            out[kind] = exc
            continue
        result = {"bytes": parsed["bytes"], "dd_seconds": parsed["seconds"], "dd_rate": parsed["rate"],
                  "wall_s": part["wall_s"], "timed": part["timed"], "path": doc.get("path"),
                  "MB_per_s": parsed["bytes"] / part["wall_s"] / 1e6 if part["wall_s"] > 0 else None}
        if side == "read":
            result["cached"] = part["cached"]
            result["cache_note"] = part["cache_note"]
        out[kind] = result
    return out


# ---------------------------------------------------------------------------------------------
# Running them

def _record(kind: str, key: dict, host: Host, started: str, result: Optional[dict] = None,
            status: str = "ok", reason: Optional[str] = None, argv: Optional[list] = None) -> dict:
    rec = {"kind": kind, "key": key, "status": status, "reason": reason, "result": result,
           "host": host.name, "started": started}
    if argv is not None:
        rec["argv"] = argv
    return rec


def tool_missing(host: Host, tool: str) -> Optional[str]:
    """Reason string if `tool` cannot be run on `host`, else None."""
    res = host.run([tool, "--version"], timeout=20)
    if res.returncode == 127 or "not found" in (res.stderr or "").lower():
        return (f"{tool} is not installed on {host.name} "
                f"(install it: apt-get install {'coreutils' if tool == 'dd' else tool})")
    return None


def free_local_port(address: str) -> int:
    """A TCP port free on `address` of this machine now (iperf3 and command baselines on localhost)."""
    fam = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def iperf3_keys(cfg: Iperf3Baseline, params_list: Sequence[dict]) -> List[dict]:
    """The (window, buffer, zerocopy) combinations to measure: per distinct cell pair, or once."""
    pairs: List[tuple] = []
    if cfg.per == "sweep":
        pairs = [(None, None)]
    else:
        for p in params_list:
            w = p.get("window")
            w = None if w in (None, "auto") else int(w)
            pair = (w, side_value("send", p, "buffer"))  # iperf3 -l: the sender's call size
            if pair not in pairs:
                pairs.append(pair)
    return [{"window": w, "buffer": b, "zerocopy": z} for (w, b) in pairs for z in IPERF3_ZEROCOPY]


def iperf3_commands(cfg: Iperf3Baseline, receiver_addr: str, key: dict, port: int) -> tuple:
    server = iperf3_server_argv(receiver_addr, port, IPERF3_IDLE_TIMEOUT)
    client = iperf3_client_argv(receiver_addr, port, key["window"], key["buffer"], key["zerocopy"],
                                cfg.duration, cfg.omit)
    return server, client


def run_iperf3(sender: Host, receiver: Host, cfg: Iperf3Baseline, key: dict) -> dict:
    """One iperf3 test sender -> receiver on the data addresses; the server is killed afterwards.

    When the port is taken on the receiver (another sweep's iperf3 test on the same host, started at the
    same time), the server is started again once a second for up to IPERF3_BUSY_WAIT s plus one test.
    """
    started = utc_now()
    missing = tool_missing(receiver, "iperf3") or tool_missing(sender, "iperf3")
    if missing:
        return _record("iperf3", key, sender, started, status="skipped", reason=missing)
    port = free_local_port(receiver.data_address) if receiver.is_local else IPERF3_PORT
    server_argv, client_argv = iperf3_commands(cfg, receiver.data_address, key, port)
    test_s = cfg.duration + cfg.omit
    busy_until = time.monotonic() + IPERF3_BUSY_WAIT + test_s
    while True:
        server = receiver.start(server_argv)
        try:
            failed = _wait_listening(server, receiver)
            if failed is not None:
                if _PORT_BUSY in failed and time.monotonic() < busy_until:
                    time.sleep(1.0)
                    continue
                return _record("iperf3", key, sender, started, status="failed", argv=client_argv, reason=failed)
            res = sender.run(client_argv, timeout=test_s + 30)
            try:
                result = parse_iperf3_json(res.stdout)
            except BaselineError as exc:
                detail = res.stderr.strip()
                return _record("iperf3", key, sender, started, status="failed", argv=client_argv,
                               reason=f"{exc} (on {sender.name}{'; ' + detail if detail else ''})")
            return _record("iperf3", key, sender, started, result=result, argv=client_argv)
        finally:
            server.kill_group(signal.SIGKILL)
            try:
                server.wait(5)
            except TimeoutError:
                pass


def _wait_listening(server: Any, receiver: Host) -> Optional[str]:
    """None once the iperf3 server listens, else why it does not."""
    deadline = time.monotonic() + 10
    while True:
        try:
            line = server.readline(max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return f"iperf3 server on {receiver.name} did not start listening within 10s"
        if line is None:
            return f"iperf3 server on {receiver.name} exited: {server.stderr_text().strip()}"
        if "listening" in line.lower():
            return None


def dd_directory(sink: str, scratch: str) -> str:
    """Where the dd baseline writes: the sink's directory, or scratch when the sink is a device.

    Works on paths as written too: `{scratch}/x.dat` -> `{scratch}` (zcorch.provision.scratch resolves it).
    """
    if sink.startswith("/dev/"):
        return scratch
    return sink.rsplit("/", 1)[0] or "/"


def dd_key(cfg: DdBaseline, directory: str, filesystem: Optional[str] = None) -> dict:
    """The `key` of a dd record: what it was run with (directory as written, e.g. `{scratch}`)."""
    return {"bs": cfg.bs, "count": cfg.count, "directory": directory, "filesystem": filesystem,
            "bs_text": format_size(cfg.bs)}


def run_dd(receiver: Host, python: str, cfg: DdBaseline, directory: str,
           filesystem: Optional[str] = None, written_directory: Optional[str] = None) -> List[dict]:
    """dd_write and dd_read records for `directory` on the receiver.

    written_directory: the directory as the experiment file gives it (`{scratch}`...), kept in the key so
    keys match across users and hosts; the resolved `directory` is recorded next to it.
    """
    started = utc_now()
    key = dd_key(cfg, written_directory or directory, filesystem)
    records = _dd_records(receiver, python, cfg, directory, key, started)
    if written_directory and written_directory != directory:
        for rec in records:
            rec["directory"] = directory
    return records


def _dd_records(receiver: Host, python: str, cfg: DdBaseline, directory: str, key: dict, started: str) -> List[dict]:
    missing = tool_missing(receiver, "dd")
    if missing:
        return [_record(k, key, receiver, started, status="skipped", reason=missing) for k in ("dd_write", "dd_read")]
    # zcorch.worker.remote.dd_baseline: times `dd; sync` and the read back on the receiver itself.
    res = run_remote(receiver, "dd", directory, cfg.bs, cfg.count, timeout=3600, python=python)
    if not res.ok:
        reason = f"dd wrapper failed on {receiver.name} (exit {res.returncode}): {res.stderr.strip()[-300:]}"
        return [_record(k, key, receiver, started, status="failed", reason=reason) for k in ("dd_write", "dd_read")]
    try:
        parsed = parse_dd_wrapper(res.stdout)
    except BaselineError as exc:
        return [_record(k, key, receiver, started, status="failed", reason=str(exc)) for k in ("dd_write", "dd_read")]
    records = []
    for kind in ("dd_write", "dd_read"):
        val = parsed.get(kind)
        if val is None:
            records.append(_record(kind, key, receiver, started, status="skipped",
                                   reason="not run: the write before it failed"))
        elif isinstance(val, BaselineError):
            records.append(_record(kind, key, receiver, started, status="failed", reason=f"{val} (on {receiver.name})"))
        else:
            records.append(_record(kind, key, receiver, started, result=val))
    return records


def describe_result(record: Dict[str, Any]) -> str:
    """One line for a baseline record (the end-of-run summary): what ran, with which key, and its figure."""
    if record.get("kind") == commands.KIND:
        return commands.describe(record)
    key = record.get("key") or {}
    if record.get("kind") == "iperf3":
        what = "iperf3 -Z" if key.get("zerocopy") else "iperf3"
        where = " ".join(f"{k}={format_size(key[k]) if key.get(k) else 'auto'}" for k in ("buffer", "window"))
    else:
        what = (record.get("kind") or "?").replace("_", " ")
        where = f"bs={key.get('bs_text') or key.get('bs')} count={key.get('count')}"
        if key.get("filesystem"):
            where += f" on {key['filesystem']}"
    result = record.get("result") or {}
    if record.get("status") != "ok":
        return f"{what} ({where}): {record.get('status')}: {record.get('reason')}"
    if "bits_per_second" in result:
        figure = f"{result['bits_per_second'] / 1e9:.2f} Gbit/s"
    else:
        figure = f"{result.get('MB_per_s', float('nan')):.0f} MB/s"
    note = " (cached)" if result.get("cached") else ""
    return f"{what} ({where}): {figure}{note}"
