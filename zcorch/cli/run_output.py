"""What `zcorch run` prints about runs, shared by one sweep's output (zcorch.cli.run) and a fleet's
(zcorch.cli.fleet): a run's modes and rate in words, JSON-safe event values, and runs.parquet written under
the result set's lock at the end. Not a command module (no register())."""
from __future__ import annotations

import os
import sys

from zcorch.errors import ResultsError
from zcorch.results.store import lock_result_set


def say_over_bar(log, bar, level: int, text: str) -> None:
    """Log one `zcorch run:` line without tearing the progress bar (tqdm) drawn on the same terminal."""
    if bar is not None:
        bar.clear()
    log.log(level, f"zcorch run: {text}")
    if bar is not None:
        bar.refresh()


def _modes(record: dict) -> str:
    """'write→read' (plus the streams when several): what a user recognises, where the cell id is a hash."""
    p = record.get("params") or {}
    text = f"{p.get('send_mode', '?')}→{p.get('recv_mode', '?')}"
    if (p.get("streams") or 1) > 1:
        text += f" ×{p['streams']}"
    return text


def _rate(record: dict) -> str:
    recv = record.get("receiver") or {}
    if record.get("status") != "ok" or not recv.get("wall_ns"):
        return ""
    return f"{recv['bytes'] * 8 / recv['wall_ns']:.2f} Gbit/s"


def _finite(x):
    return x if x is not None and x == x and x not in (float("inf"), float("-inf")) else None


def _clean(obj):
    """JSON has no NaN or infinity: they become null (an event must never fail the sweep it reports)."""
    if isinstance(obj, float):
        return _finite(obj)
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _utc_now() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def _write_cache_locked(directory: str) -> None:
    """runs.parquet, so the first zcorch.load reads it rather than every JSON line (best effort: a warning),
    under the result set's lock again: a `--resume` started since the sweep released it is appending."""
    from zcorch.analysis.cache import write_cache  # pandas + pyarrow: imported only when a sweep ends

    try:
        lock = lock_result_set(directory)
    except ResultsError as exc:
        print(f"zcorch run: warning: runs.parquet not written: {exc}", file=sys.stderr)
        return
    try:
        write_cache(directory)
    finally:
        os.close(lock)
