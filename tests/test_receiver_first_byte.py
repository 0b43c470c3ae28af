"""The receiver's throughput window starts at its first byte, not at accept (native/core/stream.c): a sender
that connects and waits before writing (its own setup) adds nothing to the receiver's wall time."""
from __future__ import annotations

import socket
import struct
import threading
import time

from zcorch.worker import native

DELAY = 0.5   # the sender's pause between its hello and its first byte, s
HELLO_MAGIC = 0x325343a5   # native/core/net.c: every connection opens with a 48-byte hello (zero nonce here)


def _receive_after(delay: float, nbytes: int = 1 << 20) -> dict:
    """A real receiver fed by a plain socket that connects, sends the stream hello (as a sender does at once),
    sleeps `delay`, then writes `nbytes` and closes."""
    out: dict = {}
    with native.Receiver("127.0.0.1", 0, "read", sink="/dev/null", timeout=20, bytes=nbytes) as rx:
        t = threading.Thread(target=lambda: out.update(recv=rx.run()))
        t.start()
        with socket.create_connection(("127.0.0.1", rx.port)) as s:
            s.sendall(struct.pack("<IIIIQQ", HELLO_MAGIC, 0, 1, 0, 0, nbytes) + bytes(16))
            time.sleep(delay)
            s.sendall(b"x" * nbytes)
        t.join()
    return out["recv"]


def test_the_receivers_clock_starts_at_its_first_byte():
    late, prompt = _receive_after(DELAY), _receive_after(0.0)
    assert late["bytes"] == prompt["bytes"] == 1 << 20
    # the pause before the first byte is not in the window: far below it (a loaded machine may stretch the
    # megabyte itself, never by the half second the sender waited)
    assert late["wall_ns"] < 0.5 * DELAY * 1e9, late["wall_ns"]
