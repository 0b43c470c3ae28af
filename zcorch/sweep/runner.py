"""Runs the cells of a plan on two hosts: the receiver starts, the sender gets its port once it listens, then
both results are collected; the workers are served (zcorch.sweep.workerpool).

Whatever ends a run (result, error, deadline, dead process, Ctrl-C), both workers' process groups are killed
before the next starts and one record is appended to runs.jsonl; Ctrl-C records the run `interrupted` and
re-raises after cleanup. A filesystem or network that cannot be set up records its runs failed, unrun.
"""
from __future__ import annotations

import os
import secrets
import shlex
import signal
import time
import traceback
from contextlib import suppress
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from zcorch.provision import scratch as scratchmod
from zcorch.errors import HostError, ZcorchError, interrupt_name
from zcorch.hosts.local import Host, Process
from zcorch.params import worker_flags
from zcorch.results.store import ResultSet, utc_now
from zcorch.sweep import interrupts, json_object
from zcorch.sweep.workerpool import WorkerPool, describe_exit


def hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


# Host.start keeps the worker's stdin open while this controller lives; EOF = controller gone.
WATCH_STDIN = "--exit-on-stdin-eof"


def recv_argv(worker: Sequence[str], address: str, params: Dict[str, Any], allow_device_sink: bool = False,
              peer: Optional[str] = None, nonce: Optional[str] = None) -> List[str]:
    """allow_device_sink: the sink is a device `allow_destroy:` lists; peer: the only address the receiver takes a
    data connection from; nonce: the run's (new_nonce), which the sender's stream hello must carry."""
    extra = ["--allow-device-sink"] if allow_device_sink else []
    extra += ["--peer", peer] if peer else []
    extra += ["--nonce", nonce] if nonce else []
    return [*worker, "recv", "--listen", hostport(address, 0), *worker_flags("recv", params), *extra, WATCH_STDIN]


def send_argv(worker: Sequence[str], address: str, port: int, params: Dict[str, Any],
              nonce: Optional[str] = None) -> List[str]:
    extra = ["--nonce", nonce] if nonce else []
    return [*worker, "send", "--connect", hostport(address, port), *worker_flags("send", params), *extra,
            WATCH_STDIN]


def new_nonce() -> str:
    """A run's nonce: 16 random bytes in hex, given to both workers of that run alone (over SSH, to the served
    workers' stdin: it is in no process's command line on the hosts)."""
    return secrets.token_hex(16)


def run_fields(run: Any) -> Tuple[str, int, Dict[str, Any]]:
    """(cell id, repeat, params) of a plan Run object or a plan.json dict."""
    if isinstance(run, dict):
        return run["id"], int(run["repeat"]), dict(run["params"])
    return run.id, int(run.repeat), dict(run.params)


def resolve_sink(params: Dict[str, Any], mountpoint: Optional[str]) -> Dict[str, Any]:
    """Params with `{filesystem}` in sink replaced by the filesystem's mountpoint."""
    sink = params.get("sink")
    if mountpoint is not None and isinstance(sink, str) and "{filesystem}" in sink:
        params = dict(params)
        params["sink"] = sink.replace("{filesystem}", mountpoint.rstrip("/"))
    return params


# Worker error codes that mean "the transfer ran out of time" (recorded as status timeout).
TIMEOUT_CODES = {"ETIMEDOUT", "ETIME", "ETIMEOUT", "TIMEOUT"}


@dataclass
class _Side:
    name: str          # "sender" / "receiver"
    host: Host
    argv: List[str]    # the worker command the run is (for the log; served: what the server's child runs)
    proc: Optional[Process] = None
    result: Optional[dict] = None
    error: Optional[dict] = None
    exited: Optional[int] = None
    lines: List[str] = field(default_factory=list)
    nonce: Optional[str] = None   # the run's (new_nonce): the receiver's side holds it for the sender's argv

    def where(self) -> str:
        return f"{self.name} on {self.host.name}"


@dataclass
class SweepOutcome:
    status: str              # complete | interrupted
    ok: int = 0
    failed: int = 0
    skipped: int = 0         # already ok in the result set (resume)
    converged: int = 0       # planned runs not run: their cell had converged (repeats: {target_ci: ...})
    records: List[dict] = field(default_factory=list)


# What a `run` event of `zcorch run --json` carries of a run's record (docs/schemas/run-events.schema.json);
# a fleet rebuilds it from the records of a pair killed before it printed them.
RUN_EVENT_KEYS = ("cell", "repeat", "status", "reason", "params", "sender", "receiver", "wall_s", "started")


def run_event_fields(record: dict) -> Dict[str, Any]:
    """A run record's fields of its `run` event, and its rate (gbit_s as the receiver saw it; None unless ok)."""
    recv = record.get("receiver") or {}
    gbit = None
    if record.get("status") == "ok" and recv.get("wall_ns"):
        gbit = recv["bytes"] * 8 / recv["wall_ns"]
    return {**{k: record.get(k) for k in RUN_EVENT_KEYS}, "gbit_s": gbit}


class Runner:
    """Runs plan runs between `sender` and `receiver` (each with its worker command prefix from the deploy),
    appending records to `results`. on_event(name, **info) is called at "receiver_started", "receiver_ready"
    (pid, port), "sender_started" and "run_done" (record): tests use it to inject faults."""

    def __init__(self, sender: Host, receiver: Host, sender_worker: Sequence[str],
                 receiver_worker: Sequence[str], results: ResultSet, *,
                 worker_env: Optional[Dict[str, Dict[str, str]]] = None, fsman: Any = None,
                 margin: float = 10.0, default_timeout: float = 60.0,
                 progress: Optional[Callable[[dict, "SweepOutcome", int], None]] = None,
                 on_event: Optional[Callable[..., None]] = None,
                 before_directory: Optional[Callable[[Optional[str], str], None]] = None,
                 source_errors: Optional[Dict[str, str]] = None,
                 scratch: Optional[Dict[str, str]] = None, allow_device_sinks: Sequence[str] = (),
                 netman: Any = None, convergence: Any = None, pool: Optional[WorkerPool] = None,
                 before_round: Optional[Callable[[int], None]] = None,
                 run_started: Optional[Callable[[str, int], None]] = None):
        self.sender, self.receiver = sender, receiver
        self.run_started = run_started   # called as each run begins (the dry run heads its commands with it)
        self.before_round = before_round   # called with the repeat before each round's first run (`control:`)
        self.convergence = convergence   # zcorch.sweep.adaptive.Convergence, or None: every planned run runs
        self.sender_worker, self.receiver_worker = list(sender_worker), list(receiver_worker)
        self.results = results
        self.allow_device_sinks = frozenset(allow_device_sinks)   # the experiment's `allow_destroy:`
        self.worker_env = worker_env or {}
        self.fsman = fsman        # zcorch.provision.filesystems.FilesystemManager, or None (no `filesystems:`)
        self.netman = netman      # zcorch.provision.network.NetworkManager, or None (no `networks:`)
        self.margin = margin
        self.failure_grace = 3.0
        self.default_timeout = default_timeout
        self.progress = progress
        self.on_event = on_event or (lambda name, **info: None)
        self.before_directory = before_directory   # once per (filesystem, sink directory): the dd baseline
        self._seen_dirs: set = set()
        self.source_errors = dict(source_errors or {})   # resolved source -> why it could not be laid out
        self.scratch = dict(scratch or {})   # role -> the {scratch} directory on that host
        self.warnings: List[str] = []   # teardown problems: reported by the CLI, never lose runs
        self.lost_host: Optional[str] = None   # why a host stopped answering during the last run
        self.pool = pool if pool is not None else WorkerPool()   # the worker servers (close() stops them)

    def close(self) -> None:
        """Stop the worker servers (run_sweep does at its end; callers of run_one alone call it)."""
        self.pool.close()
        self.warnings += [f"a worker server was restarted: {why}" for why in self.pool.restarts]
        self.pool.restarts = []

    # -- one run ------------------------------------------------------------------------------
    def run_one(self, cell: str, repeat: int, params: Dict[str, Any],
                worker_params: Optional[Dict[str, Any]] = None) -> dict:
        """One run; `params` go into the record, `worker_params` (default: `{scratch}` resolved) to the workers."""
        if self.run_started is not None:
            self.run_started(cell, repeat)
        if worker_params is None:
            worker_params = scratchmod.resolve_params(params, self.scratch)
        timeout = params.get("timeout") or self.default_timeout
        budget = float(timeout) + float(params.get("duration") or 0) + self.margin  # the worker's deadline
        started_iso = utc_now()
        t0 = time.monotonic()
        deadline = t0 + budget
        nonce = new_nonce()
        recv = _Side("receiver", self.receiver,
                     recv_argv(self.receiver_worker, self.receiver.data_address, worker_params,
                               allow_device_sink=worker_params.get("sink") in self.allow_device_sinks,
                               peer=self.sender.data_address, nonce=nonce))
        recv.nonce = nonce
        send = _Side("sender", self.sender, [])
        log_rel = self.results.log_relpath(cell, repeat)
        # Not "ok" until _drive says so: whatever escapes it must never be recorded as a success.
        status, reason = "failed", "the run ended without a result"
        traces: List[str] = []   # tracebacks for the run's log: a crash is recorded, and debuggable
        try:
            status, reason = self._drive(recv, send, worker_params, deadline, budget)
        except KeyboardInterrupt as exc:   # SIGINT, or what `zcorch run` makes of SIGTERM (SignalInterrupt)
            status, reason = "interrupted", f"interrupted by {interrupt_name(exc)} during the run"
            raise
        except Exception as exc:  # HostError (lost link), OSError (Popen), a bug: failed, the sweep goes on
            status, reason = "failed", f"{type(exc).__name__}: {exc} (traceback in {log_rel})"
            traces.append(traceback.format_exc())
        finally:
            # The wall time ends with the outcome. An ok run's record is appended while its workers exit; any
            # other run is cleaned up first, so its record says why a host stopped answering.
            wall = time.monotonic() - t0
            if status != "ok":
                self._cleanup_run(cell, repeat, recv, send, traces)
            # A lost connection explains the failure better than how the worker's channel ended.
            self.lost_host = self._unreachable() if status not in ("ok", "interrupted") else None
            if self.lost_host:
                reason = f"{reason}; {self.lost_host}"
            record = self._record(cell, repeat, params, status, reason, started_iso, wall, recv, send, log_rel)
            if self.convergence is not None:
                self.convergence.observe(record)
            if status == "ok":
                try:
                    self.results.append_run(record)
                finally:
                    self._cleanup_run(cell, repeat, recv, send, traces)
            try:
                self._write_log(log_rel, record, recv, send, traces)
            except Exception as exc:  # the record matters more than its log
                self.warnings.append(f"cannot write {log_rel}: {type(exc).__name__}: {exc}")
            if status != "ok":
                self.results.append_run(record)
            self.on_event("run_done", record=record)
        return record

    def _cleanup_run(self, cell: str, repeat: int, recv: _Side, send: _Side, traces: List[str]) -> None:
        try:
            self._cleanup(recv, send)
        except Exception as exc:  # e.g. the kill over a lost SSH link: the run is still recorded
            self.warnings.append(f"cell {cell} repeat {repeat}: workers may still run after cleanup "
                                 f"failed: {type(exc).__name__}: {exc}")
            traces.append(traceback.format_exc())

    def _serve(self, side: _Side, worker: List[str], role: str) -> None:
        """Hand side's run to the worker server of its host (side.argv = worker + the run's arguments)."""
        side.proc = self.pool.start(side.host, worker, side.argv[len(worker):], env=self.worker_env.get(role))

    def _drive(self, recv: _Side, send: _Side, params: Dict[str, Any], deadline: float,
               budget: float) -> Tuple[str, Optional[str]]:
        self._serve(recv, self.receiver_worker, "receiver")
        self.on_event("receiver_started", proc=recv.proc)
        try:
            ready = self._read_until(recv, deadline, want="ready")
        except TimeoutError:
            return "timeout", f"{recv.where()} did not report ready within {budget:.1f}s"
        if ready is None:
            return self._failure(recv, send)
        port = int(ready["port"])
        self.on_event("receiver_ready", pid=ready.get("pid"), port=port, proc=recv.proc)
        # A served sender starts in about a millisecond: it gets the port in its arguments.
        send.argv = send_argv(self.sender_worker, self.receiver.data_address, port, params, nonce=recv.nonce)
        self._serve(send, self.sender_worker, "sender")
        self.on_event("sender_started", proc=send.proc)
        pending = None
        try:
            pending = send
            self._read_until(send, deadline, want="result")
            pending = recv
            if send.result is None:
                # The sender gave up: the receiver's own error comes at once, if any (it may sit in accept()).
                deadline = min(deadline, time.monotonic() + self.failure_grace)
            self._read_until(recv, deadline, want="result")
        except TimeoutError:   # the run's deadline passed
            if send.result is None and send.proc is not None and (send.error is not None or send.exited is not None):
                return self._failure(recv, send)
            waiting = " and ".join(s.where() for s in (send, recv) if s.result is None and s.error is None)
            return "timeout", (f"no result from {waiting or pending.where()} within {budget:.1f}s "
                               f"(cell timeout {params.get('timeout')}s + margin {self.margin:g}s)")
        if send.result is not None and recv.result is not None:
            return "ok", None
        return self._failure(recv, send)

    def _read_until(self, side: _Side, deadline: float, want: str) -> Optional[dict]:
        """Read side's stdout until an event `want` or "error" (stored) or EOF (None); TimeoutError at deadline."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError()
            line = side.proc.readline(remaining)
            if line is None:
                side.exited = self._exit_status(side)
                return None
            side.lines.append(line)
            event = json_object(line)
            if event is None:
                continue  # not an event: kept in the log
            kind = event.get("event")
            if kind == "error":
                side.error = event
                return None
            if kind == want:
                if want == "result":
                    side.result = event
                return event

    @staticmethod
    def _exit_status(side: _Side, wait: float = 2.0) -> Optional[int]:
        try:
            return side.proc.wait(wait)
        except TimeoutError:
            return None

    def _failure(self, recv: _Side, send: _Side) -> Tuple[str, str]:
        """Status and reason when a side did not deliver a result: what each side said or how it died. Both are
        named: the one that failed first explains the other (a receiver that quit resets the sender's link)."""
        parts, codes = [], set()
        for s in (recv, send):
            if s.proc is None or s.result is not None:
                continue
            if s.error is not None:
                parts.append(f"{s.where()}: {s.error.get('message', '?')} [{s.error.get('code', '?')}]")
                codes.add(str(s.error.get("code", "")).upper())
                continue
            if s.exited is None:
                s.exited = self._exit_status(s, 0.5)  # a stalled side would never exit: don't wait long
            tail = s.proc.stderr_text().strip().splitlines()[-3:] if s.exited is not None else []
            parts.append(f"{s.where()} {describe_exit(s.exited)} without a result"
                         + (f": {' | '.join(tail)}" if tail else ""))
        return ("timeout" if codes & TIMEOUT_CODES else "failed"), "; ".join(parts) or "no result"

    @staticmethod
    def _cleanup(recv: _Side, send: _Side) -> None:
        # Kill both process groups whatever happened (a stalled worker must not hold the port or the CPU during the
        # next run), except those whose exit was seen: their group id may be reused.
        for side in (send, recv):
            if side.proc is None or side.exited is not None:
                continue
            try:
                side.exited = side.proc.wait(0.5 if side.result is not None else 0.0)
            except TimeoutError:
                side.proc.kill_group(signal.SIGKILL)
                with suppress(TimeoutError):
                    side.proc.wait(5.0)

    def _record(self, cell, repeat, params, status, reason, started, wall, recv: _Side, send: _Side,
                log_rel) -> dict:
        def metrics(side: _Side) -> Optional[dict]:
            if side.result is None:
                return None
            return {k: v for k, v in side.result.items() if k not in ("event", "samples")}

        if status == "ok" and (send.result is None or recv.result is None):
            # Invariant: `--resume` skips ok runs for good, so ok needs both sides' metrics.
            missing = " and ".join(s.where() for s in (send, recv) if s.result is None)
            status, reason = "failed", f"recorded without metrics from {missing}"
        if status != "ok" and not reason:
            reason = "no reason given (see the run's log)"
        rec = {"cell": cell, "repeat": repeat, "params": params, "status": status, "reason": reason,
               "started": started, "wall_s": round(wall, 6), "sender": metrics(send), "receiver": metrics(recv),
               "log": log_rel, "sender_host": self.sender.name, "receiver_host": self.receiver.name}
        walls = [s.result.get("wall_ns") for s in (send, recv) if s.result and s.result.get("wall_ns")]
        if walls and status == "ok":
            # Controller cost of this run: process start-up, ready handshake, result collection.
            rec["overhead_s"] = round(wall - max(walls) / 1e9, 6)
        if params.get("network") and self.netman is not None:
            rec["network"] = self.netman.run_facts()
        if status == "ok":
            rec.update(self._host_facts(cell, repeat, send, recv))
        return rec

    def _host_facts(self, cell: str, repeat: int, send: _Side, recv: _Side) -> dict:
        """same_host (both workers on one kernel: their host CPU is one machine's) and the run's samples file."""
        facts: dict = {}
        boots = [s.result.get("host_boot_id") for s in (send, recv)]
        if all(boots):
            facts["same_host"] = boots[0] == boots[1]
        samples = {name: s.result["samples"] for name, s in (("send", send), ("recv", recv))
                   if isinstance(s.result.get("samples"), dict)}
        rows = {name: smp.get("rows") or [] for name, smp in samples.items()}
        if any(rows.values()):
            try:
                facts["samples"] = self.results.write_samples(cell, repeat, rows)
            except OSError as exc:  # the run's record matters more than its samples
                self.warnings.append(f"cell {cell} repeat {repeat}: cannot write its samples: {exc}")
        notes = []
        for name, smp in samples.items():
            if smp.get("error"):
                notes.append(f"{name}: the sampler did not run ({smp['error']})")
            if smp.get("dropped"):
                notes.append(f"{name}: samples beyond the preallocated array were dropped")
        if notes:
            facts["samples_note"] = "; ".join(notes)
        return facts

    def _write_log(self, log_rel: str, record: dict, recv: _Side, send: _Side,
                   traces: Sequence[str] = ()) -> None:
        path = os.path.join(self.results.dir, log_rel)
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"=== {record['started']} cell {record['cell']} repeat {record['repeat']}: "
                    f"{record['status']}{' - ' + record['reason'] if record['reason'] else ''}\n")
            for trace in traces:
                f.write("--- controller exception\n" + "".join(f"[traceback] {line}\n" for line in trace.splitlines()))
            for side in (recv, send):
                if not side.argv or side.proc is None:
                    continue
                f.write(f"--- {side.where()}: {shlex.join(side.argv)}\n")
                f.writelines(f"[stdout] {line}\n" for line in side.lines)
                err = side.proc.stderr_text() if side.exited is not None or side.result else ""
                f.writelines(f"[stderr] {line}\n" for line in err.splitlines())

    # -- the sweep ----------------------------------------------------------------------------
    def run_sweep(self, runs: Sequence[Any], skip: Optional[set] = None) -> SweepOutcome:
        """Run every run not in `skip` ((cell, repeat) pairs) once; Ctrl-C -> status interrupted."""
        skip = skip or set()
        todo = [t for t in map(run_fields, runs) if (t[0], t[1]) not in skip]
        outcome = SweepOutcome(status="complete", skipped=len(runs) - len(todo))
        ahead = Counter(cell for cell, _, _ in todo)   # per cell, its runs not reached yet
        last_use = {params["filesystem"]: i for i, (_, _, params) in enumerate(todo) if params.get("filesystem")}
        mounted: Dict[str, str] = {}
        fs_errors: Dict[str, str] = {}
        net_errors: Dict[str, str] = {}
        try:
            round_of: Optional[int] = None   # the round whose before_round has run
            for i, (cell, repeat, params) in enumerate(todo):
                ahead[cell] -= 1
                if self.convergence is not None and not self.convergence.wants(cell):
                    outcome.converged += 1   # no record: the run was planned up to `max`, not needed
                    self._release_after(params.get("filesystem"), i, last_use, mounted)
                    continue
                fs, mountpoint = params.get("filesystem"), None
                error = self.source_errors.get(scratchmod.resolve_params(params, self.scratch).get("source"))
                if error is None:
                    error = self._ensure_net(params.get("network"), net_errors)
                if error is None and fs:
                    mountpoint, error = self._ensure_fs(fs, mounted, fs_errors)
                if error is not None:   # recorded failed, unrun
                    self._record_unrun(cell, repeat, params, error, outcome, ahead)
                    continue
                params = resolve_sink(params, mountpoint)
                self._before(fs, params)
                if self.before_round is not None and repeat != round_of:
                    round_of = repeat   # with the run's network and filesystem in place, as its runs have them
                    self.before_round(repeat)
                record = self.run_one(cell, repeat, params)
                self._count(record, outcome, ahead)
                if self.lost_host and i < len(todo) - 1:
                    # Every later run would fail the same way: stop, the finished runs are kept.
                    raise HostError(f"the sweep stopped after cell {cell} repeat {repeat} (recorded failed): "
                                    f"{self.lost_host}. Once the host answers again, "
                                    f"`zcorch run --resume {self.results.dir}` runs what is left")
                self._release_after(fs, i, last_use, mounted)
        except KeyboardInterrupt:
            outcome.status = "interrupted"
        finally:
            interrupts.begin_teardown()   # no signal stops what follows (zcorch.sweep.interrupts)
            self.close()
            for manager, failed in ((self.fsman, ""), (self.netman, "network not restored: ")):
                if manager is not None:
                    try:
                        manager.teardown_all()
                    except ZcorchError as exc:
                        self.warnings.append(f"{failed}{exc}")
        return outcome

    def _release_after(self, fs: Optional[str], i: int, last_use: Dict[str, int], mounted: Dict[str, str]) -> None:
        """After the i-th run (run or, converged, left out): release its filesystem if no later run uses it."""
        if fs and last_use.get(fs) == i and fs in mounted:
            del mounted[fs]
            try:
                self.fsman.release(fs)
            except ZcorchError as exc:  # the runs are recorded; teardown_all retries
                self.warnings.append(str(exc))

    def _ensure_net(self, net: Optional[str], net_errors: dict) -> Optional[str]:
        """Apply `net` (None: restore the hosts) unless it is the one applied; why its run cannot run, or None."""
        if self.netman is None:
            return f"network {net!r}: no network manager available to apply it" if net else None
        if net is None:
            if self.netman.current is not None:
                try:
                    self.netman.restore()
                except ZcorchError as exc:
                    net_errors[None] = f"the hosts' network could not be restored: {exc}"
            return net_errors.get(None)
        if net in net_errors:
            return net_errors[net]
        try:
            self.netman.ensure(net)
        except ZcorchError as exc:
            net_errors[net] = f"network {net!r} could not be applied: {exc}"
            return net_errors[net]
        return None

    def _unreachable(self) -> Optional[str]:
        """After a run that did not succeed: why a remote host no longer answers (None: both do)."""
        for host in {id(h): h for h in (self.sender, self.receiver)}.values():
            if host.is_local:
                continue
            try:
                host.run(["true"], timeout=15.0)
            except ZcorchError as exc:
                return str(exc)
        return None

    def _ensure_fs(self, fs: str, mounted: dict, fs_errors: dict) -> Tuple[Optional[str], Optional[str]]:
        if fs in fs_errors:
            return None, fs_errors[fs]
        if self.fsman is None:
            fs_errors[fs] = f"filesystem {fs!r}: no filesystem manager available to provision it"
            return None, fs_errors[fs]
        try:  # also before each later run: ensure() re-checks the mount is still there
            mounted[fs] = self.fsman.ensure(fs)
        except ZcorchError as exc:
            what = "is gone from" if fs in mounted else "could not be provisioned on"
            fs_errors[fs] = f"filesystem {fs!r} {what} {self.receiver.name}: {exc}"
            return None, fs_errors[fs]
        return mounted[fs], None

    def _before(self, fs: Optional[str], params: Dict[str, Any]) -> None:
        sink = params.get("sink") or "/dev/null"
        key = (fs, os.path.dirname(sink) if not sink.startswith("/dev/") else "/dev")
        if self.before_directory is None or key in self._seen_dirs:
            return
        self._seen_dirs.add(key)
        self.before_directory(fs, sink)

    def _record_unrun(self, cell, repeat, params, reason, outcome: SweepOutcome, ahead: Counter) -> None:
        rec = {"cell": cell, "repeat": repeat, "params": params, "status": "failed", "reason": reason,
               "started": utc_now(), "wall_s": 0.0, "sender": None, "receiver": None, "log": None,
               "sender_host": self.sender.name, "receiver_host": self.receiver.name}
        if self.convergence is not None:
            self.convergence.observe(rec)
        self.results.append_run(rec)
        self._count(rec, outcome, ahead)

    def _count(self, record: dict, outcome: SweepOutcome, ahead: Counter) -> None:
        outcome.records.append(record)
        if record["status"] == "ok":
            outcome.ok += 1
        else:
            outcome.failed += 1
        if self.progress is not None:
            # The total as now expected: the runs recorded and those ahead that will run (not a converged cell's).
            expected = sum(ahead.values()) if self.convergence is None else self.convergence.expected(ahead)
            self.progress(record, outcome, outcome.ok + outcome.failed + expected)
