"""Command baselines (`baselines.commands`): a user's own transfer command pair, timed like iperf3 and dd.

The receiver's command starts first under `zcorch worker command`, which says when `{port}` listens; then the
sender's, which waits for the controller's `go`. The figure is `bytes` over the time from `go` to both ends
exited (the SSH session and python start-up excluded). Source and sink live in the scratch directories, and a
sink must hold exactly `bytes`. Records: docs/experiment-files.md, "Command baselines".
"""
from __future__ import annotations

import re
import signal
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

from zcorch.config.baselines import commands as commands_kind
from zcorch.config.baselines.commands import DEFAULT_BYTES, CommandBaseline, command_bytes  # noqa: F401
from zcorch.hosts.local import Host
from zcorch.results.store import utc_now
from zcorch.sweep import json_object

KIND = commands_kind.RECORD_KIND
COMMAND_PORT = 5301            # + the command's index, on a remote receiver (localhost: a free port)
LISTEN_WAIT_S = 15.0           # the worker itself waits 10 s for the listening socket
_PLACEHOLDER_RE = re.compile(r"\{(address|port|source|sink|bytes)\}")


def source_path(cmd: CommandBaseline) -> str:
    """The source file as written (in the sender's `{scratch}`)."""
    return f"{{scratch}}/cmd-{cmd.name}.src"


def sink_path(cmd: CommandBaseline) -> str:
    """The sink file as written (in the receiver's `{scratch}`)."""
    return f"{{scratch}}/cmd-{cmd.name}.sink"


def fill(argv: Sequence[str], values: Mapping[str, str]) -> List[str]:
    """argv with each `{name}` replaced by values[name] (one argv item stays one item: no shell). Pure."""
    return [_PLACEHOLDER_RE.sub(lambda m: str(values[m.group(1)]), a) for a in argv]


def failed(cmd: CommandBaseline, nbytes: int, repeat: int, host: Host, reason: Optional[str],
           started: Optional[str] = None) -> Dict[str, Any]:
    """A run's record as failed (run_command fills in the rest when it gets further)."""
    return {"kind": KIND, "key": {"name": cmd.name, "bytes": nbytes}, "repeat": repeat, "status": "failed",
            "reason": reason, "result": None, "host": host.name, "started": started or utc_now()}


def end_argv(worker: Sequence[str], argv: Sequence[str], *, stdin: Optional[str] = None,
             stdout: Optional[str] = None, listen_port: Optional[int] = None, sink: Optional[str] = None,
             remove: Sequence[str] = (), timeout: float, wait_go: bool = False) -> List[str]:
    """`zcorch worker command ... -- ARGV`: one end of the pair (zcorch.worker.command)."""
    out = [*worker, "command", "--timeout", f"{timeout:g}", *(["--wait-go"] if wait_go else [])]
    for flag, value in (("--stdin", stdin), ("--stdout", stdout), ("--listen-port", listen_port), ("--sink", sink)):
        if value is not None:
            out += [flag, str(value)]
    for path in remove:
        out += ["--remove", path]
    return [*out, "--", *argv]


def _exit_event(lines: Sequence[str]) -> Optional[dict]:
    return next((doc for doc in map(json_object, reversed(lines)) if doc and doc.get("event") == "exit"), None)


def _no_exit_event(proc: Any, waited: float) -> str:
    """The reason when an end's worker printed no exit event: it did not end within `waited` s (or died)."""
    tail = " ".join(proc.stderr_text().split())[-300:]
    return (f"its worker ended or stalled without reporting the command's exit (waited up to {waited:g} s; both "
            "were killed)" + (f"; its stderr: {tail}" if tail else ""))


def _why(end: str, host: Host, event: Optional[dict], fallback: str) -> Optional[str]:
    """Why one end failed (None: it exited 0)."""
    if event is None:
        return f"{end} on {host.name}: {fallback}"
    if event.get("rc") == 0 and not event.get("error"):
        return None
    what = event.get("error") or f"exit {event.get('rc')}"
    tail = " ".join((event.get("stderr") or "").split())[-300:]
    return f"{end} on {host.name}: {what}" + (f": {tail}" if tail else "")


def run_command(sender: Host, receiver: Host, worker: Mapping[str, Sequence[str]],
                env: Mapping[str, Optional[Dict[str, str]]], cmd: CommandBaseline, nbytes: int,
                paths: Mapping[str, str], port: int, repeat: int) -> dict:
    """One run of a command baseline (paths: the resolved "source" and "sink"): its baselines.jsonl record."""
    started = utc_now()
    values = {"address": receiver.data_address, "port": str(port), "source": paths["source"],
              "sink": paths["sink"], "bytes": str(nbytes)}
    send_argv, recv_argv = fill(cmd.sender, values), fill(cmd.receiver, values)
    record = dict(failed(cmd, nbytes, repeat, sender, None, started),
                  argv={"sender": send_argv, "receiver": recv_argv})
    uses_sink = cmd.uses("sink")
    rx_cmd = end_argv(worker["receiver"], recv_argv, stdout=paths["sink"] if cmd.stdout == "sink" else None,
                      listen_port=port, sink=paths["sink"] if uses_sink else None,
                      remove=[paths["sink"]] if uses_sink else (), timeout=cmd.timeout)
    tx_cmd = end_argv(worker["sender"], send_argv, stdin=paths["source"] if cmd.stdin == "source" else None,
                      timeout=cmd.timeout, wait_go=True)
    rx = receiver.start(rx_cmd, env=env.get("receiver"))
    tx = None
    try:
        lines, how = _read_until(rx, '"listening"', LISTEN_WAIT_S)
        if how == _TIMEOUT:
            record["reason"] = (f"receiver on {receiver.name}: nothing listened on port {port} within "
                                f"{LISTEN_WAIT_S:g} s ({' '.join(recv_argv)})")
            return record
        if how == _EXITED:
            record["reason"] = _why("receiver", receiver, _exit_event(lines),
                                    f"exited before listening: {rx.stderr_text().strip()[-300:]}") \
                or f"receiver on {receiver.name}: exited before listening on port {port}"
            return record
        tx = sender.start(tx_cmd, env=env.get("sender"))
        tx_lines, how = _read_until(tx, '"ready"', LISTEN_WAIT_S)
        if how != _FOUND:
            record["reason"] = _why("sender", sender, _exit_event(tx_lines),
                                    f"its worker did not start: {tx.stderr_text().strip()[-300:]}") \
                or f"sender on {sender.name}: its worker did not start"
            return record
        t0 = time.monotonic()
        tx.send_line("go")
        tx_lines += _read_until(tx, None, cmd.timeout + 30)[0]
        tx_event = _exit_event(tx_lines)
        why = _why("sender", sender, tx_event, _no_exit_event(tx, cmd.timeout + 30))
        if why:
            record["reason"] = why
            return record
        more, how = _read_until(rx, None, cmd.timeout)
        if how == _TIMEOUT:
            record["reason"] = f"receiver on {receiver.name}: still running {cmd.timeout:g} s after the sender ended"
            return record
        lines += more
        wall = max(time.monotonic() - t0, 1e-9)
        rx_event = _exit_event(lines)
        why = _why("receiver", receiver, rx_event, _no_exit_event(rx, cmd.timeout))
        if why:
            record["reason"] = why
            return record
        assert rx_event is not None and tx_event is not None
        if uses_sink and rx_event.get("sink_bytes") != nbytes:
            record["reason"] = (f"the sink on {receiver.name} holds {rx_event.get('sink_bytes')} bytes, not the "
                                f"{nbytes} sent")
            return record
        record["status"] = "ok"
        record["result"] = {"bytes": nbytes, "wall_s": wall, "bits_per_second": nbytes * 8 / wall,
                            "MB_per_s": nbytes / wall / 1e6, "sender_wall_s": tx_event.get("wall_s"),
                            "receiver_wall_s": rx_event.get("wall_s"),
                            "sink_checked": uses_sink}
        return record
    finally:
        for proc in (p for p in (rx, tx) if p is not None):
            if record["status"] != "ok":
                # SIGTERM first: the worker kills the command's whole tree, also what left the process
                # group with setsid() (zcorch.worker.command), then exits; SIGKILL if it does not.
                proc.kill_group(signal.SIGTERM)
            try:
                proc.wait(8.0)   # the worker's own kill of the command's tree takes up to command.KILL_WAIT_S
            except TimeoutError:
                proc.kill_group(signal.SIGKILL)


_FOUND, _EXITED, _TIMEOUT = "found", "exited", "timeout"


def _read_until(proc: Any, marker: Optional[str], timeout: float) -> "tuple[List[str], str]":
    """(lines, how) of a started end read until a line holds `marker` (found), it exits (exited) or time is up."""
    lines: List[str] = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = proc.readline(max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return lines, _TIMEOUT
        if line is None:
            return lines, _EXITED
        lines.append(line)
        if marker is not None and marker in line:
            return lines, _FOUND


def describe(record: Dict[str, Any]) -> str:
    """One line for the end-of-run summary."""
    return commands_kind.KIND.describe(record)
