"""Host commands a signal must not cut in half: Ctrl-C waits for the command in flight, then stops the sweep.

Why: an interrupt while waiting for `mount` or `losetup` does not stop it on the host; it would finish after the
teardown found nothing to undo. Every Host.run/start/put_bytes runs in a `section`; a signal handler's
`defer(signum)` holds the signal while one is open and redelivers it to the main thread when the last ends
(`redelivered`); meanwhile other threads start no new section (`Stopping`) until `resume()`.
"""
from __future__ import annotations

import _thread
import contextlib
import threading
from typing import Iterator, List, Optional

_lock = threading.RLock()   # re-entrant: the handler runs in the main thread, maybe inside a section's bookkeeping
_active: List[str] = []     # what each open section waits for (a host and a command)
_held: Optional[int] = None  # the signal held until the last section ends
_redelivering: Optional[int] = None
_stopping = False


class Stopping(KeyboardInterrupt):
    """Raised in a thread that would start a host command after a signal asked the sweep to stop."""


@contextlib.contextmanager
def section(what: str) -> Iterator[None]:
    """Hold signals (asked through `defer`) until this and every other open section ended."""
    global _held, _redelivering
    with _lock:
        if _stopping and threading.current_thread() is not threading.main_thread():
            raise Stopping(f"not started, the sweep is stopping: {what}")
        _active.append(what)
    try:
        yield
    finally:
        with _lock:
            _active.remove(what)
            deliver = _held if not _active else None
            if deliver is not None:
                _held, _redelivering = None, deliver
        if deliver is not None:
            _thread.interrupt_main(deliver)


def defer(signum: int) -> bool:
    """From a signal handler: True when a host command is in flight (the signal comes again once it ended)."""
    global _held, _stopping
    with _lock:
        if not _active:
            return False
        _held = _held or signum
        _stopping = True
        return True


def redelivered(signum: int) -> bool:
    """From a signal handler: whether this is a held signal delivered again (act on it; it was counted once)."""
    global _redelivering
    with _lock:
        if _redelivering == signum:
            _redelivering = None
            return True
        return False


def waiting_for() -> List[str]:
    """What the open sections wait for (for the handler's message)."""
    with _lock:
        return list(_active)


def resume() -> None:
    """The teardown starts: host commands run again in every thread (the teardown needs them)."""
    global _stopping
    with _lock:
        _stopping = False
