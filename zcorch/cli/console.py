"""What every command does with its terminal: verbosity through `logging` (-v / -q), and output streams that end
quietly when the reader goes away (`zcorch run ... | head`): the first BrokenPipeError points the stream's
descriptor at /dev/null and the command goes on to its own exit status (a closed pipe must never stop a sweep).
"""
from __future__ import annotations

import logging
import os
import sys
from contextlib import suppress
from typing import TextIO

LOGGER = "zcorch"


class QuietOnClosedPipe:
    """A text stream that swallows the reader's departure: writes after a BrokenPipeError go nowhere."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self.reader_gone = False

    def _gone(self) -> None:
        self.reader_gone = True
        with suppress(OSError, ValueError):  # no descriptor (a test's StringIO): writes are dropped anyway
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, self._stream.fileno())
            os.close(fd)

    def write(self, text: str) -> int:
        if self.reader_gone:
            return len(text)
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        if self.reader_gone:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def guard_streams() -> None:
    """Wrap sys.stdout and sys.stderr (once)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, QuietOnClosedPipe):
            setattr(sys, name, QuietOnClosedPipe(stream))


def setup_logging(verbose: int, quiet: int) -> int:
    """The `zcorch` logger at INFO, one step down per -v (DEBUG), up per -q (WARNING, then ERROR); messages on
    stderr as they are (each command writes its own `zcorch CMD:` prefix). Returns the level."""
    level = max(logging.DEBUG, min(logging.ERROR, logging.INFO + 10 * (quiet - verbose)))
    logger = logging.getLogger(LOGGER)
    logger.setLevel(level)
    logger.propagate = False
    if not logger.handlers:
        handler = logging.StreamHandler(_Stderr())
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    return level


class _Stderr:
    """sys.stderr as it is at each write (tests and guard_streams replace it after the handler is made)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def log(name: str = "") -> logging.Logger:
    """The logger of a command (`zcorch.run`): info = what the user is told, debug = what -v adds."""
    return logging.getLogger(f"{LOGGER}.{name}" if name else LOGGER)
