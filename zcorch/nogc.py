"""`no_cyclic_gc()`: a block run with the cyclic garbage collector off (and back on after, if it was on).

Why: a parsed runs.jsonl is millions of acyclic objects; each collection rescans them all and frees nothing
(reference counting frees them anyway), so parsing a big set takes far longer with it (docs/performance.md).
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
