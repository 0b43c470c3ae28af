"""SIGINT/SIGTERM during a sweep: the first stops it; none stops its teardown (network restore, filesystem
undo, leases, the manifest), except a third Ctrl-C, which abandons it and says what is left.

    guard = InterruptGuard(out=sys.stderr)     # `zcorch run` installs it for the whole sweep
    with guard.installed():
        run_sweep(...)                         # the Runner / run_sweep call begin_teardown() first thing
                                               # in their cleanup; they register what is left (left_behind)

Why: a KeyboardInterrupt raised in the middle of `ip link set` or a manifest write leaves a host at the
sweep's MTU and a result set "running" with nobody to put them back. SIGTERM (systemd, timeout(1), a
supervisor repeating it) never abandons a teardown; a person pressing Ctrl-C three times gets out, with
every leftover named and how to restore it (os._exit: nothing more runs).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Callable, Dict, Iterator, List, Optional, TextIO

from zcorch.errors import SignalInterrupt

# What each live part of the sweep would leave if the teardown stopped now: name -> lines (empty: nothing).
Leftovers = Callable[[], List[str]]
_ACTIVE: List["InterruptGuard"] = []
ABANDON_AFTER = 3   # Ctrl-C presses during a teardown that abandon it (SIGTERM never does)


class InterruptGuard:
    """The signal handlers of one sweep (module docstring)."""

    def __init__(self, out: Optional[TextIO] = None, prog: str = "zcorch run"):
        self.out, self.prog = out or sys.stderr, prog
        self.tearing_down = False
        self.presses = 0                      # SIGINTs (Ctrl-C), the one that stopped the sweep included
        self.signals: List[int] = []          # the signals that arrived once the teardown began
        self._left: Dict[str, Leftovers] = {}
        # Set when the sweep ended interrupted: SIGTERM stays ignored after installed() (the process is
        # exiting; a supervisor repeating TERM must not turn exit status 130 into a kill).
        self.ignore_term_after = False

    def _say(self, text: str) -> None:
        try:
            self.out.write(f"{self.prog}: {text}\n")
            self.out.flush()
        except (OSError, ValueError):
            pass

    def handler(self, signum: int, frame: object) -> None:
        if signum == signal.SIGINT:
            self.presses += 1
        if not self.tearing_down:
            self.tearing_down = True
            # SIGTERM: a KeyboardInterrupt that names it, so the interrupted run's record says SIGTERM
            raise KeyboardInterrupt if signum == signal.SIGINT else SignalInterrupt(signum)
        self.signals.append(signum)
        if signum == signal.SIGINT and self.presses >= ABANDON_AFTER:
            self.abandon()
        if len(self.signals) == 1 or signum == signal.SIGINT:   # a supervisor repeating TERM: said once
            hint = (f" (Ctrl-C {ABANDON_AFTER - self.presses} more time(s) abandons it)"
                    if signum == signal.SIGINT else "")
            self._say(f"{signal.Signals(signum).name}: finishing the teardown first (restoring the hosts, "
                      f"closing the result set){hint}")

    def abandon(self) -> None:
        lines = [line for fn in list(self._left.values()) for line in _safe(fn)]
        self._say(f"teardown abandoned (Ctrl-C pressed {self.presses} times); "
                  + ("left as it is:\n  " + "\n  ".join(lines) if lines else "nothing was left to undo"))
        os._exit(130)

    def left_behind(self, name: str, fn: Optional[Leftovers]) -> None:
        """Register (or, with None, forget) what part `name` would leave behind."""
        if fn is None:
            self._left.pop(name, None)
        else:
            self._left[name] = fn

    @contextlib.contextmanager
    def installed(self) -> Iterator["InterruptGuard"]:
        old = {s: signal.signal(s, self.handler) for s in (signal.SIGINT, signal.SIGTERM)}
        _ACTIVE.append(self)
        try:
            yield self
        finally:
            _ACTIVE.remove(self)
            for s, h in old.items():
                signal.signal(s, signal.SIG_IGN if s == signal.SIGTERM and self.ignore_term_after else h)


def _safe(fn: Leftovers) -> List[str]:
    try:
        return list(fn())
    except Exception as exc:  # describing must never stop the exit
        return [f"(could not describe one part: {type(exc).__name__}: {exc})"]


def begin_teardown() -> None:
    """From here on no signal interrupts this process's sweep (when a guard is installed)."""
    for guard in _ACTIVE:
        guard.tearing_down = True


def left_behind(name: str, fn: Optional[Leftovers]) -> None:
    """Tell the installed guard (if any) what part `name` would leave behind; None: nothing any more."""
    for guard in _ACTIVE:
        guard.left_behind(name, fn)
