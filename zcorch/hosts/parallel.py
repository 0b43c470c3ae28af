"""Per-host work on every host at once (connect, preflight, deploy, calibration): a sweep's start costs the
slower host's time, not the sum. Each thread drives its own host; failures are collected and raised together.
"""
from __future__ import annotations

import threading
from typing import Callable, List, Sequence, TypeVar

from zcorch.errors import ZcorchError

T = TypeVar("T")
R = TypeVar("R")


def per_host(items: Sequence[T], work: Callable[[T], R], parallel: bool = True) -> List[R]:
    """[work(item) for item in items], one daemon thread each when `parallel`. All run to their end; then one
    ZcorchError of the first failure's class lists every failure (a non-zcorch exception is raised as is)."""
    items = list(items)
    if not parallel or len(items) < 2:
        results: List[R] = []
        errors: List[BaseException] = []
        for item in items:
            try:
                results.append(work(item))
            except ZcorchError as exc:
                errors.append(exc)
        _raise(errors)
        return results
    out: List[object] = [None] * len(items)
    failed: List[object] = [None] * len(items)

    def run(i: int) -> None:
        try:
            out[i] = work(items[i])
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            failed[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True, name=f"per-host-{i}") for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)   # short joins: a Ctrl-C in the main thread is not held up by a slow host
    errors = [e for e in failed if e is not None]
    for exc in errors:
        if not isinstance(exc, ZcorchError):
            raise exc  # type: ignore[misc]
    _raise(errors)  # type: ignore[arg-type]
    return out  # type: ignore[return-value]


def _raise(errors: List[BaseException]) -> None:
    if not errors:
        return
    if len(errors) == 1:
        raise errors[0]
    first = errors[0]
    try:
        combined = type(first)("\n".join(str(e) for e in errors))
    except TypeError:   # an error class with another constructor: the first one alone
        raise first from None
    raise combined from first
