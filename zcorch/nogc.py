"""`no_cyclic_gc()`: a block run with the cyclic garbage collector off (and back on after, if it was on).

Why: a big plan or a parsed runs.jsonl is hundreds of thousands of acyclic objects; each
collection rescans them all and frees nothing, while reference counting frees them anyway (docs/performance.md).
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
