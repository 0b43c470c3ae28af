"""Running the baseline kinds (zcorch.config.baselines: each kind declares its argv and its parser):
`run_server_client` (iperf3, qperf) and `run_dd` return baselines.jsonl records; commands: zcorch.sweep.commands.
"""
from __future__ import annotations

import signal
import socket
import time
from contextlib import suppress
from typing import Any, Dict, List, Mapping, Optional

from zcorch.config.baselines import dd as dd_kind
from zcorch.config.baselines.dd import (DdBaseline, dd_directory, dd_key, parse_dd_stderr,  # noqa: F401
                                        parse_dd_wrapper)
from zcorch.config.baselines.iperf3 import parse_iperf3_json  # noqa: F401
from zcorch.config.baselines.kind import BaselineError, ServerClientKind  # noqa: F401
from zcorch.config.baselines.registry import BY_RECORD
from zcorch.hosts.local import Host
from zcorch.provision.remote_call import run_remote
from zcorch.results.store import utc_now

SERVER_BUSY_WAIT = 60.0            # s to wait for a port another sweep's test holds (plus one test)
LISTEN_WAIT_S = 10.0               # for a server's ready line
CLIENT_MARGIN_S = 30.0             # a client's timeout: its test plus this


def _record(kind: str, key: dict, host: Host, started: str, result: Optional[dict] = None,
            status: str = "ok", reason: Optional[str] = None, argv: Optional[list] = None) -> dict:
    rec = {"kind": kind, "key": key, "status": status, "reason": reason, "result": result,
           "host": host.name, "started": started}
    if argv is not None:
        rec["argv"] = argv
    return rec


def free_local_port(address: str) -> int:
    """A TCP port free on `address` of this machine now (servers and command baselines on localhost)."""
    fam = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


# -- Server/client kinds (iperf3, qperf) --------------------------------------------------------

def _missing_tools(kind: ServerClientKind, conf: Any, hosts: Mapping[str, Host]) -> Optional[str]:
    """Why a tool of `kind` cannot be run on the host of one of its roles, else None."""
    for tool in kind.tools(conf):
        for host in (hosts[role] for role in tool.roles):
            res = host.run([tool.program, *tool.version_argv], timeout=20)
            if res.returncode == 127 or "not found" in (res.stderr or "").lower():
                return f"{tool.program} is not installed on {host.name} (install it: {tool.install_hint()})"
            if res.returncode == 126:   # the shell's (and LocalHost's) "found but cannot be run": no execute bit
                return (f"{tool.program} is found on {host.name} but cannot be run (not executable: chmod +x it, "
                        f"or {tool.install_hint()})")
    return None


def run_server_client(kind: ServerClientKind, sender: Host, receiver: Host, conf: Any, key: dict) -> dict:
    """One test of `kind` sender -> receiver on the data addresses; the server is killed afterwards. A port
    another sweep's test holds is tried again once a second for up to SERVER_BUSY_WAIT s plus one test."""
    record_kind = next(iter(kind.record_kinds))
    started = utc_now()
    missing = _missing_tools(kind, conf, {"sender": sender, "receiver": receiver})
    if missing:
        return _record(record_kind, key, sender, started, status="skipped", reason=missing)
    refused = kind.refusal(conf, key)
    if refused:
        return _record(record_kind, key, sender, started, status="skipped", reason=refused)
    port = free_local_port(receiver.data_address) if receiver.is_local else kind.port
    server_argv, client_argv = kind.commands(conf, key, receiver.data_address, port)
    test_s = kind.test_seconds(conf)
    busy_until = time.monotonic() + SERVER_BUSY_WAIT + test_s
    while True:
        server = receiver.start(server_argv)
        try:
            failed = _wait_listening(kind, server, receiver)
            if failed is not None:
                if kind.busy_marker and kind.busy_marker in failed and time.monotonic() < busy_until:
                    time.sleep(1.0)
                    continue
                return _record(record_kind, key, sender, started, status="failed", argv=client_argv, reason=failed)
            res = sender.run(client_argv, timeout=test_s + CLIENT_MARGIN_S)
            try:
                result = kind.parse_output(res.stdout)
            except BaselineError as exc:
                detail = res.stderr.strip()
                return _record(record_kind, key, sender, started, status="failed", argv=client_argv,
                               reason=f"{exc} (on {sender.name}{'; ' + detail if detail else ''})")
            return _record(record_kind, key, sender, started, result=result, argv=client_argv)
        finally:
            server.kill_group(signal.SIGKILL)
            with suppress(TimeoutError):
                server.wait(5)


def _wait_listening(kind: ServerClientKind, server: Any, receiver: Host) -> Optional[str]:
    """None once the server listens (at once when its kind's server says nothing), else why it does not."""
    if kind.ready_marker is None:
        return None
    deadline = time.monotonic() + LISTEN_WAIT_S
    while True:
        try:
            line = server.readline(max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return f"{kind.name} server on {receiver.name} did not start listening within {LISTEN_WAIT_S:g}s"
        if line is None:
            return f"{kind.name} server on {receiver.name} exited: {server.stderr_text().strip()}"
        if kind.ready_marker.lower() in line.lower():
            return None


# -- dd: the kind's host job on the receiver ----------------------------------------------------

def run_dd(receiver: Host, python: str, cfg: DdBaseline, directory: str,
           filesystem: Optional[str] = None, written_directory: Optional[str] = None, repeat: int = 0) -> List[dict]:
    """dd_write and dd_read records for `directory` on the receiver (its `repeat`-th pair: `dd.repeats`);
    the key keeps `written_directory` as the file gives it (`{scratch}`...), so keys match across users."""
    started = utc_now()
    key = dd_key(cfg, written_directory or directory, filesystem)
    records = _dd_records(receiver, python, cfg, directory, key, started, first=repeat == 0)
    for rec in records:
        rec["repeat"] = repeat
        if written_directory and written_directory != directory:
            rec["directory"] = directory
    return records


def _dd_records(receiver: Host, python: str, cfg: DdBaseline, directory: str, key: dict, started: str,
                first: bool = True) -> List[dict]:
    kind = dd_kind.KIND
    expected = kind.records_of(cfg, first)
    missing = _missing_tools(kind, cfg, {"receiver": receiver})
    if missing:
        return [_record(k, key, receiver, started, status="skipped", reason=missing) for k in expected]
    # zcorch.worker.remote.dd_baseline: times dd and the read back on the receiver itself
    res = run_remote(receiver, kind.job, *kind.job_args(cfg, directory, first), timeout=3600, python=python)
    if not res.ok:
        reason = f"dd wrapper failed on {receiver.name} (exit {res.returncode}): {res.stderr.strip()[-300:]}"
        return [_record(k, key, receiver, started, status="failed", reason=reason) for k in expected]
    try:
        parsed = parse_dd_wrapper(res.stdout)
    except BaselineError as exc:
        return [_record(k, key, receiver, started, status="failed", reason=str(exc)) for k in expected]
    records = []
    for kind_name in expected:
        val = parsed.get(kind_name)
        if val is None:
            records.append(_record(kind_name, key, receiver, started, status="skipped",
                                   reason="not run: the write before it failed"))
        elif isinstance(val, BaselineError):
            records.append(_record(kind_name, key, receiver, started, status="failed",
                                   reason=f"{val} (on {receiver.name})"))
        else:
            records.append(_record(kind_name, key, receiver, started, result=val))
    return records


def describe_result(record: Dict[str, Any]) -> str:
    """One line for a baseline record (the end-of-run summary): what ran, with which key, and its figure."""
    kind = BY_RECORD.get(record.get("kind") or "")
    if kind is None:
        return f"{record.get('kind')}: {record.get('status')}: {record.get('reason')}"
    return kind.describe(record)
