"""SIGINT/SIGTERM/SIGHUP during a sweep: the first stops it; none stops its teardown (network restore, filesystem
undo, leases, the manifest), except a third Ctrl-C, which abandons it and names every leftover (os._exit).

Why: a KeyboardInterrupt in the middle of `ip link set` or a manifest write leaves a host changed and a result
set "running" with nobody to put them back. `zcorch run` installs an InterruptGuard around the sweep; the Runner
and run_sweep call begin_teardown() first in their cleanup and register what is left (left_behind). After
SIGHUP, stdout/stderr that were the hung-up terminal go to /dev/null: a write there never fails the teardown.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Callable, Dict, Iterator, List, Optional, TextIO

from zcorch.errors import SignalInterrupt
from zcorch.hosts import critical

# What each live part of the sweep would leave if the teardown stopped now: name -> lines (empty: nothing).
Leftovers = Callable[[], List[str]]
_ACTIVE: List["InterruptGuard"] = []
ABANDON_AFTER = 3   # Ctrl-C presses during a teardown that abandon it (SIGTERM never does)
# The signals that end a sweep as Ctrl-C does; all but SIGINT stay ignored once it ended interrupted.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class InterruptGuard:
    """The signal handlers of one sweep (module docstring)."""

    def __init__(self, out: Optional[TextIO] = None, prog: str = "zcorch run"):
        self.out, self.prog = out or sys.stderr, prog
        self.tearing_down = False
        self.presses = 0                      # SIGINTs (Ctrl-C), the one that stopped the sweep included
        self.signals: List[int] = []          # the signals that arrived once the teardown began
        self._left: Dict[str, Leftovers] = {}
        # Set when the sweep ended interrupted: SIGTERM stays ignored after installed() (a supervisor repeating
        # it must not turn exit status 130 into a kill).
        self.ignore_term_after = False
        self._ttys: List[int] = []            # stdout/stderr when they were a terminal (installed() looks)

    def _say(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.out.write(f"{self.prog}: {text}\n")
            self.out.flush()

    def handler(self, signum: int, frame: object) -> None:
        again = critical.redelivered(signum)   # held while a host command ran: counted when it first came
        if signum == signal.SIGINT and not again:
            self.presses += 1
        if signum == signal.SIGHUP and not again:
            _detach_from_hung_up_terminal(self._ttys)
        if not self.tearing_down:
            if critical.defer(signum):   # a host command in flight ends first (zcorch.hosts.critical)
                if signum == signal.SIGINT and self.presses >= ABANDON_AFTER:
                    self.abandon()
                if not again:
                    self._say(f"{signal.Signals(signum).name}: stopping once {'; '.join(critical.waiting_for())} "
                              f"ended{self._hint(signum)}")
                return
            self.tearing_down = True
            # SIGTERM, SIGHUP: a KeyboardInterrupt that names it, so the interrupted run's record says which
            raise KeyboardInterrupt if signum == signal.SIGINT else SignalInterrupt(signum)
        self.signals.append(signum)
        if signum == signal.SIGINT and self.presses >= ABANDON_AFTER:
            self.abandon()
        if len(self.signals) == 1 or signum == signal.SIGINT:   # a supervisor repeating TERM: said once
            self._say(f"{signal.Signals(signum).name}: finishing the teardown first (restoring the hosts, "
                      f"closing the result set){self._hint(signum)}")

    def _hint(self, signum: int) -> str:
        return f" (Ctrl-C {ABANDON_AFTER - self.presses} more time(s) abandons it)" if signum == signal.SIGINT else ""

    def abandon(self) -> None:
        lines = [line for fn in list(self._left.values()) for line in _safe(fn)]
        self._say(f"teardown abandoned (Ctrl-C pressed {self.presses} times); "
                  + ("left as it is:\n  " + "\n  ".join(lines) if lines else "nothing was left to undo"))
        os._exit(130)

    @contextlib.contextmanager
    def installed(self) -> Iterator["InterruptGuard"]:
        # which of stdout/stderr are a terminal, asked while it is alive: once hung up, isatty() is False (EIO)
        self._ttys = [fd for fd in (1, 2) if os.isatty(fd)]
        old = {s: signal.signal(s, self.handler) for s in SIGNALS}
        _ACTIVE.append(self)
        try:
            yield self
        finally:
            _ACTIVE.remove(self)
            critical.resume()
            for s, h in old.items():
                signal.signal(s, signal.SIG_IGN if s != signal.SIGINT and self.ignore_term_after else h)


def _detach_from_hung_up_terminal(ttys: List[int]) -> None:
    """stdout and stderr that were a terminal (the one that hung up) become /dev/null: writing to a hung-up
    terminal fails (EIO), and the teardown must not. A pipe or a file stays (a SIGHUP sent by kill)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        for fd in ttys:
            with contextlib.suppress(OSError):
                os.dup2(null, fd)
    finally:
        os.close(null)


def _safe(fn: Leftovers) -> List[str]:
    try:
        return list(fn())
    except Exception as exc:  # describing must never stop the exit
        return [f"(could not describe one part: {type(exc).__name__}: {exc})"]


def begin_teardown() -> None:
    """From here on no signal interrupts this process's sweep (when a guard is installed); host commands run
    again in every thread (a signal held while one ran stopped the others from starting new ones)."""
    for guard in _ACTIVE:
        guard.tearing_down = True
    critical.resume()


def left_behind(name: str, fn: Optional[Leftovers]) -> None:
    """Tell the installed guard (if any) what part `name` would leave behind; None: nothing any more."""
    for guard in _ACTIVE:
        if fn is None:
            guard._left.pop(name, None)
        else:
            guard._left[name] = fn
