"""The controller's side of a host's watchdog (zcorch.worker.watchdog): armed before a network or filesystem
change, renewed every RENEW_S while the controller lives, confirmed once the host is put back. A host
restores itself when the connection ends, or after LAPSE_S without renewal.
"""
from __future__ import annotations

import json
import threading
from typing import Any, Dict, List, Optional, Sequence

from zcorch.errors import HostError
from zcorch.hosts.interpreter import _DROP_CWD
from zcorch.hosts.local import Host, Process
from zcorch.provision.remote_call import module_source, remote_json, run_remote

RENEW_S = 3.0      # how often the controller renews
LAPSE_S = 15.0     # renewals missing this long: the host restores itself (five renewals lost in a row)
BOUND_S = 30.0     # from the controller's loss to a restored host, whatever the cause (docs/experiment-files.md)
MODULE = "zcorch.worker.watchdog"
# Reads one framed program (a byte-count line, then the bytes) from stdin and runs it: the rest of stdin
# stays the watchdog's (renewals), which `python -c` of a program read to EOF could not give it.
_BOOT = (_DROP_CWD + '; b = sys.stdin.buffer; n = int(b.readline()); '
         'exec(compile(b.read(n), "zcorch/worker/watchdog.py", "exec"))')


def _frame(text: str) -> List[str]:
    """The two lines send_line writes for one framed program (the count covers the newline send_line adds)."""
    return [str(len(text.encode("utf-8")) + 1), text]


class Watchdog:
    """One armed watchdog on one host (module docstring)."""

    def __init__(self, host: Host, proc: Process, kind: str, undo: str):
        self.host, self.proc, self.kind, self.undo = host, proc, kind, undo
        self.lost: Optional[str] = None    # why renewing failed (the host restores itself)
        self.send_lock = threading.Lock()

    @classmethod
    def arm(cls, host: Host, python: str, kind: str, undo: str, owner: Dict[str, Any],
            lapse: float = LAPSE_S) -> "Watchdog":
        """Start the host's watchdog over `undo` (a state directory or file), armed on return (else HostError)."""
        argv = [python, "-c", _BOOT, kind, undo, f"--lapse={lapse:g}", f"--owner={json.dumps(owner)}"]
        proc = host.start(argv)
        try:
            for module in [MODULE] + (["zcorch.worker.netcfg"] if kind == "net" else []):
                for line in _frame(module_source(module)):
                    proc.send_line(line)
            first = proc.readline(60.0)
        except (HostError, OSError, TimeoutError) as exc:
            proc.kill_group()
            raise HostError(f"{host.name}: the watchdog guarding {undo} did not start: {exc}") from None
        if not first or not first.startswith("armed "):
            proc.kill_group()
            raise HostError(f"{host.name}: the watchdog guarding {undo} did not start (it said {first!r}; "
                            f"{proc.stderr_text().strip()[:400]})")
        dog = cls(host, proc, kind, undo)
        _RENEWER.add(dog)
        return dog

    def renew(self) -> None:
        with self.send_lock:
            self.proc.send_line("renew")

    def confirm(self) -> None:
        """The host is put back: the watchdog exits touching nothing (best effort: untold, it finds nothing)."""
        _RENEWER.discard(self)
        try:
            with self.send_lock:
                self.proc.send_line("confirm")
            self.proc.wait(10.0)
        except (HostError, OSError, TimeoutError, ValueError):
            pass


class _Renewer:
    """The one thread renewing every armed watchdog of this process. A thread because the main thread blocks
    in a run for its whole length (tens of seconds), longer than a renewal may wait; it ends with the last."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dogs: List[Watchdog] = []
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()      # one per thread: a discarded thread never sees a later one's

    def add(self, dog: Watchdog) -> None:
        with self._lock:
            self._dogs.append(dog)
            if self._thread is None:
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._loop, args=(self._stop,), name="watchdog-renewals",
                                                daemon=True)
                self._thread.start()

    def discard(self, dog: Watchdog) -> None:
        with self._lock:
            if dog in self._dogs:
                self._dogs.remove(dog)
            if not self._dogs and self._thread is not None:
                self._stop.set()
                self._thread = None

    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(RENEW_S):
            with self._lock:
                dogs = list(self._dogs)
            for dog in dogs:
                try:
                    dog.renew()
                except (HostError, OSError, ValueError) as exc:
                    dog.lost = str(exc)
                    self.discard(dog)


_RENEWER = _Renewer()


def watchdog_reports(host: Host, python: str, dirs: Sequence[str]) -> List[str]:
    """What watchdogs restored on `host` since the last sweep read it (each record removed once read), in words."""
    res = run_remote(host, "reports", *dirs, python=python, module=MODULE, timeout=60.0)
    doc = remote_json(res)
    if not res.ok or doc is None:
        return [f"{host.name}: could not read the watchdogs' records: {(res.stderr or res.stdout).strip()[:300]}"]
    out = []
    for r in doc.get("reports") or []:
        what = "; ".join(r.get("restored") or []) or "nothing was left to restore"
        errors = f" (NOT restored: {'; '.join(r['errors'])})" if r.get("errors") else ""
        owner = r.get("owner") or {}
        out.append(f"restored by watchdog on {host.name} at {r.get('restored_at')} ({r.get('kind')}, "
                   f"{r.get('seconds')} s after {r.get('why')}; controller pid {owner.get('pid')} on "
                   f"{owner.get('host')}): {what}{errors}")
    return out


def sweep_reports(hosts: Dict[str, Host], python: Dict[str, str], spec: Any) -> List[str]:
    """watchdog_reports of each host of a sweep (`spec`: its zcorch.config.hosts.Hosts), both at once."""
    from zcorch.config.hosts import fs_state_dir, net_state_dir
    from zcorch.hosts.parallel import per_host

    roles = ["receiver"] if hosts["sender"] is hosts["receiver"] else ["sender", "receiver"]

    def one(role: str) -> List[str]:
        dirs = [net_state_dir(spec.workdir(role))] + ([fs_state_dir(spec.workdir(role))] if role == "receiver" else [])
        return watchdog_reports(hosts[role], python[role], dirs)

    return [w for found in per_host(roles, one) for w in found]
